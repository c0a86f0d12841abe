/* fp8_impl.h - private to codec/fp8: the block grid of an FP8 tensor and
 * the passes that fp8_quant.c (whole tensors) and fp8_track.c (steps)
 * share. */
#ifndef PULSE_FP8_IMPL_H
#define PULSE_FP8_IMPL_H

#include <stdint.h>

#include "pulse_fp8.h"

/* The scale blocks of a tensor: brows x bcols each (the last of each
 * dimension smaller), grid_rows x grid_cols of them, row-major. A
 * per-tensor scale is one block of the whole tensor. */
typedef struct {
  uint64_t rows, cols;
  uint64_t brows, bcols;
  uint64_t grid_rows, grid_cols, blocks;
} fp8_grid;

/** The grid of t (checks t's scale and that rows * cols fits). */
pulse_status fp8_grid_make(const pulse_fp8_tensor *t, fp8_grid *g);

/** Block b's first row and column and its extent. */
void fp8_block_box(const fp8_grid *g, uint64_t b, uint64_t *row0, uint64_t *col0,
                   uint64_t *nrows, uint64_t *ncols);

/** The block of element `offset` (row-major). */
uint64_t fp8_block_of(const fp8_grid *g, uint64_t offset);

/** Quantizes the whole tensor: checks every value, computes every block's
 * amax (into amax, g->blocks entries, when not NULL) and scale, and only
 * then writes t->q and t->scale_inv. On an error nothing is written. */
pulse_status fp8_quantize_all(const uint16_t *bf16, const pulse_fp8_tensor *t,
                              const fp8_grid *g, int threads, uint16_t *amax);

/** Writes FP32 bits to a float without a conversion. */
void fp8_store_scale(float *at, uint32_t bits);

#endif
