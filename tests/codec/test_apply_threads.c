/* test_apply_threads.c - decode and apply on several threads (chunks decoded
 * in parallel, the commit's writes and index moves split by chunk) give
 * exactly what one thread gives: the same weights bit for bit, staged or
 * streamed, with or without a class index, for every coding; a hostile
 * patch fails the same way on any number of threads and leaves the weights
 * and the index as they were. The tables hold more than the 65536 changes
 * from which a commit writes on several threads. The threads are a pool
 * kept for the process: a forked child and two applies at once work too. */
#include "patch_testutil.h"
#include "parallel_impl.h"
#include "pulse_codec_stream.h"

#include <stdatomic.h>

#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <criterion/criterion.h>

enum { CODINGS = 6, TENSORS = 3 };
static const struct {
  unsigned version;
  pulse_pos_model model;
  const char *name;
} codings[CODINGS] = {
    {2, PULSE_POS_CLASS, "v2 class"}, {2, PULSE_POS_PLAIN, "v2 plain"},
    {1, PULSE_POS_CLASS, "v1 class"}, {1, PULSE_POS_PLAIN, "v1 plain"},
    {3, PULSE_POS_CLASS, "v3 class"}, {3, PULSE_POS_PLAIN, "v3 plain"}};

/* Three tensors: a large one at high density (most of the changes, many
 * chunks), a small one, and one without changes. */
static void make_table(pt_tensor *ts, uint64_t seed) {
  pt_tensor_make1(&ts[0], "layers.0.w", 300000, PT_WEIGHTS_NORMAL, 0.3, 1, seed);
  pt_tensor_make1(&ts[1], "layers.0.b", 5000, PT_WEIGHTS_NORMAL, 0.05, 1, seed + 1);
  pt_tensor_make1(&ts[2], "norm", 4096, PT_WEIGHTS_NORMAL, 0.0, 0, seed + 2);
}

/* Applies buf to copies of the bases in w (allocated here) on `threads`
 * threads; ix: build class indexes first (returned in ix, else NULL). */
static pulse_status apply_copy(const pulse_buffer *buf, const pt_tensor *ts, int threads,
                               int streamed, int indexed, uint16_t **w, pulse_class_index **ix) {
  pulse_host_tensor h[TENSORS];
  for (size_t i = 0; i < TENSORS; i++) {
    w[i] = pt_copy(ts[i].base, ts[i].numel);
    h[i] = (pulse_host_tensor){ts[i].name, w[i], ts[i].numel, NULL};
    ix[i] = NULL;
    if (indexed)
      cr_assert_eq(pulse_class_index_build(w[i], ts[i].numel, threads, &ix[i]), PULSE_OK);
  }
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(buf->data, buf->size, &p);
  if (st != PULSE_OK)
    return st;
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = threads;
  ao.class_index = indexed ? ix : NULL;
  if (!streamed) {
    st = pulse_patch_apply(p, h, TENSORS, &ao);
  } else {
    pulse_patch_stream *s = NULL;
    st = pulse_patch_stream_begin(p, h, TENSORS, &ao, &s);
    /* The bytes in a few pieces, as a download gives them. */
    for (size_t at = 0; st == PULSE_OK && at < buf->size; at += buf->size / 5 + 1)
      pulse_patch_stream_feed(s, at);
    if (st == PULSE_OK) {
      pulse_patch_stream_feed(s, buf->size);
      st = pulse_patch_stream_finish(s);
    }
    if (st == PULSE_OK)
      pulse_patch_stream_commit(s);
    pulse_patch_stream_free(s);
  }
  pulse_patch_free(p);
  return st;
}

static void free_copy(uint16_t **w, pulse_class_index **ix) {
  for (size_t i = 0; i < TENSORS; i++) {
    free(w[i]);
    pulse_class_index_free(ix[i]);
  }
}

Test(apply_threads, every_thread_count_gives_what_one_thread_gives) {
  static const uint32_t chunk_log2s[] = {12, 16};
  static const int threads[] = {2, 3, 8, 0};
  for (int k = 0; k < CODINGS; k++)
    for (size_t c = 0; c < PT_COUNT_OF(chunk_log2s); c++) {
      pt_tensor ts[TENSORS];
      make_table(ts, 100u + 10u * (uint64_t)k + c);
      cr_assert_gt(ts[0].changes.count + ts[1].changes.count, 65536);
      pulse_encode_opts o = pt_opts(codings[k].model, chunk_log2s[c], 2);
      o.format_version = codings[k].version;
      pulse_buffer buf = {NULL, 0};
      cr_assert_eq(pt_encode(&o, ts, TENSORS, &buf), PULSE_OK);
      uint16_t *ref[TENSORS];
      pulse_class_index *none[TENSORS];
      cr_assert_eq(apply_copy(&buf, ts, 1, 0, 0, ref, none), PULSE_OK, "%s",
                   pulse_error_detail());
      for (size_t i = 0; i < TENSORS; i++)
        cr_assert_eq(pt_first_diff(ts[i].target, ref[i], ts[i].numel), PT_NONE,
                     "%s: one thread reaches the target", codings[k].name);
      for (size_t t = 0; t < PT_COUNT_OF(threads); t++)
        for (int streamed = 0; streamed < 2; streamed++)
          for (int indexed = 0; indexed < 2; indexed++) {
            uint16_t *w[TENSORS];
            pulse_class_index *ix[TENSORS];
            pulse_status st = apply_copy(&buf, ts, threads[t], streamed, indexed, w, ix);
            cr_assert_eq(st, PULSE_OK, "%s chunk 2^%u, %d threads, %s%s: %s", codings[k].name,
                         chunk_log2s[c], threads[t], streamed ? "streamed" : "staged",
                         indexed ? ", indexed" : "", pulse_error_detail());
            for (size_t i = 0; i < TENSORS; i++) {
              cr_assert_eq(pt_first_diff(ref[i], w[i], ts[i].numel), PT_NONE,
                           "%s chunk 2^%u, %d threads, %s%s: '%s' differs from one thread",
                           codings[k].name, chunk_log2s[c], threads[t],
                           streamed ? "streamed" : "staged", indexed ? ", indexed" : "",
                           ts[i].name);
              if (indexed)
                cr_assert_eq(pulse_class_index_check(ix[i], w[i], ts[i].numel), PULSE_OK,
                             "%s, %d threads: the index follows the commit: %s",
                             codings[k].name, threads[t], pulse_error_detail());
            }
            free_copy(w, ix);
          }
      free_copy(ref, none);
      pulse_buffer_free(&buf);
      pt_tensors_free(ts, TENSORS);
    }
}

Test(apply_threads, hostile_bytes_fail_alike_and_leave_weights_and_index_alone) {
  for (int k = 0; k < CODINGS; k++) {
    pt_tensor ts[TENSORS];
    make_table(ts, 700u + (uint64_t)k);
    pulse_encode_opts o = pt_opts(codings[k].model, 12, 2);
    o.format_version = codings[k].version;
    pulse_buffer buf = {NULL, 0};
    cr_assert_eq(pt_encode(&o, ts, TENSORS, &buf), PULSE_OK);
    uint8_t *bad = pt_alloc(buf.size);
    uint64_t s = 9000u + (uint64_t)k;
    size_t failed = 0;
    for (int trial = 0; trial < 24; trial++) {
      memcpy(bad, buf.data, buf.size);
      /* A few bytes anywhere past the fixed header: the table, the streams. */
      int flips = 1 + (int)pulse_rng_below(&s, 4);
      for (int f = 0; f < flips; f++)
        bad[120 + pulse_rng_below(&s, buf.size - 120)] ^= (uint8_t)(1u + pulse_rng_below(&s, 255));
      pulse_buffer hostile = {bad, buf.size};
      uint16_t *one[TENSORS], *many[TENSORS];
      pulse_class_index *ix1[TENSORS], *ixn[TENSORS];
      int streamed = trial & 1, indexed = codings[k].model == PULSE_POS_CLASS && (trial & 2);
      pulse_status a = apply_copy(&hostile, ts, 1, streamed, indexed, one, ix1);
      pulse_status b = apply_copy(&hostile, ts, 4, streamed, indexed, many, ixn);
      cr_assert_eq(a, b, "%s trial %d: %s on one thread, %s on four", codings[k].name, trial,
                   pulse_status_name(a), pulse_status_name(b));
      for (size_t i = 0; i < TENSORS; i++) {
        cr_assert_eq(pt_first_diff(one[i], many[i], ts[i].numel), PT_NONE,
                     "%s trial %d: '%s' differs between one and four threads",
                     codings[k].name, trial, ts[i].name);
        if (b != PULSE_OK)
          cr_assert_eq(pt_first_diff(ts[i].base, many[i], ts[i].numel), PT_NONE,
                       "%s trial %d: '%s' was written by a failed apply", codings[k].name,
                       trial, ts[i].name);
        if (indexed)
          cr_assert_eq(pulse_class_index_check(ixn[i], many[i], ts[i].numel), PULSE_OK,
                       "%s trial %d: index: %s", codings[k].name, trial, pulse_error_detail());
      }
      failed += b != PULSE_OK;
      free_copy(one, ix1);
      free_copy(many, ixn);
    }
    cr_assert_gt(failed, 12, "%s: most corrupted patches fail (%zu of 24)", codings[k].name,
                 failed);
    free(bad);
    pulse_buffer_free(&buf);
    pt_tensors_free(ts, TENSORS);
  }
}

/* The threads come from a pool kept for the process (parallel.c). A child
 * forked after the pool started has none of its threads: its applies must
 * start its own and finish, not wait for threads that are not there. */
Test(apply_threads, a_forked_child_applies_on_threads_of_its_own) {
  pt_tensor ts[TENSORS];
  make_table(ts, 77);
  pulse_encode_opts o = pt_opts(PULSE_POS_CLASS, 14, 2);
  pulse_buffer buf = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, TENSORS, &buf), PULSE_OK);
  uint16_t *w[TENSORS];
  pulse_class_index *ix[TENSORS];
  cr_assert_eq(apply_copy(&buf, ts, 2, 0, 1, w, ix), PULSE_OK, "parent: %s", pulse_error_detail());
  free_copy(w, ix);
  pid_t child = fork();
  cr_assert_geq(child, 0, "fork");
  if (child == 0) {
    alarm(60); /* a hang ends the child with SIGALRM, not the test run */
    int ok = apply_copy(&buf, ts, 2, 0, 1, w, ix) == PULSE_OK;
    for (size_t i = 0; ok && i < TENSORS; i++)
      ok = pt_first_diff(ts[i].target, w[i], ts[i].numel) == PT_NONE;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child's apply on two threads failed or hung (status 0x%x)", status);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, TENSORS);
}

/* Two applies at once in one process (say two tensor-parallel ranks): one
 * has the pool, the other starts threads of its own; both are exact. */
typedef struct {
  const pulse_buffer *buf;
  const pt_tensor *ts;
  pulse_status st;
  uint16_t *w[TENSORS];
  pulse_class_index *ix[TENSORS];
} concurrent_apply;

static void *apply_thread(void *arg) {
  concurrent_apply *c = arg;
  for (int round = 0; round < 8 && c->st == PULSE_OK; round++) {
    if (round > 0)
      free_copy(c->w, c->ix);
    c->st = apply_copy(c->buf, c->ts, 2, round & 1, 1, c->w, c->ix);
  }
  return NULL;
}

Test(apply_threads, concurrent_applies_share_the_pool_and_stay_exact) {
  pt_tensor ts[TENSORS];
  make_table(ts, 78);
  pulse_encode_opts o = pt_opts(PULSE_POS_CLASS, 14, 2);
  pulse_buffer buf = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, TENSORS, &buf), PULSE_OK);
  concurrent_apply c[2] = {{&buf, ts, PULSE_OK, {NULL}, {NULL}}, {&buf, ts, PULSE_OK, {NULL}, {NULL}}};
  pthread_t tid[2];
  for (int t = 0; t < 2; t++)
    cr_assert_eq(pthread_create(&tid[t], NULL, apply_thread, &c[t]), 0);
  for (int t = 0; t < 2; t++) {
    pthread_join(tid[t], NULL);
    cr_assert_eq(c[t].st, PULSE_OK, "apply %d: %s", t, pulse_status_name(c[t].st));
    for (size_t i = 0; i < TENSORS; i++)
      cr_assert_eq(pt_first_diff(ts[i].target, c[t].w[i], ts[i].numel), PT_NONE,
                   "apply %d: '%s'", t, ts[i].name);
    free_copy(c[t].w, c[t].ix);
  }
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, TENSORS);
}

/* The commit's pass over the chunks prefers the thread that decoded each
 * one (parallel_impl.h; where an item runs is a matter of speed, and of
 * timing, so it is not asserted): every item runs exactly once, those of
 * owners that are not among the job's threads (a thread gone, or one that
 * never joins) too. */
typedef struct {
  atomic_int runs[64];
} affine_record;

static void affine_note(void *ctx, size_t i) {
  affine_record *r = ctx;
  atomic_fetch_add(&r->runs[i], 1);
}

Test(apply_threads, an_affine_pass_runs_every_item_once_whoever_owns_it) {
  uintptr_t me = pulse_parallel_self();
  for (int threads = 1; threads <= 4; threads++) {
    affine_record r;
    uintptr_t owner[64];
    for (size_t i = 0; i < 64; i++) {
      atomic_init(&r.runs[i], 0);
      owner[i] = i % 3 == 0 ? me : (uintptr_t)(0x1000 + i); /* the rest: nobody here */
    }
    pulse_parallel_for_affine(threads, 64, owner, affine_note, &r);
    for (size_t i = 0; i < 64; i++) {
      cr_assert_eq(atomic_load(&r.runs[i]), 1, "item %zu ran %d times on %d threads", i,
                   atomic_load(&r.runs[i]), threads);
    }
  }
}
