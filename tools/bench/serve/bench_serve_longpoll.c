/* bench_serve_longpoll.c - benchmark 2 of `pulse-bench serve`: long-poll
 * wake-up latency, from the head's rename to the waiting client holding the
 * new head, with the publisher in the server's process (notify) and with a
 * server that follows head.json (inotify). */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_serve_impl.h"
#include "cli_args.h"
#include "cli_time.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"

typedef struct {
  uint16_t port;
  uint64_t after;
  double received;
  int status;
} poll_job;

static void *poll_main(void *arg) {
  poll_job *j = arg;
  int fd = bench_serve_connect_local(j->port);
  char req[256], hbuf[65536];
  snprintf(req, sizeof req,
           "GET /v1/head?after=%" PRIu64
           "&timeout_ms=10000 HTTP/1.1\r\nHost: x\r\n\r\n",
           j->after);
  size_t hlen, extra;
  uint64_t clen;
  int close_after;
  j->status = -1;
  if (fd >= 0 && bench_serve_send_all(fd, req, strlen(req)) == 0)
    j->status = bench_serve_read_headers(fd, hbuf, sizeof hbuf, &hlen, &clen,
                                         &close_after, &extra);
  while (j->status == 200 && extra < clen) {
    ssize_t n = recv(fd, hbuf, sizeof hbuf, 0);
    if (n <= 0)
      break;
    extra += (size_t)n;
  }
  j->received = pulse_cli_now();
  if (fd >= 0)
    close(fd);
  return NULL;
}

typedef struct {
  pulse_server *notify; /* NULL: record the time only */
  double moved;         /* when the publisher's head hook ran */
} hook_ctx;

static void on_head(void *ctx, const pulse_pub_figures *f) {
  hook_ctx *h = ctx;
  h->moved = pulse_cli_now();
  if (h->notify != NULL)
    pulse_server_on_head(h->notify, f);
}

/* Timestamps every rename onto STORE/head.json, the moment the new head
 * exists for anyone who looks: the common origin of both wake-up figures. */
typedef struct {
  int fd, stop_fd;
  pthread_mutex_t lock;
  double renamed;
} rename_clock;

static void *rename_main(void *arg) {
  rename_clock *c = arg;
  char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    struct pollfd pf[2] = {{c->fd, POLLIN, 0}, {c->stop_fd, POLLIN, 0}};
    if (poll(pf, 2, -1) < 0 && errno != EINTR)
      break;
    if (pf[1].revents)
      break;
    double t = pulse_cli_now();
    ssize_t len = read(c->fd, buf, sizeof buf);
    for (char *p = buf; len > 0 && p < buf + len;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      if (ev->len > 0 && strcmp(ev->name, "head.json") == 0) {
        pthread_mutex_lock(&c->lock);
        c->renamed = t;
        pthread_mutex_unlock(&c->lock);
      }
      p += sizeof *ev + ev->len;
    }
  }
  return NULL;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Times n wake-ups of a long-poll on `srv` while `pub` commits. */
static poll_result time_polls(pulse_pub *pub, pulse_server *srv, hook_ctx *hook,
                              rename_clock *clk, uint16_t *bits, uint64_t numel,
                              int n) {
  poll_result r;
  memset(&r, 0, sizeof r);
  double *lat = calloc((size_t)n + 1, sizeof *lat),
         *hook_lat = calloc((size_t)n + 1, sizeof *lat);
  uint64_t x = 12345;
  for (int i = 0; i < n; i++) {
    uint64_t head = 0;
    pulse_pub_head_step(pub, &head);
    poll_job j = {pulse_server_port(srv), head, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, poll_main, &j);
    for (int w = 0; w < 20000 && pulse_server_waiters(srv) < 1; w++)
      usleep(100);
    usleep(2000); /* let the waiter settle, the rename clock idle */
    for (int k = 0; k < 64; k++) { /* a few changed weights */
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      bits[x % numel] ^= 1;
    }
    pulse_pub_tensor t = {bits, PULSE_DTYPE_BF16, PULSE_PUB_HOST};
    hook->moved = 0;
    pthread_mutex_lock(&clk->lock);
    clk->renamed = 0;
    pthread_mutex_unlock(&clk->lock);
    pulse_status st = pulse_pub_commit(pub, head + 1, &t, 1, NULL);
    pthread_join(th, NULL);
    usleep(1000);
    pthread_mutex_lock(&clk->lock);
    double renamed = clk->renamed;
    pthread_mutex_unlock(&clk->lock);
    if (st != PULSE_OK || j.status != 200 || hook->moved == 0 || renamed == 0) {
      r.errors++;
      continue;
    }
    hook_lat[r.n] = (j.received - hook->moved) * 1e3;
    lat[r.n++] = (j.received - renamed) * 1e3;
  }
  if (r.n > 0) {
    qsort(lat, (size_t)r.n, sizeof *lat, cmp_d);
    qsort(hook_lat, (size_t)r.n, sizeof *lat, cmp_d);
    r.median_ms = lat[r.n / 2];
    r.p90_ms = lat[(r.n * 9) / 10 < r.n ? (r.n * 9) / 10 : r.n - 1];
    r.max_ms = lat[r.n - 1];
    r.hook_median_ms = hook_lat[r.n / 2];
  }
  free(lat), free(hook_lat);
  return r;
}

/* 2. Long-poll wake-up: a server told by the in-process publisher, and one
 * that watches head.json. 0 or 1 (said on stderr). */
int bench_serve_longpoll(const serve_args *a, const char *work,
                         serve_results *res) {
  int rc = 0;
  char store[4096];
  snprintf(store, sizeof store, "%s/poll-store", work);
  uint64_t numel = 1 << 16;
  uint16_t *bits = calloc(numel, 2);
  for (uint64_t i = 0; i < numel; i++)
    bits[i] = (uint16_t)(0x3c00 + (i % 977));
  pulse_tensor_info ti = {"w", PULSE_DTYPE_BF16, 1, {numel}};
  pulse_sign_key *key = NULL;
  pulse_sign_key_generate(&key);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = store;
  so.threads = (unsigned)res->workers;
  mkdir(store, 0755);
  pulse_server *wired = NULL, *watching = NULL;
  so.watch = 0;
  pulse_status st = pulse_server_create(&so, &wired);
  so.watch = 1;
  if (st == PULSE_OK)
    st = pulse_server_create(&so, &watching);
  hook_ctx hook = {wired, 0};
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.tensors = &ti;
  po.tensor_count = 1;
  po.key = key;
  po.anchor_every = 0;
  po.keep_patches = 4;
  po.on_head = on_head;
  po.on_head_ctx = &hook;
  pulse_pub *pub = NULL;
  if (st == PULSE_OK)
    st = pulse_pub_create(store, &po, &pub);
  pulse_pub_tensor t = {bits, PULSE_DTYPE_BF16, PULSE_PUB_HOST};
  if (st == PULSE_OK)
    st = pulse_pub_commit(pub, 0, &t, 1, NULL);
  rename_clock clk = {inotify_init1(IN_CLOEXEC), eventfd(0, EFD_CLOEXEC),
                      PTHREAD_MUTEX_INITIALIZER, 0};
  pthread_t clk_th;
  int clk_ok = clk.fd >= 0 && clk.stop_fd >= 0 &&
               inotify_add_watch(clk.fd, store, IN_MOVED_TO) >= 0 &&
               pthread_create(&clk_th, NULL, rename_main, &clk) == 0;
  if (st == PULSE_OK && !clk_ok)
    st = PULSE_ERR_IO;
  if (st != PULSE_OK) {
    rc = pulse_cli_fail(PROG, "long-poll setup", st);
  } else {
    poll_result *nr = &res->notify_r, *wr = &res->watch_r;
    *nr = time_polls(pub, wired, &hook, &clk, bits, numel, a->polls);
    hook.notify = NULL; /* the watching server learns from head.json alone */
    *wr = time_polls(pub, watching, &hook, &clk, bits, numel, a->polls);
    if (!a->json)
      printf("long-poll wake-up, rename of head.json -> client holds the new "
             "head (%d each):\n"
             "  in-process publisher (notify): median %.3f ms, p90 %.3f ms, "
             "max %.3f ms "
             "(includes the directory fsync before the notify; from the "
             "notify: median %.3f ms)%s\n"
             "  other process (inotify):       median %.3f ms, p90 %.3f ms, "
             "max %.3f ms%s\n",
             a->polls, nr->median_ms, nr->p90_ms, nr->max_ms,
             nr->hook_median_ms, nr->errors ? " (errors!)" : "", wr->median_ms,
             wr->p90_ms, wr->max_ms, wr->errors ? " (errors!)" : "");
  }
  if (clk_ok) {
    uint64_t one = 1;
    ssize_t w = write(clk.stop_fd, &one, sizeof one);
    (void)w;
    pthread_join(clk_th, NULL);
  }
  if (clk.fd >= 0)
    close(clk.fd);
  if (clk.stop_fd >= 0)
    close(clk.stop_fd);
  pulse_server_free(wired);
  pulse_server_free(watching);
  pulse_pub_free(pub);
  pulse_sign_key_free(key);
  free(bits);
  bench_serve_rm_rf(store);
  return rc;
}
