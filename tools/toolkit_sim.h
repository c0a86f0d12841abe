/* toolkit_sim.h - DDP, DiLoCo and PULSELoCo on the built-in problem
 * (toolkit_problem.h), every trainer in this process, in turn on this
 * thread: the reference the multi-process HTTP run is compared against, and
 * what the convergence tests use. */
#ifndef PULSE_TOOLKIT_SIM_H
#define PULSE_TOOLKIT_SIM_H

#include <stdint.h>

#include "pulse_status.h"
#include "toolkit_problem.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PULSE_TK_SIM_DDP = 0,      /* dense FP32 gradient all-reduce every step */
  PULSE_TK_SIM_DILOCO = 1,   /* dense FP32 pseudo-gradients every round */
  PULSE_TK_SIM_PULSELOCO = 2 /* gated sparse payloads + error feedback */
} pulse_tk_sim_method;

typedef struct {
  uint32_t struct_version; /* PULSE_TK_SIM_OPTS_VERSION */
  pulse_tk_sim_method method;
  uint32_t trainers;
  uint32_t rounds;
  uint32_t inner; /* H: inner steps per round */
  float alpha, mu;
  /* PULSELoCo only: probability that a trainer's payload misses a round
   * (trainer 0, the coordinator, always gets through). */
  double drop_rate;
  uint64_t drop_seed;
} pulse_tk_sim_opts;

#define PULSE_TK_SIM_OPTS_VERSION 1u
#define PULSE_TK_SIM_OPTS_INIT                                                 \
  {                                                                            \
    PULSE_TK_SIM_OPTS_VERSION, PULSE_TK_SIM_PULSELOCO, 3, 50, 20, 0.7f, 0.9f,  \
        0.0, 1                                                                 \
  }

/* One round of a run, as reported to the callback (round 0: the start). */
typedef struct {
  uint32_t round;
  double loss, accuracy; /* held-out, of the global parameters */
  double train_loss;     /* mean mini-batch loss of the round's inner steps */
  uint64_t bytes;        /* sent by all trainers in this round: DDP 4*P per
                            trainer per step, DiLoCo 4*P per trainer,
                            PULSELoCo the encoded payloads */
  uint64_t max_trainer_bytes;
  uint64_t entries; /* PULSELoCo: entries sent by all trainers */
  uint32_t contributors;
} pulse_tk_sim_round;

typedef void (*pulse_tk_sim_cb)(void *user, const pulse_tk_sim_round *r);

/** Runs one method in this process (trainers in turn on this thread).
 * cb (may be NULL) sees round 0 then every round. theta_final (P floats,
 * may be NULL) receives the final global parameters. */
pulse_status pulse_tk_sim_run(const pulse_tk_problem *p,
                              const pulse_tk_sim_opts *opts, pulse_tk_sim_cb cb,
                              void *user, float *theta_final);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_TOOLKIT_SIM_H */
