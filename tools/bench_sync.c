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
 * verify, decode, apply; its own split of the time). Reported per link:
 * the publisher's commit, the subscriber's sync and their sum (end to
 * end), and the dense figure: the download of the whole BF16 checkpoint
 * (the anchor) over the same link, transfer only (no verify, no load).
 * The dense download is timed whole unless the link would take over
 * BS_DENSE_FULL_S at its nominal rate (or --dense-sample asks for a
 * prefix); then a prefix is timed and scaled linearly, and the table and
 * the JSON say so and from how many bytes (--dense-full: always whole).
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
#include "rng_impl.h"
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
               "  --dense-sample B   time only the first B bytes of the dense "
               "download and scale\n"
               "                     them linearly to the whole checkpoint (said "
               "in the output)\n"
               "  --dense-full       time the whole dense download on every link "
               "(default: whole\n"
               "                     unless the link needs over 60 s for it at "
               "its rate; then the\n"
               "                     bytes of 60 s, scaled, and said so)\n"
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
               "                     bytes_pulse, seconds_dense (and how it was "
               "measured), seconds_commit,\n"
               "                     seconds_pulse (the sync), "
               "seconds_end_to_end, the ratios, the split\n"
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

static uint64_t bs_rand(uint64_t *s) { return pulse_rng_next(s); }

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

/* Seconds to GET `bytes` (a prefix, or the whole object) of url, the
 * connection's setup left out; -1 on failure. */
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
  double t0 = pulse_tk_now();
  CURLcode rc = curl_easy_perform(c);
  double t = pulse_tk_since(t0);
  double connect = 0;
  curl_easy_getinfo(c, CURLINFO_CONNECT_TIME, &connect);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && got == bytes ? t - connect : -1;
}

/* ------------------------------------------------------------ arguments */

/* A dense download timed whole takes at most about this long at the link's
 * nominal rate; a longer one is timed on the bytes of this many seconds. */
#define BS_DENSE_FULL_S 60.0

typedef struct {
  uint64_t params, steps, seed;
  uint64_t dense_sample; /* --dense-sample: 0 = not given */
  int dense_full;
  double density;
  int json, threads, plain, no_stream, no_index, device, uniform;
  const char *links_spec, *burst, *report;
  bs_link links[8];
  size_t nlinks;
} bs_args;

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

/* The options that take a value; 1 when argv[*i] was one of them (read or
 * refused: *exit_code then set), 0 when it was not. */
static int bs_parse_value(int argc, char **argv, int *i, bs_args *a,
                          int *exit_code) {
  const char *v;
  int r;
  *exit_code = -1;
#define BS_BAD(msg) (fprintf(stderr, "pulse-bench sync: " msg "\n"), *exit_code = 2, 1)
  if ((r = pulse_tk_opt_value(argc, argv, i, "--params", &v)) != 0) {
    if (r < 0 || pulse_tk_parse_u64(v, &a->params) != 0 || a->params < 4096 ||
        a->params > 4000000000ull)
      return BS_BAD("--params needs 4096..4e9");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--density", &v)) != 0) {
    if (r < 0 || pulse_tk_parse_double(v, &a->density) != 0 ||
        !(a->density > 0 && a->density < 0.5))
      return BS_BAD("--density needs 0 < X < 0.5");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--steps", &v)) != 0) {
    if (r < 0 || pulse_tk_parse_u64(v, &a->steps) != 0 || a->steps < 1 ||
        a->steps > 200)
      return BS_BAD("--steps needs 1..200");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--links", &v)) != 0) {
    if (r < 0)
      return bench_sync_usage(stderr), *exit_code = 2, 1;
    a->links_spec = v;
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--burst", &v)) != 0) {
    if (r < 0 || strspn(v, "0123456789kmbKMB") != strlen(v) || v[0] == '\0')
      return BS_BAD("--burst needs a tc size (e.g. 64kb)");
    a->burst = v;
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--dense-sample", &v)) !=
             0) {
    if (r < 0 || pulse_tk_parse_u64(v, &a->dense_sample) != 0 ||
        a->dense_sample < 65536)
      return BS_BAD("--dense-sample needs >= 64k bytes");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--threads", &v)) != 0) {
    if (r < 0 || pulse_tk_parse_int(v, 0, 256, &a->threads) != 0)
      return BS_BAD("--threads needs 0..256");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--seed", &v)) != 0) {
    if (r < 0 || pulse_tk_parse_u64(v, &a->seed) != 0)
      return BS_BAD("--seed needs an integer");
  } else if ((r = pulse_tk_opt_value(argc, argv, i, "--report", &v)) != 0) {
    if (r < 0)
      return bench_sync_usage(stderr), *exit_code = 2, 1;
    a->report = v;
  } else {
    return 0;
  }
#undef BS_BAD
  return 1;
}

/* Reads argv into *a. Returns -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
static int bs_parse_args(int argc, char **argv, bs_args *a) {
  memset(a, 0, sizeof *a);
  a->params = 100000000, a->steps = 3, a->seed = 1, a->density = 0.01;
  a->links_spec = "loopback,100mbit,1gbit", a->burst = "64kb";
  for (int i = 1; i < argc; i++) {
    int code;
    if (pulse_tk_opt_flag(argv[i], "--help")) {
      bench_sync_usage(stdout);
      return 0;
    } else if (bs_parse_value(argc, argv, &i, a, &code)) {
      if (code >= 0)
        return code;
    } else if (pulse_tk_opt_flag(argv[i], "--dense-full")) {
      a->dense_full = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--plain")) {
      a->plain = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--no-stream")) {
      a->no_stream = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--no-index")) {
      a->no_index = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--uniform")) {
      a->uniform = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--device")) {
      a->device = 1;
    } else if (pulse_tk_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else {
      fprintf(stderr, "pulse-bench sync: unknown argument '%s'\n", argv[i]);
      return bench_sync_usage(stderr), 2;
    }
  }
  if (a->dense_full && a->dense_sample)
    return fprintf(stderr, "pulse-bench sync: --dense-full and --dense-sample "
                           "exclude each other\n"),
           2;
  if (parse_links(a->links_spec, a->links, &a->nlinks) != 0)
    return fprintf(stderr, "pulse-bench sync: --links takes loopback and tc "
                           "rates (100mbit)\n"),
           2;
  return -1;
}

/* Bytes of the dense download to time on link l: the whole checkpoint, or
 * a prefix (--dense-sample; or, by default, the bytes of BS_DENSE_FULL_S
 * at the link's rate when the whole would take longer). */
static uint64_t bs_dense_bytes(const bs_args *a, const bs_link *l,
                        uint64_t anchor_size) {
  if (a->dense_full)
    return anchor_size;
  if (a->dense_sample)
    return a->dense_sample < anchor_size ? a->dense_sample : anchor_size;
  if (l->rate[0] == '\0')
    return anchor_size;
  double in_time = rate_bps(l->rate) / 8.0 * BS_DENSE_FULL_S;
  return in_time < (double)anchor_size ? (uint64_t)in_time : anchor_size;
}

/* ------------------------------------------------------------- one run */

typedef struct {
  pulse_server *srv[2];
} bs_servers;

static void bs_on_head(void *ctx, const pulse_pub_figures *f) {
  bs_servers *s = ctx;
  for (int i = 0; i < 2; i++)
    if (s->srv[i] != NULL)
      pulse_server_on_head(s->srv[i], f);
}

/* Everything one run holds, freed by bs_free. */
typedef struct {
  const bs_args *a;
  char tmpl[64], store[4096], cache[4096];
  char *dir;
  bs_model m;
  pulse_pub *pub;
  pulse_pub_tensor *pt;
  bs_servers servers;
  pulse_sub *sub;
  pulse_sub_opts o;
  const char *urls[1];
  char url0[64], url1[128], veth_host[64];
  uint16_t **targets;
  uint16_t **dtargets; /* --device: the targets in GPU memory */
  uint64_t step;       /* the publisher's head */
  char anchor_path[PULSE_STORE_PATH_MAX + 8];
  uint64_t anchor_size;
  int netns_ok, root_ns, cli_ns;
  pulse_report *rep;
  pulse_report_table *rt;
} bs_run;

/* One synced step. */
typedef struct {
  double commit, seconds, transfer, verify, decode, apply, overlap;
  uint64_t bytes, patch_bytes, changed;
} bs_sample;

/* A link's figures: medians over its steps, and the dense download. */
typedef struct {
  double commit, sync, end_to_end, transfer, verify, decode, apply, overlap;
  uint64_t bytes_pulse, patch_bytes, changed, bytes_dense;
  double dense_s;          /* the whole checkpoint (scaled when a prefix) */
  double dense_measured_s; /* the bytes actually timed */
  uint64_t dense_timed_bytes, anchor_size;
  size_t steps;
} bs_figures;

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

/* Medians of the steps; end to end is each step's commit + sync. */
static void bs_figures_of(const bs_sample *s, size_t n, bs_figures *f) {
  double e2e[256];
  for (size_t i = 0; i < n; i++)
    e2e[i] = s[i].commit + s[i].seconds;
  qsort(e2e, n, sizeof e2e[0], cmp_double);
  f->end_to_end = n % 2 ? e2e[n / 2] : 0.5 * (e2e[n / 2 - 1] + e2e[n / 2]);
  f->commit = median_of(s, n, offsetof(bs_sample, commit));
  f->sync = median_of(s, n, offsetof(bs_sample, seconds));
  f->transfer = median_of(s, n, offsetof(bs_sample, transfer));
  f->verify = median_of(s, n, offsetof(bs_sample, verify));
  f->decode = median_of(s, n, offsetof(bs_sample, decode));
  f->apply = median_of(s, n, offsetof(bs_sample, apply));
  f->overlap = median_of(s, n, offsetof(bs_sample, overlap));
  f->bytes_pulse = median_u64(s, n, offsetof(bs_sample, bytes));
  f->patch_bytes = median_u64(s, n, offsetof(bs_sample, patch_bytes));
  f->changed = median_u64(s, n, offsetof(bs_sample, changed));
  f->steps = n;
}

static int bs_fail(const char *what, pulse_status st) {
  return pulse_tk_fail("pulse-bench sync", what, st);
}

/* The trainer side: the servers (loopback; the veth address when there is
 * a namespace), the publisher, and its first commit (an anchor). */
static int bs_trainer(bs_run *r) {
  const bs_args *a = r->a;
  pulse_status st;
  pulse_server_opts so = PULSE_SERVER_OPTS_INIT;
  so.store_dir = r->store;
  so.watch = 0;
  so.threads = 2;
  if (mkdir(r->store, 0755) != 0) {
    fprintf(stderr, "pulse-bench sync: cannot make %s\n", r->store);
    return 1;
  }
  if ((st = pulse_server_create(&so, &r->servers.srv[0])) != PULSE_OK)
    return bs_fail("server", st);
  if (r->netns_ok == 0) {
    snprintf(r->veth_host, sizeof r->veth_host, "%s.1", ns_subnet);
    so.host = r->veth_host;
    if ((st = pulse_server_create(&so, &r->servers.srv[1])) != PULSE_OK)
      return bs_fail("server on the veth", st);
  }
  pulse_pub_opts po = PULSE_PUB_OPTS_INIT;
  po.anchor_every = 0; /* the first state only: every later step is a patch */
  po.keep_patches = 1000;
  po.anchor_sync = 1;
  po.tensors = r->m.info;
  po.tensor_count = r->m.count;
  po.threads = a->threads;
  po.pos_model = a->plain ? PULSE_POS_PLAIN : PULSE_POS_CLASS;
  po.on_head = bs_on_head;
  po.on_head_ctx = &r->servers;
  if ((st = pulse_pub_create(r->store, &po, &r->pub)) != PULSE_OK)
    return bs_fail("publisher", st);
  r->pt = calloc(r->m.count, sizeof *r->pt);
  for (size_t i = 0; r->pt && i < r->m.count; i++) {
    r->pt[i].data = r->m.bits[i];
    r->pt[i].dtype = PULSE_DTYPE_BF16;
    r->pt[i].memory = PULSE_PUB_HOST;
  }
  pulse_pub_figures pf;
  if (r->pt == NULL ||
      (st = pulse_pub_commit(r->pub, r->step, r->pt, r->m.count, &pf)) != PULSE_OK)
    return bs_fail("first commit", r->pt ? st : PULSE_ERR_NOMEM);
  pulse_store_head *head = NULL;
  pulse_store_head_load(r->store, &head);
  const pulse_store_object *anchor =
      head ? pulse_store_head_anchor(head, 0) : NULL;
  r->anchor_size = anchor ? anchor->size : 0;
  snprintf(r->anchor_path, sizeof r->anchor_path, "v1/%s",
           anchor ? anchor->path : "");
  pulse_store_head_free(head);
  snprintf(r->url0, sizeof r->url0, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(r->servers.srv[0]));
  if (r->servers.srv[1] != NULL)
    snprintf(r->url1, sizeof r->url1, "http://%s:%u", r->veth_host,
             (unsigned)pulse_server_port(r->servers.srv[1]));
  return 0;
}

/* The inference side: host targets, first synced over loopback (the
 * anchor); with --device, their state copied into GPU memory. */
static int bs_first_sync(bs_run *r) {
  const bs_args *a = r->a;
  bs_model *m = &r->m;
  pulse_status st;
  r->urls[0] = r->url0;
  pulse_sub_opts o = PULSE_SUB_OPTS_INIT;
  o.urls = r->urls;
  o.url_count = 1;
  o.cache_dir = r->cache;
  o.allow_unsigned = 1; /* the bench publisher does not sign */
  o.use_catchup = 0;
  o.threads = a->threads;
  o.parallel = 4;
  o.no_streaming = a->no_stream;
  o.no_class_index = a->no_index;
  r->o = o;
  r->targets = calloc(m->count, sizeof *r->targets);
  for (size_t i = 0; r->targets && i < m->count; i++)
    r->targets[i] = calloc(m->numel[i], 2);
  st = r->targets ? pulse_sub_create(&r->o, &r->sub) : PULSE_ERR_NOMEM;
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++)
    st = r->targets[i] ? pulse_sub_attach_host(r->sub, m->info[i].name, 2,
                                               m->info[i].shape, r->targets[i])
                       : PULSE_ERR_NOMEM;
  atomic_store(&bs_current, r->sub);
  if (st == PULSE_OK)
    st = pulse_sub_sync(r->sub);
  atomic_store(&bs_current, NULL);
  pulse_sub_free(r->sub);
  r->sub = NULL;
  if (st != PULSE_OK)
    return bs_fail("first sync", st);
  if (!a->device)
    return 0;
  r->dtargets = calloc(m->count, sizeof *r->dtargets);
  st = r->dtargets ? PULSE_OK : PULSE_ERR_NOMEM;
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++) {
    st = pulse_cuda_alloc((void **)&r->dtargets[i], m->numel[i] * 2 + 2);
    if (st == PULSE_OK)
      st = pulse_cuda_upload(r->dtargets[i], r->targets[i], m->numel[i] * 2, NULL);
  }
  if (st == PULSE_OK)
    st = pulse_cuda_sync(NULL);
  return st == PULSE_OK ? 0 : bs_fail("device targets", st);
}

/* The dense figure of a link: the checkpoint (the anchor object) over it,
 * whole or a prefix scaled linearly (bs_dense_bytes). */
static void bs_dense(const bs_run *r, const bs_link *lk, const char *base,
                     bs_figures *f) {
  char durl[256];
  snprintf(durl, sizeof durl, "%s/%s", base, r->anchor_path);
  f->anchor_size = r->anchor_size;
  f->dense_timed_bytes = bs_dense_bytes(r->a, lk, r->anchor_size);
  f->dense_measured_s = bs_dense_get(durl, f->dense_timed_bytes);
  f->dense_s = f->dense_measured_s >= 0
                   ? f->dense_measured_s * (double)r->anchor_size /
                         (double)f->dense_timed_bytes
                   : -1;
}

/* `steps` steps on a link: the model moves, the publisher commits, the
 * subscriber (from the step the targets hold) syncs over `base`. */
static int bs_pulse_steps(bs_run *r, const bs_link *lk, const char *base,
                          bs_sample *s, size_t *ns) {
  const bs_args *a = r->a;
  bs_model *m = &r->m;
  r->urls[0] = base;
  pulse_status st = pulse_sub_create(&r->o, &r->sub);
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++)
    st = a->device ? pulse_sub_attach_device(r->sub, m->info[i].name, 2,
                                             m->info[i].shape, r->dtargets[i])
                   : pulse_sub_attach_host(r->sub, m->info[i].name, 2,
                                           m->info[i].shape, r->targets[i]);
  if (st == PULSE_OK)
    st = pulse_sub_assume_step(r->sub, r->step);
  atomic_store(&bs_current, r->sub);
  if (st == PULSE_OK)
    st = pulse_sub_sync(r->sub); /* checks the claim, warms the connection */
  *ns = 0;
  for (uint64_t k = 0; k < a->steps && st == PULSE_OK && !atomic_load(&bs_stop);
       k++) {
    bs_model_step(m);
    r->step++;
    pulse_pub_figures pf;
    st = pulse_pub_commit(r->pub, r->step, r->pt, m->count, &pf);
    if (st != PULSE_OK)
      break;
    st = pulse_sub_sync(r->sub);
    if (st != PULSE_OK)
      break;
    pulse_sub_figures f;
    pulse_sub_figures_get(r->sub, &f);
    s[*ns] = (bs_sample){pf.total_seconds, f.last_total_s, f.last_transfer_s,
                         f.last_verify_s, f.last_decode_s, f.last_apply_s,
                         f.last_decode_overlap_s, f.last_bytes, pf.patch_bytes,
                         pf.changed};
    (*ns)++;
  }
  atomic_store(&bs_current, NULL);
  pulse_sub_free(r->sub);
  r->sub = NULL;
  return st == PULSE_OK ? 0 : bs_fail(lk->name, st);
}

static double bs_ratio(double baseline, double x) {
  return baseline > 0 && x > 0 ? baseline / x : 0;
}

static void bs_print_json(const bs_run *r, const bs_link *lk,
                          const bs_figures *f) {
  const bs_args *a = r->a;
  int limited = lk->rate[0] != '\0';
  printf("{\"params\":%" PRIu64
         ",\"density\":%.6f,\"link\":\"%s\",\"link_bits_per_s\":%.0f"
         ",\"bytes_dense\":%" PRIu64 ",\"bytes_pulse\":%" PRIu64
         ",\"patch_bytes\":%" PRIu64 ",\"seconds_dense\":%.6f"
         ",\"dense_what\":\"transfer of the whole BF16 checkpoint only\""
         ",\"dense_extrapolated\":%s,\"dense_sample_bytes\":%" PRIu64
         ",\"dense_object_bytes\":%" PRIu64 ",\"seconds_dense_sample\":%.6f"
         ",\"seconds_commit\":%.6f,\"seconds_pulse\":%.6f"
         ",\"seconds_end_to_end\":%.6f"
         ",\"ratio_bytes_vs_dense_bf16\":%.2f"
         ",\"ratio_sync_vs_dense_transfer\":%.2f"
         ",\"ratio_end_to_end_vs_dense_transfer\":%.2f"
         ",\"transfer_s\":%.6f,\"verify_s\":%.6f"
         ",\"decode_s\":%.6f,\"apply_s\":%.6f,\"decode_overlap_s\":%.6f"
         ",\"streamed\":%s,\"steps\":%zu,\"positions\":"
         "\"%s\",\"targets\":\"%s\"}\n",
         r->m.total, (double)f->changed / (double)r->m.total, lk->name,
         limited ? rate_bps(lk->rate) : 0.0, f->bytes_dense, f->bytes_pulse,
         f->patch_bytes, f->dense_s,
         f->dense_timed_bytes < f->anchor_size ? "true" : "false",
         f->dense_timed_bytes, f->anchor_size, f->dense_measured_s, f->commit,
         f->sync, f->end_to_end,
         bs_ratio((double)f->bytes_dense, (double)f->bytes_pulse),
         bs_ratio(f->dense_s, f->sync), bs_ratio(f->dense_s, f->end_to_end),
         f->transfer, f->verify, f->decode, f->apply, f->overlap,
         a->no_stream ? "false" : "true", f->steps, a->plain ? "plain" : "class",
         a->device ? "device" : "host");
}

static void bs_print_head(void) {
  printf("%-10s %12s %11s %8s %10s %9s %9s %10s %8s %8s\n", "link",
         "bytes dense", "bytes pulse", "x fewer", "dense s", "commit s",
         "sync s", "end-end s", "x sync", "x e2e");
}

/* A ratio with the digits that matter: 148x, 12.5x, 0.43x. */
static const char *bs_fmt_ratio(double x, char *buf, size_t size) {
  snprintf(buf, size, x >= 100 ? "%.0fx" : x >= 10 ? "%.1fx" : "%.2fx", x);
  return buf;
}

static void bs_print_row(const bs_link *lk, const bs_figures *f) {
  int prefix = f->dense_timed_bytes < f->anchor_size;
  char r1[32], r2[32], r3[32];
  printf("%-10s %12" PRIu64 " %11" PRIu64 " %8s %9.3f%s %9.4f %9.4f "
         "%10.4f %8s %8s\n",
         lk->name, f->bytes_dense, f->bytes_pulse,
         bs_fmt_ratio(bs_ratio((double)f->bytes_dense, (double)f->bytes_pulse),
                      r1, sizeof r1),
         f->dense_s, prefix ? "*" : " ", f->commit, f->sync, f->end_to_end,
         bs_fmt_ratio(bs_ratio(f->dense_s, f->sync), r2, sizeof r2),
         bs_fmt_ratio(bs_ratio(f->dense_s, f->end_to_end), r3, sizeof r3));
  printf("%-10s   sync split: transfer %.4f / verify %.4f / decode %.4f / "
         "apply %.4f s (+%.4f s decoding hidden behind the transfer)\n",
         "", f->transfer, f->verify, f->decode, f->apply, f->overlap);
  if (prefix)
    printf("%-10s   * dense timed on the first %" PRIu64 " of %" PRIu64
           " bytes (%.3f s) and scaled linearly\n",
           "", f->dense_timed_bytes, f->anchor_size, f->dense_measured_s);
}

/* One link: the dense download, then the steps; the row printed. */
static int bs_link_run(bs_run *r, const bs_link *lk) {
  const bs_args *a = r->a;
  int limited = lk->rate[0] != '\0';
  if (limited && (r->netns_ok != 0 || r->cli_ns < 0))
    return 0;
  if (limited && netns_rate(lk->rate, a->burst) != 0) {
    fprintf(stderr, "pulse-bench sync: tc could not set %s: skipped\n",
            lk->rate);
    return 0;
  }
  if (limited && setns(r->cli_ns, CLONE_NEWNET) != 0) {
    fprintf(stderr, "pulse-bench sync: setns: %s\n", strerror(errno));
    return 1;
  }
  const char *base = limited ? r->url1 : r->url0;
  bs_figures f;
  memset(&f, 0, sizeof f);
  bs_dense(r, lk, base, &f);
  bs_sample s[200];
  size_t ns = 0;
  int rc = bs_pulse_steps(r, lk, base, s, &ns);
  if (limited && r->root_ns >= 0)
    setns(r->root_ns, CLONE_NEWNET);
  if (rc != 0 || ns == 0)
    return rc != 0 ? rc : -1;
  bs_figures_of(s, ns, &f);
  f.bytes_dense = r->m.total * 2;
  if (a->json)
    bs_print_json(r, lk, &f);
  else
    bs_print_row(lk, &f);
  fflush(stdout);
  pulse_report_row(r->rt);
  pulse_report_text(r->rt, lk->name);
  pulse_report_num(r->rt, limited ? rate_bps(lk->rate) : NAN);
  const double cells[] = {(double)f.bytes_dense, (double)f.bytes_pulse,
                          f.dense_s, f.commit, f.sync, f.end_to_end,
                          (double)f.dense_timed_bytes, f.transfer, f.verify,
                          f.decode, f.apply, f.overlap};
  for (size_t k = 0; k < sizeof cells / sizeof cells[0]; k++)
    pulse_report_num(r->rt, cells[k]);
  return 0;
}

/* Opens the report (--report) with its table. */
static int bs_report_open(bs_run *r, int argc, char **argv) {
  if (r->a->report == NULL)
    return 0;
  if (pulse_report_create(r->a->report, "sync", argc, argv, &r->rep) != PULSE_OK)
    return fprintf(stderr, "pulse-bench sync: --report: cannot make %s\n",
                   r->a->report),
           1;
  static const char *const cols[] = {
      "link",          "link_bits_per_s", "bytes_dense",        "bytes_pulse",
      "seconds_dense", "seconds_commit",  "seconds_pulse",      "seconds_end_to_end",
      "dense_timed_bytes", "transfer_s",  "verify_s",           "decode_s",
      "apply_s",       "decode_overlap_s"};
  r->rt = pulse_report_table_add(r->rep, "links", cols, 14);
  return 0;
}

static int bs_report_close(bs_run *r, int rc) {
  if (r->rep == NULL)
    return rc;
  static const char *const secs[] = {"seconds_dense", "seconds_pulse",
                                     "seconds_end_to_end"};
  static const char *const bytes[] = {"bytes_dense", "bytes_pulse"};
  pulse_report_chart_spec c1 = {
      PULSE_REPORT_LINE, "links",
      "Time per step vs link: dense BF16 transfer vs pulse sync and end to end "
      "(commit + sync)",
      "link", "link (loopback, then rate-limited links)", "seconds per step (s)",
      secs, 3, 0, 1};
  pulse_report_chart_spec c2 = {PULSE_REPORT_BAR, "links", "Bytes per step: dense BF16 vs pulse",
                                "link", "link", "bytes per step (B)", bytes, 2, 0, 1};
  pulse_report_chart(r->rep, &c1), pulse_report_chart(r->rep, &c2);
  char why[512];
  if (pulse_report_close(r->rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, "pulse-bench sync: --report: %s\n", why);
    return 1;
  }
  return rc;
}

/* The model, the namespace, both sides and the first sync. */
static int bs_setup(bs_run *r) {
  const bs_args *a = r->a;
  snprintf(r->tmpl, sizeof r->tmpl, "/tmp/pulse-bench-sync-XXXXXX");
  r->dir = mkdtemp(r->tmpl);
  if (r->dir == NULL) {
    fprintf(stderr, "pulse-bench sync: cannot make a folder in /tmp\n");
    return 1;
  }
  snprintf(r->store, sizeof r->store, "%s/store", r->dir);
  snprintf(r->cache, sizeof r->cache, "%s/cache", r->dir);
  double t0 = pulse_tk_now();
  if (bs_model_init(&r->m, a->params, a->seed) != 0)
    return bs_fail("model", PULSE_ERR_NOMEM);
  bs_model_calibrate(&r->m, a->density, a->uniform);
  if (!a->json)
    printf("pulse-bench sync: %" PRIu64
           " parameters in %zu tensors, density %.2f%% (%s), %" PRIu64
           " steps per link, %s positions (model made in %.1f s)\n",
           r->m.total, r->m.count, a->density * 100,
           a->uniform ? "every weight alike" : "by exponent, as under Adam",
           a->steps, a->plain ? "plain" : "class", pulse_tk_since(t0));
  int want_netns = 0;
  for (size_t i = 0; i < a->nlinks; i++)
    want_netns |= a->links[i].rate[0] != '\0';
  if (want_netns)
    r->netns_ok = netns_setup();
  if (want_netns && r->netns_ok != 0) {
    pulse_report_note(r->rep, "rate-limited links skipped (they need root, `ip netns` and tc)");
    if (!a->json)
      printf("pulse-bench sync: rate-limited links skipped (they need root, "
             "`ip netns` and tc)\n");
  }
  int rc = bs_trainer(r);
  t0 = pulse_tk_now();
  if (rc == 0)
    rc = bs_first_sync(r);
  if (rc == 0 && !a->json)
    printf("pulse-bench sync: anchor %" PRIu64
           " bytes published and synced over loopback in %.1f s\n",
           r->anchor_size, pulse_tk_since(t0));
  r->root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (r->netns_ok == 0) {
    char p[128];
    snprintf(p, sizeof p, "/var/run/netns/%s", ns_name);
    r->cli_ns = open(p, O_RDONLY | O_CLOEXEC);
  }
  return rc;
}

static void bs_free(bs_run *r) {
  atomic_store(&bs_current, NULL);
  pulse_sub_free(r->sub);
  if (r->root_ns >= 0)
    close(r->root_ns);
  if (r->cli_ns >= 0)
    close(r->cli_ns);
  pulse_pub_free(r->pub);
  pulse_server_free(r->servers.srv[1]);
  pulse_server_free(r->servers.srv[0]);
  netns_teardown();
  for (size_t i = 0; r->targets && i < r->m.count; i++)
    free(r->targets[i]);
  free(r->targets);
  for (size_t i = 0; r->dtargets && i < r->m.count; i++)
    pulse_cuda_free(r->dtargets[i]);
  free(r->dtargets);
  free(r->pt);
  bs_model_free(&r->m);
  if (r->dir != NULL)
    run("rm -rf '%s'", r->dir);
}

int bench_sync_main(int argc, char **argv) {
  bs_args a;
  int rc = bs_parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (a.device && !pulse_cuda_available()) {
    printf("pulse-bench sync: --device: no CUDA device (%s)\n", pulse_cuda_unavailable_reason());
    return 0;
  }
  if (getenv("PULSE_LOG") == NULL)
    pulse_log_level_set(PULSE_LOG_ERROR);
  static bs_run r; /* static: large, and one per process */
  memset(&r, 0, sizeof r);
  r.a = &a;
  r.netns_ok = r.root_ns = r.cli_ns = -1;
  if (bs_report_open(&r, argc, argv) != 0)
    return 1;

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

  rc = bs_setup(&r);
  if (rc == 0 && !a.json)
    bs_print_head();
  for (size_t l = 0; l < a.nlinks && rc == 0 && !atomic_load(&bs_stop); l++)
    rc = bs_link_run(&r, &a.links[l]);
  if (rc < 0) /* a link stopped before its first step */
    rc = 0;
  if (rc == 0 && !a.json)
    printf("dense s = the whole BF16 checkpoint's transfer over the link "
           "(no verify, no load: a lower bound\n"
           "  of a dense sync); commit s = the publisher's commit; sync s = "
           "the subscriber's head, patch\n"
           "  transfer, verify, decode and apply; end-end s = commit + sync; "
           "x fewer = dense BF16 bytes /\n"
           "  pulse bytes (head included); x sync and x e2e = dense s / sync "
           "s and dense s / end-end s;\n"
           "  medians over the steps; decoding %s\n",
           a.no_stream ? "after each download (--no-stream)"
                       : "runs while the patch downloads (streamed apply)");
  rc = bs_report_close(&r, rc);
  bs_free(&r);
  if (sig_running) {
    pthread_kill(sig_thread, SIGUSR1);
    pthread_join(sig_thread, NULL);
  }
  if (atomic_load(&bs_stop) && rc == 0)
    rc = 1;
  return rc;
}
