/* The publisher with tensors in device memory (PULSE_PUB_DEVICE): commits of
 * the same trajectory from the device and from the host write byte-identical
 * patches and heads (FP32 master and BF16 tensors, both position models,
 * anchors in the commit or in the background), tables that mix host and
 * device tensors or move between them, reopening a store and continuing on
 * the device, failed device commits that change nothing, and a clear error
 * without a device. Tests that need a device skip without one ("no CUDA
 * device"); tests/cuda/emu/run.sh runs them on the CPU emulator of the
 * kernels and tests/gpu/check.sh on a GPU. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>

#include "pulse_cuda.h"
#include "pulse_publisher.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "trainer_testutil.h"

#define DEVICE_TEST_START()                                                    \
  do {                                                                         \
    if (!pulse_cuda_available())                                               \
      cr_skip_test("no CUDA device");                                          \
  } while (0)

#define OK(expr)                                                               \
  do {                                                                         \
    pulse_status ok_st_ = (expr);                                              \
    cr_assert_eq(ok_st_, PULSE_OK, "%s -> %s: %s", #expr,                      \
                 pulse_status_name(ok_st_), pulse_error_detail());             \
  } while (0)

/* Where each tensor of a step comes from. */
typedef enum { ALL_HOST, ALL_DEVICE, MIXED } placement;

/* The model's tensors on the device: tensors 0 and 1 as FP32 master
 * weights, 2 and 3 as BF16 (cast on the host, the one rounding). */
typedef struct {
  void *d[TU_TENSORS];
  uint16_t *bf16[TU_TENSORS]; /* host BF16 of tensors 2, 3 */
} dev_model;

static pulse_dtype dtype_of(int i) {
  return i < 2 ? PULSE_DTYPE_F32 : PULSE_DTYPE_BF16;
}

static void dev_init(dev_model *dm, const tu_model *m) {
  memset(dm, 0, sizeof *dm);
  for (int i = 0; i < TU_TENSORS; i++) {
    OK(pulse_cuda_alloc(&dm->d[i], m->numel[i] * 4));
    dm->bf16[i] = tu_alloc(m->numel[i] * 2);
  }
}

/* Uploads the model's current weights. */
static void dev_sync(dev_model *dm, const tu_model *m) {
  for (int i = 0; i < TU_TENSORS; i++) {
    pulse_bf16_cast_f32(m->w[i], dm->bf16[i], m->numel[i]);
    if (dtype_of(i) == PULSE_DTYPE_F32)
      OK(pulse_cuda_upload(dm->d[i], m->w[i], m->numel[i] * 4, NULL));
    else
      OK(pulse_cuda_upload(dm->d[i], dm->bf16[i], m->numel[i] * 2, NULL));
  }
}

static void dev_free(dev_model *dm) {
  for (int i = 0; i < TU_TENSORS; i++) {
    pulse_cuda_free(dm->d[i]);
    free(dm->bf16[i]);
  }
}

/* The step's tensors: the same dtypes wherever they are, so that host and
 * device commits see the same inputs. */
static void tensors_of(const tu_model *m, const dev_model *dm, placement where,
                       pulse_pub_tensor *t) {
  for (int i = 0; i < TU_TENSORS; i++) {
    int dev = where == ALL_DEVICE || (where == MIXED && i % 2 == 1);
    t[i].dtype = dtype_of(i);
    t[i].memory = dev ? PULSE_PUB_DEVICE : PULSE_PUB_HOST;
    if (dev)
      t[i].data = dm->d[i];
    else
      t[i].data =
          dtype_of(i) == PULSE_DTYPE_F32 ? (void *)m->w[i] : dm->bf16[i];
  }
}

static pulse_pub *open_pub(const char *dir, const tu_model *m,
                           uint64_t anchor_every, int sync,
                           pulse_pos_model model) {
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  if (m != NULL) {
    o.tensors = m->info;
    o.tensor_count = TU_TENSORS;
  }
  o.anchor_every = anchor_every;
  o.keep_patches = 4;
  o.anchor_sync = sync;
  o.pos_model = model;
  o.chunk_log2 = 10; /* several chunks per tensor */
  o.threads = 2;
  pulse_pub *pub = NULL;
  OK(pulse_pub_create(dir, &o, &pub));
  return pub;
}

static void commit(pulse_pub *pub, const tu_model *m, const dev_model *dm,
                   placement where, uint64_t step, pulse_pub_figures *f) {
  pulse_pub_tensor t[TU_TENSORS];
  tensors_of(m, dm, where, t);
  cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, f), PULSE_OK,
               "step %" PRIu64 " (placement %d): %s", step, (int)where,
               pulse_error_detail());
}

/* Removes the head's lines that differ between two stores by design: the
 * run identity (random per store), the publication time and the link to the
 * previous head (the hash of a head that holds both). */
static size_t strip_run_lines(uint8_t *h, size_t n) {
  static const char *const keys[] = {"\"run\":", "\"published\":", "\"previous\":"};
  size_t out = 0;
  for (size_t at = 0; at < n;) {
    size_t end = at;
    while (end < n && h[end] != '\n')
      end++;
    if (end < n)
      end++; /* keep the newline with its line */
    int drop = 0;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
      drop |= end - at >= strlen(keys[k]) && memcmp(h + at, keys[k], strlen(keys[k])) == 0;
    if (!drop) {
      memmove(h + out, h + at, end - at);
      out += end - at;
    }
    at = end;
  }
  return out;
}

/* head.json of two stores: the same bytes but for the run's own lines
 * (unsigned heads name every object by its SHA-256, so equal heads mean
 * byte-identical objects). */
static void assert_same_heads(const char *d1, const char *d2, uint64_t step) {
  char p1[512], p2[512];
  size_t n1 = 0, n2 = 0;
  tt_path(p1, sizeof p1, d1, "head.json");
  tt_path(p2, sizeof p2, d2, "head.json");
  uint8_t *h1 = tu_read(p1, &n1), *h2 = tu_read(p2, &n2);
  cr_assert_not_null(h1);
  cr_assert_not_null(h2);
  n1 = strip_run_lines(h1, n1);
  n2 = strip_run_lines(h2, n2);
  cr_assert(n1 == n2 && memcmp(h1, h2, n1) == 0,
            "step %" PRIu64 ": the heads differ:\n%.*s\n%.*s", step, (int)n1,
            (const char *)h1, (int)n2, (const char *)h2);
  free(h1), free(h2);
}

static void assert_snapshot_is_model(const pulse_pub *pub, const tu_model *m) {
  uint64_t total;
  uint16_t *want = tt_model_bf16(m, &total), *at = want;
  for (size_t i = 0; i < TU_TENSORS; i++) {
    const uint16_t *snap = pulse_pub_snapshot(pub, i);
    cr_assert_not_null(snap, "%s", pulse_error_detail());
    cr_assert_eq(memcmp(snap, at, m->numel[i] * 2), 0, "tensor %zu", i);
    at += m->numel[i];
  }
  free(want);
  pulse_state_digest d = tt_model_digest(m);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &d, sizeof d), 0);
}

static void assert_verifies(const char *dir) {
  cr_assert_eq(pulse_store_verify(
                   dir, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                   NULL, NULL),
               PULSE_OK, "%s", pulse_error_detail());
}

/* A trajectory published from the host into one store and from `where`
 * into another, step by step: the same heads, the same figures. */
static void same_trajectory(placement where, int sync, pulse_pos_model model) {
  char *d1 = tu_make_dir(), *d2 = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 11 + (uint64_t)sync, 2);
  dev_model dm;
  dev_init(&dm, &m);
  pulse_pub *host = open_pub(d1, &m, 3, sync, model);
  pulse_pub *dev = open_pub(d2, &m, 3, sync, model);
  for (uint64_t s = 0; s <= 8; s++) {
    if (s > 0 && s != 5) /* step 5: nothing changed */
      tu_model_step(&m, s == 7 ? 0.6 : 0.01 * (double)s);
    dev_sync(&dm, &m);
    pulse_pub_figures fh, fd;
    commit(host, &m, &dm, ALL_HOST, s * 10, &fh);
    commit(dev, &m, &dm, where, s * 10, &fd);
    assert_same_heads(d1, d2, s);
    cr_assert_eq(fd.changed, fh.changed, "step %" PRIu64, s);
    cr_assert_eq(fd.patch_bytes, fh.patch_bytes);
    cr_assert_eq(fd.anchor_bytes, fh.anchor_bytes);
    cr_assert_eq(fd.anchor_started, fh.anchor_started);
    cr_assert_eq(fd.base_step, fh.base_step);
    cr_assert_str_eq(fd.state_digest, fh.state_digest);
    if (s > 0) {
      cr_assert_eq(fd.detect_seconds, 0.0, "one call on the device");
      cr_assert_gt(fd.encode_seconds, 0.0);
    }
    cr_assert_geq(fd.total_seconds, fd.encode_seconds + fd.write_seconds);
    if (s == 4 || s == 8)
      assert_snapshot_is_model(dev, &m); /* downloads */
  }
  cr_assert_eq(pulse_pub_flush(host, NULL), PULSE_OK);
  cr_assert_eq(pulse_pub_flush(dev, NULL), PULSE_OK);
  assert_same_heads(d1, d2, 9);
  pulse_pub_free(host);
  pulse_pub_free(dev);
  assert_verifies(d2);
  dev_free(&dm);
  tu_model_free(&m);
  tu_rm_rf(d1);
  tu_rm_rf(d2);
}

Test(publisher_device, device_commits_write_the_host_commits_bytes) {
  DEVICE_TEST_START();
  same_trajectory(ALL_DEVICE, 1, PULSE_POS_CLASS);
}

Test(publisher_device, device_commits_with_background_anchors) {
  DEVICE_TEST_START();
  same_trajectory(ALL_DEVICE, 0, PULSE_POS_CLASS);
}

Test(publisher_device, device_commits_with_the_plain_position_model) {
  DEVICE_TEST_START();
  same_trajectory(ALL_DEVICE, 1, PULSE_POS_PLAIN);
}

Test(publisher_device, mixed_host_and_device_tensors_in_one_commit) {
  DEVICE_TEST_START();
  same_trajectory(MIXED, 0, PULSE_POS_CLASS);
}

Test(publisher_device, commits_may_move_between_host_and_device) {
  DEVICE_TEST_START();
  char *d1 = tu_make_dir(), *d2 = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 21, 1);
  dev_model dm;
  dev_init(&dm, &m);
  pulse_pub *host = open_pub(d1, &m, 4, 0, PULSE_POS_CLASS);
  pulse_pub *pub = open_pub(d2, &m, 4, 0, PULSE_POS_CLASS);
  static const placement order[] = {ALL_HOST,   ALL_DEVICE, ALL_DEVICE,
                                    ALL_HOST,   MIXED,      ALL_HOST,
                                    ALL_DEVICE, ALL_HOST,   ALL_DEVICE};
  for (uint64_t s = 0; s < sizeof order / sizeof order[0]; s++) {
    if (s > 0)
      tu_model_step(&m, 0.03);
    dev_sync(&dm, &m);
    commit(host, &m, &dm, ALL_HOST, s, NULL);
    commit(pub, &m, &dm, order[s], s, NULL);
    assert_same_heads(d1, d2, s);
    if (s % 3 == 2)
      assert_snapshot_is_model(pub, &m);
  }
  pulse_pub_free(host);
  pulse_pub_free(pub);
  assert_same_heads(d1, d2, 99);
  assert_verifies(d2);
  dev_free(&dm);
  tu_model_free(&m);
  tu_rm_rf(d1);
  tu_rm_rf(d2);
}

Test(publisher_device, reopening_a_store_continues_on_the_device) {
  DEVICE_TEST_START();
  char *d1 = tu_make_dir(), *d2 = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 31, 1);
  dev_model dm;
  dev_init(&dm, &m);
  pulse_pub *host = open_pub(d1, &m, 3, 1, PULSE_POS_CLASS);
  pulse_pub *pub = open_pub(d2, &m, 3, 1, PULSE_POS_CLASS);
  for (uint64_t s = 0; s <= 12; s++) {
    if (s > 0)
      tu_model_step(&m, 0.02);
    dev_sync(&dm, &m);
    commit(host, &m, &dm, ALL_HOST, s, NULL);
    commit(pub, &m, &dm, ALL_DEVICE, s, NULL);
    assert_same_heads(d1, d2, s);
    if (s % 4 == 3) {
      /* A trainer restart: the snapshot is rebuilt from the store, checked
       * against the head's digest, and uploaded at the next commit. */
      pulse_pub_free(pub);
      pub = open_pub(d2, s % 8 == 3 ? NULL : &m, 3, 1, PULSE_POS_CLASS);
      uint64_t head = 0;
      cr_assert_eq(pulse_pub_head_step(pub, &head), 1);
      cr_assert_eq(head, s);
    }
  }
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(host);
  pulse_pub_free(pub);
  assert_verifies(d2);
  dev_free(&dm);
  tu_model_free(&m);
  tu_rm_rf(d1);
  tu_rm_rf(d2);
}

Test(publisher_device, failed_device_commits_change_nothing) {
  DEVICE_TEST_START();
  char *d1 = tu_make_dir(), *d2 = tu_make_dir(), objs[512], moved[512],
       head[512], headdir[600];
  tu_model m;
  tu_model_init(&m, 41, 1);
  dev_model dm;
  dev_init(&dm, &m);
  pulse_pub *host = open_pub(d1, &m, 100, 0, PULSE_POS_CLASS);
  pulse_pub *pub = open_pub(d2, &m, 100, 0, PULSE_POS_CLASS);
  for (uint64_t s = 0; s <= 1; s++) {
    if (s > 0)
      tu_model_step(&m, 0.03);
    dev_sync(&dm, &m);
    commit(host, &m, &dm, ALL_HOST, s, NULL);
    commit(pub, &m, &dm, ALL_DEVICE, s, NULL);
  }
  pulse_state_digest before = *pulse_pub_state_digest(pub);
  tu_model_step(&m, 0.03);
  dev_sync(&dm, &m);
  pulse_pub_tensor t[TU_TENSORS];
  tensors_of(&m, &dm, ALL_DEVICE, t);
  /* The patch cannot be written: objects/ is a file for a moment. */
  tt_path(objs, sizeof objs, d2, "objects");
  tt_path(moved, sizeof moved, d2, "objects.away");
  cr_assert_eq(rename(objs, moved), 0);
  cr_assert_eq(tu_write(objs, "x", 1), 0);
  cr_assert_eq(pulse_pub_commit(pub, 2, t, TU_TENSORS, NULL), PULSE_ERR_IO);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &before, 32), 0);
  unlink(objs);
  cr_assert_eq(rename(moved, objs), 0);
  /* The head cannot be replaced: head.json is a non-empty folder. The
   * device snapshot had moved: the next commit takes the head's state from
   * the store again (the host copy is stale after device commits). */
  tt_path(head, sizeof head, d2, "head.json");
  tt_path(moved, sizeof moved, d2, "head.keep");
  cr_assert_eq(rename(head, moved), 0);
  cr_assert_eq(mkdir(head, 0755), 0);
  tt_path(headdir, sizeof headdir, head, "x");
  cr_assert_eq(tu_write(headdir, "x", 1), 0);
  cr_assert_eq(pulse_pub_commit(pub, 2, t, TU_TENSORS, NULL), PULSE_ERR_IO);
  cr_assert_eq(memcmp(pulse_pub_state_digest(pub), &before, 32), 0);
  unlink(headdir);
  rmdir(head);
  cr_assert_eq(rename(moved, head), 0);
  /* Now it goes through, from the state it had. */
  commit(host, &m, &dm, ALL_HOST, 2, NULL);
  commit(pub, &m, &dm, ALL_DEVICE, 2, NULL);
  assert_same_heads(d1, d2, 2);
  /* And once more after a failure while the host copy was current (the
   * retry uploads it instead). */
  assert_snapshot_is_model(pub, &m); /* downloads: the host copy current */
  tu_model_step(&m, 0.03);
  dev_sync(&dm, &m);
  tensors_of(&m, &dm, ALL_DEVICE, t);
  tt_path(head, sizeof head, d2, "head.json");
  cr_assert_eq(rename(head, moved), 0);
  cr_assert_eq(mkdir(head, 0755), 0);
  cr_assert_eq(tu_write(headdir, "x", 1), 0);
  cr_assert_eq(pulse_pub_commit(pub, 3, t, TU_TENSORS, NULL), PULSE_ERR_IO);
  unlink(headdir);
  rmdir(head);
  cr_assert_eq(rename(moved, head), 0);
  commit(host, &m, &dm, ALL_HOST, 3, NULL);
  commit(pub, &m, &dm, ALL_DEVICE, 3, NULL);
  assert_same_heads(d1, d2, 3);
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(host);
  pulse_pub_free(pub);
  pulse_store_recovery rec;
  cr_assert_eq(pulse_store_recover(d2, &rec), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(rec.temporaries, 0);
  assert_verifies(d2);
  dev_free(&dm);
  tu_model_free(&m);
  tu_rm_rf(d1);
  tu_rm_rf(d2);
}

Test(publisher_device, bad_device_tensors_are_refused) {
  DEVICE_TEST_START();
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 51, 1);
  dev_model dm;
  dev_init(&dm, &m);
  dev_sync(&dm, &m);
  pulse_pub *pub = open_pub(dir, &m, 3, 0, PULSE_POS_CLASS);
  pulse_pub_tensor t[TU_TENSORS];
  tensors_of(&m, &dm, ALL_DEVICE, t);
  t[1].data = (const char *)dm.d[1] + 2; /* FP32, misaligned */
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_ERR_ARG);
  t[1].data = NULL;
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_ERR_ARG);
  tensors_of(&m, &dm, ALL_DEVICE, t);
  t[3].dtype = PULSE_DTYPE_F16;
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_ERR_DTYPE);
  cr_assert_eq(pulse_pub_head_step(pub, NULL), 0, "nothing published");
  commit(pub, &m, &dm, ALL_DEVICE, 0, NULL);
  assert_snapshot_is_model(pub, &m);
  pulse_pub_free(pub);
  dev_free(&dm);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

/* Without a usable device (or without CUDA), device tensors are refused
 * with a clear error and nothing is published. Skipped where there is a
 * device: tests/cuda/emu/run.sh runs it with the emulator's device hidden. */
Test(publisher_device, device_tensors_without_a_device_are_refused) {
  if (pulse_cuda_available())
    cr_skip_test("a CUDA device is present");
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 61, 1);
  pulse_pub *pub = open_pub(dir, &m, 3, 0, PULSE_POS_CLASS);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  int fake = 0;
  t[2].memory = PULSE_PUB_DEVICE;
  t[2].data = &fake; /* never read: refused first */
  t[2].dtype = PULSE_DTYPE_F32;
#ifdef PULSE_HAVE_CUDA
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_ERR_CUDA);
  cr_assert_not_null(strstr(pulse_error_detail(), "no CUDA device"), "%s",
                     pulse_error_detail());
#else
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL),
               PULSE_ERR_NOT_BUILT);
  cr_assert_not_null(strstr(pulse_error_detail(), "without CUDA"), "%s",
                     pulse_error_detail());
#endif
  cr_assert_not_null(strstr(pulse_error_detail(), m.info[2].name));
  cr_assert_eq(pulse_pub_head_step(pub, NULL), 0, "nothing published");
  /* The host path is unaffected. */
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_OK);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}
