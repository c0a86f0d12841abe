/* drift.c - replicas that received different chunks (docs/formats/loco-chunks.md "Chunks",
 * "Drift"): a digest per range of theta_g and b to find where two replicas
 * differ, the drift between two replicas, and the re-synchronization of a
 * range from a reference replica's values (carried over the reliable
 * path). */
#include <math.h>
#include <string.h>

#include "loco_impl.h"
#include "status_impl.h"

pulse_status pulse_loco_range_digest(const pulse_loco *ctx, uint64_t start,
                                     uint64_t length, uint64_t *digest) {
  if (ctx == NULL || digest == NULL || length == 0 || start >= ctx->n ||
      length > ctx->n - start)
    return pulse_fail(PULSE_ERR_ARG, "loco range digest: bad range");
  /* theta_g and b both: a range agrees only when both do (b steers every
   * later step). */
  *digest = pulse_loco_digest_f32(ctx->theta_g + start, length) * 3u +
            pulse_loco_digest_f32(ctx->b + start, length);
  return PULSE_OK;
}

pulse_status pulse_loco_resync_range(pulse_loco *ctx, uint64_t start,
                                     uint64_t length, const float *theta_g,
                                     const float *b) {
  if (ctx == NULL || theta_g == NULL || b == NULL || length == 0 ||
      start >= ctx->n || length > ctx->n - start)
    return pulse_fail(PULSE_ERR_ARG, "loco resync: bad range");
  if (ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco resync: a round is prepared");
  for (uint64_t i = 0; i < length; i++)
    if (!isfinite(theta_g[i]) || !isfinite(b[i]))
      return pulse_fail(PULSE_ERR_CORRUPT, "loco resync: value not finite");
  memcpy(ctx->theta_g + start, theta_g, (size_t)length * sizeof *theta_g);
  memcpy(ctx->b + start, b, (size_t)length * sizeof *b);
  pulse_loco_refresh_(ctx);
  return PULSE_OK;
}

double pulse_loco_drift(const float *theta_a, const float *theta_b,
                        uint64_t n) {
  double diff = 0.0, norm = 0.0;
  for (uint64_t i = 0; i < n; i++) {
    double d = (double)theta_a[i] - (double)theta_b[i];
    diff += d * d;
    norm += (double)theta_a[i] * (double)theta_a[i];
  }
  return norm > 0.0 ? sqrt(diff / norm) : (diff > 0.0 ? INFINITY : 0.0);
}

/* A sign per (parameter, sketch row), the same on every replica: the bits
 * of a 64-bit mix of the parameter's index. */
static uint64_t sign_bits(uint64_t i) {
  uint64_t z = i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

pulse_status pulse_loco_range_sketch(const pulse_loco *ctx, uint64_t start,
                                     uint64_t length,
                                     double sketch[PULSE_LOCO_SKETCH]) {
  if (ctx == NULL || sketch == NULL || length == 0 || start >= ctx->n ||
      length > ctx->n - start)
    return pulse_fail(PULSE_ERR_ARG, "loco range sketch: bad range");
  for (unsigned j = 0; j < PULSE_LOCO_SKETCH; j++)
    sketch[j] = 0.0;
  for (uint64_t i = start; i < start + length; i++) {
    uint64_t s = sign_bits(i);
    double v = (double)ctx->theta_g[i];
    for (unsigned j = 0; j < PULSE_LOCO_SKETCH; j++)
      sketch[j] += (s >> j) & 1u ? v : -v;
  }
  return PULSE_OK;
}

double pulse_loco_drift_estimate(const pulse_loco *ctx, uint64_t range_len,
                                 const uint8_t *differ,
                                 const double *ref_sketch) {
  if (ctx == NULL || range_len == 0 || differ == NULL || ref_sketch == NULL)
    return INFINITY;
  uint64_t P = ctx->n, count = (P + range_len - 1) / range_len;
  double diff = 0.0, norm = 0.0;
  for (uint64_t i = 0; i < P; i++)
    norm += (double)ctx->theta_g[i] * (double)ctx->theta_g[i];
  for (uint64_t k = 0; k < count; k++) {
    if (!differ[k])
      continue;
    uint64_t a = k * range_len, len = P - a < range_len ? P - a : range_len;
    double own[PULSE_LOCO_SKETCH], sum = 0.0;
    pulse_loco_range_sketch(ctx, a, len, own);
    /* With random signs, E[(s_own - s_ref)^2] = ||delta||^2 over the
     * range, for each row: their mean estimates it. */
    for (unsigned j = 0; j < PULSE_LOCO_SKETCH; j++) {
      double d = own[j] - ref_sketch[k * PULSE_LOCO_SKETCH + j];
      sum += d * d;
    }
    diff += sum / PULSE_LOCO_SKETCH;
  }
  return norm > 0.0 ? sqrt(diff / norm) : (diff > 0.0 ? INFINITY : 0.0);
}
