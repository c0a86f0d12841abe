/* loco.cu - the PULSELoCo gate and error feedback on the device (docs/design.md,
 * "PULSELoCo"), elementwise over FP32 arrays: s = e + (theta_g - theta_r),
 * send (pos, s) where bf16(theta_g) != bf16(theta_g - s), in increasing
 * position, and keep e = s elsewhere (0 where sent). Two passes, as the
 * detection: count per warp tile, scan, write (only when everything fits,
 * so an overflow changes nothing). */
#include "loco.cuh"
#include "pulse_loco_elem.h"

/* One warp per tile of 2^PULSE_LOCO_TILE_LOG2 elements: the gate of element
 * s0 + u * 32 + lane of the tile, loads issued before use. */
typedef struct {
  float g[PULSE_TILE_UNROLL];
  float s[PULSE_TILE_UNROLL];
  int send[PULSE_TILE_UNROLL];
} gate_steps;

__device__ static inline void gate_load(const float *theta_g,
                                        const float *theta_r, const float *e,
                                        uint64_t first, uint32_t n, uint32_t s0,
                                        gate_steps *st) {
  float g[PULSE_TILE_UNROLL], r[PULSE_TILE_UNROLL], x[PULSE_TILE_UNROLL];
#pragma unroll
  for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
    const uint32_t i = s0 + (uint32_t)u * 32u + pulse_lane();
    g[u] = r[u] = x[u] = 0.0f;
    if (i < n) {
      g[u] = theta_g[first + i];
      r[u] = theta_r[first + i];
      x[u] = e[first + i];
    }
  }
#pragma unroll
  for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
    const uint32_t i = s0 + (uint32_t)u * 32u + pulse_lane();
    st->g[u] = g[u];
    st->s[u] = pulse_loco_signal(g[u], r[u], x[u]);
    st->send[u] = i < n && pulse_loco_gate(g[u], st->s[u]);
  }
}

__device__ static inline uint32_t tile_elems(uint64_t n, uint64_t tile) {
  const uint64_t first = tile << PULSE_LOCO_TILE_LOG2,
                 full = 1ull << PULSE_LOCO_TILE_LOG2;
  return (uint32_t)(n - first < full ? n - first : full);
}

static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    loco_count_kernel(const float *theta_g, const float *theta_r,
                      const float *e, uint64_t n, uint64_t tiles,
                      uint64_t *tile_counts) {
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tiles)
    return;
  const uint64_t first = tile << PULSE_LOCO_TILE_LOG2;
  const uint32_t m = tile_elems(n, tile);
  uint64_t count = 0;
  for (uint32_t s0 = 0; s0 < m; s0 += 32u * PULSE_TILE_UNROLL) {
    gate_steps gs;
    gate_load(theta_g, theta_r, e, first, m, s0, &gs);
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++)
      count += (uint64_t)__popc(__ballot_sync(PULSE_FULL_MASK, gs.send[u]));
  }
  if (lane == 0)
    tile_counts[tile] = count;
}

static __global__ void __launch_bounds__(PULSE_TILE_THREADS)
    loco_write_kernel(const float *theta_g, const float *theta_r, float *e,
                      uint64_t n, uint64_t tiles, const uint64_t *tile_offset,
                      uint64_t *pos, float *value) {
  const unsigned lane = pulse_lane(), warp = threadIdx.x / 32u;
  const uint64_t tile = (uint64_t)blockIdx.x * PULSE_TILE_WARPS + warp;
  if (tile >= tiles)
    return;
  const uint64_t first = tile << PULSE_LOCO_TILE_LOG2;
  const uint32_t m = tile_elems(n, tile);
  uint64_t at = tile_offset[tile];
  for (uint32_t s0 = 0; s0 < m; s0 += 32u * PULSE_TILE_UNROLL) {
    gate_steps gs;
    gate_load(theta_g, theta_r, e, first, m, s0, &gs);
#pragma unroll
    for (int u = 0; u < PULSE_TILE_UNROLL; u++) {
      const uint32_t i = s0 + (uint32_t)u * 32u + lane;
      const unsigned sending = __ballot_sync(PULSE_FULL_MASK, gs.send[u]);
      if (gs.send[u]) {
        const uint64_t k = at + (uint64_t)__popc(sending & pulse_lanes_below());
        pos[k] = first + i;
        value[k] = gs.s[u];
        e[first + i] = 0.0f;
      } else if (i < m) {
        e[first + i] = gs.s[u];
      }
      at += (uint64_t)__popc(sending);
    }
  }
}

extern "C" pulse_status pulse_cuda_loco_gate(pulse_cuda_workspace *ws,
                                             const float *theta_g_d,
                                             const float *theta_r_d, float *e_d,
                                             uint64_t n, uint64_t capacity,
                                             uint64_t *pos_d, float *value_d,
                                             uint64_t *sent, void *stream) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_at at;
  void *tiles_mem = NULL;
  uint64_t *counts = NULL, *offsets = NULL;
  uint64_t tiles = 0, blocks = 0, total = 0;
  if (sent != NULL)
    *sent = 0;
  if (n > 0 && (theta_g_d == NULL || theta_r_d == NULL || e_d == NULL))
    return pulse_fail(PULSE_ERR_ARG, "cuda loco gate: NULL input");
  if (capacity > 0 && (pos_d == NULL || value_d == NULL))
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda loco gate: NULL output with capacity %llu",
                      (unsigned long long)capacity);
  if ((uintptr_t)theta_g_d % 4 || (uintptr_t)theta_r_d % 4 ||
      (uintptr_t)e_d % 4 || (uintptr_t)pos_d % 8 || (uintptr_t)value_d % 4)
    return pulse_fail(PULSE_ERR_ARG, "cuda loco gate: misaligned array");
  at.previous = -1;
  PULSE_TRY(pulse_cuda_enter_(ws, n > 0 ? theta_g_d : NULL, stream,
                              "cuda loco gate", &at));
  s = (cudaStream_t)at.stream;
  if (n > 0) {
    PULSE_CHECK(pulse_cuda_check_ptr_(theta_r_d, at.device, "cuda loco gate"));
    PULSE_CHECK(pulse_cuda_check_ptr_(e_d, at.device, "cuda loco gate"));
  }
  if (capacity > 0) {
    PULSE_CHECK(pulse_cuda_check_ptr_(pos_d, at.device, "cuda loco gate"));
    PULSE_CHECK(pulse_cuda_check_ptr_(value_d, at.device, "cuda loco gate"));
  }
  if (ws == NULL) {
    PULSE_CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }
  tiles = n ? ((n - 1) >> PULSE_LOCO_TILE_LOG2) + 1 : 0;
  blocks = pulse_tile_blocks(tiles);
  if (blocks > PULSE_GRID_MAX) {
    st = pulse_fail(PULSE_ERR_OVERFLOW, "cuda loco gate: %llu elements",
                    (unsigned long long)n);
    goto cleanup;
  }
  PULSE_CHECK(pulse_cuda_ws_get_(
      ws, PULSE_WS_TILES, 2 * (tiles + 1) * sizeof(uint64_t), &tiles_mem));
  counts = (uint64_t *)tiles_mem;
  offsets = counts + tiles + 1;
  PULSE_CUDA_CHECK(cudaMemsetAsync(counts + tiles, 0, sizeof(uint64_t), s));
  if (blocks > 0) {
    PULSE_LAUNCH(loco_count_kernel, (unsigned)blocks, PULSE_TILE_THREADS, s,
                 theta_g_d, theta_r_d, (const float *)e_d, n, tiles, counts);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CHECK(pulse_scan_u64(ws, counts, offsets, tiles + 1, s));
  PULSE_CUDA_CHECK(cudaMemcpyAsync(&total, offsets + tiles, sizeof total,
                                   cudaMemcpyDeviceToHost, s));
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
  if (sent != NULL)
    *sent = total;
  if (total > capacity) {
    st = pulse_fail(PULSE_ERR_OVERFLOW,
                    "cuda loco gate: %llu entries to send, room for %llu",
                    (unsigned long long)total, (unsigned long long)capacity);
    goto cleanup;
  }
  if (blocks > 0) {
    PULSE_LAUNCH(loco_write_kernel, (unsigned)blocks, PULSE_TILE_THREADS, s,
                 theta_g_d, theta_r_d, e_d, n, tiles, (const uint64_t *)offsets,
                 pos_d, value_d);
    PULSE_CUDA_CHECK(cudaGetLastError());
  }
  PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
  pulse_cuda_workspace_free(temp);
  pulse_cuda_leave_(&at);
  return st;
}
