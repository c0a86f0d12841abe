/* shard_testutil.h - the seeded FP32 model that the sharded-publish suites
 * publish (test_shard*.c, test_commit_uploaded.c): tensors of given names
 * and shapes whose weights one seed draws (the same on every rank that
 * makes it), the single publisher's BF16 snapshot where a suite keeps one,
 * the step that moves the weights, that publisher's patch, and the blocks
 * of the tensors each rank holds (sm_blocks) with their weights. */
#ifndef PULSE_SHARD_TESTUTIL_H
#define PULSE_SHARD_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_pub_shard.h"

#define SM_MAX_TENSORS 4

/* What a suite's model is: count tensors, each named, of ndims[t]
 * dimensions shapes[t]; its weights start uniform in
 * [-spread[t]/2, spread[t]/2) (spread NULL: 1). */
typedef struct {
  int count;
  const char *const *names;
  const uint32_t *ndims;
  const uint64_t (*shapes)[3];
  const double *spread;
  int snapshot; /* keep the single publisher's BF16 snapshot in snap */
} sm_spec;

typedef struct {
  int count;
  pulse_tensor_info info[SM_MAX_TENSORS];
  uint64_t numel[SM_MAX_TENSORS];
  float *w[SM_MAX_TENSORS];       /* FP32 master weights */
  uint16_t *snap[SM_MAX_TENSORS]; /* the BF16 snapshot, or NULL */
  uint64_t seed;                  /* the draws' state */
} sm_model;

/* The next draw of the seed's sequence, in [0, 1). */
static inline double sm_rnd(uint64_t *seed) {
  *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*seed >> 11) / 9007199254740992.0;
}

static inline void sm_model_init(sm_model *m, const sm_spec *s, uint64_t seed) {
  cr_assert_leq(s->count, SM_MAX_TENSORS);
  memset(m, 0, sizeof *m);
  m->count = s->count;
  m->seed = seed;
  for (int t = 0; t < s->count; t++) {
    m->info[t].name = s->names[t];
    m->info[t].dtype = PULSE_DTYPE_F32;
    m->info[t].ndim = s->ndims[t];
    m->numel[t] = 1;
    for (uint32_t k = 0; k < s->ndims[t]; k++)
      m->info[t].shape[k] = s->shapes[t][k], m->numel[t] *= s->shapes[t][k];
    double spread = s->spread != NULL ? s->spread[t] : 1.0;
    m->w[t] = malloc(m->numel[t] * 4);
    for (uint64_t i = 0; i < m->numel[t]; i++)
      m->w[t][i] = (float)((sm_rnd(&m->seed) - 0.5) * spread);
    if (s->snapshot) {
      m->snap[t] = malloc(m->numel[t] * 2);
      pulse_bf16_cast_f32(m->w[t], m->snap[t], m->numel[t]);
    }
  }
}

static inline void sm_model_free(sm_model *m) {
  for (int t = 0; t < m->count; t++)
    free(m->w[t]), free(m->snap[t]);
}

/* Moves each weight, with probability share, by a draw in
 * [-amplitude/2, amplitude/2). */
static inline void sm_model_step(sm_model *m, double share, double amplitude) {
  for (int t = 0; t < m->count; t++)
    for (uint64_t i = 0; i < m->numel[t]; i++)
      if (sm_rnd(&m->seed) < share)
        m->w[t][i] += (float)((sm_rnd(&m->seed) - 0.5) * amplitude);
}

/* The single publisher's patch of the step from the snapshot to the
 * weights (the snapshot moves to them); chunk_log2 0: the encoder's
 * default chunks. */
static inline pulse_buffer sm_single_patch(sm_model *m, uint64_t step,
                                           unsigned chunk_log2) {
  pulse_changes ch[SM_MAX_TENSORS];
  pulse_encode_tensor enc[SM_MAX_TENSORS];
  uint16_t *base[SM_MAX_TENSORS];
  memset(enc, 0, sizeof enc);
  for (int t = 0; t < m->count; t++) {
    ch[t] = (pulse_changes)PULSE_CHANGES_INIT;
    base[t] = malloc(m->numel[t] * 2);
    memcpy(base[t], m->snap[t], m->numel[t] * 2);
    cr_assert_eq(pulse_detect_ref(m->w[t], PULSE_DTYPE_F32, m->snap[t],
                                  m->numel[t], 1, &ch[t]),
                 PULSE_OK);
    enc[t].info = m->info[t];
    enc[t].info.dtype = PULSE_DTYPE_BF16;
    enc[t].base = base[t];
    enc[t].changes = &ch[t];
  }
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.step = step, o.base_step = step - 1, o.threads = 1;
  if (chunk_log2 != 0)
    o.chunk_log2 = chunk_log2;
  pulse_buffer out = {0};
  cr_assert_eq(pulse_patch_encode(&o, enc, (size_t)m->count, &out), PULSE_OK,
               "%s", pulse_error_detail());
  for (int t = 0; t < m->count; t++)
    pulse_changes_free(&ch[t]), free(base[t]);
  return out;
}

/* ---- blocks: a rank's share of the model's tensors */

#define SM_MAX_BLOCKS (3 * SM_MAX_TENSORS)

typedef struct {
  pulse_pub_block b[SM_MAX_BLOCKS];
  size_t n;
} sm_blocks;

/* Adds to r the block of tensor t (of s) from start, ext long, in each of
 * the tensor's dimensions. */
static inline void sm_blocks_rect(sm_blocks *r, const sm_spec *s, int t,
                                  const uint64_t *start, const uint64_t *ext) {
  cr_assert_lt(r->n, SM_MAX_BLOCKS);
  pulse_pub_block *b = &r->b[r->n++];
  memset(b, 0, sizeof *b);
  b->name = s->names[t];
  b->kind = PULSE_PUB_BLOCK_RECT;
  for (uint32_t k = 0; k < s->ndims[t]; k++)
    b->start[k] = start[k], b->extent[k] = ext[k];
}

/* Adds to r the flat range [lo, lo + n) of tensor t (of s). */
static inline void sm_blocks_flat(sm_blocks *r, const sm_spec *s, int t,
                                  uint64_t lo, uint64_t n) {
  cr_assert_lt(r->n, SM_MAX_BLOCKS);
  pulse_pub_block *b = &r->b[r->n++];
  memset(b, 0, sizeof *b);
  b->name = s->names[t];
  b->kind = PULSE_PUB_BLOCK_FLAT;
  b->start[0] = lo, b->extent[0] = n;
}

/* A rank's tensor of block b: a new copy (malloc) of the block's elements
 * of the FP32 weights, row-major; their count in *n unless n is NULL. */
static inline float *sm_block_data(const sm_model *m, const pulse_pub_block *b,
                                   uint64_t *n) {
  int t = 0;
  while (strcmp(m->info[t].name, b->name) != 0)
    t++;
  uint64_t count = 1;
  if (b->kind == PULSE_PUB_BLOCK_FLAT)
    count = b->extent[0];
  else
    for (uint32_t k = 0; k < m->info[t].ndim; k++)
      count *= b->extent[k];
  float *d = malloc((count ? count : 1) * 4);
  if (b->kind == PULSE_PUB_BLOCK_FLAT)
    memcpy(d, m->w[t] + b->start[0], count * 4);
  else
    for (uint64_t i = 0; i < count; i++) {
      uint64_t rest = i, pos = 0, stride = 1;
      for (uint32_t k = m->info[t].ndim; k-- > 0;) {
        pos += (b->start[k] + rest % b->extent[k]) * stride;
        rest /= b->extent[k];
        stride *= m->info[t].shape[k];
      }
      d[i] = m->w[t][pos];
    }
  if (n != NULL)
    *n = count;
  return d;
}

#endif /* PULSE_SHARD_TESTUTIL_H */
