/* flip_proxy.c - see flip_proxy.h. One thread accepts, one thread per
 * connection relays both ways with poll(); the server-to-client direction
 * goes through a tiny HTTP response parser (headers up to the blank line,
 * then Content-Length body bytes) that flips byte 40 of immutable bodies. */
#include "flip_proxy.h"

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
#include <time.h>
#include <unistd.h>

#define MAX_CONN 64

struct flip_proxy {
  int listen_fd;
  uint16_t port, upstream;
  int flip;
  atomic_int stop;
  atomic_int flips;
  _Atomic uint64_t rate;
  _Atomic uint64_t cut_after; /* catch-up bodies cut after this many bytes */
  atomic_int cut_times;       /* ... this many more times (< 0: always) */
  atomic_int cuts;
  pthread_t acceptor;
  pthread_mutex_t lock;
  pthread_t conns[MAX_CONN];
  size_t nconns;
};

typedef struct {
  flip_proxy *p;
  int client;
} conn_arg;

/* Parser of the responses going to the client. */
typedef struct {
  char hdr[16384];
  size_t hlen;
  int in_body;
  uint64_t body_left, body_pos;
  int corrupt_this;
  int flip_catchups; /* also catch-up bodies (flip mode 2) */
  int cut_this;      /* a catch-up body to cut (flip_proxy_cut_catchups) */
  /* Whether each request sent and not yet answered was a HEAD (its answer
   * has a Content-Length but no body), oldest first. */
  unsigned char head[64];
  unsigned heads_in, heads_out;
} resp_parser;

/* Notes the methods of the requests in bytes going upstream (requests
 * start their send, as curl writes them). */
static void note_requests(resp_parser *r, const char *buf, size_t n) {
  if (n >= 4 && (memcmp(buf, "GET ", 4) == 0 || memcmp(buf, "HEAD", 4) == 0))
    r->head[r->heads_in++ % sizeof r->head] = memcmp(buf, "HEAD", 4) == 0;
}

static void parse_headers(flip_proxy *p, resp_parser *r) {
  r->hdr[r->hlen] = '\0';
  uint64_t cl = 0;
  for (char *line = r->hdr; line != NULL && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL)
    if (strncasecmp(line, "Content-Length:", 15) == 0)
      cl = strtoull(line + 15, NULL, 10);
  r->corrupt_this = (strstr(r->hdr, "immutable") != NULL ||
                     (r->flip_catchups && strstr(r->hdr, "X-Pulse-From-Step") != NULL)) &&
                    cl > 64;
  int head = r->heads_out != r->heads_in && r->head[r->heads_out++ % sizeof r->head];
  if (head)
    cl = 0, r->corrupt_this = 0;
  r->cut_this = 0;
  if (!head && strstr(r->hdr, "X-Pulse-From-Step") != NULL) {
    int t = atomic_load(&p->cut_times);
    while (t != 0 && !r->cut_this) {
      if (t < 0)
        r->cut_this = 1;
      else if (atomic_compare_exchange_weak(&p->cut_times, &t, t - 1))
        r->cut_this = 1;
    }
  }
  r->body_left = cl;
  r->body_pos = 0;
  r->in_body = cl > 0;
  r->hlen = 0;
}

/* Runs the bytes through the parser, flipping in place. Returns how many
 * to send, then *cut when the connection is to be cut there. */
static size_t filter(flip_proxy *p, resp_parser *r, char *buf, size_t n,
                     int *cut) {
  *cut = 0;
  for (size_t i = 0; i < n; i++) {
    if (r->in_body && r->cut_this &&
        r->body_pos == atomic_load(&p->cut_after)) {
      atomic_fetch_add(&p->cuts, 1);
      *cut = 1;
      return i;
    }
    if (r->in_body) {
      if (p->flip && r->corrupt_this && r->body_pos == 40) {
        buf[i] ^= 0x01;
        atomic_fetch_add(&p->flips, 1);
      }
      r->body_pos++;
      if (--r->body_left == 0)
        r->in_body = 0;
      continue;
    }
    if (r->hlen < sizeof r->hdr - 1)
      r->hdr[r->hlen++] = buf[i];
    if (r->hlen >= 4 && memcmp(r->hdr + r->hlen - 4, "\r\n\r\n", 4) == 0) {
      parse_headers(p, r);
      if (r->in_body && r->cut_this && atomic_load(&p->cut_after) == 0) {
        atomic_fetch_add(&p->cuts, 1);
        *cut = 1;
        return i + 1;
      }
    }
  }
  return n;
}

static int send_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0)
      return -1;
    b += w, n -= (size_t)w;
  }
  return 0;
}

static void *relay(void *arg) {
  conn_arg *a = arg;
  flip_proxy *p = a->p;
  int client = a->client;
  free(a);
  int up = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(p->upstream);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  resp_parser *r = calloc(1, sizeof *r);
  if (r != NULL)
    r->flip_catchups = p->flip >= 2;
  if (up < 0 || r == NULL ||
      connect(up, (struct sockaddr *)&sa, sizeof sa) != 0)
    goto out;
  char buf[16384];
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  uint64_t sent = 0;
  while (!atomic_load(&p->stop)) {
    uint64_t rate = atomic_load(&p->rate);
    if (rate > 0) { /* hold back until the rate allows more */
      struct timespec now;
      clock_gettime(CLOCK_MONOTONIC, &now);
      double el = (double)(now.tv_sec - t0.tv_sec) +
                  1e-9 * (double)(now.tv_nsec - t0.tv_nsec);
      if ((double)sent > el * (double)rate) {
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
        continue;
      }
    }
    struct pollfd fds[2] = {{client, POLLIN, 0}, {up, POLLIN, 0}};
    int k = poll(fds, 2, 50);
    if (k < 0)
      break;
    if (k == 0)
      continue;
    if (fds[0].revents) {
      ssize_t n = recv(client, buf, sizeof buf, 0);
      if (n > 0)
        note_requests(r, buf, (size_t)n);
      if (n <= 0 || send_all(up, buf, (size_t)n) != 0)
        break;
    }
    if (fds[1].revents) {
      ssize_t n = recv(up, buf, sizeof buf, 0);
      if (n <= 0)
        break;
      int cut = 0;
      size_t keep = filter(p, r, buf, (size_t)n, &cut);
      if (send_all(client, buf, keep) != 0 || cut)
        break;
      sent += (uint64_t)n;
    }
  }
out:
  free(r);
  if (up >= 0)
    close(up);
  close(client);
  return NULL;
}

static void *acceptor(void *arg) {
  flip_proxy *p = arg;
  while (!atomic_load(&p->stop)) {
    struct pollfd pf = {p->listen_fd, POLLIN, 0};
    if (poll(&pf, 1, 50) <= 0)
      continue;
    int c = accept(p->listen_fd, NULL, NULL);
    if (c < 0)
      continue;
    conn_arg *a = malloc(sizeof *a);
    pthread_mutex_lock(&p->lock);
    if (a == NULL || p->nconns == MAX_CONN) {
      pthread_mutex_unlock(&p->lock);
      free(a);
      close(c);
      continue;
    }
    a->p = p;
    a->client = c;
    if (pthread_create(&p->conns[p->nconns], NULL, relay, a) == 0)
      p->nconns++;
    else
      close(c), free(a);
    pthread_mutex_unlock(&p->lock);
  }
  return NULL;
}

flip_proxy *flip_proxy_start(uint16_t upstream_port, int flip) {
  return flip_proxy_start_at(upstream_port, flip, 0);
}

flip_proxy *flip_proxy_start_at(uint16_t upstream_port, int flip,
                                uint16_t port) {
  flip_proxy *p = calloc(1, sizeof *p);
  if (p == NULL)
    return NULL;
  p->upstream = upstream_port;
  p->flip = flip;
  atomic_init(&p->stop, 0);
  atomic_init(&p->flips, 0);
  atomic_init(&p->rate, 0);
  atomic_init(&p->cut_after, 0);
  atomic_init(&p->cut_times, 0);
  atomic_init(&p->cuts, 0);
  pthread_mutex_init(&p->lock, NULL);
  p->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {0};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  sa.sin_port = htons(port);
  socklen_t len = sizeof sa;
  int one = 1;
  if (p->listen_fd >= 0)
    setsockopt(p->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (p->listen_fd < 0 ||
      bind(p->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(p->listen_fd, 64) != 0 ||
      getsockname(p->listen_fd, (struct sockaddr *)&sa, &len) != 0) {
    if (p->listen_fd >= 0)
      close(p->listen_fd);
    free(p);
    return NULL;
  }
  p->port = ntohs(sa.sin_port);
  if (pthread_create(&p->acceptor, NULL, acceptor, p) != 0) {
    close(p->listen_fd);
    free(p);
    return NULL;
  }
  return p;
}

void flip_proxy_set_rate(flip_proxy *p, uint64_t bytes_per_s) {
  atomic_store(&p->rate, bytes_per_s);
}

void flip_proxy_cut_catchups(flip_proxy *p, uint64_t after, int times) {
  atomic_store(&p->cut_after, after);
  atomic_store(&p->cut_times, times);
}

int flip_proxy_cuts(const flip_proxy *p) {
  return atomic_load(&((flip_proxy *)p)->cuts);
}

uint16_t flip_proxy_port(const flip_proxy *p) {
  return p->port;
}

int flip_proxy_flips(const flip_proxy *p) {
  return atomic_load(&((flip_proxy *)p)->flips);
}

void flip_proxy_stop(flip_proxy *p) {
  if (p == NULL)
    return;
  atomic_store(&p->stop, 1);
  pthread_join(p->acceptor, NULL);
  for (size_t i = 0; i < p->nconns; i++)
    pthread_join(p->conns[i], NULL);
  close(p->listen_fd);
  pthread_mutex_destroy(&p->lock);
  free(p);
}
