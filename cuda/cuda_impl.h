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
  PULSE_WS_X_KEYS,        /* class-rank keys of a located change list */
  PULSE_WS_X_CHUNK_FIRST, /* their chunk ranges, and locate's counter */
  PULSE_WS_IDX_TABLE,     /* a class index's table, tile and chunk counts */
  PULSE_WS_IDX_TILE_HIST,
  PULSE_WS_IDX_HIST,
  PULSE_WS_SLOTS
};

/* Pinned host staging of a workspace: what goes host -> device is written
 * there, so that the copy is a DMA the host need not wait for. Each slot
 * has an event recorded after the last copy queued from it; taking the slot
 * again waits for that event, never for the whole device. */
enum {
  PULSE_PIN_TABLE = 0, /* tensor tables */
  PULSE_PIN_IDX_TABLE,
  PULSE_PIN_POS,    /* decoded positions (plain model) */
  PULSE_PIN_DELTA,  /* decoded value deltas */
  PULSE_PIN_KEYS,   /* class-rank keys (class model) */
  PULSE_PIN_CHUNKS, /* chunk ranges of the keys */
  PULSE_PIN_SLOTS
};

/* Where a call runs: the device that owns its memory, made current for the
 * call (the caller's current device is restored after), and the stream its
 * work goes on: the caller's, or that device's own non-blocking stream
 * (never the legacy NULL stream). The runtime API works in the device's
 * primary context, the one a PyTorch process uses too. */
typedef struct {
  int device;
  int previous; /* the caller's device to restore; -1: not switched */
  void *stream; /* never NULL after a successful enter */
} pulse_cuda_at;

/** Enters a call: requires a device, finds the device of ptr_d (NULL: the
 * workspace's, else the current one), checks that it is the workspace's
 * (a workspace not used yet is bound to it), makes it current and resolves
 * the stream. On failure nothing is left switched. */
pulse_status pulse_cuda_enter_(pulse_cuda_workspace *ws, const void *ptr_d,
                               void *stream, const char *what,
                               pulse_cuda_at *at);

/** Makes `device` current for a call whose device and stream are known
 * (a later step of a patch stream, a decode thread). */
pulse_status pulse_cuda_reenter_(int device, void *stream, pulse_cuda_at *at);

/** Restores the caller's device. */
void pulse_cuda_leave_(pulse_cuda_at *at);

/** PULSE_OK when ptr_d is NULL or device memory of `device`; else
 * PULSE_ERR_ARG naming what is wrong. */
pulse_status pulse_cuda_check_ptr_(const void *ptr_d, int device,
                                   const char *what);

/** The device a workspace is bound to, -1 before its first call. */
int pulse_cuda_ws_device_(const pulse_cuda_workspace *ws);

/** Pinned host buffer of at least `bytes` in slot `slot` of `ws`, once the
 * device has read what was queued from it before. Its old content is lost
 * when it grows. */
pulse_status pulse_cuda_pin_get_(pulse_cuda_workspace *ws, unsigned slot,
                                 size_t bytes, void **out);

/** Records that copies from slot `slot` were queued on `stream`. */
pulse_status pulse_cuda_pin_queued_(pulse_cuda_workspace *ws, unsigned slot,
                                    void *stream);

/** Queues a host -> device copy on `stream` of `device` (from any thread:
 * the device is made current for the call and restored). */
pulse_status pulse_cuda_h2d_(int device, void *dst_d, const void *src,
                             size_t bytes, void *stream);

/** Device buffer of at least `bytes` (at least 256) in slot `slot` of `ws`;
 * its old content is lost when it grows. */
pulse_status pulse_cuda_ws_get_(pulse_cuda_workspace *ws, unsigned slot,
                                size_t bytes, void **out_d);

/** pulse_cuda_ws_get_ for n elements of `size` bytes (PULSE_ERR_OVERFLOW
 * when that does not fit a size_t). */
pulse_status pulse_cuda_ws_slot_(pulse_cuda_workspace *ws, unsigned slot,
                                 uint64_t n, size_t size, void **out_d);

/** PULSE_OK when built with CUDA and a device is usable, else
 * PULSE_ERR_CUDA ("no CUDA device"). Callers that run device work then use
 * pulse_cuda_enter_. */
pulse_status pulse_cuda_require_(const char *what);

/** pulse_cuda_detect in two halves, so that a caller can size its output
 * from the count: count_ runs the count, scan and (ranks non-zero) the chunk
 * class counts into chunk_hist_d (chunks * PULSE_CLASS_COUNT entries), and
 * synchronizes; write_ must follow with the same ws, table, chunk_log2 and
 * ranks, and writes the changes (and the rank form when ranks). Arguments
 * are checked by the public entry (and pulse_cuda_detect_check_). */
pulse_status pulse_cuda_detect_check_(const pulse_cuda_detect_tensor *table,
                                      size_t count, uint32_t chunk_log2);
/* Every tensor of a detection table on `device` (PULSE_ERR_ARG). */
pulse_status pulse_cuda_detect_check_device_(
    const pulse_cuda_detect_tensor *table, size_t count, int device);
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

/* The primitives of pulse_cuda.h without their entry work (argument and
 * pointer checks, device and stream resolution, temporary workspace): for
 * the orchestration in patch_cuda*.c, inside a call already entered on the
 * workspace's device with a resolved stream. */
pulse_status pulse_cuda_digest_in_(pulse_cuda_workspace *ws,
                                   const pulse_cuda_bf16_tensor *table,
                                   size_t count, pulse_tensor_digest *digests,
                                   void *stream);
pulse_status pulse_cuda_changes_digest_in_(pulse_cuda_workspace *ws,
                                           const uint64_t *tensor_first,
                                           size_t count, const uint64_t *pos_d,
                                           const uint16_t *old_d,
                                           const uint16_t *new_d,
                                           pulse_tensor_digest *moves,
                                           void *stream);
pulse_status pulse_cuda_scatter_in_(pulse_cuda_workspace *ws,
                                    const pulse_cuda_bf16_tensor *table,
                                    size_t count, const uint64_t *tensor_first,
                                    const uint64_t *pos_d,
                                    const uint16_t *new_d, void *stream);

/** Between pulse_cuda_patch_stream_finish (successful) and _commit: the
 * device change list of patch tensor `tensor` (its index in the patch's
 * table), for work that must see the step before the scatter writes it
 * (an FP8 target's stage, inference_side/apply/sub_fp8.c): *pos_d gets
 * the positions within the tensor, *new_d the new bits, *count their
 * number (0 and NULL arrays for a tensor the patch does not change or
 * that is not a target). The arrays belong to the stream's workspace and
 * stay unchanged until the stream is freed or the workspace used again;
 * work queued on the stream's stream before the commit reads them in
 * order. @return PULSE_OK; PULSE_ERR_ARG (NULL, not finished, a tensor
 * outside the table). */
pulse_status pulse_cuda_patch_stream_changes_(const pulse_cuda_patch_stream *s, size_t tensor,
                                              const uint64_t **pos_d, const uint16_t **new_d,
                                              uint64_t *count);

/** Queues on `stream` (NULL: pulse's own stream of the arrays' device):
 * out_pos_d[i] = pos_d[i] + base and out_new_d[i] = new_d[i] for i <
 * count (device arrays on one device; asynchronous). A tensor's change
 * list moved into a larger tensor that holds it at element `base`
 * (shift.cu). @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_CUDA. */
pulse_status pulse_cuda_changes_shift_(const uint64_t *pos_d, const uint16_t *new_d,
                                       uint64_t count, uint64_t base, uint64_t *out_pos_d,
                                       uint16_t *out_new_d, void *stream);

/** A class index whose device state lives in `ws` (its IDX slots), which
 * it borrows: freeing it frees no device memory. */
pulse_status pulse_cuda_class_index_build_in_(
    pulse_cuda_workspace *ws, const pulse_cuda_bf16_tensor *table, size_t count,
    uint32_t chunk_log2, void *stream, pulse_cuda_class_index **out);

/** Checks the class-rank entries of chunks [g0, g1) of an index (chunk g's
 * entries chunk_first[g] .. chunk_first[g + 1] - 1 of cls and rank) and
 * writes their keys (class << 32 | rank) to keys[j] (host). The same checks
 * and errors as pulse_cuda_locate; any thread. */
pulse_status pulse_cuda_locate_keys_(const pulse_cuda_class_index *idx,
                                     uint64_t g0, uint64_t g1,
                                     const uint64_t *chunk_first,
                                     const uint8_t *cls, const uint32_t *rank,
                                     uint64_t *keys);

/** Locate from keys and chunk ranges already on the device (chunk_first_d:
 * the index's chunks + 1 entries; entries keys in all): pos_d[j] gets entry
 * j's position. Synchronizes; PULSE_ERR_INTERNAL when not every entry was
 * found (the keys were checked before). */
pulse_status pulse_cuda_locate_in_(pulse_cuda_class_index *idx,
                                   const uint64_t *chunk_first_d,
                                   const uint64_t *keys_d, uint64_t entries,
                                   uint64_t *pos_d, void *stream);

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
