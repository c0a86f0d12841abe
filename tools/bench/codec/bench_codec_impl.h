/* bench_codec_impl.h - private to `pulse-bench codec` (bench_codec*.c): the
 * codings measured, the command line, one step's figures, the buffers the
 * steps share and the run's summary; what each part exports. Names start
 * with bench_codec_. */
#ifndef PULSE_BENCH_CODEC_IMPL_H
#define PULSE_BENCH_CODEC_IMPL_H

#include <stdint.h>

#include "bench_impl.h"
#include "cli_report.h"

#define PROG "pulse-bench codec"
#define MAX_REPS 1000
/* The most the memcpy figure writes to before it wraps round. */
#define BENCH_COPY_CAP ((size_t)256 << 20)

/* The codings measured: both position models in versions 2 and 1, and
 * version 3's class positions; the first is the default (bench_codec.c). */
enum { CODINGS = 5 };
typedef struct {
  unsigned version;
  pulse_pos_model model;
  const char *label; /* text tables */
  const char *key;   /* JSON keys and report columns */
} bench_codec_coding;
extern const bench_codec_coding bench_codec_codings[CODINGS];

typedef struct {
  uint64_t params, steps, seed;
  double lr;
  int threads, reps, json;
  int apply_threads;    /* decode + apply threads (a receiver's opts.threads) */
  int synth_opts_given; /* any of --params --steps --lr --seed */
  int commit;           /* --commit: the publisher's commit at scale */
  double density;       /* --commit: fraction of weights moved per step */
  size_t tensors;       /* --commit: tensors of the model */
  char **snapshots;
  int snapshot_count;
  const char *report;      /* --report DIR */
  pulse_report_table *rt;  /* its per-step table, or NULL */
  struct summary *rep_sum; /* the summary so far, for the report */
} codec_args;

/* Everything measured on one step. */
typedef struct {
  uint64_t step, base_step, params, changed;
  uint64_t tensors; /* in the table: the bound allows 96 B of overhead each */
  uint64_t bytes[CODINGS];
  bench_baseline_bytes base;
  bench_entropy_bits ent;
  uint64_t weight_bytes, snapshot_bytes; /* what detection reads */
  double detect_s, memcpy_s, encode_s[CODINGS], apply_s[CODINGS];
  /* Streams alone, no base; 0 when impossible (v1 class). */
  double decode_s[CODINGS];
  /* Class codings applied through a receiver's class index (built before
   * the timing, as a receiver holds it from the previous step; the commit's
   * index upkeep is timed); 0 for plain codings. */
  double apply_indexed_s[CODINGS];
  /* The default coding's applies (plain, through the index) in process CPU
   * time, every thread's: on a shared machine wall-clock figures mostly
   * measure the scheduler, CPU time what the apply costs. */
  double apply_cpu_s, apply_indexed_cpu_s;
  double index_build_s; /* building the indexes of the base, one thread */
  uint64_t index_bytes; /* the indexes' memory */
  double generate_s;    /* synthetic: time of the optimizer step; else 0 */
} step_result;

/* Buffers shared by the steps. */
typedef struct {
  bench_table table;
  uint16_t *old_bf16; /* base state (table.total values) */
  uint16_t *work;     /* apply target */
  uint8_t *copy_dst;  /* memcpy destination, written round (bench_codec_ctx.c) */
  size_t copy_cap;
  pulse_changes *changes;       /* per tensor */
  pulse_tensor_digest *digests; /* per tensor, of old_bf16 */
  pulse_encode_tensor *enc;     /* per tensor */
  pulse_host_tensor *targets;
  pulse_class_index **index; /* per tensor, for indexed applies */
  const void **cur;       /* per tensor: new weights as detection reads them */
  pulse_dtype *cur_dtype; /* per tensor */
} codec_ctx;

/* Sums sizes over steps; throughputs are averaged per step. */
typedef struct summary {
  step_result sum;
  double encode_bps, memcpy_bps, apply_cps[CODINGS], decode_cps[CODINGS];
  double indexed_cps[CODINGS];
  double cpu_cps, indexed_cpu_cps; /* default coding, per CPU second */
  uint64_t within[CODINGS]; /* steps inside the bound's allowance */
  uint64_t steps;
} summary;

/* ----------- helpers (bench_codec_util.c) and buffers (bench_codec_ctx.c) */

/** Prints the failed call to stderr. @return 1. */
int bench_codec_fail_status(const char *what, pulse_status st);

/** Decimal with thousands separators, into buf (32 bytes). @return buf. */
const char *bench_codec_fmt_u64(uint64_t v, char *buf);

/** num / den, 0 when den is not positive. */
double bench_codec_per(double num, double den);

/** Frees what bench_codec_ctx_alloc allocated (also after it failed). */
void bench_codec_ctx_free(codec_ctx *c);

/** Allocates the per-tensor and per-state buffers once c->table is known.
 * @return 0, or 1 when memory ran out (printed). */
int bench_codec_ctx_alloc(codec_ctx *c);

/* ------------------------------------------ one step (bench_codec_step.c) */

/** Measures one step: the base state is c->old_bf16, the new weights are
 * c->cur / c->cur_dtype per tensor, and their BF16 state is new_bf16.
 * @return 0, or 1 on a failure or a patch that does not rebuild new_bf16. */
int bench_codec_measure_step(codec_ctx *c, const codec_args *a,
                             const uint16_t *new_bf16, step_result *r);

/* -------------------------------- one step's output (bench_codec_print.c) */

/** The entropy bound in bytes. */
double bench_codec_bound_bytes(const bench_entropy_bits *e);

/** The size target: within 5% of the bound plus 96 bytes per tensor. */
double bench_codec_allowance_bytes(const step_result *r);

/** The table of sizes (each divided by `divide`) and the baseline named. */
void bench_codec_print_rows(const step_result *r, double divide);

/** The baselines' JSON fields: sizes, or with per_changed their bytes per
 * changed parameter. */
void bench_codec_print_baselines_json(const bench_baseline_bytes *b,
                                      const double *per_changed);

/** One step as text, or as one JSON object. */
void bench_codec_print_step_text(const step_result *r);
void bench_codec_print_step_json(const step_result *r);

/* ------------------------------------ the summary (bench_codec_summary.c) */

/** Adds a step to the summary. */
void bench_codec_summary_add(summary *s, const step_result *r);

/** The summary as text, or as one JSON object. */
void bench_codec_print_summary_text(const summary *s);
void bench_codec_print_summary_json(const summary *s, const char *source,
                                    int apply_threads);

/* --------------------------------------------------------------- the runs */

/** A measured step: into the summary (and --report's table), then printed
 * (bench_codec_report.c). */
void bench_codec_report_step(const codec_args *a, summary *s,
                             const step_result *r);

/** The synthetic trajectory (bench_codec_synthetic.c), the snapshots
 * (bench_codec_snapshots.c), or either with --report (bench_codec_report.c).
 * @return the exit code. */
int bench_codec_run_synthetic(const codec_args *a);
int bench_codec_run_snapshots(const codec_args *a);
int bench_codec_run_with_report(codec_args *a, int argc, char **argv);

/** --commit: the publisher's commit of FP32 master weights and a
 * receiver's apply of its patches (bench_codec_commit.c). */
int bench_codec_run_commit(const codec_args *a);

#endif /* PULSE_BENCH_CODEC_IMPL_H */
