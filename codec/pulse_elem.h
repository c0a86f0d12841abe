/* pulse_elem.h - per-element logic shared by the CPU reference, the CPU fast
 * paths and the CUDA kernels. Everything here is a PULSE_HD static inline
 * function on integers: no floating-point arithmetic, so host and device give
 * the same bits whatever the compiler flags.
 *
 * This header is the specification of the one rounding, of what counts as a
 * change, of the position classes of the patch format, and of the element hash
 * of the state digest. Do not write a second version of any of these. */
#ifndef PULSE_ELEM_H
#define PULSE_ELEM_H

#include <stdint.h>

#if defined(__CUDACC__)
#define PULSE_HD __host__ __device__
#else
#define PULSE_HD
#endif

/* FP32 bits -> BF16 bits, round to nearest, ties to even: exactly PyTorch's
 * c10::detail::round_to_nearest_even, which `tensor.to(torch.bfloat16)` uses
 * on the CPU. Every NaN (any sign, any payload) becomes the canonical quiet
 * NaN 0x7FC0; +-inf stay +-inf; finite values that round past the largest
 * BF16 become +-inf; subnormals round like any other value (no flush);
 * -0.0 stays 0x8000. */
PULSE_HD static inline uint16_t pulse_bf16_from_f32_bits(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u)
    return (uint16_t)0x7FC0u;
  uint32_t rounding_bias = ((u >> 16) & 1u) + 0x7FFFu;
  return (uint16_t)((u + rounding_bias) >> 16);
}

/* BF16 bits -> FP32 bits (exact). */
PULSE_HD static inline uint32_t pulse_f32_bits_from_bf16(uint16_t b) {
  return (uint32_t)b << 16;
}

/* A change is a difference of bits: -0.0 vs +0.0 is a change, two NaNs with
 * different payloads are a change, the same NaN bits are not. */
PULSE_HD static inline int pulse_bf16_changed(uint16_t old_bits,
                                              uint16_t new_bits) {
  return old_bits != new_bits;
}

/* Number of position classes of the class position model (docs/formats/patch.md). */
#define PULSE_CLASS_COUNT 256u

/* Position class of an element: its BF16 exponent field. Small weights change
 * more often under Adam (the update is about lr, the ulp is |w|/128), so a
 * receiver that knows the old exponent needs fewer bits per position. */
PULSE_HD static inline unsigned pulse_bf16_class(uint16_t old_bits) {
  return (old_bits >> 7) & 0xFFu;
}

/* The value a patch carries for a change: the new bits minus the old bits,
 * modulo 2^16 (never 0). Adam moves a weight by a few ulps, and BF16 bit
 * patterns are monotone within a sign, so this is mostly +-1..3. */
PULSE_HD static inline uint16_t pulse_bf16_delta(uint16_t old_bits,
                                                 uint16_t new_bits) {
  return (uint16_t)(new_bits - old_bits);
}

PULSE_HD static inline uint16_t pulse_bf16_undelta(uint16_t old_bits,
                                                   uint16_t delta) {
  return (uint16_t)(old_bits + delta);
}

/* Zig-zag of a 16-bit delta read as signed: 1 -> 2, -1 -> 1, 2 -> 4, ... */
PULSE_HD static inline uint32_t pulse_zigzag16(uint16_t delta) {
  int32_t d = (int16_t)delta;
  return d >= 0 ? (uint32_t)d << 1 : ((uint32_t)(-(d + 1)) << 1) | 1u;
}

PULSE_HD static inline uint16_t pulse_unzigzag16(uint32_t z) {
  int32_t d = (z & 1u) ? -(int32_t)(z >> 1) - 1 : (int32_t)(z >> 1);
  return (uint16_t)d;
}

/* Element hash of the additive state digest (docs/formats/patch.md, "Digests"). Two
 * independent 64-bit lanes over x = index << 16 | bits; a tensor digest is the
 * lane-wise sum modulo 2^64 over all elements, so replacing one element's bits
 * updates the digest in O(1) and partial sums combine in any order. */
PULSE_HD static inline uint64_t pulse_digest_lane_a(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

PULSE_HD static inline uint64_t pulse_digest_lane_b(uint64_t x) {
  x ^= 0xD6E8FEB86659FD93ull;
  x = (x ^ (x >> 33)) * 0xFF51AFD7ED558CCDull;
  x = (x ^ (x >> 33)) * 0xC4CEB9FE1A85EC53ull;
  return x ^ (x >> 33);
}

PULSE_HD static inline uint64_t pulse_digest_key(uint64_t index,
                                                 uint16_t bits) {
  return (index << 16) | bits;
}

#endif /* PULSE_ELEM_H */
