/* bench_serve_http.c - HTTP/1.1 on plain sockets for the clients of
 * `pulse-bench serve` (pulse-bench does not link libcurl): a loopback
 * connection, a whole send, a response's header block. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_serve_impl.h"

int bench_serve_connect_local(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

int bench_serve_send_all(int fd, const char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads a response's header block; leaves body bytes already read in
 * hbuf[*hlen - *extra ..). Returns the status, or -1. */
int bench_serve_read_headers(int fd, char *hbuf, size_t cap, size_t *hlen,
                             uint64_t *clen, int *close_after, size_t *extra) {
  size_t len = 0;
  char *end = NULL;
  while (end == NULL) {
    if (len + 1 >= cap)
      return -1;
    ssize_t n = recv(fd, hbuf + len, cap - 1 - len, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    len += (size_t)n;
    hbuf[len] = '\0';
    end = strstr(hbuf, "\r\n\r\n");
  }
  int status = 0;
  if (sscanf(hbuf, "HTTP/1.%*d %d", &status) != 1)
    return -1;
  *clen = 0;
  *close_after = 0;
  for (char *p = hbuf; p < end; p = strstr(p, "\r\n") + 2) {
    if (strncasecmp(p, "Content-Length:", 15) == 0)
      *clen = strtoull(p + 15, NULL, 10);
    if (strncasecmp(p, "Connection: close", 17) == 0)
      *close_after = 1;
  }
  size_t head = (size_t)(end + 4 - hbuf);
  *extra = len - head;
  *hlen = len;
  return status;
}
