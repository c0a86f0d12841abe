/* test_bf16.c - the per-element specification of pulse_elem.h (the one
 * rounding, zig-zag values, position classes) and the array cast. The
 * rounding is checked against hand-worked vectors and against two
 * formulations written here independently of pulse_elem.h. */
#include "detect_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "rng_impl.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int is_nan_bits(uint32_t u) {
  return (u & 0x7F800000u) == 0x7F800000u && (u & 0x007FFFFFu) != 0;
}

/* Independent formulation 1: keep the high half, look at the dropped low
 * half: above half an ulp rounds up, exactly half rounds to the even high
 * half. A carry out of the mantissa bumps the exponent, which is right
 * (0x7F7F + 1 = inf). */
static uint16_t round_by_halves(uint32_t u) {
  if (is_nan_bits(u))
    return 0x7FC0;
  uint32_t hi = u >> 16, lo = u & 0xFFFFu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
    hi++;
  return (uint16_t)hi;
}

/* Magnitude-ordered value of BF16 bits as a double; an exponent field of 255
 * reads as 2^128 with the mantissa, the value IEEE rounding uses before it
 * overflows to infinity. */
static double bf16_value_unbounded(uint16_t h) {
  int e = (h >> 7) & 0xFF, m = h & 0x7F;
  double mag = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
  return (h & 0x8000u) ? -mag : mag;
}

/* Independent formulation 2: the nearer of the two BF16 neighbours by real
 * distance (exact in double), ties to the even one. */
static uint16_t round_by_distance(uint32_t u) {
  if (is_nan_bits(u))
    return 0x7FC0;
  if ((u & 0x7FFFFFFFu) == 0x7F800000u)
    return (uint16_t)(u >> 16);
  float f;
  memcpy(&f, &u, sizeof f);
  double x = f;
  uint16_t below = (uint16_t)(u >> 16); /* toward zero */
  uint16_t above = (uint16_t)(below + 1);
  double da = fabs(x - bf16_value_unbounded(below));
  double db = fabs(bf16_value_unbounded(above) - x);
  if (da < db)
    return below;
  if (db < da)
    return above;
  return (below & 1u) ? above : below;
}

typedef struct {
  uint32_t f32;
  uint16_t bf16;
  const char *what;
} rounding_vector;

/* Worked by hand: BF16 keeps the top 16 bits, the low 16 decide. */
static const rounding_vector vectors[] = {
    {0x3F800000u, 0x3F80, "1.0"},
    {0xBF800000u, 0xBF80, "-1.0"},
    {0x40490FDBu, 0x4049, "pi (low half 0x0FDB rounds down)"},
    {0x3F808000u, 0x3F80, "tie, even below: stays"},
    {0x3F818000u, 0x3F82, "tie, odd below: goes up to even"},
    {0x3F807FFFu, 0x3F80, "just below a tie"},
    {0x3F808001u, 0x3F81, "just above a tie"},
    {0x3F817FFFu, 0x3F81, "just below a tie, odd"},
    {0x3F818001u, 0x3F82, "just above a tie, odd"},
    {0x3F80FFFFu, 0x3F81, "almost one ulp up"},
    {0x3FFF8000u, 0x4000, "tie carrying into the exponent"},
    {0xBF808000u, 0xBF80, "negative tie, even"},
    {0xBF818000u, 0xBF82, "negative tie, odd"},
    {0xBF808001u, 0xBF81, "negative just above a tie"},
    {0x7F7FFFFFu, 0x7F80, "max finite FP32 -> +inf"},
    {0xFF7FFFFFu, 0xFF80, "-max finite FP32 -> -inf"},
    {0x7F7F7FFFu, 0x7F7F, "largest value that stays max BF16"},
    {0x7F7F8000u, 0x7F80, "tie at max BF16 (odd) -> +inf"},
    {0xFF7F7FFFu, 0xFF7F, "negative largest staying finite"},
    {0x7F800000u, 0x7F80, "+inf"},
    {0xFF800000u, 0xFF80, "-inf"},
    {0x00000000u, 0x0000, "+0.0"},
    {0x80000000u, 0x8000, "-0.0 keeps its sign"},
    {0x00000001u, 0x0000, "smallest subnormal"},
    {0x80000001u, 0x8000, "smallest negative subnormal -> -0.0"},
    {0x00008000u, 0x0000, "subnormal tie, even"},
    {0x00018000u, 0x0002, "subnormal tie, odd"},
    {0x0000FFFFu, 0x0001, "subnormal rounding up"},
    {0x00008001u, 0x0001, "subnormal just above a tie"},
    {0x80018000u, 0x8002, "negative subnormal tie, odd"},
    {0x007FFFFFu, 0x0080, "largest subnormal -> smallest normal"},
    {0x00800000u, 0x0080, "smallest normal"},
    {0x7FC00000u, 0x7FC0, "quiet NaN"},
    {0xFFC00000u, 0x7FC0, "negative quiet NaN"},
    {0x7F800001u, 0x7FC0, "signalling NaN, payload in bit 0 (naive: inf)"},
    {0xFF800001u, 0x7FC0, "negative signalling NaN, low payload"},
    {0x7F808000u, 0x7FC0, "NaN with payload at the rounding bit"},
    {0x7F80FFFFu, 0x7FC0, "NaN with only low-half payload"},
    {0x7FBFFFFFu, 0x7FC0, "signalling NaN, full payload"},
    {0x7FFFFFFFu, 0x7FC0, "quiet NaN, full payload"},
    {0xFFFF8000u, 0x7FC0, "NaN whose naive rounding wraps to 0"},
    {0xFFFFFFFFu, 0x7FC0, "all ones"},
    {0x7FC00001u, 0x7FC0, "quiet NaN, low payload"},
};

Test(bf16, rounds_known_vectors) {
  for (size_t k = 0; k < sizeof vectors / sizeof vectors[0]; k++) {
    uint16_t got = pulse_bf16_from_f32_bits(vectors[k].f32);
    cr_assert_eq(got, vectors[k].bf16, "%s: 0x%08X -> 0x%04X, want 0x%04X",
                 vectors[k].what, vectors[k].f32, got, vectors[k].bf16);
  }
}

Test(bf16, test_formulations_agree_with_vectors) {
  /* The two formulations below are only worth trusting if they pass the
   * hand-worked vectors too. */
  for (size_t k = 0; k < sizeof vectors / sizeof vectors[0]; k++) {
    cr_assert_eq(round_by_halves(vectors[k].f32), vectors[k].bf16, "halves: %s",
                 vectors[k].what);
    cr_assert_eq(round_by_distance(vectors[k].f32), vectors[k].bf16,
                 "distance: %s", vectors[k].what);
  }
}

Test(bf16, rounds_ties_to_even) {
  /* Every BF16 high half with the low half exactly at the tie. */
  for (uint32_t hi = 0; hi <= 0xFFFFu; hi++) {
    uint32_t u = hi << 16 | 0x8000u;
    if (is_nan_bits(u))
      continue;
    uint16_t want = (uint16_t)((hi & 1u) ? hi + 1 : hi);
    cr_assert_eq(pulse_bf16_from_f32_bits(u), want, "tie 0x%08X", u);
  }
}

static void check_against_formulations(uint32_t u) {
  uint16_t got = pulse_bf16_from_f32_bits(u);
  uint16_t halves = round_by_halves(u);
  if (got != halves)
    cr_assert_fail("0x%08X -> 0x%04X, by halves 0x%04X", u, got, halves);
  uint16_t distance = round_by_distance(u);
  if (got != distance)
    cr_assert_fail("0x%08X -> 0x%04X, by distance 0x%04X", u, got, distance);
}

Test(bf16, matches_independent_rounding_on_every_high_half) {
  static const uint32_t lows[] = {0x0000u, 0x0001u, 0x3FFFu, 0x7FFFu,
                                  0x8000u, 0x8001u, 0xC000u, 0xFFFFu};
  for (uint32_t hi = 0; hi <= 0xFFFFu; hi++)
    for (size_t k = 0; k < sizeof lows / sizeof lows[0]; k++)
      check_against_formulations(hi << 16 | lows[k]);
}

Test(bf16, matches_independent_rounding_on_random_bits) {
  uint64_t state = 0x5EED0001u;
  for (int i = 0; i < 4000000; i++)
    check_against_formulations((uint32_t)pulse_rng_next(&state));
}

Test(bf16, widens_exactly_and_round_trips) {
  for (uint32_t b = 0; b <= 0xFFFFu; b++) {
    uint32_t u = pulse_f32_bits_from_bf16((uint16_t)b);
    cr_assert_eq(u, b << 16, "widen 0x%04X", b);
    uint16_t back = pulse_bf16_from_f32_bits(u);
    uint16_t want = is_nan_bits(u) ? 0x7FC0 : (uint16_t)b;
    cr_assert_eq(back, want, "round trip 0x%04X -> 0x%04X", b, back);
    if (!is_nan_bits(u) && (b & 0x7F80u) != 0x7F80u) {
      float f;
      memcpy(&f, &u, sizeof f);
      cr_assert((double)f == bf16_value_unbounded((uint16_t)b),
                "value of 0x%04X", b);
    }
  }
}

Test(bf16, change_is_a_difference_of_bits) {
  cr_assert(pulse_bf16_changed(0x0000, 0x8000), "+0.0 vs -0.0 is a change");
  cr_assert(pulse_bf16_changed(0x7FC0, 0x7FC1), "NaN payloads differ");
  cr_assert(pulse_bf16_changed(0x7FC0, 0xFFC0), "NaN signs differ");
  cr_assert_not(pulse_bf16_changed(0x7FC1, 0x7FC1), "same NaN bits");
  cr_assert_not(pulse_bf16_changed(0x3F80, 0x3F80), "same value");
}

Test(bf16, zigzag_round_trips_every_delta) {
  static uint8_t seen[65536];
  memset(seen, 0, sizeof seen);
  for (uint32_t d = 0; d <= 0xFFFFu; d++) {
    uint32_t z = pulse_zigzag16((uint16_t)d);
    int32_t s = (int16_t)(uint16_t)d;
    uint32_t want = s >= 0 ? (uint32_t)(2 * s) : (uint32_t)(-2 * s - 1);
    cr_assert_eq(z, want, "zigzag(0x%04X) = %u, want %u", d, z, want);
    cr_assert_lt(z, 65536u, "zigzag(0x%04X) out of range", d);
    cr_assert_not(seen[z], "zigzag(0x%04X) = %u twice", d, z);
    seen[z] = 1;
    cr_assert_eq(pulse_unzigzag16(z), (uint16_t)d, "unzigzag(%u)", z);
  }
}

Test(bf16, zigzag_known_values) {
  static const struct {
    uint16_t delta;
    uint32_t zig;
  } known[] = {{0x0000, 0}, {0x0001, 2}, {0xFFFF, 1},      {0x0002, 4},
               {0xFFFE, 3}, {0x0003, 6}, {0x7FFF, 0xFFFE}, {0x8000, 0xFFFF}};
  for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
    cr_assert_eq(pulse_zigzag16(known[k].delta), known[k].zig, "zigzag(0x%04X)",
                 known[k].delta);
}

Test(bf16, delta_round_trips) {
  uint64_t state = 0xDE17Au;
  for (int k = 0; k < 64; k++) {
    uint16_t old_bits = (uint16_t)pulse_rng_next(&state);
    for (uint32_t nb = 0; nb <= 0xFFFFu; nb++) {
      uint16_t d = pulse_bf16_delta(old_bits, (uint16_t)nb);
      cr_assert_eq(d == 0, !pulse_bf16_changed(old_bits, (uint16_t)nb),
                   "delta zero iff unchanged (0x%04X, 0x%04X)", old_bits, nb);
      cr_assert_eq(pulse_bf16_undelta(old_bits, d), (uint16_t)nb,
                   "undelta(0x%04X, delta 0x%04X)", old_bits, d);
    }
  }
  cr_assert_eq(pulse_bf16_delta(0x3F80, 0x3F81), 1, "one ulp up");
  cr_assert_eq(pulse_bf16_delta(0x3F80, 0x3F7F), 0xFFFF, "one ulp down");
}

Test(bf16, class_is_exponent_field) {
  for (uint32_t sign = 0; sign < 2; sign++)
    for (uint32_t e = 0; e < 256; e++)
      for (uint32_t m = 0; m < 128; m++) {
        uint16_t bits = (uint16_t)(sign << 15 | e << 7 | m);
        unsigned c = pulse_bf16_class(bits);
        cr_assert_eq(c, e, "class of 0x%04X = %u, want %u", bits, c, e);
        cr_assert_lt(c, PULSE_CLASS_COUNT, "class in range");
      }
}

/* Bits that exercise the cast: edge values, ties and any 32 bits. */
static uint32_t cast_input(uint64_t *state) {
  uint64_t r = pulse_rng_next(state);
  switch (r & 3u) {
  case 0:
    return vectors[(r >> 8) % (sizeof vectors / sizeof vectors[0])].f32;
  case 1:
    return ((uint32_t)(r >> 32) & 0xFFFF0000u) | 0x8000u; /* a tie */
  default:
    return (uint32_t)(r >> 32);
  }
}

static void check_cast(pulse_isa isa, uint64_t n, unsigned offset,
                       uint64_t seed) {
  float *src = malloc((n + offset + 1) * sizeof *src);
  uint16_t *dst = malloc((n + offset + 2) * sizeof *dst);
  cr_assert(src != NULL && dst != NULL, "allocation");
  uint64_t state = seed;
  for (uint64_t i = 0; i < n + offset + 1; i++) {
    uint32_t u = cast_input(&state);
    memcpy(&src[i], &u, sizeof u);
  }
  for (uint64_t i = 0; i < n + offset + 2; i++)
    dst[i] = 0xA5A5;
  if (isa == PULSE_ISA_AUTO)
    pulse_bf16_cast_f32(src + offset, dst + offset, n);
  else
    cr_assert_eq(pulse_bf16_cast_f32_isa(src + offset, dst + offset, n, isa),
                 PULSE_OK, "cast isa %d", isa);
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &src[offset + i], sizeof u);
    uint16_t want = round_by_halves(u);
    if (dst[offset + i] != want)
      cr_assert_fail("isa %d n %llu offset %u: element %llu 0x%08X -> 0x%04X, "
                     "want 0x%04X",
                     isa, (unsigned long long)n, offset, (unsigned long long)i,
                     u, dst[offset + i], want);
  }
  for (unsigned k = 0; k < offset; k++)
    cr_assert_eq(dst[k], 0xA5A5, "cast wrote before dst");
  cr_assert_eq(dst[offset + n], 0xA5A5, "cast wrote past dst + n");
  free(src);
  free(dst);
}

Test(bf16, cast_matches_element_rounding) {
  static const pulse_isa isas[] = {PULSE_ISA_AUTO, PULSE_ISA_SCALAR,
                                   PULSE_ISA_AVX2};
  static const uint64_t sizes[] = {0,  1,  2,  7,  15,   16,
                                   17, 31, 32, 33, 1000, 1 << 20};
  for (size_t a = 0; a < sizeof isas / sizeof isas[0]; a++) {
    if (!pulse_isa_available(isas[a])) {
      cr_log_info("isa %d not available on this CPU: skipped", isas[a]);
      continue;
    }
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (unsigned offset = 0; offset < 4; offset++)
        check_cast(isas[a], sizes[s], offset, 1000 * s + offset);
  }
}

Test(bf16, cast_refuses_unknown_isa) {
  uint16_t dst = 0;
  float src = 1.0f;
  cr_assert_eq(pulse_bf16_cast_f32_isa(&src, &dst, 1, (pulse_isa)99),
               PULSE_ERR_UNSUPPORTED, "unknown instruction set");
  cr_assert_eq(dst, 0, "nothing written");
}
