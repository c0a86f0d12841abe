/* cli_files.h - whole-file reads, atomic writes and BF16 model states
 * for the command-line programs. Nothing here prints. */
#ifndef PULSE_CLI_FILES_H
#define PULSE_CLI_FILES_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_safetensors.h"

/** Reads a whole regular file into a new buffer (pulse_buffer_free). */
pulse_status pulse_cli_read_file(const char *path, pulse_buffer *out);

/* A model's tensors as BF16 state, in the model's order (storage order, or
 * shard then storage order). */
typedef struct {
  size_t count;
  pulse_tensor_info *info; /* names borrow from `model` */
  uint16_t **bits;         /* per tensor: numel BF16 values */
  uint64_t *numel;
  uint8_t *owned;          /* bits[i] is a heap copy (else a borrowed map) */
  pulse_st_model *model;
} pulse_cli_state;

/** Loads a safetensors model (file, index.json or directory) as BF16 state:
 * BF16 tensors are used in place unless `writable` (then copied), F32 ones
 * are cast by the one rounding. Other dtypes fail with PULSE_ERR_DTYPE. */
pulse_status pulse_cli_state_load(const char *path, int writable, pulse_cli_state *out);

void pulse_cli_state_free(pulse_cli_state *s);

/** Step from the model's "step" metadata, if any (1 when found). */
int pulse_cli_state_step(const pulse_cli_state *s, uint64_t *step);

/** Full digests and the state digest of a loaded state. */
pulse_status pulse_cli_state_digest(const pulse_cli_state *s, pulse_tensor_digest *per_tensor,
                                   pulse_state_digest *out);

#endif
