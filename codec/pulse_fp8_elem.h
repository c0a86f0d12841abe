/* pulse_fp8_elem.h - per-element logic of the reference block quantizer
 * (pulse_fp8.h), shared by the CPU reference and the CUDA kernel
 * (cuda/fp8.cu). Integers only, like pulse_elem.h: the two FP32 roundings
 * the quantizer is made of (amax / 448, then x / s) are done on integers,
 * so host and device give the same bits whatever the compiler flags (fast
 * math, flush-to-zero, a host that set FTZ/DAZ in its MXCSR).
 *
 * The quantizer, for BF16 x (finite) in a block whose largest |x| is amax:
 *   s = amax / 448 in FP32, round to nearest even (1 when amax is 0);
 *   q = E4M3FN(x / s): the division in FP32, round to nearest even, then
 *       the E4M3FN value nearest to that FP32 value, ties to even,
 *       saturating at +-448 (E4M3FN has no infinity; 0x7F is NaN).
 * Two roundings, as `(x.float() / s).clamp(-448, 448).to(float8_e4m3fn)`
 * does in PyTorch: the FP32 quotient is what is rounded to E4M3FN. */
#ifndef PULSE_FP8_ELEM_H
#define PULSE_FP8_ELEM_H

#include <stdint.h>

#include "pulse_elem.h" /* PULSE_HD */

/* FP32 bits of 448.0, the largest E4M3FN value. */
#define PULSE_FP8_MAX_F32_BITS 0x43E00000u
/* E4M3FN bits of +448. */
#define PULSE_FP8_MAX_BITS 0x7Eu
/* FP32 bits of 1.0: the scale of a block of zeros. */
#define PULSE_F32_ONE_BITS 0x3F800000u

/* A BF16 value that can be quantized: not NaN, not +-inf. */
PULSE_HD static inline int pulse_fp8_bf16_finite(uint16_t x) {
  return (x & 0x7F80u) != 0x7F80u;
}

/* |x| as bits: for finite values the integer order of these is the order
 * of the magnitudes, so the block's amax is an integer max. */
PULSE_HD static inline uint16_t pulse_fp8_bf16_abs(uint16_t x) {
  return (uint16_t)(x & 0x7FFFu);
}

/* Rounds q + rest to an integer, to nearest, ties to even, where rest is
 * the fraction given as the bits dropped (`dropped` out of 2^shift, shift
 * in 1..63) and `sticky` (non-zero: something below those bits). */
PULSE_HD static inline uint64_t pulse_fp8_round_even(uint64_t q, uint64_t dropped,
                                                     unsigned shift, int sticky) {
  const uint64_t half = 1ull << (shift - 1);
  if (dropped > half || (dropped == half && (sticky || (q & 1u))))
    q++;
  return q;
}

/* Significand and exponent of a positive finite FP32: value = *m * 2^*e,
 * *m in [2^23, 2^24) (subnormals normalized). */
PULSE_HD static inline void pulse_fp8_f32_split(uint32_t bits, uint64_t *m, int *e) {
  const uint32_t field = (bits >> 23) & 0xFFu;
  uint64_t mant = bits & 0x7FFFFFu;
  int exp = (int)(field ? field : 1u) - 150;
  if (field)
    mant |= 0x800000u;
  while (mant < 0x800000u) {
    mant <<= 1;
    exp--;
  }
  *m = mant;
  *e = exp;
}

/* FP32 bits of a / b, rounded to nearest, ties to even (IEEE 754
 * division), for a >= 0 and b > 0, both finite FP32 bit patterns (either
 * may be subnormal; a result past the largest FP32 is +inf). */
PULSE_HD static inline uint32_t pulse_fp8_f32_div_bits(uint32_t a, uint32_t b) {
  if ((a & 0x7FFFFFFFu) == 0)
    return 0;
  uint64_t ma, mb;
  int ea, eb;
  pulse_fp8_f32_split(a, &ma, &ea);
  pulse_fp8_f32_split(b, &mb, &eb);
  /* ma / mb is in (1/2, 2): 40 more bits give a 40- or 41-bit quotient,
   * 16 or more below the 24 kept, and the remainder says what is left. */
  const uint64_t num = ma << 40;
  const uint64_t q = num / mb;
  const int sticky = (num % mb) != 0;
  const unsigned len = (q >> 40) ? 41u : 40u;
  const int scale = ea - eb - 40; /* a / b = (q + rest) * 2^scale */
  const int exp = (int)len - 1 + scale; /* of the leading bit */
  if (exp > 127)
    return 0x7F800000u;
  /* Normal results keep 24 bits; subnormal ones the bits at or above 2^-149. */
  unsigned shift = exp >= -126 ? len - 24u : (unsigned)(-149 - scale);
  if (shift > len) /* below half the smallest subnormal */
    return 0;
  const uint64_t kept = q >> shift;
  const uint64_t dropped = q & ((1ull << shift) - 1u);
  uint64_t m = pulse_fp8_round_even(kept, dropped, shift, sticky);
  if (exp < -126) /* subnormal, or rounded up into the smallest normal */
    return (uint32_t)m;
  int e = exp;
  if (m == (1ull << 24)) { /* rounded up into the next binade */
    m >>= 1;
    e++;
  }
  if (e > 127)
    return 0x7F800000u;
  return ((uint32_t)(e + 127) << 23) | ((uint32_t)m & 0x7FFFFFu);
}

/* E4M3FN bits of the magnitude of a finite FP32 value (its sign ignored):
 * nearest, ties to even, saturating at 448. */
PULSE_HD static inline uint8_t pulse_fp8_e4m3_from_f32_mag(uint32_t bits) {
  const uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag >= PULSE_FP8_MAX_F32_BITS)
    return PULSE_FP8_MAX_BITS;
  const uint32_t field = mag >> 23;
  if (field >= 121u) { /* at least 2^-6, E4M3FN's smallest normal */
    const uint64_t q = ((uint64_t)(field - 120u) << 3) | ((mag & 0x7FFFFFu) >> 20);
    const uint64_t r = pulse_fp8_round_even(q, mag & 0xFFFFFu, 20u, 0);
    /* A carry moves into the exponent; below 448 it never passes 0x7E. */
    return (uint8_t)(r > PULSE_FP8_MAX_BITS ? PULSE_FP8_MAX_BITS : r);
  }
  /* E4M3FN subnormals: multiples of 2^-9 (a result of 8 is 2^-6, the
   * smallest normal, whose bits are 8 too). */
  const uint64_t m = field ? ((mag & 0x7FFFFFu) | 0x800000u) : (mag & 0x7FFFFFu);
  const unsigned shift = 141u - (field ? field : 1u); /* value / 2^-9 = m >> shift */
  if (shift > 25u) /* m < 2^24: below a quarter of 2^-9 */
    return 0;
  return (uint8_t)pulse_fp8_round_even(m >> shift, m & ((1ull << shift) - 1u), shift, 0);
}

/* The scale of a block whose largest magnitude is amax (BF16 bits of a
 * finite value >= 0): FP32 bits of amax / 448, or of 1 when amax is 0. */
PULSE_HD static inline uint32_t pulse_fp8_scale_bits(uint16_t amax) {
  if (pulse_fp8_bf16_abs(amax) == 0)
    return PULSE_F32_ONE_BITS;
  return pulse_fp8_f32_div_bits((uint32_t)pulse_fp8_bf16_abs(amax) << 16,
                                PULSE_FP8_MAX_F32_BITS);
}

/* E4M3FN bits of BF16 x (finite) in a block of scale s (FP32 bits, > 0):
 * the sign of x (so -0.0 gives 0x80), the magnitude of E4M3FN(x / s). */
PULSE_HD static inline uint8_t pulse_fp8_quantize_elem(uint16_t x, uint32_t scale_bits) {
  const uint8_t sign = (uint8_t)((x >> 8) & 0x80u);
  const uint32_t quotient =
      pulse_fp8_f32_div_bits((uint32_t)pulse_fp8_bf16_abs(x) << 16, scale_bits);
  return (uint8_t)(sign | pulse_fp8_e4m3_from_f32_mag(quotient));
}

#endif /* PULSE_FP8_ELEM_H */
