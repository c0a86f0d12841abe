/* shard.c - a rank's shard of a sharded publish: block geometry, the
 * tiling check, the snapshot of its blocks and change detection
 * (pulse_pub_shard.h). */
#include <stdlib.h>
#include <string.h>

#include "digest_impl.h"
#include "endian_impl.h"
#include "pulse_store.h"
#include "pulse_elem.h"
#include "shard_impl.h"
#include "status_impl.h"

size_t shard_find(const pulse_tensor_info *table, size_t count, const char *name) {
  for (size_t i = 0; name != NULL && i < count; i++)
    if (strcmp(table[i].name, name) == 0)
      return i;
  return (size_t)-1;
}

pulse_status shard_table_id(const pulse_tensor_info *table, size_t count, uint8_t out[32]) {
  /* The published table: every tensor BF16, whatever the caller's dtype. */
  pulse_tensor_digest *zero = calloc(count ? count : 1, sizeof *zero);
  pulse_tensor_info *info = malloc((count ? count : 1) * sizeof *info);
  if (zero == NULL || info == NULL) {
    free(zero), free(info);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: table id");
  }
  for (size_t i = 0; i < count; i++)
    info[i] = table[i], info[i].dtype = PULSE_DTYPE_BF16;
  pulse_state_digest d;
  pulse_status st = pulse_state_digest_compute(info, zero, count, &d);
  free(zero), free(info);
  if (st == PULSE_OK)
    memcpy(out, d.bytes, 32);
  return st;
}

pulse_status shard_geom_make(const pulse_tensor_info *info, size_t tensor,
                             const pulse_pub_block *b, shard_geom *g) {
  memset(g, 0, sizeof *g);
  g->tensor = tensor;
  uint64_t numel = 0;
  PULSE_TRY(pulse_shape_numel(info->shape, info->ndim, &numel));
  if (b->kind == PULSE_PUB_BLOCK_FLAT) {
    if (b->start[0] > numel || b->extent[0] > numel - b->start[0])
      return pulse_fail(PULSE_ERR_ARG,
                        "shard: tensor '%s': elements [%llu, +%llu) are outside its %llu",
                        info->name, (unsigned long long)b->start[0],
                        (unsigned long long)b->extent[0], (unsigned long long)numel);
    g->elems = g->run_len = b->extent[0];
    g->runs = b->extent[0] > 0;
    g->base = b->start[0];
    return PULSE_OK;
  }
  if (b->kind != PULSE_PUB_BLOCK_RECT)
    return pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': unknown block kind %d", info->name,
                      (int)b->kind);
  uint32_t nd = info->ndim;
  uint64_t stride = 1, elems = 1;
  for (uint32_t k = nd; k-- > 0;) {
    if (b->start[k] > info->shape[k] || b->extent[k] > info->shape[k] - b->start[k])
      return pulse_fail(PULSE_ERR_ARG,
                        "shard: tensor '%s': block [%llu, +%llu) of dimension %u is outside "
                        "its %llu",
                        info->name, (unsigned long long)b->start[k],
                        (unsigned long long)b->extent[k], k,
                        (unsigned long long)info->shape[k]);
    if (k + 1 < nd) {
      g->lead_ext[k] = b->extent[k];
      g->lead_start[k] = b->start[k];
      g->stride[k] = stride;
    }
    elems *= b->extent[k]; /* <= numel: no overflow */
    stride *= info->shape[k];
  }
  g->elems = elems;
  if (nd == 0) {
    g->runs = g->run_len = 1;
    return PULSE_OK;
  }
  g->lead = nd - 1;
  g->run_len = b->extent[nd - 1];
  g->base = b->start[nd - 1];
  g->runs = g->run_len ? elems / g->run_len : 0;
  return PULSE_OK;
}

uint64_t shard_run_pos(const shard_geom *g, uint64_t r) {
  uint64_t pos = g->base;
  for (uint32_t k = g->lead; k-- > 0;) {
    uint64_t idx = r % g->lead_ext[k];
    r /= g->lead_ext[k];
    pos += (g->lead_start[k] + idx) * g->stride[k];
  }
  return pos;
}

/* ------------------------------------------------------------ the tiling */

typedef struct {
  size_t tensor;
  uint64_t lo, hi;
  size_t rank;
} tile_run;

static int run_cmp(const void *a, const void *b) {
  const tile_run *x = a, *y = b;
  if (x->tensor != y->tensor)
    return x->tensor < y->tensor ? -1 : 1;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

pulse_status pulse_pub_blocks_check(const pulse_tensor_info *table, size_t tensor_count,
                                    const pulse_pub_block *const *blocks, const size_t *counts,
                                    size_t ranks) {
  if (table == NULL || (ranks > 0 && (blocks == NULL || counts == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  uint64_t total = 0;
  for (size_t r = 0; r < ranks; r++)
    for (size_t i = 0; i < counts[r]; i++) {
      const pulse_pub_block *b = &blocks[r][i];
      size_t t = shard_find(table, tensor_count, b->name);
      if (t == (size_t)-1)
        return pulse_fail(PULSE_ERR_NOT_FOUND, "shard: rank %zu: tensor '%s' is not in the table",
                          r, b->name ? b->name : "(null)");
      shard_geom g;
      PULSE_TRY(shard_geom_make(&table[t], t, b, &g));
      total += g.runs;
    }
  tile_run *runs = malloc((total ? total : 1) * sizeof *runs);
  if (runs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: blocks check");
  size_t n = 0;
  for (size_t r = 0; r < ranks; r++)
    for (size_t i = 0; i < counts[r]; i++) {
      shard_geom g;
      size_t t = shard_find(table, tensor_count, blocks[r][i].name);
      (void)shard_geom_make(&table[t], t, &blocks[r][i], &g);
      for (uint64_t k = 0; k < g.runs; k++) {
        uint64_t p = shard_run_pos(&g, k);
        runs[n++] = (tile_run){t, p, p + g.run_len, r};
      }
    }
  qsort(runs, n, sizeof *runs, run_cmp);
  pulse_status st = PULSE_OK;
  size_t j = 0;
  for (size_t t = 0; t < tensor_count && st == PULSE_OK; t++) {
    uint64_t numel = 0, at = 0;
    if ((st = pulse_shape_numel(table[t].shape, table[t].ndim, &numel)) != PULSE_OK)
      break;
    size_t last_rank = (size_t)-1;
    for (; j < n && runs[j].tensor == t; j++) {
      if (runs[j].lo < at) {
        st = pulse_fail(PULSE_ERR_ARG,
                        "shard: tensor '%s': element %llu is in a block of rank %zu and one "
                        "of rank %zu (blocks overlap)",
                        table[t].name, (unsigned long long)runs[j].lo, last_rank, runs[j].rank);
        break;
      }
      if (runs[j].lo > at) {
        st = pulse_fail(PULSE_ERR_ARG,
                        "shard: tensor '%s': elements [%llu, %llu) are in no rank's block",
                        table[t].name, (unsigned long long)at, (unsigned long long)runs[j].lo);
        break;
      }
      at = runs[j].hi;
      last_rank = runs[j].rank;
    }
    if (st == PULSE_OK && at < numel)
      st = pulse_fail(PULSE_ERR_ARG,
                      "shard: tensor '%s': elements [%llu, %llu) are in no rank's block",
                      table[t].name, (unsigned long long)at, (unsigned long long)numel);
  }
  free(runs);
  return st;
}

/* ------------------------------------------------------------- the shard */

void pulse_pub_shard_opts_init(pulse_pub_shard_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_PUB_SHARD_OPTS_VERSION;
  o->chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  o->pos_model = PULSE_POS_CLASS;
}

int shard_chunk_whole(const pulse_pub_shard *s, size_t t, uint64_t pos) {
  uint64_t k = pos >> s->chunk_log2;
  return s->whole[t] != NULL && (s->whole[t][k >> 3] >> (k & 7) & 1);
}

/* The chunks of each tensor that the shard's blocks cover entirely: the
 * elements its runs put in each chunk, against the chunk's size. */
static pulse_status whole_chunks(pulse_pub_shard *s) {
  uint32_t log2 = s->chunk_log2;
  for (size_t t = 0; t < s->count; t++) {
    int has = 0;
    for (size_t b = 0; b < s->nblocks; b++)
      has |= s->geom[b].tensor == t && s->geom[b].elems > 0;
    if (!has)
      continue;
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[t].shape, s->info[t].ndim, &numel);
    uint64_t nck = ((numel - 1) >> log2) + 1;
    uint64_t *held = calloc((size_t)nck, sizeof *held);
    if (held == NULL || (s->whole[t] = calloc((size_t)(nck / 8 + 1), 1)) == NULL) {
      free(held);
      return pulse_fail(PULSE_ERR_NOMEM, "shard: chunks");
    }
    for (size_t b = 0; b < s->nblocks; b++) {
      const shard_geom *g = &s->geom[b];
      for (uint64_t r = 0; g->tensor == t && r < g->runs; r++) {
        uint64_t at = shard_run_pos(g, r), end = at + g->run_len;
        while (at < end) {
          uint64_t k = at >> log2, stop = (k + 1) << log2;
          stop = stop < end ? stop : end;
          held[k] += stop - at;
          at = stop;
        }
      }
    }
    for (uint64_t k = 0; k < nck; k++) {
      uint64_t size = k + 1 < nck ? (uint64_t)1 << log2 : numel - (k << log2);
      if (held[k] == size) /* more (blocks that overlap) is no tiling at all */
        s->whole[t][k >> 3] |= (uint8_t)(1u << (k & 7));
    }
    free(held);
  }
  return PULSE_OK;
}

void pulse_pub_shard_free(pulse_pub_shard *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; s->info && i < s->count; i++)
    free((char *)s->info[i].name);
  for (size_t i = 0; s->whole && i < s->count; i++)
    free(s->whole[i]);
  free(s->whole);
  for (size_t b = 0; b < s->nblocks; b++) {
    if (s->snap)
      free(s->snap[b]);
    if (s->changes)
      shard_pending_clear(&s->changes[b]);
  }
  free(s->info), free(s->geom), free(s->blocks), free(s->snap), free(s->digest);
  free(s->changes), free(s->target);
  free(s);
}

pulse_status pulse_pub_shard_create(const pulse_pub_shard_opts *o, pulse_pub_shard **out) {
  if (o == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("shard", o, PULSE_PUB_SHARD_OPTS_VERSION));
  if (o->tensors == NULL || o->tensor_count == 0 ||
      (o->blocks == NULL && o->block_count) || o->chunk_log2 < 10 ||
      o->chunk_log2 > 30 ||
      (o->pos_model != PULSE_POS_PLAIN && o->pos_model != PULSE_POS_CLASS) ||
      o->format_version > PULSE_PATCH_VERSION_MAX ||
      (o->format_version != 0 && o->format_version < PULSE_PATCH_VERSION_MIN))
    return pulse_fail(PULSE_ERR_ARG, "shard: a table, blocks, chunk_log2 in 10..30, a position "
                                     "model and a patch format version this library writes");
  if (o->format_version == 3)
    return pulse_fail(
        PULSE_ERR_UNSUPPORTED,
        "shard: format version 3 codes values against a "
        "model of the whole patch's changes, which no rank has: use 1 or 2");
  pulse_pub_shard *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard");
  s->count = o->tensor_count;
  s->chunk_log2 = o->chunk_log2;
  s->pos_model = o->pos_model;
  s->format_version = o->format_version ? o->format_version : PULSE_PATCH_VERSION;
  s->nblocks = o->block_count;
  size_t nb = s->nblocks ? s->nblocks : 1;
  s->info = calloc(s->count, sizeof *s->info);
  s->geom = calloc(nb, sizeof *s->geom);
  s->blocks = calloc(nb, sizeof *s->blocks);
  s->snap = calloc(nb, sizeof *s->snap);
  s->digest = calloc(nb, sizeof *s->digest);
  s->target = calloc(nb, sizeof *s->target);
  s->changes = calloc(nb, sizeof *s->changes);
  s->whole = calloc(s->count, sizeof *s->whole);
  pulse_status st = PULSE_OK;
  if (!s->info || !s->geom || !s->blocks || !s->snap || !s->digest || !s->target || !s->changes ||
      !s->whole)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard");
  for (size_t i = 0; st == PULSE_OK && i < s->count; i++) {
    s->info[i] = o->tensors[i];
    s->info[i].dtype = PULSE_DTYPE_BF16;
    if (o->tensors[i].name == NULL || (s->info[i].name = strdup(o->tensors[i].name)) == NULL)
      st = pulse_fail(PULSE_ERR_ARG, "shard: tensor %zu has no name", i);
  }
  if (st == PULSE_OK)
    st = shard_table_id(s->info, s->count, s->table_id);
  for (size_t b = 0; st == PULSE_OK && b < s->nblocks; b++) {
    size_t t = shard_find(s->info, s->count, o->blocks[b].name);
    if (t == (size_t)-1)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "shard: block %zu: tensor '%s' is not in the table", b,
                      o->blocks[b].name ? o->blocks[b].name : "(null)");
    else
      st = shard_geom_make(&s->info[t], t, &o->blocks[b], &s->geom[b]);
    if (st == PULSE_OK) {
      s->blocks[b] = o->blocks[b];
      s->blocks[b].name = s->info[t].name;
    }
  }
  if (st == PULSE_OK)
    st = whole_chunks(s);
  if (st != PULSE_OK) {
    pulse_pub_shard_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

static uint16_t bits_at(const pulse_pub_tensor *t, uint64_t i) {
  if (t->dtype == PULSE_DTYPE_F32) {
    uint32_t u;
    memcpy(&u, (const uint8_t *)t->data + 4 * i, 4);
    return pulse_bf16_from_f32_bits(u);
  }
  return ((const uint16_t *)t->data)[i];
}

/* The block's digest: the sum of its runs' (positions in the tensor). */
pulse_tensor_digest shard_block_digest(const shard_geom *g,
                                       const uint16_t *bits) {
  pulse_tensor_digest d = {0, 0};
  for (uint64_t r = 0; r < g->runs; r++) {
    pulse_tensor_digest x;
    if (pulse_digest_bf16_block(bits + r * g->run_len, 1, g->run_len, g->run_len,
                                shard_run_pos(g, r), g->run_len, &x) == PULSE_OK)
      d.a += x.a, d.b += x.b;
  }
  return d;
}

void pulse_pub_shard_abort(pulse_pub_shard *s) {
  if (s == NULL)
    return;
  /* Freed, not kept for the next step: between steps a rank holds its
   * snapshot and nothing else O(changes). */
  for (size_t b = 0; b < s->nblocks; b++)
    shard_pending_clear(&s->changes[b]);
  s->pending = 0;
}

void shard_pending_clear(shard_pending *pd) {
  pulse_bytebuf_free(&pd->bytes);
  free(pd->mark_at), free(pd->mark_idx);
  memset(pd, 0, sizeof *pd);
}

int shard_pending_mark(shard_pending *pd, uint64_t prev_idx) {
  if (pd->nmarks == pd->mark_cap) {
    size_t cap = pd->mark_cap ? 2 * pd->mark_cap : 16;
    size_t *at = realloc(pd->mark_at, cap * sizeof *at);
    if (at == NULL)
      return -1;
    pd->mark_at = at;
    uint64_t *idx = realloc(pd->mark_idx, cap * sizeof *idx);
    if (idx == NULL)
      return -1;
    pd->mark_idx = idx;
    pd->mark_cap = cap;
  }
  pd->mark_at[pd->nmarks] = pd->bytes.size;
  pd->mark_idx[pd->nmarks++] = prev_idx;
  return 0;
}

void shard_own_open(shard_own_cursor *c, const shard_geom *g, const shard_pending *pd) {
  c->g = g;
  c->p = pd->bytes.data, c->end = pd->bytes.data + pd->bytes.size;
  c->has = 0, c->idx = 0;
  shard_own_next(c);
}

void shard_own_next(shard_own_cursor *c) {
  pulse_reader r = pulse_reader_make(c->p, c->p != NULL ? (size_t)(c->end - c->p) : 0);
  uint64_t gap = pulse_reader_varint(&r);
  uint8_t cls = pulse_reader_u8(&r);
  uint64_t z = pulse_reader_varint(&r);
  if (!r.ok) {
    c->has = 0;
    return;
  }
  c->p = r.p;
  uint64_t idx = c->has ? c->idx + 1 + gap : gap, len = c->g->run_len;
  /* in the run of the last change: no run position to work out */
  if (c->has && idx / len == c->idx / len)
    c->pos += idx - c->idx;
  else
    c->pos = shard_run_pos(c->g, idx / len) + idx % len;
  c->idx = idx;
  c->cls = cls;
  c->delta = shard_unzigzag(z);
  c->has = 1;
}

void shard_own_seek(shard_own_cursor *c, const shard_pending *pd,
                    uint64_t idx) {
  if (!c->has || c->idx >= idx)
    return;
  /* The last mark after a change of index < idx: every change before it is
   * before idx. */
  size_t lo = 0, hi = pd->nmarks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (pd->mark_idx[mid] < idx)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo > 0 && pd->bytes.data + pd->mark_at[lo - 1] > c->p) {
    uint64_t prev = pd->mark_idx[lo - 1], len = c->g->run_len;
    c->p = pd->bytes.data + pd->mark_at[lo - 1];
    c->idx = prev;
    c->pos = shard_run_pos(c->g, prev / len) + prev % len;
    shard_own_next(c);
  }
  while (c->has && c->idx < idx)
    shard_own_next(c);
}

void pulse_pub_shard_advance(pulse_pub_shard *s) {
  if (s == NULL || !s->pending)
    return;
  for (size_t b = 0; b < s->nblocks; b++) {
    shard_own_cursor c;
    for (shard_own_open(&c, &s->geom[b], &s->changes[b]); c.has;
         shard_own_next(&c))
      s->snap[b][c.idx] = (uint16_t)(s->snap[b][c.idx] + c.delta);
    s->digest[b] = s->target[b];
  }
  pulse_pub_shard_abort(s);
}

const uint16_t *pulse_pub_shard_snapshot(const pulse_pub_shard *s, size_t i) {
  return s != NULL && s->have_snapshot && i < s->nblocks ? s->snap[i] : NULL;
}

/* Block b's header, then the changes its part carries (those of chunks
 * the shard does not cover entirely: it codes the others itself), with
 * their deltas. */
static void put_block(pulse_bytebuf *out, const pulse_pub_shard *s, size_t b) {
  const shard_geom *g = &s->geom[b];
  uint8_t p[SHARD_BLOCK_HEADER];
  memset(p, 0, sizeof p);
  pulse_store_le64(p, g->tensor);
  pulse_store_le64(p + 8, g->elems);
  pulse_store_le64(p + 16, s->digest[b].a);
  pulse_store_le64(p + 24, s->digest[b].b);
  pulse_store_le64(p + 32, s->target[b].a);
  pulse_store_le64(p + 40, s->target[b].b);
  pulse_store_le64(p + 56, (uint64_t)s->blocks[b].kind);
  for (int d = 0; d < PULSE_MAX_DIMS; d++) {
    pulse_store_le64(p + 64 + 8 * d, s->blocks[b].start[d]);
    pulse_store_le64(p + 128 + 8 * d, s->blocks[b].extent[d]);
  }
  size_t at = out->size;
  pulse_bytebuf_put(out, p, sizeof p);
  uint64_t k = 0, prev = 0;
  shard_own_cursor c;
  for (shard_own_open(&c, g, &s->changes[b]); c.has; shard_own_next(&c)) {
    if (shard_chunk_whole(s, g->tensor, c.pos))
      continue;
    pulse_bytebuf_varint(out, k == 0 ? c.pos : c.pos - prev - 1);
    pulse_bytebuf_byte(out, c.cls);
    pulse_bytebuf_varint(out, shard_zigzag(c.delta));
    prev = c.pos, k++;
  }
  if (!out->failed) {
    pulse_store_le64(out->data + at + 48, k);
    pulse_store_le64(out->data + at + 192, out->size - at - SHARD_BLOCK_HEADER);
  }
}

/* The changes detect_block finds, and the digest's batch (moved by
 * batches: the vector path of pulse_digest_change_sum). */
enum { DIGEST_BATCH = 256 };
typedef struct {
  shard_pending *pd;
  pulse_tensor_digest d;
  uint64_t prev;
  uint64_t pos[DIGEST_BATCH];
  uint16_t old_bits[DIGEST_BATCH], new_bits[DIGEST_BATCH];
  unsigned n;
} detect_state;

static void batch_flush(detect_state *x) {
  pulse_tensor_digest d = pulse_digest_change_sum(x->pos, x->old_bits, x->new_bits, x->n);
  x->d.a += d.a, x->d.b += d.b, x->n = 0;
}

/* Out of the element loop (1% of the elements take it), which stays tight. */
static __attribute__((noinline)) void detect_push(detect_state *x, uint64_t idx,
                                                  uint64_t pos, uint16_t ob, uint16_t nw) {
  shard_pending *pd = x->pd;
  if (pd->count > 0 && pd->count % SHARD_PENDING_MARK == 0 &&
      shard_pending_mark(pd, x->prev) != 0)
    pd->bytes.failed = 1; /* reported as the bytes' failure */
  pulse_bytebuf_varint(&pd->bytes, pd->count == 0 ? idx : idx - x->prev - 1);
  pulse_bytebuf_byte(&pd->bytes, (uint8_t)pulse_bf16_class(ob));
  pulse_bytebuf_varint(&pd->bytes, shard_zigzag(pulse_bf16_delta(ob, nw)));
  x->prev = idx, pd->count++;
  x->pos[x->n] = pos, x->old_bits[x->n] = ob, x->new_bits[x->n] = nw;
  if (++x->n == DIGEST_BATCH)
    batch_flush(x);
}

static pulse_status detect_block(pulse_pub_shard *s, size_t b, const pulse_pub_tensor *t) {
  const shard_geom *g = &s->geom[b];
  detect_state x;
  x.pd = &s->changes[b], x.d = s->digest[b], x.prev = 0, x.n = 0;
  const uint16_t *snap = s->snap[b];
  for (uint64_t r = 0; r < g->runs; r++) {
    uint64_t pos = shard_run_pos(g, r), at = r * g->run_len;
    for (uint64_t i = 0; i < g->run_len; i++) {
      uint16_t nw = bits_at(t, at + i), ob = snap[at + i];
      if (pulse_bf16_changed(ob, nw))
        detect_push(&x, at + i, pos + i, ob, nw);
    }
  }
  batch_flush(&x);
  if (x.pd->bytes.failed)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: a block's changes");
  s->target[b] = x.d;
  return PULSE_OK;
}

pulse_status pulse_pub_shard_detect(pulse_pub_shard *s, const pulse_pub_tensor *data, size_t count,
                                    pulse_buffer *part) {
  if (s == NULL || part == NULL || (data == NULL && count > 0) || count != s->nblocks)
    return pulse_fail(PULSE_ERR_ARG, "shard: detect needs one tensor per block (%zu)",
                      s ? s->nblocks : 0);
  part->data = NULL, part->size = 0;
  for (size_t b = 0; b < count; b++) {
    if ((data[b].data == NULL && s->geom[b].elems > 0) || data[b].memory != PULSE_PUB_HOST)
      return pulse_fail(PULSE_ERR_ARG, "shard: block %zu: NULL or not host memory", b);
    if (data[b].dtype != PULSE_DTYPE_F32 && data[b].dtype != PULSE_DTYPE_BF16)
      return pulse_fail(PULSE_ERR_DTYPE, "shard: block %zu: FP32 or BF16, not %s", b,
                        pulse_dtype_name(data[b].dtype));
  }
  pulse_pub_shard_abort(s);
  pulse_status st = PULSE_OK;
  if (!s->have_snapshot) {
    for (size_t b = 0; b < count && st == PULSE_OK; b++) {
      const shard_geom *g = &s->geom[b];
      free(s->snap[b]); /* a failed resume's */
      if ((s->snap[b] = malloc((g->elems ? g->elems : 1) * 2)) == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: snapshot");
        break;
      }
      if (data[b].dtype == PULSE_DTYPE_F32)
        pulse_bf16_cast_f32(data[b].data, s->snap[b], g->elems);
      else if (g->elems > 0)
        memcpy(s->snap[b], data[b].data, g->elems * 2);
      s->target[b] = s->digest[b] = shard_block_digest(g, s->snap[b]);
    }
    if (st != PULSE_OK) {
      for (size_t b = 0; b < count; b++)
        free(s->snap[b]), s->snap[b] = NULL;
      return st;
    }
    s->have_snapshot = 1;
  } else {
    for (size_t b = 0; b < count && st == PULSE_OK; b++)
      st = detect_block(s, b, &data[b]);
    if (st != PULSE_OK) {
      pulse_pub_shard_abort(s);
      return st;
    }
    s->pending = 1;
  }
  pulse_bytebuf out = PULSE_BYTEBUF_INIT;
  uint8_t head[SHARD_PART_HEADER];
  memset(head, 0, sizeof head);
  memcpy(head, SHARD_PART_MAGIC, 8);
  pulse_store_le32(head + 8, SHARD_WIRE_VERSION);
  pulse_store_le32(head + 12, s->chunk_log2);
  memcpy(head + 16, s->table_id, 32);
  pulse_store_le64(head + 48, count);
  pulse_store_le32(head + 56, SHARD_PART_DELTAS);
  pulse_bytebuf_put(&out, head, sizeof head);
  for (size_t b = 0; b < count; b++)
    put_block(&out, s, b);
  if (pulse_bytebuf_take(&out, part) != PULSE_OK) {
    pulse_pub_shard_abort(s);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: part");
  }
  return PULSE_OK;
}
