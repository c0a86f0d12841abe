/* device.cu - run-time detection of a usable CUDA device. */
#include <cuda_runtime.h>

#include "pulse_cuda.h"

static int probed = 0;
static int available = 0;
static const char *reason = "";

static void probe(void) {
  if (probed)
    return;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    reason = "no CUDA device";
    available = 0;
  } else {
    available = 1;
  }
  probed = 1;
}

extern "C" int pulse_cuda_available(void) {
  probe();
  return available;
}

extern "C" const char *pulse_cuda_unavailable_reason(void) {
  probe();
  return reason;
}
