/* partition_blob.c - the reduced-range blob (PLRD, docs/protocols/loco-collaboration.md "Partitioned
 * averaging"): written by a range owner, read from untrusted bytes by
 * every trainer of the round. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "loco_impl.h"
#include "partition_blob_impl.h"
#include "payload_impl.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

/* The averages' scale q (docs/protocols/loco-collaboration.md "Reduced range"): a mean is
 * sum(s_c v_c) / W with each v_c on theta_g's FP32 grid, so with W / G a
 * power of two 2^q (G the samples' gcd) the mean sits on that grid over
 * 2^q. The value model predicts zero low bits from the exponent gap to
 * theta_g; coding mean * 2^q (exact: an exponent shift) makes that
 * prediction right. The rule's q is 0 when W / G is not a power of two or
 * the denominator is not W (keep rule with absent members). */
static unsigned scale_rule(const pulse_loco *ctx, uint64_t weight, uint32_t n,
                           const pulse_loco_receipt *rc) {
  if (weight == 0 || pulse_loco_denominator_(ctx, weight, n) != (double)weight)
    return 0;
  uint64_t g = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t a = g, b = rc[i].samples;
    while (b != 0) {
      uint64_t t = a % b;
      a = b, b = t;
    }
    g = a;
  }
  uint64_t ratio = g ? weight / g : 0;
  if (ratio == 0 || (ratio & (ratio - 1u)) != 0)
    return 0;
  unsigned q = 0;
  while ((1ull << q) < ratio)
    q++;
  return q > LOCO_REDUCED_MAX_SCALE ? 0 : q;
}

/* Whether every value times 2^q stays finite (then it comes back exactly:
 * scaling up loses no bit). Else the blob is coded with q = 0. */
static int scale_fits(const float *val, uint64_t k, unsigned q) {
  for (uint64_t j = 0; j < k; j++)
    if (!isfinite(ldexpf(val[j], (int)q)))
      return 0;
  return 1;
}

pulse_status loco_reduced_encode(const pulse_loco *ctx,
                                 const loco_reduced_head *head,
                                 const pulse_loco_receipt *rc,
                                 const uint64_t *pos, const float *val,
                                 uint64_t k, pulse_buffer *out) {
  unsigned q = scale_rule(ctx, head->weight, head->ncontrib, rc);
  if (!scale_fits(val, k, q))
    q = 0;
  float *scaled = NULL;
  if (q > 0) {
    scaled = malloc((size_t)k * sizeof *scaled + 4);
    if (scaled == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco reduced: %llu averages",
                        (unsigned long long)k);
    for (uint64_t j = 0; j < k; j++)
      scaled[j] = ldexpf(val[j], (int)q);
    val = scaled;
  }
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.flags = 0; /* means pass no gate */
  h.pos_model = ctx->opts.pos_model;
  h.values = ctx->opts.values;
  h.chunk_log2 = ctx->opts.chunk_log2;
  h.sender = head->owner;
  h.round = head->round;
  h.samples = head->weight;
  h.base_digest = head->base_digest;
  pulse_buffer avg = {NULL, 0};
  pulse_status st = pulse_loco_payload_encode(&h, ctx->theta_g, ctx->theta_bf16,
                                              ctx->n, pos, val, k, &avg);
  free(scaled);
  PULSE_TRY(st);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_u32(&b, LOCO_REDUCED_MAGIC);
  pulse_bytebuf_byte(&b, PULSE_LOCO_REDUCED_VERSION);
  pulse_bytebuf_byte(&b, (uint8_t)q);
  pulse_bytebuf_byte(&b, ctx->opts.gate_mean ? LOCO_REDUCED_GATED_MEANS : 0);
  pulse_bytebuf_byte(&b, 0);
  pulse_bytebuf_u32(&b, head->owner);
  pulse_bytebuf_u32(&b, head->members);
  pulse_bytebuf_u64(&b, head->round);
  pulse_bytebuf_u64(&b, head->param_count);
  pulse_bytebuf_u64(&b, head->base_digest);
  pulse_bytebuf_u64(&b, head->start);
  pulse_bytebuf_u64(&b, head->end);
  pulse_bytebuf_u32(&b, head->ncontrib);
  pulse_bytebuf_u32(&b, 0);
  for (uint32_t i = 0; i < head->ncontrib; i++) {
    pulse_bytebuf_u32(&b, rc[i].id);
    pulse_bytebuf_u64(&b, rc[i].samples);
    pulse_bytebuf_u64(&b, rc[i].entries);
    pulse_bytebuf_u64(&b, rc[i].receipt);
  }
  pulse_bytebuf_put(&b, avg.data, avg.size);
  pulse_buffer_free(&avg);
  if (b.failed) {
    pulse_bytebuf_free(&b);
    return pulse_fail(PULSE_ERR_NOMEM, "loco reduced: blob");
  }
  out->data = b.data, out->size = b.size;
  return PULSE_OK;
}

void pulse_loco_reduced_free(pulse_loco_reduced *r) {
  if (r == NULL)
    return;
  free(r->contrib);
  pulse_loco_entries_free(&r->avg);
  *r = (pulse_loco_reduced)PULSE_LOCO_REDUCED_INIT;
}

pulse_status pulse_loco_reduced_decode(const pulse_loco *ctx,
                                       const pulse_loco_plan *plan, uint32_t k,
                                       const uint64_t *expected_samples,
                                       const uint8_t *data, size_t size,
                                       pulse_loco_reduced *out) {
  if (out == NULL || ctx == NULL || plan == NULL || k >= plan->count ||
      (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco reduced: bad argument");
  pulse_loco_reduced_free(out);
  if (size < 4)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco reduced: %zu bytes", size);
  pulse_reader r = pulse_reader_make(data, size);
  if ((uint32_t)pulse_reader_le(&r, 4) != LOCO_REDUCED_MAGIC)
    return pulse_fail(PULSE_ERR_MAGIC, "loco reduced: bad magic");
  if (size < LOCO_REDUCED_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco reduced: header of %zu bytes",
                      size);
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
  unsigned version = pulse_reader_u8(&r);
  unsigned q = pulse_reader_u8(&r);
  unsigned flags = pulse_reader_u8(&r);
  uint64_t reserved = pulse_reader_u8(&r);
  d.owner = (uint32_t)pulse_reader_le(&r, 4);
  d.members = (uint32_t)pulse_reader_le(&r, 4);
  d.round = pulse_reader_le(&r, 8);
  d.param_count = pulse_reader_le(&r, 8);
  d.base_digest = pulse_reader_le(&r, 8);
  d.start = pulse_reader_le(&r, 8);
  d.end = pulse_reader_le(&r, 8);
  uint64_t n = pulse_reader_le(&r, 4);
  reserved |= pulse_reader_le(&r, 4);
  if (version != PULSE_LOCO_REDUCED_VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "loco reduced: version %u", version);
  if (reserved != 0 || q > LOCO_REDUCED_MAX_SCALE ||
      (flags & ~LOCO_REDUCED_GATED_MEANS) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reduced: reserved bits set, flags 0x%x or scale "
                      "%u",
                      flags, q);
  if ((flags & LOCO_REDUCED_GATED_MEANS) != (ctx->opts.gate_mean ? 1u : 0u))
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reduced: the means are %sgated, this trainer's "
                      "gate_mean is %s (every trainer must use the same "
                      "setting)",
                      flags ? "" : "not ", ctx->opts.gate_mean ? "on" : "off");
  if (d.param_count != ctx->n)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "loco reduced: %llu parameters, this trainer has %llu",
                      (unsigned long long)d.param_count,
                      (unsigned long long)ctx->n);
  if (d.round != ctx->round)
    return pulse_fail(PULSE_ERR_BASE_STEP, "loco reduced: round %llu",
                      (unsigned long long)d.round);
  if (d.base_digest != ctx->digest)
    return pulse_fail(PULSE_ERR_BASE_DIGEST,
                      "loco reduced: built on another theta_g");
  if (d.owner != plan->ids[k] || d.start != plan->start[k] ||
      d.end != plan->start[k + 1] || n != plan->count ||
      d.members != ctx->members)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reduced: owner %u, range [%llu, %llu), %llu "
                      "contributors or members do not fit the plan",
                      d.owner, (unsigned long long)d.start,
                      (unsigned long long)d.end, (unsigned long long)n);
  if (r.left / LOCO_REDUCED_RECEIPT < n)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco reduced: receipts cut");
  d.ncontrib = (uint32_t)n;
  d.contrib = calloc((size_t)n, sizeof *d.contrib);
  if (d.contrib == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco reduced: receipts");
  pulse_status st = PULSE_OK;
  uint64_t weight = 0;
  for (uint32_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_loco_receipt *c = &d.contrib[i];
    c->id = (uint32_t)pulse_reader_le(&r, 4);
    c->samples = pulse_reader_le(&r, 8);
    c->entries = pulse_reader_le(&r, 8);
    c->receipt = pulse_reader_le(&r, 8);
    if (c->id != plan->ids[i] || c->samples == 0 ||
        (expected_samples && c->samples != expected_samples[i]) ||
        c->entries > d.end - d.start || c->samples > UINT64_MAX - weight)
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reduced: receipt %u (id %u) does not fit", i,
                      c->id);
    else
      weight += c->samples;
  }
  pulse_loco_payload_header h;
  if (st == PULSE_OK)
    st = pulse_loco_payload_decode(r.p, r.left, ctx->theta_g, ctx->theta_bf16,
                                   ctx->n, &h, &d.avg);
  if (st == PULSE_OK &&
      (h.flags != 0 || h.sender != d.owner || h.round != d.round ||
       h.samples != weight || h.base_digest != d.base_digest ||
       (d.avg.count > 0 && (d.avg.pos[0] < d.start ||
                            d.avg.pos[d.avg.count - 1] >= d.end))))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco reduced: averages of owner %u do not fit its "
                    "header or range",
                    d.owner);
  /* The averages were coded times 2^q, q the rule's (0 only when a value
   * would not fit scaled). */
  unsigned want = st == PULSE_OK ? scale_rule(ctx, weight, d.ncontrib, d.contrib) : 0;
  for (uint64_t j = 0; st == PULSE_OK && q > 0 && j < d.avg.count; j++)
    d.avg.val[j] = ldexpf(d.avg.val[j], -(int)q);
  if (st == PULSE_OK && q != want &&
      (q != 0 || scale_fits(d.avg.val, d.avg.count, want)))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco reduced: averages of owner %u scaled by 2^%u, "
                    "not 2^%u",
                    d.owner, q, want);
  if (st != PULSE_OK) {
    pulse_loco_reduced_free(&d);
    return st;
  }
  *out = d;
  return PULSE_OK;
}
