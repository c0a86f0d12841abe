/* bench_baselines.c - the encodings that format v1 is compared against:
 * dense BF16 (raw and zstd-1), int32 index + BF16 value (raw and zstd-1),
 * varint gaps + absolute values + zstd-1 (published production format
 * proxy), varint gaps + XOR byte planes + zstd-1. */
#include "bench_impl.h"

#include <stdlib.h>
#include <string.h>
#include <zstd.h>

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

/* zstd level 1 size of n bytes, or 0 with *st set on failure. */
static uint64_t zstd1_size(const void *src, size_t n, pulse_status *st) {
  size_t cap = ZSTD_compressBound(n);
  void *dst = malloc(cap ? cap : 1);
  if (dst == NULL) {
    *st = PULSE_ERR_NOMEM;
    return 0;
  }
  size_t r = ZSTD_compress(dst, cap, src, n, 1);
  free(dst);
  if (ZSTD_isError(r)) {
    *st = PULSE_ERR_INTERNAL;
    return 0;
  }
  return (uint64_t)r;
}

pulse_status bench_baselines_compute(const bench_table *t,
                                     const pulse_changes *changes,
                                     const uint16_t *new_bf16,
                                     bench_baseline_bytes *out) {
  pulse_status st = PULSE_OK;
  memset(out, 0, sizeof *out);
  out->dense = t->total * 2;
  out->dense_zstd = zstd1_size(new_bf16, (size_t)t->total * 2, &st);
  if (st != PULSE_OK)
    return st;

  byte_buf idx = {0}, gap_abs = {0}, gap_xor = {0};
  for (size_t i = 0; i < t->count; i++) {
    const pulse_changes *c = &changes[i];
    /* int32 index + BF16 value */
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u32(&idx, (uint32_t)c->pos[k]);
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u16(&idx, c->new_bits[k]);
    /* varint gaps, shared by the two gap encodings */
    size_t gaps_start_abs = gap_abs.size;
    uint64_t prev = 0;
    for (uint64_t k = 0; k < c->count; k++) {
      buf_put_varint(&gap_abs, c->pos[k] - prev);
      prev = c->pos[k] + 1;
    }
    if (!gap_abs.failed)
      buf_put(&gap_xor, gap_abs.data + gaps_start_abs,
              gap_abs.size - gaps_start_abs);
    for (uint64_t k = 0; k < c->count; k++)
      buf_put_u16(&gap_abs, c->new_bits[k]);
    for (uint64_t k = 0; k < c->count; k++) {
      uint8_t lo = (uint8_t)(c->old_bits[k] ^ c->new_bits[k]);
      buf_put(&gap_xor, &lo, 1);
    }
    for (uint64_t k = 0; k < c->count; k++) {
      uint8_t hi = (uint8_t)((c->old_bits[k] ^ c->new_bits[k]) >> 8);
      buf_put(&gap_xor, &hi, 1);
    }
  }
  if (idx.failed || gap_abs.failed || gap_xor.failed) {
    st = PULSE_ERR_NOMEM;
  } else {
    out->int32_bf16 = idx.size;
    out->int32_bf16_zstd = zstd1_size(idx.data, idx.size, &st);
    if (st == PULSE_OK)
      out->delta_abs_zstd = zstd1_size(gap_abs.data, gap_abs.size, &st);
    if (st == PULSE_OK)
      out->gap_xor_zstd = zstd1_size(gap_xor.data, gap_xor.size, &st);
  }
  free(idx.data);
  free(gap_abs.data);
  free(gap_xor.data);
  return st;
}
