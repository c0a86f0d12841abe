/* state.c - the global state a joining trainer loads (docs/formats/loco-state.md, "State"):
 * round, alpha, mu, theta_g and b, with digests. */
#include <stdlib.h>
#include <string.h>

#include "loco_impl.h"
#include "payload_impl.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

#define STATE_HEADER 48u

pulse_status pulse_loco_state_export(const pulse_loco *ctx, pulse_buffer *out) {
  if (ctx == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco state: NULL argument");
  out->data = NULL;
  out->size = 0;
  if (ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco state: a round is prepared");
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_u32(&b, LOCO_STATE_MAGIC);
  pulse_bytebuf_byte(&b, PULSE_LOCO_STATE_VERSION);
  pulse_bytebuf_byte(&b, 0);
  pulse_bytebuf_u16(&b, 0);
  pulse_bytebuf_u64(&b, ctx->round);
  pulse_bytebuf_u64(&b, ctx->n);
  pulse_bytebuf_u32(&b, pulse_f32_bits(ctx->opts.alpha));
  pulse_bytebuf_u32(&b, pulse_f32_bits(ctx->opts.mu));
  pulse_bytebuf_u64(&b, ctx->digest);
  pulse_bytebuf_u64(&b, pulse_loco_digest_f32(ctx->b, ctx->n));
  for (uint64_t i = 0; i < ctx->n; i++)
    pulse_bytebuf_u32(&b, pulse_f32_bits(ctx->theta_g[i]));
  for (uint64_t i = 0; i < ctx->n; i++)
    pulse_bytebuf_u32(&b, pulse_f32_bits(ctx->b[i]));
  if (b.failed) {
    pulse_bytebuf_free(&b);
    return pulse_fail(PULSE_ERR_NOMEM, "loco state: %llu parameters",
                      (unsigned long long)ctx->n);
  }
  out->data = b.data;
  out->size = b.size;
  return PULSE_OK;
}

static void read_f32s(const uint8_t *p, uint64_t n, float *dst) {
  for (uint64_t i = 0; i < n; i++, p += 4) {
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                 (uint32_t)p[3] << 24;
    memcpy(&dst[i], &u, 4);
  }
}

pulse_status pulse_loco_state_import(pulse_loco *ctx, const uint8_t *data,
                                     size_t size, float *theta_r) {
  if (ctx == NULL || (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco state: NULL argument");
  if (ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco state: a round is prepared (abandon it first)");
  pulse_reader r = pulse_reader_make(data, size);
  if (size < 4)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco state: %zu bytes", size);
  if ((uint32_t)pulse_reader_le(&r, 4) != LOCO_STATE_MAGIC)
    return pulse_fail(PULSE_ERR_MAGIC, "loco state: bad magic");
  if (size < STATE_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco state: header needs %u bytes",
                      STATE_HEADER);
  unsigned version = pulse_reader_u8(&r);
  uint64_t reserved = pulse_reader_le(&r, 3);
  uint64_t round = pulse_reader_le(&r, 8), n = pulse_reader_le(&r, 8);
  uint32_t alpha = (uint32_t)pulse_reader_le(&r, 4),
           mu = (uint32_t)pulse_reader_le(&r, 4);
  uint64_t dg = pulse_reader_le(&r, 8), db = pulse_reader_le(&r, 8);
  if (version != PULSE_LOCO_STATE_VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "loco state: version %u", version);
  if (reserved != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco state: reserved bits set");
  if (n != ctx->n)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "loco state: %llu parameters, this trainer "
                      "has %llu",
                      (unsigned long long)n, (unsigned long long)ctx->n);
  if (alpha != pulse_f32_bits(ctx->opts.alpha) ||
      mu != pulse_f32_bits(ctx->opts.mu))
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco state: another outer optimizer (alpha, mu)");
  uint64_t body = 8u * n; /* n <= 2^36: no overflow */
  if (r.left < body)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco state: %zu bytes of %llu",
                      r.left, (unsigned long long)body);
  if (r.left > body)
    return pulse_fail(PULSE_ERR_TRAILING,
                      "loco state: %zu bytes after the data",
                      (size_t)(r.left - body));
  float *g = malloc((size_t)n * sizeof *g), *b = malloc((size_t)n * sizeof *b);
  pulse_status st = PULSE_OK;
  if (g == NULL || b == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco state: %llu parameters",
                    (unsigned long long)n);
  } else {
    read_f32s(r.p, n, g);
    read_f32s(r.p + 4u * n, n, b);
    if (pulse_loco_digest_f32(g, n) != dg || pulse_loco_digest_f32(b, n) != db)
      st = pulse_fail(PULSE_ERR_CORRUPT, "loco state: digest mismatch");
  }
  if (st == PULSE_OK) {
    memcpy(ctx->theta_g, g, (size_t)n * sizeof *g);
    memcpy(ctx->b, b, (size_t)n * sizeof *b);
    ctx->round = round;
    ctx->need_state = 0;
    pulse_loco_refresh_(ctx);
    if (theta_r)
      memcpy(theta_r, ctx->theta_g, (size_t)n * sizeof *theta_r);
  }
  free(g), free(b);
  return st;
}
