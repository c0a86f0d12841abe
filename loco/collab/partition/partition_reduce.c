/* partition_reduce.c - the slices a trainer sends to range owners, the
 * owner's reduction of its range and the reduced-range blob (PLRD,
 * docs/protocols/loco-collaboration.md "Partitioned averaging"). The reduction sums in increasing
 * sender id in double and rounds once through pulse_loco_mean_, as
 * pulse_loco_finish does, so a partitioned round gives its bits. */
#include <stdlib.h>
#include <string.h>

#include "loco_impl.h"
#include "manifest_impl.h"
#include "partition_blob_impl.h"
#include "payload_impl.h"
#include "pulse_loco_elem.h"
#include "pulse_loco_partition.h"
#include "status_impl.h"

/* First entry at or after `at` of a strictly increasing list. */
static uint64_t lower_bound(const uint64_t *pos, uint64_t n, uint64_t at) {
  uint64_t lo = 0, hi = n;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (pos[mid] < at)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

pulse_status pulse_loco_slice_encode(const pulse_loco *ctx, uint64_t start,
                                     uint64_t end, pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco slice: NULL output");
  out->data = NULL, out->size = 0;
  if (ctx == NULL || !ctx->prepared || start > end || end > ctx->n)
    return pulse_fail(PULSE_ERR_ARG, "loco slice: no prepared round or range "
                                     "outside the vector");
  pulse_loco_payload_header h;
  PULSE_TRY(pulse_loco_payload_peek(ctx->payload.data, ctx->payload.size, &h));
  h.pos_model = ctx->opts.pos_model;
  uint64_t a = lower_bound(ctx->sent_pos, ctx->sent_count, start),
           b = lower_bound(ctx->sent_pos, ctx->sent_count, end);
  return pulse_loco_payload_encode(&h, ctx->theta_g, ctx->theta_bf16, ctx->n,
                                   ctx->sent_pos + a, ctx->sent_val + a, b - a,
                                   out);
}

uint64_t pulse_loco_receipt_digest(uint32_t sender, uint64_t samples,
                                   const uint64_t *pos, const float *val,
                                   uint64_t count) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_u32(&b, sender);
  pulse_bytebuf_u64(&b, samples);
  for (uint64_t j = 0; j < count; j++) {
    pulse_bytebuf_u64(&b, pos[j]);
    pulse_bytebuf_u32(&b, pulse_f32_bits(val[j]));
  }
  uint8_t sha[32];
  /* Out of memory: a digest nobody matches (the round then fails). */
  if (b.failed)
    memset(sha, 0xFF, sizeof sha);
  else
    loco_sha256(b.data, b.size, sha);
  pulse_bytebuf_free(&b);
  return pulse_load_le64(sha);
}

uint64_t pulse_loco_own_receipt(const pulse_loco *ctx, uint64_t start,
                                uint64_t end) {
  if (ctx == NULL || !ctx->prepared)
    return 0;
  uint64_t a = lower_bound(ctx->sent_pos, ctx->sent_count, start),
           b = lower_bound(ctx->sent_pos, ctx->sent_count, end);
  return pulse_loco_receipt_digest(ctx->opts.trainer_id, ctx->samples,
                                   ctx->sent_pos + a, ctx->sent_val + a, b - a);
}

uint64_t pulse_loco_own_entries_(const pulse_loco *ctx, uint64_t start,
                                 uint64_t end) {
  return lower_bound(ctx->sent_pos, ctx->sent_count, end) -
         lower_bound(ctx->sent_pos, ctx->sent_count, start);
}

/* ---------------------------------------------------------------- reducer */

struct pulse_loco_reducer {
  const pulse_loco *ctx;
  pulse_loco_plan plan;
  uint32_t k;
  uint64_t start, end;
  uint64_t *expected; /* NULL: any samples */
  uint8_t *have;
  uint8_t *leaving; /* the contributor's payload is its flush */
  uint64_t *samples;
  pulse_loco_entries *parts; /* each contributor's entries in the range */
};

void pulse_loco_reducer_free(pulse_loco_reducer *r) {
  if (r == NULL)
    return;
  for (uint32_t i = 0; r->parts && i < r->plan.count; i++)
    pulse_loco_entries_free(&r->parts[i]);
  free(r->parts), free(r->have), free(r->leaving), free(r->samples),
      free(r->expected);
  free(r);
}

pulse_status pulse_loco_reducer_create(const pulse_loco *ctx,
                                       const pulse_loco_plan *plan, uint32_t k,
                                       const uint64_t *expected_samples,
                                       pulse_loco_reducer **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco reducer: NULL output");
  *out = NULL;
  if (ctx == NULL || plan == NULL || !ctx->prepared || k >= plan->count ||
      plan->param_count != ctx->n)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco reducer: no prepared round, or a plan of "
                      "another vector");
  pulse_loco_reducer *r = calloc(1, sizeof *r);
  if (r == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco reducer");
  r->ctx = ctx;
  r->plan = *plan;
  r->k = k;
  r->start = plan->start[k], r->end = plan->start[k + 1];
  size_t n = plan->count;
  r->have = calloc(n, 1);
  r->leaving = calloc(n, 1);
  r->samples = calloc(n, sizeof *r->samples);
  r->parts = calloc(n, sizeof *r->parts);
  if (expected_samples) {
    r->expected = malloc(n * sizeof *r->expected);
    if (r->expected)
      memcpy(r->expected, expected_samples, n * sizeof *r->expected);
  }
  if (!r->have || !r->leaving || !r->samples || !r->parts ||
      (expected_samples && !r->expected)) {
    pulse_loco_reducer_free(r);
    return pulse_fail(PULSE_ERR_NOMEM, "loco reducer");
  }
  *out = r;
  return PULSE_OK;
}

pulse_status pulse_loco_reducer_add(pulse_loco_reducer *r, const uint8_t *data,
                                    size_t size) {
  if (r == NULL || (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco reducer: NULL argument");
  pulse_loco_payload_header h;
  PULSE_TRY(pulse_loco_payload_peek(data, size, &h));
  int i = pulse_loco_plan_index(&r->plan, h.sender);
  if (i < 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reducer: sender %u is not a contributor",
                      h.sender);
  if (r->have[i])
    return pulse_fail(PULSE_ERR_DUPLICATE,
                      "loco reducer: sender %u already added", h.sender);
  if (r->expected && h.samples != r->expected[i])
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco reducer: sender %u claims %llu samples, the "
                      "round granted %llu",
                      h.sender, (unsigned long long)h.samples,
                      (unsigned long long)r->expected[i]);
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  PULSE_TRY(pulse_loco_check_decode_(r->ctx, data, size, &h, &e));
  /* Keep the range only (a whole payload serves as well as a slice). */
  uint64_t a = lower_bound(e.pos, e.count, r->start),
           b = lower_bound(e.pos, e.count, r->end);
  memmove(e.pos, e.pos + a, (size_t)(b - a) * sizeof *e.pos);
  memmove(e.val, e.val + a, (size_t)(b - a) * sizeof *e.val);
  e.count = b - a;
  r->parts[i] = e;
  r->samples[i] = h.samples;
  r->leaving[i] = (h.flags & PULSE_LOCO_PAYLOAD_LEAVING) != 0;
  r->have[i] = 1;
  return PULSE_OK;
}

int pulse_loco_reducer_complete(const pulse_loco_reducer *r) {
  for (uint32_t i = 0; r && i < r->plan.count; i++)
    if (!r->have[i])
      return 0;
  return r != NULL;
}

pulse_status pulse_loco_reducer_finish(pulse_loco_reducer *r,
                                       pulse_buffer *blob) {
  if (blob == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco reducer: NULL output");
  blob->data = NULL, blob->size = 0;
  if (!pulse_loco_reducer_complete(r))
    return pulse_fail(PULSE_ERR_ARG, "loco reducer: a contributor is missing");
  const pulse_loco *ctx = r->ctx;
  uint32_t N = r->plan.count;
  uint64_t weight = 0, len = r->end - r->start;
  for (uint32_t i = 0; i < N; i++) {
    if (r->samples[i] > UINT64_MAX - weight)
      return pulse_fail(PULSE_ERR_OVERFLOW,
                        "loco reducer: sample counts overflow");
    weight += r->samples[i];
  }
  double *acc = calloc((size_t)len + 1, sizeof *acc);
  uint32_t *senders = calloc((size_t)len + 1, sizeof *senders);
  uint8_t *exempt = calloc((size_t)len + 1, 1);
  uint64_t *pos = NULL;
  float *val = NULL;
  pulse_status st = PULSE_OK;
  if (acc == NULL || senders == NULL || exempt == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco reducer: %llu parameters",
                    (unsigned long long)len);
    goto done;
  }
  /* pulse_loco_finish's sum: senders in increasing id (the plan's order),
   * each adding samples * value in double. */
  uint64_t k = 0;
  for (uint32_t i = 0; i < N; i++) {
    double w = (double)r->samples[i];
    for (uint64_t j = 0; j < r->parts[i].count; j++) {
      uint64_t p = r->parts[i].pos[j] - r->start;
      acc[p] += w * (double)r->parts[i].val[j];
      k += senders[p] == 0;
      senders[p]++;
      exempt[p] |= r->leaving[i];
    }
  }
  pos = malloc((size_t)k * sizeof *pos + 8);
  val = malloc((size_t)k * sizeof *val + 4);
  if (pos == NULL || val == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco reducer: %llu entries",
                    (unsigned long long)k);
    goto done;
  }
  /* Under gate_mean only the means the gate accepts (pulse_loco_gate_mean_
   * with the senders counted here: this owner has every contributor's
   * slice of its range, as pulse_loco_finish has every payload, so the
   * same decision): a mean not written is +0.0 at the reader, not
   * applied, as in pulse_loco_finish; an accepted one is written as it is
   * (even 0), so the readers apply pulse_loco_finish's bits. */
  double wsum = pulse_loco_denominator_(ctx, weight, N);
  uint64_t kept = 0;
  for (uint64_t p = 0; p < len; p++)
    if (senders[p]) {
      uint64_t at = r->start + p;
      float m = pulse_loco_mean_(acc[p], wsum);
      if (!pulse_loco_gate_mean_(ctx, ctx->theta_g[at], m, senders[p],
                                 exempt[p]))
        continue;
      pos[kept] = at;
      val[kept++] = m;
    }
  k = kept;
  loco_reduced_head head;
  memset(&head, 0, sizeof head);
  head.owner = r->plan.ids[r->k];
  head.members = ctx->members;
  head.round = ctx->round;
  head.param_count = ctx->n;
  head.base_digest = ctx->digest;
  head.start = r->start, head.end = r->end;
  head.ncontrib = N;
  head.weight = weight;
  pulse_loco_receipt *rc = calloc(N, sizeof *rc);
  if (rc == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco reducer: receipts");
    goto done;
  }
  for (uint32_t i = 0; i < N; i++) {
    rc[i].id = r->plan.ids[i];
    rc[i].samples = r->samples[i];
    rc[i].entries = r->parts[i].count;
    rc[i].receipt = pulse_loco_receipt_digest(rc[i].id, rc[i].samples,
                                              r->parts[i].pos,
                                              r->parts[i].val,
                                              r->parts[i].count);
  }
  st = loco_reduced_encode(ctx, &head, rc, pos, val, k, blob);
  free(rc);
done:
  free(acc), free(senders), free(exempt), free(pos), free(val);
  return st;
}

pulse_status loco_reduced_empty(const pulse_loco *ctx,
                                const pulse_loco_plan *plan, uint32_t k,
                                const uint64_t *samples, pulse_buffer *out) {
  uint32_t N = plan->count;
  pulse_loco_receipt *rc = calloc(N, sizeof *rc);
  if (rc == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco reduced: receipts");
  loco_reduced_head head;
  memset(&head, 0, sizeof head);
  head.owner = plan->ids[k];
  head.members = ctx->members;
  head.round = ctx->round;
  head.param_count = ctx->n;
  head.base_digest = ctx->digest;
  head.start = plan->start[k], head.end = plan->start[k + 1];
  head.ncontrib = N;
  pulse_status st = PULSE_OK;
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    rc[i].id = plan->ids[i];
    rc[i].samples = samples[i];
    rc[i].receipt = pulse_loco_receipt_digest(rc[i].id, samples[i], NULL,
                                              NULL, 0);
    if (samples[i] == 0 || samples[i] > UINT64_MAX - head.weight)
      st = pulse_fail(PULSE_ERR_ARG, "loco reduced: bad samples");
    head.weight += samples[i];
  }
  if (st == PULSE_OK)
    st = loco_reduced_encode(ctx, &head, rc, NULL, NULL, 0, out);
  free(rc);
  return st;
}
