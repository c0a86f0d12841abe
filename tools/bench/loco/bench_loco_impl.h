/* bench_loco_impl.h - private to `pulse-bench loco` in its fixed-membership
 * run (bench_loco*.c but bench_loco_collab*.c, which has its own
 * bench_loco_collab_impl.h): the methods, the command line, the children
 * and their protocol's rows, the run's totals, and what each part exports.
 * Names start with bench_loco_. */
#ifndef PULSE_BENCH_LOCO_IMPL_H
#define PULSE_BENCH_LOCO_IMPL_H

#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "bench_loco_drift.h"
#include "bench_netns.h"
#include "pulse_loco.h"
#include "pulse_loco_coord.h"
#include "sim_problem.h"
#include "sim_trainers.h"

#define PROG "pulse-bench loco"
#define MAX_TRAINERS 64
#define LINE_MAX_ 8192

/* The methods, in the order of every table: three baselines, each in its
 * own process (kids[0..BASELINES)), then PULSELoCo. */
enum { DDP_FP32, DILOCO_BF16, DILOCO_FP32, PULSELOCO, METHODS };
#define BASELINES PULSELOCO
/* kids[BASELINES] is the in-process PULSELoCo replay; trainers follow. */
#define FIRST_TRAINER (BASELINES + 1)
#define REFERENCE DILOCO_BF16 /* the baseline the targets are about */

/* A method's names and how the simulation runs it (bench_loco.c). */
typedef struct {
  const char *key;  /* in --json keys and the child protocol */
  const char *name; /* in the text and --report */
  pulse_sim_method method;
  pulse_sim_dense_values values;
} bench_loco_method_info;
extern const bench_loco_method_info bench_loco_method[METHODS];

typedef struct {
  uint32_t trainers, rounds, inner, deadline_ms;
  uint64_t params, seed;
  double drop_rate, lr;
  pulse_loco_rule rule;
  int join_round;  /* an extra trainer joins once this many rounds are done; -1
                      none */
  int leave_round; /* the last founder leaves in this round; -1 none */
  int json;
  int only_pulseloco; /* --only-pulseloco: no baselines */
  const char *report; /* --report DIR */
  uint32_t transport; /* PULSE_LOCO_TRANSPORT_* */
  double drop;        /* --drop: each datagram lost (UDP) */
  uint32_t resync_period;
  double drift_budget;
  /* --netns NAME=ADDR,...: trainer i runs in network namespace
   * netns[i % nnetns] (/run/netns/NAME) and listens on its address. */
  pulse_sim_netns netns[8];
  uint32_t nnetns;
  uint32_t problem;      /* PULSE_SIM_PROBLEM_TEXT (default) or _TEACHER */
  const char *text_path; /* --text FILE; NULL: base-files' licences */
  /* --compute: PULSE_SIM_COMPUTE_*; -1 until parsed, then the problem's
   * default (bench_loco_default_compute) when not given. */
  int compute;
  uint32_t parametrization; /* --param: PULSE_SIM_PARAM_* */
  /* Authentication (issue 15): every trainer signs with its key (made for
   * the run, before the trainers fork) and pins every trainer's; --no-auth
   * turns it off to compare. */
  int no_auth;
  pulse_sign_key *keys[MAX_TRAINERS];
  pulse_loco_member_key pins[MAX_TRAINERS];
  uint32_t npins;
} loco_args;

typedef struct {
  pid_t pid;
  int to;   /* parent writes */
  int from; /* parent reads */
  char buf[LINE_MAX_];
  size_t len;
  int open;
  uint32_t id; /* trainers */
  char url[64];
  int baseline; /* method + 1 of a baseline process; 0: a trainer */
  int replay;   /* the in-process PULSELoCo replay */
  int founder, told, done, quit;
  uint64_t final_round, digest;
} child;

/* One round of every method. PULSELoCo: bytes = its payloads, wire = the
 * bodies its trainers downloaded, message = the largest payload. */
typedef struct {
  double loss[METHODS];
  double reward[METHODS]; /* text RL: held-out expected reward */
  uint64_t bytes[METHODS], wire[METHODS];
  uint64_t max_trainer[METHODS], message[METHODS];
  int have[METHODS];
  uint64_t sent; /* PULSELoCo entries */
  double bias;   /* PULSELoCo update_bias, from the replay */
  int have_bias;
  uint32_t contributors, members, reports;
  /* PULSELoCo exchange: trainer 0's round and exchange wall time, the
   * max drift over trainers against the reference, and sums over them. */
  uint64_t round_ms, exchange_ms;
  double drift, replay_drift;
  uint64_t drift_ranges, resynced_ranges, resync_bytes;
  uint64_t dgram_sent, dgram_dropped, chunks_accepted, chunks_refused;
  /* Drift over all trainer pairs after the round (bench_loco_drift.h):
   * the trainers that wrote it, and the figure once measured. */
  uint64_t wrote_mask;
  int pair_tried, pair_measured;
  double pair_drift;
} round_row;

typedef struct {
  loco_args a;
  child kids[MAX_TRAINERS + FIRST_TRAINER];
  size_t nkids;
  round_row *rows; /* rows[0..rounds] */
  double init_loss, floor;
  double init_reward; /* text RL: the checkpoint's held-out reward */
  uint64_t P;
  uint32_t pacer_rounds;
  int failed;
  uint64_t auth_accepted, auth_refused; /* over every trainer and round */
  uint64_t auth_bytes; /* received only because of authentication, all */
  uint64_t text_bytes, text_digest;     /* the text problem's data */
  double pretrain_loss;                 /* text-sft: the checkpoint's */
  uint32_t pretrain_steps;              /* (0: no pretraining) */
  double lr;                            /* the inner rate the run used */
  bench_pair_drift pd;                  /* drift over all trainer pairs */
} bench;

/* The whole run, per method. */
typedef struct {
  uint64_t bytes[METHODS], wire[METHODS], message[METHODS];
  double final_loss[METHODS];
  /* Text RL: each method's held-out reward, mean over the last rounds
   * (reward_rounds of them), and PULSELoCo's against it. */
  double last_reward[METHODS], reward_gap[METHODS];
  uint32_t reward_rounds;
  double density[METHODS]; /* entries sent / (P x messages): dense 1 */
  double reduction[METHODS]; /* method's wire bytes / PULSELoCo's */
  double gap[METHODS];       /* PULSELoCo's final loss / method's - 1 */
  uint64_t entries;          /* PULSELoCo */
  double update_bias;        /* PULSELoCo, mean over rounds */
  int t10, t100, t2;
  int t_reward; /* text RL: last rounds' reward within 1% of DiLoCo-BF16's */
  /* PULSELoCo exchange */
  double max_drift, max_replay_drift, round_ms, exchange_ms;
  uint64_t resynced_ranges, resync_bytes, dgram_sent, dgram_dropped;
  uint64_t chunks_accepted, chunks_refused;
  /* drift over all pairs (max over the measured rounds) and round times
   * (trainer 0's, over rounds): sum_up_pairs_and_times */
  double max_pair_drift;
  uint32_t pair_rounds;
  bench_time_stats round_t, exchange_t;
} totals;

/* -------------------------------------------------------------- arguments */

/** Reads argv into *a (bench_loco_args.c). @return -1 to go on, else the
 * exit code (0 for --help, 2 for bad usage, with the message printed). */
int bench_loco_parse(int argc, char **argv, loco_args *a);

/* --------------------------------------------------------------- children */

/** The problem every process builds alike (same seed, same data split and
 * initial weights); NULL when it cannot be built (bench_loco_problem.c). */
pulse_sim_problem *bench_loco_make_problem(const loco_args *a);

/** Checks, before any process starts, that the problem can be built (its
 * data's size and digest, its parameter count). @return 0 when it can. */
const char *bench_loco_problem_name(uint32_t kind);
/** What a problem computes with when --compute is not given, and the
 * option's name of a mode ("fp32", "bf16"). */
int bench_loco_default_compute(uint32_t kind);
const char *bench_loco_compute_name(int compute);
int bench_loco_check_problem(const loco_args *a, uint64_t *bytes,
                             uint64_t *digest, uint64_t *P,
                             double *pretrain_loss, uint32_t *pretrain_steps,
                             double *lr);

/** A child's "error" line for a failed call. @return 1. */
int bench_loco_child_fail(int out, const char *what, pulse_status st);

/** The children's bodies, writing their lines to `out`: one baseline
 * method (bench_loco_method[which]) and the in-process PULSELoCo replay
 * (bench_loco_baselines.c), a PULSELoCo trainer reading the parent's lines
 * from in_fd (bench_loco_trainer.c). @return the exit code. */
int bench_loco_run_baseline(const loco_args *a, int which, int out);
int bench_loco_run_replay(const loco_args *a, int out);
int bench_loco_run_trainer(const loco_args *a, uint32_t id, int founder,
                           int in_fd, int out, bench_pair_drift *pd);

/* ----------------------------------------------------------------- parent */

/** Forks the baselines and the trainers, reads them to the end and waits
 * for them (bench_loco_parent.c). @return 1 when all ended well. */
int bench_loco_run_all(bench *b);

/** One complete line from child c, into b's rows (bench_loco_lines.c). */
void bench_loco_on_line(bench *b, child *c, char *line);

/* ----------------------------------------------------------------- output */

/** Every round, then the summary, as text or JSON (bench_loco_print.c). */
void bench_loco_report(const bench *b, double seconds, int identical);

/** The whole run's totals, and the summary printed from them
 * (bench_loco_summary.c). */
void bench_loco_sum_up(const bench *b, totals *t);
void bench_loco_print_summary_json(const bench *b, const totals *t,
                                   double seconds, int identical);
void bench_loco_print_summary_text(const bench *b, const totals *t,
                                   double seconds, int identical);

/** --report: the rounds as a table and charts (bench_loco_report.c).
 * @return 0, or 1 when it could not be written (printed). */
int bench_loco_write_report(const bench *b, int argc, char **argv);

#endif /* PULSE_BENCH_LOCO_IMPL_H */
