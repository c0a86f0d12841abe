/* test_detect.c - change detection: the reference against a brute-force
 * check written here, and the fast path (every instruction set, thread
 * split, alignment, snapshot update, appending) bit for bit against the
 * reference. */
#include "detect_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "rng_impl.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* The one rounding, written independently of pulse_elem.h (test_bf16.c
 * checks both against each other): round half to even on the low half. */
static uint16_t brute_round(uint32_t u) {
  if ((u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0)
    return 0x7FC0;
  uint32_t hi = u >> 16, lo = u & 0xFFFFu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
    hi++;
  return (uint16_t)hi;
}

static const uint32_t f32_edges[] = {
    0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7F800001u,
    0xFF800001u, 0x7FC00000u, 0xFFC00000u, 0x7FBFFFFFu, 0x7FFFFFFFu,
    0xFFFFFFFFu, 0x7F808000u, 0xFFFF8000u, 0x00000001u, 0x00008000u,
    0x00018000u, 0x0000FFFFu, 0x807FFFFFu, 0x7F7FFFFFu, 0x7F7F7FFFu,
    0x7F7F8000u, 0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u,
    0xBF818000u, 0x3F800000u};

static const uint16_t bf16_edges[] = {
    0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFFC0, 0x7F81, 0xFFFF,
    0x7FFF, 0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80};

#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

/* FP32 bits: edge values, ties, any bits (NaNs too) and weight-like values. */
static uint32_t gen_f32(uint64_t *state) {
  uint64_t r = pulse_rng_next(state);
  uint32_t sign = (uint32_t)(r >> 63) << 31;
  uint32_t weight = sign | (107u + (uint32_t)((r >> 40) % 20)) << 23 |
                    ((uint32_t)(r >> 8) & 0x7FFFFFu);
  switch (r & 7u) {
  case 0:
    return f32_edges[(r >> 8) % COUNT_OF(f32_edges)];
  case 1:
    return (uint32_t)(r >> 32);
  case 2:
    return (weight & 0xFFFF0000u) | 0x8000u; /* tie */
  default:
    return weight;
  }
}

static uint16_t gen_bf16(uint64_t *state) {
  uint64_t r = pulse_rng_next(state);
  switch (r & 3u) {
  case 0:
    return bf16_edges[(r >> 8) % COUNT_OF(bf16_edges)];
  case 1:
    return (uint16_t)(r >> 32);
  default:
    return (uint16_t)(((r >> 63) << 15) | (107u + (r >> 40) % 20) << 7 |
                      ((r >> 8) & 0x7Fu));
  }
}

/* A non-zero bit difference between snapshot and new bits: Adam-like ulps,
 * a sign flip (+0.0 vs -0.0 among them) or any bits. */
static uint16_t gen_delta(uint64_t *state) {
  uint64_t r = pulse_rng_next(state);
  static const uint16_t usual[] = {1, 0xFFFF, 2, 0xFFFE, 3, 0xFFFD, 0x8000};
  if (r & 1u)
    return usual[(r >> 8) % COUNT_OF(usual)];
  uint16_t d = (uint16_t)(r >> 32);
  return d != 0 ? d : 1;
}

/* One input: `cur` and `snapshot` start `offset` elements into their
 * allocations, so odd offsets give misaligned pointers. */
typedef struct {
  pulse_dtype dtype;
  uint64_t n;
  unsigned offset;
  unsigned char *cur_alloc;
  const void *cur;
  uint16_t *snapshot; /* pristine, n elements, no offset */
  uint16_t *fresh;    /* BF16 of cur by brute_round, n elements */
  char name[192];
} det_case;

static void case_make(det_case *c, pulse_dtype dtype, uint64_t n,
                      double density, uint64_t seed, unsigned offset) {
  size_t esize = pulse_dtype_size(dtype);
  c->dtype = dtype;
  c->n = n;
  c->offset = offset;
  c->cur_alloc = malloc((n + offset + 1) * esize);
  c->snapshot = malloc((n + 1) * sizeof(uint16_t));
  c->fresh = malloc((n + 1) * sizeof(uint16_t));
  cr_assert(c->cur_alloc && c->snapshot && c->fresh, "allocation");
  c->cur = c->cur_alloc + offset * esize;
  uint64_t state = seed * 0x100000001B3ull + n;
  for (uint64_t i = 0; i < n; i++) {
    uint16_t fresh;
    if (dtype == PULSE_DTYPE_F32) {
      uint32_t u = gen_f32(&state);
      memcpy(c->cur_alloc + (offset + i) * 4, &u, 4);
      fresh = brute_round(u);
    } else {
      fresh = gen_bf16(&state);
      memcpy(c->cur_alloc + (offset + i) * 2, &fresh, 2);
    }
    c->fresh[i] = fresh;
    int changed = pulse_rng_uniform(&state) < density;
    c->snapshot[i] = changed ? (uint16_t)(fresh + gen_delta(&state)) : fresh;
  }
  snprintf(c->name, sizeof c->name, "%s n=%llu density=%g seed=%llu offset=%u",
           pulse_dtype_name(dtype), (unsigned long long)n, density,
           (unsigned long long)seed, offset);
}

static void case_free(det_case *c) {
  free(c->cur_alloc);
  free(c->snapshot);
  free(c->fresh);
}

/* A working copy of the snapshot at the case's offset. */
static uint16_t *snapshot_copy(const det_case *c, uint16_t **alloc) {
  *alloc = malloc((c->n + c->offset + 1) * sizeof(uint16_t));
  cr_assert(*alloc != NULL, "allocation");
  memcpy(*alloc + c->offset, c->snapshot, c->n * sizeof(uint16_t));
  return *alloc + c->offset;
}

/* A few changes already in `out`, which detection must append after. */
static void prefill(pulse_changes *out, int count) {
  for (int k = 0; k < count; k++)
    cr_assert_eq(pulse_changes_push(out, 1000u * (uint64_t)k + 7u,
                                    (uint16_t)(0xA000 + k),
                                    (uint16_t)(0xB000 + k)),
                 PULSE_OK, "prefill");
}

static void assert_same_changes(const pulse_changes *want,
                                const pulse_changes *got, const char *name,
                                const char *what) {
  cr_assert_eq(got->count, want->count, "%s %s: %llu changes, want %llu", name,
               what, (unsigned long long)got->count,
               (unsigned long long)want->count);
  for (uint64_t k = 0; k < want->count; k++) {
    if (got->pos[k] != want->pos[k] || got->old_bits[k] != want->old_bits[k] ||
        got->new_bits[k] != want->new_bits[k])
      cr_assert_fail("%s %s: change %llu is (%llu, 0x%04X, 0x%04X), want "
                     "(%llu, 0x%04X, 0x%04X)",
                     name, what, (unsigned long long)k,
                     (unsigned long long)got->pos[k], got->old_bits[k],
                     got->new_bits[k], (unsigned long long)want->pos[k],
                     want->old_bits[k], want->new_bits[k]);
  }
}

static void assert_same_bits(const uint16_t *want, const uint16_t *got,
                             uint64_t n, const char *name, const char *what) {
  for (uint64_t i = 0; i < n; i++)
    if (got[i] != want[i])
      cr_assert_fail("%s %s: element %llu is 0x%04X, want 0x%04X", name, what,
                     (unsigned long long)i, got[i], want[i]);
}

/* ------------------------------------------- reference against brute force */

static void check_ref_brute(const det_case *c, int update) {
  pulse_changes want = PULSE_CHANGES_INIT, got = PULSE_CHANGES_INIT;
  prefill(&want, 2);
  prefill(&got, 2);
  for (uint64_t i = 0; i < c->n; i++)
    if (c->snapshot[i] != c->fresh[i])
      cr_assert_eq(pulse_changes_push(&want, i, c->snapshot[i], c->fresh[i]),
                   PULSE_OK, "push");
  uint16_t *alloc;
  uint16_t *snap = snapshot_copy(c, &alloc);
  cr_assert_eq(pulse_detect_ref(c->cur, c->dtype, snap, c->n, update, &got),
               PULSE_OK, "%s: ref status", c->name);
  assert_same_changes(&want, &got, c->name, "ref vs brute force");
  assert_same_bits(update ? c->fresh : c->snapshot, snap, c->n, c->name,
                   update ? "updated snapshot" : "untouched snapshot");
  free(alloc);
  pulse_changes_free(&want);
  pulse_changes_free(&got);
}

static const double densities[] = {0.0, 0.001, 0.01, 0.1, 0.5, 1.0};

Test(detect, ref_matches_brute_force) {
  static const uint64_t sizes[] = {0, 1, 2, 31, 32, 33, 1000, 4097, 100003};
  static const pulse_dtype dtypes[] = {PULSE_DTYPE_BF16, PULSE_DTYPE_F32};
  for (size_t d = 0; d < COUNT_OF(dtypes); d++)
    for (size_t s = 0; s < COUNT_OF(sizes); s++)
      for (size_t p = 0; p < COUNT_OF(densities); p++)
        for (uint64_t seed = 1; seed <= 2; seed++) {
          det_case c;
          case_make(&c, dtypes[d], sizes[s], densities[p], seed,
                    (unsigned)seed & 1u);
          check_ref_brute(&c, 0);
          check_ref_brute(&c, 1);
          case_free(&c);
        }
}

/* --------------------------------------------- fast path against reference */

typedef struct {
  pulse_isa isa;
  int threads;
  uint64_t min_per_thread; /* 0: the public entry with default tuning */
} det_variant;

static void check_fast_variants(const det_case *c, const det_variant *variants,
                                size_t count, int update) {
  pulse_changes want = PULSE_CHANGES_INIT;
  prefill(&want, 3);
  uint16_t *ref_alloc;
  uint16_t *ref_snap = snapshot_copy(c, &ref_alloc);
  cr_assert_eq(
      pulse_detect_ref(c->cur, c->dtype, ref_snap, c->n, update, &want),
      PULSE_OK, "%s: ref status", c->name);
  for (size_t v = 0; v < count; v++) {
    const det_variant *var = &variants[v];
    if (!pulse_isa_available(var->isa))
      continue;
    char name[320];
    snprintf(name, sizeof name, "%s isa=%d threads=%d min=%llu update=%d",
             c->name, var->isa, var->threads,
             (unsigned long long)var->min_per_thread, update);
    pulse_changes got = PULSE_CHANGES_INIT;
    prefill(&got, 3);
    uint16_t *alloc;
    uint16_t *snap = snapshot_copy(c, &alloc);
    pulse_status st;
    if (var->min_per_thread == 0) {
      st = pulse_detect_fast(c->cur, c->dtype, snap, c->n, update, var->threads,
                             &got);
    } else {
      pulse_detect_tuning tune = {var->isa, var->min_per_thread};
      st = pulse_detect_fast_tuned(c->cur, c->dtype, snap, c->n, update,
                                   var->threads, &tune, &got);
    }
    cr_assert_eq(st, PULSE_OK, "%s: status %s", name, pulse_status_name(st));
    assert_same_changes(&want, &got, name, "fast vs ref");
    assert_same_bits(ref_snap, snap, c->n, name, "snapshot after");
    free(alloc);
    pulse_changes_free(&got);
  }
  free(ref_alloc);
  pulse_changes_free(&want);
}

/* min_per_thread 1 splits even tiny inputs, down to empty ranges. */
static const det_variant small_variants[] = {
    {PULSE_ISA_AUTO, 1, 0}, {PULSE_ISA_AUTO, 0, 0},   {PULSE_ISA_SCALAR, 1, 1},
    {PULSE_ISA_AVX2, 1, 1}, {PULSE_ISA_SCALAR, 3, 1}, {PULSE_ISA_AVX2, 2, 1},
    {PULSE_ISA_AVX2, 3, 1}, {PULSE_ISA_AVX2, 8, 1},   {PULSE_ISA_SCALAR, 8, 1},
};

static void check_fast_small(pulse_dtype dtype) {
  static const uint64_t sizes[] = {0,  1,  2,  3,  15,  16,   17,   31,  32,
                                   33, 63, 64, 65, 127, 1000, 1001, 4099};
  for (size_t s = 0; s < COUNT_OF(sizes); s++)
    for (size_t p = 0; p < COUNT_OF(densities); p++)
      for (uint64_t seed = 1; seed <= 3; seed++)
        for (unsigned offset = 0; offset < 2; offset++) {
          det_case c;
          case_make(&c, dtype, sizes[s], densities[p], seed, offset);
          for (int update = 0; update < 2; update++)
            check_fast_variants(&c, small_variants, COUNT_OF(small_variants),
                                update);
          case_free(&c);
        }
}

Test(detect, fast_matches_ref_bf16_small) {
  check_fast_small(PULSE_DTYPE_BF16);
}

Test(detect, fast_matches_ref_f32_small) {
  check_fast_small(PULSE_DTYPE_F32);
}

static void check_fast_large(pulse_dtype dtype) {
  static const det_variant variants[] = {
      {PULSE_ISA_AUTO, 1, 0},          {PULSE_ISA_AUTO, 0, 0},
      {PULSE_ISA_AUTO, 3, 0},          {PULSE_ISA_AVX2, 8, 1u << 16},
      {PULSE_ISA_SCALAR, 2, 1u << 16},
  };
  static const double large_densities[] = {0.0, 0.01, 0.5, 1.0};
  const uint64_t n = 3000017; /* odd, over the default per-thread minimum */
  for (size_t p = 0; p < COUNT_OF(large_densities); p++) {
    det_case c;
    case_make(&c, dtype, n, large_densities[p], 7 + p, 1);
    for (int update = 0; update < 2; update++)
      check_fast_variants(&c, variants, COUNT_OF(variants), update);
    case_free(&c);
  }
}

Test(detect, fast_matches_ref_bf16_large) {
  check_fast_large(PULSE_DTYPE_BF16);
}

Test(detect, fast_matches_ref_f32_large) {
  check_fast_large(PULSE_DTYPE_F32);
}

/* ------------------------------------------------------ hand-written cases */

typedef pulse_status (*detect_fn)(const void *, pulse_dtype, uint16_t *,
                                  uint64_t, int, pulse_changes *);

static pulse_status fast_one_thread(const void *cur, pulse_dtype dtype,
                                    uint16_t *snap, uint64_t n, int update,
                                    pulse_changes *out) {
  return pulse_detect_fast(cur, dtype, snap, n, update, 1, out);
}

static pulse_status fast_scalar_split(const void *cur, pulse_dtype dtype,
                                      uint16_t *snap, uint64_t n, int update,
                                      pulse_changes *out) {
  pulse_detect_tuning tune = {PULSE_ISA_SCALAR, 1};
  return pulse_detect_fast_tuned(cur, dtype, snap, n, update, 4, &tune, out);
}

static pulse_status fast_simd_split(const void *cur, pulse_dtype dtype,
                                    uint16_t *snap, uint64_t n, int update,
                                    pulse_changes *out) {
  pulse_detect_tuning tune = {PULSE_ISA_AUTO, 1};
  return pulse_detect_fast_tuned(cur, dtype, snap, n, update, 3, &tune, out);
}

static const struct {
  detect_fn fn;
  const char *name;
} detectors[] = {{pulse_detect_ref, "ref"},
                 {fast_one_thread, "fast"},
                 {fast_scalar_split, "fast scalar x4"},
                 {fast_simd_split, "fast auto x3"}};

/* (FP32 input, snapshot, changed?) worked by hand. */
static const struct {
  uint32_t f32;
  uint16_t snapshot;
  int changed;
  const char *what;
} f32_cases[] = {
    {0x80000000u, 0x0000, 1, "-0.0 against +0.0"},
    {0x00000000u, 0x8000, 1, "+0.0 against -0.0"},
    {0x00000000u, 0x0000, 0, "+0.0 against +0.0"},
    {0x7F800001u, 0x7FC0, 0, "signalling NaN becomes the canonical NaN"},
    {0x7F800001u, 0x7F80, 1, "NaN is not inf"},
    {0xFFFFFFFFu, 0x7FC0, 0, "negative NaN becomes the canonical NaN"},
    {0x7FC00000u, 0x7FC1, 1, "canonical NaN against another NaN payload"},
    {0x7F800000u, 0x7F80, 0, "+inf"},
    {0xFF800000u, 0x7F80, 1, "-inf against +inf"},
    {0x7F7FFFFFu, 0x7F80, 0, "max FP32 rounds to inf"},
    {0x7F7F7FFFu, 0x7F80, 1, "largest value staying finite"},
    {0x3F808000u, 0x3F80, 0, "tie to even, down"},
    {0x3F818000u, 0x3F82, 0, "tie to even, up"},
    {0x3F818000u, 0x3F81, 1, "tie is not truncation"},
    {0x3F808001u, 0x3F80, 1, "just above a tie"},
    {0x00018000u, 0x0002, 0, "subnormal tie"},
    {0x00008000u, 0x0001, 1, "subnormal tie to even is zero"},
};

Test(detect, edge_values_f32_compare_by_bits) {
  /* Each case at lanes 0, 17, 31 of a block and in the tail, with filler
   * that never changes. */
  static const uint64_t lanes[] = {0, 17, 31, 64, 69};
  const uint64_t n = 70;
  for (size_t k = 0; k < COUNT_OF(f32_cases); k++)
    for (size_t l = 0; l < COUNT_OF(lanes); l++)
      for (size_t d = 0; d < COUNT_OF(detectors); d++) {
        float cur[70];
        uint16_t snap[70];
        for (uint64_t i = 0; i < n; i++) {
          uint32_t u = 0x3F800000u + (uint32_t)i * 0x10000u;
          memcpy(&cur[i], &u, 4);
          snap[i] = (uint16_t)(u >> 16);
        }
        memcpy(&cur[lanes[l]], &f32_cases[k].f32, 4);
        snap[lanes[l]] = f32_cases[k].snapshot;
        pulse_changes out = PULSE_CHANGES_INIT;
        cr_assert_eq(detectors[d].fn(cur, PULSE_DTYPE_F32, snap, n, 1, &out),
                     PULSE_OK, "status");
        cr_assert_eq(out.count, (uint64_t)f32_cases[k].changed,
                     "%s: %s at lane %llu", detectors[d].name,
                     f32_cases[k].what, (unsigned long long)lanes[l]);
        if (out.count == 1) {
          cr_assert_eq(out.pos[0], lanes[l], "%s: position", f32_cases[k].what);
          cr_assert_eq(out.old_bits[0], f32_cases[k].snapshot, "old bits");
          cr_assert_eq(out.new_bits[0], brute_round(f32_cases[k].f32),
                       "new bits");
        }
        cr_assert_eq(snap[lanes[l]], brute_round(f32_cases[k].f32),
                     "%s: snapshot updated", f32_cases[k].what);
        pulse_changes_free(&out);
      }
}

Test(detect, edge_values_bf16_compare_by_bits) {
  static const struct {
    uint16_t cur, snapshot;
    int changed;
  } cases[] = {{0x8000, 0x0000, 1}, {0x0000, 0x8000, 1}, {0x7FC1, 0x7FC1, 0},
               {0x7FC1, 0x7FC0, 1}, {0xFFC0, 0x7FC0, 1}, {0x7F80, 0xFF80, 1},
               {0x0001, 0x0001, 0}, {0x0001, 0x8001, 1}, {0xFFFF, 0xFFFF, 0}};
  static const uint64_t lanes[] = {0, 16, 31, 33, 40};
  for (size_t k = 0; k < COUNT_OF(cases); k++)
    for (size_t l = 0; l < COUNT_OF(lanes); l++)
      for (size_t d = 0; d < COUNT_OF(detectors); d++) {
        uint16_t cur[41], snap[41];
        for (unsigned i = 0; i < 41; i++)
          cur[i] = snap[i] = (uint16_t)(0x3F80 + i);
        cur[lanes[l]] = cases[k].cur;
        snap[lanes[l]] = cases[k].snapshot;
        pulse_changes out = PULSE_CHANGES_INIT;
        cr_assert_eq(detectors[d].fn(cur, PULSE_DTYPE_BF16, snap, 41, 0, &out),
                     PULSE_OK, "status");
        cr_assert_eq(out.count, (uint64_t)cases[k].changed,
                     "%s: 0x%04X against 0x%04X at lane %llu",
                     detectors[d].name, cases[k].cur, cases[k].snapshot,
                     (unsigned long long)lanes[l]);
        cr_assert_eq(snap[lanes[l]], cases[k].snapshot, "snapshot untouched");
        pulse_changes_free(&out);
      }
}

Test(detect, updated_snapshot_has_no_changes_left) {
  for (size_t d = 0; d < COUNT_OF(detectors); d++) {
    det_case c;
    case_make(&c, PULSE_DTYPE_F32, 5000, 0.3, 11, 1);
    uint16_t *alloc;
    uint16_t *snap = snapshot_copy(&c, &alloc);
    pulse_changes out = PULSE_CHANGES_INIT;
    cr_assert_eq(detectors[d].fn(c.cur, c.dtype, snap, c.n, 1, &out), PULSE_OK,
                 "first pass");
    cr_assert_gt(out.count, 1000u, "%s: changes found", detectors[d].name);
    assert_same_bits(c.fresh, snap, c.n, detectors[d].name, "after update");
    out.count = 0;
    cr_assert_eq(detectors[d].fn(c.cur, c.dtype, snap, c.n, 1, &out), PULSE_OK,
                 "second pass");
    cr_assert_eq(out.count, 0u, "%s: nothing left to change",
                 detectors[d].name);
    free(alloc);
    pulse_changes_free(&out);
    case_free(&c);
  }
}

/* ----------------------------------------------------------------- errors */

Test(detect, rejects_other_dtypes) {
  static const pulse_dtype bad[] = {PULSE_DTYPE_F16, PULSE_DTYPE_INVALID,
                                    (pulse_dtype)77};
  uint16_t cur[8] = {1, 2, 3, 4, 5, 6, 7, 8}, snap[8] = {0};
  for (size_t b = 0; b < COUNT_OF(bad); b++)
    for (size_t d = 0; d < COUNT_OF(detectors); d++) {
      pulse_changes out = PULSE_CHANGES_INIT;
      cr_assert_eq(detectors[d].fn(cur, bad[b], snap, 8, 1, &out),
                   PULSE_ERR_DTYPE, "%s: dtype %d", detectors[d].name, bad[b]);
      cr_assert_eq(out.count, 0u, "nothing appended");
      for (int i = 0; i < 8; i++)
        cr_assert_eq(snap[i], 0, "snapshot untouched");
    }
}

Test(detect, rejects_null_arguments) {
  uint16_t cur[4] = {1, 2, 3, 4}, snap[4] = {0};
  pulse_changes out = PULSE_CHANGES_INIT;
  for (size_t d = 0; d < COUNT_OF(detectors); d++) {
    detect_fn fn = detectors[d].fn;
    cr_assert_eq(fn(cur, PULSE_DTYPE_BF16, snap, 4, 1, NULL), PULSE_ERR_ARG,
                 "%s: NULL out", detectors[d].name);
    cr_assert_eq(fn(NULL, PULSE_DTYPE_BF16, snap, 4, 1, &out), PULSE_ERR_ARG,
                 "%s: NULL cur", detectors[d].name);
    cr_assert_eq(fn(cur, PULSE_DTYPE_BF16, NULL, 4, 1, &out), PULSE_ERR_ARG,
                 "%s: NULL snapshot", detectors[d].name);
    cr_assert_eq(fn(NULL, PULSE_DTYPE_F32, NULL, 0, 1, &out), PULSE_OK,
                 "%s: empty input may be NULL", detectors[d].name);
    cr_assert_eq(out.count, 0u, "nothing appended");
  }
  cr_assert_eq(pulse_detect_fast(cur, PULSE_DTYPE_BF16, snap, 4, 1, -1, &out),
               PULSE_ERR_ARG, "negative thread count");
  pulse_detect_tuning tune = {(pulse_isa)99, 1};
  cr_assert_eq(pulse_detect_fast_tuned(cur, PULSE_DTYPE_BF16, snap, 4, 1, 1,
                                       &tune, &out),
               PULSE_ERR_UNSUPPORTED, "unknown instruction set");
}

Test(detect, failed_append_leaves_snapshot_unchanged) {
  /* A list already at the largest capacity pulse_changes_reserve accepts:
   * the first append needs more and fails, as an allocation failure would. */
  const uint64_t full = SIZE_MAX / sizeof(uint64_t);
  static const uint64_t first_change[] = {0, 2000, 4095};
  for (size_t f = 0; f < COUNT_OF(first_change); f++)
    for (size_t d = 0; d < COUNT_OF(detectors); d++) {
      uint16_t cur[4096], snap[4096], before[4096];
      for (unsigned i = 0; i < 4096; i++) {
        cur[i] = (uint16_t)(0x3F00 + (i & 0xFF));
        snap[i] = i >= first_change[f] ? (uint16_t)(cur[i] ^ 1) : cur[i];
      }
      memcpy(before, snap, sizeof snap);
      pulse_changes out = {full, full, NULL, NULL, NULL};
      pulse_status st =
          detectors[d].fn(cur, PULSE_DTYPE_BF16, snap, 4096, 1, &out);
      cr_assert_neq(st, PULSE_OK, "%s: first change %llu must fail",
                    detectors[d].name, (unsigned long long)first_change[f]);
      cr_assert_eq(out.count, full, "%s: nothing appended", detectors[d].name);
      cr_assert_eq(memcmp(before, snap, sizeof snap), 0,
                   "%s: first change %llu: snapshot changed on error",
                   detectors[d].name, (unsigned long long)first_change[f]);
    }
}
