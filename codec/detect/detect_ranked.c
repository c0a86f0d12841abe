/* detect_ranked.c - change detection of one chunk that also gives the
 * encoder each change's position class and rank (detect_ranked_impl.h).
 *
 * The class-model encoder needs, per change, how many base elements of its
 * class come before it in its chunk: a histogram pass over every base
 * element, which at 1 B parameters cost more than reading the weights
 * (about 1 ns an element: increments of the few classes that hold most
 * weights wait on each other). Detection already has the base (the
 * snapshot) in registers, so here the counts come from the same pass, and
 * mostly without a histogram: per block of 64 elements, the 8 classes
 * most frequent in the chunk's first elements are counted with a byte
 * compare and a popcount each (with AVX-512, all eight at once through a
 * bit transpose: hot_counts); only elements of other classes (a few
 * percent of a model's weights) are counted one by one (with AVX-512, the
 * class bytes of those are packed aside without a branch and counted in
 * batches). A change's rank is its class's count before the block plus
 * the popcount of its class's mask below it. The result is the
 * reference's, bit for bit: positions and bits as pulse_detect_ref,
 * classes, ranks and counts as
 * pulse_chunk_classify (tests compare them). */
#include <stdlib.h>
#include <string.h>

#include "detect_impl.h"
#include "detect_ranked_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define RANKED_BLOCK 64u
#define RANKED_HOT 8u
/* Elements counted one by one before the hot classes are chosen. */
#define RANKED_SAMPLE 256u

void pulse_detect_chunk_free(pulse_detect_chunk *c) {
  if (c == NULL)
    return;
  pulse_changes_free(&c->changes);
  free(c->cls);
  free(c->rank);
  c->cls = NULL;
  c->rank = NULL;
  c->rank_capacity = 0;
}

/* Room for `extra` more changes in every array. */
static pulse_status chunk_room(pulse_detect_chunk *c, uint64_t extra) {
  pulse_changes *ch = &c->changes;
  if (ch->capacity - ch->count >= extra && c->rank_capacity - ch->count >= extra)
    return PULSE_OK;
  uint64_t want = ch->capacity < 1024 ? 1024 : ch->capacity;
  while (want < ch->count + extra)
    want *= 2;
  PULSE_TRY(pulse_changes_reserve(ch, want));
  if (c->rank_capacity < want) {
    uint8_t *cls = realloc(c->cls, (size_t)want);
    if (cls != NULL)
      c->cls = cls;
    uint32_t *rank = realloc(c->rank, (size_t)want * sizeof *rank);
    if (rank != NULL)
      c->rank = rank;
    if (cls == NULL || rank == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "detect: %llu changes", (unsigned long long)want);
    c->rank_capacity = want;
  }
  return PULSE_OK;
}

static inline void push(pulse_detect_chunk *c, uint64_t pos, uint16_t old, uint16_t fresh,
                        unsigned cls, uint32_t rank) {
  uint64_t k = c->changes.count++;
  c->changes.pos[k] = pos;
  c->changes.old_bits[k] = old;
  c->changes.new_bits[k] = fresh;
  c->cls[k] = (uint8_t)cls;
  c->rank[k] = rank;
}

static inline uint16_t new_bits_at(const void *cur, pulse_dtype dtype, uint64_t i) {
  const unsigned char *bytes = cur;
  if (dtype == PULSE_DTYPE_F32) {
    uint32_t u;
    memcpy(&u, bytes + i * 4, sizeof u);
    return pulse_bf16_from_f32_bits(u);
  }
  uint16_t b;
  memcpy(&b, bytes + i * 2, sizeof b);
  return b;
}

/* Elements [lo, hi) of the chunk at `first`, one by one. */
static pulse_status scan_scalar(const void *cur, pulse_dtype dtype, const uint16_t *snap,
                                uint64_t first, uint32_t lo, uint32_t hi,
                                pulse_detect_chunk *out) {
  for (uint32_t j = lo; j < hi; j++) {
    uint16_t old = snap[first + j];
    uint16_t fresh = new_bits_at(cur, dtype, first + j);
    unsigned c = pulse_bf16_class(old);
    if (pulse_bf16_changed(old, fresh)) {
      PULSE_TRY(chunk_room(out, 1));
      push(out, first + j, old, fresh, c, out->hist[c]);
    }
    out->hist[c]++;
  }
  return PULSE_OK;
}

/* The RANKED_HOT classes with the largest counts so far (distinct). */
static void choose_hot(const uint32_t *hist, uint8_t *hot) {
  uint8_t taken[PULSE_CLASS_COUNT] = {0};
  for (unsigned k = 0; k < RANKED_HOT; k++) {
    unsigned best = 0;
    int found = 0;
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
      if (!taken[c] && (!found || hist[c] > hist[best])) {
        best = c;
        found = 1;
      }
    taken[best] = 1;
    hot[k] = (uint8_t)best;
  }
}

#if PULSE_HAVE_X86_DISPATCH
#define RANKED_AVX2 __attribute__((target("avx2,bmi,popcnt")))

/* Class bytes (BF16 exponent fields) of 32 elements in order. */
RANKED_AVX2 static inline __m256i classes32(__m256i a, __m256i b) {
  const __m256i low = _mm256_set1_epi16(0xFF);
  __m256i ca = _mm256_and_si256(_mm256_srli_epi16(a, 7), low);
  __m256i cb = _mm256_and_si256(_mm256_srli_epi16(b, 7), low);
  return _mm256_permute4x64_epi64(_mm256_packus_epi16(ca, cb), 0xD8);
}

/* Bit j set where class byte j of (e0, e1) is c. */
RANKED_AVX2 static inline uint64_t class_mask(__m256i e0, __m256i e1, __m256i c) {
  uint32_t m0 = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(e0, c));
  uint32_t m1 = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(e1, c));
  return (uint64_t)m1 << 32 | m0;
}

RANKED_AVX2 static inline __m256i load16(const uint16_t *p) {
  return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* Bit j set where lane j of (n0, n1) differs from lane j of (s0, s1). */
RANKED_AVX2 static inline uint32_t diff32(__m256i n0, __m256i n1, __m256i s0, __m256i s1) {
  __m256i e0 = _mm256_cmpeq_epi16(n0, s0);
  __m256i e1 = _mm256_cmpeq_epi16(n1, s1);
  __m256i e = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
  return ~(uint32_t)_mm256_movemask_epi8(e);
}

/* Whole blocks of 64 from lo to hi (hi - lo a multiple of 64). The hot
 * classes' counts live in registers (hc, with the hist entries of the hot
 * classes stale) and are written to hist before a change reads it. Inlined
 * per dtype so the loop has no dtype branch. */
#define HOT_COUNT(k)                                                           \
  do {                                                                         \
    __m256i h = _mm256_set1_epi8((char)hot[k]);                               \
    __m256i m0 = _mm256_cmpeq_epi8(e0, h), m1 = _mm256_cmpeq_epi8(e1, h);      \
    seen0 = _mm256_or_si256(seen0, m0);                                        \
    seen1 = _mm256_or_si256(seen1, m1);                                        \
    hc[k] += (uint32_t)__builtin_popcount((uint32_t)_mm256_movemask_epi8(m0)) +  \
             (uint32_t)__builtin_popcount((uint32_t)_mm256_movemask_epi8(m1));   \
  } while (0)

__attribute__((always_inline)) RANKED_AVX2 static inline pulse_status
scan_avx2(const void *cur, const pulse_dtype dtype, const uint16_t *snap, uint64_t first,
          uint32_t lo, uint32_t hi, const uint8_t *hot, pulse_detect_chunk *out) {
  uint32_t *hist = out->hist;
  uint32_t hc[RANKED_HOT];
  for (unsigned k = 0; k < RANKED_HOT; k++)
    hc[k] = hist[hot[k]];
  _Alignas(32) uint16_t fresh[RANKED_BLOCK];
  for (uint32_t j = lo; j < hi; j += RANKED_BLOCK) {
    uint64_t i = first + j;
    const uint16_t *s = snap + i;
    __m256i s0 = load16(s), s1 = load16(s + 16), s2 = load16(s + 32), s3 = load16(s + 48);
    __m256i n0, n1, n2, n3;
    if (dtype == PULSE_DTYPE_F32) {
      const float *f = (const float *)cur + i;
      n0 = pulse_bf16x16_from_f32_avx2(f);
      n1 = pulse_bf16x16_from_f32_avx2(f + 16);
      n2 = pulse_bf16x16_from_f32_avx2(f + 32);
      n3 = pulse_bf16x16_from_f32_avx2(f + 48);
    } else {
      const uint16_t *b = (const uint16_t *)cur + i;
      n0 = load16(b), n1 = load16(b + 16), n2 = load16(b + 32), n3 = load16(b + 48);
    }
    uint64_t diff = diff32(n0, n1, s0, s1) | (uint64_t)diff32(n2, n3, s2, s3) << 32;
    __m256i e0 = classes32(s0, s1), e1 = classes32(s2, s3);
    if (diff != 0) {
      PULSE_TRY(chunk_room(out, (uint64_t)__builtin_popcountll(diff)));
      for (unsigned k = 0; k < RANKED_HOT; k++)
        hist[hot[k]] = hc[k];
      _mm256_store_si256((__m256i *)(void *)fresh, n0);
      _mm256_store_si256((__m256i *)(void *)(fresh + 16), n1);
      _mm256_store_si256((__m256i *)(void *)(fresh + 32), n2);
      _mm256_store_si256((__m256i *)(void *)(fresh + 48), n3);
      /* Ranks from the counts before this block: changes first. */
      for (uint64_t m = diff; m != 0; m = _blsr_u64(m)) {
        unsigned b = (unsigned)_tzcnt_u64(m);
        unsigned c = pulse_bf16_class(s[b]);
        uint64_t same = class_mask(e0, e1, _mm256_set1_epi8((char)c));
        uint32_t below = (uint32_t)__builtin_popcountll(same & ((1ull << b) - 1u));
        push(out, i + b, s[b], fresh[b], c, hist[c] + below);
      }
    }
    __m256i seen0 = _mm256_setzero_si256(), seen1 = _mm256_setzero_si256();
    HOT_COUNT(0);
    HOT_COUNT(1);
    HOT_COUNT(2);
    HOT_COUNT(3);
    HOT_COUNT(4);
    HOT_COUNT(5);
    HOT_COUNT(6);
    HOT_COUNT(7);
    uint64_t seen = (uint64_t)(uint32_t)_mm256_movemask_epi8(seen1) << 32 |
                    (uint32_t)_mm256_movemask_epi8(seen0);
    for (uint64_t m = ~seen; m != 0; m = _blsr_u64(m))
      hist[pulse_bf16_class(s[_tzcnt_u64(m)])]++;
  }
  for (unsigned k = 0; k < RANKED_HOT; k++)
    hist[hot[k]] = hc[k];
  return PULSE_OK;
}
#undef HOT_COUNT

#define RANKED_AVX512                                                          \
  __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512vbmi2,avx512bitalg,gfni,bmi,popcnt")))

static int have_avx512(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vbmi2") &&
         __builtin_cpu_supports("avx512bitalg") && __builtin_cpu_supports("gfni") &&
         __builtin_cpu_supports("bmi") && __builtin_cpu_supports("popcnt");
}

/* Cold class bytes waiting to be counted (see scan_avx512). */
#define COLD_BATCH 4096u

/* pulse_bf16x8_from_f32_bits_avx2 on 16 lanes, narrowed to 16 BF16 bits. */
RANKED_AVX512 static inline __m256i bf16x16_avx512(const float *src) {
  __m512i u = _mm512_loadu_si512((const void *)src);
  __mmask16 is_nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                             _mm512_set1_epi32(0x7F800000));
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
  __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  rounded = _mm512_mask_mov_epi32(rounded, is_nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(rounded); /* lanes hold 0..0xFFFF: exact */
}

RANKED_AVX512 static inline __m512i join256(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

static int have_avx512_bf16(void) { return __builtin_cpu_supports("avx512bf16"); }

/* 32 FP32 values to BF16 bits in order, by the CPU's own rounding
 * (VCVTNE2PS2BF16, AVX512_BF16): ties to even like pulse_bf16_from_f32_bits
 * for finite normal results, at a third of the software form's cost (it
 * was the largest part of the scan). The two differ only where the result
 * has exponent field 0 or 0xFF (the instruction flushes denormal inputs,
 * keeps NaN payloads): those 32 lanes take the software form instead, so
 * the bits are the reference's. Written in asm because the intrinsic needs
 * the avx512bf16 target on the shared scan body, which also runs on CPUs
 * without it. */
RANKED_AVX512 static inline __m512i bf16x32_hw(const float *src) {
  __m512 lo = _mm512_loadu_ps(src), hi = _mm512_loadu_ps(src + 16);
  __m512i r;
  __asm__("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
  const __m512i exp_field = _mm512_set1_epi16(0x7F80);
  __m512i e = _mm512_and_si512(r, exp_field);
  __mmask32 special = _mm512_testn_epi16_mask(r, exp_field) | _mm512_cmpeq_epi16_mask(e, exp_field);
  if (__builtin_expect(special != 0, 0))
    r = join256(bf16x16_avx512(src), bf16x16_avx512(src + 16));
  return r;
}

/* The hot classes' counts of one block of 64 class bytes e, all eight at
 * once (eight byte compares and popcounts cost twice as much): a table
 * lookup turns each byte into one bit, bit k for hot class k (0 for the
 * others, which *cold gets), and pulse_bit_counts64_avx512 counts each
 * bit. The table covers the 128 classes from `base` (a byte subtraction);
 * hot classes outside it are left to the cold count. */
RANKED_AVX512 static inline __m512i hot_counts(__m512i e, __m512i base, __m512i tab_lo,
                                               __m512i tab_hi, __mmask64 *cold) {
  __m512i d = _mm512_sub_epi8(e, base);
  __mmask64 outside = _mm512_movepi8_mask(d);
  __m512i bit = _mm512_maskz_permutex2var_epi8(~outside, tab_lo, d, tab_hi);
  *cold = _mm512_testn_epi8_mask(bit, bit);
  return pulse_bit_counts64_avx512(bit);
}

/* scan_avx2 on 64 lanes: the compares give masks, no movemask. The hot
 * counts live in `acc` (lane k: hot class k, when the table has it). */
__attribute__((always_inline)) RANKED_AVX512 static inline pulse_status
scan_avx512(const void *cur, const pulse_dtype dtype, const int hw_round, const uint16_t *snap,
            uint64_t first, uint32_t lo, uint32_t hi, const uint8_t *hot,
            pulse_detect_chunk *out) {
  uint32_t *hist = out->hist;
  uint8_t in_table[RANKED_HOT] = {0};
  uint8_t hot_of[PULSE_CLASS_COUNT]; /* lane of acc counting the class, or RANKED_HOT */
  memset(hot_of, RANKED_HOT, sizeof hot_of);
  _Alignas(64) uint8_t tab[128] = {0};
  _Alignas(64) uint64_t counts[RANKED_HOT] = {0};
  uint8_t base = (uint8_t)(hot[0] - 64u); /* the table around the most frequent */
  for (unsigned k = 0; k < RANKED_HOT; k++) {
    uint8_t d = (uint8_t)(hot[k] - base);
    if (d < 128) {
      tab[d] = (uint8_t)(1u << k);
      in_table[k] = 1;
      hot_of[hot[k]] = (uint8_t)k;
      counts[k] = hist[hot[k]];
    }
  }
  const __m512i tab_lo = _mm512_load_si512((const void *)tab);
  const __m512i tab_hi = _mm512_load_si512((const void *)(tab + 64));
  const __m512i base_v = _mm512_set1_epi8((char)base);
  __m512i acc = _mm512_load_si512((const void *)counts);
#define HOT_STORE()                                                            \
  do {                                                                         \
    _mm512_store_si512((void *)counts, acc);                                   \
    for (unsigned k = 0; k < RANKED_HOT; k++)                                  \
      if (in_table[k])                                                         \
        hist[hot[k]] = (uint32_t)counts[k];                                    \
  } while (0)
  _Alignas(64) uint16_t fresh[RANKED_BLOCK];
  uint8_t cold[COLD_BATCH + 2 * RANKED_BLOCK];
  unsigned ncold = 0;
#define COLD_DRAIN()                                                           \
  do {                                                                         \
    for (unsigned x = 0; x < ncold; x++)                                       \
      hist[cold[x]]++;                                                         \
    ncold = 0;                                                                 \
  } while (0)
  uint64_t *pos, at = out->changes.count, room;
  uint16_t *old_bits, *new_bits;
  uint8_t *cls;
  uint32_t *rank;
#define ARRAYS()                                                               \
  do {                                                                         \
    pos = out->changes.pos, old_bits = out->changes.old_bits;                  \
    new_bits = out->changes.new_bits, cls = out->cls, rank = out->rank;        \
    room = out->changes.capacity < out->rank_capacity ? out->changes.capacity  \
                                                      : out->rank_capacity;    \
  } while (0)
  PULSE_TRY(chunk_room(out, RANKED_BLOCK));
  ARRAYS();
  /* Entry at + r for the lowest set bit of m, ranked from the counts before
   * the block; when m is 0, lane 0's, as scratch (its cold count is not
   * needed then). */
#define EMIT(r)                                                                \
  do {                                                                         \
    unsigned b = (unsigned)_tzcnt_u64(m) & 63u;                                \
    uint16_t was = s[b];                                                       \
    unsigned c = pulse_bf16_class(was), h = hot_of[c];                         \
    uint32_t before = (uint32_t)counts[h & (RANKED_HOT - 1u)];                 \
    if (__builtin_expect(h >= RANKED_HOT && m != 0, 0)) {                      \
      COLD_DRAIN(); /* its count waits in `cold` */                            \
      before = hist[c];                                                        \
    }                                                                          \
    uint64_t same = _mm512_cmpeq_epi8_mask(e, _mm512_set1_epi8((char)c));      \
    pos[at + (r)] = i + b;                                                     \
    old_bits[at + (r)] = was;                                                  \
    new_bits[at + (r)] = fresh[b];                                             \
    cls[at + (r)] = (uint8_t)c;                                                \
    rank[at + (r)] = before + (uint32_t)__builtin_popcountll(same & ((1ull << b) - 1u)); \
  } while (0)
  for (uint32_t j = lo; j < hi; j += RANKED_BLOCK) {
    uint64_t i = first + j;
    const uint16_t *s = snap + i;
    __m512i sa = _mm512_loadu_si512((const void *)s);
    __m512i sb = _mm512_loadu_si512((const void *)(s + 32));
    __m512i na, nb;
    if (dtype == PULSE_DTYPE_F32 && hw_round) {
      const float *f = (const float *)cur + i;
      na = bf16x32_hw(f);
      nb = bf16x32_hw(f + 32);
    } else if (dtype == PULSE_DTYPE_F32) {
      const float *f = (const float *)cur + i;
      na = join256(bf16x16_avx512(f), bf16x16_avx512(f + 16));
      nb = join256(bf16x16_avx512(f + 32), bf16x16_avx512(f + 48));
    } else {
      const uint16_t *b = (const uint16_t *)cur + i;
      na = _mm512_loadu_si512((const void *)b);
      nb = _mm512_loadu_si512((const void *)(b + 32));
    }
    uint64_t diff = (uint64_t)_mm512_cmpneq_epi16_mask(nb, sb) << 32 |
                    (uint32_t)_mm512_cmpneq_epi16_mask(na, sa);
    /* The class is the low byte of bits >> 7: the narrowing keeps it. */
    __m512i e = join256(_mm512_cvtepi16_epi8(_mm512_srli_epi16(sa, 7)),
                        _mm512_cvtepi16_epi8(_mm512_srli_epi16(sb, 7)));
    /* At 1% density half the blocks hold a change, one or two mostly: a
     * branch on whether there is one, and on how many, missed often enough
     * to be most of the scan's work. So the first two entries are written
     * at every block (past the count when the block has fewer: scratch,
     * the room is there), the rest in a loop that blocks rarely enter. The
     * arrays are read into locals (a byte store may alias any field of
     * *out) and a hot class's count comes from acc's lane. */
    if (__builtin_expect(room - at < RANKED_BLOCK, 0)) {
      out->changes.count = at;
      PULSE_TRY(chunk_room(out, RANKED_BLOCK));
      ARRAYS();
    }
    _mm512_store_si512((void *)counts, acc);
    _mm512_store_si512((void *)fresh, na);
    _mm512_store_si512((void *)(fresh + 32), nb);
    uint64_t m = diff;
    EMIT(0);
    m = _blsr_u64(m);
    EMIT(1);
    m = _blsr_u64(m);
    for (unsigned r = 2; __builtin_expect(m != 0, 0); r++, m = _blsr_u64(m))
      EMIT(r);
    at += (uint64_t)__builtin_popcountll(diff);
    __mmask64 others;
    acc = _mm512_add_epi64(acc, hot_counts(e, base_v, tab_lo, tab_hi, &others));
    /* The other classes' bytes are packed into `cold` without a branch
     * (about half the blocks of a model hold one or two: a branch on them
     * was a third of the loop's time) and counted in batches. */
    _mm512_storeu_si512((void *)(cold + ncold), _mm512_maskz_compress_epi8(others, e));
    ncold += (unsigned)__builtin_popcountll(others);
    if (__builtin_expect(ncold > COLD_BATCH, 0))
      COLD_DRAIN();
  }
  out->changes.count = at;
  COLD_DRAIN();
  HOT_STORE();
  return PULSE_OK;
}
#undef COLD_DRAIN
#undef HOT_STORE
#undef ARRAYS
#undef EMIT

RANKED_AVX512 static pulse_status scan_avx512_f32(const void *cur, const uint16_t *snap,
                                                  uint64_t first, uint32_t lo, uint32_t hi,
                                                  const uint8_t *hot, pulse_detect_chunk *out) {
  return scan_avx512(cur, PULSE_DTYPE_F32, 0, snap, first, lo, hi, hot, out);
}

RANKED_AVX512 static pulse_status scan_avx512_f32_hw(const void *cur, const uint16_t *snap,
                                                     uint64_t first, uint32_t lo, uint32_t hi,
                                                     const uint8_t *hot,
                                                     pulse_detect_chunk *out) {
  return scan_avx512(cur, PULSE_DTYPE_F32, 1, snap, first, lo, hi, hot, out);
}

RANKED_AVX512 static pulse_status scan_avx512_bf16(const void *cur, const uint16_t *snap,
                                                   uint64_t first, uint32_t lo, uint32_t hi,
                                                   const uint8_t *hot, pulse_detect_chunk *out) {
  return scan_avx512(cur, PULSE_DTYPE_BF16, 0, snap, first, lo, hi, hot, out);
}

RANKED_AVX2 static pulse_status scan_avx2_f32(const void *cur, const uint16_t *snap,
                                              uint64_t first, uint32_t lo, uint32_t hi,
                                              const uint8_t *hot, pulse_detect_chunk *out) {
  return scan_avx2(cur, PULSE_DTYPE_F32, snap, first, lo, hi, hot, out);
}

RANKED_AVX2 static pulse_status scan_avx2_bf16(const void *cur, const uint16_t *snap,
                                               uint64_t first, uint32_t lo, uint32_t hi,
                                               const uint8_t *hot, pulse_detect_chunk *out) {
  return scan_avx2(cur, PULSE_DTYPE_BF16, snap, first, lo, hi, hot, out);
}
#endif

pulse_status pulse_detect_chunk_ranked(const void *cur, pulse_dtype dtype,
                                       const uint16_t *snapshot, uint64_t first, uint32_t n,
                                       pulse_isa isa, pulse_detect_chunk *out) {
  if (out == NULL || (n > 0 && (cur == NULL || snapshot == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "detect: NULL argument");
  if (dtype != PULSE_DTYPE_F32 && dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE, "detect: input dtype %s (want F32 or BF16)",
                      pulse_dtype_name(dtype));
  pulse_isa requested = isa;
  if (isa == PULSE_DETECT_RANKED_AVX512) /* AVX2 where the CPU has no AVX-512 */
    isa = PULSE_ISA_AUTO;
  if (!pulse_isa_available(isa))
    return pulse_fail(PULSE_ERR_UNSUPPORTED, "detect: instruction set %d not available", isa);
  if (isa == PULSE_ISA_AUTO)
    isa = pulse_isa_available(PULSE_ISA_AVX2) ? PULSE_ISA_AVX2 : PULSE_ISA_SCALAR;
  out->changes.count = 0;
  memset(out->hist, 0, sizeof out->hist);
  uint32_t done = n;
#if PULSE_HAVE_X86_DISPATCH
  if (isa == PULSE_ISA_AVX2 && n >= RANKED_SAMPLE + RANKED_BLOCK) {
    PULSE_TRY(scan_scalar(cur, dtype, snapshot, first, 0, RANKED_SAMPLE, out));
    uint8_t hot[RANKED_HOT];
    choose_hot(out->hist, hot);
    done = RANKED_SAMPLE + (n - RANKED_SAMPLE) / RANKED_BLOCK * RANKED_BLOCK;
    /* AUTO takes 64-lane masks where the CPU has them (AVX-512BW), and
     * the CPU's BF16 rounding where it has that too (AVX512_BF16);
     * PULSE_DETECT_RANKED_AVX512 the masks with the software rounding,
     * AVX2 the 32-lane form (tests reach all three). */
    int avx512 = (requested == PULSE_ISA_AUTO || requested == PULSE_DETECT_RANKED_AVX512) &&
                 have_avx512();
    if (avx512 && dtype == PULSE_DTYPE_F32 && requested == PULSE_ISA_AUTO && have_avx512_bf16())
      PULSE_TRY(scan_avx512_f32_hw(cur, snapshot, first, RANKED_SAMPLE, done, hot, out));
    else if (avx512)
      PULSE_TRY(dtype == PULSE_DTYPE_F32
                    ? scan_avx512_f32(cur, snapshot, first, RANKED_SAMPLE, done, hot, out)
                    : scan_avx512_bf16(cur, snapshot, first, RANKED_SAMPLE, done, hot, out));
    else
      PULSE_TRY(dtype == PULSE_DTYPE_F32
                    ? scan_avx2_f32(cur, snapshot, first, RANKED_SAMPLE, done, hot, out)
                    : scan_avx2_bf16(cur, snapshot, first, RANKED_SAMPLE, done, hot, out));
    return scan_scalar(cur, dtype, snapshot, first, done, n, out);
  }
#endif
  (void)done, (void)requested;
  return scan_scalar(cur, dtype, snapshot, first, 0, n, out);
}
