/* shard_anchor_layout.c - the byte layout of an anchor and the walk over
 * the bytes a set of blocks owns in a range of it (shard_anchor_impl.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors_impl.h"
#include "shard_anchor_impl.h"
#include "status_impl.h"

pulse_status shard_anchor_header_build(const pulse_tensor_info *table,
                                       size_t count, uint64_t step,
                                       const pulse_state_digest *digest,
                                       pulse_bytebuf *head,
                                       uint64_t *data_size) {
  /* The header of the single publisher's anchor (publisher_head.c). */
  static const uint16_t dummy = 0;
  pulse_st_write_tensor *t = calloc(count ? count : 1, sizeof *t);
  if (t == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: anchor header");
  for (size_t i = 0; i < count; i++) {
    t[i].name = table[i].name;
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = table[i].ndim;
    memcpy(t[i].shape, table[i].shape, sizeof t[i].shape);
    t[i].data = &dummy; /* not read */
  }
  char step_s[32], digest_s[65];
  snprintf(step_s, sizeof step_s, "%" PRIu64, step);
  pulse_state_digest_hex(digest, digest_s);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", digest_s}};
  pulse_status st = st_header_build(t, count, meta, 2, 0, head, data_size);
  free(t);
  return st;
}

pulse_status shard_anchor_layout_make(const pulse_tensor_info *table,
                                      size_t count, const shard_geom *geom,
                                      size_t ngeom, shard_anchor_layout *l) {
  memset(l, 0, sizeof *l);
  l->count = count;
  l->geom = geom;
  l->ngeom = ngeom;
  l->tensor_at = malloc((count + 1) * sizeof *l->tensor_at);
  l->first = calloc(count + 2, sizeof *l->first);
  l->by_tensor = malloc((ngeom ? ngeom : 1) * sizeof *l->by_tensor);
  l->next_run = malloc((ngeom ? ngeom : 1) * sizeof *l->next_run);
  l->next_pos = malloc((ngeom ? ngeom : 1) * sizeof *l->next_pos);
  if (l->tensor_at == NULL || l->first == NULL || l->by_tensor == NULL ||
      l->next_run == NULL || l->next_pos == NULL) {
    shard_anchor_layout_free(l);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: anchor layout");
  }
  uint64_t at = 0;
  for (size_t t = 0; t < count; t++) {
    uint64_t numel = 0;
    pulse_status st = pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    if (st == PULSE_OK &&
        (numel > UINT64_MAX / 2 || 2 * numel > UINT64_MAX - at))
      st = pulse_fail(PULSE_ERR_OVERFLOW,
                      "shard: anchor of more than 2^64 bytes");
    if (st != PULSE_OK) {
      shard_anchor_layout_free(l);
      return st;
    }
    l->tensor_at[t] = at;
    at += 2 * numel;
  }
  l->tensor_at[count] = at;
  /* Group the blocks by tensor (a counting sort keeps block order). */
  for (size_t i = 0; i < ngeom; i++)
    l->first[geom[i].tensor + 2]++;
  for (size_t t = 0; t < count; t++)
    l->first[t + 2] += l->first[t + 1];
  for (size_t i = 0; i < ngeom; i++)
    l->by_tensor[l->first[geom[i].tensor + 1]++] = i;
  return PULSE_OK;
}

void shard_anchor_layout_free(shard_anchor_layout *l) {
  free(l->tensor_at), free(l->first), free(l->by_tensor);
  free(l->next_run), free(l->next_pos);
  memset(l, 0, sizeof *l);
}

pulse_status shard_anchor_range_check(const shard_anchor_layout *l,
                                      uint64_t header_size, uint64_t off,
                                      uint64_t len) {
  uint64_t data = l->tensor_at[l->count];
  if (header_size > UINT64_MAX - data)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "shard: anchor of more than 2^64 bytes");
  uint64_t file = header_size + data;
  if (off > file || len > file - off)
    return pulse_fail(PULSE_ERR_ARG,
                      "shard: anchor bytes [%" PRIu64 ", +%" PRIu64
                      ") are past the end of its %" PRIu64 " bytes",
                      off, len, file);
  return PULSE_OK;
}

/* The first run of g that ends after tensor byte a (g->runs when none):
 * run positions increase with the run index. */
static uint64_t first_run_after(const shard_geom *g, uint64_t a) {
  uint64_t lo = 0, hi = g->runs;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (2 * (shard_run_pos(g, mid) + g->run_len) > a)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

/* Tensor t's pieces in its bytes [a, b): the runs of its blocks merged in
 * position order (a rank's blocks of one tensor may interleave, as two
 * column blocks do row by row). */
static pulse_status walk_tensor(shard_anchor_layout *l, size_t t,
                                uint64_t file_at, uint64_t a, uint64_t b,
                                shard_anchor_visit visit, void *ctx) {
  const size_t *ids = l->by_tensor + l->first[t];
  size_t n = l->first[t + 1] - l->first[t];
  for (size_t k = 0; k < n; k++) {
    const shard_geom *g = &l->geom[ids[k]];
    uint64_t r = g->run_len > 0 ? first_run_after(g, a) : g->runs;
    l->next_run[ids[k]] = r;
    l->next_pos[ids[k]] = r < g->runs ? shard_run_pos(g, r) : UINT64_MAX;
  }
  for (;;) {
    size_t i = (size_t)-1;
    uint64_t pos = UINT64_MAX;
    for (size_t k = 0; k < n; k++)
      if (l->next_pos[ids[k]] < pos)
        pos = l->next_pos[ids[k]], i = ids[k];
    if (i == (size_t)-1 || 2 * pos >= b)
      return PULSE_OK;
    const shard_geom *g = &l->geom[i];
    uint64_t r = l->next_run[i], lo = 2 * pos, hi = 2 * (pos + g->run_len);
    uint64_t s = lo > a ? lo : a, e = hi < b ? hi : b;
    shard_anchor_piece p = {i, 2 * r * g->run_len + (s - lo), e - s,
                            file_at + s};
    PULSE_TRY(visit(ctx, &p));
    l->next_run[i] = ++r;
    l->next_pos[i] = r < g->runs ? shard_run_pos(g, r) : UINT64_MAX;
  }
}

pulse_status shard_anchor_walk(shard_anchor_layout *l, uint64_t header_size,
                               uint64_t off, uint64_t len,
                               shard_anchor_visit visit, void *ctx) {
  PULSE_TRY(shard_anchor_range_check(l, header_size, off, len));
  if (off + len <= header_size)
    return PULSE_OK; /* the header is no block's */
  uint64_t lo = off > header_size ? off - header_size : 0,
           hi = off + len - header_size;
  /* The first tensor that ends after lo. */
  size_t t0 = 0, t1 = l->count;
  while (t0 < t1) {
    size_t mid = t0 + (t1 - t0) / 2;
    if (l->tensor_at[mid + 1] > lo)
      t1 = mid;
    else
      t0 = mid + 1;
  }
  for (size_t t = t0; t < l->count && l->tensor_at[t] < hi; t++) {
    uint64_t at = l->tensor_at[t], end = l->tensor_at[t + 1];
    uint64_t a = lo > at ? lo - at : 0, b = (hi < end ? hi : end) - at;
    PULSE_TRY(walk_tensor(l, t, header_size + at, a, b, visit, ctx));
  }
  return PULSE_OK;
}
