/* outer_elem_impl.h - the per-element Nesterov outer step (docs/design.md,
 * "PULSELoCo"), written like codec/pulse_loco_elem.h (PULSE_HD, single
 * rounded operations) so a CUDA kernel can share it; it moves there once the
 * GPU outer step exists. */
#ifndef PULSE_LOCO_OUTER_ELEM_IMPL_H
#define PULSE_LOCO_OUTER_ELEM_IMPL_H

#include "pulse_elem.h"

/*   b = mu*b + avg;  theta_g = theta_g - alpha*(avg + mu*b)
 * Every product and sum is rounded on its own (no FMA: -ffp-contract=off,
 * nvcc --fmad=false), so every trainer and device reaches the same bits from
 * the same avg. */
PULSE_HD static inline void pulse_loco_outer(float *theta_g, float *b,
                                             float avg, float alpha, float mu) {
  float nb = mu * *b;
  nb = nb + avg;
  float look = mu * nb;
  float step = avg + look;
  float scaled = alpha * step;
  *b = nb;
  *theta_g = *theta_g - scaled;
}

#endif
