/* test_cuda_loco.c - the LoCo gate and error feedback on the device against
 * the CPU reference (pulse_loco_gate_ref), bit for bit: sent positions and
 * values, and the error feedback after, over sizes, send densities and edge
 * values; an output too small changes nothing.
 *
 * One allowance: where s is a NaN made by the arithmetic, IEEE leaves its
 * payload to the hardware (x86 keeps an operand's, NVIDIA returns
 * 0x7FFFFFFF), and pulse_loco_elem.h does not canonicalize it; such values
 * compare as "both NaN". The gate decision is exact in every case. With
 * PULSE_GPU_LARGE=1 (tests/gpu/check.sh) also on 10^9 elements, about 1%
 * sent. */
#include <math.h>

#include "cuda_testutil.h"
#include "parallel_impl.h"

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static int same_float(float a, float b) {
  return fbits(a) == fbits(b) || (isnan(a) && isnan(b));
}

/* theta_g, theta_r and e for n elements; `spread` scales the steps, so the
 * share of elements sent grows with it. */
static void make_loco(uint64_t seed, uint64_t n, double spread, int edges,
                      float *g, float *r, float *e) {
  for (uint64_t i = 0; i < n; i++) {
    uint64_t h = pulse_rng_at(seed, i);
    uint32_t gb = tu_f32(h, edges && h % 7 == 0 ? TU_EDGE : TU_NORMAL);
    memcpy(&g[i], &gb, 4);
    float step, err;
    uint32_t sb = tu_f32(pulse_rng_at(seed + 1, i), TU_NORMAL),
             eb = tu_f32(pulse_rng_at(seed + 2, i), TU_NORMAL);
    memcpy(&step, &sb, 4);
    memcpy(&err, &eb, 4);
    r[i] = g[i] - step * (float)spread;
    e[i] = err * (float)(spread * 0.25);
    if (edges && h % 11 == 0) {
      uint32_t x = tu_f32_edges[(h >> 8) % COUNT_OF(tu_f32_edges)];
      memcpy(h % 2 ? &r[i] : &e[i], &x, 4);
    }
  }
}

static void check_loco(uint64_t seed, uint64_t n, double spread, int edges) {
  float *g = tu_alloc((size_t)n * 4 + 4), *r = tu_alloc((size_t)n * 4 + 4);
  float *e = tu_alloc((size_t)n * 4 + 4), *e_ref = tu_alloc((size_t)n * 4 + 4);
  make_loco(seed, n, spread, edges, g, r, e);
  memcpy(e_ref, e, (size_t)n * 4);
  uint64_t *pos_ref = tu_alloc((size_t)n * 8 + 8), sent_ref = 0, sent = 0;
  float *val_ref = tu_alloc((size_t)n * 4 + 4);
  OK(pulse_loco_gate_ref(g, r, e_ref, n, n, pos_ref, val_ref, &sent_ref));
  void *g_d = dev_upload(g, (size_t)n * 4), *r_d = dev_upload(r, (size_t)n * 4);
  void *e_d = dev_upload(e, (size_t)n * 4);
  void *pos_d = dev_alloc((size_t)n * 8 + 8),
       *val_d = dev_alloc((size_t)n * 4 + 4);
  /* Too small first: nothing may change. */
  if (sent_ref > 0) {
    cr_assert_eq(pulse_cuda_loco_gate(NULL, g_d, r_d, e_d, n, sent_ref - 1,
                                      pos_d, val_d, &sent, NULL),
                 PULSE_ERR_OVERFLOW);
    cr_assert_eq(sent, sent_ref);
    float *e_now = dev_download(e_d, (size_t)n * 4);
    cr_assert_eq(tu_memdiff(e_now, e, (size_t)n * 4), -1,
                 "an overflow changed e");
    free(e_now);
  }
  OK(pulse_cuda_loco_gate(NULL, g_d, r_d, e_d, n, n, pos_d, val_d, &sent,
                          NULL));
  cr_assert_eq(sent, sent_ref, "n %llu spread %g: %llu sent, reference %llu",
               (unsigned long long)n, spread, (unsigned long long)sent,
               (unsigned long long)sent_ref);
  uint64_t *pos = dev_download(pos_d, (size_t)sent * 8);
  float *val = dev_download(val_d, (size_t)sent * 4),
        *e_got = dev_download(e_d, (size_t)n * 4);
  cr_assert_eq(tu_memdiff(pos, pos_ref, (size_t)sent * 8), -1,
               "n %llu: positions", (unsigned long long)n);
  for (uint64_t k = 0; k < sent; k++)
    cr_assert(same_float(val[k], val_ref[k]),
              "n %llu: value %llu: %08x, reference %08x", (unsigned long long)n,
              (unsigned long long)k, fbits(val[k]), fbits(val_ref[k]));
  for (uint64_t i = 0; i < n; i++)
    cr_assert(same_float(e_got[i], e_ref[i]),
              "n %llu: e[%llu]: %08x, reference %08x", (unsigned long long)n,
              (unsigned long long)i, fbits(e_got[i]), fbits(e_ref[i]));
  free(pos), free(val), free(e_got);
  pulse_cuda_free(g_d), pulse_cuda_free(r_d), pulse_cuda_free(e_d);
  pulse_cuda_free(pos_d), pulse_cuda_free(val_d);
  free(g), free(r), free(e), free(e_ref), free(pos_ref), free(val_ref);
}

Test(cuda_loco, gate_matches_the_reference) {
  GPU_TEST_START();
  static const uint64_t sizes[] = {0,    1,    31,   33,    1000,
                                   8191, 8192, 8193, 40000, 100001};
  static const double spreads[] = {0.0, 1e-4, 1e-2, 1.0};
  for (size_t si = 0; si < COUNT_OF(sizes); si++)
    for (size_t pi = 0; pi < COUNT_OF(spreads); pi++)
      check_loco(si * 10 + pi, sizes[si], spreads[pi], (si + pi) % 2);
}

Test(cuda_loco, gate_repeated_rounds_feed_the_error_back) {
  GPU_TEST_START();
  /* Ten rounds of small steps on the same arrays, device and CPU side by
   * side: e carries over and must stay identical. */
  enum { N = 20000 };
  float *g = tu_alloc(N * 4), *r = tu_alloc(N * 4), *e = tu_alloc(N * 4);
  make_loco(3, N, 1e-3, 0, g, r, e);
  void *g_d = dev_upload(g, N * 4), *r_d = dev_upload(r, N * 4),
       *e_d = dev_upload(e, N * 4);
  void *pos_d = dev_alloc(N * 8), *val_d = dev_alloc(N * 4);
  uint64_t *pos = tu_alloc(N * 8), sent = 0, sent_ref = 0;
  float *val = tu_alloc(N * 4);
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (int round = 0; round < 10; round++) {
    OK(pulse_loco_gate_ref(g, r, e, N, N, pos, val, &sent_ref));
    OK(pulse_cuda_loco_gate(ws, g_d, r_d, e_d, N, N, pos_d, val_d, &sent,
                            NULL));
    cr_assert_eq(sent, sent_ref, "round %d", round);
    float *e_got = dev_download(e_d, N * 4);
    cr_assert_eq(tu_memdiff(e_got, e, N * 4), -1, "round %d: e", round);
    free(e_got);
  }
  pulse_cuda_workspace_free(ws);
  pulse_cuda_free(g_d), pulse_cuda_free(r_d), pulse_cuda_free(e_d);
  pulse_cuda_free(pos_d), pulse_cuda_free(val_d);
  free(g), free(r), free(e), free(pos), free(val);
}

typedef struct {
  float *g, *r, *e;
  uint64_t n;
  double spread;
} loco_fill;

static void loco_fill_block(void *ctx, size_t b) {
  loco_fill *job = ctx;
  uint64_t lo = (uint64_t)b << 20,
           hi = lo + (1u << 20) < job->n ? lo + (1u << 20) : job->n;
  make_loco(777 + b, hi - lo, job->spread, 0, job->g + lo, job->r + lo,
            job->e + lo);
}

/* The size: 10^9 elements with about 1% sent (steps scaled so that
 * about one BF16 weight in a hundred would show them). */
Test(cuda_loco, a_billion_elements_match_the_reference, .timeout = 600) {
  GPU_TEST_START();
  if (!gpu_large())
    cr_skip_test(
        "10^9 elements only with PULSE_GPU_LARGE=1 (tests/gpu/check.sh)");
  const uint64_t n = 1000000000ull, cap = n / 25;
  float *g = malloc((size_t)n * 4), *r = malloc((size_t)n * 4);
  float *e = malloc((size_t)n * 4), *e_ref = malloc((size_t)n * 4);
  uint64_t *pos_ref = malloc((size_t)cap * 8), sent_ref = 0, sent = 0;
  float *val_ref = malloc((size_t)cap * 4);
  cr_assert(g && r && e && e_ref && pos_ref && val_ref, "host memory");
  loco_fill job = {g, r, e, n, 2.7e-7};
  pulse_parallel_for(0, (size_t)((n + (1u << 20) - 1) >> 20), loco_fill_block,
                     &job);
  memcpy(e_ref, e, (size_t)n * 4);
  OK(pulse_loco_gate_ref(g, r, e_ref, n, cap, pos_ref, val_ref, &sent_ref));
  cr_assert(sent_ref > n / 200 && sent_ref < n / 50,
            "%llu sent: not about 1%%", (unsigned long long)sent_ref);
  void *g_d = dev_upload(g, (size_t)n * 4), *r_d = dev_upload(r, (size_t)n * 4);
  void *e_d = dev_upload(e, (size_t)n * 4);
  free(g), free(r), free(e);
  void *pos_d = dev_alloc((size_t)cap * 8), *val_d = dev_alloc((size_t)cap * 4);
  OK(pulse_cuda_loco_gate(NULL, g_d, r_d, e_d, n, cap, pos_d, val_d, &sent,
                          NULL));
  cr_assert_eq(sent, sent_ref, "%llu sent, reference %llu",
               (unsigned long long)sent, (unsigned long long)sent_ref);
  uint64_t *pos = dev_download(pos_d, (size_t)sent * 8);
  float *val = dev_download(val_d, (size_t)sent * 4);
  cr_assert_eq(tu_memdiff(pos, pos_ref, (size_t)sent * 8), -1, "positions");
  for (uint64_t k = 0; k < sent; k++)
    cr_assert(same_float(val[k], val_ref[k]), "value %llu",
              (unsigned long long)k);
  free(pos), free(val);
  float *e_got = dev_download(e_d, (size_t)n * 4);
  for (uint64_t i = 0; i < n; i++)
    if (!same_float(e_got[i], e_ref[i]))
      cr_assert_fail("e[%llu]: %08x, reference %08x", (unsigned long long)i,
                     fbits(e_got[i]), fbits(e_ref[i]));
  free(e_got), free(e_ref), free(pos_ref), free(val_ref);
  pulse_cuda_free(g_d), pulse_cuda_free(r_d), pulse_cuda_free(e_d);
  pulse_cuda_free(pos_d), pulse_cuda_free(val_d);
}
