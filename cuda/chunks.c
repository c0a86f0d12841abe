/* chunks.c - host-only helpers of the CUDA API, built with or without CUDA. */
#include <string.h>
#include "pulse_cuda.h"
#include "status_impl.h"

void pulse_cuda_detect_opts_init(pulse_cuda_detect_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_CUDA_DETECT_OPTS_VERSION;
  o->chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
}

pulse_status pulse_cuda_chunk_count(const pulse_cuda_detect_tensor *table,
                                    size_t count, uint32_t chunk_log2,
                                    uint64_t *chunks) {
  if (chunks == NULL || (count > 0 && table == NULL))
    return pulse_fail(PULSE_ERR_ARG, "chunk count: NULL argument");
  *chunks = 0;
  if (chunk_log2 < 10 || chunk_log2 > 30)
    return pulse_fail(PULSE_ERR_ARG,
                      "chunk count: chunk_log2 %u outside 10..30", chunk_log2);
  uint64_t sum = 0;
  for (size_t t = 0; t < count; t++) {
    uint64_t n = table[t].numel;
    sum += n ? ((n - 1) >> chunk_log2) + 1
             : 0; /* at most 2^54 each: no wrap in practice */
  }
  *chunks = sum;
  return PULSE_OK;
}
