/* The v3 chunk coding (codec/coding/chunk_v3_impl.h): round trips
 * on random and Adam-shaped chunks, dense classes coded by their holes, the
 * patch value model's serialization, and hostile streams and models. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bitio_impl.h"
#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "pulse_elem.h"

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

static double unif(uint64_t *s) {
  return (double)(rng(s) >> 11) / 9007199254740992.0;
}

/* One chunk: its base, its changes (position order) and their rank form. */
typedef struct {
  uint32_t n, k;
  uint16_t *base;
  uint32_t *pos, *rank;
  uint16_t *delta;
  uint8_t *cls;
  uint32_t hist[PULSE_CLASS_COUNT];
} chunk;

enum { SHAPE_RANDOM, SHAPE_ADAM };

static uint16_t bf16_of(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return (uint16_t)(u >> 16);
}

/* SHAPE_RANDOM: any bits, per-class densities drawn at random, any
 * non-zero delta. SHAPE_ADAM: Gaussian weights, an element changes with
 * probability lr / ulp (so small weights change more), by +-1 ulp mostly
 * and by many ulps near zero. `density` scales the change probabilities. */
static void make_chunk(chunk *c, uint32_t n, double density, uint64_t seed,
                       int shape) {
  memset(c, 0, sizeof *c);
  seed = seed * 0x9E3779B97F4A7C15ull + 1u;
  c->n = n;
  c->base = malloc(n * sizeof *c->base);
  c->pos = malloc(n * sizeof *c->pos);
  c->rank = malloc(n * sizeof *c->rank);
  c->delta = malloc(n * sizeof *c->delta);
  c->cls = malloc(n);
  double pclass[PULSE_CLASS_COUNT];
  for (unsigned x = 0; x < PULSE_CLASS_COUNT; x++)
    pclass[x] = density * unif(&seed);
  for (uint32_t i = 0; i < n; i++) {
    double p;
    uint16_t d;
    if (shape == SHAPE_RANDOM) {
      c->base[i] = (uint16_t)rng(&seed);
      p = pclass[pulse_bf16_class(c->base[i])];
      d = (uint16_t)(1u + rng(&seed) % 0xFFFFu);
    } else {
      double g = sqrt(-2.0 * log(unif(&seed) + 1e-300)) *
                 cos(6.283185307 * unif(&seed));
      c->base[i] = bf16_of((float)(0.02 * g));
      int e = (int)pulse_bf16_class(c->base[i]) - 127 - 7; /* ulp = 2^e */
      double ulps = 3e-5 / ldexp(1.0, e);
      p = density * (ulps > 1 ? 1 : ulps);
      uint32_t mag = 1u + (ulps > 2 ? (uint32_t)(unif(&seed) * ulps) % 4000u
                                    : rng(&seed) % 8 == 0);
      d = (uint16_t)(rng(&seed) & 1u ? mag : 0u - mag);
    }
    if (unif(&seed) < p) {
      c->pos[c->k] = i;
      c->delta[c->k++] = d;
    }
  }
  if (c->k == 0) { /* at least one change */
    c->pos[0] = n / 2;
    c->delta[0] = 1;
    c->k = 1;
  }
  pulse_chunk_classify(c->base, n, c->pos, c->k, c->hist, c->rank, c->cls);
}

static void free_chunk(chunk *c) {
  free(c->base), free(c->pos), free(c->rank), free(c->delta), free(c->cls);
}

/* The model of these chunks, through its serialized form (as a decoder
 * gets it). */
static pulse_v3_model *model_of(const chunk *c, size_t count,
                                pulse_v3_model **enc) {
  pulse_v3_counts *counts = calloc(1, sizeof *counts);
  for (size_t i = 0; i < count; i++)
    pulse_v3_count(counts, c[i].cls, c[i].delta, c[i].k);
  cr_assert_eq(pulse_v3_model_build(counts, enc), PULSE_OK);
  free(counts);
  pulse_bytebuf b = {0};
  cr_assert_eq(pulse_v3_model_write(*enc, &b), PULSE_OK);
  pulse_v3_model *dec;
  size_t used = 0;
  cr_assert_eq(pulse_v3_model_read(b.data, b.size, &used, &dec), PULSE_OK);
  cr_assert_eq(used, b.size);
  pulse_bytebuf_free(&b);
  return dec;
}

/* Decodes and checks against the class-major form of the chunk. */
static void check_round_trip(const chunk *c, const pulse_v3_model *dec,
                             const pulse_bytebuf *s, const uint32_t *hist) {
  uint32_t *rank = malloc(c->k * sizeof *rank),
           *order = malloc(c->k * sizeof *order);
  uint16_t *delta = malloc(c->k * sizeof *delta);
  uint32_t start[PULSE_CLASS_COUNT + 1], kc[PULSE_CLASS_COUNT] = {0},
                                         xs[PULSE_CLASS_COUNT + 1];
  pulse_chunk_class_order(c->k, c->cls, kc, xs, order);
  cr_assert_eq(pulse_chunk3_decode_ranks(dec, hist, c->n, s->data, s->size,
                                         c->k, start, rank, delta),
               PULSE_OK, "%s", pulse_error_detail());
  for (unsigned x = 0; x <= PULSE_CLASS_COUNT; x++)
    cr_assert_eq(start[x], xs[x], "class start %u", x);
  for (uint32_t t = 0; t < c->k; t++) {
    cr_assert_eq(rank[t], c->rank[order[t]], "rank %u", t);
    cr_assert_eq(delta[t], c->delta[order[t]], "delta %u", t);
  }
  free(rank), free(order), free(delta);
}

typedef struct {
  uint32_t n;
  double density;
  uint64_t seed;
  int shape;
} params;

ParameterizedTestParameters(chunk_v3, round_trips) {
  static params p[] = {
      {1, 1.0, 1, SHAPE_RANDOM},      {100, 0.05, 2, SHAPE_RANDOM},
      {4096, 0.01, 3, SHAPE_RANDOM},  {4096, 0.5, 4, SHAPE_RANDOM},
      {4096, 1.0, 5, SHAPE_RANDOM},   {65536, 0.02, 6, SHAPE_RANDOM},
      {1000, 1.0, 7, SHAPE_ADAM},     {65536, 1.0, 8, SHAPE_ADAM},
      {65536, 0.1, 9, SHAPE_ADAM},    {262144, 1.0, 10, SHAPE_ADAM},
      {262144, 0.02, 11, SHAPE_ADAM}, {4096, 1.0, 12, SHAPE_ADAM},
  };
  return cr_make_param_array(params, p, sizeof p / sizeof p[0]);
}

ParameterizedTest(params *p, chunk_v3, round_trips) {
  chunk c;
  make_chunk(&c, p->n, p->density, p->seed, p->shape);
  pulse_v3_model *enc, *dec = model_of(&c, 1, &enc);
  pulse_bytebuf s = {0};
  cr_assert_eq(
      pulse_chunk3_encode_ranks(enc, c.k, c.cls, c.rank, c.delta, &s, NULL),
      PULSE_OK);
  check_round_trip(&c, dec, &s,
                   c.hist); /* ranks checked against the base's counts */
  check_round_trip(&c, dec, &s, NULL); /* and against n only */
  pulse_bytebuf_free(&s);
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  free_chunk(&c);
}

/* Chunks share the patch's model: each decodes alone with it. */
Test(chunk_v3, chunks_share_one_model_and_decode_alone) {
  chunk c[3];
  for (int i = 0; i < 3; i++)
    make_chunk(&c[i], 20000, i == 1 ? 0.3 : 1.0, 40u + (unsigned)i, SHAPE_ADAM);
  pulse_v3_model *enc, *dec = model_of(c, 3, &enc);
  for (int i = 2; i >= 0; i--) {
    pulse_bytebuf s = {0};
    cr_assert_eq(pulse_chunk3_encode_ranks(enc, c[i].k, c[i].cls, c[i].rank,
                                           c[i].delta, &s, NULL),
                 PULSE_OK);
    check_round_trip(&c[i], dec, &s, c[i].hist);
    pulse_bytebuf_free(&s);
  }
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  for (int i = 0; i < 3; i++)
    free_chunk(&c[i]);
}

/* One class of 2000 elements of which all but a few change: coded by its
 * holes it costs far less than the bit per change of a unary gap code. */
Test(chunk_v3, dense_class_is_coded_by_its_holes) {
  chunk c;
  memset(&c, 0, sizeof c);
  c.n = 2000;
  c.base = malloc(2000 * 2), c.pos = malloc(2000 * 4),
  c.rank = malloc(2000 * 4);
  c.delta = malloc(2000 * 2), c.cls = malloc(2000);
  uint64_t seed = 77;
  for (uint32_t i = 0; i < c.n; i++) {
    c.base[i] = 0x3F80;
    if (rng(&seed) % 50 != 0) {
      c.pos[c.k] = i;
      c.delta[c.k++] = 1;
    }
  }
  pulse_chunk_classify(c.base, c.n, c.pos, c.k, c.hist, c.rank, c.cls);
  pulse_v3_model *enc, *dec = model_of(&c, 1, &enc);
  pulse_bytebuf s = {0};
  pulse_v3_stats st = {0};
  cr_assert_eq(
      pulse_chunk3_encode_ranks(enc, c.k, c.cls, c.rank, c.delta, &s, &st),
      PULSE_OK);
  cr_assert_lt(st.gap_bits, c.k / 4u, "%llu gap bits for %u changes",
               (unsigned long long)st.gap_bits, c.k);
  check_round_trip(&c, dec, &s, c.hist);
  pulse_bytebuf_free(&s);
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  free_chunk(&c);
}

/* Deltas at the ends of every token range, one class each. */
Test(chunk_v3, every_delta_width_round_trips) {
  static const uint16_t d[] = {1,      0xFFFF, 2,      0xFFFE, 4,      7,
                               8,      9,      0xFFF8, 15,     16,     17,
                               0x7FFF, 0x8000, 0x8001, 0x4000, 0xC000, 0x3FFF,
                               255,    256,    0xFF00, 1000,   0xF000, 3};
  const uint32_t k = sizeof d / sizeof d[0];
  chunk c;
  memset(&c, 0, sizeof c);
  c.n = 4 * k;
  c.base = malloc(c.n * 2), c.pos = malloc(c.n * 4), c.rank = malloc(c.n * 4);
  c.delta = malloc(c.n * 2), c.cls = malloc(c.n);
  for (uint32_t i = 0; i < c.n; i++)
    c.base[i] = (uint16_t)((i % 3 ? 0x8000u : 0u) | (i * 37u % 256u) << 7 |
                           (i & 0x7Fu));
  for (uint32_t t = 0; t < k; t++) {
    c.pos[t] = 4 * t + t % 3;
    c.delta[t] = d[t];
  }
  c.k = k;
  pulse_chunk_classify(c.base, c.n, c.pos, c.k, c.hist, c.rank, c.cls);
  pulse_v3_model *enc, *dec = model_of(&c, 1, &enc);
  pulse_bytebuf s = {0};
  cr_assert_eq(
      pulse_chunk3_encode_ranks(enc, c.k, c.cls, c.rank, c.delta, &s, NULL),
      PULSE_OK);
  check_round_trip(&c, dec, &s, c.hist);
  pulse_bytebuf_free(&s);
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  free_chunk(&c);
}

Test(chunk_v3, model_round_trips_its_frequencies) {
  chunk c;
  make_chunk(&c, 65536, 1.0, 5, SHAPE_RANDOM);
  pulse_v3_model *enc, *dec = model_of(&c, 1, &enc);
  for (unsigned x = 0; x < PULSE_CLASS_COUNT; x++) {
    unsigned sum = 0;
    for (unsigned t = 0; t < PULSE_V3_TOKENS; t++) {
      cr_assert_eq(pulse_v3_model_freq(dec, x, t),
                   pulse_v3_model_freq(enc, x, t));
      sum += pulse_v3_model_freq(dec, x, t);
    }
    cr_assert(sum == 0 || sum == 1u << PULSE_V3_PROB_BITS,
              "class %u sums to %u", x, sum);
  }
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  free_chunk(&c);
}

/* ---------------------------------------------------------- hostile input */

typedef struct {
  chunk c;
  pulse_v3_model *enc, *dec;
  pulse_bytebuf s;
  uint32_t *rank, start[PULSE_CLASS_COUNT + 1];
  uint16_t *delta;
} hostile;

static void hostile_make(hostile *h, uint32_t n, double density, uint64_t seed,
                         int shape) {
  make_chunk(&h->c, n, density, seed, shape);
  h->dec = model_of(&h->c, 1, &h->enc);
  memset(&h->s, 0, sizeof h->s);
  cr_assert_eq(pulse_chunk3_encode_ranks(h->enc, h->c.k, h->c.cls, h->c.rank,
                                         h->c.delta, &h->s, NULL),
               PULSE_OK);
  h->rank = malloc((n + 1) * sizeof *h->rank);
  h->delta = malloc((n + 1) * sizeof *h->delta);
}

static void hostile_free(hostile *h) {
  pulse_bytebuf_free(&h->s);
  pulse_v3_model_free(h->enc), pulse_v3_model_free(h->dec);
  free(h->rank), free(h->delta);
  free_chunk(&h->c);
}

static pulse_status decode(hostile *h, const uint8_t *s, size_t size,
                           uint32_t k, const uint32_t *hist) {
  return pulse_chunk3_decode_ranks(h->dec, hist, h->c.n, s, size, k, h->start,
                                   h->rank, h->delta);
}

Test(chunk_v3, every_truncation_and_extension_is_refused) {
  hostile h;
  hostile_make(&h, 8192, 1.0, 21, SHAPE_ADAM);
  uint8_t *copy = malloc(h.s.size + 1);
  for (size_t len = 0; len < h.s.size; len++) {
    memcpy(copy, h.s.data, len); /* a fresh buffer of exactly len bytes */
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, h.s.data, len);
    cr_assert_neq(decode(&h, exact, len, h.c.k, h.c.hist), PULSE_OK,
                  "prefix of %zu", len);
    free(exact);
  }
  memcpy(copy, h.s.data, h.s.size);
  copy[h.s.size] = 0;
  cr_assert_neq(decode(&h, copy, h.s.size + 1, h.c.k, h.c.hist), PULSE_OK);
  free(copy);
  hostile_free(&h);
}

/* Every single-bit flip: an error, or a decode whose ranks are inside
 * their classes and increasing; never a crash (run under ASan). */
Test(chunk_v3, bit_flips_are_refused_or_stay_in_range) {
  hostile h;
  hostile_make(&h, 4096, 0.3, 22, SHAPE_RANDOM);
  uint8_t *copy = malloc(h.s.size);
  for (size_t bit = 0; bit < 8 * h.s.size; bit++) {
    memcpy(copy, h.s.data, h.s.size);
    copy[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    if (decode(&h, copy, h.s.size, h.c.k, h.c.hist) != PULSE_OK)
      continue;
    for (unsigned x = 0; x < PULSE_CLASS_COUNT; x++)
      for (uint32_t t = h.start[x]; t < h.start[x + 1]; t++) {
        cr_assert_lt(h.rank[t], h.c.hist[x]);
        if (t > h.start[x])
          cr_assert_gt(h.rank[t], h.rank[t - 1]);
      }
  }
  free(copy);
  hostile_free(&h);
}

Test(chunk_v3, counts_that_do_not_sum_are_refused) {
  hostile h;
  hostile_make(&h, 4096, 1.0, 23, SHAPE_ADAM);
  cr_assert_eq(decode(&h, h.s.data, h.s.size, h.c.k, h.c.hist), PULSE_OK);
  cr_assert_neq(decode(&h, h.s.data, h.s.size, h.c.k - 1u, h.c.hist), PULSE_OK);
  cr_assert_neq(decode(&h, h.s.data, h.s.size, h.c.k + 1u, h.c.hist), PULSE_OK);
  cr_assert_neq(decode(&h, h.s.data, h.s.size, 0, h.c.hist), PULSE_OK);
  hostile_free(&h);
}

/* A base with one element fewer in the class of the chunk's last change
 * in its class: that rank is past the class. */
Test(chunk_v3, ranks_past_their_class_are_refused) {
  hostile h;
  hostile_make(&h, 4096, 1.0, 24, SHAPE_ADAM);
  uint32_t hist[PULSE_CLASS_COUNT];
  for (unsigned x = 0; x < PULSE_CLASS_COUNT; x++) {
    uint32_t maxrank = 0, any = 0;
    for (uint32_t t = 0; t < h.c.k; t++)
      if (h.c.cls[t] == x)
        maxrank = h.c.rank[t], any = 1;
    if (!any)
      continue;
    memcpy(hist, h.c.hist, sizeof hist);
    hist[x] = maxrank; /* the class now ends just before its last change */
    cr_assert_neq(decode(&h, h.s.data, h.s.size, h.c.k, hist), PULSE_OK,
                  "class %u", x);
  }
  hostile_free(&h);
}

Test(chunk_v3, classes_missing_from_the_model_are_refused) {
  hostile h;
  hostile_make(&h, 4096, 1.0, 25, SHAPE_ADAM);
  pulse_v3_counts *counts = calloc(1, sizeof *counts);
  pulse_v3_count(counts, h.c.cls, h.c.delta, h.c.k);
  memset(counts->count[h.c.cls[0]], 0, sizeof counts->count[0]);
  pulse_v3_model *partial;
  cr_assert_eq(pulse_v3_model_build(counts, &partial), PULSE_OK);
  pulse_bytebuf s = {0};
  cr_assert_eq(pulse_chunk3_encode_ranks(partial, h.c.k, h.c.cls, h.c.rank,
                                         h.c.delta, &s, NULL),
               PULSE_ERR_ARG);
  cr_assert_neq(pulse_chunk3_decode_ranks(partial, h.c.hist, h.c.n, h.s.data,
                                          h.s.size, h.c.k, h.start, h.rank,
                                          h.delta),
                PULSE_OK);
  pulse_bytebuf_free(&s);
  pulse_v3_model_free(partial);
  free(counts);
  hostile_free(&h);
}

/* Hand-made streams: codes longer than any field, a part A size past the
 * end or not in its shortest form, no room for the value coder's state, a
 * state below its range. */
Test(chunk_v3, malformed_streams_are_refused) {
  hostile h;
  hostile_make(&h, 4096, 1.0, 26, SHAPE_ADAM);
  const uint8_t ones[] = {8,    0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                          0xFF, 0xFF, 0xFF, 0,    0,    1};
  const uint8_t size_past_end[] = {200, 1, 0, 0, 1};
  const uint8_t long_varint[] = {0x81, 0x00, 1, 0, 0, 1};
  const uint8_t no_state[] = {1, 1, 0, 1};
  const uint8_t low_state[] = {1, 1, 0xFF, 0xFF, 0};
  const uint8_t *bad[] = {ones, size_past_end, long_varint, no_state,
                          low_state};
  const size_t size[] = {sizeof ones, sizeof size_past_end, sizeof long_varint,
                         sizeof no_state, sizeof low_state};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_neq(decode(&h, bad[i], size[i], h.c.k, h.c.hist), PULSE_OK,
                  "stream %zu", i);
  hostile_free(&h);
}

Test(chunk_v3, malformed_models_are_refused) {
  chunk c;
  make_chunk(&c, 65536, 1.0, 27, SHAPE_ADAM);
  pulse_v3_model *enc, *dec = model_of(&c, 1, &enc), *m;
  pulse_bytebuf b = {0};
  cr_assert_eq(pulse_v3_model_write(enc, &b), PULSE_OK);
  size_t used;
  for (size_t len = 0; len < b.size; len++) {
    uint8_t *exact = malloc(len ? len : 1);
    memcpy(exact, b.data, len);
    cr_assert_neq(pulse_v3_model_read(exact, len, &used, &m), PULSE_OK,
                  "prefix of %zu", len);
    cr_assert_null(m);
    free(exact);
  }
  /* hand-made: 257 classes; a class step past 255; a weight of 32; a last
   * token whose weight is 0; non-zero padding */
  pulse_bytebuf x[5] = {{0}};
  pulse_bitwriter w;
  pulse_bw_init(&w, &x[0]); /* gamma(258) */
  pulse_bw_put(&w, 0xFF, 8), pulse_bw_put(&w, 0, 1),
      pulse_bw_put(&w, 258 & 0xFF, 8);
  pulse_bw_flush(&w);
  pulse_bw_init(&w, &x[1]); /* gamma(2) classes, gamma(257) step */
  pulse_bw_put(&w, 1, 1), pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 0, 1);
  pulse_bw_put(&w, 0xFF, 8), pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 1, 8);
  pulse_bw_flush(&w);
  pulse_bw_init(&w,
                &x[2]); /* 1 class, step 1, last 0, weight zigzag 64 -> 32 */
  pulse_bw_put(&w, 1, 1), pulse_bw_put(&w, 0, 1),
      pulse_bw_put(&w, 0, 1);                     /* gamma(2) */
  pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 0, 1); /* gamma(1), gamma(1) */
  pulse_bw_put(&w, 0x3F, 6), pulse_bw_put(&w, 0, 1),
      pulse_bw_put(&w, 1, 6); /* gamma(65) */
  pulse_bw_flush(&w);
  pulse_bw_init(&w, &x[3]); /* 1 class, step 1, last 0, weight 0 */
  pulse_bw_put(&w, 1, 1), pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 0, 1);
  pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 0, 1);
  pulse_bw_flush(&w);
  pulse_bw_init(&w, &x[4]); /* 0 classes: gamma(1), then a padding bit set */
  pulse_bw_put(&w, 0, 1), pulse_bw_put(&w, 1, 1);
  pulse_bw_flush(&w);
  for (int i = 0; i < 5; i++) {
    cr_assert_neq(pulse_v3_model_read(x[i].data, x[i].size, &used, &m),
                  PULSE_OK, "model %d", i);
    pulse_bytebuf_free(&x[i]);
  }
  pulse_bytebuf_free(&b);
  pulse_v3_model_free(enc), pulse_v3_model_free(dec);
  free_chunk(&c);
}
