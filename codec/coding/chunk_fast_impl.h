/* chunk_fast_impl.h - the version 2 class-model decode fused with the
 * locate through a receiver's class index (chunk_fast.c). */
#ifndef PULSE_CHUNK_FAST_IMPL_H
#define PULSE_CHUNK_FAST_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "chunk_impl.h"
#include "pulse_codec.h"

/* pulse_chunk_decode_indexed of a version 2 class-model stream, with the
 * same results in the same order (positions class-major; with data and
 * old_bits, old_bits[j] = data[pos[j]] and delta[j] the new bits), in one
 * pass: each rank is turned into its position as it is decoded, instead of
 * ranks staged for a second pass over them. On any error (bad stream, rank
 * past its class) the chunk is decoded again by pulse_chunk_decode_indexed
 * with scratch, so the status and message are the reference's; pos, delta
 * and old_bits hold garbage then. */
pulse_status pulse_chunk2_decode_indexed(const pulse_class_index *ix, const uint16_t *data,
                                         uint64_t first, uint32_t n, const uint8_t *stream,
                                         size_t size, uint32_t k, uint64_t *pos,
                                         uint16_t *delta, uint16_t *old_bits,
                                         const pulse_chunk_scratch *scratch);

#endif
