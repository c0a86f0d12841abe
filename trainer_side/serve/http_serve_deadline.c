/* http_serve_deadline.c - the HTTP serving layer's deadlines for receiving
 * a request's headers and its body (http_serve_impl.h,
 * opts.header_timeout_s), and its cap on connections.
 *
 * libmicrohttpd's own timeout is an idle timeout: a client that sends one
 * header byte every few seconds (slowloris) never hits it and holds its
 * connection for ever; enough of them and nobody else is answered. Here
 * each connection has a deadline: from its start (and from each new
 * request line on a kept-alive connection) its headers must be complete
 * within header_timeout_s. Then its body (if any) must keep up an average
 * of SERVE_BODY_MIN_RATE after a grace of header_timeout_s: headers sent
 * whole and a body dripped a byte at a time once held a connection for
 * ever, the request counting as running. Once the request is read whole it
 * runs as long as it needs (downloads, long-polls). Between requests a
 * kept-alive connection waits at most idle_timeout_s + header_timeout_s for the
 * next request line (the idle timeout normally closes it before). A watcher
 * thread shuts down the socket of a connection past its deadline; microhttpd
 * then sees the end of the stream and closes it as it closes any other.
 *
 * The deadline alone does not keep a server reachable: clients spread over
 * many addresses (the per-address limit holds for each) can hold every
 * connection, each until its deadline, and take back each one freed before
 * anybody else does (seen: 20 addresses x 55 slow connections, 2 of 10
 * probes answered). So the cap on connections is enforced here, not by
 * microhttpd (whose limit is set higher, s->mhd_limit, so that it keeps
 * accepting): a new connection past the cap evicts the connection that has
 * waited longest without a request running (still sending its headers or
 * its body, or idle between requests), which a slow client never is for
 * long; a request that runs (a download, a long-poll) is never evicted. When
 * every other connection runs a request, the new one is closed instead. A
 * client answered quickly needs its connection for milliseconds: it is the
 * newest, evicted only after every slower one. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>

#include "http_serve_core_impl.h"
#include "pulse_log.h"

/* Bytes per second a request body must average, once its grace of
 * header_timeout_s is over: a floor that every real link clears many times
 * over (an upload of a whole payload included), while a client dripping a
 * byte now and then falls behind it within the grace. Holding a connection
 * at the floor costs a client real bandwidth: no longer a slowloris. */
#define SERVE_BODY_MIN_RATE (16.0 * 1024)

/* Where a connection's current request is. A connection that waits on its
 * client (WAITING, BODY) is evictable; one that runs a request (BUSY: the
 * server answers, or waits on its own event) is not. */
enum { CONN_WAITING, CONN_BODY, CONN_BUSY };

struct serve_conn {
  int fd;
  int shut;          /* shut down already (deadline, eviction, refusal) */
  int phase;         /* CONN_*; 0: WAITING (for headers, or a request) */
  double since;      /* when it started waiting (opened, request done), or
                        where its body would be at the floor rate */
  double deadline;   /* monotonic seconds; INFINITY: none now */
  double body_start; /* when the headers were in (CONN_BODY) */
  uint64_t body_got; /* body bytes in since then */
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
    if (x != c && !x->shut && x->phase != CONN_BUSY &&
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

/* The connection's state, with conns_lock taken (the caller unlocks);
 * NULL when it has none (out of memory when it opened). */
static serve_conn *conn_lock(pulse_serve *s, struct MHD_Connection *conn) {
  pthread_mutex_lock(&s->conns_lock);
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci != NULL ? ci->socket_context : NULL;
}

/* The deadline `after` seconds past `t`; INFINITY without a header
 * timeout (no deadline at all then). */
static double deadline_after(const pulse_serve *s, double t, double after) {
  return s->opts.header_timeout_s > 0 ? t + after : INFINITY;
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
  serve_conn *c = conn_lock(s, conn);
  double d = deadline_after(s, pulse_serve_now(), s->opts.header_timeout_s);
  if (c != NULL && d < c->deadline)
    c->deadline = d;
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_headers_done(pulse_serve *s, struct MHD_Connection *conn) {
  serve_conn *c = conn_lock(s, conn);
  if (c != NULL) {
    c->phase = CONN_BODY;
    c->since = c->body_start = pulse_serve_now();
    c->body_got = 0;
    c->deadline = deadline_after(s, c->since, s->opts.header_timeout_s);
  }
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_body_data(pulse_serve *s, struct MHD_Connection *conn,
                          size_t n) {
  serve_conn *c = conn_lock(s, conn);
  if (c != NULL && c->phase == CONN_BODY) {
    c->body_got += n;
    /* A body ahead of the floor rate is "newer" than one that just began,
     * and evicted after it. */
    c->since = c->body_start + (double)c->body_got / SERVE_BODY_MIN_RATE;
    c->deadline = deadline_after(s, c->since, s->opts.header_timeout_s);
  }
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_request_read(pulse_serve *s, struct MHD_Connection *conn) {
  serve_conn *c = conn_lock(s, conn);
  if (c != NULL) {
    c->phase = CONN_BUSY;
    c->deadline = INFINITY;
  }
  pthread_mutex_unlock(&s->conns_lock);
}

void serve_conn_request_done(pulse_serve *s, struct MHD_Connection *conn) {
  serve_conn *c = conn_lock(s, conn);
  if (c != NULL) {
    c->phase = CONN_WAITING;
    c->since = pulse_serve_now();
    c->deadline = deadline_after(
        s, c->since, (double)s->opts.idle_timeout_s + s->opts.header_timeout_s);
  }
  pthread_mutex_unlock(&s->conns_lock);
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
      if (!c->shut && c->deadline < now) { /* by what was late */
        atomic_fetch_add(c->phase == CONN_BODY ? &s->metrics.body_timeouts
                                               : &s->metrics.header_timeouts,
                         1);
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
