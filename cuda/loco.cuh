/* loco.cuh - the PULSELoCo gate family (loco.cu). Its entry point is
 * pulse_cuda_loco_gate (pulse_cuda.h); the CPU reference it must match bit
 * for bit is pulse_loco_gate_ref (loco_ref.c); both are loops over
 * codec/pulse_loco_elem.h. */
#ifndef PULSE_CUDA_LOCO_CUH
#define PULSE_CUDA_LOCO_CUH

#include "common.cuh"

/* Elements per warp tile of the gate kernels. */
#define PULSE_LOCO_TILE_LOG2 13u

#endif /* PULSE_CUDA_LOCO_CUH */
