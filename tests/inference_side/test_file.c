/* The safetensors file target: written like an anchor (table order,
 * metadata step and state digest), resumed after a restart from the step it
 * names, replaced from an anchor when damaged or when it claims a step it
 * does not hold, and left as it was when a sync fails. */
#include <inttypes.h>

#include "flip_proxy.h"
#include "inf_testutil.h"
#include "pulse_safetensors.h"

typedef struct {
  it_trainer t;
  char *work;
  char cache[4096], out[4096];
  const char *urls[2];
} fx;

static void fx_up(fx *f, uint64_t steps) {
  memset(f, 0, sizeof *f);
  it_trainer_up(&f->t, 100, 32, 2);
  it_trainer_run(&f->t, 0, steps, 0.01);
  f->work = tu_make_dir();
  snprintf(f->cache, sizeof f->cache, "%s/cache", f->work);
  snprintf(f->out, sizeof f->out, "%s/model.safetensors", f->work);
}

static void fx_down(fx *f) {
  it_trainer_down(&f->t);
  tu_rm_rf(f->work);
}

static pulse_sub *fx_sub(fx *f, int use_catchup) {
  pulse_sub_opts o = it_sub_opts(&f->t, f->cache, f->urls);
  o.use_catchup = use_catchup;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_sub_attach_file(sub, f->out), PULSE_OK, "%s",
               pulse_error_detail());
  return sub;
}

/* The file holds the trainer's step, in table order, with its metadata. */
static void expect_file(fx *f, uint64_t step) {
  pulse_st_file *sf;
  cr_assert_eq(pulse_st_open(f->out, &sf), PULSE_OK, "%s",
               pulse_error_detail());
  char s[32];
  snprintf(s, sizeof s, "%" PRIu64, step);
  cr_assert_str_eq(pulse_st_metadata_get(sf, "step"), s);
  cr_assert_str_eq(pulse_st_metadata_get(sf, "state_digest"),
                   f->t.digest[step]);
  cr_assert_eq(pulse_st_tensor_count(sf), TU_TENSORS);
  for (size_t i = 0; i < TU_TENSORS; i++) {
    pulse_st_tensor x;
    cr_assert_eq(pulse_st_tensor_get(sf, i, &x), PULSE_OK);
    cr_assert_str_eq(x.name, f->t.m.info[i].name, "table order");
    cr_assert_eq(x.dtype, PULSE_DTYPE_BF16);
    cr_assert(memcmp(x.data, f->t.bits[step][i], x.nbytes) == 0,
              "tensor %zu differs", i);
  }
  pulse_st_close(sf);
}

Test(inference_side,
     file_target_is_written_like_an_anchor_and_resumed_after_restart) {
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), PULSE_SUB_NO_STEP);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 3);
  const uint16_t *d;
  uint64_t n;
  pulse_sub_read_lock(sub, NULL);
  cr_assert_eq(pulse_sub_tensor(sub, f.t.m.info[1].name, &d, &n), PULSE_OK);
  cr_assert(n == f.t.m.numel[1] && memcmp(d, f.t.bits[3][1], n * 2) == 0);
  pulse_sub_read_unlock(sub);
  pulse_sub_free(sub);

  it_trainer_run(&f.t, 4, 6, 0.01);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), 3, "resumes from the step the file names");
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 6);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN);
  cr_assert_eq(fig.anchors_applied, 0);
  cr_assert_eq(fig.patches_applied, 3);
  pulse_sub_free(sub);
  fx_down(&f);
}

Test(inference_side, a_damaged_file_is_replaced_from_an_anchor) {
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK);
  pulse_sub_free(sub);
  cr_assert_eq(tu_flip(f.out, -10), 0); /* inside the last tensor */
  it_trainer_run(&f.t, 4, 4, 0.01);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), PULSE_SUB_NO_STEP,
               "a file that fails its own digest");
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 4);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  pulse_sub_free(sub);
  fx_down(&f);
}

Test(inference_side, a_file_that_claims_another_step_is_never_patched) {
  fx f;
  fx_up(&f, 5);
  /* Step 3's weights, labelled step 2, without a state digest. */
  pulse_st_write_tensor w[TU_TENSORS];
  for (int i = 0; i < TU_TENSORS; i++) {
    w[i].name = f.t.m.info[i].name;
    w[i].dtype = PULSE_DTYPE_BF16;
    w[i].ndim = f.t.m.info[i].ndim;
    memcpy(w[i].shape, f.t.m.info[i].shape, sizeof w[i].shape);
    w[i].data = f.t.bits[3][i];
  }
  pulse_st_kv meta[1] = {{"step", "2"}};
  cr_assert_eq(pulse_st_write(f.out, w, TU_TENSORS, meta, 1), PULSE_OK);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), 2);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 5);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  cr_assert_geq(fig.rejected, 1);
  pulse_sub_free(sub);
  fx_down(&f);
}

Test(inference_side, a_failed_sync_leaves_the_file_as_it_was) {
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK);
  pulse_sub_free(sub);
  size_t n0 = 0, n1 = 0;
  uint8_t *before = tu_read(f.out, &n0);
  it_trainer_run(&f.t, 4, 6, 0.01);
  flip_proxy *px = flip_proxy_start(f.t.port, 1);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  f.urls[0] = url;
  o.use_catchup = 0;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  cr_assert_eq(pulse_sub_attach_file(sub, f.out), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_sub_step(sub), 3);
  uint8_t *after = tu_read(f.out, &n1);
  cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the file changed");
  free(before), free(after);
  pulse_sub_free(sub);
  flip_proxy_stop(px);
  fx_down(&f);
}
