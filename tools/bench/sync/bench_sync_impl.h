/* bench_sync_impl.h - private to `pulse-bench sync` (bench_sync*.c): the
 * synthetic model, the rate-limited link, the command line, one run's state
 * and its figures. Names start with bs_. Nothing here is thread-safe unless
 * said: the bench drives everything from its main thread (the stop-signal
 * thread only reads bs_stop's companions). */
#ifndef PULSE_BENCH_SYNC_IMPL_H
#define PULSE_BENCH_SYNC_IMPL_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_store.h"
#include "pulse_subscriber.h"
#include "cli_report.h"

/* ------------------------------------------------------------------ model */

/* A table of 4096-wide BF16 matrices whose weights move like under Adam
 * (bench_sync_model.c). */
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

/** Makes `params` N(0, 0.02)-like BF16 weights in 4096-wide tensors.
 * @return 0, or -1 when memory ran out (bs_model_free still applies). */
int bs_model_init(bs_model *m, uint64_t params, uint64_t seed);

/** Sets the change probability of each exponent so that a step moves a
 * `density` of the weights (uniform: every weight alike). */
void bs_model_calibrate(bs_model *m, double density, int uniform);

/** One training step: moves weights by 1-3 ulps, O(changes). */
void bs_model_step(bs_model *m);

/** Frees what bs_model_init allocated (also after it failed). */
void bs_model_free(bs_model *m);

/* ------------------------------------------------------------- network */

typedef struct {
  char name[32];
  char rate[32]; /* tc rate, "" for loopback */
} bs_link;

/** Runs a shell command (printf format), its output discarded.
 * @return 0 when it exited 0, else -1. */
int bs_sh(const char *fmt, ...);

/** Makes the client network namespace and the veth pair (needs root, `ip`
 * and `tc`). @return 0, or -1 (nothing left behind). */
int bs_netns_setup(void);

/** Removes the namespace and the veth, if made. Idempotent. */
void bs_netns_teardown(void);

/** Shapes the server's end of the veth: tc tbf at `rate` with bucket `burst`.
 * @return 0 or -1. */
int bs_netns_rate(const char *rate, const char *burst);

/** The namespace's name ("pulse-bench-PID"); "" before bs_netns_setup. */
const char *bs_netns_name(void);

/** The server's address on the veth ("10.213.N.1"). */
const char *bs_netns_server_addr(void);

/** Bits per second of a tc rate ("100mbit", "1gbit"), for the output. */
double bs_rate_bps(const char *rate);

/* ------------------------------------------------------------ arguments */

/* A dense download timed whole takes at most about this long at the link's
 * nominal rate; a longer one is timed on the bytes of this many seconds. */
#define BS_DENSE_FULL_S 60.0

/* Who syncs (--workers), in the order given. */
typedef enum {
  BS_WORKER_HOST,       /* a subscriber in the bench's process, host targets */
  BS_WORKER_LONG_LIVED, /* one `pulse-pull --follow --out` for all steps */
  BS_WORKER_ONE_SHOT,   /* a new `pulse-pull --out` process per step */
  BS_WORKERS
} bs_worker;

/** "host", "long-lived", "one-shot". */
const char *bs_worker_name(bs_worker w);

typedef struct {
  uint64_t params, steps, seed;
  uint64_t dense_sample; /* --dense-sample: 0 = not given */
  int dense_full;
  double density;
  int json, threads, plain, no_stream, device, uniform;
  pulse_sub_class_index index;  /* --index (--no-index: OFF) */
  uint64_t memory_budget;       /* --memory-budget, 0: the library's */
  const char *links_spec, *burst, *report;
  const char *pull; /* --pull: the pulse-pull program, NULL = beside us */
  bs_link links[8];
  size_t nlinks;
  bs_worker workers[BS_WORKERS];
  size_t nworkers;
  int file_workers; /* a long-lived or one-shot worker is among them */
} bs_args;

/** Reads argv into *a. @return -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
int bs_parse_args(int argc, char **argv, bs_args *a);

/** Bytes of the dense download to time on link l: the whole checkpoint, or
 * a prefix (--dense-sample; or, by default, the bytes of BS_DENSE_FULL_S at
 * the link's rate when the whole would take longer). */
uint64_t bs_dense_bytes(const bs_args *a, const bs_link *l,
                        uint64_t anchor_size);

/* ------------------------------------------------------------- one run */

typedef struct {
  pulse_server *srv[2];
} bs_servers;

/* Everything one run holds, freed by bs_free. */
typedef struct {
  const bs_args *a;
  char tmpl[1024], store[4096], cache[4096];
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
  uint16_t **dtargets;    /* --device: the targets in GPU memory */
  uint64_t step;          /* the publisher's head */
  uint64_t host_step;     /* the step the host worker's targets hold */
  double commit_at;       /* pulse_cli_now() when the last commit began */
  _Atomic double head_at; /* when the publisher's head last moved */
  char anchor_path[PULSE_STORE_PATH_MAX + 8];
  uint64_t anchor_size;
  int netns_ok, root_ns, cli_ns;
  pulse_report *rep;
  pulse_report_table *rt;
  /* The file workers (bench_sync_pull.c). */
  char pull_bin[4096], file[4096], pull_cache[4096];
  uint64_t file_step;  /* the step the file holds; UINT64_MAX: not known */
  double first_step_s; /* the long-lived worker's untimed first step */
} bs_run;

/* ------------------------------------------------------------- memory */

/** A field of /proc/PID/status in KiB (VmRSS, VmHWM; pid 0: this
 * process), 0 when it cannot be read. */
uint64_t bs_mem_kib(int pid, const char *field);

/** Sets the peak (VmHWM) of process pid (0: this one) back to its resident
 * memory now. @return 0 or -1. */
int bs_mem_reset_peak(int pid);

/* One synced step. */
typedef struct {
  double commit;      /* the publisher's commit */
  double seconds;     /* the worker's step: total_s (see bs_figures) */
  double seen;        /* the step as seen from outside the worker */
  double end_to_end;  /* from the commit's start to the worker's step done */
  double worker_sync; /* the worker's own figure of its sync */
  double transfer, verify, decode, apply, overlap;
  double write; /* making the file durable; -1: not reported */
  uint64_t bytes, patch_bytes, changed;
  /* The worker's peak resident memory above its targets during the step
   * (see bs_figures.peak_extra); 0: not measured. */
  uint64_t peak_extra;
  int class_index; /* the worker kept class indexes (its choice) */
} bs_sample;

/* A link's figures for one worker: medians over its steps, and the dense
 * download. total (sync): the host worker's sync call, the long-lived
 * worker's own total_s, the one-shot worker's time from its start to its
 * exit. seen: the same for the host and the one-shot worker; for the
 * long-lived one, from the head's move (inside the commit) until its synced
 * event. end_to_end: commit + total for the host and the one-shot worker
 * (they start after the commit); for the long-lived one, from the start of
 * the commit until its synced event (it may start before the commit
 * returns). */
typedef struct {
  bs_worker worker;
  double commit, sync, end_to_end, transfer, verify, decode, apply, overlap;
  double write; /* -1 when a step did not report it */
  double seen, worker_sync;
  uint64_t bytes_pulse, patch_bytes, changed, bytes_dense;
  double dense_s;          /* the whole checkpoint (scaled when a prefix) */
  double dense_measured_s; /* the bytes actually timed */
  uint64_t dense_timed_bytes, anchor_size;
  size_t steps;
  /* The largest over the steps of the worker's peak resident memory above
   * its targets' bytes (host: the rise of this process's VmHWM during each
   * sync over its VmRSS before it, plus the class indexes it held then;
   * long-lived: pulse-pull's VmHWM over its timed steps less the file's
   * tensors, which it holds in memory; one-shot: its VmHWM at its synced event, loading
   * the file included, less the same). 0: not measured. */
  uint64_t peak_extra;
  int class_index; /* the worker's choice at its last step */
} bs_figures;

/* Set by a stop signal (SIGINT, SIGTERM): every loop ends early. */
extern atomic_int bs_stop;
/* The in-process subscriber now syncing, stopped by a stop signal. */
extern pulse_sub *_Atomic bs_current;

/** Prints the failed call to stderr. @return 1. */
int bs_fail(const char *what, pulse_status st);

/** The dense figure of a link: the checkpoint (the anchor object) over
 * `base`, whole or a prefix scaled linearly (bench_sync_dense.c). */
void bs_dense(const bs_run *r, const bs_link *lk, const char *base,
              bs_figures *f);

/** The in-process subscriber with host targets (or --device targets): its
 * first sync over loopback, the anchor (bench_sync_host.c). @return 0 or 1. */
int bs_host_first_sync(bs_run *r);

/** `steps` steps on a link: the model moves, the publisher commits, the
 * in-process subscriber syncs over `base`; one sample per step in s[].
 * @return 0 or 1 (printed). */
int bs_host_steps(bs_run *r, const bs_link *lk, const char *base, bs_sample *s,
                  size_t *ns);

/** Moves the model one step and commits it (r->step then names it).
 * @return the commit's status. */
pulse_status bs_commit_next(bs_run *r, pulse_pub_figures *pf);

/** Finds the pulse-pull program into r->pull_bin: --pull, or the one in
 * this program's folder. @return 0, or 1 when it is not an executable
 * (printed). */
int bs_pull_find(bs_run *r);

/** Makes the workers' file and fills it with the head by one pull over
 * loopback, untimed (after bs_pull_find). @return 0 or 1 (printed). */
int bs_pull_prepare(bs_run *r);

/** The long-lived worker on a link: one `pulse-pull --follow` started in
 * the calling thread's namespace, one untimed step (its total_s in
 * r->first_step_s: a class index it keeps is built after it), then `steps` commits and
 * its synced events; one sample per timed step in s[]. It is stopped before
 * the return.
 * @return 0 or 1 (printed). */
int bs_pull_long_lived_steps(bs_run *r, const bs_link *lk, const char *base,
                             bs_sample *s, size_t *ns);

/** The one-shot worker on a link: per step, a commit and a new `pulse-pull`
 * in the calling thread's namespace, timed from its start to its exit.
 * @return 0 or 1 (printed). */
int bs_pull_one_shot_steps(bs_run *r, const bs_link *lk, const char *base,
                           bs_sample *s, size_t *ns);

/* ------------------------------------------------------------- output */

/** Medians of the n steps in s[] (end to end: each step's commit + sync). */
void bs_figures_of(const bs_sample *s, size_t n, bs_figures *f);

/** The link's figures: a JSON line or table rows, and the report's row. */
void bs_print_link(bs_run *r, const bs_link *lk, const bs_figures *f);

/** The table's header (nothing with --json). */
void bs_print_head(const bs_run *r);

/** The text under the table (nothing with --json). */
void bs_print_legend(const bs_run *r);

/** Opens the report (--report) with its table. @return 0 or 1 (printed). */
int bs_report_open(bs_run *r, int argc, char **argv);

/** Adds the charts and writes the report. @return rc, or 1 when it could
 * not be written. */
int bs_report_close(bs_run *r, int rc);

#endif /* PULSE_BENCH_SYNC_IMPL_H */
