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

void shard_count_block(const shard_geom *g, const uint16_t *snap, const shard_chunk *c,
                        const uint64_t *chunks, uint64_t m, uint32_t log2,
                        uint32_t *contrib, uint32_t *hist) {
  uint32_t cnt[PULSE_CLASS_COUNT];
  memset(cnt, 0, sizeof cnt);
  uint64_t cur = UINT64_MAX, ci = 0;
#define EMIT_BEFORE(limit)                                                           \
  for (; ci < c->count && c->pos[ci] < (limit); ci++)                                \
    if ((c->pos[ci] >> log2) == cur)                                                 \
      contrib[ci] += cnt[c->cls[ci]];
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

/* Cursors (*cur, *ncur of them; free them) on the blocks of tensor t in
 * the parts that carry changes. */
static pulse_status open_cursors(const shard_parts_view *v, size_t t, const char *what,
                                 shard_part_cursor **cur, size_t *ncur) {
  size_t n = 0;
  for (size_t b = 0; b < v->nblocks; b++)
    n += v->blocks[b].tensor == t && v->blocks[b].k > 0;
  shard_part_cursor *c = calloc(n ? n : 1, sizeof *c);
  *cur = c, *ncur = 0;
  if (c == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: %s", what);
  for (size_t b = 0; b < v->nblocks; b++)
    if (v->blocks[b].tensor == t && v->blocks[b].k > 0)
      shard_cursor_open(&c[(*ncur)++], &v->blocks[b]);
  return PULSE_OK;
}

/* The changes of chunk k over the cursors (every cursor stands at its first
 * change of chunk k or after), merged in position order into c (emptied
 * first); the cursors move past them. */
static pulse_status chunk_gather(shard_part_cursor *cur, size_t ncur, uint64_t k, uint32_t log2,
                                 shard_chunk *c) {
  c->count = 0;
  for (;;) {
    size_t best = ncur;
    for (size_t i = 0; i < ncur; i++)
      if (cur[i].j < cur[i].b->k && cur[i].pos >> log2 == k &&
          (best == ncur || cur[i].pos < cur[best].pos))
        best = i;
    if (best == ncur)
      return PULSE_OK;
    PULSE_TRY(shard_chunk_push(c, cur[best].pos, cur[best].cls, cur[best].delta));
    shard_cursor_next(&cur[best]);
  }
}

/* Tensor t's section of this rank's counts, appended to out: the parts'
 * changes are walked one changed chunk at a time (those the rank's blocks
 * meet, `mark`), so that a step holds one chunk's changes and ranks, not
 * the tensor's; the class counts of each chunk wait in `hists` (about 300
 * bytes a changed chunk) until the entries are out. */
static pulse_status count_tensor(const pulse_pub_shard *s, const shard_parts_view *v, size_t t,
                                 const uint8_t *mark, pulse_bytebuf *out) {
  uint32_t log2 = s->chunk_log2;
  size_t ncur = 0;
  shard_part_cursor *cur = NULL;
  pulse_status st = open_cursors(v, t, "counts", &cur, &ncur);
  if (st != PULSE_OK)
    return st;
  size_t sec_at = out->size;
  uint8_t sec[SHARD_COUNT_SECTION];
  memset(sec, 0, sizeof sec);
  pulse_store_le64(sec, t);
  pulse_bytebuf_put(out, sec, sizeof sec);
  pulse_bytebuf hists = PULSE_BYTEBUF_INIT;
  shard_chunk c = SHARD_CHUNK_INIT;
  uint64_t m = 0, prev = 0, contrib_cap = 0;
  uint32_t *contrib = NULL, hist[PULSE_CLASS_COUNT], last[PULSE_CLASS_COUNT];
  while (st == PULSE_OK) {
    /* The next changed chunk the rank's blocks meet. */
    uint64_t k = UINT64_MAX;
    for (size_t i = 0; i < ncur; i++) {
      for (; cur[i].j < cur[i].b->k; shard_cursor_next(&cur[i])) {
        uint64_t ck = cur[i].pos >> log2;
        if (mark[ck >> 3] >> (ck & 7) & 1) {
          k = ck < k ? ck : k;
          break;
        }
      }
    }
    if (k == UINT64_MAX)
      break;
    if ((st = chunk_gather(cur, ncur, k, log2, &c)) != PULSE_OK)
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
    memset(last, 0, sizeof last);
    for (size_t b = 0; b < s->nblocks; b++)
      if (s->geom[b].tensor == t)
        shard_count_block(&s->geom[b], s->snap[b], &c, &k, 1, log2, contrib, hist);
    for (uint64_t j = 0; j < c.count; j++) {
      pulse_bytebuf_varint(out, contrib[j] - last[c.cls[j]]);
      last[c.cls[j]] = contrib[j];
    }
    pulse_bytebuf_varint(&hists, m == 0 ? k : k - prev - 1);
    for (unsigned q = 0; q < PULSE_CLASS_COUNT; q++)
      pulse_bytebuf_varint(&hists, hist[q]);
    prev = k, m++;
  }
  if (st == PULSE_OK && (out->failed || hists.failed))
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: counts");
  if (st == PULSE_OK) {
    pulse_store_le64(out->data + sec_at + 8, m);
    pulse_store_le64(out->data + sec_at + 16, out->size - sec_at - SHARD_COUNT_SECTION);
    pulse_store_le64(out->data + sec_at + 24, hists.size);
    pulse_bytebuf_put(out, hists.data, hists.size);
  }
  pulse_bytebuf_free(&hists);
  shard_chunk_free(&c);
  free(contrib), free(cur);
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
  PULSE_TRY(shard_view_parts(parts, nparts, s->info, s->count, s->table_id, s->chunk_log2, &v));
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
 * while the tensor is coded: `e` reads its entries, `h` its class counts
 * (hj of nh chunks read; `chunk` is the next one's while hj < nh). */
typedef struct {
  size_t counts; /* index of the counts it is in */
  uint64_t tensor, nh, hj, chunk;
  pulse_reader e, h;
} count_section;

typedef struct {
  count_section *v;
  size_t n, cap;
} section_list;

/* The chunk size of chunk k of a tensor of numel elements (0: none). */
static uint64_t chunk_size(uint64_t numel, uint64_t k, uint32_t log2) {
  if (numel == 0 || k > (numel - 1) >> log2)
    return 0;
  uint64_t left = numel - (k << log2);
  return left < ((uint64_t)1 << log2) ? left : (uint64_t)1 << log2;
}

/* Reads the next chunk index of section x's class counts into x->chunk
 * (checked by check_counts). */
static void section_chunk(count_section *x) {
  if (x->hj < x->nh) {
    uint64_t gap = pulse_reader_varint(&x->h);
    x->chunk = x->hj == 0 ? gap : x->chunk + 1 + gap;
  }
}

/* Checks one rank's counts (counts index i: header, sections, class
 * counts, coded chunks), records its sections into the list and its coded
 * chunks (borrowing their bytes); nothing is summed yet. The entries are
 * read, and checked, as the chunks are coded (how many a chunk has is the
 * parts'). */
static pulse_status check_counts(const pulse_buffer *buf, size_t i,
                                 const pulse_tensor_info *table, size_t n, const uint8_t id[32],
                                 const pulse_encode_opts *opts, unsigned version,
                                 const shard_parts_view *v, section_list *secs,
                                 coded_list *coded) {
  uint32_t log2 = opts->chunk_log2;
  const uint8_t *p = buf->data;
  size_t left = buf->size;
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
    uint64_t t = pulse_reader_le(&r, 8), nh = pulse_reader_le(&r, 8);
    uint64_t eb = pulse_reader_le(&r, 8), hb = pulse_reader_le(&r, 8);
    const uint8_t *ep = r.ok && eb <= r.left ? pulse_reader_span(&r, (size_t)eb) : NULL;
    const uint8_t *hp = r.ok && hb <= r.left ? pulse_reader_span(&r, (size_t)hb) : NULL;
    uint64_t numel = 0;
    if (t < n)
      (void)pulse_shape_numel(table[t].shape, table[t].ndim, &numel);
    if (!r.ok || ep == NULL || hp == NULL || t >= n || numel == 0 ||
        nh > hb / (1 + PULSE_CLASS_COUNT))
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: section %llu is inconsistent",
                        i, (unsigned long long)q);
    pulse_reader h = pulse_reader_make(hp, (size_t)hb);
    uint64_t k = 0;
    for (uint64_t j = 0; j < nh; j++) {
      uint64_t gap = pulse_reader_varint(&h);
      uint64_t room = j == 0 ? ((numel - 1) >> log2) + 1 : (numel - 1) >> log2 > k
                                                               ? ((numel - 1) >> log2) - k : 0;
      /* in chunk order, each once: they are summed as the chunks are coded */
      if (!h.ok || gap >= room)
        return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name a chunk out of range or "
                          "out of order", i);
      k = j == 0 ? gap : k + 1 + gap;
      uint64_t size = chunk_size(numel, k, log2);
      for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
        if (pulse_reader_varint(&h) > size || !h.ok)
          return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: class counts of chunk %llu "
                            "of '%s' are inconsistent", i, (unsigned long long)k, table[t].name);
    }
    if (h.left != 0)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: section %llu has %zu bytes too "
                        "many", i, (unsigned long long)q, h.left);
    if (secs->n == secs->cap) {
      size_t cap = secs->cap ? 2 * secs->cap : 16;
      count_section *more = realloc(secs->v, cap * sizeof *more);
      if (more == NULL)
        return pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
      secs->v = more, secs->cap = cap;
    }
    count_section *sec = &secs->v[secs->n++];
    *sec = (count_section){i, t, nh, 0, 0, pulse_reader_make(ep, (size_t)eb),
                           pulse_reader_make(hp, (size_t)hb)};
    section_chunk(sec);
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

/* Adds section x's class counts and contributions of chunk k (size
 * elements; c its changes) to hist and rank, moving x to its next chunk.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (entries that run out or sum past
 * the chunk). */
static pulse_status section_add(count_section *x, const shard_chunk *c, uint64_t size,
                                const char *name, uint64_t *hist, uint32_t *rank) {
  for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
    hist[cl] += pulse_reader_varint(&x->h); /* each <= size: checked */
  uint64_t last[PULSE_CLASS_COUNT];
  memset(last, 0, sizeof last);
  for (uint64_t j = 0; j < c->count; j++) {
    uint64_t d = pulse_reader_varint(&x->e);
    uint64_t got = last[c->cls[j]] + d;
    if (!x->e.ok || d > size || got > size || rank[j] + got > size)
      return pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu: the entries of chunk %llu of "
                        "'%s' are inconsistent", x->counts, (unsigned long long)x->chunk, name);
    last[c->cls[j]] = got;
    rank[j] += (uint32_t)got;
  }
  x->hj++;
  section_chunk(x);
  return PULSE_OK;
}

/* Codes the chunks of tensor t that parts carry changes of (several ranks
 * meet them), one chunk at a time: its changes merged from the parts, the
 * ranks' contributions and class counts summed from the sections of t
 * (walked chunk by chunk beside it), the stream into streams (owned) and
 * the list. Holds one chunk's changes, not the tensor's. */
static pulse_status code_shared(const pulse_tensor_info *info, size_t t, uint64_t numel,
                                const pulse_encode_opts *opts, unsigned version,
                                const shard_parts_view *v, section_list *secs,
                                stream_list *streams, coded_list *out) {
  uint32_t log2 = opts->chunk_log2;
  size_t ncur = 0;
  shard_part_cursor *cur = NULL;
  pulse_status st = open_cursors(v, t, "encode", &cur, &ncur);
  if (st != PULSE_OK)
    return st;
  for (size_t i = 0; i < ncur && st == PULSE_OK; i++)
    if (!cur[i].b->deltas)
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: a part cut for counting has no deltas to "
                      "code (the encoder needs every rank's whole part)");
  shard_chunk c = SHARD_CHUNK_INIT;
  uint64_t rank_cap = 0, hsum[PULSE_CLASS_COUNT];
  uint32_t *rank = NULL, hist[PULSE_CLASS_COUNT];
  while (st == PULSE_OK) {
    uint64_t k = UINT64_MAX;
    for (size_t i = 0; i < ncur; i++)
      if (cur[i].j < cur[i].b->k) {
        uint64_t ck = cur[i].pos >> log2;
        k = ck < k ? ck : k;
      }
    if (k == UINT64_MAX)
      break;
    if ((st = chunk_gather(cur, ncur, k, log2, &c)) != PULSE_OK)
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
    uint64_t size = chunk_size(numel, k, log2);
    memset(rank, 0, (size_t)c.count * sizeof *rank);
    memset(hsum, 0, sizeof hsum);
    /* Every rank's entries and class counts of this chunk. */
    for (size_t q = 0; q < secs->n && st == PULSE_OK; q++) {
      count_section *x = &secs->v[q];
      if (x->tensor != t || x->hj >= x->nh || x->chunk > k)
        continue;
      if (x->chunk < k)
        st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name chunk %llu of '%s', which no "
                        "part changes", x->counts, (unsigned long long)x->chunk, info->name);
      else
        st = section_add(x, &c, size, info->name, hsum, rank);
    }
    for (unsigned cl = 0; st == PULSE_OK && cl < PULSE_CLASS_COUNT; cl++) {
      if (hsum[cl] > size)
        st = pulse_fail(PULSE_ERR_CORRUPT, "shard: the counts of the chunk at element %llu of "
                        "'%s' do not add up to its class ranks", (unsigned long long)(k << log2),
                        info->name);
      hist[cl] = (uint32_t)hsum[cl];
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
    st = shard_code_chunk(version, opts->pos_model, hist, (uint32_t)size, k << log2, &c, rank, b);
    if (st != PULSE_OK)
      st = pulse_fail(st, "shard: tensor '%s': %s", info->name, pulse_error_detail());
    else if (b->failed || !coded_push(out, (shard_coded){t, k, c.count, b->data, b->size}))
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: encode");
  }
  /* What is left of a section names chunks past the tensor's last changed
   * one, or entries no change has. */
  for (size_t q = 0; q < secs->n && st == PULSE_OK; q++) {
    const count_section *x = &secs->v[q];
    if (x->tensor == t && (x->hj < x->nh || x->e.left != 0))
      st = pulse_fail(PULSE_ERR_CORRUPT, "shard: counts %zu name chunk %llu of '%s' or entries "
                      "that no part changes", x->counts, (unsigned long long)x->chunk,
                      info->name);
  }
  shard_chunk_free(&c);
  free(rank), free(cur);
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
      (opts->pos_model != PULSE_POS_PLAIN &&
       opts->pos_model != PULSE_POS_CLASS) ||
      version < PULSE_PATCH_VERSION_MIN || version > PULSE_PATCH_VERSION_MAX)
    return pulse_fail(PULSE_ERR_ARG, "shard: chunk_log2 in 10..30, a position model and a "
                                     "format version this library writes");
  if (version == 3)
    return pulse_fail(
        PULSE_ERR_UNSUPPORTED,
        "shard: format version 3 codes values against a "
        "model of the whole patch's changes, which no rank has: use 1 or 2");
  uint8_t id[32];
  PULSE_TRY(shard_table_id(table, tensor_count, id));
  shard_parts_view v;
  PULSE_TRY(shard_view_parts(parts, nparts, table, tensor_count, id, opts->chunk_log2, &v));
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

pulse_status shard_parts_blocks(const pulse_tensor_info *table, size_t count,
                                const pulse_buffer *parts, size_t nparts,
                                pulse_pub_block ***blocks_out,
                                size_t **counts_out) {
  uint8_t id[32];
  PULSE_TRY(shard_table_id(table, count, id));
  pulse_status st = PULSE_OK;
  pulse_pub_block **blocks = calloc(nparts ? nparts : 1, sizeof *blocks);
  size_t *counts = calloc(nparts ? nparts : 1, sizeof *counts);
  if (blocks == NULL || counts == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: check");
  for (size_t i = 0; i < nparts && st == PULSE_OK; i++) {
    /* parts already read by view_parts: viewed again one at a time */
    shard_parts_view v;
    uint32_t log2 = parts[i].data != NULL && parts[i].size >= SHARD_PART_HEADER
                        ? pulse_load_le32(parts[i].data + 12) : 0;
    if ((st = shard_view_parts(&parts[i], 1, table, count, id, log2, &v)) != PULSE_OK)
      break;
    if ((blocks[i] = calloc(v.nblocks ? v.nblocks : 1, sizeof **blocks)) == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "shard: check");
    counts[i] = v.nblocks;
    for (size_t b = 0; st == PULSE_OK && b < v.nblocks; b++) {
      const uint8_t *q = v.blocks[b].header;
      pulse_pub_block *x = &blocks[i][b];
      x->name = table[v.blocks[b].tensor].name;
      x->kind = pulse_load_le64(q + 56) == PULSE_PUB_BLOCK_FLAT ? PULSE_PUB_BLOCK_FLAT
                                                                : PULSE_PUB_BLOCK_RECT;
      for (int d = 0; d < PULSE_MAX_DIMS; d++) {
        x->start[d] = pulse_load_le64(q + 64 + 8 * d);
        x->extent[d] = pulse_load_le64(q + 128 + 8 * d);
      }
    }
    shard_view_free(&v);
  }
  if (st != PULSE_OK) {
    shard_parts_blocks_free(blocks, counts, nparts);
    return st;
  }
  *blocks_out = blocks;
  *counts_out = counts;
  return PULSE_OK;
}

void shard_parts_blocks_free(pulse_pub_block **blocks, size_t *counts,
                             size_t nparts) {
  for (size_t i = 0; blocks && i < nparts; i++)
    free(blocks[i]);
  free(blocks), free(counts);
}

pulse_status shard_parts_check(const pulse_tensor_info *table, size_t count,
                               const pulse_buffer *parts, size_t nparts) {
  pulse_pub_block **blocks = NULL;
  size_t *counts = NULL;
  PULSE_TRY(shard_parts_blocks(table, count, parts, nparts, &blocks, &counts));
  pulse_status st = pulse_pub_blocks_check(
      table, count, (const pulse_pub_block *const *)blocks, counts, nparts);
  shard_parts_blocks_free(blocks, counts, nparts);
  return st;
}
