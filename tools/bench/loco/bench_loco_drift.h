/* bench_loco_drift.h - measurements of `pulse-bench loco` that need every
 * trainer's state at once and must cost no network bytes: the drift over
 * all trainer pairs, max over pairs (a, b) of ||theta_a - theta_b|| /
 * ||theta_a|| of their global weights after a round (issue 16), through a
 * region shared across fork; and round wall-time statistics.
 *
 * The region holds DRIFT_DEPTH slots per trainer; a trainer writes its
 * theta_g of round r into slot r mod DRIFT_DEPTH, framed by a sequence
 * word (0 while it writes, r + 1 once written), and the parent reads a
 * round once every member has written it: a slot read while its trainer
 * overwrote it (it ran DRIFT_DEPTH rounds ahead) reads as not measured,
 * never as a wrong figure. */
#ifndef PULSE_BENCH_LOCO_DRIFT_H
#define PULSE_BENCH_LOCO_DRIFT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define DRIFT_DEPTH 4u

typedef struct {
  float *theta;          /* [slots][DRIFT_DEPTH][P]; NULL: not measured */
  _Atomic uint64_t *seq; /* [slots][DRIFT_DEPTH] */
  size_t map_bytes;
  uint32_t slots;
  uint64_t P;
} bench_pair_drift;

/** Maps the region for `slots` trainers of P parameters (before any fork).
 * Leaves pd->theta NULL (drift not measured) when the region would exceed
 * 4 GiB or the map fails. */
void bench_pair_drift_open(bench_pair_drift *pd, uint32_t slots, uint64_t P);
void bench_pair_drift_close(bench_pair_drift *pd);

/** A trainer: its theta_g (P floats) after round `round` (1-based). */
void bench_pair_drift_write(bench_pair_drift *pd, uint32_t id, uint64_t round,
                            const float *theta_g);

/** The parent: the max drift over the pairs of the trainers in id_mask
 * (bit i: trainer i) after `round`. @return 0 when measured, -1 when a
 * slot no longer held that round (or nothing is mapped). */
int bench_pair_drift_measure(const bench_pair_drift *pd, uint64_t round,
                             uint64_t id_mask, double *max_drift);

/* Median and 10th/90th percentiles of n values (nearest rank). */
typedef struct {
  double median, p10, p90;
  uint32_t n;
} bench_time_stats;

void bench_time_stats_of(const double *v, uint32_t n, bench_time_stats *out);

#endif /* PULSE_BENCH_LOCO_DRIFT_H */
