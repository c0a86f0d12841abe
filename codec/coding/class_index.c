/* class_index.c - a receiver's index of its weights by position class.
 *
 * Class-model patches code each change as a rank among the base elements of
 * its class (docs/formats/patch.md, "Position classes"). Without help a decoder finds positions
 * with a pass over every base element of a changed chunk: at RL densities
 * (1-3%) that pass, not the entropy decode, sets the speed. A receiver that
 * applies patch after patch can keep this index instead: it is derived from
 * the base weights alone (nothing the patches do not already assume) and a
 * commit updates it in O(changes), because few changes alter an exponent. */
#include <stdlib.h>
#include <string.h>

#include "class_index_impl.h"
#include "digest_impl.h"
#include "hugepage_impl.h"
#include "parallel_impl.h"
#include "status_impl.h"

static inline uint16_t *block_runs(const pulse_class_index *ix, uint64_t b) {
  return ix->run + b * PULSE_CLASS_RUNS;
}

static inline uint32_t block_size(const pulse_class_index *ix, uint64_t b) {
  uint64_t left = ix->numel - (b << PULSE_CLASS_BLOCK_LOG2);
  return left < PULSE_CLASS_BLOCK ? (uint32_t)left : PULSE_CLASS_BLOCK;
}

typedef struct {
  pulse_class_index *ix;
  const uint16_t *data;
  pulse_tensor_digest *digest; /* per group: its elements' share */
  const atomic_int *stop;      /* set: leave the remaining groups */
  atomic_int stopped;          /* a group was left */
} build_job;

/* A counting sort of one block's offsets by class. */
static void build_block(void *ctx, size_t b) {
  build_job *job = ctx;
  pulse_class_index *ix = job->ix;
  uint32_t n = block_size(ix, b);
  const uint16_t *bits = job->data + ((uint64_t)b << PULSE_CLASS_BLOCK_LOG2);
  uint16_t *off = ix->offset + ((uint64_t)b << PULSE_CLASS_BLOCK_LOG2);
  uint16_t *run = block_runs(ix, b);
  uint32_t count[PULSE_CLASS_COUNT] = {0};
  for (uint32_t i = 0; i < n; i++)
    count[pulse_bf16_class(bits[i])]++;
  uint32_t at = 0, next[PULSE_CLASS_COUNT];
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    run[c] = (uint16_t)at;
    next[c] = at;
    at += count[c];
  }
  run[PULSE_CLASS_COUNT] = (uint16_t)at; /* the block size: at most 4096 */
  for (uint32_t i = 0; i < n; i++)
    off[next[pulse_bf16_class(bits[i])]++] = (uint16_t)i;
}

/* Blocks per parallel item: enough work to be worth handing out. */
#define BUILD_GROUP 64u

static void build_group(void *ctx, size_t g) {
  build_job *job = ctx;
  if (job->stop != NULL && atomic_load_explicit(job->stop, memory_order_relaxed)) {
    atomic_store_explicit(&job->stopped, 1, memory_order_relaxed);
    return;
  }
  uint64_t from = (uint64_t)g * BUILD_GROUP, to = from + BUILD_GROUP;
  if (to > job->ix->blocks)
    to = job->ix->blocks;
  for (uint64_t b = from; b < to; b++)
    build_block(ctx, (size_t)b);
  /* The group's share of the digest, while its elements are in cache. */
  uint64_t first = from << PULSE_CLASS_BLOCK_LOG2, last = to << PULSE_CLASS_BLOCK_LOG2;
  if (last > job->ix->numel)
    last = job->ix->numel;
  job->digest[g] = pulse_digest_bf16_at(job->data + first, last - first, first);
}

pulse_status pulse_class_index_build(const uint16_t *data, uint64_t numel, int threads,
                                     pulse_class_index **out) {
  return pulse_class_index_build_until(data, numel, threads, NULL, out);
}

pulse_status pulse_class_index_build_until(const uint16_t *data, uint64_t numel, int threads,
                                           const atomic_int *stop, pulse_class_index **out) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || (data == NULL && numel > 0))
    return pulse_fail(PULSE_ERR_ARG, "class index: NULL data or output");
  uint64_t blocks = (numel + PULSE_CLASS_BLOCK - 1) >> PULSE_CLASS_BLOCK_LOG2;
  if (numel > ((uint64_t)1 << 48))
    return pulse_fail(PULSE_ERR_OVERFLOW, "class index: %llu elements",
                      (unsigned long long)numel);
  pulse_class_index *ix = calloc(1, sizeof *ix);
  if (ix != NULL) {
    /* Both read at random by every decode and moved in by every commit
     * (the runs are 129 MB at 10^9 elements): huge pages. */
    ix->offset = pulse_hugepage_alloc((size_t)numel * sizeof *ix->offset + 2);
    ix->run = pulse_hugepage_alloc((size_t)blocks * PULSE_CLASS_RUNS * sizeof *ix->run + 2);
  }
  if (ix == NULL || ix->offset == NULL || ix->run == NULL) {
    pulse_class_index_free(ix);
    return pulse_fail(PULSE_ERR_NOMEM, "class index: %llu elements", (unsigned long long)numel);
  }
  ix->numel = numel;
  ix->blocks = blocks;
  size_t groups = (size_t)((blocks + BUILD_GROUP - 1) / BUILD_GROUP);
  build_job job = {ix, data, calloc(groups + 1, sizeof(pulse_tensor_digest)), stop, 0};
  if (job.digest == NULL) {
    pulse_class_index_free(ix);
    return pulse_fail(PULSE_ERR_NOMEM, "class index: %llu elements", (unsigned long long)numel);
  }
  pulse_parallel_for(threads, groups, build_group, &job);
  if (atomic_load(&job.stopped)) {
    free(job.digest);
    pulse_class_index_free(ix);
    return PULSE_OK; /* *out stays NULL */
  }
  for (size_t g = 0; g < groups; g++) {
    ix->digest.a += job.digest[g].a;
    ix->digest.b += job.digest[g].b;
  }
  free(job.digest);
  *out = ix;
  return PULSE_OK;
}

void pulse_class_index_free(pulse_class_index *ix) {
  if (ix == NULL)
    return;
  free(ix->offset), free(ix->run), free(ix);
}

pulse_tensor_digest pulse_class_index_digest(const pulse_class_index *ix) {
  pulse_tensor_digest none = {0, 0};
  return ix != NULL ? ix->digest : none;
}

size_t pulse_class_index_bytes(const pulse_class_index *ix) {
  if (ix == NULL)
    return 0;
  return sizeof *ix + (size_t)ix->numel * sizeof *ix->offset +
         (size_t)ix->blocks * PULSE_CLASS_RUNS * sizeof *ix->run;
}

pulse_status pulse_class_index_check(const pulse_class_index *ix, const uint16_t *data,
                                     uint64_t numel) {
  if (ix == NULL || (data == NULL && numel > 0))
    return pulse_fail(PULSE_ERR_ARG, "class index check: NULL index or data");
  if (ix->numel != numel)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "class index: %llu elements, data %llu",
                      (unsigned long long)ix->numel, (unsigned long long)numel);
  pulse_tensor_digest d = pulse_digest_bf16(data, numel);
  if (d.a != ix->digest.a || d.b != ix->digest.b)
    return pulse_fail(PULSE_ERR_CORRUPT, "class index: describes other data (digest)");
  for (uint64_t b = 0; b < ix->blocks; b++) {
    const uint16_t *run = block_runs(ix, b);
    const uint16_t *off = ix->offset + (b << PULSE_CLASS_BLOCK_LOG2);
    const uint16_t *bits = data + (b << PULSE_CLASS_BLOCK_LOG2);
    if (run[0] != 0 || run[PULSE_CLASS_COUNT] != block_size(ix, b))
      return pulse_fail(PULSE_ERR_CORRUPT, "class index: block %llu: bad run table",
                        (unsigned long long)b);
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
      if (run[c] > run[c + 1])
        return pulse_fail(PULSE_ERR_CORRUPT, "class index: block %llu: runs out of order",
                          (unsigned long long)b);
      for (uint32_t r = run[c]; r < run[c + 1]; r++) {
        /* Every offset in its class's run, increasing: the runs then hold
         * each offset exactly once, since their sizes add up to the block. */
        if (off[r] >= block_size(ix, b) || pulse_bf16_class(bits[off[r]]) != c ||
            (r > run[c] && off[r] <= off[r - 1]))
          return pulse_fail(PULSE_ERR_CORRUPT, "class index: block %llu class %u: entry %u",
                            (unsigned long long)b, c, r);
      }
    }
  }
  return PULSE_OK;
}

void pulse_class_index_hist(const pulse_class_index *ix, uint64_t first, uint32_t n,
                            uint32_t *hist) {
  memset(hist, 0, PULSE_CLASS_COUNT * sizeof *hist);
  uint64_t b = first >> PULSE_CLASS_BLOCK_LOG2;
  uint64_t end = (first + n + PULSE_CLASS_BLOCK - 1) >> PULSE_CLASS_BLOCK_LOG2;
  for (; b < end; b++) {
    const uint16_t *run = block_runs(ix, b);
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
      hist[c] += (uint32_t)(run[c + 1] - run[c]);
  }
}

/* How far the offsets' loads trail the walk that finds their slots: the
 * walk prefetches each slot's entry (a class's entries are sparse in its
 * runs, so nearly every one misses the cache), and the entry is read this
 * many changes later, when it has arrived. */
#define LOCATE_LAG 48u

/* And how far the old bits' loads trail the positions, whose lines are
 * prefetched when the position is known. */
#define RESOLVE_LAG 32u

/* Turns change j's slot into its position and prefetches its old bits. */
static inline void locate_finish(const pulse_class_index *ix, const uint16_t *data,
                                 uint64_t *pos, uint32_t j) {
  const uint64_t block_mask = ~(uint64_t)(PULSE_CLASS_BLOCK - 1);
  pos[j] = (pos[j] & block_mask) + ix->offset[pos[j]];
  if (data != NULL)
    __builtin_prefetch(data + pos[j]); /* the old bits are read next */
}

/* Change j's old bits, and its delta turned into its new bits. */
static inline void locate_resolve(const uint16_t *data, const uint64_t *pos, uint16_t *old_bits,
                                  uint16_t *delta, uint32_t j) {
  uint16_t old = data[pos[j]];
  old_bits[j] = old;
  delta[j] = pulse_bf16_undelta(old, delta[j]);
}

uint32_t pulse_class_index_locate(const pulse_class_index *ix, uint64_t first, uint32_t n,
                                  uint32_t k, const uint32_t *start, const uint32_t *rank,
                                  const uint16_t *cdelta, const uint16_t *data,
                                  uint64_t *pos, uint16_t *delta, uint16_t *old_bits) {
  uint64_t b0 = first >> PULSE_CLASS_BLOCK_LOG2;
  uint64_t end = (first + n + PULSE_CLASS_BLOCK - 1) >> PULSE_CLASS_BLOCK_LOG2;
  uint32_t out = 0, done = 0, resolved = 0;
  int resolve = old_bits != NULL && data != NULL;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT && out < k; c++) {
    if (start[c] == start[c + 1])
      continue;
    /* Walk the blocks once per class: `before` counts the class's elements
     * in the blocks passed, so rank - before indexes the current run. */
    uint64_t b = b0;
    const uint16_t *run = block_runs(ix, b);
    uint32_t before = 0, size = (uint32_t)(run[c + 1] - run[c]);
    for (uint32_t j = start[c]; j < start[c + 1]; j++) {
      uint32_t r = rank[j];
      while (r - before >= size) {
        before += size;
        if (++b == end)
          goto past_end; /* the rank is past the end of its class */
        run = block_runs(ix, b);
        size = (uint32_t)(run[c + 1] - run[c]);
      }
      /* For now the slot in the offsets (its block is the slot's block). */
      uint64_t slot = (b << PULSE_CLASS_BLOCK_LOG2) + run[c] + (r - before);
      __builtin_prefetch(ix->offset + slot);
      pos[out] = slot;
      delta[out] = cdelta[j];
      out++;
      if (out > LOCATE_LAG) {
        locate_finish(ix, data, pos, done++);
        if (resolve && done > RESOLVE_LAG)
          locate_resolve(data, pos, old_bits, delta, resolved++);
      }
    }
  }
past_end:
  while (done < out)
    locate_finish(ix, data, pos, done++);
  while (resolve && resolved < out)
    locate_resolve(data, pos, old_bits, delta, resolved++);
  return out;
}

/* The first entry of off[lo, hi) (sorted) that is not below o. */
static uint32_t lower_bound(const uint16_t *off, uint32_t lo, uint32_t hi, uint16_t o) {
  while (lo < hi) {
    uint32_t mid = (lo + hi) / 2;
    if (off[mid] < o)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* lower_bound starting from a guess: a class's offsets spread over the
 * block about evenly, so o's place in the block predicts its place in the
 * run. The search gallops from there (the few entries around the guess
 * share a cache line or two) instead of bisecting the whole run: a move
 * comes long after its block was last touched, and each step of a
 * bisection was a cache miss that depended on the one before. */
static uint32_t lower_bound_near(const uint16_t *off, uint32_t lo, uint32_t hi, uint16_t o) {
  if (lo >= hi)
    return lo;
  uint32_t g = lo + (uint32_t)(((uint64_t)(hi - lo) * o) >> PULSE_CLASS_BLOCK_LOG2);
  uint32_t step = 1;
  if (off[g] < o) { /* the answer is in (g, hi] */
    uint32_t l = g + 1;
    while (l + step - 1 < hi && off[l + step - 1] < o) {
      l += step;
      step *= 2;
    }
    return lower_bound(off, l, l + step - 1 < hi ? l + step - 1 : hi, o);
  }
  uint32_t r = g; /* off[r] >= o: the answer is in [lo, r] */
  while (r >= lo + step && off[r - step] >= o) {
    r -= step;
    step *= 2;
  }
  return lower_bound(off, r >= lo + step ? r - step + 1 : lo, r, o);
}

/* Moves offset o of a block from class a's run to class b's, keeping each
 * run sorted. */
static void move_offset(uint16_t *off, uint16_t *run, uint16_t o, unsigned a, unsigned b) {
  uint32_t from = lower_bound_near(off, run[a], run[a + 1], o); /* where o is */
  uint32_t to = lower_bound_near(off, run[b], run[b + 1], o);   /* o goes before it */
  if (a < b) {
    /* Runs a+1..b shift down one place; o ends at the end of b's prefix. */
    memmove(off + from, off + from + 1, (size_t)(to - from - 1) * sizeof *off);
    off[to - 1] = o;
    for (unsigned c = a + 1; c <= b; c++)
      run[c]--;
  } else {
    memmove(off + to + 1, off + to, (size_t)(from - to) * sizeof *off);
    off[to] = o;
    for (unsigned c = b + 1; c <= a; c++)
      run[c]++;
  }
}

/* Where the gallop of lower_bound_near starts for offset o in a run. */
static inline const uint16_t *near_guess(const uint16_t *off, const uint16_t *run, unsigned c,
                                         uint16_t o) {
  uint32_t lo = run[c], hi = run[c + 1];
  return off + lo + (uint32_t)(((uint64_t)(hi - lo) * o) >> PULSE_CLASS_BLOCK_LOG2);
}

/* Moves in flight: a move's block was last touched long ago (its chunk was
 * located before every other chunk of the step was decoded), so each of
 * its loads misses the cache, and within a move they depend on each other
 * (the run table, then the guesses, then the gallops). Pipelined over the
 * moves instead: the run tables of the move MOVE_AHEAD * 2 ahead are
 * prefetched, and the guessed entries of the one MOVE_AHEAD ahead, whose
 * run table is then in cache. Prefetches are only hints: the moves before
 * may shift what they fetched by a few entries, never the result. */
#define MOVE_AHEAD 6u
#define MOVE_BATCH 256u

typedef struct {
  uint64_t blk;
  uint16_t o;
  uint8_t a, b;
} pending_move;

static void move_batch(pulse_class_index *ix, const pending_move *m, uint32_t n) {
  for (uint32_t i = 0; i < n + 2 * MOVE_AHEAD; i++) {
    if (i < n) {
      const uint16_t *run = block_runs(ix, m[i].blk);
      __builtin_prefetch(run + m[i].a);
      __builtin_prefetch(run + m[i].b);
    }
    if (i >= MOVE_AHEAD && i - MOVE_AHEAD < n) {
      const pending_move *q = &m[i - MOVE_AHEAD];
      const uint16_t *run = block_runs(ix, q->blk);
      const uint16_t *off = ix->offset + (q->blk << PULSE_CLASS_BLOCK_LOG2);
      __builtin_prefetch(near_guess(off, run, q->a, q->o));
      __builtin_prefetch(near_guess(off, run, q->b, q->o));
    }
    if (i >= 2 * MOVE_AHEAD) {
      const pending_move *q = &m[i - 2 * MOVE_AHEAD];
      move_offset(ix->offset + (q->blk << PULSE_CLASS_BLOCK_LOG2), block_runs(ix, q->blk), q->o,
                  q->a, q->b);
    }
  }
}

void pulse_class_index_move(pulse_class_index *ix, const uint64_t *pos, const uint16_t *old_bits,
                            const uint16_t *new_bits, uint64_t k) {
  pending_move m[MOVE_BATCH];
  uint32_t n = 0;
  for (uint64_t j = 0; j < k; j++) {
    /* Few changes cross an exponent: four at a time past those that keep
     * their class (bits 7-14 of each lane). */
    for (uint64_t o, w; j + 4 <= k; j += 4) {
      memcpy(&o, old_bits + j, sizeof o);
      memcpy(&w, new_bits + j, sizeof w);
      if (((o ^ w) & 0x7F807F807F807F80u) != 0)
        break;
    }
    if (j == k)
      break;
    unsigned a = pulse_bf16_class(old_bits[j]), b = pulse_bf16_class(new_bits[j]);
    if (a == b)
      continue;
    m[n++] = (pending_move){pos[j] >> PULSE_CLASS_BLOCK_LOG2,
                            (uint16_t)(pos[j] & (PULSE_CLASS_BLOCK - 1)), (uint8_t)a, (uint8_t)b};
    if (n == MOVE_BATCH) {
      move_batch(ix, m, n);
      n = 0;
    }
  }
  move_batch(ix, m, n);
}
