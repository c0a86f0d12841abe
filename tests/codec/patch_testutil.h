/* patch_testutil.h - helpers shared by the patch tests, the patch fuzzer and
 * the corpus generator: a seeded PRNG, BF16 weights with a realistic spread
 * of exponents, change lists at a given density, the encoder's tensor table,
 * and a parser/writer of the wire layout written here from the format text
 * (so tests can edit any field and re-serialize).
 *
 * No Criterion in here (the fuzzer and the generator include it too): helpers
 * report through return values, and a failed allocation aborts. */
#ifndef PULSE_PATCH_TESTUTIL_H
#define PULSE_PATCH_TESTUTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_elem.h"
#include "rng_impl.h"

#define PT_COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))
#define PT_NONE UINT64_MAX /* "no mismatch" from the compare helpers */

/* ------------------------------------------------------------------ PRNG */

/* codec/runtime/rng_impl.h: pulse_rng_next, pulse_rng_below, pulse_rng_uniform. */

static inline void *pt_alloc(size_t bytes) {
  void *p = calloc(bytes ? bytes : 1, 1);
  if (p == NULL) {
    fprintf(stderr, "patch_testutil: out of memory (%zu bytes)\n", bytes);
    abort();
  }
  return p;
}

static inline uint16_t *pt_copy(const uint16_t *bits, uint64_t n) {
  uint16_t *c = pt_alloc((size_t)n * sizeof *c);
  if (n)
    memcpy(c, bits, (size_t)n * sizeof *c);
  return c;
}

/* Index of the first differing element, or PT_NONE. */
static inline uint64_t pt_first_diff(const uint16_t *a, const uint16_t *b,
                                     uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (a[i] != b[i])
      return i;
  return PT_NONE;
}

/* ---------------------------------------------------------- BF16 values */

/* NaN payloads, infinities, both zeros, subnormals, largest finite. */
static const uint16_t pt_edge_bits[] = {
    0x7FC1, 0xFFC0, 0x7FC0, 0x7F80, 0xFF80, 0x8000, 0x0000, 0x0001,
    0x8001, 0x7F7F, 0xFF7F, 0x007F, 0x0080, 0x7F81, 0xFFFF, 0x3F80};

/* BF16 bits of N(0, 1) * scale through the one rounding: weights of a real
 * layer span a dozen or more exponents, so the class model sees many
 * classes. */
static inline uint16_t pt_normal_bf16(uint64_t *s, double scale) {
  double u1 = ((double)(pulse_rng_next(s) >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(pulse_rng_next(s) >> 11) * 0x1p-53;
  float f = (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2) * scale);
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return pulse_bf16_from_f32_bits(u);
}

typedef enum {
  PT_WEIGHTS_NORMAL, /* N(0, 1) * 0.02 */
  PT_WEIGHTS_ANY,    /* any 16 bits, NaNs and infinities included */
  PT_WEIGHTS_EDGE,   /* edge values mixed into normal weights */
  PT_WEIGHTS_CONST   /* one value: a single position class */
} pt_weights;

static inline uint16_t pt_weight(uint64_t *s, pt_weights kind) {
  switch (kind) {
  case PT_WEIGHTS_ANY:
    return (uint16_t)pulse_rng_next(s);
  case PT_WEIGHTS_EDGE:
    if (pulse_rng_below(s, 3) == 0)
      return pt_edge_bits[pulse_rng_below(s, PT_COUNT_OF(pt_edge_bits))];
    return pt_normal_bf16(s, 0.02);
  case PT_WEIGHTS_CONST:
    return 0x3C23;
  default:
    return pt_normal_bf16(s, 0.02);
  }
}

/* A non-zero bit delta: mostly Adam-like +-1..3 ulps, sometimes a sign flip
 * (0x8000), the extremes 0x7FFF/0x8001, or any 16 bits. */
static inline uint16_t pt_delta(uint64_t *s) {
  static const uint16_t usual[] = {1,      0xFFFF, 2,      0xFFFE, 3,
                                   0xFFFD, 0x8000, 0x7FFF, 0x8001};
  uint64_t r = pulse_rng_next(s);
  if ((r & 3u) != 0)
    return usual[(r >> 8) % PT_COUNT_OF(usual)];
  uint16_t d = (uint16_t)(r >> 32);
  return d != 0 ? d : 0x4000;
}

/* New bits for an element whose old bits are `old` (never equal to old):
 * a delta, or with edge values on, an edge value. */
static inline uint16_t pt_new_bits(uint64_t *s, uint16_t old, int edges) {
  if (edges && pulse_rng_below(s, 4) == 0) {
    uint16_t e = pt_edge_bits[pulse_rng_below(s, PT_COUNT_OF(pt_edge_bits))];
    if (e != old)
      return e;
  }
  return pulse_bf16_undelta(old, pt_delta(s));
}

static inline void pt_push(pulse_changes *c, uint64_t pos, uint16_t old_bits,
                           uint16_t new_bits) {
  if (pulse_changes_push(c, pos, old_bits, new_bits) != PULSE_OK)
    abort();
}

/* Appends changes of base at the given density (each element on its own;
 * density >= 1 changes every element) to `out`, increasing positions. */
static inline void pt_make_changes(const uint16_t *base, uint64_t n,
                                   double density, int edges, uint64_t *s,
                                   pulse_changes *out) {
  for (uint64_t i = 0; i < n; i++)
    if (density >= 1.0 || (density > 0.0 && pulse_rng_uniform(s) < density))
      pt_push(out, i, base[i], pt_new_bits(s, base[i], edges));
}

/* dst[pos] = new bits for every change. */
static inline void pt_apply_changes(uint16_t *dst, const pulse_changes *c) {
  for (uint64_t j = 0; j < c->count; j++)
    dst[c->pos[j]] = c->new_bits[j];
}

/* The change list from a to b. */
static inline void pt_diff(const uint16_t *a, const uint16_t *b, uint64_t n,
                           pulse_changes *out) {
  for (uint64_t i = 0; i < n; i++)
    if (a[i] != b[i])
      pt_push(out, i, a[i], b[i]);
}

/* Index of the first differing change (or the shorter count), or PT_NONE. */
static inline uint64_t pt_changes_diff(const pulse_changes *a,
                                       const pulse_changes *b) {
  uint64_t n = a->count < b->count ? a->count : b->count;
  for (uint64_t j = 0; j < n; j++)
    if (a->pos[j] != b->pos[j] || a->old_bits[j] != b->old_bits[j] ||
        a->new_bits[j] != b->new_bits[j])
      return j;
  return a->count == b->count ? PT_NONE : n;
}

/* --------------------------------------------------------------- tensors */

#define PT_NAME_MAX 64

/* One tensor of a test state: base, changes and the target they make. */
typedef struct {
  char name[PT_NAME_MAX];
  uint32_t ndim;
  uint64_t shape[PULSE_MAX_DIMS];
  uint64_t numel;
  uint16_t *base;
  uint16_t *target;
  pulse_changes changes;
} pt_tensor;

static inline void pt_tensor_shape(pt_tensor *t, const char *name,
                                   uint32_t ndim, const uint64_t *shape) {
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->ndim = ndim;
  t->numel = 1;
  for (uint32_t d = 0; d < ndim; d++) {
    t->shape[d] = shape[d];
    t->numel *= shape[d];
  }
  t->changes = (pulse_changes)PULSE_CHANGES_INIT;
}

/* A tensor of `numel` elements (1-D) or any shape, with base weights of
 * `kind`, changes at `density` and the target they make. */
static inline void pt_tensor_make(pt_tensor *t, const char *name, uint32_t ndim,
                                  const uint64_t *shape, pt_weights kind,
                                  double density, int edges, uint64_t seed) {
  pt_tensor_shape(t, name, ndim, shape);
  uint64_t s = seed * 0x100000001B3ull + t->numel;
  t->base = pt_alloc((size_t)t->numel * sizeof *t->base);
  for (uint64_t i = 0; i < t->numel; i++)
    t->base[i] = pt_weight(&s, kind);
  pt_make_changes(t->base, t->numel, density, edges, &s, &t->changes);
  t->target = pt_copy(t->base, t->numel);
  pt_apply_changes(t->target, &t->changes);
}

static inline void pt_tensor_make1(pt_tensor *t, const char *name,
                                   uint64_t numel, pt_weights kind,
                                   double density, int edges, uint64_t seed) {
  pt_tensor_make(t, name, 1, &numel, kind, density, edges, seed);
}

static inline void pt_tensor_free(pt_tensor *t) {
  free(t->base);
  free(t->target);
  pulse_changes_free(&t->changes);
  t->base = t->target = NULL;
}

static inline void pt_tensors_free(pt_tensor *ts, size_t n) {
  for (size_t i = 0; i < n; i++)
    pt_tensor_free(&ts[i]);
}

static inline pulse_tensor_info pt_info(const pt_tensor *t) {
  pulse_tensor_info info;
  memset(&info, 0, sizeof info);
  info.name = t->name;
  info.dtype = PULSE_DTYPE_BF16;
  info.ndim = t->ndim;
  memcpy(info.shape, t->shape, sizeof info.shape);
  return info;
}

/* The encoder's table for ts (pointers borrow from ts). */
static inline void pt_encode_table(const pt_tensor *ts, size_t n,
                                   pulse_encode_tensor *out) {
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].info = pt_info(&ts[i]);
    out[i].base = ts[i].base;
    out[i].changes = &ts[i].changes;
  }
}

static inline pulse_encode_opts pt_opts(pulse_pos_model model,
                                        uint32_t chunk_log2, int threads) {
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.pos_model = model;
  o.chunk_log2 = chunk_log2;
  o.threads = threads;
  o.step = 8;
  o.base_step = 7;
  return o;
}

/* Encodes ts; returns the encoder's status. */
static inline pulse_status pt_encode(const pulse_encode_opts *o,
                                     const pt_tensor *ts, size_t n,
                                     pulse_buffer *out) {
  pulse_encode_tensor *enc = pt_alloc((n + 1) * sizeof *enc);
  pt_encode_table(ts, n, enc);
  pulse_status st = pulse_patch_encode(o, enc, n, out);
  free(enc);
  return st;
}

/* Working copies of every base, as apply targets (free with
 * pt_hosts_free). */
static inline pulse_host_tensor *pt_hosts(const pt_tensor *ts, size_t n) {
  pulse_host_tensor *h = pt_alloc((n + 1) * sizeof *h);
  for (size_t i = 0; i < n; i++) {
    h[i].name = ts[i].name;
    h[i].data = pt_copy(ts[i].base, ts[i].numel);
    h[i].numel = ts[i].numel;
    h[i].digest = NULL;
  }
  return h;
}

static inline void pt_hosts_free(pulse_host_tensor *h, size_t n) {
  for (size_t i = 0; h && i < n; i++)
    free(h[i].data);
  free(h);
}

/* ------------------------------------------------ deterministic fuzz base */

/* Base bits of element i of tensor t as the fuzzer builds them: a pattern
 * over five exponents (so the class model sees several classes), both
 * signs, no floating point. The corpus seeds are encoded against it, so the
 * fuzzer's apply succeeds on them. */
static inline uint16_t pt_fuzz_base_bits(size_t t, uint64_t i) {
  uint64_t x = i * 0x9E3779B1ull + (uint64_t)t * 0x85EBCA77ull;
  unsigned exponent = 0x76u + (unsigned)((x >> 7) % 5u);
  unsigned sign = (unsigned)((x >> 13) & 1u) << 15;
  return (uint16_t)(sign | exponent << 7 | (unsigned)(x & 0x7Fu));
}

/* ------------------------------------------------- wire layout, by hand */

typedef struct {
  uint64_t changed, bytes;
} pt_raw_chunk;

#define PT_RAW_DIMS 16

typedef struct {
  uint8_t name[PULSE_MAX_NAME + 16];
  size_t name_len;
  uint8_t dtype, ndim;
  uint64_t dims[PT_RAW_DIMS];
  uint64_t changed, section_size;
  uint64_t digest[4]; /* base a, b, target a, b */
  size_t chunk_count; /* entries written (parsed: those of the format) */
  pt_raw_chunk *chunks;
} pt_raw_tensor;

typedef struct {
  uint8_t magic[8];
  uint16_t version;
  uint8_t model, chunk_log2;
  uint32_t table_size;
  uint64_t step, base_step;
  uint8_t base_state[32], target_state[32];
  uint64_t count, total_changed, body_size;
  size_t tensors_len;
  pt_raw_tensor *tensors;
  uint8_t *body;
  size_t body_len;
  uint8_t *values; /* version 3: the value model closing the table, as is */
  size_t values_len;
  uint8_t *extra_table; /* appended to the table as is */
  size_t extra_table_len;
} pt_raw_patch;

#define PT_HEADER_SIZE 120u
/* Offsets of the fixed header fields. */
#define PT_OFF_VERSION 8u
#define PT_OFF_MODEL 10u
#define PT_OFF_CHUNK_LOG2 11u
#define PT_OFF_TABLE_SIZE 12u
#define PT_OFF_STEP 16u
#define PT_OFF_BASE_STEP 24u
#define PT_OFF_BASE_STATE 32u
#define PT_OFF_TARGET_STATE 64u
#define PT_OFF_COUNT 96u
#define PT_OFF_TOTAL_CHANGED 104u
#define PT_OFF_BODY_SIZE 112u

typedef struct {
  const uint8_t *p;
  size_t left;
  int ok;
} pt_rd;

static inline uint64_t pt_rd_le(pt_rd *r, int n) {
  if (!r->ok || (size_t)n > r->left) {
    r->ok = 0;
    return 0;
  }
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = v << 8 | r->p[i];
  r->p += n;
  r->left -= (size_t)n;
  return v;
}

static inline uint64_t pt_rd_varint(pt_rd *r) {
  uint64_t v = 0;
  for (int i = 0; i < 10; i++) {
    uint64_t b = pt_rd_le(r, 1);
    v |= (b & 0x7F) << (7 * i);
    if (!(b & 0x80))
      return v;
  }
  r->ok = 0;
  return 0;
}

static inline void pt_rd_bytes(pt_rd *r, void *dst, size_t n) {
  if (!r->ok || n > r->left) {
    r->ok = 0;
    return;
  }
  memcpy(dst, r->p, n);
  r->p += n;
  r->left -= n;
}

static inline void pt_raw_free(pt_raw_patch *raw) {
  for (size_t i = 0; raw->tensors && i < raw->tensors_len; i++)
    free(raw->tensors[i].chunks);
  free(raw->tensors);
  free(raw->body);
  free(raw->values);
  free(raw->extra_table);
  memset(raw, 0, sizeof *raw);
}

/* Parses a valid patch into raw (1) or fails (0) on anything unexpected. */
static inline int pt_raw_parse(const uint8_t *bytes, size_t size,
                               pt_raw_patch *raw) {
  memset(raw, 0, sizeof *raw);
  pt_rd r = {bytes, size, 1};
  pt_rd_bytes(&r, raw->magic, 8);
  raw->version = (uint16_t)pt_rd_le(&r, 2);
  raw->model = (uint8_t)pt_rd_le(&r, 1);
  raw->chunk_log2 = (uint8_t)pt_rd_le(&r, 1);
  raw->table_size = (uint32_t)pt_rd_le(&r, 4);
  raw->step = pt_rd_le(&r, 8);
  raw->base_step = pt_rd_le(&r, 8);
  pt_rd_bytes(&r, raw->base_state, 32);
  pt_rd_bytes(&r, raw->target_state, 32);
  raw->count = pt_rd_le(&r, 8);
  raw->total_changed = pt_rd_le(&r, 8);
  raw->body_size = pt_rd_le(&r, 8);
  if (!r.ok || raw->count > 1000000 || raw->chunk_log2 > 40 ||
      raw->table_size > r.left)
    return 0;
  raw->tensors_len = (size_t)raw->count;
  raw->tensors = pt_alloc((raw->tensors_len + 1) * sizeof *raw->tensors);
  pt_rd t = {r.p, raw->table_size, 1};
  for (size_t i = 0; i < raw->tensors_len && t.ok; i++) {
    pt_raw_tensor *e = &raw->tensors[i];
    e->name_len = (size_t)pt_rd_varint(&t);
    if (e->name_len > PULSE_MAX_NAME)
      return 0;
    pt_rd_bytes(&t, e->name, e->name_len);
    e->dtype = (uint8_t)pt_rd_le(&t, 1);
    e->ndim = (uint8_t)pt_rd_le(&t, 1);
    if (e->ndim > PT_RAW_DIMS)
      return 0;
    uint64_t numel = 1;
    for (unsigned d = 0; d < e->ndim; d++) {
      e->dims[d] = pt_rd_varint(&t);
      numel *= e->dims[d];
    }
    e->changed = pt_rd_varint(&t);
    uint64_t chunks = e->changed > 0 ? ((numel - 1) >> raw->chunk_log2) + 1 : 0;
    /* Version 3: a section size only for one chunk with changes, a target
     * digest only with changes, chunk entries only for several chunks. */
    int v3 = raw->version == 3;
    e->section_size = !v3 || chunks == 1 ? pt_rd_varint(&t) : 0;
    for (int k = 0; k < 4; k++)
      e->digest[k] = !v3 || k < 2 || e->changed > 0 ? pt_rd_le(&t, 8) : e->digest[k - 2];
    if (e->changed > 0) {
      if (chunks > t.left + 1)
        return 0;
      e->chunk_count = (size_t)chunks;
      e->chunks = pt_alloc(e->chunk_count * sizeof *e->chunks);
      if (v3 && chunks == 1) {
        e->chunks[0].changed = e->changed;
        e->chunks[0].bytes = e->section_size;
      } else {
        for (size_t c = 0; c < e->chunk_count; c++) {
          e->chunks[c].changed = pt_rd_varint(&t);
          e->chunks[c].bytes = pt_rd_varint(&t);
          if (v3)
            e->section_size += e->chunks[c].bytes;
        }
      }
    }
  }
  if (t.ok && raw->version == 3 &&
      raw->total_changed > 0) { /* the value model: the rest */
    raw->values_len = t.left;
    raw->values = pt_alloc(raw->values_len + 1);
    pt_rd_bytes(&t, raw->values, raw->values_len);
  }
  if (!t.ok || t.left != 0)
    return 0;
  r.p += raw->table_size;
  r.left -= raw->table_size;
  if (r.left != raw->body_size)
    return 0;
  raw->body_len = r.left;
  raw->body = pt_alloc(raw->body_len);
  memcpy(raw->body, r.p, raw->body_len);
  return 1;
}

typedef struct {
  uint8_t *data;
  size_t size, cap;
} pt_wr;

static inline void pt_wr_put(pt_wr *w, const void *src, size_t n) {
  if (w->size + n > w->cap) {
    size_t cap = w->cap ? w->cap : 256;
    while (cap < w->size + n)
      cap *= 2;
    uint8_t *p = realloc(w->data, cap);
    if (p == NULL)
      abort();
    w->data = p;
    w->cap = cap;
  }
  if (n)
    memcpy(w->data + w->size, src, n);
  w->size += n;
}

static inline void pt_wr_le(pt_wr *w, uint64_t v, int n) {
  uint8_t b[8];
  for (int i = 0; i < n; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  pt_wr_put(w, b, (size_t)n);
}

static inline void pt_wr_varint(pt_wr *w, uint64_t v) {
  do {
    uint8_t b = (uint8_t)(v & 0x7F);
    v >>= 7;
    b |= v ? 0x80 : 0;
    pt_wr_put(w, &b, 1);
  } while (v);
}

static inline pt_wr pt_raw_table(const pt_raw_patch *raw) {
  pt_wr w = {NULL, 0, 0};
  for (size_t i = 0; i < raw->tensors_len; i++) {
    const pt_raw_tensor *e = &raw->tensors[i];
    pt_wr_varint(&w, e->name_len);
    pt_wr_put(&w, e->name, e->name_len);
    pt_wr_le(&w, e->dtype, 1);
    pt_wr_le(&w, e->ndim, 1);
    for (unsigned d = 0; d < e->ndim && d < PT_RAW_DIMS; d++)
      pt_wr_varint(&w, e->dims[d]);
    pt_wr_varint(&w, e->changed);
    int v3 = raw->version == 3; /* what pt_raw_parse leaves out, left out */
    if (!v3 || (e->changed > 0 && e->chunk_count == 1))
      pt_wr_varint(&w, e->section_size);
    for (int k = 0; k < 4; k++)
      if (!v3 || k < 2 || e->changed > 0)
        pt_wr_le(&w, e->digest[k], 8);
    for (size_t c = 0; !(v3 && e->chunk_count == 1) && c < e->chunk_count; c++) {
      pt_wr_varint(&w, e->chunks[c].changed);
      pt_wr_varint(&w, e->chunks[c].bytes);
    }
  }
  pt_wr_put(&w, raw->values, raw->values_len);
  pt_wr_put(&w, raw->extra_table, raw->extra_table_len);
  return w;
}

/* Sets table_size, body_size and count from the content. */
static inline void pt_raw_fix_sizes(pt_raw_patch *raw) {
  pt_wr t = pt_raw_table(raw);
  raw->table_size = (uint32_t)t.size;
  raw->body_size = raw->body_len;
  raw->count = raw->tensors_len;
  free(t.data);
}

/* Serializes raw exactly as its fields say (heap buffer, free()). */
static inline pulse_buffer pt_raw_write(const pt_raw_patch *raw) {
  pt_wr w = {NULL, 0, 0};
  pt_wr_put(&w, raw->magic, 8);
  pt_wr_le(&w, raw->version, 2);
  pt_wr_le(&w, raw->model, 1);
  pt_wr_le(&w, raw->chunk_log2, 1);
  pt_wr_le(&w, raw->table_size, 4);
  pt_wr_le(&w, raw->step, 8);
  pt_wr_le(&w, raw->base_step, 8);
  pt_wr_put(&w, raw->base_state, 32);
  pt_wr_put(&w, raw->target_state, 32);
  pt_wr_le(&w, raw->count, 8);
  pt_wr_le(&w, raw->total_changed, 8);
  pt_wr_le(&w, raw->body_size, 8);
  pt_wr t = pt_raw_table(raw);
  pt_wr_put(&w, t.data, t.size);
  free(t.data);
  pt_wr_put(&w, raw->body, raw->body_len);
  pulse_buffer b = {w.data, w.size};
  return b;
}

/* Overwrites n little-endian bytes at off. */
static inline void pt_put_le(uint8_t *p, size_t off, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[off + (size_t)i] = (uint8_t)(v >> (8 * i));
}

#endif /* PULSE_PATCH_TESTUTIL_H */
