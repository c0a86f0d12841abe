/* apply.cu - the receiver's side on the device: tensor digests, digest moves
 * of change lists, gather (old bits, new = old + delta) and scatter of change
 * lists, and the class index that turns class-rank positions of the class
 * model back into positions without copying the base to the host. */
#include <stdlib.h>
#include <string.h>

#include "apply.cuh"
#include "encode.cuh"

/* ------------------------------------------------------------ kernels */

/* One warp per tile: lane sums of the tile's element hashes, one atomic add
 * per lane and tile (the sum is order-free, so any split gives the bits of
 * pulse_digest_bf16). */
static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    digest_kernel(pulse_dev_table tab, uint64_t *sums) {
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tab.tiles)
    return;
  const pulse_tile tl = pulse_tile_at(tab, tile);
  const uint16_t *base = pulse_tab_base(tab, tl.t);
  uint64_t a = 0, b = 0;
  for (uint32_t s0 = 0; s0 < tl.n; s0 += 32u * PULSE_TILE_UNROLL) {
    uint16_t bits[PULSE_TILE_UNROLL];
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t i = s0 + (uint32_t)u * 32u + lane;
      bits[u] = i < tl.n ? base[tl.first + i] : 0;
    }
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t i = s0 + (uint32_t)u * 32u + lane;
      if (i < tl.n) {
        const uint64_t x = pulse_digest_key(tl.first + i, bits[u]);
        a += pulse_digest_lane_a(x);
        b += pulse_digest_lane_b(x);
      }
    }
  }
  a = pulse_warp_sum(a);
  b = pulse_warp_sum(b);
  if (lane == 0) {
    pulse_atomic_add_u64(&sums[2 * (uint64_t)tl.t], a);
    pulse_atomic_add_u64(&sums[2 * (uint64_t)tl.t + 1], b);
  }
}

/* Digest move of one change. */
__device__ static inline void change_move(uint64_t pos, uint16_t old_bits,
                                          uint16_t new_bits, uint64_t *a,
                                          uint64_t *b) {
  const uint64_t xo = pulse_digest_key(pos, old_bits),
                 xn = pulse_digest_key(pos, new_bits);
  *a = pulse_digest_lane_a(xn) - pulse_digest_lane_a(xo);
  *b = pulse_digest_lane_b(xn) - pulse_digest_lane_b(xo);
}

/* One warp per 32 * PULSE_DIGEST_PER_LANE consecutive entries: summed in
 * the warp when they all belong to one tensor (the usual case), else one
 * atomic add per entry. */
static __global__ void changes_digest_kernel(pulse_dev_table tab,
                                             const uint64_t *pos,
                                             const uint16_t *old_bits,
                                             const uint16_t *new_bits,
                                             uint64_t *sums) {
  const unsigned lane = pulse_lane();
  const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32u;
  const uint64_t span = 32u * PULSE_DIGEST_PER_LANE;
  const uint64_t e0 = warp * span;
  if (e0 >= tab.entries)
    return;
  const uint64_t e1 = tab.entries - e0 < span ? tab.entries : e0 + span;
  const uint32_t t0 = pulse_find(tab.entry_first, tab.count, e0);
  const uint32_t t1 = pulse_find(tab.entry_first, tab.count, e1 - 1);
  if (t0 == t1) {
    uint64_t a = 0, b = 0;
    for (uint64_t e = e0 + lane; e < e1; e += 32u) {
      uint64_t ma, mb;
      change_move(pos[e], old_bits[e], new_bits[e], &ma, &mb);
      a += ma;
      b += mb;
    }
    a = pulse_warp_sum(a);
    b = pulse_warp_sum(b);
    if (lane == 0) {
      pulse_atomic_add_u64(&sums[2 * (uint64_t)t0], a);
      pulse_atomic_add_u64(&sums[2 * (uint64_t)t0 + 1], b);
    }
  } else {
    for (uint64_t e = e0 + lane; e < e1; e += 32u) {
      const uint32_t t = pulse_find(tab.entry_first, tab.count, e);
      uint64_t ma, mb;
      change_move(pos[e], old_bits[e], new_bits[e], &ma, &mb);
      pulse_atomic_add_u64(&sums[2 * (uint64_t)t], ma);
      pulse_atomic_add_u64(&sums[2 * (uint64_t)t + 1], mb);
    }
  }
}

/* Grid-stride over the entries of a change list. */
#define FOR_EACH_ENTRY(e, tab)                                                 \
  for (uint64_t e = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;           \
       e < (tab).entries; e += (uint64_t)gridDim.x * blockDim.x)

static __global__ void scatter_kernel(pulse_dev_table tab, const uint64_t *pos,
                                      const uint16_t *new_bits, unsigned *bad) {
  FOR_EACH_ENTRY(e, tab) {
    const uint32_t t = pulse_find(tab.entry_first, tab.count, e);
    const uint64_t p = pos[e];
    if (p < tab.numel[t])
      pulse_tab_base(tab, t)[p] = new_bits[e];
    else
      atomicOr(bad, 1u);
  }
}

static __global__ void gather_kernel(pulse_dev_table tab, const uint64_t *pos,
                                     const uint16_t *delta, uint16_t *old_bits,
                                     uint16_t *new_bits, unsigned *bad) {
  FOR_EACH_ENTRY(e, tab) {
    const uint32_t t = pulse_find(tab.entry_first, tab.count, e);
    const uint64_t p = pos[e];
    uint16_t old = 0;
    if (p < tab.numel[t])
      old = pulse_tab_base(tab, t)[p];
    else
      atomicOr(bad, 1u);
    old_bits[e] = old;
    new_bits[e] = pulse_bf16_undelta(old, delta[e]);
  }
}

/* One warp per tile of a class index whose chunk has entries. Entry keys
 * are class << 32 | rank, increasing within a chunk. The warp walks its tile
 * as the detect write pass does, keeping each class's running rank (hist,
 * from the tile's prefix) and a cursor: the first entry of the class at or
 * past that rank. In a step, the lanes of class c hold ranks r0 .. r0 + g - 1
 * in lane order; the lowest of them takes every entry with a key below
 * c << 32 | (r0 + g), whose rank r names the (r - r0)-th of those lanes. */
static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    locate_kernel(pulse_dev_table tab, const uint32_t *tile_prefix,
                  const uint64_t *chunk_entry, const uint64_t *keys,
                  uint64_t *pos, uint64_t *located) {
  __shared__ uint32_t hist_s[PULSE_TILE_WARPS][PULSE_CLASS_COUNT];
  __shared__ uint64_t cursor_s[PULSE_TILE_WARPS][PULSE_CLASS_COUNT];
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tab.tiles)
    return;
  const pulse_tile tl = pulse_tile_at(tab, tile);
  const uint64_t e_begin = chunk_entry[tl.chunk],
                 e_end = chunk_entry[tl.chunk + 1];
  if (e_begin == e_end)
    return;
  const uint64_t unset = UINT64_MAX;
  uint32_t *hist = hist_s[warp];
  uint64_t *cursor = cursor_s[warp];
  for (unsigned c = lane; c < PULSE_CLASS_COUNT; c += 32u) {
    hist[c] = tile_prefix[tile * PULSE_CLASS_COUNT + c];
    cursor[c] = unset;
  }
  __syncwarp();
  const uint16_t *base = pulse_tab_base(tab, tl.t);
  uint64_t found = 0;
  for (uint32_t s0 = 0; s0 < tl.n; s0 += 32u * PULSE_TILE_UNROLL) {
    uint16_t bits[PULSE_TILE_UNROLL];
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t i = s0 + (uint32_t)u * 32u + lane;
      bits[u] = i < tl.n ? base[tl.first + i] : 0;
    }
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t step = s0 + (uint32_t)u * 32u;
      const int valid = step + lane < tl.n;
      const unsigned c = valid ? pulse_bf16_class(bits[u]) : PULSE_CLASS_COUNT;
      const unsigned same = __match_any_sync(PULSE_FULL_MASK, c);
      if (valid && lane == pulse_first_lane(same)) {
        const uint32_t r0 = hist[c], g = (uint32_t)__popc(same);
        const uint64_t lo = (uint64_t)c << 32 | r0,
                       hi = (uint64_t)c << 32 | (r0 + g);
        uint64_t k = cursor[c];
        if (k == unset)
          k = pulse_lower_bound(keys, e_begin, e_end, lo);
        for (; k < e_end && keys[k] < hi; k++) {
          if (keys[k] < lo)
            continue; /* out of order: left unlocated, so the count fails */
          const unsigned l = pulse_nth_lane(same, (uint32_t)keys[k] - r0);
          pos[k] = tl.first + step + l;
          found++;
        }
        cursor[c] = k;
        hist[c] = r0 + g;
      }
      __syncwarp(); /* the next step's leaders see hist and cursor */
    }
  }
  found = pulse_warp_sum(found);
  if (lane == 0)
    pulse_atomic_add_u64(located, found);
}

/* ------------------------------------------------------------ helpers */

pulse_status pulse_check_ranges(const uint64_t *first, size_t count,
                                const char *what) {
  if (first == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL ranges", what);
  if (first[0] != 0)
    return pulse_fail(PULSE_ERR_ARG, "%s: ranges start at %llu, not 0", what,
                      (unsigned long long)first[0]);
  for (size_t t = 0; t < count; t++)
    if (first[t + 1] < first[t])
      return pulse_fail(PULSE_ERR_ARG, "%s: range %zu ends before it starts",
                        what, t);
  return PULSE_OK;
}

static pulse_status check_bf16_table(const pulse_cuda_bf16_tensor *table,
                                     size_t count, const char *what) {
  if (count > 0 && table == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL table", what);
  if (count >= UINT32_MAX)
    return pulse_fail(PULSE_ERR_ARG, "%s: %zu tensors", what, count);
  for (size_t t = 0; t < count; t++) {
    if (table[t].numel == 0)
      continue;
    if (table[t].data_d == NULL || (uintptr_t)table[t].data_d % 2 != 0)
      return pulse_fail(PULSE_ERR_ARG,
                        "%s: tensor %zu: NULL or misaligned data", what, t);
    if (table[t].numel > (UINT64_MAX >> 16))
      return pulse_fail(PULSE_ERR_OVERFLOW, "%s: tensor %zu: %llu elements",
                        what, t, (unsigned long long)table[t].numel);
  }
  return PULSE_OK;
}

/* Uploads a BF16 table (with change-list ranges when first is not NULL; a
 * NULL table gives tensors of no elements, for the ranges alone) into table
 * slot `which`. */
static pulse_status bf16_table(pulse_cuda_workspace *ws, unsigned which,
                               const pulse_cuda_bf16_tensor *table,
                               size_t count, const uint64_t *first,
                               uint32_t chunk_log2, void *stream,
                               pulse_dev_table *tab) {
  pulse_status st = PULSE_OK;
  const uint16_t **base = (const uint16_t **)calloc(count + 1, sizeof *base);
  uint64_t *numel = (uint64_t *)calloc(count + 1, sizeof *numel);
  pulse_table_desc desc;
  memset(&desc, 0, sizeof desc);
  if (base == NULL || numel == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "table of %zu tensors", count);
    goto cleanup;
  }
  for (size_t t = 0; table != NULL && t < count; t++) {
    base[t] = table[t].data_d;
    numel[t] = table[t].numel;
  }
  desc.count = count;
  desc.base = base;
  desc.numel = numel;
  desc.entry_first = first;
  desc.chunk_log2 = chunk_log2;
  st = pulse_table_upload(ws, which, &desc, stream, tab);
cleanup:
  free(base), free(numel);
  return st;
}

/* Blocks for a grid-stride pass over n entries. */
static unsigned list_blocks(uint64_t n) {
  uint64_t blocks = (n + PULSE_LIST_THREADS - 1) / PULSE_LIST_THREADS;
  const uint64_t cap = 1u << 20;
  return (unsigned)(blocks == 0 ? 1 : blocks < cap ? blocks : cap);
}

/* The first tensor with elements (the call's device is its device). */
static const void *first_data(const pulse_cuda_bf16_tensor *table,
                              size_t count) {
  for (size_t t = 0; table != NULL && t < count; t++)
    if (table[t].numel > 0)
      return table[t].data_d;
  return NULL;
}

/* Every tensor of a table on the call's device. */
static pulse_status check_table_device(const pulse_cuda_bf16_tensor *table,
                                       size_t count, int device,
                                       const char *what) {
  for (size_t t = 0; table != NULL && t < count; t++)
    if (table[t].numel > 0)
      PULSE_TRY(pulse_cuda_check_ptr_(table[t].data_d, device, what));
  return PULSE_OK;
}

/* Public entries over a BF16 table: checks, device, stream and workspace. */
typedef struct {
  pulse_cuda_at at;
  pulse_cuda_workspace *ws, *temp;
} entry;

static pulse_status entry_begin(entry *e, pulse_cuda_workspace *ws,
                                const pulse_cuda_bf16_tensor *table,
                                size_t count, const void *other_d,
                                void *stream, const char *what) {
  e->at.previous = -1;
  e->ws = ws;
  e->temp = NULL;
  const void *ptr = first_data(table, count);
  PULSE_TRY(pulse_cuda_enter_(ws, ptr != NULL ? ptr : other_d, stream, what,
                              &e->at));
  pulse_status st = check_table_device(table, count, e->at.device, what);
  if (st == PULSE_OK && other_d != NULL)
    st = pulse_cuda_check_ptr_(other_d, e->at.device, what);
  if (st == PULSE_OK && ws == NULL) {
    st = pulse_cuda_workspace_create(&e->temp);
    e->ws = e->temp;
  }
  if (st != PULSE_OK)
    pulse_cuda_leave_(&e->at);
  return st;
}

static void entry_end(entry *e) {
  pulse_cuda_workspace_free(e->temp);
  e->temp = NULL;
  pulse_cuda_leave_(&e->at);
}

/* ------------------------------------------------------------ digests */

/* The digest kernels add each tensor's two 64-bit sums into 2 * count + 1
 * words of the small workspace (the last one spare for the kernels'
 * bounds): these zero them before the launch and read them back after. */
static pulse_status digest_sums_zeroed(pulse_cuda_workspace *ws, size_t count,
                                       cudaStream_t s, void **sums) {
  pulse_status st = pulse_cuda_ws_get_(ws, PULSE_WS_SMALL,
                                       (2 * count + 1) * sizeof(uint64_t), sums);
  if (st != PULSE_OK)
    return st;
  PULSE_CUDA_CHECK(
      cudaMemsetAsync(*sums, 0, (2 * count + 1) * sizeof(uint64_t), s));
cleanup:
  return st;
}

static pulse_status digest_sums_read(const void *sums, uint64_t *host,
                                     size_t count, cudaStream_t s,
                                     pulse_tensor_digest *out) {
  pulse_status st = PULSE_OK;
  PULSE_CUDA_CHECK(cudaMemcpyAsync(host, sums,
                                   (2 * count + 1) * sizeof(uint64_t),
                                   cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  for (size_t t = 0; t < count; t++) {
    out[t].a = host[2 * t];
    out[t].b = host[2 * t + 1];
  }
cleanup:
  return st;
}

extern "C" pulse_status
pulse_cuda_digest_in_(pulse_cuda_workspace *ws,
                      const pulse_cuda_bf16_tensor *table, size_t count,
                      pulse_tensor_digest *digests, void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_dev_table tab;
  void *sums = NULL;
  uint64_t *host = NULL;
  uint64_t blocks = 0;
  host = (uint64_t *)calloc(2 * count + 1, sizeof *host);
  if (host == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda digest: %zu tensors", count);
    goto cleanup;
  }
  PULSE_CHECK(bf16_table(ws, PULSE_WS_TABLE, table, count, NULL,
                         PULSE_TILE_LOG2, stream, &tab));
  PULSE_CHECK(digest_sums_zeroed(ws, count, s, &sums));
  blocks = pulse_tile_blocks(tab.tiles);
  if (blocks > PULSE_GRID_MAX) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "cuda digest: %llu tiles",
                    (unsigned long long)tab.tiles);
    goto cleanup;
  }
  if (blocks > 0) {
    PULSE_LAUNCH(digest_kernel, (unsigned)blocks, PULSE_TILE_THREADS, s, tab,
                 (uint64_t *)sums);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CHECK(digest_sums_read(sums, host, count, s, digests));
cleanup:
  free(host);
  return st;
}

extern "C" pulse_status
pulse_cuda_digest(pulse_cuda_workspace *ws, const pulse_cuda_bf16_tensor *table,
                  size_t count, pulse_tensor_digest *digests, void *stream) {
  pulse_status st = PULSE_OK;
  entry e;
  if (count > 0 && digests == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda digest: NULL output");
  PULSE_TRY(check_bf16_table(table, count, "cuda digest"));
  PULSE_TRY(entry_begin(&e, ws, table, count, NULL, stream, "cuda digest"));
  st = pulse_cuda_digest_in_(e.ws, table, count, digests, e.at.stream);
  entry_end(&e);
  return st;
}

extern "C" pulse_status pulse_cuda_changes_digest_in_(
    pulse_cuda_workspace *ws, const uint64_t *tensor_first, size_t count,
    const uint64_t *pos_d, const uint16_t *old_d, const uint16_t *new_d,
    pulse_tensor_digest *moves, void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_dev_table tab;
  void *sums = NULL;
  uint64_t *host = NULL;
  uint64_t warps = 0, blocks = 0;
  const uint64_t per_block = PULSE_LIST_THREADS / 32u;
  host = (uint64_t *)calloc(2 * count + 1, sizeof *host);
  if (host == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda changes digest: %zu tensors", count);
    goto cleanup;
  }
  PULSE_CHECK(bf16_table(ws, PULSE_WS_TABLE, NULL, count, tensor_first,
                         PULSE_TILE_LOG2, stream, &tab));
  PULSE_CHECK(digest_sums_zeroed(ws, count, s, &sums));
  warps = (tab.entries + 32u * PULSE_DIGEST_PER_LANE - 1) /
          (32u * PULSE_DIGEST_PER_LANE);
  blocks = (warps + per_block - 1) / per_block;
  if (blocks > PULSE_GRID_MAX) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "cuda changes digest: %llu entries",
                    (unsigned long long)tab.entries);
    goto cleanup;
  }
  if (blocks > 0) {
    PULSE_LAUNCH(changes_digest_kernel, (unsigned)blocks, PULSE_LIST_THREADS, s,
                 tab, pos_d, old_d, new_d, (uint64_t *)sums);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CHECK(digest_sums_read(sums, host, count, s, moves));
cleanup:
  free(host);
  return st;
}

extern "C" pulse_status pulse_cuda_changes_digest(
    pulse_cuda_workspace *ws, const uint64_t *tensor_first, size_t count,
    const uint64_t *pos_d, const uint16_t *old_d, const uint16_t *new_d,
    pulse_tensor_digest *moves, void *stream) {
  pulse_status st = PULSE_OK;
  entry e;
  if (count >= UINT32_MAX || (count > 0 && moves == NULL))
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda changes digest: bad table or NULL output");
  PULSE_TRY(pulse_check_ranges(tensor_first, count, "cuda changes digest"));
  if (tensor_first[count] > 0 &&
      (pos_d == NULL || old_d == NULL || new_d == NULL))
    return pulse_fail(PULSE_ERR_ARG, "cuda changes digest: NULL change arrays");
  PULSE_TRY(entry_begin(&e, ws, NULL, 0, tensor_first[count] > 0 ? pos_d : NULL,
                        stream, "cuda changes digest"));
  if (tensor_first[count] > 0) {
    st = pulse_cuda_check_ptr_(old_d, e.at.device, "cuda changes digest");
    if (st == PULSE_OK)
      st = pulse_cuda_check_ptr_(new_d, e.at.device, "cuda changes digest");
  }
  if (st == PULSE_OK)
    st = pulse_cuda_changes_digest_in_(e.ws, tensor_first, count, pos_d, old_d,
                                       new_d, moves, e.at.stream);
  entry_end(&e);
  return st;
}

/* ----------------------------------------------------- gather, scatter */

/* Runs gather (delta_d != NULL) or scatter over a change list; *bad gets
 * whether a position was out of range. */
static pulse_status run_list(pulse_cuda_workspace *ws,
                             const pulse_cuda_bf16_tensor *table, size_t count,
                             const uint64_t *tensor_first,
                             const uint64_t *pos_d, const uint16_t *delta_d,
                             uint16_t *old_d, uint16_t *new_d, void *stream,
                             unsigned *bad) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_dev_table tab;
  void *flag = NULL;
  *bad = 0;
  PULSE_CHECK(bf16_table(ws, PULSE_WS_TABLE, table, count, tensor_first,
                         PULSE_TILE_LOG2, stream, &tab));
  PULSE_CHECK(pulse_cuda_ws_get_(ws, PULSE_WS_SMALL, sizeof(unsigned), &flag));
  PULSE_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(unsigned), s));
  if (tab.entries > 0) {
    if (delta_d != NULL)
      PULSE_LAUNCH(gather_kernel, list_blocks(tab.entries), PULSE_LIST_THREADS,
                   s, tab, pos_d, delta_d, old_d, new_d, (unsigned *)flag);
    else
      PULSE_LAUNCH(scatter_kernel, list_blocks(tab.entries), PULSE_LIST_THREADS,
                   s, tab, pos_d, (const uint16_t *)new_d, (unsigned *)flag);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CUDA_CHECK(
      cudaMemcpyAsync(bad, flag, sizeof(unsigned), cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
  return st;
}

static pulse_status check_list(const pulse_cuda_bf16_tensor *table,
                               size_t count, const uint64_t *tensor_first,
                               const uint64_t *pos_d, const void *a_d,
                               const void *b_d, const char *what) {
  PULSE_TRY(check_bf16_table(table, count, what));
  PULSE_TRY(pulse_check_ranges(tensor_first, count, what));
  if (tensor_first[count] > 0 && (pos_d == NULL || a_d == NULL || b_d == NULL))
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL change arrays", what);
  return PULSE_OK;
}

extern "C" pulse_status
pulse_cuda_scatter_in_(pulse_cuda_workspace *ws,
                       const pulse_cuda_bf16_tensor *table, size_t count,
                       const uint64_t *tensor_first, const uint64_t *pos_d,
                       const uint16_t *new_d, void *stream) {
  unsigned bad = 0;
  PULSE_TRY(run_list(ws, table, count, tensor_first, pos_d, NULL, NULL,
                     (uint16_t *)new_d, stream, &bad));
  if (bad)
    return pulse_fail(PULSE_ERR_POSITION,
                      "cuda scatter: a position is past its tensor");
  return PULSE_OK;
}

extern "C" pulse_status
pulse_cuda_scatter(pulse_cuda_workspace *ws,
                   const pulse_cuda_bf16_tensor *table, size_t count,
                   const uint64_t *tensor_first, const uint64_t *pos_d,
                   const uint16_t *new_d, void *stream) {
  pulse_status st = PULSE_OK;
  entry e;
  PULSE_TRY(check_list(table, count, tensor_first, pos_d, new_d, new_d,
                       "cuda scatter"));
  PULSE_TRY(entry_begin(&e, ws, table, count,
                        tensor_first[count] > 0 ? pos_d : NULL, stream,
                        "cuda scatter"));
  if (tensor_first[count] > 0)
    st = pulse_cuda_check_ptr_(new_d, e.at.device, "cuda scatter");
  if (st == PULSE_OK)
    st = pulse_cuda_scatter_in_(e.ws, table, count, tensor_first, pos_d, new_d,
                                e.at.stream);
  entry_end(&e);
  return st;
}

extern "C" pulse_status pulse_cuda_gather_(
    pulse_cuda_workspace *ws, const pulse_cuda_bf16_tensor *table, size_t count,
    const uint64_t *tensor_first, const uint64_t *pos_d,
    const uint16_t *delta_d, uint16_t *old_d, uint16_t *new_d, void *stream) {
  pulse_status st = PULSE_OK;
  unsigned bad = 0;
  PULSE_TRY(check_list(table, count, tensor_first, pos_d, old_d, new_d,
                       "cuda gather"));
  if (tensor_first[count] > 0 && delta_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda gather: NULL deltas");
  PULSE_TRY(pulse_cuda_require_("cuda gather"));
  PULSE_CHECK(run_list(ws, table, count, tensor_first, pos_d, delta_d, old_d,
                       new_d, stream, &bad));
  if (bad)
    st = pulse_fail(PULSE_ERR_POSITION,
                    "cuda gather: a position is past its tensor");
cleanup:
  return st;
}

/* -------------------------------------------------------- class index */

struct pulse_cuda_class_index {
  pulse_cuda_workspace *ws; /* its table, tile prefixes, locate's scratch */
  int owns_ws;              /* built by the public entry: ws is its own */
  int device;
  pulse_dev_table tab;
  uint32_t *hist; /* host: chunks * PULSE_CLASS_COUNT */
  uint32_t *tile_hist_d;
};

extern "C" void pulse_cuda_class_index_free(pulse_cuda_class_index *idx) {
  if (idx == NULL)
    return;
  if (idx->owns_ws)
    pulse_cuda_workspace_free(idx->ws);
  free(idx->hist);
  free(idx);
}

extern "C" pulse_status pulse_cuda_class_index_build_in_(
    pulse_cuda_workspace *ws, const pulse_cuda_bf16_tensor *table, size_t count,
    uint32_t chunk_log2, void *stream, pulse_cuda_class_index **out) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_cuda_class_index *idx = NULL;
  void *tile_hist = NULL, *chunk_hist = NULL;
  size_t hist_bytes = 0;
  *out = NULL;
  idx = (pulse_cuda_class_index *)calloc(1, sizeof *idx);
  if (idx == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda class index");
  idx->ws = ws;
  idx->device = pulse_cuda_ws_device_(ws);
  PULSE_CHECK(bf16_table(ws, PULSE_WS_IDX_TABLE, table, count, NULL,
                         chunk_log2, stream, &idx->tab));
  hist_bytes = idx->tab.chunks * PULSE_CLASS_COUNT * sizeof(uint32_t);
  idx->hist = (uint32_t *)malloc(hist_bytes + sizeof(uint32_t));
  if (idx->hist == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda class index: %llu chunks",
                    (unsigned long long)idx->tab.chunks);
    goto cleanup;
  }
  PULSE_CHECK(pulse_cuda_ws_get_(
      ws, PULSE_WS_IDX_TILE_HIST,
      idx->tab.tiles * PULSE_CLASS_COUNT * sizeof(uint32_t), &tile_hist));
  PULSE_CHECK(
      pulse_cuda_ws_get_(ws, PULSE_WS_IDX_HIST, hist_bytes, &chunk_hist));
  idx->tile_hist_d = (uint32_t *)tile_hist;
  PULSE_CHECK(pulse_launch_tally(idx->tab, idx->tile_hist_d, NULL, s));
  PULSE_CHECK(pulse_launch_chunk_prefix(idx->tab, idx->tile_hist_d,
                                        (uint32_t *)chunk_hist, s));
  if (hist_bytes > 0)
    PULSE_CUDA_CHECK(cudaMemcpyAsync(idx->hist, chunk_hist, hist_bytes,
                                     cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  *out = idx;
  idx = NULL;
cleanup:
  pulse_cuda_class_index_free(idx);
  return st;
}

extern "C" pulse_status
pulse_cuda_class_index_build(const pulse_cuda_bf16_tensor *table, size_t count,
                             uint32_t chunk_log2, void *stream,
                             pulse_cuda_class_index **out) {
  pulse_status st = PULSE_OK;
  pulse_cuda_workspace *ws = NULL;
  pulse_cuda_at at, bind;
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda class index: NULL output");
  *out = NULL;
  PULSE_TRY(check_bf16_table(table, count, "cuda class index"));
  if (chunk_log2 < 10 || chunk_log2 > 30)
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda class index: chunk_log2 %u outside 10..30",
                      chunk_log2);
  PULSE_TRY(pulse_cuda_enter_(NULL, first_data(table, count), stream,
                              "cuda class index", &at));
  PULSE_CHECK(check_table_device(table, count, at.device, "cuda class index"));
  PULSE_CHECK(pulse_cuda_workspace_create(&ws));
  /* Binds ws to the device (current now: no switch). */
  PULSE_CHECK(
      pulse_cuda_enter_(ws, NULL, at.stream, "cuda class index", &bind));
  pulse_cuda_leave_(&bind);
  PULSE_CHECK(pulse_cuda_class_index_build_in_(ws, table, count, chunk_log2,
                                               at.stream, out));
  (*out)->owns_ws = 1;
  ws = NULL;
cleanup:
  pulse_cuda_workspace_free(ws);
  pulse_cuda_leave_(&at);
  return st;
}

extern "C" const uint32_t *
pulse_cuda_class_index_hist(const pulse_cuda_class_index *idx,
                            uint64_t *chunks) {
  if (chunks != NULL)
    *chunks = idx ? idx->tab.chunks : 0;
  return idx ? idx->hist : NULL;
}

extern "C" pulse_status pulse_cuda_locate_keys_(
    const pulse_cuda_class_index *idx, uint64_t g0, uint64_t g1,
    const uint64_t *chunk_first, const uint8_t *cls, const uint32_t *rank,
    uint64_t *keys) {
  for (uint64_t g = g0; g < g1; g++) {
    const uint32_t *hist = idx->hist + g * PULSE_CLASS_COUNT;
    for (uint64_t j = chunk_first[g]; j < chunk_first[g + 1]; j++) {
      if (rank[j] >= hist[cls[j]])
        return pulse_fail(PULSE_ERR_POSITION,
                          "cuda locate: chunk %llu: rank %u past class %u",
                          (unsigned long long)g, rank[j], cls[j]);
      keys[j] = (uint64_t)cls[j] << 32 | rank[j];
      if (j > chunk_first[g] && keys[j] <= keys[j - 1])
        return pulse_fail(PULSE_ERR_POSITION,
                          "cuda locate: chunk %llu: entries out of order",
                          (unsigned long long)g);
    }
  }
  return PULSE_OK;
}

extern "C" pulse_status pulse_cuda_locate_in_(pulse_cuda_class_index *idx,
                                              const uint64_t *chunk_first_d,
                                              const uint64_t *keys_d,
                                              uint64_t entries, uint64_t *pos_d,
                                              void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  uint64_t located = 0, blocks = 0;
  void *small = NULL;
  uint64_t *located_d = NULL;
  if (entries == 0)
    return PULSE_OK;
  PULSE_CHECK(pulse_cuda_ws_get_(idx->ws, PULSE_WS_SMALL, sizeof(uint64_t),
                                 &small));
  located_d = (uint64_t *)small;
  PULSE_CUDA_CHECK(cudaMemsetAsync(located_d, 0, sizeof(uint64_t), s));
  blocks = pulse_tile_blocks(idx->tab.tiles);
  if (blocks > PULSE_GRID_MAX) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "cuda locate: %llu tiles",
                    (unsigned long long)idx->tab.tiles);
    goto cleanup;
  }
  PULSE_LAUNCH(locate_kernel, (unsigned)blocks, PULSE_TILE_THREADS, s, idx->tab,
               (const uint32_t *)idx->tile_hist_d, chunk_first_d, keys_d, pos_d,
               located_d);
  PULSE_CUDA_CHECK(cudaGetLastError());
  PULSE_CUDA_CHECK(cudaMemcpyAsync(&located, located_d, sizeof located,
                                   cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (located != entries)
    st = pulse_fail(PULSE_ERR_INTERNAL,
                    "cuda locate: found %llu of %llu entries",
                    (unsigned long long)located, (unsigned long long)entries);
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_locate(pulse_cuda_class_index *idx,
                                          const uint64_t *chunk_first,
                                          const uint8_t *cls,
                                          const uint32_t *rank, uint64_t *pos_d,
                                          void *stream) {
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  uint64_t entries = 0, chunks = 0;
  uint64_t *keys = NULL, *first_h = NULL;
  void *keys_d = NULL, *first_d = NULL;
  at.previous = -1;
  if (idx == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda locate: NULL index");
  chunks = idx->tab.chunks;
  PULSE_TRY(pulse_check_ranges(chunk_first, (size_t)chunks, "cuda locate"));
  entries = chunk_first[chunks];
  if (entries > 0 && (cls == NULL || rank == NULL || pos_d == NULL))
    return pulse_fail(PULSE_ERR_ARG, "cuda locate: NULL entries or output");
  if (entries == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_cuda_enter_(idx->ws, pos_d, stream, "cuda locate", &at));
  /* Keys and ranges checked and written to pinned staging, then uploaded. */
  PULSE_CHECK(pulse_cuda_pin_get_(idx->ws, PULSE_PIN_KEYS,
                                  entries * sizeof *keys, (void **)&keys));
  PULSE_CHECK(pulse_cuda_locate_keys_(idx, 0, chunks, chunk_first, cls, rank,
                                      keys));
  PULSE_CHECK(pulse_cuda_pin_get_(idx->ws, PULSE_PIN_CHUNKS,
                                  (chunks + 1) * sizeof(uint64_t),
                                  (void **)&first_h));
  memcpy(first_h, chunk_first, (chunks + 1) * sizeof(uint64_t));
  PULSE_CHECK(pulse_cuda_ws_get_(idx->ws, PULSE_WS_X_KEYS,
                                 entries * sizeof *keys, &keys_d));
  PULSE_CHECK(pulse_cuda_ws_get_(idx->ws, PULSE_WS_X_CHUNK_FIRST,
                                 (chunks + 1) * sizeof(uint64_t), &first_d));
  PULSE_CUDA_CHECK(cudaMemcpyAsync(keys_d, keys, entries * sizeof *keys,
                                   cudaMemcpyHostToDevice,
                                   (cudaStream_t)at.stream));
  PULSE_CUDA_CHECK(cudaMemcpyAsync(first_d, first_h,
                                   (chunks + 1) * sizeof(uint64_t),
                                   cudaMemcpyHostToDevice,
                                   (cudaStream_t)at.stream));
  PULSE_CHECK(pulse_cuda_pin_queued_(idx->ws, PULSE_PIN_KEYS, at.stream));
  PULSE_CHECK(pulse_cuda_pin_queued_(idx->ws, PULSE_PIN_CHUNKS, at.stream));
  PULSE_CHECK(pulse_cuda_locate_in_(idx, (const uint64_t *)first_d,
                                    (const uint64_t *)keys_d, entries, pos_d,
                                    at.stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}
