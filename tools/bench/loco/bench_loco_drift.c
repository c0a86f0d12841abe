/* bench_loco_drift.c - drift over all trainer pairs and round-time
 * statistics for `pulse-bench loco` (bench_loco_drift.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_loco_drift.h"
#include "pulse_loco.h"

void bench_pair_drift_open(bench_pair_drift *pd, uint32_t slots, uint64_t P) {
  memset(pd, 0, sizeof *pd);
  uint64_t words = (uint64_t)slots * DRIFT_DEPTH;
  uint64_t head = (words * sizeof(uint64_t) + 63u) & ~(uint64_t)63u;
  uint64_t bytes = head + words * P * sizeof(float);
  if (slots == 0 || P == 0 || P > (1ull << 32) || bytes > (4ull << 30))
    return;
  void *m = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return;
  pd->seq = m; /* zero: nothing written */
  pd->theta = (float *)((char *)m + head);
  pd->map_bytes = (size_t)bytes;
  pd->slots = slots;
  pd->P = P;
}

void bench_pair_drift_close(bench_pair_drift *pd) {
  if (pd->theta != NULL)
    munmap((void *)pd->seq, pd->map_bytes);
  memset(pd, 0, sizeof *pd);
}

static float *slot(const bench_pair_drift *pd, uint32_t id, uint64_t round) {
  return pd->theta + ((uint64_t)id * DRIFT_DEPTH + round % DRIFT_DEPTH) * pd->P;
}

void bench_pair_drift_write(bench_pair_drift *pd, uint32_t id, uint64_t round,
                            const float *theta_g) {
  if (pd->theta == NULL || id >= pd->slots)
    return;
  _Atomic uint64_t *seq = &pd->seq[id * DRIFT_DEPTH + round % DRIFT_DEPTH];
  atomic_store_explicit(seq, 0, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  memcpy(slot(pd, id, round), theta_g, (size_t)pd->P * sizeof *theta_g);
  atomic_store_explicit(seq, round + 1, memory_order_release);
}

/* The slot of trainer id still holds `round`. */
static int holds(const bench_pair_drift *pd, uint32_t id, uint64_t round) {
  return atomic_load_explicit(&pd->seq[id * DRIFT_DEPTH + round % DRIFT_DEPTH],
                              memory_order_acquire) == round + 1;
}

int bench_pair_drift_measure(const bench_pair_drift *pd, uint64_t round,
                             uint64_t id_mask, double *max_drift) {
  *max_drift = 0.0;
  if (pd->theta == NULL)
    return -1;
  for (uint32_t a = 0; a < pd->slots; a++)
    if ((id_mask >> a & 1u) && !holds(pd, a, round))
      return -1;
  double mx = 0.0;
  for (uint32_t a = 0; a < pd->slots; a++)
    for (uint32_t b = a + 1; b < pd->slots; b++)
      if ((id_mask >> a & 1u) && (id_mask >> b & 1u)) {
        double d =
            pulse_loco_drift(slot(pd, a, round), slot(pd, b, round), pd->P);
        if (d > mx)
          mx = d;
      }
  /* Read again: a trainer that overwrote a slot meanwhile voids it. */
  atomic_thread_fence(memory_order_acquire);
  for (uint32_t a = 0; a < pd->slots; a++)
    if ((id_mask >> a & 1u) && !holds(pd, a, round))
      return -1;
  *max_drift = mx;
  return 0;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return (a > b) - (a < b);
}

void bench_time_stats_of(const double *v, uint32_t n, bench_time_stats *out) {
  memset(out, 0, sizeof *out);
  double *c = n ? malloc(n * sizeof *c) : NULL;
  if (c == NULL)
    return;
  memcpy(c, v, n * sizeof *c);
  qsort(c, n, sizeof *c, cmp_double);
  out->n = n;
  out->median = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
  out->p10 = c[(uint32_t)(0.1 * (n - 1) + 0.5)];
  out->p90 = c[(uint32_t)(0.9 * (n - 1) + 0.5)];
  free(c);
}
