/* patch_decode.c - decoding sections and the transactional host apply. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk_fast_impl.h"
#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "class_index_impl.h"
#include "digest_impl.h"
#include "patch_changes_impl.h"
#include "patch_impl.h"
#include "pulse_codec_stream.h"
#include "pulse_elem.h"
#include "status_impl.h"

int patch_can_use_index(const pulse_patch *p) {
  return p->model == PULSE_POS_CLASS && p->chunk_log2 >= PULSE_CLASS_BLOCK_LOG2;
}

pulse_status patch_decode_chunk(const pulse_patch *p, size_t t, uint64_t j,
                                const uint16_t *base, const pulse_class_index *ix,
                                uint64_t *pos, uint16_t *delta) {
  return patch_decode_chunk_in(p, t, j, base, ix, pos, delta, NULL);
}

pulse_status patch_decode_chunk_in(const pulse_patch *p, size_t t, uint64_t j,
                                   const uint16_t *base, const pulse_class_index *ix,
                                   uint64_t *pos, uint16_t *delta,
                                   const pulse_chunk_scratch *scratch) {
  const patch_tensor *tt = &p->tensors[t];
  uint64_t c = tt->chunk_first + j;
  uint32_t k = p->chunk_changed[c];
  if (k == 0)
    return PULSE_OK;
  uint64_t first = j << p->chunk_log2;
  const uint8_t *stream = p->bytes + p->chunk_offset[c];
  size_t size = (size_t)p->chunk_size[c];
  uint32_t n = patch_chunk_elems(p, tt, j);
  pulse_status st;
  if (ix != NULL && patch_can_use_index(p) && p->version == 2)
    /* Decode and locate in one pass (chunk_fast.c): the same results as
     * the two-pass path below, which stays the reference. */
    st = pulse_chunk2_decode_indexed(ix, base, first, n, stream, size, k, pos, delta,
                                     scratch != NULL ? scratch->old_bits : NULL, scratch);
  else if (ix != NULL && patch_can_use_index(p) && p->version == 3)
    st = pulse_chunk3_decode_indexed(
        p->values, ix, base, first, n, stream, size, k, pos, delta,
        scratch != NULL ? scratch->old_bits : NULL, scratch);
  else if (ix != NULL && patch_can_use_index(p))
    st = pulse_chunk_decode_indexed(p->version, p->values, ix, base, first, n,
                                    stream, size, k, pos, delta, scratch);
  else
    st = pulse_chunk_decode_in(p->version, p->values, p->model,
                               base ? base + first : NULL, n, stream, size, k,
                               first, pos, delta, scratch);
  if (st != PULSE_OK)
    return pulse_fail(st, "tensor '%s' chunk %llu: %s", tt->info.name, (unsigned long long)j,
                      pulse_error_detail());
  return PULSE_OK;
}

/* Fills old and new bits from the base and the deltas (in place: the delta
 * array becomes new_bits). */
static void resolve_bits(const uint16_t *base, pulse_changes *c, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; i++) {
    uint16_t old = base[c->pos[i]];
    c->old_bits[i] = old;
    c->new_bits[i] = pulse_bf16_undelta(old, c->new_bits[i]);
  }
}

pulse_tensor_digest patch_resolve_chunk(const uint16_t *base, pulse_changes *c, uint64_t from,
                                        uint64_t to) {
  /* Old and new bits first: a loop of loads alone, so many cache misses on
   * the base are in flight at once (fused with the digest's arithmetic it
   * ran at half the speed). Then the digest change, the staging in cache. */
  resolve_bits(base, c, from, to);
  return pulse_digest_change_sum(c->pos + from, c->old_bits + from, c->new_bits + from, to - from);
}

pulse_status pulse_patch_decode_tensor(const pulse_patch *p, size_t i, const uint16_t *base,
                                       uint64_t numel, pulse_changes *out) {
  if (p == NULL || out == NULL || i >= p->count)
    return pulse_fail(PULSE_ERR_ARG, "decode: no tensor %zu", i);
  const patch_tensor *t = &p->tensors[i];
  if (numel != t->numel)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "decode: tensor '%s' has %llu elements, base %llu",
                      t->info.name, (unsigned long long)t->numel, (unsigned long long)numel);
  if (base == NULL && numel > 0)
    return pulse_fail(PULSE_ERR_ARG, "decode: tensor '%s': NULL base", t->info.name);
  out->count = 0;
  if (t->changed == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_changes_reserve(out, t->changed));
  for (uint64_t j = 0; j < t->chunk_count; j++) {
    uint64_t at = p->chunk_before[t->chunk_first + j];
    PULSE_TRY(patch_decode_chunk(p, i, j, base, NULL, out->pos + at, out->new_bits + at));
  }
  out->count = t->changed;
  resolve_bits(base, out, 0, out->count);
  return PULSE_OK;
}

/* ---------------------------------------------------------------- apply */

/* The table's infos, for state digests. */
pulse_status patch_state_digest_of(const pulse_patch *p, const pulse_tensor_digest *d,
                                   pulse_state_digest *out) {
  pulse_tensor_info *infos = calloc(p->count + 1, sizeof *infos);
  if (infos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "apply: state digest");
  for (size_t i = 0; i < p->count; i++)
    infos[i] = p->tensors[i].info;
  pulse_status st = pulse_state_digest_compute(infos, d, p->count, out);
  free(infos);
  return st;
}

/* The staged transaction is the stream's (patch_stream.c) with every byte
 * there from the start: one implementation of the checks. */
struct pulse_patch_staged {
  pulse_patch_stream *s;
  pulse_patch_stage_figures times;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void pulse_patch_staged_free(pulse_patch_staged *s) {
  if (s == NULL)
    return;
  pulse_patch_stream_free(s->s);
  free(s);
}

pulse_status pulse_patch_stage(const pulse_patch *p, pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts, pulse_patch_staged **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "apply: NULL output");
  *out = NULL;
  pulse_patch_staged *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "apply: staging");
  double t0 = now_s();
  pulse_status st = patch_stream_begin(p, targets, count, opts, 1, &s->s);
  if (st == PULSE_OK) {
    pulse_patch_stream_feed(s->s, p->size);
    st = pulse_patch_stream_finish(s->s);
  }
  if (st != PULSE_OK) {
    pulse_patch_staged_free(s);
    return st;
  }
  pulse_patch_stream_figures t = pulse_patch_stream_figures_get(s->s);
  s->times.verify_seconds = t.verify_seconds;
  s->times.decode_seconds = now_s() - t0 - t.verify_seconds;
  *out = s;
  return PULSE_OK;
}

void pulse_patch_staged_commit_data(pulse_patch_staged *s) { pulse_patch_stream_commit_data(s->s); }

void pulse_patch_staged_commit_indexes(pulse_patch_staged *s) {
  pulse_patch_stream_commit_indexes(s->s);
}

void pulse_patch_staged_commit(pulse_patch_staged *s) { pulse_patch_stream_commit(s->s); }

pulse_patch_stage_figures pulse_patch_staged_figures_get(const pulse_patch_staged *s) { return s->times; }

const pulse_changes *patch_staged_changes(const pulse_patch_staged *s, size_t i) {
  return s != NULL ? patch_stream_changes(s->s, i) : NULL;
}

void pulse_apply_opts_init(pulse_apply_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_APPLY_OPTS_VERSION;
}

pulse_status pulse_patch_apply(const pulse_patch *p, pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts) {
  pulse_patch_staged *s = NULL;
  PULSE_TRY(pulse_patch_stage(p, targets, count, opts, &s));
  pulse_patch_staged_commit(s);
  pulse_patch_staged_free(s);
  return PULSE_OK;
}
