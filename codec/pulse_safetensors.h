/* pulse_safetensors.h - reading and writing safetensors files.
 *
 * Format (https://github.com/huggingface/safetensors): an 8-byte little-endian
 * header length N, N bytes of a JSON object (optionally padded with spaces),
 * then the tensor data. Each header member other than "__metadata__" is one
 * tensor: {"dtype": "BF16", "shape": [2, 3], "data_offsets": [begin, end]},
 * offsets relative to the start of the data. "__metadata__", when present,
 * maps strings to strings.
 *
 * The reader checks everything before it hands out a tensor, and treats any
 * file as hostile: header length at most PULSE_ST_MAX_HEADER and within the
 * file; the header strict JSON (RFC 8259, UTF-8) starting with '{'; no
 * duplicate names; dtype F32, BF16 or F16 (pulse_dtype), anything else is
 * PULSE_ERR_DTYPE; at most PULSE_MAX_DIMS dimensions; element and byte counts
 * that do not overflow; each tensor exactly numel * dtype size bytes; and
 * tensors that tile the data with no gap, overlap or trailing byte. Unknown
 * members inside a tensor entry are ignored (as by the reference reader).
 *
 * Errors: a non-OK pulse_status with the detail in pulse_error_detail(),
 * naming the tensor at fault. Nothing here prints to stdout.
 *
 * Thread-safety: every function is reentrant. An opened file or model is
 * read-only and may be read from several threads at once; closing it must
 * not race with any other use. */
#ifndef PULSE_SAFETENSORS_H
#define PULSE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest header accepted, in bytes (the reference reader's limit). */
#define PULSE_ST_MAX_HEADER ((uint64_t)100000000)

/* Parsing a header (or index) takes at most this many bytes of memory per
 * byte of JSON, plus 1 MiB. Real headers need about 11; the cap stops a
 * hostile header ("[0,0,0,...]") from taking about 60. */
#define PULSE_ST_JSON_MEMORY_RATIO 16u

/* One tensor of an opened file or model. Pointers borrow from the file or
 * model and stay valid until it is closed. */
typedef struct {
  const char *name; /* NUL-terminated UTF-8, never "__metadata__" */
  pulse_dtype dtype;
  uint32_t ndim;                  /* 0 for a scalar */
  uint64_t shape[PULSE_MAX_DIMS]; /* entries past ndim are 0 */
  uint64_t numel;                 /* product of the shape (1 for a scalar) */
  /* nbytes bytes of little-endian elements. Aligned to the dtype whenever
   * the header length is a multiple of 8 (as pulse and the reference writer
   * make it) and the mapping is page-aligned; a file from another writer may
   * leave it unaligned, so check or copy before casting. */
  const void *data;
  uint64_t nbytes; /* numel * pulse_dtype_size(dtype) */
} pulse_st_tensor;

/* ----------------------------------------------------------- single files */

/* An opened, fully validated safetensors file. */
typedef struct pulse_st_file pulse_st_file;

/** Opens and validates the regular file at `path`, mapping it read-only.
 * The file must not be truncated while it is open (reads of a mapping past
 * the end of a file fault); replacing it by rename, as pulse_st_write does,
 * is safe. On success *out owns the mapping: close it with pulse_st_close.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND when the path does not exist;
 * PULSE_ERR_IO when it cannot be opened, is not a regular file or cannot be
 * mapped; PULSE_ERR_ARG for NULL arguments; or any error of
 * pulse_st_open_memory. */
pulse_status pulse_st_open(const char *path, pulse_st_file **out);

/** Validates `size` bytes holding a whole safetensors file. Borrows `bytes`:
 * they must stay unchanged until pulse_st_close. On success *out is a new
 * handle; on error *out is NULL.
 * @return PULSE_OK; PULSE_ERR_TRUNCATED (fewer than 8 bytes, or a header
 * running past the end); PULSE_ERR_OVERFLOW (header longer than
 * PULSE_ST_MAX_HEADER, a header whose JSON tree would take more than
 * PULSE_ST_JSON_MEMORY_RATIO bytes per header byte, a dimension beyond 64
 * bits, or an element or byte count that overflows); PULSE_ERR_JSON (header not
 * strict JSON, not an object, a missing or mistyped field, metadata that is not
 * a string map); PULSE_ERR_DTYPE (a dtype other than F32, BF16, F16);
 * PULSE_ERR_UNSUPPORTED (more than PULSE_MAX_DIMS dimensions);
 * PULSE_ERR_DUPLICATE (two tensors or metadata keys with one name);
 * PULSE_ERR_OFFSETS (offsets that are not two integers, end before begin, past
 * the data, or tensors that leave a gap or overlap); PULSE_ERR_SIZE_MISMATCH
 * (byte range not numel * dtype size); PULSE_ERR_TRAILING (data bytes after the
 * last tensor); PULSE_ERR_NOMEM; PULSE_ERR_ARG. */
pulse_status pulse_st_open_memory(const uint8_t *bytes, size_t size,
                                  pulse_st_file **out);

/** Closes a file and unmaps it; every pointer obtained from it becomes
 * invalid. NULL is fine. */
void pulse_st_close(pulse_st_file *file);

/** Number of tensors (0 for NULL). */
size_t pulse_st_tensor_count(const pulse_st_file *file);

/** Tensor i in storage order: ascending data offset; tensors of zero bytes
 * at one offset keep their order in the header, which is the order
 * pulse_st_write was given.
 * @return PULSE_OK, or PULSE_ERR_ARG when i >= count or an argument is
 * NULL. */
pulse_status pulse_st_tensor_get(const pulse_st_file *file, size_t i,
                                 pulse_st_tensor *out);

/** The tensor named `name` (O(log n) over a name index built at open).
 * @return PULSE_OK, PULSE_ERR_NOT_FOUND, or PULSE_ERR_ARG. */
pulse_status pulse_st_tensor_find(const pulse_st_file *file, const char *name,
                                  pulse_st_tensor *out);

/** Value of metadata key `key`, or NULL when absent. Borrowed from the file.
 * Values never contain NUL bytes. */
const char *pulse_st_metadata_get(const pulse_st_file *file, const char *key);

/** Number of metadata entries (0 for NULL). */
size_t pulse_st_metadata_count(const pulse_st_file *file);

/** Metadata entry i, in ascending byte order of the keys. `key` and `value`
 * (either may be NULL) are borrowed from the file.
 * @return PULSE_OK, or PULSE_ERR_ARG when i >= count. */
pulse_status pulse_st_metadata_at(const pulse_st_file *file, size_t i,
                                  const char **key, const char **value);

/* ---------------------------------------------------------------- writing */

/* One tensor to write. Borrowed for the duration of the call. */
typedef struct {
  const char *name; /* UTF-8 without NUL, not "__metadata__" */
  pulse_dtype dtype;
  uint32_t ndim;                  /* 0..PULSE_MAX_DIMS */
  uint64_t shape[PULSE_MAX_DIMS]; /* entries past ndim are ignored */
  const void *data; /* numel * dtype size bytes; may be NULL when 0 bytes */
} pulse_st_write_tensor;

/* One metadata entry: UTF-8 strings without NUL. */
typedef struct {
  const char *key;
  const char *value;
} pulse_st_kv;

/** Serializes tensors (stored in the given order, contiguously) and metadata
 * into a new heap buffer. The header lists "__metadata__" first (when
 * meta_count > 0), then the tensors in order, and is padded with spaces to a
 * multiple of 8 bytes so every tensor stays aligned. On success `out` owns
 * the buffer (pulse_buffer_free); on error it is empty.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL pointer, bad name or string, ndim
 * out of range); PULSE_ERR_DTYPE; PULSE_ERR_DUPLICATE (repeated tensor name
 * or metadata key); PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_st_serialize(const pulse_st_write_tensor *tensors,
                                size_t count, const pulse_st_kv *meta,
                                size_t meta_count, pulse_buffer *out);

/** Writes the same bytes as pulse_st_serialize to `path`, atomically: into a
 * new temporary file in the same directory, fsync, rename over `path`, fsync
 * of the directory. Tensor data is streamed, not copied. On failure no file
 * at `path` is created or changed and the temporary file is removed; the one
 * exception is a failing directory fsync after the rename, reported as
 * PULSE_ERR_IO with the new file already in place. The file gets mode 0666
 * less the umask, also when it replaces one with another mode.
 * @return as pulse_st_serialize, plus PULSE_ERR_IO (with the path and
 * errno text). */
pulse_status pulse_st_write(const char *path,
                            const pulse_st_write_tensor *tensors, size_t count,
                            const pulse_st_kv *meta, size_t meta_count);

/* ---------------------------------------------------- models (sharded too) */

/* A model: one safetensors file, or the shards of a
 * model.safetensors.index.json, seen as one tensor table. */
typedef struct pulse_st_model pulse_st_model;

/** Opens a model from `path`, which is either
 *  - a "*.json" file: a model.safetensors.index.json, {"metadata": {...},
 *    "weight_map": {"tensor name": "shard file", ...}}; shard files are
 *    names in the index's directory (no '/', not "." or ".."); every
 *    weight_map name must be in its shard (else PULSE_ERR_NOT_FOUND) and
 *    every shard tensor must be mapped to that shard (else
 *    PULSE_ERR_CORRUPT); members other than the two are ignored;
 *  - any other file: one safetensors file;
 *  - a directory: its model.safetensors.index.json when present, else its
 *    model.safetensors, else its only "*.safetensors" file.
 * Each shard is opened with pulse_st_open and fully validated. On success
 * *out owns every shard; close it with pulse_st_model_close.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (path, shard or tensor missing, or a
 * directory without a model); PULSE_ERR_ARG (a directory with several
 * candidate files and neither of the two names above); PULSE_ERR_JSON (bad
 * index); PULSE_ERR_DUPLICATE (a name listed twice in the weight_map);
 * PULSE_ERR_CORRUPT (a shard path that leaves the directory, or a shard
 * tensor the weight_map does not map to that shard); or any error of
 * pulse_st_open, the detail naming the shard. */
pulse_status pulse_st_model_open(const char *path, pulse_st_model **out);

/** Closes a model and all its shards. NULL is fine. */
void pulse_st_model_close(pulse_st_model *model);

/** Number of tensors over all shards (0 for NULL). */
size_t pulse_st_model_tensor_count(const pulse_st_model *model);

/** Tensor i: for one file, storage order; for shards, the shards in
 * ascending byte order of their file names, storage order within each.
 * @return PULSE_OK, or PULSE_ERR_ARG when i >= count. */
pulse_status pulse_st_model_tensor_get(const pulse_st_model *model, size_t i,
                                       pulse_st_tensor *out);

/** The tensor named `name` (O(log n)).
 * @return PULSE_OK, PULSE_ERR_NOT_FOUND, or PULSE_ERR_ARG. */
pulse_status pulse_st_model_tensor_find(const pulse_st_model *model,
                                        const char *name, pulse_st_tensor *out);

/** Model metadata: a single file's "__metadata__", or the index's
 * "metadata", where numbers and booleans become their JSON text (e.g.
 * "total_size" -> "123456") and null, arrays and objects are left out.
 * Same contract as pulse_st_metadata_get / _count / _at. */
const char *pulse_st_model_metadata_get(const pulse_st_model *model,
                                        const char *key);
size_t pulse_st_model_metadata_count(const pulse_st_model *model);
pulse_status pulse_st_model_metadata_at(const pulse_st_model *model, size_t i,
                                        const char **key, const char **value);

/** Number of files the model was read from (1 for a single file). */
size_t pulse_st_model_shard_count(const pulse_st_model *model);

/** Shard i (ascending file name order) as an opened file, borrowed from the
 * model, or NULL when i is out of range. */
const pulse_st_file *pulse_st_model_shard(const pulse_st_model *model,
                                          size_t i);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SAFETENSORS_H */
