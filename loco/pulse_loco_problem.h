/* pulse_loco_problem.h - the built-in training problem of PULSELoCo's
 * benchmarks and tests, and in-process runs of DDP, DiLoCo and PULSELoCo on
 * it.
 *
 * The problem is a fine-tuning task, the regime PULSELoCo is built for (RL
 * post-training moves a pretrained model a little). A 2-layer MLP (inputs ->
 * hidden ReLU -> classes, logits times logit_scale, fixed 1/sqrt(fan-in)
 * multipliers) starts at "pretrained" weights A ~ N(0, init_scale^2), so
 * weights are O(1). The task's labels come from a teacher B = A + N(0,
 * shift^2) offsets: inputs are N(0, I), targets are B's probabilities
 * (distillation).
 * The student must move every weight by about `shift`, a few BF16 ulps,
 * with inner Adam steps far below one: that is what makes the gate matter.
 * Each trainer draws its mini-batches from its own stream (seed, trainer
 * id): its data shard. The loss is the cross-entropy against B's
 * probabilities on a fixed held-out set, so its floor is B's entropy
 * (pulse_loco_problem_floor). Everything is deterministic for a seed.
 *
 * Thread-safety: a problem is read-only after creation and may be shared;
 * a learner belongs to one thread. */
#ifndef PULSE_LOCO_PROBLEM_H
#define PULSE_LOCO_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_loco.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_loco_problem pulse_loco_problem;
typedef struct pulse_loco_learner pulse_loco_learner;

/* Problem options; start from PULSE_LOCO_PROBLEM_OPTS_INIT. */
typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_PROBLEM_OPTS_VERSION */
  uint64_t seed;
  uint32_t inputs, hidden, classes;
  uint32_t batch;              /* samples per inner step */
  uint32_t test_count;         /* held-out samples */
  float init_scale;            /* std of the pretrained weights A */
  float shift;                 /* std of the teacher's offsets B - A */
  float logit_scale;           /* multiplier of the logits */
  float lr, beta1, beta2, eps; /* inner Adam */
} pulse_loco_problem_opts;

#define PULSE_LOCO_PROBLEM_OPTS_VERSION 1u
#define PULSE_LOCO_PROBLEM_OPTS_INIT                                           \
  {                                                                            \
    PULSE_LOCO_PROBLEM_OPTS_VERSION, 1, 128, 512, 10, 32, 1024, 1.0f, 0.02f,   \
        30.0f, 2e-5f, 0.9f, 0.99f, 1e-8f                                       \
  }

/** Generates the problem (class means, held-out set). */
pulse_status pulse_loco_problem_create(const pulse_loco_problem_opts *opts,
                                       pulse_loco_problem **out);
void pulse_loco_problem_free(pulse_loco_problem *p); /* NULL is fine */

/** Number of parameters P of the model. */
uint64_t pulse_loco_problem_param_count(const pulse_loco_problem *p);

/** Samples per inner step (the options' batch). */
uint32_t pulse_loco_problem_batch(const pulse_loco_problem *p);

/** Hidden width of a model of about `params` parameters with the other
 * options of opts (at least 1). */
uint32_t pulse_loco_problem_hidden_for(const pulse_loco_problem_opts *opts,
                                       uint64_t params);

/** The initial parameters (P floats), the same for every trainer. */
void pulse_loco_problem_init(const pulse_loco_problem *p, float *theta);

/** Held-out mean cross-entropy against the teacher's probabilities (nats),
 * and accuracy (student's argmax = teacher's argmax), of theta. */
void pulse_loco_problem_eval(const pulse_loco_problem *p, const float *theta,
                             double *loss, double *accuracy);

/** The loss floor: the teacher's mean entropy on the held-out set. */
double pulse_loco_problem_floor(const pulse_loco_problem *p);

/** A trainer's learner: its data stream and inner Adam moments. */
pulse_status pulse_loco_learner_create(const pulse_loco_problem *p,
                                       uint32_t trainer_id,
                                       pulse_loco_learner **out);
void pulse_loco_learner_free(pulse_loco_learner *l); /* NULL is fine */

/** Gradient (P floats) of the mean loss over the trainer's next
 * mini-batch at theta; returns that loss. */
double pulse_loco_learner_grad(pulse_loco_learner *l, const float *theta,
                               float *grad);

/** One Adam step of theta along grad with the learner's moments. */
void pulse_loco_learner_adam(pulse_loco_learner *l, float *theta,
                             const float *grad);

/** grad + adam on the next mini-batch; returns its loss. */
double pulse_loco_learner_step(pulse_loco_learner *l, float *theta);

/* ------------------------------------------------------ in-process runs */

typedef enum {
  PULSE_LOCO_SIM_DDP = 0,      /* dense FP32 gradient all-reduce every step */
  PULSE_LOCO_SIM_DILOCO = 1,   /* dense FP32 pseudo-gradients every round */
  PULSE_LOCO_SIM_PULSELOCO = 2 /* gated sparse payloads + error feedback */
} pulse_loco_sim_method;

typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_SIM_OPTS_VERSION */
  pulse_loco_sim_method method;
  uint32_t trainers;
  uint32_t rounds;
  uint32_t inner; /* H: inner steps per round */
  float alpha, mu;
  /* PULSELoCo only: probability that a trainer's payload misses a round
   * (trainer 0, the coordinator, always gets through). */
  double drop_rate;
  uint64_t drop_seed;
} pulse_loco_sim_opts;

#define PULSE_LOCO_SIM_OPTS_VERSION 1u
#define PULSE_LOCO_SIM_OPTS_INIT                                               \
  {                                                                            \
    PULSE_LOCO_SIM_OPTS_VERSION, PULSE_LOCO_SIM_PULSELOCO, 3, 50, 20, 0.7f,    \
        0.9f, 0.0, 1                                                           \
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
} pulse_loco_sim_round;

typedef void (*pulse_loco_sim_cb)(void *user, const pulse_loco_sim_round *r);

/** Runs one method in this process (trainers in turn on this thread).
 * cb (may be NULL) sees round 0 then every round. theta_final (P floats,
 * may be NULL) receives the final global parameters. */
pulse_status pulse_loco_sim_run(const pulse_loco_problem *p,
                                const pulse_loco_sim_opts *opts,
                                pulse_loco_sim_cb cb, void *user,
                                float *theta_final);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_PROBLEM_H */
