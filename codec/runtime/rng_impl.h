/* rng_impl.h - the project's one pseudo-random generator: splitmix64
 * (Steele, Lea, Flood 2014), for tests, benches, synthetic data and the
 * exchange's loss simulation. Not for keys or anything an attacker may
 * predict. Its mixing function is the state digest's lane a (pulse_elem.h),
 * so the two can never drift apart.
 *
 * A state is any uint64_t; equal seeds give equal streams on every
 * platform. */
#ifndef PULSE_RNG_IMPL_H
#define PULSE_RNG_IMPL_H

#include <stdint.h>

#include "pulse_elem.h"

/** The next 64 random bits; advances *state. */
static inline uint64_t pulse_rng_next(uint64_t *state) {
  uint64_t x = *state;
  *state = x + 0x9E3779B97F4A7C15ull;
  return pulse_digest_lane_a(x);
}

/** Stateless: the value number i of the stream keyed by seed, so that
 * generators can fill ranges in parallel. */
static inline uint64_t pulse_rng_at(uint64_t seed, uint64_t i) {
  uint64_t s = seed ^ (i * 0xD1342543DE82EF95ull);
  return pulse_rng_next(&s);
}

/** Uniform in [0, 1), 53 random bits. */
static inline double pulse_rng_uniform(uint64_t *state) {
  return (double)(pulse_rng_next(state) >> 11) * 0x1p-53;
}

/** Uniform in [0, n) (0 when n is 0); modulo bias below 2^-40 for n < 2^24. */
static inline uint64_t pulse_rng_below(uint64_t *state, uint64_t n) {
  return n ? pulse_rng_next(state) % n : 0;
}

#endif /* PULSE_RNG_IMPL_H */
