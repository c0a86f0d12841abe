/* shard_code.c - chunk streams of a sharded step (pulse_pub_shard.h): one
 * chunk's stream from its changes and their class ranks, and the streams
 * a rank codes alone, those of the changed chunks its blocks cover
 * entirely, so that their changes never leave it (the encoding rank
 * receives streams, about the patch's bytes, instead of 12 bytes a
 * change). */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "endian_impl.h"
#include "pulse_elem.h"
#include "shard_impl.h"
#include "status_impl.h"

pulse_status shard_code_chunk(unsigned version, pulse_pos_model model, const uint32_t *hist,
                              uint32_t n, uint64_t first, const pulse_changes *c, uint64_t from,
                              uint32_t k, const uint32_t *rank, pulse_bytebuf *out) {
  uint16_t *delta = malloc((size_t)k * sizeof *delta);
  uint8_t *cls = malloc(k);
  uint32_t *pos = model == PULSE_POS_PLAIN ? malloc((size_t)k * sizeof *pos) : NULL;
  pulse_status st = PULSE_OK;
  if (delta == NULL || cls == NULL || (model == PULSE_POS_PLAIN && pos == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk of %u changes", k);
  for (uint32_t j = 0; st == PULSE_OK && j < k; j++) {
    delta[j] = pulse_bf16_delta(c->old_bits[from + j], c->new_bits[from + j]);
    cls[j] = (uint8_t)pulse_bf16_class(c->old_bits[from + j]);
    if (pos != NULL)
      pos[j] = (uint32_t)(c->pos[from + j] - first);
  }
  if (st == PULSE_OK && model == PULSE_POS_CLASS) {
    /* Ranks summed from several ranks' counts must be a rank form a decoder
     * inverts: class counts that cover the chunk, ranks inside their class
     * and increasing (else the counts did not add up: refused, not coded). */
    uint64_t total = 0;
    int64_t last[PULSE_CLASS_COUNT];
    for (unsigned q = 0; q < PULSE_CLASS_COUNT; q++)
      total += hist[q], last[q] = -1;
    for (uint32_t j = 0; j < k && total == n; j++) {
      if (rank[j] >= hist[cls[j]] || (int64_t)rank[j] <= last[cls[j]])
        total = 0;
      last[cls[j]] = rank[j];
    }
    if (total != n)
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: the counts of the chunk at element %llu do not "
                      "add up to its class ranks", (unsigned long long)first);
  }
  if (st == PULSE_OK)
    st = model == PULSE_POS_PLAIN
             ? pulse_chunk_encode(version, model, NULL, n, pos, delta, k, out)
             : pulse_chunk_encode_ranks(version, model, hist, n, k, cls, rank, delta, out);
  free(delta), free(cls), free(pos);
  return st;
}

uint64_t shard_first_change(const pulse_changes *c, uint64_t pos) {
  uint64_t lo = 0, hi = c->count;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (c->pos[mid] < pos)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

typedef struct {
  uint64_t pos;
  uint16_t old_bits, new_bits;
} one_change;

static int by_pos(const void *a, const void *b) {
  uint64_t x = ((const one_change *)a)->pos, y = ((const one_change *)b)->pos;
  return x < y ? -1 : x > y;
}

/* The pending changes of tensor t in [lo, hi) over the shard's blocks, in
 * position order. When one block holds them all (dim-0 blocks, flat
 * ranges) *out is a view of its list and *owned 0: no copy. Else they are
 * copied (*owned 1), and sorted where blocks' runs interleave (column
 * blocks). */
static pulse_status chunk_changes(const pulse_pub_shard *s, size_t t, uint64_t lo, uint64_t hi,
                                  pulse_changes *out, int *owned) {
  size_t holders = 0, one = 0;
  for (size_t b = 0; b < s->nblocks; b++) {
    const pulse_changes *c = &s->changes[b];
    uint64_t j = s->geom[b].tensor == t ? shard_first_change(c, lo) : c->count;
    if (j < c->count && c->pos[j] < hi)
      holders++, one = b;
  }
  *owned = holders > 1;
  if (holders == 1) {
    const pulse_changes *c = &s->changes[one];
    uint64_t j = shard_first_change(c, lo), e = shard_first_change(c, hi);
    *out = (pulse_changes)PULSE_CHANGES_INIT;
    out->pos = c->pos + j, out->old_bits = c->old_bits + j, out->new_bits = c->new_bits + j;
    out->count = e - j;
    return PULSE_OK;
  }
  int sorted = 1;
  for (size_t b = 0; holders > 1 && b < s->nblocks; b++) {
    const pulse_changes *c = &s->changes[b];
    if (s->geom[b].tensor != t)
      continue;
    for (uint64_t j = shard_first_change(c, lo); j < c->count && c->pos[j] < hi; j++) {
      sorted &= out->count == 0 || out->pos[out->count - 1] < c->pos[j];
      PULSE_TRY(pulse_changes_push(out, c->pos[j], c->old_bits[j], c->new_bits[j]));
    }
  }
  if (sorted)
    return PULSE_OK;
  one_change *v = malloc((size_t)out->count * sizeof *v);
  if (v == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk's changes");
  for (uint64_t j = 0; j < out->count; j++)
    v[j] = (one_change){out->pos[j], out->old_bits[j], out->new_bits[j]};
  qsort(v, (size_t)out->count, sizeof *v, by_pos);
  for (uint64_t j = 0; j < out->count; j++)
    out->pos[j] = v[j].pos, out->old_bits[j] = v[j].old_bits, out->new_bits[j] = v[j].new_bits;
  free(v);
  return PULSE_OK;
}

/* Codes chunk k of tensor t (covered by the shard's blocks) into out as
 * one coded item; nothing when it has no changes. */
static pulse_status code_one(const pulse_pub_shard *s, size_t t, uint64_t numel, uint64_t k,
                             pulse_bytebuf *out, uint64_t *items) {
  uint32_t log2 = s->chunk_log2;
  uint64_t lo = k << log2, hi = lo + ((uint64_t)1 << log2);
  hi = hi < numel ? hi : numel;
  pulse_changes c = PULSE_CHANGES_INIT;
  int owned = 1;
  uint32_t *rank = NULL, *hist = NULL;
  pulse_status st = chunk_changes(s, t, lo, hi, &c, &owned);
  if (st == PULSE_OK && c.count == 0) {
    if (owned)
      pulse_changes_free(&c);
    return PULSE_OK;
  }
  if (st == PULSE_OK && ((rank = calloc((size_t)c.count, sizeof *rank)) == NULL ||
                         (hist = calloc(PULSE_CLASS_COUNT, sizeof *hist)) == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk's ranks");
  if (st == PULSE_OK && s->pos_model == PULSE_POS_CLASS)
    for (size_t b = 0; b < s->nblocks; b++)
      if (s->geom[b].tensor == t)
        shard_count_block(&s->geom[b], s->snap[b], &c, &k, 1, log2, rank, hist);
  size_t at = out->size;
  if (st == PULSE_OK) {
    uint8_t head[SHARD_CODED_HEADER];
    memset(head, 0, sizeof head);
    pulse_store_le64(head, t);
    pulse_store_le64(head + 8, k);
    pulse_store_le64(head + 16, c.count);
    pulse_bytebuf_put(out, head, sizeof head);
    st = shard_code_chunk(s->format_version, s->pos_model, hist, (uint32_t)(hi - lo), lo, &c, 0,
                          (uint32_t)c.count, rank, out);
  }
  if (st == PULSE_OK && out->failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  if (st == PULSE_OK) {
    pulse_store_le64(out->data + at + 24, out->size - at - SHARD_CODED_HEADER);
    (*items)++;
  }
  if (owned)
    pulse_changes_free(&c);
  free(rank), free(hist);
  return st;
}

pulse_status shard_code_whole(const pulse_pub_shard *s, pulse_bytebuf *out, uint64_t *items) {
  *items = 0;
  if (!s->pending)
    return PULSE_OK;
  for (size_t t = 0; t < s->count; t++) {
    if (s->whole[t] == NULL)
      continue;
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[t].shape, s->info[t].ndim, &numel);
    uint64_t nck = ((numel - 1) >> s->chunk_log2) + 1;
    /* The whole chunks that hold changes, then each coded in chunk order. */
    uint8_t *changed = calloc((size_t)(nck / 8 + 1), 1);
    if (changed == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "shard: chunks");
    for (size_t b = 0; b < s->nblocks; b++) {
      const pulse_changes *c = &s->changes[b];
      for (uint64_t j = 0; s->geom[b].tensor == t && j < c->count; j++) {
        uint64_t k = c->pos[j] >> s->chunk_log2;
        if (shard_chunk_whole(s, t, c->pos[j]))
          changed[k >> 3] |= (uint8_t)(1u << (k & 7));
      }
    }
    pulse_status st = PULSE_OK;
    for (uint64_t k = 0; k < nck && st == PULSE_OK; k++)
      if (changed[k >> 3] >> (k & 7) & 1)
        st = code_one(s, t, numel, k, out, items);
    free(changed);
    PULSE_TRY(st);
  }
  return PULSE_OK;
}
