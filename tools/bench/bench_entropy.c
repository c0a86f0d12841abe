/* bench_entropy.c - empirical entropy of one step's changes: what an ideal
 * order-0 coder would spend on positions (given the tensor and the old
 * exponent class, which every receiver knows from its base weights) and on
 * value differences. */
#include "bench_impl.h"

#include "pulse_elem.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* n * H2(k / n) in bits: the cost of saying which k of n items are marked. */
static double binary_entropy_bits(uint64_t n, uint64_t k) {
  if (k == 0 || k >= n)
    return 0.0;
  double p = (double)k / (double)n;
  return -(double)k * log2(p) - (double)(n - k) * log2(1.0 - p);
}

/* 2^17 zig-zag values cover every 16-bit delta. */
#define ZIGZAG_SYMBOLS (1u << 17)

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

/* Order-0 entropy of the zig-zag deltas within each old exponent class:
 * keys (class << 17 | zig-zag) sorted, so runs are symbol counts. */
static pulse_status values_given_class_bits(const bench_table *t,
                                            const pulse_changes *changes,
                                            uint64_t total_changed,
                                            double *bits) {
  *bits = 0.0;
  if (total_changed == 0)
    return PULSE_OK;
  uint32_t *keys = malloc((size_t)total_changed * sizeof *keys);
  if (keys == NULL)
    return PULSE_ERR_NOMEM;
  uint64_t class_count[PULSE_CLASS_COUNT] = {0};
  size_t n = 0;
  for (size_t i = 0; i < t->count; i++)
    for (uint64_t k = 0; k < changes[i].count; k++) {
      unsigned cl = pulse_bf16_class(changes[i].old_bits[k]);
      class_count[cl]++;
      keys[n++] = (uint32_t)cl << 17 |
                  pulse_zigzag16(pulse_bf16_delta(changes[i].old_bits[k],
                                                  changes[i].new_bits[k]));
    }
  qsort(keys, n, sizeof *keys, cmp_u32);
  for (size_t a = 0; a < n;) {
    size_t b = a;
    while (b < n && keys[b] == keys[a])
      b++;
    double c = (double)(b - a);
    *bits -= c * log2(c / (double)class_count[keys[a] >> 17]);
    a = b;
  }
  free(keys);
  return PULSE_OK;
}

pulse_status bench_entropy_compute(const bench_table *t,
                                   const uint16_t *old_bf16,
                                   const pulse_changes *changes,
                                   bench_entropy_bits *out) {
  memset(out, 0, sizeof *out);
  uint64_t *sym = calloc(ZIGZAG_SYMBOLS, sizeof *sym);
  if (sym == NULL)
    return PULSE_ERR_NOMEM;
  uint64_t total_changed = 0;
  for (size_t i = 0; i < t->count; i++) {
    const pulse_changes *c = &changes[i];
    const uint16_t *old = old_bf16 + t->offset[i];
    uint64_t n_c[PULSE_CLASS_COUNT] = {0}, k_c[PULSE_CLASS_COUNT] = {0};
    for (uint64_t j = 0; j < t->numel[i]; j++)
      n_c[pulse_bf16_class(old[j])]++;
    for (uint64_t k = 0; k < c->count; k++) {
      k_c[pulse_bf16_class(c->old_bits[k])]++;
      sym[pulse_zigzag16(pulse_bf16_delta(c->old_bits[k], c->new_bits[k]))]++;
    }
    for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
      out->positions_class_bits += binary_entropy_bits(n_c[cl], k_c[cl]);
    out->positions_tensor_bits += binary_entropy_bits(t->numel[i], c->count);
    total_changed += c->count;
  }
  for (uint32_t v = 0; v < ZIGZAG_SYMBOLS; v++)
    if (sym[v] > 0)
      out->values_bits -=
          (double)sym[v] * log2((double)sym[v] / (double)total_changed);
  free(sym);
  return values_given_class_bits(t, changes, total_changed,
                                 &out->values_class_bits);
}
