/* udp.c - the datagram socket of the exchange over UDP (udp_impl.h): one
 * socket on the node's address, a thread that drains it into a queue, timed takes.
 * POSIX sockets only. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "peer_http_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "udp_impl.h"

/* What the queue may hold before new datagrams are dropped (and counted):
 * far above a round of many trainers (a few MB), far below a runaway. */
#define QUEUE_CAP_BYTES ((size_t)64 << 20)

struct loco_udp {
  int fd;
  uint16_t port;
  pthread_t thread;
  int running;
  pthread_mutex_t lock;
  pthread_cond_t ready;
  loco_datagram *head, *tail; /* under lock */
  size_t queued;              /* bytes, under lock */
  uint64_t overflow;          /* under lock */
  uint64_t sent;              /* bytes sent; the sending thread's */
  volatile int stop;
};

/* Moves one datagram from the socket to the queue without waiting.
 * @return 0 when none was there. */
static int drain_one(loco_udp *u) {
  uint8_t buf[LOCO_UDP_MAX];
  {
    struct sockaddr_in from;
    socklen_t flen = sizeof from;
    /* MSG_TRUNC: the datagram's real length even when it did not fit. */
    ssize_t got = recvfrom(u->fd, buf, sizeof buf, MSG_TRUNC | MSG_DONTWAIT,
                           (struct sockaddr *)&from, &flen);
    if (got < 0)
      return 0;
    size_t keep = (size_t)got < sizeof buf ? (size_t)got : sizeof buf;
    loco_datagram *d = malloc(sizeof *d + (keep ? keep : 1));
    if (d == NULL)
      return 1; /* out of memory: as if lost */
    d->next = NULL;
    d->addr = ntohl(from.sin_addr.s_addr);
    d->port = ntohs(from.sin_port);
    d->cut = (size_t)got > sizeof buf;
    d->size = keep;
    memcpy(d->data, buf, keep);
    pthread_mutex_lock(&u->lock);
    if (u->queued + keep > QUEUE_CAP_BYTES) {
      u->overflow++;
      free(d);
    } else {
      if (u->tail)
        u->tail->next = d;
      else
        u->head = d;
      u->tail = d;
      u->queued += keep;
      pthread_cond_signal(&u->ready);
    }
    pthread_mutex_unlock(&u->lock);
  }
  return 1;
}

static void *drain(void *arg) {
  loco_udp *u = arg;
  while (!u->stop) {
    struct pollfd pf = {u->fd, POLLIN, 0};
    if (poll(&pf, 1, 50) > 0)
      while (drain_one(u))
        ;
  }
  return NULL;
}

void loco_udp_flush(loco_udp *u) {
  while (drain_one(u))
    ;
}

pulse_status loco_udp_open(uint32_t addr, uint16_t port, loco_udp **out) {
  *out = NULL;
  loco_udp *u = calloc(1, sizeof *u);
  if (u == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco udp");
  u->fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (u->fd < 0) {
    free(u);
    return pulse_fail(PULSE_ERR_IO, "loco udp: socket: %s", strerror(errno));
  }
  /* A larger receive buffer (the kernel caps it at rmem_max): the thread
   * drains it, this only absorbs a burst while it is scheduled out. What
   * was obtained is logged: a lossless run that loses datagrams on a host
   * with a small rmem_max shows it (UdpRcvbufErrors in nstat). */
  int rcv = 4 << 20, got = 0;
  socklen_t glen = sizeof got;
  setsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
  if (getsockopt(u->fd, SOL_SOCKET, SO_RCVBUF, &got, &glen) == 0)
    PULSE_LOG_AT(PULSE_LOG_DEBUG,
                 "loco udp: receive buffer %d bytes (asked %d; the kernel "
                 "caps the request at net.core.rmem_max, then doubles it)",
                 got, rcv);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(addr);
  a.sin_port = htons(port);
  socklen_t alen = sizeof a;
  if (bind(u->fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      getsockname(u->fd, (struct sockaddr *)&a, &alen) != 0) {
    int err = errno;
    close(u->fd);
    free(u);
    return pulse_fail(PULSE_ERR_IO, "loco udp: cannot bind %u.%u.%u.%u:%u: %s",
                      addr >> 24, (addr >> 16) & 255u, (addr >> 8) & 255u,
                      addr & 255u, (unsigned)port, strerror(err));
  }
  u->port = ntohs(a.sin_port);
  pthread_mutex_init(&u->lock, NULL);
  pthread_cond_init(&u->ready, NULL);
  if (pthread_create(&u->thread, NULL, drain, u) != 0) {
    loco_udp_close(u);
    return pulse_fail(PULSE_ERR_IO, "loco udp: thread");
  }
  u->running = 1;
  *out = u;
  return PULSE_OK;
}

void loco_udp_close(loco_udp *u) {
  if (u == NULL)
    return;
  u->stop = 1;
  if (u->running)
    pthread_join(u->thread, NULL);
  close(u->fd);
  for (loco_datagram *d = u->head, *next; d; d = next) {
    next = d->next;
    free(d);
  }
  pthread_mutex_destroy(&u->lock);
  pthread_cond_destroy(&u->ready);
  free(u);
}

uint16_t loco_udp_port(const loco_udp *u) {
  return u->port;
}

/* Errors of the path, not of the socket: the datagram is lost. */
static int path_error(int e) {
  return e == EPERM || e == ECONNREFUSED || e == EHOSTUNREACH || e == ENETUNREACH ||
         e == EHOSTDOWN || e == ENETDOWN || e == ENOBUFS || e == EAGAIN;
}

pulse_status loco_udp_send(loco_udp *u, uint32_t addr, uint16_t port,
                           const uint8_t *data, size_t size, int *lost) {
  *lost = 0;
  struct sockaddr_in to;
  memset(&to, 0, sizeof to);
  to.sin_family = AF_INET;
  to.sin_addr.s_addr = htonl(addr);
  to.sin_port = htons(port);
  for (int tries = 0;; tries++) {
    ssize_t k =
        sendto(u->fd, data, size, 0, (struct sockaddr *)&to, sizeof to);
    if (k == (ssize_t)size) {
      u->sent += size;
      return PULSE_OK;
    }
    /* A full socket buffer: wait for it rather than lose on our side. */
    if (k < 0 && (errno == ENOBUFS || errno == EAGAIN || errno == EINTR) &&
        tries < 100) {
      loco_sleep_ms(1);
      continue;
    }
    if (k < 0 && path_error(errno)) {
      *lost = 1;
      return PULSE_OK;
    }
    return pulse_fail(PULSE_ERR_IO, "loco udp: send to port %u: %s",
                      (unsigned)port, k < 0 ? strerror(errno) : "short");
  }
}

loco_datagram *loco_udp_take(loco_udp *u, uint64_t deadline_ms) {
  pthread_mutex_lock(&u->lock);
  while (u->head == NULL) {
    uint64_t now = loco_now_ms();
    if (now >= deadline_ms)
      break;
    /* The wait is short and re-checked: the clocks of loco_now_ms and
     * the condition variable need not agree. */
    uint64_t wait = deadline_ms - now < 5u ? deadline_ms - now : 5u;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)wait * 1000000L;
    if (ts.tv_nsec >= 1000000000L)
      ts.tv_sec++, ts.tv_nsec -= 1000000000L;
    pthread_cond_timedwait(&u->ready, &u->lock, &ts);
  }
  loco_datagram *d = u->head;
  if (d) {
    u->head = d->next;
    if (u->head == NULL)
      u->tail = NULL;
    u->queued -= d->size;
    d->next = NULL;
  }
  pthread_mutex_unlock(&u->lock);
  return d;
}

uint64_t loco_udp_bytes_sent(const loco_udp *u) {
  return u->sent;
}

uint64_t loco_udp_overflow(const loco_udp *u) {
  loco_udp *m = (loco_udp *)u;
  pthread_mutex_lock(&m->lock);
  uint64_t v = m->overflow;
  pthread_mutex_unlock(&m->lock);
  return v;
}
