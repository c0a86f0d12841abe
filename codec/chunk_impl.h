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

/* The rank form, for callers that classify elsewhere (a GPU kernel): the
 * changes in position order with each one's class (cls, ignored and may be
 * NULL for PULSE_POS_PLAIN) and rank within it (plain: the chunk position),
 * and hist the class counts of the base (plain: NULL). */
pulse_status pulse_chunk_encode_ranks(pulse_pos_model model, const uint32_t *hist,
                                      uint32_t n, uint32_t k, const uint8_t *cls,
                                      const uint32_t *rank, const uint16_t *delta,
                                      pulse_bytebuf *out);

/* Decodes a stream to the rank form, class-major: the changes of class c are
 * entries start[c]..start[c+1]-1 (start has PULSE_CLASS_COUNT + 1 entries;
 * unused by PULSE_POS_PLAIN, whose entries are in position order), with
 * increasing ranks, each checked to be below its class count. */
pulse_status pulse_chunk_decode_ranks(pulse_pos_model model, const uint32_t *hist,
                                      uint32_t n, const uint8_t *stream, size_t size,
                                      uint32_t k, uint32_t *start, uint32_t *rank,
                                      uint16_t *delta);

/* Turns the class-major rank form back into positions (first + chunk
 * position) in storage order with one pass over the chunk's base. The ranks
 * must come from pulse_chunk_decode_ranks with this base's class counts. */
void pulse_chunk_locate(const uint16_t *base, uint32_t n, uint32_t k, const uint32_t *start,
                        const uint32_t *rank, const uint16_t *cdelta, uint64_t first,
                        uint64_t *pos, uint16_t *delta);

/* Decodes a chunk stream that the table says holds k changes into pos and
 * delta (k entries each, storage order; pos[j] = first + chunk position).
 * base is required by PULSE_POS_CLASS and ignored by PULSE_POS_PLAIN. Every
 * count, gap and value is checked; the stream must be consumed exactly. */
pulse_status pulse_chunk_decode(pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint8_t *stream, size_t size,
                                uint32_t k, uint64_t first, uint64_t *pos,
                                uint16_t *delta);

#endif
