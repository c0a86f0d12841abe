/* server_catchup_queue.c - catch-ups are built off the HTTP threads: a few
 * builder threads take builds from a bounded queue, and the requests that
 * need a build wait for it suspended (no thread held) up to a bound. So
 * head, long-polls, objects, metrics and /healthz answer whatever the
 * catch-up load (issue 20, finding 6): the HTTP threads only look up the
 * cache, queue, suspend and send. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"

static unsigned builds_max(const pulse_server *srv) {
  return srv->opts.catchup_builds ? srv->opts.catchup_builds : 1;
}

static size_t queue_max(const pulse_server *srv) {
  return srv->opts.catchup_queue ? srv->opts.catchup_queue : 16;
}

/* Drops a reference to a build. catchup_lock held. */
static void build_release(srv_build *b) {
  if (--b->refs > 0)
    return;
  if (b->fd >= 0)
    close(b->fd);
  srv_head_release(b->head);
  free(b);
}

/* Takes w off its build's list and resumes its request. catchup_lock held
 * (the request is suspended until then: its completion takes the lock). */
static void wake_waiter(srv_build_waiter *w, int why) {
  srv_build *b = w->build;
  if (w->prev)
    w->prev->next = w->next;
  else
    b->waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->woken = why;
  pulse_serve_resume(w->rq);
}

/* The request of a waiter completed (answered, or its connection died). */
static void waiter_done(void *data) {
  srv_build_waiter *w = data;
  pulse_server *srv = w->srv;
  pthread_mutex_lock(&srv->catchup_lock);
  if (!w->woken) {
    if (w->prev)
      w->prev->next = w->next;
    else if (w->build->waiters == w)
      w->build->waiters = w->next;
    if (w->next)
      w->next->prev = w->prev;
  }
  build_release(w->build);
  pthread_mutex_unlock(&srv->catchup_lock);
  free(w);
}

static void *builder_main(void *arg) {
  pulse_server *srv = arg;
  /* Builds are background work: the HTTP threads (and the trainer, when
   * the server runs in its process) come first for the CPU. The threads a
   * build starts inherit this. */
  if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
    PULSE_LOG_AT(PULSE_LOG_DEBUG, "server: builder priority: %s",
                 strerror(errno));
  pthread_mutex_lock(&srv->catchup_lock);
  for (;;) {
    srv_build *b = srv->builds;
    while (b != NULL && b->running)
      b = b->next;
    if (srv->builders_stop)
      break;
    if (b == NULL) {
      pthread_cond_wait(&srv->build_cv, &srv->catchup_lock);
      continue;
    }
    b->running = 1;
    srv->builds_queued--;
    pthread_mutex_unlock(&srv->catchup_lock);
    srv_catchup c;
    int fd = -1;
    pulse_status st = srv_catchup_produce(srv, b->head, b->from, &c, &fd);
    pthread_mutex_lock(&srv->catchup_lock);
    b->status = st;
    if (st == PULSE_OK) {
      b->result = c;
      b->result.memfd = -1; /* the cache owns it */
      b->fd = fd;
      srv_catchup_remember(srv, &c);
    } else {
      snprintf(b->detail, sizeof b->detail, "%s", pulse_error_detail());
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "server: catch-up %" PRIu64 "-%" PRIu64 ": %s (%s)", b->from,
                   b->head->step, b->detail, pulse_status_name(st));
    }
    b->done = 1;
    srv_build **at = &srv->builds;
    while (*at != b)
      at = &(*at)->next;
    *at = b->next;
    while (b->waiters != NULL)
      wake_waiter(b->waiters, SRV_WAIT_DONE);
    build_release(b); /* the queue's */
  }
  pthread_mutex_unlock(&srv->catchup_lock);
  return NULL;
}

pulse_status srv_builders_start(pulse_server *srv) {
  unsigned n = builds_max(srv);
  srv->builders = calloc(n, sizeof *srv->builders);
  if (srv->builders == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "server: builder threads");
  for (; srv->nbuilders < n; srv->nbuilders++)
    if (pthread_create(&srv->builders[srv->nbuilders], NULL, builder_main,
                       srv) != 0)
      return pulse_fail(PULSE_ERR_NOMEM,
                        "server: cannot start the catch-up builders");
  return PULSE_OK;
}

void srv_builders_stop(pulse_server *srv) {
  pthread_mutex_lock(&srv->catchup_lock);
  srv->builders_stop = 1;
  pthread_cond_broadcast(&srv->build_cv);
  pthread_mutex_unlock(&srv->catchup_lock);
  /* A build in progress finishes first (it cannot be interrupted). */
  for (unsigned i = 0; i < srv->nbuilders; i++)
    pthread_join(srv->builders[i], NULL);
  free(srv->builders);
  srv->builders = NULL;
  srv->nbuilders = 0;
  /* What is left was never started, and the requests that waited for it
   * have all completed (the HTTP layer stopped first). */
  pthread_mutex_lock(&srv->catchup_lock);
  while (srv->builds != NULL) {
    srv_build *b = srv->builds;
    srv->builds = b->next;
    build_release(b);
  }
  srv->builds_queued = 0;
  pthread_mutex_unlock(&srv->catchup_lock);
}

/* 1 once pulse_server_free has begun (waiters are then answered at once). */
static int server_stopping(pulse_server *srv) {
  pthread_mutex_lock(&srv->lock);
  int stopping = srv->stopping;
  pthread_mutex_unlock(&srv->lock);
  return stopping;
}

int srv_build_wait(pulse_server *srv, pulse_serve_request *rq, srv_head *h,
                   uint64_t from, int pinned) {
  srv_build *b = srv->builds;
  while (b != NULL && !(b->from == from && b->head->step == h->step))
    b = b->next;
  if (b == NULL) {
    if (srv->builds_queued >= queue_max(srv)) {
      pthread_mutex_unlock(&srv->catchup_lock);
      atomic_fetch_add(&srv->metrics.catchup_refused, 1);
      return pulse_serve_reply_error(
          rq, 503,
          "%zu catch-ups are waiting to be built: retry later, or fetch the "
          "patches",
          queue_max(srv));
    }
    b = calloc(1, sizeof *b);
    if (b == NULL) {
      pthread_mutex_unlock(&srv->catchup_lock);
      return pulse_serve_reply_error(rq, 500, "out of memory");
    }
    atomic_fetch_add(&h->refs, 1);
    b->head = h;
    b->from = from;
    b->fd = -1;
    b->refs = 1;
    srv_build **at = &srv->builds;
    while (*at != NULL)
      at = &(*at)->next;
    *at = b;
    srv->builds_queued++;
    pthread_cond_signal(&srv->build_cv);
  }
  srv_build_waiter *w =
      srv->opts.catchup_wait_ms > 0 && !server_stopping(srv)
          ? calloc(1, sizeof *w)
          : NULL;
  if (w == NULL) {
    /* Not waiting: the build goes on and the next request finds it. */
    pthread_mutex_unlock(&srv->catchup_lock);
    atomic_fetch_add(&srv->metrics.catchup_refused, 1);
    return pulse_serve_reply_error(
        rq, 503, "the catch-up from %" PRIu64 " is being built: retry later",
        from);
  }
  w->srv = srv;
  w->rq = rq;
  w->build = b;
  w->pinned = pinned;
  b->refs++;
  w->deadline =
      pulse_serve_now() + (double)srv->opts.catchup_wait_ms / 1000.0;
  w->next = b->waiters;
  if (b->waiters)
    b->waiters->prev = w;
  b->waiters = w;
  pulse_serve_attach(rq, w, waiter_done);
  /* Suspended under the lock, so no builder can resume it before it is. */
  pulse_serve_suspend(rq);
  pthread_mutex_unlock(&srv->catchup_lock);
  /* The watcher takes the new deadline into account. */
  uint64_t one = 1;
  ssize_t wr = write(srv->wake_fd, &one, sizeof one);
  (void)wr;
  return PULSE_SERVE_OK;
}

double srv_build_expire(pulse_server *srv, double now, int all) {
  double next = INFINITY;
  pthread_mutex_lock(&srv->catchup_lock);
  for (srv_build *b = srv->builds; b != NULL; b = b->next)
    for (srv_build_waiter *w = b->waiters, *n; w != NULL; w = n) {
      n = w->next;
      if (all || now >= w->deadline)
        wake_waiter(w, all ? SRV_WAIT_STOPPING : SRV_WAIT_TIMEOUT);
      else if (w->deadline < next)
        next = w->deadline;
    }
  pthread_mutex_unlock(&srv->catchup_lock);
  return next;
}

size_t srv_build_count(pulse_server *srv) {
  size_t n = 0;
  pthread_mutex_lock(&srv->catchup_lock);
  for (srv_build *b = srv->builds; b != NULL; b = b->next)
    n++;
  pthread_mutex_unlock(&srv->catchup_lock);
  return n;
}
