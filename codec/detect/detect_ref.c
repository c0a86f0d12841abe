/* detect_ref.c - reference change detection: the specification that the fast
 * paths (SIMD, threads, CUDA) are tested against bit for bit. */
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "status_impl.h"

#include <string.h>

pulse_status pulse_detect_ref(const void *cur, pulse_dtype cur_dtype,
                              uint16_t *snapshot, uint64_t n,
                              int update_snapshot, pulse_changes *out) {
  if (out == NULL || (n > 0 && (cur == NULL || snapshot == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "detect: NULL argument");
  if (cur_dtype != PULSE_DTYPE_F32 && cur_dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE,
                      "detect: input dtype %s (want F32 or "
                      "BF16)",
                      pulse_dtype_name(cur_dtype));

  const unsigned char *bytes = cur;
  uint64_t first = out->count;
  for (uint64_t i = 0; i < n; i++) {
    uint16_t new_bits;
    if (cur_dtype == PULSE_DTYPE_F32) {
      uint32_t u;
      memcpy(&u, bytes + i * 4, sizeof u); /* the caller's floats, as bits */
      new_bits = pulse_bf16_from_f32_bits(u);
    } else {
      memcpy(&new_bits, bytes + i * 2, sizeof new_bits);
    }
    if (pulse_bf16_changed(snapshot[i], new_bits))
      PULSE_TRY(pulse_changes_push(out, i, snapshot[i], new_bits));
  }

  /* A second pass over the recorded changes, so that a failed push above
   * leaves the snapshot as it was. */
  if (update_snapshot) {
    for (uint64_t k = first; k < out->count; k++)
      snapshot[out->pos[k]] = out->new_bits[k];
  }
  return PULSE_OK;
}
