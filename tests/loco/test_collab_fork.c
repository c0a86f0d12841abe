/* test_collab_fork.c - a peer started in a child process forked after its
 * parent fetched from the members (pulse-bench loco forks its joiners from
 * a parent that watches the peers' outcomes): the child's fetches never go
 * over its parent's kept connections. Both processes held copies of the
 * same sockets, so a joiner read answers to its parent's requests (a
 * signed outcome of another round where it waited for a grant) and
 * refused honest grants, then was dropped for payloads that carried
 * other samples than granted. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collab_auth_testutil.h"

/* ------------------------------------------- a server that numbers them */

/* A keep-alive HTTP server on 127.0.0.1 that answers every request with
 * the number of the connection it came on (1 for the first accepted). */
#define NS_CONNS 8
typedef struct {
  int listen_fd;
  uint16_t port;
  volatile int stop;
  pthread_t th;
} numbering_server;

static void *ns_serve(void *arg) {
  numbering_server *s = arg;
  struct pollfd pf[NS_CONNS + 1];
  unsigned number[NS_CONNS + 1];
  size_t n = 1;
  unsigned accepted = 0;
  pf[0] = (struct pollfd){s->listen_fd, POLLIN, 0};
  while (!s->stop) {
    if (poll(pf, n, 20) <= 0)
      continue;
    if ((pf[0].revents & POLLIN) && n < NS_CONNS + 1) {
      int fd = accept(s->listen_fd, NULL, NULL);
      if (fd >= 0) {
        pf[n] = (struct pollfd){fd, POLLIN, 0};
        number[n++] = ++accepted;
      }
    }
    for (size_t i = 1; i < n; i++) {
      if (!(pf[i].revents & (POLLIN | POLLHUP)))
        continue;
      char req[4096];
      ssize_t got = read(pf[i].fd, req, sizeof req - 1);
      if (got <= 0) { /* closed: its slot goes to the last one */
        close(pf[i].fd);
        pf[i] = pf[n - 1], number[i] = number[n - 1];
        n--, i--;
        continue;
      }
      req[got] = '\0';
      /* One answer per request in what arrived (GETs: no bodies). */
      for (char *p = req; (p = strstr(p, "\r\n\r\n")) != NULL; p += 4) {
        char body[16], answer[128];
        int blen = snprintf(body, sizeof body, "%u", number[i]);
        int alen = snprintf(answer, sizeof answer,
                            "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                            "Content-Type: text/plain\r\n\r\n%s",
                            blen, body);
        if (write(pf[i].fd, answer, (size_t)alen) != alen)
          break; /* the client sees no answer and fails the test */
      }
    }
  }
  for (size_t i = 1; i < n; i++)
    close(pf[i].fd);
  return NULL;
}

static void ns_start(numbering_server *s) {
  memset(s, 0, sizeof *s);
  s->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  cr_assert(s->listen_fd >= 0 &&
            bind(s->listen_fd, (struct sockaddr *)&a, sizeof a) == 0 &&
            listen(s->listen_fd, 8) == 0 &&
            getsockname(s->listen_fd, (struct sockaddr *)&a, &len) == 0);
  s->port = ntohs(a.sin_port);
  pthread_create(&s->th, NULL, ns_serve, s);
}

static void ns_stop(numbering_server *s) {
  s->stop = 1;
  pthread_join(s->th, NULL);
  close(s->listen_fd);
}

/* The connection number a GET of url was answered on; 0 when none. */
static unsigned ns_get(const char *url) {
  pulse_bytebuf body = PULSE_BYTEBUF_INIT;
  long status = 0;
  unsigned n = 0;
  char text[16] = "";
  if (loco_http_get(url, 5000, 64, &body, &status) == PULSE_OK &&
      status == 200 && body.size > 0 && body.size < sizeof text) {
    memcpy(text, body.data, body.size);
    n = (unsigned)strtoul(text, NULL, 10);
  }
  pulse_bytebuf_free(&body);
  return n;
}

Test(loco_collab_auth, a_forked_child_fetches_on_connections_of_its_own) {
  numbering_server s;
  ns_start(&s);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/x", (unsigned)s.port);
  /* This thread's engine keeps connection 1 for its next fetch. */
  cr_assert_eq(ns_get(url), 1);
  cr_assert_eq(ns_get(url), 1);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) /* its answer's connection number is its exit status */
    _exit((int)ns_get(url));
  int status = 0;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status));
  cr_assert_eq(WEXITSTATUS(status), 2,
               "the child fetched on connection %d (1: its parent's)",
               WEXITSTATUS(status));
  /* The parent's connection is still its own, and still open. */
  cr_assert_eq(ns_get(url), 1);
  ns_stop(&s);
}

/* ------------------------------------- a joiner forked from a watcher */

#define FORK_ROUNDS 10
#define VIEW_CAP 65536u /* a membership view of three peers fits */

/* The forked joiner: joins through seed, runs to FORK_ROUNDS and writes
 * its global digest and the grants it refused to fd. Exit status 0 when
 * every round went through. */
static int run_forked_joiner(ca_group *g, const char *seed, int fd) {
  uint32_t id = 2;
  pulse_loco *ctx = ca_ctx(id, NULL);
  pulse_loco_collab *c = ca_peer(ctx, g->k[id], g->pins, g->n);
  float *theta = malloc(CA_P * sizeof *theta);
  memcpy(theta, g->init, CA_P * sizeof *theta);
  pulse_status st = pulse_loco_collab_join(c, seed, theta, 30000);
  while (st == PULSE_OK && pulse_loco_round(ctx) < FORK_ROUNDS) {
    pulse_loco_collab_figures info;
    st = pulse_loco_collab_round(c, theta, 16, ca_step, &id, 0, &info);
  }
  if (st != PULSE_OK)
    fprintf(stderr, "forked joiner: %s\n", pulse_error_detail());
  pthread_mutex_lock(&c->lock);
  uint64_t out[2] = {pulse_loco_global_digest(ctx),
                     c->auth_refused_kind[PULSE_LOCO_AUTH_GRANT - 1]};
  pthread_mutex_unlock(&c->lock);
  int ok = write(fd, out, sizeof out) == (ssize_t)sizeof out;
  return st == PULSE_OK && ok ? 0 : 1;
}

Test(loco_collab_auth, a_joiner_forked_by_a_watcher_has_its_grants_verified,
     .timeout = 120) {
#if defined(__SANITIZE_ADDRESS__)
  /* The founders' server threads run while the watcher forks: gcc 12's
   * ASan allocator takes no lock around fork, and the child can block for
   * good on one a thread held then (seen: 1 run in about 60 under load,
   * every thread of the child in SizeClassAllocator64::GetFromAllocator).
   * glibc's malloc is fork-safe; the unsanitized build runs this test. */
  cr_skip_test("ASan's allocator is not fork-safe while other threads run");
#endif
  ca_group g;
  ca_group_start(&g, 3, 2, FORK_ROUNDS);
  char views[2][160];
  for (int i = 0; i < 2; i++)
    snprintf(views[i], sizeof views[i], "%s/v1/loco/members", g.m[i].url);
  /* The watcher (this thread) fetches from both founders before the fork:
   * its engine keeps a connection to each. */
  for (int i = 0; i < 2; i++) {
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long status = 0;
    cr_assert_eq(loco_http_get(views[i], 2000, VIEW_CAP, &b, &status),
                 PULSE_OK);
    cr_assert_eq(status, 200);
    pulse_bytebuf_free(&b);
  }
  int p[2];
  cr_assert_eq(pipe(p), 0);
  fflush(NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(p[0]);
    _exit(run_forked_joiner(&g, g.m[0].url, p[1]));
  }
  close(p[1]);
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, ca_run, &g.r[i]);
  /* The watcher goes on fetching while the joiner runs (the bench polls
   * every peer's outcome), for at most a minute. */
  int status = 0;
  pid_t done = 0;
  uint64_t end = loco_now_ms() + 60000;
  for (unsigned i = 0; done == 0 && loco_now_ms() < end; i++) {
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long st = 0;
    loco_http_get(views[i % 2], 2000, VIEW_CAP, &b, &st);
    pulse_bytebuf_free(&b);
    done = waitpid(pid, &status, WNOHANG);
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  uint64_t got[2] = {0, 0};
  ssize_t n = read(p[0], got, sizeof got);
  close(p[0]);
  cr_assert_neq(done, 0, "the forked joiner did not end within a minute");
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                n == (ssize_t)sizeof got,
            "the forked joiner failed (its stderr says why)");
  cr_assert_eq(got[1], 0, "the joiner refused %llu honest grants",
               (unsigned long long)got[1]);
  for (int i = 0; i < 2; i++) {
    ca_runner *r = &g.r[i];
    cr_assert_eq(r->st, PULSE_OK, "peer %d: %s", i, r->detail);
    cr_assert_eq(pulse_loco_round(r->ctx), FORK_ROUNDS, "peer %d", i);
    cr_assert_eq(pulse_loco_global_digest(r->ctx), got[0], "peer %d", i);
    for (int w = 0; w < 4; w++)
      cr_assert_eq(ca_refused(r->c, (const char *[]){"unsigned", "forged",
                                                     "replayed", "foreign"}[w]),
                   0, "peer %d", i);
  }
  ca_group_free(&g);
}
