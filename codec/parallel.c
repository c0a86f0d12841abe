/* parallel.c - a minimal parallel for over pthreads. */
#include "parallel_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#define PULSE_MAX_THREADS 256

typedef struct {
  atomic_size_t next;
  size_t count;
  void (*fn)(void *ctx, size_t i);
  void *ctx;
} parallel_job;

static void *parallel_worker(void *arg) {
  parallel_job *job = arg;
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
    if (i >= job->count)
      break;
    job->fn(job->ctx, i);
  }
  return NULL;
}

int pulse_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > PULSE_MAX_THREADS ? PULSE_MAX_THREADS : (int)n);
}

void pulse_parallel_for(int threads, size_t count,
                        void (*fn)(void *ctx, size_t i), void *ctx) {
  if (threads <= 0)
    threads = pulse_cpu_count();
  if (threads > PULSE_MAX_THREADS)
    threads = PULSE_MAX_THREADS;
  if ((size_t)threads > count)
    threads = (int)count;
  parallel_job job;
  atomic_init(&job.next, 0);
  job.count = count;
  job.fn = fn;
  job.ctx = ctx;
  pthread_t tid[PULSE_MAX_THREADS];
  int started = 0;
  for (int t = 1; t < threads; t++) {
    if (pthread_create(&tid[started], NULL, parallel_worker, &job) != 0)
      break;
    started++;
  }
  parallel_worker(&job);
  for (int t = 0; t < started; t++)
    pthread_join(tid[t], NULL);
}
