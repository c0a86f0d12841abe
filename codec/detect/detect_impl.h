/* detect_impl.h - private pieces of the fast change detection and the BF16
 * cast: instruction-set choice, tuning knobs (so tests can reach the scalar
 * fallback and the thread split on any machine), and the AVX2 form of the one
 * rounding shared by detect_fast.c and bf16_cast.c. */
#ifndef PULSE_DETECT_IMPL_H
#define PULSE_DETECT_IMPL_H

#include "pulse_codec.h"

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define PULSE_HAVE_X86_DISPATCH 1
#include <immintrin.h>
#else
#define PULSE_HAVE_X86_DISPATCH 0
#endif

typedef enum {
  PULSE_ISA_AUTO = 0,   /* the best this CPU runs */
  PULSE_ISA_SCALAR = 1, /* portable C, block skipping on 64-bit words */
  PULSE_ISA_AVX2 = 2
} pulse_isa;

/** Non-zero when `isa` is compiled in and this CPU runs it (AUTO and SCALAR
 * always are). */
int pulse_isa_available(pulse_isa isa);

/* Inputs below this many elements per thread use fewer threads: starting a
 * thread costs about as much as scanning this many elements. */
#define PULSE_DETECT_MIN_PER_THREAD (1u << 20)

typedef struct {
  pulse_isa isa;
  uint64_t min_per_thread; /* elements; 0 means 1 */
} pulse_detect_tuning;

#define PULSE_DETECT_TUNING_INIT                                               \
  { PULSE_ISA_AUTO, PULSE_DETECT_MIN_PER_THREAD }

/** pulse_detect_fast with explicit tuning (NULL = defaults). An `isa` this
 * CPU cannot run gives PULSE_ERR_UNSUPPORTED. */
pulse_status pulse_detect_fast_tuned(const void *cur, pulse_dtype cur_dtype,
                                     uint16_t *snapshot, uint64_t n,
                                     int update_snapshot, int threads,
                                     const pulse_detect_tuning *tuning,
                                     pulse_changes *out);

/** pulse_bf16_cast_f32 on a chosen instruction set; PULSE_ERR_UNSUPPORTED
 * when this CPU cannot run it. */
pulse_status pulse_bf16_cast_f32_isa(const float *src, uint16_t *dst,
                                     uint64_t n, pulse_isa isa);

#if PULSE_HAVE_X86_DISPATCH
/* pulse_bf16_from_f32_bits on 8 lanes of FP32 bits, as 32-bit lanes holding
 * the BF16 bits. Integer operations only, same formula as pulse_elem.h. */
__attribute__((target("avx2"))) static inline __m256i
pulse_bf16x8_from_f32_bits_avx2(__m256i u) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i inf = _mm256_set1_epi32(0x7F800000);
  const __m256i qnan = _mm256_set1_epi32(0x7FC0);
  /* Both sides are below 2^31, so the signed compare is the unsigned one. */
  __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
  __m256i lsb =
      _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
  __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  return _mm256_blendv_epi8(rounded, qnan, is_nan);
}

/* 16 FP32 values (unaligned) -> 16 BF16 bits in order. */
__attribute__((target("avx2"))) static inline __m256i
pulse_bf16x16_from_f32_avx2(const float *src) {
  __m256i a = pulse_bf16x8_from_f32_bits_avx2(
      _mm256_loadu_si256((const __m256i *)(const void *)src));
  __m256i b = pulse_bf16x8_from_f32_bits_avx2(
      _mm256_loadu_si256((const __m256i *)(const void *)(src + 8)));
  /* Lanes hold 0..0xFFFF, so the saturating pack is exact; it interleaves
   * 128-bit halves (a0 b0 a1 b1), which the permute puts back in order. */
  return _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
}

/* How many of the 64 bytes of `bit` hold each bit j (0..7), in u64 lane j:
 * GF2P8AFFINEQB with the matrix of a qword's eight bytes and the bytes
 * 1 << j transposes them, so that the popcount of byte j is how many of the
 * eight hold bit j; a byte permute puts the eight qwords' counts of bit j
 * in qword j, which a sum of absolute differences adds. With one bit per
 * class byte (a table lookup), eight classes are counted at once: the
 * ranked detection's hot classes (detect_ranked.c) and the locate's groups
 * (chunk_locate.c). */
__attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bitalg,gfni"))) static inline __m512i
pulse_bit_counts64_avx512(__m512i bit) {
  const __m512i unit = _mm512_set1_epi64((long long)0x8040201008040201ull);
  const __m512i by_bit = _mm512_set_epi8(
      63, 55, 47, 39, 31, 23, 15, 7, 62, 54, 46, 38, 30, 22, 14, 6, 61, 53, 45, 37, 29, 21, 13, 5,
      60, 52, 44, 36, 28, 20, 12, 4, 59, 51, 43, 35, 27, 19, 11, 3, 58, 50, 42, 34, 26, 18, 10, 2,
      57, 49, 41, 33, 25, 17, 9, 1, 56, 48, 40, 32, 24, 16, 8, 0);
  __m512i per_qword = _mm512_popcnt_epi8(_mm512_gf2p8affine_epi64_epi8(unit, bit, 0));
  return _mm512_sad_epu8(_mm512_permutexvar_epi8(by_bit, per_qword), _mm512_setzero_si512());
}
#endif

#endif /* PULSE_DETECT_IMPL_H */
