/* apply.cuh - the apply family (apply.cu): digests, gather and scatter of
 * change lists, the class index and locate. Its entry points are the C
 * functions of pulse_cuda.h and cuda_impl.h; nothing else is shared. */
#ifndef PULSE_CUDA_APPLY_CUH
#define PULSE_CUDA_APPLY_CUH

#include "common.cuh"

/* Entries of a change list each lane of the digest kernel sums. */
#define PULSE_DIGEST_PER_LANE 8u

/* Checks a host array first[count + 1] of change-list ranges: first[0] == 0
 * and non-decreasing. */
pulse_status pulse_check_ranges(const uint64_t *first, size_t count,
                                const char *what);

#endif /* PULSE_CUDA_APPLY_CUH */
