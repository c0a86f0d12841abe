/* test_chunk_indexed.c - the version 2 and 3 class-model decodes fused
 * with the locate through a class index (pulse_chunk2_decode_indexed,
 * chunk_fast.c; pulse_chunk3_decode_indexed, chunk_v3.c) against the two
 * passes they replace (pulse_chunk_decode_indexed, the reference): the
 * same status, message, positions, old bits and new bits
 * in the same order, for chunks of one or several index blocks, the
 * tensor's first or a later chunk, a short last chunk, densities from one
 * change to every element, bases of one class to any bits; and for hostile
 * streams (flipped bytes, cut streams, ranks past the end of their class,
 * a table that says more or fewer changes than the stream holds) the same
 * status and message. */
#include "bytebuf_impl.h"
#include "chunk_fast_impl.h"
#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "class_index_impl.h"
#include "rank_form_testutil.h"

#include <criterion/criterion.h>

/* A chunk of n elements from `first` in a tensor of numel elements, its
 * changes coded against `coded_base` (the tensor's data when honest). */
typedef struct {
  unsigned version;       /* 2 or 3 */
  pulse_v3_model *values; /* version 3: the model the stream is coded against */
  uint64_t numel, first;
  uint32_t n, k;
  uint16_t *data;
  pulse_class_index *ix;
  pulse_bytebuf stream;
} chunk_case;

/* Codes changes at pos of the chunk `base` (n elements) as a class-model
 * stream of c's version (version 3: against a model of these changes, which
 * replaces c->values). */
static void encode(chunk_case *c, const uint16_t *base, uint32_t n,
                   const uint32_t *pos, uint32_t k, uint64_t *s,
                   pulse_bytebuf *out) {
  uint32_t hist[PULSE_CLASS_COUNT];
  uint32_t *rank = pt_alloc((size_t)k * 4 + 4);
  uint8_t *cls = pt_alloc((size_t)k + 1);
  uint16_t *delta = pt_alloc((size_t)k * 2 + 2);
  pulse_chunk_classify(base, n, pos, k, hist, rank, cls);
  for (uint32_t j = 0; j < k; j++)
    delta[j] = pt_delta(s);
  memset(out, 0, sizeof *out);
  if (c->version == 2) {
    cr_assert_eq(
        pulse_chunk2_encode_ranks(PULSE_POS_CLASS, k, cls, rank, delta, out),
        PULSE_OK);
  } else {
    pulse_v3_counts *counts = pt_alloc(sizeof *counts);
    memset(counts, 0, sizeof *counts);
    pulse_v3_count(counts, cls, delta, k);
    pulse_v3_model_free(c->values);
    cr_assert_eq(pulse_v3_model_build(counts, &c->values), PULSE_OK);
    free(counts);
    if (k > 0)
      cr_assert_eq(
          pulse_chunk3_encode_ranks(c->values, k, cls, rank, delta, out, NULL),
          PULSE_OK);
  }
  free(rank), free(cls), free(delta);
}

static void case_make(chunk_case *c, unsigned version, uint64_t numel,
                      uint64_t first, uint32_t n, double density,
                      pt_weights kind, uint64_t *s) {
  c->version = version;
  c->values = NULL;
  c->numel = numel;
  c->first = first;
  c->n = n;
  c->data = pt_alloc((size_t)numel * 2 + 2);
  for (uint64_t i = 0; i < numel; i++)
    c->data[i] = pt_weight(s, kind);
  uint32_t *pos = pt_alloc((size_t)n * 4 + 4);
  c->k = pt_positions(n, density, s, pos);
  encode(c, c->data + first, n, pos, c->k, s, &c->stream);
  free(pos);
  c->ix = NULL;
  cr_assert_eq(pulse_class_index_build(c->data, numel, 1, &c->ix), PULSE_OK);
}

static void case_free(chunk_case *c) {
  free(c->data);
  pulse_v3_model_free(c->values);
  pulse_class_index_free(c->ix);
  pulse_bytebuf_free(&c->stream);
}

/* Both decodes of `stream` (size bytes, the table's k); with old bits or
 * without (deltas stay deltas). Returns the status both gave. */
static pulse_status assert_same(const chunk_case *c, const uint8_t *stream, size_t size,
                                uint32_t k, int with_old, const char *label) {
  size_t cap = (size_t)(k > c->n ? k : c->n) + 1;
  uint64_t *want_pos = pt_alloc(cap * 8), *pos = pt_alloc(cap * 8);
  uint16_t *want_delta = pt_alloc(cap * 2), *delta = pt_alloc(cap * 2);
  uint16_t *want_old = pt_alloc(cap * 2), *old = pt_alloc(cap * 2);
  uint32_t *rank = pt_alloc(cap * 4);
  uint16_t *cdelta = pt_alloc(cap * 2);
  pulse_chunk_scratch want_scratch = {rank, cdelta, with_old ? want_old : NULL};
  pulse_status want = pulse_chunk_decode_indexed(
      c->version, c->values, c->ix, c->data, c->first, c->n, stream, size, k,
      want_pos, want_delta, &want_scratch);
  char want_detail[256];
  snprintf(want_detail, sizeof want_detail, "%s", want != PULSE_OK ? pulse_error_detail() : "");
  pulse_chunk_scratch scratch = {rank, cdelta, with_old ? old : NULL};
  pulse_status got =
      c->version == 2
          ? pulse_chunk2_decode_indexed(c->ix, c->data, c->first, c->n, stream,
                                        size, k, pos, delta,
                                        with_old ? old : NULL, &scratch)
          : pulse_chunk3_decode_indexed(c->values, c->ix, c->data, c->first,
                                        c->n, stream, size, k, pos, delta,
                                        with_old ? old : NULL, &scratch);
  cr_assert_eq(got, want, "%s: status %s, the reference %s (%s)", label, pulse_status_name(got),
               pulse_status_name(want), want_detail);
  if (want != PULSE_OK) {
    cr_assert_str_eq(pulse_error_detail(), want_detail, "%s: message", label);
  } else {
    for (uint32_t j = 0; j < k; j++) {
      cr_assert(pos[j] == want_pos[j] && delta[j] == want_delta[j],
                "%s: change %u at %llu bits %04x, the reference %llu %04x", label, j,
                (unsigned long long)pos[j], delta[j], (unsigned long long)want_pos[j],
                want_delta[j]);
      if (with_old)
        cr_assert(old[j] == want_old[j] && old[j] == c->data[pos[j]],
                  "%s: change %u old bits %04x, the reference %04x", label, j, old[j],
                  want_old[j]);
    }
  }
  free(want_pos), free(pos), free(want_delta), free(delta), free(want_old), free(old);
  free(rank), free(cdelta);
  return got;
}

Test(chunk_indexed, one_pass_gives_what_decode_then_locate_gives) {
  /* (tensor elements, chunk start, chunk elements): one block; a chunk of
   * 4 blocks at the start and in the middle; a short last chunk whose last
   * block is short. */
  static const struct {
    uint64_t numel, first;
    uint32_t n;
  } shapes[] = {{4096, 0, 4096}, {5 * 16384, 0, 16384}, {5 * 16384, 2 * 16384, 16384},
                {2 * 16384 + 5000, 2 * 16384, 5000}, {300, 0, 300}};
  static const double densities[] = {0.0, 0.001, 0.03, 0.3, 1.0};
  static const pt_weights kinds[] = {PT_WEIGHTS_NORMAL, PT_WEIGHTS_EDGE, PT_WEIGHTS_ANY,
                                     PT_WEIGHTS_CONST};
  uint64_t s = 36;
  for (unsigned v = 2; v <= 3; v++)
    for (size_t z = 0; z < PT_COUNT_OF(shapes); z++)
      for (size_t d = 0; d < PT_COUNT_OF(densities); d++)
        for (size_t w = 0; w < PT_COUNT_OF(kinds); w++) {
          chunk_case c;
          case_make(&c, v, shapes[z].numel, shapes[z].first, shapes[z].n,
                    densities[d], kinds[w], &s);
          if (c.k == 0 && v == 3) { /* version 3 codes no stream of no change */
            case_free(&c);
            continue;
          }
          char label[128];
          snprintf(label, sizeof label,
                   "v%u chunk at %llu of %u elements, density %g, weights %zu, "
                   "%u changes",
                   v, (unsigned long long)c.first, c.n, densities[d], w, c.k);
          for (int with_old = 0; with_old < 2; with_old++)
            cr_assert_eq(assert_same(&c, c.stream.data, c.stream.size, c.k,
                                     with_old, label),
                         PULSE_OK, "%s: an honest stream decodes", label);
          case_free(&c);
        }
}

Test(chunk_indexed, hostile_streams_fail_as_the_reference_fails) {
  uint64_t s = 7;
  unsigned failed = 0, cases = 0;
  for (int round = 0; round < 80; round++) {
    chunk_case c;
    case_make(&c, round < 40 ? 2 : 3, 3 * 16384, 16384, 16384,
              round % 2 ? 0.02 : 0.2,
              round % 4 < 2 ? PT_WEIGHTS_NORMAL : PT_WEIGHTS_EDGE, &s);
    uint8_t *bytes = pt_alloc(c.stream.size + 8);
    char label[96];
    /* Flipped bytes. */
    for (int f = 0; f < 8; f++) {
      memcpy(bytes, c.stream.data, c.stream.size);
      size_t at = (size_t)pulse_rng_below(&s, c.stream.size);
      bytes[at] ^= (uint8_t)(1u + pulse_rng_below(&s, 255));
      snprintf(label, sizeof label, "round %d: byte %zu flipped", round, at);
      failed += assert_same(&c, bytes, c.stream.size, c.k, 1, label) != PULSE_OK;
      cases++;
    }
    /* Cut short, and one byte too many. */
    size_t sizes[] = {c.stream.size - 1, c.stream.size / 2, c.stream.size + 1};
    memcpy(bytes, c.stream.data, c.stream.size);
    bytes[c.stream.size] = 0;
    for (size_t i = 0; i < PT_COUNT_OF(sizes); i++) {
      snprintf(label, sizeof label, "round %d: %zu of %zu bytes", round, sizes[i], c.stream.size);
      failed += assert_same(&c, bytes, sizes[i], c.k, 1, label) != PULSE_OK;
      cases++;
    }
    /* The table says one change more, or fewer. */
    snprintf(label, sizeof label, "round %d: k + 1", round);
    failed += assert_same(&c, c.stream.data, c.stream.size, c.k + 1, 1, label) != PULSE_OK;
    snprintf(label, sizeof label, "round %d: k - 1", round);
    if (c.k > 1)
      failed += assert_same(&c, c.stream.data, c.stream.size, c.k - 1, 1, label) != PULSE_OK;
    cases += 1 + (c.k > 1);
    free(bytes);
    case_free(&c);
  }
  cr_assert_gt(failed, cases / 2, "most hostile streams fail (%u of %u)", failed, cases);
}

Test(chunk_indexed, ranks_past_their_class_fail_as_the_reference_fails) {
  /* Changes coded against another base, with more elements in the classes
   * that have changes, land past the ends of those classes in this one. */
  uint64_t s = 11;
  for (int round = 0; round < 24; round++) {
    chunk_case c;
    case_make(&c, round < 12 ? 2 : 3, 2 * 16384, 0, 16384, 0.05,
              PT_WEIGHTS_NORMAL, &s);
    uint16_t *other = pt_alloc((size_t)c.n * 2);
    memcpy(other, c.data, (size_t)c.n * 2);
    /* The other base: a run of one value at the end (one class many times
     * over), so a rank near that class's end in `other` is past it here. */
    uint16_t v = c.data[pulse_rng_below(&s, c.n)];
    for (uint32_t i = c.n / 2; i < c.n; i++)
      other[i] = v;
    uint32_t pos[64];
    uint32_t k = 0;
    for (uint32_t i = c.n - 64 + (uint32_t)(round % 12); i < c.n; i += 4)
      pos[k++] = i;
    pulse_bytebuf stream;
    encode(&c, other, c.n, pos, k, &s, &stream);
    char label[64];
    snprintf(label, sizeof label, "round %d", round);
    cr_assert_eq(assert_same(&c, stream.data, stream.size, k, 1, label), PULSE_ERR_POSITION,
                 "%s: a rank past its class", label);
    pulse_bytebuf_free(&stream);
    free(other);
    case_free(&c);
  }
}
