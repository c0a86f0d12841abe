/* shard_encode.c - the exchange half of a sharded publish
 * (pulse_pub_shard.h): reading parts, each rank's counts of the class ranks
 * its blocks contribute, and the patch from every rank's parts and counts. */
#include <stdlib.h>
#include <string.h>

#include "endian_impl.h"
#include "pulse_elem.h"
#include "shard_impl.h"
#include "status_impl.h"

/* One block of a part, read in place. */
typedef struct {
  uint64_t tensor, elems, k;
  pulse_tensor_digest base, target;
  const uint8_t *pos, *old_bits, *new_bits;
  uint64_t first; /* index of its first change in the step's enumeration */
} part_block;

typedef struct {
  part_block *blocks;
  size_t nblocks;
  uint64_t changes; /* over every part */
} parts_view;

static void view_free(parts_view *v) {
  free(v->blocks);
  memset(v, 0, sizeof *v);
}

static pulse_status view_parts(const pulse_buffer *parts, size_t nparts, size_t tensor_count,
                               const uint8_t table_id[32], uint32_t chunk_log2, parts_view *v) {
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
      part_block *x = &v->blocks[v->nblocks++];
      const uint8_t *q = p + at;
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
      x->first = v->changes;
      v->changes += x->k;
    }
    if (at != size)
      goto short_part;
    continue;
  short_part:
    view_free(v);
    return pulse_fail(PULSE_ERR_CORRUPT, "shard: part %zu is cut short or inconsistent", i);
  }
  return PULSE_OK;
}

/* One change of the step, for sorting by position within its tensor. */
typedef struct {
  uint64_t pos;
  uint64_t index; /* in the step's enumeration */
  uint16_t old_bits, new_bits;
} step_change;

static step_change change_at(const part_block *x, uint64_t j) {
  return (step_change){pulse_load_le64(x->pos + 8 * j), x->first + j,
                       pulse_load_le16(x->old_bits + 2 * j),
                       pulse_load_le16(x->new_bits + 2 * j)};
}

/* The changes of tensor t over every part, sorted by position; *n of them.
 * Each block's changes are in increasing position order (else
 * PULSE_ERR_CORRUPT); the blocks' lists are merged: blocks that do not
 * interleave (flat ranges, dim-0 blocks, whole tensors) are concatenated,
 * others (column blocks) merged head by head. */
static pulse_status tensor_changes(const parts_view *v, uint64_t t, step_change **out,
                                   uint64_t *n) {
  uint64_t k = 0;
  size_t nb = 0;
  for (size_t b = 0; b < v->nblocks; b++)
    if (v->blocks[b].tensor == t && v->blocks[b].k > 0)
      k += v->blocks[b].k, nb++;
  step_change *c = malloc((k ? k : 1) * sizeof *c);
  const part_block **bl = malloc((nb ? nb : 1) * sizeof *bl);
  uint64_t *head = calloc(nb ? nb : 1, sizeof *head);
  if (c == NULL || bl == NULL || head == NULL) {
    free(c), free(bl), free(head);
    return pulse_fail(PULSE_ERR_NOMEM, "shard: changes");
  }
  nb = 0;
  for (size_t b = 0; b < v->nblocks; b++)
    if (v->blocks[b].tensor == t && v->blocks[b].k > 0)
      bl[nb++] = &v->blocks[b];
  pulse_status st = PULSE_OK;
  for (size_t b = 0; b < nb && st == PULSE_OK; b++)
    for (uint64_t j = 1; j < bl[b]->k; j++)
      if (pulse_load_le64(bl[b]->pos + 8 * j) <= pulse_load_le64(bl[b]->pos + 8 * (j - 1))) {
        st = pulse_fail(PULSE_ERR_CORRUPT, "shard: a part's changes are not in position order");
        break;
      }
  /* Blocks by first position (insertion sort: a handful per tensor). */
  for (size_t b = 1; b < nb; b++)
    for (size_t a = b; a > 0 && pulse_load_le64(bl[a]->pos) < pulse_load_le64(bl[a - 1]->pos);
         a--) {
      const part_block *x = bl[a];
      bl[a] = bl[a - 1], bl[a - 1] = x;
    }
  int disjoint = 1;
  for (size_t b = 1; b < nb; b++)
    if (pulse_load_le64(bl[b]->pos) <= pulse_load_le64(bl[b - 1]->pos + 8 * (bl[b - 1]->k - 1)))
      disjoint = 0;
  uint64_t m = 0;
  if (st == PULSE_OK && disjoint) {
    for (size_t b = 0; b < nb; b++)
      for (uint64_t j = 0; j < bl[b]->k; j++)
        c[m++] = change_at(bl[b], j);
  } else if (st == PULSE_OK) {
    while (m < k) {
      size_t best = nb;
      uint64_t bp = 0;
      for (size_t b = 0; b < nb; b++) {
        if (head[b] == bl[b]->k)
          continue;
        uint64_t p = pulse_load_le64(bl[b]->pos + 8 * head[b]);
        if (best == nb || p < bp)
          best = b, bp = p;
      }
      c[m++] = change_at(bl[best], head[best]++);
    }
  }
  free(bl), free(head);
  if (st != PULSE_OK) {
    free(c);
    return st;
  }
  *out = c;
  *n = k;
  return PULSE_OK;
}

/* Distinct chunks of sorted changes c (n), into chunks (room for n). */
static uint64_t changed_chunks(const step_change *c, uint64_t n, uint32_t log2,
                               uint64_t *chunks) {
  uint64_t m = 0;
  for (uint64_t j = 0; j < n; j++)
    if (m == 0 || chunks[m - 1] != c[j].pos >> log2)
      chunks[m++] = c[j].pos >> log2;
  return m;
}

static uint64_t chunk_slot(const uint64_t *chunks, uint64_t m, uint64_t k) {
  uint64_t lo = 0, hi = m;
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (chunks[mid] < k)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < m && chunks[lo] == k ? lo : m;
}

/* Walks block g's elements in the changed chunks in position order beside
 * the sorted changes c: each change gets the count of the block's elements
 * of its class before it in its chunk, and each changed chunk the block's
 * class counts (hist, m * 256). */
static void count_block(const shard_geom *g, const uint16_t *snap, const step_change *c,
                        uint64_t n, const uint64_t *chunks, uint64_t m, uint32_t log2,
                        uint32_t *contrib, uint32_t *hist) {
  uint32_t cnt[PULSE_CLASS_COUNT];
  memset(cnt, 0, sizeof cnt);
  uint64_t cur = UINT64_MAX, ci = 0;
#define EMIT_BEFORE(limit)                                                           \
  for (; ci < n && c[ci].pos < (limit); ci++)                                        \
    if ((c[ci].pos >> log2) == cur)                                                  \
      contrib[c[ci].index] += cnt[pulse_bf16_class(c[ci].old_bits)];
#define CLOSE_CHUNK()                                                                \
  do {                                                                               \
    if (cur != UINT64_MAX) {                                                         \
      uint64_t s_ = chunk_slot(chunks, m, cur);                                      \
      if (s_ < m)                                                                    \
        for (unsigned q_ = 0; q_ < PULSE_CLASS_COUNT; q_++)                          \
          hist[s_ * PULSE_CLASS_COUNT + q_] += cnt[q_];                              \
    }                                                                                \
  } while (0)
  for (uint64_t r = 0; r < g->runs; r++) {
    uint64_t pos = shard_run_pos(g, r), end = pos + g->run_len;
    const uint16_t *bits = snap + r * g->run_len - pos;
    while (pos < end) {
      uint64_t k = pos >> log2, seg = (k + 1) << log2;
      if (seg > end)
        seg = end;
      EMIT_BEFORE(pos);
      if (k != cur) {
        CLOSE_CHUNK();
        memset(cnt, 0, sizeof cnt);
        cur = k;
      }
      if (chunk_slot(chunks, m, k) < m)
        for (uint64_t e = pos; e < seg; e++) {
          EMIT_BEFORE(e + 1);
          cnt[pulse_bf16_class(bits[e])]++;
        }
      pos = seg;
    }
  }
  EMIT_BEFORE(UINT64_MAX);
  CLOSE_CHUNK();
#undef EMIT_BEFORE
#undef CLOSE_CHUNK
}

pulse_status pulse_pub_shard_count(const pulse_pub_shard *s, const pulse_buffer *parts,
                                   size_t nparts, pulse_buffer *counts) {
  if (s == NULL || counts == NULL || (parts == NULL && nparts > 0))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  counts->data = NULL, counts->size = 0;
  if (!s->have_snapshot)
    return pulse_fail(PULSE_ERR_ARG, "shard: count before the first detect");
  parts_view v;
  PULSE_TRY(view_parts(parts, nparts, s->count, s->table_id, s->chunk_log2, &v));
  /* Slots: changed chunks of every tensor, in tensor order. */
  step_change **tc = calloc(s->count, sizeof *tc);
  uint64_t *tn = calloc(s->count, sizeof *tn), *tm = calloc(s->count, sizeof *tm);
  uint64_t **tchunks = calloc(s->count, sizeof *tchunks);
  pulse_status st = tc && tn && tm && tchunks ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "shard");
  uint64_t slots = 0;
  for (size_t t = 0; st == PULSE_OK && t < s->count; t++) {
    if ((st = tensor_changes(&v, t, &tc[t], &tn[t])) != PULSE_OK)
      break;
    if ((tchunks[t] = malloc((tn[t] ? tn[t] : 1) * sizeof **tchunks)) == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "shard");
      break;
    }
    tm[t] = changed_chunks(tc[t], tn[t], s->chunk_log2, tchunks[t]);
    slots += tm[t];
  }
  uint8_t *out = NULL;
  size_t size = SHARD_COUNT_HEADER + 4 * (size_t)v.changes + 4 * PULSE_CLASS_COUNT * (size_t)slots;
  uint32_t *contrib = NULL, *hist = NULL;
  if (st == PULSE_OK) {
    contrib = calloc(v.changes ? v.changes : 1, 4);
    hist = calloc(slots ? slots * PULSE_CLASS_COUNT : 1, 4);
    out = malloc(size);
    if (!contrib || !hist || !out)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  }
  if (st == PULSE_OK) {
    uint64_t slot0 = 0;
    for (size_t t = 0; t < s->count; t++) {
      for (size_t b = 0; b < s->nblocks; b++)
        if (s->geom[b].tensor == t && tm[t] > 0)
          count_block(&s->geom[b], s->snap[b], tc[t], tn[t], tchunks[t], tm[t], s->chunk_log2,
                      contrib, hist + slot0 * PULSE_CLASS_COUNT);
      slot0 += tm[t];
    }
    memcpy(out, SHARD_COUNT_MAGIC, 8);
    pulse_store_le32(out + 8, SHARD_WIRE_VERSION);
    pulse_store_le32(out + 12, s->chunk_log2);
    memcpy(out + 16, s->table_id, 32);
    pulse_store_le64(out + 48, v.changes);
    pulse_store_le64(out + 56, slots);
    uint8_t *p = out + SHARD_COUNT_HEADER;
    for (uint64_t j = 0; j < v.changes; j++, p += 4)
      pulse_store_le32(p, contrib[j]);
    for (uint64_t j = 0; j < slots * PULSE_CLASS_COUNT; j++, p += 4)
      pulse_store_le32(p, hist[j]);
    counts->data = out, counts->size = size;
    out = NULL;
  }
  for (size_t t = 0; tc && t < s->count; t++)
    free(tc[t]), free(tchunks[t]);
  free(tc), free(tn), free(tm), free(tchunks), free(contrib), free(hist), free(out);
  view_free(&v);
  return st;
}

pulse_status pulse_pub_shard_encode(const pulse_tensor_info *table, size_t tensor_count,
                                    const pulse_encode_opts *opts, const pulse_buffer *parts,
                                    size_t nparts, const pulse_buffer *counts, size_t ncounts,
                                    pulse_state_digest *base_digest, pulse_buffer *patch) {
  if (table == NULL || tensor_count == 0 || opts == NULL || patch == NULL ||
      (parts == NULL && nparts) || (counts == NULL && ncounts))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  patch->data = NULL, patch->size = 0;
  PULSE_TRY(PULSE_OPTS_CHECK("shard encode", opts, PULSE_ENCODE_OPTS_VERSION));
  if (opts->chunk_log2 < 10 || opts->chunk_log2 > 30)
    return pulse_fail(PULSE_ERR_ARG, "shard: chunk_log2 in 10..30");
  uint8_t id[32];
  PULSE_TRY(shard_table_id(table, tensor_count, id));
  parts_view v;
  PULSE_TRY(view_parts(parts, nparts, tensor_count, id, opts->chunk_log2, &v));
  uint32_t log2 = opts->chunk_log2;
  size_t n = tensor_count;
  pulse_encode_tensor *enc = calloc(n, sizeof *enc);
  pulse_changes *ch = calloc(n, sizeof *ch);
  pulse_tensor_digest *bd = calloc(n, sizeof *bd);
  uint64_t *elems = calloc(n, sizeof *elems), *slot0 = calloc(n + 1, sizeof *slot0);
  uint8_t **cls = calloc(n, sizeof *cls);
  uint32_t **rank = calloc(n, sizeof *rank), **hist = calloc(n, sizeof *hist);
  uint64_t **chunks = calloc(n, sizeof *chunks);
  uint64_t *nchunk = calloc(n, sizeof *nchunk);
  step_change **tc = calloc(n, sizeof *tc);
  uint32_t *contrib = calloc(v.changes ? v.changes : 1, 4);
  pulse_status st = enc && ch && bd && elems && slot0 && cls && rank && hist && chunks &&
                            nchunk && tc && contrib
                        ? PULSE_OK
                        : pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
  for (size_t b = 0; st == PULSE_OK && b < v.nblocks; b++) {
    const part_block *x = &v.blocks[b];
    bd[x->tensor].a += x->base.a, bd[x->tensor].b += x->base.b;
    elems[x->tensor] += x->elems;
  }
  for (size_t t = 0; st == PULSE_OK && t < n; t++) {
    uint64_t numel = 0;
    if ((st = pulse_shape_numel(table[t].shape, table[t].ndim, &numel)) != PULSE_OK)
      break;
    if (elems[t] != numel) {
      st = pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': the parts' blocks hold %llu of %llu "
                      "elements", table[t].name, (unsigned long long)elems[t],
                      (unsigned long long)numel);
      break;
    }
    uint64_t k = 0;
    if ((st = tensor_changes(&v, t, &tc[t], &k)) != PULSE_OK)
      break;
    for (uint64_t j = 1; j < k && st == PULSE_OK; j++)
      if (tc[t][j].pos == tc[t][j - 1].pos)
        st = pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': two parts change element %llu "
                        "(blocks overlap)", table[t].name, (unsigned long long)tc[t][j].pos);
    if (st != PULSE_OK)
      break;
    uint64_t nck = numel ? ((numel - 1) >> log2) + 1 : 0;
    chunks[t] = malloc((k ? k : 1) * sizeof **chunks);
    cls[t] = malloc(k ? k : 1);
    rank[t] = malloc((k ? k : 1) * 4);
    hist[t] = calloc(nck ? nck * PULSE_CLASS_COUNT : 1, 4);
    if (!chunks[t] || !cls[t] || !rank[t] || !hist[t] ||
        (k && pulse_changes_reserve(&ch[t], k) != PULSE_OK)) {
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
      break;
    }
    nchunk[t] = changed_chunks(tc[t], k, log2, chunks[t]);
    slot0[t + 1] = slot0[t] + nchunk[t];
    for (uint64_t j = 0; j < k; j++)
      (void)pulse_changes_push(&ch[t], tc[t][j].pos, tc[t][j].old_bits, tc[t][j].new_bits);
  }
  /* Every rank's counts: rank contributions and class counts add up. */
  for (size_t i = 0; st == PULSE_OK && i < ncounts; i++) {
    const uint8_t *p = counts[i].data;
    if (p == NULL || counts[i].size < SHARD_COUNT_HEADER ||
        memcmp(p, SHARD_COUNT_MAGIC, 8) != 0 || pulse_load_le32(p + 8) != SHARD_WIRE_VERSION ||
        pulse_load_le32(p + 12) != log2 || memcmp(p + 16, id, 32) != 0 ||
        pulse_load_le64(p + 48) != v.changes || pulse_load_le64(p + 56) != slot0[n] ||
        counts[i].size != SHARD_COUNT_HEADER + 4 * (size_t)v.changes +
                              4 * PULSE_CLASS_COUNT * (size_t)slot0[n]) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu are not of these parts", i);
      break;
    }
    p += SHARD_COUNT_HEADER;
    for (uint64_t j = 0; j < v.changes; j++, p += 4)
      contrib[j] += pulse_load_le32(p);
    for (size_t t = 0; t < n; t++)
      for (uint64_t q = 0; q < nchunk[t]; q++) {
        uint32_t *h = hist[t] + chunks[t][q] * PULSE_CLASS_COUNT;
        for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++, p += 4)
          h[c] += pulse_load_le32(p);
      }
  }
  for (size_t t = 0; st == PULSE_OK && t < n; t++) {
    for (uint64_t j = 0; j < ch[t].count; j++) {
      cls[t][j] = (uint8_t)pulse_bf16_class(tc[t][j].old_bits);
      rank[t][j] = contrib[tc[t][j].index];
    }
    enc[t].info = table[t];
    enc[t].info.dtype = PULSE_DTYPE_BF16;
    enc[t].base = NULL;
    enc[t].changes = &ch[t];
    enc[t].base_digest = &bd[t];
    enc[t].chunk_hist = hist[t];
    enc[t].change_class = cls[t];
    enc[t].change_rank = rank[t];
  }
  if (st == PULSE_OK && base_digest != NULL) {
    pulse_tensor_info *info = malloc(n * sizeof *info);
    if (info == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
    for (size_t t = 0; info && t < n; t++)
      info[t] = table[t], info[t].dtype = PULSE_DTYPE_BF16;
    if (st == PULSE_OK)
      st = pulse_state_digest_compute(info, bd, n, base_digest);
    free(info);
  }
  if (st == PULSE_OK)
    st = pulse_patch_encode(opts, enc, n, patch);
  for (size_t t = 0; t < n; t++) {
    if (ch)
      pulse_changes_free(&ch[t]);
    if (cls)
      free(cls[t]);
    if (rank)
      free(rank[t]);
    if (hist)
      free(hist[t]);
    if (chunks)
      free(chunks[t]);
    if (tc)
      free(tc[t]);
  }
  free(enc), free(ch), free(bd), free(elems), free(slot0), free(cls), free(rank), free(hist);
  free(chunks), free(nchunk), free(tc), free(contrib);
  view_free(&v);
  return st;
}
