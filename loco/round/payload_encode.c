/* payload_encode.c - a trainer's round payload (docs/formats/loco-payload.md): header, chunk
 * table, then per chunk the positions (codec/coding/chunk_coder.c, the codec's
 * position coder, over the BF16 bits of theta_g) and the FP32 values. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "payload_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

void pulse_loco_entries_free(pulse_loco_entries *e) {
  if (e == NULL)
    return;
  free(e->pos);
  free(e->val);
  *e = (pulse_loco_entries)PULSE_LOCO_ENTRIES_INIT;
}

static void put_header(pulse_bytebuf *b, const pulse_loco_payload_header *h) {
  pulse_bytebuf_u32(b, LOCO_PAYLOAD_MAGIC);
  pulse_bytebuf_byte(b, (uint8_t)h->version);
  pulse_bytebuf_byte(b, (uint8_t)h->flags);
  pulse_bytebuf_byte(b, (uint8_t)h->pos_model);
  pulse_bytebuf_byte(b, (uint8_t)h->values);
  pulse_bytebuf_byte(b, (uint8_t)h->chunk_log2);
  pulse_bytebuf_byte(b, 0);
  pulse_bytebuf_u16(b, 0);
  pulse_bytebuf_u32(b, h->sender);
  pulse_bytebuf_u64(b, h->round);
  pulse_bytebuf_u64(b, h->samples);
  pulse_bytebuf_u64(b, h->param_count);
  pulse_bytebuf_u64(b, h->base_digest);
  pulse_bytebuf_u64(b, h->count);
}

/* Scratch for one chunk, sized for the largest. */
typedef struct {
  uint32_t *rel;
  uint16_t *delta;
  uint16_t *base; /* only when the caller gave no theta_bf16 */
} chunk_scratch;

static pulse_status encode_values(const pulse_loco_payload_header *h,
                                  const uint16_t *tb, const uint64_t *pos,
                                  uint64_t first, const float *val,
                                  const uint16_t *delta, uint32_t k,
                                  pulse_bytebuf *out) {
  if (h->values == PULSE_LOCO_VALUES_RAW) {
    for (uint32_t j = 0; j < k; j++)
      pulse_bytebuf_u32(out, pulse_f32_bits(val[j]));
    return PULSE_OK;
  }
  loco_value_models *m = malloc(sizeof *m);
  if (m == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco payload: value models");
  loco_value_models_reset(m);
  int gated = (h->flags & PULSE_LOCO_PAYLOAD_GATED) != 0;
  pulse_rc_enc e;
  pulse_rc_enc_init(&e, out);
  for (uint32_t j = 0; j < k; j++)
    loco_value_put(&e, m, tb[pos[j] - first], delta[j], gated,
                   pulse_f32_bits(val[j]));
  pulse_rc_enc_flush(&e);
  free(m);
  return PULSE_OK;
}

/* One encoding with a fixed position model. */
static pulse_status encode_with(const pulse_loco_payload_header *h,
                                const float *theta_g,
                                const uint16_t *theta_bf16, const uint64_t *pos,
                                const float *val, chunk_scratch *sc,
                                pulse_buffer *out) {
  uint64_t P = h->param_count, k = h->count;
  unsigned log2 = h->chunk_log2;
  uint64_t chunks = (P + (1ull << log2) - 1u) >> log2;
  pulse_bytebuf table = PULSE_BYTEBUF_INIT, data = PULSE_BYTEBUF_INIT;
  pulse_status st = PULSE_OK;
  int gated = (h->flags & PULSE_LOCO_PAYLOAD_GATED) != 0;
  uint64_t j = 0;
  for (uint64_t c = 0; c < chunks && st == PULSE_OK; c++) {
    uint64_t first = c << log2, n = loco_chunk_len(P, log2, c);
    uint64_t a = j;
    while (j < k && pos[j] < first + n)
      j++;
    uint32_t kc = (uint32_t)(j - a);
    pulse_bytebuf_varint(&table, kc);
    if (kc == 0)
      continue;
    const uint16_t *tb = theta_bf16 ? theta_bf16 + first : sc->base;
    if (theta_bf16 == NULL)
      pulse_bf16_cast_f32(theta_g + first, sc->base, n);
    for (uint32_t t = 0; t < kc; t++) {
      uint64_t p = pos[a + t];
      sc->rel[t] = (uint32_t)(p - first);
      if (gated) {
        float moved = theta_g[p] - val[a + t];
        sc->delta[t] = pulse_bf16_delta(
            tb[p - first], pulse_bf16_from_f32_bits(pulse_f32_bits(moved)));
      } else {
        sc->delta[t] = 1;
      }
    }
    size_t before = data.size;
    st = pulse_chunk_encode(1, NULL, (pulse_pos_model)h->pos_model, tb,
                            (uint32_t)n, sc->rel, sc->delta, kc, &data);
    if (st != PULSE_OK)
      break;
    size_t mid = data.size;
    st = encode_values(h, tb, pos + a, first, val + a, sc->delta, kc, &data);
    pulse_bytebuf_varint(&table, mid - before);
    pulse_bytebuf_varint(&table, data.size - mid);
  }
  if (st == PULSE_OK) {
    pulse_bytebuf whole = PULSE_BYTEBUF_INIT;
    put_header(&whole, h);
    if (table.size)
      pulse_bytebuf_put(&whole, table.data, table.size);
    if (data.size)
      pulse_bytebuf_put(&whole, data.data, data.size);
    if (whole.failed || table.failed || data.failed) {
      pulse_bytebuf_free(&whole);
      st = pulse_fail(PULSE_ERR_NOMEM, "loco payload: output buffer");
    } else {
      out->data = whole.data;
      out->size = whole.size;
    }
  }
  pulse_bytebuf_free(&table);
  pulse_bytebuf_free(&data);
  return st;
}

static pulse_status check_args(const pulse_loco_payload_header *hdr,
                               const float *theta_g, uint64_t P,
                               const uint64_t *pos, const float *val,
                               uint64_t k) {
  if (hdr == NULL || theta_g == NULL || (k > 0 && (pos == NULL || val == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "loco payload encode: NULL argument");
  if (P == 0 || P > PULSE_LOCO_MAX_PARAMS || k > P)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco payload encode: %llu entries of %llu parameters",
                      (unsigned long long)k, (unsigned long long)P);
  if ((hdr->flags & ~LOCO_FLAGS_KNOWN) != 0 || hdr->samples == 0 ||
      hdr->values > PULSE_LOCO_VALUES_MODELED ||
      (hdr->pos_model > PULSE_POS_CLASS &&
       hdr->pos_model != PULSE_POS_AUTO) ||
      hdr->chunk_log2 < LOCO_CHUNK_LOG2_MIN ||
      hdr->chunk_log2 > LOCO_CHUNK_LOG2_MAX)
    return pulse_fail(PULSE_ERR_ARG, "loco payload encode: bad header field");
  int gated = (hdr->flags & PULSE_LOCO_PAYLOAD_GATED) != 0;
  for (uint64_t j = 0; j < k; j++) {
    if (pos[j] >= P || (j > 0 && pos[j] <= pos[j - 1]))
      return pulse_fail(PULSE_ERR_ARG,
                        "loco payload encode: position %llu out of order",
                        (unsigned long long)j);
    if (!isfinite(val[j]))
      return pulse_fail(PULSE_ERR_ARG,
                        "loco payload encode: value %llu is not finite",
                        (unsigned long long)j);
    if (gated && !pulse_loco_gate(theta_g[pos[j]], val[j]))
      return pulse_fail(PULSE_ERR_ARG,
                        "loco payload encode: entry %llu fails the gate",
                        (unsigned long long)j);
  }
  return PULSE_OK;
}

pulse_status pulse_loco_payload_encode(const pulse_loco_payload_header *hdr,
                                       const float *theta_g,
                                       const uint16_t *theta_bf16, uint64_t P,
                                       const uint64_t *pos, const float *val,
                                       uint64_t k, pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco payload encode: NULL output");
  out->data = NULL;
  out->size = 0;
  PULSE_TRY(check_args(hdr, theta_g, P, pos, val, k));
  pulse_loco_payload_header h = *hdr;
  h.version = PULSE_LOCO_PAYLOAD_VERSION;
  h.param_count = P;
  h.count = k;

  /* Scratch for the largest chunk's entries. */
  uint64_t csize = 1ull << h.chunk_log2, kmax = 0;
  for (uint64_t j = 0, c = 0; j < k; c++) {
    uint64_t a = j;
    while (j < k && pos[j] < (c + 1) * csize)
      j++;
    kmax = j - a > kmax ? j - a : kmax;
  }
  chunk_scratch sc = {malloc((size_t)kmax * sizeof *sc.rel + 4),
                      malloc((size_t)kmax * sizeof *sc.delta + 2),
                      theta_bf16 ? NULL
                                 : malloc((size_t)(P < csize ? P : csize) * 2)};
  pulse_status st = PULSE_OK;
  if (sc.rel == NULL || sc.delta == NULL ||
      (theta_bf16 == NULL && sc.base == NULL)) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco payload encode: %llu entries",
                    (unsigned long long)k);
  } else if (h.pos_model != PULSE_POS_AUTO) {
    st = encode_with(&h, theta_g, theta_bf16, pos, val, &sc, out);
  } else {
    pulse_buffer plain = {NULL, 0}, cls = {NULL, 0};
    h.pos_model = PULSE_POS_PLAIN;
    st = encode_with(&h, theta_g, theta_bf16, pos, val, &sc, &plain);
    if (st == PULSE_OK) {
      h.pos_model = PULSE_POS_CLASS;
      st = encode_with(&h, theta_g, theta_bf16, pos, val, &sc, &cls);
    }
    if (st == PULSE_OK && cls.size < plain.size) {
      *out = cls;
      pulse_buffer_free(&plain);
    } else if (st == PULSE_OK) {
      *out = plain;
      pulse_buffer_free(&cls);
    } else {
      pulse_buffer_free(&plain);
      pulse_buffer_free(&cls);
    }
  }
  free(sc.rel), free(sc.delta), free(sc.base);
  return st;
}
