/* The safetensors file target: written like an anchor (table order,
 * metadata step and state digest), resumed after a restart from the step it
 * names, replaced from an anchor when damaged or when it claims a step it
 * does not hold, and left as it was when a sync fails. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flip_proxy.h"
#include "inf_testutil.h"
#include "pulse_file.h"
#include "pulse_safetensors.h"

typedef struct {
  it_trainer t;
  char *work;
  char cache[4096], out[4096];
  const char *urls[2];
} fx;

static void fx_up_scaled(fx *f, uint64_t steps, uint64_t scale) {
  memset(f, 0, sizeof *f);
  it_trainer_up(&f->t, 100, 32, scale);
  it_trainer_run(&f->t, 0, steps, 0.01);
  f->work = tu_make_dir();
  snprintf(f->cache, sizeof f->cache, "%s/cache", f->work);
  snprintf(f->out, sizeof f->out, "%s/model.safetensors", f->work);
}

static void fx_up(fx *f, uint64_t steps) { fx_up_scaled(f, steps, 2); }

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

/* ------------------------------------------------ in place, with a journal */

static char *journal_of(fx *f) {
  static char j[4200];
  snprintf(j, sizeof j, "%s/.model.safetensors.journal", f->work);
  return j;
}

static uint64_t header_size_of(const char *path) {
  size_t n = 0;
  uint8_t *b = tu_read(path, &n);
  cr_assert_geq(n, 8);
  uint64_t h = 8;
  for (int i = 0; i < 8; i++)
    h += (uint64_t)b[i] << (8 * i);
  free(b);
  return h;
}

static uint64_t changes_between(fx *f, uint64_t a, uint64_t b) {
  uint64_t n = 0;
  for (int i = 0; i < TU_TENSORS; i++)
    for (uint64_t k = 0; k < f->t.m.numel[i]; k++)
      n += f->t.bits[a][i][k] != f->t.bits[b][i][k];
  return n;
}

static void copy_file(const char *from, const char *to) {
  size_t n = 0;
  uint8_t *b = tu_read(from, &n);
  cr_assert_not_null(b, "%s", from);
  cr_assert_eq(tu_write(to, b, n), 0);
  free(b);
}

static int same_bytes(const char *a, const char *b) {
  size_t na = 0, nb = 0;
  uint8_t *x = tu_read(a, &na), *y = tu_read(b, &nb);
  int same = x != NULL && y != NULL && na == nb && memcmp(x, y, na) == 0;
  free(x), free(y);
  return same;
}

/* In place, by the pages (4 KiB) that hold changes: a model of 1.4 M
 * weights (338 pages) and a step of about 70 changes leave most pages
 * unwritten. */
Test(inference_side, a_step_is_written_in_place_in_proportion_to_its_changes) {
  fx f;
  fx_up_scaled(&f, 3, 100);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  struct stat before;
  cr_assert_eq(stat(f.out, &before), 0);
  uint64_t header = header_size_of(f.out);

  it_trainer_run(&f.t, 4, 4, 0.0001);
  uint64_t changes = changes_between(&f, 3, 4);
  cr_assert_gt(changes, 0);
  sub = fx_sub(&f, 0);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  uint64_t at_attach = fig.file_bytes_written;
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 4);
  struct stat after;
  cr_assert_eq(stat(f.out, &after), 0);
  cr_assert_eq(after.st_ino, before.st_ino, "the file is updated in place, not replaced");
  cr_assert_eq(after.st_size, before.st_size);
  cr_assert_eq(header_size_of(f.out), header, "the claim is rewritten in its own room");
  pulse_sub_figures_get(sub, &fig);
  uint64_t wrote = fig.file_bytes_written - at_attach;
  /* The journal (its header, the changes at about 4 bytes each, the new
   * header) and the file (at most a page per change, the header):
   * O(changes). */
  uint64_t bound = 2 * header + 8 * changes + 256 + 4096 * changes;
  cr_assert_leq(wrote, bound, "%" PRIu64 " bytes written for %" PRIu64 " changes", wrote,
                changes);
  cr_assert_lt(wrote, (uint64_t)before.st_size / 2, "not the whole file");
  cr_assert_geq(wrote, 2 * changes + header, "every change and the claim were written");
  cr_assert_eq(access(journal_of(&f), F_OK), 0, "the step is in the journal until a checkpoint");
  pulse_sub_free(sub);
  expect_file(&f, 4);
  /* A clean close does not wait for the file's pages: the next attach
   * replays the journal (changing nothing) and retires it. */
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), 4);
  cr_assert_neq(access(journal_of(&f), F_OK), 0, "the next attach retires the journal");
  pulse_sub_free(sub);
  expect_file(&f, 4);
  fx_down(&f);
}

/* A journal kept from a real step, laid over the file before that step:
 * the next attach finishes the step, also from a file that took part of it
 * already, and replaying it again changes nothing. */
static void replay_rounds(const char *window) {
  if (window != NULL)
    setenv("PULSE_TEST_REPLAY_WINDOW", window, 1);
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  char f3[4200], f4[4200], j4[4200];
  snprintf(f3, sizeof f3, "%s/f3", f.work);
  snprintf(f4, sizeof f4, "%s/f4", f.work);
  snprintf(j4, sizeof j4, "%s/j4", f.work);
  copy_file(f.out, f3);
  it_trainer_run(&f.t, 4, 4, 0.01);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  copy_file(journal_of(&f), j4);
  pulse_sub_free(sub);
  copy_file(f.out, f4);

  /* Torn data: step 3 with half of the differing bytes of step 4. */
  size_t n3 = 0, n4 = 0;
  uint8_t *b3 = tu_read(f3, &n3), *b4 = tu_read(f4, &n4);
  cr_assert_eq(n3, n4);
  int flip = 0;
  for (size_t i = 0; i < n3; i++)
    if (b3[i] != b4[i] && (flip ^= 1))
      b3[i] = b4[i];
  /* The claim of step 4 with the data of step 3: a power cut after a
   * clean exit lost pages that the kernel had not written back yet, but
   * not the header. */
  size_t hs = (size_t)header_size_of(f4);
  uint8_t *lost = tu_read(f3, &n3);
  cr_assert(lost != NULL && hs < n3);
  memcpy(lost, b4, hs);
  for (int round = 0; round < 4; round++) {
    if (round == 0)
      cr_assert_eq(tu_write(f.out, b3, n3), 0); /* part written */
    else if (round == 1)
      copy_file(f3, f.out); /* none written */
    else if (round == 3)
      cr_assert_eq(tu_write(f.out, lost, n3), 0); /* the claim, pages lost */
    /* round 2: all written already (the file is step 4): a second replay */
    copy_file(j4, journal_of(&f));
    sub = fx_sub(&f, 0);
    cr_assert_eq(pulse_sub_step(sub), 4, "round %d: step 4 finished from the journal", round);
    cr_assert_neq(access(journal_of(&f), F_OK), 0, "round %d: the journal is retired", round);
    pulse_sub_free(sub);
    cr_assert(same_bytes(f.out, f4), "round %d: bit-identical to the step written whole", round);
  }
  free(b3), free(b4), free(lost);

  /* The next sync goes on from there. */
  it_trainer_run(&f.t, 5, 6, 0.01);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  expect_file(&f, 6);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.anchors_applied, 0);
  pulse_sub_free(sub);
  fx_down(&f);
}

Test(inference_side, a_complete_journal_is_replayed_and_a_second_replay_is_harmless) {
  replay_rounds(NULL);
}

/* The replay reads, patches and writes the file a window at a time: with
 * windows of 3 bytes, every other element lies across two windows. */
Test(inference_side, a_journal_replayed_in_small_odd_windows_gives_the_same_file) {
  replay_rounds("3");
}

typedef struct {
  int torn_warnings;
} warn_count;

static void count_warnings(void *ctx, const pulse_sub_event *ev) {
  warn_count *w = ctx;
  if (ev->type == PULSE_SUB_EV_WARNING && strstr(ev->detail, "journal") != NULL)
    w->torn_warnings++;
}

Test(inference_side, a_torn_or_corrupt_journal_is_dropped_and_the_file_keeps_its_step) {
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  char f3[4200], j4[4200];
  snprintf(f3, sizeof f3, "%s/f3", f.work);
  snprintf(j4, sizeof j4, "%s/j4", f.work);
  copy_file(f.out, f3);
  it_trainer_run(&f.t, 4, 4, 0.01);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  copy_file(journal_of(&f), j4);
  pulse_sub_free(sub);
  size_t nj = 0;
  uint8_t *j = tu_read(j4, &nj);
  cr_assert_gt(nj, 100);

  for (int kind = 0; kind < 4; kind++) {
    copy_file(f3, f.out);
    if (kind == 0) /* torn: the last byte never made it */
      cr_assert_eq(tu_write(journal_of(&f), j, nj - 1), 0);
    else if (kind == 1) /* torn early: half the transaction */
      cr_assert_eq(tu_write(journal_of(&f), j, nj / 2), 0);
    else if (kind == 2) { /* whole length, one byte rotten */
      j[nj / 2] ^= 0x40;
      cr_assert_eq(tu_write(journal_of(&f), j, nj), 0);
      j[nj / 2] ^= 0x40;
    } else /* not a journal at all */
      cr_assert_eq(tu_write(journal_of(&f), "garbage, not a pulse journal", 28), 0);
    warn_count w = {0};
    pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
    o.use_catchup = 0;
    o.on_event = count_warnings;
    o.on_event_ctx = &w;
    cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
    cr_assert_eq(pulse_sub_attach_file(sub, f.out), PULSE_OK, "%s", pulse_error_detail());
    cr_assert_eq(pulse_sub_step(sub), 3, "kind %d: the file keeps step 3", kind);
    cr_assert_eq(w.torn_warnings, 1, "kind %d: a warning says the journal was dropped", kind);
    cr_assert_neq(access(journal_of(&f), F_OK), 0, "kind %d: the journal is removed", kind);
    cr_assert(same_bytes(f.out, f3), "kind %d: the file is untouched", kind);
    cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
    expect_file(&f, 4);
    pulse_sub_free(sub);
  }
  free(j);
  fx_down(&f);
}

Test(inference_side, a_snapshot_is_a_whole_step_written_every_k_steps) {
  fx f;
  fx_up(&f, 3);
  char snap[4096];
  snprintf(snap, sizeof snap, "%.4000s.snapshot", f.out);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_file_snapshot(sub, 2), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  for (uint64_t s = 4; s <= 6; s++) {
    it_trainer_run(&f.t, s, s, 0.01);
    cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  }
  pulse_sub_free(sub); /* waits for a snapshot being written */
  /* Steps 3 (the first) and 5 were due; 4 and 6 were not. */
  char out[4096];
  snprintf(out, sizeof out, "%s", f.out);
  snprintf(f.out, sizeof f.out, "%s", snap);
  expect_file(&f, 5);
  snprintf(f.out, sizeof f.out, "%s", out);
  expect_file(&f, 6);
  pulse_sub *plain = NULL;
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  cr_assert_eq(pulse_sub_create(&o, &plain), PULSE_OK);
  cr_assert_eq(pulse_sub_file_snapshot(plain, 2), PULSE_ERR_ARG, "no file target");
  pulse_sub_free(plain);
  fx_down(&f);
}

Test(inference_side, temporaries_of_killed_writers_are_removed_on_attach) {
  fx f;
  fx_up(&f, 3);
  pulse_sub *sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  /* A writer that is gone (no such process), one that is alive and writing
   * (this process, holding its lock), and another file's. */
  pid_t gone = 4000000;
  while (kill(gone, 0) == 0 || errno != ESRCH)
    gone++;
  char dead[4200], live[4200], other[4200], snapdead[4200];
  snprintf(dead, sizeof dead, "%s/.model.safetensors.tmp-%ld-3-9a", f.work, (long)gone);
  snprintf(snapdead, sizeof snapdead, "%s/.model.safetensors.snapshot.tmp-%ld-0-1", f.work,
           (long)gone);
  snprintf(other, sizeof other, "%s/.other.safetensors.tmp-%ld-3-9a", f.work, (long)gone);
  cr_assert_eq(tu_write(dead, "x", 1), 0);
  cr_assert_eq(tu_write(snapdead, "x", 1), 0);
  cr_assert_eq(tu_write(other, "x", 1), 0);
  pulse_atomic_file *af = NULL;
  cr_assert_eq(pulse_atomic_file_create(f.out, &af), PULSE_OK);
  sub = fx_sub(&f, 0);
  cr_assert_eq(pulse_sub_step(sub), 3);
  pulse_sub_free(sub);
  cr_assert_neq(access(dead, F_OK), 0, "a dead writer's temporary is removed");
  cr_assert_neq(access(snapdead, F_OK), 0, "and one of the snapshot's");
  cr_assert_eq(access(other, F_OK), 0, "another file's is kept");
  DIR *d = opendir(f.work);
  int live_kept = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    live_kept += strncmp(e->d_name, ".model.safetensors.tmp-", 23) == 0;
  closedir(d);
  cr_assert_eq(live_kept, 1, "a live writer's temporary is kept");
  pulse_atomic_file_abort(af);
  unlink(other);
  (void)live;
  fx_down(&f);
}
