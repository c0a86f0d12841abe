/* sub_index.c - the targets' class indexes: whether to keep them (decided
 * per step, opts.class_index and opts.memory_budget_bytes) and building
 * them in the background between steps.
 *
 * What an index buys and costs, measured on this project's 2-core machine
 * (staged decode + apply of class-model patches with the kept digests,
 * 2 threads, 64 tensors of N(0, 0.02) weights, changes at random
 * positions; medians of 3 steps, the machine shared and loaded):
 *
 *   params  changed  by the pass  through the index  index/pass
 *   20 M    0.3%       47.8 ms        7.1 ms          0.15
 *   20 M    1%         60.2 ms       17.4 ms          0.29
 *   20 M    3%         88.0 ms       49.5 ms          0.56
 *   50 M    5%        313.5 ms      182.8 ms          0.58
 *   50 M    10%       354.7 ms      236.6 ms          0.67
 *   250 M   1%        689.7 ms      225.4 ms          0.33
 *   250 M   6%        933.2 ms      554.0 ms          0.59
 *   250 M   12%      2006.5 ms     1680.0 ms          0.84
 *   1 B     1%        955.5 ms      291.9 ms          0.31
 *   1 B     3%       2381.8 ms     1789.0 ms          0.75
 *
 * So once built, an index is faster at every size and density measured
 * (the pass reads every base element of a changed chunk; the index finds
 * each change in a few loads), and its gain shrinks as patches get denser.
 * What it costs: 2.13 bytes per parameter, more than the weights' own 2
 * (a 1 B model's worker needs another 2 GiB), and a build that reads the
 * whole model, 4-7 ns per parameter on one thread (4.4 s at 1 B params):
 * at 1% density six to seven steps' gain, at 3% about ten, at 12% above
 * ten. (`pulse-bench codec --params 1e8 --apply-threads 0` shows the same
 * on an AdamW trajectory: 4% changed, 32.8 M changes/s by the pass, 63.5
 * through the index, built in 0.4 s.) Where python/bench.py once found the
 * index slower at 1 B params (822 vs 587 ms a step, an idle machine), its
 * steps waited for the build: on this machine, loaded, one run of the same
 * bench gave 1424 ms a step with ON (waits), 1208 ms with AUTO and room
 * (never waits) and 3118 ms without an index (medians of 8 steps).
 * Both paths got faster since the table (the pass takes windows of 4096
 * elements, chunk_locate.c; the index decodes and locates in one pass,
 * chunk_fast.c), and the index stays ahead: python/bench.py, a worker's
 * CPU per pull (medians of 8), 250 M at 2%: 196 ms by the pass, 135 ms
 * through the index (1.45x); 1 B at 1%: 610 and 323 ms (1.89x). The pass
 * reads every base element of a changed chunk at memory speed, and an
 * index small enough for the memory bound (<= 0.1 byte a parameter) would
 * still read most of the base at these densities (about half of all
 * 64-element blocks hold a change at 1%): speed and the bound conflict,
 * and the budget decides.
 *
 * Hence the rule of PULSE_SUB_CLASS_INDEX_AUTO, per step, before a patch
 * is decoded:
 *   - memory first: the indexes of every host or file target must fit
 *     opts.memory_budget_bytes (default a tenth of the targets' bytes, so
 *     by default they never do: a worker stays within its model's bytes
 *     + 10% + the patch);
 *   - then density: a build starts only after a patch that changed at most
 *     SUB_INDEX_DENSITY_MAX of the weights (its gain falls under 40% above
 *     that and the build takes ten steps or more to pay back); indexes
 *     already built are used for denser patches too (still faster, and kept
 *     current by the commit);
 *   - a step never waits for a build: it stops it (the tensors indexed so
 *     far keep their indexes, the others decode by the pass) and the build
 *     goes on after the commit. So a worker whose steps come faster than a
 *     build is never slower than without an index.
 * PULSE_SUB_CLASS_INDEX_ON keeps indexes whatever they cost (a step waits
 * for a build that runs); OFF never keeps any. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "class_index_impl.h"
#include "parallel_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "sub_impl.h"

/* Densest patch after which AUTO starts a build (see above). */
#define SUB_INDEX_DENSITY_MAX 0.05

/* Bytes of a class index of n elements: pulse_class_index_bytes of the
 * index that would be built (class_index.c). */
static uint64_t index_bytes_of(uint64_t n) {
  uint64_t blocks = (n + PULSE_CLASS_BLOCK - 1) >> PULSE_CLASS_BLOCK_LOG2;
  return sizeof(pulse_class_index) + n * sizeof(uint16_t) +
         blocks * PULSE_CLASS_RUNS * sizeof(uint16_t);
}

static int index_current(const sub_target *t) {
  pulse_tensor_digest have = pulse_class_index_digest(t->index);
  return t->index != NULL && have.a == t->digest.a && have.b == t->digest.b;
}

/* Half the cores (at least one): the other half stays with the download
 * of the next step and the file target's write. */
static int index_threads(const pulse_sub *sub) {
  int n = sub->opts.threads > 0 ? sub->opts.threads : pulse_cpu_count();
  return n > 1 ? n / 2 : 1;
}

static uint64_t held_bytes(const pulse_sub *sub) {
  uint64_t bytes = 0;
  for (size_t i = 0; i < sub->ntargets; i++)
    bytes += pulse_class_index_bytes(sub->targets[i].index);
  return bytes;
}

/* The targets' data, table and digests do not change while this runs:
 * every writer stops or waits for it first (sub_impl.h). */
static void *indexer_main(void *arg) {
  pulse_sub *sub = arg;
  uint64_t built = 0;
  for (size_t i = 0; i < sub->ntargets && !atomic_load(&sub->indexer_stop); i++) {
    sub_target *t = &sub->targets[i];
    if (t->data == NULL || index_current(t)) /* NULL data: an empty tensor */
      continue;
    pulse_class_index_free(t->index); /* stale: its memory goes first */
    t->index = NULL;
    pulse_class_index *ix = NULL;
    pulse_status st = pulse_class_index_build_until(t->data, t->numel, index_threads(sub),
                                                    &sub->indexer_stop, &ix);
    if (st != PULSE_OK) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "subscriber: no class index for '%s' (%s): its patches decode by a "
                   "pass over the weights",
                   t->name, pulse_status_str(st));
      continue;
    }
    if (ix == NULL)
      break; /* stopped */
    /* The build digests what it indexed: an index is only kept for the
     * weights the kept digest describes. */
    t->index = ix;
    if (!index_current(t)) {
      PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: '%s' is not what its digest says: no class index",
                   t->name);
      pulse_class_index_free(t->index);
      t->index = NULL;
      continue;
    }
    built++;
  }
  uint64_t bytes = held_bytes(sub);
  pthread_mutex_lock(&sub->fig_lock);
  sub->fig.class_index_builds += built;
  sub->fig.class_index_bytes = bytes;
  pthread_mutex_unlock(&sub->fig_lock);
  return NULL;
}

static void index_join(pulse_sub *sub, int stop) {
  if (!sub->indexer_running)
    return;
  if (stop)
    atomic_store(&sub->indexer_stop, 1);
  pthread_join(sub->indexer, NULL);
  sub->indexer_running = 0;
  atomic_store(&sub->indexer_stop, 0);
}

void sub_index_stop(pulse_sub *sub) { index_join(sub, 1); }

void sub_index_start(pulse_sub *sub) {
  if (sub->indexer_running || !sub->index_wanted ||
      (sub->mem != SUB_MEM_HOST && sub->mem != SUB_MEM_FILE))
    return;
  size_t missing = 0;
  for (size_t i = 0; i < sub->ntargets; i++)
    missing += sub->targets[i].data != NULL && !index_current(&sub->targets[i]);
  if (missing == 0)
    return;
  atomic_store(&sub->indexer_stop, 0);
  /* Not started: the patches decode by the pass, as without indexes. */
  sub->indexer_running = pthread_create(&sub->indexer, NULL, indexer_main, sub) == 0;
}

void sub_index_wait(pulse_sub *sub) {
  double t0 = sub_now();
  /* ON finishes the build first; otherwise the step goes first, and the
   * tensors indexed so far keep their indexes. */
  index_join(sub, sub->opts.class_index != PULSE_SUB_CLASS_INDEX_ON);
  sub->t_decode += sub_now() - t0;
}

/* Frees every index (a build is stopped already). */
static void index_drop(pulse_sub *sub) {
  for (size_t i = 0; i < sub->ntargets; i++) {
    pulse_class_index_free(sub->targets[i].index);
    sub->targets[i].index = NULL;
  }
}

/* The rule (see the top of this file): whether the targets keep indexes
 * from patch p on, and why, into why[cap]. Drops the indexes that are not
 * to be kept. */
static int index_decide(pulse_sub *sub, const pulse_patch *p, char *why, size_t cap) {
  pulse_sub_class_index mode = sub->opts.class_index;
  if (mode == PULSE_SUB_CLASS_INDEX_OFF) {
    snprintf(why, cap, "class index off (opts.class_index OFF)");
    return 0;
  }
  /* Only class-model patches whose chunks are whole index blocks use one
   * (the codec's rule): a plain-model publisher never costs the memory. */
  if (pulse_patch_pos_model(p) != PULSE_POS_CLASS || pulse_patch_chunk_log2(p) < 12) {
    snprintf(why, cap, "class index off: %s patches decode without one",
             pulse_patch_pos_model(p) != PULSE_POS_CLASS ? "plain-position" : "small-chunk");
    return 0;
  }
  if (mode == PULSE_SUB_CLASS_INDEX_ON) {
    snprintf(why, cap, "class index on (opts.class_index ON)");
    return 1;
  }
  uint64_t weights = 0, need = 0, numel = 0, changed = 0;
  for (size_t i = 0; i < sub->ntargets; i++) {
    const sub_target *t = &sub->targets[i];
    weights += t->numel * sizeof(uint16_t);
    if (t->data != NULL && t->numel > 0) /* an empty tensor gets none */
      need += index_bytes_of(t->numel);
    size_t at;
    pulse_patch_tensor pt;
    if (pulse_patch_tensor_find(p, t->name, &at) == PULSE_OK &&
        pulse_patch_tensor_get(p, at, &pt) == PULSE_OK)
      numel += pt.numel, changed += pt.changed;
  }
  uint64_t budget = sub->opts.memory_budget_bytes;
  int default_budget = budget == 0;
  if (default_budget)
    budget = weights / 10;
  double density = numel > 0 ? (double)changed / (double)numel : 0.0;
  const double mib = 1.0 / (1 << 20);
  if (need > budget) {
    snprintf(why, cap,
             "class index off: it needs %.1f MiB (2.13 bytes a parameter), above the memory "
             "budget of %.1f MiB%s",
             (double)need * mib, (double)budget * mib,
             default_budget ? " (a tenth of the targets' bytes: opts.memory_budget_bytes)" : "");
    return 0;
  }
  int have = held_bytes(sub) > 0;
  if (density > SUB_INDEX_DENSITY_MAX && !have) {
    snprintf(why, cap,
             "class index off: the patch changed %.2f%% of the weights, above %.0f%%: "
             "its build would not pay back",
             100.0 * density, 100.0 * SUB_INDEX_DENSITY_MAX);
    return 0;
  }
  snprintf(why, cap,
           "class index on: %.1f MiB within the memory budget of %.1f MiB, %.2f%% of the "
           "weights changed%s",
           (double)need * mib, (double)budget * mib, 100.0 * density,
           density > SUB_INDEX_DENSITY_MAX ? " (built already: still faster)" : "");
  return 1;
}

void sub_targets_index(pulse_sub *sub, const pulse_patch *p) {
  sub_index_wait(sub);
  char why[sizeof sub->fig.class_index_why];
  sub->index_wanted = index_decide(sub, p, why, sizeof why);
  if (!sub->index_wanted)
    index_drop(sub);
  uint64_t bytes = held_bytes(sub);
  pthread_mutex_lock(&sub->fig_lock);
  sub->fig.class_index_kept = sub->index_wanted;
  sub->fig.class_index_bytes = bytes;
  snprintf(sub->fig.class_index_why, sizeof sub->fig.class_index_why, "%s", why);
  pthread_mutex_unlock(&sub->fig_lock);
}
