/* parallel_impl.h - a parallel for over a pool of threads (parallel.c). */
#ifndef PULSE_PARALLEL_IMPL_H
#define PULSE_PARALLEL_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* Runs fn(ctx, i) for every i in [0, count), on up to `threads` threads
 * (<= 0: one per online CPU), the caller's thread included. Items are handed
 * out one at a time in increasing order; fn must be safe to run concurrently
 * for different i. Falls back to the calling thread alone if threads cannot
 * be started. */
void pulse_parallel_for(int threads, size_t count,
                        void (*fn)(void *ctx, size_t i), void *ctx);

/* Runs fn(ctx) on up to `threads` threads at once (<= 0: one per online
 * CPU), the caller's included, and returns when every call has returned.
 * fn must take work from a shared source until it is empty: helpers that
 * have not started when the caller's own call returns are called off. The
 * helpers are the process's pool threads, or threads of the job's own
 * while another job has the pool. */
void pulse_parallel_run(int threads, void (*fn)(void *ctx), void *ctx);

/* A token of the calling thread, distinct among the threads alive at once
 * (for pulse_parallel_for_affine's owners). */
uintptr_t pulse_parallel_self(void);

/* pulse_parallel_for where item i was last worked on by the thread whose
 * pulse_parallel_self() is owner[i]: each thread first runs the items it
 * owns, then any that no thread has taken (an owner that is not among this
 * job's threads). Every item runs exactly once, whoever joins. Why: on a
 * machine whose cores do not share a last-level cache (AMD's CCXs; two vCPUs
 * may sit on two), a second pass over the lines a first pass touched is
 * several times slower on the other core. Falls back to pulse_parallel_for
 * when memory for the claims is short. */
void pulse_parallel_for_affine(int threads, size_t count, const uintptr_t *owner,
                               void (*fn)(void *ctx, size_t i), void *ctx);

/* Number of online CPUs (at least 1). */
int pulse_cpu_count(void);

#endif
