/* cuda_stub.c - the CUDA entry points of a build without CUDA. */
#include "pulse_cuda.h"

int pulse_cuda_available(void) { return 0; }

const char *pulse_cuda_unavailable_reason(void) {
  return "pulse was built without CUDA (PULSE_CUDA=OFF or no nvcc)";
}
