/* server_poll.c - the head as the server sees it: reloading head.json when
 * it moves, the long-poll waiters, and the watcher thread that follows a
 * publisher in another process. */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"
#include "store_impl.h"

void srv_head_release(srv_head *h) {
  if (h != NULL && atomic_fetch_sub(&h->refs, 1) == 1) {
    pulse_store_head_free(h->head);
    free(h);
  }
}

srv_head *srv_head_get(pulse_server *srv) {
  pthread_mutex_lock(&srv->lock);
  srv_head *h = srv->head;
  if (h != NULL)
    atomic_fetch_add(&h->refs, 1);
  pthread_mutex_unlock(&srv->lock);
  return h;
}

/* Resumes the waiters that may answer now: a head above their step, their
 * deadline passed, or the server stopping. Called with srv->lock held, so a
 * waiter cannot complete (waiter_done) while it is taken off the list. */
static void wake_locked(pulse_server *srv, double now, int all) {
  uint64_t step = srv->head ? srv->head->step : 0;
  int have = srv->head != NULL;
  for (srv_waiter *w = srv->waiters, *next; w != NULL; w = next) {
    next = w->next;
    if (!(all || srv->stopping || (have && step > w->after) ||
          now >= w->deadline))
      continue;
    if (w->prev)
      w->prev->next = w->next;
    else
      srv->waiters = w->next;
    if (w->next)
      w->next->prev = w->prev;
    w->prev = w->next = NULL;
    srv->nwaiters--;
    w->woken = 1;
    if (have && step > w->after) /* observed when it runs again */
      w->learned = srv->head_learned;
    pulse_serve_resume(w->rq);
  }
}

void srv_wake_all(void *server) {
  pulse_server *srv = server;
  pthread_mutex_lock(&srv->lock);
  wake_locked(srv, pulse_serve_now(), 1);
  pthread_mutex_unlock(&srv->lock);
  srv_build_expire(srv, pulse_serve_now(), 1); /* catch-ups' waiters too */
}

void srv_reload(pulse_server *srv, int force) {
  char path[4096];
  snprintf(path, sizeof path, "%s/" PULSE_STORE_HEAD_FILE, srv->dir);
  pthread_mutex_lock(&srv->reload_lock);
  struct stat sb;
  if (stat(path, &sb) != 0) {
    pthread_mutex_unlock(&srv->reload_lock);
    return; /* no head (yet): keep what we have */
  }
  if (!force && srv->head != NULL && sb.st_dev == srv->head_dev &&
      sb.st_ino == srv->head_ino && sb.st_size == srv->head_size &&
      sb.st_mtim.tv_sec == srv->head_mtime.tv_sec &&
      sb.st_mtim.tv_nsec == srv->head_mtime.tv_nsec) {
    pthread_mutex_unlock(&srv->reload_lock);
    return;
  }
  pulse_store_head *parsed = NULL;
  pulse_status st = pulse_store_head_load(srv->dir, &parsed);
  atomic_fetch_add(&srv->metrics.head_reloads, 1);
  if (st != PULSE_OK) {
    /* Never serve a head that does not check; keep the last good one. */
    atomic_fetch_add(&srv->metrics.head_errors, 1);
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "server: %s: %s (%s); still serving the previous head", path,
                 pulse_error_detail(), pulse_status_name(st));
    srv->head_dev = sb.st_dev, srv->head_ino = sb.st_ino,
    srv->head_size = sb.st_size;
    srv->head_mtime = sb.st_mtim;
    pthread_mutex_unlock(&srv->reload_lock);
    return;
  }
  srv_head *h = calloc(1, sizeof *h);
  if (h == NULL) {
    pulse_store_head_free(parsed);
    pthread_mutex_unlock(&srv->reload_lock);
    return;
  }
  atomic_init(&h->refs, 1);
  h->head = parsed;
  h->step = pulse_store_head_step(parsed);
  size_t n;
  const uint8_t *bytes = pulse_store_head_bytes(parsed, &n);
  uint8_t sha[32];
  char hex[65];
  store_sha256(bytes, n, sha);
  store_hex(sha, 32, hex);
  snprintf(h->etag, sizeof h->etag, "\"%s\"", hex);

  /* The identities its objects have now (server_objects.c), before any
   * request can name them. */
  srv_objects_note_head(srv, parsed);
  srv_history_note(srv, parsed);
  pthread_mutex_lock(&srv->lock);
  srv_head *old = srv->head;
  int moved = old == NULL || old->step != h->step;
  srv->head = h;
  srv->head_dev = sb.st_dev, srv->head_ino = sb.st_ino,
  srv->head_size = sb.st_size;
  srv->head_mtime = sb.st_mtim;
  double now = pulse_serve_now();
  srv->head_learned = now;
  wake_locked(srv, now, 0);
  pthread_mutex_unlock(&srv->lock);
  pthread_mutex_unlock(&srv->reload_lock);
  srv_head_release(old);
  if (moved && srv->wake_fd >= 0) {
    /* The watcher drops catch-ups the new head made stale, off this thread. */
    uint64_t one = 1;
    ssize_t w = write(srv->wake_fd, &one, sizeof one);
    (void)w;
  }
}

/* ------------------------------------------------------------- long-poll */

static int parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9' || strlen(s) > 20)
    return -1;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9' || v > (UINT64_MAX - (uint64_t)(*s - '0')) / 10)
      return -1;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  *out = v;
  return 0;
}

static int answer_head(pulse_server *srv, pulse_serve_request *rq) {
  srv_head *h = srv_head_get(srv);
  if (h == NULL)
    return pulse_serve_reply_error(rq, 404, "the store has no head yet");
  char step[32];
  snprintf(step, sizeof step, "%" PRIu64, h->step);
  const char *extra[] = {"X-Pulse-Step", step, NULL};
  pulse_serve_meta m = {0, "application/json", PULSE_SERVE_NO_CACHE, h->etag,
                        extra};
  size_t n;
  const uint8_t *bytes = pulse_store_head_bytes(h->head, &n);
  int r = pulse_serve_reply_bytes(rq, &m, bytes, n);
  srv_head_release(h);
  return r;
}

/* The waiter's request completed: off the list unless a waker took it. */
static void waiter_done(void *data) {
  srv_waiter *w = data;
  pulse_server *srv = w->srv;
  pthread_mutex_lock(&srv->lock);
  if (!w->woken) {
    if (w->prev)
      w->prev->next = w->next;
    else if (srv->waiters == w)
      srv->waiters = w->next;
    if (w->next)
      w->next->prev = w->prev;
    srv->nwaiters--;
  }
  pthread_mutex_unlock(&srv->lock);
  free(w);
}

int srv_head_request(void *server, pulse_serve_request *rq, const char *path) {
  (void)path;
  pulse_server *srv = server;
  if (pulse_serve_resumed(rq)) { /* answer with whatever the head is now */
    /* The wake-up: from the head learned to the handler running again on
     * a daemon thread. (Taken at the resume itself it read the clock the
     * head was learned at, under the same lock: 0 every time.) */
    const srv_waiter *w = pulse_serve_attached(rq);
    if (w != NULL && w->learned > 0) {
      double dt = pulse_serve_now() - w->learned;
      pulse_serve_histogram_add(&srv->metrics.wakeup, dt > 0 ? dt : 0);
    }
    return answer_head(srv, rq);
  }
  const char *after_s = pulse_serve_query(rq, "after");
  const char *timeout_s = pulse_serve_query(rq, "timeout_ms");
  if (after_s == NULL) {
    if (timeout_s != NULL)
      return pulse_serve_reply_error(rq, 400, "timeout_ms needs after=STEP");
    return answer_head(srv, rq);
  }
  pulse_serve_relabel(rq, "head_poll");
  uint64_t after, timeout_ms = 30000;
  if (parse_u64(after_s, &after) != 0)
    return pulse_serve_reply_error(rq, 400, "after must be a step number");
  if (timeout_s != NULL && parse_u64(timeout_s, &timeout_ms) != 0)
    return pulse_serve_reply_error(rq, 400,
                                   "timeout_ms must be a whole number");
  if (timeout_ms > srv->opts.max_poll_ms)
    timeout_ms = srv->opts.max_poll_ms;
  pthread_mutex_lock(&srv->lock);
  int ready = srv->stopping || (srv->head != NULL && srv->head->step > after) ||
              timeout_ms == 0;
  if (!ready && srv->nwaiters >= srv->opts.max_waiters) {
    pthread_mutex_unlock(&srv->lock);
    return pulse_serve_reply_error(rq, 503, "too many long-polls waiting (%u)",
                                   srv->opts.max_waiters);
  }
  srv_waiter *w = ready ? NULL : calloc(1, sizeof *w);
  if (w == NULL) {
    pthread_mutex_unlock(&srv->lock);
    return answer_head(srv, rq); /* ready, or no memory to wait with */
  }
  w->srv = srv;
  w->rq = rq;
  w->after = after;
  w->deadline = pulse_serve_now() + (double)timeout_ms / 1000.0;
  w->next = srv->waiters;
  if (srv->waiters)
    srv->waiters->prev = w;
  srv->waiters = w;
  srv->nwaiters++;
  pulse_serve_attach(rq, w, waiter_done);
  /* Suspended under the lock, so no waker can resume it before it is. */
  pulse_serve_suspend(rq);
  pthread_mutex_unlock(&srv->lock);
  /* The watcher computes its next deadline from the list. */
  uint64_t one = 1;
  ssize_t wr = write(srv->wake_fd, &one, sizeof one);
  (void)wr;
  return PULSE_SERVE_OK;
}

/* ---------------------------------------------------------------- watcher */

static void *watcher_main(void *arg) {
  pulse_server *srv = arg;
  const int poll_ms = 250;
  double next_stat = pulse_serve_now() + poll_ms / 1000.0;
  for (;;) {
    pthread_mutex_lock(&srv->lock);
    int stopping = srv->stopping;
    double now = pulse_serve_now(), deadline = next_stat;
    for (srv_waiter *w = srv->waiters; w != NULL; w = w->next)
      if (w->deadline < deadline)
        deadline = w->deadline;
    pthread_mutex_unlock(&srv->lock);
    if (stopping)
      break;
    /* Catch-up requests that waited long enough for their build answer
     * 503 now; the next one's end bounds the sleep. */
    double next_build = srv_build_expire(srv, now, 0);
    if (next_build < deadline)
      deadline = next_build;
    struct pollfd pf[2] = {{srv->wake_fd, POLLIN, 0},
                           {srv->inotify_fd, POLLIN, 0}};
    int wait_ms = deadline > now ? (int)((deadline - now) * 1000.0) + 1 : 0;
    int n = poll(pf, srv->inotify_fd >= 0 ? 2 : 1, wait_ms);
    int head_event = 0;
    if (n > 0 && (pf[0].revents & POLLIN)) {
      uint64_t v;
      ssize_t r = read(srv->wake_fd, &v, sizeof v);
      (void)r;
    }
    if (n > 0 && srv->inotify_fd >= 0 && (pf[1].revents & POLLIN)) {
      char buf[4096]
          __attribute__((aligned(__alignof__(struct inotify_event))));
      ssize_t len;
      while ((len = read(srv->inotify_fd, buf, sizeof buf)) > 0)
        for (char *p = buf; p < buf + len;) {
          struct inotify_event *ev = (struct inotify_event *)p;
          if (ev->len > 0 && strcmp(ev->name, PULSE_STORE_HEAD_FILE) == 0)
            head_event = 1;
          p += sizeof *ev + ev->len;
        }
    }
    pthread_mutex_lock(&srv->lock);
    stopping = srv->stopping;
    pthread_mutex_unlock(&srv->lock);
    if (stopping)
      break;
    now = pulse_serve_now();
    if (srv->opts.watch && (head_event || now >= next_stat)) {
      srv_reload(srv, 0);
      next_stat = now + poll_ms / 1000.0;
    } else if (now >= next_stat) {
      next_stat = now + poll_ms / 1000.0;
    }
    pthread_mutex_lock(&srv->lock);
    wake_locked(srv, pulse_serve_now(), 0);
    pthread_mutex_unlock(&srv->lock);
    srv_catchup_clean(srv);
  }
  return NULL;
}

pulse_status srv_watcher_start(pulse_server *srv) {
  srv->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (srv->wake_fd < 0)
    return pulse_fail(PULSE_ERR_IO, "server: eventfd: %s", strerror(errno));
  if (srv->opts.watch) {
    srv->inotify_fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (srv->inotify_fd >= 0 &&
        inotify_add_watch(srv->inotify_fd, srv->dir,
                          IN_MOVED_TO | IN_CLOSE_WRITE | IN_CREATE) < 0) {
      PULSE_LOG_AT(PULSE_LOG_INFO,
                   "server: no inotify on %s (%s): polling head.json", srv->dir,
                   strerror(errno));
      close(srv->inotify_fd);
      srv->inotify_fd = -1;
    }
  }
  if (pthread_create(&srv->watcher, NULL, watcher_main, srv) != 0)
    return pulse_fail(PULSE_ERR_NOMEM,
                      "server: cannot start the watcher thread");
  srv->watcher_started = 1;
  return PULSE_OK;
}

void srv_watcher_stop(pulse_server *srv) {
  pthread_mutex_lock(&srv->lock);
  srv->stopping = 1;
  pthread_mutex_unlock(&srv->lock);
  if (srv->watcher_started) {
    uint64_t one = 1;
    ssize_t w = write(srv->wake_fd, &one, sizeof one);
    (void)w;
    pthread_join(srv->watcher, NULL);
    srv->watcher_started = 0;
  }
  if (srv->wake_fd >= 0)
    close(srv->wake_fd);
  if (srv->inotify_fd >= 0)
    close(srv->inotify_fd);
  srv->wake_fd = srv->inotify_fd = -1;
}
