/* types.c - dtypes, shapes and change lists. */
#include "pulse_codec.h"
#include "status_impl.h"

#include <stdlib.h>

size_t pulse_dtype_size(pulse_dtype dtype) {
  switch (dtype) {
  case PULSE_DTYPE_BF16:
  case PULSE_DTYPE_F16:
    return 2;
  case PULSE_DTYPE_F32:
    return 4;
  default:
    return 0;
  }
}

const char *pulse_dtype_name(pulse_dtype dtype) {
  switch (dtype) {
  case PULSE_DTYPE_BF16:
    return "BF16";
  case PULSE_DTYPE_F16:
    return "F16";
  case PULSE_DTYPE_F32:
    return "F32";
  default:
    return "?";
  }
}

pulse_status pulse_shape_numel(const uint64_t *shape, uint32_t ndim,
                               uint64_t *numel) {
  if (ndim > PULSE_MAX_DIMS || (ndim > 0 && shape == NULL) || numel == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shape: ndim %u", ndim);
  /* The product of the non-zero dimensions must fit whatever their order
   * and whether another dimension is 0, so a shape is valid or not as a
   * whole ([0, 2^40, 2^40] is refused like [2^40, 2^40, 0]). */
  uint64_t n = 1;
  int empty = 0;
  for (uint32_t i = 0; i < ndim; i++) {
    if (shape[i] == 0) {
      empty = 1;
      continue;
    }
    if (n > UINT64_MAX / shape[i])
      return pulse_fail(PULSE_ERR_OVERFLOW, "shape: element count overflows");
    n *= shape[i];
  }
  *numel = empty ? 0 : n;
  return PULSE_OK;
}

pulse_status pulse_changes_reserve(pulse_changes *c, uint64_t capacity) {
  if (c == NULL)
    return pulse_fail(PULSE_ERR_ARG, "changes: NULL");
  if (capacity <= c->capacity)
    return PULSE_OK;
  if (capacity > (SIZE_MAX / sizeof(uint64_t)))
    return pulse_fail(PULSE_ERR_OVERFLOW, "changes: capacity overflows");
  uint64_t *pos = realloc(c->pos, capacity * sizeof *pos);
  if (pos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "changes: %llu positions",
                      (unsigned long long)capacity);
  c->pos = pos;
  uint16_t *old_bits = realloc(c->old_bits, capacity * sizeof *old_bits);
  if (old_bits == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "changes: old bits");
  c->old_bits = old_bits;
  uint16_t *new_bits = realloc(c->new_bits, capacity * sizeof *new_bits);
  if (new_bits == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "changes: new bits");
  c->new_bits = new_bits;
  c->capacity = capacity;
  return PULSE_OK;
}

pulse_status pulse_changes_push(pulse_changes *c, uint64_t pos,
                                uint16_t old_bits, uint16_t new_bits) {
  if (c->count == c->capacity)
    PULSE_TRY(pulse_changes_reserve(c, c->capacity < 64 ? 64 : c->capacity * 2));
  c->pos[c->count] = pos;
  c->old_bits[c->count] = old_bits;
  c->new_bits[c->count] = new_bits;
  c->count++;
  return PULSE_OK;
}

void pulse_changes_free(pulse_changes *c) {
  if (c == NULL)
    return;
  free(c->pos);
  free(c->old_bits);
  free(c->new_bits);
  *c = (pulse_changes)PULSE_CHANGES_INIT;
}

void pulse_buffer_free(pulse_buffer *buf) {
  if (buf == NULL)
    return;
  free(buf->data);
  buf->data = NULL;
  buf->size = 0;
}
