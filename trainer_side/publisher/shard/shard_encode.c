/* shard_encode.c - the exchange half of a sharded publish
 * (pulse_pub_shard.h): reading parts, each rank's counts of the class ranks
 * its blocks contribute, and the patch from every rank's parts and counts. */
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
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
static pulse_status tensor_changes(const parts_view *v, uint64_t t, const uint8_t *mark,
                                   uint32_t log2, step_change **out, uint64_t *n) {
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
  uint64_t m = 0, seen = 0;
#define KEEP(x)                                                                      \
  do {                                                                               \
    step_change x_ = (x);                                                            \
    if (mark == NULL || (mark[(x_.pos >> log2) >> 3] >> ((x_.pos >> log2) & 7) & 1)) \
      c[m++] = x_;                                                                   \
  } while (0)
  if (st == PULSE_OK && disjoint) {
    for (size_t b = 0; b < nb; b++)
      for (uint64_t j = 0; j < bl[b]->k; j++)
        KEEP(change_at(bl[b], j));
  } else if (st == PULSE_OK) {
    while (seen++ < k) {
      size_t best = nb;
      uint64_t bp = 0;
      for (size_t b = 0; b < nb; b++) {
        if (head[b] == bl[b]->k)
          continue;
        uint64_t p = pulse_load_le64(bl[b]->pos + 8 * head[b]);
        if (best == nb || p < bp)
          best = b, bp = p;
      }
      KEEP(change_at(bl[best], head[best]++));
    }
  }
#undef KEEP
  free(bl), free(head);
  if (st != PULSE_OK) {
    free(c);
    return st;
  }
  *out = c;
  *n = m;
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
      contrib[ci] += cnt[pulse_bf16_class(c[ci].old_bits)];
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
  uint32_t log2 = s->chunk_log2;
  pulse_bytebuf out = PULSE_BYTEBUF_INIT, hist_out = PULSE_BYTEBUF_INIT;
  uint8_t head[SHARD_COUNT_HEADER];
  memset(head, 0, sizeof head);
  pulse_bytebuf_put(&out, head, sizeof head);
  uint64_t ncontrib = 0, nhist = 0;
  pulse_status st = PULSE_OK;
  for (size_t t = 0; t < s->count && st == PULSE_OK; t++) {
    int owned = 0;
    for (size_t b = 0; b < s->nblocks; b++)
      owned |= s->geom[b].tensor == t && s->geom[b].elems > 0;
    if (!owned)
      continue;
    /* Only the chunks this rank's blocks meet: its counts elsewhere are 0. */
    uint64_t numel = 0;
    (void)pulse_shape_numel(s->info[t].shape, s->info[t].ndim, &numel);
    uint64_t nck = ((numel - 1) >> log2) + 1;
    uint8_t *mark = calloc((size_t)(nck / 8 + 1), 1);
    step_change *c = NULL;
    uint64_t n = 0, m = 0, *chunks = NULL;
    uint32_t *contrib = NULL, *hist = NULL;
    if (mark == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
    for (size_t b = 0; b < s->nblocks && st == PULSE_OK; b++) {
      const shard_geom *g = &s->geom[b];
      if (g->tensor != t)
        continue;
      for (uint64_t r = 0; r < g->runs; r++) {
        uint64_t at = shard_run_pos(g, r);
        for (uint64_t k = at >> log2; k <= (at + g->run_len - 1) >> log2; k++)
          mark[k >> 3] |= (uint8_t)(1u << (k & 7));
      }
    }
    if (st == PULSE_OK)
      st = tensor_changes(&v, t, mark, log2, &c, &n);
    if (st == PULSE_OK) {
      chunks = malloc((n ? n : 1) * sizeof *chunks);
      contrib = calloc(n ? n : 1, 4);
      if (chunks == NULL || contrib == NULL)
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
    }
    if (st == PULSE_OK) {
      m = changed_chunks(c, n, log2, chunks);
      if ((hist = calloc(m ? m * PULSE_CLASS_COUNT : 1, 4)) == NULL)
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
    }
    for (size_t b = 0; b < s->nblocks && st == PULSE_OK && m > 0; b++)
      if (s->geom[b].tensor == t)
        count_block(&s->geom[b], s->snap[b], c, n, chunks, m, log2, contrib, hist);
    uint8_t e[12];
    for (uint64_t j = 0; j < n && st == PULSE_OK; j++)
      if (contrib[j] > 0) {
        pulse_store_le64(e, c[j].index);
        pulse_store_le32(e + 8, contrib[j]);
        pulse_bytebuf_put(&out, e, 12);
        ncontrib++;
      }
    for (uint64_t q = 0; q < m && st == PULSE_OK; q++) {
      uint8_t h[16 + 4 * PULSE_CLASS_COUNT];
      pulse_store_le64(h, t);
      pulse_store_le64(h + 8, chunks[q]);
      for (unsigned k = 0; k < PULSE_CLASS_COUNT; k++)
        pulse_store_le32(h + 16 + 4 * k, hist[q * PULSE_CLASS_COUNT + k]);
      pulse_bytebuf_put(&hist_out, h, sizeof h);
      nhist++;
    }
    free(mark), free(c), free(chunks), free(contrib), free(hist);
  }
  if (st == PULSE_OK && !hist_out.failed && hist_out.size > 0)
    pulse_bytebuf_put(&out, hist_out.data, hist_out.size);
  if (st == PULSE_OK && (out.failed || hist_out.failed))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  free(hist_out.data);
  if (st != PULSE_OK) {
    free(out.data);
    view_free(&v);
    return st;
  }
  memcpy(out.data, SHARD_COUNT_MAGIC, 8);
  pulse_store_le32(out.data + 8, SHARD_WIRE_VERSION);
  pulse_store_le32(out.data + 12, log2);
  memcpy(out.data + 16, s->table_id, 32);
  pulse_store_le64(out.data + 48, v.changes);
  pulse_store_le64(out.data + 56, ncontrib);
  pulse_store_le64(out.data + 64, nhist);
  counts->data = out.data;
  counts->size = out.size;
  view_free(&v);
  return PULSE_OK;
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
  uint64_t *elems = calloc(n, sizeof *elems);
  uint8_t **cls = calloc(n, sizeof *cls);
  uint32_t **rank = calloc(n, sizeof *rank), **hist = calloc(n, sizeof *hist);
  step_change **tc = calloc(n, sizeof *tc);
  uint32_t *contrib = calloc(v.changes ? v.changes : 1, 4);
  pulse_status st = enc && ch && bd && elems && cls && rank && hist && tc && contrib
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
    if ((st = tensor_changes(&v, t, NULL, log2, &tc[t], &k)) != PULSE_OK)
      break;
    for (uint64_t j = 1; j < k && st == PULSE_OK; j++)
      if (tc[t][j].pos == tc[t][j - 1].pos)
        st = pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': two parts change element %llu "
                        "(blocks overlap)", table[t].name, (unsigned long long)tc[t][j].pos);
    if (st != PULSE_OK)
      break;
    uint64_t nck = numel ? ((numel - 1) >> log2) + 1 : 0;
    cls[t] = malloc(k ? k : 1);
    rank[t] = malloc((k ? k : 1) * 4);
    hist[t] = calloc(nck ? nck * PULSE_CLASS_COUNT : 1, 4);
    if (!cls[t] || !rank[t] || !hist[t] ||
        (k && pulse_changes_reserve(&ch[t], k) != PULSE_OK)) {
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
      break;
    }
    for (uint64_t j = 0; j < k; j++)
      (void)pulse_changes_push(&ch[t], tc[t][j].pos, tc[t][j].old_bits, tc[t][j].new_bits);
  }
  /* Every rank's counts: rank contributions and class counts add up. */
  for (size_t i = 0; st == PULSE_OK && i < ncounts; i++) {
    const uint8_t *p = counts[i].data;
    uint64_t nc = 0, nh = 0;
    const uint64_t hentry = 16 + 4 * PULSE_CLASS_COUNT;
    if (p != NULL && counts[i].size >= SHARD_COUNT_HEADER)
      nc = pulse_load_le64(p + 56), nh = pulse_load_le64(p + 64);
    if (p == NULL || counts[i].size < SHARD_COUNT_HEADER ||
        memcmp(p, SHARD_COUNT_MAGIC, 8) != 0 || pulse_load_le32(p + 8) != SHARD_WIRE_VERSION ||
        pulse_load_le32(p + 12) != log2 || memcmp(p + 16, id, 32) != 0 ||
        pulse_load_le64(p + 48) != v.changes || nc > counts[i].size / 12 ||
        nh > counts[i].size / hentry ||
        counts[i].size != SHARD_COUNT_HEADER + 12 * nc + hentry * nh) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu are not of these parts", i);
      break;
    }
    p += SHARD_COUNT_HEADER;
    for (uint64_t j = 0; j < nc && st == PULSE_OK; j++, p += 12) {
      uint64_t at = pulse_load_le64(p);
      if (at >= v.changes)
        st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name change %llu", i,
                        (unsigned long long)at);
      else
        contrib[at] += pulse_load_le32(p + 8);
    }
    for (uint64_t j = 0; j < nh && st == PULSE_OK; j++, p += hentry) {
      uint64_t t = pulse_load_le64(p), k = pulse_load_le64(p + 8), numel = 0;
      if (t < n)
        (void)pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
      if (t >= n || numel == 0 || k > (numel - 1) >> log2) {
        st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name a chunk out of range", i);
        break;
      }
      uint32_t *h = hist[t] + k * PULSE_CLASS_COUNT;
      for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
        h[c] += pulse_load_le32(p + 16 + 4 * c);
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
    if (tc)
      free(tc[t]);
  }
  free(enc), free(ch), free(bd), free(elems), free(cls), free(rank), free(hist);
  free(tc), free(contrib);
  view_free(&v);
  return st;
}

pulse_status shard_parts_check(const pulse_tensor_info *table, size_t count,
                               const pulse_buffer *parts, size_t nparts) {
  pulse_pub_block **blocks = calloc(nparts ? nparts : 1, sizeof *blocks);
  size_t *counts = calloc(nparts ? nparts : 1, sizeof *counts);
  pulse_status st = blocks && counts ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "shard: check");
  for (size_t i = 0; i < nparts && st == PULSE_OK; i++) {
    const uint8_t *p = parts[i].data;
    size_t size = parts[i].size, at = SHARD_PART_HEADER;
    uint64_t nb = pulse_load_le64(p + 48); /* parts already read by view_parts */
    if ((blocks[i] = calloc(nb ? nb : 1, sizeof **blocks)) == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: check");
      break;
    }
    counts[i] = (size_t)nb;
    for (uint64_t b = 0; b < nb && at + SHARD_BLOCK_HEADER <= size; b++) {
      const uint8_t *q = p + at;
      uint64_t t = pulse_load_le64(q), k = pulse_load_le64(q + 48);
      pulse_pub_block *x = &blocks[i][b];
      x->name = t < count ? table[t].name : NULL;
      x->kind = pulse_load_le64(q + 56) == PULSE_PUB_BLOCK_FLAT ? PULSE_PUB_BLOCK_FLAT
                                                                : PULSE_PUB_BLOCK_RECT;
      for (int d = 0; d < PULSE_MAX_DIMS; d++) {
        x->start[d] = pulse_load_le64(q + 64 + 8 * d);
        x->extent[d] = pulse_load_le64(q + 128 + 8 * d);
      }
      at += SHARD_BLOCK_HEADER + 12 * (size_t)k;
    }
  }
  if (st == PULSE_OK)
    st = pulse_pub_blocks_check(table, count, (const pulse_pub_block *const *)blocks, counts,
                                nparts);
  for (size_t i = 0; blocks && i < nparts; i++)
    free(blocks[i]);
  free(blocks), free(counts);
  return st;
}
