/* sim_problem.h - the built-in training problem of PULSELoCo's
 * benchmark (`pulse-bench loco`) and tests: a model, its data and an inner
 * optimizer, so that DDP, DiLoCo and PULSELoCo can be run and compared
 * (sim_trainers.h runs them in one process). Not part of any pulse library.
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
 * (pulse_sim_problem_floor). Everything is deterministic for a seed.
 *
 * A second problem, PULSE_SIM_PROBLEM_TEXT (sim_text.h), is next-
 * character prediction on real text (base-files' licences): the same calls,
 * a held-out split of the text for the loss, an embedding -> hidden ->
 * softmax model of any size (`hidden`, or pulse_sim_problem_hidden_for).
 * It reads files; the teacher problem needs none, and the tests that are
 * about the protocol rather than the data use it.
 *
 * Thread-safety: a problem is read-only after creation and may be shared;
 * a learner belongs to one thread. */
#ifndef PULSE_SIM_PROBLEM_H
#define PULSE_SIM_PROBLEM_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_sim_problem pulse_sim_problem;
typedef struct pulse_sim_learner pulse_sim_learner;

/* Problem options; start from pulse_sim_problem_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_SIM_PROBLEM_OPTS_VERSION */
  uint64_t seed;
  uint32_t inputs, hidden, classes;
  uint32_t batch;              /* samples per inner step */
  uint32_t test_count;         /* held-out samples */
  float init_scale;            /* std of the pretrained weights A */
  float shift;                 /* std of the teacher's offsets B - A */
  float logit_scale;           /* multiplier of the logits */
  float lr, beta1, beta2, eps; /* inner Adam */
  /* Which problem; the text problem ignores inputs, classes, shift and
   * logit_scale, and its loss floor is unknown (reported as 0). */
  uint32_t kind; /* PULSE_SIM_PROBLEM_TEACHER, _TEXT, _TEXT_SFT or _TEXT_RL */
  const char *text_path; /* text: one file to learn; NULL: base-files' */
  uint32_t context;      /* text: bytes of context k */
  uint32_t embed;        /* text: embedding width d */
  /* Text SFT: the model is first pretrained from its random start for
   * pretrain_steps Adam steps at pretrain_lr on the pretraining part of
   * the text (deterministic in the seed; the checkpoint is cached in a
   * file, sim_pretrain.c), then the learners fine-tune it at `lr` on the
   * fine-tuning part, which pretraining never saw. */
  uint32_t pretrain_steps;
  float pretrain_lr;
  /* Text RL (sim_rl.h): from the same checkpoint, each inner step samples
   * rl_group continuations of rl_length bytes for each of batch /
   * rl_group prompts of the fine-tuning part, and takes a policy-gradient
   * step with group-normalized advantages. */
  uint32_t rl_group, rl_length;
  /* What the learners compute with: PULSE_SIM_COMPUTE_FP32, the FP32
   * weights themselves, or _BF16, their BF16 rounding (pulse_elem.h, the
   * project's one rounding), as RL runs in practice: an inference engine
   * holding BF16 weights samples the rollouts, and a mixed-precision
   * trainer (FSDP param_dtype=bf16, autocast) runs forward and backward on
   * the BF16 rounding of its FP32 master weights. With _BF16 the gradient,
   * text RL's samples, the held-out loss and the reward all see
   * bf16(theta), while Adam updates the FP32 theta; the arithmetic stays
   * FP32 (weights are rounded, activations are not). Pretraining computes
   * in FP32 in both modes, so both start from one cached checkpoint. */
  uint32_t compute;
  /* Where the text problems keep their layers' scale (sim_text.h):
   * PULSE_SIM_PARAM_SCALED, 1/sqrt(fan-in) multipliers in the forward and
   * O(1) weights (median |w| about 0.8), or _STANDARD, as LLMs: no
   * multipliers, W1 and W2 that much smaller. Adam moves a weight by about
   * lr whatever its size, and a BF16 ulp is relative, so the choice sets
   * how many BF16 weights a rate moves. Text SFT and RL pretrain scaled
   * (one cached checkpoint) and convert it: the same function. */
  uint32_t parametrization;
} pulse_sim_problem_opts;

enum {
  PULSE_SIM_PROBLEM_TEACHER = 0,
  PULSE_SIM_PROBLEM_TEXT = 1,     /* next byte, from a random start */
  PULSE_SIM_PROBLEM_TEXT_SFT = 2, /* the same model, fine-tuned from a
                                     pretrained checkpoint on unseen text */
  PULSE_SIM_PROBLEM_TEXT_RL = 3   /* the same checkpoint, trained by RL on
                                     prompts of the unseen text */
};

/* Whether a kind starts from the pretrained checkpoint. */
static inline int pulse_sim_problem_is_pretrained(uint32_t kind) {
  return kind == PULSE_SIM_PROBLEM_TEXT_SFT ||
         kind == PULSE_SIM_PROBLEM_TEXT_RL;
}

/* Whether a kind is one of the text problems. */
static inline int pulse_sim_problem_is_text(uint32_t kind) {
  return kind == PULSE_SIM_PROBLEM_TEXT || pulse_sim_problem_is_pretrained(kind);
}

/* Text problem defaults: a learning rate for its O(1) weights, and the
 * fine-tuning rate of text SFT (an RL-like rate: most of an outer round's
 * pseudo-gradient does not move a BF16 weight) and text RL's rate. */
#define PULSE_SIM_TEXT_LR 2e-3f
#define PULSE_SIM_TEXT_SFT_LR 5e-6f
#define PULSE_SIM_TEXT_RL_LR 5e-6f
/* What text SFT and text RL compute with by default in `pulse-bench loco`
 * (the sim's own default is FP32), and the help text that says so: BF16,
 * as RL post-training runs (docs/benchmarks/loss.md, "Compute precision":
 * it leaves DiLoCo-BF16's reward within 0.1% and raises PULSELoCo's share
 * of its gain from 0.27 to 0.39 at 5e-6). */
#define PULSE_SIM_TEXT_SFT_COMPUTE PULSE_SIM_COMPUTE_BF16
#define PULSE_SIM_TEXT_RL_COMPUTE PULSE_SIM_COMPUTE_BF16
#define PULSE_SIM_TEXT_COMPUTE_HELP                                            \
  "bf16 for text-sft and text-rl, fp32 for text and\n"                         \
  "                   teacher"
/* Text RL's defaults: samples per prompt, bytes per sample. */
#define PULSE_SIM_TEXT_RL_GROUP 8u
#define PULSE_SIM_TEXT_RL_LENGTH 4u

enum {
  PULSE_SIM_COMPUTE_FP32 = 0, /* the FP32 weights (the default) */
  PULSE_SIM_COMPUTE_BF16 = 1  /* their BF16 rounding; Adam keeps FP32 */
};

enum {
  PULSE_SIM_PARAM_SCALED = 0,  /* multipliers in the forward (the default) */
  PULSE_SIM_PARAM_STANDARD = 1 /* in the weights, as LLMs */
};

#define PULSE_SIM_PROBLEM_OPTS_VERSION 4u
/* Sets every field of *opts to its default (struct_version included). */
void pulse_sim_problem_opts_init(pulse_sim_problem_opts *opts);

/** Generates the problem (class means, held-out set). */
pulse_status pulse_sim_problem_create(const pulse_sim_problem_opts *opts,
                                     pulse_sim_problem **out);
void pulse_sim_problem_free(pulse_sim_problem *p); /* NULL is fine */

/** Number of parameters P of the model. */
uint64_t pulse_sim_problem_param_count(const pulse_sim_problem *p);

/** Samples per inner step (the options' batch). */
uint32_t pulse_sim_problem_batch(const pulse_sim_problem *p);

/** Hidden width of a model of about `params` parameters with the other
 * options of opts (at least 1). */
uint32_t pulse_sim_problem_hidden_for(const pulse_sim_problem_opts *opts,
                                     uint64_t params);

/** The learners' Adam rate. */
double pulse_sim_problem_lr(const pulse_sim_problem *p);

/** Text SFT and RL: the held-out loss the pretraining reached (evaluated
 * as the options' compute says, so it is the learners' starting loss) and
 * its steps (0 and 0 for the other problems). */
double pulse_sim_problem_pretrain_loss(const pulse_sim_problem *p);
uint32_t pulse_sim_problem_pretrain_steps(const pulse_sim_problem *p);

/** The text problem's text: bytes read and their digest (both 0 for the
 * teacher problem). */
void pulse_sim_problem_data(const pulse_sim_problem *p, uint64_t *bytes,
                           uint64_t *digest);

/** The initial parameters (P floats), the same for every trainer. */
void pulse_sim_problem_init(const pulse_sim_problem *p, float *theta);

/** Held-out mean cross-entropy against the teacher's probabilities (nats),
 * and accuracy (student's argmax = teacher's argmax), of theta; text: the
 * cross-entropy of the held-out characters (nats per character) and the
 * share predicted right. Computed at bf16(theta) when the options' compute
 * is PULSE_SIM_COMPUTE_BF16; a NAN loss when out of memory. */
void pulse_sim_problem_eval(const pulse_sim_problem *p, const float *theta,
                           double *loss, double *accuracy);

/** Text RL: the policy theta's expected reward over the held-out prompts,
 * exact (sim_rl.h); 0 for the other problems. Like eval, at the weights
 * the options' `compute` says (bf16(theta) for _BF16); NAN when out of
 * memory. */
double pulse_sim_problem_reward(const pulse_sim_problem *p,
                               const float *theta);

/** The loss floor: the teacher's mean entropy on the held-out set (text:
 * 0, unknown). */
double pulse_sim_problem_floor(const pulse_sim_problem *p);

/** A trainer's learner: its data stream and inner Adam moments. */
pulse_status pulse_sim_learner_create(const pulse_sim_problem *p,
                                     uint32_t trainer_id,
                                     pulse_sim_learner **out);
void pulse_sim_learner_free(pulse_sim_learner *l); /* NULL is fine */

/** Gradient (P floats) of the mean loss over the trainer's next
 * mini-batch at theta (at bf16(theta) under PULSE_SIM_COMPUTE_BF16: the
 * gradient with respect to the rounded weights, as mixed precision
 * computes it); returns that loss (text RL: minus the mean reward of the
 * step's samples). */
double pulse_sim_learner_grad(pulse_sim_learner *l, const float *theta,
                             float *grad);

/** One Adam step of theta along grad with the learner's moments (theta
 * stays FP32 in both compute modes: the master weights). */
void pulse_sim_learner_adam(pulse_sim_learner *l, float *theta,
                           const float *grad);

/** grad + adam on the next mini-batch; returns its loss. */
double pulse_sim_learner_step(pulse_sim_learner *l, float *theta);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_PROBLEM_H */
