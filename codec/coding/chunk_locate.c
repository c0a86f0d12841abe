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
 * and block, then each change's block and lane without a branch); where it
 * also has AVX-512 VBMI and BITALG and GFNI, windows from 1/256 to 1/40
 * changed count eight classes a block at once (locate_groups); the older paths
 * resolve the few blocks where a wanted rank falls bit by bit.
 * tests/codec/driver/locate_bench.c times each path.
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

/* Appends a window's hits in element order: only its blocks with hits
 * (`nonempty`), the first two of a block written without a branch (a slot
 * past them is written over by the next change, and both lie below k), a
 * loop for the rest. The blocks' one-by-one emit mispredicted about once a
 * block (0.2 cycles an element at 1%, measured). Clears the hits. */
static inline uint32_t locate_emit_window(uint64_t *hits, uint64_t nonempty,
                                          const uint16_t *hit_delta, uint64_t at0, uint32_t k,
                                          uint64_t *pos, uint16_t *delta, uint32_t out) {
  for (; nonempty != 0; nonempty &= nonempty - 1) {
    unsigned b = (unsigned)__builtin_ctzll(nonempty);
    uint64_t h = hits[b], at = at0 + (uint64_t)b * LOCATE_BLOCK;
    const uint16_t *hd = hit_delta + b * LOCATE_BLOCK;
    hits[b] = 0;
    if (out + 2 <= k) {
      unsigned cnt = (unsigned)__builtin_popcountll(h), l0 = (unsigned)__builtin_ctzll(h);
      uint64_t h1 = h & (h - 1);
      unsigned l1 = h1 != 0 ? (unsigned)__builtin_ctzll(h1) : 0u;
      pos[out] = at + l0, delta[out] = hd[l0];
      pos[out + 1] = at + l1, delta[out + 1] = hd[l1];
      if (cnt <= 2) {
        out += cnt;
        continue;
      }
      out += 2;
      h = h1 & (h1 - 1);
    }
    out = locate_emit(h, hd, at, pos, delta, out);
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

/* A window's class bytes, nb blocks from base + i, into cls. */
LOCATE_WIN static inline void window_classes(uint8_t *cls, const uint16_t *base, uint32_t i,
                                             uint32_t nb) {
  for (uint32_t b = 0; b < nb; b++)
    _mm512_store_si512((void *)(cls + b * LOCATE_BLOCK), classes64(base + i + b * LOCATE_BLOCK));
}

/* The next window's base lines (32 elements each), asked for while this
 * window's passes run: the pass reads the base at memory speed, and the
 * hardware's prefetch alone left it waiting (10% more CPU time per pull at
 * 250 M parameters, 2%). Asked for all at once (ahead_rest), the 128
 * misses queue behind the core's few miss buffers and the pass waits on
 * its own prefetches; both passes ask for one line at a time between their
 * steps instead (ahead_one), and for what is left at the window's end
 * (locate_bench, medians of alternating runs on a noisy machine: groups at
 * 0.5% / 1% of a chunk changed 0.31 -> 0.21, 0.40 -> 0.33 ns an element;
 * windows at 3% / 5% 0.73 -> 0.67, 0.88 -> 0.84). */
typedef struct {
  const char *at;
  uint32_t next, end;
} window_ahead;

/* Nothing to ask for when the next window does not fit whole in the
 * chunk (and no pointer past the chunk is formed). */
static inline window_ahead ahead_start(const uint16_t *base, uint32_t i, uint32_t n) {
  window_ahead w = {NULL, 0, 0};
  if (i + 2 * LOCATE_WINDOW <= n)
    w.at = (const char *)(base + i + LOCATE_WINDOW), w.end = LOCATE_WINDOW * 2 / 64;
  return w;
}

static inline void ahead_one(window_ahead *w) {
  if (w->next < w->end)
    __builtin_prefetch(w->at + 64 * w->next++);
}

static inline void ahead_rest(window_ahead *w) {
  while (w->next < w->end)
    __builtin_prefetch(w->at + 64 * w->next++);
}

/* The change of class byte c that is element `in` of its class in block b
 * of the window: its bit in the block's hits, its delta at its lane. */
LOCATE_WIN static inline void window_hit(const uint8_t *cls, uint32_t b, uint32_t in, uint8_t c,
                                         uint16_t d, uint64_t *hits, uint64_t *nonempty,
                                         uint16_t *hit_delta) {
  uint64_t m = _mm512_cmpeq_epi8_mask(_mm512_load_si512((const void *)(cls + b * LOCATE_BLOCK)),
                                      _mm512_set1_epi8((char)c));
  uint64_t bit = _pdep_u64(1ull << in, m);
  hits[b] |= bit;
  *nonempty |= 1ull << b;
  hit_delta[b * LOCATE_BLOCK + (unsigned)_tzcnt_u64(bit)] = d;
}

/* The state the reference's loop goes on from after the windows: each
 * active class's elements seen; a stalled class wants nothing more. */
static inline void window_leave(locate_state *st, const uint32_t *seen, const uint8_t *stalled,
                                uint32_t *seen_out) {
  for (unsigned a = 0; a < st->count; a++) {
    seen_out[a] = seen[a];
    if (stalled[a])
      st->cursor[a] = st->end[a];
  }
}

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
  uint64_t hits[LOCATE_WINDOW_BLOCKS] = {0}, nonempty = 0;
  uint32_t out = 0, i = 0;
  unsigned count = st->count;
  while (i + LOCATE_BLOCK <= n && out < k) {
    uint32_t nb = (n - i) / LOCATE_BLOCK;
    nb = nb < LOCATE_WINDOW_BLOCKS ? nb : LOCATE_WINDOW_BLOCKS;
    window_classes(cls, base, i, nb);
    window_ahead ahead = ahead_start(base, i, n); /* a line every 8 blocks of a class, every change */
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
        if ((b & 7) == 7)
          ahead_one(&ahead);
      }
      for (uint32_t b = nb; b < LOCATE_WINDOW_BLOCKS; b++)
        u[b] = 0xFFFF;
      /* 2. Its changes in the window, each found as it is walked. (Listing
       * every class's first and finding them in one loop, as the groups
       * do, measured slower here: locate_bench at 5%, medians of six
       * alternating runs, 0.76 -> 0.85 ns an element.) */
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
        window_hit(cls, b, r - (b > 0 ? u[b - 1] : 0u), st->cls[a], cdelta[at], hits, &nonempty,
                   hit_delta);
        low = w + 1;
        ahead_one(&ahead);
      }
      st->cursor[a] = at;
      seen[a] = s0 + run;
      lo[a] = low;
    }
    ahead_rest(&ahead);
    out = locate_emit_window(hits, nonempty, hit_delta, first + i, k, pos, delta, out);
    nonempty = 0;
    i += nb * LOCATE_BLOCK;
  }
  window_leave(st, seen, stalled, seen_out);
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

#if PULSE_HAVE_X86_DISPATCH
/* ----------------------------------------------------------------- groups
 * The windows above, with pass 1 taken eight classes at a time: per block,
 * a byte table turns each class byte into its bit among the group's eight
 * (zero for other classes), a bit transpose and a byte popcount count
 * each bit per qword, and a sum of absolute differences adds the qwords:
 * about ten instructions a block for eight classes, where the windows pay
 * about five per class (pulse_bit_counts64_avx512, as detect_ranked.c
 * counts its hot classes). The running counts stay in [block][member] order, eight u16 a
 * block; a change's block is then found with two masked compares of
 * eight super-blocks of eight blocks, and two of the eight blocks of its
 * super-block. Each class's changes in the window are listed first, so
 * that those finds, which do not depend on one another, run in one loop
 * instead of behind each class's loop exit. tests/codec/driver/
 * locate_bench.c, CPU ns per element on a quiet machine, blocks / windows
 * / groups: 0.3% 0.27 / 0.32 / 0.25, 0.5% 0.33 / 0.34 / 0.28, 1% 0.47 /
 * 0.41 / 0.35, 2% 0.73 / 0.51 / 0.50, 3% 0.95 / 0.58 / 0.60, 5% 1.26 /
 * 0.68 / 0.77. With the next window's lines asked for one at a time
 * (window_ahead) the two cross between 2.5% and 3%: windows / groups
 * 1.5% 0.48 / 0.38, 2% 0.52 / 0.48, 2.5% 0.55 / 0.53, 3% 0.59 / 0.59,
 * 4% 0.64 / 0.69 (medians of three runs of 9; the windows' own change
 * after it left the crossing near 2.5%); so the groups take the
 * densities from 1/256 of a chunk changed to 1/40. */
#define LOCATE_GROUPS_DENSITY_MIN_INV 256u
#define LOCATE_GROUPS_DENSITY_INV 40u
#define LOCATE_GROUP 8u
#define LOCATE_GROUPS_MAX (LOCATE_WINDOW_MAX_ACTIVE / LOCATE_GROUP)
#define LOCATE_GRP                                                                                 \
  __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bitalg,gfni,bmi,bmi2,popcnt")))

/* One change of the window found in pass 2: its entry in rank/cdelta, its
 * rank within the window's elements of its class, its active class. */
typedef struct {
  uint32_t at;
  uint16_t r;
  uint8_t a;
} locate_todo;

/* The count of each of the group's members in the 64 elements of class
 * bytes e, in the u64 lanes of the result (lane j: member j). tab0..3:
 * the group's 256-byte table, class -> its member's bit (bytes 0..127
 * through the first two, 128..255 the other two). */
LOCATE_GRP static inline __m512i group_counts(__m512i e, __m512i tab0, __m512i tab1, __m512i tab2,
                                              __m512i tab3) {
  __m512i bit = _mm512_mask_blend_epi8(_mm512_movepi8_mask(e),
                                       _mm512_permutex2var_epi8(tab0, e, tab1),
                                       _mm512_permutex2var_epi8(tab2, e, tab3));
  return pulse_bit_counts64_avx512(bit);
}

LOCATE_GRP static uint32_t locate_groups(locate_state *st, const uint16_t *base, uint32_t n,
                                         uint32_t k, const uint32_t *rank,
                                         const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                         uint16_t *delta, uint32_t *next, uint32_t *seen_out) {
  /* seen, lo and stalled as in locate_window. */
  uint32_t seen[LOCATE_WINDOW_MAX_ACTIVE] = {0}, lo[LOCATE_WINDOW_MAX_ACTIVE] = {0};
  uint8_t stalled[LOCATE_WINDOW_MAX_ACTIVE] = {0};
  _Alignas(64) uint8_t cls[LOCATE_WINDOW];
  _Alignas(64) uint8_t tab[LOCATE_GROUPS_MAX][256];
  /* upto[g][b][j]: member j's elements before block b (b = 0..64; blocks
   * past the window's last: 0xFFFF, never at or below a rank); sup[g][s]:
   * upto[g][8 s + 8], the counts after each super-block. */
  _Alignas(64) uint16_t upto[LOCATE_GROUPS_MAX][LOCATE_WINDOW_BLOCKS + 1][LOCATE_GROUP];
  _Alignas(64) uint16_t sup[LOCATE_GROUPS_MAX][LOCATE_WINDOW_BLOCKS / LOCATE_GROUP][LOCATE_GROUP];
  _Alignas(64) uint16_t hit_delta[LOCATE_WINDOW];
  locate_todo todo[LOCATE_WINDOW];
  uint64_t hits[LOCATE_WINDOW_BLOCKS] = {0}, nonempty = 0;
  uint32_t out = 0, i = 0;
  unsigned count = st->count, groups = (count + LOCATE_GROUP - 1) / LOCATE_GROUP;
  memset(tab, 0, sizeof tab);
  for (unsigned a = 0; a < count; a++)
    tab[a / LOCATE_GROUP][st->cls[a]] = (uint8_t)(1u << (a % LOCATE_GROUP));
  for (unsigned g = 0; g < groups; g++)
    memset(upto[g][0], 0, sizeof upto[g][0]);
  while (i + LOCATE_BLOCK <= n && out < k) {
    uint32_t nb = (n - i) / LOCATE_BLOCK;
    nb = nb < LOCATE_WINDOW_BLOCKS ? nb : LOCATE_WINDOW_BLOCKS;
    window_classes(cls, base, i, nb);
    window_ahead ahead = ahead_start(base, i, n); /* a line every other block and every change */
    /* 1. Each group's running counts, block by block. */
    for (unsigned g = 0; g < groups; g++) {
      const uint8_t *t = tab[g];
      __m512i t0 = _mm512_load_si512((const void *)t), t1 = _mm512_load_si512((const void *)(t + 64));
      __m512i t2 = _mm512_load_si512((const void *)(t + 128));
      __m512i t3 = _mm512_load_si512((const void *)(t + 192));
      __m512i run = _mm512_setzero_si512();
      for (uint32_t b = 0; b < nb; b++) {
        __m512i e = _mm512_load_si512((const void *)(cls + b * LOCATE_BLOCK));
        run = _mm512_add_epi64(run, group_counts(e, t0, t1, t2, t3));
        _mm_store_si128((__m128i *)(void *)upto[g][b + 1], _mm512_cvtepi64_epi16(run));
        if (b & 1)
          ahead_one(&ahead);
      }
      for (uint32_t b = nb; b < LOCATE_WINDOW_BLOCKS; b++)
        _mm_store_si128((__m128i *)(void *)upto[g][b + 1], _mm_set1_epi16(-1));
      for (unsigned s = 0; s < LOCATE_WINDOW_BLOCKS / LOCATE_GROUP; s++)
        memcpy(sup[g][s], upto[g][LOCATE_GROUP * s + LOCATE_GROUP], sizeof sup[g][s]);
    }
    /* 2. Each class's changes in the window, listed. */
    uint32_t listed = 0;
    for (unsigned a = 0; a < count; a++) {
      if (stalled[a] || st->cursor[a] == st->end[a])
        continue;
      uint32_t run = upto[a / LOCATE_GROUP][nb][a % LOCATE_GROUP];
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
        todo[listed].at = at, todo[listed].r = (uint16_t)r, todo[listed].a = (uint8_t)a;
        listed++;
        low = w + 1;
      }
      st->cursor[a] = at;
      seen[a] = s0 + run;
      lo[a] = low;
    }
    /*    Then each listed change's block (the blocks before it hold at
     * most r of its class), its lane by a pdep of the block's mask. */
    for (uint32_t t = 0; t < listed; t++) {
      unsigned a = todo[t].a, g = a / LOCATE_GROUP, j = a % LOCATE_GROUP;
      uint64_t member = 0x0101010101010101ull << j;
      __m512i rv = _mm512_set1_epi16((short)todo[t].r);
      uint32_t s = (uint32_t)__builtin_popcountll(
          ((uint64_t)_mm512_cmple_epu16_mask(_mm512_load_si512((const void *)sup[g][0]), rv) |
           (uint64_t)_mm512_cmple_epu16_mask(_mm512_load_si512((const void *)sup[g][4]), rv)
               << 32) &
          member);
      const uint16_t *u = upto[g][LOCATE_GROUP * s + 1];
      uint32_t b = LOCATE_GROUP * s +
                   (uint32_t)__builtin_popcountll(
                       ((uint64_t)_mm512_cmple_epu16_mask(_mm512_loadu_si512((const void *)u), rv) |
                        (uint64_t)_mm512_cmple_epu16_mask(
                            _mm512_loadu_si512((const void *)(u + 4 * LOCATE_GROUP)), rv)
                            << 32) &
                       member);
      window_hit(cls, b, todo[t].r - upto[g][b][j], st->cls[a], cdelta[todo[t].at], hits,
                 &nonempty, hit_delta);
      ahead_one(&ahead);
    }
    ahead_rest(&ahead);
    out = locate_emit_window(hits, nonempty, hit_delta, first + i, k, pos, delta, out);
    nonempty = 0;
    i += nb * LOCATE_BLOCK;
  }
  window_leave(st, seen, stalled, seen_out);
  *next = i;
  return out;
}

static int have_groups(void) {
  return have_window() && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("gfni");
}
#endif

uint32_t pulse_chunk_locate_isa(int isa, const uint16_t *base, uint32_t n, uint32_t k,
                                const uint32_t *start, const uint32_t *rank,
                                const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                uint16_t *delta) {
  locate_state st;
  uint32_t out = 0, next = 0;
#if PULSE_HAVE_X86_DISPATCH
  if ((isa == PULSE_CHUNK_LOCATE_GROUPS ||
       (isa == PULSE_ISA_AUTO && (uint64_t)k * LOCATE_GROUPS_DENSITY_MIN_INV >= n &&
        (uint64_t)k * LOCATE_GROUPS_DENSITY_INV < n)) &&
      have_groups() && locate_init(&st, start, rank, LOCATE_WINDOW_MAX_ACTIVE)) {
    uint32_t seen[LOCATE_WINDOW_MAX_ACTIVE];
    out = locate_groups(&st, base, n, k, rank, cdelta, first, pos, delta, &next, seen);
    return locate_window_tail(&st, seen, base, next, n, k, rank, cdelta, first, pos, delta, out);
  }
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
      isa == PULSE_CHUNK_LOCATE_GROUPS ||
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
