/* Syncing host targets from an in-process trainer over 127.0.0.1: from
 * nothing (anchor), along the chain, through a signed catch-up, late after
 * retention, from a wrong base, with a subset of the table, and the
 * refusals that leave the targets as they were. */
#include <dirent.h>
#include <inttypes.h>

#include "inf_testutil.h"
#include "pulse_cuda.h"

typedef struct {
  it_trainer t;
  char *cache;
  const char *urls[4];
  pulse_sub *sub;
  it_targets tg;
} fx;

static void fx_up(fx *f, uint64_t anchor_every, uint64_t keep, uint64_t steps) {
  memset(f, 0, sizeof *f);
  it_trainer_up(&f->t, anchor_every, keep, 2);
  it_trainer_run(&f->t, 0, steps, 0.01);
  f->cache = tu_make_dir();
}

static void fx_sub(fx *f, pulse_sub_opts *o) {
  cr_assert_eq(pulse_sub_create(o, &f->sub), PULSE_OK, "%s",
               pulse_error_detail());
  it_targets_attach(&f->tg, &f->t, f->sub);
}

static void fx_down(fx *f) {
  pulse_sub_free(f->sub);
  it_targets_free(&f->tg);
  it_trainer_down(&f->t);
  tu_rm_rf(f->cache);
}

static void expect_at(fx *f, uint64_t step) {
  pulse_sub_figures fig;
  pulse_sub_figures_get(f->sub, &fig);
  cr_assert_eq(fig.step, step, "step %" PRIu64 ", expected %" PRIu64, fig.step,
               step);
  cr_assert_eq(pulse_sub_step(f->sub), step);
  cr_assert(it_targets_equal(&f->tg, &f->t, step),
            "targets differ from the trainer's step %" PRIu64, step);
  cr_assert_str_eq(fig.state_digest, f->t.digest[step]);
}

Test(inference_side, first_sync_takes_an_anchor_and_matches_bit_for_bit) {
  fx f;
  fx_up(&f, 4, 8, 6);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_step(f.sub), PULSE_SUB_NO_STEP);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 6);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  cr_assert_eq(fig.anchors_applied, 1);
  cr_assert_eq(fig.patches_applied, 2,
               "the newest anchor (step 4), then 2 patches");
  cr_assert_eq(fig.head_step, 6);
  cr_assert_gt(fig.bytes_downloaded, 0);
  /* The cache is a store: head.json as fetched, signature and all. */
  char path[4096];
  snprintf(path, sizeof path, "%s/head.json", f.cache);
  size_t a = 0, b = 0;
  uint8_t *mine = tu_read(path, &a);
  snprintf(path, sizeof path, "%s/head.json", f.t.dir);
  uint8_t *theirs = tu_read(path, &b);
  cr_assert(mine != NULL && a == b && memcmp(mine, theirs, a) == 0);
  free(mine), free(theirs);
  /* Nothing new: nothing downloaded but the head. */
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK);
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_NONE);
  cr_assert_lt(fig.last_bytes, 4096);
  fx_down(&f);
}

Test(inference_side, chain_of_patches_moves_step_by_step) {
  fx f;
  fx_up(&f, 100, 32, 2);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  o.use_catchup = 0;
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 2);
  it_trainer_run(&f.t, 3, 7, 0.01);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 7);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN);
  cr_assert_eq(fig.last_from_step, 2);
  cr_assert_eq(fig.patches_applied, 2 + 5);
  cr_assert_eq(fig.anchors_applied, 1);
  fx_down(&f);
}

Test(inference_side, signed_catchup_is_used_when_it_is_smaller) {
  fx f;
  fx_up(&f, 100, 32, 1);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 1);
  /* Eight steps that mostly revisit the same weights: the squash is far
   * smaller than the chain. */
  it_trainer_run(&f.t, 2, 9, 0.02);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 9);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_eq(fig.catchups_applied, 1);
  fx_down(&f);
}

Test(inference_side, late_joiner_starts_from_the_newest_anchor) {
  fx f;
  fx_up(&f, 3, 2, 11); /* anchors every 3 steps, few patches kept */
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 11);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  cr_assert_eq(fig.patches_applied, 2, "anchor 9, then 10 and 11");
  fx_down(&f);
}

/* Removes the objects the head does not name, as the publisher does once
 * their grace period is over. */
static void collect_unnamed(const char *dir) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  char objects[4096];
  snprintf(objects, sizeof objects, "%s/objects", dir);
  DIR *d = opendir(objects);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    char rel[512];
    snprintf(rel, sizeof rel, "objects/%s", e->d_name);
    int named = e->d_name[0] == '.';
    for (size_t i = 0; i < pulse_store_head_patch_count(h) && !named; i++)
      named = strcmp(pulse_store_head_patch(h, i)->path, rel) == 0;
    for (size_t i = 0; i < pulse_store_head_anchor_count(h) && !named; i++)
      named = strcmp(pulse_store_head_anchor(h, i)->path, rel) == 0;
    if (!named)
      unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
  pulse_store_head_free(h);
}

/* A worker at step 2 of a trainer at step 12 that retains 2 patches. */
static void fall_behind_retention(fx *f) {
  fx_up(f, 3, 2, 2);
  pulse_sub_opts o = it_sub_opts(&f->t, f->cache, f->urls);
  fx_sub(f, &o);
  cr_assert_eq(pulse_sub_sync(f->sub), PULSE_OK);
  expect_at(f, 2);
  it_trainer_run(&f->t, 3, 12, 0.01); /* step 2 is no longer retained */
}

/* Behind what the head retains: while the store still holds the objects
 * earlier heads named, the server squashes a catch-up from the worker's
 * step (fewer bytes than an anchor); once they are collected, an anchor. */
Test(inference_side, worker_behind_retention_catches_up_while_objects_last) {
  fx f;
  fall_behind_retention(&f);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 12);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_eq(fig.anchors_applied, 1, "only the first sync's anchor");
  fx_down(&f);
}

Test(inference_side, worker_behind_retention_takes_an_anchor_once_objects_go) {
  fx f;
  fall_behind_retention(&f);
  collect_unnamed(f.t.dir);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 12);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  fx_down(&f);
}

Test(inference_side, wrong_base_is_never_applied_and_leads_to_an_anchor) {
  fx f;
  fx_up(&f, 100, 32, 5);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  o.use_catchup = 0;
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  /* The buffers hold step 3 but the worker claims step 2. */
  for (int i = 0; i < TU_TENSORS; i++) {
    f.tg.data[i] = tu_alloc(f.t.m.numel[i] * 2);
    memcpy(f.tg.data[i], f.t.bits[3][i], f.t.m.numel[i] * 2);
    cr_assert_eq(pulse_sub_attach_host(f.sub, f.t.m.info[i].name,
                                       f.t.m.info[i].ndim, f.t.m.info[i].shape,
                                       f.tg.data[i]),
                 PULSE_OK);
  }
  cr_assert_eq(pulse_sub_assume_step(f.sub, 2), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 5);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR);
  cr_assert_geq(fig.rejected, 1, "the wrong base was refused");
  cr_assert_eq(fig.patches_applied, 5,
               "anchor 0, then 1..5: the patch 2->3 never went onto step 3");
  fx_down(&f);
}

Test(inference_side, right_claim_resumes_without_an_anchor) {
  fx f;
  fx_up(&f, 100, 32, 5);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  o.use_catchup = 0;
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  for (int i = 0; i < TU_TENSORS; i++) {
    f.tg.data[i] = tu_alloc(f.t.m.numel[i] * 2);
    memcpy(f.tg.data[i], f.t.bits[3][i], f.t.m.numel[i] * 2);
    cr_assert_eq(pulse_sub_attach_host(f.sub, f.t.m.info[i].name,
                                       f.t.m.info[i].ndim, f.t.m.info[i].shape,
                                       f.tg.data[i]),
                 PULSE_OK);
  }
  cr_assert_eq(pulse_sub_assume_step(f.sub, 3), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  expect_at(&f, 5);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN);
  cr_assert_eq(fig.anchors_applied, 0);
  /* A claim of the head's own step is checked against the head too. */
  pulse_sub_free(f.sub);
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  for (int i = 0; i < TU_TENSORS; i++)
    cr_assert_eq(pulse_sub_attach_host(f.sub, f.t.m.info[i].name,
                                       f.t.m.info[i].ndim, f.t.m.info[i].shape,
                                       f.tg.data[i]),
                 PULSE_OK);
  cr_assert_eq(pulse_sub_assume_step(f.sub, 5), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_NONE);
  cr_assert_eq(fig.anchors_applied, 0);
  expect_at(&f, 5);
  fx_down(&f);
}

Test(inference_side, a_shard_of_the_table_is_kept_current) {
  fx f;
  fx_up(&f, 100, 32, 3);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  f.tg.data[1] = tu_alloc(f.t.m.numel[1] * 2);
  cr_assert_eq(pulse_sub_attach_host(f.sub, f.t.m.info[1].name,
                                     f.t.m.info[1].ndim, f.t.m.info[1].shape,
                                     f.tg.data[1]),
               PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  it_trainer_run(&f.t, 4, 6, 0.01);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  cr_assert_eq(pulse_sub_step(f.sub), 6);
  cr_assert(memcmp(f.tg.data[1], f.t.bits[6][1], f.t.m.numel[1] * 2) == 0);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_str_eq(fig.state_digest, "",
                   "a shard has no state digest of its own");
  fx_down(&f);
}

Test(inference_side, a_target_of_another_shape_is_refused_and_untouched) {
  fx f;
  fx_up(&f, 100, 32, 2);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  uint64_t shape[2] = {f.t.m.info[0].shape[1],
                       f.t.m.info[0].shape[0]}; /* transposed */
  f.tg.data[0] = tu_alloc(f.t.m.numel[0] * 2);
  memset(f.tg.data[0], 0x11, f.t.m.numel[0] * 2);
  cr_assert_eq(
      pulse_sub_attach_host(f.sub, f.t.m.info[0].name, 2, shape, f.tg.data[0]),
      PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_ERR_SIZE_MISMATCH);
  cr_assert(strstr(pulse_sub_error(f.sub), "shape") != NULL, "%s",
            pulse_sub_error(f.sub));
  for (uint64_t k = 0; k < f.t.m.numel[0]; k++)
    cr_assert_eq(f.tg.data[0][k], 0x1111);
  cr_assert_eq(pulse_sub_step(f.sub), PULSE_SUB_NO_STEP);
  /* An unknown name likewise. */
  pulse_sub_free(f.sub);
  cr_assert_eq(pulse_sub_create(&o, &f.sub), PULSE_OK);
  uint64_t one = 4;
  cr_assert_eq(
      pulse_sub_attach_host(f.sub, "no.such.tensor", 1, &one, f.tg.data[0]),
      PULSE_OK);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_ERR_NOT_FOUND);
  fx_down(&f);
}

Test(inference_side, head_signed_by_another_key_is_refused) {
  fx f;
  fx_up(&f, 100, 32, 2);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  uint8_t other[32];
  memcpy(other, f.t.pub, 32);
  other[0] ^= 1;
  o.public_key = other;
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_sub_error(f.sub), "signed by") != NULL, "%s",
            pulse_sub_error(f.sub));
  cr_assert_eq(pulse_sub_step(f.sub), PULSE_SUB_NO_STEP);
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.sub, &fig);
  cr_assert_geq(fig.rejected, 1);
  cr_assert_eq(fig.objects_fetched, 0,
               "nothing downloaded on a head that does not verify");
  fx_down(&f);
}

Test(inference_side, key_is_trusted_on_first_use_and_then_required) {
  fx f;
  fx_up(&f, 100, 32, 2);
  pulse_sub_opts o = it_sub_opts(&f.t, f.cache, f.urls);
  o.public_key = NULL;
  o.trust_first_use = 1; /* never the default (key_is_required_...) */
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_OK, "%s", pulse_sub_error(f.sub));
  char path[4096], hex[65];
  snprintf(path, sizeof path, "%s/trusted-key", f.cache);
  size_t n = 0;
  uint8_t *kept = tu_read(path, &n);
  cr_assert_not_null(kept);
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", f.t.pub[i]);
  cr_assert(n >= 64 && memcmp(kept, hex, 64) == 0);
  free(kept);
  /* Another publisher behind the same URL later: refused. */
  pulse_sub_free(f.sub);
  it_targets_free(&f.tg);
  it_trainer t2;
  it_trainer_up(&t2, 100, 32, 2);
  it_trainer_run(&t2, 0, 9, 0.01);
  f.urls[0] = t2.url;
  fx_sub(&f, &o);
  cr_assert_eq(pulse_sub_sync(f.sub), PULSE_ERR_CORRUPT);
  it_trainer_down(&t2);
  fx_down(&f);
}

Test(inference_side, options_are_checked) {
  pulse_sub *sub = NULL;
  const char *bad[] = {"ftp://example.com"};
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  o.urls = bad;
  o.url_count = 1;
  o.cache_dir = "/tmp";
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  const char *good[] = {"http://127.0.0.1:1"};
  uint8_t key[32] = {0};
  o.urls = good;
  o.public_key = key;
  o.allow_unsigned = 1;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  cr_assert_null(sub);
  /* Options of any other version (an older caller's shorter struct) are
   * refused, naming both versions, with no read past the version field
   * (ASan: the allocation ends right after it). */
  char *cache = tu_make_dir();
  uint32_t versions[] = {1, 5, PULSE_SUB_OPTS_VERSION - 1, PULSE_SUB_OPTS_VERSION + 1};
  for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
    uint32_t *old = tu_alloc(sizeof *old);
    *old = versions[i];
    cr_assert_eq(pulse_sub_create((const pulse_sub_opts *)(void *)old, &sub),
                 PULSE_ERR_VERSION, "version %u", versions[i]);
    cr_assert_null(sub);
    cr_assert(strstr(pulse_error_detail(), "this library's are") != NULL, "%s",
              pulse_error_detail());
    free(old);
  }
  pulse_sub_opts full = o;
  full.public_key = key;
  full.allow_unsigned = 0;
  full.cache_dir = cache;
  cr_assert_eq(pulse_sub_create(&full, &sub), PULSE_OK, "%s", pulse_error_detail());
  pulse_sub_free(sub);
  sub = NULL;
  tu_rm_rf(cache);
  uint8_t k[32];
  cr_assert_eq(pulse_sub_key_from_hex("12", k), PULSE_ERR_ARG);
  cr_assert_eq(pulse_sub_key_from_hex("000102030405060708090a0b0c0d0e0f"
                                      "101112131415161718191a1b1c1d1e1f",
                                      k),
               PULSE_OK);
  cr_assert_eq(k[31], 0x1f);
  cr_assert_str_eq(pulse_sub_route_name(PULSE_SUB_ROUTE_CATCHUP), "catchup");
}

/* Pinned trust by default (issue 15): no key is refused at create, with a
 * message that says what to give, unless trust on first use is asked for
 * or unsigned heads are allowed. */
Test(inference_side, key_is_required_unless_trust_on_first_use_is_asked) {
  char *cache = tu_make_dir();
  const char *urls[] = {"http://127.0.0.1:1"};
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  pulse_sub *sub = NULL;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  cr_assert_null(sub);
  cr_assert(strstr(pulse_error_detail(), "no publisher key") != NULL &&
                strstr(pulse_error_detail(), "trust_first_use") != NULL,
            "%s", pulse_error_detail());
  o.trust_first_use = 1;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_sub_free(sub);
  sub = NULL;
  uint8_t key[32] = {1};
  o.public_key = key; /* a pinned key and trust on first use: which? */
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  o.trust_first_use = 0;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  pulse_sub_free(sub);
  sub = NULL;
  /* No key, unsigned heads asked for explicitly (no authenticity). */
  o.public_key = NULL;
  o.allow_unsigned = 1;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s", pulse_error_detail());
  pulse_sub_free(sub);
  sub = NULL;
  tu_rm_rf(cache);
}

Test(inference_side, device_targets_report_what_is_missing) {
  char *cache = tu_make_dir();
  const char *urls[] = {"http://127.0.0.1:1"};
  uint8_t key[32] = {1};
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.public_key = key;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  uint64_t shape[1] = {16};
  pulse_status st = pulse_sub_attach_device(sub, "w", 1, shape,
                                            (uint16_t *)(uintptr_t)0x1000);
  if (pulse_cuda_available())
    cr_assert_eq(st, PULSE_OK);
  else
    cr_assert(st == PULSE_ERR_NOT_BUILT || st == PULSE_ERR_CUDA, "%s",
              pulse_status_name(st));
  /* Host and device targets do not mix; nor does a file with others. */
  uint16_t host[16];
  if (st == PULSE_OK)
    cr_assert_eq(pulse_sub_attach_host(sub, "h", 1, shape, host),
                 PULSE_ERR_ARG);
  cr_assert_eq(pulse_sub_attach_host(sub, "h", 1, shape, host),
               st == PULSE_OK ? PULSE_ERR_ARG : PULSE_OK);
  cr_assert_eq(pulse_sub_attach_file(sub, "/tmp/x.safetensors"), PULSE_ERR_ARG);
  pulse_sub_free(sub);
  tu_rm_rf(cache);
}
