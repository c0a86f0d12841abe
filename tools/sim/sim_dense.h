/* sim_dense.h - the messages of the dense baselines that `pulse-bench
 * loco` runs beside PULSELoCo (DDP's gradients, DiLoCo's pseudo-gradients):
 * all P values of a vector, FP32 or BF16, behind a small header. They are
 * encoded, sent over HTTP and decoded like PULSELoCo's payloads
 * (docs/formats/loco-payload.md), so the bench counts their bytes instead of computing
 * them. A bench format, not one of any pulse library.
 *
 * Layout, little-endian, exactly PULSE_SIM_DENSE_HEADER + P * width bytes:
 *
 *   offset size field
 *   0      4    magic "PLDV"
 *   4      1    version, 1
 *   5      1    values: 0 FP32 (4 bytes each), 1 BF16 (2 bytes each: the
 *               FP32 value rounded to nearest even, pulse_bf16_from_f32_bits)
 *   6      2    reserved, 0
 *   8      4    sender id
 *   12     4    reserved, 0
 *   16     8    step (DDP: the inner step; DiLoCo: the round)
 *   24     8    samples, >= 1 (the weight of this contribution)
 *   32     8    P, 1..PULSE_SIM_DENSE_MAX_COUNT
 *   40          the P values
 *
 * Thread-safety: no shared state. */
#ifndef PULSE_SIM_DENSE_H
#define PULSE_SIM_DENSE_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PULSE_SIM_DENSE_HEADER 40u
#define PULSE_SIM_DENSE_MAX_COUNT (1ull << 36)

/* How a message carries its values. */
typedef enum {
  PULSE_SIM_DENSE_FP32 = 0,
  PULSE_SIM_DENSE_BF16 = 1
} pulse_sim_dense_values;

/* The header's fields. */
typedef struct {
  pulse_sim_dense_values values;
  uint32_t sender;
  uint64_t step;
  uint64_t samples; /* >= 1 */
  uint64_t count;   /* P */
} pulse_sim_dense_header;

/** Bytes of a message of `count` values of this kind (0 for a count of 0,
 * above PULSE_SIM_DENSE_MAX_COUNT or an unknown kind). */
size_t pulse_sim_dense_size(pulse_sim_dense_values values, uint64_t count);

/** Writes the message of h and the h->count values x (finite, also once
 * rounded to BF16 when BF16 carries them) into out, which holds
 * pulse_sim_dense_size(h->values, h->count) bytes (owned by the caller).
 * @return PULSE_OK; PULSE_ERR_ARG (a bad header field, or a value that is
 * not finite: a diverged run). */
pulse_status pulse_sim_dense_encode(const pulse_sim_dense_header *h,
                                   const float *x, uint8_t *out);

/** Decodes a message (untrusted bytes) that must be of kind want->values,
 * step want->step and count want->count: checks the magic, version,
 * reserved fields, samples >= 1, the exact size and that every value is
 * finite, and writes the count values as floats into x (BF16 widened
 * exactly) and the header into got (may be NULL). On error got is not
 * written and x holds nothing of use.
 * @return PULSE_OK; PULSE_ERR_TRUNCATED, PULSE_ERR_TRAILING (size),
 * PULSE_ERR_MAGIC, PULSE_ERR_VERSION, PULSE_ERR_CORRUPT (a field, a value),
 * PULSE_ERR_BASE_STEP (another step), PULSE_ERR_SIZE_MISMATCH (another
 * count), PULSE_ERR_DTYPE (another kind). */
pulse_status pulse_sim_dense_decode(const uint8_t *data, size_t size,
                                   const pulse_sim_dense_header *want,
                                   pulse_sim_dense_header *got, float *x);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_DENSE_H */
