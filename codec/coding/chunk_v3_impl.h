/* chunk_v3_impl.h - the chunk coding of patch format version 3 (issue 36,
 * "fewer bytes"; docs/formats/patch.md): the patch encoder writes it with
 * format_version 3, with the value model at the end of the tensor table
 * (patch_open.c reads it), and every decoder of chunk_impl.h dispatches
 * to it. It closes most of the gap between version 2
 * and the entropy bound H(position | tensor, old exponent class) +
 * H(value | old exponent class), measured on real AdamW trajectories:
 *
 * - Values are coded against one **value model per patch**: for each old
 *   exponent class with changes anywhere in the patch, a distribution over
 *   34 tokens (zig-zag delta - 1 below 8 literally, then two tokens per
 *   octave with the bits below the top two sent raw). Version 2 sent a
 *   value code per class per chunk (2-70 bits each, 2.2% of a patch) and
 *   Huffman codes lose 6% against the class entropy; here the model costs
 *   a few hundred bytes per patch and values are rANS-coded (11-bit
 *   probabilities, a state in [2^16, 2^24), byte renormalization), whose
 *   decode is one table lookup, one multiply and a shift per change. 11
 *   bits give the same bytes as 12 to 9 on both trajectories and an 8 KiB
 *   table per class (12 bits: 16 KiB, decode 1.31x v2's CPU time against
 *   1.13x).
 * - Per class a chunk sends its class step and count as version 2 does
 *   (the count in an order-3 Exp-Golomb code), and the Golomb parameter as
 *   an index into a quarter-octave table of parameters, coded against the
 *   previous class's index plus QSLOPE per class step (adjacent exponent
 *   classes have densities about a factor 2 apart).
 * - Chunks stay independent given the patch's model; decoding needs no
 *   class counts of the base (ranks past a class are caught when located,
 *   as with version 2).
 *
 * Stream of one chunk: a varint, the size of part A (>= 1); part A (bits:
 * class headers and gaps, version 2's bit order); part B (rANS, byte-wise:
 * the final encoder state as 3 bytes little-endian, then bytes in decode
 * order); part C (raw value bits, a bit stream like part A, stored
 * backwards from the end of the stream, so it needs no size: it is what
 * part B leaves). Every part is consumed exactly and the
 * rANS state must end at its initial value. */
#ifndef PULSE_CHUNK_V3_IMPL_H
#define PULSE_CHUNK_V3_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "chunk_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"

#define PULSE_V3_TOKENS 34u
#define PULSE_V3_LITERALS 8u
/* 11 or 12: below 11 the top token of a class could be left with no
 * frequency (it keeps >= 60 - 33 at 11), above 12 slot entries overflow. */
#define PULSE_V3_PROB_BITS 11u
#define PULSE_V3_WEIGHT_MAX 31u /* weights are half-octave steps, 0 = absent   \
                                 */

/* Token counts of a patch's changes by old exponent class: the encoder's
 * first pass, before it can write the model. */
typedef struct {
  uint64_t count[PULSE_CLASS_COUNT][PULSE_V3_TOKENS];
} pulse_v3_counts;

/* The patch's value model: per class, weights as sent and the normalized
 * frequencies both sides derive from them, and decode tables. */
typedef struct pulse_v3_model pulse_v3_model;

/* The token of a delta (non-zero) and its raw bits (count *nraw). Inline:
 * the encoder asks it three times a change (the model's counts, the raw
 * bits, the rANS pass). */
static inline unsigned pulse_v3_token(uint16_t delta, uint32_t *raw,
                                      unsigned *nraw) {
  uint32_t v = pulse_zigzag16(delta) - 1u; /* 0..65534 */
  if (v < PULSE_V3_LITERALS) {
    *raw = 0;
    *nraw = 0;
    return v;
  }
  unsigned l = 32u - (unsigned)__builtin_clz(v); /* 4..16 */
  *nraw = l - 2u;
  *raw = v & ((1u << (l - 2u)) - 1u);
  return PULSE_V3_LITERALS + 2u * (l - 4u) + ((v >> (l - 2u)) & 1u);
}

/* Adds k changes (class, delta) to the counts. */
void pulse_v3_count(pulse_v3_counts *counts, const uint8_t *cls,
                    const uint16_t *delta, uint64_t k);

/* The model the encoder writes for these counts. *out is freed with
 * pulse_v3_model_free. @return PULSE_OK or PULSE_ERR_NOMEM. */
pulse_status pulse_v3_model_build(const pulse_v3_counts *counts,
                                  pulse_v3_model **out);

/* Appends the model's serialized form (a bit stream, padded to a byte). */
pulse_status pulse_v3_model_write(const pulse_v3_model *model,
                                  pulse_bytebuf *out);

/* Parses a serialized model from the start of `size` bytes; *used gets its
 * length. Untrusted input: PULSE_ERR_CORRUPT on anything malformed (class
 * steps past 256, weights past PULSE_V3_WEIGHT_MAX, a class without a token,
 * non-zero padding, truncation). */
pulse_status pulse_v3_model_read(const uint8_t *data, size_t size, size_t *used,
                                 pulse_v3_model **out);

void pulse_v3_model_free(pulse_v3_model *model);

/* Normalized frequency of token t of class c (0: the model has none). */
unsigned pulse_v3_model_freq(const pulse_v3_model *model, unsigned c,
                             unsigned t);

/* Bits of a chunk stream by what they carry, for the benches. */
typedef struct {
  uint64_t class_bits;  /* gamma(active), class steps */
  uint64_t count_bits;  /* per-class change counts */
  uint64_t m_bits;      /* Golomb parameter indices */
  uint64_t gap_bits;    /* gaps */
  uint64_t value_bytes; /* part B (rANS, its 3-byte state included) */
  uint64_t raw_bits;    /* part C */
  uint64_t pad_bits;    /* padding of parts A and C */
  uint64_t frame_bytes; /* the part A size varint */
} pulse_v3_stats;

/* Encodes a chunk's changes in rank form (as pulse_chunk2_encode_ranks:
 * position order, each change's class and rank within it, non-zero deltas)
 * against the patch's model, which must hold every (class, token) used.
 * stats (or NULL) is added to. k > 0. */
pulse_status pulse_chunk3_encode_ranks(const pulse_v3_model *model, uint32_t k,
                                       const uint8_t *cls, const uint32_t *rank,
                                       const uint16_t *delta,
                                       pulse_bytebuf *out,
                                       pulse_v3_stats *stats);

/* Decodes to the class-major rank form of pulse_chunk_decode_ranks (start:
 * PULSE_CLASS_COUNT + 1 entries; ranks checked against hist[c], or against
 * n when hist is NULL). Untrusted input: every field is checked and the
 * stream consumed exactly. */
pulse_status pulse_chunk3_decode_ranks(const pulse_v3_model *model,
                                       const uint32_t *hist, uint32_t n,
                                       const uint8_t *stream, size_t size,
                                       uint32_t k, uint32_t *start,
                                       uint32_t *rank, uint16_t *delta);

/* pulse_chunk_decode_indexed of a version 3 class-model stream in one
 * pass, as pulse_chunk2_decode_indexed does for version 2 (chunk_fast_impl.h):
 * the same results in the same order (positions class-major; with data and
 * old_bits, old_bits[j] = data[pos[j]] and delta[j] the new bits). On any
 * error the chunk is decoded again by pulse_chunk_decode_indexed with
 * scratch, so the status and message are the reference's; pos, delta and
 * old_bits hold garbage then. */
pulse_status pulse_chunk3_decode_indexed(const pulse_v3_model *model,
                                         const pulse_class_index *ix,
                                         const uint16_t *data, uint64_t first,
                                         uint32_t n, const uint8_t *stream,
                                         size_t size, uint32_t k, uint64_t *pos,
                                         uint16_t *delta, uint16_t *old_bits,
                                         const pulse_chunk_scratch *scratch);

#endif
