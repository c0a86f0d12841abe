/* sim_trainers.h - DDP, DiLoCo and PULSELoCo on the built-in problem
 * (sim_problem.h), every trainer in this process, in turn on this
 * thread. Each trainer keeps its own replica of the model and sends real
 * encoded messages to every other trainer through a sim_exchange.h
 * exchange (over HTTP on 127.0.0.1 for `pulse-bench loco`, in memory for
 * tests), so bytes are counted from what was sent, and every replica must
 * end with the same bits.
 *
 *   DDP        every inner step, each trainer's dense gradient (FP32 or
 *              BF16, sim_dense.h) to every other; each replica sums
 *              them in sender order, divides by N and takes one Adam step
 *   DiLoCo     every round of H inner Adam steps, each trainer's dense
 *              pseudo-gradient theta_g - theta_r (FP32 or BF16); each
 *              replica averages them as pulse_loco_finish does (sample
 *              weights, double sums in sender order, one rounding) and
 *              takes the same Nesterov outer step: with FP32 values this is
 *              the pulse_loco context's dense mode (PULSE_LOCO_GATE_NONE)
 *              bit for bit, with BF16 it rounds every value before it is
 *              sent
 *   PULSELoCo  every round, each trainer's gated sparse payload
 *              (pulse_loco contexts, docs/formats/loco-payload.md), error feedback
 *
 * Thread-safety: a run uses only its own state; a problem may be shared. */
#ifndef PULSE_SIM_TRAINERS_H
#define PULSE_SIM_TRAINERS_H

#include <stdint.h>

#include "pulse_loco_testing.h"
#include "pulse_status.h"
#include "sim_dense.h"
#include "sim_problem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PULSE_SIM_DDP = 0,      /* dense gradients every inner step */
  PULSE_SIM_DILOCO = 1,   /* dense pseudo-gradients every round */
  PULSE_SIM_PULSELOCO = 2 /* gated sparse payloads + error feedback */
} pulse_sim_method;

typedef struct {
  uint32_t struct_version; /* PULSE_SIM_OPTS_VERSION */
  pulse_sim_method method;
  uint32_t trainers;
  uint32_t rounds;
  uint32_t inner; /* H: inner steps per round */
  float alpha, mu;
  /* PULSELoCo only: probability that a trainer's payload misses a round
   * (trainer 0, the coordinator, always gets through). */
  double drop_rate;
  uint64_t drop_seed;
  /* DDP and DiLoCo: how their messages carry values. */
  pulse_sim_dense_values values;
  /* Send the messages over HTTP on 127.0.0.1 (else in memory). */
  int over_http;
  /* PULSELoCo: the loss rule (pulse_loco_rule; 0, the default: drop). */
  int rule;
  /* PULSELoCo as over datagrams (the node's UDP transport, drop rule):
   * every payload cut into chunks of max_datagram bytes, each lost for
   * each receiver when pulse_loco_datagram_draw(drop_seed, round, sender,
   * receiver, index) < datagram_drop; every receiver aggregates what it
   * got (pulse_loco_finish_inbox), then re-syncs to trainer 0 (the
   * reference) as the node does (docs/formats/loco-chunks.md "Drift"): the ranges of
   * resync_range parameters that differ, in every round r with (r + 1) a
   * multiple of resync_period, and in between when the drift estimated
   * from the sketches exceeds drift_budget; a replica left drifted names
   * the reference's base and flags its drifted ranges in its chunks. */
  int chunked;
  double datagram_drop;
  uint32_t max_datagram;
  uint32_t resync_period;
  double drift_budget;
  uint32_t resync_range;
} pulse_sim_opts;

#define PULSE_SIM_OPTS_VERSION 4u
/* Sets every field of *opts to its default (struct_version included). */
void pulse_sim_opts_init(pulse_sim_opts *opts);

/* One round of a run, as reported to the callback (round 0: the start). */
typedef struct {
  uint32_t round;
  double loss, accuracy; /* held-out, of trainer 0's global parameters */
  double train_loss;     /* mean mini-batch loss of the round's inner steps */
  uint64_t bytes;        /* the messages all trainers sent in this round,
                            each counted once at its encoded size (DDP: one
                            per trainer per inner step) */
  uint64_t max_trainer_bytes; /* the most one trainer sent in this round */
  uint64_t max_message_bytes; /* the largest single message of the round */
  uint64_t wire_bytes; /* message bodies that left the trainers in this round:
                          each message once per other trainer (over HTTP,
                          as the servers counted them) */
  uint64_t entries;    /* PULSELoCo: entries sent by all trainers */
  uint32_t contributors;
  /* PULSELoCo: (applied · lossless) / ||lossless||^2 of the round's mean
   * pseudo-gradient, 1 = unbiased. "Lossless" replays the round with every
   * payload arriving: each trainer's signal is its local progress
   * theta_g - theta_r plus a shadow error feedback that has only ever
   * kept what the gate held back (never what was lost); "applied" is the
   * mean the round really used (trainer 0's b - mu * b_before). 1 when the
   * lossless mean is 0. */
  double update_bias;
  /* chunked: the max over trainer pairs of ||theta_a - theta_b|| /
   * ||theta_a|| after the round, before the re-syncs (0 otherwise). */
  double drift;
  /* Text RL: the held-out expected reward of trainer 0's global parameters
   * (pulse_sim_problem_reward; 0 for the other problems). */
  double reward;
} pulse_sim_round;

typedef void (*pulse_sim_cb)(void *user, const pulse_sim_round *r);

/** Runs one method. cb (may be NULL) sees round 0 then every round.
 * theta_final (P floats, may be NULL) receives the final parameters of
 * trainer 0.
 * @return PULSE_OK; PULSE_ERR_ARG (options); PULSE_ERR_IO (the exchange);
 * PULSE_ERR_CORRUPT (the replicas ended with different parameters); a
 * context or message error; PULSE_ERR_NOMEM. */
pulse_status pulse_sim_run(const pulse_sim_problem *p,
                              const pulse_sim_opts *opts, pulse_sim_cb cb,
                              void *user, float *theta_final);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_TRAINERS_H */
