/* safetensors_write.c - serializing tensors, and atomic file writes. */
#include "bytebuf_impl.h"
#include "json_impl.h"
#include "pulse_safetensors.h"
#include "pulse_file.h"
#include "safetensors_impl.h"
#include "status_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUOTE_MAX 200

/* --------------------------------------------------------- header builder */

static int cstr_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sets *dup to a string that occurs twice in strs, or NULL. */
static pulse_status find_dup_string(const char **strs, size_t n,
                                    const char **dup) {
  *dup = NULL;
  if (n < 2)
    return PULSE_OK;
  const char **sorted = malloc(n * sizeof *sorted);
  if (sorted == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: name index");
  memcpy(sorted, strs, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, cstr_cmp);
  for (size_t i = 1; i < n && *dup == NULL; i++)
    if (strcmp(sorted[i - 1], sorted[i]) == 0)
      *dup = sorted[i];
  free(sorted);
  return PULSE_OK;
}

static pulse_status check_string(const char *what, const char *s) {
  if (s == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: %s is NULL", what);
  if (!pulse_json_utf8_valid(s, strlen(s)))
    return pulse_fail(PULSE_ERR_ARG, "safetensors: %s '%.*s' is not UTF-8",
                      what, QUOTE_MAX, s);
  return PULSE_OK;
}

/* Checks the inputs; fills nbytes[i] for each tensor. */
static pulse_status check_inputs(const pulse_st_write_tensor *tensors,
                                 size_t count, const pulse_st_kv *meta,
                                 size_t meta_count, uint64_t *nbytes) {
  if ((tensors == NULL && count > 0) || (meta == NULL && meta_count > 0))
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL array");
  for (size_t i = 0; i < count; i++) {
    const pulse_st_write_tensor *t = &tensors[i];
    PULSE_TRY(check_string("tensor name", t->name));
    if (strcmp(t->name, "__metadata__") == 0)
      return pulse_fail(PULSE_ERR_ARG,
                        "safetensors: a tensor may not be named __metadata__");
    size_t esize = pulse_dtype_size(t->dtype);
    if (esize == 0)
      return pulse_fail(PULSE_ERR_DTYPE, "safetensors: tensor '%.*s': dtype %d",
                        QUOTE_MAX, t->name, (int)t->dtype);
    if (t->ndim > PULSE_MAX_DIMS)
      return pulse_fail(PULSE_ERR_ARG,
                        "safetensors: tensor '%.*s': %u dimensions, at most "
                        "%d",
                        QUOTE_MAX, t->name, t->ndim, PULSE_MAX_DIMS);
    uint64_t numel;
    if (pulse_shape_numel(t->shape, t->ndim, &numel) != PULSE_OK ||
        numel > UINT64_MAX / esize)
      return pulse_fail(PULSE_ERR_OVERFLOW,
                        "safetensors: tensor '%.*s': size overflows", QUOTE_MAX,
                        t->name);
    nbytes[i] = numel * esize;
    if (t->data == NULL && nbytes[i] > 0)
      return pulse_fail(PULSE_ERR_ARG, "safetensors: tensor '%.*s': NULL data",
                        QUOTE_MAX, t->name);
  }
  for (size_t i = 0; i < meta_count; i++) {
    PULSE_TRY(check_string("metadata key", meta[i].key));
    PULSE_TRY(check_string("metadata value", meta[i].value));
  }

  size_t n = count > meta_count ? count : meta_count;
  const char **strs = malloc((n > 0 ? n : 1) * sizeof *strs);
  if (strs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: name index");
  const char *dup;
  for (size_t i = 0; i < count; i++)
    strs[i] = tensors[i].name;
  pulse_status st = find_dup_string(strs, count, &dup);
  if (st == PULSE_OK && dup != NULL)
    st = pulse_fail(PULSE_ERR_DUPLICATE,
                    "safetensors: tensor name '%.*s' "
                    "given twice",
                    QUOTE_MAX, dup);
  if (st == PULSE_OK) {
    for (size_t i = 0; i < meta_count; i++)
      strs[i] = meta[i].key;
    st = find_dup_string(strs, meta_count, &dup);
    if (st == PULSE_OK && dup != NULL)
      st = pulse_fail(PULSE_ERR_DUPLICATE,
                      "safetensors: metadata key '%.*s' given twice", QUOTE_MAX,
                      dup);
  }
  free(strs);
  return st;
}

/* Writes one tensor's entry of the header. */
static void write_entry(pulse_json_writer *w, const pulse_st_write_tensor *t,
                        uint64_t begin, uint64_t end) {
  pulse_json_write_key(w, t->name);
  pulse_json_write_object(w);
  pulse_json_write_key(w, "dtype");
  pulse_json_write_string(w, pulse_dtype_name(t->dtype));
  pulse_json_write_key(w, "shape");
  pulse_json_write_array(w);
  for (uint32_t d = 0; d < t->ndim; d++)
    pulse_json_write_u64(w, t->shape[d]);
  pulse_json_write_end(w);
  pulse_json_write_key(w, "data_offsets");
  pulse_json_write_array(w);
  pulse_json_write_u64(w, begin);
  pulse_json_write_u64(w, end);
  pulse_json_write_end(w);
  pulse_json_write_end(w);
}

static pulse_status build_head(const pulse_st_write_tensor *tensors,
                               size_t count, const pulse_st_kv *meta,
                               size_t meta_count, pulse_bytebuf *head,
                               uint64_t *data_size) {
  return st_header_build(tensors, count, meta, meta_count, 0, head, data_size);
}

pulse_status st_header_build(const pulse_st_write_tensor *tensors, size_t count,
                             const pulse_st_kv *meta, size_t meta_count,
                             uint64_t min_size, pulse_bytebuf *head,
                             uint64_t *data_size) {
  uint64_t *nbytes = malloc((count > 0 ? count : 1) * sizeof *nbytes);
  if (nbytes == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: %zu tensors", count);
  pulse_status st = check_inputs(tensors, count, meta, meta_count, nbytes);
  if (st != PULSE_OK) {
    free(nbytes);
    return st;
  }
  pulse_bytebuf *b = head;
  pulse_bytebuf_put(b, "\0\0\0\0\0\0\0\0", 8);
  pulse_json_writer w;
  pulse_json_write_init(&w, b);
  pulse_json_write_object(&w);
  if (meta_count > 0) {
    pulse_json_write_key(&w, "__metadata__");
    pulse_json_write_object(&w);
    for (size_t i = 0; i < meta_count; i++) {
      pulse_json_write_key(&w, meta[i].key);
      pulse_json_write_string(&w, meta[i].value);
    }
    pulse_json_write_end(&w);
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < count; i++) {
    if (nbytes[i] > UINT64_MAX - offset) {
      free(nbytes);
      return pulse_fail(PULSE_ERR_OVERFLOW, "safetensors: data size overflows");
    }
    write_entry(&w, &tensors[i], offset, offset + nbytes[i]);
    offset += nbytes[i];
  }
  pulse_json_write_end(&w);
  free(nbytes);
  st = pulse_json_write_finish(&w);
  if (st == PULSE_ERR_NOMEM)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: header");
  PULSE_TRY(st);
  /* Spaces up to a multiple of 8 keep every tensor aligned to its dtype. */
  while (!b->failed && (b->size % 8 != 0 || b->size < min_size) &&
         b->size != min_size)
    pulse_bytebuf_byte(b, ' ');
  if (b->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: header");
  uint64_t hlen = b->size - 8;
  if (hlen > PULSE_ST_MAX_HEADER)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: header of %llu bytes exceeds the limit",
                      (unsigned long long)hlen);
  for (int i = 0; i < 8; i++)
    b->data[i] = (uint8_t)(hlen >> (8 * i) & 0xFF);
  *data_size = offset;
  return PULSE_OK;
}

pulse_status pulse_st_serialize(const pulse_st_write_tensor *tensors,
                                size_t count, const pulse_st_kv *meta,
                                size_t meta_count, pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL output");
  out->data = NULL;
  out->size = 0;
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size;
  pulse_status st =
      build_head(tensors, count, meta, meta_count, &head, &data_size);
  if (st != PULSE_OK) {
    free(head.data);
    return st;
  }
  if (data_size > SIZE_MAX - head.size) {
    free(head.data);
    return pulse_fail(PULSE_ERR_OVERFLOW, "safetensors: file size overflows");
  }
  size_t total = head.size + (size_t)data_size;
  uint8_t *buf = realloc(head.data, total);
  if (buf == NULL) {
    free(head.data);
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: %zu bytes", total);
  }
  size_t at = head.size;
  for (size_t i = 0; i < count; i++) {
    uint64_t numel;
    (void)pulse_shape_numel(tensors[i].shape, tensors[i].ndim, &numel);
    size_t n = (size_t)numel * pulse_dtype_size(tensors[i].dtype);
    if (n > 0)
      memcpy(buf + at, tensors[i].data, n);
    at += n;
  }
  out->data = buf;
  out->size = total;
  return PULSE_OK;
}

pulse_status pulse_st_write(const char *path,
                            const pulse_st_write_tensor *tensors, size_t count,
                            const pulse_st_kv *meta, size_t meta_count) {
  if (path == NULL || path[0] == '\0' || path[strlen(path) - 1] == '/')
    return pulse_fail(PULSE_ERR_ARG, "safetensors: bad output path '%s'",
                      path == NULL ? "(null)" : path);
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size;
  pulse_status st =
      build_head(tensors, count, meta, meta_count, &head, &data_size);
  if (st != PULSE_OK) {
    free(head.data);
    return st;
  }
  (void)data_size;
  pulse_atomic_file *file = NULL;
  st = pulse_atomic_file_create(path, &file);
  if (st == PULSE_OK)
    st = pulse_atomic_file_write(file, head.data, head.size);
  free(head.data);
  for (size_t i = 0; st == PULSE_OK && i < count; i++) {
    uint64_t numel;
    (void)pulse_shape_numel(tensors[i].shape, tensors[i].ndim, &numel);
    st = pulse_atomic_file_write(file, tensors[i].data,
                                 numel * pulse_dtype_size(tensors[i].dtype));
  }
  if (st != PULSE_OK) {
    pulse_atomic_file_abort(file);
    return st;
  }
  return pulse_atomic_file_commit(file);
}
