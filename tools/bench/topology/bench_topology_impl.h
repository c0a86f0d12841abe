/* bench_topology_impl.h - private to `pulse-bench topology`: its arguments,
 * arms and per-round figures, shared by the run (bench_topology.c), the
 * multi-process HTTP run (bench_topology_http.c) and the printing and
 * report (bench_topology_print.c). */
#ifndef PULSE_BENCH_TOPOLOGY_IMPL_H
#define PULSE_BENCH_TOPOLOGY_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "pulse_gossip.h"
#include "sim_problem.h"

#define TOPO_PROG "pulse-bench topology"

typedef enum {
  ARM_RING,
  ARM_TORUS,
  ARM_EXPONENTIAL,
  ARM_COMPLETE,
  ARM_ADAPTIVE,
  ARM_ONEPEER,
  ARM_COUNT
} topo_arm;

extern const char *const topo_arm_name[ARM_COUNT];

typedef struct {
  uint32_t nodes, rounds, inner;
  uint64_t seed, params;
  double lr, noise;  /* inner SGD step and gradient noise std (per entry) */
  double target;     /* adaptive: variance target (0: automatic) */
  double budget;     /* adaptive: fraction of the complete graph's bytes */
  uint32_t final_rounds; /* adaptive: complete-graph rounds at the end */
  int arms[ARM_COUNT]; /* which arms run */
  int gate_none;     /* --gate none: exact payloads */
  int json;
  int processes;     /* one process per node over HTTP on 127.0.0.1 */
  const char *report;
} topo_args;

/* One round of one arm, measured after mixing. */
typedef struct {
  double variance;      /* mean over parameters of the across-replica
                           variance, over the mean squared parameter */
  double predicted;     /* the graph's prediction for this round (NaN:
                           none) */
  double noise;         /* the round's update variance, same units */
  double consensus;     /* sqrt(mean over nodes of |x_i - mean|^2) */
  double loss;          /* mean over nodes of the held-out loss */
  double bytes_per_node; /* payload bytes sent this round, per node */
  uint32_t degree;      /* payloads a node sent this round: the mean degree
                           of the round's graph (rounded), summed over its
                           steps */
  uint32_t steps;       /* gossip steps this round (adaptive: one-peer
                           steps; the other arms: 1) */
} topo_row;

typedef struct {
  double variance, predicted, bytes_per_node, final_loss, mean_degree;
  double seconds;
} topo_summary;

/* A whole arm: rows[0..rounds) and the adaptive decisions (per round in
 * rows, `reason` and `decision`). */
typedef struct {
  topo_arm arm;
  topo_row *rows;
  const char **reason; /* adaptive only, static strings */
  pulse_gossip_decision *decision; /* adaptive only: the policy's log */
  topo_summary sum;
  uint64_t digest; /* of every node's final parameters, in node order */
} topo_result;

/* The shared part of a run: the problem and what every node starts from. */
typedef struct {
  const topo_args *a;
  pulse_sim_problem *prob;
  uint64_t P;
  float *init;
} topo_setup;

/* Local steps of node i in round t: `inner` SGD steps with the learner's
 * gradient plus N(0, noise^2) per entry (deterministic in seed, i, t). */
void topo_local_steps(const topo_setup *s, pulse_sim_learner *l, uint32_t i,
                      uint32_t t, float *x, float *grad);

/* Gossip options of a node. */
void topo_gossip_opts(const topo_setup *s, uint32_t i, pulse_gossip_opts *o);

/* The figures of a round from every node's parameters (xs[i], P floats
 * each): variance, consensus, loss. */
void topo_measure(const topo_setup *s, const float *const *xs, topo_row *row);

/* The per-node variance of the round's local change xs - before (unbiased
 * across nodes), over the mean squared parameter: the noise the graph's
 * prediction multiplies. */
double topo_update_variance(const topo_setup *s, const float *const *xs,
                            const float *const *before);

/* The summary of an arm from its rows. */
void topo_summarize(const topo_args *a, topo_result *r);

/* Round t's graph of a static or one-peer arm (owned by the caller). */
pulse_status topo_graph(const topo_args *a, topo_arm arm, uint32_t t,
                        pulse_gossip_graph **g);

/* Predicted variance per unit noise of a non-adaptive arm (NaN when
 * none). */
double topo_factor(const topo_args *a, topo_arm arm);

/* The most gossip steps of one round (the adaptive arm's log2 N <= 6). */
#define TOPO_MAX_STEPS 8u

/* The gossip round id of step k of round t (the adaptive arm's steps are
 * rounds of their own; the other arms keep t). */
uint64_t topo_gossip_round(topo_arm arm, uint32_t t, uint32_t k);

/* Round t's graphs (steps[0..*count), owned by the caller; free with
 * topo_free_steps): one for a static or one-peer arm; the adaptive arm asks
 * its policy (from the last variance, the bytes spent so far, the last
 * round's mean payload and mean payload of its first step) and logs the
 * decision in r. */
pulse_status topo_round_graphs(const topo_args *a, topo_arm arm, uint32_t t,
                               pulse_gossip_policy *policy, double last_var,
                               double spent, double last_payload,
                               double last_full, topo_result *r,
                               pulse_gossip_graph **steps, uint32_t *count);
void topo_free_steps(pulse_gossip_graph **steps, uint32_t count);

/* The gate of step k of a round of `count` steps: the arm's (--gate), but
 * the adaptive arm sends the last step of an exact round (log2 N steps)
 * ungated, so that its replicas end the round as the average without the
 * BF16 gate's held-back residue. */
pulse_loco_gate_mode topo_step_gate(const topo_args *a, topo_arm arm,
                                    uint32_t count, uint32_t k);

/* The adaptive arm's automatic target, in units of the measured per-round
 * noise (set from round 0's local steps). s one-peer steps leave at least
 * 1/2^s - 1/N of a round's fresh noise (0.06 with 3 steps at N = 16), an
 * exact round (log2 N steps) only the gate's residue (about 0.008 at
 * --noise 0.1): 0.01 keeps the policy at exact rounds while it measures
 * more than half of that. */
#define ADAPTIVE_TARGET_FACTOR 0.01

/* The adaptive arm's policy (target automatic or --target). */
pulse_status topo_policy_create(const topo_args *a, pulse_gossip_policy **p);

/* The multi-process run of one arm over HTTP (bench_topology_http.c). */
int topo_run_http(const topo_setup *s, topo_arm arm, topo_result *r);

/* Output (bench_topology_print.c). */
void topo_print_round(const topo_args *a, const topo_result *r, uint32_t t);
void topo_print_summaries(const topo_args *a, const topo_result *res,
                          int count);
int topo_write_report(const topo_args *a, const topo_result *res, int count,
                      int argc, char **argv);

#endif
