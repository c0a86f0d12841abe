/* fp8.cu - the reference block quantizer of codec/pulse_fp8.h on device
 * tensors: whole tensors (pulse_cuda_fp8_quantize) and the blocks a step
 * touches (pulse_cuda_fp8_track_*), bit-identical to pulse_fp8_quantize_ref
 * and pulse_fp8_track because every value goes through the same element
 * functions (pulse_fp8_elem.h).
 *
 * The unit of work is a 128 x 128 tile, one thread block each: with a scale
 * per block a tile is a scale block; with one per tensor the tiles' amax
 * meet in one atomic max. Amax are BF16 magnitudes as integers (their
 * integer order is the order of the values), kept in 32-bit words for the
 * atomics. Nothing is written to an FP8 tensor before every value was
 * checked: a check kernel raises a device flag (the lowest bad offset or
 * entry, by atomic min) that the host reads back first. */
#include <stdlib.h>
#include <string.h>

#include "fp8.cuh"

/* ------------------------------------------------------------ the device */

__device__ static inline uint64_t tile_scale_block(const pulse_fp8_geom &g,
                                                   uint64_t tile) {
  return g.per_tensor ? 0 : tile;
}

__device__ static inline uint64_t offset_scale_block(const pulse_fp8_geom &g,
                                                     uint64_t off) {
  if (g.per_tensor)
    return 0;
  return (off / g.cols / PULSE_FP8_BLOCK) * g.tile_cols +
         (off % g.cols) / PULSE_FP8_BLOCK;
}

/* Tile t's first row and column and its extent. */
__device__ static inline void tile_box(const pulse_fp8_geom &g, uint64_t t,
                                       uint64_t *r0, uint64_t *c0,
                                       uint32_t *nr, uint32_t *nc) {
  *r0 = (t / g.tile_cols) * PULSE_FP8_BLOCK;
  *c0 = (t % g.tile_cols) * PULSE_FP8_BLOCK;
  *nr = (uint32_t)(g.rows - *r0 < PULSE_FP8_BLOCK ? g.rows - *r0
                                                  : PULSE_FP8_BLOCK);
  *nc = (uint32_t)(g.cols - *c0 < PULSE_FP8_BLOCK ? g.cols - *c0
                                                  : PULSE_FP8_BLOCK);
}

__device__ static inline uint32_t warp_max(uint32_t v) {
  for (unsigned off = 16; off > 0; off >>= 1) {
    const uint32_t o = __shfl_xor_sync(PULSE_FULL_MASK, v, (int)off);
    v = o > v ? o : v;
  }
  return v;
}

/* The largest |x| of each tile into amax[its scale block] (atomic max; the
 * caller zeroed it), and the lowest offset of a NaN or infinity into *bad
 * (atomic min; the caller set it to all ones) when bad is not NULL. With
 * `select`, only the tiles of blocks whose select[] is non-zero. */
static __global__ void __launch_bounds__(PULSE_FP8_TILE_THREADS)
    fp8_amax_kernel(const uint16_t *x, pulse_fp8_geom g,
                    const uint32_t *select, uint32_t *amax,
                    unsigned long long *bad) {
  for (uint64_t t = blockIdx.x; t < g.tiles; t += gridDim.x) {
    const uint64_t b = tile_scale_block(g, t);
    if (select != NULL && select[b] == 0)
      continue; /* the same for the whole thread block */
    uint64_t r0, c0, first_bad = ~0ull;
    uint32_t nr, nc, m = 0;
    tile_box(g, t, &r0, &c0, &nr, &nc);
    for (uint32_t k = threadIdx.x; k < nr * PULSE_FP8_BLOCK; k += blockDim.x) {
      const uint32_t r = k / PULSE_FP8_BLOCK, c = k % PULSE_FP8_BLOCK;
      if (c >= nc)
        continue;
      const uint64_t off = (r0 + r) * g.cols + c0 + c;
      const uint16_t v = x[off];
      const uint32_t a = pulse_fp8_bf16_abs(v);
      if (!pulse_fp8_bf16_finite(v))
        first_bad = off < first_bad ? off : first_bad;
      else if (a > m)
        m = a;
    }
    m = warp_max(m);
    if (pulse_lane() == 0 && m != 0)
      atomicMax(&amax[b], m);
    if (bad != NULL && first_bad != ~0ull)
      atomicMin(bad, (unsigned long long)first_bad);
  }
}

/* Every block's scale from its amax (a whole-tensor quantization); the
 * amax kept when keep is not NULL. Scales are written as FP32 bits. */
static __global__ void fp8_scale_kernel(pulse_fp8_geom g, const uint32_t *amax,
                                        uint32_t *scale_inv, uint32_t *keep) {
  for (uint64_t b = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
       b < g.blocks; b += (uint64_t)gridDim.x * blockDim.x) {
    scale_inv[b] = pulse_fp8_scale_bits((uint16_t)amax[b]);
    if (keep != NULL)
      keep[b] = amax[b];
  }
}

/* The block state of a commit: untouched, touched with its scale kept
 * (only the changed elements are requantized), or rescaled (requantized
 * whole). */
enum { FP8_UNTOUCHED = 0, FP8_KEPT = 1, FP8_RESCALED = 2 };

/* Quantizes every tile, or with `state` those of rescaled blocks, at the
 * scale (FP32 bits) of its block. */
static __global__ void __launch_bounds__(PULSE_FP8_TILE_THREADS)
    fp8_quantize_kernel(const uint16_t *x, pulse_fp8_geom g,
                        const uint32_t *state, const uint32_t *scale_inv,
                        uint8_t *q) {
  for (uint64_t t = blockIdx.x; t < g.tiles; t += gridDim.x) {
    const uint64_t b = tile_scale_block(g, t);
    if (state != NULL && state[b] != FP8_RESCALED)
      continue;
    const uint32_t s = scale_inv[b];
    uint64_t r0, c0;
    uint32_t nr, nc;
    tile_box(g, t, &r0, &c0, &nr, &nc);
    for (uint32_t k = threadIdx.x; k < nr * PULSE_FP8_BLOCK; k += blockDim.x) {
      const uint32_t r = k / PULSE_FP8_BLOCK, c = k % PULSE_FP8_BLOCK;
      if (c < nc) {
        const uint64_t off = (r0 + r) * g.cols + c0 + c;
        q[off] = pulse_fp8_quantize_elem(x[off], s);
      }
    }
  }
}

/* Grid-stride over n entries. */
#define FOR_EACH(i, n)                                                         \
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);  \
       i += (uint64_t)gridDim.x * blockDim.x)

/* A step's changes before the BF16 tensor takes them: the lowest entry
 * with a position outside the tensor or a value that is not finite into
 * *bad; for each block touched, hi1 = 1 + its largest new magnitude and
 * down = 1 when an element holding its amax goes down. */
static __global__ void fp8_stage_kernel(const uint16_t *x, pulse_fp8_geom g,
                                        const uint64_t *pos,
                                        const uint16_t *nw, uint64_t n,
                                        const uint32_t *amax, uint32_t *hi1,
                                        uint32_t *down,
                                        unsigned long long *bad) {
  FOR_EACH(i, n) {
    const uint64_t p = pos[i];
    const uint16_t v = nw[i];
    if (p >= g.numel || !pulse_fp8_bf16_finite(v)) {
      atomicMin(bad, (unsigned long long)i);
      continue;
    }
    const uint64_t b = offset_scale_block(g, p);
    const uint32_t now = pulse_fp8_bf16_abs(v), was = pulse_fp8_bf16_abs(x[p]);
    const uint32_t old = amax[b];
    atomicMax(&hi1[b], now + 1u);
    if (was == old && now < old)
      atomicOr(&down[b], 1u);
  }
}

/* Sums a thread's figure into counters[k] (when counting). */
__device__ static inline void count_add(unsigned long long *counters, int k,
                                        uint64_t v) {
  if (counters != NULL && v != 0)
    atomicAdd(&counters[k], (unsigned long long)v);
}

/* Figures of a commit, as pulse_fp8_stage_figures. */
enum { FP8_FIG_TOUCHED, FP8_FIG_RESCANNED, FP8_FIG_RESCALED, FP8_FIG_ELEMS };

/* Commit, first: which touched blocks must be read again (their amax
 * element went down and no change reached it): select[b]. */
static __global__ void fp8_decide_kernel(pulse_fp8_geom g,
                                         const uint32_t *amax,
                                         const uint32_t *hi1,
                                         const uint32_t *down,
                                         uint32_t *select) {
  FOR_EACH(b, g.blocks) {
    select[b] = hi1[b] != 0 && hi1[b] - 1u < amax[b] && down[b] != 0;
  }
}

__device__ static inline uint64_t block_elems(const pulse_fp8_geom &g,
                                              uint64_t b) {
  if (g.per_tensor)
    return g.numel;
  uint64_t r0, c0;
  uint32_t nr, nc;
  tile_box(g, b, &r0, &c0, &nr, &nc);
  return (uint64_t)nr * nc;
}

/* Commit, then: each touched block's new amax (the rescan's, or the larger
 * of the kept one and the changes'), scale and state; scales and amax
 * written. */
static __global__ void fp8_rescale_kernel(pulse_fp8_geom g, uint32_t *amax,
                                          const uint32_t *hi1,
                                          const uint32_t *select,
                                          const uint32_t *rescanned,
                                          uint32_t *state, uint32_t *scale_inv,
                                          unsigned long long *counters) {
  uint64_t touched = 0, rescans = 0, rescales = 0, elems = 0;
  FOR_EACH(b, g.blocks) {
    if (hi1[b] == 0) {
      state[b] = FP8_UNTOUCHED;
      continue;
    }
    const uint32_t old = amax[b], hi = hi1[b] - 1u;
    const uint32_t now = select[b] ? rescanned[b] : (hi > old ? hi : old);
    const uint32_t s = pulse_fp8_scale_bits((uint16_t)now);
    const int moved = s != pulse_fp8_scale_bits((uint16_t)old);
    state[b] = moved ? FP8_RESCALED : FP8_KEPT;
    scale_inv[b] = s;
    amax[b] = now;
    touched++;
    rescans += select[b] != 0;
    if (moved) {
      rescales++;
      elems += block_elems(g, b);
    }
  }
  count_add(counters, FP8_FIG_TOUCHED, touched);
  count_add(counters, FP8_FIG_RESCANNED, rescans);
  count_add(counters, FP8_FIG_RESCALED, rescales);
  count_add(counters, FP8_FIG_ELEMS, elems);
}

/* Commit, last: the changed elements of blocks whose scale stayed. */
static __global__ void fp8_elements_kernel(pulse_fp8_geom g,
                                           const uint64_t *pos,
                                           const uint16_t *nw, uint64_t n,
                                           const uint32_t *state,
                                           const uint32_t *scale_inv,
                                           uint8_t *q,
                                           unsigned long long *counters) {
  uint64_t done = 0;
  FOR_EACH(i, n) {
    const uint64_t p = pos[i], b = offset_scale_block(g, p);
    if (state[b] == FP8_KEPT) {
      q[p] = pulse_fp8_quantize_elem(nw[i], scale_inv[b]);
      done++;
    }
  }
  count_add(counters, FP8_FIG_ELEMS, done);
}

/* -------------------------------------------------------------- the host */

static unsigned grid_for(uint64_t work, unsigned per_block) {
  const uint64_t blocks = (work + per_block - 1) / per_block;
  return (unsigned)(blocks < PULSE_FP8_GRID_MAX ? blocks : PULSE_FP8_GRID_MAX);
}

/* The geometry of t, with its arguments checked (not the devices). */
static pulse_status fp8_geom_make(const uint16_t *bf16_d,
                                  const pulse_cuda_fp8_tensor *t,
                                  const char *what, pulse_fp8_geom *g) {
  uint64_t scales = 0;
  int kind = 0;
  if (t == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL tensor", what);
  /* Read as the int a C caller stored: C++ may assume an enum holds only
   * its own values. */
  memcpy(&kind, &t->scale, sizeof kind);
  if (kind != PULSE_FP8_SCALE_BLOCK && kind != PULSE_FP8_SCALE_TENSOR)
    return pulse_fail(PULSE_ERR_ARG, "%s: unknown scale kind %d", what, kind);
  PULSE_TRY(pulse_fp8_scale_count(t->rows, t->cols, t->scale, &scales));
  g->rows = t->rows;
  g->cols = t->cols;
  g->numel = t->rows * t->cols; /* checked by pulse_fp8_scale_count */
  g->tile_cols = t->cols ? (t->cols - 1) / PULSE_FP8_BLOCK + 1 : 0;
  g->tiles = g->numel ? ((t->rows - 1) / PULSE_FP8_BLOCK + 1) * g->tile_cols : 0;
  g->per_tensor = kind == PULSE_FP8_SCALE_TENSOR;
  g->blocks = scales;
  if (g->numel > 0 && (bf16_d == NULL || t->q_d == NULL))
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL data", what);
  if (g->blocks > 0 && t->scale_inv_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL scale_inv_d", what);
  if ((uintptr_t)bf16_d % 2 || (uintptr_t)t->scale_inv_d % 4)
    return pulse_fail(PULSE_ERR_ARG, "%s: misaligned BF16 data or scales",
                      what);
  return PULSE_OK;
}

/* Enters the call on the device of t's memory, all of it on one device. */
static pulse_status fp8_enter(pulse_cuda_workspace *ws, const uint16_t *bf16_d,
                              const pulse_cuda_fp8_tensor *t,
                              const pulse_fp8_geom *g, void *stream,
                              const char *what, pulse_cuda_at *at) {
  pulse_status st = PULSE_OK;
  const void *first = g->numel > 0 ? (const void *)bf16_d
                                   : (const void *)t->scale_inv_d;
  PULSE_TRY(pulse_cuda_enter_(ws, first, stream, what, at));
  if (g->numel > 0) {
    PULSE_CHECK(pulse_cuda_check_ptr_(t->q_d, at->device, what));
    PULSE_CHECK(pulse_cuda_check_ptr_(t->scale_inv_d, at->device, what));
  }
cleanup:
  if (st != PULSE_OK)
    pulse_cuda_leave_(at);
  return st;
}

static pulse_status not_finite(const char *what, const pulse_fp8_geom *g,
                               uint64_t at, uint16_t x, const char *verb) {
  return pulse_fail(PULSE_ERR_UNSUPPORTED,
                    "%s: element (%llu, %llu) %s %s (BF16 0x%04x): E4M3FN "
                    "weights take finite values only; nothing written",
                    what, (unsigned long long)(at / g->cols),
                    (unsigned long long)(at % g->cols), verb,
                    (x & 0x7Fu) ? "NaN" : "infinite", (unsigned)x);
}

/* The whole-tensor quantization on a call already entered: amax and the
 * finite check (into amax, g->blocks words of scratch or of a track, and
 * *bad_d), the flag read back, then scales (amax kept into keep when not
 * NULL) and bytes. Does not wait for the last kernels. */
static pulse_status fp8_quantize_on(const uint16_t *x, const pulse_fp8_geom *g,
                                    uint8_t *q, float *scale_inv,
                                    uint32_t *amax, uint32_t *keep,
                                    unsigned long long *bad_d, cudaStream_t s,
                                    const char *what) {
  pulse_status st = PULSE_OK;
  unsigned long long bad = 0;
  uint16_t value = 0;
  uint32_t *scales = (uint32_t *)scale_inv; /* written as FP32 bits */
  if (g->blocks > 0)
    PULSE_CUDA_CHECK(cudaMemsetAsync(amax, 0, g->blocks * sizeof *amax, s));
  PULSE_CUDA_CHECK(cudaMemsetAsync(bad_d, 0xFF, sizeof *bad_d, s));
  if (g->tiles > 0) {
    PULSE_LAUNCH(fp8_amax_kernel, grid_for(g->tiles, 1), PULSE_FP8_TILE_THREADS,
                 s, x, *g, (const uint32_t *)NULL, amax, bad_d);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CUDA_CHECK(
      cudaMemcpyAsync(&bad, bad_d, sizeof bad, cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad != ~0ull) {
    PULSE_CUDA_CHECK(cudaMemcpyAsync(&value, x + bad, sizeof value,
                                     cudaMemcpyDeviceToHost, s));
    PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
    return not_finite(what, g, bad, value, "is");
  }
  if (g->blocks > 0) {
    PULSE_LAUNCH(fp8_scale_kernel, grid_for(g->blocks, PULSE_LIST_THREADS),
                 PULSE_LIST_THREADS, s, *g, (const uint32_t *)amax, scales,
                 keep);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  if (g->tiles > 0) {
    PULSE_LAUNCH(fp8_quantize_kernel, grid_for(g->tiles, 1),
                 PULSE_FP8_TILE_THREADS, s, x, *g, (const uint32_t *)NULL,
                 (const uint32_t *)scales, q);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_fp8_quantize(pulse_cuda_workspace *ws,
                                                const uint16_t *bf16_d,
                                                const pulse_cuda_fp8_tensor *t,
                                                void *stream) {
  static const char what[] = "cuda fp8 quantize";
  pulse_status st = PULSE_OK;
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_at at;
  pulse_fp8_geom g;
  void *scratch = NULL;
  cudaStream_t s;
  PULSE_TRY(fp8_geom_make(bf16_d, t, what, &g));
  PULSE_TRY(fp8_enter(ws, bf16_d, t, &g, stream, what, &at));
  s = (cudaStream_t)at.stream;
  if (ws == NULL) {
    PULSE_CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }
  /* The flag, then the blocks' amax. */
  PULSE_CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_TILES, g.blocks + 2,
                                  sizeof(uint32_t), &scratch));
  PULSE_CHECK(fp8_quantize_on(bf16_d, &g, t->q_d, t->scale_inv_d,
                              (uint32_t *)scratch + 2, NULL,
                              (unsigned long long *)scratch, s, what));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
  pulse_cuda_workspace_free(temp);
  pulse_cuda_leave_(&at);
  return st;
}

/* ------------------------------------------------------------ the track */

struct pulse_cuda_fp8_track {
  const uint16_t *bf16_d;
  pulse_cuda_fp8_tensor t;
  pulse_fp8_geom g;
  void *mem_d; /* flags, then the per-block words below */
  unsigned long long *bad_d;      /* the check's flag */
  unsigned long long *counters_d; /* a commit's figures (FP8_FIG_*) */
  uint32_t *amax_d;               /* per block, of what bf16_d holds */
  uint32_t *hi1_d, *down_d;       /* the stage's */
  uint32_t *select_d, *rescan_d, *state_d; /* the commit's */
  const uint64_t *pos_d;          /* the staged step */
  const uint16_t *new_d;
  uint64_t count;
  int staged;
};

/* Words of device memory a track keeps per block, and its flags. */
#define FP8_TRACK_WORDS 6u
#define FP8_TRACK_FLAGS 8u

extern "C" pulse_status pulse_cuda_fp8_track_create(
    const uint16_t *bf16_d, const pulse_cuda_fp8_tensor *t, void *stream,
    pulse_cuda_fp8_track **out) {
  static const char what[] = "cuda fp8 track";
  pulse_status st = PULSE_OK;
  pulse_cuda_fp8_track *tr = NULL;
  pulse_cuda_at at;
  pulse_fp8_geom g;
  uint32_t *words = NULL;
  size_t bytes = 0;
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL output", what);
  *out = NULL;
  PULSE_TRY(fp8_geom_make(bf16_d, t, what, &g));
  if (g.blocks > (SIZE_MAX - 64) / (FP8_TRACK_WORDS * sizeof(uint32_t)))
    return pulse_fail(PULSE_ERR_OVERFLOW, "%s: %llu blocks", what,
                      (unsigned long long)g.blocks);
  PULSE_TRY(fp8_enter(NULL, bf16_d, t, &g, stream, what, &at));
  tr = (pulse_cuda_fp8_track *)calloc(1, sizeof *tr);
  if (tr == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "%s", what);
    goto cleanup;
  }
  tr->bf16_d = bf16_d;
  tr->t = *t;
  tr->g = g;
  bytes = FP8_TRACK_FLAGS * sizeof(unsigned long long) +
          (size_t)g.blocks * FP8_TRACK_WORDS * sizeof(uint32_t);
  PULSE_CHECK(pulse_cuda_alloc(&tr->mem_d, bytes));
  tr->bad_d = (unsigned long long *)tr->mem_d;
  tr->counters_d = tr->bad_d + 1;
  words = (uint32_t *)(tr->bad_d + FP8_TRACK_FLAGS);
  tr->amax_d = words;
  tr->hi1_d = words + g.blocks;
  tr->down_d = words + 2 * g.blocks;
  tr->select_d = words + 3 * g.blocks;
  tr->rescan_d = words + 4 * g.blocks;
  tr->state_d = words + 5 * g.blocks;
  PULSE_CHECK(fp8_quantize_on(bf16_d, &g, t->q_d, t->scale_inv_d,
                              tr->rescan_d, tr->amax_d, tr->bad_d,
                              (cudaStream_t)at.stream, what));
  PULSE_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)at.stream));
  *out = tr;
  tr = NULL;
cleanup:
  pulse_cuda_leave_(&at);
  pulse_cuda_fp8_track_free(tr);
  return st;
}

extern "C" void pulse_cuda_fp8_track_free(pulse_cuda_fp8_track *track) {
  if (track == NULL)
    return;
  pulse_cuda_free(track->mem_d);
  free(track);
}

extern "C" void pulse_cuda_fp8_track_drop(pulse_cuda_fp8_track *track) {
  if (track != NULL)
    track->staged = 0;
}

extern "C" pulse_status pulse_cuda_fp8_track_requantize(
    pulse_cuda_fp8_track *track, void *stream) {
  static const char what[] = "cuda fp8 requantize";
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  if (track == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL track", what);
  track->staged = 0;
  PULSE_TRY(pulse_cuda_enter_(NULL, track->mem_d, stream, what, &at));
  PULSE_CHECK(fp8_quantize_on(track->bf16_d, &track->g, track->t.q_d,
                              track->t.scale_inv_d, track->rescan_d,
                              track->amax_d, track->bad_d,
                              (cudaStream_t)at.stream, what));
  PULSE_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)at.stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

extern "C" pulse_status pulse_cuda_fp8_track_stage(pulse_cuda_fp8_track *track,
                                                   const uint64_t *pos_d,
                                                   const uint16_t *new_d,
                                                   uint64_t count,
                                                   void *stream) {
  static const char what[] = "cuda fp8 stage";
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  const pulse_fp8_geom *g;
  unsigned long long bad = 0;
  uint64_t p = 0;
  uint16_t v = 0;
  cudaStream_t s;
  if (track == NULL || (count > 0 && (pos_d == NULL || new_d == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL argument", what);
  if ((uintptr_t)pos_d % 8 || (uintptr_t)new_d % 2)
    return pulse_fail(PULSE_ERR_ARG, "%s: misaligned change arrays", what);
  g = &track->g;
  track->staged = 0;
  PULSE_TRY(pulse_cuda_enter_(NULL, track->mem_d, stream, what, &at));
  s = (cudaStream_t)at.stream;
  if (count > 0) {
    PULSE_CHECK(pulse_cuda_check_ptr_(pos_d, at.device, what));
    PULSE_CHECK(pulse_cuda_check_ptr_(new_d, at.device, what));
  }
  if (g->blocks > 0)
    PULSE_CUDA_CHECK(cudaMemsetAsync(track->hi1_d, 0,
                                     2 * g->blocks * sizeof(uint32_t), s));
  PULSE_CUDA_CHECK(cudaMemsetAsync(track->bad_d, 0xFF, sizeof bad, s));
  if (count > 0) {
    PULSE_LAUNCH(fp8_stage_kernel, grid_for(count, PULSE_LIST_THREADS),
                 PULSE_LIST_THREADS, s, track->bf16_d, *g, pos_d, new_d, count,
                 (const uint32_t *)track->amax_d, track->hi1_d, track->down_d,
                 track->bad_d);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CUDA_CHECK(cudaMemcpyAsync(&bad, track->bad_d, sizeof bad,
                                   cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (bad != ~0ull) {
    PULSE_CUDA_CHECK(cudaMemcpyAsync(&p, pos_d + bad, sizeof p,
                                     cudaMemcpyDeviceToHost, s));
    PULSE_CUDA_CHECK(cudaMemcpyAsync(&v, new_d + bad, sizeof v,
                                     cudaMemcpyDeviceToHost, s));
    PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
    if (p >= g->numel)
      st = pulse_fail(PULSE_ERR_ARG,
                      "%s: entry %llu: offset %llu outside %llu elements", what,
                      bad, (unsigned long long)p,
                      (unsigned long long)g->numel);
    else
      st = not_finite(what, g, p, v, "would be");
    goto cleanup;
  }
  track->pos_d = pos_d;
  track->new_d = new_d;
  track->count = count;
  track->staged = 1;
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

extern "C" pulse_status
pulse_cuda_fp8_track_commit(pulse_cuda_fp8_track *track, void *stream,
                            pulse_fp8_stage_figures *figures) {
  static const char what[] = "cuda fp8 commit";
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  const pulse_fp8_geom *g;
  unsigned long long *counters = NULL, fig[4] = {0, 0, 0, 0};
  uint32_t *scales;
  cudaStream_t s;
  if (figures != NULL)
    memset(figures, 0, sizeof *figures);
  if (track == NULL || !track->staged)
    return pulse_fail(PULSE_ERR_ARG, "%s: no step staged", what);
  track->staged = 0;
  g = &track->g;
  scales = (uint32_t *)track->t.scale_inv_d;
  PULSE_TRY(pulse_cuda_enter_(NULL, track->mem_d, stream, what, &at));
  s = (cudaStream_t)at.stream;
  if (figures != NULL) {
    counters = track->counters_d;
    PULSE_CUDA_CHECK(cudaMemsetAsync(counters, 0, sizeof fig, s));
  }
  if (g->blocks > 0) {
    const unsigned grid = grid_for(g->blocks, PULSE_LIST_THREADS);
    PULSE_LAUNCH(fp8_decide_kernel, grid, PULSE_LIST_THREADS, s, *g,
                 (const uint32_t *)track->amax_d, (const uint32_t *)track->hi1_d,
                 (const uint32_t *)track->down_d, track->select_d);
    PULSE_CUDA_CHECK(cudaGetLastError());
    PULSE_CUDA_CHECK(cudaMemsetAsync(track->rescan_d, 0,
                                     g->blocks * sizeof(uint32_t), s));
    if (g->tiles > 0) {
      PULSE_LAUNCH(fp8_amax_kernel, grid_for(g->tiles, 1),
                   PULSE_FP8_TILE_THREADS, s, track->bf16_d, *g,
                   (const uint32_t *)track->select_d, track->rescan_d,
                   (unsigned long long *)NULL);
      PULSE_CUDA_CHECK(cudaGetLastError());
    }
    PULSE_LAUNCH(fp8_rescale_kernel, grid, PULSE_LIST_THREADS, s, *g,
                 track->amax_d, (const uint32_t *)track->hi1_d,
                 (const uint32_t *)track->select_d,
                 (const uint32_t *)track->rescan_d, track->state_d, scales,
                 counters);
    PULSE_CUDA_CHECK(cudaGetLastError());
    if (g->tiles > 0) {
      PULSE_LAUNCH(fp8_quantize_kernel, grid_for(g->tiles, 1),
                   PULSE_FP8_TILE_THREADS, s, track->bf16_d, *g,
                   (const uint32_t *)track->state_d, (const uint32_t *)scales,
                   track->t.q_d);
      PULSE_CUDA_CHECK(cudaGetLastError());
    }
  }
  if (track->count > 0) {
    PULSE_LAUNCH(fp8_elements_kernel, grid_for(track->count, PULSE_LIST_THREADS),
                 PULSE_LIST_THREADS, s, *g, track->pos_d, track->new_d,
                 track->count, (const uint32_t *)track->state_d,
                 (const uint32_t *)scales, track->t.q_d, counters);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  if (figures != NULL) {
    PULSE_CUDA_CHECK(cudaMemcpyAsync(fig, counters, sizeof fig,
                                     cudaMemcpyDeviceToHost, s));
    PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
    figures->changes = track->count;
    figures->blocks_touched = fig[FP8_FIG_TOUCHED];
    figures->blocks_rescanned = fig[FP8_FIG_RESCANNED];
    figures->blocks_rescaled = fig[FP8_FIG_RESCALED];
    figures->elements_quantized = fig[FP8_FIG_ELEMS];
  }
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}
