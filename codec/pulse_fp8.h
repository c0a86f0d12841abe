/* pulse_fp8.h - FP8 weights kept equal to the reference block quantizer of
 * BF16 weights. Engines serve in FP8: each 2-D weight as E4M3FN values with
 * one FP32 scale per 128x128 block (or one for the tensor), dequantized as
 * q * scale. A worker that keeps the BF16 weights (its shadow, brought to
 * each step by the subscriber) keeps its FP8 weights equal, bit for bit, to
 *
 *   per block (128 x 128, the last ones of each dimension smaller; or the
 *   whole tensor): amax = max |x| over the BF16 values x as FP32 (exact);
 *   s = amax / 448 in FP32, round to nearest even (1 when amax is 0);
 *   q = the E4M3FN value nearest to x / s (the division in FP32, round to
 *   nearest even; then ties to even, saturating at +-448),
 *
 * stored as q (row-major, one byte per element) and scale_inv (the s of
 * each block, row-major over the block grid [ceil(R/128), ceil(C/128)], or
 * one float). pulse_fp8_elem.h holds the element functions (CPU and CUDA).
 * A BF16 NaN or infinity cannot be quantized: it is refused
 * (PULSE_ERR_UNSUPPORTED) and nothing is written.
 *
 * pulse_fp8_quantize_ref quantizes a whole tensor (the reference). A
 * pulse_fp8_track follows a BF16 tensor step by step: it keeps each
 * block's amax (2 bytes a block) and, for the changes of a step, stages
 * only what they move (a block whose scale stays requantizes only its
 * changed elements; a block whose largest element went down is scanned
 * again; a block whose scale moves is requantized whole), then commits, or
 * is dropped with nothing written.
 *
 * Thread-safety: reentrant; a track and its staged changes belong to one
 * thread at a time. Nothing here prints to stdout. */
#ifndef PULSE_FP8_H
#define PULSE_FP8_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Side of a scale block. */
#define PULSE_FP8_BLOCK 128u

/* How an FP8 tensor is scaled. */
typedef enum {
  PULSE_FP8_SCALE_BLOCK = 1, /* one scale per 128 x 128 block */
  PULSE_FP8_SCALE_TENSOR = 2 /* one scale for the whole tensor */
} pulse_fp8_scale;

/* An FP8 tensor in host memory, the quantization of a rows x cols BF16
 * tensor (row-major). */
typedef struct {
  uint64_t rows, cols;
  uint8_t *q;            /* rows * cols E4M3FN bytes, row-major */
  float *scale_inv;      /* pulse_fp8_scale_count floats */
  pulse_fp8_scale scale;
} pulse_fp8_tensor;

/** Number of scales of a rows x cols tensor: ceil(rows/128) *
 * ceil(cols/128) for PULSE_FP8_SCALE_BLOCK (0 for an empty tensor), 1 for
 * PULSE_FP8_SCALE_TENSOR.
 * @return PULSE_OK and *count; PULSE_ERR_ARG (NULL, unknown scale);
 * PULSE_ERR_OVERFLOW. */
pulse_status pulse_fp8_scale_count(uint64_t rows, uint64_t cols, pulse_fp8_scale scale,
                                   uint64_t *count);

/** The reference quantizer: writes t->q and t->scale_inv from `bf16`
 * (t->rows * t->cols BF16 bits, row-major), on `threads` threads (0: one
 * per core). Every value is checked first: nothing is written when one is
 * NaN or infinite.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, unknown scale);
 * PULSE_ERR_UNSUPPORTED (a NaN or infinity, its row and column in the
 * detail); PULSE_ERR_OVERFLOW. */
pulse_status pulse_fp8_quantize_ref(const uint16_t *bf16, const pulse_fp8_tensor *t,
                                    int threads);

/* A BF16 tensor and its FP8 quantization, followed step by step. */
typedef struct pulse_fp8_track pulse_fp8_track;

/** Starts following `bf16` (t->rows * t->cols elements, borrowed: the
 * caller writes the changes it stages, and nothing else, into it) and its
 * quantization t (copied; q and scale_inv borrowed, written by commits
 * only): quantizes bf16 into t now (pulse_fp8_quantize_ref) and keeps each
 * block's amax. Extra memory: 2 bytes per scale block.
 * @return PULSE_OK and *out (free with pulse_fp8_track_free); the errors of
 * pulse_fp8_quantize_ref (nothing written then); PULSE_ERR_NOMEM. */
pulse_status pulse_fp8_track_create(const uint16_t *bf16, const pulse_fp8_tensor *t,
                                    int threads, pulse_fp8_track **out);

/** Frees a track (its tensors are left as they are). NULL is fine. */
void pulse_fp8_track_free(pulse_fp8_track *track);

/** The caller replaced the BF16 tensor whole (an anchor): quantizes it
 * again, all blocks. Checks every value before writing anything.
 * @return as pulse_fp8_quantize_ref (on an error nothing is written). */
pulse_status pulse_fp8_track_requantize(pulse_fp8_track *track, int threads);

/** Whether every value of bf16[0 .. rows) x [0 .. cols) (row stride
 * `stride` elements) can be quantized: PULSE_OK, or
 * PULSE_ERR_UNSUPPORTED naming `what` and the first NaN or infinity's row
 * and column. For a caller that checks new contents before replacing a
 * tracked tensor with them. */
pulse_status pulse_fp8_check_finite(const uint16_t *bf16, uint64_t rows, uint64_t cols,
                                    uint64_t stride, const char *what);

/* What a stage did. */
typedef struct {
  uint64_t changes;        /* BF16 changes staged */
  uint64_t blocks_touched; /* scale blocks they fall in */
  uint64_t blocks_rescanned; /* of those, blocks whose largest element
                                went down: read whole for the new amax */
  uint64_t blocks_rescaled;  /* of those, blocks whose scale moved:
                                requantized whole */
  uint64_t elements_quantized; /* element quantizations staged */
} pulse_fp8_stage_figures;

/* The FP8 side of one step, staged. */
typedef struct pulse_fp8_staged pulse_fp8_staged;

/** First half of a step: the BF16 tensor is about to take new_bits[i] at
 * element offset[i] (row-major; each offset at most once, any order).
 * Checks every offset and every new value, finds the blocks they touch,
 * their new amax (from the kept amax and the changes; a block is read
 * whole only when its largest element went down) and scale, and stages
 * the new E4M3FN bytes: the changed elements of a block whose scale stays,
 * every element of a block whose scale moves. Nothing is written. Work:
 * O(count) plus O(block) per rescanned or rescaled block. Extra memory:
 * the staged bytes. The BF16 tensor must not change until commit or free.
 * @return PULSE_OK and *out (commit, then free); PULSE_ERR_ARG (NULL, an
 * offset outside the tensor); PULSE_ERR_UNSUPPORTED (a new value that is
 * NaN or infinite, its row and column in the detail); PULSE_ERR_NOMEM. */
pulse_status pulse_fp8_track_stage(pulse_fp8_track *track, const uint64_t *offset,
                                   const uint16_t *new_bits, uint64_t count,
                                   pulse_fp8_staged **out);

/** Writes the staged FP8 bytes and scales and moves the kept amax (cannot
 * fail). The caller writes the BF16 changes itself, before or after. */
void pulse_fp8_staged_commit(pulse_fp8_staged *staged);

/** What the stage did (NULL staged: zeros). */
pulse_fp8_stage_figures pulse_fp8_staged_figures_get(const pulse_fp8_staged *staged);

/** Frees staged changes, committed or not. NULL is fine. */
void pulse_fp8_staged_free(pulse_fp8_staged *staged);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_FP8_H */
