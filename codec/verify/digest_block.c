/* Digest of a block of a tensor (pulse_digest_bf16_block): the terms of the
 * whole tensor's digest (docs/formats/patch.md "Digests") for the elements of the block
 * only, at their positions in the whole tensor. The digest is a sum over
 * elements, so the digests of blocks that tile a tensor add up to the
 * tensor's: a tensor-parallel rank that holds a shard in another layout
 * (rows of a fused tensor, columns of a row-parallel one) checks what it
 * holds without the rest. */
#include "digest_impl.h"
#include "pulse_codec.h"
#include "status_impl.h"

pulse_status pulse_digest_bf16_block(const uint16_t *bits, uint64_t rows, uint64_t cols,
                                     uint64_t stride, uint64_t first, uint64_t full_cols,
                                     pulse_tensor_digest *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "digest of a block: no output");
  out->a = 0;
  out->b = 0;
  if (rows == 0 || cols == 0)
    return PULSE_OK;
  if (bits == NULL || cols > stride || cols > full_cols)
    return pulse_fail(PULSE_ERR_ARG,
                      "digest of a block: %llu columns, stride %llu, tensor rows of %llu",
                      (unsigned long long)cols, (unsigned long long)stride,
                      (unsigned long long)full_cols);
  /* The last element's position must fit (positions are 48-bit keys in
   * the digest, pulse_digest_key; the tensor's own numel bounds them). */
  uint64_t last_row = rows - 1;
  if (last_row > (UINT64_MAX - first - cols) / full_cols)
    return pulse_fail(PULSE_ERR_OVERFLOW, "digest of a block: positions overflow");
  for (uint64_t r = 0; r < rows; r++) {
    pulse_tensor_digest d = pulse_digest_bf16_at(bits + r * stride, cols, first + r * full_cols);
    out->a += d.a;
    out->b += d.b;
  }
  return PULSE_OK;
}
