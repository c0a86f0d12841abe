/* http_serve_deadline.c - the HTTP serving layer's deadline for receiving a
 * request's headers (http_serve_impl.h, opts.header_timeout_s), and its cap
 * on connections.
 *
 * libmicrohttpd's own timeout is an idle timeout: a client that sends one
 * header byte every few seconds (slowloris) never hits it and holds its
 * connection for ever; enough of them and nobody else is answered. Here
 * each connection has a deadline: from its start (and from each new
 * request line on a kept-alive connection) its headers must be complete
 * within header_timeout_s; once they are, the request runs as long as it
 * needs (downloads, long-polls). Between requests a kept-alive connection
 * waits at most idle_timeout_s + header_timeout_s for the next request line
 * (the idle timeout normally closes it before). A watcher thread shuts down
 * the socket of a connection past its deadline; microhttpd then sees the
 * end of the stream and closes it as it closes any other.
 *
 * The deadline alone does not keep a server reachable: clients spread over
 * many addresses (the per-address limit holds for each) can hold every
 * connection, each until its deadline, and take back each one freed before
 * anybody else does (seen: 20 addresses x 55 slow connections, 2 of 10
 * probes answered). So the cap on connections is enforced here, not by
 * microhttpd (whose limit is set higher, s->mhd_limit, so that it keeps
 * accepting): a new connection past the cap evicts the connection that has
 * waited longest without a request running (still sending its headers, or
 * idle between requests), which a slow client never is for long; a request
 * that runs (a download, a long-poll) is never evicted. When every other
 * connection runs a request, the new one is closed instead. A client
 * answered quickly needs its connection for milliseconds: it is the
 * newest, evicted only after every slower one. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "http_serve_core_impl.h"
#include "pulse_log.h"

struct serve_conn {
  int fd;
  int shut;         /* shut down already (deadline, eviction, refusal) */
  int busy;         /* a request runs: its headers are in, it is not done */
  double since;     /* when it last started waiting (opened, request done) */
  double deadline;  /* monotonic seconds; INFINITY: none now */
  serve_conn *prev, *next;
};

/* Shuts c down (microhttpd closes it and notifies). conns_lock held. */
static void conn_shut(pulse_serve *s, serve_conn *c) {
  c->shut = 1;
  s->nlive--;
  shutdown(c->fd, SHUT_RDWR);
}

/* Past the cap: evicts the live connection, other than c, that has waited
 * longest with no request running; none: c itself. conns_lock held. */
static void conn_make_room(pulse_serve *s, serve_conn *c) {
  serve_conn *victim = NULL;
  for (serve_conn *x = s->conns; x != NULL; x = x->next)
    if (x != c && !x->shut && !x->busy &&
        (victim == NULL || x->since < victim->since))
      victim = x;
  if (victim != NULL) {
    atomic_fetch_add(&s->metrics.evictions, 1);
    conn_shut(s, victim);
  } else {
    atomic_fetch_add(&s->metrics.refused, 1);
    conn_shut(s, c);
  }
}

static serve_conn *conn_of(struct MHD_Connection *conn) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci != NULL ? ci->socket_context : NULL;
}

/* busy: 1 (headers in), 0 (done: waiting from now), -1 (unchanged). */
static void set_deadline(pulse_serve *s, struct MHD_Connection *conn,
                         double deadline, int only_earlier, int busy) {
  pthread_mutex_lock(&s->conns_lock);
  serve_conn *c = conn_of(conn);
  if (c != NULL && s->opts.header_timeout_s > 0 &&
      (!only_earlier || deadline < c->deadline))
    c->deadline = deadline;
  if (c != NULL && busy >= 0) {
    c->busy = busy;
    if (!busy)
      c->since = pulse_serve_now();
  }
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_notify(void *cls, struct MHD_Connection *conn,
                       void **socket_context,
                       enum MHD_ConnectionNotificationCode code) {
  pulse_serve *s = cls;
  pthread_mutex_lock(&s->conns_lock);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    serve_conn *c = ci != NULL ? calloc(1, sizeof *c) : NULL;
    if (c != NULL) { /* without one the connection has the idle timeout only */
      c->fd = ci->connect_fd;
      c->since = pulse_serve_now();
      c->deadline = s->opts.header_timeout_s > 0
                        ? c->since + s->opts.header_timeout_s
                        : INFINITY;
      c->next = s->conns;
      if (s->conns != NULL)
        s->conns->prev = c;
      s->conns = c;
      if (++s->nlive > s->cap)
        conn_make_room(s, c);
    }
    *socket_context = c;
  } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context != NULL) {
    /* microhttpd closes the socket after this call: the watcher, which
     * shuts sockets down under this lock, never touches a closed one. */
    serve_conn *c = *socket_context;
    if (!c->shut)
      s->nlive--;
    if (c->prev != NULL)
      c->prev->next = c->next;
    else
      s->conns = c->next;
    if (c->next != NULL)
      c->next->prev = c->prev;
    free(c);
    *socket_context = NULL;
  }
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_request_line(pulse_serve *s, struct MHD_Connection *conn) {
  set_deadline(s, conn, pulse_serve_now() + s->opts.header_timeout_s, 1, -1);
}

void serve_conn_headers_done(pulse_serve *s, struct MHD_Connection *conn) {
  set_deadline(s, conn, INFINITY, 0, 1);
}

void serve_conn_request_done(pulse_serve *s, struct MHD_Connection *conn) {
  set_deadline(s, conn,
               pulse_serve_now() + s->opts.idle_timeout_s +
                   s->opts.header_timeout_s,
               0, 0);
}

static void *watch(void *arg) {
  pulse_serve *s = arg;
  pthread_mutex_lock(&s->conns_lock);
  while (!s->watch_stop) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200 * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&s->watch_cv, &s->conns_lock, &until);
    double now = pulse_serve_now();
    for (serve_conn *c = s->conns; c != NULL; c = c->next)
      if (!c->shut && c->deadline < now) {
        atomic_fetch_add(&s->metrics.header_timeouts, 1); /* seen first */
        conn_shut(s, c);
      }
  }
  pthread_mutex_unlock(&s->conns_lock);
  return NULL;
}

int serve_deadline_start(pulse_serve *s) {
  pthread_mutex_init(&s->conns_lock, NULL);
  pthread_cond_init(&s->watch_cv, NULL);
  if (s->opts.header_timeout_s == 0)
    return 0;
  if (pthread_create(&s->watcher, NULL, watch, s) != 0)
    return -1;
  s->watcher_running = 1;
  return 0;
}

void serve_deadline_stop(pulse_serve *s) {
  if (s->watcher_running) {
    pthread_mutex_lock(&s->conns_lock);
    s->watch_stop = 1;
    pthread_cond_signal(&s->watch_cv);
    pthread_mutex_unlock(&s->conns_lock);
    pthread_join(s->watcher, NULL);
    s->watcher_running = 0;
  }
  /* Called after the daemon stopped: every connection was closed and
   * notified, so the list is empty. */
  pthread_cond_destroy(&s->watch_cv);
  pthread_mutex_destroy(&s->conns_lock);
}
