/* patch_open.c - parses and checks a patch's header and tensor table.
 * Everything here reads untrusted bytes: every length, count and offset is
 * checked against the buffer before it is used, and allocations grow only
 * with bytes actually read. */
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "chunk_v3_impl.h"
#include "patch_impl.h"
#include "status_impl.h"

typedef struct {
  void *data;
  size_t count, capacity, elem;
} grow_array;

static int grow_push(grow_array *a, const void *v) {
  if (a->count == a->capacity) {
    size_t cap = a->capacity ? a->capacity * 2 : 16;
    void *p = realloc(a->data, cap * a->elem);
    if (p == NULL)
      return 0;
    a->data = p;
    a->capacity = cap;
  }
  memcpy((char *)a->data + a->count * a->elem, v, a->elem);
  a->count++;
  return 1;
}

static int name_cmp(const void *a, const void *b) {
  const patch_tensor *x = *(const patch_tensor *const *)a;
  const patch_tensor *y = *(const patch_tensor *const *)b;
  return strcmp(x->info.name, y->info.name);
}

void pulse_patch_free(pulse_patch *p) {
  if (p == NULL)
    return;
  free(p->tensors);
  free(p->names);
  free(p->by_name);
  free(p->chunk_changed);
  free(p->chunk_offset);
  free(p->chunk_size);
  free(p->chunk_before);
  pulse_v3_model_free(p->values);
  free(p);
}

/* numel from the shape, and the change count within it. */
static pulse_status check_counts(patch_tensor *t, size_t i) {
  if (pulse_shape_numel(t->info.shape, t->info.ndim, &t->numel) != PULSE_OK)
    return pulse_fail(PULSE_ERR_OVERFLOW, "patch: tensor %zu: element count overflows", i);
  if (t->changed > t->numel)
    return pulse_fail(PULSE_ERR_OVERFLOW, "patch: tensor %zu: %llu changes in %llu elements", i,
                      (unsigned long long)t->changed, (unsigned long long)t->numel);
  return PULSE_OK;
}

/* Chunks of tensor t (0 for an empty one). */
static uint64_t tensor_chunks(const pulse_patch *p, const patch_tensor *t) {
  return t->numel ? ((t->numel - 1) >> p->chunk_log2) + 1 : 0;
}

/* Version 3 sends what a receiver can derive only once: the section size
 * only for a tensor of one chunk with changes (of several, it is the sum of
 * the chunk entries; without changes, 0), and the target digest only when
 * there are changes (without, it is the base's). */
static pulse_status parse_tensor_rest_v3(const pulse_patch *p, pulse_reader *r, size_t i,
                                         patch_tensor *t) {
  if (!r->ok)
    return pulse_fail(PULSE_ERR_TRUNCATED, "patch: tensor table ends inside tensor %zu", i);
  PULSE_TRY(check_counts(t, i));
  t->section_size = t->changed > 0 && tensor_chunks(p, t) == 1 ? pulse_reader_varint(r) : 0;
  t->base_digest.a = pulse_reader_le(r, 8);
  t->base_digest.b = pulse_reader_le(r, 8);
  t->target_digest = t->base_digest;
  if (t->changed > 0) {
    t->target_digest.a = pulse_reader_le(r, 8);
    t->target_digest.b = pulse_reader_le(r, 8);
  }
  if (!r->ok)
    return pulse_fail(PULSE_ERR_TRUNCATED, "patch: tensor table ends inside tensor %zu", i);
  return PULSE_OK;
}

/* One tensor's fixed fields: name (copied into p->names at *names_used;
 * info.name holds its offset until parse_table fixes it up), dtype, shape,
 * change count, section size and digests. */
static pulse_status parse_tensor_head(pulse_patch *p, pulse_reader *r, size_t i,
                                      size_t *names_used) {
  patch_tensor *t = &p->tensors[i];
  uint64_t name_len = pulse_reader_varint(r);
  const uint8_t *name =
      r->ok && name_len <= PULSE_MAX_NAME ? pulse_reader_span(r, (size_t)name_len) : NULL;
  if (!r->ok || name == NULL)
    return pulse_fail(r->ok ? PULSE_ERR_CORRUPT : PULSE_ERR_TRUNCATED,
                      "patch: tensor %zu: name missing or longer than %d bytes", i, PULSE_MAX_NAME);
  if (name_len == 0 || memchr(name, 0, (size_t)name_len) != NULL)
    return pulse_fail(PULSE_ERR_CORRUPT, "patch: tensor %zu: empty name or NUL in name", i);
  memcpy(p->names + *names_used, name, (size_t)name_len);
  p->names[*names_used + name_len] = '\0';
  t->info.name = (const char *)(uintptr_t)*names_used; /* fixed up by parse_table */
  *names_used += (size_t)name_len + 1;

  uint8_t dtype = pulse_reader_u8(r), ndim = pulse_reader_u8(r);
  if (r->ok && dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE, "patch: tensor %zu: dtype %u (v1 carries BF16 only)", i, dtype);
  if (r->ok && ndim > PULSE_MAX_DIMS)
    return pulse_fail(PULSE_ERR_CORRUPT, "patch: tensor %zu: %u dimensions", i, ndim);
  t->info.dtype = PULSE_DTYPE_BF16;
  t->info.ndim = ndim;
  for (unsigned d = 0; d < ndim; d++)
    t->info.shape[d] = pulse_reader_varint(r);
  t->changed = pulse_reader_varint(r);
  if (p->version == 3)
    return parse_tensor_rest_v3(p, r, i, t);
  t->section_size = pulse_reader_varint(r);
  t->base_digest.a = pulse_reader_le(r, 8);
  t->base_digest.b = pulse_reader_le(r, 8);
  t->target_digest.a = pulse_reader_le(r, 8);
  t->target_digest.b = pulse_reader_le(r, 8);
  if (!r->ok)
    return pulse_fail(PULSE_ERR_TRUNCATED, "patch: tensor table ends inside tensor %zu", i);
  return check_counts(t, i);
}

/* One tensor's chunk entries: every one is read (so a claimed count must be
 * backed by bytes) before its arrays grow. */
static pulse_status parse_chunk_entries(pulse_patch *p, pulse_reader *r, size_t i,
                                        uint64_t body_left, grow_array *changed,
                                        grow_array *size) {
  patch_tensor *t = &p->tensors[i];
  uint64_t k_sum = 0, bytes_sum = 0;
  /* Version 3: one chunk's entry is the tensor's counts; several chunks'
   * bytes make the section, bounded by the body left. */
  const int v3_one = p->version == 3 && t->chunk_count == 1;
  if (p->version == 3 && !v3_one)
    t->section_size = body_left;
  for (uint64_t c = 0; c < t->chunk_count; c++) {
    uint64_t k = v3_one ? t->changed : pulse_reader_varint(r);
    uint64_t bytes = v3_one ? t->section_size : pulse_reader_varint(r);
    if (!r->ok)
      return pulse_fail(PULSE_ERR_TRUNCATED, "patch: tensor %zu: chunk table truncated", i);
    uint32_t elems = (uint32_t)(((t->numel - (c << p->chunk_log2)) < (1ull << p->chunk_log2))
                                    ? t->numel - (c << p->chunk_log2)
                                    : (1ull << p->chunk_log2));
    if (k > elems || (k == 0) != (bytes == 0) || bytes > t->section_size - bytes_sum)
      return pulse_fail(PULSE_ERR_CORRUPT, "patch: tensor %zu chunk %llu: %llu changes in %llu bytes",
                        i, (unsigned long long)c, (unsigned long long)k, (unsigned long long)bytes);
    uint32_t k32 = (uint32_t)k;
    if (!grow_push(changed, &k32) || !grow_push(size, &bytes))
      return pulse_fail(PULSE_ERR_NOMEM, "patch: chunk table");
    k_sum += k;
    bytes_sum += bytes;
  }
  if (p->version == 3 && !v3_one)
    t->section_size = bytes_sum;
  if (k_sum != t->changed || bytes_sum != t->section_size)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "patch: tensor %zu: chunks hold %llu changes in %llu bytes, table says %llu in %llu",
                      i, (unsigned long long)k_sum, (unsigned long long)bytes_sum,
                      (unsigned long long)t->changed, (unsigned long long)t->section_size);
  return PULSE_OK;
}

/* Names to pointers, and each chunk's body offset and changes before it. */
static pulse_status index_chunks(pulse_patch *p) {
  p->chunk_offset = calloc(p->chunks + 1, sizeof *p->chunk_offset);
  p->chunk_before = calloc(p->chunks + 1, sizeof *p->chunk_before);
  if (p->chunk_offset == NULL || p->chunk_before == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "patch: chunk offsets");
  for (size_t i = 0; i < p->count; i++) {
    patch_tensor *t = &p->tensors[i];
    t->info.name = p->names + (uintptr_t)t->info.name;
    if (t->changed == 0)
      continue;
    uint64_t at = t->section_offset, before = 0;
    for (uint64_t c = 0; c < t->chunk_count; c++) {
      p->chunk_offset[t->chunk_first + c] = at;
      p->chunk_before[t->chunk_first + c] = before;
      at += p->chunk_size[t->chunk_first + c];
      before += p->chunk_changed[t->chunk_first + c];
    }
  }
  return PULSE_OK;
}

/* Version 3's value model: the rest of the table, parsed whole before any
 * chunk decodes against it (every chunk of the patch codes its values with
 * it, so a receiver reading some sections has it with the table). */
static pulse_status parse_value_model(pulse_patch *p, pulse_reader *r) {
  size_t used = 0;
  pulse_status st = pulse_v3_model_read(r->p, r->left, &used, &p->values);
  if (st != PULSE_OK)
    return pulse_fail(st, "patch: %s", pulse_error_detail());
  if (used > r->left) /* the reader never says more than it was given */
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "patch: value model runs past the table");
  p->values_size = used;
  r->p += used;
  r->left -= used;
  return PULSE_OK;
}

/* Every tensor entry, then checks that the sections tile the body and the
 * change counts add up to the header's. */
static pulse_status parse_entries(pulse_patch *p, pulse_reader *r, uint64_t body_offset,
                                  uint64_t body_size, grow_array *changed, grow_array *size) {
  size_t names_used = 0;
  uint64_t section_at = body_offset, total_changed = 0;
  for (size_t i = 0; i < p->count; i++) {
    patch_tensor *t = &p->tensors[i];
    PULSE_TRY(parse_tensor_head(p, r, i, &names_used));
    const uint64_t body_left = body_size - (section_at - body_offset);
    if (t->section_size > body_left)
      return pulse_fail(PULSE_ERR_OVERFLOW, "patch: tensor %zu: section runs past the body", i);
    t->section_offset = section_at;
    total_changed += t->changed; /* <= sum of numel; overflow checked below */
    if (total_changed < t->changed)
      return pulse_fail(PULSE_ERR_OVERFLOW, "patch: total change count overflows");
    t->chunk_count = tensor_chunks(p, t);
    t->chunk_first = changed->count;
    if (t->changed == 0) {
      if (t->section_size != 0)
        return pulse_fail(PULSE_ERR_CORRUPT, "patch: tensor %zu: bytes but no changes", i);
      continue;
    }
    PULSE_TRY(parse_chunk_entries(p, r, i, body_left, changed, size));
    section_at += t->section_size; /* version 3: known only now */
  }
  /* Version 3: the value model closes the table of a patch with changes. */
  if (p->version == 3 && p->total_changed > 0)
    PULSE_TRY(parse_value_model(p, r));
  if (r->left != 0)
    return pulse_fail(PULSE_ERR_TRAILING, "patch: %zu bytes after the tensor table", r->left);
  if (section_at - body_offset != body_size)
    return pulse_fail(PULSE_ERR_CORRUPT, "patch: sections cover %llu of %llu body bytes",
                      (unsigned long long)(section_at - body_offset), (unsigned long long)body_size);
  if (total_changed != p->total_changed)
    return pulse_fail(PULSE_ERR_CORRUPT, "patch: tensors hold %llu changes, header says %llu",
                      (unsigned long long)total_changed, (unsigned long long)p->total_changed);
  return PULSE_OK;
}

static pulse_status parse_table(pulse_patch *p, const uint8_t *table, size_t table_size,
                                uint64_t body_offset, uint64_t body_size) {
  pulse_reader r = pulse_reader_make(table, table_size);
  /* A tensor entry takes at least 38 bytes (version 3: 21), so the count is
   * bounded by the table before anything is allocated for it. */
  if (p->count > table_size / (p->version == 3 ? 21u : 38u))
    return pulse_fail(PULSE_ERR_TRUNCATED, "patch: %zu tensors cannot fit a %zu-byte table",
                      p->count, table_size);
  p->tensors = calloc(p->count + 1, sizeof *p->tensors);
  p->names = malloc(table_size + 1); /* names are shorter than the table */
  if (p->tensors == NULL || p->names == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "patch: table of %zu tensors", p->count);
  grow_array changed = {NULL, 0, 0, sizeof(uint32_t)}, size = {NULL, 0, 0, sizeof(uint64_t)};
  pulse_status st = parse_entries(p, &r, body_offset, body_size, &changed, &size);
  if (st != PULSE_OK) {
    free(changed.data);
    free(size.data);
    return st;
  }
  p->chunks = changed.count;
  p->chunk_changed = changed.data;
  p->chunk_size = size.data;
  return index_chunks(p);
}

/* Sorts the table into p->by_name, which refuses a name twice and keeps
 * pulse_patch_tensor_find O(log n): a worker that looks up each of its
 * thousands of expert tensors must not pay O(n) for each. */
static pulse_status index_names(pulse_patch *p) {
  p->by_name = malloc((p->count + 1) * sizeof *p->by_name);
  if (p->by_name == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "patch: name index");
  for (size_t i = 0; i < p->count; i++)
    p->by_name[i] = &p->tensors[i];
  qsort(p->by_name, p->count, sizeof *p->by_name, name_cmp);
  for (size_t i = 1; i < p->count; i++)
    if (strcmp(p->by_name[i - 1]->info.name, p->by_name[i]->info.name) == 0)
      return pulse_fail(PULSE_ERR_DUPLICATE, "patch: tensor '%s' appears twice",
                        p->by_name[i]->info.name);
  return PULSE_OK;
}

pulse_status pulse_patch_open(const uint8_t *bytes, size_t size, pulse_patch **out) {
  if (out == NULL || (bytes == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "patch: NULL argument");
  *out = NULL;
  pulse_reader r = pulse_reader_make(bytes, size);
  const uint8_t *magic = pulse_reader_span(&r, 8);
  if (magic == NULL)
    return pulse_fail(PULSE_ERR_TRUNCATED, "patch: %zu bytes, shorter than the magic", size);
  if (memcmp(magic, PULSE_PATCH_MAGIC, 8) != 0)
    return pulse_fail(PULSE_ERR_MAGIC, "patch: bad magic (not a pulse patch)");
  uint16_t version = (uint16_t)pulse_reader_le(&r, 2);
  if (r.ok && version > PULSE_PATCH_VERSION_MAX)
    return pulse_fail(
        PULSE_ERR_VERSION,
        "patch: format version %u is newer than this decoder (%u..%u)", version,
        PULSE_PATCH_VERSION_MIN, PULSE_PATCH_VERSION_MAX);
  if (r.ok && version < PULSE_PATCH_VERSION_MIN)
    return pulse_fail(PULSE_ERR_VERSION,
                      "patch: format version %u, this decoder knows %u..%u",
                      version, PULSE_PATCH_VERSION_MIN,
                      PULSE_PATCH_VERSION_MAX);
  pulse_patch *p = calloc(1, sizeof *p);
  if (p == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "patch: handle");
  p->bytes = bytes;
  p->size = size;
  p->version = version;
  uint8_t model = pulse_reader_u8(&r);
  p->chunk_log2 = pulse_reader_u8(&r);
  uint64_t table_size = pulse_reader_le(&r, 4);
  p->step = pulse_reader_le(&r, 8);
  p->base_step = pulse_reader_le(&r, 8);
  pulse_reader_take(&r, p->base_digest.bytes, 32);
  pulse_reader_take(&r, p->target_digest.bytes, 32);
  uint64_t count = pulse_reader_le(&r, 8);
  p->total_changed = pulse_reader_le(&r, 8);
  uint64_t body_size = pulse_reader_le(&r, 8);
  pulse_status st = PULSE_OK;
  if (!r.ok) {
    st = pulse_fail(PULSE_ERR_TRUNCATED, "patch: %zu bytes, shorter than the %u-byte header",
                    size, PULSE_PATCH_FIXED_HEADER);
  } else if (model != PULSE_POS_PLAIN && model != PULSE_POS_CLASS) {
    st = pulse_fail(PULSE_ERR_VERSION, "patch: unknown position model %u", model);
  } else if (p->chunk_log2 < PULSE_CHUNK_LOG2_MIN || p->chunk_log2 > PULSE_CHUNK_LOG2_MAX) {
    st = pulse_fail(PULSE_ERR_CORRUPT, "patch: chunk size 2^%u outside 2^%u..2^%u", p->chunk_log2,
                    PULSE_CHUNK_LOG2_MIN, PULSE_CHUNK_LOG2_MAX);
  } else if (table_size > r.left || body_size != r.left - table_size) {
    /* Compared without adding, so a size near 2^64 cannot wrap. */
    int truncated = table_size > r.left || body_size > r.left - table_size;
    st = pulse_fail(truncated ? PULSE_ERR_TRUNCATED : PULSE_ERR_TRAILING,
                    "patch: header says %llu table + %llu body bytes, %zu follow",
                    (unsigned long long)table_size, (unsigned long long)body_size, r.left);
  } else if (count > SIZE_MAX / sizeof(patch_tensor)) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "patch: tensor count %llu", (unsigned long long)count);
  }
  if (st == PULSE_OK) {
    p->model = (pulse_pos_model)model;
    p->count = (size_t)count;
    st = parse_table(p, r.p, (size_t)table_size, PULSE_PATCH_FIXED_HEADER + table_size, body_size);
  }
  if (st == PULSE_OK)
    st = index_names(p);
  if (st != PULSE_OK) {
    pulse_patch_free(p);
    return st;
  }
  *out = p;
  return PULSE_OK;
}

uint64_t pulse_patch_step(const pulse_patch *p) { return p->step; }
uint64_t pulse_patch_base_step(const pulse_patch *p) { return p->base_step; }
unsigned pulse_patch_format_version(const pulse_patch *p) { return p->version; }
size_t pulse_patch_value_model_size(const pulse_patch *p) {
  return p->values_size;
}

void pulse_patch_versions_supported(unsigned *oldest, unsigned *newest) {
  if (oldest != NULL)
    *oldest = PULSE_PATCH_VERSION_MIN;
  if (newest != NULL)
    *newest = PULSE_PATCH_VERSION_MAX;
}
pulse_pos_model pulse_patch_pos_model(const pulse_patch *p) { return p->model; }
uint32_t pulse_patch_chunk_log2(const pulse_patch *p) { return p->chunk_log2; }
const pulse_state_digest *pulse_patch_base_digest(const pulse_patch *p) { return &p->base_digest; }
const pulse_state_digest *pulse_patch_target_digest(const pulse_patch *p) { return &p->target_digest; }
size_t pulse_patch_tensor_count(const pulse_patch *p) { return p->count; }
uint64_t pulse_patch_total_changed(const pulse_patch *p) { return p->total_changed; }

pulse_status pulse_patch_tensor_get(const pulse_patch *p, size_t i, pulse_patch_tensor *out) {
  if (p == NULL || out == NULL || i >= p->count)
    return pulse_fail(PULSE_ERR_ARG, "patch: no tensor %zu", i);
  const patch_tensor *t = &p->tensors[i];
  out->info = t->info;
  out->numel = t->numel;
  out->changed = t->changed;
  out->section_size = t->section_size;
  out->chunk_count = (uint32_t)(t->changed ? t->chunk_count : 0);
  out->base_digest = t->base_digest;
  out->target_digest = t->target_digest;
  return PULSE_OK;
}

pulse_status pulse_patch_tensor_find(const pulse_patch *p, const char *name, size_t *index) {
  if (p == NULL || name == NULL || index == NULL)
    return pulse_fail(PULSE_ERR_ARG, "patch: NULL argument");
  size_t lo = 0, hi = p->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(p->by_name[mid]->info.name, name);
    if (c == 0) {
      *index = (size_t)(p->by_name[mid] - p->tensors);
      return PULSE_OK;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return pulse_fail(PULSE_ERR_NOT_FOUND, "patch: no tensor '%s'", name);
}
