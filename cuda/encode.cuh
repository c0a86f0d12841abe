/* encode.cuh - the tile passes of change detection, shared with the class
 * index of apply.cu (which runs the same counting over a receiver's base). */
#ifndef PULSE_CUDA_ENCODE_CUH
#define PULSE_CUDA_ENCODE_CUH

#include "common.cuh"

/* Per tile of `tab`: its change count into tile_changes[tile] (when not
 * NULL; tensors without current values never change) and its class counts
 * into tile_hist[tile * PULSE_CLASS_COUNT + class] (when not NULL). One warp
 * per tile; queues the launch on `stream`. */
pulse_status pulse_launch_tally(const pulse_dev_table &tab, uint32_t *tile_hist,
                                uint64_t *tile_changes, cudaStream_t stream);

/* Turns tile_hist into each tile's class counts before it within its chunk
 * (exclusive prefix over the chunk's tiles, in place) and writes every
 * chunk's totals to chunk_hist[chunk * PULSE_CLASS_COUNT + class]. */
pulse_status pulse_launch_chunk_prefix(const pulse_dev_table &tab,
                                       uint32_t *tile_hist,
                                       uint32_t *chunk_hist,
                                       cudaStream_t stream);

#endif /* PULSE_CUDA_ENCODE_CUH */
