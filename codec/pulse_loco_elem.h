/* pulse_loco_elem.h - per-element PULSELoCo logic shared by the CPU reference
 * and the CUDA kernels (docs/design.md, "PULSELoCo"):
 *
 *   s    = e + delta                       delta = theta_g - theta_r
 *   mask = bf16(theta_g) != bf16(theta_g - s)   (the BF16 visibility gate)
 *   sent = s where mask;  e = s where not mask, else 0
 *
 * Float arithmetic here is single IEEE additions and subtractions, rounded to
 * nearest: the host builds with -ffp-contract=off and nvcc with
 * --fmad=false, so no FMA contraction changes a result, and host and device
 * give the same bits. */
#ifndef PULSE_LOCO_ELEM_H
#define PULSE_LOCO_ELEM_H

#include <stdint.h>
#include <string.h>

#include "pulse_elem.h"

PULSE_HD static inline uint32_t pulse_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* The error-fed pseudo-gradient s = e + (theta_g - theta_r). A NaN result
 * is made the canonical quiet NaN: x86 and NVIDIA GPUs propagate different
 * NaN bits, and host and device must agree bit for bit. */
PULSE_HD static inline float pulse_loco_signal(float theta_g, float theta_r, float e) {
  float delta = theta_g - theta_r;
  float s = e + delta;
  if (s != s) {
    uint32_t canonical = 0x7FC00000u;
    memcpy(&s, &canonical, sizeof s);
  }
  return s;
}

/* 1 when applying s to theta_g would change its BF16 value: only then is the
 * entry worth sending now; otherwise it waits in the error feedback. */
PULSE_HD static inline int pulse_loco_gate(float theta_g, float s) {
  float moved = theta_g - s;
  return pulse_bf16_from_f32_bits(pulse_f32_bits(theta_g)) !=
         pulse_bf16_from_f32_bits(pulse_f32_bits(moved));
}

#endif
