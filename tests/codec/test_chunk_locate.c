/* test_chunk_locate.c - the fast turn of class ranks into positions
 * (pulse_chunk_locate_fast, chunk_locate.c) against the reference
 * (pulse_chunk_locate): on every instruction set this CPU runs, the same
 * count, positions and deltas in the same order, for chunk sizes around its
 * 64-element blocks, densities from one change to every element, bases of
 * one class to any bits (more classes with changes than its fast path
 * takes), and ranks past the end of their class (a corrupt stream: both
 * find the same fewer). */
#include "chunk_impl.h"
#include "chunk_locate_impl.h"
#include "detect_impl.h"
#include "rank_form_testutil.h"

#include <criterion/criterion.h>

/* Every instruction set against the reference on one rank form. */
static void assert_same(const uint16_t *base, uint32_t n, uint32_t k, const pt_rank_form *f,
                        const char *label) {
  uint64_t *want_pos = pt_alloc((size_t)k * 8 + 8), *pos = pt_alloc((size_t)k * 8 + 8);
  uint16_t *want_delta = pt_alloc((size_t)k * 2 + 2), *delta = pt_alloc((size_t)k * 2 + 2);
  uint64_t first = 7u << 20;
  uint32_t want = pulse_chunk_locate(base, n, k, f->start, f->rank, f->cdelta, first, want_pos,
                                     want_delta);
  static const int isas[] = {PULSE_ISA_AUTO, PULSE_ISA_SCALAR, PULSE_ISA_AVX2,
                             PULSE_CHUNK_LOCATE_AVX512, PULSE_CHUNK_LOCATE_WINDOW,
                             PULSE_CHUNK_LOCATE_GROUPS};
  for (size_t i = 0; i < PT_COUNT_OF(isas); i++) {
    memset(pos, 0xAB, (size_t)k * 8 + 8);
    uint32_t got = pulse_chunk_locate_isa(isas[i], base, n, k, f->start, f->rank, f->cdelta,
                                          first, pos, delta);
    cr_assert_eq(got, want, "%s, isa %d: found %u, the reference %u", label, isas[i], got, want);
    for (uint32_t j = 0; j < got; j++)
      cr_assert(pos[j] == want_pos[j] && delta[j] == want_delta[j],
                "%s, isa %d: change %u at %llu delta %04x, the reference %llu %04x", label,
                isas[i], j, (unsigned long long)pos[j], delta[j],
                (unsigned long long)want_pos[j], want_delta[j]);
  }
  uint32_t fast = pulse_chunk_locate_fast(base, n, k, f->start, f->rank, f->cdelta, first, pos,
                                          delta);
  cr_assert_eq(fast, want, "%s: the dispatched form", label);
  free(want_pos), free(pos), free(want_delta), free(delta);
}

Test(chunk_locate, every_instruction_set_finds_what_the_reference_finds) {
  static const uint32_t sizes[] = {1, 63, 64, 65, 127, 128, 1000, 4096, 65536};
  static const double densities[] = {0.0, 0.001, 0.01, 0.1, 1.0};
  static const pt_weights kinds[] = {PT_WEIGHTS_NORMAL, PT_WEIGHTS_EDGE, PT_WEIGHTS_ANY,
                                     PT_WEIGHTS_CONST};
  uint64_t s = 42;
  for (size_t z = 0; z < PT_COUNT_OF(sizes); z++)
    for (size_t d = 0; d < PT_COUNT_OF(densities); d++)
      for (size_t w = 0; w < PT_COUNT_OF(kinds); w++) {
        uint32_t n = sizes[z];
        uint16_t *base = pt_alloc((size_t)n * 2 + 2);
        uint32_t *pos = pt_alloc((size_t)n * 4 + 4);
        for (uint32_t i = 0; i < n; i++)
          base[i] = pt_weight(&s, kinds[w]);
        uint32_t k = pt_positions(n, densities[d], &s, pos);
        pt_rank_form f;
        pt_rank_form_make(base, n, pos, k, &s, &f);
        char label[96];
        snprintf(label, sizeof label, "%u elements, density %g, weights %zu, %u changes", n,
                 densities[d], w, k);
        assert_same(base, n, k, &f, label);
        free(base), free(pos), free(f.rank), free(f.cdelta);
      }
}

Test(chunk_locate, ranks_past_their_class_are_found_as_short_as_by_the_reference) {
  uint32_t n = 5000;
  uint64_t s = 9;
  uint16_t *base = pt_alloc(n * 2);
  uint32_t *pos = pt_alloc(n * 4);
  for (uint32_t i = 0; i < n; i++)
    base[i] = pt_weight(&s, PT_WEIGHTS_NORMAL);
  uint32_t k = pt_positions(n, 0.02, &s, pos);
  pt_rank_form f;
  pt_rank_form_make(base, n, pos, k, &s, &f);
  /* The last change of each of a few classes moved past its class's end,
   * the first class's first change too (later ones then are never wanted). */
  unsigned moved = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT && moved < 3; c++)
    if (f.start[c] < f.start[c + 1]) {
      f.rank[f.start[c + 1] - 1] += n;
      if (moved == 0)
        f.rank[f.start[c]] = n + 1;
      moved++;
    }
  cr_assert_eq(moved, 3);
  assert_same(base, n, k, &f, "corrupt ranks");
  uint64_t *out = pt_alloc((size_t)k * 8);
  uint16_t *delta = pt_alloc((size_t)k * 2);
  cr_assert_lt(pulse_chunk_locate_fast(base, n, k, f.start, f.rank, f.cdelta, 0, out, delta), k,
               "a rank past its class is never found");
  free(base), free(pos), free(f.rank), free(f.cdelta), free(out), free(delta);
}
