/* test_cuda_host.c - what runs without a GPU: the CPU reference of the LoCo
 * gate on edge values, the build without CUDA (every entry says
 * PULSE_ERR_NOT_BUILT), and the argument checks every entry makes before it
 * looks for a device. */
#include <math.h>

#include "cuda_testutil.h"
#include "pulse_loco_elem.h"

static float f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint32_t bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* --------------------------------------------------- LoCo CPU reference */

/* One element through the reference: sent or not, the value, the new e. */
typedef struct {
  int sent;
  float value;
  float e;
} gate_out;

static gate_out gate1(float g, float r, float e) {
  uint64_t pos = 99, sent = 0;
  float value = -1.0f;
  OK(pulse_loco_gate_ref(&g, &r, &e, 1, 1, &pos, &value, &sent));
  gate_out o = {(int)sent, value, e};
  if (sent)
    cr_assert_eq(pos, 0);
  return o;
}

Test(cuda_host, loco_gate_keeps_what_the_bf16_weight_would_not_show) {
  /* Just below 1.0 a BF16 ulp is 2^-8: 1 - 2^-9 is a tie that rounds back to
   * 1.0 (even), so the step waits in e; 1 - 2^-7 shows, is sent, e is 0. */
  gate_out o = gate1(1.0f, 1.0f - 0x1p-9f, 0.0f);
  cr_assert_eq(o.sent, 0);
  cr_assert_eq(bits(o.e), bits(0x1p-9f));
  o = gate1(1.0f, 1.0f - 0x1p-7f, 0.0f);
  cr_assert_eq(o.sent, 1);
  cr_assert_eq(bits(o.value), bits(0x1p-7f));
  cr_assert_eq(bits(o.e), 0u);
  /* Error feedback: half-ulp steps accumulate until they show. */
  float e = 0.0f;
  int sent_at = -1;
  for (int step = 0; step < 4 && sent_at < 0; step++) {
    o = gate1(1.0f, 1.0f - 0x1p-9f, e);
    e = o.e;
    if (o.sent)
      sent_at = step;
  }
  cr_assert_eq(sent_at, 1, "two half ulps make one BF16 ulp");
}

Test(cuda_host, loco_gate_edge_values) {
  /* -0.0: theta_g = -0, theta_r = +0: s = +0, theta_g - s = -0: same BF16. */
  gate_out o = gate1(f32(0x80000000u), 0.0f, 0.0f);
  cr_assert_eq(o.sent, 0);
  cr_assert_eq(bits(o.e), 0x00000000u);
  /* Subnormals are not flushed: a subnormal step of a subnormal weight. */
  o = gate1(f32(0x00010000u), 0.0f, 0.0f);
  cr_assert_eq(o.sent, 1, "0x00010000 and 0 differ in BF16");
  cr_assert_eq(bits(o.value), 0x00010000u);
  o = gate1(f32(0x00010000u), f32(0x0000FFFFu), 0.0f);
  cr_assert_eq(o.sent, 0, "one FP32 subnormal ulp is far below a BF16 ulp");
  cr_assert_eq(bits(o.e), 0x00000001u);
  /* Infinities: an infinite step is sent; inf - inf is NaN, sent too. */
  o = gate1(1.0f, -INFINITY, 0.0f);
  cr_assert_eq(o.sent, 1);
  cr_assert(isinf(o.value) && o.value > 0);
  o = gate1(INFINITY, INFINITY, 0.0f);
  cr_assert_eq(o.sent, 1, "bf16(inf) != bf16(inf - NaN)");
  cr_assert(isnan(o.value));
  cr_assert_eq(bits(o.e), 0u);
  /* NaN weights: bf16(NaN) == bf16(NaN - s): nothing to send, e keeps s. */
  o = gate1(f32(0x7FC00001u), 0.0f, 0.0f);
  cr_assert_eq(o.sent, 0);
  cr_assert(isnan(o.e));
  /* From the largest finite BF16, a step that rounds to infinity (a tie,
   * to even) is a change. */
  o = gate1(f32(0x7F7F0000u), f32(0x7F7F8000u), 0.0f);
  cr_assert_eq(o.sent, 1);
  cr_assert_eq(bits(o.value), bits(-0x1p119f));
}

Test(cuda_host, loco_gate_reference_matches_the_element_function) {
  /* The reference is a loop over pulse_loco_elem.h: on many elements, its
   * outputs are those of the element functions, sent ones in position order. */
  enum { N = 20000 };
  float *g = tu_alloc(N * sizeof *g), *r = tu_alloc(N * sizeof *r),
        *e = tu_alloc(N * sizeof *e);
  float *e0 = tu_alloc(N * sizeof *e0), *value = tu_alloc(N * sizeof *value);
  uint64_t *pos = tu_alloc(N * sizeof *pos), sent = 0;
  for (uint64_t i = 0; i < N; i++) {
    uint64_t h = pulse_rng_at(7, i);
    g[i] = f32(tu_f32(h, TU_EDGE));
    r[i] = g[i] - f32(tu_f32(pulse_rng_at(8, i), TU_NORMAL)) * 0x1p-8f;
    e0[i] = e[i] = f32(tu_f32(pulse_rng_at(9, i), TU_NORMAL)) * 0x1p-12f;
  }
  OK(pulse_loco_gate_ref(g, r, e, N, N, pos, value, &sent));
  cr_assert_gt(sent, 0);
  cr_assert_lt(sent, N);
  uint64_t k = 0;
  for (uint64_t i = 0; i < N; i++) {
    float s = pulse_loco_signal(g[i], r[i], e0[i]);
    if (pulse_loco_gate(g[i], s)) {
      cr_assert_eq(pos[k], i);
      cr_assert(bits(value[k]) == bits(s) || (isnan(value[k]) && isnan(s)));
      cr_assert_eq(bits(e[i]), 0u);
      k++;
    } else {
      cr_assert(bits(e[i]) == bits(s) || (isnan(e[i]) && isnan(s)));
    }
  }
  cr_assert_eq(k, sent);
  free(g), free(r), free(e), free(e0), free(value), free(pos);
}

Test(cuda_host, loco_gate_reference_overflow_changes_nothing) {
  float g[3] = {1.0f, 2.0f, 4.0f}, r[3] = {0.0f, 0.0f, 4.0f},
        e[3] = {0.5f, 0.25f, 0x1p-10f};
  uint64_t pos[1], sent = 0;
  float value[1];
  cr_assert_eq(pulse_loco_gate_ref(g, r, e, 3, 1, pos, value, &sent),
               PULSE_ERR_OVERFLOW);
  cr_assert_eq(sent, 2);
  cr_assert(e[0] == 0.5f && e[1] == 0.25f && e[2] == 0x1p-10f);
  cr_assert_eq(pulse_loco_gate_ref(g, r, e, 3, 0, NULL, NULL, &sent),
               PULSE_ERR_OVERFLOW);
  cr_assert_eq(sent, 2);
  cr_assert_eq(pulse_loco_gate_ref(g, r, e, 3, 5, NULL, value, &sent),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_gate_ref(NULL, r, e, 3, 0, NULL, NULL, &sent),
               PULSE_ERR_ARG);
  OK(pulse_loco_gate_ref(NULL, NULL, NULL, 0, 0, NULL, NULL, &sent));
  cr_assert_eq(sent, 0);
}

/* ----------------------------------------------------------- host helpers */

Test(cuda_host, chunk_count_counts_chunks_per_tensor) {
  pulse_cuda_detect_tensor t[3] = {{NULL, PULSE_DTYPE_F32, NULL, 0},
                                   {NULL, PULSE_DTYPE_F32, NULL, 1024},
                                   {NULL, PULSE_DTYPE_BF16, NULL, 1025}};
  uint64_t chunks = 7;
  OK(pulse_cuda_chunk_count(t, 3, 10, &chunks));
  cr_assert_eq(chunks, 0 + 1 + 2);
  OK(pulse_cuda_chunk_count(t, 3, 20, &chunks));
  cr_assert_eq(chunks, 2);
  cr_assert_eq(pulse_cuda_chunk_count(t, 3, 9, &chunks), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_chunk_count(NULL, 3, 20, &chunks), PULSE_ERR_ARG);
}

/* ------------------------------------------------- builds and arguments */

#ifndef PULSE_HAVE_CUDA

Test(cuda_host, stub_build_reports_not_built) {
  cr_assert_eq(pulse_cuda_available(), 0);
  cr_assert_not_null(strstr(pulse_cuda_unavailable_reason(), "without CUDA"));
  void *d = (void *)1;
  cr_assert_eq(pulse_cuda_alloc(&d, 16), PULSE_ERR_NOT_BUILT);
  cr_assert_null(d);
  cr_assert_eq(pulse_cuda_upload(NULL, NULL, 0, NULL), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_download(NULL, NULL, 0, NULL), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_copy(NULL, NULL, 0, NULL), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_fill(NULL, 0, 0, NULL), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_sync(NULL), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_device_count(), 0);
  int dev = 5;
  cr_assert_eq(pulse_cuda_device_of(&dev, &dev), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(dev, -1);
  cr_assert_eq(pulse_cuda_set_device(0), PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_get_device(&dev), PULSE_ERR_NOT_BUILT);
  void *stream = (void *)1;
  cr_assert_eq(pulse_cuda_stream_create(&stream), PULSE_ERR_NOT_BUILT);
  cr_assert_null(stream);
  pulse_cuda_stream_free(NULL);
  pulse_cuda_workspace *ws = (pulse_cuda_workspace *)1;
  cr_assert_eq(pulse_cuda_workspace_create(&ws), PULSE_ERR_NOT_BUILT);
  cr_assert_null(ws);
  pulse_cuda_workspace_free(NULL);
  uint64_t total = 5;
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 0, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_NOT_BUILT);
  cr_assert_eq(total, 0);
  cr_assert_not_null(strstr(pulse_error_detail(), "without CUDA"));
  pulse_tensor_digest dg;
  cr_assert_eq(pulse_cuda_digest(NULL, NULL, 0, &dg, NULL),
               PULSE_ERR_NOT_BUILT);
  uint64_t first[1] = {0};
  cr_assert_eq(
      pulse_cuda_changes_digest(NULL, first, 0, NULL, NULL, NULL, &dg, NULL),
      PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_scatter(NULL, NULL, 0, first, NULL, NULL, NULL),
               PULSE_ERR_NOT_BUILT);
  pulse_cuda_class_index *idx = (pulse_cuda_class_index *)1;
  cr_assert_eq(pulse_cuda_class_index_build(NULL, 0, 20, NULL, &idx),
               PULSE_ERR_NOT_BUILT);
  cr_assert_null(idx);
  cr_assert_null(pulse_cuda_class_index_hist(NULL, &total));
  cr_assert_eq(pulse_cuda_locate(NULL, first, NULL, NULL, NULL, NULL),
               PULSE_ERR_NOT_BUILT);
  pulse_cuda_class_index_free(NULL);
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  pulse_buffer buf = {(uint8_t *)1, 3};
  cr_assert_eq(pulse_cuda_patch_encode(NULL, &eo, NULL, 0, 0, NULL, &buf, NULL),
               PULSE_ERR_NOT_BUILT);
  cr_assert_null(buf.data);
  cr_assert_eq(pulse_cuda_patch_apply(NULL, NULL, NULL, 0, NULL, NULL, NULL),
               PULSE_ERR_NOT_BUILT);
  cr_assert_eq(pulse_cuda_loco_gate(NULL, NULL, NULL, NULL, 0, 0, NULL, NULL,
                                    &total, NULL),
               PULSE_ERR_NOT_BUILT);
}

#else /* built with CUDA */

Test(cuda_host, without_a_device_the_reason_is_no_cuda_device) {
  if (pulse_cuda_available())
    cr_skip_test("a CUDA device is present");
  cr_assert_str_eq(pulse_cuda_unavailable_reason(), "no CUDA device");
  pulse_cuda_workspace *ws = NULL;
  cr_assert_eq(pulse_cuda_workspace_create(&ws), PULSE_ERR_CUDA);
  cr_assert_not_null(strstr(pulse_error_detail(), "no CUDA device"));
  /* Valid arguments, no device. */
  uint64_t total = 5;
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 0, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_CUDA);
  cr_assert_not_null(strstr(pulse_error_detail(), "no CUDA device"));
  pulse_tensor_digest dg;
  cr_assert_eq(pulse_cuda_digest(NULL, NULL, 0, &dg, NULL), PULSE_ERR_CUDA);
  float x = 0.0f;
  cr_assert_eq(
      pulse_cuda_loco_gate(NULL, &x, &x, &x, 1, 0, NULL, NULL, &total, NULL),
      PULSE_ERR_CUDA);
}

#endif

#ifdef PULSE_HAVE_CUDA
#define ARGS_BEFORE_DEVICE 1
#else
#define ARGS_BEFORE_DEVICE 0
#endif

/* Bad arguments are refused the same way with or without a device. */
Test(cuda_host, entries_check_their_arguments_first) {
  if (!ARGS_BEFORE_DEVICE)
    cr_skip_test("built without CUDA: every entry returns PULSE_ERR_NOT_BUILT");
  uint32_t storage[8]; /* 4-byte aligned; never read: the checks come first */
  uint16_t *snap = (uint16_t *)storage;
  uint64_t total = 0;
  pulse_cuda_detect_tensor t = {snap, PULSE_DTYPE_F16, snap, 4};
  cr_assert_eq(pulse_cuda_detect(NULL, &t, 1, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_DTYPE);
  t.cur_dtype = PULSE_DTYPE_F32;
  t.cur_d = (const char *)snap + 2; /* not 4-byte aligned for F32 */
  cr_assert_eq(pulse_cuda_detect(NULL, &t, 1, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_ARG);
  t.cur_d = NULL;
  cr_assert_eq(pulse_cuda_detect(NULL, &t, 1, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 1, NULL, NULL, NULL, &total, NULL),
               PULSE_ERR_ARG);
  pulse_cuda_detect_opts o;
  pulse_cuda_detect_opts_init(&o);
  o.chunk_log2 = 31;
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 0, &o, NULL, NULL, &total, NULL),
               PULSE_ERR_ARG);
  pulse_cuda_detect_opts_init(&o);
  o.struct_version = 99;
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 0, &o, NULL, NULL, &total, NULL),
               PULSE_ERR_VERSION);
  /* The rank form comes whole; too few chunks is an overflow. */
  uint32_t hist_storage[1];
  pulse_cuda_changes out = {0, NULL, NULL, NULL, NULL, NULL, hist_storage, 0};
  cr_assert_eq(pulse_cuda_detect(NULL, NULL, 0, NULL, &out, NULL, &total, NULL),
               PULSE_ERR_ARG);
  uint8_t cls_storage[1];
  uint32_t rank_storage[1];
  out.class_d = cls_storage;
  out.rank_d = rank_storage;
  t.cur_d = snap;
  t.cur_dtype = PULSE_DTYPE_BF16;
  cr_assert_eq(pulse_cuda_detect(NULL, &t, 1, NULL, &out, NULL, &total, NULL),
               PULSE_ERR_OVERFLOW);
  out.capacity = 4;
  cr_assert_eq(pulse_cuda_detect(NULL, &t, 1, NULL, &out, NULL, &total, NULL),
               PULSE_ERR_ARG);

  pulse_tensor_digest dg;
  pulse_cuda_bf16_tensor bt = {NULL, 3};
  cr_assert_eq(pulse_cuda_digest(NULL, &bt, 1, &dg, NULL), PULSE_ERR_ARG);
  bt.data_d = (uint16_t *)((char *)snap + 1);
  cr_assert_eq(pulse_cuda_digest(NULL, &bt, 1, &dg, NULL), PULSE_ERR_ARG);
  uint64_t bad_first[2] = {1, 2}, dec_first[3] = {0, 2, 1}, first[2] = {0, 3};
  cr_assert_eq(pulse_cuda_changes_digest(NULL, bad_first, 1, NULL, NULL, NULL,
                                         &dg, NULL),
               PULSE_ERR_ARG);
  pulse_tensor_digest dg2[2];
  cr_assert_eq(pulse_cuda_changes_digest(NULL, dec_first, 2, NULL, NULL, NULL,
                                         dg2, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_cuda_changes_digest(NULL, first, 1, NULL, NULL, NULL, &dg, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_scatter(NULL, NULL, 1, first, NULL, NULL, NULL),
               PULSE_ERR_ARG);
  pulse_cuda_class_index *idx = NULL;
  bt.data_d = snap;
  cr_assert_eq(pulse_cuda_class_index_build(&bt, 1, 9, NULL, &idx),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_class_index_build(&bt, 1, 20, NULL, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_locate(NULL, first, NULL, NULL, NULL, NULL),
               PULSE_ERR_ARG);

  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  pulse_buffer buf;
  cr_assert_eq(pulse_cuda_patch_encode(NULL, &eo, NULL, 1, 0, NULL, &buf, NULL),
               PULSE_ERR_ARG);
  eo.chunk_log2 = 5;
  cr_assert_eq(pulse_cuda_patch_encode(NULL, &eo, NULL, 0, 0, NULL, &buf, NULL),
               PULSE_ERR_ARG);
  pulse_encode_opts_init(&eo);
  pulse_cuda_encode_tensor et = {
      {"w", PULSE_DTYPE_F32, 1, {4}}, snap, PULSE_DTYPE_BF16, snap, NULL};
  cr_assert_eq(pulse_cuda_patch_encode(NULL, &eo, &et, 1, 0, NULL, &buf, NULL),
               PULSE_ERR_DTYPE);
  cr_assert_null(buf.data);
  cr_assert_eq(pulse_cuda_patch_apply(NULL, NULL, NULL, 0, NULL, NULL, NULL),
               PULSE_ERR_ARG);
  float x = 0.0f;
  cr_assert_eq(
      pulse_cuda_loco_gate(NULL, NULL, &x, &x, 1, 0, NULL, NULL, &total, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_cuda_loco_gate(NULL, &x, &x, &x, 1, 2, NULL, NULL, &total, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_alloc(NULL, 4), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_upload(NULL, &x, 4, NULL), PULSE_ERR_ARG);
  int dev = 0;
  cr_assert_eq(pulse_cuda_device_of(NULL, &dev), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_device_of(&x, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_stream_create(NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_get_device(NULL), PULSE_ERR_ARG);
}
