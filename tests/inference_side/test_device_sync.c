/* Device targets through the subscriber: the first sync takes the anchor,
 * then patches (streamed: the host decodes the chunk streams while they
 * download, the device finds, checks and writes; or downloaded whole) bring
 * the device tensors bit for bit to the trainer's state. Runs on a GPU
 * and on the CPU emulator of the kernels (tests/cuda/emu/run.sh); elsewhere
 * it skips, saying why. */
#include "../cuda/emu/emu_counts.h"
#include "inf_testutil.h"
#include "pulse_cuda.h"

/* Defined by the CPU emulator of the runtime only (counts of its calls). */
#pragma weak pulse_emu_counts_get

#define DEVICE_TEST_START()                                                    \
  do {                                                                         \
    if (!pulse_cuda_available())                                               \
      cr_skip_test("%s (tests/cuda/emu/run.sh runs this on the CPU emulator)", \
                   pulse_cuda_unavailable_reason());                           \
  } while (0)

/* Device tensors of the trainer's table, attached to sub. */
static void attach_device(const it_trainer *t, pulse_sub *sub, uint16_t **d) {
  for (int i = 0; i < TU_TENSORS; i++) {
    d[i] = NULL;
    cr_assert_eq(pulse_cuda_alloc((void **)&d[i], t->m.numel[i] * 2 + 2), PULSE_OK);
    cr_assert_eq(pulse_sub_attach_device(sub, t->m.info[i].name, t->m.info[i].ndim,
                                         t->m.info[i].shape, d[i]),
                 PULSE_OK, "%s", pulse_error_detail());
  }
}

static int device_equal(const it_trainer *t, uint16_t *const *d, uint64_t step) {
  int same = 1;
  for (int i = 0; i < TU_TENSORS && same; i++) {
    uint16_t *h = tu_alloc(t->m.numel[i] * 2 + 2);
    cr_assert_eq(pulse_cuda_download(h, d[i], t->m.numel[i] * 2, NULL), PULSE_OK);
    same = memcmp(h, t->bits[step][i], t->m.numel[i] * 2) == 0;
    free(h);
  }
  return same;
}

Test(inference_side_device, patches_bring_device_tensors_to_the_trainer_state) {
  DEVICE_TEST_START();
  for (int whole = 0; whole < 2; whole++) {
    it_trainer t;
    it_trainer_up(&t, 100, 32, 20);
    it_trainer_run(&t, 0, 4, 0.02);
    char *cache = tu_make_dir();
    const char *urls[1];
    pulse_sub_opts o = it_sub_opts(&t, cache, urls);
    o.use_catchup = 0;
    o.no_streaming = whole;
    o.threads = 2;
    pulse_sub *sub;
    uint16_t *d[TU_TENSORS];
    cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
    attach_device(&t, sub, d);
    cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
    cr_assert(device_equal(&t, d, 4), "whole %d: step 4", whole);
    pulse_sub_figures f;
    pulse_sub_figures_get(sub, &f);
    cr_assert_eq(f.anchors_applied, 1);
    cr_assert_eq(f.patches_applied, 4);
    if (!whole)
      cr_assert_geq(f.last_decode_overlap_s, 0.0);
    /* More steps, from the step the device holds. */
    it_trainer_run(&t, 5, 7, 0.02);
    cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
    cr_assert(device_equal(&t, d, 7), "whole %d: step 7", whole);
    pulse_sub_figures_get(sub, &f);
    cr_assert_eq(f.patches_applied, 7);
    cr_assert_str_eq(f.state_digest, t.digest[7]);
    pulse_sub_free(sub);
    for (int i = 0; i < TU_TENSORS; i++)
      pulse_cuda_free(d[i]);
    tu_rm_rf(cache);
    it_trainer_down(&t);
  }
}

/* The subscriber's device work (digests at attach, the anchor's upload,
 * streamed and whole patches) goes on opts.cuda_stream, never on the legacy
 * NULL stream, and nothing synchronizes the whole device (counted by the
 * emulator; on a GPU only the results are checked). */
Test(inference_side_device, device_work_goes_on_the_given_stream) {
  DEVICE_TEST_START();
  it_trainer t;
  it_trainer_up(&t, 100, 32, 20);
  it_trainer_run(&t, 0, 3, 0.02);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.use_catchup = 0;
  o.threads = 2;
  void *stream = NULL;
  cr_assert_eq(pulse_cuda_stream_create(&stream), PULSE_OK);
  o.cuda_stream = stream;
  pulse_sub *sub;
  uint16_t *d[TU_TENSORS];
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  pulse_emu_counts c0, c2;
  memset(&c0, 0, sizeof c0);
  if (pulse_emu_counts_get != NULL)
    pulse_emu_counts_get(&c0);
  attach_device(&t, sub, d);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(device_equal(&t, d, 3));
  it_trainer_run(&t, 4, 6, 0.02);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(device_equal(&t, d, 6));
  c2 = c0;
  if (pulse_emu_counts_get != NULL) {
    pulse_emu_counts_get(&c2);
    cr_assert_eq(c2.null_stream, c0.null_stream,
                 "%llu uses of the legacy NULL stream",
                 (unsigned long long)(c2.null_stream - c0.null_stream));
    cr_assert_eq(c2.device_syncs, c0.device_syncs, "cudaDeviceSynchronize");
  }
  pulse_sub_free(sub);
  for (int i = 0; i < TU_TENSORS; i++)
    pulse_cuda_free(d[i]);
  pulse_cuda_stream_free(stream);
  tu_rm_rf(cache);
  it_trainer_down(&t);
}
