/* pulse_codec.h - change detection, state digests and the patch format.
 *
 * Thread-safety: functions are reentrant; a pulse_patch may be read from
 * several threads at once. Errors: a non-OK pulse_status, with details in
 * pulse_error_detail(). Nothing here prints to stdout. */
#ifndef PULSE_CODEC_H
#define PULSE_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ types */

/* Element types. Values are part of the patch format: never renumber. */
typedef enum {
  PULSE_DTYPE_INVALID = 0,
  PULSE_DTYPE_BF16 = 1,
  PULSE_DTYPE_F32 = 2,
  PULSE_DTYPE_F16 = 3
} pulse_dtype;

#define PULSE_MAX_DIMS 8
#define PULSE_MAX_NAME 1024 /* bytes, excluding the terminating NUL */

/** Bytes per element of a dtype, 0 for an invalid one. */
size_t pulse_dtype_size(pulse_dtype dtype);

/** "BF16", "F32", "F16" (safetensors spelling), or "?" */
const char *pulse_dtype_name(pulse_dtype dtype);

/** Product of the shape; PULSE_ERR_OVERFLOW when the product of its non-zero
 * dimensions does not fit 64 bits (even if another dimension is 0). */
pulse_status pulse_shape_numel(const uint64_t *shape, uint32_t ndim,
                               uint64_t *numel);

/* Additive 128-bit digest of one BF16 tensor (pulse_elem.h, docs/formats/patch.md). */
typedef struct {
  uint64_t a, b;
} pulse_tensor_digest;

/* SHA-256 over the tensor table and its tensor digests (docs/formats/patch.md). */
typedef struct {
  uint8_t bytes[32];
} pulse_state_digest;

/* ------------------------------------------------------------ change list */

/* Changes of one tensor: strictly increasing positions with the old and new
 * BF16 bits at each. Owned by the struct; free with pulse_changes_free. */
typedef struct {
  uint64_t count;
  uint64_t capacity;
  uint64_t *pos;
  uint16_t *old_bits;
  uint16_t *new_bits;
} pulse_changes;

#define PULSE_CHANGES_INIT {0, 0, NULL, NULL, NULL}

/** Ensures room for `capacity` changes, keeping the current ones. */
pulse_status pulse_changes_reserve(pulse_changes *c, uint64_t capacity);

/** Appends one change (positions must keep increasing; not checked here). */
pulse_status pulse_changes_push(pulse_changes *c, uint64_t pos,
                                uint16_t old_bits, uint16_t new_bits);

/** Releases the arrays and resets the struct. NULL is fine. */
void pulse_changes_free(pulse_changes *c);

/* ------------------------------------------------------- change detection */

/** Reference change detection (the specification): a plain loop over
 * pulse_elem.h. `cur` holds n elements of `cur_dtype` (PULSE_DTYPE_F32 master
 * weights, cast by the one rounding, or PULSE_DTYPE_BF16); `snapshot` holds n
 * BF16 values. Appends every i where the BF16 of cur[i] differs in bits from
 * snapshot[i] to `out` (old = snapshot, new = BF16 of cur), in increasing
 * order; when `update_snapshot` is non-zero also stores the new bits into
 * snapshot. On error `out` may hold a prefix and the snapshot is unchanged. */
pulse_status pulse_detect_ref(const void *cur, pulse_dtype cur_dtype,
                              uint16_t *snapshot, uint64_t n, int update_snapshot,
                              pulse_changes *out);

/** Fast change detection: SIMD (AVX2 when the CPU has it) over `threads`
 * threads (0 = one per core). Same contract, and bit-identical output, as
 * pulse_detect_ref. */
pulse_status pulse_detect_fast(const void *cur, pulse_dtype cur_dtype,
                               uint16_t *snapshot, uint64_t n,
                               int update_snapshot, int threads,
                               pulse_changes *out);

/** Casts n FP32 values to BF16 bits with the one rounding
 * (pulse_bf16_from_f32_bits: ties to even, every NaN -> 0x7FC0), SIMD when
 * the CPU has it. `src` and `dst` need only their natural alignment and must
 * not overlap; both may be NULL when n is 0. Single-threaded. */
void pulse_bf16_cast_f32(const float *src, uint16_t *dst, uint64_t n);

/* ---------------------------------------------------------------- digests */

/** Digest of n BF16 values (full pass). */
pulse_tensor_digest pulse_digest_bf16(const uint16_t *bits, uint64_t n);

/** Digest of a rows x cols block of a row-major tensor whose rows hold
 * full_cols elements, the block's first element at position `first` of the
 * tensor: element (r, c) is read at bits[r * stride + c] (stride >= cols:
 * the block may sit in other memory than the tensor, e.g. a
 * tensor-parallel shard) and counts at position first + r * full_cols + c.
 * The digests of blocks that tile a tensor add up (lane by lane, modulo
 * 2^64) to pulse_digest_bf16 of the tensor.
 * @return PULSE_OK and *out; PULSE_ERR_ARG (NULL, cols above stride or
 * full_cols); PULSE_ERR_OVERFLOW. */
pulse_status pulse_digest_bf16_block(const uint16_t *bits, uint64_t rows, uint64_t cols,
                                     uint64_t stride, uint64_t first, uint64_t full_cols,
                                     pulse_tensor_digest *out);

/** Updates a digest for one element whose bits change from old to new. */
void pulse_digest_replace(pulse_tensor_digest *d, uint64_t index,
                          uint16_t old_bits, uint16_t new_bits);

/** Digest after applying a change list to a tensor with digest `base`. */
pulse_tensor_digest pulse_digest_apply_changes(pulse_tensor_digest base,
                                               const pulse_changes *changes);

/* What the state digest covers of each tensor. */
typedef struct {
  const char *name;
  pulse_dtype dtype; /* dtype of the stored (BF16) state */
  uint32_t ndim;
  uint64_t shape[PULSE_MAX_DIMS];
} pulse_tensor_info;

/** State digest of a whole tensor table, in table order. */
pulse_status pulse_state_digest_compute(const pulse_tensor_info *infos,
                                        const pulse_tensor_digest *digests,
                                        size_t count, pulse_state_digest *out);

/** Lower-case hex of a state digest into `hex` (65 bytes with the NUL). */
void pulse_state_digest_hex(const pulse_state_digest *d, char hex[65]);

/* ----------------------------------------------------------- patch format */

/* Format versions this library writes and reads (docs/formats/patch.md):
 * PULSE_PATCH_VERSION_MIN..PULSE_PATCH_VERSION_MAX. Version 2 (the default,
 * PULSE_PATCH_VERSION) decodes several times faster than version 1 at about
 * the same size; version 3 codes values against a value model per patch
 * and is about 4-5% smaller than version 2; 1 and 3 are written on request
 * (pulse_encode_opts.format_version). */
#define PULSE_PATCH_VERSION 2
#define PULSE_PATCH_VERSION_MIN 1
#define PULSE_PATCH_VERSION_MAX 3

/** The patch format versions the loaded library decodes and encodes, which
 * may differ from the headers' PULSE_PATCH_VERSION_MIN/_MAX: a program
 * built against older headers asks the library it loaded. Either pointer
 * may be NULL. A patch of a newer version is refused with
 * PULSE_ERR_VERSION ("format version N is newer than this decoder"). */
void pulse_patch_versions_supported(unsigned *oldest, unsigned *newest);

/* Position models (docs/formats/patch.md). Values are part of the format. */
typedef enum {
  /* Positions as gaps in storage order; decodes without the base weights
   * (except to turn deltas into new bits) in time proportional to changes. */
  PULSE_POS_PLAIN = 0,
  /* Positions as ranks within the class of the old exponent; about 30%
   * fewer position bytes, decoding reads the whole base tensor. */
  PULSE_POS_CLASS = 1,
  /* Not a format: where an API says so (PULSELoCo payloads), code both and
   * keep the smaller. The patch encoder refuses it. */
  PULSE_POS_AUTO = 255
} pulse_pos_model;

/* Encoder options; start from pulse_encode_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_ENCODE_OPTS_VERSION */
  uint64_t step;           /* step of the target state */
  uint64_t base_step;      /* step of the base state */
  pulse_pos_model pos_model;
  uint32_t chunk_log2; /* elements per chunk = 2^chunk_log2, 10..30 */
  int threads;         /* 0 = one per core */
  uint32_t format_version; /* 0 = PULSE_PATCH_VERSION; or 1..3 */
} pulse_encode_opts;

#define PULSE_ENCODE_OPTS_VERSION 2u
#define PULSE_CHUNK_LOG2_DEFAULT 20u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_encode_opts_init(pulse_encode_opts *opts);

/* One tensor given to the encoder. */
typedef struct {
  pulse_tensor_info info;       /* dtype must be PULSE_DTYPE_BF16 */
  const uint16_t *base;         /* base BF16 bits, numel(shape) elements */
  const pulse_changes *changes; /* changes from base to target (may be NULL
                                   or empty); old bits must equal base */
  const pulse_tensor_digest *base_digest; /* NULL: computed from base */
  /* Rank form, for a base that is not in host memory (a device tensor whose
   * classes a kernel counted): base NULL, base_digest given, and for
   * PULSE_POS_CLASS the class counts of every chunk's base
   * (chunk_hist[chunk * PULSE_CLASS_COUNT + class]) and each change's class
   * and rank within its class in its chunk (change order). NULL otherwise. */
  const uint32_t *chunk_hist;
  const uint8_t *change_class;
  const uint32_t *change_rank;
} pulse_encode_tensor;

/* A heap buffer owned by the caller after a successful call. */
typedef struct {
  uint8_t *data;
  size_t size;
} pulse_buffer;

void pulse_buffer_free(pulse_buffer *buf); /* NULL is fine */

/** Encodes one patch from base to target for a whole tensor table (table
 * order is kept). On success `out` holds the patch; on error it is empty.
 * The target digests are derived from the base digests and the changes. */
pulse_status pulse_patch_encode(const pulse_encode_opts *opts,
                                const pulse_encode_tensor *tensors,
                                size_t count, pulse_buffer *out);

/* A parsed patch: header and tensor table checked, sections not yet decoded.
 * Borrows the bytes given to pulse_patch_open: they must outlive it. */
typedef struct pulse_patch pulse_patch;

/** Parses and checks the header and tensor table of `size` bytes. Every
 * length, count and offset is checked against the buffer. */
pulse_status pulse_patch_open(const uint8_t *bytes, size_t size,
                              pulse_patch **out);
void pulse_patch_free(pulse_patch *patch); /* NULL is fine */

uint64_t pulse_patch_step(const pulse_patch *patch);
uint64_t pulse_patch_base_step(const pulse_patch *patch);
unsigned pulse_patch_format_version(const pulse_patch *patch);
/* Bytes of the version 3 value model at the end of the tensor table (0 for
 * versions 1 and 2). */
size_t pulse_patch_value_model_size(const pulse_patch *patch);
pulse_pos_model pulse_patch_pos_model(const pulse_patch *patch);
uint32_t pulse_patch_chunk_log2(const pulse_patch *patch);
const pulse_state_digest *pulse_patch_base_digest(const pulse_patch *patch);
const pulse_state_digest *pulse_patch_target_digest(const pulse_patch *patch);
size_t pulse_patch_tensor_count(const pulse_patch *patch);
uint64_t pulse_patch_total_changed(const pulse_patch *patch);

/* Table entry of one tensor; pointers borrow from the patch. */
typedef struct {
  pulse_tensor_info info;
  uint64_t numel;
  uint64_t changed;
  uint64_t section_size; /* coded bytes of this tensor */
  uint32_t chunk_count;
  pulse_tensor_digest base_digest;
  pulse_tensor_digest target_digest;
} pulse_patch_tensor;

/** Table entry i (0 <= i < tensor_count), or PULSE_ERR_ARG. */
pulse_status pulse_patch_tensor_get(const pulse_patch *patch, size_t i,
                                    pulse_patch_tensor *out);

/** Index of the tensor named `name`, or PULSE_ERR_NOT_FOUND. */
pulse_status pulse_patch_tensor_find(const pulse_patch *patch, const char *name,
                                     size_t *index);

/** Decodes the changes of tensor i against its base bits (numel elements).
 * `out` is cleared first and receives positions, old and new bits. Checks
 * every count and position; does not check digests. */
pulse_status pulse_patch_decode_tensor(const pulse_patch *patch, size_t i,
                                       const uint16_t *base, uint64_t numel,
                                       pulse_changes *out);

/** Decodes every chunk stream without the base weights and checks what can
 * be checked without them: counts, classes, ranks against the chunk size
 * and (plain model) the exact positions, values, exact stream lengths. Not
 * the digests, and not class ranks against the base's class counts (apply
 * does both). Version 1 class-model streams cannot be decoded without the
 * base: PULSE_ERR_UNSUPPORTED. This is also the coder's share of a device
 * apply (pulse_cuda_patch_apply), where a GPU turns ranks into positions.
 * threads: 0 = one per core. */
pulse_status pulse_patch_check_streams(const pulse_patch *patch, int threads);

/* An index of a BF16 tensor's elements by position class, for a receiver
 * that applies class-model patches one after another (class_index.c). It
 * turns the decoder's class ranks into positions without a pass over the
 * base, which otherwise sets the apply speed at RL densities. It holds 2
 * bytes per element plus 528 bytes per block of 4096: 2.13 bytes per
 * element, at most 2.2 for a tensor of 10,000 elements or more (a smaller
 * one still takes a block's 528), a little more than the weights. A build is
 * one pass over the weights (several times the pass that decoding a patch
 * without it costs, so a receiver builds it off the step's path);
 * commits keep it current in O(changes). */
typedef struct pulse_class_index pulse_class_index;

/** Builds the index of `numel` BF16 elements (`data` is only read, and may
 * be freed afterwards). threads: 0 = one per core.
 * @return PULSE_OK and *out (free with pulse_class_index_free);
 * PULSE_ERR_NOMEM; PULSE_ERR_ARG for NULL arguments. */
pulse_status pulse_class_index_build(const uint16_t *data, uint64_t numel,
                                     int threads, pulse_class_index **out);

/** Frees an index. NULL is fine. */
void pulse_class_index_free(pulse_class_index *index);

/** The digest of the data the index describes: the data it was built
 * from, then each committed patch's target. A caller whose tensor digest
 * differs holds a stale index and rebuilds it. NULL gives {0, 0}. */
pulse_tensor_digest pulse_class_index_digest(const pulse_class_index *index);

/** Memory the index holds, in bytes (0 for NULL). */
size_t pulse_class_index_bytes(const pulse_class_index *index);

/** Checks that the index describes `data` exactly (tests and debugging: a
 * full pass). @return PULSE_OK; PULSE_ERR_SIZE_MISMATCH;
 * PULSE_ERR_CORRUPT, with the first difference in the detail. */
pulse_status pulse_class_index_check(const pulse_class_index *index,
                                     const uint16_t *data, uint64_t numel);

/* A BF16 tensor in host memory that apply may modify. */
typedef struct {
  const char *name;
  uint16_t *data;
  uint64_t numel;
  /* In: the tensor's current digest when known (skips a full pass over the
   * data); NULL computes it. */
  const pulse_tensor_digest *digest;
} pulse_host_tensor;

/* Apply options; start from pulse_apply_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_APPLY_OPTS_VERSION */
  int threads;             /* 0 = one per core */
  /* 0: every tensor of the patch table must be among the targets, and the
   * base and target state digests are checked too. 1: the targets may be a
   * subset (a shard holder); only their per-tensor digests are checked.
   * Targets the patch does not name are never touched. */
  int partial_table;
  /* Version 2. NULL, or one entry per target (parallel to `targets`; NULL
   * entries for none): an index of that target's data
   * (pulse_class_index_build). Apply decodes class-model patches through it
   * and a commit updates it with the data. An index of other data (its
   * digest is not the target's) is ignored, never trusted: a caller that
   * changed the data loses only speed, and the index stays stale until
   * rebuilt. Without one, a pass over each changed chunk's base. */
  pulse_class_index *const *class_index;
} pulse_apply_opts;

#define PULSE_APPLY_OPTS_VERSION 2u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_apply_opts_init(pulse_apply_opts *opts);


/** Applies a patch transactionally: every target's base digest is checked,
 * every section fully decoded and the target digests checked before the first
 * element is written. On any error nothing is written and the status says
 * why. `targets` are matched to the table by name. */
pulse_status pulse_patch_apply(const pulse_patch *patch,
                               pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts);

/** Frees the staging memory that applies keep for the next apply (the
 * largest recent patch's, 18 bytes per change; the next apply allocates
 * it again). For a process that is done applying and wants the memory
 * back; safe to call at any time. */
void pulse_apply_cache_free(void);

/* The same transaction in two halves, for a caller that lets readers read
 * the targets while a patch is decoded and locks them only to write. */
typedef struct pulse_patch_staged pulse_patch_staged;

typedef struct {
  double verify_seconds; /* base and target digest checks */
  double decode_seconds; /* decoding every section into staging */
} pulse_patch_stage_figures;

/** Every check and decode of pulse_patch_apply, nothing written: on success
 * *out holds the changes, and the targets' data must not change until it is
 * committed or freed (the patch and the targets array must outlive it).
 * @return as pulse_patch_apply. */
pulse_status pulse_patch_stage(const pulse_patch *patch, pulse_host_tensor *targets,
                               size_t count, const pulse_apply_opts *opts,
                               pulse_patch_staged **out);

/** Writes the staged changes into the targets (cannot fail). Afterwards
 * each target holds the patch's target; its digest is the table's
 * target_digest (pulse_patch_tensor_get). */
void pulse_patch_staged_commit(pulse_patch_staged *staged);

/** The two halves of pulse_patch_staged_commit, for a caller that holds
 * readers off only while the weights change: commit_data writes the staged
 * changes (it may be called again: it writes the same bits), then
 * commit_indexes brings the options' class indexes up to the new weights
 * (once; later calls do nothing). Between the two an index no longer
 * describes its target, and no patch may be applied with it. */
void pulse_patch_staged_commit_data(pulse_patch_staged *staged);
void pulse_patch_staged_commit_indexes(pulse_patch_staged *staged);

pulse_patch_stage_figures pulse_patch_staged_figures_get(const pulse_patch_staged *staged);

/** Frees staged changes, committed or not. NULL is fine. */
void pulse_patch_staged_free(pulse_patch_staged *staged);

/** Merges consecutive patches (patches[i+1] based on patches[i]'s target)
 * into one patch from the first base to the last target, without the full
 * weights of any later state: with PULSE_POS_PLAIN patches and output no
 * weights are read at all (`base` may be NULL); PULSE_POS_CLASS decodes
 * against the old exponents, so it needs each tensor's first base (`base`,
 * in the first patch's table order) and keeps one tensor's scratch copy at a
 * time. All patches must share one tensor table. opts->step and base_step are
 * taken from the patches; pos_model, chunk_log2 and threads from opts. */
pulse_status pulse_patch_squash(const pulse_patch *const *patches, size_t count,
                                const uint16_t *const *base,
                                const pulse_encode_opts *opts,
                                pulse_buffer *out);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CODEC_H */
