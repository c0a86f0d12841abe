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

void shard_count_block(const shard_geom *g, const uint16_t *snap, const pulse_changes *c,
                        const uint64_t *chunks, uint64_t m, uint32_t log2,
                        uint32_t *contrib, uint32_t *hist) {
  uint32_t cnt[PULSE_CLASS_COUNT];
  memset(cnt, 0, sizeof cnt);
  uint64_t cur = UINT64_MAX, ci = 0;
#define EMIT_BEFORE(limit)                                                           \
  for (; ci < c->count && c->pos[ci] < (limit); ci++)                                \
    if ((c->pos[ci] >> log2) == cur)                                                 \
      contrib[ci] += cnt[pulse_bf16_class(c->old_bits[ci])];
#define CLOSE_CHUNK()                                                                \
  do {                                                                               \
    if (cur != UINT64_MAX) {                                                         \
      uint64_t s_ = chunk_slot(chunks, m, cur);                                      \
      if (s_ < m)                                                                    \
        for (unsigned q_ = 0; q_ < PULSE_CLASS_COUNT; q_++)                          \
          hist[s_ * PULSE_CLASS_COUNT + q_] += cnt[q_];                              \
    }                                                                                \
  } while (0)
  /* Runs are in position order: only those that reach the chunks are walked
   * (a chunk at a time is one chunk's runs, not the block's). */
  uint64_t lo = m > 0 ? chunks[0] << log2 : 0, r0 = 0, rn = g->runs;
  uint64_t hi = m > 0 ? (chunks[m - 1] + 1) << log2 : 0;
  while (r0 < rn) {
    uint64_t mid = r0 + (rn - r0) / 2;
    if (shard_run_pos(g, mid) + g->run_len <= lo)
      r0 = mid + 1;
    else
      rn = mid;
  }
  for (uint64_t r = r0; r < g->runs; r++) {
    uint64_t pos = shard_run_pos(g, r), end = pos + g->run_len;
    if (pos >= hi)
      break;
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

/* One part block's changes of a tensor, read from where `j` stands. */
typedef struct {
  uint64_t pos;
  uint16_t old_bits, new_bits;
} one_change;


typedef struct {
  const shard_part_block *b;
  uint64_t j;
} part_cursor;

static int by_change_pos(const void *a, const void *b) {
  uint64_t x = ((const one_change *)a)->pos, y = ((const one_change *)b)->pos;
  return x < y ? -1 : x > y;
}

/* Cursors (*cur, *ncur of them; free them) on the blocks of tensor t in
 * the parts that carry changes, each checked to list its changes in
 * position order. *cur NULL: out of memory (the status says so); else the
 * status is the order check's. */
static pulse_status open_cursors(const shard_parts_view *v, size_t t,
                                 const char *what, part_cursor **cur,
                                 size_t *ncur) {
  size_t n = 0;
  for (size_t b = 0; b < v->nblocks; b++)
    n += v->blocks[b].tensor == t && v->blocks[b].k > 0;
  part_cursor *c = calloc(n ? n : 1, sizeof *c);
  *cur = c, *ncur = 0;
  if (c == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: %s", what);
  n = 0;
  for (size_t b = 0; b < v->nblocks; b++)
    if (v->blocks[b].tensor == t && v->blocks[b].k > 0)
      c[n++] = (part_cursor){&v->blocks[b], 0};
  *ncur = n;
  for (size_t i = 0; i < n; i++)
    for (uint64_t j = 1; j < c[i].b->k; j++)
      if (pulse_load_le64(c[i].b->pos + 8 * j) <= pulse_load_le64(c[i].b->pos + 8 * (j - 1)))
        return pulse_fail(PULSE_ERR_CORRUPT, "shard: a part's changes are not in position order");
  return PULSE_OK;
}

/* The changes of chunk k over the cursors (every cursor stands at its first
 * change of chunk k or after), in position order, into c (emptied first);
 * the cursors move past them. */
static pulse_status chunk_gather(part_cursor *cur, size_t ncur, uint64_t k, uint32_t log2,
                                 pulse_changes *c, one_change **tmp, uint64_t *tmp_cap) {
  c->count = 0;
  size_t holders = 0;
  for (size_t i = 0; i < ncur; i++) {
    const shard_part_block *b = cur[i].b;
    uint64_t before = c->count;
    for (; cur[i].j < b->k; cur[i].j++) {
      uint64_t p = pulse_load_le64(b->pos + 8 * cur[i].j);
      if (p >> log2 != k)
        break;
      PULSE_TRY(pulse_changes_push(c, p, pulse_load_le16(b->old_bits + 2 * cur[i].j),
                                   pulse_load_le16(b->new_bits + 2 * cur[i].j)));
    }
    holders += c->count > before;
  }
  if (holders < 2)
    return PULSE_OK;
  if (*tmp_cap < c->count) {
    one_change *more = realloc(*tmp, (size_t)c->count * sizeof *more);
    if (more == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "shard: a chunk's changes");
    *tmp = more, *tmp_cap = c->count;
  }
  one_change *v = *tmp;
  for (uint64_t j = 0; j < c->count; j++)
    v[j] = (one_change){c->pos[j], c->old_bits[j], c->new_bits[j]};
  qsort(v, (size_t)c->count, sizeof *v, by_change_pos);
  for (uint64_t j = 0; j < c->count; j++)
    c->pos[j] = v[j].pos, c->old_bits[j] = v[j].old_bits, c->new_bits[j] = v[j].new_bits;
  return PULSE_OK;
}

/* Tensor t's section of this rank's counts, appended to out: the parts'
 * changes are walked one changed chunk at a time (those the rank's blocks
 * meet, `mark`), so that a step holds one chunk's changes and ranks, not
 * the tensor's; the class counts of each chunk wait in `hists` (1 KiB a
 * changed chunk) until the entries are out. */
static pulse_status count_tensor(const pulse_pub_shard *s, const shard_parts_view *v, size_t t,
                                 const uint8_t *mark, pulse_bytebuf *out) {
  uint32_t log2 = s->chunk_log2;
  size_t ncur = 0;
  part_cursor *cur = NULL;
  pulse_status st = open_cursors(v, t, "counts", &cur, &ncur);
  if (cur == NULL)
    return st;
  size_t sec_at = out->size;
  uint8_t sec[SHARD_COUNT_SECTION];
  memset(sec, 0, sizeof sec);
  pulse_store_le64(sec, t);
  pulse_bytebuf_put(out, sec, sizeof sec);
  pulse_bytebuf hists = PULSE_BYTEBUF_INIT;
  pulse_changes c = PULSE_CHANGES_INIT;
  one_change *tmp = NULL;
  uint64_t tmp_cap = 0, nc = 0, m = 0, prev = 0;
  uint32_t *contrib = NULL, hist[PULSE_CLASS_COUNT];
  uint64_t contrib_cap = 0;
  int first = 1;
  while (st == PULSE_OK) {
    /* The next changed chunk the rank's blocks meet. */
    uint64_t k = UINT64_MAX;
    for (size_t i = 0; i < ncur; i++) {
      const shard_part_block *b = cur[i].b;
      for (; cur[i].j < b->k; cur[i].j++) {
        uint64_t ck = pulse_load_le64(b->pos + 8 * cur[i].j) >> log2;
        if (mark[ck >> 3] >> (ck & 7) & 1) {
          k = ck < k ? ck : k;
          break;
        }
      }
    }
    if (k == UINT64_MAX)
      break;
    if ((st = chunk_gather(cur, ncur, k, log2, &c, &tmp, &tmp_cap)) != PULSE_OK)
      break;
    if (contrib_cap < c.count) {
      uint32_t *more = realloc(contrib, (size_t)c.count * sizeof *more);
      if (more == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
        break;
      }
      contrib = more, contrib_cap = c.count;
    }
    memset(contrib, 0, (size_t)c.count * sizeof *contrib);
    memset(hist, 0, sizeof hist);
    for (size_t b = 0; b < s->nblocks; b++)
      if (s->geom[b].tensor == t)
        shard_count_block(&s->geom[b], s->snap[b], &c, &k, 1, log2, contrib, hist);
    for (uint64_t j = 0; j < c.count; j++)
      if (contrib[j] > 0) {
        pulse_bytebuf_varint(out, first ? c.pos[j] : c.pos[j] - prev - 1);
        pulse_bytebuf_varint(out, contrib[j]);
        prev = c.pos[j], first = 0, nc++;
      }
    uint8_t h[8 + 4 * PULSE_CLASS_COUNT];
    pulse_store_le64(h, k);
    for (unsigned q = 0; q < PULSE_CLASS_COUNT; q++)
      pulse_store_le32(h + 8 + 4 * q, hist[q]);
    pulse_bytebuf_put(&hists, h, sizeof h);
    m++;
  }
  if (st == PULSE_OK && !out->failed) {
    pulse_store_le64(out->data + sec_at + 8, nc);
    pulse_store_le64(out->data + sec_at + 16, m);
    pulse_store_le64(out->data + sec_at + 24, out->size - sec_at - SHARD_COUNT_SECTION);
  }
  if (st == PULSE_OK && hists.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  if (st == PULSE_OK && hists.size > 0)
    pulse_bytebuf_put(out, hists.data, hists.size);
  pulse_bytebuf_free(&hists);
  pulse_changes_free(&c);
  free(tmp), free(contrib), free(cur);
  return st;
}

pulse_status pulse_pub_shard_count(const pulse_pub_shard *s, const pulse_buffer *parts,
                                   size_t nparts, pulse_buffer *counts) {
  if (s == NULL || counts == NULL || (parts == NULL && nparts > 0))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  counts->data = NULL, counts->size = 0;
  if (!s->have_snapshot)
    return pulse_fail(PULSE_ERR_ARG, "shard: count before the first detect");
  shard_parts_view v;
  PULSE_TRY(shard_view_parts(parts, nparts, s->count, s->table_id, s->chunk_log2, &v));
  uint32_t log2 = s->chunk_log2;
  pulse_bytebuf out = PULSE_BYTEBUF_INIT;
  uint8_t head[SHARD_COUNT_HEADER];
  memset(head, 0, sizeof head);
  pulse_bytebuf_put(&out, head, sizeof head);
  uint64_t nsections = 0;
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
    uint8_t *mark = shard_chunk_marks(s->geom, s->nblocks, t, numel, log2);
    st = mark == NULL ? pulse_fail(PULSE_ERR_NOMEM, "shard: counts")
                      : count_tensor(s, &v, t, mark, &out);
    nsections += st == PULSE_OK;
    free(mark);
  }
  /* The chunks this rank's blocks cover entirely: coded here, sent as
   * streams (their changes are in no part). */
  size_t items_at = out.size;
  uint64_t items = 0;
  if (st == PULSE_OK) {
    pulse_bytebuf_u64(&out, 0);
    st = shard_code_whole(s, &out, &items);
  }
  if (st == PULSE_OK && out.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  if (st != PULSE_OK) {
    free(out.data);
    shard_view_free(&v);
    return st;
  }
  pulse_store_le64(out.data + items_at, items);
  memcpy(out.data, SHARD_COUNT_MAGIC, 8);
  pulse_store_le32(out.data + 8, SHARD_WIRE_VERSION);
  pulse_store_le32(out.data + 12, log2);
  memcpy(out.data + 16, s->table_id, 32);
  pulse_store_le64(out.data + 48, v.step.a);
  pulse_store_le64(out.data + 56, v.step.b);
  pulse_store_le64(out.data + 64, nsections);
  pulse_store_le32(out.data + 72, (uint32_t)s->pos_model);
  pulse_store_le32(out.data + 76, s->format_version);
  counts->data = out.data;
  counts->size = out.size;
  shard_view_free(&v);
  return PULSE_OK;
}

typedef struct {
  shard_coded *v;
  size_t n, cap;
} coded_list;

static int coded_push(coded_list *l, shard_coded c) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 64;
    shard_coded *more = realloc(l->v, cap * sizeof *more);
    if (more == NULL)
      return 0;
    l->v = more, l->cap = cap;
  }
  l->v[l->n++] = c;
  return 1;
}

/* The coded chunks at the end of one rank's counts (counts index i), into
 * the list (borrowing their bytes). */
static pulse_status read_coded(pulse_reader *r, size_t i, const pulse_tensor_info *table,
                               size_t n, uint32_t log2, coded_list *out) {
  uint64_t items = pulse_reader_le(r, 8);
  if (!r->ok)
    return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu end before their coded chunks", i);
  for (uint64_t j = 0; j < items; j++) {
    uint64_t t = pulse_reader_le(r, 8), k = pulse_reader_le(r, 8);
    uint64_t nc = pulse_reader_le(r, 8), nb = pulse_reader_le(r, 8);
    const uint8_t *bytes = r->ok && nb <= r->left ? pulse_reader_span(r, (size_t)nb) : NULL;
    uint64_t numel = 0;
    if (t < n)
      (void)pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    uint64_t size = numel == 0 || k > (numel - 1) >> log2 ? 0
                    : numel - (k << log2) < ((uint64_t)1 << log2) ? numel - (k << log2)
                                                                 : (uint64_t)1 << log2;
    if (bytes == NULL || t >= n || size == 0 || nc == 0 || nc > size || nb == 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: coded chunk %llu is inconsistent",
                        i, (unsigned long long)j);
    if (!coded_push(out, (shard_coded){t, k, nc, bytes, (size_t)nb}))
      return pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
  }
  return PULSE_OK;
}

/* One rank's section of one tensor in its counts, walked chunk by chunk
 * while the tensor is coded: `e` reads its entries (the next one's
 * position and contribution in pos, contrib while ej < nc), `h` its class
 * counts (hj of nh read). */
typedef struct {
  size_t counts; /* index of the counts it is in */
  uint64_t tensor, nc, nh, ej, hj, pos, contrib;
  pulse_reader e;
  const uint8_t *h;
} count_section;

typedef struct {
  count_section *v;
  size_t n, cap;
} section_list;

#define SHARD_HIST_ENTRY (8u + 4u * PULSE_CLASS_COUNT)

/* Reads section s's entry ej into s->pos, s->contrib (entries were checked
 * by check_counts). */
static void section_next(count_section *s) {
  uint64_t gap = pulse_reader_varint(&s->e), contrib = pulse_reader_varint(&s->e);
  s->pos = s->ej == 0 ? gap : s->pos + 1 + gap;
  s->contrib = contrib;
}

/* Checks one rank's counts (counts index i: header, sections, entries,
 * class counts, coded chunks), records its sections into the list and its
 * coded chunks (borrowing their bytes); nothing is summed yet. */
static pulse_status check_counts(const pulse_buffer *buf, size_t i,
                                 const pulse_tensor_info *table, size_t n, const uint8_t id[32],
                                 const pulse_encode_opts *opts, unsigned version,
                                 const shard_parts_view *v, section_list *secs,
                                 coded_list *coded) {
  uint32_t log2 = opts->chunk_log2;
  const uint8_t *p = buf->data;
  size_t left = buf->size;
  const uint64_t hentry = SHARD_HIST_ENTRY;
  if (p == NULL || left < SHARD_COUNT_HEADER || memcmp(p, SHARD_COUNT_MAGIC, 8) != 0 ||
      pulse_load_le32(p + 8) != SHARD_WIRE_VERSION || pulse_load_le32(p + 12) != log2 ||
      memcmp(p + 16, id, 32) != 0 || pulse_load_le64(p + 48) != v->step.a ||
      pulse_load_le64(p + 56) != v->step.b)
    return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu are not of these parts", i);
  if (pulse_load_le32(p + 72) != (uint32_t)opts->pos_model || pulse_load_le32(p + 76) != version)
    return pulse_fail(PULSE_ERR_ARG, "shard: counts %zu were coded with position model %u and "
                      "format version %u, the encoder's are %u and %u (every rank's shard needs "
                      "the committer's)", i, pulse_load_le32(p + 72), pulse_load_le32(p + 76),
                      (unsigned)opts->pos_model, version);
  uint64_t sections = pulse_load_le64(p + 64);
  pulse_reader r = pulse_reader_make(p + SHARD_COUNT_HEADER, left - SHARD_COUNT_HEADER);
  for (uint64_t q = 0; q < sections; q++) {
    uint64_t t = pulse_reader_le(&r, 8), nc = pulse_reader_le(&r, 8);
    uint64_t nh = pulse_reader_le(&r, 8), eb = pulse_reader_le(&r, 8);
    const uint8_t *ep = r.ok && eb <= r.left ? pulse_reader_span(&r, (size_t)eb) : NULL;
    uint64_t numel = 0;
    if (t < n)
      (void)pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    if (!r.ok || ep == NULL || t >= n || numel == 0 || nc > eb / 2 || nh > r.left / hentry)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: section %llu is inconsistent",
                        i, (unsigned long long)q);
    pulse_reader e = pulse_reader_make(ep, (size_t)eb);
    uint64_t pos = 0;
    for (uint64_t j = 0; j < nc; j++) {
      uint64_t gap = pulse_reader_varint(&e), contrib = pulse_reader_varint(&e);
      uint64_t room = j == 0 ? numel : numel - pos - 1; /* positions after the last */
      if (!e.ok || gap >= room || contrib == 0 || contrib > UINT32_MAX)
        return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: section %llu: entry %llu is "
                          "inconsistent", i, (unsigned long long)q, (unsigned long long)j);
      pos = j == 0 ? gap : pos + 1 + gap;
    }
    if (e.left != 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: section %llu has %zu bytes too "
                        "many", i, (unsigned long long)q, e.left);
    const uint8_t *h = pulse_reader_span(&r, (size_t)(nh * hentry));
    for (uint64_t j = 0; j < nh; j++) {
      uint64_t k = pulse_load_le64(h + j * hentry);
      /* in chunk order, each once: they are summed as the chunks are coded */
      if (k > (numel - 1) >> log2 || (j > 0 && k <= pulse_load_le64(h + (j - 1) * hentry)))
        return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name a chunk out of range or "
                          "out of order", i);
    }
    if (secs->n == secs->cap) {
      size_t cap = secs->cap ? 2 * secs->cap : 16;
      count_section *more = realloc(secs->v, cap * sizeof *more);
      if (more == NULL)
        return pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
      secs->v = more, secs->cap = cap;
    }
    count_section *sec = &secs->v[secs->n++];
    *sec = (count_section){i, t, nc, nh, 0, 0, 0, 0, pulse_reader_make(ep, (size_t)eb), h};
    if (nc > 0)
      section_next(sec);
  }
  PULSE_TRY(read_coded(&r, i, table, n, log2, coded));
  left = r.left;
  if (left != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu have %zu bytes too many", i, left);
  return PULSE_OK;
}

static int by_chunk(const void *a, const void *b) {
  const shard_coded *x = a, *y = b;
  if (x->tensor != y->tensor)
    return x->tensor < y->tensor ? -1 : 1;
  return x->chunk < y->chunk ? -1 : x->chunk > y->chunk;
}

typedef struct {
  pulse_bytebuf *v;
  size_t n, cap;
} stream_list;

/* The index of the change at `pos` among c's (sorted), or c->count. */
static uint64_t change_at(const pulse_changes *c, uint64_t pos) {
  uint64_t i = shard_first_change(c, pos);
  return i < c->count && c->pos[i] == pos ? i : c->count;
}

/* Codes the chunks of tensor t that parts carry changes of (several ranks
 * meet them), one chunk at a time: its changes merged from the parts, the
 * ranks' contributions and class counts summed from the sections of t
 * (walked in position order beside it), the stream into streams (owned)
 * and the list. Holds one chunk's changes, not the tensor's. */
static pulse_status code_shared(const pulse_tensor_info *info, size_t t, uint64_t numel,
                                const pulse_encode_opts *opts, unsigned version,
                                const shard_parts_view *v, section_list *secs,
                                stream_list *streams, coded_list *out) {
  uint32_t log2 = opts->chunk_log2;
  size_t ncur = 0;
  part_cursor *cur = NULL;
  pulse_status st = open_cursors(v, t, "encode", &cur, &ncur);
  if (cur == NULL)
    return st;
  pulse_changes c = PULSE_CHANGES_INIT;
  one_change *tmp = NULL;
  uint64_t tmp_cap = 0, rank_cap = 0;
  uint32_t *rank = NULL, hist[PULSE_CLASS_COUNT];
  while (st == PULSE_OK) {
    uint64_t k = UINT64_MAX;
    for (size_t i = 0; i < ncur; i++)
      if (cur[i].j < cur[i].b->k) {
        uint64_t ck = pulse_load_le64(cur[i].b->pos + 8 * cur[i].j) >> log2;
        k = ck < k ? ck : k;
      }
    if (k == UINT64_MAX)
      break;
    if ((st = chunk_gather(cur, ncur, k, log2, &c, &tmp, &tmp_cap)) != PULSE_OK)
      break;
    for (uint64_t j = 1; j < c.count && st == PULSE_OK; j++)
      if (c.pos[j] == c.pos[j - 1])
        st = pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': two parts change element %llu "
                        "(blocks overlap)", info->name, (unsigned long long)c.pos[j]);
    if (st == PULSE_OK && rank_cap < c.count) {
      uint32_t *more = realloc(rank, (size_t)c.count * sizeof *more);
      if (more == NULL)
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
      else
        rank = more, rank_cap = c.count;
    }
    if (st != PULSE_OK)
      break;
    memset(rank, 0, (size_t)c.count * sizeof *rank);
    memset(hist, 0, sizeof hist);
    /* Every rank's entries and class counts of this chunk. */
    for (size_t q = 0; q < secs->n && st == PULSE_OK; q++) {
      count_section *x = &secs->v[q];
      if (x->tensor != t)
        continue;
      while (x->ej < x->nc && x->pos >> log2 <= k) {
        uint64_t at = x->pos >> log2 == k ? change_at(&c, x->pos) : c.count;
        if (at == c.count) {
          st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name element %llu of '%s', "
                          "which no part changes", x->counts, (unsigned long long)x->pos,
                          info->name);
          break;
        }
        rank[at] += (uint32_t)x->contrib;
        if (++x->ej < x->nc)
          section_next(x);
      }
      for (; x->hj < x->nh; x->hj++) {
        const uint8_t *h = x->h + x->hj * SHARD_HIST_ENTRY;
        uint64_t hk = pulse_load_le64(h);
        if (hk > k)
          break;
        for (unsigned cl = 0; hk == k && cl < PULSE_CLASS_COUNT; cl++)
          hist[cl] += pulse_load_le32(h + 8 + 4 * cl);
      }
    }
    if (st != PULSE_OK)
      break;
    if (streams->n == streams->cap) {
      size_t cap = streams->cap ? 2 * streams->cap : 64;
      pulse_bytebuf *more = realloc(streams->v, cap * sizeof *more);
      if (more == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
        break;
      }
      streams->v = more, streams->cap = cap;
    }
    pulse_bytebuf *b = &streams->v[streams->n++];
    *b = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    uint64_t first = k << log2, left = numel - first;
    uint32_t size = (uint32_t)(left < ((uint64_t)1 << log2) ? left : (uint64_t)1 << log2);
    st = shard_code_chunk(version, opts->pos_model, hist, size, first, &c, 0,
                          (uint32_t)c.count, rank, b);
    if (st != PULSE_OK)
      st = pulse_fail(st, "shard: tensor '%s': %s", info->name, pulse_error_detail());
    else if (b->failed || !coded_push(out, (shard_coded){t, k, c.count, b->data, b->size}))
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
  }
  /* Entries past the tensor's last changed chunk name what no part changes. */
  for (size_t q = 0; q < secs->n && st == PULSE_OK; q++)
    if (secs->v[q].tensor == t && secs->v[q].ej < secs->v[q].nc)
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name element %llu of '%s', which "
                      "no part changes", secs->v[q].counts, (unsigned long long)secs->v[q].pos,
                      info->name);
  pulse_changes_free(&c);
  free(tmp), free(rank), free(cur);
  return st;
}

static pulse_status shard_encode(const pulse_tensor_info *table, size_t tensor_count,
                                 const pulse_encode_opts *opts, const pulse_buffer *parts,
                                 size_t nparts, const pulse_buffer *counts, size_t ncounts,
                                 pulse_state_digest *base_digest, const char *path,
                                 pulse_buffer *patch) {
  if (table == NULL || tensor_count == 0 || opts == NULL || patch == NULL ||
      (parts == NULL && nparts) || (counts == NULL && ncounts))
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  patch->data = NULL, patch->size = 0;
  PULSE_TRY(PULSE_OPTS_CHECK("shard encode", opts, PULSE_ENCODE_OPTS_VERSION));
  unsigned version = opts->format_version ? opts->format_version : PULSE_PATCH_VERSION;
  if (opts->chunk_log2 < 10 || opts->chunk_log2 > 30 ||
      (opts->pos_model != PULSE_POS_PLAIN && opts->pos_model != PULSE_POS_CLASS) ||
      version < PULSE_PATCH_VERSION_MIN || version > PULSE_PATCH_VERSION)
    return pulse_fail(PULSE_ERR_ARG, "shard: chunk_log2 in 10..30, a position model and a "
                                     "format version this library writes");
  uint8_t id[32];
  PULSE_TRY(shard_table_id(table, tensor_count, id));
  shard_parts_view v;
  PULSE_TRY(shard_view_parts(parts, nparts, tensor_count, id, opts->chunk_log2, &v));
  size_t n = tensor_count;
  pulse_tensor_digest *bd = calloc(n, sizeof *bd), *td = calloc(n, sizeof *td);
  uint64_t *elems = calloc(n, sizeof *elems);
  coded_list coded = {NULL, 0, 0};
  section_list secs = {NULL, 0, 0};
  stream_list streams = {NULL, 0, 0};
  pulse_status st = bd && td && elems ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
  for (size_t b = 0; st == PULSE_OK && b < v.nblocks; b++) {
    const shard_part_block *x = &v.blocks[b];
    bd[x->tensor].a += x->base.a, bd[x->tensor].b += x->base.b;
    td[x->tensor].a += x->target.a, td[x->tensor].b += x->target.b;
    elems[x->tensor] += x->elems;
  }
  for (size_t t = 0; st == PULSE_OK && t < n; t++) {
    uint64_t numel = 0;
    if ((st = pulse_shape_numel(table[t].shape, table[t].ndim, &numel)) != PULSE_OK)
      break;
    if (elems[t] != numel)
      st = pulse_fail(PULSE_ERR_ARG, "shard: tensor '%s': the parts' blocks hold %llu of %llu "
                      "elements", table[t].name, (unsigned long long)elems[t],
                      (unsigned long long)numel);
  }
  /* Every rank's counts checked; the streams of the chunks one rank covers
   * come as they are, the shared chunks are summed as they are coded. */
  for (size_t i = 0; st == PULSE_OK && i < ncounts; i++)
    st = check_counts(&counts[i], i, table, n, id, opts, version, &v, &secs, &coded);
  for (size_t t = 0; st == PULSE_OK && t < n; t++) {
    uint64_t numel = 0;
    (void)pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    st = code_shared(&table[t], t, numel, opts, version, &v, &secs, &streams, &coded);
  }
  if (st == PULSE_OK)
    qsort(coded.v, coded.n, sizeof *coded.v, by_chunk);
  for (size_t j = 1; st == PULSE_OK && j < coded.n; j++)
    if (by_chunk(&coded.v[j - 1], &coded.v[j]) == 0)
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: chunk %llu of '%s' is coded twice (two ranks "
                      "claim it whole, or one does and a part changes it)",
                      (unsigned long long)coded.v[j].chunk, table[coded.v[j].tensor].name);
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
    st = shard_patch_write(opts, version, table, n, bd, td, coded.v, coded.n, path, patch);
  for (size_t i = 0; i < streams.n; i++)
    pulse_bytebuf_free(&streams.v[i]);
  free(streams.v), free(coded.v), free(secs.v);
  free(bd), free(td), free(elems);
  shard_view_free(&v);
  return st;
}

pulse_status pulse_pub_shard_encode(const pulse_tensor_info *table, size_t tensor_count,
                                    const pulse_encode_opts *opts, const pulse_buffer *parts,
                                    size_t nparts, const pulse_buffer *counts, size_t ncounts,
                                    pulse_state_digest *base_digest, pulse_buffer *patch) {
  return shard_encode(table, tensor_count, opts, parts, nparts, counts, ncounts, base_digest,
                      NULL, patch);
}

pulse_status pulse_pub_shard_encode_file(const pulse_tensor_info *table, size_t tensor_count,
                                         const pulse_encode_opts *opts,
                                         const pulse_buffer *parts, size_t nparts,
                                         const pulse_buffer *counts, size_t ncounts,
                                         const char *path, uint64_t *size) {
  if (path == NULL || size == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  pulse_buffer patch = {0};
  pulse_status st = shard_encode(table, tensor_count, opts, parts, nparts, counts, ncounts, NULL,
                                 path, &patch);
  *size = st == PULSE_OK ? patch.size : 0;
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
