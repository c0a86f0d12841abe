/* chunk_v3.c - the chunk coding of format version 3 (chunk_v3_impl.h says
 * what and why): a value model per patch, values rANS-coded against it,
 * class headers and Golomb gaps as in version 2 with cheaper counts and
 * parameters. */
#include <stdlib.h>
#include <string.h>

#include "bitio_impl.h"
#include "chunk_impl.h"
#include "chunk_sink_impl.h"
#include "chunk_v3_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define QUOTIENT_MAX 24u /* unary Golomb quotient before the escape, as v2 */
#define GAMMA_MAX 33u
#define Q_MAX 125u  /* Golomb parameter index: M(125) = 2^31 */
#define Q_FIRST 24u /* prediction of a chunk's first index: M about 54 */
#define Q_SLOPE 5u  /* index steps per class step: density halves per class */
#define COUNT_FIRST 4u /* prediction of a chunk's first count's bit length */
#define PROB_SCALE (1u << PULSE_V3_PROB_BITS)
#define RANS_LOW                                                               \
  (1u << 16) /* the state stays in [2^16, 2^24), renormalized by bytes */

struct pulse_v3_model {
  uint8_t weight[PULSE_CLASS_COUNT][PULSE_V3_TOKENS];
  uint16_t freq[PULSE_CLASS_COUNT][PULSE_V3_TOKENS];
  uint16_t cum[PULSE_CLASS_COUNT][PULSE_V3_TOKENS + 1];
  uint8_t present[PULSE_CLASS_COUNT];
  uint16_t lut_of[PULSE_CLASS_COUNT]; /* index of the class's slot table */
  /* active * PROB_SCALE slots, each packing what decoding it needs in
   * one load: token (bits 0-5), slot - cum (6-17), freq (18-30) */
  uint32_t *lut;
};

/* Half-octave weights: round(2^((w - 1) / 2)), w = 1..31; 0 absent. */
static const uint16_t weight_value[PULSE_V3_WEIGHT_MAX + 1] = {
    0,    1,    1,    2,    3,    4,    6,     8,     11,    16,   23,
    32,   45,   64,   91,   128,  181,  256,   362,   512,   724,  1024,
    1448, 2048, 2896, 4096, 5793, 8192, 11585, 16384, 23170, 32768};

static unsigned bit_length(uint64_t v) {
  return v ? 64u - (unsigned)__builtin_clzll(v) : 0u;
}

static unsigned gamma_len(uint64_t v) {
  return 2u * bit_length(v) - 1u;
}

static uint32_t zigzag(int32_t d) {
  return d >= 0 ? (uint32_t)d << 1 : ((uint32_t)(-d) << 1) - 1u;
}

static int32_t unzigzag(uint32_t z) {
  return (z & 1u) ? -(int32_t)((z + 1u) >> 1) : (int32_t)(z >> 1);
}

/* Golomb parameter of index q: 0, then quarter octaves from 1 to 2^31. */
static uint64_t m_of(unsigned q) {
  static const uint32_t mant[4] = {65536u, 77936u, 92682u,
                                   110218u}; /* 2^(i/4), 16.16 */
  if (q == 0)
    return 0;
  unsigned e = (q - 1u) >> 2;
  return (((uint64_t)mant[(q - 1u) & 3u] << e) + 32768u) >> 16;
}

/* Token and raw bits back to zig-zag - 1. */
static uint32_t token_value(unsigned tok, uint32_t raw) {
  if (tok < PULSE_V3_LITERALS)
    return tok;
  unsigned o = tok - PULSE_V3_LITERALS, l = 4u + (o >> 1);
  return ((2u | (o & 1u)) << (l - 2u)) | raw;
}

static unsigned token_raw_bits(unsigned tok) {
  return tok < PULSE_V3_LITERALS ? 0u : 2u + ((tok - PULSE_V3_LITERALS) >> 1);
}

void pulse_v3_count(pulse_v3_counts *counts, const uint8_t *cls,
                    const uint16_t *delta, uint64_t k) {
  for (uint64_t j = 0; j < k; j++) {
    uint32_t raw;
    unsigned nraw;
    counts->count[cls[j]][pulse_v3_token(delta[j], &raw, &nraw)]++;
  }
}

/* ---------------------------------------------------------------- model */

/* Frequencies summing to PROB_SCALE from the class's weights, and its slot
 * table: integer arithmetic only, so both sides derive the same. */
static void class_tables(pulse_v3_model *m, unsigned c, uint32_t *lut) {
  uint64_t sum = 0;
  unsigned top = 0;
  for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
    sum += weight_value[m->weight[c][t]];
    if (weight_value[m->weight[c][t]] > weight_value[m->weight[c][top]])
      top = t;
  }
  int32_t total = 0;
  for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
    uint64_t w = weight_value[m->weight[c][t]];
    uint32_t f = (uint32_t)(w * PROB_SCALE / sum);
    if (w > 0 && f == 0)
      f = 1;
    m->freq[c][t] = (uint16_t)f;
    total += (int32_t)f;
  }
  /* At most 33 tokens were raised to 1; the top one, at least 1/34 of the
   * weight, holds >= 2048/34 = 60, so it stays positive for any weights. */
  m->freq[c][top] =
      (uint16_t)((int32_t)m->freq[c][top] + (int32_t)PROB_SCALE - total);
  m->cum[c][0] = 0;
  for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
    m->cum[c][t + 1] = (uint16_t)(m->cum[c][t] + m->freq[c][t]);
    for (unsigned s = m->cum[c][t]; s < m->cum[c][t + 1]; s++)
      lut[s] = t | (s - m->cum[c][t]) << 6 | (uint32_t)m->freq[c][t] << 18;
  }
}

static pulse_status finish_model(pulse_v3_model *m) {
  unsigned active = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    active += m->present[c];
  m->lut = malloc((size_t)(active ? active : 1u) * PROB_SCALE * sizeof *m->lut);
  if (m->lut == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "v3 model: %u classes", active);
  unsigned i = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    if (m->present[c]) {
      m->lut_of[c] = (uint16_t)i;
      class_tables(m, c, m->lut + (size_t)i * PROB_SCALE);
      i++;
    }
  return PULSE_OK;
}

/* w = 31 - round(log2((cmax / count)^2)), at least 1: integer compares of
 * count^2 * 2^j against cmax^2 * sqrt 2 (181/128). */
static uint8_t weight_for(uint64_t count, uint64_t cmax) {
  if (count == 0)
    return 0;
  unsigned __int128 x = (unsigned __int128)cmax * cmax * 181u / 128u;
  unsigned __int128 y = (unsigned __int128)count * count;
  unsigned j = 0;
  while (j < PULSE_V3_WEIGHT_MAX - 1u && (y << (j + 1u)) <= x)
    j++;
  return (uint8_t)(PULSE_V3_WEIGHT_MAX - j);
}

pulse_status pulse_v3_model_build(const pulse_v3_counts *counts,
                                  pulse_v3_model **out) {
  *out = NULL;
  pulse_v3_model *m = calloc(1, sizeof *m);
  if (m == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "v3 model");
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    uint64_t cmax = 0;
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++)
      cmax = counts->count[c][t] > cmax ? counts->count[c][t] : cmax;
    if (cmax == 0)
      continue;
    m->present[c] = 1;
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++)
      m->weight[c][t] = weight_for(counts->count[c][t], cmax);
  }
  pulse_status st = finish_model(m);
  if (st != PULSE_OK) {
    pulse_v3_model_free(m);
    return st;
  }
  *out = m;
  return PULSE_OK;
}

void pulse_v3_model_free(pulse_v3_model *model) {
  if (model == NULL)
    return;
  free(model->lut);
  free(model);
}

unsigned pulse_v3_model_freq(const pulse_v3_model *model, unsigned c,
                             unsigned t) {
  return c < PULSE_CLASS_COUNT && t < PULSE_V3_TOKENS && model->present[c]
             ? model->freq[c][t]
             : 0u;
}

static void put_gamma(pulse_bitwriter *w, uint64_t v) { /* v >= 1 */
  unsigned l = bit_length(v) - 1u;
  pulse_bw_ones(w, l);
  pulse_bw_put(w, 0, 1);
  if (l > 32) {
    pulse_bw_put(w, v, 32);
    pulse_bw_put(w, v >> 32, l - 32u);
  } else {
    pulse_bw_put(w, v, l);
  }
}

static int get_gamma(pulse_bitreader *r, uint64_t *out) {
  pulse_br_refill(r);
  unsigned l = (unsigned)__builtin_ctzll(~r->buf | (1ull << GAMMA_MAX));
  if (l >= GAMMA_MAX)
    return 0;
  pulse_br_skip(r, l + 1u);
  pulse_br_refill(r);
  *out = (1ull << l) | pulse_br_peek(r, l);
  pulse_br_skip(r, l);
  return 1;
}

/* Model: gamma(active classes); per class in increasing order gamma(class
 * step), gamma(last token + 1), then each weight up to the last as
 * gamma(zigzag(weight - the previous class's weight) + 1). */
pulse_status pulse_v3_model_write(const pulse_v3_model *m, pulse_bytebuf *out) {
  pulse_bitwriter w;
  pulse_bw_init(&w, out);
  unsigned active = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    active += m->present[c];
  put_gamma(&w, active + 1u);
  uint8_t prev[PULSE_V3_TOKENS] = {0};
  unsigned next = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    if (!m->present[c])
      continue;
    put_gamma(&w, c + 1u - next);
    next = c + 1u;
    unsigned last = 0;
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++)
      if (m->weight[c][t])
        last = t;
    put_gamma(&w, last + 1u);
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
      uint8_t wt = t <= last ? m->weight[c][t] : 0;
      if (t <= last)
        put_gamma(&w, zigzag((int32_t)wt - (int32_t)prev[t]) + 1u);
      prev[t] = wt;
    }
  }
  pulse_bw_flush(&w);
  return out->failed ? pulse_fail(PULSE_ERR_NOMEM, "v3 model: output")
                     : PULSE_OK;
}

pulse_status pulse_v3_model_read(const uint8_t *data, size_t size, size_t *used,
                                 pulse_v3_model **out) {
  *out = NULL;
  pulse_v3_model *m = calloc(1, sizeof *m);
  if (m == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "v3 model");
  pulse_bitreader r;
  pulse_br_init(&r, data, size);
  uint64_t active1, next = 0;
  uint8_t prev[PULSE_V3_TOKENS] = {0};
  const char *why = NULL;
  if (!get_gamma(&r, &active1) || active1 - 1u > PULSE_CLASS_COUNT) {
    why = "bad class count";
    goto bad;
  }
  for (uint64_t a = 0; a + 1u < active1; a++) {
    uint64_t step, last1;
    if (!get_gamma(&r, &step) || step > PULSE_CLASS_COUNT - next) {
      why = "bad class step";
      goto bad;
    }
    unsigned c = (unsigned)(next + step - 1u);
    next = c + 1u;
    if (!get_gamma(&r, &last1) || last1 > PULSE_V3_TOKENS) {
      why = "bad last token";
      goto bad;
    }
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
      int32_t wt = 0;
      if (t < last1) {
        uint64_t z;
        if (!get_gamma(&r, &z) || z - 1u > 2u * PULSE_V3_WEIGHT_MAX) {
          why = "bad weight";
          goto bad;
        }
        wt = (int32_t)prev[t] + unzigzag((uint32_t)(z - 1u));
        if (wt < 0 || wt > (int32_t)PULSE_V3_WEIGHT_MAX) {
          why = "weight out of range";
          goto bad;
        }
      }
      m->weight[c][t] = (uint8_t)wt;
      prev[t] = (uint8_t)wt;
    }
    if (m->weight[c][last1 - 1u] == 0) { /* one form per model */
      why = "last token has no weight";
      goto bad;
    }
    m->present[c] = 1;
  }
  uint64_t bits = pulse_br_consumed(&r);
  if (bits > 8u * (uint64_t)size) {
    why = "truncated";
    goto bad;
  }
  unsigned pad = (unsigned)((8u - bits % 8u) % 8u);
  if (pad && (r.buf & ((1ull << pad) - 1u))) {
    why = "non-zero padding";
    goto bad;
  }
  *used = (size_t)((bits + 7u) / 8u);
  pulse_status st = finish_model(m);
  if (st != PULSE_OK) {
    pulse_v3_model_free(m);
    return st;
  }
  *out = m;
  return PULSE_OK;
bad:
  pulse_v3_model_free(m);
  return pulse_fail(PULSE_ERR_CORRUPT, "v3 model: %s", why);
}

/* ------------------------------------------------------------ encoding */

static uint64_t golomb_len(uint64_t gap, uint64_t m) {
  uint64_t q = gap / m, r = gap - q * m;
  uint64_t n = q < QUOTIENT_MAX
                   ? q + 1u
                   : QUOTIENT_MAX + gamma_len(q - QUOTIENT_MAX + 1u);
  if (m >= 2) {
    unsigned b = bit_length(m - 1u);
    uint64_t u = (1ull << b) - m;
    n += r < u ? b - 1u : b;
  }
  return n;
}

static void put_gap(pulse_bitwriter *w, uint64_t gap, uint64_t m) {
  uint64_t q = gap / m, r = gap - q * m;
  if (q < QUOTIENT_MAX) {
    pulse_bw_put(w, (1ull << q) - 1u, (unsigned)q + 1u);
  } else {
    pulse_bw_ones(w, QUOTIENT_MAX);
    put_gamma(w, q - QUOTIENT_MAX + 1u);
  }
  if (m < 2)
    return;
  unsigned b = bit_length(m - 1u);
  uint64_t u = (1ull << b) - m;
  if (r < u) {
    pulse_bw_put(w, r, b - 1u);
  } else {
    uint64_t x = r + u;
    pulse_bw_put(w, x >> 1, b - 1u);
    pulse_bw_put(w, x & 1u, 1);
  }
}

/* A class's position field: its ordinal o, coded as
 * gamma(zigzag(o - prediction) + 1). o = q >= 0: gaps between changes,
 * Golomb with parameter m_of(q); o = -1 - q: the class is dense, and the
 * holes (unchanged elements of the class before its last change) are
 * coded instead, their count then their gaps with parameter m_of(q). The
 * ordinal grows about Q_SLOPE per class step in both modes (density
 * halves per exponent step), except across classes whose changes all
 * come first (o = 0), which tend to follow each other. */
#define O_MIN (-(int32_t)Q_MAX - 1)

static int32_t predict_o(int first, int32_t o_prev, unsigned c_prev,
                         unsigned c) {
  if (first)
    return 0;
  if (o_prev == 0)
    return 0;
  int64_t p = (int64_t)o_prev + (int64_t)Q_SLOPE * (c - c_prev);
  return p > (int64_t)Q_MAX ? (int32_t)Q_MAX : (int32_t)p;
}

static uint64_t seq_bits(const uint32_t *g, uint32_t n, uint64_t m) {
  uint64_t bits = 0;
  if (m > 0)
    for (uint32_t t = 0; t < n; t++)
      bits += golomb_len(g[t], m);
  return bits;
}

/* The index whose parameter codes gaps g (n of them) in fewest bits: the
 * quarter octaves around round(ln 2 * mean gap), v2's rule. *bits gets
 * the gaps' bits. */
static unsigned choose_q(const uint32_t *g, uint32_t n, uint64_t *bits) {
  uint64_t gap_sum = 0;
  for (uint32_t t = 0; t < n; t++)
    gap_sum += g[t];
  if (gap_sum == 0) {
    *bits = 0;
    return 0;
  }
  uint64_t target = (gap_sum * 45426u / n + 32768u) >> 16;
  unsigned q0 = 1;
  while (q0 < Q_MAX && m_of(q0 + 1u) <= target)
    q0++;
  unsigned best = q0;
  uint64_t best_bits = UINT64_MAX;
  for (unsigned q = q0 > 2 ? q0 - 2u : 1u; q <= q0 + 2u && q <= Q_MAX; q++) {
    uint64_t b = seq_bits(g, n, m_of(q));
    if (b < best_bits) {
      best_bits = b;
      best = q;
    }
  }
  *bits = best_bits;
  return best;
}

/* Gaps between changes (g, k entries) and, while fewer than k, between
 * holes (hg; *h of them; *h = UINT32_MAX when there are k or more). */
static void class_gaps(const uint32_t *rank, const uint32_t *order, uint32_t k,
                       uint32_t *g, uint32_t *hg, uint32_t *h) {
  uint64_t prev = 0;
  uint32_t nh = 0, run = 0; /* changes since the last hole */
  for (uint32_t t = 0; t < k; t++) {
    uint32_t r = rank[order[t]];
    g[t] = (uint32_t)(r - prev);
    if (g[t] > 0 && nh != UINT32_MAX) {
      if ((uint64_t)nh + g[t] >= k) {
        nh = UINT32_MAX;
      } else {
        hg[nh++] = run;
        for (uint32_t x = 1; x < g[t]; x++)
          hg[nh++] = 0;
      }
      run = 0;
    }
    run++;
    prev = (uint64_t)r + 1u;
  }
  *h = nh;
}

pulse_status pulse_chunk3_encode_ranks(const pulse_v3_model *model, uint32_t k,
                                       const uint8_t *cls, const uint32_t *rank,
                                       const uint16_t *delta,
                                       pulse_bytebuf *out,
                                       pulse_v3_stats *stats) {
  pulse_bytebuf part_a = {0}, part_c = {0};
  pulse_bitwriter wa, wc;
  pulse_bw_init(&wa, &part_a);
  pulse_bw_init(&wc, &part_c);
  uint32_t kc[PULSE_CLASS_COUNT] = {0}, start[PULSE_CLASS_COUNT + 1];
  uint32_t *order = malloc((size_t)k * sizeof *order);
  uint8_t *bytes = malloc(2u * (size_t)k + 4u); /* at most 2 per value */
  uint32_t *gaps = malloc(((size_t)k + 1u) * sizeof *gaps);
  uint32_t *holes = malloc(((size_t)k + 1u) * sizeof *holes);
  pulse_status st = PULSE_OK;
  const size_t out_start = out->size;
  if (order == NULL || bytes == NULL || gaps == NULL || holes == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "chunk v3 encode: %u changes", k);
    goto done;
  }
  unsigned active = pulse_chunk_class_order(k, cls, kc, start, order);
  uint64_t raw_total = 0, a_bits = 0, m_bits = 0, count_bits = 0,
           class_bits = gamma_len(active);
  put_gamma(&wa, active);
  unsigned next = 0, c_prev = 0, len_prev = COUNT_FIRST;
  int32_t o_prev = 0;
  int first = 1;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    if (kc[c] == 0)
      continue;
    if (!model->present[c]) {
      st = pulse_fail(PULSE_ERR_ARG,
                      "chunk v3 encode: class %u is not in the model", c);
      goto done;
    }
    put_gamma(&wa, c + 1u - next);
    class_bits += gamma_len(c + 1u - next);
    next = c + 1u;
    /* the count: its bit length against the previous class's, then the
     * bits below its leading one */
    unsigned len = bit_length(kc[c]);
    uint32_t lz = zigzag((int32_t)len - (int32_t)len_prev);
    put_gamma(&wa, lz + 1u);
    pulse_bw_put(&wa, kc[c], len - 1u);
    count_bits += gamma_len(lz + 1u) + len - 1u;
    len_prev = len;
    const uint32_t *ord = order + start[c];
    uint32_t h;
    class_gaps(rank, ord, kc[c], gaps, holes, &h);
    int32_t pred = predict_o(first, o_prev, c_prev, c);
    uint64_t bits_n, bits_h = UINT64_MAX;
    unsigned q = choose_q(gaps, kc[c], &bits_n), qh = 0;
    int32_t o = (int32_t)q;
    bits_n += gamma_len(zigzag(o - pred) + 1u);
    if (h != UINT32_MAX && h > 0) {
      qh = choose_q(holes, h, &bits_h);
      bits_h += gamma_len(zigzag(-1 - (int32_t)qh - pred) + 1u) + gamma_len(h);
    }
    const uint32_t *seq = gaps;
    uint32_t nseq = kc[c];
    if (bits_h < bits_n) {
      o = -1 - (int32_t)qh, q = qh, seq = holes, nseq = h;
    }
    put_gamma(&wa, zigzag(o - pred) + 1u);
    m_bits += gamma_len(zigzag(o - pred) + 1u);
    if (o < 0) {
      put_gamma(&wa, h);
      m_bits += gamma_len(h);
    }
    first = 0, o_prev = o, c_prev = c;
    uint64_t m = m_of(q);
    if (m > 0)
      for (uint32_t t = 0; t < nseq; t++) {
        put_gap(&wa, seq[t], m);
        a_bits += golomb_len(seq[t], m);
      }
    for (uint32_t t = 0; t < kc[c]; t++) {
      uint32_t j = ord[t];
      uint32_t raw;
      unsigned nraw, tok = pulse_v3_token(delta[j], &raw, &nraw);
      if (model->freq[c][tok] == 0) {
        st = pulse_fail(
            PULSE_ERR_ARG,
            "chunk v3 encode: token %u of class %u is not in the model", tok,
            c);
        goto done;
      }
      pulse_bw_put(&wc, raw, nraw);
      raw_total += nraw;
    }
  }
  /* rANS runs backwards: the last value first, so the decoder reads forward. */
  uint32_t x = RANS_LOW;
  size_t nb = 0;
  for (uint32_t i = k; i-- > 0;) {
    uint32_t j = order[i];
    unsigned c = cls[j];
    uint32_t raw;
    unsigned nraw, tok = pulse_v3_token(delta[j], &raw, &nraw);
    uint32_t f = model->freq[c][tok], cum = model->cum[c][tok];
    while (x >=
           f << (24u - PULSE_V3_PROB_BITS)) { /* (RANS_LOW / scale) * 2^8 * f */
      bytes[nb++] = (uint8_t)x;
      x >>= 8;
    }
    x = ((x / f) << PULSE_V3_PROB_BITS) + (x % f) + cum;
  }
  size_t a_size, b_size = 3u + nb;
  pulse_bw_flush(&wa);
  pulse_bw_flush(&wc);
  a_size = part_a.size;
  pulse_bytebuf_varint(out, a_size);
  pulse_bytebuf_put(out, part_a.data, a_size);
  uint8_t state[3] = {(uint8_t)x, (uint8_t)(x >> 8), (uint8_t)(x >> 16)};
  pulse_bytebuf_put(out, state, 3);
  for (size_t i = nb; i-- > 0;)
    pulse_bytebuf_byte(out, bytes[i]);
  for (size_t i = part_c.size; i-- > 0;) /* part C backwards from the end */
    pulse_bytebuf_byte(out, part_c.data[i]);
  if (out->failed || part_a.failed || part_c.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "chunk v3 encode: output buffer");
  if (stats) {
    stats->class_bits += class_bits;
    stats->count_bits += count_bits;
    stats->m_bits += m_bits;
    stats->gap_bits += a_bits;
    stats->value_bytes += b_size;
    stats->pad_bits +=
        8u * a_size - (class_bits + count_bits + m_bits + a_bits);
    stats->pad_bits += 8u * part_c.size - raw_total;
    stats->raw_bits += raw_total;
    stats->frame_bytes += out->size - out_start - a_size - b_size - part_c.size;
  }
done:
  free(order);
  free(bytes);
  free(gaps);
  free(holes);
  pulse_bytebuf_free(&part_a);
  pulse_bytebuf_free(&part_c);
  return st;
}

/* ------------------------------------------------------------ decoding */

static int read_varint(const uint8_t *s, size_t size, size_t *i,
                       uint64_t *out) {
  uint64_t a = 0;
  size_t start = *i;
  for (unsigned shift = 0;; shift += 7) {
    if (*i >= size || shift > 28)
      return 0;
    uint8_t byte = s[(*i)++];
    a |= (uint64_t)(byte & 0x7Fu) << shift;
    if (!(byte & 0x80u)) {
      if (byte == 0 && *i - start > 1) /* not the shortest form */
        return 0;
      break;
    }
  }
  *out = a;
  return 1;
}

/* One Golomb gap (parameter m > 0; b1, u, lomask derived from it); 0 when
 * malformed or when the quotient alone reaches `limit`. */
static inline int get_gap(pulse_bitreader *ra, uint64_t m, unsigned b1,
                          uint64_t u, uint64_t lomask, uint64_t limit,
                          uint64_t *gap) {
  pulse_br_refill(ra);
  unsigned qq = (unsigned)__builtin_ctzll(~ra->buf | (1ull << QUOTIENT_MAX));
  uint64_t quot = qq;
  if (__builtin_expect(qq < QUOTIENT_MAX, 1)) {
    pulse_br_skip(ra, qq + 1u);
  } else {
    pulse_br_skip(ra, QUOTIENT_MAX);
    uint64_t rest;
    if (!get_gamma(ra, &rest))
      return 0;
    quot = rest + QUOTIENT_MAX - 1u;
    if (quot >= limit) /* also keeps quot * m from overflowing */
      return 0;
    pulse_br_refill(ra);
  }
  /* the truncated binary remainder without a branch, as v2 */
  uint64_t lo = ra->buf & lomask, big = lo >= u, hi = (ra->buf >> b1) & 1u;
  uint64_t rem = lo + ((0u - big) & (lo + hi - u));
  pulse_br_skip(ra, b1 + (unsigned)big);
  *gap = quot * m + rem;
  return 1;
}

/* Part C is read from the end of the stream backwards, so it needs no
 * size: its bytes are whatever part B leaves, which the end checks. */
typedef struct {
  const uint8_t *low, *p; /* p: one past the next byte to load, going down */
  uint64_t buf, loaded, overrun;
  unsigned bits;
} back_reader;

static inline void back_refill(back_reader *r) {
  while (r->bits <= 56u) {
    uint64_t byte = 0;
    if (r->p > r->low) {
      byte = *--r->p;
      r->loaded++;
    } else {
      r->overrun++;
    }
    r->buf |= byte << r->bits;
    r->bits += 8u;
  }
}

static inline uint32_t back_get(back_reader *r, unsigned n) { /* n <= 16 */
  back_refill(r);
  uint32_t v = (uint32_t)(r->buf & ((1u << n) - 1u));
  r->buf >>= n;
  r->bits -= n;
  return v;
}

/* Exactly `size` bytes consumed, padding zero. */
static int back_finished_exactly(const back_reader *r, size_t size) {
  uint64_t used = 8u * (r->loaded + r->overrun) - r->bits;
  if (used > 8u * (uint64_t)size || used + 8u <= 8u * (uint64_t)size)
    return 0;
  unsigned pad = (unsigned)(8u * size - used);
  return pad == 0 || (r->buf & ((1ull << pad) - 1u)) == 0;
}

typedef struct {
  uint32_t x;
  const uint8_t *p, *end;
} rans_reader;

/* One value of a class's slot table; 0 when malformed. */
static inline int get_value(rans_reader *rr, back_reader *rc,
                            const uint32_t *lut, uint16_t *out) {
  uint32_t x = rr->x, e = lut[x & (PROB_SCALE - 1u)];
  unsigned tok = e & 63u;
  x = (e >> 18) * (x >> PULSE_V3_PROB_BITS) + ((e >> 6) & (PROB_SCALE - 1u));
  while (x < RANS_LOW) { /* at most twice */
    if (rr->p >= rr->end)
      return 0;
    x = (x << 8) | *rr->p++;
  }
  rr->x = x;
  uint32_t raw = 0;
  unsigned nraw = token_raw_bits(tok);
  if (nraw)
    raw = back_get(rc, nraw);
  uint32_t v = token_value(tok, raw);
  if (v > 0xFFFEu)
    return 0;
  *out = pulse_unzigzag16(v + 1u);
  return 1;
}

/* The decode to the class-major rank form, or (sink non-NULL, rank NULL)
 * through a receiver's class index to positions, change by change
 * (chunk_sink_impl.h). Inlined into both, so the rank form's loop has no
 * sink branches. */
__attribute__((always_inline)) static inline pulse_status
decode3(const pulse_v3_model *model, const uint32_t *hist, uint32_t n,
        const uint8_t *stream, size_t size, uint32_t k, uint32_t *start,
        uint32_t *rank, uint16_t *delta, index_sink *sink) {
  const int resolve = sink && sink->old_bits != NULL && sink->data != NULL;
  if (k == 0 || k > n)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: %u changes in %u elements",
                      k, n);
  size_t i = 0;
  uint64_t a_size;
  if (!read_varint(stream, size, &i, &a_size) || a_size == 0 ||
      a_size > size - i || size - i - a_size < 3)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: bad part sizes");
  pulse_bitreader ra;
  pulse_br_init(&ra, stream + i, (size_t)a_size);
  const uint8_t *pb = stream + i + a_size, *end = stream + size;
  back_reader rc = {pb + 3, end, 0, 0, 0, 0};
  rans_reader rr = {pb[0] | (uint32_t)pb[1] << 8 | (uint32_t)pb[2] << 16,
                    pb + 3, end};
  if (rr.x < RANS_LOW)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: bad value coder state");
  uint64_t active, total = 0, next = 0;
  if (!get_gamma(&ra, &active) || active == 0 || active > PULSE_CLASS_COUNT)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: bad class count");
  for (unsigned c = 0; c <= PULSE_CLASS_COUNT; c++)
    start[c] = 0;
  unsigned c_prev = 0, len_prev = COUNT_FIRST;
  int32_t o_prev = 0;
  for (uint64_t a = 0; a < active; a++) {
    uint64_t step, lz, oz;
    if (!get_gamma(&ra, &step) || step > PULSE_CLASS_COUNT - next ||
        !get_gamma(&ra, &lz) || lz - 1u > 64u)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "chunk v3: bad class or class count");
    unsigned c = (unsigned)(next + step - 1u);
    next = c + 1u;
    int32_t len = (int32_t)len_prev + unzigzag((uint32_t)(lz - 1u));
    if (len < 1 || len > (int32_t)bit_length(k - total))
      return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: class %u count too large",
                        c);
    len_prev = (unsigned)len;
    pulse_br_refill(&ra);
    uint64_t kc = (1ull << (len - 1)) | pulse_br_peek(&ra, (unsigned)len - 1u);
    pulse_br_skip(&ra, (unsigned)len - 1u);
    const uint64_t limit = hist ? hist[c] : n;
    if (kc > k - total || kc > limit)
      return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: class %u count too large",
                        c);
    if (!model->present[c])
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "chunk v3: class %u is not in the model", c);
    int32_t pred = predict_o(a == 0, o_prev, c_prev, c);
    if (!get_gamma(&ra, &oz) || oz - 1u > 4u * Q_MAX + 4u)
      return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: bad Golomb parameter");
    int32_t o = pred + unzigzag((uint32_t)(oz - 1u));
    if (o < O_MIN || o > (int32_t)Q_MAX)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "chunk v3: Golomb parameter out of range");
    o_prev = o, c_prev = c;
    uint64_t holes = 0;
    if (o < 0 && (!get_gamma(&ra, &holes) || holes > limit - kc))
      return pulse_fail(PULSE_ERR_CORRUPT, "chunk v3: bad hole count");
    const uint64_t m = m_of(o < 0 ? (unsigned)(-1 - o) : (unsigned)o);
    const unsigned b1 = m >= 2 ? bit_length(m - 1u) - 1u : 0u;
    const uint64_t u = m >= 2 ? (2ull << b1) - m : 1u,
                   lomask = (1ull << b1) - 1u;
    const uint32_t *lut = model->lut + (size_t)model->lut_of[c] * PROB_SCALE;
    uint32_t *rk = sink ? NULL : rank + total;
    uint16_t *dl = delta + total;
    sink_walk walk = {0};
    uint64_t *spos = NULL;
    if (sink) {
      sink_walk_start(sink, c, &walk);
      spos = sink->pos + total;
    }
    if (o >= 0) { /* gaps between changes: the hot loop, readers in locals */
      uint64_t pos = 0, buf = ra.buf;
      unsigned bits = ra.bits;
      const uint8_t *p = ra.p, *const end_a = ra.end;
      uint32_t x = rr.x;
      const uint8_t *wp = rr.p, *const wend = rr.end;
      int ok = 0;
#define SAVE_A() (ra.buf = buf, ra.bits = bits, ra.p = p)
#define LOAD_A() (buf = ra.buf, bits = ra.bits, p = ra.p)
      for (uint64_t t = 0; t < kc; t++) {
        uint64_t gap = 0;
        if (m > 0) {
          if (end_a - p >= 8) {
            buf |= pulse_load_le64(p) << bits;
            p += (63u - bits) >> 3;
            bits |= 56u;
          } else {
            SAVE_A();
            pulse_br_refill(&ra);
            LOAD_A();
          }
          unsigned qq =
              (unsigned)__builtin_ctzll(~buf | (1ull << QUOTIENT_MAX));
          if (__builtin_expect(qq < QUOTIENT_MAX, 1)) {
            buf >>= qq + 1u;
            bits -= qq + 1u;
            uint64_t lo = buf & lomask, big = lo >= u, hi = (buf >> b1) & 1u;
            uint64_t rem = lo + ((0u - big) & (lo + hi - u));
            buf >>= b1 + big;
            bits -= b1 + (unsigned)big;
            gap = qq * m + rem;
          } else {
            SAVE_A();
            int good = get_gap(&ra, m, b1, u, lomask, limit, &gap);
            LOAD_A();
            if (!good)
              goto out_normal;
          }
        }
        if (gap >= limit - pos)
          goto out_normal;
        pos += gap;
        if (sink) {
          if (!sink_walk_slot(sink, &walk, (uint32_t)pos, spos + t))
            goto out_normal; /* past the end of its class */
        } else {
          rk[t] = (uint32_t)pos;
        }
        pos++;
        uint32_t e = lut[x & (PROB_SCALE - 1u)];
        unsigned tok = e & 63u;
        x = (e >> 18) * (x >> PULSE_V3_PROB_BITS) +
            ((e >> 6) & (PROB_SCALE - 1u));
        if (x < RANS_LOW) { /* one byte, or two: the second is rare */
          if (wp >= wend)
            goto out_normal;
          x = (x << 8) | *wp++;
          if (__builtin_expect(x < RANS_LOW, 0)) {
            if (wp >= wend)
              goto out_normal;
            x = (x << 8) | *wp++;
          }
        }
        if (__builtin_expect(tok < PULSE_V3_LITERALS, 1)) {
          dl[t] = pulse_unzigzag16(tok + 1u);
        } else {
          uint32_t v = token_value(tok, back_get(&rc, token_raw_bits(tok)));
          if (v > 0xFFFEu)
            goto out_normal;
          dl[t] = pulse_unzigzag16(v + 1u);
        }
        if (sink)
          sink_push(sink, resolve);
      }
      ok = 1;
    out_normal:
      SAVE_A();
#undef SAVE_A
#undef LOAD_A
      rr.x = x, rr.p = wp;
      if (!ok)
        return pulse_fail(PULSE_ERR_POSITION,
                          "chunk v3: class %u change or value badly coded", c);
    } else { /* gaps between holes: the changes fill the rest up to the last */
      const uint64_t span = kc + holes; /* <= limit */
      uint64_t left = holes, hole = UINT64_MAX, r = 0;
      if (left > 0) {
        uint64_t gap = 0;
        if (m > 0 && !get_gap(&ra, m, b1, u, lomask, span, &gap))
          return pulse_fail(PULSE_ERR_POSITION,
                            "chunk v3: bad hole gap in class %u", c);
        hole = gap, left--;
      }
      for (uint64_t t = 0; t < kc; t++) {
        while (r == hole) {
          r++;
          hole = UINT64_MAX;
          if (left > 0) {
            uint64_t gap = 0;
            if (m > 0 && !get_gap(&ra, m, b1, u, lomask, span, &gap))
              return pulse_fail(PULSE_ERR_POSITION,
                                "chunk v3: bad hole gap in class %u", c);
            if (gap >= span - r)
              return pulse_fail(PULSE_ERR_POSITION,
                                "chunk v3: class %u hole out of range", c);
            hole = r + gap, left--;
          }
        }
        if (sink) {
          if (!sink_walk_slot(sink, &walk, (uint32_t)r, spos + t))
            return pulse_fail(PULSE_ERR_POSITION,
                              "chunk v3: class %u rank past its end", c);
        } else {
          rk[t] = (uint32_t)r;
        }
        r++;
        if (!get_value(&rr, &rc, lut, dl + t))
          return pulse_fail(PULSE_ERR_CORRUPT,
                            "chunk v3: bad value in class %u", c);
        if (sink)
          sink_push(sink, resolve);
      }
      if (left > 0 || hole != UINT64_MAX) /* a hole after the last change */
        return pulse_fail(PULSE_ERR_POSITION,
                          "chunk v3: class %u holes past its changes", c);
    }
    start[c + 1] = (uint32_t)kc;
    total += kc;
  }
  if (total != k)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "chunk v3: classes hold %llu changes, table says %u",
                      (unsigned long long)total, k);
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    start[c + 1] += start[c];
  if (!pulse_br_finished_exactly(&ra) ||
      !back_finished_exactly(&rc, (size_t)(end - rr.p)) || rr.x != RANS_LOW)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "chunk v3: stream length does not match its content");
  return PULSE_OK;
}

pulse_status pulse_chunk3_decode_ranks(const pulse_v3_model *model,
                                       const uint32_t *hist, uint32_t n,
                                       const uint8_t *stream, size_t size,
                                       uint32_t k, uint32_t *start,
                                       uint32_t *rank, uint16_t *delta) {
  return decode3(model, hist, n, stream, size, k, start, rank, delta, NULL);
}

/* Any failure (a bad stream, a rank past the end of its class) returns the
 * reference's status: the chunk is decoded again the two-pass way, which
 * reports the error it meets first (a hostile patch pays). */
pulse_status pulse_chunk3_decode_indexed(const pulse_v3_model *model,
                                         const pulse_class_index *ix,
                                         const uint16_t *data, uint64_t first,
                                         uint32_t n, const uint8_t *stream,
                                         size_t size, uint32_t k, uint64_t *pos,
                                         uint16_t *delta, uint16_t *old_bits,
                                         const pulse_chunk_scratch *scratch) {
  uint32_t start[PULSE_CLASS_COUNT + 1];
  index_sink sink = {.ix = ix,
                     .data = data,
                     .b0 = first >> PULSE_CLASS_BLOCK_LOG2,
                     .bend = (first + n + PULSE_CLASS_BLOCK - 1) >>
                             PULSE_CLASS_BLOCK_LOG2,
                     .pos = pos,
                     .delta = delta,
                     .old_bits = old_bits};
  if (decode3(model, NULL, n, stream, size, k, start, NULL, delta, &sink) ==
      PULSE_OK) {
    sink_drain(&sink);
    return PULSE_OK;
  }
  return pulse_chunk_decode_indexed(3, model, ix, data, first, n, stream, size,
                                    k, pos, delta, scratch);
}
