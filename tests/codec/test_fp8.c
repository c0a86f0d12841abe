/* test_fp8.c - the reference block quantizer (pulse_fp8.h,
 * pulse_fp8_elem.h): the integer element functions against the host's
 * IEEE float division and a nearest-value search over the E4M3FN table
 * written here (every BF16 input for several scales, ties, saturation,
 * subnormals), whole tensors with partial edge blocks against a naive
 * quantizer written here, and the track's steps (amax up, amax down,
 * scale unchanged) against quantizing the new tensor whole, all or
 * nothing when a value is NaN or infinite. */
#include "pulse_fp8.h"
#include "pulse_fp8_elem.h"
#include "rng_impl.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float f32_of(uint32_t bits) {
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The value of E4M3FN bits 0x00..0x7E (bias 7, subnormals m * 2^-9). */
static double e4m3_value(unsigned code) {
  unsigned e = (code >> 3) & 0xFu, m = code & 7u;
  return e == 0 ? ldexp(m, -9) : ldexp(8 + m, (int)e - 10);
}

/* Independent E4M3FN of a float: the nearest of the 127 non-negative
 * finite values by distance, ties to the even code, above 448 -> 448; the
 * sign copied. */
static uint8_t e4m3_nearest(float v) {
  double x = fabs((double)v);
  unsigned best = 0x7E;
  if (!(x > 448.0)) {
    double bd = INFINITY;
    for (unsigned c = 0; c <= 0x7E; c++) {
      double d = fabs(x - e4m3_value(c));
      if (d < bd || (d == bd && (c & 1u) == 0)) {
        bd = d;
        best = c;
      }
    }
  }
  return (uint8_t)(best | (signbit(v) ? 0x80u : 0u));
}

/* Independent quantization of BF16 x at scale s: the host's FP32 division. */
static uint8_t quantize_indep(uint16_t x, float s) {
  volatile float q = f32_of((uint32_t)x << 16) / s;
  return e4m3_nearest(q);
}

static uint32_t scale_indep(uint16_t amax) {
  if ((amax & 0x7FFFu) == 0)
    return bits_of(1.0f);
  volatile float s = f32_of((uint32_t)(amax & 0x7FFFu) << 16) / 448.0f;
  return bits_of(s);
}

Test(fp8_elem, e4m3_table_and_hand_values) {
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(448.0f)), 0x7E);
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(1e30f)), 0x7E, "saturates");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(464.0f)), 0x7E, "no NaN past 448");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(1.0f)), 0x38);
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(1.0625f)), 0x38, "tie to even (down)");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(1.1875f)), 0x3A, "tie to even (up)");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(0x1p-9f)), 0x01, "smallest subnormal");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(0x1p-10f)), 0x00, "half of it: to even 0");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(0x3p-10f)), 0x02, "1.5 ulp: to even 2");
  cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(0x0.fp-6f)), 0x08, "rounds into 2^-6");
  cr_assert_eq(pulse_fp8_quantize_elem(0x8000u, bits_of(1.0f)), 0x80, "-0 keeps its sign");
  for (unsigned c = 0; c <= 0x7E; c++) {
    float v = (float)e4m3_value(c);
    cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(v)), c, "code 0x%02x", c);
    cr_assert_eq(pulse_fp8_e4m3_from_f32_mag(bits_of(-v)), c, "sign ignored");
  }
}

Test(fp8_elem, f32_division_matches_the_hosts_ieee_division) {
  uint64_t rng;
  rng = (uint64_t)(34);
  for (int i = 0; i < 2000000; i++) {
    uint32_t a = (uint32_t)pulse_rng_next(&rng) & 0x7FFFFFFFu;
    uint32_t b = (uint32_t)pulse_rng_next(&rng) & 0x7FFFFFFFu;
    if (i % 4 == 1) /* subnormal operands and results */
      a &= 0x00FFFFFFu;
    if (i % 4 == 2)
      b &= 0x00FFFFFFu;
    if (i % 8 == 3) /* quotients near 1 */
      b = a ^ ((uint32_t)pulse_rng_next(&rng) & 0xFFu);
    if ((a >> 23) == 0xFF || (b >> 23) == 0xFF || (b & 0x7FFFFFFFu) == 0)
      continue;
    volatile float q = f32_of(a) / f32_of(b);
    cr_assert_eq(pulse_fp8_f32_div_bits(a, b), bits_of(q), "0x%08x / 0x%08x", a, b);
  }
}

Test(fp8_elem, scale_of_every_bf16_amax) {
  for (uint32_t a = 0; a < 0x7F80u; a++)
    cr_assert_eq(pulse_fp8_scale_bits((uint16_t)a), scale_indep((uint16_t)a), "amax 0x%04x", a);
  cr_assert_eq(pulse_fp8_scale_bits(0x8000u), bits_of(1.0f), "-0: a block of zeros");
}

Test(fp8_elem, every_bf16_input_at_several_scales) {
  /* Scales of amax 0 (s = 1), subnormal amaxes (subnormal s, quotients
   * past 448), 1, 448, the largest BF16, and a few in between. */
  const uint16_t amax[] = {0x0000, 0x0001, 0x0013, 0x0080, 0x3F80, 0x43E0,
                           0x7F7F, 0x3C23, 0x4049, 0x2F11, 0x5A5A, 0x0100};
  for (size_t k = 0; k < sizeof amax / sizeof amax[0]; k++) {
    uint32_t s = pulse_fp8_scale_bits(amax[k]);
    for (uint32_t x = 0; x < 0x10000u; x++) {
      if (!pulse_fp8_bf16_finite((uint16_t)x))
        continue;
      cr_assert_eq(pulse_fp8_quantize_elem((uint16_t)x, s), quantize_indep((uint16_t)x, f32_of(s)),
                   "x 0x%04x at amax 0x%04x", x, amax[k]);
    }
  }
}

Test(fp8_elem, nan_and_infinity_are_not_finite) {
  cr_assert(!pulse_fp8_bf16_finite(0x7F80u));
  cr_assert(!pulse_fp8_bf16_finite(0xFF80u));
  cr_assert(!pulse_fp8_bf16_finite(0x7FC0u));
  cr_assert(!pulse_fp8_bf16_finite(0xFF81u));
  cr_assert(pulse_fp8_bf16_finite(0x7F7Fu));
  cr_assert(pulse_fp8_bf16_finite(0x8000u));
}

/* ------------------------------------------------------------- tensors */

/* The naive quantizer: per block, amax over |x| as floats, the host's
 * division, the nearest search. */
static void quantize_naive(const uint16_t *x, uint64_t rows, uint64_t cols, pulse_fp8_scale mode,
                           uint8_t *q, float *scale) {
  uint64_t br = mode == PULSE_FP8_SCALE_BLOCK ? 128 : rows, bc = mode == PULSE_FP8_SCALE_BLOCK ? 128 : cols;
  uint64_t gr = (rows + br - 1) / br, gc = (cols + bc - 1) / bc;
  for (uint64_t i = 0; i < gr; i++)
    for (uint64_t j = 0; j < gc; j++) {
      float m = 0;
      for (uint64_t r = i * br; r < rows && r < (i + 1) * br; r++)
        for (uint64_t c = j * bc; c < cols && c < (j + 1) * bc; c++)
          m = fmaxf(m, fabsf(f32_of((uint32_t)x[r * cols + c] << 16)));
      volatile float s = m == 0 ? 1.0f : m / 448.0f;
      scale[i * gc + j] = s;
      for (uint64_t r = i * br; r < rows && r < (i + 1) * br; r++)
        for (uint64_t c = j * bc; c < cols && c < (j + 1) * bc; c++)
          q[r * cols + c] = quantize_indep(x[r * cols + c], s);
    }
}

/* Weights like a model's: small values of mixed signs, a few larger. */
static void fill_weights(uint16_t *x, uint64_t n, uint64_t *rng) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t r = pulse_rng_next(rng);
    uint16_t e = (uint16_t)(0x70 + (r % 14)); /* 2^-15 .. 2^-2 */
    x[i] = (uint16_t)(((r >> 8) & 0x8000u) | (e << 7) | ((r >> 20) & 0x7Fu));
  }
}

static void expect_equal(const uint8_t *q, const float *s, const uint8_t *rq, const float *rs,
                         uint64_t n, uint64_t ns) {
  for (uint64_t i = 0; i < ns; i++)
    cr_assert_eq(bits_of(s[i]), bits_of(rs[i]), "scale %llu", (unsigned long long)i);
  for (uint64_t i = 0; i < n; i++)
    cr_assert_eq(q[i], rq[i], "element %llu", (unsigned long long)i);
}

typedef struct {
  uint64_t rows, cols;
  pulse_fp8_scale mode;
} shape_case;

ParameterizedTestParameters(fp8_tensor, partial_edge_blocks_match_the_naive_quantizer) {
  static shape_case cases[] = {{300, 200, PULSE_FP8_SCALE_BLOCK}, {128, 128, PULSE_FP8_SCALE_BLOCK},
                               {1, 1000, PULSE_FP8_SCALE_BLOCK},  {257, 3, PULSE_FP8_SCALE_BLOCK},
                               {300, 200, PULSE_FP8_SCALE_TENSOR}, {1, 1, PULSE_FP8_SCALE_TENSOR}};
  return cr_make_param_array(shape_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(shape_case *sc, fp8_tensor, partial_edge_blocks_match_the_naive_quantizer) {
  uint64_t n = sc->rows * sc->cols, ns;
  cr_assert_eq(pulse_fp8_scale_count(sc->rows, sc->cols, sc->mode, &ns), PULSE_OK);
  uint16_t *x = malloc(n * 2);
  uint8_t *q = malloc(n), *rq = malloc(n);
  float *s = malloc(ns * 4), *rs = malloc(ns * 4);
  uint64_t rng;
  rng = (uint64_t)(sc->rows * 7 + sc->cols);
  fill_weights(x, n, &rng);
  for (uint64_t i = 0; i < n; i += 97) /* zeros, and -0 */
    x[i] = (uint16_t)(i % 2 ? 0x8000u : 0u);
  if (sc->mode == PULSE_FP8_SCALE_BLOCK && n > 128)
    for (uint64_t r = 0; r < sc->rows && r < 128; r++) /* a block of zeros */
      for (uint64_t c = 0; c < sc->cols && c < 128; c++)
        x[r * sc->cols + c] = 0;
  pulse_fp8_tensor t = {sc->rows, sc->cols, q, s, sc->mode};
  cr_assert_eq(pulse_fp8_quantize_ref(x, &t, 2), PULSE_OK);
  quantize_naive(x, sc->rows, sc->cols, sc->mode, rq, rs);
  expect_equal(q, s, rq, rs, n, ns);
  if (sc->mode == PULSE_FP8_SCALE_BLOCK && n > 128)
    cr_assert_eq(bits_of(s[0]), bits_of(1.0f), "a block of zeros has scale 1");
  free(x), free(q), free(rq), free(s), free(rs);
}

Test(fp8_tensor, nan_or_infinity_is_refused_and_nothing_written) {
  const uint16_t bad[] = {0x7FC0u, 0xFF80u, 0x7F80u, 0x7F81u};
  for (size_t k = 0; k < 4; k++) {
    uint16_t x[200 * 150];
    uint8_t q[200 * 150];
    float s[4];
    uint64_t rng;
    rng = (uint64_t)(k);
    fill_weights(x, 200 * 150, &rng);
    x[170 * 150 + 140] = bad[k];
    memset(q, 0xAA, sizeof q);
    memset(s, 0xAA, sizeof s);
    pulse_fp8_tensor t = {200, 150, q, s, PULSE_FP8_SCALE_BLOCK};
    cr_assert_eq(pulse_fp8_quantize_ref(x, &t, 2), PULSE_ERR_UNSUPPORTED);
    cr_assert(strstr(pulse_error_detail(), "(170, 140)") != NULL, "%s", pulse_error_detail());
    for (size_t i = 0; i < sizeof q; i++)
      cr_assert_eq(q[i], 0xAA);
    for (size_t i = 0; i < sizeof s; i++)
      cr_assert_eq(((uint8_t *)s)[i], 0xAA);
  }
}

/* ---------------------------------------------------------------- steps */

typedef struct {
  uint64_t rows, cols, n, ns;
  uint16_t *x;
  uint8_t *q, *rq;
  float *s, *rs;
  pulse_fp8_tensor t;
  pulse_fp8_track *tr;
} tracked;

static void tracked_make(tracked *k, uint64_t rows, uint64_t cols, pulse_fp8_scale mode,
                         uint64_t seed) {
  memset(k, 0, sizeof *k);
  k->rows = rows, k->cols = cols, k->n = rows * cols;
  cr_assert_eq(pulse_fp8_scale_count(rows, cols, mode, &k->ns), PULSE_OK);
  k->x = malloc(k->n * 2);
  k->q = malloc(k->n), k->rq = malloc(k->n);
  k->s = malloc(k->ns * 4), k->rs = malloc(k->ns * 4);
  uint64_t rng;
  rng = (uint64_t)(seed);
  fill_weights(k->x, k->n, &rng);
  k->t = (pulse_fp8_tensor){rows, cols, k->q, k->s, mode};
  cr_assert_eq(pulse_fp8_track_create(k->x, &k->t, 2, &k->tr), PULSE_OK);
}

static void tracked_free(tracked *k) {
  pulse_fp8_track_free(k->tr);
  free(k->x), free(k->q), free(k->rq), free(k->s), free(k->rs);
}

/* Stages and commits a step, writes the BF16 changes, checks against the
 * naive quantizer of the new tensor; returns the stage's figures. */
static pulse_fp8_stage_figures step(tracked *k, const uint64_t *off, const uint16_t *bits,
                                    uint64_t count) {
  pulse_fp8_staged *st = NULL;
  cr_assert_eq(pulse_fp8_track_stage(k->tr, off, bits, count, &st), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_fp8_stage_figures f = pulse_fp8_staged_figures_get(st);
  for (uint64_t i = 0; i < count; i++)
    k->x[off[i]] = bits[i];
  pulse_fp8_staged_commit(st);
  pulse_fp8_staged_free(st);
  quantize_naive(k->x, k->rows, k->cols, k->t.scale, k->rq, k->rs);
  expect_equal(k->q, k->s, k->rq, k->rs, k->n, k->ns);
  return f;
}

/* The offset of block (i, j)'s largest magnitude. */
static uint64_t block_max_at(const tracked *k, uint64_t i, uint64_t j) {
  uint64_t at = i * 128 * k->cols + j * 128;
  for (uint64_t r = i * 128; r < k->rows && r < (i + 1) * 128; r++)
    for (uint64_t c = j * 128; c < k->cols && c < (j + 1) * 128; c++)
      if ((k->x[r * k->cols + c] & 0x7FFFu) > (k->x[at] & 0x7FFFu))
        at = r * k->cols + c;
  return at;
}

Test(fp8_track, amax_up_rescales_one_block) {
  tracked k;
  tracked_make(&k, 300, 260, PULSE_FP8_SCALE_BLOCK, 1);
  /* Block (2, 2), the partial corner: an element above its amax. */
  uint64_t at = block_max_at(&k, 2, 2), top0 = block_max_at(&k, 0, 0), low = 5;
  while ((k.x[low] & 0x7FFFu) == (k.x[top0] & 0x7FFFu)) /* below block (0, 0)'s amax */
    low++;
  uint64_t off[2] = {290 * 260 + 259, low};
  uint16_t bits[2] = {(uint16_t)(((k.x[at] & 0x7FFFu) + 0x80u) | 0x8000u), 0};
  pulse_fp8_stage_figures f = step(&k, off, bits, 2);
  cr_assert_eq(f.blocks_touched, 2);
  cr_assert_eq(f.blocks_rescaled, 1, "only the corner's amax moved");
  cr_assert_eq(f.elements_quantized, (300 - 256) * (260 - 256) + 1);
  cr_assert_eq(f.blocks_rescanned, 0);
  tracked_free(&k);
}

Test(fp8_track, amax_down_rescans_and_rescales_one_block) {
  tracked k;
  tracked_make(&k, 300, 260, PULSE_FP8_SCALE_BLOCK, 2);
  /* First a unique largest element in block (1, 0) (random weights tie
   * at the top), then that element back down to zero. */
  uint64_t at = block_max_at(&k, 1, 0);
  uint64_t off[1] = {at};
  uint16_t bits[1] = {0x3F00u}; /* 0.5, above every weight made */
  step(&k, off, bits, 1);
  bits[0] = 0;
  pulse_fp8_stage_figures f = step(&k, off, bits, 1);
  cr_assert_eq(f.blocks_touched, 1);
  cr_assert_eq(f.blocks_rescanned, 1);
  cr_assert_eq(f.blocks_rescaled, 1, "the next largest is smaller: the scale moves");
  cr_assert_eq(f.elements_quantized, 128 * 128);
  tracked_free(&k);
}

Test(fp8_track, small_changes_requantize_only_the_changed_elements) {
  tracked k;
  tracked_make(&k, 256, 384, PULSE_FP8_SCALE_BLOCK, 3);
  /* Every non-max element moved by one ulp toward zero: scales stay. */
  uint64_t *off = malloc(k.n * 8);
  uint16_t *bits = malloc(k.n * 2);
  uint64_t count = 0;
  for (uint64_t i = 0; i < k.n; i += 13) {
    uint64_t bi = i / k.cols / 128, bj = i % k.cols / 128;
    uint64_t top = block_max_at(&k, bi, bj);
    if ((k.x[i] & 0x7FFFu) == (k.x[top] & 0x7FFFu) || (k.x[i] & 0x7FFFu) == 0)
      continue;
    off[count] = i;
    bits[count++] = (uint16_t)(k.x[i] - 1u);
  }
  pulse_fp8_stage_figures f = step(&k, off, bits, count);
  cr_assert_eq(f.blocks_touched, 6);
  cr_assert_eq(f.blocks_rescaled, 0);
  cr_assert_eq(f.blocks_rescanned, 0);
  cr_assert_eq(f.elements_quantized, count);
  free(off), free(bits);
  tracked_free(&k);
}

Test(fp8_track, random_steps_match_the_reference_every_step) {
  const pulse_fp8_scale modes[] = {PULSE_FP8_SCALE_BLOCK, PULSE_FP8_SCALE_TENSOR};
  for (int m = 0; m < 2; m++) {
    tracked k;
    tracked_make(&k, 333, 290, modes[m], 40 + (uint64_t)m);
    uint64_t rng;
    rng = (uint64_t)(7);
    uint64_t *off = malloc(k.n * 8);
    uint16_t *bits = malloc(k.n * 2);
    uint8_t *seen = calloc(k.n, 1);
    uint64_t rescaled = 0, rescanned = 0;
    for (int s = 0; s < 12; s++) {
      uint64_t count = 0;
      memset(seen, 0, k.n);
      for (uint64_t i = 0; i < k.n / 50; i++) {
        uint64_t at = pulse_rng_next(&rng) % k.n;
        if (seen[at])
          continue;
        seen[at] = 1;
        uint64_t r = pulse_rng_next(&rng);
        uint16_t v = (uint16_t)(k.x[at] + (uint16_t)((r % 7) - 3)); /* a few ulps */
        if (s % 2 == 1 && r % 200 == 0) /* now and then a new largest or a zero */
          v = (uint16_t)((r >> 16) % 2 ? 0x3F00u | (r >> 32 & 0x7Fu) : 0);
        if (!pulse_fp8_bf16_finite(v))
          v = 0;
        off[count] = at;
        bits[count++] = v;
      }
      /* and, in the other steps, block 0's largest element goes down */
      uint64_t top = block_max_at(&k, 0, 0);
      if (s % 2 == 0 && !seen[top]) {
        off[count] = top;
        bits[count++] = (uint16_t)(k.x[top] & 0x8000u);
      }
      pulse_fp8_stage_figures f = step(&k, off, bits, count);
      rescaled += f.blocks_rescaled;
      rescanned += f.blocks_rescanned;
    }
    cr_assert_gt(rescaled, 0);
    cr_assert_gt(rescanned, 0);
    free(off), free(bits), free(seen);
    tracked_free(&k);
  }
}

Test(fp8_track, a_bad_step_writes_nothing) {
  tracked k;
  tracked_make(&k, 200, 300, PULSE_FP8_SCALE_BLOCK, 5);
  uint8_t *q0 = malloc(k.n);
  float s0[6];
  memcpy(q0, k.q, k.n);
  memcpy(s0, k.s, sizeof s0);
  uint64_t top = block_max_at(&k, 0, 0);
  uint64_t off[3] = {top, 10, 150 * 300 + 299};
  uint16_t bits[3] = {0x4400u, 0x0001u, 0xFF80u}; /* amax up, then -inf */
  pulse_fp8_staged *st = NULL;
  cr_assert_eq(pulse_fp8_track_stage(k.tr, off, bits, 3, &st), PULSE_ERR_UNSUPPORTED);
  cr_assert_null(st);
  cr_assert(strstr(pulse_error_detail(), "(150, 299)") != NULL, "%s", pulse_error_detail());
  uint64_t outside = k.n;
  cr_assert_eq(pulse_fp8_track_stage(k.tr, &outside, bits, 1, &st), PULSE_ERR_ARG);
  /* Staged and dropped: nothing written either. */
  cr_assert_eq(pulse_fp8_track_stage(k.tr, off, bits, 2, &st), PULSE_OK);
  pulse_fp8_staged_free(st);
  cr_assert_eq(memcmp(q0, k.q, k.n), 0);
  cr_assert_eq(memcmp(s0, k.s, sizeof s0), 0);
  /* The track still follows the tensor: a later good step is right. */
  step(&k, off, bits, 2);
  /* An anchor with a NaN: refused, nothing written. */
  memcpy(q0, k.q, k.n);
  k.x[7] = 0x7FC1u;
  cr_assert_eq(pulse_fp8_track_requantize(k.tr, 2), PULSE_ERR_UNSUPPORTED);
  cr_assert_eq(memcmp(q0, k.q, k.n), 0);
  free(q0);
  tracked_free(&k);
}
