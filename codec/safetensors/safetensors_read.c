/* safetensors_read.c - opening and validating one safetensors file. */
#include "endian_impl.h"
#include "json_impl.h"
#include "pulse_safetensors.h"
#include "status_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct pulse_st_file {
  const uint8_t *bytes;
  size_t size;
  void *map; /* non-NULL when pulse_st_open mapped the bytes */
  size_t map_size;
  pulse_json_doc *doc; /* the header; names and metadata point into it */
  size_t count;
  pulse_st_tensor *tensors;        /* storage order */
  const pulse_st_tensor **by_name; /* the tensors in strcmp order of names */
  size_t meta_count;
  const pulse_json **meta; /* metadata members in strcmp order of keys */
};

/* Validation scratch for one tensor. */
typedef struct {
  uint64_t begin, end;
  size_t order; /* position in the header */
} st_range;

/* Names and strings from a file are quoted at most this long in details. */
#define QUOTE_MAX 200

/* Re-raises the current detail after a prefix that starts with
 * "safetensors: " (the detail buffer is the destination, so it is copied
 * first, less its own "safetensors: "). */
static pulse_status fail_prefixed(pulse_status st, const char *prefix) {
  char inner[512];
  const char *d = pulse_error_detail();
  if (strncmp(d, "safetensors: ", 13) == 0)
    d += 13;
  snprintf(inner, sizeof inner, "%s", d);
  return pulse_fail(st, "%s%s", prefix, inner);
}

void pulse_st_close(pulse_st_file *file) {
  if (file == NULL)
    return;
  free(file->tensors);
  free(file->by_name);
  free(file->meta);
  pulse_json_doc_free(file->doc);
  if (file->map != NULL)
    munmap(file->map, file->map_size);
  free(file);
}

static pulse_status parse_dtype(const char *name, const pulse_json *v,
                                pulse_dtype *out) {
  const char *s;
  if (v == NULL)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': missing \"dtype\"",
                      QUOTE_MAX, name);
  if (!pulse_json_string(v, &s, NULL))
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': \"dtype\" is not a string",
                      QUOTE_MAX, name);
  static const pulse_dtype known[] = {PULSE_DTYPE_F32, PULSE_DTYPE_BF16,
                                      PULSE_DTYPE_F16};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (strcmp(s, pulse_dtype_name(known[i])) == 0) {
      *out = known[i];
      return PULSE_OK;
    }
  }
  return pulse_fail(PULSE_ERR_DTYPE,
                    "safetensors: tensor '%.*s': dtype '%.32s' is not "
                    "supported (pulse reads F32, BF16 and F16)",
                    QUOTE_MAX, name, s);
}

static pulse_status parse_shape(const char *name, const pulse_json *v,
                                pulse_st_tensor *t) {
  if (v == NULL)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': missing \"shape\"",
                      QUOTE_MAX, name);
  if (v->type != PULSE_JSON_ARRAY)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': \"shape\" is not an array",
                      QUOTE_MAX, name);
  if (v->len > PULSE_MAX_DIMS)
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "safetensors: tensor '%.*s': %zu dimensions, pulse "
                      "supports at most %d",
                      QUOTE_MAX, name, v->len, PULSE_MAX_DIMS);
  t->ndim = (uint32_t)v->len;
  for (size_t d = 0; d < v->len; d++) {
    pulse_status st = pulse_json_u64(&v->items[d], &t->shape[d]);
    if (st == PULSE_ERR_OVERFLOW)
      return pulse_fail(st,
                        "safetensors: tensor '%.*s': dimension %zu (%.40s) "
                        "does not fit in 64 bits",
                        QUOTE_MAX, name, d, v->items[d].text);
    if (st != PULSE_OK)
      return pulse_fail(PULSE_ERR_JSON,
                        "safetensors: tensor '%.*s': dimension %zu is not a "
                        "non-negative integer",
                        QUOTE_MAX, name, d);
  }
  if (pulse_shape_numel(t->shape, t->ndim, &t->numel) != PULSE_OK)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: tensor '%.*s': element count overflows",
                      QUOTE_MAX, name);
  return PULSE_OK;
}

static pulse_status parse_offsets(const char *name, const pulse_json *v,
                                  uint64_t data_size, st_range *r) {
  if (v == NULL)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': missing \"data_offsets\"",
                      QUOTE_MAX, name);
  if (v->type != PULSE_JSON_ARRAY || v->len != 2)
    return pulse_fail(PULSE_ERR_OFFSETS,
                      "safetensors: tensor '%.*s': \"data_offsets\" is not "
                      "an array of two integers",
                      QUOTE_MAX, name);
  if (pulse_json_u64(&v->items[0], &r->begin) != PULSE_OK ||
      pulse_json_u64(&v->items[1], &r->end) != PULSE_OK)
    return pulse_fail(PULSE_ERR_OFFSETS,
                      "safetensors: tensor '%.*s': \"data_offsets\" are not "
                      "both integers in 0..2^64-1",
                      QUOTE_MAX, name);
  if (r->end < r->begin)
    return pulse_fail(PULSE_ERR_OFFSETS,
                      "safetensors: tensor '%.*s': data ends (%llu) before "
                      "it begins (%llu)",
                      QUOTE_MAX, name, (unsigned long long)r->end,
                      (unsigned long long)r->begin);
  if (r->end > data_size)
    return pulse_fail(PULSE_ERR_OFFSETS,
                      "safetensors: tensor '%.*s': data ends at %llu, past "
                      "the %llu bytes of data",
                      QUOTE_MAX, name, (unsigned long long)r->end,
                      (unsigned long long)data_size);
  return PULSE_OK;
}

/* Fills t (all but data) and r from one header member. */
static pulse_status parse_tensor(const pulse_json *m, uint64_t data_size,
                                 pulse_st_tensor *t, st_range *r) {
  const char *name = m->key;
  if (m->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': entry is not an object",
                      QUOTE_MAX, name);
  const pulse_json *dup;
  PULSE_TRY(pulse_json_find_duplicate(m, &dup));
  if (dup != NULL)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: tensor '%.*s': field '%.40s' repeated",
                      QUOTE_MAX, name, dup->key);
  memset(t, 0, sizeof *t);
  t->name = name;
  PULSE_TRY(parse_dtype(name, pulse_json_get(m, "dtype"), &t->dtype));
  PULSE_TRY(parse_shape(name, pulse_json_get(m, "shape"), t));
  PULSE_TRY(
      parse_offsets(name, pulse_json_get(m, "data_offsets"), data_size, r));
  uint64_t esize = pulse_dtype_size(t->dtype);
  if (t->numel > UINT64_MAX / esize)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: tensor '%.*s': byte count overflows",
                      QUOTE_MAX, name);
  t->nbytes = t->numel * esize;
  if (r->end - r->begin != t->nbytes)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "safetensors: tensor '%.*s': %llu data bytes, but "
                      "%llu %s elements need %llu",
                      QUOTE_MAX, name, (unsigned long long)(r->end - r->begin),
                      (unsigned long long)t->numel, pulse_dtype_name(t->dtype),
                      (unsigned long long)t->nbytes);
  return PULSE_OK;
}

static pulse_status parse_metadata(pulse_st_file *f, const pulse_json *m) {
  if (m->type == PULSE_JSON_NULL)
    return PULSE_OK;
  if (m->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: \"__metadata__\" is not an object");
  const pulse_json *dup;
  PULSE_TRY(pulse_json_find_duplicate(m, &dup));
  if (dup != NULL)
    return pulse_fail(PULSE_ERR_DUPLICATE,
                      "safetensors: metadata key '%.*s' repeated", QUOTE_MAX,
                      dup->key);
  for (size_t i = 0; i < m->len; i++) {
    const pulse_json *kv = &m->items[i];
    if (kv->type != PULSE_JSON_STRING)
      return pulse_fail(PULSE_ERR_JSON,
                        "safetensors: metadata '%.*s': value is not a string",
                        QUOTE_MAX, kv->key);
    if (memchr(kv->text, '\0', kv->len) != NULL)
      return pulse_fail(PULSE_ERR_JSON,
                        "safetensors: metadata '%.*s': value holds a NUL",
                        QUOTE_MAX, kv->key);
  }
  if (m->len == 0)
    return PULSE_OK;
  f->meta = malloc(m->len * sizeof *f->meta);
  if (f->meta == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: metadata");
  for (size_t i = 0; i < m->len; i++)
    f->meta[i] = &m->items[i];
  f->meta_count = m->len;
  return PULSE_OK;
}

static int meta_cmp(const void *a, const void *b) {
  const pulse_json *x = *(const pulse_json *const *)a;
  const pulse_json *y = *(const pulse_json *const *)b;
  return strcmp(x->key, y->key);
}

typedef struct {
  pulse_st_tensor t;
  st_range r;
} st_item;

static int storage_cmp(const void *a, const void *b) {
  const st_range *x = &((const st_item *)a)->r;
  const st_range *y = &((const st_item *)b)->r;
  if (x->begin != y->begin)
    return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end)
    return x->end < y->end ? -1 : 1;
  return x->order < y->order ? -1 : (x->order > y->order);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp((*(const pulse_st_tensor *const *)a)->name,
                (*(const pulse_st_tensor *const *)b)->name);
}

/* Reads the tensor table from the parsed header into f. */
static pulse_status load_table(pulse_st_file *f, const pulse_json *root,
                               uint64_t data_offset) {
  uint64_t data_size = f->size - data_offset;
  size_t count = 0;
  for (size_t i = 0; i < root->len; i++) {
    if (strcmp(root->items[i].key, "__metadata__") == 0)
      PULSE_TRY(parse_metadata(f, &root->items[i]));
    else
      count++;
  }
  if (f->meta_count > 1)
    qsort(f->meta, f->meta_count, sizeof *f->meta, meta_cmp);

  st_item *items = NULL;
  if (count > 0) {
    items = calloc(count, sizeof *items);
    f->tensors = malloc(count * sizeof *f->tensors);
    f->by_name = malloc(count * sizeof *f->by_name);
    if (items == NULL || f->tensors == NULL || f->by_name == NULL) {
      free(items);
      return pulse_fail(PULSE_ERR_NOMEM, "safetensors: table of %zu tensors",
                        count);
    }
  }
  size_t n = 0;
  for (size_t i = 0; i < root->len; i++) {
    const pulse_json *m = &root->items[i];
    if (strcmp(m->key, "__metadata__") == 0)
      continue;
    pulse_status st = parse_tensor(m, data_size, &items[n].t, &items[n].r);
    if (st != PULSE_OK) {
      free(items);
      return st;
    }
    items[n].r.order = n;
    n++;
  }
  if (count > 1)
    qsort(items, count, sizeof *items, storage_cmp);

  /* The tensors must tile the data exactly. */
  uint64_t expected = 0;
  for (size_t i = 0; i < count; i++) {
    const st_range *r = &items[i].r;
    if (r->begin != expected) {
      pulse_status st = pulse_fail(
          PULSE_ERR_OFFSETS,
          "safetensors: tensor '%.*s' begins at data offset %llu, but the "
          "tensors before it end at %llu (%s)",
          QUOTE_MAX, items[i].t.name, (unsigned long long)r->begin,
          (unsigned long long)expected,
          r->begin > expected ? "a gap" : "an overlap");
      free(items);
      return st;
    }
    expected = r->end;
    f->tensors[i] = items[i].t;
    f->tensors[i].data = f->bytes + data_offset + r->begin;
  }
  free(items);
  if (expected != data_size)
    return pulse_fail(PULSE_ERR_TRAILING,
                      "safetensors: %llu bytes of data after the last tensor",
                      (unsigned long long)(data_size - expected));
  f->count = count;
  for (size_t i = 0; i < count; i++)
    f->by_name[i] = &f->tensors[i];
  if (count > 1)
    qsort(f->by_name, count, sizeof *f->by_name, name_cmp);
  return PULSE_OK;
}

static pulse_status parse_header(pulse_st_file *f) {
  if (f->size < 8)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "safetensors: %zu bytes, fewer than the 8 of the header "
                      "length",
                      f->size);
  uint64_t hlen = pulse_load_le64(f->bytes);
  if (hlen > PULSE_ST_MAX_HEADER)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: header length %llu exceeds the limit of "
                      "%llu bytes",
                      (unsigned long long)hlen,
                      (unsigned long long)PULSE_ST_MAX_HEADER);
  if (hlen > f->size - 8)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "safetensors: header length %llu runs past the end of "
                      "the %zu-byte file",
                      (unsigned long long)hlen, f->size);
  const char *header = (const char *)f->bytes + 8;
  if (hlen == 0 || header[0] != '{')
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: header does not start with '{'");
  pulse_json_limits limits = PULSE_JSON_LIMITS_INIT;
  limits.max_bytes =
      (size_t)hlen * PULSE_ST_JSON_MEMORY_RATIO + ((size_t)1 << 20);
  pulse_status st = pulse_json_parse(header, (size_t)hlen, &limits, &f->doc);
  if (st != PULSE_OK)
    return fail_prefixed(st, "safetensors: header: ");
  const pulse_json *root = pulse_json_doc_root(f->doc);
  if (root->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON, "safetensors: header is not an object");
  const pulse_json *dup;
  PULSE_TRY(pulse_json_find_duplicate(root, &dup));
  if (dup != NULL)
    return pulse_fail(PULSE_ERR_DUPLICATE,
                      "safetensors: tensor name '%.*s' appears twice",
                      QUOTE_MAX, dup->key);
  return load_table(f, root, 8 + hlen);
}

pulse_status pulse_st_open_memory(const uint8_t *bytes, size_t size,
                                  pulse_st_file **out) {
  if (out == NULL || (bytes == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL argument");
  *out = NULL;
  pulse_st_file *f = calloc(1, sizeof *f);
  if (f == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: file handle");
  f->bytes = bytes;
  f->size = size;
  pulse_status st = parse_header(f);
  if (st != PULSE_OK) {
    pulse_st_close(f);
    return st;
  }
  *out = f;
  return PULSE_OK;
}

pulse_status pulse_st_open(const char *path, pulse_st_file **out) {
  if (path == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL argument");
  *out = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "safetensors: %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int e = errno;
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "safetensors: %s: %s", path, strerror(e));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "safetensors: %s: not a regular file",
                      path);
  }
  if ((uint64_t)sb.st_size > SIZE_MAX) {
    close(fd);
    return pulse_fail(PULSE_ERR_OVERFLOW, "safetensors: %s: too large", path);
  }
  size_t size = (size_t)sb.st_size;
  if (size < 8) {
    close(fd);
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "safetensors: %s: %zu bytes, fewer than the 8 of the "
                      "header length",
                      path, size);
  }
  void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  int e = errno;
  close(fd);
  if (map == MAP_FAILED)
    return pulse_fail(PULSE_ERR_IO, "safetensors: %s: mmap: %s", path,
                      strerror(e));
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open_memory(map, size, &f);
  if (st != PULSE_OK) {
    munmap(map, size);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "safetensors: %s: ", path);
    return fail_prefixed(st, prefix);
  }
  f->map = map;
  f->map_size = size;
  *out = f;
  return PULSE_OK;
}

size_t pulse_st_tensor_count(const pulse_st_file *file) {
  return file == NULL ? 0 : file->count;
}

pulse_status pulse_st_tensor_get(const pulse_st_file *file, size_t i,
                                 pulse_st_tensor *out) {
  if (file == NULL || out == NULL || i >= file->count)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: no tensor %zu", i);
  *out = file->tensors[i];
  return PULSE_OK;
}

pulse_status pulse_st_tensor_find(const pulse_st_file *file, const char *name,
                                  pulse_st_tensor *out) {
  if (file == NULL || name == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL argument");
  size_t lo = 0, hi = file->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const pulse_st_tensor *t = file->by_name[mid];
    int c = strcmp(t->name, name);
    if (c == 0) {
      *out = *t;
      return PULSE_OK;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return pulse_fail(PULSE_ERR_NOT_FOUND, "safetensors: no tensor '%.*s'",
                    QUOTE_MAX, name);
}

const char *pulse_st_metadata_get(const pulse_st_file *file, const char *key) {
  if (file == NULL || key == NULL)
    return NULL;
  size_t lo = 0, hi = file->meta_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(file->meta[mid]->key, key);
    if (c == 0)
      return file->meta[mid]->text;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

size_t pulse_st_metadata_count(const pulse_st_file *file) {
  return file == NULL ? 0 : file->meta_count;
}

pulse_status pulse_st_metadata_at(const pulse_st_file *file, size_t i,
                                  const char **key, const char **value) {
  if (file == NULL || i >= file->meta_count)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: no metadata entry %zu", i);
  if (key != NULL)
    *key = file->meta[i]->key;
  if (value != NULL)
    *value = file->meta[i]->text;
  return PULSE_OK;
}
