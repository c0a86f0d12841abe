/* class_index_impl.h - what the decoder and the commits use of a
 * pulse_class_index (class_index.c).
 *
 * The index splits a tensor into blocks of PULSE_CLASS_BLOCK elements. Per
 * block it holds the block's element offsets sorted by (position class,
 * offset), and where each class's run starts. Turning a class rank into a
 * position is then two loads instead of a pass over the base, and a commit
 * keeps the index current by moving the few elements whose exponent changed
 * from one run to another. */
#ifndef PULSE_CLASS_INDEX_IMPL_H
#define PULSE_CLASS_INDEX_IMPL_H

#include <stdatomic.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_elem.h"

#define PULSE_CLASS_BLOCK_LOG2 12u
#define PULSE_CLASS_BLOCK (1u << PULSE_CLASS_BLOCK_LOG2)
/* Entries of a block's run table: PULSE_CLASS_COUNT + 1 starts, padded. */
#define PULSE_CLASS_RUNS (PULSE_CLASS_COUNT + 8u)

struct pulse_class_index {
  uint64_t numel;
  uint64_t blocks;
  uint16_t *offset; /* numel entries: block b's are offset[b * BLOCK ...] */
  uint16_t *run;    /* blocks * PULSE_CLASS_RUNS: run[c] is where class c
                       starts in its block's offsets, run[256] its size */
  pulse_tensor_digest digest; /* of the data the index describes */
};

/* Whether the index describes `numel` elements whose digest is d: an index
 * that does not is never used (its owner changed the data behind it). */
static inline int pulse_class_index_matches(const pulse_class_index *ix, uint64_t numel,
                                            pulse_tensor_digest d) {
  return ix != NULL && ix->numel == numel && ix->digest.a == d.a && ix->digest.b == d.b;
}

/* The options' class index for targets[j], or NULL. */
static inline pulse_class_index *pulse_apply_opts_index(const pulse_apply_opts *opts, size_t j) {
  return opts->class_index != NULL ? opts->class_index[j] : NULL;
}

/* pulse_class_index_build that gives up once *stop is set (NULL: never;
 * read between groups of blocks, so it stops within a few milliseconds):
 * then PULSE_OK with *out NULL. For a receiver that builds in the
 * background and must take its data back. */
pulse_status pulse_class_index_build_until(const uint16_t *data, uint64_t numel, int threads,
                                           const atomic_int *stop, pulse_class_index **out);

/* The class counts of the n elements from `first` (a multiple of the block
 * size): hist[PULSE_CLASS_COUNT]. */
void pulse_class_index_hist(const pulse_class_index *ix, uint64_t first, uint32_t n,
                            uint32_t *hist);

/* pulse_chunk_locate through the index: the class-major rank form of the
 * chunk of n elements from `first` (a multiple of the block size) to
 * positions (first + chunk position) and deltas, class-major rather than in
 * storage order. data (the tensor's, or NULL) is prefetched at each position
 * found; with old_bits too, each change's old bits are read into old_bits
 * and its delta turned into its new bits (while the line is fresh in
 * cache). Returns how many it found: k when every rank is inside its
 * class. */
uint32_t pulse_class_index_locate(const pulse_class_index *ix, uint64_t first, uint32_t n,
                                  uint32_t k, const uint32_t *start, const uint32_t *rank,
                                  const uint16_t *cdelta, const uint16_t *data, uint64_t *pos,
                                  uint16_t *delta, uint16_t *old_bits);

/* Follows k changes at distinct positions (old bits to new bits) that the
 * data the index describes has taken or will take: each element whose class
 * changes moves to its new run. Once per change: the index does not look
 * at the data. Calls for positions in different blocks may run
 * concurrently; the caller sets ix->digest afterwards. */
void pulse_class_index_move(pulse_class_index *ix, const uint64_t *pos, const uint16_t *old_bits,
                            const uint16_t *new_bits, uint64_t k);

#endif
