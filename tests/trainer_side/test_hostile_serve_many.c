/* A slowloris spread over many source addresses (issue "Reliability and
 * security", finding 2): 20 attacker addresses x 55 slow connections,
 * reconnecting as the server closed them, left 2 of 10 probes from a fresh
 * address answered: the per-address limit held for each address, and
 * together they held every connection. Now a connection past the cap evicts
 * the one that has waited longest with no request running. Here, scaled
 * down to run in a few seconds: a cap of 60 connections, 8 per address,
 * attackers on 127.0.0.2..127.0.0.21 (up to 160 slow or idle connections,
 * each reopened at once when closed) against probes from 127.0.0.1, each of
 * which must be answered within 1 s. The header deadline (10 s) never
 * fires during the test: only the cap frees connections. */
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
#include <time.h>
#include <unistd.h>

#include "files_testutil.h"
#include "metrics_testutil.h"
#include "serve_testutil.h"
#include "pulse_server.h"
#include "store_impl.h"

enum { ADDRS = 20, PER_ADDR = 8, SLOTS = ADDRS * PER_ADDR };

typedef struct {
  uint16_t port;
  atomic_int stop;
  double until; /* stops by itself then, whatever happens */
  long opened, reopened;
  int held_max; /* most connections open at once seen */
} attack;

/* Each slot keeps a slow connection: opens it, sends a request line and a
 * header byte every 200 ms, never the end of the headers (a quarter of the
 * slots stay idle: not a byte); reopens it as soon as the server closes it
 * (at most 40 reopens per 5 ms round). */
static void *attack_main(void *arg) {
  attack *a = arg;
  static int fd[SLOTS];
  static double last[SLOTS];
  static int started[SLOTS];
  const char *start = "GET /v1/head HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  for (int i = 0; i < SLOTS; i++)
    fd[i] = -1;
  while (!atomic_load(&a->stop) && tu_now_s() < a->until) {
    int reopen = 40, open_now = 0;
    for (int i = 0; i < SLOTS; i++) {
      if (fd[i] >= 0) {
        char c[64];
        ssize_t r = recv(fd[i], c, sizeof c, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != ENOTCONN)) {
          close(fd[i]);
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
      if (i % 4 == 3) /* a quarter of them idle: never a byte */
        continue;
      if (!started[i]) {
        if (send(fd[i], start, strlen(start), MSG_NOSIGNAL) > 0)
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

Test(hostile_serve, a_slowloris_from_many_addresses_leaves_a_new_client_served,
     .timeout = 30) {
  char *dir = ts_store_with_head();
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  so.max_connections = 60;
  so.max_per_ip = PER_ADDR;
  pulse_server *srv;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  attack a;
  memset(&a, 0, sizeof a);
  a.port = pulse_server_port(srv);
  a.until = tu_now_s() + 8;
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, attack_main, &a), 0);
  usleep(700 * 1000); /* every slot taken, and retaken */
  int ok = 0, asked = 0;
  double worst = 0;
  for (int k = 0; k < 10; k++, asked++) {
    double t0 = tu_now_s();
    ok += ts_get_answered(a.port, k % 2 ? "/v1/head" : "/healthz", 1.0);
    double dt = tu_now_s() - t0;
    worst = dt > worst ? dt : worst;
    usleep(100 * 1000);
  }
  atomic_store(&a.stop, 1);
  pthread_join(th, NULL);
  long long evicted =
      tu_server_metric(srv, "pulse_http_evicted_connections_total");
  cr_expect_eq(ok, asked,
               "%d of %d probes answered within 1 s (slowest %.2f s; the "
               "attack opened %ld connections, held up to %d at once; %lld "
               "evicted)",
               ok, asked, worst, a.opened, a.held_max, evicted);
  cr_log_info("%d of %d probes answered, slowest %.3f s; the attack opened "
              "%ld connections, held up to %d; %lld evicted",
              ok, asked, worst, a.opened, a.held_max, evicted);
  /* The attack was one: more slow connections than the cap, and churn. */
  cr_expect_gt(a.held_max, 60, "the attackers held only %d", a.held_max);
  cr_expect_gt(evicted, 0);
  /* And once it is over the server still answers. */
  cr_expect(ts_get_answered(pulse_server_port(srv), "/healthz", 1.0));
  pulse_server_free(srv);
  tu_rm_rf(dir);
}
