/* fp8.cuh - the FP8 family (fp8.cu): the reference block quantizer of
 * codec/pulse_fp8.h on device tensors, whole (pulse_cuda_fp8_quantize) and
 * step by step (pulse_cuda_fp8_track_*). Its CPU references, bit for bit,
 * are pulse_fp8_quantize_ref and pulse_fp8_track; all are loops over
 * codec/pulse_fp8_elem.h. */
#ifndef PULSE_CUDA_FP8_CUH
#define PULSE_CUDA_FP8_CUH

#include "common.cuh"
#include "pulse_fp8.h"
#include "pulse_fp8_elem.h"

/* Threads per 128 x 128 tile: two rows of 128 columns a pass, so that a
 * warp reads 64 contiguous bytes of one row. */
#define PULSE_FP8_TILE_THREADS 256u

/* Largest grid of the tile and list kernels (they stride over the rest). */
#define PULSE_FP8_GRID_MAX 65535u

/* The tiles of an FP8 tensor: 128 x 128 (the last of each dimension
 * smaller), tile_cols per row of tiles, row-major. Scale block b of tile t:
 * t itself with one scale per block, 0 with one per tensor. Travels by
 * value to the kernels. */
typedef struct {
  uint64_t rows, cols, numel;
  uint64_t tile_cols, tiles;
  uint64_t blocks; /* scales: tiles, or 1 per tensor */
  int per_tensor;
} pulse_fp8_geom;

#endif /* PULSE_CUDA_FP8_CUH */
