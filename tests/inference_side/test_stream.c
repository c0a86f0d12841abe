/* Streamed apply: patches decoded while they download reach the same state
 * as patches downloaded whole; a partial patch download resumes (also in
 * parallel ranges) and streams from the bytes on disk; garbage in a partial
 * patch is dropped with whatever was decoded from it and the patch is
 * fetched again; a wrong base found in a streamed patch leads to an anchor
 * and nothing is applied. */
#include <inttypes.h>

#include "inf_testutil.h"

/* Writes bytes [from, from + n) of a store object as the partial download
 * `suffix` ("" for the first segment), or 0x42 garbage. */
static void plant(const char *store, const char *cache,
                  const pulse_store_object *o, const char *suffix,
                  uint64_t from, uint64_t n, int garbage) {
  char path[4096], hex[65];
  snprintf(path, sizeof path, "%s/%s", store, o->path);
  size_t size = 0;
  uint8_t *bytes = tu_read(path, &size);
  cr_assert_not_null(bytes);
  cr_assert_leq(from + n, size);
  if (garbage)
    memset(bytes + from, 0x42, n);
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", o->sha256[i]);
  snprintf(path, sizeof path, "%s/objects", cache);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/objects/.%s.part%s", cache, hex, suffix);
  cr_assert_eq(tu_write(path, bytes + from, n), 0);
  free(bytes);
}

/* The head's newest patch. */
static const pulse_store_object *last_patch(const char *store,
                                            pulse_store_head **h) {
  cr_assert_eq(pulse_store_head_load(store, h), PULSE_OK);
  size_t n = pulse_store_head_patch_count(*h);
  cr_assert_gt(n, 0);
  return pulse_store_head_patch(*h, n - 1);
}

/* A subscriber with host targets synced to the trainer's head. */
static pulse_sub *synced(const it_trainer *t, const char *cache,
                         const char **urls, pulse_sub_opts *o, it_targets *tg) {
  *o = it_sub_opts(t, cache, urls);
  o->use_catchup = 0;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(o, &sub), PULSE_OK);
  it_targets_attach(tg, t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(tg, t, t->step));
  return sub;
}

Test(inference_side, streamed_and_whole_patches_reach_the_same_state) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 20);
  it_trainer_run(&t, 0, 5, 0.02);
  for (int whole = 0; whole < 2; whole++)
    for (int threads = 1; threads <= 3; threads += 2) {
      char *cache = tu_make_dir();
      const char *urls[1];
      pulse_sub_opts o = it_sub_opts(&t, cache, urls);
      o.use_catchup = 0;
      o.no_streaming = whole;
      o.threads = threads;
      pulse_sub *sub;
      it_targets tg;
      cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
      it_targets_attach(&tg, &t, sub);
      cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
      cr_assert(it_targets_equal(&tg, &t, 5), "whole %d threads %d", whole,
                threads);
      pulse_sub_figures f;
      pulse_sub_figures_get(sub, &f);
      cr_assert_eq(f.patches_applied, 5);
      cr_assert_eq(f.anchors_applied, 1);
      cr_assert_geq(f.last_decode_overlap_s, 0.0);
      if (whole)
        cr_assert_eq(f.last_decode_overlap_s, 0.0,
                     "nothing overlaps without streaming");
      cr_assert_str_eq(f.state_digest, t.digest[5]);
      /* Patches already in the cache are applied from it. */
      pulse_sub_free(sub);
      it_targets_free(&tg);
      cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
      it_targets_attach(&tg, &t, sub);
      cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
      cr_assert(it_targets_equal(&tg, &t, 5));
      pulse_sub_figures_get(sub, &f);
      cr_assert_eq(f.objects_fetched, 0, "everything came from the cache");
      pulse_sub_free(sub);
      it_targets_free(&tg);
      tu_rm_rf(cache);
    }
  it_trainer_down(&t);
}

/* Host targets keep class indexes between patches (built once, kept by
 * every commit, rebuilt after an anchor rewrote the weights); with or
 * without them, streamed or whole, every step is bit-identical. */
Test(inference_side, class_indexes_are_kept_across_patches_and_anchors) {
  for (int no_index = 0; no_index < 2; no_index++)
    for (int whole = 0; whole < 2; whole++) {
      it_trainer t;
      it_trainer_up(&t, 3, 2, 20); /* anchors every 3 steps, 2 patches kept */
      it_trainer_run(&t, 0, 2, 0.02);
      char *cache = tu_make_dir();
      const char *urls[1];
      pulse_sub_opts o = it_sub_opts(&t, cache, urls);
      o.use_catchup = 0;
      o.no_streaming = whole;
      o.class_index = no_index ? PULSE_SUB_CLASS_INDEX_OFF : PULSE_SUB_CLASS_INDEX_ON;
      pulse_sub *sub;
      it_targets tg;
      cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
      for (int i = 0; i < TU_TENSORS; i++) { /* the worker holds step 0 */
        tg.data[i] = tu_alloc(t.m.numel[i] * 2);
        memcpy(tg.data[i], t.bits[0][i], t.m.numel[i] * 2);
      }
      it_targets_resume(&tg, &t, sub, 0);
      cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
      cr_assert(it_targets_equal(&tg, &t, t.step), "no_index %d whole %d", no_index, whole);
      pulse_sub_figures f;
      pulse_sub_figures_get(sub, &f);
      cr_assert_eq(f.patches_applied, t.step);
      cr_assert_eq(f.anchors_applied, 0);
      uint64_t builds = no_index ? 0 : TU_TENSORS;
      cr_assert_eq(f.class_index_builds, builds, "one build per tensor, kept by the commits");
      cr_assert_eq(f.class_index_bytes > 0, !no_index);
      /* Past the retained patches: an anchor rewrites the weights, and the
       * next patch rebuilds the indexes (the old ones no longer match). */
      uint64_t from = t.step + 1;
      it_trainer_run(&t, from, from + 6, 0.02);
      cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
      cr_assert(it_targets_equal(&tg, &t, t.step));
      pulse_sub_figures_get(sub, &f);
      cr_assert_eq(f.anchors_applied, 1);
      it_trainer_run(&t, t.step + 1, t.step + 2, 0.02);
      cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
      cr_assert(it_targets_equal(&tg, &t, t.step));
      pulse_sub_figures_get(sub, &f);
      cr_assert_eq(f.class_index_builds, 2 * builds, "rebuilt once after the anchor");
      pulse_sub_free(sub);
      it_targets_free(&tg);
      tu_rm_rf(cache);
      it_trainer_down(&t);
    }
}

Test(inference_side, a_partial_patch_download_resumes_and_streams) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 40);
  it_trainer_run(&t, 0, 1, 0.05);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o;
  it_targets tg;
  pulse_sub *sub = synced(&t, cache, urls, &o, &tg);
  it_trainer_run(&t, 2, 2, 0.05);
  pulse_store_head *h;
  const pulse_store_object *p = last_patch(t.dir, &h);
  uint64_t part = p->size * 2 / 3;
  plant(t.dir, cache, p, "", 0, part, 0);
  pulse_sub_figures before, f;
  pulse_sub_figures_get(sub, &before);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 2));
  pulse_sub_figures_get(sub, &f);
  cr_assert_eq(f.bytes_resumed - before.bytes_resumed, part);
  cr_assert_lt(f.last_bytes, p->size,
               "%" PRIu64 " bytes downloaded for a %" PRIu64 "-byte patch",
               f.last_bytes, p->size);
  cr_assert_eq(f.rejected, before.rejected);
  pulse_store_head_free(h);

  /* Garbage on disk: the object does not verify, what was decoded from it
   * is dropped, and the patch is fetched and streamed again. */
  it_trainer_run(&t, 3, 3, 0.05);
  p = last_patch(t.dir, &h);
  plant(t.dir, cache, p, "", p->size / 4, p->size / 2, 1);
  pulse_sub_figures_get(sub, &before);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 3));
  pulse_sub_figures_get(sub, &f);
  cr_assert_eq(f.rejected - before.rejected, 1,
               "the bad partial file, then a clean download");
  cr_assert_eq(f.step, 3);
  pulse_store_head_free(h);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, a_large_patch_streams_from_parallel_ranges_that_resume) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 800); /* 5.6 M parameters */
  it_trainer_run(&t, 0, 0, 0.0);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o;
  it_targets tg;
  pulse_sub *sub = synced(&t, cache, urls, &o, &tg);
  pulse_sub_free(sub);
  it_trainer_run(&t, 1, 1, 0.7);
  pulse_store_head *h;
  const pulse_store_object *p = last_patch(t.dir, &h);
  cr_assert_gt(p->size, (uint64_t)3 << 19, "a patch of %" PRIu64 " bytes",
               p->size);
  /* Segments of 1 MiB: the first and the second partly on disk. */
  plant(t.dir, cache, p, "", 0, 200000, 0);
  plant(t.dir, cache, p, "-1048576", 1 << 20, 300000, 0);
  o.parallel = 4;
  o.parallel_min_bytes = 1 << 20;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_resume(&tg, &t, sub, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  cr_assert_eq(f.bytes_resumed, 500000);
  cr_assert_eq(f.patches_applied, 1);
  cr_assert_eq(f.rejected, 0);
  pulse_store_head_free(h);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, a_wrong_base_found_while_streaming_leads_to_an_anchor) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 20);
  it_trainer_run(&t, 0, 2, 0.02);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.use_catchup = 0;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  /* Step 0's weights with one element off, claimed to be step 0. */
  for (int i = 0; i < TU_TENSORS; i++)
    memcpy(tg.data[i], t.bits[0][i], t.m.numel[i] * 2);
  tg.data[1][5] ^= 1;
  pulse_sub_free(sub);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_resume(&tg, &t, sub, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 2));
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  cr_assert_eq(f.anchors_applied, 1,
               "the streamed patch was refused: an anchor");
  cr_assert_geq(f.rejected, 1);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}
