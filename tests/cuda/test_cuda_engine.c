/* test_cuda_engine.c - how the CUDA code uses the runtime, not what it
 * computes: a steady state of applies allocates, frees and synchronizes
 * nothing device-wide and never touches the legacy NULL stream; work goes on
 * the caller's stream (or pulse's own per-device one); every call runs on
 * the device that owns its memory and leaves the caller's current device as
 * it was, with one workspace per device side by side.
 *
 * The counts come from the CPU emulator of the runtime (tests/cuda/emu,
 * emu_counts.h); on a real device those assertions are skipped (the
 * results are still checked). Two devices: the emulator fakes them
 * (PULSE_EMU_DEVICES, 2 by default); a one-GPU machine skips that test. */
#include "cuda_testutil.h"
#include "emu/emu_counts.h"

/* Defined by the emulator only. */
#pragma weak pulse_emu_counts_get

static int counting(void) {
  return pulse_emu_counts_get != NULL;
}

static pulse_emu_counts counts_now(void) {
  pulse_emu_counts c;
  memset(&c, 0, sizeof c);
  if (counting())
    pulse_emu_counts_get(&c);
  return c;
}

/* --------------------------------------------------------------- a model */

enum { EM_T = 3 };

/* A trainer's BF16 state on the host (the reference) and its copy on a
 * device (the receiver's targets). */
typedef struct {
  uint64_t numel[EM_T];
  char name[EM_T][32];
  pulse_tensor_info info[EM_T];
  uint16_t *host[EM_T];
  uint16_t *dev[EM_T];
  pulse_tensor_digest digest[EM_T]; /* of the device targets */
  int device;
} em_model;

/* Allocates the targets on `device` (the caller's current device is kept). */
static void em_make(em_model *m, uint64_t seed, int device) {
  static const uint64_t sizes[EM_T] = {9000, 1234, 17001};
  int previous = 0;
  OK(pulse_cuda_get_device(&previous));
  OK(pulse_cuda_set_device(device));
  m->device = device;
  for (size_t t = 0; t < EM_T; t++) {
    m->numel[t] = sizes[t];
    snprintf(m->name[t], 32, "block.%zu.weight", t);
    m->info[t] = (pulse_tensor_info){m->name[t], PULSE_DTYPE_BF16, 1, {sizes[t]}};
    m->host[t] = tu_alloc(sizes[t] * 2);
    for (uint64_t i = 0; i < sizes[t]; i++)
      m->host[t][i] = pulse_bf16_from_f32_bits(
          tu_weight_f32(pulse_rng_at(seed * 10 + t, i)));
    m->dev[t] = dev_upload(m->host[t], sizes[t] * 2);
    m->digest[t] = pulse_digest_bf16(m->host[t], sizes[t]);
  }
  OK(pulse_cuda_set_device(previous));
}

static void em_free(em_model *m) {
  for (size_t t = 0; t < EM_T; t++) {
    free(m->host[t]);
    pulse_cuda_free(m->dev[t]);
  }
}

/* One training step on the host: about `density` of the values move a few
 * ulps; *out gets the patch from the state before to the state after. */
static void em_step(em_model *m, uint64_t seed, double density,
                    pulse_pos_model model, pulse_buffer *out) {
  pulse_changes ch[EM_T];
  pulse_encode_tensor enc[EM_T];
  uint16_t *next[EM_T];
  for (size_t t = 0; t < EM_T; t++) {
    uint64_t n = m->numel[t];
    next[t] = tu_alloc(n * 2);
    for (uint64_t i = 0; i < n; i++) {
      uint64_t r = pulse_rng_at(seed * 100 + t, i);
      next[t][i] = tu_chance(r, density)
                       ? (uint16_t)(m->host[t][i] + 1u + ((r >> 8) & 3u))
                       : m->host[t][i];
    }
    uint16_t *scratch = tu_alloc(n * 2);
    memcpy(scratch, m->host[t], n * 2);
    ch[t] = (pulse_changes)PULSE_CHANGES_INIT;
    OK(pulse_detect_ref(next[t], PULSE_DTYPE_BF16, scratch, n, 0, &ch[t]));
    free(scratch);
    enc[t] = (pulse_encode_tensor){m->info[t], m->host[t], &ch[t], NULL,
                                   NULL,       NULL,       NULL};
  }
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.pos_model = model;
  o.threads = 1;
  OK(pulse_patch_encode(&o, enc, EM_T, out));
  for (size_t t = 0; t < EM_T; t++) {
    pulse_changes_free(&ch[t]);
    free(m->host[t]);
    m->host[t] = next[t];
  }
}

/* Applies a patch to the device targets with `ws` on `stream`: whole, or
 * (streamed) fed in three slices as a download would. */
static pulse_status em_apply(em_model *m, pulse_cuda_workspace *ws,
                             const pulse_buffer *bytes, int streamed,
                             void *stream) {
  pulse_patch *p = NULL;
  OK(pulse_patch_open(bytes->data, bytes->size, &p));
  pulse_cuda_target tg[EM_T];
  for (size_t t = 0; t < EM_T; t++)
    tg[t] = (pulse_cuda_target){m->name[t], m->dev[t], m->numel[t],
                                &m->digest[t]};
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = 2;
  pulse_status st;
  if (!streamed) {
    st = pulse_cuda_patch_apply(ws, p, tg, EM_T, &ao, stream, m->digest);
  } else {
    pulse_cuda_patch_stream *s = NULL;
    st = pulse_cuda_patch_stream_begin(ws, p, tg, EM_T, &ao, stream, &s);
    if (st == PULSE_OK) {
      pulse_cuda_patch_stream_feed(s, bytes->size / 3);
      pulse_cuda_patch_stream_feed(s, 2 * bytes->size / 3);
      pulse_cuda_patch_stream_feed(s, bytes->size);
      st = pulse_cuda_patch_stream_finish(s);
    }
    if (st == PULSE_OK)
      st = pulse_cuda_patch_stream_commit(s, m->digest);
    pulse_cuda_patch_stream_free(s);
  }
  pulse_patch_free(p);
  return st;
}

/* The device targets hold the host state, bit for bit. */
static void em_check(const em_model *m, const char *what) {
  for (size_t t = 0; t < EM_T; t++) {
    uint16_t *got = dev_download(m->dev[t], m->numel[t] * 2);
    cr_assert_eq(tu_memdiff(got, m->host[t], m->numel[t] * 2), -1,
                 "%s: tensor %zu", what, t);
    free(got);
    pulse_tensor_digest d = pulse_digest_bf16(m->host[t], m->numel[t]);
    cr_assert(d.a == m->digest[t].a && d.b == m->digest[t].b,
              "%s: tensor %zu: digest after the apply", what, t);
  }
}

/* --------------------------------------------------------------- tests */

static void steady_state(pulse_pos_model model) {
  em_model m;
  em_make(&m, 7, 0);
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  void *stream = NULL;
  OK(pulse_cuda_stream_create(&stream));
  pulse_buffer patch;
  /* The first apply sizes the workspace and its pinned staging. */
  em_step(&m, 100, 0.02, model, &patch);
  OK(em_apply(&m, ws, &patch, 0, stream));
  pulse_buffer_free(&patch);
  em_check(&m, "the first apply");
  pulse_emu_counts before = counts_now();
  for (int i = 1; i <= 20; i++) {
    em_step(&m, 100 + (uint64_t)i, 0.02, model, &patch);
    OK(em_apply(&m, ws, &patch, i % 2, stream));
    pulse_buffer_free(&patch);
  }
  pulse_emu_counts after = counts_now();
  em_check(&m, "twenty applies later");
  if (counting()) {
    cr_assert_eq(after.device_allocs, before.device_allocs,
                 "%llu cudaMalloc in 20 applies",
                 (unsigned long long)(after.device_allocs - before.device_allocs));
    cr_assert_eq(after.device_frees, before.device_frees, "cudaFree in 20 applies");
    cr_assert_eq(after.host_allocs, before.host_allocs,
                 "cudaHostAlloc in 20 applies");
    cr_assert_eq(after.host_frees, before.host_frees, "cudaFreeHost in 20 applies");
    cr_assert_eq(after.device_syncs, before.device_syncs,
                 "cudaDeviceSynchronize in 20 applies");
    cr_assert_eq(after.null_stream, before.null_stream,
                 "%llu uses of the legacy NULL stream in 20 applies",
                 (unsigned long long)(after.null_stream - before.null_stream));
    cr_assert_eq(after.streams_made, before.streams_made, "streams made");
    cr_assert_eq(after.events_made, before.events_made, "events made");
    /* The decoded entries went up from pinned staging. */
    cr_assert_geq(after.pinned_copies - before.pinned_copies, 20 * 2,
                  "pinned copies: %llu",
                  (unsigned long long)(after.pinned_copies - before.pinned_copies));
  }
  pulse_cuda_stream_free(stream);
  pulse_cuda_workspace_free(ws);
  em_free(&m);
}

Test(cuda_engine, twenty_class_model_applies_after_the_first_allocate_and_sync_nothing) {
  GPU_TEST_START();
  steady_state(PULSE_POS_CLASS);
}

Test(cuda_engine, twenty_plain_model_applies_after_the_first_allocate_and_sync_nothing) {
  GPU_TEST_START();
  steady_state(PULSE_POS_PLAIN);
}

Test(cuda_engine, work_goes_on_the_given_stream_or_the_devices_own_never_the_null_stream) {
  GPU_TEST_START();
  em_model m;
  em_make(&m, 11, 0);
  void *stream = NULL;
  OK(pulse_cuda_stream_create(&stream));
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  pulse_emu_counts before = counts_now();
  for (int round = 0; round < 2; round++) {
    void *s = round == 0 ? stream : NULL; /* NULL: the device's own stream */
    pulse_buffer patch;
    em_step(&m, 40 + (uint64_t)round, 0.01, PULSE_POS_CLASS, &patch);
    OK(em_apply(&m, ws, &patch, round, s));
    pulse_buffer_free(&patch);
    em_check(&m, round == 0 ? "on the given stream" : "on the device's stream");
    /* The primitives too. */
    pulse_cuda_bf16_tensor bt[EM_T];
    pulse_tensor_digest d[EM_T];
    for (size_t t = 0; t < EM_T; t++)
      bt[t] = (pulse_cuda_bf16_tensor){m.dev[t], m.numel[t]};
    OK(pulse_cuda_digest(ws, bt, EM_T, d, s));
    cr_assert(d[0].a == m.digest[0].a && d[0].b == m.digest[0].b);
    pulse_cuda_detect_tensor dt = {m.dev[1], PULSE_DTYPE_BF16, m.dev[1], m.numel[1]};
    uint64_t total = 1;
    OK(pulse_cuda_detect(ws, &dt, 1, NULL, NULL, NULL, &total, s));
    cr_assert_eq(total, 0);
    float *g = tu_alloc(64 * 4);
    void *g_d = dev_upload(g, 64 * 4), *e_d = dev_upload(g, 64 * 4);
    OK(pulse_cuda_loco_gate(ws, g_d, g_d, e_d, 64, 0, NULL, NULL, &total, s));
    cr_assert_eq(total, 0);
    OK(pulse_cuda_sync(s));
    pulse_cuda_free(g_d), pulse_cuda_free(e_d);
    free(g);
  }
  pulse_emu_counts after = counts_now();
  if (counting())
    cr_assert_eq(after.null_stream, before.null_stream,
                 "%llu uses of the legacy NULL stream",
                 (unsigned long long)(after.null_stream - before.null_stream));
  pulse_cuda_workspace_free(ws);
  pulse_cuda_stream_free(stream);
  em_free(&m);
}

Test(cuda_engine, calls_run_on_the_device_that_owns_the_memory) {
  GPU_TEST_START();
  if (pulse_cuda_device_count() < 2)
    cr_skip_test("one device (the emulator fakes two)");
  OK(pulse_cuda_set_device(0));
  /* Two ranks: one model per device, one workspace each, used in turn
   * from a thread whose current device stays 0. */
  em_model m[2];
  pulse_cuda_workspace *ws[2] = {NULL, NULL};
  for (int r = 0; r < 2; r++) {
    em_make(&m[r], 20 + (uint64_t)r, r);
    OK(pulse_cuda_workspace_create(&ws[r]));
    int owner = -1;
    OK(pulse_cuda_device_of(m[r].dev[0], &owner));
    cr_assert_eq(owner, r);
  }
  for (int step = 0; step < 3; step++)
    for (int r = 0; r < 2; r++) {
      pulse_buffer patch;
      em_step(&m[r], 60 + (uint64_t)(10 * r + step), 0.02,
              step == 1 ? PULSE_POS_PLAIN : PULSE_POS_CLASS, &patch);
      OK(em_apply(&m[r], ws[r], &patch, step % 2, NULL));
      pulse_buffer_free(&patch);
      int current = -1;
      OK(pulse_cuda_get_device(&current));
      cr_assert_eq(current, 0, "rank %d step %d left device %d current", r, step,
                   current);
      em_check(&m[r], "a rank's device");
    }
  /* A workspace serves one device; one call's memory is on one device. */
  pulse_buffer patch;
  em_step(&m[1], 99, 0.02, PULSE_POS_CLASS, &patch);
  cr_assert_eq(em_apply(&m[1], ws[0], &patch, 0, NULL), PULSE_ERR_ARG);
  cr_assert_not_null(strstr(pulse_error_detail(), "device"), "%s",
                     pulse_error_detail());
  uint16_t *other = m[1].dev[2];
  m[1].dev[2] = m[0].dev[2]; /* a tensor of device 0 among device 1's */
  pulse_cuda_bf16_tensor bt[EM_T];
  pulse_tensor_digest d[EM_T];
  for (size_t t = 0; t < EM_T; t++)
    bt[t] = (pulse_cuda_bf16_tensor){m[1].dev[t], m[1].numel[t]};
  bt[2].numel = m[0].numel[2];
  cr_assert_eq(pulse_cuda_digest(NULL, bt, EM_T, d, NULL), PULSE_ERR_ARG);
  m[1].dev[2] = other;
  /* Host memory is not device memory. */
  bt[0].data_d = m[1].host[0];
  cr_assert_eq(pulse_cuda_digest(NULL, bt, 1, d, NULL), PULSE_ERR_ARG);
  /* Still applies after the refusals (nothing was written). */
  OK(em_apply(&m[1], ws[1], &patch, 0, NULL));
  em_check(&m[1], "after the refusals");
  pulse_buffer_free(&patch);
  for (int r = 0; r < 2; r++) {
    pulse_cuda_workspace_free(ws[r]);
    em_free(&m[r]);
  }
}
