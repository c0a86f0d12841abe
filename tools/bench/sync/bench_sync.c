/* bench_sync.c - `pulse-bench sync`: per-step sync time and bytes on the
 * wire, dense BF16 checkpoint vs pulse, over loopback and over rate-limited
 * links, for the workers a user runs.
 *
 * In this process: a publisher and the HTTP server (trainer side). The
 * model is a table of 4096-wide BF16 matrices (bench_sync_model.c); each
 * step moves a `density` of its weights by 1-3 BF16 ulps, each weight with
 * a probability that falls with its exponent as under Adam (--uniform:
 * every weight alike, which gives the class model nothing to use). On each
 * link, each worker (--workers) runs `steps` steps: the publisher commits,
 * the worker syncs (head, patch, verify, decode, apply, and for the file
 * workers the durable write; its own split of the time). The workers: host,
 * a subscriber in this process with host targets (bench_sync_host.c);
 * long-lived, one `pulse-pull --follow --out FILE` for all the steps of a
 * link; one-shot, a new `pulse-pull --out FILE` per step, timed from outside
 * (bench_sync_pull.c). Reported per link and worker: the publisher's commit,
 * the worker's split and total, the local part (total - transfer), end to
 * end, and the dense figure: the download of the whole BF16 checkpoint (the
 * anchor) over the same link, transfer only (no verify, no load;
 * bench_sync_dense.c). The dense download is timed whole unless the link would
 * take over BS_DENSE_FULL_S at its nominal rate (or --dense-sample asks for a
 * prefix); then a prefix is timed and scaled linearly, and the table and
 * the JSON say so and from how many bytes (--dense-full: always whole).
 *
 * Rate-limited links (root and `ip` needed, else skipped with a note): a
 * veth pair between the root network namespace (server side) and a new one
 * (client side), with `tc qdisc ... tbf rate R burst 256kb latency 50ms` on
 * the server's end (--burst); the syncing thread joins the client namespace
 * with setns(2), and the pulse-pull workers it starts run there
 * (bench_sync_netns.c). The namespace and the veth are removed on every exit
 * path (SIGINT and SIGTERM included). The bucket is 64 KB by default, not the
 * 256 KB often written: a bucket refilled between steps would carry a
 * whole small patch at memory speed and flatter the pulse figure. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_impl.h"
#include "bench_sync_impl.h"
#include "pulse_cuda.h"
#include "pulse_log.h"
#include "cli_args.h"
#include "cli_time.h"

/* ---------------------------------------------------------- stop signals */

atomic_int bs_stop;
pulse_sub *_Atomic bs_current;

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

int bs_fail(const char *what, pulse_status st) {
  return pulse_cli_fail("pulse-bench sync", what, st);
}

/* The publisher moved its head (inside pulse_pub_commit): the servers wake
 * their long-polls, and the time is kept (a long-lived worker may start
 * syncing before the commit returns). */
static void bs_on_head(void *ctx, const pulse_pub_figures *f) {
  bs_run *r = ctx;
  atomic_store(&r->head_at, pulse_cli_now());
  for (int i = 0; i < 2; i++)
    if (r->servers.srv[i] != NULL)
      pulse_server_on_head(r->servers.srv[i], f);
}

/* The trainer side: the servers (loopback; the veth address when there is
 * a namespace), the publisher, and its first commit (an anchor). */
static int bs_trainer(bs_run *r) {
  const bs_args *a = r->a;
  pulse_status st;
  pulse_server_opts so;
  pulse_server_opts_init(&so);
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
    snprintf(r->veth_host, sizeof r->veth_host, "%s", bs_netns_server_addr());
    so.host = r->veth_host;
    if ((st = pulse_server_create(&so, &r->servers.srv[1])) != PULSE_OK)
      return bs_fail("server on the veth", st);
  }
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.anchor_every = 0; /* the first state only: every later step is a patch */
  po.keep_patches = 1000;
  po.anchor_sync = 1;
  po.tensors = r->m.info;
  po.tensor_count = r->m.count;
  po.threads = a->threads;
  po.pos_model = a->plain ? PULSE_POS_PLAIN : PULSE_POS_CLASS;
  po.on_head = bs_on_head;
  po.on_head_ctx = r;
  if ((st = pulse_pub_create(r->store, &po, &r->pub)) != PULSE_OK)
    return bs_fail("publisher", st);
  r->pt = calloc(r->m.count, sizeof *r->pt);
  for (size_t i = 0; r->pt && i < r->m.count; i++) {
    r->pt[i].data = r->m.bits[i];
    r->pt[i].dtype = PULSE_DTYPE_BF16;
    r->pt[i].memory = PULSE_PUB_HOST;
  }
  pulse_pub_figures pf;
  if (r->pt == NULL || (st = pulse_pub_commit(r->pub, r->step, r->pt,
                                              r->m.count, &pf)) != PULSE_OK)
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

pulse_status bs_commit_next(bs_run *r, pulse_pub_figures *pf) {
  bs_model_step(&r->m);
  r->step++;
  r->commit_at = pulse_cli_now();
  return pulse_pub_commit(r->pub, r->step, r->pt, r->m.count, pf);
}

/* One worker's steps on a link, in the calling thread's namespace. */
static int bs_worker_steps(bs_run *r, bs_worker w, const bs_link *lk,
                           const char *base, bs_sample *s, size_t *ns) {
  switch (w) {
  case BS_WORKER_HOST:
    return bs_host_steps(r, lk, base, s, ns);
  case BS_WORKER_LONG_LIVED:
    return bs_pull_long_lived_steps(r, lk, base, s, ns);
  case BS_WORKER_ONE_SHOT:
    return bs_pull_one_shot_steps(r, lk, base, s, ns);
  default:
    return 1;
  }
}

/* One link: the dense download, then each worker's steps; a row each. The
 * syncing thread (this one) joins the client namespace for a rate-limited
 * link, and the pulse-pull workers it starts run there. */
static int bs_link_run(bs_run *r, const bs_link *lk) {
  const bs_args *a = r->a;
  int limited = lk->rate[0] != '\0';
  if (limited && (r->netns_ok != 0 || r->cli_ns < 0))
    return 0;
  if (limited && bs_netns_rate(lk->rate, a->burst) != 0) {
    fprintf(stderr, "pulse-bench sync: tc could not set %s: skipped\n",
            lk->rate);
    return 0;
  }
  if (limited && setns(r->cli_ns, CLONE_NEWNET) != 0) {
    fprintf(stderr, "pulse-bench sync: setns: %s\n", strerror(errno));
    return 1;
  }
  const char *base = limited ? r->url1 : r->url0;
  bs_figures dense;
  memset(&dense, 0, sizeof dense);
  bs_dense(r, lk, base, &dense);
  int rc = 0;
  for (size_t k = 0; k < a->nworkers && rc == 0 && !atomic_load(&bs_stop);
       k++) {
    static bs_sample s[200];
    size_t ns = 0;
    rc = bs_worker_steps(r, a->workers[k], lk, base, s, &ns);
    if (rc == 0 && ns == 0)
      rc = -1; /* stopped before its first step */
    if (rc != 0)
      break;
    bs_figures f = dense;
    bs_figures_of(s, ns, &f);
    f.worker = a->workers[k];
    f.bytes_dense = r->m.total * 2;
    bs_print_link(r, lk, &f);
  }
  if (limited && r->root_ns >= 0)
    setns(r->root_ns, CLONE_NEWNET);
  return rc;
}

/* The model, the namespace, both sides and the first sync. */
static int bs_setup(bs_run *r) {
  const bs_args *a = r->a;
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || tmp[0] == '\0')
    tmp = "/tmp";
  if (strchr(tmp, '\'') != NULL ||
      (size_t)snprintf(r->tmpl, sizeof r->tmpl, "%s/pulse-bench-sync-XXXXXX",
                       tmp) >= sizeof r->tmpl) {
    fprintf(stderr, "pulse-bench sync: TMPDIR is too long or holds a quote\n");
    return 1;
  }
  r->dir = mkdtemp(r->tmpl);
  if (r->dir == NULL) {
    fprintf(stderr, "pulse-bench sync: cannot make a folder in %s\n", tmp);
    return 1;
  }
  snprintf(r->store, sizeof r->store, "%s/store", r->dir);
  snprintf(r->cache, sizeof r->cache, "%s/cache", r->dir);
  double t0 = pulse_cli_now();
  if (bs_model_init(&r->m, a->params, a->seed) != 0)
    return bs_fail("model", PULSE_ERR_NOMEM);
  bs_model_calibrate(&r->m, a->density, a->uniform);
  if (atomic_load(&bs_stop))
    return 1; /* a stop signal while the model was made (seconds at 1e9) */
  if (!a->json)
    printf("pulse-bench sync: %" PRIu64
           " parameters in %zu tensors, density %.2f%% (%s), %" PRIu64
           " steps per link, %s positions (model made in %.1f s)\n",
           r->m.total, r->m.count, a->density * 100,
           a->uniform ? "every weight alike" : "by exponent, as under Adam",
           a->steps, a->plain ? "plain" : "class", pulse_cli_since(t0));
  int want_netns = 0;
  for (size_t i = 0; i < a->nlinks; i++)
    want_netns |= a->links[i].rate[0] != '\0';
  if (want_netns)
    r->netns_ok = bs_netns_setup();
  if (want_netns && r->netns_ok != 0) {
    pulse_report_note(
        r->rep,
        "rate-limited links skipped (they need root, `ip netns` and tc)");
    if (!a->json)
      printf("pulse-bench sync: rate-limited links skipped (they need root, "
             "`ip netns` and tc)\n");
  }
  int rc = bs_trainer(r), host = 0;
  if (rc == 0 && atomic_load(&bs_stop))
    rc = 1;
  for (size_t k = 0; k < a->nworkers; k++)
    host |= a->workers[k] == BS_WORKER_HOST;
  t0 = pulse_cli_now();
  if (rc == 0 && host)
    rc = bs_host_first_sync(r);
  if (rc == 0 && a->file_workers)
    rc = bs_pull_prepare(r);
  if (rc == 0 && !a->json)
    printf("pulse-bench sync: anchor %" PRIu64
           " bytes published and synced over loopback in %.1f s (%s)\n",
           r->anchor_size, pulse_cli_since(t0),
           host && a->file_workers ? "host targets and the workers' file"
           : host                  ? "host targets"
                                   : "the workers' file");
  r->root_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (r->netns_ok == 0) {
    char p[128];
    snprintf(p, sizeof p, "/var/run/netns/%s", bs_netns_name());
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
  bs_netns_teardown();
  for (size_t i = 0; r->targets && i < r->m.count; i++)
    free(r->targets[i]);
  free(r->targets);
  for (size_t i = 0; r->dtargets && i < r->m.count; i++)
    pulse_cuda_free(r->dtargets[i]);
  free(r->dtargets);
  free(r->pt);
  bs_model_free(&r->m);
  if (r->dir != NULL)
    bs_sh("rm -rf '%s'", r->dir);
}

int bench_sync_main(int argc, char **argv) {
  bs_args a;
  int rc = bs_parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;
  if (a.device && !pulse_cuda_available()) {
    printf("pulse-bench sync: --device: no CUDA device (%s)\n",
           pulse_cuda_unavailable_reason());
    return 0;
  }
  if (getenv("PULSE_LOG") == NULL)
    pulse_log_level_set(PULSE_LOG_ERROR);
  static bs_run r; /* static: large, and one per process */
  memset(&r, 0, sizeof r);
  r.a = &a;
  r.netns_ok = r.root_ns = r.cli_ns = -1;
  if (a.file_workers && bs_pull_find(&r) != 0)
    return 1;
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
  if (rc == 0)
    bs_print_head(&r);
  for (size_t l = 0; l < a.nlinks && rc == 0 && !atomic_load(&bs_stop); l++)
    rc = bs_link_run(&r, &a.links[l]);
  if (rc < 0) /* a link stopped before its first step */
    rc = 0;
  if (rc == 0)
    bs_print_legend(&r);
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
