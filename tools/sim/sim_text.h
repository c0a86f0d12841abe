/* sim_text.h - the text problem behind sim_problem.h
 * (PULSE_SIM_PROBLEM_TEXT): next-character prediction on real text that
 * every Debian system ships, so that loss figures mean something.
 *
 * Data: the licence texts of base-files (Essential: yes, so present on every
 * Debian system; PULSE_SIM_TEXT_FILES, read in that order and concatenated),
 * or one file the caller names. The text is cut into blocks of
 * PULSE_SIM_TEXT_BLOCK bytes; a tenth of them, chosen by the seed, is held
 * out: the loss is the mean cross-entropy (nats per character) of
 * test_count held-out positions, also chosen by the seed. A trainer draws
 * its mini-batches from the other blocks with its own stream (seed,
 * trainer id).
 *
 * Model (V = 256 byte values, k = context, d = embed, H = hidden):
 *   x = [E[c_1], ..., E[c_k]]         embedding of the k previous bytes
 *   h = ReLU(b1 + W1^T x / sqrt(k d))  hidden layer
 *   logits = b2 + W2^T h / sqrt(H)     softmax over the next byte
 * with E[V][d], W1[k d][H], b1[H], W2[H][V], b2[V] in that order in theta;
 * E, W1 and W2 start ~ N(0, init_scale^2), the biases at 0. That folds
 * the layers' scale into the forward (weights O(1)); the standard
 * parametrization of LLMs keeps it in the weights (pulse_sim_text_unfold:
 * the same model with multipliers 1 and W1, W2 that much smaller).
 *
 * Text SFT and text RL (sim_rl.h) start from a pretrained checkpoint
 * and learn from a fine-tuning part of the text (pulse_sim_text_set_phase).
 *
 * Every loop is either an axpy over a contiguous row or a dot product
 * with 8 fixed lanes, so the compiler vectorizes them without reordering
 * any sum: the bits do not depend on the machine (sim_problem.c).
 * Internal to tools/: sim_problem.c and sim_rl.c are its users. */
#ifndef PULSE_SIM_TEXT_H
#define PULSE_SIM_TEXT_H

#include <stdint.h>

#include "pulse_status.h"
#include "sim_problem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The default text: base-files' licences, in this order. */
#define PULSE_SIM_TEXT_DIR "/usr/share/common-licenses/"
#define PULSE_SIM_TEXT_FILES                                                    \
  "GPL-3", "GPL-2", "GFDL-1.3", "MPL-2.0", "MPL-1.1", "Apache-2.0",            \
      "Artistic", "CC0-1.0"
#define PULSE_SIM_TEXT_BLOCK 512u /* bytes per split block */

typedef struct pulse_sim_text pulse_sim_text;
typedef struct pulse_sim_text_scratch pulse_sim_text_scratch;

/** Reads the text (opts->text_path, or the default files), splits it and
 * draws the held-out positions. A missing or unreadable file is
 * PULSE_ERR_NOT_FOUND or PULSE_ERR_IO with the path in the detail. */
pulse_status pulse_sim_text_create(const pulse_sim_problem_opts *opts,
                                  pulse_sim_text **out);
void pulse_sim_text_free(pulse_sim_text *t); /* NULL is fine */

uint64_t pulse_sim_text_param_count(const pulse_sim_text *t);

/** Which training blocks the learners draw from: 0 all of them (the text
 * problem) or, for text SFT and RL, the pretraining part; 1 the
 * fine-tuning part (a third of the blocks that are not held out, chosen by
 * the seed; only for PULSE_SIM_PROBLEM_TEXT_SFT and _RL, which split
 * them alike). The held-out set is
 * the same in both. Not while learners draw. */
void pulse_sim_text_set_phase(pulse_sim_text *t, int tune);

/** Hidden width H of the smallest model of at least `params` parameters. */
uint32_t pulse_sim_text_hidden_for(const pulse_sim_problem_opts *opts,
                                  uint64_t params);

/** The standard parametrization (PULSE_SIM_PARAM_STANDARD): moves the
 * forward's 1/sqrt(fan-in) multipliers into the weights, W1 *= 1/sqrt(k
 * d) and W2 *= 1/sqrt(H) in theta (NULL: none to convert), and sets them
 * to 1, so the model computes the same function (up to FP32 rounding) from
 * weights of LLM-like size, and pulse_sim_text_init draws its start that
 * much smaller. Once; later calls do nothing. Not while learners draw. */
void pulse_sim_text_unfold(pulse_sim_text *t, float *theta);

/** Bytes of text read, and a digest of them (to compare machines). */
uint64_t pulse_sim_text_bytes(const pulse_sim_text *t);
uint64_t pulse_sim_text_digest(const pulse_sim_text *t);

void pulse_sim_text_init(const pulse_sim_text *t, float *theta);

/** Held-out cross-entropy (nats per character) and top-1 accuracy. */
void pulse_sim_text_eval(const pulse_sim_text *t, const float *theta,
                        double *loss, double *accuracy);

/** Per-learner buffers for `rows` rows (the batch; text RL: a group's
 * samples times their length). */
pulse_status pulse_sim_text_scratch_create(const pulse_sim_text *t,
                                          uint32_t rows,
                                          pulse_sim_text_scratch **out);
void pulse_sim_text_scratch_free(pulse_sim_text_scratch *s); /* NULL is fine */

/** Gradient (P floats) of the mean loss over the next mini-batch drawn
 * from *rng's stream; returns that loss. */
double pulse_sim_text_grad(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                          uint64_t *rng, const float *theta, float *grad);

/* Rows, for the problems built on the model (text RL, sim_rl.h): a row
 * predicts one byte from the k bytes at ctx[row] (anywhere: in the text or
 * in a sample). */

/** The problem's options, its context k and its text (borrowed: they live
 * as long as t). */
const pulse_sim_problem_opts *pulse_sim_text_opts(const pulse_sim_text *t);
uint32_t pulse_sim_text_context(const pulse_sim_text *t);
const uint8_t *pulse_sim_text_data(const pulse_sim_text *t);

/** Text RL's prompts (positions of a continuation's first byte, which with
 * the rest of the continuation lies in one block): the fine-tuning part's
 * (held_out 0) or test_count held-out ones (1). *n = 0 and NULL for the
 * other problems. */
const uint32_t *pulse_sim_text_rl_prompts(const pulse_sim_text *t,
                                         int held_out, uint64_t *n);

/** Forward of n rows (ctx[0..n)) into the scratch's rows [first, first +
 * n), first + n <= its rows; returns their logits (n x 256, in s, valid
 * until the rows are used again). */
float *pulse_sim_text_forward(const pulse_sim_text *t,
                              pulse_sim_text_scratch *s, const float *theta,
                              const uint8_t *const *ctx, uint32_t first,
                              uint32_t n);

/** Adds to grad the gradient of sum_b w[b] * -log p(y[b] | ctx[b]) over
 * the scratch's rows [0, n), forwarded at theta from the same ctx (their
 * logits are used up). Rows of weight 0 are skipped. Returns the sum of
 * -log p(y[b] | ctx[b]) over the rows not skipped. */
double pulse_sim_text_backward(const pulse_sim_text *t,
                              pulse_sim_text_scratch *s, const float *theta,
                              const uint8_t *const *ctx, const uint8_t *y,
                              const float *w, uint32_t n, float *grad);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_TEXT_H */
