/* pulse_cuda.h - CUDA entry points, callable from C. Never includes CUDA
 * headers: streams travel as void *. When pulse is built without CUDA every
 * function exists and returns PULSE_ERR_NOT_BUILT (or 0 for the query). */
#ifndef PULSE_CUDA_H
#define PULSE_CUDA_H

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Non-zero when pulse was built with CUDA and at least one device is usable
 * now. Cheap after the first call. */
int pulse_cuda_available(void);

/** Why pulse_cuda_available() is 0 ("no CUDA device", "not built with
 * CUDA", ...), or "" when a device is available. Static storage. */
const char *pulse_cuda_unavailable_reason(void);

#ifdef __cplusplus
}
#endif
#endif
