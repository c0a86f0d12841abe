/* parallel.c - a parallel for over a pool of threads kept for the process.
 *
 * Starting a thread is slow in a virtual machine: here (PVM guest) a
 * pthread_create took 480 us to run its first instruction and 920 us with
 * its join, against 14 us to wake a sleeping thread. An apply of a 260 k
 * change step takes 4 ms on two threads and started four threads, so the
 * threads are started once, on first use, and kept asleep between jobs.
 * One job runs in the pool at a time; a second caller meanwhile (another
 * receiver in the same process, or a job started from inside a job) starts
 * its own threads as before. A forked child starts its own pool. */
#include "parallel_impl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define PULSE_MAX_THREADS 256

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_work = PTHREAD_COND_INITIALIZER; /* a job has open slots */
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER; /* its last helper returned */
static pthread_once_t pool_once = PTHREAD_ONCE_INIT;
static int pool_threads; /* started, all alive for the process */
static int pool_busy;    /* a job is on */
static struct {
  void (*fn)(void *ctx);
  void *ctx;
  int open;    /* helper slots not yet taken */
  int running; /* taken and not yet returned */
} job;

/* Jobs posted so far: a worker that just finished one watches it for a
 * while before it sleeps (pool_worker); and the helpers running the job,
 * which its caller watches likewise (pool_run). Both also move under
 * pool_mu with job.open and job.running, which decide. */
static atomic_uint job_posted;
static atomic_int job_running;

/* How long a worker that finished a job waits awake for the next one. An
 * apply is several jobs back to back (decode, then the commit's writes,
 * then its index moves, a few microseconds apart); a sleeping thread takes
 * 14 us or more to wake here, by which time the caller has taken its work
 * (and the caches of the chunks it decoded are on the wrong core). */
#define POOL_SPIN_NS 200000

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* Spins until done(arg) or POOL_SPIN_NS have passed (the clock is read
 * every 64 turns: it costs more than a pause). */
static void spin_until(int (*done)(unsigned arg), unsigned arg) {
  uint64_t until = mono_ns() + POOL_SPIN_NS;
  for (unsigned i = 0; !done(arg); i++) {
    spin_pause();
    if ((i & 63) == 63 && mono_ns() > until)
      return;
  }
}

static int posted_since(unsigned seen) {
  return atomic_load_explicit(&job_posted, memory_order_acquire) != seen;
}

static int helpers_returned(unsigned unused) {
  (void)unused;
  return atomic_load_explicit(&job_running, memory_order_acquire) == 0;
}

static void *pool_worker(void *arg) {
  (void)arg;
  pthread_mutex_lock(&pool_mu);
  for (;;) {
    while (job.open == 0) {
      unsigned seen = atomic_load_explicit(&job_posted, memory_order_acquire);
      pthread_mutex_unlock(&pool_mu);
      spin_until(posted_since, seen);
      pthread_mutex_lock(&pool_mu);
      if (job.open == 0 && atomic_load_explicit(&job_posted, memory_order_acquire) == seen)
        pthread_cond_wait(&pool_work, &pool_mu);
    }
    job.open--;
    job.running++;
    atomic_fetch_add_explicit(&job_running, 1, memory_order_relaxed);
    void (*fn)(void *) = job.fn;
    void *ctx = job.ctx;
    pthread_mutex_unlock(&pool_mu);
    fn(ctx);
    pthread_mutex_lock(&pool_mu);
    if (--job.running == 0)
      pthread_cond_signal(&pool_done);
    atomic_fetch_sub_explicit(&job_running, 1, memory_order_release);
  }
  return NULL;
}

/* fork: the child has none of the parent's threads, so it starts afresh
 * (the lock is held across the fork, so the state it copies is whole). */
static void pool_prepare(void) { pthread_mutex_lock(&pool_mu); }
static void pool_parent(void) { pthread_mutex_unlock(&pool_mu); }
static void pool_child(void) {
  pool_threads = 0;
  pool_busy = 0;
  job.open = job.running = 0;
  atomic_store(&job_running, 0);
  pthread_mutex_init(&pool_mu, NULL);
  pthread_cond_init(&pool_work, NULL);
  pthread_cond_init(&pool_done, NULL);
}
static void pool_register(void) { pthread_atfork(pool_prepare, pool_parent, pool_child); }

/* Runs fn(ctx) on the calling thread and on up to `helpers` pool threads;
 * returns once every call has returned. fn takes work from a shared source
 * until it is empty, so helpers that have not started when the caller's
 * own call returns are not needed and are called off. Returns 0 when the
 * pool is busy (the caller then runs the job some other way). */
static int pool_run(int helpers, void (*fn)(void *ctx), void *ctx) {
  pthread_once(&pool_once, pool_register);
  pthread_mutex_lock(&pool_mu);
  if (pool_busy) {
    pthread_mutex_unlock(&pool_mu);
    return 0;
  }
  pool_busy = 1;
  while (pool_threads < helpers) {
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int failed = pthread_create(&tid, &attr, pool_worker, NULL);
    pthread_attr_destroy(&attr);
    if (failed)
      break;
    pool_threads++;
  }
  job.fn = fn;
  job.ctx = ctx;
  job.open = helpers < pool_threads ? helpers : pool_threads;
  job.running = 0;
  atomic_fetch_add_explicit(&job_posted, 1, memory_order_release);
  pthread_cond_broadcast(&pool_work);
  pthread_mutex_unlock(&pool_mu);
  fn(ctx);
  pthread_mutex_lock(&pool_mu);
  job.open = 0;
  if (job.running > 0) { /* a helper is on its last item: wait awake a while */
    pthread_mutex_unlock(&pool_mu);
    spin_until(helpers_returned, 0);
    pthread_mutex_lock(&pool_mu);
  }
  while (job.running > 0)
    pthread_cond_wait(&pool_done, &pool_mu);
  pool_busy = 0;
  pthread_mutex_unlock(&pool_mu);
  return 1;
}

typedef struct {
  void (*fn)(void *ctx);
  void *ctx;
} thread_call;

static void *call_thread(void *arg) {
  thread_call *c = arg;
  c->fn(c->ctx);
  return NULL;
}

int pulse_cpu_count(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : (n > PULSE_MAX_THREADS ? PULSE_MAX_THREADS : (int)n);
}

void pulse_parallel_run(int threads, void (*fn)(void *ctx), void *ctx) {
  if (threads <= 0)
    threads = pulse_cpu_count();
  if (threads > PULSE_MAX_THREADS)
    threads = PULSE_MAX_THREADS;
  if (threads == 1) {
    fn(ctx);
    return;
  }
  if (pool_run(threads - 1, fn, ctx))
    return;
  /* The pool is busy: threads of this job's own. */
  thread_call call = {fn, ctx};
  pthread_t tid[PULSE_MAX_THREADS];
  int started = 0;
  for (int t = 1; t < threads; t++) {
    if (pthread_create(&tid[started], NULL, call_thread, &call) != 0)
      break;
    started++;
  }
  fn(ctx);
  for (int t = 0; t < started; t++)
    pthread_join(tid[t], NULL);
}

typedef struct {
  atomic_size_t next;
  size_t count;
  void (*fn)(void *ctx, size_t i);
  void *ctx;
} parallel_job;

static void parallel_worker(void *arg) {
  parallel_job *pj = arg;
  for (;;) {
    size_t i = atomic_fetch_add_explicit(&pj->next, 1, memory_order_relaxed);
    if (i >= pj->count)
      break;
    pj->fn(pj->ctx, i);
  }
}

void pulse_parallel_for(int threads, size_t count, void (*fn)(void *ctx, size_t i), void *ctx) {
  if (threads <= 0)
    threads = pulse_cpu_count();
  if ((size_t)threads > count)
    threads = (int)count;
  parallel_job pj;
  atomic_init(&pj.next, 0);
  pj.count = count;
  pj.fn = fn;
  pj.ctx = ctx;
  if (threads > 0)
    pulse_parallel_run(threads, parallel_worker, &pj);
}

uintptr_t pulse_parallel_self(void) {
  static _Thread_local char self; /* one per thread: its address names it */
  return (uintptr_t)&self;
}

typedef struct {
  size_t count;
  const uintptr_t *owner;
  atomic_uchar *taken;
  void (*fn)(void *ctx, size_t i);
  void *ctx;
} affine_job;

static int affine_take(affine_job *aj, size_t i) {
  return atomic_load_explicit(&aj->taken[i], memory_order_relaxed) == 0 &&
         atomic_exchange_explicit(&aj->taken[i], 1, memory_order_relaxed) == 0;
}

/* Its own items in order, then what is left from the other end, where the
 * owners (walking forward) get last. */
static void affine_worker(void *arg) {
  affine_job *aj = arg;
  uintptr_t me = pulse_parallel_self();
  for (size_t i = 0; i < aj->count; i++)
    if (aj->owner[i] == me && affine_take(aj, i))
      aj->fn(aj->ctx, i);
  for (size_t i = aj->count; i-- > 0;)
    if (affine_take(aj, i))
      aj->fn(aj->ctx, i);
}

void pulse_parallel_for_affine(int threads, size_t count, const uintptr_t *owner,
                               void (*fn)(void *ctx, size_t i), void *ctx) {
  if (threads <= 0)
    threads = pulse_cpu_count();
  if ((size_t)threads > count)
    threads = (int)count;
  if (threads <= 1 || owner == NULL) {
    pulse_parallel_for(threads, count, fn, ctx);
    return;
  }
  affine_job aj = {count, owner, calloc(count, sizeof(atomic_uchar)), fn, ctx};
  if (aj.taken == NULL) {
    pulse_parallel_for(threads, count, fn, ctx);
    return;
  }
  pulse_parallel_run(threads, affine_worker, &aj);
  free(aj.taken);
}
