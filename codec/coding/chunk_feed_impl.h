/* chunk_feed_impl.h - decoding the chunks of a patch as its bytes arrive
 * (chunk_feed.c): the thread work behind the host stream (patch_stream.c)
 * and the device stream (cuda/patch_cuda_apply.c).
 *
 * Items are taken in order, each by one of the feed's threads once the
 * bytes up to its end are there; an item whose decode fails stops the rest
 * (they stay undecoded). */
#ifndef PULSE_CHUNK_FEED_IMPL_H
#define PULSE_CHUNK_FEED_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

typedef struct pulse_chunk_feed pulse_chunk_feed;

/* Decodes item i; returns 0 when it failed (the decode keeps its own
 * status). Called on a feed thread, or on the waiter's thread when no
 * thread could start. */
typedef int (*pulse_chunk_feed_fn)(void *ctx, size_t i);

/* Starts up to `threads` threads (0: one per core, at most one per item)
 * for n items whose bytes end at end[i] (non-decreasing, at most size; the
 * array must outlive the feed). Nothing runs until bytes are fed.
 * caller_helps (for bytes that are all there already): no thread is
 * started; wait decodes on the process's thread pool (parallel_impl.h),
 * the caller's thread among the `threads`.
 * @return PULSE_OK and *out; PULSE_ERR_NOMEM. */
pulse_status pulse_chunk_feed_start(size_t n, const uint64_t *end, uint64_t size, int threads,
                                    int caller_helps, pulse_chunk_feed_fn fn, void *ctx,
                                    pulse_chunk_feed **out);

/* Bytes [0, avail) are there (only grows). Any one thread at a time. */
void pulse_chunk_feed_bytes(pulse_chunk_feed *f, uint64_t avail);

/* Every byte fed so far (pulse_chunk_feed_fed). */
uint64_t pulse_chunk_feed_fed(pulse_chunk_feed *f);

/* Waits until every item is decoded or one failed. Returns 1 when every
 * item was decoded; 0 after a failure, or at once when fewer than `size`
 * bytes were fed. */
int pulse_chunk_feed_wait(pulse_chunk_feed *f);

/* Monotonic times (seconds): start, the last byte fed, the last item done
 * (valid after wait). */
typedef struct {
  double begin, last_byte, done;
} pulse_chunk_feed_times;
pulse_chunk_feed_times pulse_chunk_feed_times_get(const pulse_chunk_feed *f);

/* Stops the threads (items not yet taken stay undecoded) and frees the
 * feed. NULL is fine. */
void pulse_chunk_feed_free(pulse_chunk_feed *f);

#endif
