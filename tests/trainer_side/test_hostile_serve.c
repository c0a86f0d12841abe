/* The server under connection exhaustion (issue 15, "Hostile networks"):
 * 2,000 idle connections and 1,100 slowloris clients (a header byte now and
 * then, never the end of the headers) from one address once left nobody
 * else answered; with the per-address limit and the header deadline,
 * normal clients from another address get /healthz and the head within
 * 1 s, and a slow client is cut off at the deadline however steadily it
 * sends. Clients use 127.0.0.2 as the attackers' source address. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "files_testutil.h"
#include "serve_testutil.h"
#include "pulse_server.h"
#include "store_impl.h"

/* A non-blocking TCP connection to port from source address `from`: the
 * attacks here need every one they ask for. */
static int open_from(const char *from, uint16_t port) {
  int fd = ts_open_from(from, port);
  cr_assert_geq(fd, 0, "connect from %s: %s", from, strerror(errno));
  return fd;
}

static void raise_fd_limit(rlim_t want) {
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur < want) {
    rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  cr_assert_geq(rl.rlim_cur, 4000, "the test needs 4000 descriptors (hard "
                                   "limit %llu)",
                (unsigned long long)rl.rlim_max);
}

Test(hostile_serve, idle_and_slowloris_connections_leave_others_served) {
  raise_fd_limit(8192);
  char *dir = ts_store_with_head();
  pulse_server_opts so;
  pulse_server_opts_init(&so); /* the defaults defend */
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  pulse_server *srv;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  uint16_t port = pulse_server_port(srv);
  enum { IDLE = 2000, SLOW = 1100 };
  static int fds[IDLE + SLOW];
  for (int i = 0; i < IDLE + SLOW; i++)
    fds[i] = open_from("127.0.0.2", port);
  /* The slow ones start a request and send a header byte now and then. */
  const char *start = "GET /v1/head HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  for (int i = IDLE; i < IDLE + SLOW; i++)
    (void)send(fds[i], start, strlen(start), MSG_NOSIGNAL);
  int ok = 0, asked = 0;
  double worst = 0;
  for (int round = 0; round < 3; round++) {
    for (int i = IDLE; i < IDLE + SLOW; i++)
      (void)send(fds[i], "a", 1, MSG_NOSIGNAL);
    for (int k = 0; k < 5; k++, asked++) {
      double t0 = tu_now_s();
      ok += ts_get_answered(port, k % 2 ? "/v1/head" : "/healthz", 1.0);
      double dt = tu_now_s() - t0;
      worst = dt > worst ? dt : worst;
    }
  }
  cr_expect_eq(ok, asked, "%d of %d normal requests answered within 1 s "
                          "(slowest %.2f s)",
               ok, asked, worst);
  for (int i = 0; i < IDLE + SLOW; i++)
    close(fds[i]);
  pulse_server_free(srv);
  tu_rm_rf(dir);
}

Test(hostile_serve, a_slow_client_is_cut_off_at_the_header_deadline) {
  char *dir = ts_store_with_head();
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  so.header_timeout_s = 1;
  pulse_server *srv;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  int fd = open_from("127.0.0.1", pulse_server_port(srv));
  const char *start = "GET /v1/head HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  double t0 = tu_now_s(), closed_at = 0;
  (void)send(fd, start, strlen(start), MSG_NOSIGNAL);
  while (tu_now_s() - t0 < 4 && closed_at == 0) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 200) > 0) {
      char c;
      ssize_t r = recv(fd, &c, 1, 0);
      if (r <= 0 && !(r < 0 && errno == EAGAIN))
        closed_at = tu_now_s() - t0;
    }
    if (send(fd, "a", 1, MSG_NOSIGNAL) < 0 && errno != EAGAIN &&
        closed_at == 0)
      closed_at = tu_now_s() - t0;
  }
  close(fd);
  cr_expect(closed_at > 0.5 && closed_at < 2.5,
            "the slow connection closed after %.2f s (0: not within 4 s)",
            closed_at);
  /* Counted, and the server still answers. */
  pulse_buffer text = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(srv, &text), PULSE_OK);
  const char *want = "pulse_http_header_timeouts_total 1\n";
  int found = 0;
  for (size_t i = 0; i + strlen(want) <= text.size && !found; i++)
    found = memcmp(text.data + i, want, strlen(want)) == 0;
  cr_expect(found, "no header timeout counted: %.*s", (int)text.size, (const char *)text.data);
  pulse_buffer_free(&text);
  cr_expect(ts_get_answered(pulse_server_port(srv), "/healthz", 1.0));
  pulse_server_free(srv);
  tu_rm_rf(dir);
}
