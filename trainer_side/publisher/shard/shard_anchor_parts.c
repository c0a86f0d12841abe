/* shard_anchor_parts.c - any rank's bytes in a part of an anchor, from
 * the table and that rank's blocks alone: how many
 * (pulse_pub_anchor_owned) and where they go (pulse_pub_anchor_place), so
 * that the rank assembling a part of a multipart upload puts every rank's
 * pulse_pub_shard_anchor_read bytes at their places (pulse_pub_shard.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "shard_anchor_impl.h"
#include "status_impl.h"

typedef struct {
  const char *name;
  size_t tensor;
} named;

static int named_cmp(const void *a, const void *b) {
  return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* The blocks' geometries; names found through a sorted index of the
 * table (a part costs O((tensors + blocks) log tensors) beside its
 * bytes, not tensors x blocks). */
static pulse_status blocks_geom(const pulse_tensor_info *table, size_t count,
                                const pulse_pub_block *blocks, size_t nblocks,
                                shard_geom **out) {
  named *index = malloc((count ? count : 1) * sizeof *index);
  shard_geom *g = malloc((nblocks ? nblocks : 1) * sizeof *g);
  pulse_status st = PULSE_OK;
  if (index == NULL || g == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: anchor blocks");
  for (size_t t = 0; st == PULSE_OK && t < count; t++) {
    if (table[t].name == NULL)
      st = pulse_fail(PULSE_ERR_ARG,
                      "shard: tensor %zu of the table has no name", t);
    index[t] = (named){table[t].name, t};
  }
  if (st == PULSE_OK)
    qsort(index, count, sizeof *index, named_cmp);
  for (size_t i = 0; st == PULSE_OK && i < nblocks; i++) {
    named key = {blocks[i].name, 0}, *hit = NULL;
    if (key.name != NULL)
      hit = bsearch(&key, index, count, sizeof *index, named_cmp);
    if (hit == NULL)
      st = pulse_fail(PULSE_ERR_NOT_FOUND,
                      "shard: block %zu: tensor '%s' is not in the table", i,
                      key.name ? key.name : "(null)");
    else
      st = shard_geom_make(&table[hit->tensor], hit->tensor, &blocks[i], &g[i]);
  }
  free(index);
  if (st != PULSE_OK) {
    free(g);
    return st;
  }
  *out = g;
  return PULSE_OK;
}

typedef struct {
  uint64_t owned;
  const uint8_t *bytes; /* placing: the rank's bytes, consumed in order */
  uint8_t *dst;
  uint64_t off;
} anchor_placer;

static pulse_status count_piece(void *ctx, const shard_anchor_piece *p) {
  ((anchor_placer *)ctx)->owned += p->size;
  return PULSE_OK;
}

static pulse_status place_piece(void *ctx, const shard_anchor_piece *p) {
  anchor_placer *a = ctx;
  memcpy(a->dst + (p->file_at - a->off), a->bytes + a->owned, p->size);
  a->owned += p->size;
  return PULSE_OK;
}

/* Counts the blocks' bytes in the range, then (with bytes) places them. */
static pulse_status owned_walk(const pulse_tensor_info *table, size_t count,
                               const pulse_pub_block *blocks, size_t nblocks,
                               uint64_t header_size, uint64_t off, uint64_t len,
                               anchor_placer *a, size_t nbytes) {
  if (table == NULL || count == 0 || (blocks == NULL && nblocks > 0))
    return pulse_fail(PULSE_ERR_ARG,
                      "shard: anchor part: NULL table or blocks");
  shard_geom *g = NULL;
  PULSE_TRY(blocks_geom(table, count, blocks, nblocks, &g));
  shard_anchor_layout l;
  pulse_status st = shard_anchor_layout_make(table, count, g, nblocks, &l);
  if (st != PULSE_OK) {
    free(g);
    return st;
  }
  st = shard_anchor_walk(&l, header_size, off, len, count_piece, a);
  if (st == PULSE_OK && a->dst != NULL) {
    /* Nothing is written unless the bytes are exactly the blocks'. */
    if (a->owned != nbytes)
      st = pulse_fail(PULSE_ERR_ARG,
                      "shard: anchor part [%" PRIu64 ", +%" PRIu64
                      "): the blocks own %" PRIu64 " bytes of it, not %zu",
                      off, len, a->owned, nbytes);
    a->owned = 0;
    if (st == PULSE_OK)
      st = shard_anchor_walk(&l, header_size, off, len, place_piece, a);
  }
  shard_anchor_layout_free(&l);
  free(g);
  return st;
}

pulse_status pulse_pub_anchor_owned(const pulse_tensor_info *table,
                                    size_t count, const pulse_pub_block *blocks,
                                    size_t nblocks, uint64_t header_size,
                                    uint64_t off, uint64_t len,
                                    uint64_t *bytes) {
  if (bytes == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: anchor part: NULL bytes");
  anchor_placer a;
  memset(&a, 0, sizeof a);
  PULSE_TRY(
      owned_walk(table, count, blocks, nblocks, header_size, off, len, &a, 0));
  *bytes = a.owned;
  return PULSE_OK;
}

pulse_status pulse_pub_anchor_place(const pulse_tensor_info *table,
                                    size_t count, const pulse_pub_block *blocks,
                                    size_t nblocks, uint64_t header_size,
                                    uint64_t off, uint64_t len,
                                    const uint8_t *bytes, size_t nbytes,
                                    uint8_t *dst) {
  if ((dst == NULL && len > 0) || (bytes == NULL && nbytes > 0))
    return pulse_fail(PULSE_ERR_ARG,
                      "shard: anchor part: NULL bytes or destination");
  anchor_placer a = {0, bytes, dst, off};
  return owned_walk(table, count, blocks, nblocks, header_size, off, len, &a,
                    nbytes);
}
