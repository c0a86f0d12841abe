/* bench_demo.c - `pulse-bench demo`, the main job: a trainer publishes a
 * synthetic RL trajectory into a local store served by the built-in HTTP
 * server while inference pullers follow it over loopback; a live table shows
 * what each step cost on the wire against dense BF16, how long the pullers
 * took, and that every puller holds the trainer's weights bit for bit. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_impl.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_subscriber.h"
#include "cli_args.h"
#include "cli_report.h"
#include "sim_synth.h"
#include "cli_time.h"

#define PROG "pulse-bench demo"
#define MAX_PULLERS 16

void bench_demo_usage(FILE *out) {
  fprintf(out, "usage: pulse-bench demo [options]\n"
               "  a trainer publishes a synthetic RL trajectory (local store, built-in HTTP\n"
               "  server on 127.0.0.1) while inference pullers follow it; prints per step the\n"
               "  bytes on the wire against dense BF16, the sync time and a bit-for-bit check\n"
               "  --params N    parameters (default 10M)\n"
               "  --steps S     optimizer steps after the initial state (default 10)\n"
               "  --pullers P   inference pullers (default 2, at most 16)\n"
               "  --lr X        Adam learning rate (default 1e-6: about 1-2%% of BF16\n"
               "                weights change per step, as docs/design.md reports for RL runs)\n"
               "  --seed N      trajectory seed (default 1)\n"
               "  --keep DIR    keep the store and the pullers' caches in DIR\n"
               "  --json        one JSON object per step, then a summary object\n"
               "  --report DIR  also write DIR/steps.csv and DIR/report.html (charts)\n");
}

typedef struct {
  pulse_sub *sub;
  pthread_t thread;
  uint16_t **bufs;
  int started;
} puller;

static void *follow_main(void *arg) {
  puller *p = arg;
  pulse_sub_follow(p->sub);
  return NULL;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(path);
}

static int fail(const char *what, pulse_status st) { return pulse_cli_fail(PROG, what, st); }

typedef struct {
  uint64_t params, steps, seed;
  unsigned pullers;
  double lr;
  const char *keep;
  int json;
  const char *report;
} demo_args;

static int parse(int argc, char **argv, demo_args *a) {
  const char *v;
  for (int i = 1; i < argc; i++) {
    int r;
    uint64_t u;
    if (pulse_cli_opt_flag(argv[i], "--help")) {
      bench_demo_usage(stdout);
      exit(0);
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->params) != 0 || a->params < PULSE_SYNTH_MIN_PARAMS)
        return fprintf(stderr, PROG ": --params needs an integer >= %u\n", PULSE_SYNTH_MIN_PARAMS), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->steps) != 0 || a->steps < 1 || a->steps > 10000)
        return fprintf(stderr, PROG ": --steps needs an integer in 1..10000\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--pullers", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &u) != 0 || u < 1 || u > MAX_PULLERS)
        return fprintf(stderr, PROG ": --pullers needs an integer in 1..%d\n", MAX_PULLERS), -1;
      a->pullers = (unsigned)u;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_double(v, &a->lr) != 0 || !(a->lr > 0))
        return fprintf(stderr, PROG ": --lr needs a positive number\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->seed) != 0)
        return fprintf(stderr, PROG ": --seed needs an integer\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--keep", &v)) != 0) {
      if (r < 0)
        return -1;
      a->keep = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return -1;
      a->report = v;
    } else if (pulse_cli_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else {
      return fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]), -1;
    }
  }
  return 0;
}

/* Waits until every puller holds `step`; the seconds it took, or < 0. */
static double wait_synced(puller *p, unsigned n, uint64_t step, double since, double limit_s) {
  for (;;) {
    unsigned at = 0;
    for (unsigned k = 0; k < n; k++)
      at += pulse_sub_step(p[k].sub) == step;
    if (at == n)
      return pulse_cli_since(since);
    if (pulse_cli_since(since) > limit_s)
      return -1.0;
    usleep(200);
  }
}

/* 1 when every puller's tensors equal the publisher's snapshot bit for bit. */
static int all_identical(puller *p, unsigned n, pulse_pub *pub, const pulse_synth *syn) {
  int same = 1;
  size_t count = pulse_synth_tensor_count(syn);
  for (unsigned k = 0; k < n; k++) {
    uint64_t step;
    pulse_sub_read_lock(p[k].sub, &step);
    for (size_t i = 0; i < count; i++) {
      const pulse_synth_tensor *t = pulse_synth_tensor_get(syn, i);
      same &= memcmp(p[k].bufs[i], pulse_pub_snapshot(pub, i), t->numel * 2) == 0;
      /* The trainer's own BF16 view must be what was published, too. */
      same &= memcmp(pulse_pub_snapshot(pub, i), pulse_synth_bf16(syn) + t->offset, t->numel * 2) == 0;
    }
    pulse_sub_read_unlock(p[k].sub);
  }
  return same;
}

/* Everything one demo run holds, freed by demo_free. */
typedef struct {
  char root[4096], store[4200], url[64];
  pulse_synth *syn;
  pulse_sign_key *key;
  pulse_server *server;
  pulse_pub *pub;
  puller pl[MAX_PULLERS];
  pulse_tensor_info *infos;
  pulse_pub_tensor *pt;
  size_t count;
  uint64_t params;
  pulse_report *rep;
  pulse_report_table *rt;
} demo_run;

/* Sums over the steps after the first (the join). */
typedef struct {
  uint64_t wire, dense, prev_dl[MAX_PULLERS];
  double sync;
  int every_identical;
} demo_totals;

/* The trainer side: trajectory, signing key, server, publisher. */
static int demo_trainer(demo_run *d, const demo_args *a) {
  pulse_status st;
  pulse_synth_opts so;
  pulse_synth_opts_init(&so);
  so.params = a->params;
  so.lr = a->lr;
  so.seed = a->seed;
  if ((st = pulse_synth_create(&so, &d->syn)) != PULSE_OK)
    return fail("trajectory", st);
  d->count = pulse_synth_tensor_count(d->syn);
  d->params = pulse_synth_param_count(d->syn);
  d->infos = calloc(d->count, sizeof *d->infos);
  d->pt = calloc(d->count, sizeof *d->pt);
  if (d->infos == NULL || d->pt == NULL)
    return fail("memory", PULSE_ERR_NOMEM);
  for (size_t i = 0; i < d->count; i++)
    d->infos[i] = pulse_synth_tensor_get(d->syn, i)->info;
  if ((st = pulse_sign_key_generate(&d->key)) != PULSE_OK)
    return fail("signing key", st);
  pulse_server_opts sv;
  pulse_server_opts_init(&sv);
  sv.store_dir = d->store;
  sv.key = d->key;
  if ((st = pulse_server_create(&sv, &d->server)) != PULSE_OK)
    return fail("server", st);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.key = d->key;
  po.tensors = d->infos;
  po.tensor_count = d->count;
  po.anchor_sync = 1;
  po.on_head = pulse_server_on_head;
  po.on_head_ctx = d->server;
  if ((st = pulse_pub_create(d->store, &po, &d->pub)) != PULSE_OK)
    return fail("publisher", st);
  snprintf(d->url, sizeof d->url, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(d->server));
  return 0;
}

/* Puller k: a subscriber with host targets, following in its own thread. */
static int demo_puller(demo_run *d, unsigned k) {
  pulse_status st;
  puller *p = &d->pl[k];
  char cache[4300];
  snprintf(cache, sizeof cache, "%s/puller%u", d->root, k);
  const char *urls[1] = {d->url};
  uint8_t public_key[PULSE_KEY_BYTES];
  pulse_sign_key_public(d->key, public_key);
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.public_key = public_key;
  o.threads = 1;
  o.poll_timeout_ms = 2000;
  if ((st = pulse_sub_create(&o, &p->sub)) != PULSE_OK)
    return fail("puller", st);
  p->bufs = calloc(d->count, sizeof *p->bufs);
  if (p->bufs == NULL)
    return fail("memory", PULSE_ERR_NOMEM);
  for (size_t i = 0; i < d->count; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(d->syn, i);
    p->bufs[i] = calloc(t->numel ? t->numel : 1, 2);
    if (p->bufs[i] == NULL)
      return fail("memory", PULSE_ERR_NOMEM);
    if ((st = pulse_sub_attach_host(p->sub, t->info.name, t->info.ndim, t->info.shape,
                                    p->bufs[i])) != PULSE_OK)
      return fail("puller target", st);
  }
  if (pthread_create(&p->thread, NULL, follow_main, p) != 0) {
    fprintf(stderr, PROG ": cannot start a puller thread\n");
    return 1;
  }
  p->started = 1;
  return 0;
}

static void demo_row(const demo_run *d, const demo_args *a, uint64_t step,
                     const pulse_pub_figures *fig, uint64_t wire, double sync, int same) {
  uint64_t dense = d->params * 2;
  double reduction = wire ? (double)dense / (double)wire : 0.0;
  if (a->json)
    printf("{\"step\":%" PRIu64 ",\"params\":%" PRIu64 ",\"changed\":%" PRIu64
           ",\"patch_bytes\":%" PRIu64 ",\"bytes_per_puller\":%" PRIu64
           ",\"bytes_dense\":%" PRIu64 ",\"reduction\":%.2f,\"sync_seconds\":%.6f"
           ",\"commit_seconds\":%.6f,\"identical\":%s}\n",
           step, d->params, fig->changed, fig->patch_bytes, wire, dense, reduction, sync,
           fig->total_seconds, same ? "true" : "false");
  else if (step == 0)
    printf("%5" PRIu64 " %10s %8s %14" PRIu64 " %14" PRIu64 " %10s %9.1f %10s   (join: anchor)\n",
           step, "-", "-", wire, dense, "1x", sync * 1e3, same ? "yes" : "NO");
  else
    printf("%5" PRIu64 " %10" PRIu64 " %7.3f%% %14" PRIu64 " %14" PRIu64 " %9.1fx %9.1f %10s\n",
           step, fig->changed, 100.0 * (double)fig->changed / (double)d->params, wire, dense,
           reduction, sync * 1e3, same ? "yes" : "NO");
  fflush(stdout);
  pulse_report_row(d->rt);
  pulse_report_num(d->rt, (double)step);
  pulse_report_num(d->rt, step ? (double)fig->changed : NAN);
  pulse_report_num(d->rt, step ? 100.0 * (double)fig->changed / (double)d->params : NAN);
  pulse_report_num(d->rt, (double)wire);
  pulse_report_num(d->rt, (double)dense);
  pulse_report_num(d->rt, reduction);
  pulse_report_num(d->rt, sync * 1e3);
}

/* One step: the trainer moves and commits, every puller catches up, and
 * the row is printed. Returns 0 or 1 (said on stderr). */
static int demo_step(demo_run *d, const demo_args *a, uint64_t step, demo_totals *tot) {
  pulse_status st;
  if (step > 0 && (st = pulse_synth_step(d->syn)) != PULSE_OK)
    return fail("trajectory step", st);
  const float *master = pulse_synth_master(d->syn);
  for (size_t i = 0; i < d->count; i++)
    d->pt[i] = (pulse_pub_tensor){master + pulse_synth_tensor_get(d->syn, i)->offset,
                                  PULSE_DTYPE_F32, PULSE_PUB_HOST};
  pulse_pub_figures fig;
  if ((st = pulse_pub_commit(d->pub, step, d->pt, d->count, &fig)) != PULSE_OK)
    return fail("commit", st);
  double since = pulse_cli_now();
  double sync = wait_synced(d->pl, a->pullers, step, since, 120.0);
  if (sync < 0) {
    fprintf(stderr, PROG ": step %" PRIu64 ": the pullers did not reach it within 120 s", step);
    for (unsigned k = 0; k < a->pullers; k++)
      fprintf(stderr, "%s puller %u at %" PRIu64 " (%s)", k ? "," : ":", k,
              pulse_sub_step(d->pl[k].sub), pulse_sub_error(d->pl[k].sub));
    fprintf(stderr, "\n");
    return 1;
  }
  int same = all_identical(d->pl, a->pullers, d->pub, d->syn);
  tot->every_identical &= same;
  /* Bytes each puller received for this step (response bodies: head,
   * patch, or the anchor for the first state), averaged. */
  uint64_t wire = 0;
  for (unsigned k = 0; k < a->pullers; k++) {
    pulse_sub_figures f;
    pulse_sub_figures_get(d->pl[k].sub, &f);
    wire += f.bytes_downloaded - tot->prev_dl[k];
    tot->prev_dl[k] = f.bytes_downloaded;
  }
  wire /= a->pullers;
  if (step > 0) {
    tot->wire += wire;
    tot->dense += d->params * 2;
    tot->sync += sync;
  }
  demo_row(d, a, step, &fig, wire, sync, same);
  return 0;
}

static void demo_summary(const demo_run *d, const demo_args *a, const demo_totals *tot) {
  double total_reduction = tot->wire ? (double)tot->dense / (double)tot->wire : 0.0;
  if (a->json)
    printf("{\"summary\":true,\"params\":%" PRIu64 ",\"steps\":%" PRIu64 ",\"pullers\":%u"
           ",\"bytes_dense\":%" PRIu64 ",\"bytes_pulse\":%" PRIu64 ",\"reduction\":%.2f"
           ",\"mean_sync_seconds\":%.6f,\"identical\":%s}\n",
           d->params, a->steps, a->pullers, tot->dense, tot->wire, total_reduction,
           tot->sync / (double)a->steps, tot->every_identical ? "true" : "false");
  else
    printf("\nsummary: %" PRIu64 " steps, %u puller(s): %" PRIu64 " bytes per puller instead of %" PRIu64
           " dense BF16: %.1fx less on the wire; mean sync %.1f ms; every puller bit-identical "
           "to the trainer: %s\n",
           a->steps, a->pullers, tot->wire, tot->dense, total_reduction,
           1e3 * tot->sync / (double)a->steps, tot->every_identical ? "yes" : "NO");
  if (d->rep != NULL) {
    static const char *const density[] = {"density_pct"};
    static const char *const bytes[] = {"pulse_bytes_per_puller", "dense_bf16_bytes"};
    static const char *const sync_y[] = {"sync_ms"};
    pulse_report_chart_spec c1 = {PULSE_REPORT_LINE, "steps", "Density: share of weights changed per step",
                                  "step", "optimizer step", "changed weights (% of parameters)",
                                  density, 1, 0, 0};
    pulse_report_chart_spec c2 = {PULSE_REPORT_LINE, "steps",
                                  "Bytes per step: pulse vs dense BF16 (step 0 = anchor)", "step",
                                  "optimizer step", "bytes per puller (B)", bytes, 2, 0, 1};
    pulse_report_chart_spec c3 = {PULSE_REPORT_LINE, "steps", "Sync time per step (all pullers)",
                                  "step", "optimizer step", "sync time (ms)", sync_y, 1, 0, 0};
    pulse_report_chart(d->rep, &c1), pulse_report_chart(d->rep, &c2), pulse_report_chart(d->rep, &c3);
  }
}

/* Stops the pullers and frees everything; returns rc, or 1 when the report
 * could not be written. */
static int demo_free(demo_run *d, const demo_args *a, int rc) {
  if (d->rep != NULL) {
    char why[512];
    if (pulse_report_close(d->rep, why, sizeof why) != PULSE_OK) {
      fprintf(stderr, PROG ": --report: %s\n", why);
      rc = 1;
    }
  }
  for (unsigned k = 0; k < MAX_PULLERS; k++) {
    puller *p = &d->pl[k];
    if (p->started) {
      pulse_sub_stop(p->sub);
      pthread_join(p->thread, NULL);
    }
    pulse_sub_free(p->sub);
    for (size_t i = 0; p->bufs && i < d->count; i++)
      free(p->bufs[i]);
    free(p->bufs);
  }
  pulse_pub_free(d->pub);
  pulse_server_free(d->server);
  pulse_sign_key_free(d->key);
  pulse_synth_free(d->syn);
  free(d->infos), free(d->pt);
  if (a->keep == NULL)
    nftw(d->root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}

int bench_demo_main(int argc, char **argv) {
  demo_args a = {10000000, 10, 1, 2, 1e-6, NULL, 0, NULL};
  if (parse(argc, argv, &a) != 0)
    return bench_demo_usage(stderr), 2;
  static demo_run d; /* static: large, and one per process */
  memset(&d, 0, sizeof d);
  if (a.report != NULL) {
    if (pulse_report_create(a.report, "demo", argc, argv, &d.rep) != PULSE_OK)
      return fprintf(stderr, PROG ": --report: cannot make %s\n", a.report), 1;
    static const char *const cols[] = {"step", "changed", "density_pct", "pulse_bytes_per_puller",
                                       "dense_bf16_bytes", "reduction_x", "sync_ms"};
    d.rt = pulse_report_table_add(d.rep, "steps", cols, 7);
  }
  if (a.keep != NULL) {
    snprintf(d.root, sizeof d.root, "%s", a.keep);
    mkdir(d.root, 0755);
  } else {
    snprintf(d.root, sizeof d.root, "/tmp/pulse-demo-XXXXXX");
    if (mkdtemp(d.root) == NULL)
      return fprintf(stderr, PROG ": cannot make a temporary folder\n"), 1;
  }
  snprintf(d.store, sizeof d.store, "%s/store", d.root);
  mkdir(d.store, 0755);

  int rc = demo_trainer(&d, &a);
  for (unsigned k = 0; rc == 0 && k < a.pullers; k++)
    rc = demo_puller(&d, k);
  if (rc != 0)
    return demo_free(&d, &a, 1);
  if (!a.json)
    printf("pulse demo: trainer -> store %s -> %s -> %u puller(s); %" PRIu64
           " parameters in %zu tensors, Adam lr %g\n\n"
           "%5s %10s %8s %14s %14s %10s %9s %10s\n",
           d.store, d.url, a.pullers, d.params, d.count, a.lr, "step", "changed", "density",
           "bytes/puller", "dense BF16", "reduction", "sync ms", "identical");
  demo_totals tot;
  memset(&tot, 0, sizeof tot);
  tot.every_identical = 1;
  for (uint64_t step = 0; step <= a.steps && rc == 0; step++)
    rc = demo_step(&d, &a, step, &tot);
  if (rc != 0)
    return demo_free(&d, &a, 1);
  demo_summary(&d, &a, &tot);
  return demo_free(&d, &a, tot.every_identical ? 0 : 1);
}
