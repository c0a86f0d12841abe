/* chunk_sink_impl.h - the locate through a receiver's class index fused
 * into a chunk decode (version 2: chunk_fast.c, version 3: chunk_v3.c):
 * each change's rank becomes the slot of its offset as it is decoded, the
 * offset and the old bits are prefetched, and they are read some changes
 * later, so the decode's arithmetic runs while those lines are on their
 * way. */
#ifndef PULSE_CHUNK_SINK_IMPL_H
#define PULSE_CHUNK_SINK_IMPL_H

#include <stdint.h>

#include "class_index_impl.h"
#include "pulse_elem.h"

/* pulse_class_index_locate's work, change by change as each rank is
 * decoded. Its counters run across the classes of the chunk. */
typedef struct {
  const pulse_class_index *ix;
  const uint16_t *data;         /* the tensor: old bits (NULL: none read) */
  uint64_t b0, bend;            /* the chunk's index blocks */
  uint64_t *pos;                /* the chunk's staging: slots, then positions */
  uint16_t *delta;              /* deltas, then new bits (with old_bits) */
  uint16_t *old_bits;           /* NULL: deltas stay deltas */
  uint32_t out, done, resolved; /* changes decoded, located, resolved */
  unsigned cls;                 /* the class being decoded */
} index_sink;

/* How far an offset's load trails its slot's prefetch, and an old bits'
 * load its position's prefetch, in changes. Both prefetches ask for L2
 * only (prefetcht2): into L1, each line held one of L1's few miss buffers
 * until it came, and with two lines asked per change the prefetches
 * themselves stalled the loop once those ran out (5e7 synthetic, one
 * thread: 24 -> 20 ms CPU an apply, with the commit's own). */
#define SINK_LOCATE_LAG 64u
#define SINK_RESOLVE_LAG 48u

/* Change j's slot in the offsets becomes its position; its old bits are
 * prefetched (class_index.c's locate_finish, into L2). */
static inline void sink_finish(index_sink *s, uint32_t j) {
  const uint64_t block_mask = ~(uint64_t)(PULSE_CLASS_BLOCK - 1);
  uint64_t slot = s->pos[j];
  s->pos[j] = (slot & block_mask) + s->ix->offset[slot];
  if (s->data != NULL)
    __builtin_prefetch(s->data + s->pos[j], 0, 1);
}

/* Change j's old bits, and its delta turned into its new bits. */
static inline void sink_resolve(index_sink *s, uint32_t j) {
  uint16_t old = s->data[s->pos[j]];
  s->old_bits[j] = old;
  s->delta[j] = pulse_bf16_undelta(old, s->delta[j]);
}

/* The walk over a chunk's index blocks for one class (class_index.c's
 * locate): `before` counts the class's elements in the blocks passed, so
 * rank - before indexes the current block's run. */
typedef struct {
  uint64_t b;
  const uint16_t *run;
  uint32_t before, size;
  unsigned cls;
} sink_walk;

static inline void sink_walk_start(const index_sink *s, unsigned cls,
                                   sink_walk *w) {
  w->b = s->b0;
  w->run = s->ix->run + w->b * PULSE_CLASS_RUNS;
  w->before = 0;
  w->size = (uint32_t)(w->run[cls + 1] - w->run[cls]);
  w->cls = cls;
}

/* The slot of the offset of rank r (not below the previous rank of the
 * walk), prefetched; 0 when r is past the end of its class in the chunk. */
static inline int sink_walk_slot(const index_sink *s, sink_walk *w, uint32_t r,
                                 uint64_t *slot) {
  while (r - w->before >= w->size) {
    w->before += w->size;
    if (++w->b == s->bend)
      return 0;
    w->run = s->ix->run + w->b * PULSE_CLASS_RUNS;
    w->size = (uint32_t)(w->run[w->cls + 1] - w->run[w->cls]);
  }
  *slot = (w->b << PULSE_CLASS_BLOCK_LOG2) + w->run[w->cls] + (r - w->before);
  __builtin_prefetch(s->ix->offset + *slot, 0, 1);
  return 1;
}

/* One more change decoded (its slot and delta stored at sink->out): the
 * ones the lags have left behind are located and resolved. */
static inline void sink_push(index_sink *s, int resolve) {
  uint32_t o = ++s->out;
  if (o > SINK_LOCATE_LAG) {
    sink_finish(s, s->done++);
    if (resolve && s->done > SINK_RESOLVE_LAG)
      sink_resolve(s, s->resolved++);
  }
}

/* Every change decoded: the rest located and resolved. */
static inline void sink_drain(index_sink *s) {
  while (s->done < s->out)
    sink_finish(s, s->done++);
  while (s->old_bits != NULL && s->data != NULL && s->resolved < s->out)
    sink_resolve(s, s->resolved++);
}

#endif
