/* bench_serve.c - `pulse-bench serve`: the trainer side's serving and
 * publishing costs.
 *
 *  1. throughput of large immutable objects to 1, 8 and 32 concurrent
 *     clients over loopback, pulse_server side by side with nginx (the
 *     Debian package, run as a child with a generated configuration) serving
 *     the same files, in the same run, rounds interleaved;
 *  2. long-poll wake-up latency: from the head's rename to the waiting
 *     client holding the new head, with the publisher in the server's
 *     process (notify) and with a server that follows head.json (inotify);
 *  3. commit time against the bare encoder (detection + patch encoding with
 *     the same threads and the same cached digests) on a synthetic AdamW
 *     trajectory.
 *
 * The HTTP clients are threads with one keep-alive connection each, written
 * here on plain sockets (pulse-bench does not link libcurl): the same client
 * for both servers, reading every byte into user space as a real one does. */
#include "bench_impl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "rng_impl.h"
#include "cli_args.h"
#include "cli_report.h"
#include "sim_synth.h"
#include "cli_time.h"

#define PROG "pulse-bench serve"
#define MAX_CLIENT_COUNTS 8

typedef struct {
  uint64_t object_mb;
  int objects;
  int clients[MAX_CLIENT_COUNTS];
  int nclients;
  double seconds;
  int rounds;
  int threads; /* server threads and nginx workers; 0: one per CPU */
  const char *nginx;
  int no_nginx;
  int polls;
  uint64_t params, steps, anchor_every;
  int commit_threads;
  int json;
  int skip_throughput, skip_poll, skip_commit;
  const char *report; /* --report DIR */
} serve_args;

void bench_serve_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench serve [options]\n"
      "  Serving throughput of large objects (pulse vs nginx on the same "
      "files),\n"
      "  long-poll wake-up latency, commit time vs the bare encoder.\n"
      "  --object-mb N     size of each object (default 256)\n"
      "  --objects K       distinct objects the clients cycle through (default "
      "2)\n"
      "  --clients LIST    concurrent clients, comma separated (default "
      "1,8,32)\n"
      "  --seconds S       per measurement (default 3)\n"
      "  --rounds R        interleaved rounds per client count, best kept "
      "(default 2)\n"
      "  --threads N       server threads = nginx workers (default: one per "
      "CPU)\n"
      "  --nginx PATH      nginx binary (default: /usr/sbin/nginx, then PATH)\n"
      "  --no-nginx        pulse only\n"
      "  --polls N         long-poll wake-ups timed per mode (default 50)\n"
      "  --params N        parameters of the commit trajectory (default 20M)\n"
      "  --steps S         commits timed (default 8)\n"
      "  --anchor-every K  anchors during the commit run (default 4; "
      "background)\n"
      "  --commit-threads T  detection/encoding threads (default: one per "
      "core)\n"
      "  --only throughput|poll|commit\n"
      "  --json            one JSON object\n"
      "  --report DIR      also write DIR/throughput.csv, DIR/longpoll.csv,\n"
      "                    DIR/commit.csv and DIR/report.html (charts)\n");
}

/* ------------------------------------------------------------- utilities */

static int rm_cb(const char *path, const struct stat *sb, int flag,
                 struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static void rm_rf(const char *dir) {
  if (dir != NULL && dir[0] != '\0')
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static int connect_local(uint16_t port) {
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

static uint16_t free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  uint16_t port = 0;
  if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
      getsockname(fd, (struct sockaddr *)&a, &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0)
    close(fd);
  return port;
}

static int send_all(int fd, const char *p, size_t n) {
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
static int read_headers(int fd, char *hbuf, size_t cap, size_t *hlen,
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

/* ------------------------------------------------------------- throughput */

typedef struct {
  uint16_t port;
  char **paths;
  int npaths, first;
  double deadline;
  uint64_t bytes, requests;
  int errors;
  double end;
  pthread_barrier_t *start;
} client_job;

static void *client_main(void *arg) {
  client_job *j = arg;
  size_t cap = (size_t)1 << 18;
  char *buf = malloc(cap), hbuf[16384];
  int fd = -1, k = j->first;
  pthread_barrier_wait(j->start);
  while (buf != NULL && pulse_tk_now() < j->deadline) {
    if (fd < 0 && (fd = connect_local(j->port)) < 0) {
      j->errors++;
      break;
    }
    char req[512];
    int len =
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 j->paths[k++ % j->npaths]);
    size_t hlen, extra;
    uint64_t clen;
    int close_after;
    int status = send_all(fd, req, (size_t)len) == 0
                     ? read_headers(fd, hbuf, sizeof hbuf, &hlen, &clen,
                                    &close_after, &extra)
                     : -1;
    if (status != 200) {
      j->errors++;
      close(fd);
      fd = -1;
      continue;
    }
    uint64_t left = clen - extra;
    j->bytes += extra;
    int cut = 0;
    while (left > 0) {
      ssize_t n = recv(fd, buf, left < cap ? (size_t)left : cap, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        j->errors++;
        cut = 1;
        break;
      }
      j->bytes += (uint64_t)n;
      left -= (uint64_t)n;
      if (pulse_tk_now() >= j->deadline) { /* time is up mid-body */
        cut = 1;
        break;
      }
    }
    if (!cut)
      j->requests++;
    if (cut || close_after) {
      close(fd);
      fd = -1;
    }
  }
  if (fd >= 0)
    close(fd);
  free(buf);
  j->end = pulse_tk_now();
  return NULL;
}

typedef struct {
  double mbps;
  uint64_t requests;
  int errors;
} tp_result;

static tp_result run_clients(uint16_t port, char **paths, int npaths,
                             int clients, double seconds) {
  tp_result r = {0, 0, 0};
  client_job *jobs = calloc((size_t)clients, sizeof *jobs);
  pthread_t *th = calloc((size_t)clients, sizeof *th);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)clients + 1);
  for (int i = 0; i < clients; i++) {
    jobs[i].port = port;
    jobs[i].paths = paths;
    jobs[i].npaths = npaths;
    jobs[i].first = i;
    jobs[i].start = &start;
  }
  double t0 = pulse_tk_now() + 0.05;
  for (int i = 0; i < clients; i++) {
    jobs[i].deadline = t0 + seconds;
    pthread_create(&th[i], NULL, client_main, &jobs[i]);
  }
  pthread_barrier_wait(&start);
  t0 = pulse_tk_now();
  uint64_t bytes = 0;
  double end = t0;
  for (int i = 0; i < clients; i++) {
    pthread_join(th[i], NULL);
    bytes += jobs[i].bytes;
    r.requests += jobs[i].requests;
    r.errors += jobs[i].errors;
    if (jobs[i].end > end)
      end = jobs[i].end;
  }
  pthread_barrier_destroy(&start);
  r.mbps = end > t0 ? (double)bytes / (end - t0) / 1e6 : 0;
  free(jobs), free(th);
  return r;
}

/* Writes k objects of random bytes into dir/objects, named by their hash;
 * fills the URL paths. */
static int make_objects(const char *dir, uint64_t mb, int k, char **paths) {
  char objs[4200], tmp[4300], final[4400];
  snprintf(objs, sizeof objs, "%s/objects", dir);
  mkdir(dir, 0755);
  mkdir(objs, 0755);
  chmod(dir, 0755); /* nginx workers may run as another user */
  size_t chunk = (size_t)1 << 20;
  uint64_t *buf = malloc(chunk);
  uint64_t x = 1; /* any seed: random bytes no compressor can shrink */
  for (int i = 0; i < k && buf; i++) {
    snprintf(tmp, sizeof tmp, "%s/.object%d.tmp-bench", objs, i);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
      return -1;
    for (uint64_t m = 0; m < mb; m++) {
      for (size_t w = 0; w < chunk / 8; w++) {
        buf[w] = pulse_rng_next(&x);
      }
      fwrite(buf, 1, chunk, f);
    }
    fclose(f);
    uint8_t sha[32];
    char hex[65];
    if (pulse_store_file_sha256(tmp, sha, NULL) != PULSE_OK)
      return -1;
    for (int b = 0; b < 32; b++)
      snprintf(hex + 2 * b, 3, "%02x", sha[b]);
    snprintf(final, sizeof final, "%s/%s.pulse", objs, hex);
    if (rename(tmp, final) != 0)
      return -1;
    chmod(final, 0644);
    paths[i] = malloc(128);
    snprintf(paths[i], 128, "/v1/objects/%s.pulse", hex);
  }
  free(buf);
  return buf ? 0 : -1;
}

static const char *find_nginx(const char *given) {
  if (given != NULL)
    return access(given, X_OK) == 0 ? given : NULL;
  if (access("/usr/sbin/nginx", X_OK) == 0)
    return "/usr/sbin/nginx";
  static char found[4096];
  const char *path = getenv("PATH");
  while (path != NULL && *path) {
    const char *colon = strchr(path, ':');
    size_t n = colon ? (size_t)(colon - path) : strlen(path);
    snprintf(found, sizeof found, "%.*s/nginx", (int)n, path);
    if (access(found, X_OK) == 0)
      return found;
    path = colon ? colon + 1 : NULL;
  }
  return NULL;
}

/* Starts nginx serving dir/objects at /v1/objects/ on a free port. */
static pid_t start_nginx(const char *bin, const char *work, const char *store,
                         int workers, uint16_t *port_out) {
  char conf[4200], prefix[4096];
  snprintf(prefix, sizeof prefix, "%s/nginx", work);
  mkdir(prefix, 0755);
  snprintf(conf, sizeof conf, "%s/nginx.conf", prefix);
  uint16_t port = free_port();
  FILE *f = fopen(conf, "w");
  if (f == NULL || port == 0)
    return -1;
  /* The same work as pulse: sendfile, keep-alive, no logging. */
  fprintf(f,
          "daemon off;\nmaster_process on;\nworker_processes %d;\npid "
          "%s/nginx.pid;\n"
          "error_log %s/error.log warn;\n"
          "events { worker_connections 4096; }\n"
          "http {\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  "
          "tcp_nodelay on;\n"
          "  keepalive_requests 1000000;\n  keepalive_timeout 65;\n"
          "  client_body_temp_path %s/body;\n  proxy_temp_path %s/proxy;\n"
          "  fastcgi_temp_path %s/fastcgi;\n  uwsgi_temp_path %s/uwsgi;\n  "
          "scgi_temp_path %s/scgi;\n"
          "  default_type application/octet-stream;\n"
          "  server {\n    listen 127.0.0.1:%u;\n"
          "    location /v1/objects/ { alias %s/objects/; }\n  }\n}\n",
          workers, prefix, prefix, prefix, prefix, prefix, prefix, prefix,
          (unsigned)port, store);
  fclose(f);
  char errlog[4300];
  snprintf(errlog, sizeof errlog, "%s/error.log", prefix);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0), dup2(devnull, 1);
    }
    execl(bin, "nginx", "-p", prefix, "-c", conf, "-e", errlog, (char *)NULL);
    _exit(127);
  }
  if (pid < 0)
    return -1;
  for (int i = 0; i < 300; i++) {
    int fd = connect_local(port);
    if (fd >= 0) {
      close(fd);
      *port_out = port;
      return pid;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid)
      return -1;
    usleep(10000);
  }
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  return -1;
}

/* -------------------------------------------------------------- long-poll */

typedef struct {
  uint16_t port;
  uint64_t after;
  double received;
  int status;
} poll_job;

static void *poll_main(void *arg) {
  poll_job *j = arg;
  int fd = connect_local(j->port);
  char req[256], hbuf[65536];
  snprintf(req, sizeof req,
           "GET /v1/head?after=%" PRIu64
           "&timeout_ms=10000 HTTP/1.1\r\nHost: x\r\n\r\n",
           j->after);
  size_t hlen, extra;
  uint64_t clen;
  int close_after;
  j->status = -1;
  if (fd >= 0 && send_all(fd, req, strlen(req)) == 0)
    j->status =
        read_headers(fd, hbuf, sizeof hbuf, &hlen, &clen, &close_after, &extra);
  while (j->status == 200 && extra < clen) {
    ssize_t n = recv(fd, hbuf, sizeof hbuf, 0);
    if (n <= 0)
      break;
    extra += (size_t)n;
  }
  j->received = pulse_tk_now();
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
  h->moved = pulse_tk_now();
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
    double t = pulse_tk_now();
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

typedef struct {
  double median_ms, p90_ms, max_ms; /* from the rename */
  double hook_median_ms;            /* from the publisher's head hook */
  int n, errors;
} poll_result;

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

/* ----------------------------------------------------------------- commit */

typedef struct {
  uint64_t params;
  int steps;
  double bare_median_s, commit_median_s, ratio_median, ratio_max;
  double anchor_steps_ratio_max;
  double write_median_s;
  uint64_t changed_median, patch_median;
  int errors;
} commit_result;

/* The bare encoder's step k (timed: detection against its own snapshot and
 * pulse_patch_encode), then, untimed, its snapshot and digests moved on.
 * Returns the timed seconds; counts failures in *errors. */
static double bare_step(const serve_args *a, pulse_synth *s, uint64_t k,
                        const pulse_tensor_info *info, uint16_t *bare,
                        pulse_tensor_digest *dig, pulse_changes *ch,
                        pulse_encode_tensor *enc, int *errors) {
  size_t n = pulse_synth_tensor_count(s);
  double t0 = pulse_tk_now();
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    ch[i].count = 0;
    pulse_detect_fast(pulse_synth_master(s) + t->offset, PULSE_DTYPE_F32,
                      bare + t->offset, t->numel, 0, a->commit_threads, &ch[i]);
    enc[i].info = info[i];
    enc[i].base = bare + t->offset;
    enc[i].changes = &ch[i];
    enc[i].base_digest = &dig[i];
  }
  pulse_encode_opts eo = PULSE_ENCODE_OPTS_INIT;
  eo.step = k;
  eo.base_step = k - 1;
  eo.threads = a->commit_threads;
  pulse_buffer patch = {NULL, 0};
  if (pulse_patch_encode(&eo, enc, n, &patch) != PULSE_OK)
    (*errors)++;
  double b = pulse_tk_now() - t0;
  pulse_buffer_free(&patch);
  for (size_t i = 0; i < n; i++) { /* untimed: move the bare snapshot on */
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    dig[i] = pulse_digest_apply_changes(dig[i], &ch[i]);
    for (uint64_t c = 0; c < ch[i].count; c++)
      bare[t->offset + ch[i].pos[c]] = ch[i].new_bits[c];
  }
  return b;
}

static commit_result bench_commit(const serve_args *a, const char *work) {
  commit_result r;
  memset(&r, 0, sizeof r);
  pulse_synth_opts so = PULSE_SYNTH_OPTS_INIT;
  so.params = a->params;
  pulse_synth *s = NULL;
  if (pulse_synth_create(&so, &s) != PULSE_OK) {
    r.errors = 1;
    return r;
  }
  size_t n = pulse_synth_tensor_count(s);
  uint64_t total = pulse_synth_param_count(s);
  r.params = total;
  pulse_tensor_info *info = calloc(n, sizeof *info);
  pulse_changes *ch = calloc(n, sizeof *ch);
  pulse_encode_tensor *enc = calloc(n, sizeof *enc);
  pulse_tensor_digest *dig = calloc(n, sizeof *dig);
  pulse_pub_tensor *pt = calloc(n, sizeof *pt);
  uint16_t *bare = malloc(total * 2);
  int steps = (int)a->steps;
  double *bare_s = calloc((size_t)steps + 1, sizeof(double));
  double *commit_s = calloc((size_t)steps + 1, sizeof(double));
  double *ratio = calloc((size_t)steps + 1, sizeof(double));
  double *write_s = calloc((size_t)steps + 1, sizeof(double));
  double *changed = calloc((size_t)steps + 1, sizeof(double));
  double *bytes = calloc((size_t)steps + 1, sizeof(double));
  memcpy(bare, pulse_synth_bf16(s), total * 2);
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    info[i] = t->info;
    dig[i] = pulse_digest_bf16(bare + t->offset, t->numel);
  }
  char store[4096];
  snprintf(store, sizeof store, "%s/commit-store", work);
  pulse_sign_key *key = NULL;
  pulse_sign_key_generate(&key);
  pulse_pub_opts po = PULSE_PUB_OPTS_INIT;
  po.tensors = info;
  po.tensor_count = n;
  po.key = key;
  po.anchor_every = a->anchor_every;
  po.threads = a->commit_threads;
  pulse_pub *pub = NULL;
  if (pulse_pub_create(store, &po, &pub) != PULSE_OK) {
    r.errors = 1;
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    pt[i].data = pulse_synth_master(s) + t->offset;
    pt[i].dtype = PULSE_DTYPE_F32;
    pt[i].memory = PULSE_PUB_HOST;
  }
  if (pulse_pub_commit(pub, 0, pt, n, NULL) != PULSE_OK) {
    r.errors = 1;
    goto done;
  }
  double anchor_max = 0;
  for (int k = 1; k <= steps; k++) {
    pulse_synth_step(s);
    pulse_pub_figures f;
    memset(&f, 0, sizeof f);
    double b = 0, c = 0;
    for (int order = 0; order < 2; order++) {
      int bare_now =
          (order == 0) == (k % 2 == 1); /* alternate which goes first */
      if (!bare_now) {
        double t0 = pulse_tk_now(); /* the whole call, housekeeping included */
        if (pulse_pub_commit(pub, (uint64_t)k, pt, n, &f) != PULSE_OK)
          r.errors++;
        c = pulse_tk_now() - t0;
        /* Untimed: once the head has moved, the publisher moves its
         * snapshot to the step, removes dropped objects and writes anchors
         * in the background (while a trainer computes its next step); let
         * that finish so that it never runs beside the bare encoder. */
        pulse_pub_wait(pub);
        continue;
      }
      b = bare_step(a, s, (uint64_t)k, info, bare, dig, ch, enc, &r.errors);
    }
    bare_s[k - 1] = b;
    commit_s[k - 1] = c;
    ratio[k - 1] = c / b;
    write_s[k - 1] = f.write_seconds;
    changed[k - 1] = (double)f.changed;
    bytes[k - 1] = (double)f.patch_bytes;
    if ((f.anchor_started || f.anchor_bytes) && ratio[k - 1] > anchor_max)
      anchor_max = ratio[k - 1];
    if (!a->json)
      printf("  commit step %d: bare encoder %.1f ms, commit %.1f ms (detect "
             "%.1f, encode %.1f, "
             "write %.1f)%s, x%.3f\n",
             k, b * 1e3, c * 1e3, f.detect_seconds * 1e3,
             f.encode_seconds * 1e3, f.write_seconds * 1e3,
             f.anchor_started ? ", anchor started" : "", ratio[k - 1]);
  }
  r.steps = steps;
  r.ratio_max = 0;
  for (int k = 0; k < steps; k++)
    if (ratio[k] > r.ratio_max)
      r.ratio_max = ratio[k];
  r.anchor_steps_ratio_max = anchor_max;
  r.bare_median_s = pulse_tk_median(bare_s, (size_t)steps);
  r.commit_median_s = pulse_tk_median(commit_s, (size_t)steps);
  r.ratio_median = pulse_tk_median(ratio, (size_t)steps);
  r.write_median_s = pulse_tk_median(write_s, (size_t)steps);
  r.changed_median = (uint64_t)pulse_tk_median(changed, (size_t)steps);
  r.patch_median = (uint64_t)pulse_tk_median(bytes, (size_t)steps);
done:
  pulse_pub_free(pub);
  pulse_sign_key_free(key);
  for (size_t i = 0; i < n; i++)
    pulse_changes_free(&ch[i]);
  free(info), free(ch), free(enc), free(dig), free(pt), free(bare);
  free(bare_s), free(commit_s), free(ratio), free(write_s), free(changed),
      free(bytes);
  pulse_synth_free(s);
  return r;
}

/* ------------------------------------------------------------------- main */

static int parse_args(int argc, char **argv, serve_args *a) {
  memset(a, 0, sizeof *a);
  a->object_mb = 256;
  a->objects = 2;
  a->clients[0] = 1, a->clients[1] = 8, a->clients[2] = 32;
  a->nclients = 3;
  a->seconds = 3;
  a->rounds = 2;
  a->polls = 50;
  a->params = 20000000;
  a->steps = 8;
  a->anchor_every = 4;
  const char *v;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_tk_opt_flag(argv[i], "--help")) {
      bench_serve_usage(stdout);
      exit(0);
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--object-mb", &v)) !=
               0) {
      if (r < 0 || pulse_tk_parse_u64(v, &a->object_mb) != 0 ||
          a->object_mb < 1 || a->object_mb > 65536)
        return fprintf(stderr, PROG ": --object-mb needs 1..65536\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--objects", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 1, 64, &a->objects) != 0)
        return fprintf(stderr, PROG ": --objects needs 1..64\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--clients", &v)) != 0) {
      if (r < 0)
        return -1;
      a->nclients = 0;
      char tmp[256];
      snprintf(tmp, sizeof tmp, "%s", v);
      for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        if (a->nclients == MAX_CLIENT_COUNTS ||
            pulse_tk_parse_int(tok, 1, 1024, &a->clients[a->nclients]) != 0)
          return fprintf(stderr,
                         PROG ": --clients needs up to 8 counts in 1..1024\n"),
                 -1;
        a->nclients++;
      }
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--seconds", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_double(v, &a->seconds) != 0 ||
          !(a->seconds > 0) || a->seconds > 600)
        return fprintf(stderr, PROG ": --seconds needs a number in (0, 600]\n"),
               -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--rounds", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 1, 100, &a->rounds) != 0)
        return fprintf(stderr, PROG ": --rounds needs 1..100\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 0, 256, &a->threads) != 0)
        return fprintf(stderr, PROG ": --threads needs 0..256\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--nginx", &v)) != 0) {
      if (r < 0)
        return -1;
      a->nginx = v;
    } else if (pulse_tk_opt_flag(argv[i], "--no-nginx")) {
      a->no_nginx = 1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--polls", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 1, 100000, &a->polls) != 0)
        return fprintf(stderr, PROG ": --polls needs 1..100000\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &a->params) != 0 ||
          a->params < PULSE_SYNTH_MIN_PARAMS)
        return fprintf(stderr, PROG ": --params needs an integer >= %u\n",
                       PULSE_SYNTH_MIN_PARAMS),
               -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &a->steps) != 0 || a->steps < 1 ||
          a->steps > 10000)
        return fprintf(stderr, PROG ": --steps needs 1..10000\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--anchor-every", &v)) !=
               0) {
      if (r < 0 || pulse_tk_parse_u64(v, &a->anchor_every) != 0)
        return fprintf(stderr, PROG ": --anchor-every needs an integer\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--commit-threads",
                                       &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 0, 256, &a->commit_threads) != 0)
        return fprintf(stderr, PROG ": --commit-threads needs 0..256\n"), -1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--only", &v)) != 0) {
      if (r < 0 ||
          (strcmp(v, "throughput") && strcmp(v, "poll") && strcmp(v, "commit")))
        return fprintf(stderr, PROG ": --only throughput|poll|commit\n"), -1;
      a->skip_throughput = strcmp(v, "throughput") != 0;
      a->skip_poll = strcmp(v, "poll") != 0;
      a->skip_commit = strcmp(v, "commit") != 0;
    } else if (pulse_tk_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return -1;
      a->report = v;
    } else {
      fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]);
      return -1;
    }
  }
  return 0;
}

/* What the three parts measured, for the JSON line and the report. */
typedef struct {
  int workers;
  tp_result pulse_tp[MAX_CLIENT_COUNTS], nginx_tp[MAX_CLIENT_COUNTS];
  int have_nginx;
  poll_result notify_r, watch_r;
  commit_result cr;
} serve_results;

/* 1. Throughput: pulse's server and nginx over the same objects, best of
 * interleaved rounds per client count. 0 or 1 (said on stderr). */
static int serve_throughput(const serve_args *a, const char *work, serve_results *res) {
  char store[4096];
  snprintf(store, sizeof store, "%s/store", work);
  int workers = res->workers;
  char **paths = calloc((size_t)a->objects, sizeof *paths);
  if (make_objects(store, a->object_mb, a->objects, paths) != 0) {
    fprintf(stderr, PROG ": cannot write the objects in %s\n", store);
    return 1;
  }
  pulse_server_opts so = PULSE_SERVER_OPTS_INIT;
  so.store_dir = store;
  so.threads = (unsigned)workers;
  so.watch = 0;
  pulse_server *srv = NULL;
  pulse_status st = pulse_server_create(&so, &srv);
  if (st != PULSE_OK)
    return pulse_tk_fail(PROG, "server", st);
  pid_t nginx = -1;
  uint16_t nport = 0;
  const char *nginx_why = "";
  const char *bin = a->no_nginx ? NULL : find_nginx(a->nginx);
  if (a->no_nginx)
    nginx_why = "--no-nginx";
  else if (bin == NULL)
    nginx_why = "nginx not found (apt-get install nginx)";
  else if ((nginx = start_nginx(bin, work, store, workers, &nport)) < 0)
    nginx_why = "nginx did not start (see its error.log)";
  int have_nginx = res->have_nginx = nginx > 0;
  if (!have_nginx && !a->json)
    printf("nginx column skipped: %s\n", nginx_why);
  if (!a->json)
    printf("throughput: %d objects of %" PRIu64
           " MiB, %.1f s per run, best of %d interleaved "
           "rounds, %d server threads / nginx workers, loopback\n",
           a->objects, a->object_mb, a->seconds, a->rounds, workers);
  /* Warm the page cache so neither server pays for the first read. */
  run_clients(pulse_server_port(srv), paths, a->objects, a->objects, 0.5);
  tp_result *pulse_tp = res->pulse_tp, *nginx_tp = res->nginx_tp;
  for (int c = 0; c < a->nclients; c++) {
    for (int r = 0; r < a->rounds; r++) {
      tp_result p = run_clients(pulse_server_port(srv), paths, a->objects, a->clients[c],
                                a->seconds);
      if (p.mbps > pulse_tp[c].mbps)
        pulse_tp[c] = p;
      if (have_nginx) {
        tp_result n = run_clients(nport, paths, a->objects, a->clients[c], a->seconds);
        if (n.mbps > nginx_tp[c].mbps)
          nginx_tp[c] = n;
      }
    }
    if (!a->json) {
      printf("  %3d clients: pulse %8.0f MB/s (%" PRIu64 " objects, %d errors)", a->clients[c],
             pulse_tp[c].mbps, pulse_tp[c].requests, pulse_tp[c].errors);
      if (have_nginx)
        printf("   nginx %8.0f MB/s (%" PRIu64 " objects, %d errors)   pulse/nginx %.2f",
               nginx_tp[c].mbps, nginx_tp[c].requests, nginx_tp[c].errors,
               nginx_tp[c].mbps > 0 ? pulse_tp[c].mbps / nginx_tp[c].mbps : 0);
      printf("\n");
      fflush(stdout);
    }
  }
  if (have_nginx) {
    kill(nginx, SIGTERM);
    waitpid(nginx, NULL, 0);
  }
  pulse_server_free(srv);
  for (int i = 0; i < a->objects; i++)
    free(paths[i]);
  free(paths);
  rm_rf(store);
  return 0;
}

/* 2. Long-poll wake-up: a server told by the in-process publisher, and one
 * that watches head.json. 0 or 1 (said on stderr). */
static int serve_longpoll(const serve_args *a, const char *work, serve_results *res) {
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
  pulse_server_opts so = PULSE_SERVER_OPTS_INIT;
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
  pulse_pub_opts po = PULSE_PUB_OPTS_INIT;
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
    rc = pulse_tk_fail(PROG, "long-poll setup", st);
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
             a->polls, nr->median_ms, nr->p90_ms, nr->max_ms, nr->hook_median_ms,
             nr->errors ? " (errors!)" : "", wr->median_ms, wr->p90_ms, wr->max_ms,
             wr->errors ? " (errors!)" : "");
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
  rm_rf(store);
  return rc;
}

/* 3. Commit vs bare encoder. 0 or 1. */
static int serve_commit(const serve_args *a, const char *work, serve_results *res) {
  if (!a->json)
    printf("commit vs bare encoder (%" PRIu64 " parameters requested, anchors every %" PRIu64
           " in the background):\n",
           a->params, a->anchor_every);
  commit_result cr = res->cr = bench_commit(a, work);
  if (!a->json)
    printf("  median: bare %.1f ms, commit %.1f ms (write %.1f ms): medians "
           "x%.3f, per-step commit/bare median x%.3f (max x%.3f, anchor "
           "steps max x%.3f); %" PRIu64 " changed, patch %" PRIu64 " bytes\n",
           cr.bare_median_s * 1e3, cr.commit_median_s * 1e3, cr.write_median_s * 1e3,
           cr.bare_median_s > 0 ? cr.commit_median_s / cr.bare_median_s : 0, cr.ratio_median,
           cr.ratio_max, cr.anchor_steps_ratio_max, cr.changed_median, cr.patch_median);
  return cr.errors ? 1 : 0;
}

static void serve_json(const serve_args *a, const serve_results *res) {
  const tp_result *pulse_tp = res->pulse_tp, *nginx_tp = res->nginx_tp;
  const poll_result *nr = &res->notify_r, *wr = &res->watch_r;
  const commit_result *cr = &res->cr;
  printf("{\"mode\":\"serve\",\"throughput\":{\"object_mib\":%" PRIu64 ",\"objects\":%d,"
         "\"seconds\":%.3f,\"rounds\":%d,\"workers\":%d,\"nginx\":%s,\"runs\":[",
         a->object_mb, a->objects, a->seconds, a->rounds, res->workers,
         res->have_nginx ? "true" : "false");
  for (int c = 0; !a->skip_throughput && c < a->nclients; c++) {
    printf("%s{\"clients\":%d,\"pulse_mbps\":%.1f,\"pulse_errors\":%d", c ? "," : "",
           a->clients[c], pulse_tp[c].mbps, pulse_tp[c].errors);
    if (res->have_nginx)
      printf(",\"nginx_mbps\":%.1f,\"nginx_errors\":%d,\"ratio\":%.3f", nginx_tp[c].mbps,
             nginx_tp[c].errors, nginx_tp[c].mbps > 0 ? pulse_tp[c].mbps / nginx_tp[c].mbps : 0);
    printf("}");
  }
  printf("]},\"longpoll\":{\"polls\":%d,\"notify_median_ms\":%.3f,\"notify_"
         "p90_ms\":%.3f,"
         "\"notify_max_ms\":%.3f,\"notify_from_hook_median_ms\":%.3f,\"watch_"
         "median_ms\":%.3f,"
         "\"watch_p90_ms\":%.3f,\"watch_max_ms\":%.3f,\"errors\":%d},",
         a->polls, nr->median_ms, nr->p90_ms, nr->max_ms, nr->hook_median_ms, wr->median_ms,
         wr->p90_ms, wr->max_ms, nr->errors + wr->errors);
  printf("\"commit\":{\"params\":%" PRIu64 ",\"steps\":%d,\"bare_median_s\":%.6f,"
         "\"commit_median_s\":%.6f,\"write_median_s\":%.6f,"
         "\"ratio_of_medians\":%.4f,\"ratio_median\":%.4f,"
         "\"ratio_max\":%.4f,\"anchor_steps_ratio_max\":%.4f}}\n",
         cr->params, cr->steps, cr->bare_median_s, cr->commit_median_s, cr->write_median_s,
         cr->bare_median_s > 0 ? cr->commit_median_s / cr->bare_median_s : 0, cr->ratio_median,
         cr->ratio_max, cr->anchor_steps_ratio_max);
}

/* --report DIR: the three tables and their charts. 0 or 1. */
static int serve_report(const serve_args *a, int argc, char **argv, const serve_results *res) {
  pulse_report *rep = NULL;
  if (pulse_report_create(a->report, "serve", argc, argv, &rep) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: cannot make %s\n", a->report);
    return 1;
  }
  int have_nginx = res->have_nginx;
  static const char *const tcols[] = {"clients", "pulse_MBps", "nginx_MBps", "pulse_errors",
                                      "nginx_errors"};
  pulse_report_table *tt = pulse_report_table_add(rep, "throughput", tcols, 5);
  for (int c = 0; !a->skip_throughput && c < a->nclients; c++) {
    pulse_report_row(tt);
    pulse_report_num(tt, a->clients[c]);
    pulse_report_num(tt, res->pulse_tp[c].mbps);
    pulse_report_num(tt, have_nginx ? res->nginx_tp[c].mbps : NAN);
    pulse_report_num(tt, res->pulse_tp[c].errors);
    pulse_report_num(tt, have_nginx ? res->nginx_tp[c].errors : NAN);
  }
  if (!a->skip_throughput && !have_nginx)
    pulse_report_note(rep, "nginx not found: throughput measured for pulse only");
  static const char *const lcols[] = {"server", "median_ms", "p90_ms", "max_ms"};
  pulse_report_table *lt = pulse_report_table_add(rep, "longpoll", lcols, 4);
  const poll_result *pr[2] = {&res->notify_r, &res->watch_r};
  static const char *const pname[2] = {"notify (hook)", "watch (inotify)"};
  for (int k = 0; !a->skip_poll && k < 2; k++) {
    pulse_report_row(lt);
    pulse_report_text(lt, pname[k]);
    pulse_report_num(lt, pr[k]->median_ms);
    pulse_report_num(lt, pr[k]->p90_ms);
    pulse_report_num(lt, pr[k]->max_ms);
  }
  static const char *const ccols[] = {"params", "bare_median_ms", "commit_median_ms",
                                      "write_median_ms", "ratio_median", "ratio_max"};
  pulse_report_table *ct = pulse_report_table_add(rep, "commit", ccols, 6);
  if (!a->skip_commit) {
    const commit_result *cr = &res->cr;
    const double v[] = {(double)cr->params, cr->bare_median_s * 1e3, cr->commit_median_s * 1e3,
                        cr->write_median_s * 1e3, cr->ratio_median, cr->ratio_max};
    pulse_report_row(ct);
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
      pulse_report_num(ct, v[k]);
  }
  pulse_report_chart_spec c1 = {PULSE_REPORT_BAR, "throughput",
                                "Serving throughput per client count: pulse vs nginx",
                                "clients", "concurrent clients", "throughput (MB/s)", tcols + 1,
                                2, 0, 0};
  pulse_report_chart_spec c2 = {PULSE_REPORT_BAR, "longpoll",
                                "Long-poll wake-up latency: rename of head.json to client",
                                "server", "server", "latency (ms)", lcols + 1, 3, 0, 0};
  pulse_report_chart_spec c3 = {PULSE_REPORT_BAR, "commit", "Commit vs bare encoder (median)",
                                "params", "parameters", "time per step (ms)", ccols + 1, 3, 0, 0};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2), pulse_report_chart(rep, &c3);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: %s\n", why);
    return 1;
  }
  return 0;
}

int bench_serve_main(int argc, char **argv) {
  serve_args a;
  if (parse_args(argc, argv, &a) != 0)
    return bench_serve_usage(stderr), 2;
  signal(SIGPIPE, SIG_IGN);
  /* $TMPDIR picks the file system (fsync costs differ widely). */
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || tmp[0] == '\0' || strlen(tmp) > 512)
    tmp = "/tmp";
  char work[600];
  snprintf(work, sizeof work, "%s/pulse-bench-serve-XXXXXX", tmp);
  if (mkdtemp(work) == NULL)
    return fprintf(stderr, PROG ": mkdtemp: %s\n", strerror(errno)), 1;
  chmod(work, 0755);
  static serve_results res; /* static: large, and one per process */
  memset(&res, 0, sizeof res);
  res.workers = a.threads > 0 ? a.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (res.workers < 2)
    res.workers = 2;
  int rc = 0;
  if (!a.skip_throughput && serve_throughput(&a, work, &res) != 0) {
    rm_rf(work);
    return 1;
  }
  if (!a.skip_poll)
    rc |= serve_longpoll(&a, work, &res);
  if (!a.skip_commit)
    rc |= serve_commit(&a, work, &res);
  if (a.json)
    serve_json(&a, &res);
  if (a.report != NULL)
    rc |= serve_report(&a, argc, argv, &res);
  rm_rf(work);
  return rc;
}
