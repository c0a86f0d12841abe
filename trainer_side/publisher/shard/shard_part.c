/* shard_part.c - reading parts in place, and cutting a rank's part down to
 * what another rank needs for its counts (pulse_pub_shard_part_for): a rank
 * counts only in the chunks its own blocks meet, so the changes elsewhere
 * need not travel to it. */
#include <stdlib.h>
#include <string.h>

#include "endian_impl.h"
#include "shard_impl.h"
#include "status_impl.h"

void shard_view_free(shard_parts_view *v) {
  free(v->blocks);
  memset(v, 0, sizeof *v);
}

pulse_status shard_chunk_push(shard_chunk *c, uint64_t pos, uint8_t cls, uint16_t delta) {
  if (c->count == c->cap) {
    uint64_t cap = c->cap < 256 ? 256 : 2 * c->cap;
    uint64_t *p = realloc(c->pos, (size_t)cap * sizeof *p);
    if (p != NULL)
      c->pos = p;
    uint8_t *q = p != NULL ? realloc(c->cls, (size_t)cap) : NULL;
    if (q != NULL)
      c->cls = q;
    uint16_t *d = q != NULL ? realloc(c->delta, (size_t)cap * sizeof *d) : NULL;
    if (d == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk's changes");
    c->delta = d, c->cap = cap;
  }
  c->pos[c->count] = pos, c->cls[c->count] = cls, c->delta[c->count] = delta;
  c->count++;
  return PULSE_OK;
}

void shard_chunk_free(shard_chunk *c) {
  free(c->pos), free(c->cls), free(c->delta);
  *c = (shard_chunk)SHARD_CHUNK_INIT;
}

/* Reads change j of the cursor's block (the view checked the bytes). */
static void cursor_load(shard_part_cursor *c) {
  if (c->j >= c->b->k)
    return;
  uint64_t gap = pulse_reader_varint(&c->r);
  c->pos = c->j == 0 ? gap : c->pos + 1 + gap;
  c->cls = pulse_reader_u8(&c->r);
  c->delta = c->b->deltas ? shard_unzigzag(pulse_reader_varint(&c->r)) : 0;
  if (!c->r.ok) /* not after the view's check: read as the end */
    c->j = c->b->k;
}

void shard_cursor_open(shard_part_cursor *c, const shard_part_block *b) {
  c->b = b, c->j = 0, c->pos = 0;
  c->r = pulse_reader_make(b->ch, b->ch_size);
  cursor_load(c);
}

void shard_cursor_next(shard_part_cursor *c) {
  if (c->j < c->b->k) {
    c->j++;
    cursor_load(c);
  }
}

/* Checks block x's changes: k of them exactly fill its bytes, positions
 * increase inside the tensor's numel elements, deltas are not 0. */
static int changes_ok(const shard_part_block *x, uint64_t numel) {
  pulse_reader r = pulse_reader_make(x->ch, x->ch_size);
  uint64_t pos = 0;
  for (uint64_t j = 0; j < x->k; j++) {
    uint64_t gap = pulse_reader_varint(&r);
    uint64_t room = j == 0 ? numel : numel - pos - 1; /* positions after the last */
    if (!r.ok || gap >= room)
      return 0;
    pos = j == 0 ? gap : pos + 1 + gap;
    (void)pulse_reader_u8(&r);
    if (x->deltas) {
      uint64_t z = pulse_reader_varint(&r);
      if (z == 0 || z > 0xFFFF) /* a delta is never 0 */
        return 0;
    }
  }
  return r.ok && r.left == 0;
}

pulse_status shard_view_parts(const pulse_buffer *parts, size_t nparts,
                              const pulse_tensor_info *table, size_t tensor_count,
                              const uint8_t table_id[32], uint32_t chunk_log2,
                              shard_parts_view *v) {
  memset(v, 0, sizeof *v);
  size_t total = 0;
  for (size_t i = 0; i < nparts; i++) {
    const uint8_t *p = parts[i].data;
    if (p == NULL || parts[i].size < SHARD_PART_HEADER || memcmp(p, SHARD_PART_MAGIC, 8) != 0 ||
        pulse_load_le32(p + 8) != SHARD_WIRE_VERSION)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: part %zu is not a shard part", i);
    if (pulse_load_le32(p + 12) != chunk_log2 || memcmp(p + 16, table_id, 32) != 0)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "shard: part %zu describes another table or chunk size", i);
    uint64_t nb = pulse_load_le64(p + 48);
    if (nb > (parts[i].size - SHARD_PART_HEADER) / SHARD_BLOCK_HEADER ||
        (pulse_load_le32(p + 56) & ~SHARD_PART_DELTAS) != 0 || pulse_load_le32(p + 60) != 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: part %zu: %llu blocks, flags %#x", i,
                        (unsigned long long)nb, pulse_load_le32(p + 56));
    total += (size_t)nb;
  }
  v->blocks = calloc(total ? total : 1, sizeof *v->blocks);
  if (v->blocks == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: parts");
  for (size_t i = 0; i < nparts; i++) {
    const uint8_t *p = parts[i].data;
    size_t size = parts[i].size, at = SHARD_PART_HEADER;
    uint64_t nb = pulse_load_le64(p + 48);
    int deltas = (pulse_load_le32(p + 56) & SHARD_PART_DELTAS) != 0;
    for (uint64_t b = 0; b < nb; b++) {
      if (size - at < SHARD_BLOCK_HEADER)
        goto short_part;
      shard_part_block *x = &v->blocks[v->nblocks++];
      const uint8_t *q = p + at;
      x->header = q;
      x->tensor = pulse_load_le64(q);
      x->elems = pulse_load_le64(q + 8);
      x->base.a = pulse_load_le64(q + 16), x->base.b = pulse_load_le64(q + 24);
      x->target.a = pulse_load_le64(q + 32), x->target.b = pulse_load_le64(q + 40);
      x->k = pulse_load_le64(q + 48);
      uint64_t bytes = pulse_load_le64(q + 192);
      at += SHARD_BLOCK_HEADER;
      uint64_t numel = 0;
      if (x->tensor >= tensor_count ||
          pulse_shape_numel(table[x->tensor].shape, table[x->tensor].ndim, &numel) != PULSE_OK ||
          x->k > x->elems || x->k > numel || bytes > size - at || x->k > bytes / 2)
        goto short_part;
      x->ch = p + at;
      x->ch_size = (size_t)bytes;
      x->deltas = deltas;
      if (!changes_ok(x, numel))
        goto short_part;
      at += (size_t)bytes;
      v->changes += x->k;
      v->step.a += x->target.a, v->step.b += x->target.b;
    }
    if (at != size)
      goto short_part;
    continue;
  short_part:
    shard_view_free(v);
    return pulse_fail(PULSE_ERR_CORRUPT, "shard: part %zu is cut short or inconsistent", i);
  }
  return PULSE_OK;
}

uint8_t *shard_chunk_marks(const shard_geom *g, size_t ng, size_t t, uint64_t numel,
                           uint32_t log2) {
  uint64_t nck = numel ? ((numel - 1) >> log2) + 1 : 0;
  uint8_t *mark = calloc((size_t)(nck / 8 + 1), 1);
  for (size_t b = 0; mark != NULL && b < ng; b++) {
    if (g[b].tensor != t || g[b].elems == 0)
      continue;
    for (uint64_t r = 0; r < g[b].runs; r++) {
      uint64_t at = shard_run_pos(&g[b], r);
      for (uint64_t k = at >> log2; k <= (at + g[b].run_len - 1) >> log2; k++)
        mark[k >> 3] |= (uint8_t)(1u << (k & 7));
    }
  }
  return mark;
}

static int marked(const uint8_t *mark, uint64_t pos, uint32_t log2) {
  uint64_t k = pos >> log2;
  return mark[k >> 3] >> (k & 7) & 1;
}

/* Block x's header and its changes in the chunks marked, without deltas,
 * appended to out. */
static void cut_block(const shard_part_block *x, const uint8_t *mark, uint32_t log2,
                      pulse_bytebuf *out) {
  size_t at = out->size;
  pulse_bytebuf_put(out, x->header, SHARD_BLOCK_HEADER);
  uint64_t m = 0, prev = 0;
  shard_part_cursor c;
  for (shard_cursor_open(&c, x); c.j < x->k; shard_cursor_next(&c)) {
    if (!marked(mark, c.pos, log2))
      continue;
    pulse_bytebuf_varint(out, m == 0 ? c.pos : c.pos - prev - 1);
    pulse_bytebuf_byte(out, c.cls);
    prev = c.pos, m++;
  }
  if (!out->failed) {
    pulse_store_le64(out->data + at + 48, m);
    pulse_store_le64(out->data + at + 192, out->size - at - SHARD_BLOCK_HEADER);
  }
}

pulse_status pulse_pub_shard_part_for(const pulse_pub_shard *s, const pulse_buffer *part,
                                      const pulse_pub_block *blocks, size_t block_count,
                                      pulse_buffer *out) {
  if (s == NULL || part == NULL || out == NULL || (blocks == NULL && block_count > 0))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  out->data = NULL, out->size = 0;
  shard_geom *g = calloc(block_count ? block_count : 1, sizeof *g);
  if (g == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
  pulse_status st = PULSE_OK;
  for (size_t b = 0; b < block_count && st == PULSE_OK; b++) {
    size_t t = shard_find(s->info, s->count, blocks[b].name);
    if (t == (size_t)-1)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "shard: block %zu: tensor '%s' is not in the table",
                      b, blocks[b].name ? blocks[b].name : "(null)");
    else
      st = shard_geom_make(&s->info[t], t, &blocks[b], &g[b]);
  }
  shard_parts_view v = {0};
  if (st == PULSE_OK)
    st = shard_view_parts(part, 1, s->info, s->count, s->table_id, s->chunk_log2, &v);
  pulse_bytebuf cut = PULSE_BYTEBUF_INIT;
  if (st == PULSE_OK) {
    pulse_bytebuf_put(&cut, part->data, SHARD_PART_HEADER);
    if (!cut.failed)
      pulse_store_le32(cut.data + 56, 0); /* counting reads no deltas */
  }
  for (size_t b = 0; b < v.nblocks && st == PULSE_OK; b++) {
    const shard_part_block *x = &v.blocks[b];
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[x->tensor].shape, s->info[x->tensor].ndim, &numel);
    uint8_t *mark = shard_chunk_marks(g, block_count, x->tensor, numel, s->chunk_log2);
    if (mark == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
    else
      cut_block(x, mark, s->chunk_log2, &cut);
    free(mark);
  }
  if (st == PULSE_OK && pulse_bytebuf_take(&cut, out) != PULSE_OK)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
  pulse_bytebuf_free(&cut);
  free(g);
  shard_view_free(&v);
  return st;
}
