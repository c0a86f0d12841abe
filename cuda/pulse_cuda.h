/* pulse_cuda.h - CUDA entry points, callable from C. Never includes CUDA
 * headers: streams travel as void * (a cudaStream_t) and device pointers end
 * in _d.
 *
 * Devices: every call runs on the device that owns the memory it is given
 * (cudaPointerGetAttributes), makes it current for the call and restores
 * the caller's current device before returning; all the memory of one call
 * must be on one device (else PULSE_ERR_ARG). pulse uses the CUDA runtime
 * API only, hence each device's primary context: the one PyTorch and other
 * runtime users in the process share. Several devices in one process (one
 * per tensor-parallel rank) work side by side, each with its own workspace:
 * a workspace is bound to the device of its first call.
 *
 * Streams: all device work of a call goes on the stream it is given. NULL
 * means pulse's own stream for that device (one per device, made on first
 * use, non-blocking: it neither waits for nor holds up the legacy NULL
 * stream, so order work queued elsewhere before the call, e.g. pass
 * torch.cuda.current_stream().cuda_stream). pulse never queues work on the
 * legacy NULL stream and never synchronizes a whole device in steady state.
 *
 * Builds: with CUDA (nvcc found, PULSE_CUDA=AUTO/ON) every function below
 * runs its kernels; with no usable device it returns PULSE_ERR_CUDA ("no
 * CUDA device") after checking its arguments. Without CUDA (PULSE_CUDA=OFF)
 * every function that needs a device returns PULSE_ERR_NOT_BUILT; the CPU
 * references (pulse_loco_gate_ref) work in both builds.
 *
 * Results are bit-identical to the CPU reference in codec/: kernels call the
 * same PULSE_HD element functions (pulse_elem.h, pulse_loco_elem.h,
 * pulse_fp8_elem.h).
 *
 * Errors: a pulse_status, details in pulse_error_detail(). Nothing aborts the
 * process or prints. Synchronization: a function that returns sizes, digests
 * or a status computed on the device synchronizes `stream` before returning
 * (each says so); the work it queued is then complete.
 *
 * Thread-safety: functions are reentrant; a workspace or class index is used
 * by one thread at a time. */
#ifndef PULSE_CUDA_H
#define PULSE_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_fp8.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------ the device */

/** Non-zero when pulse was built with CUDA and at least one device is usable
 * now. Cheap after the first call. */
int pulse_cuda_available(void);

/** Why pulse_cuda_available() is 0 ("no CUDA device", "not built with
 * CUDA", ...), or "" when a device is available. Static storage. */
const char *pulse_cuda_unavailable_reason(void);

/** Number of usable devices (0 without CUDA or without a device). */
int pulse_cuda_device_count(void);

/** The device that owns device (or managed) memory ptr_d.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, or not CUDA device memory);
 * PULSE_ERR_CUDA; PULSE_ERR_NOT_BUILT. */
pulse_status pulse_cuda_device_of(const void *ptr_d, int *device);

/** cudaSetDevice / cudaGetDevice for callers without CUDA headers (the
 * calling thread's current device: where pulse_cuda_alloc allocates). */
pulse_status pulse_cuda_set_device(int device);
pulse_status pulse_cuda_get_device(int *device);

/** A new non-blocking stream on the current device (cudaStreamCreateWithFlags
 * with cudaStreamNonBlocking) into *out; free with pulse_cuda_stream_free
 * (NULL is fine) once its work is done. */
pulse_status pulse_cuda_stream_create(void **out);
void pulse_cuda_stream_free(void *stream);

/** cudaMalloc of `bytes` on the current device (0 gives NULL and PULSE_OK)
 * into *out_d. */
pulse_status pulse_cuda_alloc(void **out_d, size_t bytes);

/** cudaFree, on the device that owns ptr_d; NULL is fine. */
void pulse_cuda_free(void *ptr_d);

/** Copies host -> device; returns when the copy is complete. */
pulse_status pulse_cuda_upload(void *dst_d, const void *src, size_t bytes,
                               void *stream);

/** Copies device -> host; returns when the copy is complete. */
pulse_status pulse_cuda_download(void *dst, const void *src_d, size_t bytes,
                                 void *stream);

/** Queues a device -> device copy on `stream` (asynchronous). */
pulse_status pulse_cuda_copy(void *dst_d, const void *src_d, size_t bytes,
                             void *stream);

/** Fills `bytes` of device memory with `byte`, asynchronously on `stream`. */
pulse_status pulse_cuda_fill(void *dst_d, int byte, size_t bytes, void *stream);

/** Waits for everything queued on `stream`; reports a pending CUDA error. */
pulse_status pulse_cuda_sync(void *stream);

/* --------------------------------------------------------------- scratch */

/* Device scratch (tile counts, scans, staged changes) and pinned host
 * staging kept between calls, so that a steady-state call allocates
 * nothing: each buffer grows on demand (with a quarter to spare) and never
 * shrinks. Bound to one device, the one its first call ran on. Every
 * function taking one accepts NULL: it then uses a temporary one (which
 * allocates and frees on every call). */
typedef struct pulse_cuda_workspace pulse_cuda_workspace;

pulse_status pulse_cuda_workspace_create(pulse_cuda_workspace **out);
void pulse_cuda_workspace_free(pulse_cuda_workspace *ws); /* NULL is fine */

/* ------------------------------------------------- encode: detect changes */

/* One tensor of the trainer's table: its current weights and the BF16
 * snapshot of the last published step (the patch's base). */
typedef struct {
  const void *cur_d;     /* numel values of cur_dtype, aligned to it */
  pulse_dtype cur_dtype; /* PULSE_DTYPE_F32 (master) or PULSE_DTYPE_BF16 */
  uint16_t *snapshot_d;  /* numel BF16 bits, 2-byte aligned */
  uint64_t numel;
} pulse_cuda_detect_tensor;

/* Where pulse_cuda_detect writes, all device arrays owned by the caller.
 * Changes are laid out as the CPU encoder lists them: tensor after tensor in
 * table order, positions increasing within each tensor. */
typedef struct {
  uint64_t capacity; /* changes each array below can hold */
  uint64_t *pos_d;   /* position within its tensor */
  uint16_t *old_d;   /* the snapshot's bits (base) */
  uint16_t *new_d;   /* pulse_bf16_from_f32_bits(cur) or the BF16 cur */
  /* The rank form of PULSE_POS_CLASS (pulse_encode_tensor): each change's
   * class (pulse_bf16_class of its old bits) and rank among the elements of
   * that class in its chunk, and the class counts of every chunk of the base
   * (chunk_hist_d[chunk * PULSE_CLASS_COUNT + class], chunks numbered across
   * the table: tensor after tensor, see pulse_cuda_chunk_count). All three
   * NULL to skip the rank form. */
  uint8_t *class_d;
  uint32_t *rank_d;
  uint32_t *chunk_hist_d;
  uint64_t chunk_capacity; /* chunks chunk_hist_d can hold */
} pulse_cuda_changes;

/* Detection options; start from pulse_cuda_detect_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_CUDA_DETECT_OPTS_VERSION */
  uint32_t chunk_log2;     /* chunk of the rank form, 10..30 */
  int update_snapshot;     /* non-zero: snapshot_d takes the new bits */
} pulse_cuda_detect_opts;

#define PULSE_CUDA_DETECT_OPTS_VERSION 1u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_cuda_detect_opts_init(pulse_cuda_detect_opts *opts);

/** Chunks of 2^chunk_log2 elements over a table (a tensor of numel elements
 * has ceil(numel / 2^chunk_log2); chunks never span tensors). Host only.
 * @return PULSE_OK, or PULSE_ERR_ARG for a NULL table or chunk_log2 outside
 * 10..30. */
pulse_status pulse_cuda_chunk_count(const pulse_cuda_detect_tensor *table,
                                    size_t count, uint32_t chunk_log2,
                                    uint64_t *chunks);

/** Change detection on the device for a whole table, bit-identical to
 * pulse_detect_ref on each tensor (and, for the rank form, to
 * pulse_chunk_classify on each chunk): a fixed number of kernel launches
 * whatever the tensor count (count, scan, chunk counts, write).
 *
 * `out` NULL is a size query: nothing is written. Otherwise, when the changes
 * exceed out->capacity the call fails with PULSE_ERR_OVERFLOW, writes no
 * change and leaves every snapshot as it was (chunk_hist_d may have been
 * written); `total` (may be NULL) receives the number of changes and
 * `tensor_changes` (may be NULL) each tensor's count, in both cases. A rank
 * form whose chunks exceed chunk_capacity fails with PULSE_ERR_OVERFLOW
 * before anything runs (total 0). Synchronizes `stream`.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL pointers, misaligned tensors, bad
 * options, a dtype other than F32/BF16 -> PULSE_ERR_DTYPE); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM (scratch); PULSE_ERR_CUDA. */
pulse_status pulse_cuda_detect(pulse_cuda_workspace *ws,
                               const pulse_cuda_detect_tensor *table,
                               size_t count, const pulse_cuda_detect_opts *opts,
                               const pulse_cuda_changes *out,
                               uint64_t *tensor_changes, uint64_t *total,
                               void *stream);

/* ------------------------------------------- apply: digests and scatter */

/* A BF16 tensor in device memory. */
typedef struct {
  uint16_t *data_d; /* numel BF16 bits, 2-byte aligned */
  uint64_t numel;
} pulse_cuda_bf16_tensor;

/** The additive digest (docs/formats/patch.md) of every tensor of a table, equal to
 * pulse_digest_bf16 on each, into digests[count] (host). One launch for the
 * table; no weights leave the device. Synchronizes `stream`. */
pulse_status pulse_cuda_digest(pulse_cuda_workspace *ws,
                               const pulse_cuda_bf16_tensor *table,
                               size_t count, pulse_tensor_digest *digests,
                               void *stream);

/** How a change list moves each tensor's digest: moves[t] (host, count
 * entries) gets, lane by lane modulo 2^64, the sum over tensor t's changes of
 * lane(pos << 16 | new) - lane(pos << 16 | old); a digest after the changes is
 * the digest before plus this (pulse_digest_apply_changes gives the same).
 * Tensor t's changes are entries tensor_first[t] .. tensor_first[t + 1] - 1
 * (host array of count + 1, non-decreasing, from 0) of the device arrays.
 * Synchronizes `stream`. */
pulse_status pulse_cuda_changes_digest(
    pulse_cuda_workspace *ws, const uint64_t *tensor_first, size_t count,
    const uint64_t *pos_d, const uint16_t *old_d, const uint16_t *new_d,
    pulse_tensor_digest *moves, void *stream);

/** Writes new_d[j] at position pos_d[j] of its tensor (entries laid out as
 * for pulse_cuda_changes_digest) with one launch. Positions must be distinct
 * within a tensor. An entry at or past its tensor's numel is skipped and
 * reported as PULSE_ERR_POSITION after the others were written (the patch
 * apply checks positions before it scatters). Synchronizes `stream`. */
pulse_status pulse_cuda_scatter(pulse_cuda_workspace *ws,
                                const pulse_cuda_bf16_tensor *table,
                                size_t count, const uint64_t *tensor_first,
                                const uint64_t *pos_d, const uint16_t *new_d,
                                void *stream);

/* ------------------------------------ apply: class-rank positions -> positions
 */

/* The class counts of a device base, per chunk and per tile, that decoding
 * a PULSE_POS_CLASS patch needs (docs/formats/patch.md, "Position classes"). Valid while
 * the base tensors keep their bits. */
typedef struct pulse_cuda_class_index pulse_cuda_class_index;

/** Counts the classes of every chunk of a table of device tensors (the
 * receiver's base). Synchronizes `stream`. The table is copied; the tensors
 * are borrowed and must outlive the index unchanged. */
pulse_status pulse_cuda_class_index_build(const pulse_cuda_bf16_tensor *table,
                                          size_t count, uint32_t chunk_log2,
                                          void *stream,
                                          pulse_cuda_class_index **out);

void pulse_cuda_class_index_free(
    pulse_cuda_class_index *idx); /* NULL is fine */

/** The class counts of every chunk (host memory owned by the index:
 * hist[chunk * PULSE_CLASS_COUNT + class], chunks tensor after tensor), equal
 * to pulse_chunk_classify on each chunk; *chunks gets their number. */
const uint32_t *pulse_cuda_class_index_hist(const pulse_cuda_class_index *idx,
                                            uint64_t *chunks);

/** Turns class-rank entries back into positions (what pulse_chunk_locate does
 * on the host). Chunk g's entries are entries chunk_first[g] ..
 * chunk_first[g + 1] - 1 (host array of chunks + 1, non-decreasing, from 0),
 * each a class cls[j] and a rank rank[j] (host arrays), in the order
 * pulse_chunk_decode_ranks gives them: increasing class, then increasing
 * rank; every rank below its class count. pos_d[j] (device) receives entry
 * j's position within its tensor. The entries are checked on the host first.
 * Synchronizes `stream`.
 * @return PULSE_OK; PULSE_ERR_POSITION for entries out of order or past
 * their class; PULSE_ERR_CUDA; PULSE_ERR_NOMEM. */
pulse_status pulse_cuda_locate(pulse_cuda_class_index *idx,
                               const uint64_t *chunk_first, const uint8_t *cls,
                               const uint32_t *rank, uint64_t *pos_d,
                               void *stream);

/* ---------------------------------------------- patches from/to the device */

/* One tensor given to pulse_cuda_patch_encode. */
typedef struct {
  pulse_tensor_info info; /* name, dtype PULSE_DTYPE_BF16 (the state), shape */
  const void *cur_d; /* numel(shape) values of cur_dtype: the step's weights */
  pulse_dtype cur_dtype; /* PULSE_DTYPE_F32 or PULSE_DTYPE_BF16 */
  uint16_t *snapshot_d;  /* numel BF16 bits: the base (last published step) */
  /* The snapshot's digest when known; NULL computes it on the device. */
  const pulse_tensor_digest *base_digest;
} pulse_cuda_encode_tensor;

/** pulse_patch_encode for weights in device memory: detects the changes on
 * the device (one pass for the whole table), brings only the change lists,
 * their rank form and the chunk class counts to the host, and codes them.
 * The bytes equal those of pulse_patch_encode on host copies of the same
 * snapshots and changes. When the patch is made and `update_snapshot` is
 * non-zero, each snapshot then takes the new bits (on failure no snapshot
 * changes). `target_digests` (host, count entries; may be NULL) receives the
 * tensors' digests after the step. Synchronizes `stream`.
 * @return what pulse_patch_encode returns, PULSE_ERR_CUDA, PULSE_ERR_NOMEM. */
pulse_status pulse_cuda_patch_encode(pulse_cuda_workspace *ws,
                                     const pulse_encode_opts *opts,
                                     const pulse_cuda_encode_tensor *tensors,
                                     size_t count, int update_snapshot,
                                     void *stream, pulse_buffer *out,
                                     pulse_tensor_digest *target_digests);

/* A BF16 tensor in device memory that pulse_cuda_patch_apply may modify. */
typedef struct {
  const char *name;
  uint16_t *data_d;
  uint64_t numel;
  /* In: the tensor's current digest when known (skips a full pass over it on
   * the device); NULL computes it. */
  const pulse_tensor_digest *digest;
} pulse_cuda_target;

/** pulse_patch_apply for device tensors, with the same checks and the same
 * transaction: base digests (and the base state digest unless
 * opts->partial_table), every chunk decoded (the class model against class
 * counts taken on the device), positions found and old bits gathered on the
 * device, the target digests checked, and only then the new bits scattered.
 * On any error no target is written. `digests` (host, count entries, in
 * targets order; may be NULL) receives each target's digest after the call
 * (the base digest for targets the patch does not change). Synchronizes
 * `stream`.
 * @return what pulse_patch_apply returns, PULSE_ERR_CUDA, PULSE_ERR_NOMEM. */
pulse_status pulse_cuda_patch_apply(pulse_cuda_workspace *ws,
                                    const pulse_patch *patch,
                                    const pulse_cuda_target *targets,
                                    size_t count, const pulse_apply_opts *opts,
                                    void *stream, pulse_tensor_digest *digests);

/* pulse_cuda_patch_apply while the patch's bytes arrive, as
 * pulse_patch_stream_* (pulse_codec_stream.h) does for host tensors: the
 * patch is opened over a buffer of the object's full size once its header
 * and table are there; begin checks the targets and their base digests and
 * takes the class counts on the device; each chunk's streams are decoded on
 * the host (opts->threads threads) once feed says its bytes are there, into
 * the workspace's pinned staging, and the copy of its entries to the device
 * is queued at once (so the bus works while the rest downloads);
 * finish (every byte fed, the object verified by the caller) finds the
 * positions, gathers the old bits and checks the target digests on the
 * device; commit scatters the new bits. Bytes decoded early are untrusted:
 * they only reach host and device staging, never a target. The patch, its
 * bytes, the targets array and the device tensors must outlive the stream,
 * and the targets must not change until it is committed or freed. */
typedef struct pulse_cuda_patch_stream pulse_cuda_patch_stream;

/** @return PULSE_OK and *out (free with pulse_cuda_patch_stream_free); the
 * errors of pulse_cuda_patch_apply's checks, nothing started. */
pulse_status pulse_cuda_patch_stream_begin(pulse_cuda_workspace *ws,
                                           const pulse_patch *patch,
                                           const pulse_cuda_target *targets,
                                           size_t count,
                                           const pulse_apply_opts *opts,
                                           void *stream,
                                           pulse_cuda_patch_stream **out);

/** Bytes [0, avail) of the patch's buffer are final (only grows). Cheap;
 * any one thread at a time. */
void pulse_cuda_patch_stream_feed(pulse_cuda_patch_stream *s, size_t avail);

/** Waits for the decodes and does the device half of the checks; nothing
 * is written. @return PULSE_OK: ready to commit; PULSE_ERR_TRUNCATED (not
 * every byte fed: may be called again later); a chunk's decode error;
 * PULSE_ERR_POSITION, PULSE_ERR_TARGET_DIGEST, PULSE_ERR_CUDA. After any
 * other error the stream can only be freed. */
pulse_status pulse_cuda_patch_stream_finish(pulse_cuda_patch_stream *s);

/** Scatters the new bits (after a successful finish). `digests` as for
 * pulse_cuda_patch_apply. @return PULSE_OK; PULSE_ERR_CUDA (a device
 * failure: the targets' contents are then unknown); PULSE_ERR_ARG before a
 * successful finish. */
pulse_status pulse_cuda_patch_stream_commit(pulse_cuda_patch_stream *s,
                                            pulse_tensor_digest *digests);

/** Stops the decode threads and frees the stream. NULL is fine. */
void pulse_cuda_patch_stream_free(pulse_cuda_patch_stream *s);

/* ------------------------------------------------ PULSELoCo gate (docs/design.md)
 */

/** CPU reference of the LoCo gate over n FP32 elements (a plain loop over
 * pulse_loco_elem.h): s = e + (theta_g - theta_r); where bf16(theta_g) !=
 * bf16(theta_g - s) the element is sent, (pos, s) appended in increasing
 * position to pos/value, and e becomes 0; elsewhere e becomes s. When more
 * than `capacity` elements would be sent it fails with PULSE_ERR_OVERFLOW
 * and leaves e unchanged; `sent` (may be NULL) receives the count in both
 * cases. pos and value may be NULL when capacity is 0 (then a call with
 * anything to send is a size query that changes nothing). Works in every
 * build. */
pulse_status pulse_loco_gate_ref(const float *theta_g, const float *theta_r,
                                 float *e, uint64_t n, uint64_t capacity,
                                 uint64_t *pos, float *value, uint64_t *sent);

/** The same gate on device arrays, bit-identical to pulse_loco_gate_ref
 * (same contract; pos_d and value_d are device arrays). Synchronizes
 * `stream`. */
pulse_status pulse_cuda_loco_gate(pulse_cuda_workspace *ws,
                                  const float *theta_g_d,
                                  const float *theta_r_d, float *e_d,
                                  uint64_t n, uint64_t capacity,
                                  uint64_t *pos_d, float *value_d,
                                  uint64_t *sent, void *stream);


/* -------------------------------------- FP8 targets (codec/pulse_fp8.h) */

/* An FP8 tensor in device memory, the quantization of a rows x cols BF16
 * tensor laid out as pulse_fp8_tensor: q_d rows * cols E4M3FN bytes
 * (row-major), scale_inv_d pulse_fp8_scale_count FP32 scales (4-byte
 * aligned), dequantized as q * scale_inv. */
typedef struct {
  uint64_t rows, cols;
  uint8_t *q_d;
  float *scale_inv_d;
  pulse_fp8_scale scale;
} pulse_cuda_fp8_tensor;

/** pulse_fp8_quantize_ref on the device, bit-identical to it: writes t->q_d
 * and t->scale_inv_d from bf16_d (t->rows * t->cols BF16 bits, row-major,
 * 2-byte aligned, on the device of t's arrays). Every value is checked on
 * the device first (a flag read back): nothing is written when one is NaN
 * or infinite. Scratch in `ws` (NULL: a temporary one). Synchronizes
 * `stream`.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, misaligned or foreign memory, an
 * unknown scale); PULSE_ERR_UNSUPPORTED (a NaN or infinity: the first in
 * row-major order, its row and column in the detail); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM; PULSE_ERR_CUDA; PULSE_ERR_NOT_BUILT. */
pulse_status pulse_cuda_fp8_quantize(pulse_cuda_workspace *ws,
                                     const uint16_t *bf16_d,
                                     const pulse_cuda_fp8_tensor *t,
                                     void *stream);

/* A device BF16 tensor and its FP8 quantization followed step by step, as
 * pulse_fp8_track does in host memory: each block's amax is kept on the
 * device, and a step requantizes only the blocks its changes touch (a block
 * whose scale stays gets its changed elements requantized; one whose
 * largest element went down is read again; one whose scale moves is
 * requantized whole). A step is staged before the BF16 tensor takes its
 * changes and committed after, on one stream:
 *
 *   pulse_cuda_fp8_track_stage(tr, pos_d, new_d, n, s, NULL)   checks
 *   pulse_cuda_scatter(..., pos_d, new_d, s)     the caller's BF16 writes
 *   pulse_cuda_fp8_track_commit(tr, s, NULL)    FP8 bytes, scales, amax
 *
 * A stage that fails (a NaN or infinity, a position outside the tensor)
 * writes nothing, so the caller refuses the step with the BF16 and FP8
 * tensors as they were. Readers of the FP8 tensor order their work after
 * the commit on its stream; a step on another stream than the last one's
 * is ordered after it by the caller (the track's device state is reused
 * step after step). Device memory of its own: 24 bytes per scale block and
 * 64 bytes, allocated by create (a step allocates nothing). Bound to the
 * device of its tensors; one thread at a time. */
typedef struct pulse_cuda_fp8_track pulse_cuda_fp8_track;

/** Starts following bf16_d (borrowed: the caller writes the changes it
 * stages into it, and nothing else) and its quantization t (copied; q_d and
 * scale_inv_d borrowed, written by quantizations and commits only):
 * quantizes bf16_d into t now, as pulse_cuda_fp8_quantize (the same checks;
 * nothing written on an error). Synchronizes `stream`.
 * @return PULSE_OK and *out (free with pulse_cuda_fp8_track_free); the
 * errors of pulse_cuda_fp8_quantize. */
pulse_status pulse_cuda_fp8_track_create(const uint16_t *bf16_d,
                                         const pulse_cuda_fp8_tensor *t,
                                         void *stream,
                                         pulse_cuda_fp8_track **out);

/** Frees a track and its device memory (its tensors are left as they are;
 * the caller has waited for its commits). NULL is fine. */
void pulse_cuda_fp8_track_free(pulse_cuda_fp8_track *track);

/** The caller replaced the BF16 tensor whole (an anchor): quantizes it
 * again, every block, with pulse_cuda_fp8_quantize's checks (nothing
 * written on an error); drops a staged step. Synchronizes `stream`. */
pulse_status pulse_cuda_fp8_track_requantize(pulse_cuda_fp8_track *track,
                                             void *stream);

/** First half of a step: the BF16 tensor is about to take new_d[i] at
 * element pos_d[i] (device arrays of count entries, row-major offsets,
 * each at most once, any order). On the device: checks every position and
 * every new value, and records for each block the step touches its
 * largest new magnitude and whether an element holding its amax goes
 * down. The FP8 tensor, its scales and the kept amax are not written; the
 * flag is read back (synchronizes `stream`). pos_d and new_d must stay
 * unchanged until the commit. A stage replaces a stage not committed.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, foreign memory, a position
 * outside the tensor); PULSE_ERR_UNSUPPORTED (a new value that is NaN or
 * infinite, its row and column in the detail); the lowest bad entry is the
 * one reported; PULSE_ERR_CUDA. On an error nothing is staged. */
pulse_status pulse_cuda_fp8_track_stage(pulse_cuda_fp8_track *track,
                                        const uint64_t *pos_d,
                                        const uint16_t *new_d, uint64_t count,
                                        void *stream);

/** Second half: queued on `stream` after the caller's BF16 writes of the
 * staged changes. Finds each touched block's new amax (from the kept one
 * and the changes; a block is read whole only when its largest element
 * went down) and scale, requantizes the blocks whose scale moved and the
 * changed elements of the others, and writes their scales and amax.
 * Asynchronous when `figures` is NULL; otherwise it synchronizes and
 * fills *figures as pulse_fp8_staged_figures_get does for the same step.
 * @return PULSE_OK; PULSE_ERR_ARG (nothing staged); PULSE_ERR_CUDA (the
 * FP8 tensor's contents are then unknown: requantize it). */
pulse_status pulse_cuda_fp8_track_commit(pulse_cuda_fp8_track *track,
                                         void *stream,
                                         pulse_fp8_stage_figures *figures);

/** Forgets a staged step (the BF16 writes did not happen). NULL is fine. */
void pulse_cuda_fp8_track_drop(pulse_cuda_fp8_track *track);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CUDA_H */
