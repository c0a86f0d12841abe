/* chunk_fast.c - the version 2 chunk streams (docs/formats/patch.md, "Version 2 chunk
 * streams"): the same class-rank transform as version 1, coded with static
 * codes a decoder reads with a few table lookups per change instead of one
 * adaptive binary decision per bit.
 *
 * Per class: its count, a Golomb parameter M chosen by the encoder from the
 * class's own gaps (so a decoder needs no class counts), and a value code
 * (default, constant, or canonical prefix code of at most 8 bits). Gaps are
 * Golomb codes (unary quotient, truncated binary remainder): the optimal
 * prefix code for geometric gaps, which is what rank gaps within a class
 * are when changes are independent given the exponent. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bitio_impl.h"
#include "chunk_fast_impl.h"
#include "chunk_impl.h"
#include "chunk_sink_impl.h"
#include "class_index_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define QUOTIENT_MAX 24u  /* unary quotient length before the escape */
#define GAMMA_MAX 33u     /* longest gamma prefix any field needs */
#define TOKENS 16u        /* value tokens: 0..14 literal, 15 escape */
#define TOKEN_ESCAPE 15u
#define CODE_LEN_MAX 8u   /* longest value codeword */
#define M_MAX (1ull << 31)

enum { VALUE_CODE_DEFAULT = 0, VALUE_CODE_CUSTOM = 1, VALUE_CODE_CONSTANT = 2 };

/* The default value code: zig-zag deltas 1, 2 (tokens 0, 1) most likely,
 * halving every two tokens; a complete code (Kraft sum exactly 1). */
static const uint8_t default_lengths[TOKENS] = {2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 8, 8};

static unsigned bit_length(uint64_t v) {
  return v ? 64u - (unsigned)__builtin_clzll(v) : 0u;
}

static unsigned reverse_bits(unsigned v, unsigned n) {
  unsigned r = 0;
  for (unsigned i = 0; i < n; i++)
    r |= ((v >> i) & 1u) << (n - 1u - i);
  return r;
}

/* Canonical codewords (bit-reversed, as the reader sees them) for lengths. */
static void canonical_codes(const uint8_t len[TOKENS], uint16_t code[TOKENS]) {
  unsigned count[CODE_LEN_MAX + 1] = {0}, next[CODE_LEN_MAX + 2];
  for (unsigned t = 0; t < TOKENS; t++)
    count[len[t]]++;
  count[0] = 0;
  unsigned c = 0;
  for (unsigned l = 1; l <= CODE_LEN_MAX; l++) {
    c = (c + count[l - 1]) << 1;
    next[l] = c;
  }
  for (unsigned t = 0; t < TOKENS; t++)
    code[t] = len[t] ? (uint16_t)reverse_bits(next[len[t]]++, len[t]) : 0;
}

/* ------------------------------------------------------------ encoding */

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

/* Golomb parameter from the gaps: round(ln 2 * mean gap), the optimum for
 * geometric gaps; 0 when every gap is 0 (nothing to code). */
static uint64_t choose_m(uint64_t gap_sum, uint64_t k) {
  if (gap_sum == 0)
    return 0;
  uint64_t m = (gap_sum * 45426u / k + 32768u) >> 16; /* 45426 / 2^16 = ln 2 */
  if (m < 1)
    m = 1;
  return m > M_MAX ? M_MAX : m;
}

/* Gaps are rank differences and m <= M_MAX: both fit 32 bits, whose
 * division is the cheaper one. */
static void put_gap(pulse_bitwriter *w, uint32_t gap, uint32_t m, unsigned b, uint32_t u) {
  uint32_t q = gap / m, r = gap - q * m;
  if (q < QUOTIENT_MAX) { /* q ones, then the zero: one append */
    pulse_bw_put(w, (1u << q) - 1u, q + 1u);
  } else {
    pulse_bw_ones(w, QUOTIENT_MAX);
    put_gamma(w, q - QUOTIENT_MAX + 1u);
  }
  if (m < 2)
    return;
  if (r < u) {
    pulse_bw_put(w, r, b - 1u);
  } else {
    uint32_t x = r + u;
    pulse_bw_put(w, x >> 1, b - 1u);
    pulse_bw_put(w, x & 1u, 1);
  }
}

static unsigned value_token(uint16_t delta) {
  uint32_t v = pulse_zigzag16(delta) - 1u; /* delta != 0 */
  return v < TOKEN_ESCAPE ? v : TOKEN_ESCAPE;
}

/* Huffman code lengths for the token counts, at most CODE_LEN_MAX bits
 * (counts are halved until the tree is shallow enough). */
static void huffman_lengths(const uint64_t count_in[TOKENS], uint8_t len[TOKENS]) {
  uint64_t count[TOKENS];
  memcpy(count, count_in, sizeof count);
  for (;;) {
    uint64_t weight[2 * TOKENS];
    int parent[2 * TOKENS], alive[2 * TOKENS];
    unsigned nodes = 0, used = 0;
    for (unsigned t = 0; t < TOKENS; t++) {
      weight[t] = count[t];
      parent[t] = -1;
      alive[t] = count[t] > 0;
      used += count[t] > 0;
    }
    nodes = TOKENS;
    memset(len, 0, TOKENS);
    if (used < 2) { /* a lone token still needs one bit in a prefix code */
      for (unsigned t = 0; t < TOKENS; t++)
        if (count[t] > 0)
          len[t] = 1;
      return;
    }
    for (unsigned merges = 0; merges + 1 < used; merges++) {
      int a = -1, b = -1;
      for (unsigned i = 0; i < nodes; i++) {
        if (!alive[i])
          continue;
        if (a < 0 || weight[i] < weight[a]) {
          b = a;
          a = (int)i;
        } else if (b < 0 || weight[i] < weight[b]) {
          b = (int)i;
        }
      }
      weight[nodes] = weight[a] + weight[b];
      parent[nodes] = -1;
      alive[nodes] = 1;
      alive[a] = alive[b] = 0;
      parent[a] = parent[b] = (int)nodes;
      nodes++;
    }
    unsigned deepest = 0;
    for (unsigned t = 0; t < TOKENS; t++) {
      if (count[t] == 0)
        continue;
      unsigned d = 0;
      for (int x = (int)t; parent[x] >= 0; x = parent[x])
        d++;
      len[t] = (uint8_t)d;
      deepest = d > deepest ? d : deepest;
    }
    if (deepest <= CODE_LEN_MAX)
      return;
    for (unsigned t = 0; t < TOKENS; t++)
      if (count[t] > 0)
        count[t] = (count[t] >> 1) | 1u;
  }
}

/* Chooses and writes the value code of one class; fills its codewords. */
static void put_value_code(pulse_bitwriter *w, const uint64_t count[TOKENS], uint8_t len[TOKENS],
                           uint16_t code[TOKENS], unsigned *constant) {
  unsigned used = 0, last = 0, only = 0;
  for (unsigned t = 0; t < TOKENS; t++)
    if (count[t] > 0) {
      used++;
      last = t;
      only = t;
    }
  *constant = TOKENS;
  if (used == 1) {
    pulse_bw_put(w, VALUE_CODE_CONSTANT, 2);
    pulse_bw_put(w, only, 4);
    *constant = only;
    return;
  }
  uint8_t huff[TOKENS];
  huffman_lengths(count, huff);
  uint64_t cost_default = 0, cost_custom = 4u + 4u * (last + 1u);
  for (unsigned t = 0; t < TOKENS; t++) {
    cost_default += count[t] * default_lengths[t];
    cost_custom += count[t] * huff[t];
  }
  if (cost_custom < cost_default) {
    pulse_bw_put(w, VALUE_CODE_CUSTOM, 2);
    pulse_bw_put(w, last, 4);
    for (unsigned t = 0; t <= last; t++)
      pulse_bw_put(w, huff[t], 4);
    memcpy(len, huff, TOKENS);
  } else {
    pulse_bw_put(w, VALUE_CODE_DEFAULT, 2);
    memcpy(len, default_lengths, TOKENS);
  }
  canonical_codes(len, code);
}

/* Codes the changes of one class: ranks increasing (rank[order[t]]). */
static void put_class(pulse_bitwriter *w, pulse_bitwriter *wv, const uint32_t *rank,
                      const uint16_t *delta, const uint32_t *order, uint32_t k) {
  uint64_t gap_sum = 0, prev = 0, count[TOKENS] = {0};
  for (uint32_t t = 0; t < k; t++) {
    uint32_t j = order ? order[t] : t;
    gap_sum += rank[j] - prev;
    prev = (uint64_t)rank[j] + 1u;
    count[value_token(delta[j])]++;
  }
  uint64_t m = choose_m(gap_sum, k);
  put_gamma(w, m + 1u);
  uint8_t len[TOKENS];
  uint16_t code[TOKENS];
  unsigned constant;
  put_value_code(w, count, len, code, &constant);
  unsigned b = m >= 2 ? bit_length(m - 1u) : 0u;
  uint64_t u = m >= 2 ? (1ull << b) - m : 0u;
  prev = 0;
  for (uint32_t t = 0; t < k; t++) {
    uint32_t j = order ? order[t] : t;
    if (m > 0)
      put_gap(w, (uint32_t)(rank[j] - prev), (uint32_t)m, b, (uint32_t)u);
    prev = (uint64_t)rank[j] + 1u;
    unsigned tok = value_token(delta[j]);
    if (constant == TOKENS)
      pulse_bw_put(wv, code[tok], len[tok]);
    if (tok == TOKEN_ESCAPE) /* the zig-zag beyond the literal tokens */
      put_gamma(wv, pulse_zigzag16(delta[j]) - TOKEN_ESCAPE);
  }
}

pulse_status pulse_chunk2_encode_ranks(pulse_pos_model model, uint32_t k, const uint8_t *cls,
                                       const uint32_t *rank, const uint16_t *delta,
                                       pulse_bytebuf *out) {
  /* Two parts, so a decoder reads positions and values as two independent
   * chains: part A (class headers, gaps) and part B (value tokens). */
  pulse_bytebuf part_a = {0}, part_b = {0};
  pulse_bitwriter w, wv;
  pulse_bw_init(&w, &part_a);
  pulse_bw_init(&wv, &part_b);
  pulse_status st = PULSE_OK;
  if (model == PULSE_POS_PLAIN) {
    put_class(&w, &wv, rank, delta, NULL, k);
  } else {
    uint32_t kc[PULSE_CLASS_COUNT] = {0}, start[PULSE_CLASS_COUNT + 1];
    uint32_t *order = malloc((size_t)k * sizeof *order);
    if (order == NULL) {
      pulse_bytebuf_free(&part_a), pulse_bytebuf_free(&part_b);
      return pulse_fail(PULSE_ERR_NOMEM, "chunk encode: %u changes", k);
    }
    unsigned active = pulse_chunk_class_order(k, cls, kc, start, order);
    put_gamma(&w, active);
    unsigned prev = 0;
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
      if (kc[c] == 0)
        continue;
      put_gamma(&w, c + 1u - prev);
      prev = c + 1u;
      put_gamma(&w, kc[c]);
      put_class(&w, &wv, rank, delta, order + start[c], kc[c]);
    }
    free(order);
  }
  pulse_bw_flush(&w);
  pulse_bw_flush(&wv);
  pulse_bytebuf_varint(out, part_a.size);
  if (part_a.size)
    pulse_bytebuf_put(out, part_a.data, part_a.size);
  if (part_b.size)
    pulse_bytebuf_put(out, part_b.data, part_b.size);
  if (out->failed || part_a.failed || part_b.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "chunk encode: output buffer");
  pulse_bytebuf_free(&part_a), pulse_bytebuf_free(&part_b);
  return st;
}

/* ------------------------------------------------------------ decoding */

/* 0 when the prefix is longer than any field may be. */
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

typedef struct {
  uint8_t token, len; /* len 0: no codeword starts with these bits */
} value_entry;

typedef struct {
  unsigned bits;      /* table index width (longest codeword) */
  unsigned constant;  /* the token of a constant code, else TOKENS */
  const value_entry *table; /* `own`, or the default code's shared table */
  value_entry own[1u << CODE_LEN_MAX];
} value_code;

/* Fills table (2^bits entries) from codeword lengths; returns bits, the
 * longest codeword (0: none, or they do not fit: Kraft). An incomplete code
 * leaves entries that no codeword reaches (len 0); reading one is an error. */
static unsigned value_table(const uint8_t len[TOKENS], value_entry *table) {
  unsigned kraft = 0, longest = 0;
  for (unsigned t = 0; t < TOKENS; t++)
    if (len[t]) {
      kraft += 1u << (CODE_LEN_MAX - len[t]);
      longest = len[t] > longest ? len[t] : longest;
    }
  if (longest == 0 || kraft > (1u << CODE_LEN_MAX))
    return 0;
  uint16_t code[TOKENS];
  canonical_codes(len, code);
  memset(table, 0, sizeof(value_entry) << longest);
  for (unsigned t = 0; t < TOKENS; t++)
    if (len[t])
      for (unsigned i = code[t]; i < (1u << longest); i += 1u << len[t])
        table[i] = (value_entry){(uint8_t)t, len[t]};
  return longest;
}

/* The default code's table, built once: most classes use it, and building
 * a table per class per chunk cost a tenth of the decode. */
static value_entry default_table[1u << CODE_LEN_MAX];
static unsigned default_bits;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;
static void default_table_init(void) { default_bits = value_table(default_lengths, default_table); }

static int get_value_code(pulse_bitreader *r, value_code *vc) {
  pulse_br_refill(r);
  unsigned kind = (unsigned)pulse_br_peek(r, 2);
  pulse_br_skip(r, 2);
  uint8_t len[TOKENS] = {0};
  vc->constant = TOKENS;
  if (kind == VALUE_CODE_CONSTANT) {
    vc->constant = (unsigned)pulse_br_peek(r, 4);
    pulse_br_skip(r, 4);
    vc->bits = 0;
    return 1;
  }
  if (kind == VALUE_CODE_DEFAULT) {
    pthread_once(&default_once, default_table_init);
    vc->bits = default_bits;
    vc->table = default_table;
    return 1;
  } else if (kind == VALUE_CODE_CUSTOM) {
    unsigned last = (unsigned)pulse_br_peek(r, 4);
    pulse_br_skip(r, 4);
    for (unsigned t = 0; t <= last; t++) {
      pulse_br_refill(r);
      len[t] = (uint8_t)pulse_br_peek(r, 4);
      pulse_br_skip(r, 4);
      if (len[t] > CODE_LEN_MAX)
        return 0;
    }
  } else {
    return 0;
  }
  vc->bits = value_table(len, vc->own);
  vc->table = vc->own;
  return vc->bits != 0;
}

/* Decodes k changes of one class into delta and, ranks below `limit`, either
 * rank or (pos non-NULL) pos = first + rank, or (sink non-NULL) the sink's
 * positions through its class index. The class header and the gaps
 * come from part A (ra), the values from part B (rb).
 *
 * The hot loop keeps both bit readers in locals (the structs are synced
 * around the rare slow paths: the last 8 bytes of a part, escapes); the two
 * readers are independent chains the CPU runs side by side. The truncated
 * binary remainder is read without a branch: which of its two lengths a
 * remainder has is a coin flip the branch predictor would lose. */
/* Inlined into each caller, so the NULL arguments of each call remove their
 * branches from the loop (measured: 166 -> 190 M changes/s, class model). */
__attribute__((always_inline)) static inline int
get_class(pulse_bitreader *ra, pulse_bitreader *rb, value_code *vc, uint64_t limit, uint32_t k,
          uint32_t *rank, uint64_t *pos, uint64_t first, uint16_t *delta,
          const uint16_t *prefetch, index_sink *sink) {
  uint64_t m1;
  if (!get_gamma(ra, &m1) || m1 - 1u > M_MAX || !get_value_code(ra, vc))
    return 0;
  const uint64_t m = m1 - 1u;
  /* Remainder: short codewords of b1 bits for values below u, else b1 + 1
   * bits. m == 1 has no remainder: b1 = 0 and u = 1 make it read 0 bits. */
  const unsigned b1 = m >= 2 ? bit_length(m - 1u) - 1u : 0u;
  const uint64_t u = m >= 2 ? (2ull << b1) - m : 1u;
  const uint64_t lomask = (1ull << b1) - 1u;
  const value_entry *table = vc->table;
  const uint64_t vmask = (1ull << vc->bits) - 1u;
  const unsigned constant = vc->constant;
  const uint8_t *const end_a = ra->end, *const end_b = rb->end;
  uint64_t buf = ra->buf, vbuf = rb->buf, next = 0;
  unsigned bits = ra->bits, vbits = rb->bits;
  const uint8_t *p = ra->p, *vp = rb->p;
#define SAVE_A() (ra->buf = buf, ra->bits = bits, ra->p = p)
#define LOAD_A() (buf = ra->buf, bits = ra->bits, p = ra->p)
#define SAVE_B() (rb->buf = vbuf, rb->bits = vbits, rb->p = vp)
#define LOAD_B() (vbuf = rb->buf, vbits = rb->bits, vp = rb->p)
#define REFILL(B, BITS, P, END, SAVE, LOAD, R)                                 \
  do {                                                                         \
    if ((END) - (P) >= 8) {                                                    \
      B |= pulse_load_le64(P) << (BITS);                                       \
      P += (63u - (BITS)) >> 3;                                                \
      BITS |= 56u;                                                             \
    } else {                                                                   \
      SAVE;                                                                    \
      pulse_br_refill(R);                                                      \
      LOAD;                                                                    \
    }                                                                          \
  } while (0)
  /* The sink's walk over the blocks (class_index.c's locate): `before`
   * counts the class's elements in the blocks passed, so rank - before
   * indexes the current block's run. */
  uint64_t sb = 0;
  const uint16_t *srun = NULL;
  uint32_t sbefore = 0, ssize = 0;
  const unsigned sc = sink ? sink->cls : 0;
  if (sink) {
    sb = sink->b0;
    srun = sink->ix->run + sb * PULSE_CLASS_RUNS;
    ssize = (uint32_t)(srun[sc + 1] - srun[sc]);
    pos = sink->pos + sink->out;
    delta = sink->delta + sink->out;
  }
  const int resolve = sink && sink->old_bits != NULL && sink->data != NULL;
  int ok = 0;
  for (uint32_t t = 0; t < k; t++) {
    uint64_t gap = 0;
    if (m > 0) {
      REFILL(buf, bits, p, end_a, SAVE_A(), LOAD_A(), ra);
      unsigned q = (unsigned)__builtin_ctzll(~buf | (1ull << QUOTIENT_MAX));
      uint64_t quot = q;
      /* A quotient below QUOTIENT_MAX times m <= M_MAX cannot overflow: the
       * gap's own range check below suffices. */
      if (__builtin_expect(q < QUOTIENT_MAX, 1)) {
        buf >>= q + 1u;
        bits -= q + 1u;
      } else {
        buf >>= QUOTIENT_MAX;
        bits -= QUOTIENT_MAX;
        uint64_t rest;
        SAVE_A();
        int good = get_gamma(ra, &rest);
        if (good)
          pulse_br_refill(ra);
        LOAD_A();
        if (!good)
          goto out;
        quot = rest + QUOTIENT_MAX - 1u;
        if (quot >= limit) /* also keeps quot * m from overflowing */
          goto out;
      }
      /* rem = lo, or 2 lo + hi - u for a long codeword: by mask, as
       * compilers turn a ternary here back into the branch. */
      uint64_t lo = buf & lomask;
      uint64_t big = lo >= u;
      uint64_t hi = (buf >> b1) & 1u;
      uint64_t rem = lo + ((0u - big) & (lo + hi - u));
      buf >>= b1 + big;
      bits -= b1 + (unsigned)big;
      gap = quot * m + rem;
    }
    if (gap >= limit - next)
      goto out;
    next += gap;
    if (sink) {
      uint32_t r = (uint32_t)next;
      while (r - sbefore >= ssize) {
        sbefore += ssize;
        if (++sb == sink->bend)
          goto out; /* past the end of its class */
        srun = sink->ix->run + sb * PULSE_CLASS_RUNS;
        ssize = (uint32_t)(srun[sc + 1] - srun[sc]);
      }
      /* For now the slot in the offsets (its block is the slot's block). */
      uint64_t slot = (sb << PULSE_CLASS_BLOCK_LOG2) + srun[sc] + (r - sbefore);
      __builtin_prefetch(sink->ix->offset + slot, 0, 1);
      pos[t] = slot;
    } else if (pos) {
      pos[t] = first + next;
    } else {
      rank[t] = (uint32_t)next;
    }
    if (prefetch) /* the caller reads the old bits next: start the miss now */
      __builtin_prefetch(prefetch + next);
    next++;
    unsigned tok = constant;
    if (tok == TOKENS) {
      REFILL(vbuf, vbits, vp, end_b, SAVE_B(), LOAD_B(), rb);
      value_entry e = table[vbuf & vmask];
      if (e.len == 0)
        goto out;
      vbuf >>= e.len;
      vbits -= e.len;
      tok = e.token;
    }
    uint32_t v = tok;
    if (__builtin_expect(tok == TOKEN_ESCAPE, 0)) {
      uint64_t rest;
      SAVE_B();
      int good = get_gamma(rb, &rest);
      LOAD_B();
      if (!good || rest > 0xFFFFu - TOKEN_ESCAPE)
        goto out;
      v = (uint32_t)(rest + TOKEN_ESCAPE - 1u);
    }
    delta[t] = pulse_unzigzag16(v + 1u);
    if (sink) {
      uint32_t o = ++sink->out;
      if (o > SINK_LOCATE_LAG) {
        sink_finish(sink, sink->done++);
        if (resolve && sink->done > SINK_RESOLVE_LAG)
          sink_resolve(sink, sink->resolved++);
      }
    }
  }
  ok = 1;
out:
  SAVE_A();
  SAVE_B();
  return ok;
#undef SAVE_A
#undef LOAD_A
#undef SAVE_B
#undef LOAD_B
#undef REFILL
}

/* Splits a stream into its two parts: a minimal varint, the size of part A
 * (at least 1 byte), then part A, then part B (the rest). */
static int open_parts(const uint8_t *stream, size_t size, pulse_bitreader *ra,
                      pulse_bitreader *rb) {
  uint64_t a = 0;
  size_t i = 0;
  for (unsigned shift = 0;; shift += 7) {
    if (i >= size || shift > 28)
      return 0;
    uint8_t byte = stream[i++];
    a |= (uint64_t)(byte & 0x7Fu) << shift;
    if (!(byte & 0x80u)) {
      if (byte == 0 && i > 1) /* not the shortest form */
        return 0;
      break;
    }
  }
  if (a == 0 || a > size - i)
    return 0;
  pulse_br_init(ra, stream + i, (size_t)a);
  pulse_br_init(rb, stream + i + a, size - i - (size_t)a);
  return 1;
}

pulse_status pulse_chunk2_decode_ranks(pulse_pos_model model, const uint32_t *hist,
                                       uint32_t n, const uint8_t *stream, size_t size,
                                       uint32_t k, uint32_t *start, uint32_t *rank,
                                       uint16_t *delta) {
  if (k == 0 || k > n)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: %u changes in %u elements", k, n);
  value_code code, *vc = &code;
  pulse_bitreader r, rv;
  if (!open_parts(stream, size, &r, &rv))
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: bad part sizes");
  pulse_status st = PULSE_OK;
  if (model == PULSE_POS_PLAIN) {
    if (!get_class(&r, &rv, vc, n, k, rank, NULL, 0, delta, NULL, NULL))
      st = pulse_fail(PULSE_ERR_POSITION, "chunk: a change is out of range or badly coded");
  } else {
    uint64_t active, total = 0;
    if (!get_gamma(&r, &active) || active > PULSE_CLASS_COUNT) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: bad class count");
      goto done;
    }
    uint64_t c_next = 0;
    for (unsigned c = 0; c <= PULSE_CLASS_COUNT; c++)
      start[c] = 0;
    for (uint64_t a = 0; a < active; a++) {
      uint64_t step, kc;
      if (!get_gamma(&r, &step) || step > PULSE_CLASS_COUNT - c_next || !get_gamma(&r, &kc) ||
          kc > k - total) {
        st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: bad class or class count");
        goto done;
      }
      unsigned c = (unsigned)(c_next + step - 1u);
      c_next = c + 1u;
      uint64_t limit = hist ? hist[c] : n;
      if (!get_class(&r, &rv, vc, limit, (uint32_t)kc, rank + total, NULL, 0, delta + total,
                     NULL, NULL)) {
        st = pulse_fail(PULSE_ERR_POSITION, "chunk: class %u change out of range or badly coded", c);
        goto done;
      }
      start[c + 1] = (uint32_t)kc; /* counts for now, prefix sums below */
      total += kc;
    }
    if (total != k) {
      st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: classes hold %llu changes, table says %u",
                      (unsigned long long)total, k);
      goto done;
    }
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
      start[c + 1] += start[c];
  }
  if (st == PULSE_OK && (!pulse_br_finished_exactly(&r) || !pulse_br_finished_exactly(&rv)))
    st = pulse_fail(PULSE_ERR_CORRUPT, "chunk: stream length does not match its content");
done:
  return st;
}

pulse_status pulse_chunk2_decode_plain(const uint16_t *base, uint32_t n, const uint8_t *stream,
                                       size_t size, uint32_t k, uint64_t first, uint64_t *pos,
                                       uint16_t *delta) {
  if (k == 0 || k > n)
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: %u changes in %u elements", k, n);
  value_code code;
  pulse_bitreader r, rv;
  if (!open_parts(stream, size, &r, &rv))
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: bad part sizes");
  if (!get_class(&r, &rv, &code, n, k, NULL, pos, first, delta, base, NULL))
    return pulse_fail(PULSE_ERR_POSITION, "chunk: a change is out of range or badly coded");
  if (!pulse_br_finished_exactly(&r) || !pulse_br_finished_exactly(&rv))
    return pulse_fail(PULSE_ERR_CORRUPT, "chunk: stream length does not match its content");
  return PULSE_OK;
}

/* pulse_chunk2_decode_ranks (class model) and pulse_class_index_locate in
 * one pass. Any failure (a bad stream, a rank past the end of its class)
 * returns the reference's status: the chunk is decoded again the reference
 * way, which reports the error it meets first (a hostile patch pays). */
pulse_status pulse_chunk2_decode_indexed(const pulse_class_index *ix, const uint16_t *data,
                                         uint64_t first, uint32_t n, const uint8_t *stream,
                                         size_t size, uint32_t k, uint64_t *pos,
                                         uint16_t *delta, uint16_t *old_bits,
                                         const pulse_chunk_scratch *scratch) {
  value_code code;
  pulse_bitreader r, rv;
  uint64_t active, total = 0, c_next = 0;
  int ok = k > 0 && k <= n && open_parts(stream, size, &r, &rv) && get_gamma(&r, &active) &&
           active <= PULSE_CLASS_COUNT;
  index_sink sink = {.ix = ix,
                     .data = data,
                     .b0 = first >> PULSE_CLASS_BLOCK_LOG2,
                     .bend = (first + n + PULSE_CLASS_BLOCK - 1) >> PULSE_CLASS_BLOCK_LOG2,
                     .pos = pos,
                     .delta = delta,
                     .old_bits = old_bits};
  for (uint64_t a = 0; ok && a < active; a++) {
    uint64_t step, kc;
    if (!get_gamma(&r, &step) || step > PULSE_CLASS_COUNT - c_next || !get_gamma(&r, &kc) ||
        kc > k - total) {
      ok = 0;
      break;
    }
    unsigned c = (unsigned)(c_next + step - 1u);
    c_next = c + 1u;
    sink.cls = c;
    ok = get_class(&r, &rv, &code, n, (uint32_t)kc, NULL, NULL, 0, NULL, NULL, &sink);
    total += kc;
  }
  ok = ok && total == k && pulse_br_finished_exactly(&r) && pulse_br_finished_exactly(&rv);
  if (ok) {
    while (sink.done < sink.out)
      sink_finish(&sink, sink.done++);
    while (old_bits != NULL && data != NULL && sink.resolved < sink.out)
      sink_resolve(&sink, sink.resolved++);
    return PULSE_OK;
  }
  return pulse_chunk_decode_indexed(2, NULL, ix, data, first, n, stream, size,
                                    k, pos, delta, scratch);
}
