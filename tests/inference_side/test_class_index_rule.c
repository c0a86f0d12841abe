/* The class index rule (opts.class_index, opts.memory_budget_bytes;
 * inference_side/apply/sub_index.c): what a worker keeps, said in its
 * figures and synced events, and never a different result. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "inf_testutil.h"

/* A worker of trainer t holding step 0, syncing each step the test
 * publishes: mode and budget as given. */
typedef struct {
  char *cache;
  const char *urls[1];
  pulse_sub *sub;
  it_targets tg;
  char synced_why[256]; /* the last synced event's detail */
  int synced;
} rule_worker;

static void on_event(void *ctx, const pulse_sub_event *ev) {
  rule_worker *w = ctx;
  if (ev->type == PULSE_SUB_EV_SYNCED) {
    snprintf(w->synced_why, sizeof w->synced_why, "%s", ev->detail ? ev->detail : "(null)");
    w->synced++;
  }
}

static void worker_up(rule_worker *w, const it_trainer *t, pulse_sub_class_index mode,
                      uint64_t budget) {
  memset(w, 0, sizeof *w);
  w->cache = tu_make_dir();
  pulse_sub_opts o = it_sub_opts(t, w->cache, w->urls);
  o.use_catchup = 0;
  o.class_index = mode;
  o.memory_budget_bytes = budget;
  o.on_event = on_event;
  o.on_event_ctx = w;
  cr_assert_eq(pulse_sub_create(&o, &w->sub), PULSE_OK, "%s", pulse_error_detail());
  for (int i = 0; i < TU_TENSORS; i++) {
    w->tg.data[i] = tu_alloc(t->m.numel[i] * 2);
    memcpy(w->tg.data[i], t->bits[0][i], t->m.numel[i] * 2);
  }
  it_targets_resume(&w->tg, t, w->sub, 0);
}

static void worker_down(rule_worker *w) {
  pulse_sub_free(w->sub);
  it_targets_free(&w->tg);
  tu_rm_rf(w->cache);
}

/* Syncs to the trainer's head and checks the targets hold it bit for bit
 * and the synced event said what the figures say. */
static pulse_sub_figures worker_sync(rule_worker *w, const it_trainer *t) {
  cr_assert_eq(pulse_sub_sync(w->sub), PULSE_OK, "%s", pulse_sub_error(w->sub));
  cr_assert(it_targets_equal(&w->tg, t, t->step), "step %llu differs",
            (unsigned long long)t->step);
  pulse_sub_figures f;
  pulse_sub_figures_get(w->sub, &f);
  cr_assert_str_eq(w->synced_why, f.class_index_why, "the synced event says the choice");
  return f;
}

/* Waits (at most 20 s) until the background build has indexed every
 * tensor: `want` builds in all. */
static pulse_sub_figures worker_wait_builds(rule_worker *w, uint64_t want) {
  pulse_sub_figures f;
  for (int i = 0; i < 2000; i++) {
    pulse_sub_figures_get(w->sub, &f);
    if (f.class_index_builds >= want)
      return f;
    nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
  }
  cr_assert_fail("no class index built within 20 s (%llu of %llu)",
                 (unsigned long long)f.class_index_builds, (unsigned long long)want);
  return f;
}

/* With room and a sparse run the worker keeps indexes (built once,
 * between steps, then used and kept by every commit); a worker without
 * them reaches the same bits at every step. */
Test(inference_side, class_index_auto_with_room_keeps_it_for_a_sparse_run) {
  it_trainer t;
  it_trainer_up(&t, 100, 10, 20);
  it_trainer_run(&t, 0, 0, 0);
  rule_worker with, without;
  worker_up(&with, &t, PULSE_SUB_CLASS_INDEX_AUTO, UINT64_MAX);
  worker_up(&without, &t, PULSE_SUB_CLASS_INDEX_OFF, 0);
  for (uint64_t s = 1; s <= 4; s++) {
    it_trainer_run(&t, s, s, 0.01);
    pulse_sub_figures f = worker_sync(&with, &t);
    cr_assert_eq(f.class_index_kept, 1, "%s", f.class_index_why);
    cr_assert(strncmp(f.class_index_why, "class index on:", 15) == 0, "%s", f.class_index_why);
    if (s == 1) /* built after the first patch, which decoded by the pass */
      f = worker_wait_builds(&with, TU_TENSORS);
    cr_assert_gt(f.class_index_bytes, 0);
    cr_assert_eq(f.class_index_builds, TU_TENSORS, "built once, kept by the commits");
    pulse_sub_figures g = worker_sync(&without, &t);
    cr_assert_eq(g.class_index_kept, 0);
    cr_assert_eq(g.class_index_bytes, 0);
    cr_assert_str_eq(g.class_index_why, "class index off (opts.class_index OFF)");
  }
  worker_down(&with);
  worker_down(&without);
  it_trainer_down(&t);
}

/* Patches that change a quarter of the weights: with all the room in the
 * world the worker builds no index (its build would not pay back), and
 * reaches the same bits. */
Test(inference_side, class_index_auto_leaves_it_out_for_dense_patches) {
  it_trainer t;
  it_trainer_up(&t, 100, 10, 20);
  it_trainer_run(&t, 0, 0, 0);
  rule_worker w;
  worker_up(&w, &t, PULSE_SUB_CLASS_INDEX_AUTO, UINT64_MAX);
  for (uint64_t s = 1; s <= 3; s++) {
    it_trainer_run(&t, s, s, 0.3);
    pulse_sub_figures f = worker_sync(&w, &t);
    cr_assert_eq(f.class_index_kept, 0, "%s", f.class_index_why);
    cr_assert(strstr(f.class_index_why, "above 5%") != NULL, "%s", f.class_index_why);
    nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL); /* a build would run now */
    pulse_sub_figures_get(w.sub, &f);
    cr_assert_eq(f.class_index_builds, 0);
    cr_assert_eq(f.class_index_bytes, 0);
  }
  worker_down(&w);
  it_trainer_down(&t);
}

/* The memory budget decides first: the default (a tenth of the targets'
 * bytes) and a budget one byte short of the index keep it off; a budget of
 * exactly the index's bytes keeps it. */
Test(inference_side, class_index_auto_keeps_it_within_the_memory_budget) {
  it_trainer t;
  it_trainer_up(&t, 100, 10, 20);
  it_trainer_run(&t, 0, 0, 0);
  /* The index's bytes: what a worker that keeps it holds. */
  rule_worker on;
  worker_up(&on, &t, PULSE_SUB_CLASS_INDEX_ON, 1); /* ON ignores the budget */
  it_trainer_run(&t, 1, 1, 0.01);
  worker_sync(&on, &t);
  uint64_t need = worker_wait_builds(&on, TU_TENSORS).class_index_bytes;
  cr_assert_gt(need, 2 * 138000, "about 2.13 bytes an element");
  uint64_t budgets[3] = {0, need - 1, need};
  for (int b = 0; b < 3; b++) {
    rule_worker w;
    worker_up(&w, &t, PULSE_SUB_CLASS_INDEX_AUTO, budgets[b]);
    it_trainer_run(&t, t.step + 1, t.step + 1, 0.01);
    pulse_sub_figures f = worker_sync(&w, &t);
    cr_assert_eq(f.class_index_kept, b == 2, "budget %llu: %s", (unsigned long long)budgets[b],
                 f.class_index_why);
    if (b == 0)
      cr_assert(strstr(f.class_index_why, "a tenth of the targets' bytes") != NULL, "%s",
                f.class_index_why);
    if (b == 1)
      cr_assert(strstr(f.class_index_why, "memory budget") != NULL, "%s", f.class_index_why);
    if (b == 2)
      cr_assert_eq(worker_wait_builds(&w, TU_TENSORS).class_index_bytes, need);
    it_trainer_run(&t, t.step + 1, t.step + 1, 0.01); /* one more, through it or not */
    f = worker_sync(&w, &t);
    cr_assert_eq(f.class_index_bytes > 0, b == 2);
    worker_sync(&on, &t);
    worker_down(&w);
  }
  worker_down(&on);
  it_trainer_down(&t);
}

Test(inference_side, class_index_mode_out_of_range_is_refused) {
  char *cache = tu_make_dir();
  const char *urls[1] = {"http://127.0.0.1:9"};
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  cr_assert_eq(o.class_index, PULSE_SUB_CLASS_INDEX_AUTO, "the default");
  cr_assert_eq(o.memory_budget_bytes, 0, "the default: a tenth of the targets' bytes");
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.allow_unsigned = 1;
  o.class_index = (pulse_sub_class_index)3;
  pulse_sub *sub = NULL;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);
  cr_assert_null(sub);
  cr_assert(strstr(pulse_error_detail(), "class_index") != NULL, "%s", pulse_error_detail());
  tu_rm_rf(cache);
}
