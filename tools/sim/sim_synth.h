/* sim_synth.h - a synthetic RL fine-tuning trajectory: FP32 master weights
 * of a transformer-shaped tensor table, moved by Adam on synthetic gradients,
 * with the BF16 view that a trainer would publish after each step.
 *
 * What it imitates (so that change densities and their structure look like a
 * real trajectory at RL learning rates):
 * - a tensor table like a GPT: token and position embeddings, per layer
 *   layernorms, attention qkv/out and MLP up/down with biases, a final
 *   layernorm and an untied head; width and depth grow with the requested
 *   parameter count, the vocabulary fills the rest;
 * - a "pretrained" state: matrices N(0, (0.02*scale)^2) with a per-tensor
 *   scale, layernorm weights 1 +- 0.01, biases near 0, token embeddings
 *   N(0, 1) (PyTorch's nn.Embedding init, the large-magnitude tensors);
 * - a fresh Adam optimizer (beta1 0.9, beta2 0.999, eps 1e-8, PyTorch's
 *   update order, FP32 state), optional decoupled weight decay (AdamW);
 * - gradients g = gscale_t * (snr_t * d_i + noise_i): a per-parameter
 *   direction d_i that drifts slowly (AR(1), correlation 0.95 per step, so
 *   momentum matters and the first steps move more than later ones) plus
 *   heavy-tailed noise (a scale mixture of normals); gscale_t and snr_t are
 *   drawn per tensor.
 *
 * Deterministic: the same options give the same bits on one machine, whatever
 * the thread count (each block of parameters draws from its own xoshiro256**
 * stream keyed by seed, step, tensor and block). Normals come from Box-Muller
 * in double precision, so other libm versions may differ in the last bits.
 *
 * Memory: about 18 bytes per parameter (master, m, v, direction, BF16).
 * A pulse_synth is not thread-safe; use one per thread. */
#ifndef PULSE_SIM_SYNTH_H
#define PULSE_SIM_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Options; start from pulse_synth_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_SYNTH_OPTS_VERSION */
  uint64_t params; /* requested parameter count (>= PULSE_SYNTH_MIN_PARAMS);
                      the table holds within 2*width of it */
  uint64_t seed;
  double lr;           /* Adam learning rate */
  double beta1, beta2; /* Adam moment decays */
  double eps;          /* Adam epsilon */
  double weight_decay; /* decoupled (AdamW); 0 = plain Adam */
  int threads; /* worker threads for create and step; 0 = one per core */
} pulse_synth_opts;

#define PULSE_SYNTH_OPTS_VERSION 1u
#define PULSE_SYNTH_MIN_PARAMS 10000u
/* Sets every field of *opts to its default (struct_version included). */
void pulse_synth_opts_init(pulse_synth_opts *opts);

/* One tensor of the table. All tensors live in one flat array, in table
 * order: tensor i holds elements [offset, offset + numel). */
typedef struct {
  pulse_tensor_info info; /* info.dtype is PULSE_DTYPE_BF16 (the published
                             state); info.name is owned by the pulse_synth */
  uint64_t numel;
  uint64_t offset;
} pulse_synth_tensor;

typedef struct pulse_synth pulse_synth;

/* What a trajectory holds per parameter: the FP32 weights, Adam's two
 * moments and the gradient's direction, and the BF16 view. */
#define PULSE_SYNTH_BYTES_PER_PARAM 18u

/** Builds the tensor table and the pretrained state (step 0; the optimizer
 * has taken no step yet).
 * @return PULSE_OK and a new trajectory in *out (free with pulse_synth_free);
 *         PULSE_ERR_ARG for bad options (details logged), PULSE_ERR_NOMEM. */
pulse_status pulse_synth_create(const pulse_synth_opts *opts,
                                pulse_synth **out);

/** Releases the trajectory and every array it exposed. NULL is fine. */
void pulse_synth_free(pulse_synth *s);

/** Takes one optimizer step: new gradients, Adam update of the FP32 master,
 * and the BF16 view recast. Pointers from pulse_synth_master/bf16 stay valid
 * (the arrays are updated in place).
 * @return PULSE_OK, or PULSE_ERR_NOMEM when threads cannot start. */
pulse_status pulse_synth_step(pulse_synth *s);

/** Optimizer steps taken so far (0 after create). */
uint64_t pulse_synth_step_index(const pulse_synth *s);

/** Total parameter count of the table (close to opts.params). */
uint64_t pulse_synth_param_count(const pulse_synth *s);

/** Number of tensors in the table. */
size_t pulse_synth_tensor_count(const pulse_synth *s);

/** Tensor i (0 <= i < count), borrowed from `s`; NULL when out of range. */
const pulse_synth_tensor *pulse_synth_tensor_get(const pulse_synth *s,
                                                 size_t i);

/** The FP32 master weights, all tensors in table order (param_count
 * elements), borrowed from `s` and updated by each step. */
const float *pulse_synth_master(const pulse_synth *s);

/** The BF16 bits of the master weights under the project's one rounding
 * (pulse_bf16_cast_f32, i.e. pulse_bf16_from_f32_bits), same layout, borrowed
 * and updated likewise. */
const uint16_t *pulse_synth_bf16(const pulse_synth *s);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_SYNTH_H */
