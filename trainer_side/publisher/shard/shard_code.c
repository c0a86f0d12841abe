/* shard_code.c - chunk streams of a sharded step (pulse_pub_shard.h): one
 * chunk's stream from its changes and their class ranks, and the streams
 * a rank codes alone, those of the changed chunks its blocks cover
 * entirely, so that their changes never leave it (the encoding rank
 * receives streams, about the patch's bytes, instead of 3-4 bytes a
 * change). */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "endian_impl.h"
#include "pulse_elem.h"
#include "shard_impl.h"
#include "status_impl.h"

pulse_status shard_code_chunk(unsigned version, pulse_pos_model model, const uint32_t *hist,
                              uint32_t n, uint64_t first, const shard_chunk *c,
                              const uint32_t *rank, pulse_bytebuf *out) {
  uint32_t k = (uint32_t)c->count;
  uint32_t *pos = model == PULSE_POS_PLAIN ? malloc((size_t)(k ? k : 1) * sizeof *pos) : NULL;
  if (model == PULSE_POS_PLAIN && pos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk of %u changes", k);
  for (uint32_t j = 0; pos != NULL && j < k; j++)
    pos[j] = (uint32_t)(c->pos[j] - first);
  pulse_status st = PULSE_OK;
  if (model == PULSE_POS_CLASS) {
    /* Ranks summed from several ranks' counts must be a rank form a decoder
     * inverts: class counts that cover the chunk, ranks inside their class
     * and increasing (else the counts did not add up: refused, not coded). */
    uint64_t total = 0;
    int64_t last[PULSE_CLASS_COUNT];
    for (unsigned q = 0; q < PULSE_CLASS_COUNT; q++)
      total += hist[q], last[q] = -1;
    for (uint32_t j = 0; j < k && total == n; j++) {
      if (rank[j] >= hist[c->cls[j]] || (int64_t)rank[j] <= last[c->cls[j]])
        total = 0;
      last[c->cls[j]] = rank[j];
    }
    if (total != n)
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: the counts of the chunk at element %llu do not "
                      "add up to its class ranks", (unsigned long long)first);
  }
  if (st == PULSE_OK)
    st = model == PULSE_POS_PLAIN
             ? pulse_chunk_encode(version, NULL, model, NULL, n, pos, c->delta,
                                  k, out)
             : pulse_chunk_encode_ranks(version, NULL, model, hist, n, k,
                                        c->cls, rank, c->delta, out);
  free(pos);
  return st;
}

/* Codes chunk k of tensor t (covered by the shard's blocks, whose pending
 * changes `cur` stand at their first change at or after the chunk's) into
 * out as one coded item, merging the blocks' changes in position order;
 * the cursors move past the chunk. Nothing when it has no changes. */
static pulse_status code_one(const pulse_pub_shard *s, size_t t, uint64_t numel, uint64_t k,
                             shard_own_cursor *cur, shard_chunk *c, pulse_bytebuf *out,
                             uint64_t *items) {
  uint32_t log2 = s->chunk_log2;
  uint64_t lo = k << log2, hi = lo + ((uint64_t)1 << log2);
  hi = hi < numel ? hi : numel;
  c->count = 0;
  for (;;) {
    size_t best = s->nblocks;
    for (size_t b = 0; b < s->nblocks; b++)
      if (cur[b].has && s->geom[b].tensor == t && cur[b].pos < hi &&
          (best == s->nblocks || cur[b].pos < cur[best].pos))
        best = b;
    if (best == s->nblocks)
      break;
    shard_own_cursor *x = &cur[best];
    PULSE_TRY(shard_chunk_push(c, x->pos, x->cls, x->delta));
    shard_own_next(x);
  }
  if (c->count == 0)
    return PULSE_OK;
  uint32_t *rank = calloc((size_t)c->count, sizeof *rank);
  uint32_t hist[PULSE_CLASS_COUNT];
  memset(hist, 0, sizeof hist);
  if (rank == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk's ranks");
  if (s->pos_model == PULSE_POS_CLASS)
    for (size_t b = 0; b < s->nblocks; b++)
      if (s->geom[b].tensor == t)
        shard_count_block(&s->geom[b], s->snap[b], c, &k, 1, log2, rank, hist);
  size_t at = out->size;
  uint8_t head[SHARD_CODED_HEADER];
  memset(head, 0, sizeof head);
  pulse_store_le64(head, t);
  pulse_store_le64(head + 8, k);
  pulse_store_le64(head + 16, c->count);
  pulse_bytebuf_put(out, head, sizeof head);
  pulse_status st = shard_code_chunk(s->format_version, s->pos_model, hist, (uint32_t)(hi - lo),
                                     lo, c, rank, out);
  if (st == PULSE_OK && out->failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  if (st == PULSE_OK) {
    pulse_store_le64(out->data + at + 24, out->size - at - SHARD_CODED_HEADER);
    (*items)++;
  }
  free(rank);
  return st;
}

pulse_status shard_code_whole(const pulse_pub_shard *s, pulse_bytebuf *out, uint64_t *items) {
  *items = 0;
  if (!s->pending)
    return PULSE_OK;
  shard_own_cursor *cur = calloc(s->nblocks ? s->nblocks : 1, sizeof *cur);
  if (cur == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: chunks");
  shard_chunk c = SHARD_CHUNK_INIT;
  pulse_status st = PULSE_OK;
  for (size_t t = 0; t < s->count && st == PULSE_OK; t++) {
    if (s->whole[t] == NULL)
      continue;
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[t].shape, s->info[t].ndim, &numel);
    for (size_t b = 0; b < s->nblocks; b++)
      if (s->geom[b].tensor == t)
        shard_own_open(&cur[b], &s->geom[b], &s->changes[b]);
    /* The whole chunks that hold changes, each coded in chunk order; the
     * changes of shared chunks (in the part) are stepped over. */
    while (st == PULSE_OK) {
      uint64_t k = UINT64_MAX;
      for (size_t b = 0; b < s->nblocks; b++) {
        if (s->geom[b].tensor != t)
          continue;
        while (cur[b].has && !shard_chunk_whole(s, t, cur[b].pos))
          shard_own_next(&cur[b]);
        if (cur[b].has && cur[b].pos >> s->chunk_log2 < k)
          k = cur[b].pos >> s->chunk_log2;
      }
      if (k == UINT64_MAX)
        break;
      st = code_one(s, t, numel, k, cur, &c, out, items);
    }
  }
  shard_chunk_free(&c);
  free(cur);
  return st;
}
