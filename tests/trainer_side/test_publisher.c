/* The publisher: first state, commits, figures, resume after a restart,
 * retention, anchors in the background, refusals that change nothing. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>

#include "pulse_cuda.h"
#include "pulse_publisher.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "trainer_testutil.h"

static pulse_pub *open_pub(const char *dir, tu_model *m, uint64_t anchor_every,
                           uint64_t keep, int sync) {
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  if (m != NULL) {
    o.tensors = m->info;
    o.tensor_count = TU_TENSORS;
  }
  o.anchor_every = anchor_every;
  o.keep_patches = keep;
  o.anchor_sync = sync;
  o.threads = 2;
  o.grace_seconds = 0; /* retention's counts, without the grace period */
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  return pub;
}

static void commit(pulse_pub *pub, tu_model *m, uint64_t step,
                   pulse_pub_figures *f) {
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(m, t);
  cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, f), PULSE_OK,
               "step %" PRIu64 ": %s", step, pulse_error_detail());
}

static void assert_snapshot_is_model(const pulse_pub *pub, const tu_model *m) {
  uint64_t total;
  uint16_t *want = tt_model_bf16(m, &total), *at = want;
  for (size_t i = 0; i < TU_TENSORS; i++) {
    cr_assert_eq(memcmp(pulse_pub_snapshot(pub, i), at, m->numel[i] * 2), 0,
                 "tensor %zu", i);
    at += m->numel[i];
  }
  free(want);
  pulse_state_digest d = tt_model_digest(m);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &d, sizeof d), 0);
}

Test(publisher, first_commit_writes_an_anchor_only) {
  char *dir = tu_make_dir(), objs[512];
  tu_model m;
  tu_model_init(&m, 1, 1);
  pulse_pub *pub = open_pub(dir, &m, 4, 8, 0);
  cr_assert_eq(pulse_pub_head_step(pub, NULL), 0);
  cr_assert_null(pulse_pub_state_digest(pub));
  pulse_pub_figures f;
  commit(pub, &m, 100, &f);
  cr_assert_eq(f.step, 100);
  cr_assert_eq(f.base_step, 100);
  cr_assert_eq(f.patch_bytes, 0);
  cr_assert_gt(f.anchor_bytes, 2 * f.params);
  cr_assert_eq(f.params, m.numel[0] + m.numel[1] + m.numel[2] + m.numel[3]);
  uint64_t step;
  cr_assert_eq(pulse_pub_head_step(pub, &step), 1);
  cr_assert_eq(step, 100);
  assert_snapshot_is_model(pub, &m);
  tt_path(objs, sizeof objs, dir, "objects");
  cr_assert_eq(tt_count(objs), 1);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

static void on_head(void *ctx, const pulse_pub_figures *f) {
  uint64_t *seen = ctx;
  seen[0]++;
  seen[1] = f->step;
}

Test(publisher, commits_track_the_trainer_bit_for_bit_and_report_figures) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 2, 2);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  uint64_t seen[2] = {0, 0};
  o.on_head = on_head;
  o.on_head_ctx = seen;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK);
  commit(pub, &m, 0, NULL);
  for (uint64_t s = 1; s <= 6; s++) {
    tu_model_step(&m, 0.01 * (double)s);
    pulse_pub_figures f;
    commit(pub, &m, s, &f);
    cr_assert_eq(f.base_step, s - 1);
    cr_assert_gt(f.changed, 0);
    cr_assert_lt(f.changed, f.params / 5);
    cr_assert_gt(f.patch_bytes, 120);
    cr_assert_lt(f.patch_bytes, f.changed * 3 + 2000,
                 "sparse: %" PRIu64 " bytes for %" PRIu64, f.patch_bytes,
                 f.changed);
    cr_assert_geq(f.total_seconds, f.detect_seconds + f.encode_seconds);
    assert_snapshot_is_model(pub, &m);
    cr_assert_eq(seen[1], s);
  }
  cr_assert_eq(seen[0], 7);
  /* Unchanged weights: an empty patch is still a step. */
  pulse_pub_figures f;
  commit(pub, &m, 7, &f);
  cr_assert_eq(f.changed, 0);
  pulse_pub_free(pub);
  cr_assert_eq(pulse_store_verify(
                   dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                   NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher, bf16_and_f32_inputs_publish_the_same_state) {
  char *d1 = tu_make_dir(), *d2 = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 4, 1);
  pulse_pub *a = open_pub(d1, &m, 3, 8, 1), *b = open_pub(d2, &m, 3, 8, 1);
  for (uint64_t s = 0; s < 3; s++) {
    if (s)
      tu_model_step(&m, 0.03);
    commit(a, &m, s, NULL);
    uint64_t total;
    uint16_t *bits = tt_model_bf16(&m, &total), *at = bits;
    pulse_pub_tensor t[TU_TENSORS];
    for (int i = 0; i < TU_TENSORS; i++) {
      t[i].data = at;
      t[i].dtype = i == 1 ? PULSE_DTYPE_F32 : PULSE_DTYPE_BF16; /* mixed */
      if (i == 1)
        t[i].data = m.w[1];
      t[i].memory = PULSE_PUB_HOST;
      at += m.numel[i];
    }
    cr_assert_eq(pulse_pub_commit(b, s, t, TU_TENSORS, NULL), PULSE_OK);
    free(bits);
    cr_assert_eq(
        memcmp(pulse_pub_state_digest(a), pulse_pub_state_digest(b), 32), 0);
  }
  pulse_pub_free(a);
  pulse_pub_free(b);
  tu_model_free(&m);
  tu_rm_rf(d1);
  tu_rm_rf(d2);
}

Test(publisher, reopening_resumes_from_the_head_and_continues) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 2);
  pulse_pub *pub = open_pub(dir, &m, 3, 16, 0);
  for (uint64_t s = 0; s <= 4; s++) {
    if (s)
      tu_model_step(&m, 0.02);
    commit(pub, &m, s, NULL);
  }
  pulse_pub_free(pub);
  /* Without a table: taken from the store. */
  pub = open_pub(dir, NULL, 3, 16, 0);
  uint64_t step;
  cr_assert_eq(pulse_pub_head_step(pub, &step), 1);
  cr_assert_eq(step, 4);
  cr_assert_eq(pulse_pub_tensor_count(pub), TU_TENSORS);
  cr_assert_str_eq(pulse_pub_tensor_info(pub, 1)->name, m.info[1].name);
  assert_snapshot_is_model(pub, &m);
  for (uint64_t s = 5; s <= 8; s++) {
    tu_model_step(&m, 0.02);
    commit(pub, &m, s, NULL);
  }
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(pub);
  /* With the same table, again. */
  pub = open_pub(dir, &m, 3, 16, 0);
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(pub);
  cr_assert_eq(pulse_store_verify(
                   dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                   NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher, a_store_of_another_model_is_refused) {
  char *dir = tu_make_dir();
  tu_model m, other;
  tu_model_init(&m, 5, 1);
  tu_model_init(&other, 5, 2); /* other shapes */
  pulse_pub *pub = open_pub(dir, &m, 3, 16, 0);
  commit(pub, &m, 0, NULL);
  pulse_pub_free(pub);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = other.info;
  o.tensor_count = TU_TENSORS;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_SIZE_MISMATCH);
  cr_assert_null(pub);
  o.tensor_count = 2;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_SIZE_MISMATCH);
  tu_model_free(&m);
  tu_model_free(&other);
  tu_rm_rf(dir);
}

Test(publisher, bad_commits_are_refused_and_change_nothing) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 6, 1);
  pulse_pub *pub = open_pub(dir, &m, 3, 16, 0);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 5, t, TU_TENSORS - 1, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_head_step(pub, NULL), 0, "nothing published");
  commit(pub, &m, 5, NULL);
  tu_model_step(&m, 0.05);
  cr_assert_eq(pulse_pub_commit(pub, 5, t, TU_TENSORS, NULL),
               PULSE_ERR_BASE_STEP);
  cr_assert_eq(pulse_pub_commit(pub, 4, t, TU_TENSORS, NULL),
               PULSE_ERR_BASE_STEP);
  /* Device tensors without a device (test_publisher_device.c has the
   * rest; host memory must never reach a device encoder). */
  t[2].memory = PULSE_PUB_DEVICE;
#ifdef PULSE_HAVE_CUDA
  if (!pulse_cuda_available())
    cr_assert_eq(pulse_pub_commit(pub, 6, t, TU_TENSORS, NULL), PULSE_ERR_CUDA);
#else
  cr_assert_eq(pulse_pub_commit(pub, 6, t, TU_TENSORS, NULL),
               PULSE_ERR_NOT_BUILT);
#endif
  t[2].memory = (pulse_pub_memory)7;
  cr_assert_eq(pulse_pub_commit(pub, 6, t, TU_TENSORS, NULL), PULSE_ERR_ARG,
               "unknown memory kind");
  t[2].memory = PULSE_PUB_HOST;
  t[1].dtype = PULSE_DTYPE_F16;
  cr_assert_eq(pulse_pub_commit(pub, 6, t, TU_TENSORS, NULL), PULSE_ERR_DTYPE);
  t[1].dtype = PULSE_DTYPE_F32;
  t[0].data = (const char *)m.w[0] + 1;
  cr_assert_eq(pulse_pub_commit(pub, 6, t, TU_TENSORS, NULL), PULSE_ERR_ARG,
               "misaligned");
  t[0].data = m.w[0];
  uint64_t step;
  pulse_pub_head_step(pub, &step);
  cr_assert_eq(step, 5);
  commit(pub, &m, 6, NULL);
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher, failed_writes_leave_the_publisher_and_store_as_they_were) {
  char *dir = tu_make_dir(), objs[512], moved[512], head[512], headdir[600];
  tu_model m;
  tu_model_init(&m, 7, 1);
  pulse_pub *pub = open_pub(dir, &m, 100, 16, 0);
  commit(pub, &m, 0, NULL);
  tu_model_step(&m, 0.03);
  commit(pub, &m, 1, NULL);
  pulse_state_digest before = *pulse_pub_state_digest(pub);
  tu_model_step(&m, 0.03);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  /* The patch cannot be written: objects/ is a file for a moment. */
  tt_path(objs, sizeof objs, dir, "objects");
  tt_path(moved, sizeof moved, dir, "objects.away");
  cr_assert_eq(rename(objs, moved), 0);
  cr_assert_eq(tu_write(objs, "x", 1), 0);
  cr_assert_eq(pulse_pub_commit(pub, 2, t, TU_TENSORS, NULL), PULSE_ERR_IO);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &before, 32), 0);
  unlink(objs);
  cr_assert_eq(rename(moved, objs), 0);
  /* The head cannot be replaced: head.json is a non-empty folder. */
  tt_path(head, sizeof head, dir, "head.json");
  tt_path(moved, sizeof moved, dir, "head.keep");
  cr_assert_eq(rename(head, moved), 0);
  cr_assert_eq(mkdir(head, 0755), 0);
  tt_path(headdir, sizeof headdir, head, "x");
  cr_assert_eq(tu_write(headdir, "x", 1), 0);
  cr_assert_eq(pulse_pub_commit(pub, 2, t, TU_TENSORS, NULL), PULSE_ERR_IO);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &before, 32), 0,
               "rolled back");
  unlink(headdir);
  rmdir(head);
  cr_assert_eq(rename(moved, head), 0);
  /* Now it goes through, from the state it had. */
  commit(pub, &m, 2, NULL);
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(pub);
  pulse_store_recovery rec;
  cr_assert_eq(pulse_store_recover(dir, &rec), PULSE_OK, "%s",
               pulse_error_detail());
  /* The retried step wrote the very same bytes under the same name as the
   * patch of the failed attempt: nothing is left over. */
  cr_assert_eq(rec.orphans, 0);
  cr_assert_eq(rec.temporaries, 0);
  cr_assert_eq(pulse_store_verify(
                   dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                   NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}

/* Parameterized over sync / background anchors. */
static void retention_run(int sync) {
  char *dir = tu_make_dir(), objs[512];
  tu_model m;
  tu_model_init(&m, 8, 1);
  pulse_pub *pub = open_pub(dir, &m, 4, 3, sync);
  tt_path(objs, sizeof objs, dir, "objects");
  for (uint64_t s = 0; s <= 21; s++) {
    if (s)
      tu_model_step(&m, 0.02);
    commit(pub, &m, s, NULL);
    pulse_store_head *h = NULL;
    cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
    size_t np = pulse_store_head_patch_count(h),
           na = pulse_store_head_anchor_count(h);
    /* At least 3 patches (once there are), at most back to an anchor 4 apart.
     */
    cr_assert_geq(np, s < 3 ? s : 3, "step %" PRIu64, s);
    cr_assert_leq(np, 3 + 4 + 4, "step %" PRIu64 ": %zu patches", s, np);
    cr_assert_leq(na, 3);
    pulse_pub_wait(pub); /* dropped objects go in the background */
    int files = tt_count(objs);
    cr_assert_geq(files, (int)(np + na));
    cr_assert_leq(files, (int)(np + na) + 1, "a background anchor at most");
    pulse_store_head_free(h);
  }
  cr_assert_eq(pulse_pub_flush(pub, NULL), PULSE_OK);
  pulse_pub_free(pub);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(
      pulse_store_head_anchor(h, pulse_store_head_anchor_count(h) - 1)->step,
      20, "the newest anchor is named once flushed");
  cr_assert_eq(tt_count(objs), (int)(pulse_store_head_patch_count(h) +
                                     pulse_store_head_anchor_count(h)));
  pulse_store_head_free(h);
  cr_assert_eq(pulse_store_verify(
                   dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                   NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher,
     retention_keeps_a_rebuildable_window_with_anchors_in_the_commit) {
  retention_run(1);
}
Test(publisher, retention_keeps_a_rebuildable_window_with_background_anchors) {
  retention_run(0);
}

Test(publisher, background_anchors_are_named_by_the_next_head_or_a_flush) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 9, 1);
  pulse_pub *pub = open_pub(dir, &m, 2, 16, 0);
  pulse_pub_figures f;
  commit(pub, &m, 0, &f);
  tu_model_step(&m, 0.02);
  commit(pub, &m, 1, &f);
  cr_assert_eq(f.anchor_started, 0);
  tu_model_step(&m, 0.02);
  commit(pub, &m, 2, &f);
  cr_assert_eq(f.anchor_started, 1);
  cr_assert_eq(f.anchor_bytes, 0);
  tu_model_step(&m, 0.02);
  commit(pub, &m, 3, &f);
  cr_assert_gt(f.anchor_bytes, 0, "step 2's anchor is named by step 3's head");
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_anchor_count(h), 2);
  cr_assert_eq(pulse_store_head_anchor(h, 1)->step, 2);
  pulse_store_head_free(h);
  tu_model_step(&m, 0.02);
  commit(pub, &m, 4, &f);
  cr_assert_eq(f.anchor_started, 1);
  cr_assert_eq(pulse_pub_flush(pub, &f), PULSE_OK);
  cr_assert_eq(f.flush, 1);
  cr_assert_eq(f.step, 4);
  cr_assert_gt(f.anchor_bytes, 0);
  cr_assert_eq(pulse_pub_flush(pub, &f), PULSE_OK);
  cr_assert_eq(f.flush, 0, "nothing left to name");
  pulse_pub_free(pub);
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(
      pulse_store_head_anchor(h, pulse_store_head_anchor_count(h) - 1)->step,
      4);
  pulse_store_head_free(h);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher, bad_options_are_refused) {
  char *dir = tu_make_dir();
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_ARG,
               "a new store needs a table");
  tu_model m;
  tu_model_init(&m, 1, 1);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.keep_patches = 0;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_ARG);
  o.keep_patches = 4;
  o.keep_anchors = 1;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_ARG,
               "the floor needs a successor");
  o.keep_anchors = 2;
  o.struct_version = 99;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_VERSION);
  o.struct_version = PULSE_PUB_OPTS_VERSION;
  pulse_tensor_info dup[2] = {m.info[0], m.info[0]};
  o.tensors = dup;
  o.tensor_count = 2;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_DUPLICATE);
  cr_assert_null(pub);
  pulse_pub_free(NULL);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher, retention_stays_bounded_when_every_step_is_an_anchor) {
  char *dir = tu_make_dir(), objs[512];
  tu_model m;
  tu_model_init(&m, 10, 1);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.anchor_every = 1;
  o.keep_patches = 4;
  o.keep_anchors = 2;
  o.anchor_sync = 1;
  o.threads = 1;
  o.grace_seconds = 0;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK);
  tt_path(objs, sizeof objs, dir, "objects");
  for (uint64_t s = 0; s <= 40; s++) {
    if (s)
      tu_model_step(&m, 0.02);
    commit(pub, &m, s, NULL);
    pulse_store_head *h = NULL;
    cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
    size_t np = pulse_store_head_patch_count(h),
           na = pulse_store_head_anchor_count(h);
    cr_assert_leq(np, 2 * 4 + 1, "step %" PRIu64 ": %zu patches", s, np);
    cr_assert_geq(np, s < 4 ? s : 4);
    cr_assert_leq(na, 2);
    pulse_pub_wait(pub); /* dropped objects go in the background */
    cr_assert_eq(tt_count(objs), (int)(np + na));
    pulse_store_head_free(h);
  }
  pulse_pub_free(pub);
  cr_assert_eq(pulse_store_verify(dir, PULSE_STORE_VERIFY_STATE, NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}
