/* detect_fast.c - change detection over blocks of elements (AVX2, or 64-bit
 * words in portable C) and threads. Output is bit-identical to
 * pulse_detect_ref: same positions, old and new bits, same snapshot after.
 *
 * Threads scan contiguous ranges into their own lists; only when every range
 * succeeded and `out` has room for all of them are the lists copied into
 * `out` in range order and the snapshot written, so an error leaves the
 * snapshot untouched. (Writing the snapshot while its lines are still in
 * cache measured no faster: the cost is the write-back of dirtied lines.) */
#include "detect_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DETECT_BLOCK 32u      /* portable path */
#define DETECT_SIMD_BLOCK 64u /* AVX2 path */
#define DETECT_MAX_THREADS 256
/* Fewer changes than this are copied and scattered by the caller alone. */
#define DETECT_PUBLISH_PARALLEL_MIN (1u << 16)

int pulse_isa_available(pulse_isa isa) {
  switch (isa) {
  case PULSE_ISA_AUTO:
  case PULSE_ISA_SCALAR:
    return 1;
  case PULSE_ISA_AVX2:
#if PULSE_HAVE_X86_DISPATCH
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi") &&
           __builtin_cpu_supports("popcnt");
#else
    return 0;
#endif
  }
  return 0;
}

/* What every range of one call shares. */
typedef struct {
  const void *cur;
  pulse_dtype dtype;
  uint16_t *snapshot;
  pulse_isa isa; /* resolved: SCALAR or AVX2 */
} detect_input;

static pulse_status changes_grow(pulse_changes *c, uint64_t extra) {
  if (extra > UINT64_MAX - c->count)
    return pulse_fail(PULSE_ERR_OVERFLOW, "detect: change count overflows");
  uint64_t want = c->capacity < 1024 ? 1024 : c->capacity;
  while (want < c->count + extra)
    want = want > UINT64_MAX / 2 ? UINT64_MAX : want * 2;
  return pulse_changes_reserve(c, want);
}

/* Makes room for `extra` more changes; the common case is one compare. */
static inline pulse_status changes_room(pulse_changes *c, uint64_t extra) {
  if (c->capacity - c->count >= extra)
    return PULSE_OK;
  return changes_grow(c, extra);
}

/* Appends the lanes set in `mask` of the block starting at element i; room
 * for them must be there. snap and fresh point at the block's lane 0. */
static inline void emit_block(pulse_changes *c, uint64_t i, uint32_t mask,
                              const uint16_t *snap, const uint16_t *fresh) {
  uint64_t k = c->count;
  while (mask != 0) {
    unsigned j = (unsigned)__builtin_ctz(mask);
    mask &= mask - 1;
    c->pos[k] = i + j;
    c->old_bits[k] = snap[j];
    c->new_bits[k] = fresh[j];
    k++;
  }
  c->count = k;
}

/* New BF16 bits of elements [i, i + len), len <= DETECT_BLOCK. */
static inline void load_block(const detect_input *in, uint64_t i, unsigned len,
                              uint16_t *fresh) {
  const unsigned char *bytes = in->cur;
  if (in->dtype == PULSE_DTYPE_F32) {
    for (unsigned j = 0; j < len; j++) {
      uint32_t u;
      memcpy(&u, bytes + (i + j) * 4, sizeof u);
      fresh[j] = pulse_bf16_from_f32_bits(u);
    }
  } else {
    memcpy(fresh, bytes + i * 2, (size_t)len * 2);
  }
}

/* One block of up to 32 elements, element by element. */
static pulse_status scan_block_scalar(const detect_input *in, uint64_t i,
                                      unsigned len, pulse_changes *out) {
  uint16_t fresh[DETECT_BLOCK];
  const uint16_t *snap = in->snapshot + i;
  load_block(in, i, len, fresh);
  uint32_t mask = 0;
  for (unsigned j = 0; j < len; j++)
    mask |= (uint32_t)pulse_bf16_changed(snap[j], fresh[j]) << j;
  if (mask == 0)
    return PULSE_OK;
  PULSE_TRY(changes_room(out, (uint64_t)__builtin_popcount(mask)));
  emit_block(out, i, mask, snap, fresh);
  return PULSE_OK;
}

/* Portable path: whole blocks whose 64-bit words all match are skipped. */
static pulse_status scan_scalar(const detect_input *in, uint64_t lo,
                                uint64_t hi, pulse_changes *out) {
  uint64_t i = lo;
  for (; hi - i >= DETECT_BLOCK; i += DETECT_BLOCK) {
    uint16_t fresh[DETECT_BLOCK];
    const uint16_t *snap = in->snapshot + i;
    load_block(in, i, DETECT_BLOCK, fresh);
    uint64_t diff = 0;
    for (unsigned w = 0; w < DETECT_BLOCK; w += 4) {
      uint64_t a, b;
      memcpy(&a, fresh + w, sizeof a);
      memcpy(&b, snap + w, sizeof b);
      diff |= a ^ b;
    }
    if (diff == 0)
      continue;
    uint32_t mask = 0;
    for (unsigned j = 0; j < DETECT_BLOCK; j++)
      mask |= (uint32_t)pulse_bf16_changed(snap[j], fresh[j]) << j;
    PULSE_TRY(changes_room(out, (uint64_t)__builtin_popcount(mask)));
    emit_block(out, i, mask, snap, fresh);
  }
  if (i < hi)
    PULSE_TRY(scan_block_scalar(in, i, (unsigned)(hi - i), out));
  return PULSE_OK;
}

#if PULSE_HAVE_X86_DISPATCH
#define DETECT_AVX2 __attribute__((target("avx2,bmi,popcnt")))

/* Bit j set where lane j of (n0, n1) differs from lane j of (s0, s1). */
DETECT_AVX2 static inline uint32_t diff_mask_avx2(__m256i n0, __m256i n1,
                                                  __m256i s0, __m256i s1) {
  __m256i e0 = _mm256_cmpeq_epi16(n0, s0);
  __m256i e1 = _mm256_cmpeq_epi16(n1, s1);
  /* Words 0/-1 pack to bytes 0/-1; the permute undoes the lane interleave. */
  __m256i e = _mm256_permute4x64_epi64(_mm256_packs_epi16(e0, e1), 0xD8);
  return ~(uint32_t)_mm256_movemask_epi8(e);
}

DETECT_AVX2 static inline __m256i load_avx2(const uint16_t *p) {
  return _mm256_loadu_si256((const __m256i *)(const void *)p);
}

/* Appends the lanes set in `mask` of the 64-element block at i; room for 64
 * changes must be there. At ~1% density a block rarely has more than four
 * changes, so four are written unconditionally (entries past the count are
 * scratch): no branch on how many there are. */
DETECT_AVX2 static inline void emit_mask64_avx2(pulse_changes *c, uint64_t i,
                                                uint64_t mask,
                                                const uint16_t *snap,
                                                const uint16_t *fresh) {
  uint64_t k = c->count;
  uint64_t *pos = c->pos + k;
  uint16_t *old_bits = c->old_bits + k, *new_bits = c->new_bits + k;
  uint64_t count = (uint64_t)__builtin_popcountll(mask);
  for (unsigned r = 0; r < 4; r++) {
    unsigned j = (unsigned)_tzcnt_u64(mask) & 63u; /* 64 when empty */
    pos[r] = i + j;
    old_bits[r] = snap[j];
    new_bits[r] = fresh[j];
    mask = _blsr_u64(mask);
  }
  for (unsigned r = 4; mask != 0; r++) {
    unsigned j = (unsigned)_tzcnt_u64(mask);
    pos[r] = i + j;
    old_bits[r] = snap[j];
    new_bits[r] = fresh[j];
    mask = _blsr_u64(mask);
  }
  c->count = k + count;
}

DETECT_AVX2 static pulse_status scan_bf16_avx2(const detect_input *in,
                                               uint64_t lo, uint64_t hi,
                                               pulse_changes *out) {
  const uint16_t *cur = in->cur;
  const uint16_t *snap = in->snapshot;
  uint64_t i = lo;
  for (; hi - i >= DETECT_SIMD_BLOCK; i += DETECT_SIMD_BLOCK) {
    __m256i n0 = load_avx2(cur + i), n1 = load_avx2(cur + i + 16);
    __m256i s0 = load_avx2(snap + i), s1 = load_avx2(snap + i + 16);
    __m256i n2 = load_avx2(cur + i + 32), n3 = load_avx2(cur + i + 48);
    __m256i s2 = load_avx2(snap + i + 32), s3 = load_avx2(snap + i + 48);
    uint64_t mask = diff_mask_avx2(n0, n1, s0, s1) |
                    (uint64_t)diff_mask_avx2(n2, n3, s2, s3) << 32;
    PULSE_TRY(changes_room(out, DETECT_SIMD_BLOCK));
    emit_mask64_avx2(out, i, mask, snap + i, cur + i);
  }
  if (i < hi)
    PULSE_TRY(scan_scalar(in, i, hi, out));
  return PULSE_OK;
}

DETECT_AVX2 static pulse_status scan_f32_avx2(const detect_input *in,
                                              uint64_t lo, uint64_t hi,
                                              pulse_changes *out) {
  const float *cur = in->cur;
  const uint16_t *snap = in->snapshot;
  _Alignas(32) uint16_t fresh[DETECT_SIMD_BLOCK];
  uint64_t i = lo;
  for (; hi - i >= DETECT_SIMD_BLOCK; i += DETECT_SIMD_BLOCK) {
    __m256i n0 = pulse_bf16x16_from_f32_avx2(cur + i);
    __m256i n1 = pulse_bf16x16_from_f32_avx2(cur + i + 16);
    __m256i n2 = pulse_bf16x16_from_f32_avx2(cur + i + 32);
    __m256i n3 = pulse_bf16x16_from_f32_avx2(cur + i + 48);
    __m256i s0 = load_avx2(snap + i), s1 = load_avx2(snap + i + 16);
    __m256i s2 = load_avx2(snap + i + 32), s3 = load_avx2(snap + i + 48);
    uint64_t mask = diff_mask_avx2(n0, n1, s0, s1) |
                    (uint64_t)diff_mask_avx2(n2, n3, s2, s3) << 32;
    _mm256_store_si256((__m256i *)(void *)fresh, n0);
    _mm256_store_si256((__m256i *)(void *)(fresh + 16), n1);
    _mm256_store_si256((__m256i *)(void *)(fresh + 32), n2);
    _mm256_store_si256((__m256i *)(void *)(fresh + 48), n3);
    PULSE_TRY(changes_room(out, DETECT_SIMD_BLOCK));
    emit_mask64_avx2(out, i, mask, snap + i, fresh);
  }
  if (i < hi)
    PULSE_TRY(scan_scalar(in, i, hi, out));
  return PULSE_OK;
}
#endif

/* Appends the changes of elements [lo, hi) to out. */
static pulse_status scan_kernel(const detect_input *in, uint64_t lo,
                                uint64_t hi, pulse_changes *out) {
#if PULSE_HAVE_X86_DISPATCH
  if (in->isa == PULSE_ISA_AVX2)
    return in->dtype == PULSE_DTYPE_F32 ? scan_f32_avx2(in, lo, hi, out)
                                        : scan_bf16_avx2(in, lo, hi, out);
#endif
  return scan_scalar(in, lo, hi, out);
}

/* One thread's share of a call. */
typedef struct {
  const detect_input *in;
  uint64_t lo, hi;
  int update_snapshot;
  pulse_changes *list; /* range 0: the caller's out; others: &local */
  pulse_changes local;
  uint64_t first; /* index in list of this range's first change */
  pulse_status status;
  pulse_changes *out; /* set before publishing */
  uint64_t offset;    /* index in out of this range's first change */
} detect_range;

static void *range_scan(void *arg) {
  detect_range *r = arg;
  r->status = scan_kernel(r->in, r->lo, r->hi, r->list);
  return NULL;
}

/* Writes the new bits of changes [first, first + count) of out into the
 * snapshot. */
static void snapshot_update(uint16_t *snapshot, const pulse_changes *out,
                            uint64_t first, uint64_t count) {
  const uint64_t *pos = out->pos + first;
  const uint16_t *fresh = out->new_bits + first;
  for (uint64_t k = 0; k < count; k++)
    snapshot[pos[k]] = fresh[k];
}

/* Copies a range's changes to their place in out, then writes them into the
 * snapshot. */
static void *range_publish(void *arg) {
  detect_range *r = arg;
  uint64_t count = r->list->count - r->first;
  if (r->list != r->out && count > 0) {
    memcpy(r->out->pos + r->offset, r->list->pos, count * sizeof(uint64_t));
    memcpy(r->out->old_bits + r->offset, r->list->old_bits,
           count * sizeof(uint16_t));
    memcpy(r->out->new_bits + r->offset, r->list->new_bits,
           count * sizeof(uint16_t));
  }
  if (r->update_snapshot)
    snapshot_update(r->in->snapshot, r->out, r->offset, count);
  return NULL;
}

/* Runs fn on every range: range 0 on the calling thread, the others on new
 * threads, or inline when a thread cannot be started. */
static void run_ranges(void *(*fn)(void *), detect_range *ranges, int count,
                       int parallel) {
  pthread_t tids[DETECT_MAX_THREADS];
  int started[DETECT_MAX_THREADS];
  for (int t = 1; t < count; t++)
    started[t] =
        parallel && pthread_create(&tids[t], NULL, fn, &ranges[t]) == 0;
  fn(&ranges[0]);
  for (int t = 1; t < count; t++) {
    if (started[t])
      pthread_join(tids[t], NULL);
    else
      fn(&ranges[t]);
  }
}

static int threads_for(int threads, uint64_t n, uint64_t min_per_thread) {
  long t = threads;
  if (t == 0) {
    t = sysconf(_SC_NPROCESSORS_ONLN);
    if (t < 1)
      t = 1;
  }
  if (t > DETECT_MAX_THREADS)
    t = DETECT_MAX_THREADS;
  if (min_per_thread == 0)
    min_per_thread = 1;
  uint64_t useful = n / min_per_thread + (n % min_per_thread != 0);
  if (useful < (uint64_t)t)
    t = (long)useful;
  return t < 1 ? 1 : (int)t;
}

/* Checks every range and makes room in out for all their changes. */
static pulse_status ranges_collect(detect_range *ranges, int count,
                                   pulse_changes *out, uint64_t *total) {
  pulse_status st = PULSE_OK;
  uint64_t sum = out->count; /* already holds range 0's changes */
  for (int t = 0; t < count && st == PULSE_OK; t++) {
    if (t == 0)
      st = ranges[0].status; /* ran on this thread: its detail is set */
    else if (ranges[t].status != PULSE_OK)
      st = pulse_fail(ranges[t].status, "detect: range %d of %d: %s", t, count,
                      pulse_status_str(ranges[t].status));
    else
      sum += ranges[t].local.count;
  }
  if (st == PULSE_OK && sum > out->capacity)
    st = pulse_changes_reserve(out, sum);
  if (st != PULSE_OK)
    return st;
  *total = sum;
  return PULSE_OK;
}

pulse_status pulse_detect_fast_tuned(const void *cur, pulse_dtype cur_dtype,
                                     uint16_t *snapshot, uint64_t n,
                                     int update_snapshot, int threads,
                                     const pulse_detect_tuning *tuning,
                                     pulse_changes *out) {
  if (out == NULL || (n > 0 && (cur == NULL || snapshot == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "detect: NULL argument");
  if (threads < 0)
    return pulse_fail(PULSE_ERR_ARG, "detect: %d threads", threads);
  if (cur_dtype != PULSE_DTYPE_F32 && cur_dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE,
                      "detect: input dtype %s (want F32 or BF16)",
                      pulse_dtype_name(cur_dtype));
  pulse_detect_tuning tune = PULSE_DETECT_TUNING_INIT;
  if (tuning != NULL)
    tune = *tuning;
  if (!pulse_isa_available(tune.isa))
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "detect: instruction set %d not available", tune.isa);
  if (tune.isa == PULSE_ISA_AUTO)
    tune.isa =
        pulse_isa_available(PULSE_ISA_AVX2) ? PULSE_ISA_AVX2 : PULSE_ISA_SCALAR;

  detect_input in = {cur, cur_dtype, snapshot, tune.isa};
  int count = threads_for(threads, n, tune.min_per_thread);
  if (count == 1) { /* no thread, no copy */
    uint64_t first = out->count;
    PULSE_TRY(scan_kernel(&in, 0, n, out));
    if (update_snapshot)
      snapshot_update(snapshot, out, first, out->count - first);
    return PULSE_OK;
  }

  /* Contiguous ranges on SIMD block boundaries, in element order. */
  detect_range ranges[DETECT_MAX_THREADS];
  uint64_t blocks = n / DETECT_SIMD_BLOCK + (n % DETECT_SIMD_BLOCK != 0);
  uint64_t per = blocks / (uint64_t)count, extra = blocks % (uint64_t)count;
  uint64_t block = 0;
  for (int t = 0; t < count; t++) {
    detect_range *r = &ranges[t];
    memset(r, 0, sizeof *r);
    r->in = &in;
    r->lo = block * DETECT_SIMD_BLOCK < n ? block * DETECT_SIMD_BLOCK : n;
    block += per + ((uint64_t)t < extra);
    r->hi = block * DETECT_SIMD_BLOCK < n ? block * DETECT_SIMD_BLOCK : n;
    r->update_snapshot = update_snapshot;
    r->local = (pulse_changes)PULSE_CHANGES_INIT;
    r->list = t == 0 ? out : &r->local;
    r->first = t == 0 ? out->count : 0;
  }

  run_ranges(range_scan, ranges, count, 1);

  uint64_t total = 0;
  pulse_status st = ranges_collect(ranges, count, out, &total);
  if (st == PULSE_OK) {
    uint64_t offset = ranges[0].first;
    for (int t = 0; t < count; t++) {
      ranges[t].out = out;
      ranges[t].offset = offset;
      offset += ranges[t].list->count - ranges[t].first;
    }
    run_ranges(range_publish, ranges, count,
               total - ranges[0].first >= DETECT_PUBLISH_PARALLEL_MIN);
    out->count = total;
  }
  for (int t = 1; t < count; t++)
    pulse_changes_free(&ranges[t].local);
  return st;
}

pulse_status pulse_detect_fast(const void *cur, pulse_dtype cur_dtype,
                               uint16_t *snapshot, uint64_t n,
                               int update_snapshot, int threads,
                               pulse_changes *out) {
  return pulse_detect_fast_tuned(cur, cur_dtype, snapshot, n, update_snapshot,
                                 threads, NULL, out);
}
