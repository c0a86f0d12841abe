/* emu_cuda.h - a CPU emulator of the CUDA features the kernels in cuda/ use, so
 * that the real kernels run (and are tested bit for bit) on a machine without a
 * GPU. Force-included (g++ -include) when compiling the .cu files as C++ with
 * -DPULSE_CUDA_EMU; see run.sh. Not part of the library.
 *
 * Every CUDA thread is a coroutine with its own stack. A thread runs until it
 * reaches a warp collective (__syncwarp, __ballot_sync, __match_any_sync,
 * __shfl_xor_sync) or __syncthreads, or ends; the scheduler runs the threads
 * of a block in a random order between collectives, and resolves a
 * collective once every lane of the warp has reached it (all lanes must
 * reach the same one with the full mask, as the kernels here require).
 * A kernel that relies on an ordering without a barrier, or whose lanes
 * diverge at a collective, fails here. Device memory is host memory
 * (cudaMalloc is malloc), so AddressSanitizer checks every kernel access.
 *
 * Devices, streams and events: PULSE_EMU_DEVICES devices (default 2, so
 * that code for one device per tensor-parallel rank runs here), each with
 * its own allocations; a kernel, copy or fill must run on the current
 * device with pointers of that device and a stream of that device (else the
 * emulator aborts). The runtime counts what a steady state must not do
 * (emu_counts.h): allocations and frees, device-wide synchronizations, work
 * on the legacy NULL stream, streams and events made.
 *
 * Limits: one-dimensional grids and blocks, block sizes a multiple of 32,
 * blocks run one after another, every operation completes when queued
 * (streams order nothing more). */
#ifndef PULSE_EMU_CUDA_H
#define PULSE_EMU_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <type_traits>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct emu_dim3 {
  unsigned x, y, z;
};

extern emu_dim3 emu_block_idx, emu_block_dim, emu_grid_dim;
const emu_dim3 &emu_thread_idx(void);

#define threadIdx (emu_thread_idx())
#define blockIdx emu_block_idx
#define blockDim emu_block_dim
#define gridDim emu_grid_dim

/* ------------------------------------------------------------ runtime API */

typedef enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorInvalidResourceHandle = 400
} cudaError_t;

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;

#define cudaStreamDefault 0x00u
#define cudaStreamNonBlocking 0x01u
#define cudaEventDefault 0x00u
#define cudaEventDisableTiming 0x02u
#define cudaHostAllocDefault 0x00u

enum cudaMemoryType {
  cudaMemoryTypeUnregistered = 0,
  cudaMemoryTypeHost = 1,
  cudaMemoryTypeDevice = 2,
  cudaMemoryTypeManaged = 3
};

struct cudaPointerAttributes {
  enum cudaMemoryType type;
  int device;
  void *devicePointer;
  void *hostPointer;
};

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr,
                                     const void *ptr);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned flags = 0);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream = 0);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind kind);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes,
                            cudaStream_t stream = 0);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t err);

/* Runs fn as grid blocks of `block` threads on `stream` (of the current
 * device). */
void emu_launch(unsigned grid, unsigned block, cudaStream_t stream,
                std::function<void()> fn);

/* Whether [p, p + bytes) lies inside one cudaMalloc allocation of the
 * current device. */
bool emu_is_device(const void *p, size_t bytes);
[[noreturn]] void emu_fatal(const char *what);

/* Kernel arguments are checked before a launch: a pointer must be NULL or
 * device memory. Structs of device pointers get overloads next to their
 * definition (found by argument-dependent lookup). */
template <typename T> inline void emu_check_arg(const T &) {}
template <typename T> inline void emu_check_arg(T *const &p) {
  if (p != NULL && !emu_is_device(p, 1))
    emu_fatal("a kernel argument points to host memory");
}
template <typename... A>
inline void emu_launch_checked(unsigned grid, unsigned block,
                               cudaStream_t stream, std::function<void()> fn,
                               const A &...args) {
  (emu_check_arg(args), ...);
  emu_launch(grid, block, stream, std::move(fn));
}

/* ------------------------------------------------------- device intrinsics */

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xFFFFFFFFu);
unsigned __ballot_sync(unsigned mask, int predicate);
unsigned __match_any_sync(unsigned mask, unsigned value);
unsigned __match_any_sync(unsigned mask, unsigned long long value);
unsigned long long __shfl_xor_sync(unsigned mask, unsigned long long value,
                                   int lane_mask, int width = 32);
unsigned __shfl_xor_sync(unsigned mask, unsigned value, int lane_mask,
                         int width = 32);

static inline int __popc(unsigned x) {
  return __builtin_popcount(x);
}
static inline int __popcll(unsigned long long x) {
  return __builtin_popcountll(x);
}
static inline int __ffs(int x) {
  return __builtin_ffs(x);
}
static inline int __clz(int x) {
  return x == 0 ? 32 : __builtin_clz((unsigned)x);
}

/* Threads of a block never run at the same time here: plain read-modify-write.
 */
static inline unsigned atomicAdd(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old + v;
  return old;
}
static inline unsigned long long atomicAdd(unsigned long long *p,
                                           unsigned long long v) {
  unsigned long long old = *p;
  *p = old + v;
  return old;
}
static inline unsigned atomicOr(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old | v;
  return old;
}
static inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = *p;
  *p = old > v ? old : v;
  return old;
}
static inline unsigned long long atomicMin(unsigned long long *p,
                                           unsigned long long v) {
  unsigned long long old = *p;
  *p = old < v ? old : v;
  return old;
}

/* Work queued on `stream`: counts the NULL stream, aborts on a stream of
 * another device. */
void emu_stream_use(cudaStream_t stream, const char *what);

/* -------------------------------------------------------------------- CUB */

namespace cub {
struct DeviceScan {
  template <typename In, typename Out, typename N>
  static cudaError_t ExclusiveSum(void *temp, size_t &temp_bytes, In in,
                                  Out out, N n, cudaStream_t stream = 0) {
    if (temp == NULL) {
      temp_bytes = 64;
      return cudaSuccess;
    }
    emu_stream_use(stream, "cub::DeviceScan");
    typename std::remove_reference<decltype(*out)>::type acc = 0;
    for (N i = 0; i < n; i++) {
      auto x = in[i];
      out[i] = acc;
      acc += x;
    }
    return cudaSuccess;
  }
};
} // namespace cub

#endif /* PULSE_EMU_CUDA_H */
