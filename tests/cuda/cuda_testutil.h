/* cuda_testutil.h - helpers of the CUDA suites: the skip rule, a seeded
 * PRNG, value generators with the edge values the kernels must get right,
 * and device buffers that fail the test instead of returning a status.
 *
 * Every test that needs a device starts with GPU_TEST_START(): without one it
 * is skipped with the reason "no CUDA device" (reported as skipped, never as
 * passed). PULSE_GPU_LARGE=1 adds the 10^9-element cases. */
#ifndef PULSE_CUDA_TESTUTIL_H
#define PULSE_CUDA_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_cuda.h"
#include "pulse_elem.h"
#include "rng_impl.h"

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

#define GPU_TEST_START()                                                       \
  do {                                                                         \
    if (!pulse_cuda_available())                                               \
      cr_skip_test("no CUDA device");                                          \
  } while (0)

#define OK(expr)                                                               \
  do {                                                                         \
    pulse_status ok_st_ = (expr);                                              \
    cr_assert_eq(ok_st_, PULSE_OK, "%s -> %s: %s", #expr,                      \
                 pulse_status_name(ok_st_), pulse_error_detail());             \
  } while (0)

/* The 10^9-element cases run only when PULSE_GPU_LARGE=1 (tests/gpu/check.sh).
 */
static inline int gpu_large(void) {
  const char *v = getenv("PULSE_GPU_LARGE");
  return v != NULL && strcmp(v, "1") == 0;
}

/* ------------------------------------------------------------------ PRNG */

/* codec/runtime/rng_impl.h: pulse_rng_next, and pulse_rng_at (stateless: the value
 * for (seed, i), so generators can run in parallel). */

/* True with probability density (0 and 1 exactly). */
static inline int tu_chance(uint64_t r, double density) {
  if (density <= 0.0)
    return 0;
  if (density >= 1.0)
    return 1;
  return (double)(r >> 11) * 0x1p-53 < density;
}

static inline void *tu_alloc(size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  cr_assert_not_null(p, "out of host memory (%zu bytes)", bytes);
  return p;
}

/* ---------------------------------------------------------- edge values */

/* FP32 bits the one rounding must get right: NaN payloads of both signs,
 * infinities, both zeros, subnormals, ties (to even, both ways), values that
 * round to infinity, and the largest finite. */
static const uint32_t tu_f32_edges[] = {
    0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F800001u,
    0xFF800001u, 0x7FC00000u, 0xFFC00000u, 0x7FBFFFFFu, 0x7FFFFFFFu,
    0xFFFFFFFFu, 0x7FC00001u, 0x00000001u, 0x80000001u, 0x00008000u,
    0x00018000u, 0x0000FFFFu, 0x807FFFFFu, 0x007FFFFFu, 0x7F7FFFFFu,
    0x7F7F8000u, 0x7F7F7FFFu, 0xFF7F8000u, 0x3F808000u, 0x3F818000u,
    0x3F807FFFu, 0x3F808001u, 0xBF818000u, 0xBF808000u, 0x3F800000u};

/* BF16 bits: NaN payloads, infinities, zeros, subnormals, extremes. */
static const uint16_t tu_bf16_edges[] = {
    0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFC0, 0x7F81, 0xFFFF,
    0x7FFF, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80};

typedef enum {
  TU_NORMAL, /* weight-like: |w| around 2^-6, a dozen exponents */
  TU_EDGE,   /* a third edge values, the rest weight-like */
  TU_ANY,    /* any bits */
  TU_CONST   /* one value (a single class) */
} tu_values;

static inline uint32_t tu_weight_f32(uint64_t r) {
  uint32_t sign = (uint32_t)(r >> 63) << 31;
  uint32_t exp = 112u + (uint32_t)((r >> 40) % 14u);
  return sign | exp << 23 | ((uint32_t)(r >> 8) & 0x7FFFFFu);
}

static inline uint32_t tu_f32(uint64_t r, tu_values kind) {
  switch (kind) {
  case TU_EDGE:
    if (r % 3 == 0)
      return tu_f32_edges[(r >> 8) % COUNT_OF(tu_f32_edges)];
    return tu_weight_f32(r);
  case TU_ANY:
    return (uint32_t)(r >> 16);
  case TU_CONST:
    return 0x3C23D70Au;
  default:
    return tu_weight_f32(r);
  }
}

/* A snapshot value that differs from `bits`: a few ulps away, a sign flip,
 * an edge value, or any bits. */
static inline uint16_t tu_other_bf16(uint16_t bits, uint64_t r) {
  uint16_t v;
  switch (r & 3u) {
  case 0:
    v = (uint16_t)(bits + 1u + ((r >> 8) & 3u));
    break;
  case 1:
    v = (uint16_t)(bits - 1u - ((r >> 8) & 3u));
    break;
  case 2:
    v = tu_bf16_edges[(r >> 8) % COUNT_OF(tu_bf16_edges)];
    break;
  default:
    v = (uint16_t)(r >> 40);
    break;
  }
  return v != bits ? v : (uint16_t)(bits ^ 0x8000u);
}

/* A detection case: n current values of `dtype` (FP32 bits or BF16) and a
 * snapshot whose elements differ from their BF16 with probability density. */
static inline void tu_make_case(uint64_t seed, uint64_t n, pulse_dtype dtype,
                                tu_values kind, double density, void *cur,
                                uint16_t *snapshot) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = pulse_rng_at(seed, i);
    uint32_t f = tu_f32(r, kind);
    uint16_t now;
    if (dtype == PULSE_DTYPE_F32) {
      ((uint32_t *)cur)[i] = f;
      now = pulse_bf16_from_f32_bits(f);
    } else {
      now = kind == TU_EDGE && r % 5 == 0
                ? tu_bf16_edges[(r >> 20) % COUNT_OF(tu_bf16_edges)]
                : pulse_bf16_from_f32_bits(f);
      ((uint16_t *)cur)[i] = now;
    }
    uint64_t r2 = pulse_rng_at(seed ^ 0x5555u, i);
    snapshot[i] = tu_chance(r2, density) ? tu_other_bf16(now, r2) : now;
  }
}

/* -------------------------------------------------------- device buffers */

static inline void *dev_alloc(size_t bytes) {
  void *d = NULL;
  OK(pulse_cuda_alloc(&d, bytes ? bytes : 1));
  return d;
}

static inline void *dev_upload(const void *host, size_t bytes) {
  void *d = dev_alloc(bytes);
  if (bytes > 0)
    OK(pulse_cuda_upload(d, host, bytes, NULL));
  return d;
}

static inline void *dev_download(const void *dev, size_t bytes) {
  void *h = tu_alloc(bytes);
  if (bytes > 0)
    OK(pulse_cuda_download(h, dev, bytes, NULL));
  return h;
}

/* Index of the first differing byte, or -1. */
static inline long long tu_memdiff(const void *a, const void *b, size_t bytes) {
  const unsigned char *x = a, *y = b;
  for (size_t i = 0; i < bytes; i++)
    if (x[i] != y[i])
      return (long long)i;
  return -1;
}

#endif /* PULSE_CUDA_TESTUTIL_H */
