/* bench_baselines.c - the encodings that the patch formats are compared
 * against: dense BF16 (raw, and through zstd), int32 index + BF16 value
 * (raw, and through zstd), varint gaps + absolute values (published
 * production format proxy) and varint gaps + XOR byte planes through zstd;
 * every zstd figure at levels 1, 3 and 19. */
#include "bench_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "parallel_impl.h"

/* Growable byte buffer; a failed allocation sticks in `failed`. */
typedef struct {
  uint8_t *data;
  size_t size, cap;
  int failed;
} byte_buf;

static void buf_reserve(byte_buf *b, size_t extra) {
  if (b->failed || b->cap - b->size >= extra)
    return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap - b->size < extra)
    cap *= 2;
  uint8_t *p = realloc(b->data, cap);
  if (p == NULL) {
    b->failed = 1;
    return;
  }
  b->data = p;
  b->cap = cap;
}

static void buf_put(byte_buf *b, const void *src, size_t n) {
  buf_reserve(b, n);
  if (b->failed)
    return;
  memcpy(b->data + b->size, src, n);
  b->size += n;
}

static void buf_put_u16(byte_buf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  buf_put(b, x, 2);
}

static void buf_put_u32(byte_buf *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                  (uint8_t)(v >> 24)};
  buf_put(b, x, 4);
}

static void buf_put_varint(byte_buf *b, uint64_t v) {
  uint8_t x[10];
  size_t n = 0;
  while (v >= 0x80) {
    x[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  x[n++] = (uint8_t)v;
  buf_put(b, x, n);
}

static const char *const kind_label[BENCH_ZKINDS] = {
    "dense BF16", "int32 index + BF16 value", "varint gap + abs BF16",
    "varint gap + XOR planes"};
static const char *const kind_key[BENCH_ZKINDS] = {"dense", "int32_bf16", "delta_abs",
                                                   "gap_xor"};

void bench_baseline_label(int kind, int li, char *buf, size_t size) {
  snprintf(buf, size, "%s + zstd-%d%s", kind_label[kind], BENCH_ZSTD_LEVEL(li),
           kind == BENCH_GAP_ABS_Z ? " (prod.)" : "");
}

void bench_baseline_key(int kind, int li, char *buf, size_t size) {
  if (li == 0)
    snprintf(buf, size, "%s_zstd", kind_key[kind]);
  else
    snprintf(buf, size, "%s_zstd%d", kind_key[kind], BENCH_ZSTD_LEVEL(li));
}

uint64_t bench_baseline_best(const bench_baseline_bytes *b, int *kind, int *li) {
  uint64_t best = UINT64_MAX;
  *kind = BENCH_INT32_Z, *li = 0;
  for (int k = 0; k < BENCH_ZKINDS; k++)
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
      int sampled = k == BENCH_DENSE_Z && l == 2 && b->dense_z19_read < b->dense;
      if (!sampled && b->zstd[k][l] < best)
        best = b->zstd[k][l], *kind = k, *li = l;
    }
  return best;
}

/* One compression: src through zstd at `level`, its size into *out. */
typedef struct {
  const void *src;
  size_t n;
  int level;
  uint64_t *out;
  pulse_status st;
} zstd_job;

static void zstd_one(void *ctx, size_t i) {
  zstd_job *j = &((zstd_job *)ctx)[i];
  size_t cap = ZSTD_compressBound(j->n);
  void *dst = malloc(cap ? cap : 1);
  if (dst == NULL) {
    j->st = PULSE_ERR_NOMEM;
    return;
  }
  size_t r = ZSTD_compress(dst, cap, j->src, j->n, j->level);
  free(dst);
  if (ZSTD_isError(r))
    j->st = PULSE_ERR_INTERNAL;
  else
    *j->out = (uint64_t)r;
}

/* The sparse encodings' buffers, built in one pass over the changes. */
static void build_sparse(const bench_table *t, const pulse_changes *changes, byte_buf *idx,
                         byte_buf *gap_abs, byte_buf *gap_xor) {
  for (size_t i = 0; i < t->count; i++) {
    const pulse_changes *c = &changes[i];
    /* int32 index + BF16 value */
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u32(idx, (uint32_t)c->pos[k]);
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u16(idx, c->new_bits[k]);
    /* varint gaps, shared by the two gap encodings */
    size_t gaps_start_abs = gap_abs->size;
    uint64_t prev = 0;
    for (uint64_t k = 0; k < c->count; k++) {
      buf_put_varint(gap_abs, c->pos[k] - prev);
      prev = c->pos[k] + 1;
    }
    if (!gap_abs->failed)
      buf_put(gap_xor, gap_abs->data + gaps_start_abs, gap_abs->size - gaps_start_abs);
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u16(gap_abs, c->new_bits[k]);
    for (uint64_t k = 0; k < c->count; k++) {
      uint8_t lo = (uint8_t)(c->old_bits[k] ^ c->new_bits[k]);
      buf_put(gap_xor, &lo, 1);
    }
    for (uint64_t k = 0; k < c->count; k++) {
      uint8_t hi = (uint8_t)((c->old_bits[k] ^ c->new_bits[k]) >> 8);
      buf_put(gap_xor, &hi, 1);
    }
  }
}

/* The bytes dense zstd-19 reads: the whole state when it is at most
 * BENCH_Z19_DENSE_SAMPLE, else BENCH_Z19_SLICES evenly spaced slices. */
static void dense_z19_sample(const uint16_t *new_bf16, uint64_t bytes, byte_buf *sample) {
  if (bytes <= BENCH_Z19_DENSE_SAMPLE) {
    buf_put(sample, new_bf16, (size_t)bytes);
    return;
  }
  uint64_t slice = BENCH_Z19_DENSE_SAMPLE / BENCH_Z19_SLICES & ~(uint64_t)1;
  for (int k = 0; k < BENCH_Z19_SLICES; k++) {
    uint64_t at = (bytes - slice) / (BENCH_Z19_SLICES - 1) * (uint64_t)k & ~(uint64_t)1;
    buf_put(sample, (const uint8_t *)new_bf16 + at, (size_t)slice);
  }
}

pulse_status bench_baselines_compute(const bench_table *t,
                                     const pulse_changes *changes,
                                     const uint16_t *new_bf16,
                                     bench_baseline_bytes *out) {
  memset(out, 0, sizeof *out);
  out->dense = t->total * 2;
  byte_buf idx = {0}, gap_abs = {0}, gap_xor = {0}, sample = {0};
  build_sparse(t, changes, &idx, &gap_abs, &gap_xor);
  dense_z19_sample(new_bf16, out->dense, &sample);
  pulse_status st = PULSE_OK;
  if (idx.failed || gap_abs.failed || gap_xor.failed || sample.failed) {
    st = PULSE_ERR_NOMEM;
  } else {
    out->int32_bf16 = idx.size;
    out->dense_z19_read = sample.size;
    const byte_buf *src[BENCH_ZKINDS] = {NULL, &idx, &gap_abs, &gap_xor};
    zstd_job jobs[BENCH_ZKINDS * BENCH_ZSTD_LEVELS];
    size_t n = 0;
    for (int k = 0; k < BENCH_ZKINDS; k++)
      for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
        zstd_job j = {NULL, 0, BENCH_ZSTD_LEVEL(l), &out->zstd[k][l], PULSE_OK};
        if (k != BENCH_DENSE_Z)
          j.src = src[k]->data, j.n = src[k]->size;
        else if (l == 2)
          j.src = sample.data, j.n = sample.size;
        else
          j.src = new_bf16, j.n = (size_t)out->dense;
        jobs[n++] = j;
      }
    /* The slowest first (level 19), so that two cores share them evenly. */
    for (size_t i = 0; i < n; i++)
      for (size_t k = i + 1; k < n; k++)
        if (jobs[k].level * (double)jobs[k].n > jobs[i].level * (double)jobs[i].n) {
          zstd_job x = jobs[i];
          jobs[i] = jobs[k], jobs[k] = x;
        }
    pulse_parallel_for(0, n, zstd_one, jobs);
    for (size_t i = 0; i < n && st == PULSE_OK; i++)
      st = jobs[i].st;
    if (st == PULSE_OK && sample.size < out->dense)
      out->zstd[BENCH_DENSE_Z][2] = (uint64_t)((double)out->zstd[BENCH_DENSE_Z][2] *
                                               (double)out->dense / (double)sample.size + 0.5);
  }
  free(idx.data);
  free(gap_abs.data);
  free(gap_xor.data);
  free(sample.data);
  return st;
}
