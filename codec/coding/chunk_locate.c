/* chunk_locate.c - pulse_chunk_locate (chunk_coder.c, the reference) on
 * blocks of 64 base elements with AVX-512BW or AVX2: the same positions and
 * deltas in the same order, for every input.
 *
 * The reference pays a load, a compare and a store per base element, and
 * neighbours of one class chain through the store. Only the classes that
 * have changes in the chunk (typically 10 to 20 of the 256) matter: here
 * each of them costs one byte compare, a mask and a popcount per 64
 * elements, and the few blocks where a wanted rank falls are resolved bit
 * by bit. A decode without a class index spends most of its time here
 * (python/bench_moe.py: 80% of a region stage). More active classes than
 * LOCATE_MAX_ACTIVE, or neither instruction set, take the reference. */
#include <string.h>

#include "chunk_impl.h"
#include "detect_impl.h"
#include "pulse_elem.h"

/* Above this many classes with changes the per-class compares cost more
 * than the reference's per-element work. */
#define LOCATE_MAX_ACTIVE 32u
#define LOCATE_BLOCK 64u

/* The classes with changes left to find, and where each stands. */
typedef struct {
  unsigned count;
  uint8_t cls[LOCATE_MAX_ACTIVE];
  /* Elements of the class to pass before its next change: that change's
   * class rank minus the elements passed so far (one number to load, test
   * and store per class and block). UINT32_MAX once all are found. */
  uint32_t skip[LOCATE_MAX_ACTIVE];
  uint32_t cursor[LOCATE_MAX_ACTIVE]; /* the next change's entry in rank/cdelta */
  uint32_t end[LOCATE_MAX_ACTIVE];    /* after the class's last entry */
} locate_state;

/* Fills st from the class-major rank form; 0 when more than
 * LOCATE_MAX_ACTIVE classes have changes. */
static int locate_init(locate_state *st, const uint32_t *start, const uint32_t *rank) {
  st->count = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    if (start[c] >= start[c + 1])
      continue;
    if (st->count == LOCATE_MAX_ACTIVE)
      return 0;
    unsigned a = st->count++;
    st->cls[a] = (uint8_t)c;
    st->skip[a] = rank[start[c]];
    st->cursor[a] = start[c];
    st->end[a] = start[c + 1];
  }
  return 1;
}

/* Drops the classes whose changes are all found. */
static void locate_compact(locate_state *st) {
  unsigned kept = 0;
  for (unsigned a = 0; a < st->count; a++) {
    if (st->cursor[a] == st->end[a])
      continue;
    st->cls[kept] = st->cls[a], st->skip[kept] = st->skip[a];
    st->cursor[kept] = st->cursor[a], st->end[kept] = st->end[a];
    kept++;
  }
  st->count = kept;
}

/* Class a's change at its cursor was found: moves to the next one. Ranks
 * strictly increase within a class (a decoded gap is >= 0), so the skip to
 * the next is their difference less one; ranks that do not increase give a
 * skip that never runs out, as the reference never finds them. Returns
 * non-zero when the class has no change left. */
static inline int locate_next(locate_state *st, unsigned a, const uint32_t *rank) {
  uint32_t c = st->cursor[a]++;
  if (st->cursor[a] == st->end[a]) {
    st->skip[a] = UINT32_MAX;
    return 1;
  }
  st->skip[a] = rank[c + 1] - rank[c] - 1;
  return 0;
}

/* The reference's loop over base[i0, n), from the state the blocks left. */
static uint32_t locate_tail(locate_state *st, const uint16_t *base, uint32_t i0, uint32_t n,
                            uint32_t k, const uint32_t *rank, const uint16_t *cdelta,
                            uint64_t first, uint64_t *pos, uint16_t *delta, uint32_t out) {
  uint8_t slot[PULSE_CLASS_COUNT];
  memset(slot, 0xFF, sizeof slot);
  for (unsigned a = 0; a < st->count; a++)
    slot[st->cls[a]] = (uint8_t)a;
  for (uint32_t i = i0; i < n && out < k; i++) {
    unsigned a = slot[pulse_bf16_class(base[i])];
    if (a == 0xFF || st->cursor[a] == st->end[a] || st->skip[a]-- != 0)
      continue;
    pos[out] = first + i;
    delta[out] = cdelta[st->cursor[a]];
    out++;
    locate_next(st, a, rank);
  }
  return out;
}

/* Active class a has the elements of mask m in the block: finds its wanted
 * changes among them (hits, with their deltas at their lanes) and passes
 * the rest. Returns non-zero when the class has no change left. */
static inline int locate_class(locate_state *st, unsigned a, uint64_t m, uint64_t *hits,
                               uint16_t *hit_delta, const uint32_t *rank,
                               const uint16_t *cdelta) {
  uint32_t cnt = (uint32_t)__builtin_popcountll(m), skip = st->skip[a];
  if (skip >= cnt) { /* the common case: no change of the class here */
    st->skip[a] = skip - cnt;
    return 0;
  }
  for (;;) {
    for (; skip > 0; skip--)
      m &= m - 1;
    unsigned lane = (unsigned)__builtin_ctzll(m);
    m &= m - 1;
    *hits |= 1ull << lane;
    hit_delta[lane] = cdelta[st->cursor[a]];
    if (locate_next(st, a, rank))
      return 1;
    skip = st->skip[a];
    cnt = (uint32_t)__builtin_popcountll(m);
    if (skip >= cnt) {
      st->skip[a] = skip - cnt;
      return 0;
    }
  }
}

/* Appends the hits of the block at i in element order, as the reference
 * finds them. */
static inline uint32_t locate_emit(uint64_t hits, const uint16_t *hit_delta, uint64_t at,
                                   uint64_t *pos, uint16_t *delta, uint32_t out) {
  for (; hits != 0; hits &= hits - 1) {
    unsigned lane = (unsigned)__builtin_ctzll(hits);
    pos[out] = at + lane;
    delta[out] = hit_delta[lane];
    out++;
  }
  return out;
}

#if PULSE_HAVE_X86_DISPATCH
#define LOCATE_AVX2 __attribute__((target("avx2,bmi,popcnt")))
#define LOCATE_AVX512 __attribute__((target("avx512f,avx512bw,bmi,popcnt")))

/* The classes of 32 elements as bytes, in element order. */
LOCATE_AVX2 static inline __m256i classes32(const uint16_t *p) {
  const __m256i ff = _mm256_set1_epi16(0xFF);
  __m256i a = _mm256_loadu_si256((const __m256i *)(const void *)p);
  __m256i b = _mm256_loadu_si256((const __m256i *)(const void *)(p + 16));
  a = _mm256_and_si256(_mm256_srli_epi16(a, 7), ff);
  b = _mm256_and_si256(_mm256_srli_epi16(b, 7), ff);
  /* packus interleaves the 128-bit lanes; the permute puts them back. */
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xD8);
}

LOCATE_AVX2 static uint32_t locate_avx2(locate_state *st, const uint16_t *base, uint32_t n,
                                        uint32_t k, const uint32_t *rank,
                                        const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                        uint16_t *delta, uint32_t *next) {
  uint32_t out = 0, i = 0;
  uint16_t hit_delta[LOCATE_BLOCK];
  for (; i + LOCATE_BLOCK <= n && out < k; i += LOCATE_BLOCK) {
    __m256i lo = classes32(base + i), hi = classes32(base + i + 32);
    uint64_t hits = 0;
    int done = 0;
    for (unsigned a = 0; a < st->count; a++) {
      __m256i c = _mm256_set1_epi8((char)st->cls[a]);
      uint64_t m = (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(lo, c)) |
                   (uint64_t)(uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, c)) << 32;
      done |= locate_class(st, a, m, &hits, hit_delta, rank, cdelta);
    }
    out = locate_emit(hits, hit_delta, first + i, pos, delta, out);
    if (done)
      locate_compact(st);
  }
  *next = i;
  return out;
}

/* The classes of 64 elements as bytes: (bits >> 7) narrowed to its low
 * byte. */
LOCATE_AVX512 static inline __m512i classes64(const uint16_t *p) {
  __m512i a = _mm512_loadu_si512((const void *)p);
  __m512i b = _mm512_loadu_si512((const void *)(p + 32));
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(a, 7))),
                            _mm512_cvtepi16_epi8(_mm512_srli_epi16(b, 7)), 1);
}

/* Two blocks per pass over the classes: a class without a change in
 * either costs one test of its skip for 128 elements. */
LOCATE_AVX512 static uint32_t locate_avx512(locate_state *st, const uint16_t *base, uint32_t n,
                                            uint32_t k, const uint32_t *rank,
                                            const uint16_t *cdelta, uint64_t first,
                                            uint64_t *pos, uint16_t *delta, uint32_t *next) {
  uint32_t out = 0, i = 0;
  uint16_t hit_delta[2 * LOCATE_BLOCK];
  for (; i + 2 * LOCATE_BLOCK <= n && out < k; i += 2 * LOCATE_BLOCK) {
    __m512i lo = classes64(base + i), hi = classes64(base + i + LOCATE_BLOCK);
    uint64_t hits_lo = 0, hits_hi = 0;
    int done = 0;
    for (unsigned j = 0; j < st->count; j++) {
      __m512i c = _mm512_set1_epi8((char)st->cls[j]);
      uint64_t m_lo = _mm512_cmpeq_epi8_mask(lo, c), m_hi = _mm512_cmpeq_epi8_mask(hi, c);
      uint32_t cnt = (uint32_t)(__builtin_popcountll(m_lo) + __builtin_popcountll(m_hi));
      if (st->skip[j] >= cnt) { /* the common case: no change of the class here */
        st->skip[j] -= cnt;
        continue;
      }
      int d = locate_class(st, j, m_lo, &hits_lo, hit_delta, rank, cdelta);
      if (!d)
        d = locate_class(st, j, m_hi, &hits_hi, hit_delta + LOCATE_BLOCK, rank, cdelta);
      done |= d;
    }
    out = locate_emit(hits_lo, hit_delta, first + i, pos, delta, out);
    out = locate_emit(hits_hi, hit_delta + LOCATE_BLOCK, first + i + LOCATE_BLOCK, pos, delta, out);
    if (done)
      locate_compact(st);
  }
  if (i + LOCATE_BLOCK <= n && out < k) { /* one block left */
    __m512i cls = classes64(base + i);
    uint64_t hits = 0;
    int done = 0;
    for (unsigned j = 0; j < st->count; j++)
      done |= locate_class(st, j, _mm512_cmpeq_epi8_mask(cls, _mm512_set1_epi8((char)st->cls[j])),
                           &hits, hit_delta, rank, cdelta);
    out = locate_emit(hits, hit_delta, first + i, pos, delta, out);
    if (done)
      locate_compact(st);
    i += LOCATE_BLOCK;
  }
  *next = i;
  return out;
}

static int have_avx512(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
}
#endif

uint32_t pulse_chunk_locate_isa(int isa, const uint16_t *base, uint32_t n, uint32_t k,
                                const uint32_t *start, const uint32_t *rank,
                                const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                uint16_t *delta) {
  locate_state st;
  if (isa == PULSE_ISA_SCALAR || !locate_init(&st, start, rank))
    return pulse_chunk_locate(base, n, k, start, rank, cdelta, first, pos, delta);
  uint32_t out = 0, next = 0;
#if PULSE_HAVE_X86_DISPATCH
  if ((isa == PULSE_ISA_AUTO || isa == PULSE_CHUNK_LOCATE_AVX512) && have_avx512())
    out = locate_avx512(&st, base, n, k, rank, cdelta, first, pos, delta, &next);
  else if ((isa == PULSE_ISA_AUTO || isa == PULSE_ISA_AVX2) &&
           pulse_isa_available(PULSE_ISA_AVX2))
    out = locate_avx2(&st, base, n, k, rank, cdelta, first, pos, delta, &next);
#endif
  return locate_tail(&st, base, next, n, k, rank, cdelta, first, pos, delta, out);
}

uint32_t pulse_chunk_locate_fast(const uint16_t *base, uint32_t n, uint32_t k,
                                 const uint32_t *start, const uint32_t *rank,
                                 const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                 uint16_t *delta) {
  return pulse_chunk_locate_isa(PULSE_ISA_AUTO, base, n, k, start, rank, cdelta, first, pos,
                                delta);
}
