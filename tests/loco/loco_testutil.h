/* loco_testutil.h - helpers shared by the loco test files: a seeded
 * generator, bit views of floats, an independent BF16 rounding (through
 * double arithmetic, not pulse_elem.h) and context set-up. */
#ifndef PULSE_LOCO_TESTUTIL_H
#define PULSE_LOCO_TESTUTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco.h"
#include "rng_impl.h"

/* A text of n bytes in a new file (path: a mkstemp template, filled in):
 * the eight words drawn in a seeded order, so that within a word every
 * byte follows from the ones before and a continuation can be learnt. */
static inline void lt_write_words(char *path, const char *const words[8],
                                  uint64_t seed, size_t n) {
  int fd = mkstemp(path);
  cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
  FILE *f = fdopen(fd, "w");
  for (size_t out = 0; out < n;) {
    const char *w = words[pulse_rng_below(&seed, 8)];
    size_t len = strlen(w) < n - out ? strlen(w) : n - out;
    fwrite(w, 1, len, f);
    out += len;
  }
  fclose(f);
}

static inline float lt_normal(uint64_t *s) {
  double u = pulse_rng_uniform(s), v = pulse_rng_uniform(s);
  return (float)(sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v));
}

static inline uint32_t lt_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float lt_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* BF16 of x by its definition: round to nearest with 8 significant bits,
 * ties to even, subnormals on the 2^-133 grid, overflow to infinity, every
 * NaN to 0x7FC0; computed with doubles, independently of pulse_elem.h. */
static inline uint16_t lt_ref_bf16(float x) {
  uint16_t sign = (uint16_t)((lt_bits(x) >> 16) & 0x8000u);
  if (isnan(x))
    return 0x7FC0;
  if (isinf(x))
    return sign | 0x7F80u;
  double a = fabs((double)x);
  if (a == 0.0)
    return sign;
  int e;
  frexp(a, &e);
  int unb = e - 1;
  if (unb < -126)
    unb = -126;
  double ulp = ldexp(1.0, unb - 7);
  double q = a / ulp, fl = floor(q), rem = q - fl;
  if (rem > 0.5 || (rem == 0.5 && fmod(fl, 2.0) == 1.0))
    fl += 1.0;
  double r = fl * ulp;
  if (r >= 0x1p128)
    return sign | 0x7F80u;
  return sign | (uint16_t)(lt_bits((float)r) >> 16);
}

/* The gate by its definition (docs/design.md). */
static inline int lt_ref_gate(float theta_g, float s) {
  volatile float moved = theta_g - s;
  return lt_ref_bf16(theta_g) != lt_ref_bf16(moved);
}

/* Parameters like a trained layer: normal, scaled, with some exact zeros
 * and tiny values. */
static inline void lt_fill_weights(float *x, uint64_t n, uint64_t seed,
                                   float scale) {
  uint64_t s = seed;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = pulse_rng_next(&s) % 100;
    x[i] = r == 0   ? 0.0f
           : r == 1 ? lt_normal(&s) * 1e-30f
                    : lt_normal(&s) * scale;
  }
}

static inline pulse_loco *lt_ctx(uint64_t P, uint32_t id, const float *theta) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = P;
  o.trainer_id = id;
  pulse_loco *c = NULL;
  cr_assert_eq(pulse_loco_create(&o, theta, &c), PULSE_OK, "%s",
               pulse_error_detail());
  return c;
}

#endif
