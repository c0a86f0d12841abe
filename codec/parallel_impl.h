/* parallel_impl.h - a minimal parallel for over pthreads. */
#ifndef PULSE_PARALLEL_IMPL_H
#define PULSE_PARALLEL_IMPL_H

#include <stddef.h>

/* Runs fn(ctx, i) for every i in [0, count), on up to `threads` threads
 * (<= 0: one per online CPU), the caller's thread included. Items are handed
 * out one at a time in increasing order; fn must be safe to run concurrently
 * for different i. Falls back to the calling thread alone if threads cannot
 * be started. */
void pulse_parallel_for(int threads, size_t count,
                        void (*fn)(void *ctx, size_t i), void *ctx);

/* Number of online CPUs (at least 1). */
int pulse_cpu_count(void);

#endif
