/* chunk_impl.h - coding of one chunk of one tensor (FORMAT.md, "Chunk
 * streams"): the class-rank transform and the entropy coder. */
#ifndef PULSE_CHUNK_IMPL_H
#define PULSE_CHUNK_IMPL_H

#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_codec.h"

/* Counts the base elements of each position class (hist[PULSE_CLASS_COUNT])
 * and gives each changed position (pos, strictly increasing, < n) its class
 * and its rank among the elements of that class. With k = 0 it only counts
 * (pos, rank and cls may then be NULL). */
void pulse_chunk_classify(const uint16_t *base, uint32_t n, const uint32_t *pos,
                          uint32_t k, uint32_t *hist, uint32_t *rank,
                          uint8_t *cls);

/* Encodes k changes (chunk-relative positions, strictly increasing, and
 * non-zero deltas) of a chunk of n elements, appending the stream to out.
 * base (the chunk's base bits) is read only by PULSE_POS_CLASS. k > 0. */
pulse_status pulse_chunk_encode(pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint32_t *pos,
                                const uint16_t *delta, uint32_t k,
                                pulse_bytebuf *out);

/* Decodes a chunk stream that the table says holds k changes into pos and
 * delta (k entries each, storage order; pos[j] = first + chunk position).
 * base is required by PULSE_POS_CLASS and ignored by PULSE_POS_PLAIN. Every
 * count, gap and value is checked; the stream must be consumed exactly. */
pulse_status pulse_chunk_decode(pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint8_t *stream, size_t size,
                                uint32_t k, uint64_t first, uint64_t *pos,
                                uint16_t *delta);

#endif
