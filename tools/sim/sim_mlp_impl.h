/* sim_mlp_impl.h - what the built-in training problems share
 * (sim_problem.c, the distillation problem; sim_text.c, the
 * next-character one): their normal draws and the forward pass of their
 * 2-layer ReLU MLP. Inline, so each problem's AVX2 and default clones
 * (target_clones) compile it for themselves; loops run along contiguous
 * rows (axpy form), so vectorized code adds in the same order as scalar
 * code and the bits do not depend on the machine (with -ffp-contract=off). */
#ifndef PULSE_SIM_MLP_IMPL_H
#define PULSE_SIM_MLP_IMPL_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rng_impl.h"

/* Fills n standard normal floats (Box-Muller) from the stream s. */
static inline void pulse_sim_normals(uint64_t *s, float *out, uint64_t n) {
  for (uint64_t i = 0; i < n; i += 2) {
    uint64_t r = pulse_rng_next(s);
    float u1 = ((float)(r >> 40) + 0.5f) * 0x1p-24f;
    float u2 = (float)((r >> 16) & 0xFFFFFFu) * 0x1p-24f;
    float rad = sqrtf(-2.0f * logf(u1)), ang = 6.2831853f * u2;
    out[i] = rad * cosf(ang);
    if (i + 1 < n)
      out[i + 1] = rad * sinf(ang);
  }
}

/* One sample's forward pass: z = B1 + s1 x W1 (in x hid, row-major),
 * h = relu(z), logits = B2 + s2 h W2 (hid x cls). */
static inline __attribute__((always_inline)) void
pulse_sim_mlp_forward_row(const float *x, uint32_t in, float s1, const float *W1,
                         const float *B1, uint32_t hid, float s2, const float *W2,
                         const float *B2, uint32_t cls, float *z, float *h, float *logits) {
  memcpy(z, B1, hid * sizeof *z);
  for (uint32_t k = 0; k < in; k++) {
    float xk = s1 * x[k];
    const float *row = W1 + (size_t)k * hid;
    for (uint32_t j = 0; j < hid; j++)
      z[j] += xk * row[j];
  }
  for (uint32_t j = 0; j < hid; j++)
    h[j] = z[j] > 0.0f ? z[j] : 0.0f;
  memcpy(logits, B2, cls * sizeof *logits);
  for (uint32_t j = 0; j < hid; j++) {
    float hj = s2 * h[j];
    if (hj == 0.0f)
      continue;
    const float *row = W2 + (size_t)j * cls;
    for (uint32_t c = 0; c < cls; c++)
      logits[c] += hj * row[c];
  }
}

#endif
