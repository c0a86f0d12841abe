/* chunk_coder.c - entropy coding of one chunk (docs/formats/patch.md, "Chunk streams").
 *
 * A chunk's changes are coded class by class: for every position class the
 * number of changed elements, then for each change the gap to the previous
 * one counted in elements of that class (Golomb-binarized, adaptive), and the
 * zig-zag of the bit delta (adaptive, conditioned on the class). With one
 * class (PULSE_POS_PLAIN) ranks are plain positions. */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "class_index_impl.h"
#include "pulse_elem.h"
#include "rangecoder_impl.h"
#include "status_impl.h"

#define QUOTIENT_MAX 24u  /* unary quotient length before the escape */
#define QUOTIENT_CTX 12u
#define VALUE_LEN_MAX 15u /* w + 1 <= 65533 has at most 16 bits */

/* All adaptive probabilities of one chunk; reset at the start of each chunk
 * so chunks decode independently. */
typedef struct {
  pulse_prob count_zero[65];
  pulse_prob count_len[65];
  pulse_prob quotient[QUOTIENT_CTX];
  pulse_prob remainder[32][4];
  pulse_prob value_big[PULSE_CLASS_COUNT];
  pulse_prob value_sign[PULSE_CLASS_COUNT];
  pulse_prob value_len[PULSE_CLASS_COUNT][VALUE_LEN_MAX];
} chunk_models;

static void models_reset(chunk_models *m) {
  pulse_prob *p = (pulse_prob *)m;
  for (size_t i = 0; i < sizeof *m / sizeof *p; i++)
    p[i] = PULSE_RC_PROB_INIT;
}

static unsigned bit_length(uint64_t v) {
  return v ? 64u - (unsigned)__builtin_clzll(v) : 0u;
}

/* Golomb parameter for a class of n elements with k changed: M = 2^m close
 * to ln 2 times the mean gap, the optimum for geometric gaps. */
static unsigned golomb_log2(uint64_t n, uint64_t k) {
  uint64_t ratio = (n / k) * 11u / 16u;
  unsigned m = ratio ? bit_length(ratio) - 1u : 0u;
  return m > 31u ? 31u : m;
}

/* ------------------------------------------------------------- classify */

void pulse_chunk_classify(const uint16_t *base, uint32_t n, const uint32_t *pos,
                          uint32_t k, uint32_t *hist, uint32_t *rank,
                          uint8_t *cls) {
  /* Four partial histograms break the store-to-load chain when neighbours
   * share a class; a change needs the exact running count, so it sums them. */
  uint32_t h4[4][PULSE_CLASS_COUNT];
  memset(h4, 0, sizeof h4);
  uint32_t i = 0;
  for (uint32_t j = 0; j <= k; j++) {
    uint32_t stop = j < k ? pos[j] : n;
    for (; i + 4 <= stop; i += 4) {
      h4[0][pulse_bf16_class(base[i])]++;
      h4[1][pulse_bf16_class(base[i + 1])]++;
      h4[2][pulse_bf16_class(base[i + 2])]++;
      h4[3][pulse_bf16_class(base[i + 3])]++;
    }
    for (; i < stop; i++)
      h4[0][pulse_bf16_class(base[i])]++;
    if (j == k)
      break;
    unsigned c = pulse_bf16_class(base[i]);
    rank[j] = h4[0][c] + h4[1][c] + h4[2][c] + h4[3][c];
    cls[j] = (uint8_t)c;
    h4[0][c]++;
    i++;
  }
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    hist[c] = h4[0][c] + h4[1][c] + h4[2][c] + h4[3][c];
}


/* ------------------------------------------------------------ encoding */

unsigned pulse_chunk_class_order(uint32_t k, const uint8_t *cls, uint32_t *kc, uint32_t *start,
                                 uint32_t *order) {
  unsigned active = 0;
  for (uint32_t j = 0; j < k; j++)
    active += kc[cls[j]]++ == 0;
  start[0] = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    start[c + 1] = start[c] + kc[c];
  uint32_t fill[PULSE_CLASS_COUNT];
  memcpy(fill, start, sizeof fill);
  for (uint32_t j = 0; j < k; j++) /* stable: ranks stay increasing */
    order[fill[cls[j]]++] = j;
  return active;
}

static void put_count(pulse_rc_enc *e, chunk_models *m, uint64_t n, uint64_t k) {
  unsigned ln = bit_length(n);
  pulse_rc_enc_bit(e, &m->count_zero[ln], k != 0);
  if (k == 0)
    return;
  /* bit length of k in truncated unary (k <= n bounds it), then the bits
   * below the leading one. */
  unsigned lk = bit_length(k);
  for (unsigned i = 1; i < ln; i++) {
    pulse_rc_enc_bit(e, &m->count_len[i], lk > i);
    if (lk <= i)
      break;
  }
  pulse_rc_enc_direct(e, k, lk - 1u);
}

static void put_gap(pulse_rc_enc *e, chunk_models *m, uint64_t gap, unsigned mlog) {
  uint64_t q = gap >> mlog;
  unsigned unary = q < QUOTIENT_MAX ? (unsigned)q : QUOTIENT_MAX;
  for (unsigned i = 0; i < unary; i++)
    pulse_rc_enc_bit(e, &m->quotient[i < QUOTIENT_CTX ? i : QUOTIENT_CTX - 1], 1);
  if (q < QUOTIENT_MAX) {
    pulse_rc_enc_bit(e, &m->quotient[unary < QUOTIENT_CTX ? unary : QUOTIENT_CTX - 1], 0);
  } else {
    uint64_t rest = q - QUOTIENT_MAX + 1u; /* >= 1 */
    unsigned len = bit_length(rest);
    pulse_rc_enc_direct(e, len, 7);
    pulse_rc_enc_direct(e, rest, len - 1u);
  }
  if (mlog == 0)
    return;
  uint64_t r = gap & ((1ull << mlog) - 1u);
  unsigned b1 = (unsigned)(r >> (mlog - 1u)) & 1u;
  pulse_rc_enc_bit(e, &m->remainder[mlog][1], b1);
  if (mlog == 1)
    return;
  unsigned b2 = (unsigned)(r >> (mlog - 2u)) & 1u;
  pulse_rc_enc_bit(e, &m->remainder[mlog][2 + b1], b2);
  pulse_rc_enc_direct(e, r, mlog - 2u);
}

static void put_value(pulse_rc_enc *e, chunk_models *m, unsigned vc, uint16_t delta) {
  uint32_t v = pulse_zigzag16(delta) - 1u; /* delta != 0, so zig-zag >= 1 */
  pulse_rc_enc_bit(e, &m->value_big[vc], v >= 2u);
  if (v < 2u) {
    pulse_rc_enc_bit(e, &m->value_sign[vc], v);
    return;
  }
  uint32_t w1 = v - 1u; /* (v - 2) + 1 >= 1 */
  unsigned len = bit_length(w1) - 1u;
  for (unsigned i = 0; i < VALUE_LEN_MAX; i++) {
    pulse_rc_enc_bit(e, &m->value_len[vc][i], len > i);
    if (len <= i)
      break;
  }
  pulse_rc_enc_direct(e, w1, len);
}

static pulse_status v1_encode_ranks(pulse_pos_model model, const uint32_t *hist,
                                    uint32_t n, uint32_t k, const uint8_t *cls,
                                    const uint32_t *rank, const uint16_t *delta,
                                    pulse_bytebuf *out) {
  chunk_models *m = malloc(sizeof *m);
  uint32_t *order = NULL;
  if (m == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "chunk encode: models");
  models_reset(m);
  pulse_rc_enc e;
  pulse_rc_enc_init(&e, out);

  if (model == PULSE_POS_PLAIN) {
    uint64_t prev = 0;
    unsigned mlog = golomb_log2(n, k);
    for (uint32_t j = 0; j < k; j++) {
      put_gap(&e, m, rank[j] - prev, mlog);
      put_value(&e, m, 0, delta[j]);
      prev = (uint64_t)rank[j] + 1u;
    }
  } else {
    uint32_t kc[PULSE_CLASS_COUNT] = {0}, start[PULSE_CLASS_COUNT + 1];
    order = malloc((size_t)k * sizeof *order);
    if (order == NULL) {
      free(m);
      return pulse_fail(PULSE_ERR_NOMEM, "chunk encode: %u changes", k);
    }
    pulse_chunk_class_order(k, cls, kc, start, order);
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
      if (hist[c] != 0)
        put_count(&e, m, hist[c], kc[c]);
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
      if (kc[c] == 0)
        continue;
      unsigned mlog = golomb_log2(hist[c], kc[c]);
      uint64_t prev = 0;
      for (uint32_t t = start[c]; t < start[c + 1]; t++) {
        uint32_t j = order[t];
        put_gap(&e, m, rank[j] - prev, mlog);
        put_value(&e, m, c, delta[j]);
        prev = (uint64_t)rank[j] + 1u;
      }
    }
  }
  pulse_rc_enc_flush(&e);
  free(m), free(order);
  if (out->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "chunk encode: output buffer");
  return PULSE_OK;
}

/* Version 3 codes the plain model as one class, class 0, which the
 * patch's value model then describes. */
static pulse_status v3_encode_ranks(const pulse_v3_model *values,
                                    pulse_pos_model model, uint32_t k,
                                    const uint8_t *cls, const uint32_t *rank,
                                    const uint16_t *delta, pulse_bytebuf *out) {
  if (values == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "chunk encode: format version 3 needs the value model");
  if (model == PULSE_POS_CLASS)
    return pulse_chunk3_encode_ranks(values, k, cls, rank, delta, out, NULL);
  uint8_t *zeros = calloc((size_t)k + 1, 1);
  if (zeros == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "chunk encode: %u changes", k);
  pulse_status st =
      pulse_chunk3_encode_ranks(values, k, zeros, rank, delta, out, NULL);
  free(zeros);
  return st;
}

pulse_status pulse_chunk_encode_ranks(
    unsigned version, const pulse_v3_model *values, pulse_pos_model model,
    const uint32_t *hist, uint32_t n, uint32_t k, const uint8_t *cls,
    const uint32_t *rank, const uint16_t *delta, pulse_bytebuf *out) {
  if (version == 2)
    return pulse_chunk2_encode_ranks(model, k, cls, rank, delta, out);
  if (version == 3)
    return v3_encode_ranks(values, model, k, cls, rank, delta, out);
  if (version != 1)
    return pulse_fail(PULSE_ERR_VERSION, "chunk encode: no format version %u", version);
  return v1_encode_ranks(model, hist, n, k, cls, rank, delta, out);
}

pulse_status pulse_chunk_encode(unsigned version, const pulse_v3_model *values,
                                pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint32_t *pos,
                                const uint16_t *delta, uint32_t k,
                                pulse_bytebuf *out) {
  if (model == PULSE_POS_PLAIN)
    return pulse_chunk_encode_ranks(version, values, model, NULL, n, k, NULL,
                                    pos, delta, out);
  uint32_t hist[PULSE_CLASS_COUNT];
  uint32_t *rank = malloc((size_t)k * sizeof *rank);
  uint8_t *cls = malloc((size_t)k);
  pulse_status st;
  if (rank == NULL || cls == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "chunk encode: %u changes", k);
  } else {
    pulse_chunk_classify(base, n, pos, k, hist, rank, cls);
    st = pulse_chunk_encode_ranks(version, values, model, hist, n, k, cls, rank,
                                  delta, out);
  }
  free(rank), free(cls);
  return st;
}

/* ------------------------------------------------------------ decoding */

static int get_count(pulse_rc_dec *d, chunk_models *m, uint64_t n, uint64_t *k) {
  unsigned ln = bit_length(n);
  if (!pulse_rc_dec_bit(d, &m->count_zero[ln])) {
    *k = 0;
    return 1;
  }
  unsigned lk = 1;
  while (lk < ln && pulse_rc_dec_bit(d, &m->count_len[lk]))
    lk++;
  uint64_t v = (1ull << (lk - 1u)) | pulse_rc_dec_direct(d, lk - 1u);
  *k = v;
  return v <= n;
}

/* Reads one gap; 0 when it cannot fit below `room` (the gap must be < room). */
static int get_gap(pulse_rc_dec *d, chunk_models *m, unsigned mlog, uint64_t room,
                   uint64_t *gap) {
  uint64_t q = 0;
  while (q < QUOTIENT_MAX &&
         pulse_rc_dec_bit(d, &m->quotient[q < QUOTIENT_CTX ? q : QUOTIENT_CTX - 1]))
    q++;
  if (q == QUOTIENT_MAX) {
    unsigned len = (unsigned)pulse_rc_dec_direct(d, 7);
    if (len == 0 || len > 64)
      return 0;
    uint64_t rest = (len == 64 ? 0 : (1ull << (len - 1u))) | pulse_rc_dec_direct(d, len - 1u);
    if (len == 64)
      rest |= 1ull << 63;
    if (rest > UINT64_MAX - (QUOTIENT_MAX - 1u))
      return 0;
    q = rest + QUOTIENT_MAX - 1u;
  }
  if (q > (room >> mlog))
    return 0;
  uint64_t r = 0;
  if (mlog >= 1) {
    unsigned b1 = pulse_rc_dec_bit(d, &m->remainder[mlog][1]);
    r = b1;
    if (mlog >= 2) {
      unsigned b2 = pulse_rc_dec_bit(d, &m->remainder[mlog][2 + b1]);
      r = (r << 1) | b2;
      r = (r << (mlog - 2u)) | pulse_rc_dec_direct(d, mlog - 2u);
    }
  }
  uint64_t g = (q << mlog) | r;
  if (g >= room)
    return 0;
  *gap = g;
  return 1;
}

static int get_value(pulse_rc_dec *d, chunk_models *m, unsigned vc, uint16_t *delta) {
  uint32_t v;
  if (!pulse_rc_dec_bit(d, &m->value_big[vc])) {
    v = pulse_rc_dec_bit(d, &m->value_sign[vc]);
  } else {
    unsigned len = 0;
    while (len < VALUE_LEN_MAX && pulse_rc_dec_bit(d, &m->value_len[vc][len]))
      len++;
    uint32_t w1 = (1u << len) | (uint32_t)pulse_rc_dec_direct(d, len);
    v = w1 + 1u;
  }
  uint32_t z = v + 1u;
  if (z > 0xFFFFu)
    return 0;
  *delta = pulse_unzigzag16(z);
  return 1;
}

static pulse_status v1_decode_ranks(pulse_pos_model model, const uint32_t *hist,
                                    uint32_t n, const uint8_t *stream, size_t size,
                                    uint32_t k, uint32_t *start, uint32_t *rank,
                                    uint16_t *delta) {
  if (k == 0 || k > n)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: %u changes in %u elements", k, n);
  if (model == PULSE_POS_CLASS && hist == NULL)
    return pulse_fail(PULSE_ERR_ARG, "chunk: the class model needs the base's class counts");
  pulse_rc_dec d;
  if (!pulse_rc_dec_init(&d, stream, size))
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: not a range-coder stream");
  chunk_models *m = malloc(sizeof *m);
  if (m == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "chunk decode: models");
  models_reset(m);
  pulse_status st = PULSE_OK;

  if (model == PULSE_POS_PLAIN) {
    unsigned mlog = golomb_log2(n, k);
    uint64_t next = 0;
    for (uint32_t j = 0; j < k; j++) {
      uint64_t gap;
      if (!get_gap(&d, m, mlog, n - next, &gap) || !get_value(&d, m, 0, &delta[j])) {
        st = pulse_fail(PULSE_ERR_POSITION, "chunk: change %u of %u out of range", j, k);
        goto done;
      }
      rank[j] = (uint32_t)(next + gap);
      next += gap + 1u;
    }
  } else {
    uint64_t kc[PULSE_CLASS_COUNT] = {0}, total = 0;
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
      if (hist[c] == 0)
        continue;
      if (!get_count(&d, m, hist[c], &kc[c])) {
        st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: class %u count exceeds its %u elements", c, hist[c]);
        goto done;
      }
      total += kc[c];
    }
    if (total != k) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: classes hold %llu changes, table says %u",
                      (unsigned long long)total, k);
      goto done;
    }
    start[0] = 0;
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
      start[c + 1] = start[c] + (uint32_t)kc[c];
      if (kc[c] == 0)
        continue;
      unsigned mlog = golomb_log2(hist[c], kc[c]);
      uint64_t next = 0;
      for (uint32_t t = start[c]; t < start[c + 1]; t++) {
        uint64_t gap;
        if (!get_gap(&d, m, mlog, hist[c] - next, &gap) || !get_value(&d, m, c, &delta[t])) {
          st = pulse_fail(PULSE_ERR_POSITION, "chunk: class %u change out of range", c);
          goto done;
        }
        rank[t] = (uint32_t)(next + gap);
        next += gap + 1u;
      }
    }
  }
  if (!pulse_rc_dec_finished_exactly(&d))
    st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: stream length does not match its content");
done:
  free(m);
  return st;
}

/* A plain-model stream of version 3 must hold class 0 alone: its ranks are
 * then positions in storage order. */
static pulse_status v3_decode_ranks(const pulse_v3_model *values,
                                    pulse_pos_model model, const uint32_t *hist,
                                    uint32_t n, const uint8_t *stream,
                                    size_t size, uint32_t k, uint32_t *start,
                                    uint32_t *rank, uint16_t *delta) {
  if (values == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "chunk decode: format version 3 needs the value model");
  uint32_t own[PULSE_CLASS_COUNT + 1];
  uint32_t *st_at = start != NULL ? start : own;
  PULSE_TRY(pulse_chunk3_decode_ranks(values,
                                      model == PULSE_POS_CLASS ? hist : NULL, n,
                                      stream, size, k, st_at, rank, delta));
  if (model == PULSE_POS_PLAIN && st_at[1] != k)
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "chunk v3: a plain-model chunk codes a class other than 0");
  return PULSE_OK;
}

pulse_status pulse_chunk_decode_ranks(
    unsigned version, const pulse_v3_model *values, pulse_pos_model model,
    const uint32_t *hist, uint32_t n, const uint8_t *stream, size_t size,
    uint32_t k, uint32_t *start, uint32_t *rank, uint16_t *delta) {
  if (version == 2)
    return pulse_chunk2_decode_ranks(model, hist, n, stream, size, k, start, rank, delta);
  if (version == 3)
    return v3_decode_ranks(values, model, hist, n, stream, size, k, start, rank,
                           delta);
  if (version != 1)
    return pulse_fail(PULSE_ERR_VERSION, "chunk decode: no format version %u", version);
  return v1_decode_ranks(model, hist, n, stream, size, k, start, rank, delta);
}

uint32_t pulse_chunk_locate(const uint16_t *base, uint32_t n, uint32_t k, const uint32_t *start,
                            const uint32_t *rank, const uint16_t *cdelta, uint64_t first,
                            uint64_t *pos, uint16_t *delta) {
  /* want[c]: the class rank of the next change of class c (or never). */
  uint32_t seen[PULSE_CLASS_COUNT] = {0}, cursor[PULSE_CLASS_COUNT], want[PULSE_CLASS_COUNT];
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    cursor[c] = start[c];
    want[c] = start[c] < start[c + 1] ? rank[start[c]] : UINT32_MAX;
  }
  uint32_t out = 0;
  for (uint32_t i = 0; i < n && out < k; i++) {
    unsigned c = pulse_bf16_class(base[i]);
    if (seen[c]++ == want[c]) {
      pos[out] = first + i;
      delta[out] = cdelta[cursor[c]];
      out++;
      cursor[c]++;
      want[c] = cursor[c] < start[c + 1] ? rank[cursor[c]] : UINT32_MAX;
    }
  }
  return out;
}

/* A class-model stream: class ranks, then positions, through a receiver's
 * class index of the tensor (ix, with `base` the whole tensor, only
 * prefetched) or with a pass over the chunk's base (ix NULL, `base` the
 * chunk's). Version 1 decodes with the class counts, version 2 without:
 * there a rank past its class is caught by locate, which then finds fewer
 * than k (version 1 ranks were checked against the counts). */
static pulse_status decode_class(unsigned version, const pulse_v3_model *values,
                                 const uint16_t *base,
                                 const pulse_class_index *ix, uint64_t first,
                                 uint32_t n, const uint8_t *stream, size_t size,
                                 uint32_t k, uint64_t *pos, uint16_t *delta,
                                 const pulse_chunk_scratch *scratch) {
  uint32_t hist[PULSE_CLASS_COUNT], start[PULSE_CLASS_COUNT + 1];
  int own = scratch == NULL;
  uint32_t *rank = own ? malloc((size_t)k * sizeof *rank + 4) : scratch->rank;
  uint16_t *cdelta = own ? malloc((size_t)k * sizeof *cdelta + 2) : scratch->cdelta;
  pulse_status st = PULSE_OK;
  if (rank == NULL || cdelta == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "chunk decode: %u changes", k);
  if (st == PULSE_OK && version == 1) {
    if (ix != NULL)
      pulse_class_index_hist(ix, first, n, hist);
    else
      pulse_chunk_classify(base, n, NULL, 0, hist, NULL, NULL); /* counts only */
  }
  if (st == PULSE_OK)
    st = pulse_chunk_decode_ranks(version, values, PULSE_POS_CLASS,
                                  version == 1 ? hist : NULL, n, stream, size,
                                  k, start, rank, cdelta);
  if (st == PULSE_OK) {
    uint32_t found =
        ix != NULL
            ? pulse_class_index_locate(ix, first, n, k, start, rank, cdelta, base, pos, delta,
                                       scratch != NULL ? scratch->old_bits : NULL)
            : pulse_chunk_locate_fast(base, n, k, start, rank, cdelta, first, pos, delta);
    if (found != k)
      st = pulse_fail(PULSE_ERR_POSITION, "chunk: a class rank is past the end of its class");
  }
  if (own)
    free(rank), free(cdelta);
  return st;
}

pulse_status pulse_chunk_decode(unsigned version, const pulse_v3_model *values,
                                pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint8_t *stream, size_t size,
                                uint32_t k, uint64_t first, uint64_t *pos,
                                uint16_t *delta) {
  return pulse_chunk_decode_in(version, values, model, base, n, stream, size, k,
                               first, pos, delta, NULL);
}

pulse_status pulse_chunk_decode_in(unsigned version,
                                   const pulse_v3_model *values,
                                   pulse_pos_model model, const uint16_t *base,
                                   uint32_t n, const uint8_t *stream,
                                   size_t size, uint32_t k, uint64_t first,
                                   uint64_t *pos, uint16_t *delta,
                                   const pulse_chunk_scratch *scratch) {
  if (model == PULSE_POS_PLAIN && version == 2)
    return pulse_chunk2_decode_plain(base, n, stream, size, k, first, pos, delta);
  if (model == PULSE_POS_PLAIN) {
    uint32_t *rank = malloc((size_t)k * sizeof *rank + 4);
    if (rank == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "chunk decode: %u changes", k);
    pulse_status st = pulse_chunk_decode_ranks(
        version, values, model, NULL, n, stream, size, k, NULL, rank, delta);
    for (uint32_t j = 0; st == PULSE_OK && j < k; j++)
      pos[j] = first + rank[j];
    free(rank);
    return st;
  }
  if (base == NULL)
    return pulse_fail(PULSE_ERR_ARG, "chunk: the class model needs the base");
  return decode_class(version, values, base, NULL, first, n, stream, size, k,
                      pos, delta, scratch);
}

pulse_status pulse_chunk_decode_indexed(
    unsigned version, const pulse_v3_model *values, const pulse_class_index *ix,
    const uint16_t *data, uint64_t first, uint32_t n, const uint8_t *stream,
    size_t size, uint32_t k, uint64_t *pos, uint16_t *delta,
    const pulse_chunk_scratch *scratch) {
  return decode_class(version, values, data, ix, first, n, stream, size, k, pos,
                      delta, scratch);
}
