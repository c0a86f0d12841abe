/* partition_plan.c - who reduces which range of a partitioned round
 * (docs/protocols/loco-collaboration.md "Partitioned averaging"): boundaries in proportion to the
 * owners' bandwidth, on cell multiples, counted in parameters or in the
 * replicated momentum's active entries, from integers and replicated bits
 * only so that every trainer computes the same plan; and the rotation of
 * the checkers. */
#include <stdlib.h>
#include <string.h>

#include "loco_impl.h"
#include "partition_impl.h"
#include "pulse_loco_elem.h"
#include "pulse_loco_partition.h"
#include "status_impl.h"

/* Weights are brought under 2^24 (a right shift of all of them, the same
 * everywhere): their sum stays far below 2^64 (the products with cell
 * counts or costs go through loco_mul_div). */
#define WEIGHT_BITS 24u

/* The product in two 64-bit halves, then a long division. */
uint64_t loco_mul_div(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t a_lo = a & 0xffffffffu, a_hi = a >> 32;
  uint64_t b_lo = b & 0xffffffffu, b_hi = b >> 32;
  uint64_t ll = a_lo * b_lo, lh = a_lo * b_hi, hl = a_hi * b_lo,
           hh = a_hi * b_hi;
  uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
  uint64_t lo = (ll & 0xffffffffu) | (mid << 32);
  uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
  uint64_t q = 0, r = 0;
  for (int bit = 127; bit >= 0; bit--) {
    uint64_t top = r >> 63; /* r * 2 may pass 2^64: then it exceeds c */
    r = (r << 1) | ((bit >= 64 ? hi >> (bit - 64) : lo >> bit) & 1u);
    if (top || r >= c) {
      r -= c;
      if (bit < 64)
        q |= 1ull << bit;
    }
  }
  return q;
}

/* The cells' active elements (a cell of the active plan costs 1 plus
 * them), one sweep: elements whose outer momentum b is about a BF16 step
 * of theta_g or more, b's exponent at least theta_g's less 8 (BF16 keeps 8
 * significant bits: the BF16 gate, pulse_loco_gate, in exponents only,
 * integers). b = 0 (and subnormal b) never counts. b and theta_g are
 * replicated bit for bit, so every trainer counts the same. At most
 * PULSE_LOCO_PART_ALIGN (128) a cell. Returns their sum. */
static uint64_t count_active(const pulse_loco *ctx, uint8_t *active,
                             uint64_t cells) {
  const uint64_t A = PULSE_LOCO_PART_ALIGN, P = ctx->n;
  uint64_t sum = 0;
  for (uint64_t c = 0; c < cells; c++) {
    const float *b = ctx->b + c * A, *t = ctx->theta_g + c * A;
    uint32_t n = (uint32_t)(P - c * A < A ? P - c * A : A), k = 0;
    for (uint32_t i = 0; i < n; i++) {
      uint32_t eb = (pulse_f32_bits(b[i]) >> 23) & 0xffu;
      uint32_t et = (pulse_f32_bits(t[i]) >> 23) & 0xffu;
      k += (uint32_t)(eb != 0) & (uint32_t)(eb + 8u >= et);
    }
    active[c] = (uint8_t)k;
    sum += k;
  }
  return sum;
}

/* The plan; with ctx (P = ctx->n) cut in the cells' costs. */
static pulse_status make_plan(uint64_t P, const uint32_t *ids,
                              const uint64_t *weights, size_t count,
                              const pulse_loco *ctx, pulse_loco_plan *plan) {
  if (plan == NULL || ids == NULL || count == 0 || count > PULSE_LOCO_PART_MAX)
    return pulse_fail(PULSE_ERR_ARG, "loco plan: %zu contributors", count);
  if (P == 0 || P > PULSE_LOCO_MAX_PARAMS)
    return pulse_fail(PULSE_ERR_ARG, "loco plan: %llu parameters",
                      (unsigned long long)P);
  for (size_t k = 1; k < count; k++)
    if (ids[k] <= ids[k - 1])
      return pulse_fail(PULSE_ERR_ARG, "loco plan: ids not increasing");
  uint64_t w[PULSE_LOCO_PART_MAX], max = 0;
  for (size_t k = 0; k < count; k++) {
    w[k] = weights ? weights[k] : 1u;
    max = w[k] > max ? w[k] : max;
  }
  if (max == 0) {
    for (size_t k = 0; k < count; k++)
      w[k] = 1;
    max = 1;
  }
  unsigned shift = 0;
  while ((max >> shift) >= (1ull << WEIGHT_BITS))
    shift++;
  uint64_t total = 0;
  for (size_t k = 0; k < count; k++) {
    /* A non-zero weight that the shift would zero keeps its tiny share. */
    uint64_t s = w[k] >> shift;
    w[k] = (w[k] != 0 && s == 0) ? 1u : s;
    total += w[k];
  }
  uint64_t A = PULSE_LOCO_PART_ALIGN, cells = (P + A - 1) / A;
  uint64_t all = cells; /* the cost of every cell: 1 each, plus active */
  uint8_t *active = NULL;
  if (ctx != NULL) {
    active = malloc((size_t)cells);
    if (active == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco plan: %llu cells",
                        (unsigned long long)cells);
    all += count_active(ctx, active, cells);
  }
  memset(plan, 0, sizeof *plan);
  plan->param_count = P;
  plan->count = (uint32_t)count;
  /* Owner k starts at the last cell boundary whose cost before it is at
   * most its share's start, floor(all * cum / total): with every cell
   * costing 1, the cell floor(cells * cum / total). */
  uint64_t cum = 0, cell = 0, before = 0;
  for (size_t k = 0; k < count; k++) {
    plan->ids[k] = ids[k];
    uint64_t target = loco_mul_div(all, cum, total);
    if (active == NULL)
      cell = target;
    else
      while (cell < cells && before + 1u + active[cell] <= target)
        before += 1u + active[cell++];
    uint64_t at = cell * A;
    plan->start[k] = at < P ? at : P;
    cum += w[k];
  }
  plan->start[count] = P;
  free(active);
  return PULSE_OK;
}

pulse_status pulse_loco_plan_make(uint64_t P, const uint32_t *ids,
                                  const uint64_t *weights, size_t count,
                                  pulse_loco_plan *plan) {
  return make_plan(P, ids, weights, count, NULL, plan);
}

pulse_status pulse_loco_plan_make_active(const pulse_loco *ctx,
                                         const uint32_t *ids,
                                         const uint64_t *weights,
                                         size_t count, pulse_loco_plan *plan) {
  if (ctx == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco plan: NULL context");
  return make_plan(ctx->n, ids, weights, count, ctx, plan);
}

static int by_value(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

void pulse_loco_plan_weights(const uint64_t *bandwidth, size_t count,
                             uint64_t *weights) {
  uint64_t v[PULSE_LOCO_PART_MAX];
  size_t n = 0;
  if (count > PULSE_LOCO_PART_MAX)
    count = PULSE_LOCO_PART_MAX;
  for (size_t k = 0; bandwidth != NULL && k < count; k++)
    if (bandwidth[k] > 0)
      v[n++] = bandwidth[k];
  if (n == 0) {
    for (size_t k = 0; k < count; k++)
      weights[k] = 1;
    return;
  }
  /* The median holds against lies by fewer than half of the peers; the
   * bounds around it give the ratio (2m / ceil(m / 2) <= 4). A median
   * over 2^62 is cut so that 2m fits. */
  qsort(v, n, sizeof *v, by_value);
  uint64_t m = v[(n - 1) / 2];
  m = m > (1ull << 62) ? 1ull << 62 : m;
  uint64_t lo = (m + 1) / 2, hi = 2 * m;
  for (size_t k = 0; k < count; k++) {
    uint64_t b = bandwidth[k] > 0 ? bandwidth[k] : m;
    weights[k] = b < lo ? lo : b > hi ? hi : b;
  }
}

int pulse_loco_plan_index(const pulse_loco_plan *plan, uint32_t id) {
  size_t lo = 0, hi = plan ? plan->count : 0;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (plan->ids[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return plan && lo < plan->count && plan->ids[lo] == id ? (int)lo : -1;
}

int pulse_loco_plan_checker(const pulse_loco_plan *plan, uint64_t round,
                            uint32_t attempt, uint32_t k,
                            const uint8_t *eligible) {
  if (plan == NULL || k >= plan->count || plan->count < 2 ||
      plan->start[k] == plan->start[k + 1])
    return -1;
  /* A shift by 1..N-1 that changes every round: one range for each
   * trainer to check (a derangement), and a different partner each
   * round, so an owner cannot count on a friendly checker. */
  uint32_t N = plan->count;
  uint64_t s = 1u + (round + attempt) % (N - 1u);
  for (uint32_t step = 0; step < N; step++) {
    uint32_t j = (uint32_t)((k + s + step) % N);
    if (j != k && (eligible == NULL || eligible[j]))
      return (int)j;
  }
  return -1;
}

int pulse_loco_plan_round_checker(const pulse_loco_plan *plan, uint64_t round,
                                  uint32_t attempt, uint32_t period,
                                  uint32_t k, const uint8_t *eligible) {
  uint32_t p = period ? period : 1u;
  if (round % p != k % p)
    return -1;
  return pulse_loco_plan_checker(plan, round / p, attempt, k, eligible);
}
