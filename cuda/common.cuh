/* common.cuh - what every kernel family shares: the error macro, the launch
 * macro, the device copy of a tensor table and small warp helpers.
 *
 * Under PULSE_CUDA_EMU (tests/cuda/emu: the kernels compiled as C++ and run
 * by a CPU emulator of the CUDA features used here) the emulator's header is
 * force-included instead of the CUDA runtime and CUB. */
#ifndef PULSE_CUDA_COMMON_CUH
#define PULSE_CUDA_COMMON_CUH

#ifndef PULSE_CUDA_EMU
#include <cuda_runtime.h>
#endif

#include <stddef.h>
#include <stdint.h>

#include "cuda_impl.h"
#include "pulse_cuda.h"
#include "pulse_elem.h"

extern "C" {
#include "status_impl.h"
}

/* Maps a failed CUDA call to PULSE_ERR_CUDA with the CUDA message and jumps
 * to the function's `cleanup` label; the function declares `pulse_status st`
 * (and, C++ being C++, every variable before its first CHECK). */
#define PULSE_CUDA_CHECK(call)                                                 \
  do {                                                                         \
    cudaError_t pulse_cuda_err_ = (call);                                      \
    if (pulse_cuda_err_ != cudaSuccess) {                                      \
      st = pulse_fail(PULSE_ERR_CUDA, "%s: %s (%s)", __func__,                 \
                      cudaGetErrorString(pulse_cuda_err_), #call);             \
      goto cleanup;                                                            \
    }                                                                          \
  } while (0)

/* The same for a pulse_status. */
#define PULSE_CHECK(expr)                                                      \
  do {                                                                         \
    st = (expr);                                                               \
    if (st != PULSE_OK)                                                        \
      goto cleanup;                                                            \
  } while (0)

/* Launches a kernel on a stream (grid and block one-dimensional). Follow it
 * with PULSE_CUDA_CHECK(cudaGetLastError()). */
#ifdef PULSE_CUDA_EMU
#define PULSE_LAUNCH(kernel, grid, block, stream, ...)                         \
  emu_launch_checked((grid), (block), (stream),                                \
                     [=]() { kernel(__VA_ARGS__); }, __VA_ARGS__)
#else
#define PULSE_LAUNCH(kernel, grid, block, stream, ...)                         \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

#define PULSE_FULL_MASK 0xFFFFFFFFu

/* Warps per block of the tile kernels: each warp walks its own tile. */
#define PULSE_TILE_WARPS 4u
#define PULSE_TILE_THREADS (32u * PULSE_TILE_WARPS)
/* Steps (32 elements each) whose loads a lane issues before using them. */
#define PULSE_TILE_UNROLL 4

/* Threads per block of the elementwise kernels over change lists. */
#define PULSE_LIST_THREADS 256u

/* Largest grid the launchers use (blocks). */
#define PULSE_GRID_MAX 0x7FFFFFFFull

/* A tensor table on the device: tensor t's arrays are at the device addresses
 * cur[t] (0 when the kernel has none) and base[t]; it holds numel[t]
 * elements, tiles tile_first[t] .. tile_first[t + 1] - 1 and chunks
 * chunk_first[t] .. chunk_first[t + 1] - 1; entries (changes of a change
 * list) entry_first[t] .. entry_first[t + 1] - 1. Every array lives in the
 * workspace's table slot; the struct itself travels by value to kernels. */
typedef struct {
  const uint64_t *cur;
  const uint64_t *base;
  const uint64_t *numel;
  const uint64_t *tile_first;  /* count + 1 */
  const uint64_t *chunk_first; /* count + 1 */
  const uint64_t *entry_first; /* count + 1 */
  const uint8_t *dtype;        /* of cur */
  uint32_t count;
  uint32_t tile_log2;
  uint32_t chunk_log2;
  uint64_t tiles;
  uint64_t chunks;
  uint64_t entries;
} pulse_dev_table;

#ifdef PULSE_CUDA_EMU
/* The emulator checks that a table's arrays are device memory. */
static inline void emu_check_arg(const pulse_dev_table &tab) {
  if (!emu_is_device(tab.cur, (6 * (size_t)tab.count + 3) * sizeof(uint64_t) +
                                  tab.count))
    emu_fatal("a table whose arrays are not device memory");
}
static inline void emu_check_arg(const pulse_cuda_changes &out) {
  if ((out.pos_d && !emu_is_device(out.pos_d, out.capacity * 8)) ||
      (out.old_d && !emu_is_device(out.old_d, out.capacity * 2)) ||
      (out.new_d && !emu_is_device(out.new_d, out.capacity * 2)) ||
      (out.class_d && !emu_is_device(out.class_d, out.capacity)) ||
      (out.rank_d && !emu_is_device(out.rank_d, out.capacity * 4)) ||
      (out.chunk_hist_d &&
       !emu_is_device(out.chunk_hist_d, out.chunk_capacity * 1024)))
    emu_fatal("change outputs that are not device memory of their capacity");
}
#endif

/* What a host builds a pulse_dev_table from (arrays of count entries; each
 * may be NULL, which reads as zeros). */
typedef struct {
  size_t count;
  const void *const *cur;      /* current values */
  const pulse_dtype *dtype;    /* of cur */
  const uint16_t *const *base; /* BF16 base, snapshot or target */
  const uint64_t *numel;
  const uint64_t *entry_first; /* count + 1: a change list's tensor ranges */
  uint32_t chunk_log2;
} pulse_table_desc;

/* Uploads a table into the workspace's table slot `which` (PULSE_WS_TABLE,
 * or PULSE_WS_IDX_TABLE for a class index) from its pinned staging, on
 * `stream`, and fills `out`. */
pulse_status pulse_table_upload(pulse_cuda_workspace *ws, unsigned which,
                                const pulse_table_desc *desc, void *stream,
                                pulse_dev_table *out);

/* Exclusive prefix sum of n counts into out (n entries; in and out do not
 * overlap) with CUB, its scratch in the workspace's scan slot. Queued on
 * `stream`. */
pulse_status pulse_scan_u64(pulse_cuda_workspace *ws, const uint64_t *in,
                            uint64_t *out, uint64_t n, cudaStream_t stream);

/* Elements per tile for a chunk size. */
static inline uint32_t pulse_tile_log2(uint32_t chunk_log2) {
  return chunk_log2 < PULSE_TILE_LOG2 ? chunk_log2 : PULSE_TILE_LOG2;
}

/* Blocks for `warps` independent warps of PULSE_TILE_WARPS per block. */
static inline unsigned pulse_tile_blocks(uint64_t warps) {
  return (unsigned)((warps + PULSE_TILE_WARPS - 1) / PULSE_TILE_WARPS);
}

/* ------------------------------------------------------- device helpers */

/* The t with first[t] <= x < first[t + 1], for first[0] <= x < first[count]
 * (first non-decreasing: empty ranges are skipped). */
__device__ static inline uint32_t pulse_find(const uint64_t *first,
                                             uint32_t count, uint64_t x) {
  uint32_t lo = 0, hi = count;
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (first[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

/* The first index in [lo, hi) whose a[] is >= x (a increasing there), or hi. */
__device__ static inline uint64_t
pulse_lower_bound(const uint64_t *a, uint64_t lo, uint64_t hi, uint64_t x) {
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (a[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

__device__ static inline unsigned pulse_lane(void) {
  return threadIdx.x % 32u;
}

/* Lanes below this one. */
__device__ static inline unsigned pulse_lanes_below(void) {
  return (1u << pulse_lane()) - 1u;
}

/* The lowest lane of a non-empty mask. */
__device__ static inline unsigned pulse_first_lane(unsigned mask) {
  return (unsigned)(__ffs((int)mask) - 1);
}

/* The lane of the q-th set bit (from 0) of mask; q < popcount(mask). */
__device__ static inline unsigned pulse_nth_lane(unsigned mask, unsigned q) {
  while (q > 0 && mask != 0) {
    mask &= mask - 1u;
    q--;
  }
  return pulse_first_lane(mask);
}

/* Sum over the warp (every lane gets it); all 32 lanes must call. */
__device__ static inline uint64_t pulse_warp_sum(uint64_t v) {
  for (unsigned off = 16; off > 0; off >>= 1)
    v += (uint64_t)__shfl_xor_sync(PULSE_FULL_MASK, (unsigned long long)v, off);
  return v;
}

/* Modular 64-bit add into device memory. */
__device__ static inline void pulse_atomic_add_u64(uint64_t *p, uint64_t v) {
  atomicAdd((unsigned long long *)p, (unsigned long long)v);
}

/* One tile of a table: tensor t, its elements first .. first + n - 1 (within
 * the tensor), in chunk `chunk` (numbered across the table). */
typedef struct {
  uint32_t t;
  uint32_t n;
  uint64_t first;
  uint64_t chunk;
} pulse_tile;

__device__ static inline pulse_tile pulse_tile_at(const pulse_dev_table &tab,
                                                  uint64_t tile) {
  pulse_tile tl;
  tl.t = pulse_find(tab.tile_first, tab.count, tile);
  uint64_t j = tile - tab.tile_first[tl.t];
  tl.first = j << tab.tile_log2;
  uint64_t left = tab.numel[tl.t] - tl.first;
  uint64_t full = 1ull << tab.tile_log2;
  tl.n = (uint32_t)(left < full ? left : full);
  tl.chunk = tab.chunk_first[tl.t] + (j >> (tab.chunk_log2 - tab.tile_log2));
  return tl;
}

__device__ static inline uint16_t *pulse_tab_base(const pulse_dev_table &tab,
                                                  uint32_t t) {
  return (uint16_t *)(uintptr_t)tab.base[t];
}

#endif /* PULSE_CUDA_COMMON_CUH */
