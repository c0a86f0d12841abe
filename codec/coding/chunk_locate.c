/* chunk_locate.c - pulse_chunk_locate (chunk_coder.c, the reference) on
 * blocks of 64 base elements with AVX-512BW or AVX2: the same positions and
 * deltas in the same order, for every input.
 *
 * The reference pays a load, a compare and a store per base element, and
 * neighbours of one class chain through the store. Only the classes that
 * have changes in the chunk (typically 10 to 20 of the 256) matter: here
 * each of them costs one byte compare, a mask and a popcount per 64
 * elements. The default, where the CPU has AVX-512BW and BMI2, takes
 * windows of 4096 elements in two passes (locate_window: counts per class
 * and block, then each change's block and lane without a branch); the
 * older paths resolve the few blocks where a wanted rank falls bit by bit.
 * A decode without a class index spends most of its time here
 * (python/bench_moe.py: 80% of a region stage). More active classes than
 * the path takes (LOCATE_MAX_ACTIVE, LOCATE_WINDOW_MAX_ACTIVE), or none of
 * the instruction sets, take the reference. */
#include <string.h>

#include "chunk_impl.h"
#include "chunk_locate_impl.h"
#include "detect_impl.h"
#include "pulse_elem.h"

/* Above this many classes with changes the per-class compares cost more
 * than the reference's per-element work: in the blocks below, and in the
 * two-pass windows further down (measured at 1% density: a class costs
 * them about 2 cycles per 64 elements, the reference about 2.3 cycles per
 * element, even at about 60 classes). */
#define LOCATE_MAX_ACTIVE 32u
#define LOCATE_WINDOW_MAX_ACTIVE 48u
#define LOCATE_BLOCK 64u

/* The classes with changes left to find, and where each stands. */
typedef struct {
  unsigned count;
  uint8_t cls[LOCATE_WINDOW_MAX_ACTIVE];
  /* Elements of the class to pass before its next change: that change's
   * class rank minus the elements passed so far (one number to load, test
   * and store per class and block). UINT32_MAX once all are found. */
  uint32_t skip[LOCATE_WINDOW_MAX_ACTIVE];
  uint32_t cursor[LOCATE_WINDOW_MAX_ACTIVE]; /* the next change's entry in rank/cdelta */
  uint32_t end[LOCATE_WINDOW_MAX_ACTIVE];    /* after the class's last entry */
} locate_state;

/* Fills st from the class-major rank form; 0 when more than `max` classes
 * have changes. */
static int locate_init(locate_state *st, const uint32_t *start, const uint32_t *rank,
                       unsigned max) {
  st->count = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++) {
    if (start[c] >= start[c + 1])
      continue;
    if (st->count == max)
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

#if PULSE_HAVE_X86_DISPATCH
/* ---------------------------------------------------------------- windows
 * The blocks above stop at every change: which of the active classes have
 * one in the block is known only there, each such stop is a mispredicted
 * branch and a chain of loads through the class's state, and at 1-2%
 * density (a change every 50-100 elements) the stops cost more than the
 * compares (about 55 cycles each, measured). Here a window of
 * LOCATE_WINDOW_BLOCKS blocks is taken in two passes instead:
 *   1. per active class, its element count up to each block of the window
 *      (a compare, a mask and a popcount per block and class; the running
 *      sum stays in a register);
 *   2. per active class, its changes that fall in the window: the block of
 *      each is the number of those counts at or below its rank (two 32-lane
 *      compares), its lane a pdep of the block's mask; they go into the
 *      window's hit bitmap and delta slots, without a branch per change.
 * Then the hits come out in storage order from the bitmap. */
#define LOCATE_WINDOW_BLOCKS 64u
/* The windows are the default from 1/128 of the chunk changed (or with
 * more classes than the blocks take); below it the blocks' stops are rare
 * and their single pass costs less. Chunks of 1M N(0, 0.02) elements read
 * from memory, one thread's CPU time per element, blocks / windows: 0.2%
 * 0.23 / 0.31 ns, 0.5% 0.33 / 0.36, 1% 0.47 / 0.44, 2% 0.70 / 0.52. */
#define LOCATE_WINDOW_DENSITY_INV 128u
#define LOCATE_WINDOW (LOCATE_WINDOW_BLOCKS * LOCATE_BLOCK)
#define LOCATE_WIN __attribute__((target("avx512f,avx512bw,bmi,bmi2,popcnt")))

LOCATE_WIN static uint32_t locate_window(locate_state *st, const uint16_t *base, uint32_t n,
                                         uint32_t k, const uint32_t *rank,
                                         const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                         uint16_t *delta, uint32_t *next, uint32_t *seen_out) {
  /* st->skip is unused here: seen (elements of the class passed) and lo
   * (the lowest rank still findable: one past the last found; a rank below
   * it stalls its class for good, as in the reference) instead. */
  uint32_t seen[LOCATE_WINDOW_MAX_ACTIVE] = {0}, lo[LOCATE_WINDOW_MAX_ACTIVE] = {0};
  uint8_t stalled[LOCATE_WINDOW_MAX_ACTIVE] = {0};
  _Alignas(64) uint8_t cls[LOCATE_WINDOW];
  _Alignas(64) uint16_t upto[LOCATE_WINDOW_MAX_ACTIVE][LOCATE_WINDOW_BLOCKS];
  _Alignas(64) uint16_t hit_delta[LOCATE_WINDOW];
  uint64_t hits[LOCATE_WINDOW_BLOCKS] = {0};
  uint32_t out = 0, i = 0;
  unsigned count = st->count;
  while (i + LOCATE_BLOCK <= n && out < k) {
    uint32_t nb = (n - i) / LOCATE_BLOCK;
    nb = nb < LOCATE_WINDOW_BLOCKS ? nb : LOCATE_WINDOW_BLOCKS;
    for (uint32_t b = 0; b < nb; b++)
      _mm512_store_si512((void *)(cls + b * LOCATE_BLOCK), classes64(base + i + b * LOCATE_BLOCK));
    /* The next window's base lines (32 elements each), while this one's
     * two passes run: the pass reads the base at memory speed, and the
     * hardware's prefetch alone left it waiting (10% more CPU time per
     * pull at 250 M parameters, 2%). */
    if (i + 2 * LOCATE_WINDOW <= n)
      for (uint32_t b = 0; b < 2 * LOCATE_WINDOW_BLOCKS; b++)
        __builtin_prefetch(base + i + LOCATE_WINDOW + b * 32u);
    for (unsigned a = 0; a < count; a++) {
      if (stalled[a] || st->cursor[a] == st->end[a])
        continue;
      /* 1. The class's count up to each block (past the window's last
       * block: never at or below a rank). */
      __m512i c = _mm512_set1_epi8((char)st->cls[a]);
      uint16_t *u = upto[a];
      uint32_t run = 0;
      for (uint32_t b = 0; b < nb; b++) {
        run += (uint32_t)__builtin_popcountll(
            _mm512_cmpeq_epi8_mask(_mm512_load_si512((const void *)(cls + b * LOCATE_BLOCK)), c));
        u[b] = (uint16_t)run;
      }
      for (uint32_t b = nb; b < LOCATE_WINDOW_BLOCKS; b++)
        u[b] = 0xFFFF;
      /* 2. Its changes in the window. */
      __m512i u0 = _mm512_load_si512((const void *)u);
      __m512i u1 = _mm512_load_si512((const void *)(u + 32));
      uint32_t at = st->cursor[a], end = st->end[a], s0 = seen[a], low = lo[a];
      for (; at < end; at++) {
        uint32_t w = rank[at];
        if (w < low) { /* does not increase: never found, nor any after it */
          stalled[a] = 1;
          break;
        }
        uint32_t r = w - s0;
        if (r >= run)
          break;
        __m512i rv = _mm512_set1_epi16((short)r);
        uint32_t b = (uint32_t)__builtin_popcount(_mm512_cmple_epu16_mask(u0, rv)) +
                     (uint32_t)__builtin_popcount(_mm512_cmple_epu16_mask(u1, rv));
        uint32_t in = r - (b > 0 ? u[b - 1] : 0u);
        uint64_t m = _mm512_cmpeq_epi8_mask(
            _mm512_load_si512((const void *)(cls + b * LOCATE_BLOCK)), c);
        uint64_t bit = _pdep_u64(1ull << in, m);
        hits[b] |= bit;
        hit_delta[b * LOCATE_BLOCK + (unsigned)_tzcnt_u64(bit)] = cdelta[at];
        low = w + 1;
      }
      st->cursor[a] = at;
      seen[a] = s0 + run;
      lo[a] = low;
    }
    for (uint32_t b = 0; b < nb; b++) {
      out = locate_emit(hits[b], hit_delta + b * LOCATE_BLOCK, first + i + b * LOCATE_BLOCK, pos,
                        delta, out);
      hits[b] = 0;
    }
    i += nb * LOCATE_BLOCK;
  }
  /* The state the reference's loop goes on from: a stalled class wants
   * nothing more. */
  for (unsigned a = 0; a < count; a++) {
    seen_out[a] = seen[a];
    if (stalled[a])
      st->cursor[a] = st->end[a];
  }
  *next = i;
  return out;
}

/* The reference's loop over base[i0, n) from where the windows left each
 * active class (its elements seen, its cursor). */
static uint32_t locate_window_tail(const locate_state *st, const uint32_t *seen_in,
                                   const uint16_t *base, uint32_t i0, uint32_t n, uint32_t k,
                                   const uint32_t *rank, const uint16_t *cdelta, uint64_t first,
                                   uint64_t *pos, uint16_t *delta, uint32_t out) {
  uint32_t seen[PULSE_CLASS_COUNT] = {0}, cursor[PULSE_CLASS_COUNT], end[PULSE_CLASS_COUNT],
                                     want[PULSE_CLASS_COUNT];
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    want[c] = UINT32_MAX, cursor[c] = end[c] = 0;
  for (unsigned a = 0; a < st->count; a++) {
    unsigned c = st->cls[a];
    seen[c] = seen_in[a];
    cursor[c] = st->cursor[a];
    end[c] = st->end[a];
    want[c] = cursor[c] < end[c] ? rank[cursor[c]] : UINT32_MAX;
  }
  for (uint32_t i = i0; i < n && out < k; i++) {
    unsigned c = pulse_bf16_class(base[i]);
    if (seen[c]++ != want[c])
      continue;
    pos[out] = first + i;
    delta[out] = cdelta[cursor[c]];
    out++;
    cursor[c]++;
    want[c] = cursor[c] < end[c] ? rank[cursor[c]] : UINT32_MAX;
  }
  return out;
}

static int have_window(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2") &&
         __builtin_cpu_supports("popcnt");
}
#endif

uint32_t pulse_chunk_locate_isa(int isa, const uint16_t *base, uint32_t n, uint32_t k,
                                const uint32_t *start, const uint32_t *rank,
                                const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                uint16_t *delta) {
  locate_state st;
  uint32_t out = 0, next = 0;
#if PULSE_HAVE_X86_DISPATCH
  if ((isa == PULSE_ISA_AUTO || isa == PULSE_CHUNK_LOCATE_WINDOW) && have_window() &&
      locate_init(&st, start, rank, LOCATE_WINDOW_MAX_ACTIVE) &&
      (isa == PULSE_CHUNK_LOCATE_WINDOW || st.count > LOCATE_MAX_ACTIVE ||
       (uint64_t)k * LOCATE_WINDOW_DENSITY_INV >= n)) {
    uint32_t seen[LOCATE_WINDOW_MAX_ACTIVE];
    out = locate_window(&st, base, n, k, rank, cdelta, first, pos, delta, &next, seen);
    return locate_window_tail(&st, seen, base, next, n, k, rank, cdelta, first, pos, delta, out);
  }
#endif
  if (isa == PULSE_ISA_SCALAR || isa == PULSE_CHUNK_LOCATE_WINDOW ||
      !locate_init(&st, start, rank, LOCATE_MAX_ACTIVE))
    return pulse_chunk_locate(base, n, k, start, rank, cdelta, first, pos, delta);
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
