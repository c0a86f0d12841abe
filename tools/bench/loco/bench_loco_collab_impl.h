/* bench_loco_collab_impl.h - private to `pulse-bench loco` in collaboration
 * mode (bench_loco_collab*.c): the command line, the peers and the rounds'
 * rows the parent keeps, a peer's loss evaluator, and what each part
 * exports. Names start with bench_loco_collab_. */
#ifndef PULSE_BENCH_LOCO_COLLAB_IMPL_H
#define PULSE_BENCH_LOCO_COLLAB_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bench_netns.h"
#include "pulse_loco_auth.h"
#include "sim_problem.h"

#define PROG "pulse-bench loco"
#define MAXP 32
#define MAXR 1000
#define MAXEV 16

typedef struct {
  char kind[16]; /* join, leave, kill, kill-writer, kill-finisher,
                    partition */
  uint32_t round;
  int fired;
} churn_event;

typedef struct {
  uint32_t trainers, rounds;
  uint64_t target, params, seed;
  double speeds[MAXP];
  uint32_t nspeeds;
  churn_event ev[MAXEV];
  uint32_t nev;
  int json;
  const char *report;
  uint32_t claim_ms, round_ms;
  int partitioned;  /* --averaging partitioned */
  uint32_t check;   /* --partition-check: PULSE_LOCO_COLLAB_CHECK_* */
  uint32_t clients; /* --clients K: the last K founders in client mode */
  int equal_ranges; /* --ranges equal */
  /* pulse_loco_opts.gate_mean: --gate-mean 1, --no-gate-mean 0; neither:
   * on when partitioned (where it cuts the reduced ranges' bytes in, the
   * issue's 3x), off all-to-all (where it only grows the payloads). */
  int gate_mean;
  /* --netns NAME=ADDR,...: peer i runs in network namespace
   * netns[(i - 1) % nnetns] (/run/netns/NAME) and listens on ADDR. */
  pulse_sim_netns netns[MAXP];
  uint32_t nnetns;
  /* Authentication (on unless --no-auth): every peer id's key, made
   * before the peers fork, every one pinned at every peer. */
  int no_auth;
  pulse_sign_key *keys[MAXP + 1];
  pulse_loco_member_key pins[MAXP];
  /* --churn partition: peer i runs as user uid_base + i once it listens,
   * so that nft tells its packets apart (every peer is on 127.0.0.1);
   * 0: none. */
  uint32_t uid_base;
} collab_args;

#define BENCH_CUT_UID_BASE 62000u

typedef struct {
  pid_t pid;
  int to, from, alive, done, errored;
  uint32_t id;
  char url[64];
  char buf[1 << 15];
  size_t have;
  uint64_t busy_ms, alive_ms, final_round, digest;
} peer;

typedef struct {
  int have;
  uint64_t samples, contributors, writer, takeovers;
  uint32_t members;
  uint32_t by_exchange; /* peers whose round the partitioned exchange ended */
  double loss, t_s;
  uint64_t in[MAXP + 1], out[MAXP + 1]; /* by id (ids 1..MAXP) */
  uint64_t payload[MAXP + 1];           /* each peer's own payload size */
  int reported[MAXP + 1];
  uint32_t next[MAXP];
  size_t nnext;
} round_row;

typedef struct {
  collab_args a;
  peer p[MAXP];
  size_t n;
  round_row rows[MAXR];
  double start;
  uint64_t rng;
  int failed;
  uint64_t auth_bytes, auth_reports; /* summed over the peers' rounds */
  /* kill-finisher: the round whose first member to say "finished" is
   * killed (watching: 1 until then). */
  uint64_t finisher_round;
  int watching;
  /* partition: the nft table that cuts two members, until cut_until
   * (pulse_cli_now seconds; 0: no cut). */
  char cut_table[48];
  double cut_until;
} collab_bench;

/* Bytes in over the peer's own payload, the measure of
 * partitioned averaging (at most 3x at 8 peers): the mean over non-writer
 * peer-rounds, the worst peer's mean over its non-writer rounds, the worst
 * non-writer peer-round, and the writers' mean. Peer-rounds without a
 * payload (a joiner's first, a client's missed round) do not count. */
typedef struct {
  double mean, worst_peer, worst_peer_round, writer;
  uint64_t count;
} in_ratios;

/* A peer's held-out losses, evaluated off its critical path
 * (bench_loco_collab_eval.c). */
typedef struct eval_job {
  struct eval_job *next;
  uint64_t round;
  float *theta;
} eval_job;

typedef struct {
  const pulse_sim_problem *p; /* pulse_sim_problem_eval reads it only */
  uint64_t P;
  int out;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  eval_job *head, **tail;
  uint64_t queued_bytes;
  int started, closing;
} loss_evaluator;

/** Reads argv into *a (bench_loco_collab_args.c). @return -1 to go on,
 * else the exit code (2 for bad usage, printed). */
int bench_loco_collab_parse(int argc, char **argv, collab_args *a);

/* ------------------------------------------------------------------- peer */

/** Peer `id` at `speed` samples/s (0: unthrottled), serving (client_of
 * NULL) or a client hosted there: its rounds until the last, reading the
 * parent's lines from `in`, writing its own to `out`
 * (bench_loco_collab_peer.c). @return the exit code. */
int bench_loco_collab_run_peer(const collab_args *a, uint32_t id, double speed,
                               const char *client_of, int in, int out);

/** Starts the evaluator's thread (it writes "loss R LOSS" lines to out). */
void bench_loco_collab_evaluator_start(loss_evaluator *ev,
                                       const pulse_sim_problem *p, uint64_t P,
                                       int out);

/** Queues the loss of `round` at theta (copied), or evaluates it here when
 * the thread or the memory for a copy is missing. */
void bench_loco_collab_evaluator_post(loss_evaluator *ev, uint64_t round,
                                      const float *theta);

/** Evaluates what is queued, then stops the thread. */
void bench_loco_collab_evaluator_finish(loss_evaluator *ev);

/* ----------------------------------------------------------------- parent */

/** Forks peer `id`, serving (client_of NULL) or in client mode hosted
 * there, and reads its URL (bench_loco_collab_parent.c). @return 0 or -1. */
int bench_loco_collab_spawn_peer(collab_bench *b, uint32_t id,
                                 const char *client_of);

/** Reads every peer's lines until none is left to read or the run failed. */
void bench_loco_collab_event_loop(collab_bench *b);

/** The churn events of round reported + 1, once round `reported` is first
 * reported (bench_loco_collab_churn.c). */
void bench_loco_collab_fire_events(collab_bench *b, uint32_t reported);

/** While a kill-finisher event watches: reads the live serving members'
 * outcome of its round and kills the first that says "finished". */
void bench_loco_collab_watch_finishers(collab_bench *b);

/** Ends a partition whose time is up (now: the run is over). */
void bench_loco_collab_heal(collab_bench *b, int now);

/* ----------------------------------------------------------------- output */

/** Rounds 0..last-1, as text or JSON (bench_loco_collab_print.c). */
void bench_loco_collab_print_rounds(const collab_bench *b, uint32_t last);

/** Bytes in over the peer's own payload over rounds 0..last-1. */
in_ratios bench_loco_collab_ratios_of(const collab_bench *b, uint32_t last);

/** --report: the rounds as a table and charts. @return 0, or 1 (printed). */
int bench_loco_collab_write_report(const collab_bench *b, uint32_t last,
                                   int argc, char **argv);

#endif /* PULSE_BENCH_LOCO_COLLAB_IMPL_H */
