/* payload_chunks.c - PULSELoCo payloads as independently decodable chunks
 * (docs/formats/loco-chunks.md "Chunks"): each covers a range of whole cells of the flat
 * parameter vector, fits one datagram, and names its sender, round, base
 * and range, under a checksum; a receiver aggregates per cell, over the
 * senders whose chunk for that cell arrived, so a lost datagram loses one
 * range of one sender. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "endian_impl.h"
#include "loco_impl.h"
#include "outer_elem_impl.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

#define CHUNK_MAGIC 0x4B434C50u /* "PLCK" */
#define CHUNK_ENTRY 8u          /* u32 offset in the range, FP32 value */

void loco_sha256(const uint8_t *data, size_t size, uint8_t out[32]) {
  unsigned len = 32;
  if (!EVP_Digest(data, size, out, &len, EVP_sha256(), NULL))
    memset(out, 0, 32);
}

static uint64_t checksum(const uint8_t *data, size_t size) {
  uint8_t sha[32];
  loco_sha256(data, size, sha);
  return pulse_load_le64(sha);
}

size_t pulse_loco_chunk_bound(void) {
  return PULSE_LOCO_CHUNK_HEADER + (size_t)CHUNK_ENTRY * PULSE_LOCO_CHUNK_CELL;
}

/* Writes one chunk of entries [a, b) covering [start, start + length). */
static void put_chunk(uint8_t *p, const pulse_loco_payload_header *hdr,
                      uint64_t P, uint64_t start, uint32_t length,
                      const uint64_t *pos, const float *val, uint64_t a,
                      uint64_t b) {
  uint32_t count = (uint32_t)(b - a);
  pulse_store_le32(p, CHUNK_MAGIC);
  p[4] = PULSE_LOCO_CHUNK_VERSION;
  p[5] = (uint8_t)hdr->flags;
  p[6] = p[7] = 0;
  pulse_store_le32(p + 8, hdr->sender);
  pulse_store_le64(p + 12, hdr->round);
  pulse_store_le64(p + 20, hdr->samples);
  pulse_store_le64(p + 28, P);
  pulse_store_le64(p + 36, hdr->base_digest);
  pulse_store_le64(p + 44, start);
  pulse_store_le32(p + 52, length);
  pulse_store_le32(p + 56, count);
  uint8_t *q = p + PULSE_LOCO_CHUNK_HEADER;
  for (uint64_t j = a; j < b; j++, q += CHUNK_ENTRY) {
    uint32_t bits;
    memcpy(&bits, &val[j], 4);
    pulse_store_le32(q, (uint32_t)(pos[j] - start));
    pulse_store_le32(q + 4, bits);
  }
  size_t size = PULSE_LOCO_CHUNK_HEADER + (size_t)CHUNK_ENTRY * count;
  pulse_store_le64(p + 60, 0);
  pulse_store_le64(p + 60, checksum(p, size));
}

pulse_status pulse_loco_chunks_encode(const pulse_loco_payload_header *hdr,
                                      uint64_t P, const uint64_t *pos,
                                      const float *val, uint64_t k,
                                      size_t max_datagram, pulse_buffer *out,
                                      uint64_t *nchunks) {
  if (out == NULL || hdr == NULL || (k > 0 && (pos == NULL || val == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "loco chunks: NULL argument");
  out->data = NULL, out->size = 0;
  if (P == 0 || P > PULSE_LOCO_MAX_PARAMS || k > P ||
      max_datagram < pulse_loco_chunk_bound() || hdr->samples == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco chunks: bad P, count, samples or datagram size "
                      "(at least %zu bytes)",
                      pulse_loco_chunk_bound());
  for (uint64_t j = 0; j < k; j++)
    if (pos[j] >= P || (j > 0 && pos[j] <= pos[j - 1]) || !isfinite(val[j]))
      return pulse_fail(PULSE_ERR_ARG, "loco chunks: entry %llu",
                        (unsigned long long)j);
  size_t per = (max_datagram - PULSE_LOCO_CHUNK_HEADER) / CHUNK_ENTRY;
  uint64_t cells = (P + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  /* At most one chunk per cell: the bound of the output. */
  size_t cap =
      (size_t)cells * PULSE_LOCO_CHUNK_HEADER + (size_t)k * CHUNK_ENTRY;
  uint8_t *buf = malloc(cap ? cap : 1);
  if (buf == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco chunks: %zu bytes", cap);
  size_t used = 0;
  uint64_t n = 0, j = 0;
  /* Greedy: whole cells into a chunk while their entries fit. Every cell
   * is covered, with entries or not: an empty range says "nothing here",
   * which the receiver counts as this sender's arrival for those cells. */
  for (uint64_t c = 0; c < cells;) {
    uint64_t start = c * PULSE_LOCO_CHUNK_CELL, a = j;
    uint64_t end = start;
    while (c < cells) {
      uint64_t cell_end = (c + 1) * PULSE_LOCO_CHUNK_CELL;
      if (cell_end > P)
        cell_end = P;
      uint64_t b = j;
      while (b < k && pos[b] < cell_end)
        b++;
      if (end > start && b - a > per)
        break; /* this cell goes to the next chunk */
      j = b, end = cell_end, c++;
      if (end - start >= (uint64_t)UINT32_MAX - PULSE_LOCO_CHUNK_CELL)
        break;
    }
    put_chunk(buf + used, hdr, P, start, (uint32_t)(end - start), pos, val, a,
              j);
    used += PULSE_LOCO_CHUNK_HEADER + (size_t)CHUNK_ENTRY * (j - a);
    n++;
  }
  out->data = buf, out->size = used;
  if (nchunks)
    *nchunks = n;
  return PULSE_OK;
}

/* Whether any range of range_len parameters flagged in drifted overlaps
 * [start, start + length). */
static int overlaps(const uint8_t *drifted, uint64_t range_len,
                    uint64_t start, uint64_t length) {
  for (uint64_t k = start / range_len; k <= (start + length - 1) / range_len;
       k++)
    if (drifted[k])
      return 1;
  return 0;
}

pulse_status pulse_loco_chunks_mark_drifted(pulse_buffer *chunks,
                                            uint64_t nchunks, uint64_t P,
                                            const uint8_t *drifted,
                                            uint64_t range_len) {
  if (chunks == NULL || drifted == NULL || range_len == 0 ||
      (chunks->data == NULL && chunks->size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco chunks: NULL argument");
  uint8_t *p = chunks->data;
  size_t left = chunks->size;
  for (uint64_t n = 0; n < nchunks; n++) {
    size_t cs;
    PULSE_TRY(pulse_loco_chunk_size(p, left, &cs));
    if (cs > left)
      return pulse_fail(PULSE_ERR_TRUNCATED, "loco chunks: chunk %llu",
                        (unsigned long long)n);
    uint64_t start = pulse_load_le64(p + 44);
    uint32_t length = pulse_load_le32(p + 52);
    if (length == 0 || start >= P || length > P - start)
      return pulse_fail(PULSE_ERR_CORRUPT, "loco chunks: chunk %llu range",
                        (unsigned long long)n);
    if (overlaps(drifted, range_len, start, length)) {
      p[5] |= (uint8_t)PULSE_LOCO_CHUNK_DRIFTED;
      pulse_store_le64(p + 60, 0);
      pulse_store_le64(p + 60, checksum(p, cs));
    }
    p += cs, left -= cs;
  }
  return PULSE_OK;
}

pulse_status pulse_loco_chunk_size(const uint8_t *data, size_t size,
                                   size_t *chunk_size) {
  if (data == NULL || chunk_size == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco chunk: NULL argument");
  if (size < PULSE_LOCO_CHUNK_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco chunk: %zu bytes", size);
  uint32_t count = pulse_load_le32(data + 56);
  if (count > PULSE_LOCO_CHUNK_CELL * 64u)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: %u entries", count);
  *chunk_size = PULSE_LOCO_CHUNK_HEADER + (size_t)CHUNK_ENTRY * count;
  return PULSE_OK;
}

/* Why a chunk was refused, for the inbox's counters. */
enum { WHY_TRUNCATED = 1, WHY_CHECKSUM, WHY_MALFORMED };

static pulse_status decode(const uint8_t *data, size_t size,
                           const float *theta_g, uint64_t P,
                           pulse_loco_chunk_header *h, uint64_t *pos,
                           float *val, unsigned *why) {
  memset(h, 0, sizeof *h);
  *why = WHY_TRUNCATED;
  if (size < PULSE_LOCO_CHUNK_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco chunk: %zu bytes", size);
  *why = WHY_MALFORMED;
  if (pulse_load_le32(data) != CHUNK_MAGIC)
    return pulse_fail(PULSE_ERR_MAGIC, "loco chunk: not PLCK");
  if (data[4] != PULSE_LOCO_CHUNK_VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "loco chunk: version %u", data[4]);
  uint32_t count = pulse_load_le32(data + 56);
  if (count > PULSE_LOCO_CHUNK_CELL * 64u)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: %u entries", count);
  size_t want = PULSE_LOCO_CHUNK_HEADER + (size_t)CHUNK_ENTRY * count;
  *why = WHY_TRUNCATED;
  if (size < want)
    return pulse_fail(PULSE_ERR_TRUNCATED, "loco chunk: %zu of %zu bytes", size,
                      want);
  if (size > want)
    return pulse_fail(PULSE_ERR_TRAILING, "loco chunk: %zu bytes after it",
                      size - want);
  *why = WHY_CHECKSUM;
  /* The checksum covers the chunk with its own field zeroed. */
  uint8_t *copy = malloc(want);
  if (copy == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco chunk");
  memcpy(copy, data, want);
  memset(copy + 60, 0, 8);
  uint64_t sum = checksum(copy, want);
  free(copy);
  if (sum != pulse_load_le64(data + 60))
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: bad checksum");
  *why = WHY_MALFORMED;
  h->flags = data[5];
  h->sender = pulse_load_le32(data + 8);
  h->round = pulse_load_le64(data + 12);
  h->samples = pulse_load_le64(data + 20);
  h->param_count = pulse_load_le64(data + 28);
  h->base_digest = pulse_load_le64(data + 36);
  h->start = pulse_load_le64(data + 44);
  h->length = pulse_load_le32(data + 52);
  h->count = count;
  if ((h->flags & ~(uint32_t)(PULSE_LOCO_PAYLOAD_GATED |
                              PULSE_LOCO_PAYLOAD_LEAVING |
                              PULSE_LOCO_CHUNK_DRIFTED)) != 0 ||
      data[6] != 0 || data[7] != 0 || h->samples == 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: flags or samples");
  if (h->param_count != P)
    return pulse_fail(
        PULSE_ERR_SIZE_MISMATCH, "loco chunk: %llu parameters, this run %llu",
        (unsigned long long)h->param_count, (unsigned long long)P);
  /* The range: whole cells, inside P (the last cell may be short). */
  if (h->length == 0 || h->start % PULSE_LOCO_CHUNK_CELL != 0 ||
      h->start >= P || h->length > P - h->start ||
      (h->start + h->length != P && h->length % PULSE_LOCO_CHUNK_CELL != 0) ||
      count > h->length)
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: range or count");
  /* A sender whose base differs from the reference over this range built
   * its entries on other values than the receiver's: the gate there is
   * the sender's, and cannot be checked here. */
  int gated = (h->flags & PULSE_LOCO_PAYLOAD_GATED) != 0 &&
              (h->flags & PULSE_LOCO_CHUNK_DRIFTED) == 0;
  const uint8_t *q = data + PULSE_LOCO_CHUNK_HEADER;
  for (uint32_t j = 0; j < count; j++, q += CHUNK_ENTRY) {
    uint32_t off = pulse_load_le32(q), bits = pulse_load_le32(q + 4);
    if (off >= h->length || (j > 0 && h->start + off <= pos[j - 1]))
      return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: entry %u position", j);
    float v;
    memcpy(&v, &bits, 4);
    if (!isfinite(v))
      return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: entry %u value", j);
    pos[j] = h->start + off;
    val[j] = v;
    if (gated && theta_g != NULL && !pulse_loco_gate(theta_g[pos[j]], v))
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco chunk: entry %u does not pass the gate", j);
  }
  return PULSE_OK;
}

pulse_status pulse_loco_chunk_decode(const uint8_t *data, size_t size,
                                     const float *theta_g, uint64_t P,
                                     pulse_loco_chunk_header *h, uint64_t *pos,
                                     float *val) {
  if (data == NULL || h == NULL || pos == NULL || val == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco chunk: NULL argument");
  unsigned why;
  return decode(data, size, theta_g, P, h, pos, val, &why);
}

/* ------------------------------------------------------------------ inbox */

typedef struct {
  uint32_t sender;
  uint64_t samples, count;
  uint64_t *pos;
  float *val;
} held_chunk;

struct pulse_loco_inbox {
  pulse_loco *ctx; /* borrowed; its prepared round */
  uint64_t cells;
  uint32_t *senders; /* the others, increasing */
  size_t nsenders;
  uint8_t *arrived;  /* nsenders x cells */
  uint64_t *samples; /* per sender, from its first chunk */
  uint64_t *ncells;  /* per sender, cells arrived */
  size_t heard, complete; /* senders with a chunk kept, with every cell */
  held_chunk *held;
  size_t nheld, capheld;
  uint64_t base;      /* the base digest chunks must name */
  uint8_t *drifted;   /* NULL, or the ranges where this replica differs
                         from the reference (no gate check there) */
  uint64_t range_len;
  uint64_t *pos; /* scratch for one chunk */
  float *val;
  pulse_loco_inbox_figures stats;
};

static int by_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return (x > y) - (x < y);
}

pulse_status pulse_loco_inbox_create(pulse_loco *ctx, const uint32_t *senders,
                                     size_t nsenders, pulse_loco_inbox **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco inbox: NULL output");
  *out = NULL;
  if (ctx == NULL || !ctx->prepared || (nsenders > 0 && senders == NULL) ||
      nsenders > 65536)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco inbox: no prepared round or bad senders");
  pulse_loco_inbox *in = calloc(1, sizeof *in);
  if (in == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco inbox");
  in->ctx = ctx;
  in->base = ctx->digest;
  in->cells = (ctx->n + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  in->senders = malloc((nsenders ? nsenders : 1) * sizeof *in->senders);
  in->samples = calloc(nsenders ? nsenders : 1, sizeof *in->samples);
  in->ncells = calloc(nsenders ? nsenders : 1, sizeof *in->ncells);
  in->arrived = calloc((size_t)(nsenders ? nsenders : 1) * in->cells, 1);
  in->pos = malloc(64u * PULSE_LOCO_CHUNK_CELL * sizeof *in->pos);
  in->val = malloc(64u * PULSE_LOCO_CHUNK_CELL * sizeof *in->val);
  if (!in->senders || !in->samples || !in->ncells || !in->arrived ||
      !in->pos || !in->val) {
    pulse_loco_inbox_free(in);
    return pulse_fail(PULSE_ERR_NOMEM, "loco inbox: %llu cells",
                      (unsigned long long)in->cells);
  }
  size_t n = 0;
  for (size_t i = 0; i < nsenders; i++)
    if (senders[i] != ctx->opts.trainer_id)
      in->senders[n++] = senders[i];
  qsort(in->senders, n, sizeof *in->senders, by_u32);
  for (size_t i = 1; i < n; i++)
    if (in->senders[i] == in->senders[i - 1]) {
      pulse_loco_inbox_free(in);
      return pulse_fail(PULSE_ERR_DUPLICATE, "loco inbox: sender %u twice",
                        senders[i]);
    }
  in->nsenders = n;
  *out = in;
  return PULSE_OK;
}

void pulse_loco_inbox_free(pulse_loco_inbox *in) {
  if (in == NULL)
    return;
  for (size_t i = 0; i < in->nheld; i++)
    free(in->held[i].pos), free(in->held[i].val);
  free(in->held), free(in->senders), free(in->samples), free(in->arrived);
  free(in->ncells), free(in->drifted);
  free(in->pos), free(in->val);
  free(in);
}

pulse_status pulse_loco_inbox_set_drift(pulse_loco_inbox *in,
                                       uint64_t base_digest,
                                       const uint8_t *drifted,
                                       uint64_t range_len) {
  if (in == NULL || (drifted != NULL && range_len == 0))
    return pulse_fail(PULSE_ERR_ARG, "loco inbox: drift");
  uint8_t *copy = NULL;
  if (drifted != NULL) {
    uint64_t count = (in->ctx->n + range_len - 1) / range_len;
    copy = malloc((size_t)count);
    if (copy == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco inbox: drift");
    memcpy(copy, drifted, (size_t)count);
  }
  free(in->drifted);
  in->drifted = copy;
  in->range_len = range_len;
  in->base = base_digest;
  return PULSE_OK;
}

void pulse_loco_inbox_figures_get(const pulse_loco_inbox *in,
                            pulse_loco_inbox_figures *stats) {
  *stats = in->stats;
}

static int find_sender(const pulse_loco_inbox *in, uint32_t id) {
  size_t lo = 0, hi = in->nsenders;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (in->senders[mid] < id)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < in->nsenders && in->senders[lo] == id ? (int)lo : -1;
}

pulse_status pulse_loco_inbox_add(pulse_loco_inbox *in, const uint8_t *data,
                                  size_t size) {
  if (in == NULL || (data == NULL && size > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco inbox: NULL argument");
  const pulse_loco *ctx = in->ctx;
  pulse_loco_chunk_header h;
  unsigned why = WHY_TRUNCATED;
  pulse_status st = data ? decode(data, size, NULL, ctx->n, &h, in->pos,
                                  in->val, &why)
                         : pulse_fail(PULSE_ERR_TRUNCATED, "loco chunk: empty");
  /* The gate, against this replica's theta_g, where the sender's base and
   * this one are both the reference's (neither flags the range). */
  if (st == PULSE_OK && (h.flags & PULSE_LOCO_PAYLOAD_GATED) &&
      !(h.flags & PULSE_LOCO_CHUNK_DRIFTED) &&
      !(in->drifted && overlaps(in->drifted, in->range_len, h.start, h.length)))
    for (uint32_t j = 0; j < h.count && st == PULSE_OK; j++)
      if (!pulse_loco_gate(ctx->theta_g[in->pos[j]], in->val[j])) {
        why = WHY_MALFORMED;
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "loco chunk: entry %u does not pass the gate", j);
      }
  if (st != PULSE_OK) {
    if (why == WHY_TRUNCATED)
      in->stats.truncated++;
    else if (why == WHY_CHECKSUM)
      in->stats.bad_checksum++;
    else
      in->stats.malformed++;
    return st;
  }
  int s = find_sender(in, h.sender);
  if (s < 0) {
    in->stats.unknown_sender++;
    return pulse_fail(PULSE_ERR_CORRUPT, "loco chunk: unknown sender %u",
                      h.sender);
  }
  if (h.round != ctx->round) {
    in->stats.other_round++;
    return pulse_fail(PULSE_ERR_BASE_STEP, "loco chunk: round %llu, not %llu",
                      (unsigned long long)h.round,
                      (unsigned long long)ctx->round);
  }
  if (h.base_digest != in->base) {
    in->stats.other_base++;
    return pulse_fail(PULSE_ERR_BASE_DIGEST,
                      "loco chunk: built on another theta_g");
  }
  if (in->samples[s] != 0 && in->samples[s] != h.samples) {
    in->stats.malformed++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco chunk: sender %u changed its sample count",
                      h.sender);
  }
  uint64_t c0 = h.start / PULSE_LOCO_CHUNK_CELL;
  uint64_t c1 =
      (h.start + h.length + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  uint8_t *got = in->arrived + (size_t)s * in->cells;
  for (uint64_t c = c0; c < c1; c++)
    if (got[c]) {
      in->stats.duplicate++;
      return pulse_fail(PULSE_ERR_DUPLICATE,
                        "loco chunk: sender %u's cell %llu again", h.sender,
                        (unsigned long long)c);
    }
  if (in->nheld == in->capheld) {
    size_t cap = in->capheld ? 2 * in->capheld : 64;
    held_chunk *m = realloc(in->held, cap * sizeof *m);
    if (m == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco inbox");
    in->held = m, in->capheld = cap;
  }
  held_chunk *k = &in->held[in->nheld];
  k->sender = h.sender;
  k->samples = h.samples;
  k->count = h.count;
  k->pos = malloc((h.count ? h.count : 1) * sizeof *k->pos);
  k->val = malloc((h.count ? h.count : 1) * sizeof *k->val);
  if (k->pos == NULL || k->val == NULL) {
    free(k->pos), free(k->val);
    return pulse_fail(PULSE_ERR_NOMEM, "loco inbox");
  }
  memcpy(k->pos, in->pos, h.count * sizeof *k->pos);
  memcpy(k->val, in->val, h.count * sizeof *k->val);
  in->nheld++;
  in->heard += in->samples[s] == 0;
  in->samples[s] = h.samples;
  for (uint64_t c = c0; c < c1; c++)
    got[c] = 1;
  in->ncells[s] += c1 - c0;
  in->complete += in->ncells[s] == in->cells;
  in->stats.accepted++;
  return PULSE_OK;
}

void loco_inbox_progress(const pulse_loco_inbox *in, size_t *senders,
                         size_t *heard, size_t *complete) {
  *senders = in->nsenders;
  *heard = in->heard;
  *complete = in->complete;
}

uint64_t loco_inbox_arrival(const pulse_loco_inbox *in, uint32_t sender,
                            uint8_t sha[32]) {
  int s = find_sender(in, sender);
  if (s < 0) {
    memset(sha, 0, 32);
    return 0;
  }
  loco_sha256(in->arrived + (size_t)s * in->cells, (size_t)in->cells, sha);
  return in->ncells[s];
}

static int held_by_sender(const void *a, const void *b) {
  uint32_t x = ((const held_chunk *)a)->sender,
           y = ((const held_chunk *)b)->sender;
  return (x > y) - (x < y);
}

pulse_status pulse_loco_finish_inbox(pulse_loco *ctx, pulse_loco_inbox *in,
                                     float *theta_r,
                                     pulse_loco_finish_figures *info) {
  if (ctx == NULL || in == NULL || in->ctx != ctx || !ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco inbox: not this prepared round");
  if (ctx->opts.rule != PULSE_LOCO_RULE_DROP)
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "loco inbox: the %s rule needs every sender to learn "
                      "which of its ranges arrived (a manifest per range): "
                      "only the drop rule aggregates chunks",
                      pulse_loco_rule_name(ctx->opts.rule));
  if (ctx->opts.gate_mean)
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "loco inbox: the mean gate (gate_mean) is not "
                      "implemented for chunks over datagrams");
  uint64_t P = ctx->n, cells = in->cells;
  double *acc = calloc((size_t)P, sizeof *acc);
  double *weight = calloc((size_t)cells, sizeof *weight);
  float *avg = malloc((size_t)P * sizeof *avg + 1);
  if (acc == NULL || weight == NULL || avg == NULL) {
    free(acc), free(weight), free(avg);
    return pulse_fail(PULSE_ERR_NOMEM, "loco inbox: finish");
  }
  /* Every sender's cells in increasing sender id, this trainer's own among
   * them (its chunks never travel): the same sums on every trainer that
   * got the same chunks. Chunks of one sender cover disjoint cells. */
  if (in->nheld > 0) /* held may be NULL then, which qsort may not take */
    qsort(in->held, in->nheld, sizeof *in->held, held_by_sender);
  uint32_t self = ctx->opts.trainer_id;
  int self_done = 0;
  uint64_t entries = 0, wsum = ctx->samples;
  uint32_t senders = 1;
  for (size_t i = 0; i <= in->nheld; i++) {
    if (!self_done && (i == in->nheld || in->held[i].sender > self)) {
      double w = (double)ctx->samples;
      for (uint64_t j = 0; j < ctx->sent_count; j++)
        acc[ctx->sent_pos[j]] += w * (double)ctx->sent_val[j];
      for (uint64_t c = 0; c < cells; c++)
        weight[c] += w;
      entries += ctx->sent_count;
      self_done = 1;
    }
    if (i == in->nheld)
      break;
    const held_chunk *k = &in->held[i];
    double w = (double)k->samples;
    for (uint64_t j = 0; j < k->count; j++)
      acc[k->pos[j]] += w * (double)k->val[j];
    entries += k->count;
  }
  /* Per cell, the weight of the senders whose chunk for it arrived. */
  for (size_t s = 0; s < in->nsenders; s++) {
    if (in->samples[s] == 0)
      continue;
    senders++;
    wsum += in->samples[s];
    const uint8_t *got = in->arrived + s * cells;
    for (uint64_t c = 0; c < cells; c++)
      if (got[c])
        weight[c] += (double)in->samples[s];
  }
  for (uint64_t i = 0; i < P; i++)
    avg[i] = (float)(acc[i] / weight[i / PULSE_LOCO_CHUNK_CELL]);
  free(acc), free(weight);
  if (info) {
    info->round = ctx->round;
    info->contributors = senders;
    info->self_included = 1;
    info->samples = wsum;
    info->entries = entries;
  }
  /* The outer step and the drop rule (this trainer's payload counts as
   * included: what was sent is gone from e, arrived or not), as every
   * finish does. */
  pulse_loco_conclude_(ctx, avg, NULL, 0.0, NULL, 1, theta_r);
  free(avg);
  return PULSE_OK;
}
