/* sim_pretrain.h - the checkpoint cache of text SFT's pretraining
 * (sim_problem.h, PULSE_SIM_PROBLEM_TEXT_SFT): pretraining is deterministic
 * in the problem's options, so its result is kept in a file named by a
 * hash of everything it depends on, and every process of a run (and every
 * later run) reads it instead of training again.
 *
 * Where: $PULSE_CACHE_DIR, else $XDG_CACHE_HOME/pulse, else
 * $HOME/.cache/pulse, else /tmp/pulse-cache. A file is trusted only
 * whole: magic, version, the key, the parameter count and a checksum of
 * the weights must match, else it is trained again and rewritten
 * (atomically: a temporary file renamed). */
#ifndef PULSE_SIM_PRETRAIN_H
#define PULSE_SIM_PRETRAIN_H

#include <stdint.h>

#include "sim_problem.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The key of a pretraining: every option it depends on and the text. */
uint64_t pulse_sim_pretrain_key(const pulse_sim_problem_opts *o, uint64_t P,
                                uint64_t text_digest);

/* Reads the checkpoint of `key` into theta (P floats) and its held-out
 * loss. @return 1 when a whole, matching file was read; 0 otherwise
 * (theta then undefined). */
int pulse_sim_pretrain_load(uint64_t key, uint64_t P, float *theta,
                            double *loss);

/* Writes it (best effort: a cache that cannot be written only costs the
 * next process the training). */
void pulse_sim_pretrain_save(uint64_t key, uint64_t P, const float *theta,
                             double loss);

#ifdef __cplusplus
}
#endif
#endif
