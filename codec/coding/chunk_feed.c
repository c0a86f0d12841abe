/* chunk_feed.c - decoding chunks as their bytes arrive
 * (chunk_feed_impl.h). */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "chunk_feed_impl.h"
#include "parallel_impl.h"
#include "status_impl.h"

#define FEED_MAX_THREADS 64

struct pulse_chunk_feed {
  size_t n;
  const uint64_t *end;
  uint64_t size;
  pulse_chunk_feed_fn fn;
  void *ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t avail; /* bytes there */
  size_t next;    /* next item to take */
  size_t done;    /* items decoded (or failed) */
  int stop;       /* free: threads leave */
  int failed;     /* an item failed: the rest is not decoded */
  pulse_chunk_feed_times times;
  pthread_t tid[FEED_MAX_THREADS];
  int nthreads;
  int caller_helps; /* wait decodes, on the pool (all bytes are there) */
  int helpers_want;  /* threads for that, the caller's included */
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Takes items in order, each once its bytes are there. */
static void *feed_worker(void *arg) {
  pulse_chunk_feed *f = arg;
  pthread_mutex_lock(&f->mu);
  while (!f->stop && !f->failed && f->next < f->n) {
    size_t i = f->next;
    if (f->end[i] > f->avail) {
      pthread_cond_wait(&f->cv, &f->mu);
      continue;
    }
    f->next++;
    pthread_mutex_unlock(&f->mu);
    int ok = f->fn(f->ctx, i);
    pthread_mutex_lock(&f->mu);
    f->failed |= !ok;
    if (++f->done == f->n)
      f->times.done = now_s();
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

static void stop_threads(pulse_chunk_feed *f, int stop) {
  pthread_mutex_lock(&f->mu);
  f->stop |= stop;
  pthread_cond_broadcast(&f->cv);
  pthread_mutex_unlock(&f->mu);
  for (int k = 0; k < f->nthreads; k++)
    pthread_join(f->tid[k], NULL);
  f->nthreads = 0;
}

pulse_status pulse_chunk_feed_start(size_t n, const uint64_t *end, uint64_t size, int threads,
                                    int caller_helps, pulse_chunk_feed_fn fn, void *ctx,
                                    pulse_chunk_feed **out) {
  pulse_chunk_feed *f = calloc(1, sizeof *f);
  if (f == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "chunk feed");
  f->n = n;
  f->end = end;
  f->size = size;
  f->fn = fn;
  f->ctx = ctx;
  pthread_mutex_init(&f->mu, NULL);
  pthread_cond_init(&f->cv, NULL);
  f->times.begin = now_s();
  if (n == 0)
    f->times.done = f->times.begin;
  if (threads <= 0)
    threads = pulse_cpu_count();
  if (threads > FEED_MAX_THREADS)
    threads = FEED_MAX_THREADS;
  if ((size_t)threads > n)
    threads = (int)n;
  f->caller_helps = caller_helps;
  /* Every byte is there: wait decodes on the pool's threads (parallel.c),
   * started long ago, rather than threads started now. */
  if (caller_helps) {
    f->helpers_want = threads > 0 ? threads : 1;
    threads = 0;
  }
  /* When no thread starts, wait decodes on the caller's thread. */
  for (int k = 0; k < threads; k++) {
    if (pthread_create(&f->tid[f->nthreads], NULL, feed_worker, f) != 0)
      break;
    f->nthreads++;
  }
  *out = f;
  return PULSE_OK;
}

void pulse_chunk_feed_bytes(pulse_chunk_feed *f, uint64_t avail) {
  if (f == NULL)
    return;
  pthread_mutex_lock(&f->mu);
  if (avail > f->size)
    avail = f->size;
  if (avail > f->avail) {
    f->avail = avail;
    if (avail == f->size)
      f->times.last_byte = now_s();
    pthread_cond_broadcast(&f->cv);
  }
  pthread_mutex_unlock(&f->mu);
}

uint64_t pulse_chunk_feed_fed(pulse_chunk_feed *f) {
  pthread_mutex_lock(&f->mu);
  uint64_t avail = f->avail;
  pthread_mutex_unlock(&f->mu);
  return avail;
}

static void feed_job(void *arg) { feed_worker(arg); }

int pulse_chunk_feed_wait(pulse_chunk_feed *f) {
  if (pulse_chunk_feed_fed(f) < f->size)
    return 0; /* the threads would wait for bytes forever */
  if (f->caller_helps)
    pulse_parallel_run(f->helpers_want, feed_job, f);
  else if (f->nthreads == 0)
    feed_worker(f); /* no thread could start */
  stop_threads(f, 0); /* every byte is there: they run out of items */
  return !f->failed && f->done == f->n;
}

pulse_chunk_feed_times pulse_chunk_feed_times_get(const pulse_chunk_feed *f) {
  return f->times;
}

void pulse_chunk_feed_free(pulse_chunk_feed *f) {
  if (f == NULL)
    return;
  stop_threads(f, 1);
  pthread_cond_destroy(&f->cv);
  pthread_mutex_destroy(&f->mu);
  free(f);
}
