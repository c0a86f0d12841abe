/* payload_decode.c - reads a round payload (docs/formats/loco-payload.md) from untrusted
 * bytes: every field, count, size, position and value is checked, and a bad
 * payload gives an error, never a crash or a partial result. */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "payload_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

pulse_status pulse_loco_payload_peek(const uint8_t *data, size_t size,
                                     pulse_loco_payload_header *hdr) {
  if (hdr == NULL || (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco payload: NULL argument");
  memset(hdr, 0, sizeof *hdr);
  if (size < 4)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco payload: %zu bytes", size);
  pulse_reader r = pulse_reader_make(data, size);
  if ((uint32_t)pulse_reader_le(&r, 4) != LOCO_PAYLOAD_MAGIC)
    return pulse_fail(PULSE_ERR_MAGIC, "loco payload: bad magic");
  if (size < LOCO_HEADER_SIZE)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "loco payload: header needs %u bytes, have %zu",
                      LOCO_HEADER_SIZE, size);
  pulse_loco_payload_header h;
  h.version = pulse_reader_u8(&r);
  h.flags = pulse_reader_u8(&r);
  h.pos_model = pulse_reader_u8(&r);
  h.values = pulse_reader_u8(&r);
  h.chunk_log2 = pulse_reader_u8(&r);
  uint64_t reserved = pulse_reader_le(&r, 3);
  h.sender = (uint32_t)pulse_reader_le(&r, 4);
  h.round = pulse_reader_le(&r, 8);
  h.samples = pulse_reader_le(&r, 8);
  h.param_count = pulse_reader_le(&r, 8);
  h.base_digest = pulse_reader_le(&r, 8);
  h.count = pulse_reader_le(&r, 8);
  if (h.version != PULSE_LOCO_PAYLOAD_VERSION)
    return pulse_fail(PULSE_ERR_VERSION,
                      "loco payload: version %u (this build reads %u)",
                      h.version, PULSE_LOCO_PAYLOAD_VERSION);
  if ((h.flags & ~LOCO_FLAGS_KNOWN) != 0 || reserved != 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco payload: unknown flags or reserved bits");
  if (h.pos_model > PULSE_POS_CLASS || h.values > PULSE_LOCO_VALUES_MODELED)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco payload: position model %u, value coding %u",
                      h.pos_model, h.values);
  if (h.chunk_log2 < LOCO_CHUNK_LOG2_MIN || h.chunk_log2 > LOCO_CHUNK_LOG2_MAX)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco payload: chunk_log2 %u",
                      h.chunk_log2);
  if (h.samples == 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco payload: zero samples");
  if (h.param_count == 0 || h.param_count > PULSE_LOCO_MAX_PARAMS)
    return pulse_fail(PULSE_ERR_OVERFLOW, "loco payload: %llu parameters",
                      (unsigned long long)h.param_count);
  if (h.count > h.param_count)
    return pulse_fail(
        PULSE_ERR_OVERFLOW, "loco payload: %llu entries of %llu parameters",
        (unsigned long long)h.count, (unsigned long long)h.param_count);
  *hdr = h;
  return PULSE_OK;
}

/* First pass over the chunk table: checks every count and size against the
 * header and the bytes, so the second pass can trust them. */
static pulse_status scan_table(const pulse_loco_payload_header *h,
                               pulse_reader *r, uint64_t *kmax) {
  uint64_t P = h->param_count,
           chunks = (P + (1ull << h->chunk_log2) - 1u) >> h->chunk_log2;
  uint64_t total_k = 0, streams = 0;
  *kmax = 0;
  for (uint64_t c = 0; c < chunks; c++) {
    uint64_t kc = pulse_reader_varint(r);
    if (!r->ok)
      return pulse_fail(PULSE_ERR_TRUNCATED,
                        "loco payload: chunk table ends at chunk %llu",
                        (unsigned long long)c);
    if (kc > loco_chunk_len(P, h->chunk_log2, c) || kc > h->count - total_k)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco payload: chunk %llu claims %llu entries",
                        (unsigned long long)c, (unsigned long long)kc);
    total_k += kc;
    *kmax = kc > *kmax ? kc : *kmax;
    if (kc == 0)
      continue;
    uint64_t ps = pulse_reader_varint(r), vs = pulse_reader_varint(r);
    if (!r->ok)
      return pulse_fail(PULSE_ERR_TRUNCATED,
                        "loco payload: chunk table ends at chunk %llu",
                        (unsigned long long)c);
    if (h->values == PULSE_LOCO_VALUES_RAW && vs != 4u * kc)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco payload: chunk %llu: %llu raw value bytes "
                        "for %llu entries",
                        (unsigned long long)c, (unsigned long long)vs,
                        (unsigned long long)kc);
    if (streams > r->left || ps > r->left - streams ||
        vs > r->left - streams - ps)
      return pulse_fail(PULSE_ERR_TRUNCATED,
                        "loco payload: chunk %llu streams exceed the "
                        "payload",
                        (unsigned long long)c);
    streams += ps + vs;
  }
  if (total_k != h->count)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco payload: chunks hold %llu entries, header "
                      "says %llu",
                      (unsigned long long)total_k,
                      (unsigned long long)h->count);
  if (streams != r->left)
    return pulse_fail(
        streams < r->left ? PULSE_ERR_TRAILING : PULSE_ERR_TRUNCATED,
        "loco payload: %zu bytes after the table, streams need %llu", r->left,
        (unsigned long long)streams);
  return PULSE_OK;
}

static pulse_status decode_values(const pulse_loco_payload_header *h,
                                  const uint8_t *s, size_t size,
                                  const float *theta_g, const uint16_t *tb,
                                  uint64_t first, const uint64_t *pos,
                                  const uint16_t *delta, uint32_t k,
                                  float *val) {
  int gated = (h->flags & PULSE_LOCO_PAYLOAD_GATED) != 0;
  loco_value_models *m = NULL;
  pulse_rc_dec d;
  memset(&d, 0, sizeof d);
  if (h->values == PULSE_LOCO_VALUES_MODELED) {
    if (!pulse_rc_dec_init(&d, s, size))
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco payload: value stream is not a range-coder "
                        "stream");
    m = malloc(sizeof *m);
    if (m == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco payload: value models");
    loco_value_models_reset(m);
  }
  pulse_status st = PULSE_OK;
  for (uint32_t j = 0; j < k; j++) {
    uint64_t p = pos[j];
    uint16_t t = tb[p - first];
    uint32_t bits;
    if (m == NULL) {
      const uint8_t *q = s + 4u * (size_t)j;
      bits = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
             (uint32_t)q[3] << 24;
    } else {
      bits = loco_value_get(&d, m, t, delta[j], gated);
    }
    if (((bits >> 23) & 0xFFu) == 0xFFu) {
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco payload: value at %llu is not finite",
                      (unsigned long long)p);
      break;
    }
    float v;
    memcpy(&v, &bits, 4);
    if (gated) {
      float moved = theta_g[p] - v;
      uint16_t want =
          pulse_bf16_delta(t, pulse_bf16_from_f32_bits(pulse_f32_bits(moved)));
      if (want != delta[j]) {
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "loco payload: entry at %llu does not match its "
                        "gate",
                        (unsigned long long)p);
        break;
      }
    } else if (delta[j] != 1) {
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco payload: ungated entry at %llu with a delta",
                      (unsigned long long)p);
      break;
    }
    val[j] = v;
  }
  if (st == PULSE_OK && m != NULL && !pulse_rc_dec_finished_exactly(&d))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco payload: value stream length does not match");
  free(m);
  return st;
}

pulse_status pulse_loco_payload_decode(const uint8_t *data, size_t size,
                                       const float *theta_g,
                                       const uint16_t *theta_bf16, uint64_t P,
                                       pulse_loco_payload_header *hdr,
                                       pulse_loco_entries *out) {
  if (out == NULL || hdr == NULL || theta_g == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco payload decode: NULL argument");
  pulse_loco_entries_free(out);
  pulse_loco_payload_header h;
  PULSE_TRY(pulse_loco_payload_peek(data, size, &h));
  if (h.param_count != P)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "loco payload: %llu parameters, receiver has "
                      "%llu",
                      (unsigned long long)h.param_count, (unsigned long long)P);
  pulse_reader r =
      pulse_reader_make(data + LOCO_HEADER_SIZE, size - LOCO_HEADER_SIZE);
  uint64_t kmax;
  PULSE_TRY(scan_table(&h, &r, &kmax));
  const uint8_t *streams = r.p;

  uint64_t csize = 1ull << h.chunk_log2;
  pulse_loco_entries e = {h.count, malloc((size_t)h.count * sizeof *e.pos + 8),
                          malloc((size_t)h.count * sizeof *e.val + 4)};
  uint16_t *delta = malloc((size_t)kmax * sizeof *delta + 2);
  uint16_t *base =
      theta_bf16 ? NULL : malloc((size_t)(P < csize ? P : csize) * 2);
  pulse_status st = PULSE_OK;
  if (e.pos == NULL || e.val == NULL || delta == NULL ||
      (theta_bf16 == NULL && base == NULL)) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco payload decode: %llu entries",
                    (unsigned long long)h.count);
    goto done;
  }
  /* Second pass: the table is known good. */
  pulse_reader t = pulse_reader_make(
      data + LOCO_HEADER_SIZE, (size_t)(streams - data) - LOCO_HEADER_SIZE);
  uint64_t chunks = (P + csize - 1u) >> h.chunk_log2, off = 0;
  for (uint64_t c = 0; c < chunks; c++) {
    uint64_t kc = pulse_reader_varint(&t);
    if (kc == 0)
      continue;
    size_t ps = (size_t)pulse_reader_varint(&t),
           vs = (size_t)pulse_reader_varint(&t);
    uint64_t first = c << h.chunk_log2, n = loco_chunk_len(P, h.chunk_log2, c);
    const uint16_t *tb = theta_bf16 ? theta_bf16 + first : base;
    if (theta_bf16 == NULL)
      pulse_bf16_cast_f32(theta_g + first, base, n);
    st = pulse_chunk_decode(1, NULL, (pulse_pos_model)h.pos_model, tb,
                            (uint32_t)n, streams, ps, (uint32_t)kc, first,
                            e.pos + off, delta);
    if (st != PULSE_OK)
      goto done;
    streams += ps;
    st = decode_values(&h, streams, vs, theta_g, tb, first, e.pos + off, delta,
                       (uint32_t)kc, e.val + off);
    if (st != PULSE_OK)
      goto done;
    streams += vs;
    off += kc;
  }
  *hdr = h;
  *out = e;
  e.pos = NULL, e.val = NULL;
done:
  free(e.pos), free(e.val), free(delta), free(base);
  return st;
}
