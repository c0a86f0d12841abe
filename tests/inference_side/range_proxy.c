/* range_proxy.c - see range_proxy.h. One thread accepts; each connection
 * is served on its own thread: read the request's headers, rewrite them,
 * send them upstream with "Connection: close", relay the answer until the
 * server closes. */
#include "range_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

struct range_proxy {
  int listen_fd;
  uint16_t port, upstream;
  int mode;
  atomic_int stop;
  _Atomic uint64_t bytes;
  atomic_int partials, sections, flips;
  atomic_int active; /* connection threads running */
  pthread_t acceptor;
};

typedef struct {
  range_proxy *p;
  int client;
} conn_arg;

static int send_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0)
      return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int connect_upstream(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static void *conn_main(void *arg) {
  conn_arg *c = arg;
  range_proxy *p = c->p;
  char req[16384], out[16600];
  size_t n = 0;
  while (n + 1 < sizeof req) {
    ssize_t r = recv(c->client, req + n, sizeof req - 1 - n, 0);
    if (r <= 0)
      break;
    n += (size_t)r;
    req[n] = '\0';
    if (strstr(req, "\r\n\r\n") != NULL)
      break;
  }
  char *end = n > 0 ? strstr(req, "\r\n\r\n") : NULL;
  if (end == NULL)
    goto done;
  *end = '\0';
  int sections = strstr(req, "/sections/") != NULL;
  if (sections)
    atomic_fetch_add(&p->sections, 1);
  if (sections && (p->mode & RANGE_PROXY_NO_SECTIONS)) {
    const char *nf = "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot here\n";
    send_all(c->client, nf, strlen(nf));
    goto done;
  }
  /* The request line and headers, less Connection (and Range). */
  size_t o = 0;
  for (char *line = req, *next; line != NULL; line = next) {
    next = strstr(line, "\r\n");
    if (next != NULL) {
      *next = '\0';
      next += 2;
    }
    if (strncasecmp(line, "Connection:", 11) == 0 ||
        ((p->mode & RANGE_PROXY_NO_RANGE) &&
         (strncasecmp(line, "Range:", 6) == 0 || strncasecmp(line, "If-Range:", 9) == 0)))
      continue;
    o += (size_t)snprintf(out + o, sizeof out - o, "%s\r\n", line);
  }
  o += (size_t)snprintf(out + o, sizeof out - o, "Connection: close\r\n\r\n");
  int up = connect_upstream(p->upstream);
  if (up < 0 || send_all(up, out, o) != 0) {
    if (up >= 0)
      close(up);
    goto done;
  }
  /* Relay the answer; note a 206 and, in FLIP mode, flip the first body
   * byte of the first one whose range does not start at 0. */
  char buf[65536], hdr[8192];
  size_t hlen = 0;
  int in_body = 0, flip = 0;
  for (;;) {
    ssize_t r = recv(up, buf, sizeof buf, 0);
    if (r <= 0)
      break;
    size_t k = (size_t)r, body_at = in_body ? 0 : k;
    if (!in_body) {
      size_t take = k < sizeof hdr - 1 - hlen ? k : sizeof hdr - 1 - hlen;
      memcpy(hdr + hlen, buf, take);
      size_t before = hlen;
      hlen += take;
      hdr[hlen] = '\0';
      char *e = strstr(hdr, "\r\n\r\n");
      if (e != NULL) {
        in_body = 1;
        body_at = (size_t)(e + 4 - hdr) - before;
        if (strncmp(hdr + 9, "206", 3) == 0) {
          atomic_fetch_add(&p->partials, 1);
          int expected = 0;
          flip = (p->mode & RANGE_PROXY_FLIP_SECTION) && strstr(hdr, "bytes 0-") == NULL &&
                 atomic_compare_exchange_strong(&p->flips, &expected, 1);
        }
      }
    }
    if (flip && in_body && body_at < k) {
      buf[body_at] ^= 0x20; /* the body's first byte, maybe in a later read */
      flip = 0;
    }
    atomic_fetch_add(&p->bytes, k);
    if (send_all(c->client, buf, k) != 0)
      break;
  }
  close(up);
done:
  close(c->client);
  free(c);
  atomic_fetch_sub(&p->active, 1);
  return NULL;
}

static void *accept_main(void *arg) {
  range_proxy *p = arg;
  while (!atomic_load(&p->stop)) {
    struct pollfd pf = {p->listen_fd, POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0)
      continue;
    int fd = accept(p->listen_fd, NULL, NULL);
    if (fd < 0)
      continue;
    conn_arg *c = malloc(sizeof *c);
    pthread_t t;
    if (c == NULL) {
      close(fd);
      continue;
    }
    c->p = p;
    c->client = fd;
    atomic_fetch_add(&p->active, 1);
    if (pthread_create(&t, NULL, conn_main, c) != 0) {
      atomic_fetch_sub(&p->active, 1);
      close(fd);
      free(c);
      continue;
    }
    pthread_detach(t);
  }
  return NULL;
}

range_proxy *range_proxy_start(uint16_t upstream_port, int mode) {
  range_proxy *p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->upstream = upstream_port;
  p->mode = mode;
  p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (p->listen_fd < 0 || bind(p->listen_fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(p->listen_fd, 64) != 0 ||
      getsockname(p->listen_fd, (struct sockaddr *)&a, &len) != 0) {
    if (p->listen_fd >= 0)
      close(p->listen_fd);
    free(p);
    return NULL;
  }
  p->port = ntohs(a.sin_port);
  if (pthread_create(&p->acceptor, NULL, accept_main, p) != 0) {
    close(p->listen_fd);
    free(p);
    return NULL;
  }
  return p;
}

uint16_t range_proxy_port(const range_proxy *p) { return p->port; }
uint64_t range_proxy_bytes(const range_proxy *p) { return atomic_load(&p->bytes); }
int range_proxy_partials(const range_proxy *p) { return atomic_load(&p->partials); }
int range_proxy_sections(const range_proxy *p) { return atomic_load(&p->sections); }
int range_proxy_flips(const range_proxy *p) { return atomic_load(&p->flips); }

void range_proxy_stop(range_proxy *p) {
  if (p == NULL)
    return;
  atomic_store(&p->stop, 1);
  pthread_join(p->acceptor, NULL);
  close(p->listen_fd);
  /* Detached connection threads end when their sockets do. */
  for (int i = 0; i < 500 && atomic_load(&p->active) > 0; i++)
    usleep(10000);
  free(p);
}
