/* safetensors_write.c - serializing tensors, and atomic file writes. */
#include "json_impl.h"
#include "pulse_safetensors.h"
#include "pulse_file.h"
#include "status_impl.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define QUOTE_MAX 200

/* --------------------------------------------------------- header builder */

typedef struct {
  char *data;
  size_t len;
  size_t cap;
  int failed; /* an allocation failed; later appends do nothing */
} strbuf;

static void sb_reserve(strbuf *b, size_t extra) {
  if (b->failed)
    return;
  if (extra > SIZE_MAX / 2 - b->len) {
    b->failed = 1;
    return;
  }
  if (b->len + extra <= b->cap)
    return;
  size_t cap = b->cap < 256 ? 256 : b->cap;
  while (cap < b->len + extra)
    cap *= 2;
  char *d = realloc(b->data, cap);
  if (d == NULL) {
    b->failed = 1;
    return;
  }
  b->data = d;
  b->cap = cap;
}

static void sb_put(strbuf *b, const char *s, size_t n) {
  sb_reserve(b, n);
  if (b->failed)
    return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
}

static void sb_puts(strbuf *b, const char *s) {
  sb_put(b, s, strlen(s));
}

static void sb_u64(strbuf *b, uint64_t v) {
  char tmp[24];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  sb_put(b, tmp, (size_t)n);
}

/* Appends s as a quoted JSON string. */
static void sb_json_string(strbuf *b, const char *s) {
  size_t n = strlen(s);
  size_t esc = pulse_json_escape(NULL, s, n);
  sb_reserve(b, esc + 2);
  if (b->failed)
    return;
  b->data[b->len++] = '"';
  b->len += pulse_json_escape(b->data + b->len, s, n);
  b->data[b->len++] = '"';
}

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

/* Builds the 8-byte length and the padded header JSON into *head (caller
 * frees); *data_size receives the bytes of tensor data that follow. */
static pulse_status build_head(const pulse_st_write_tensor *tensors,
                               size_t count, const pulse_st_kv *meta,
                               size_t meta_count, strbuf *head,
                               uint64_t *data_size) {
  uint64_t *nbytes = malloc((count > 0 ? count : 1) * sizeof *nbytes);
  if (nbytes == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: %zu tensors", count);
  pulse_status st = check_inputs(tensors, count, meta, meta_count, nbytes);
  if (st != PULSE_OK) {
    free(nbytes);
    return st;
  }
  strbuf *b = head;
  sb_put(b, "\0\0\0\0\0\0\0\0{", 9);
  const char *sep = "";
  if (meta_count > 0) {
    sb_puts(b, "\"__metadata__\":{");
    for (size_t i = 0; i < meta_count; i++) {
      sb_puts(b, i > 0 ? "," : "");
      sb_json_string(b, meta[i].key);
      sb_puts(b, ":");
      sb_json_string(b, meta[i].value);
    }
    sb_puts(b, "}");
    sep = ",";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < count; i++) {
    const pulse_st_write_tensor *t = &tensors[i];
    if (nbytes[i] > UINT64_MAX - offset) {
      free(nbytes);
      return pulse_fail(PULSE_ERR_OVERFLOW, "safetensors: data size overflows");
    }
    sb_puts(b, sep);
    sep = ",";
    sb_json_string(b, t->name);
    sb_puts(b, ":{\"dtype\":\"");
    sb_puts(b, pulse_dtype_name(t->dtype));
    sb_puts(b, "\",\"shape\":[");
    for (uint32_t d = 0; d < t->ndim; d++) {
      sb_puts(b, d > 0 ? "," : "");
      sb_u64(b, t->shape[d]);
    }
    sb_puts(b, "],\"data_offsets\":[");
    sb_u64(b, offset);
    sb_puts(b, ",");
    sb_u64(b, offset + nbytes[i]);
    sb_puts(b, "]}");
    offset += nbytes[i];
  }
  sb_puts(b, "}");
  free(nbytes);
  /* Spaces up to a multiple of 8 keep every tensor aligned to its dtype. */
  while (!b->failed && b->len % 8 != 0)
    sb_puts(b, " ");
  if (b->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: header");
  uint64_t hlen = b->len - 8;
  if (hlen > PULSE_ST_MAX_HEADER)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: header of %llu bytes exceeds the limit",
                      (unsigned long long)hlen);
  for (int i = 0; i < 8; i++)
    b->data[i] = (char)(hlen >> (8 * i) & 0xFF);
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
  strbuf head = {0};
  uint64_t data_size;
  pulse_status st =
      build_head(tensors, count, meta, meta_count, &head, &data_size);
  if (st != PULSE_OK) {
    free(head.data);
    return st;
  }
  if (data_size > SIZE_MAX - head.len) {
    free(head.data);
    return pulse_fail(PULSE_ERR_OVERFLOW, "safetensors: file size overflows");
  }
  size_t total = head.len + (size_t)data_size;
  uint8_t *buf = realloc(head.data, total);
  if (buf == NULL) {
    free(head.data);
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: %zu bytes", total);
  }
  size_t at = head.len;
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
  strbuf head = {0};
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
    st = pulse_atomic_file_write(file, head.data, head.len);
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
