/* POST bodies that arrive a byte at a time (issue 35, item 2). The header
 * deadline and the eviction at the cap (test_hostile_serve*.c) stopped at
 * the end of the headers: a request whose headers were in counted as
 * running, so a client that sent complete POST headers with a
 * Content-Length and then dripped the body held its connection for ever,
 * never evicted; from enough addresses, such clients hold every slot and
 * new clients are refused. Now a body must keep up a minimum rate after a
 * grace of header_timeout_s, and a connection whose body is still arriving
 * is evicted like one whose headers are; a long-poll (the server waiting
 * on its own event) is not. Tested on the layer itself, with a route that
 * takes a body, as PULSELoCo's peers' servers do. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "files_testutil.h"
#include "http_serve_impl.h"
#include "serve_testutil.h"

/* Probes the server closed before they had an answer and that connected
 * again (see answered). */
static atomic_int probe_reconnects;

/* Sends `req` whole from 127.0.0.1, in pieces of `piece` bytes `gap_s`
 * apart (0: at once), and reads the answer until `want` appears in it: 1
 * when it did within limit_s. A connection the server closes before any
 * answer (evicted at the cap: under a flood of new connections, a probe
 * the loaded scheduler leaves waiting a few milliseconds can be the
 * connection that waited longest) connects again once within limit_s, as
 * every HTTP client does; a refusal, which is what a server whose slots
 * are all held gives, is refused again. */
static int answered(uint16_t port, const char *req, size_t piece, double gap_s,
                    const char *want, double limit_s) {
  double t0 = tu_now_s();
  int found = 0;
  for (int attempt = 0; attempt < 2 && !found && tu_now_s() - t0 < limit_s;
       attempt++) {
    int fd = ts_open_from("127.0.0.1", port);
    if (fd < 0)
      return 0;
    if (attempt > 0)
      atomic_fetch_add(&probe_reconnects, 1);
    char buf[1024];
    size_t n = strlen(req), sent = 0, got = 0;
    double last = 0;
    int closed = 0;
    if (piece == 0)
      piece = n;
    while (!found && !closed && tu_now_s() - t0 < limit_s) {
      struct pollfd p = {fd, POLLIN, 0};
      if (sent < n && tu_now_s() - last >= gap_s) {
        size_t k = n - sent < piece ? n - sent : piece;
        ssize_t w = send(fd, req + sent, k, MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN) {
          closed = 1;
          break;
        }
        sent += w > 0 ? (size_t)w : 0;
        last = tu_now_s();
      }
      if (poll(&p, 1, 10) <= 0)
        continue;
      ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
      if (r <= 0) {
        closed = 1;
        break;
      }
      got += (size_t)r;
      buf[got] = '\0';
      found = strstr(buf, want) != NULL;
    }
    close(fd);
    if (!closed || got > 0)
      break; /* answered, answered otherwise, or out of time */
  }
  return found && tu_now_s() - t0 < limit_s;
}

/* POST /post: answers 200 with the length of the body it got. */
static int echo_length(void *user, pulse_serve_request *rq, const char *path) {
  (void)user, (void)path;
  size_t n;
  (void)pulse_serve_request_body(rq, &n);
  char text[32];
  int len = snprintf(text, sizeof text, "length %zu\n", n);
  pulse_serve_meta m = {0, "text/plain", NULL, NULL, NULL};
  return pulse_serve_reply_bytes(rq, &m, text, (size_t)len);
}

/* GET /wait: a long-poll, parked until the test resumes it. */
static pthread_mutex_t parked_lock = PTHREAD_MUTEX_INITIALIZER;
static pulse_serve_request *parked;

static int wait_event(void *user, pulse_serve_request *rq, const char *path) {
  (void)user, (void)path;
  if (pulse_serve_resumed(rq)) { /* by the test, or by wake_all */
    pulse_serve_meta m = {0, "text/plain", NULL, NULL, NULL};
    return pulse_serve_reply_bytes(rq, &m, "event\n", 6);
  }
  pthread_mutex_lock(&parked_lock);
  parked = rq;
  pulse_serve_suspend(rq);
  pthread_mutex_unlock(&parked_lock);
  return PULSE_SERVE_OK;
}

/* Resumes the parked long-poll, if any: 1 when there was one. */
static int wake(void) {
  pthread_mutex_lock(&parked_lock);
  pulse_serve_request *rq = parked;
  parked = NULL;
  if (rq != NULL)
    pulse_serve_resume(rq);
  pthread_mutex_unlock(&parked_lock);
  return rq != NULL;
}

static void wake_all(void *user) {
  (void)user;
  (void)wake();
}

static const pulse_serve_route routes[] = {
    {"/post", 0, PULSE_SERVE_POST, "post", echo_length, 64 * 1024},
    {"/wait", 0, PULSE_SERVE_GET, "wait", wait_event, 0},
};

static pulse_serve *start(unsigned cap, unsigned per_ip,
                          unsigned header_timeout_s) {
  pulse_serve_opts o;
  pulse_serve_opts_init(&o);
  o.name = "body test";
  o.threads = 2;
  o.max_connections = cap;
  o.max_per_ip = per_ip;
  o.header_timeout_s = header_timeout_s;
  o.routes = routes;
  o.route_count = sizeof routes / sizeof routes[0];
  o.wake_all = wake_all;
  pulse_serve *s;
  cr_assert_eq(pulse_serve_create(&o, &s), PULSE_OK, "%s",
               pulse_error_detail());
  return s;
}

static unsigned long long metric(pulse_serve *s, const char *name) {
  pulse_buffer text = {NULL, 0};
  cr_assert_eq(pulse_serve_metrics_text(s, &text), PULSE_OK);
  char *t = strndup((const char *)text.data, text.size);
  pulse_buffer_free(&text);
  char line[128];
  snprintf(line, sizeof line, "\n%s ", name); /* the value, not its HELP */
  const char *p = strstr(t, line);
  unsigned long long v = p ? strtoull(p + strlen(line), NULL, 10) : 0;
  free(t);
  return v;
}

static const char *const drip_headers =
    "POST /post HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n";
static const char *const honest_post =
    "POST /post HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    "Content-Length: 10\r\n\r\n0123456789";

enum { ADDRS = 10, PER_ADDR = 8, SLOTS = ADDRS * PER_ADDR, CAP = 40 };

typedef struct {
  uint16_t port;
  atomic_int stop;
  double until; /* stops by itself then, whatever happens */
  long opened;
  int held_max; /* most connections open at once */
} attack;

/* Each slot keeps a dripping POST: complete headers with a Content-Length
 * of 1000, then one body byte every 200 ms; reopened as soon as the
 * server closes it (at most 40 reopens per 5 ms round). */
static void *attack_main(void *arg) {
  attack *a = arg;
  static int fd[SLOTS];
  static double last[SLOTS];
  static int started[SLOTS];
  for (int i = 0; i < SLOTS; i++)
    fd[i] = -1;
  while (!atomic_load(&a->stop) && tu_now_s() < a->until) {
    int reopen = 40, open_now = 0;
    for (int i = 0; i < SLOTS; i++) {
      if (fd[i] >= 0) {
        char c[64];
        ssize_t r = recv(fd[i], c, sizeof c, 0);
        if (r >= 0 || (errno != EAGAIN && errno != ENOTCONN)) {
          close(fd[i]); /* closed, or answered: a body never completes */
          fd[i] = -1;
        }
      }
      if (fd[i] < 0 && reopen > 0) {
        char from[32];
        snprintf(from, sizeof from, "127.0.0.%d", 2 + i / PER_ADDR);
        fd[i] = ts_open_from(from, a->port);
        reopen--;
        started[i] = 0;
        last[i] = tu_now_s();
        if (fd[i] >= 0)
          a->opened++;
      }
      if (fd[i] < 0)
        continue;
      open_now++;
      double t = tu_now_s();
      if (!started[i]) {
        if (send(fd[i], drip_headers, strlen(drip_headers), MSG_NOSIGNAL) > 0)
          started[i] = 1;
      } else if (t - last[i] > 0.2) {
        (void)send(fd[i], "a", 1, MSG_NOSIGNAL);
        last[i] = t;
      }
    }
    if (open_now > a->held_max)
      a->held_max = open_now;
    usleep(5000);
  }
  for (int i = 0; i < SLOTS; i++)
    if (fd[i] >= 0)
      close(fd[i]);
  return NULL;
}

Test(hostile_serve,
     dripping_post_bodies_from_many_addresses_leave_a_new_client_served,
     .timeout = 30) {
  /* A cap of 40 connections, 8 per address, against 80 dripping POSTs
   * from 127.0.0.2..11 (each reopened as soon as it is closed) and probes
   * from 127.0.0.1, each answered within 1 s. A header deadline of 10 s,
   * which never fires here: only eviction at the cap frees connections. */
  pulse_serve *s = start(CAP, PER_ADDR, 10);
  attack a;
  memset(&a, 0, sizeof a);
  a.port = pulse_serve_port(s);
  a.until = tu_now_s() + 8;
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, attack_main, &a), 0);
  usleep(700 * 1000); /* every slot taken, bodies dripping */
  int ok = 0, asked = 0;
  double worst = 0;
  for (int k = 0; k < 10; k++, asked++) {
    double t0 = tu_now_s();
    ok += k % 2 ? answered(a.port, honest_post, 0, 0, "length 10", 1.0)
                : answered(a.port,
                           "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                           "Connection: close\r\n\r\n",
                           0, 0, "HTTP/1.1 200", 1.0);
    double dt = tu_now_s() - t0;
    worst = dt > worst ? dt : worst;
    usleep(100 * 1000);
  }
  atomic_store(&a.stop, 1);
  pthread_join(th, NULL);
  unsigned long long evicted =
      metric(s, "pulse_http_evicted_connections_total");
  unsigned long long refused =
      metric(s, "pulse_http_refused_connections_total");
  int again = atomic_load(&probe_reconnects);
  cr_expect_eq(ok, asked,
               "%d of %d probes answered within 1 s (slowest %.2f s, %d "
               "connected again; the attack opened %ld connections, held up "
               "to %d at once; %llu evicted, %llu refused)",
               ok, asked, worst, again, a.opened, a.held_max, evicted, refused);
  cr_log_info("%d of %d probes answered, slowest %.3f s, %d connected again; "
              "the attack opened %ld connections, held up to %d; %llu "
              "evicted, %llu refused",
              ok, asked, worst, again, a.opened, a.held_max, evicted, refused);
  /* The attack was one: more dripping connections than the cap. */
  cr_expect_gt(a.held_max, CAP, "the attackers held only %d", a.held_max);
  cr_expect_gt(evicted, 0);
  cr_expect(answered(a.port, honest_post, 0, 0, "length 10", 1.0));
  pulse_serve_free(s);
}

typedef struct {
  uint16_t port;
  int ok;
  double took;
} poll_job;

static void *poll_main(void *arg) {
  poll_job *j = arg;
  double t0 = tu_now_s();
  j->ok = answered(j->port,
                   "GET /wait HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                   0, 0, "event", 6.0);
  j->took = tu_now_s() - t0;
  return NULL;
}

Test(hostile_serve, a_dripping_post_body_is_cut_off_at_its_deadline,
     .timeout = 30) {
  pulse_serve *s = start(64, 0, 1);
  uint16_t port = pulse_serve_port(s);
  int fd = ts_open_from("127.0.0.1", port);
  cr_assert_geq(fd, 0);
  double t0 = tu_now_s(), closed_at = 0;
  (void)send(fd, drip_headers, strlen(drip_headers), MSG_NOSIGNAL);
  while (tu_now_s() - t0 < 4 && closed_at == 0) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char c;
      ssize_t r = recv(fd, &c, 1, 0);
      if (r <= 0 && !(r < 0 && errno == EAGAIN))
        closed_at = tu_now_s() - t0;
    }
    if (send(fd, "a", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN && closed_at == 0)
      closed_at = tu_now_s() - t0;
  }
  close(fd);
  cr_expect(closed_at > 0.5 && closed_at < 2.5,
            "the dripping POST closed after %.2f s (0: not within 4 s)",
            closed_at);
  cr_log_info("the dripping POST closed after %.2f s", closed_at);
  cr_expect_eq(metric(s, "pulse_http_body_timeouts_total"), 1);
  cr_expect_eq(metric(s, "pulse_http_header_timeouts_total"), 0);
  /* An honest body in pieces is taken whole. */
  cr_expect(answered(port, honest_post, 40, 0.1, "length 10", 1.0));
  /* A body that keeps above the floor rate may take longer than the
   * grace: 64 KiB in 8 KiB pieces 0.25 s apart (2 s, 32 KiB/s). */
  const char *head = "POST /post HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     "Content-Length: 65536\r\n\r\n";
  char *big = malloc(strlen(head) + 65536 + 1);
  cr_assert_not_null(big);
  strcpy(big, head);
  memset(big + strlen(head), 'b', 65536);
  big[strlen(head) + 65536] = '\0';
  double t1 = tu_now_s();
  cr_expect(answered(port, big, 8192, 0.25, "length 65536", 4.0));
  cr_expect_gt(tu_now_s() - t1, 1.5, "the upload was not slow");
  free(big);
  /* A long-poll parked for over twice the deadline is not cut off. */
  poll_job job = {port, 0, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, poll_main, &job), 0);
  usleep(2500 * 1000);
  int woke = wake();
  pthread_join(th, NULL);
  cr_expect(woke, "the long-poll was not parked");
  cr_expect(job.ok && job.took > 2.4, "the long-poll %s after %.2f s",
            job.ok ? "answered" : "failed", job.took);
  cr_expect_eq(metric(s, "pulse_http_body_timeouts_total"), 1);
  pulse_serve_free(s);
}
