/* test_chunk_locate_ranks.c - the fast turn of class ranks into positions
 * (pulse_chunk_locate_fast, chunk_locate.c) against the reference
 * (pulse_chunk_locate) on the rank forms a corrupt or hostile stream can
 * give and a decoder does not check: ranks that repeat or go back within
 * their class (the reference never finds them nor any later change of the
 * class), ranks one past their class's end; and on bases around the fast
 * path's limits: every one of the 256 classes with changes, and just
 * below, at and above the number of classes its blocks compare
 * (LOCATE_MAX_ACTIVE, 32; LOCATE_WINDOW_MAX_ACTIVE, 48, in the two-pass
 * windows), over windows of 4096 elements and tails of one. On every
 * instruction set this CPU runs (the two-pass windows included,
 * PULSE_CHUNK_LOCATE_WINDOW, and their eight-class groups,
 * PULSE_CHUNK_LOCATE_GROUPS): the same count, positions and deltas in the
 * same order. */
#include "chunk_impl.h"
#include "chunk_locate_impl.h"
#include "detect_impl.h"
#include "rank_form_testutil.h"

#include <criterion/criterion.h>

/* The class-major rank form of the elements of base picked with
 * probability `density` (at least one), as a decoder hands it to locate. */
static void ranks_make(const uint16_t *base, uint32_t n, double density, uint64_t *s,
                       pt_rank_form *f) {
  uint32_t *pos = pt_alloc((size_t)n * 4 + 4);
  pt_rank_form_make(base, n, pos, pt_positions(n, density, s, pos), s, f);
  free(pos);
}

/* Every instruction set against the reference; returns what it found. */
static uint32_t assert_same(const uint16_t *base, uint32_t n, const pt_rank_form *f, const char *label) {
  uint32_t k = f->k;
  uint64_t *want_pos = pt_alloc((size_t)k * 8 + 8), *pos = pt_alloc((size_t)k * 8 + 8);
  uint16_t *want_delta = pt_alloc((size_t)k * 2 + 2), *delta = pt_alloc((size_t)k * 2 + 2);
  uint64_t first = 3u << 20;
  uint32_t want = pulse_chunk_locate(base, n, k, f->start, f->rank, f->cdelta, first, want_pos,
                                     want_delta);
  static const int isas[] = {PULSE_ISA_AUTO, PULSE_ISA_SCALAR, PULSE_ISA_AVX2,
                             PULSE_CHUNK_LOCATE_AVX512, PULSE_CHUNK_LOCATE_WINDOW,
                             PULSE_CHUNK_LOCATE_GROUPS};
  for (size_t i = 0; i <= PT_COUNT_OF(isas); i++) {
    memset(pos, 0xAB, (size_t)k * 8 + 8);
    memset(delta, 0xAB, (size_t)k * 2 + 2);
    uint32_t got =
        i < PT_COUNT_OF(isas)
            ? pulse_chunk_locate_isa(isas[i], base, n, k, f->start, f->rank, f->cdelta, first,
                                     pos, delta)
            : pulse_chunk_locate_fast(base, n, k, f->start, f->rank, f->cdelta, first, pos,
                                      delta);
    int isa = i < PT_COUNT_OF(isas) ? isas[i] : -1; /* -1: the dispatched form */
    cr_assert_eq(got, want, "%s, isa %d: found %u, the reference %u", label, isa, got, want);
    for (uint32_t j = 0; j < got; j++)
      cr_assert(pos[j] == want_pos[j] && delta[j] == want_delta[j],
                "%s, isa %d: change %u at %llu delta %04x, the reference %llu %04x", label, isa,
                j, (unsigned long long)pos[j], delta[j], (unsigned long long)want_pos[j],
                want_delta[j]);
  }
  free(want_pos), free(pos), free(want_delta), free(delta);
  return want;
}

/* Normal weights whose exponents are spread over `classes` classes (each
 * element's class picked at random among them: 1 gives a constant
 * exponent, 256 every class). */
static uint16_t spread_weight(uint64_t *s, unsigned classes) {
  uint16_t bits = pt_weight(s, PT_WEIGHTS_NORMAL);
  unsigned c = (unsigned)pulse_rng_below(s, classes);
  return (uint16_t)((bits & 0x807Fu) | (uint16_t)(c << 7));
}

Test(chunk_locate_ranks, ranks_that_repeat_or_go_back_stall_their_class_as_in_the_reference) {
  static const uint32_t sizes[] = {200, 4096, 70001};
  static const pt_weights kinds[] = {PT_WEIGHTS_NORMAL, PT_WEIGHTS_ANY};
  uint64_t s = 17;
  for (size_t z = 0; z < PT_COUNT_OF(sizes); z++)
    for (size_t w = 0; w < PT_COUNT_OF(kinds); w++)
      for (unsigned how = 0; how < 3; how++) {
        uint32_t n = sizes[z];
        uint16_t *base = pt_alloc((size_t)n * 2);
        for (uint32_t i = 0; i < n; i++)
          base[i] = pt_weight(&s, kinds[w]);
        pt_rank_form f;
        ranks_make(base, n, 0.05, &s, &f);
        /* In every class with two changes or more, the second takes the
         * first's rank (how 0), one less (1), or 0 (2). */
        unsigned bent = 0;
        for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
          uint32_t a = f.start[c];
          if (f.start[c + 1] - a < 2)
            continue;
          f.rank[a + 1] = how == 0 ? f.rank[a] : how == 1 ? f.rank[a] - 1 : 0;
          bent++;
        }
        char label[96];
        snprintf(label, sizeof label, "%u elements, weights %zu, bend %u", n, w, how);
        uint32_t found = assert_same(base, n, &f, label);
        if (bent > 0)
          cr_assert_lt(found, f.k, "%s: a stalled class leaves changes unfound", label);
        pt_rank_form_free(&f);
        free(base);
      }
}

Test(chunk_locate_ranks, a_rank_one_past_its_class_is_never_found) {
  uint32_t n = 9000;
  uint64_t s = 5;
  uint16_t *base = pt_alloc((size_t)n * 2);
  for (uint32_t i = 0; i < n; i++)
    base[i] = pt_weight(&s, PT_WEIGHTS_NORMAL);
  uint32_t hist[PULSE_CLASS_COUNT];
  pulse_chunk_classify(base, n, NULL, 0, hist, NULL, NULL);
  pt_rank_form f;
  ranks_make(base, n, 0.03, &s, &f);
  /* Each class's last change at its class's element count: the first rank
   * a decoder without the counts lets through and the base lacks. */
  unsigned moved = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    if (f.start[c] < f.start[c + 1]) {
      f.rank[f.start[c + 1] - 1] = hist[c];
      moved++;
    }
  uint32_t found = assert_same(base, n, &f, "last ranks at their class's count");
  cr_assert_eq(found, f.k - moved, "every change but the moved ones is found");
  pt_rank_form_free(&f);
  free(base);
}

Test(chunk_locate_ranks, any_number_of_classes_with_changes_finds_what_the_reference_finds) {
  /* Around the fast paths' 32 and 48 compared classes, and all 256. */
  static const unsigned classes[] = {1, 2, 31, 32, 33, 48, 49, 64, 256};
  static const double densities[] = {0.002, 0.05, 0.5, 1.0};
  static const uint32_t sizes[] = {64, 127, 128, 129, 4095, 4096, 4097, 4096 + 64,
                                   65536 + 100};
  uint64_t s = 23;
  for (size_t c = 0; c < PT_COUNT_OF(classes); c++)
    for (size_t d = 0; d < PT_COUNT_OF(densities); d++)
      for (size_t z = 0; z < PT_COUNT_OF(sizes); z++) {
        uint32_t n = sizes[z];
        uint16_t *base = pt_alloc((size_t)n * 2);
        for (uint32_t i = 0; i < n; i++)
          base[i] = spread_weight(&s, classes[c]);
        pt_rank_form f;
        ranks_make(base, n, densities[d], &s, &f);
        char label[96];
        snprintf(label, sizeof label, "%u classes, density %g, %u elements, %u changes",
                 classes[c], densities[d], n, f.k);
        cr_assert_eq(assert_same(base, n, &f, label), f.k, "%s: every change found", label);
        pt_rank_form_free(&f);
        free(base);
      }
}
