/* FP8 targets over device shadows through the subscriber
 * (pulse_sub_bind_fp8 with device targets): after every sync the device
 * FP8 tensors and their scales equal, byte for byte, the CPU reference
 * quantizer (pulse_fp8_quantize_ref) of the trainer's BF16 weights at that
 * step, whether the patch streamed or came whole, through an anchor, steps
 * that move a block's amax up and down, a shadow of one target or of two
 * side by side (a fused weight), and a step refused for a NaN (nothing
 * written, BF16 or FP8). Runs on a GPU and on the CPU emulator of
 * the kernels (tests/cuda/emu/run.sh); elsewhere it skips, saying why. */
#include "../cuda/emu/emu_counts.h"
#include "inf_testutil.h"
#include "pulse_cuda.h"
#include "pulse_fp8.h"

/* Defined by the CPU emulator of the runtime only (counts of its calls). */
#pragma weak pulse_emu_counts_get

#define DEVICE_TEST_START()                                                    \
  do {                                                                         \
    if (!pulse_cuda_available())                                               \
      cr_skip_test("%s (tests/cuda/emu/run.sh runs this on the CPU emulator)", \
                   pulse_cuda_unavailable_reason());                           \
  } while (0)

/* The trainer's 2-D tensors held in FP8: one with a scale per block, one
 * with one scale for the tensor; fused, the first is embed and head (40
 * columns each) side by side in one shadow. */
enum { FP8_BLOCKED = 1, FP8_PER_TENSOR = 3, FP8_COUNT = 2 };
enum { FUSED_TOP = 0, FUSED_BELOW = 3 };

typedef struct {
  int tensor; /* index in the trainer's table */
  int below;  /* -1, or a tensor of as many columns stacked below it */
  pulse_fp8_tensor t; /* q and scale_inv: device memory */
  uint64_t scales;
} dev_fp8;

static void fp8_make(const it_trainer *tr, int tensor, int below, pulse_fp8_scale kind,
                     dev_fp8 *f) {
  memset(f, 0, sizeof *f);
  f->tensor = tensor;
  f->below = below;
  f->t.rows = tr->m.info[tensor].shape[0] + (below >= 0 ? tr->m.info[below].shape[0] : 0);
  f->t.cols = tr->m.info[tensor].shape[1];
  f->t.scale = kind;
  cr_assert_eq(pulse_fp8_scale_count(f->t.rows, f->t.cols, kind, &f->scales), PULSE_OK);
  cr_assert_eq(pulse_cuda_alloc((void **)&f->t.q, f->t.rows * f->t.cols), PULSE_OK);
  cr_assert_eq(pulse_cuda_alloc((void **)&f->t.scale_inv, f->scales * 4), PULSE_OK);
}

static void fp8_free(dev_fp8 *f) {
  pulse_cuda_free(f->t.q);
  pulse_cuda_free(f->t.scale_inv);
}

/* Device tensors of the trainer's table (zeros: finite, so that binding
 * quantizes them), attached to sub; `fused`: FUSED_BELOW lies right after
 * FUSED_TOP in its memory. */
static void attach_device(const it_trainer *t, pulse_sub *sub, uint16_t **d, int fused) {
  for (int i = 0; i < TU_TENSORS; i++) {
    uint64_t n = t->m.numel[i] + (fused && i == FUSED_TOP ? t->m.numel[FUSED_BELOW] : 0);
    if (fused && i == FUSED_BELOW) {
      d[i] = d[FUSED_TOP] + t->m.numel[FUSED_TOP];
    } else {
      d[i] = NULL;
      cr_assert_eq(pulse_cuda_alloc((void **)&d[i], n * 2 + 2), PULSE_OK);
      cr_assert_eq(pulse_cuda_fill(d[i], 0, n * 2 + 2, NULL), PULSE_OK);
      cr_assert_eq(pulse_cuda_sync(NULL), PULSE_OK);
    }
    cr_assert_eq(pulse_sub_attach_device(sub, t->m.info[i].name, t->m.info[i].ndim,
                                         t->m.info[i].shape, d[i]),
                 PULSE_OK, "%s", pulse_error_detail());
  }
}

static int bf16_equal(const it_trainer *t, uint16_t *const *d, uint64_t step) {
  int same = 1;
  for (int i = 0; i < TU_TENSORS && same; i++) {
    uint16_t *h = tu_alloc(t->m.numel[i] * 2 + 2);
    cr_assert_eq(pulse_cuda_download(h, d[i], t->m.numel[i] * 2, NULL), PULSE_OK);
    same = memcmp(h, t->bits[step][i], t->m.numel[i] * 2) == 0;
    free(h);
  }
  return same;
}

/* The device FP8 tensor and scales are the reference quantization of the
 * trainer's BF16 tensor at `step`. */
static int fp8_equal(const it_trainer *t, const dev_fp8 *f, uint64_t step) {
  uint64_t n = f->t.rows * f->t.cols, top = t->m.numel[f->tensor];
  uint16_t *bits = tu_alloc(n * 2);
  memcpy(bits, t->bits[step][f->tensor], top * 2);
  if (f->below >= 0)
    memcpy(bits + top, t->bits[step][f->below], (n - top) * 2);
  pulse_fp8_tensor ref = f->t;
  ref.q = tu_alloc(n);
  ref.scale_inv = tu_alloc(f->scales * 4);
  cr_assert_eq(pulse_fp8_quantize_ref(bits, &ref, 1), PULSE_OK, "%s", pulse_error_detail());
  free(bits);
  uint8_t *q = tu_alloc(n);
  float *s = tu_alloc(f->scales * 4);
  cr_assert_eq(pulse_cuda_download(q, f->t.q, n, NULL), PULSE_OK);
  cr_assert_eq(pulse_cuda_download(s, f->t.scale_inv, f->scales * 4, NULL), PULSE_OK);
  int same = memcmp(q, ref.q, n) == 0 && memcmp(s, ref.scale_inv, f->scales * 4) == 0;
  free(q), free(s), free(ref.q), free(ref.scale_inv);
  return same;
}

/* The element of tensor i with the largest magnitude (in FP32). */
static uint64_t largest(const it_trainer *t, int i) {
  uint64_t at = 0;
  for (uint64_t k = 1; k < t->m.numel[i]; k++)
    if (fabsf(t->m.w[i][k]) > fabsf(t->m.w[i][at]))
      at = k;
  return at;
}

typedef struct {
  it_trainer t;
  char *cache;
  pulse_sub *sub;
  uint16_t *d[TU_TENSORS];
  int fused;
  dev_fp8 f[FP8_COUNT];
} fp8_rig;

static void rig_up(fp8_rig *r, int whole, void *stream, int fused) {
  it_trainer_up(&r->t, 100, 32, 20);
  it_trainer_run(&r->t, 0, 3, 0.02);
  r->cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&r->t, r->cache, urls);
  o.use_catchup = 0;
  o.no_streaming = whole;
  o.threads = 2;
  o.cuda_stream = stream;
  cr_assert_eq(pulse_sub_create(&o, &r->sub), PULSE_OK);
  r->fused = fused;
  attach_device(&r->t, r->sub, r->d, fused);
  if (fused) {
    fp8_make(&r->t, FUSED_TOP, FUSED_BELOW, PULSE_FP8_SCALE_BLOCK, &r->f[0]);
    fp8_make(&r->t, FP8_BLOCKED, -1, PULSE_FP8_SCALE_TENSOR, &r->f[1]);
  } else {
    fp8_make(&r->t, FP8_BLOCKED, -1, PULSE_FP8_SCALE_BLOCK, &r->f[0]);
    fp8_make(&r->t, FP8_PER_TENSOR, -1, PULSE_FP8_SCALE_TENSOR, &r->f[1]);
  }
  for (int k = 0; k < FP8_COUNT; k++)
    cr_assert_eq(pulse_sub_bind_fp8(r->sub, r->d[r->f[k].tensor], &r->f[k].t), PULSE_OK, "%s",
                 pulse_sub_error(r->sub));
}

static void rig_down(fp8_rig *r) {
  pulse_sub_free(r->sub);
  for (int k = 0; k < FP8_COUNT; k++)
    fp8_free(&r->f[k]);
  for (int i = 0; i < TU_TENSORS; i++)
    if (!(r->fused && i == FUSED_BELOW))
      pulse_cuda_free(r->d[i]);
  tu_rm_rf(r->cache);
  it_trainer_down(&r->t);
}

static void rig_check(fp8_rig *r, uint64_t step, int whole) {
  cr_assert(bf16_equal(&r->t, r->d, step), "fused %d whole %d: BF16 at step %llu", r->fused,
            whole, (unsigned long long)step);
  for (int k = 0; k < FP8_COUNT; k++)
    cr_assert(fp8_equal(&r->t, &r->f[k], step), "fused %d whole %d: FP8 target %d at step %llu",
              r->fused, whole, k, (unsigned long long)step);
}

Test(inference_side_device_fp8, device_fp8_targets_equal_the_reference_at_every_step) {
  DEVICE_TEST_START();
  for (int run = 0; run < 4; run++) {
    int whole = run & 1;
    fp8_rig r;
    rig_up(&r, whole, NULL, run >> 1);
    /* The anchor (step 0) into the shadows, requantized whole, then
     * patches. */
    cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
    rig_check(&r, 3, whole);
    pulse_sub_figures fig;
    pulse_sub_figures_get(r.sub, &fig);
    cr_assert_eq(fig.anchors_applied, 1);
    cr_assert_eq(fig.patches_applied, 3);
    /* One patch a sync: ordinary steps, then the largest element of each
     * FP8 tensor doubled (its block's amax and scale go up, the block is
     * requantized whole) and then zeroed (the amax goes down: the block is
     * read again). */
    for (uint64_t s = 4; s <= 9; s++) {
      tu_model_step(&r.t.m, 0.02);
      for (int k = 0; k < FP8_COUNT && (s == 6 || s == 7); k++) {
        for (int part = 0; part < 2; part++) {
          int i = part == 0 ? r.f[k].tensor : r.f[k].below;
          if (i < 0)
            continue;
          uint64_t at = largest(&r.t, i);
          r.t.m.w[i][at] = s == 6 ? 2.0f * r.t.m.w[i][at] : 0.0f;
        }
      }
      it_trainer_commit(&r.t, s);
      cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
      rig_check(&r, s, whole);
    }
    pulse_sub_figures_get(r.sub, &fig);
    cr_assert_eq(fig.patches_applied, 9);
    cr_assert_str_eq(fig.state_digest, r.t.digest[9]);
    rig_down(&r);
  }
}

Test(inference_side_device_fp8, a_nan_into_a_device_shadow_is_refused_with_nothing_written) {
  DEVICE_TEST_START();
  for (int whole = 0; whole < 2; whole++) {
    fp8_rig r;
    rig_up(&r, whole, NULL, 0);
    cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
    rig_check(&r, 3, whole);
    tu_model_step(&r.t.m, 0.02);
    r.t.m.w[FP8_BLOCKED][5] = NAN;
    it_trainer_commit(&r.t, 4);
    pulse_sub_figures before, fig;
    pulse_sub_figures_get(r.sub, &before);
    pulse_status st = pulse_sub_sync(r.sub);
    cr_assert_neq(st, PULSE_OK, "whole %d: a NaN step applied", whole);
    cr_assert(strstr(pulse_sub_error(r.sub), "NaN") != NULL, "whole %d: %s", whole,
              pulse_sub_error(r.sub));
    /* Refused once, by no other route (no anchor rewrote the targets), and
     * not fetched or reported again for the same head. */
    cr_assert_eq(pulse_sub_sync(r.sub), st, "whole %d: %s", whole, pulse_sub_error(r.sub));
    pulse_sub_figures_get(r.sub, &fig);
    cr_assert_eq(fig.anchors_applied, before.anchors_applied, "whole %d", whole);
    cr_assert_eq(fig.rejected, before.rejected + 1, "whole %d", whole);
    cr_assert_eq(fig.objects_fetched, before.objects_fetched + 1, "whole %d", whole);
    /* Shadows and FP8 tensors all hold step 3, and so does the subscriber. */
    rig_check(&r, 3, whole);
    cr_assert_str_eq(fig.state_digest, r.t.digest[3]);
    rig_down(&r);
  }
}

Test(inference_side_device_fp8, a_device_shadow_must_be_covered_exactly_by_device_targets) {
  DEVICE_TEST_START();
  fp8_rig r;
  rig_up(&r, 0, NULL, 0);
  /* Half of a target's memory (one not bound): the target lies partly
   * outside. */
  uint64_t rows = r.t.m.info[0].shape[0] / 2, cols = r.t.m.info[0].shape[1];
  pulse_fp8_tensor half = {rows, cols, r.f[0].t.q, r.f[0].t.scale_inv, PULSE_FP8_SCALE_BLOCK};
  cr_assert_eq(pulse_sub_bind_fp8(r.sub, r.d[0] + rows * cols, &half), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_sub_error(r.sub), "partly outside") != NULL, "%s",
            pulse_sub_error(r.sub));
  /* Device memory no target covers. */
  uint16_t *bare = NULL;
  cr_assert_eq(pulse_cuda_alloc((void **)&bare, rows * cols * 2), PULSE_OK);
  cr_assert_eq(pulse_sub_bind_fp8(r.sub, bare, &half), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_sub_error(r.sub), "cover 0 of") != NULL, "%s", pulse_sub_error(r.sub));
  pulse_cuda_free(bare);
  /* A shadow bound already. */
  cr_assert_eq(pulse_sub_bind_fp8(r.sub, r.d[FP8_BLOCKED], &r.f[0].t), PULSE_ERR_ARG);
  rig_down(&r);
}

/* The FP8 work (binding, anchors, stages, commits) goes on opts.cuda_stream
 * with the patches', never on the legacy NULL stream, and nothing
 * synchronizes the whole device (counted by the emulator; on a GPU only
 * the results are checked). */
Test(inference_side_device_fp8, device_fp8_work_goes_on_the_given_stream) {
  DEVICE_TEST_START();
  void *stream = NULL;
  cr_assert_eq(pulse_cuda_stream_create(&stream), PULSE_OK);
  pulse_emu_counts c0, c1;
  memset(&c0, 0, sizeof c0);
  if (pulse_emu_counts_get != NULL)
    pulse_emu_counts_get(&c0);
  fp8_rig r;
  rig_up(&r, 0, stream, 1);
  cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
  rig_check(&r, 3, 0);
  it_trainer_run(&r.t, 4, 5, 0.02);
  cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
  rig_check(&r, 5, 0);
  if (pulse_emu_counts_get != NULL) {
    pulse_emu_counts_get(&c1);
    cr_assert_eq(c1.null_stream, c0.null_stream, "%llu uses of the legacy NULL stream",
                 (unsigned long long)(c1.null_stream - c0.null_stream));
    cr_assert_eq(c1.device_syncs, c0.device_syncs, "cudaDeviceSynchronize");
  }
  rig_down(&r);
  pulse_cuda_stream_free(stream);
}
