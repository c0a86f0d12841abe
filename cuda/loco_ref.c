/* loco_ref.c - CPU reference of the PULSELoCo gate and error feedback: a
 * plain loop over pulse_loco_elem.h, the specification the CUDA kernel
 * (loco.cu) is tested against bit for bit. Built with or without CUDA. */
#include "pulse_cuda.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

pulse_status pulse_loco_gate_ref(const float *theta_g, const float *theta_r,
                                 float *e, uint64_t n, uint64_t capacity,
                                 uint64_t *pos, float *value, uint64_t *sent) {
  if (sent != NULL)
    *sent = 0;
  if (n > 0 && (theta_g == NULL || theta_r == NULL || e == NULL))
    return pulse_fail(PULSE_ERR_ARG, "loco gate: NULL input");
  if (capacity > 0 && (pos == NULL || value == NULL))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco gate: NULL output with capacity %llu",
                      (unsigned long long)capacity);
  /* Count first, so that an output too small changes nothing. */
  uint64_t k = 0;
  for (uint64_t i = 0; i < n; i++) {
    float s = pulse_loco_signal(theta_g[i], theta_r[i], e[i]);
    k += (uint64_t)pulse_loco_gate(theta_g[i], s);
  }
  if (sent != NULL)
    *sent = k;
  if (k > capacity)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "loco gate: %llu entries to send, room for %llu",
                      (unsigned long long)k, (unsigned long long)capacity);
  k = 0;
  for (uint64_t i = 0; i < n; i++) {
    float s = pulse_loco_signal(theta_g[i], theta_r[i], e[i]);
    if (pulse_loco_gate(theta_g[i], s)) {
      pos[k] = i;
      value[k] = s;
      k++;
      e[i] = 0.0f;
    } else {
      e[i] = s;
    }
  }
  return PULSE_OK;
}
