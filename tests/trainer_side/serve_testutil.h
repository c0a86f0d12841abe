/* serve_testutil.h - what the serving layer's hostile-client tests share:
 * a store the server can serve heads from, connections from a chosen
 * source address, and a probe that times one GET. */
#ifndef PULSE_SERVE_TESTUTIL_H
#define PULSE_SERVE_TESTUTIL_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "files_testutil.h"
#include "store_impl.h"

/* A store whose head names one (absent) anchor: the server serves heads
 * without looking at objects. */
static inline char *ts_store_with_head(void) {
  char *dir = tu_make_dir();
  pulse_store_object a;
  memset(&a, 0, sizeof a);
  a.kind = PULSE_STORE_ANCHOR;
  a.size = 1000;
  a.sha256[0] = 1;
  store_object_set_path(&a);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.anchors = &a;
  f.nanchors = 1;
  f.version = 2;
  f.run[0] = 7;
  f.published = 1764633600;
  pulse_buffer json = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, NULL, &json), PULSE_OK, "%s",
               pulse_error_detail());
  char path[4096];
  snprintf(path, sizeof path, "%s/head.json", dir);
  cr_assert_eq(tu_write(path, json.data, json.size), 0);
  pulse_buffer_free(&json);
  return dir;
}

/* A non-blocking TCP connection to 127.0.0.1:port from source address
 * `from` (127.0.0.x: each its own client address to the server); -1 when
 * none can be made now. */
static inline int ts_open_from(const char *from, uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in src = {0}, dst = {0};
  src.sin_family = dst.sin_family = AF_INET;
  inet_pton(AF_INET, from, &src.sin_addr);
  inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
  dst.sin_port = htons(port);
  if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
      (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0 &&
       errno != EINPROGRESS)) {
    close(fd);
    return -1;
  }
  return fd;
}

/* One GET of `path` from 127.0.0.1: 1 when a "200" status line came back
 * within `limit_s`. */
static inline int ts_get_answered(uint16_t port, const char *path, double limit_s) {
  double t0 = tu_now_s();
  int fd = ts_open_from("127.0.0.1", port);
  if (fd < 0)
    return 0;
  char req[256], buf[512];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                   path);
  size_t sent = 0, got = 0;
  while (tu_now_s() - t0 < limit_s) {
    struct pollfd p = {fd, (short)(sent < (size_t)n ? POLLOUT : POLLIN), 0};
    if (poll(&p, 1, 50) <= 0)
      continue;
    if (sent < (size_t)n) {
      ssize_t w = send(fd, req + sent, (size_t)n - sent, MSG_NOSIGNAL);
      if (w > 0)
        sent += (size_t)w;
      else if (errno != EAGAIN)
        break;
      continue;
    }
    ssize_t r = recv(fd, buf + got, sizeof buf - 1 - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
    buf[got] = '\0';
    if (strstr(buf, "\r\n") != NULL)
      break;
  }
  close(fd);
  buf[got] = '\0';
  return got > 0 && strncmp(buf, "HTTP/1.1 200", 12) == 0 &&
         tu_now_s() - t0 < limit_s;
}

#endif
