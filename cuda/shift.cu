/* shift.cu - a tensor's change list moved into a larger tensor that holds
 * it at an offset: positions plus the offset, appended with their new bits
 * to one list, on the caller's stream. For the FP8 targets of a device
 * subscriber whose BF16 shadow is tiled by several targets (a fused
 * weight: inference_side/apply/sub_fp8.c), whose track stages one list of
 * offsets into the whole shadow. */
#include "common.cuh"

static __global__ void shift_kernel(const uint64_t *pos, uint64_t n,
                                    uint64_t base, uint64_t *out) {
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (uint64_t)gridDim.x * blockDim.x)
    out[i] = pos[i] + base;
}

extern "C" pulse_status pulse_cuda_changes_shift_(const uint64_t *pos_d,
                                                  const uint16_t *new_d,
                                                  uint64_t count, uint64_t base,
                                                  uint64_t *out_pos_d,
                                                  uint16_t *out_new_d,
                                                  void *stream) {
  static const char what[] = "cuda shift changes";
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  uint64_t blocks = 0;
  if (count == 0)
    return PULSE_OK;
  if (pos_d == NULL || new_d == NULL || out_pos_d == NULL || out_new_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL array", what);
  if (count > SIZE_MAX / sizeof *pos_d)
    return pulse_fail(PULSE_ERR_OVERFLOW, "%s: %llu changes", what,
                      (unsigned long long)count);
  PULSE_TRY(pulse_cuda_enter_(NULL, pos_d, stream, what, &at));
  PULSE_CHECK(pulse_cuda_check_ptr_(out_pos_d, at.device, what));
  PULSE_CHECK(pulse_cuda_check_ptr_(out_new_d, at.device, what));
  blocks = (count + PULSE_LIST_THREADS - 1) / PULSE_LIST_THREADS;
  PULSE_LAUNCH(shift_kernel, (unsigned)(blocks < 65535u ? blocks : 65535u),
               PULSE_LIST_THREADS, (cudaStream_t)at.stream, pos_d, count, base,
               out_pos_d);
  PULSE_CUDA_CHECK(cudaGetLastError());
  PULSE_CUDA_CHECK(cudaMemcpyAsync(out_new_d, new_d, (size_t)count * sizeof *new_d,
                                   cudaMemcpyDeviceToDevice,
                                   (cudaStream_t)at.stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}
