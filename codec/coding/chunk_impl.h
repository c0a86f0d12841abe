/* chunk_impl.h - coding of one chunk of one tensor (docs/formats/patch.md,
 * "Chunk streams"): the class-rank transform and the two coders, version 1's
 * adaptive range coder (chunk_coder.c) and version 2's static codes
 * (chunk_fast.c), and version 3's (chunk_v3.c). `version` is the patch
 * format version (1..3); `values` is a version 3 patch's value model
 * (chunk_v3_impl.h), which every version 3 chunk is coded against, and
 * ignored (may be NULL) by versions 1 and 2. */
#ifndef PULSE_CHUNK_IMPL_H
#define PULSE_CHUNK_IMPL_H

#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_codec.h"

struct pulse_v3_model; /* chunk_v3_impl.h */

/* Counts the base elements of each position class (hist[PULSE_CLASS_COUNT])
 * and gives each changed position (pos, strictly increasing, < n) its class
 * and its rank among the elements of that class. With k = 0 it only counts
 * (pos, rank and cls may then be NULL). */
void pulse_chunk_classify(const uint16_t *base, uint32_t n, const uint32_t *pos,
                          uint32_t k, uint32_t *hist, uint32_t *rank,
                          uint8_t *cls);

/* Groups k changes by class (cls[j], in position order) for coding class
 * by class: kc (zeroed by the caller, PULSE_CLASS_COUNT entries) gets each
 * class's count, start (PULSE_CLASS_COUNT + 1) its first entry, order the
 * change indices class-major with ranks still increasing. Returns the
 * number of classes with changes. */
unsigned pulse_chunk_class_order(uint32_t k, const uint8_t *cls, uint32_t *kc, uint32_t *start,
                                 uint32_t *order);

/* Encodes k changes (chunk-relative positions, strictly increasing, and
 * non-zero deltas) of a chunk of n elements, appending the stream to out.
 * base (the chunk's base bits) is read only by PULSE_POS_CLASS. k > 0. */
pulse_status pulse_chunk_encode(unsigned version,
                                const struct pulse_v3_model *values,
                                pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint32_t *pos,
                                const uint16_t *delta, uint32_t k,
                                pulse_bytebuf *out);

/* The rank form, for callers that classify elsewhere (a GPU kernel): the
 * changes in position order with each one's class (cls, ignored and may be
 * NULL for PULSE_POS_PLAIN) and rank within it (plain: the chunk position),
 * and hist the class counts of the base (plain: NULL). */
pulse_status
pulse_chunk_encode_ranks(unsigned version, const struct pulse_v3_model *values,
                         pulse_pos_model model, const uint32_t *hist,
                         uint32_t n, uint32_t k, const uint8_t *cls,
                         const uint32_t *rank, const uint16_t *delta,
                         pulse_bytebuf *out);

/* Decodes a stream to the rank form, class-major: the changes of class c are
 * entries start[c]..start[c+1]-1 (start has PULSE_CLASS_COUNT + 1 entries;
 * unused by PULSE_POS_PLAIN, whose entries are in position order), with
 * increasing ranks, each checked to be below its class count (hist, the
 * base's class counts; version 2 accepts NULL and then checks ranks only
 * against n, leaving the rest to pulse_chunk_locate). */
pulse_status pulse_chunk_decode_ranks(unsigned version,
                                      const struct pulse_v3_model *values,
                                      pulse_pos_model model,
                                      const uint32_t *hist, uint32_t n,
                                      const uint8_t *stream, size_t size,
                                      uint32_t k, uint32_t *start,
                                      uint32_t *rank, uint16_t *delta);

/* Turns the class-major rank form back into positions (first + chunk
 * position) in storage order with one pass over the chunk's base. Returns
 * how many it found: k when every rank is inside its class, which ranks
 * checked against this base's class counts always are. */
uint32_t pulse_chunk_locate(const uint16_t *base, uint32_t n, uint32_t k, const uint32_t *start,
                            const uint32_t *rank, const uint16_t *cdelta, uint64_t first,
                            uint64_t *pos, uint16_t *delta);

/* pulse_chunk_locate on the best instruction set this CPU runs
 * (chunk_locate.c): the same return, positions and deltas, in the same
 * order, for every input. _isa forces one, for the tests: a pulse_isa of
 * detect_impl.h (AUTO, SCALAR: the reference, AVX2) or
 * PULSE_CHUNK_LOCATE_AVX512; one this CPU lacks runs the reference's loop. */
#define PULSE_CHUNK_LOCATE_AVX512 3
uint32_t pulse_chunk_locate_fast(const uint16_t *base, uint32_t n, uint32_t k,
                                 const uint32_t *start, const uint32_t *rank,
                                 const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                 uint16_t *delta);
uint32_t pulse_chunk_locate_isa(int isa, const uint16_t *base, uint32_t n, uint32_t k,
                                const uint32_t *start, const uint32_t *rank,
                                const uint16_t *cdelta, uint64_t first, uint64_t *pos,
                                uint16_t *delta);

/* Room a class-model decode works in: k class ranks and k class-major
 * deltas. A caller that decodes chunk after chunk passes its own (slices of
 * one staging block) instead of the decoder allocating them per chunk.
 * old_bits (k entries, or NULL): a decode through a class index also reads
 * each change's old bits there and returns new bits instead of deltas. */
typedef struct pulse_chunk_scratch {
  uint32_t *rank;
  uint16_t *cdelta;
  uint16_t *old_bits;
} pulse_chunk_scratch;

/* Decodes a chunk stream that the table says holds k changes into pos and
 * delta (k entries each, storage order; pos[j] = first + chunk position).
 * base is required by PULSE_POS_CLASS and ignored by PULSE_POS_PLAIN. Every
 * count, gap and value is checked; the stream must be consumed exactly. */
pulse_status pulse_chunk_decode(unsigned version,
                                const struct pulse_v3_model *values,
                                pulse_pos_model model, const uint16_t *base,
                                uint32_t n, const uint8_t *stream, size_t size,
                                uint32_t k, uint64_t first, uint64_t *pos,
                                uint16_t *delta);

/* pulse_chunk_decode working in `scratch` (NULL: its own allocation). */
pulse_status pulse_chunk_decode_in(unsigned version,
                                   const struct pulse_v3_model *values,
                                   pulse_pos_model model, const uint16_t *base,
                                   uint32_t n, const uint8_t *stream,
                                   size_t size, uint32_t k, uint64_t first,
                                   uint64_t *pos, uint16_t *delta,
                                   const pulse_chunk_scratch *scratch);

/* pulse_chunk_decode of a PULSE_POS_CLASS stream through a receiver's class
 * index (class_index_impl.h) instead of a pass over the base: the chunk of
 * n elements starts at tensor position `first`, a multiple of the index's
 * block size. Positions (first + chunk position) come out class-major, not
 * in storage order. data (the whole tensor the index describes, or NULL)
 * is only prefetched at each change, for a caller that reads it next. */
pulse_status pulse_chunk_decode_indexed(
    unsigned version, const struct pulse_v3_model *values,
    const pulse_class_index *ix, const uint16_t *data, uint64_t first,
    uint32_t n, const uint8_t *stream, size_t size, uint32_t k, uint64_t *pos,
    uint16_t *delta, const pulse_chunk_scratch *scratch);

/* The version 2 coder behind the two functions above (chunk_fast.c). */
pulse_status pulse_chunk2_encode_ranks(pulse_pos_model model, uint32_t k, const uint8_t *cls,
                                       const uint32_t *rank, const uint16_t *delta,
                                       pulse_bytebuf *out);
pulse_status pulse_chunk2_decode_ranks(pulse_pos_model model, const uint32_t *hist,
                                       uint32_t n, const uint8_t *stream, size_t size,
                                       uint32_t k, uint32_t *start, uint32_t *rank,
                                       uint16_t *delta);
/* Plain model straight to positions (pos[j] = first + chunk position).
 * base (the chunk's base bits, or NULL) is only prefetched at each change,
 * for a caller that reads the old bits next. */
pulse_status pulse_chunk2_decode_plain(const uint16_t *base, uint32_t n, const uint8_t *stream,
                                       size_t size, uint32_t k, uint64_t first, uint64_t *pos,
                                       uint16_t *delta);

#endif
