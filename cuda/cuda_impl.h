/* cuda_impl.h - private to cuda/: what the host orchestration in plain C
 * (patch_cuda.c) and the kernel families (*.cu) share. No CUDA types. */
#ifndef PULSE_CUDA_IMPL_H
#define PULSE_CUDA_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tiles: the unit of work of one warp in the tile kernels. A tile holds
 * 2^min(PULSE_TILE_LOG2, chunk_log2) elements of one tensor, so tiles never
 * span chunks or tensors (the last tile of a tensor may be short). */
#define PULSE_TILE_LOG2 13u

/* Workspace slots: each a device buffer that grows on demand. The public
 * primitives (detect, digests, scatter) use the first group; the patch
 * encode/apply orchestration keeps its staged changes in the second, which
 * no primitive touches, so the primitives can run in between. */
enum {
  PULSE_WS_TABLE = 0, /* device copy of the tensor table */
  PULSE_WS_TILES,     /* per-tile change counts and their scan */
  PULSE_WS_TILE_HIST, /* per-tile class counts, then prefixes within chunks */
  PULSE_WS_SCAN,      /* CUB scan scratch */
  PULSE_WS_SMALL,     /* per-tensor sums and counters, flags */
  PULSE_WS_X_POS,     /* staged changes of the patch encode/apply */
  PULSE_WS_X_OLD,
  PULSE_WS_X_NEW,
  PULSE_WS_X_CLASS,
  PULSE_WS_X_RANK,
  PULSE_WS_X_HIST,
  PULSE_WS_X_DELTA,
  PULSE_WS_SLOTS
};

/** Device buffer of at least `bytes` (at least 256) in slot `slot` of `ws`;
 * its old content is lost when it grows. */
pulse_status pulse_cuda_ws_get_(pulse_cuda_workspace *ws, unsigned slot,
                                size_t bytes, void **out_d);

/** pulse_cuda_ws_get_ for n elements of `size` bytes (PULSE_ERR_OVERFLOW
 * when that does not fit a size_t). */
pulse_status pulse_cuda_ws_slot_(pulse_cuda_workspace *ws, unsigned slot,
                                 uint64_t n, size_t size, void **out_d);

/** PULSE_OK when built with CUDA and a device is usable, else
 * PULSE_ERR_CUDA ("no CUDA device"). */
pulse_status pulse_cuda_require_(const char *what);

/** pulse_cuda_detect in two halves, so that a caller can size its output
 * from the count: count_ runs the count, scan and (ranks non-zero) the chunk
 * class counts into chunk_hist_d (chunks * PULSE_CLASS_COUNT entries), and
 * synchronizes; write_ must follow with the same ws, table, chunk_log2 and
 * ranks, and writes the changes (and the rank form when ranks). Arguments
 * are checked by the public entry (and pulse_cuda_detect_check_). */
pulse_status pulse_cuda_detect_check_(const pulse_cuda_detect_tensor *table,
                                      size_t count, uint32_t chunk_log2);
pulse_status pulse_cuda_detect_count_(pulse_cuda_workspace *ws,
                                      const pulse_cuda_detect_tensor *table,
                                      size_t count, uint32_t chunk_log2,
                                      int ranks, uint32_t *chunk_hist_d,
                                      uint64_t *tensor_changes, uint64_t *total,
                                      void *stream);
pulse_status pulse_cuda_detect_write_(pulse_cuda_workspace *ws,
                                      const pulse_cuda_detect_tensor *table,
                                      size_t count, uint32_t chunk_log2,
                                      int ranks, const pulse_cuda_changes *out,
                                      int update_snapshot, void *stream);

/** For each entry j of a change list (laid out as for pulse_cuda_scatter):
 * old_d[j] = the tensor's bits at pos_d[j], new_d[j] = old + delta_d[j]
 * (pulse_bf16_undelta). Reads the tensors, writes none. Synchronizes.
 * @return PULSE_ERR_POSITION when a position is at or past its tensor's
 * numel. */
pulse_status pulse_cuda_gather_(pulse_cuda_workspace *ws,
                                const pulse_cuda_bf16_tensor *table,
                                size_t count, const uint64_t *tensor_first,
                                const uint64_t *pos_d, const uint16_t *delta_d,
                                uint16_t *old_d, uint16_t *new_d, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CUDA_IMPL_H */
