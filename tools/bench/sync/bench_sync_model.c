/* bench_sync_model.c - the synthetic model of `pulse-bench sync`: a table
 * of 4096-wide BF16 matrices whose weights move, step after step, like
 * under Adam (a weight changes with a probability that falls with its
 * exponent; --uniform: every weight alike). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_sync_impl.h"
#include "rng_impl.h"

static uint64_t bs_rand(uint64_t *s) {
  return pulse_rng_next(s);
}

int bs_model_init(bs_model *m, uint64_t params, uint64_t seed) {
  const uint64_t width = 4096, per = width * width;
  memset(m, 0, sizeof *m);
  m->rng = seed * 0x2545F4914F6CDD1Dull + 1;
  m->count = (size_t)((params + per - 1) / per);
  m->info = calloc(m->count, sizeof *m->info);
  m->names = calloc(m->count, sizeof *m->names);
  m->numel = calloc(m->count, sizeof *m->numel);
  m->bits = calloc(m->count, sizeof *m->bits);
  if (!m->info || !m->names || !m->numel || !m->bits)
    return -1;
  for (size_t i = 0; i < m->count; i++) {
    uint64_t left = params - (uint64_t)i * per,
             rows = (left < per ? left : per) / width;
    if (rows == 0)
      rows = 1;
    snprintf(m->names[i], sizeof m->names[i], "layers.%zu.weight", i);
    m->info[i].name = m->names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = 2;
    m->info[i].shape[0] = rows;
    m->info[i].shape[1] = width;
    m->numel[i] = rows * width;
    m->total += m->numel[i];
    m->bits[i] = malloc(m->numel[i] * 2);
    if (m->bits[i] == NULL)
      return -1;
    /* N(0, 0.02)-like weights (Irwin-Hall of four uniforms), as BF16. */
    for (uint64_t k = 0; k < m->numel[i]; k++) {
      uint64_t r = bs_rand(&m->rng);
      double u = ((double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
                  (double)((r >> 32) & 0xffff) + (double)(r >> 48)) /
                     65536.0 -
                 2.0;
      float w = (float)(u * 1.7320508 * 0.02);
      uint32_t b;
      memcpy(&b, &w, 4);
      m->bits[i][k] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
    }
  }
  return 0;
}

/* Under Adam a step moves a weight by about the learning rate, and the move
 * shows in BF16 when it crosses an ulp, about |w|/128: a weight changes
 * with a probability about proportional to 2^-exponent. So p[e] =
 * min(cap, c 2^-e), c set by bisection so that they average to `density`
 * over the model's exponents (sampled from its first tensor), and the
 * smallest weights capped at 8x the density. The real AdamW trajectory has
 * this shape: there class-conditioned positions take 30% fewer bytes.
 * uniform: p[e] = density for every e. */
void bs_model_calibrate(bs_model *m, double density, int uniform) {
  double hist[256] = {0}, n = 0;
  uint64_t sample =
      m->numel[0] < ((uint64_t)1 << 20) ? m->numel[0] : (uint64_t)1 << 20;
  for (uint64_t k = 0; k < sample; k++, n++)
    hist[(m->bits[0][k] >> 7) & 0xFF]++;
  double cap = 8 * density < 1 ? 8 * density : 1;
  double lo = -200, hi = 200; /* log2 c */
  for (int it = 0; it < 200 && !uniform; it++) {
    double mid = (lo + hi) / 2, mean = 0;
    for (int e = 0; e < 256; e++) {
      double q = exp2(mid - e);
      mean += hist[e] * (q < cap ? q : cap);
    }
    if (mean / n < density)
      lo = mid;
    else
      hi = mid;
  }
  m->p_max = 0;
  for (int e = 0; e < 256; e++) {
    double q = exp2(lo - e);
    m->p[e] = uniform ? density : (q < cap ? q : cap);
    if (hist[e] > 0 && m->p[e] > m->p_max)
      m->p_max = m->p[e];
  }
  if (m->p_max <= 0)
    m->p_max = density;
}

/* Moves weights by 1-3 ulps, each with its probability p[exponent]:
 * geometric skips at p_max, each stop taken with p / p_max (O(changes)). */
void bs_model_step(bs_model *m) {
  double lq = log1p(-(m->p_max < 1 ? m->p_max : 0.999999));
  for (size_t i = 0; i < m->count; i++) {
    uint64_t pos = 0;
    for (;;) {
      double u = ((double)(bs_rand(&m->rng) >> 11) + 1.0) * 0x1p-53;
      pos += (uint64_t)(log(u) / lq);
      if (pos >= m->numel[i])
        break;
      uint64_t r = bs_rand(&m->rng);
      double take = m->p[(m->bits[i][pos] >> 7) & 0xFF] / m->p_max;
      if (take < 1 && (double)(bs_rand(&m->rng) >> 11) * 0x1p-53 >= take) {
        pos++;
        continue;
      }
      int delta = (int)(r % 3) + 1;
      m->bits[i][pos] =
          (uint16_t)(m->bits[i][pos] + ((r >> 8) & 1 ? delta : -delta));
      pos++;
    }
  }
}

void bs_model_free(bs_model *m) {
  for (size_t i = 0; m->bits && i < m->count; i++)
    free(m->bits[i]);
  free(m->info), free(m->names), free(m->numel), free(m->bits);
}
