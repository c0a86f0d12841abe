/* bf16_cast.c - FP32 -> BF16 cast of whole arrays with the one rounding. */
#include "detect_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#include <string.h>

static void cast_scalar(const float *src, uint16_t *dst, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, src + i, sizeof u);
    dst[i] = pulse_bf16_from_f32_bits(u);
  }
}

#if PULSE_HAVE_X86_DISPATCH
__attribute__((target("avx2"))) static void
cast_avx2(const float *src, uint16_t *dst, uint64_t n) {
  uint64_t i = 0;
  for (; n - i >= 16; i += 16)
    _mm256_storeu_si256((__m256i *)(void *)(dst + i),
                        pulse_bf16x16_from_f32_avx2(src + i));
  cast_scalar(src + i, dst + i, n - i);
}
#endif

pulse_status pulse_bf16_cast_f32_isa(const float *src, uint16_t *dst,
                                     uint64_t n, pulse_isa isa) {
  if (n > 0 && (src == NULL || dst == NULL))
    return pulse_fail(PULSE_ERR_ARG, "bf16 cast: NULL argument");
  if (!pulse_isa_available(isa))
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "bf16 cast: instruction set %d not available", isa);
  if (isa == PULSE_ISA_AUTO)
    isa =
        pulse_isa_available(PULSE_ISA_AVX2) ? PULSE_ISA_AVX2 : PULSE_ISA_SCALAR;
#if PULSE_HAVE_X86_DISPATCH
  if (isa == PULSE_ISA_AVX2) {
    cast_avx2(src, dst, n);
    return PULSE_OK;
  }
#endif
  cast_scalar(src, dst, n);
  return PULSE_OK;
}

void pulse_bf16_cast_f32(const float *src, uint16_t *dst, uint64_t n) {
  (void)pulse_bf16_cast_f32_isa(src, dst, n, PULSE_ISA_AUTO);
}
