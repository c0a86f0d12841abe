/* encode.cu - change detection on the device for a whole tensor table: cast
 * with the one rounding, compare bits, compact the changes (with old and new
 * bits, and the rank form of the class position model) in the CPU encoder's
 * order, update the snapshot.
 *
 * Passes, each one launch for the whole table (tiles of one warp each):
 *   tally         per tile: changes, and class counts of the base
 *   scan          exclusive sum of the tile change counts (CUB)
 *   chunk prefix  per chunk and class: prefix over its tiles, chunk totals
 *   firsts        per tensor: index of its first change
 *   write         per tile: the changes at their scanned offsets, each with
 *                 its class and rank (tile prefix + running count in the
 *                 tile), then the snapshot
 * A warp walks its tile 32 consecutive elements per step, so ranks and the
 * compaction order follow storage order exactly as the CPU loops do. */
#include <stdlib.h>
#include <string.h>

#include "encode.cuh"

/* ------------------------------------------------------------ kernels */

/* Where a warp reads its tile: the base bits, and the current values (cur
 * 0: none, the new bits are the base's). */
typedef struct {
  const uint16_t *base;
  uintptr_t cur;
  int f32;
} tile_source;

__device__ static inline tile_source tile_source_of(const pulse_dev_table &tab,
                                                    uint32_t t) {
  tile_source src;
  src.base = pulse_tab_base(tab, t);
  src.cur = (uintptr_t)tab.cur[t];
  src.f32 = tab.dtype[t] == (uint8_t)PULSE_DTYPE_F32;
  return src;
}

/* Loads PULSE_TILE_UNROLL steps of a tile (element s0 + u * 32 + lane, all
 * loads issued before any is used): base bits and new bits, the one
 * rounding of an FP32 value or the BF16 value itself. */
__device__ static inline void
load_steps(const tile_source &src, const pulse_tile &tl, uint32_t s0,
           uint16_t (&old_bits)[PULSE_TILE_UNROLL],
           uint16_t (&new_bits)[PULSE_TILE_UNROLL]) {
#pragma unroll
  for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
    const uint32_t i = s0 + (uint32_t)u * 32u + pulse_lane();
    const uint64_t at = tl.first + i;
    old_bits[u] = 0;
    new_bits[u] = 0;
    if (i < tl.n) {
      old_bits[u] = src.base[at];
      if (src.cur == 0)
        new_bits[u] = old_bits[u];
      else if (src.f32)
        new_bits[u] = pulse_bf16_from_f32_bits(((const uint32_t *)src.cur)[at]);
      else
        new_bits[u] = ((const uint16_t *)src.cur)[at];
    }
  }
}

static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    tally_kernel(pulse_dev_table tab, uint32_t *tile_hist,
                 uint64_t *tile_changes) {
  __shared__ uint32_t hist_s[PULSE_TILE_WARPS][PULSE_CLASS_COUNT];
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tab.tiles)
    return; /* the whole warp: no block-wide barrier below */
  const pulse_tile tl = pulse_tile_at(tab, tile);
  const tile_source src = tile_source_of(tab, tl.t);
  uint32_t *hist = hist_s[warp];
  for (unsigned c = lane; c < PULSE_CLASS_COUNT; c += 32u)
    hist[c] = 0;
  __syncwarp();
  uint64_t changes = 0;
  for (uint32_t s0 = 0; s0 < tl.n; s0 += 32u * PULSE_TILE_UNROLL) {
    uint16_t old_bits[PULSE_TILE_UNROLL], new_bits[PULSE_TILE_UNROLL];
    load_steps(src, tl, s0, old_bits, new_bits);
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const int valid = s0 + (uint32_t)u * 32u + lane < tl.n;
      const int changed = valid && pulse_bf16_changed(old_bits[u], new_bits[u]);
      changes += (uint64_t)__popc(__ballot_sync(PULSE_FULL_MASK, changed));
      if (tile_hist != NULL) {
        /* One shared add per class present in the step (order is free). */
        const unsigned c =
            valid ? pulse_bf16_class(old_bits[u]) : PULSE_CLASS_COUNT;
        const unsigned same = __match_any_sync(PULSE_FULL_MASK, c);
        if (valid && lane == pulse_first_lane(same))
          atomicAdd(&hist[c], (unsigned)__popc(same));
      }
    }
  }
  __syncwarp();
  if (tile_hist != NULL)
    for (unsigned c = lane; c < PULSE_CLASS_COUNT; c += 32u)
      tile_hist[tile * PULSE_CLASS_COUNT + c] = hist[c];
  if (tile_changes != NULL && lane == 0)
    tile_changes[tile] = changes;
}

/* One block per chunk, one thread per class. */
static __global__ void __launch_bounds__(PULSE_CLASS_COUNT)
    chunk_prefix_kernel(pulse_dev_table tab, uint32_t *tile_hist,
                        uint32_t *chunk_hist) {
  const uint64_t g = blockIdx.x;
  const unsigned c = threadIdx.x;
  const uint32_t t = pulse_find(tab.chunk_first, tab.count, g);
  const uint64_t j = g - tab.chunk_first[t];
  const uint32_t shift = tab.chunk_log2 - tab.tile_log2;
  const uint64_t t0 = tab.tile_first[t] + (j << shift);
  const uint64_t t_end = tab.tile_first[t + 1];
  const uint64_t t1 =
      t_end - t0 < (1ull << shift) ? t_end : t0 + (1ull << shift);
  uint32_t run = 0;
  for (uint64_t tile = t0; tile < t1; tile++) {
    uint32_t x = tile_hist[tile * PULSE_CLASS_COUNT + c];
    tile_hist[tile * PULSE_CLASS_COUNT + c] = run;
    run += x;
  }
  chunk_hist[g * PULSE_CLASS_COUNT + c] = run;
}

/* firsts[t] = index of tensor t's first change (t = 0 .. count). */
static __global__ void firsts_kernel(pulse_dev_table tab,
                                     const uint64_t *tile_offset,
                                     uint64_t *firsts) {
  const uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t <= tab.count)
    firsts[t] = tile_offset[tab.tile_first[t]];
}

static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    write_kernel(pulse_dev_table tab, const uint32_t *tile_prefix,
                 const uint64_t *tile_offset, pulse_cuda_changes out,
                 int update_snapshot) {
  __shared__ uint32_t hist_s[PULSE_TILE_WARPS][PULSE_CLASS_COUNT];
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tab.tiles)
    return;
  const pulse_tile tl = pulse_tile_at(tab, tile);
  const int ranks = tile_prefix != NULL;
  uint32_t *hist = hist_s[warp];
  if (ranks)
    for (unsigned c = lane; c < PULSE_CLASS_COUNT; c += 32u)
      hist[c] = tile_prefix[tile * PULSE_CLASS_COUNT + c];
  __syncwarp();
  const tile_source src = tile_source_of(tab, tl.t);
  uint16_t *snapshot = pulse_tab_base(tab, tl.t);
  uint64_t at = tile_offset[tile];
  for (uint32_t s0 = 0; s0 < tl.n; s0 += 32u * PULSE_TILE_UNROLL) {
    uint16_t old_bits[PULSE_TILE_UNROLL], new_bits[PULSE_TILE_UNROLL];
    load_steps(src, tl, s0, old_bits, new_bits);
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t i = s0 + (uint32_t)u * 32u + lane;
      const int valid = i < tl.n;
      const int changed = valid && pulse_bf16_changed(old_bits[u], new_bits[u]);
      const unsigned moved = __ballot_sync(PULSE_FULL_MASK, changed);
      const unsigned c =
          valid ? pulse_bf16_class(old_bits[u]) : PULSE_CLASS_COUNT;
      unsigned same = 0;
      uint32_t rank = 0;
      if (ranks) {
        /* Rank: elements of class c before this one in the chunk = earlier
         * tiles (the prefix), earlier steps (hist), earlier lanes now. */
        same = __match_any_sync(PULSE_FULL_MASK, c);
        if (valid)
          rank = hist[c] + (uint32_t)__popc(same & pulse_lanes_below());
      }
      if (changed) {
        const uint64_t k = at + (uint64_t)__popc(moved & pulse_lanes_below());
        out.pos_d[k] = tl.first + i;
        out.old_d[k] = old_bits[u];
        out.new_d[k] = new_bits[u];
        if (ranks) {
          out.class_d[k] = (uint8_t)c;
          out.rank_d[k] = rank;
        }
        if (update_snapshot)
          snapshot[tl.first + i] = new_bits[u];
      }
      at += (uint64_t)__popc(moved);
      if (ranks) {
        __syncwarp(); /* every lane has read hist before it moves */
        if (valid && lane == pulse_first_lane(same))
          hist[c] += (uint32_t)__popc(same);
        __syncwarp();
      }
    }
  }
}

/* ----------------------------------------------------------- launchers */

pulse_status pulse_launch_tally(const pulse_dev_table &tab, uint32_t *tile_hist,
                                uint64_t *tile_changes, cudaStream_t stream) {
  pulse_status st = PULSE_OK;
  const uint64_t blocks = pulse_tile_blocks(tab.tiles);
  if (tab.tiles == 0)
    return PULSE_OK;
  if (blocks > PULSE_GRID_MAX)
    return pulse_fail(PULSE_ERR_OVERFLOW, "tally: %llu tiles",
                      (unsigned long long)tab.tiles);
  PULSE_LAUNCH(tally_kernel, (unsigned)blocks, PULSE_TILE_THREADS, stream, tab,
               tile_hist, tile_changes);
  PULSE_CUDA_CHECK(cudaGetLastError());
cleanup:
  return st;
}

pulse_status pulse_launch_chunk_prefix(const pulse_dev_table &tab,
                                       uint32_t *tile_hist,
                                       uint32_t *chunk_hist,
                                       cudaStream_t stream) {
  pulse_status st = PULSE_OK;
  if (tab.chunks == 0)
    return PULSE_OK;
  if (tab.chunks > PULSE_GRID_MAX)
    return pulse_fail(PULSE_ERR_OVERFLOW, "chunk prefix: %llu chunks",
                      (unsigned long long)tab.chunks);
  PULSE_LAUNCH(chunk_prefix_kernel, (unsigned)tab.chunks, PULSE_CLASS_COUNT,
               stream, tab, tile_hist, chunk_hist);
  PULSE_CUDA_CHECK(cudaGetLastError());
cleanup:
  return st;
}

/* ----------------------------------------------------------- detection */

extern "C" pulse_status
pulse_cuda_detect_check_(const pulse_cuda_detect_tensor *table, size_t count,
                         uint32_t chunk_log2) {
  if (count > 0 && table == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda detect: NULL table");
  if (count >= UINT32_MAX)
    return pulse_fail(PULSE_ERR_ARG, "cuda detect: %zu tensors", count);
  if (chunk_log2 < 10 || chunk_log2 > 30)
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda detect: chunk_log2 %u outside 10..30", chunk_log2);
  for (size_t t = 0; t < count; t++) {
    const pulse_cuda_detect_tensor *x = &table[t];
    if (x->cur_dtype != PULSE_DTYPE_F32 && x->cur_dtype != PULSE_DTYPE_BF16)
      return pulse_fail(
          PULSE_ERR_DTYPE,
          "cuda detect: tensor %zu: input dtype %s (want F32 or BF16)", t,
          pulse_dtype_name(x->cur_dtype));
    if (x->numel == 0)
      continue;
    if (x->cur_d == NULL || x->snapshot_d == NULL)
      return pulse_fail(PULSE_ERR_ARG, "cuda detect: tensor %zu: NULL pointer",
                        t);
    if ((uintptr_t)x->cur_d % pulse_dtype_size(x->cur_dtype) != 0 ||
        (uintptr_t)x->snapshot_d % 2 != 0)
      return pulse_fail(PULSE_ERR_ARG,
                        "cuda detect: tensor %zu: misaligned pointer", t);
    if (x->numel > (UINT64_MAX >> 16))
      return pulse_fail(PULSE_ERR_OVERFLOW,
                        "cuda detect: tensor %zu: %llu elements", t,
                        (unsigned long long)x->numel);
  }
  return PULSE_OK;
}

/* Uploads a detection table. */
static pulse_status detect_table(pulse_cuda_workspace *ws,
                                 const pulse_cuda_detect_tensor *table,
                                 size_t count, uint32_t chunk_log2,
                                 void *stream, pulse_dev_table *tab) {
  pulse_status st = PULSE_OK;
  const void **cur = (const void **)calloc(count + 1, sizeof *cur);
  pulse_dtype *dtype = (pulse_dtype *)calloc(count + 1, sizeof *dtype);
  const uint16_t **base = (const uint16_t **)calloc(count + 1, sizeof *base);
  uint64_t *numel = (uint64_t *)calloc(count + 1, sizeof *numel);
  pulse_table_desc desc;
  if (cur == NULL || dtype == NULL || base == NULL || numel == NULL) {
    st =
        pulse_fail(PULSE_ERR_NOMEM, "cuda detect: table of %zu tensors", count);
    goto cleanup;
  }
  for (size_t t = 0; t < count; t++) {
    cur[t] = table[t].cur_d;
    dtype[t] = table[t].cur_dtype;
    base[t] = table[t].snapshot_d;
    numel[t] = table[t].numel;
  }
  desc.count = count;
  desc.cur = cur;
  desc.dtype = dtype;
  desc.base = base;
  desc.numel = numel;
  desc.entry_first = NULL;
  desc.chunk_log2 = chunk_log2;
  st = pulse_table_upload(ws, PULSE_WS_TABLE, &desc, stream, tab);
cleanup:
  free(cur), free(dtype), free(base), free(numel);
  return st;
}

extern "C" pulse_status pulse_cuda_detect_count_(
    pulse_cuda_workspace *ws, const pulse_cuda_detect_tensor *table,
    size_t count, uint32_t chunk_log2, int ranks, uint32_t *chunk_hist_d,
    uint64_t *tensor_changes, uint64_t *total, void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_dev_table tab;
  void *tiles_mem = NULL, *hist_mem = NULL, *small = NULL;
  uint64_t *tile_changes = NULL, *tile_offset = NULL;
  uint64_t *firsts = (uint64_t *)calloc(count + 1, sizeof *firsts);
  *total = 0;
  if (firsts == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda detect: %zu tensors", count);
  PULSE_CHECK(detect_table(ws, table, count, chunk_log2, stream, &tab));
  PULSE_CHECK(pulse_cuda_ws_get_(
      ws, PULSE_WS_TILES, 2 * (tab.tiles + 1) * sizeof(uint64_t), &tiles_mem));
  tile_changes = (uint64_t *)tiles_mem;
  tile_offset = tile_changes + tab.tiles + 1;
  PULSE_CUDA_CHECK(
      cudaMemsetAsync(tile_changes + tab.tiles, 0, sizeof(uint64_t), s));
  if (ranks)
    PULSE_CHECK(pulse_cuda_ws_get_(
        ws, PULSE_WS_TILE_HIST,
        tab.tiles * PULSE_CLASS_COUNT * sizeof(uint32_t), &hist_mem));
  PULSE_CHECK(pulse_launch_tally(tab, (uint32_t *)hist_mem, tile_changes, s));
  PULSE_CHECK(pulse_scan_u64(ws, tile_changes, tile_offset, tab.tiles + 1, s));
  if (ranks)
    PULSE_CHECK(
        pulse_launch_chunk_prefix(tab, (uint32_t *)hist_mem, chunk_hist_d, s));
  PULSE_CHECK(pulse_cuda_ws_get_(ws, PULSE_WS_SMALL,
                                 (count + 1) * sizeof(uint64_t), &small));
  PULSE_LAUNCH(firsts_kernel, (unsigned)(count / PULSE_LIST_THREADS + 1),
               PULSE_LIST_THREADS, s, tab, tile_offset, (uint64_t *)small);
  PULSE_CUDA_CHECK(cudaGetLastError());
  PULSE_CUDA_CHECK(cudaMemcpyAsync(firsts, small,
                                   (count + 1) * sizeof(uint64_t),
                                   cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  *total = firsts[count];
  for (size_t t = 0; tensor_changes != NULL && t < count; t++)
    tensor_changes[t] = firsts[t + 1] - firsts[t];
cleanup:
  free(firsts);
  return st;
}

extern "C" pulse_status pulse_cuda_detect_write_(
    pulse_cuda_workspace *ws, const pulse_cuda_detect_tensor *table,
    size_t count, uint32_t chunk_log2, int ranks, const pulse_cuda_changes *out,
    int update_snapshot, void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_dev_table tab;
  void *tiles_mem = NULL, *hist_mem = NULL;
  uint64_t blocks = 0;
  PULSE_CHECK(detect_table(ws, table, count, chunk_log2, stream, &tab));
  /* The same sizes as the count: the slots keep what it left there. */
  PULSE_CHECK(pulse_cuda_ws_get_(
      ws, PULSE_WS_TILES, 2 * (tab.tiles + 1) * sizeof(uint64_t), &tiles_mem));
  if (ranks)
    PULSE_CHECK(pulse_cuda_ws_get_(
        ws, PULSE_WS_TILE_HIST,
        tab.tiles * PULSE_CLASS_COUNT * sizeof(uint32_t), &hist_mem));
  blocks = pulse_tile_blocks(tab.tiles);
  if (blocks > PULSE_GRID_MAX) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "cuda detect: %llu tiles",
                    (unsigned long long)tab.tiles);
    goto cleanup;
  }
  if (blocks > 0) {
    PULSE_LAUNCH(write_kernel, (unsigned)blocks, PULSE_TILE_THREADS, s, tab,
                 (const uint32_t *)hist_mem,
                 (const uint64_t *)tiles_mem + tab.tiles + 1, *out,
                 update_snapshot);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
  return st;
}

/* The first tensor with elements: the call runs on its device. */
static const void *detect_first_ptr(const pulse_cuda_detect_tensor *table,
                                    size_t count) {
  for (size_t t = 0; table != NULL && t < count; t++)
    if (table[t].numel > 0)
      return table[t].cur_d;
  return NULL;
}

/* Every array of a detection on the call's device. */
static pulse_status detect_check_device(const pulse_cuda_detect_tensor *table,
                                        size_t count,
                                        const pulse_cuda_changes *out,
                                        int device) {
  const char *what = "cuda detect";
  for (size_t t = 0; t < count; t++) {
    if (table[t].numel == 0)
      continue;
    PULSE_TRY(pulse_cuda_check_ptr_(table[t].cur_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(table[t].snapshot_d, device, what));
  }
  if (out != NULL) {
    PULSE_TRY(pulse_cuda_check_ptr_(out->pos_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(out->old_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(out->new_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(out->class_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(out->rank_d, device, what));
    PULSE_TRY(pulse_cuda_check_ptr_(out->chunk_hist_d, device, what));
  }
  return PULSE_OK;
}

extern "C" pulse_status pulse_cuda_detect_check_device_(
    const pulse_cuda_detect_tensor *table, size_t count, int device) {
  return detect_check_device(table, count, NULL, device);
}

extern "C" pulse_status pulse_cuda_detect(pulse_cuda_workspace *ws,
                                          const pulse_cuda_detect_tensor *table,
                                          size_t count,
                                          const pulse_cuda_detect_opts *opts,
                                          const pulse_cuda_changes *out,
                                          uint64_t *tensor_changes,
                                          uint64_t *total, void *stream) {
  pulse_status st = PULSE_OK;
  pulse_cuda_detect_opts defaults;
  pulse_cuda_detect_opts_init(&defaults);
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_at at;
  uint64_t found = 0, chunks = 0;
  int ranks = 0;
  at.previous = -1;
  if (total != NULL)
    *total = 0;
  if (opts == NULL)
    opts = &defaults;
  PULSE_TRY(PULSE_OPTS_CHECK("cuda detect", opts, PULSE_CUDA_DETECT_OPTS_VERSION));
  PULSE_TRY(pulse_cuda_detect_check_(table, count, opts->chunk_log2));
  if (out != NULL) {
    int given = (out->class_d != NULL) + (out->rank_d != NULL) +
                (out->chunk_hist_d != NULL);
    if (given != 0 && given != 3)
      return pulse_fail(PULSE_ERR_ARG,
                        "cuda detect: the rank form needs class_d, rank_d and "
                        "chunk_hist_d together");
    if (out->capacity > 0 &&
        (out->pos_d == NULL || out->old_d == NULL || out->new_d == NULL))
      return pulse_fail(PULSE_ERR_ARG, "cuda detect: NULL output arrays");
    ranks = given == 3;
    if (ranks) {
      PULSE_TRY(
          pulse_cuda_chunk_count(table, count, opts->chunk_log2, &chunks));
      if (chunks > out->chunk_capacity)
        return pulse_fail(PULSE_ERR_OVERFLOW,
                          "cuda detect: %llu chunks, room for %llu",
                          (unsigned long long)chunks,
                          (unsigned long long)out->chunk_capacity);
    }
  }
  PULSE_TRY(pulse_cuda_enter_(ws, detect_first_ptr(table, count), stream,
                              "cuda detect", &at));
  stream = at.stream;
  PULSE_CHECK(detect_check_device(table, count, out, at.device));
  if (ws == NULL) {
    PULSE_CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }
  PULSE_CHECK(pulse_cuda_detect_count_(ws, table, count, opts->chunk_log2,
                                       ranks, ranks ? out->chunk_hist_d : NULL,
                                       tensor_changes, &found, stream));
  if (total != NULL)
    *total = found;
  if (out == NULL)
    goto cleanup;
  if (found > out->capacity) {
    st = pulse_fail(
        PULSE_ERR_OVERFLOW, "cuda detect: %llu changes, room for %llu",
        (unsigned long long)found, (unsigned long long)out->capacity);
    goto cleanup;
  }
  PULSE_CHECK(pulse_cuda_detect_write_(ws, table, count, opts->chunk_log2,
                                       ranks, out, opts->update_snapshot,
                                       stream));
cleanup:
  pulse_cuda_workspace_free(temp);
  pulse_cuda_leave_(&at);
  return st;
}
