/* rank_form_testutil.h - what the locate and indexed-decode tests share:
 * random change positions in a chunk, and their class-major rank form as
 * a decoder hands it to locate. */
#ifndef PULSE_RANK_FORM_TESTUTIL_H
#define PULSE_RANK_FORM_TESTUTIL_H

#include "chunk_impl.h"
#include "patch_testutil.h"

/* Distinct positions of n elements picked with probability `density`
 * (every element when it is 1; one at least when n > 0), increasing, into
 * pos: how many. */
static inline uint32_t pt_positions(uint32_t n, double density, uint64_t *s, uint32_t *pos) {
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++)
    if (density >= 1.0 || pulse_rng_uniform(s) < density)
      pos[k++] = i;
  if (k == 0 && n > 0)
    pos[k++] = (uint32_t)pulse_rng_below(s, n);
  return k;
}

/* The class-major rank form of k changes at `pos` of `base`, with random
 * deltas. */
typedef struct {
  uint32_t start[PULSE_CLASS_COUNT + 1];
  uint32_t *rank;
  uint16_t *cdelta;
  uint32_t k;
} pt_rank_form;

static inline void pt_rank_form_make(const uint16_t *base, uint32_t n, const uint32_t *pos,
                                     uint32_t k, uint64_t *s, pt_rank_form *f) {
  uint32_t hist[PULSE_CLASS_COUNT], kc[PULSE_CLASS_COUNT] = {0};
  uint32_t *rank = pt_alloc((size_t)k * 4 + 4), *order = pt_alloc((size_t)k * 4 + 4);
  uint8_t *cls = pt_alloc((size_t)k + 1);
  pulse_chunk_classify(base, n, pos, k, hist, rank, cls);
  pulse_chunk_class_order(k, cls, kc, f->start, order);
  f->rank = pt_alloc((size_t)k * 4 + 4);
  f->cdelta = pt_alloc((size_t)k * 2 + 2);
  for (uint32_t j = 0; j < k; j++) {
    f->rank[j] = rank[order[j]];
    f->cdelta[j] = pt_delta(s);
  }
  f->k = k;
  free(rank), free(order), free(cls);
}

static inline void pt_rank_form_free(pt_rank_form *f) { free(f->rank), free(f->cdelta); }

#endif
