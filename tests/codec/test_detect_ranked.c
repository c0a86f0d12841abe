/* test_detect_ranked.c - detection with class ranks (detect_ranked_impl.h)
 * bit for bit against the reference pieces it replaces: pulse_detect_ref
 * for positions and bits, pulse_chunk_classify for classes, ranks and
 * class counts; on every instruction set, for chunks inside a tensor, with
 * few or many classes (the fast path counts 8 of them by mask), and FP32
 * values whose rounding a CPU's BF16 instruction does otherwise. */
#include "chunk_impl.h"
#include "detect_impl.h"
#include "detect_ranked_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "rng_impl.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

typedef enum { CLASSES_WEIGHTS, CLASSES_FEW, CLASSES_ANY } class_mix;

/* Snapshot bits: weight-like (a spread of exponents, most in a few), two
 * classes only, or any bits at all. */
static uint16_t gen_old(uint64_t *state, class_mix mix) {
  uint64_t r = pulse_rng_next(state);
  uint16_t sign = (uint16_t)((r >> 63) << 15), mant = (uint16_t)((r >> 8) & 0x7Fu);
  switch (mix) {
  case CLASSES_WEIGHTS: {
    unsigned e = 122u - (unsigned)__builtin_ctzll((r >> 20) | (1ull << 14));
    return (uint16_t)(sign | e << 7 | mant);
  }
  case CLASSES_FEW:
    return (uint16_t)(sign | (120u + ((r >> 30) & 1u)) << 7 | mant);
  default:
    return (uint16_t)(r >> 32);
  }
}

typedef struct {
  pulse_dtype dtype;
  uint64_t n;
  void *cur;
  uint16_t *snap;
} ranked_case;

static void case_make(ranked_case *c, pulse_dtype dtype, uint64_t n, double density,
                      class_mix mix, uint64_t seed) {
  c->dtype = dtype;
  c->n = n;
  c->cur = malloc((n + 1) * pulse_dtype_size(dtype));
  c->snap = malloc((n + 1) * sizeof *c->snap);
  cr_assert(c->cur && c->snap, "allocation");
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + n;
  for (uint64_t i = 0; i < n; i++) {
    uint16_t old = gen_old(&state, mix), fresh = old;
    if (pulse_rng_uniform(&state) < density) {
      uint64_t r = pulse_rng_next(&state);
      fresh = (uint16_t)(old + ((r & 1u) ? 1u : 0xFFFFu) * (1u + (unsigned)((r >> 8) % 3u)));
      if (r % 97u == 0)
        fresh = (uint16_t)(old ^ 0x4000u); /* a jump to another class */
    }
    c->snap[i] = old;
    if (dtype == PULSE_DTYPE_BF16) {
      ((uint16_t *)c->cur)[i] = fresh;
    } else {
      /* FP32 that rounds to `fresh`: low half below the tie (NaNs keep
       * their canonical form only when fresh is it, so avoid them). */
      uint32_t u = (uint32_t)fresh << 16 | (uint32_t)(pulse_rng_next(&state) & 0x7FFFu);
      if ((u & 0x7FFFFFFFu) > 0x7F800000u)
        u = 0x7FC00000u;
      ((uint32_t *)c->cur)[i] = u;
    }
  }
}

static void case_free(ranked_case *c) {
  free(c->cur);
  free(c->snap);
}

/* Every chunk of 2^chunk_log2 elements of the case on `isa`, against the
 * reference pieces. */
static void check_case(const ranked_case *c, unsigned chunk_log2, pulse_isa isa) {
  pulse_changes want = PULSE_CHANGES_INIT;
  cr_assert_eq(pulse_detect_ref(c->cur, c->dtype, c->snap, c->n, 0, &want), PULSE_OK);
  pulse_detect_chunk got;
  memset(&got, 0, sizeof got);
  uint64_t size = 1ull << chunk_log2, at = 0;
  for (uint64_t first = 0; first < c->n; first += size) {
    uint32_t n = (uint32_t)(c->n - first < size ? c->n - first : size);
    cr_assert_eq(pulse_detect_chunk_ranked(c->cur, c->dtype, c->snap, first, n, isa, &got),
                 PULSE_OK, "%s", pulse_error_detail());
    uint32_t k = 0;
    while (at + k < want.count && want.pos[at + k] < first + n)
      k++;
    cr_assert_eq(got.changes.count, k, "chunk at %llu: %llu changes, want %u",
                 (unsigned long long)first, (unsigned long long)got.changes.count, k);
    uint32_t *pos = malloc((k + 1) * sizeof *pos), *rank = malloc((k + 1) * sizeof *rank);
    uint8_t *cls = malloc(k + 1);
    uint32_t hist[PULSE_CLASS_COUNT];
    cr_assert(pos && rank && cls, "allocation");
    for (uint32_t j = 0; j < k; j++)
      pos[j] = (uint32_t)(want.pos[at + j] - first);
    pulse_chunk_classify(c->snap + first, n, pos, k, hist, rank, cls);
    cr_assert_arr_eq(got.hist, hist, sizeof hist, "chunk at %llu: class counts",
                     (unsigned long long)first);
    for (uint32_t j = 0; j < k; j++) {
      cr_assert_eq(got.changes.pos[j], want.pos[at + j]);
      cr_assert_eq(got.changes.old_bits[j], want.old_bits[at + j]);
      cr_assert_eq(got.changes.new_bits[j], want.new_bits[at + j]);
      cr_assert_eq(got.cls[j], cls[j], "change %u: class", j);
      cr_assert_eq(got.rank[j], rank[j], "change %u at %u: rank %u, want %u", j, pos[j],
                   got.rank[j], rank[j]);
    }
    free(pos), free(rank), free(cls);
    at += k;
  }
  cr_assert_eq(at, want.count);
  pulse_detect_chunk_free(&got);
  pulse_changes_free(&want);
}

Test(detect_ranked, matches_the_reference_detection_and_classification) {
  static const uint64_t sizes[] = {1, 63, 255, 256, 320, 321, 1024, 5000, 70001};
  static const double densities[] = {0.0, 0.01, 0.3, 1.0};
  static const pulse_dtype dtypes[] = {PULSE_DTYPE_F32, PULSE_DTYPE_BF16};
  static const pulse_isa isas[] = {PULSE_ISA_SCALAR, PULSE_ISA_AVX2,
                                   PULSE_DETECT_RANKED_AVX512, PULSE_ISA_AUTO};
  uint64_t seed = 1;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (size_t d = 0; d < sizeof densities / sizeof *densities; d++)
      for (unsigned mix = CLASSES_WEIGHTS; mix <= CLASSES_ANY; mix++)
        for (size_t t = 0; t < 2; t++) {
          ranked_case c;
          case_make(&c, dtypes[t], sizes[s], densities[d], (class_mix)mix, seed++);
          for (size_t i = 0; i < sizeof isas / sizeof *isas; i++) {
            if (isas[i] != PULSE_DETECT_RANKED_AVX512 && !pulse_isa_available(isas[i]))
              continue;
            check_case(&c, 10, isas[i]);
            check_case(&c, 16, isas[i]);
          }
          case_free(&c);
        }
}

/* FP32 bits where a CPU's own BF16 rounding (AUTO takes VCVTNE2PS2BF16
 * where the CPU has it) is not pulse_bf16_from_f32_bits: denormals (flushed
 * by the instruction), NaNs of any payload and sign (kept by it, 0x7FC0 in
 * the reference), infinities, values that round to infinity, zeros; each
 * planted alone or in runs among weight-like values, at every lane of the
 * 64-element blocks, so every block form meets them. */
static uint32_t special_f32(uint64_t r) {
  static const uint32_t fixed[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807FFFFFu,
                                   0x00400000u, 0x00008000u, 0x7F800000u, 0xFF800000u,
                                   0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu, 0x7F7FFFFFu,
                                   0xFF7F8000u, 0x7F7F7FFFu, 0x00800000u, 0x0080FFFFu};
  if (r & 1u)
    return fixed[(r >> 1) % (sizeof fixed / sizeof *fixed)];
  uint32_t u = (uint32_t)(r >> 16);
  return (r & 2u) ? (u & 0x807FFFFFu) : (u | 0x7F800000u); /* denormal or Inf/NaN */
}

Test(detect_ranked, rounds_special_f32_values_as_the_reference) {
  static const pulse_isa isas[] = {PULSE_ISA_SCALAR, PULSE_ISA_AVX2,
                                   PULSE_DETECT_RANKED_AVX512, PULSE_ISA_AUTO};
  static const double rates[] = {0.001, 0.02, 0.5};
  for (size_t k = 0; k < sizeof rates / sizeof *rates; k++) {
    ranked_case c;
    case_make(&c, PULSE_DTYPE_F32, 20000, 0.01, CLASSES_WEIGHTS, 40 + k);
    uint32_t *u = c.cur;
    uint64_t state = 99 + k;
    for (uint64_t i = 0; i < c.n; i++) {
      if (pulse_rng_uniform(&state) >= rates[k])
        continue;
      uint64_t run = 1 + pulse_rng_next(&state) % 40u; /* a run, up to a block's width */
      for (uint64_t j = i; j < i + run && j < c.n; j++) {
        u[j] = special_f32(pulse_rng_next(&state));
        if (j % 3u == 0) /* the snapshot sometimes already holds the rounding */
          c.snap[j] = pulse_bf16_from_f32_bits(u[j]);
      }
      i += run;
    }
    for (size_t i = 0; i < sizeof isas / sizeof *isas; i++) {
      if (isas[i] != PULSE_DETECT_RANKED_AVX512 && !pulse_isa_available(isas[i]))
        continue;
      check_case(&c, 10, isas[i]);
      check_case(&c, 14, isas[i]);
    }
    case_free(&c);
  }
}

Test(detect_ranked, keeps_its_arrays_and_refuses_bad_input) {
  ranked_case c;
  case_make(&c, PULSE_DTYPE_F32, 4096, 0.05, CLASSES_WEIGHTS, 7);
  pulse_detect_chunk got;
  memset(&got, 0, sizeof got);
  for (int rep = 0; rep < 3; rep++) /* the second call starts from empty */
    cr_assert_eq(pulse_detect_chunk_ranked(c.cur, c.dtype, c.snap, 0, 4096, PULSE_ISA_AUTO,
                                           &got),
                 PULSE_OK);
  uint64_t count = got.changes.count;
  cr_assert_gt(count, 0);
  cr_assert_eq(pulse_detect_chunk_ranked(c.cur, PULSE_DTYPE_F16, c.snap, 0, 16,
                                         PULSE_ISA_AUTO, &got),
               PULSE_ERR_DTYPE);
  cr_assert_eq(pulse_detect_chunk_ranked(NULL, c.dtype, c.snap, 0, 16, PULSE_ISA_AUTO, &got),
               PULSE_ERR_ARG);
  pulse_detect_chunk_free(&got);
  pulse_detect_chunk_free(NULL);
  case_free(&c);
}
