/* sub_segments_impl.h - how the subscriber cuts an object into the range
 * segments it downloads in parallel (sub_object.c), apart so that the fuzz
 * target of the head -> download plan path (tests/fuzz/fuzz_head_plan.c)
 * reaches it. Sizes come from a head, so from the network: nothing here may
 * wrap, whatever the size. */
#ifndef PULSE_SUB_SEGMENTS_IMPL_H
#define PULSE_SUB_SEGMENTS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#define SUB_SEG_MAX 16
#define SUB_SEG_ALIGN ((uint64_t)1 << 20)

/* The largest object a worker downloads: a file (off_t) holds at most
 * INT64_MAX bytes. A head naming a larger object is refused. */
#define SUB_OBJECT_MAX_BYTES ((uint64_t)INT64_MAX)

/** Cuts an object of `size` bytes into segments: one, or min(parallel,
 * SUB_SEG_MAX) of SUB_SEG_ALIGN-aligned length when parallel > 1 and the
 * object is at least parallel_min_bytes and over SUB_SEG_ALIGN. Segment k
 * is bytes [origin[k], origin[k] + len[k]); together they cover [0, size)
 * in order, without gaps or overlaps (one empty segment for size 0), for
 * any size up to UINT64_MAX.
 * @return the number of segments, 1..SUB_SEG_MAX. */
size_t sub_segments_plan(unsigned parallel, uint64_t parallel_min_bytes,
                         uint64_t size, uint64_t origin[SUB_SEG_MAX],
                         uint64_t len[SUB_SEG_MAX]);

/** a + b, or UINT64_MAX when that wraps (costs that only compare). */
static inline uint64_t sub_add_sat(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

#endif
