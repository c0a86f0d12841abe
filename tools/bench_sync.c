/* bench_sync.c - `pulse-bench sync`: per-step sync time and bytes on the
 * wire, dense BF16 checkpoint vs pulse, over loopback and over rate-limited
 * links.
 *
 * In one process: a publisher and the HTTP server (trainer side) and a
 * subscriber with host targets (inference side). The model is a table of
 * 4096-wide BF16 matrices; each step moves a `density` of its weights by
 * 1-3 BF16 ulps, each weight with a probability that falls with its
 * exponent as under Adam (bs_model_calibrate; --uniform: every weight
 * alike, which gives the class model nothing to use). Each link runs `steps`
 * steps: the publisher commits, the subscriber syncs (head, patch,
 * verify, decode, apply; its own split of the time), and the dense figure
 * is the download of the whole BF16 checkpoint (the anchor) over the same
 * link, timed on a prefix of --dense-sample bytes and scaled linearly on a
 * rate-limited link (said so in the output).
 *
 * Rate-limited links (root and `ip` needed, else skipped with a note): a
 * veth pair between the root network namespace (server side) and a new one
 * (client side), with `tc qdisc ... tbf rate R burst 256kb latency 50ms` on
 * the server's end (--burst); the syncing thread joins the client namespace
 * with setns(2). The namespace and the veth are removed on every exit path
 * (SIGINT and SIGTERM included). The bucket is 64 KB by default, not the
 * 256 KB often written: a bucket refilled between steps would carry a
 * whole small patch at memory speed and flatter the pulse figure. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_impl.h"
#include "pulse_cuda.h"
#include "pulse_log.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_store.h"
#include "pulse_subscriber.h"
#include "toolkit_args.h"
#include "toolkit_report.h"
#include "toolkit_time.h"

void bench_sync_usage(FILE *out) {
  fprintf(out, "usage: pulse-bench sync [options]\n"
               "  per-step sync time and bytes on the wire, dense BF16 vs "
               "pulse, publisher and\n"
               "  subscriber in one process over HTTP\n"
               "  --params N         parameters (default 1e8; 1e9 needs about "
               "8 GB of memory)\n"
               "  --density X        fraction of weights that change per step "
               "(default 0.01)\n"
               "  --steps S          synced steps per link (default 3; the "
               "median is reported)\n"
               "  --links L          comma list of loopback, 100mbit, 1gbit, "
               "or any tc rate\n"
               "                     (default loopback,100mbit,1gbit; "
               "rate-limited links need root and\n"
               "                     `ip netns`, else they are skipped)\n"
               "  --burst SIZE       tbf bucket of the rate-limited links "
               "(default 64kb: a bucket as\n"
               "                     large as a patch would let it through at "
               "memory speed)\n"
               "  --dense-sample B   bytes of the dense download timed on a "
               "rate-limited link, scaled\n"
               "                     to the whole checkpoint (default 64M)\n"
               "  --plain            plain position model (about 40%% more bytes on "
               "real\n"
               "                     trajectories; decodes without a class index)\n"
               "  --uniform          every weight changes with the same probability "
               "(default: by\n"
               "                     exponent, as under Adam; uniform leaves the class "
               "model\n"
               "                     nothing to use)\n"
               "  --no-index         the subscriber keeps no class index (class-model "
               "patches\n"
               "                     then decode with a pass over the weights)\n"
               "  --no-stream        download each patch whole before decoding "
               "it (the subscriber\n"
               "                     otherwise decodes chunks while the patch "
               "downloads)\n"
               "  --threads N        threads (default: one per core)\n"
               "  --device           targets in GPU memory: the host decodes the streams,\n"
               "                     the GPU places and writes the changes (without a CUDA\n"
               "                     device: says so and exits 0)\n"
               "  --seed N           generator seed (default 1)\n"
               "  --json             one JSON object per link: params, "
               "density, link, bytes_dense,\n"
               "                     bytes_pulse, seconds_dense, "
               "seconds_pulse, and the split\n"
               "  --report DIR       also write DIR/links.csv and DIR/report.html "
               "(charts)\n");
}

/* ------------------------------------------------------------------ model */

typedef struct {
  size_t count;
  pulse_tensor_info *info;
  char (*names)[48];
  uint64_t *numel;
  uint16_t **bits;
  uint64_t total;
  uint64_t rng;
  double p[256]; /* change probability by exponent field */
  double p_max;  /* the largest of them */
} bs_model;

static uint64_t bs_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static int bs_model_init(bs_model *m, uint64_t params, uint64_t seed) {
  const uint64_t width = 4096, per = width * width;
  memset(m, 0, sizeof *m);
  m->rng = seed * 0x2545F4914F6CDD1Dull + 1;
  m->count = (size_t)((params + per - 1) / per);
  m->info = calloc(m->count, sizeof *m->info);
  m->names = calloc(m->count, sizeof *m->names);
  m->numel = calloc(m->count, sizeof *m->numel);
  m->bits = calloc(m->count, sizeof *m->bits);
  if (!m->info || !m->names || !m->numel || !m->bits)
    return -1;
  for (size_t i = 0; i < m->count; i++) {
    uint64_t left = params - (uint64_t)i * per,
             rows = (left < per ? left : per) / width;
    if (rows == 0)
      rows = 1;
    snprintf(m->names[i], sizeof m->names[i], "layers.%zu.weight", i);
    m->info[i].name = m->names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = 2;
    m->info[i].shape[0] = rows;
    m->info[i].shape[1] = width;
    m->numel[i] = rows * width;
    m->total += m->numel[i];
    m->bits[i] = malloc(m->numel[i] * 2);
    if (m->bits[i] == NULL)
      return -1;
    /* N(0, 0.02)-like weights (Irwin-Hall of four uniforms), as BF16. */
    for (uint64_t k = 0; k < m->numel[i]; k++) {
      uint64_t r = bs_rand(&m->rng);
      double u = ((double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
                  (double)((r >> 32) & 0xffff) + (double)(r >> 48)) /
                     65536.0 -
                 2.0;
      float w = (float)(u * 1.7320508 * 0.02);
      uint32_t b;
      memcpy(&b, &w, 4);
      m->bits[i][k] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
    }
  }
  return 0;
}

/* Under Adam a step moves a weight by about the learning rate, and the move
 * shows in BF16 when it crosses an ulp, about |w|/128: a weight changes
 * with a probability about proportional to 2^-exponent. So p[e] =
 * min(cap, c 2^-e), c set by bisection so that they average to `density`
 * over the model's exponents (sampled from its first tensor), and the
 * smallest weights capped at 8x the density. The real AdamW trajectory has
 * this shape: there class-conditioned positions take 30% fewer bytes.
 * uniform: p[e] = density for every e. */
static void bs_model_calibrate(bs_model *m, double density, int uniform) {
  double hist[256] = {0}, n = 0;
  uint64_t sample = m->numel[0] < ((uint64_t)1 << 20) ? m->numel[0] : (uint64_t)1 << 20;
  for (uint64_t k = 0; k < sample; k++, n++)
    hist[(m->bits[0][k] >> 7) & 0xFF]++;
  double cap = 8 * density < 1 ? 8 * density : 1;
  double lo = -200, hi = 200; /* log2 c */
  for (int it = 0; it < 200 && !uniform; it++) {
    double mid = (lo + hi) / 2, mean = 0;
    for (int e = 0; e < 256; e++) {
      double q = exp2(mid - e);
      mean += hist[e] * (q < cap ? q : cap);
    }
    if (mean / n < density)
      lo = mid;
    else
      hi = mid;
  }
  m->p_max = 0;
  for (int e = 0; e < 256; e++) {
    double q = exp2(lo - e);
    m->p[e] = uniform ? density : (q < cap ? q : cap);
    if (hist[e] > 0 && m->p[e] > m->p_max)
      m->p_max = m->p[e];
  }
  if (m->p_max <= 0)
    m->p_max = density;
}

/* Moves weights by 1-3 ulps, each with its probability p[exponent]:
 * geometric skips at p_max, each stop taken with p / p_max (O(changes)). */
static void bs_model_step(bs_model *m) {
  double lq = log1p(-(m->p_max < 1 ? m->p_max : 0.999999));
  for (size_t i = 0; i < m->count; i++) {
    uint64_t pos = 0;
    for (;;) {
      double u = ((double)(bs_rand(&m->rng) >> 11) + 1.0) * 0x1p-53;
      pos += (uint64_t)(log(u) / lq);
      if (pos >= m->numel[i])
        break;
      uint64_t r = bs_rand(&m->rng);
      double take = m->p[(m->bits[i][pos] >> 7) & 0xFF] / m->p_max;
      if (take < 1 && (double)(bs_rand(&m->rng) >> 11) * 0x1p-53 >= take) {
        pos++;
        continue;
      }
      int delta = (int)(r % 3) + 1;
      m->bits[i][pos] =
          (uint16_t)(m->bits[i][pos] + ((r >> 8) & 1 ? delta : -delta));
      pos++;
    }
  }
}

static void bs_model_free(bs_model *m) {
  for (size_t i = 0; m->bits && i < m->count; i++)
    free(m->bits[i]);
  free(m->info), free(m->names), free(m->numel), free(m->bits);
}

/* ------------------------------------------------------------- network */

typedef struct {
  char name[32];
  char rate[32]; /* tc rate, "" for loopback */
} bs_link;

static char ns_name[64], veth_srv[16], veth_cli[16], ns_subnet[32];
static int ns_made = 0;

static int run(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[1200];
  snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
  int rc = system(full);
  return rc == 0 ? 0 : -1;
}

static void netns_teardown(void) {
  if (!ns_made)
    return;
  run("ip link del %s", veth_srv);
  run("ip netns del %s", ns_name);
  ns_made = 0;
}

static int netns_setup(void) {
  if (geteuid() != 0 || run("ip -V") != 0 || run("tc -V") != 0)
    return -1;
  unsigned pid = (unsigned)getpid();
  snprintf(ns_name, sizeof ns_name, "pulse-bench-%u", pid);
  snprintf(veth_srv, sizeof veth_srv, "pb%us", pid % 10000000u);
  snprintf(veth_cli, sizeof veth_cli, "pb%uc", pid % 10000000u);
  snprintf(ns_subnet, sizeof ns_subnet, "10.213.%u", pid % 250u + 1);
  if (run("ip netns add %s", ns_name) != 0)
    return -1;
  ns_made = 1;
  if (run("ip link add %s type veth peer name %s", veth_srv, veth_cli) != 0 ||
      run("ip link set %s netns %s", veth_cli, ns_name) != 0 ||
      run("ip addr add %s.1/30 dev %s", ns_subnet, veth_srv) != 0 ||
      run("ip link set %s up", veth_srv) != 0 ||
      run("ip netns exec %s ip addr add %s.2/30 dev %s", ns_name, ns_subnet,
          veth_cli) != 0 ||
      run("ip netns exec %s ip link set %s up", ns_name, veth_cli) != 0 ||
      run("ip netns exec %s ip link set lo up", ns_name) != 0) {
    netns_teardown();
    return -1;
  }
  return 0;
}

static int netns_rate(const char *rate, const char *burst) {
  return run("tc qdisc replace dev %s root tbf rate %s burst %s latency 50ms",
             veth_srv, rate, burst);
}

/* ---------------------------------------------------------- stop signals */

static atomic_int bs_stop;
static pulse_sub *_Atomic bs_current;

static void *bs_signal_thread(void *arg) {
  sigset_t *set = arg;
  int sig = 0;
  sigwait(set, &sig);
  if (sig != SIGUSR1) {
    atomic_store(&bs_stop, 1);
    pulse_sub *s = atomic_load(&bs_current);
    if (s != NULL)
      pulse_sub_stop(s);
  }
  return NULL;
}

/* -------------------------------------------------------- dense download */

static size_t bs_discard(char *p, size_t sz, size_t n, void *ctx) {
  (void)p;
  *(uint64_t *)ctx += sz * n;
  return sz * n;
}

/* Seconds to GET `bytes` (a prefix) of url; -1 on failure. */
static double bs_dense_get(const char *url, uint64_t bytes) {
  CURL *c = curl_easy_init();
  if (c == NULL)
    return -1;
  char range[64];
  snprintf(range, sizeof range, "0-%" PRIu64, bytes - 1);
  uint64_t got = 0;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_RANGE, range);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, bs_discard);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  /* Connect first, so that the timing is the transfer. */
  curl_easy_setopt(c, CURLOPT_CONNECT_ONLY, 0L);
  double t0 = pulse_tk_now();
  CURLcode rc = curl_easy_perform(c);
  double t = pulse_tk_since(t0);
  double connect = 0;
  curl_easy_getinfo(c, CURLINFO_CONNECT_TIME, &connect);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && got == bytes ? t - connect : -1;
}

/* ---------------------------------------------------------------- main */

typedef struct {
  double seconds, transfer, verify, decode, apply, overlap;
  uint64_t bytes, patch_bytes, changed;
} bs_sample;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_of(const bs_sample *s, size_t n, size_t off) {
  double v[256];
  for (size_t i = 0; i < n; i++)
    v[i] = *(const double *)((const char *)&s[i] + off);
  qsort(v, n, sizeof v[0], cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t median_u64(const bs_sample *s, size_t n, size_t off) {
  double v[256];
  for (size_t i = 0; i < n; i++)
    v[i] = (double)*(const uint64_t *)((const char *)&s[i] + off);
  qsort(v, n, sizeof v[0], cmp_double);
  return (uint64_t)(n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

static int bs_fail(const char *what, pulse_status st) {
  return pulse_tk_fail("pulse-bench sync", what, st);
}

static int parse_links(const char *spec, bs_link *links, size_t *n) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL && *n < 8;
       t = strtok_r(NULL, ",", &save)) {
    bs_link *l = &links[(*n)++];
    snprintf(l->name, sizeof l->name, "%s", t);
    if (strcmp(t, "loopback") == 0)
      l->rate[0] = '\0';
    else if (strspn(t, "0123456789.") > 0 &&
             strspn(t, "0123456789.kmgitbpsKMGITBPS") == strlen(t))
      snprintf(l->rate, sizeof l->rate, "%s", t);
    else
      return -1;
  }
  return *n > 0 ? 0 : -1;
}

/* Bits per second of a tc rate ("100mbit", "1gbit"), for the output. */
static double rate_bps(const char *rate) {
  char *end;
  double v = strtod(rate, &end);
  if (strncmp(end, "kbit", 4) == 0)
    return v * 1e3;
  if (strncmp(end, "mbit", 4) == 0)
    return v * 1e6;
  if (strncmp(end, "gbit", 4) == 0)
    return v * 1e9;
  return v;
}

typedef struct {
  pulse_server *srv[2];
} bs_servers;

static void bs_on_head(void *ctx, const pulse_pub_figures *f) {
  bs_servers *s = ctx;
  for (int i = 0; i < 2; i++)
    if (s->srv[i] != NULL)
      pulse_server_on_head(s->srv[i], f);
}

int bench_sync_main(int argc, char **argv) {
  uint64_t params = 100000000, steps = 3, seed = 1,
           dense_sample = (uint64_t)64 << 20;
  double density = 0.01;
  int json = 0, threads = 0, plain = 0, no_stream = 0, no_index = 0, device = 0,
      uniform = 0;
  const char *links_spec = "loopback,100mbit,1gbit", *burst = "64kb", *v;
  const char *report = NULL;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_tk_opt_flag(argv[i], "--help")) {
      bench_sync_usage(stdout);
      return 0;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &params) != 0 || params < 4096 ||
          params > 4000000000ull)
        return fprintf(stderr, "pulse-bench sync: --params needs 4096..4e9\n"),
               2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--density", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_double(v, &density) != 0 ||
          !(density > 0 && density < 0.5))
        return fprintf(stderr,
                       "pulse-bench sync: --density needs 0 < X < 0.5\n"),
               2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &steps) != 0 || steps < 1 ||
          steps > 200)
        return fprintf(stderr, "pulse-bench sync: --steps needs 1..200\n"), 2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--links", &v)) != 0) {
      if (r < 0)
        return bench_sync_usage(stderr), 2;
      links_spec = v;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--burst", &v)) != 0) {
      if (r < 0 || strspn(v, "0123456789kmbKMB") != strlen(v) || v[0] == '\0')
        return fprintf(
                   stderr,
                   "pulse-bench sync: --burst needs a tc size (e.g. 64kb)\n"),
               2;
      burst = v;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--dense-sample", &v)) !=
               0) {
      if (r < 0 || pulse_tk_parse_u64(v, &dense_sample) != 0 ||
          dense_sample < 65536)
        return fprintf(stderr,
                       "pulse-bench sync: --dense-sample needs >= 64k bytes\n"),
               2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 0, 256, &threads) != 0)
        return fprintf(stderr, "pulse-bench sync: --threads needs 0..256\n"), 2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &seed) != 0)
        return fprintf(stderr, "pulse-bench sync: --seed needs an integer\n"),
               2;
    } else if (pulse_tk_opt_flag(argv[i], "--plain")) {
      plain = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--no-stream")) {
      no_stream = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--no-index")) {
      no_index = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--uniform")) {
      uniform = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--device")) {
      device = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--json")) {
      json = 1;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return bench_sync_usage(stderr), 2;
      report = v;
    } else {
      fprintf(stderr, "pulse-bench sync: unknown argument '%s'\n", argv[i]);
      return bench_sync_usage(stderr), 2;
    }
  }
  bs_link links[8];
  size_t nlinks;
  if (parse_links(links_spec, links, &nlinks) != 0)
    return fprintf(stderr, "pulse-bench sync: --links takes loopback and tc "
                           "rates (100mbit)\n"),
           2;
  if (device && !pulse_cuda_available()) {
    printf("pulse-bench sync: --device: no CUDA device (%s)\n", pulse_cuda_unavailable_reason());
    return 0;
  }
  if (getenv("PULSE_LOG") == NULL)
    pulse_log_level_set(PULSE_LOG_ERROR);
  pulse_report *rep = NULL;
  pulse_report_table *rt = NULL;
  if (report != NULL) {
    if (pulse_report_create(report, "sync", argc, argv, &rep) != PULSE_OK)
      return fprintf(stderr, "pulse-bench sync: --report: cannot make %s\n", report), 1;
    static const char *const cols[] = {"link", "link_bits_per_s", "bytes_dense", "bytes_pulse",
                                       "seconds_dense", "seconds_pulse", "transfer_s",
                                       "verify_s", "decode_s", "apply_s",
                                       "decode_overlap_s"};
    rt = pulse_report_table_add(rep, "links", cols, 11);
  }

  /* Stop signals: to one thread, which stops the sync; cleanup follows. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  pthread_t sig_thread;
  int sig_running =
      pthread_create(&sig_thread, NULL, bs_signal_thread, &set) == 0;

  int rc = 0, netns_ok = -1, root_ns = -1, cli_ns = -1;
  char tmpl[] = "/tmp/pulse-bench-sync-XXXXXX", store[4096], cache[4096];
  char *dir = mkdtemp(tmpl);
  bs_model m;
  memset(&m, 0, sizeof m);
  pulse_pub *pub = NULL;
  bs_servers servers = {{NULL, NULL}};
  pulse_sub *sub = NULL;
  uint16_t **targets = NULL;
  uint16_t **dtargets = NULL; /* --device: the targets in GPU memory */
  pulse_status st;
  if (dir == NULL) {
    fprintf(stderr, "pulse-bench sync: cannot make a folder in /tmp\n");
    rc = 1;
    goto done;
  }
  snprintf(store, sizeof store, "%s/store", dir);
  snprintf(cache, sizeof cache, "%s/cache", dir);
  double t0 = pulse_tk_now();
  if (bs_model_init(&m, params, seed) != 0) {
    rc = bs_fail("model", PULSE_ERR_NOMEM);
    goto done;
  }
  bs_model_calibrate(&m, density, uniform);
  if (!json)
    printf("pulse-bench sync: %" PRIu64
           " parameters in %zu tensors, density %.2f%% (%s), %" PRIu64
           " steps per link, %s positions (model made in %.1f s)\n",
           m.total, m.count, density * 100,
           uniform ? "every weight alike" : "by exponent, as under Adam", steps,
           plain ? "plain" : "class", pulse_tk_since(t0));

  /* Trainer side: servers (loopback; the veth address when there is one). */
  int want_netns = 0;
  for (size_t i = 0; i < nlinks; i++)
    want_netns |= links[i].rate[0] != '\0';
  if (want_netns)
    netns_ok = netns_setup();
  if (want_netns && netns_ok != 0)
    pulse_report_note(rep, "rate-limited links skipped (they need root, `ip netns` and tc)");
  if (want_netns && netns_ok != 0 && !json)
    printf("pulse-bench sync: rate-limited links skipped (they need root, `ip "
           "netns` and tc)\n");
  pulse_server_opts so = PULSE_SERVER_OPTS_INIT;
  so.store_dir = store;
  so.watch = 0;
  so.threads = 2;
  if (mkdir(store, 0755) != 0) {
    fprintf(stderr, "pulse-bench sync: cannot make %s\n", store);
    rc = 1;
    goto done;
  }
  if ((st = pulse_server_create(&so, &servers.srv[0])) != PULSE_OK) {
    rc = bs_fail("server", st);
    goto done;
  }
  char veth_host[64];
  if (netns_ok == 0) {
    snprintf(veth_host, sizeof veth_host, "%s.1", ns_subnet);
    so.host = veth_host;
    if ((st = pulse_server_create(&so, &servers.srv[1])) != PULSE_OK) {
      rc = bs_fail("server on the veth", st);
      goto done;
    }
  }
  pulse_pub_opts po = PULSE_PUB_OPTS_INIT;
  po.anchor_every = 0; /* the first state only: every later step is a patch */
  po.keep_patches = 1000;
  po.anchor_sync = 1;
  po.tensors = m.info;
  po.tensor_count = m.count;
  po.threads = threads;
  po.pos_model = plain ? PULSE_POS_PLAIN : PULSE_POS_CLASS;
  po.on_head = bs_on_head;
  po.on_head_ctx = &servers;
  if ((st = pulse_pub_create(store, &po, &pub)) != PULSE_OK) {
    rc = bs_fail("publisher", st);
    goto done;
  }
  pulse_pub_tensor *pt = calloc(m.count, sizeof *pt);
  for (size_t i = 0; pt && i < m.count; i++) {
    pt[i].data = m.bits[i];
    pt[i].dtype = PULSE_DTYPE_BF16;
    pt[i].memory = PULSE_PUB_HOST;
  }
  uint64_t step = 0;
  pulse_pub_figures pf;
  if (pt == NULL ||
      (st = pulse_pub_commit(pub, step, pt, m.count, &pf)) != PULSE_OK) {
    rc = bs_fail("first commit", pt ? st : PULSE_ERR_NOMEM);
    free(pt);
    goto done;
  }
  pulse_store_head *head = NULL;
  pulse_store_head_load(store, &head);
  const pulse_store_object *anchor =
      head ? pulse_store_head_anchor(head, 0) : NULL;
  char anchor_path[PULSE_STORE_PATH_MAX + 8];
  uint64_t anchor_size = anchor ? anchor->size : 0;
  snprintf(anchor_path, sizeof anchor_path, "v1/%s",
           anchor ? anchor->path : "");
  pulse_store_head_free(head);

  /* Inference side: host targets, first synced over loopback (an anchor). */
  targets = calloc(m.count, sizeof *targets);
  char url0[64], url1[128];
  snprintf(url0, sizeof url0, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(servers.srv[0]));
  if (servers.srv[1] != NULL)
    snprintf(url1, sizeof url1, "http://%s:%u", veth_host,
             (unsigned)pulse_server_port(servers.srv[1]));
  const char *urls[1] = {url0};
  pulse_sub_opts o = PULSE_SUB_OPTS_INIT;
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.allow_unsigned = 1; /* the bench publisher does not sign */
  o.use_catchup = 0;
  o.threads = threads;
  o.parallel = 4;
  o.no_streaming = no_stream;
  o.no_class_index = no_index;
  for (size_t i = 0; targets && i < m.count; i++)
    targets[i] = calloc(m.numel[i], 2);
  t0 = pulse_tk_now();
  st = targets ? pulse_sub_create(&o, &sub) : PULSE_ERR_NOMEM;
  for (size_t i = 0; st == PULSE_OK && i < m.count; i++)
    st = targets[i] ? pulse_sub_attach_host(sub, m.info[i].name, 2,
                                            m.info[i].shape, targets[i])
                    : PULSE_ERR_NOMEM;
  atomic_store(&bs_current, sub);
  if (st == PULSE_OK)
    st = pulse_sub_sync(sub);
  atomic_store(&bs_current, NULL);
  if (st != PULSE_OK) {
    rc = bs_fail("first sync", st);
    free(pt);
    goto done;
  }
  pulse_sub_free(sub);
  sub = NULL;
  if (device) { /* the state the host targets reached, now in GPU memory */
    dtargets = calloc(m.count, sizeof *dtargets);
    st = dtargets ? PULSE_OK : PULSE_ERR_NOMEM;
    for (size_t i = 0; st == PULSE_OK && i < m.count; i++) {
      st = pulse_cuda_alloc((void **)&dtargets[i], m.numel[i] * 2 + 2);
      if (st == PULSE_OK)
        st = pulse_cuda_upload(dtargets[i], targets[i], m.numel[i] * 2, NULL);
    }
    if (st == PULSE_OK)
      st = pulse_cuda_sync(NULL);
    if (st != PULSE_OK) {
      rc = bs_fail("device targets", st);
      free(pt);
      goto done;
    }
  }
  if (!json)
    printf("pulse-bench sync: anchor %" PRIu64
           " bytes published and synced over loopback in %.1f s\n",
           anchor_size, pulse_tk_since(t0));

  root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (netns_ok == 0) {
    char p[128];
    snprintf(p, sizeof p, "/var/run/netns/%s", ns_name);
    cli_ns = open(p, O_RDONLY | O_CLOEXEC);
  }
  if (!json)
    printf("%-10s %12s %12s %7s %10s %10s %7s   %s\n", "link", "bytes dense",
           "bytes pulse", "ratio", "s dense", "s pulse", "ratio",
           "pulse split: transfer / verify / decode / apply (s)   "
           "(+decode hidden behind the transfer)");
  for (size_t l = 0; l < nlinks && rc == 0 && !atomic_load(&bs_stop); l++) {
    bs_link *lk = &links[l];
    int limited = lk->rate[0] != '\0';
    if (limited && (netns_ok != 0 || cli_ns < 0))
      continue;
    if (limited && netns_rate(lk->rate, burst) != 0) {
      fprintf(stderr, "pulse-bench sync: tc could not set %s: skipped\n",
              lk->rate);
      continue;
    }
    if (limited && setns(cli_ns, CLONE_NEWNET) != 0) {
      fprintf(stderr, "pulse-bench sync: setns: %s\n", strerror(errno));
      rc = 1;
      break;
    }
    const char *base = limited ? url1 : url0;
    /* Dense: the whole BF16 checkpoint over this link. */
    char durl[256];
    snprintf(durl, sizeof durl, "%s/%s", base, anchor_path);
    uint64_t sample =
        limited && dense_sample < anchor_size ? dense_sample : anchor_size;
    double dt = bs_dense_get(durl, sample);
    double seconds_dense =
        dt >= 0 ? dt * (double)anchor_size / (double)sample : -1;
    int extrapolated = sample < anchor_size;
    /* Pulse: a subscriber on this link, from the step the targets hold. */
    urls[0] = base;
    st = pulse_sub_create(&o, &sub);
    for (size_t i = 0; st == PULSE_OK && i < m.count; i++)
      st = device ? pulse_sub_attach_device(sub, m.info[i].name, 2, m.info[i].shape, dtargets[i])
                  : pulse_sub_attach_host(sub, m.info[i].name, 2, m.info[i].shape, targets[i]);
    if (st == PULSE_OK)
      st = pulse_sub_assume_step(sub, step);
    atomic_store(&bs_current, sub);
    if (st == PULSE_OK)
      st = pulse_sub_sync(sub); /* checks the claim, warms the connection */
    bs_sample s[200];
    size_t ns = 0;
    for (uint64_t k = 0; k < steps && st == PULSE_OK && !atomic_load(&bs_stop);
         k++) {
      bs_model_step(&m);
      step++;
      st = pulse_pub_commit(pub, step, pt, m.count, &pf);
      if (st != PULSE_OK)
        break;
      st = pulse_sub_sync(sub);
      if (st != PULSE_OK)
        break;
      pulse_sub_figures f;
      pulse_sub_figures_get(sub, &f);
      s[ns].seconds = f.last_total_s;
      s[ns].transfer = f.last_transfer_s;
      s[ns].verify = f.last_verify_s;
      s[ns].decode = f.last_decode_s;
      s[ns].apply = f.last_apply_s;
      s[ns].overlap = f.last_decode_overlap_s;
      s[ns].bytes = f.last_bytes;
      s[ns].patch_bytes = pf.patch_bytes;
      s[ns].changed = pf.changed;
      ns++;
    }
    atomic_store(&bs_current, NULL);
    if (st != PULSE_OK)
      rc = bs_fail(lk->name, st);
    pulse_sub_free(sub);
    sub = NULL;
    if (limited && root_ns >= 0)
      setns(root_ns, CLONE_NEWNET);
    if (rc != 0 || ns == 0)
      break;
    double sp = median_of(s, ns, offsetof(bs_sample, seconds));
    double tr = median_of(s, ns, offsetof(bs_sample, transfer));
    double ve = median_of(s, ns, offsetof(bs_sample, verify));
    double de = median_of(s, ns, offsetof(bs_sample, decode));
    double ap = median_of(s, ns, offsetof(bs_sample, apply));
    double ov = median_of(s, ns, offsetof(bs_sample, overlap));
    uint64_t bp = median_u64(s, ns, offsetof(bs_sample, bytes));
    uint64_t pb = median_u64(s, ns, offsetof(bs_sample, patch_bytes));
    uint64_t ch = median_u64(s, ns, offsetof(bs_sample, changed));
    uint64_t bd = m.total * 2;
    double dens = (double)ch / (double)m.total;
    if (json) {
      printf("{\"params\":%" PRIu64
             ",\"density\":%.6f,\"link\":\"%s\",\"link_bits_per_s\":%.0f"
             ",\"bytes_dense\":%" PRIu64 ",\"bytes_pulse\":%" PRIu64
             ",\"patch_bytes\":%" PRIu64
             ",\"seconds_dense\":%.6f,\"seconds_pulse\":%.6f,\"dense_"
             "extrapolated\":%s"
             ",\"dense_sample_bytes\":%" PRIu64
             ",\"transfer_s\":%.6f,\"verify_s\":%.6f"
             ",\"decode_s\":%.6f,\"apply_s\":%.6f,\"decode_overlap_s\":%.6f"
             ",\"streamed\":%s,\"steps\":%zu,\"positions\":"
             "\"%s\",\"targets\":\"%s\"}\n",
             m.total, dens, lk->name, limited ? rate_bps(lk->rate) : 0.0, bd,
             bp, pb, seconds_dense, sp, extrapolated ? "true" : "false", sample,
             tr, ve, de, ap, ov, no_stream ? "false" : "true", ns,
             plain ? "plain" : "class", device ? "device" : "host");
    } else {
      printf("%-10s %12" PRIu64 " %12" PRIu64
             " %6.0fx %9.3f%s %10.4f %6.0fx   %.4f / %.4f / %.4f / %.4f"
             "   (+%.4f)\n",
             lk->name, bd, bp, (double)bd / (double)bp, seconds_dense,
             extrapolated ? "*" : " ", sp, seconds_dense / sp, tr, ve, de, ap,
             ov);
    }
    fflush(stdout);
    pulse_report_row(rt);
    pulse_report_text(rt, lk->name);
    pulse_report_num(rt, limited ? rate_bps(lk->rate) : NAN);
    const double cells[] = {(double)bd, (double)bp, seconds_dense, sp, tr, ve, de, ap, ov};
    for (size_t k = 0; k < sizeof cells / sizeof cells[0]; k++)
      pulse_report_num(rt, cells[k]);
  }
  if (!json && netns_ok == 0)
    printf("* dense timed on the first %" PRIu64
           " bytes and scaled linearly to the whole checkpoint\n"
           "  (dense = transfer only, no verify or apply; pulse bytes include "
           "the head)\n",
           dense_sample);
  if (!json)
    printf("decode = decoding not hidden behind the download; (+x) = "
           "decoding that ran while the patch\n"
           "  was still downloading (%s)\n",
           no_stream ? "none: --no-stream" : "streamed apply");
  free(pt);
done:
  if (rep != NULL) {
    static const char *const secs[] = {"seconds_dense", "seconds_pulse"};
    static const char *const bytes[] = {"bytes_dense", "bytes_pulse"};
    pulse_report_chart_spec c1 = {PULSE_REPORT_LINE, "links",
                                  "Sync time per step vs link: dense BF16 vs pulse", "link",
                                  "link (loopback, then rate-limited links)", "seconds per step (s)",
                                  secs, 2, 0, 1};
    pulse_report_chart_spec c2 = {PULSE_REPORT_BAR, "links", "Bytes per step: dense BF16 vs pulse",
                                  "link", "link", "bytes per step (B)", bytes, 2, 0, 1};
    pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2);
    char why[512];
    if (pulse_report_close(rep, why, sizeof why) != PULSE_OK) {
      fprintf(stderr, "pulse-bench sync: --report: %s\n", why);
      rc = 1;
    }
  }
  atomic_store(&bs_current, NULL);
  pulse_sub_free(sub);
  if (root_ns >= 0)
    close(root_ns);
  if (cli_ns >= 0)
    close(cli_ns);
  pulse_pub_free(pub);
  pulse_server_free(servers.srv[1]);
  pulse_server_free(servers.srv[0]);
  netns_teardown();
  for (size_t i = 0; targets && i < m.count; i++)
    free(targets[i]);
  free(targets);
  for (size_t i = 0; dtargets && i < m.count; i++)
    pulse_cuda_free(dtargets[i]);
  free(dtargets);
  bs_model_free(&m);
  if (dir != NULL)
    run("rm -rf '%s'", dir);
  if (sig_running) {
    pthread_kill(sig_thread, SIGUSR1);
    pthread_join(sig_thread, NULL);
  }
  if (atomic_load(&bs_stop) && rc == 0)
    rc = 1;
  return rc;
}
