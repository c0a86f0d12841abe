/* sim_rl.h - text RL (PULSE_SIM_PROBLEM_TEXT_RL, sim_problem.h):
 * reinforcement learning of the text model (sim_text.h) from the
 * pretrained checkpoint text SFT starts from, GRPO-style.
 *
 * An inner step draws batch / group prompts from the fine-tuning part of
 * the text (a prompt is the k bytes before a position whose `length`-byte
 * continuation lies in the same block), samples `group` continuations of
 * `length` bytes for each from the model (temperature 1, the learner's
 * seeded stream), and scores each with a verifiable reward: the number of
 * leading bytes that match the text's true continuation (0..length). The
 * advantage of a sample is its reward normalized in its group,
 * A = (r - mean) / (std + PULSE_SIM_RL_STD_EPS) with the population std,
 * and the step's loss is -(1/N) sum_samples A sum_bytes log pi(byte), N
 * the samples of the step: its gradient is that of a weighted
 * cross-entropy of the sampled bytes (pulse_sim_text_backward). A group
 * whose samples all score alike has A = 0 and adds nothing.
 *
 * The held-out reward is exact, not sampled: with a prefix-match reward,
 * E[r] = sum_j prod_{i <= j} p(true byte i | prompt, true bytes < i),
 * which teacher forcing gives in one pass; it is averaged over test_count
 * held-out prompts. Internal to tools/: sim_problem.c and the tests. */
#ifndef PULSE_SIM_RL_H
#define PULSE_SIM_RL_H

#include <stdint.h>

#include "pulse_status.h"
#include "sim_text.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Keeps the advantage finite when a group's rewards barely differ. */
#define PULSE_SIM_RL_STD_EPS 1e-4

typedef struct pulse_sim_rl_scratch pulse_sim_rl_scratch;

/** The reward of a sample: how many of its first bytes equal the true
 * continuation's (0..length). */
uint32_t pulse_sim_rl_reward(const uint8_t *sample, const uint8_t *truth,
                             uint32_t length);

/** Group-normalized advantages: adv[i] = (r[i] - mean) / (std + eps) over
 * the n rewards (population std). n >= 1. */
void pulse_sim_rl_advantages(const double *reward, uint32_t n, double *adv);

/** Per-learner buffers (sampled bytes, rows, rewards) for the problem's
 * group and length; the text scratch it is used with must hold group x
 * length rows. */
pulse_status pulse_sim_rl_scratch_create(const pulse_sim_text *t,
                                         pulse_sim_rl_scratch **out);
void pulse_sim_rl_scratch_free(pulse_sim_rl_scratch *r); /* NULL is fine */

/** One inner step's gradient (P floats, overwritten) at theta: samples,
 * scores and weighs batch / group prompts from *rng's stream. Returns
 * minus the mean reward of the step's samples (a loss: lower is better). */
double pulse_sim_rl_grad(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                         pulse_sim_rl_scratch *r, uint64_t *rng,
                         const float *theta, float *grad);

/** The exact expected reward of the policy theta over the held-out
 * prompts (see above); NAN when out of memory. */
double pulse_sim_rl_eval(const pulse_sim_text *t, const float *theta);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_RL_H */
