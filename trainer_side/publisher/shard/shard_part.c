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

pulse_status shard_view_parts(const pulse_buffer *parts, size_t nparts, size_t tensor_count,
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
    if (nb > (parts[i].size - SHARD_PART_HEADER) / SHARD_BLOCK_HEADER)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: part %zu: %llu blocks", i,
                        (unsigned long long)nb);
    total += (size_t)nb;
  }
  v->blocks = calloc(total ? total : 1, sizeof *v->blocks);
  if (v->blocks == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: parts");
  for (size_t i = 0; i < nparts; i++) {
    const uint8_t *p = parts[i].data;
    size_t size = parts[i].size, at = SHARD_PART_HEADER;
    uint64_t nb = pulse_load_le64(p + 48);
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
      at += SHARD_BLOCK_HEADER;
      if (x->tensor >= tensor_count || x->k > x->elems || x->k > (size - at) / 12)
        goto short_part;
      x->pos = p + at;
      x->old_bits = x->pos + 8 * x->k;
      x->new_bits = x->old_bits + 2 * x->k;
      at += 12 * (size_t)x->k;
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

/* Block x's changes in the chunks marked (k of them written at out when
 * out is not NULL: positions, old bits, new bits). */
static uint64_t cut_block(const shard_part_block *x, const uint8_t *mark, uint32_t log2,
                          uint8_t *out, uint64_t k) {
  uint64_t m = 0;
  for (uint64_t j = 0; j < x->k; j++) {
    uint64_t pos = pulse_load_le64(x->pos + 8 * j);
    if (!marked(mark, pos, log2))
      continue;
    if (out != NULL) {
      memcpy(out + 8 * m, x->pos + 8 * j, 8);
      memcpy(out + 8 * k + 2 * m, x->old_bits + 2 * j, 2);
      memcpy(out + 10 * k + 2 * m, x->new_bits + 2 * j, 2);
    }
    m++;
  }
  return m;
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
    st = shard_view_parts(part, 1, s->count, s->table_id, s->chunk_log2, &v);
  uint64_t *kept = st == PULSE_OK ? calloc(v.nblocks ? v.nblocks : 1, sizeof *kept) : NULL;
  uint8_t **marks = st == PULSE_OK ? calloc(v.nblocks ? v.nblocks : 1, sizeof *marks) : NULL;
  if (st == PULSE_OK && (kept == NULL || marks == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
  /* First the sizes (the cut part is written once, at its size). */
  size_t size = SHARD_PART_HEADER;
  for (size_t b = 0; b < v.nblocks && st == PULSE_OK; b++) {
    const shard_part_block *x = &v.blocks[b];
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[x->tensor].shape, s->info[x->tensor].ndim, &numel);
    if ((marks[b] = shard_chunk_marks(g, block_count, x->tensor, numel, s->chunk_log2)) == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
    else
      kept[b] = cut_block(x, marks[b], s->chunk_log2, NULL, 0);
    size += SHARD_BLOCK_HEADER + 12 * (size_t)kept[b];
  }
  uint8_t *p = st == PULSE_OK ? malloc(size) : NULL;
  if (st == PULSE_OK && p == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: part_for");
  if (st == PULSE_OK) {
    memcpy(p, part->data, SHARD_PART_HEADER);
    size_t at = SHARD_PART_HEADER;
    for (size_t b = 0; b < v.nblocks; b++) {
      memcpy(p + at, v.blocks[b].header, SHARD_BLOCK_HEADER);
      pulse_store_le64(p + at + 48, kept[b]);
      at += SHARD_BLOCK_HEADER;
      (void)cut_block(&v.blocks[b], marks[b], s->chunk_log2, p + at, kept[b]);
      at += 12 * (size_t)kept[b];
    }
    out->data = p;
    out->size = size;
  }
  for (size_t b = 0; marks != NULL && b < v.nblocks; b++)
    free(marks[b]);
  free(marks), free(kept), free(g);
  shard_view_free(&v);
  return st;
}
