/* partition_plan.c - who reduces which range of a partitioned round
 * (PAYLOAD.md "Partitioned averaging"): boundaries in proportion to the
 * owners' bandwidth, on cell multiples, from integers only so that every
 * trainer computes the same plan; and the rotation of the checkers. */
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_partition.h"
#include "status_impl.h"

/* Weights are brought under 2^24 (a right shift of all of them, the same
 * everywhere) so that cells (<= 2^29 + 1) times a sum of at most 1024 of
 * them stays below 2^64. */
#define WEIGHT_BITS 24u

pulse_status pulse_loco_plan_make(uint64_t P, const uint32_t *ids,
                                  const uint64_t *weights, size_t count,
                                  pulse_loco_plan *plan) {
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
  uint64_t A = PULSE_LOCO_PART_ALIGN, cells = (P + A - 1) / A, cum = 0;
  memset(plan, 0, sizeof *plan);
  plan->param_count = P;
  plan->count = (uint32_t)count;
  for (size_t k = 0; k < count; k++) {
    plan->ids[k] = ids[k];
    uint64_t at = (cells * cum / total) * A;
    plan->start[k] = at < P ? at : P;
    cum += w[k];
  }
  plan->start[count] = P;
  return PULSE_OK;
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
