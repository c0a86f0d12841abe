/* detect_ranked_impl.h - change detection of one chunk that also gives each
 * change its position class and class rank, the rank form the encoder
 * takes (pulse_encode_tensor's chunk_hist, change_class, change_rank), from
 * the one pass over the snapshot that detection makes anyway
 * (detect_ranked.c). For the publisher, whose commit it saves a second
 * pass over the snapshot (the encoder's class counting). */
#ifndef PULSE_DETECT_RANKED_IMPL_H
#define PULSE_DETECT_RANKED_IMPL_H

#include <stdint.h>

#include "detect_impl.h"
#include "pulse_elem.h"

/* One chunk's findings; the arrays grow as needed and are kept for the
 * next call (start from {0}; pulse_detect_chunk_free). */
typedef struct {
  pulse_changes changes; /* positions in the tensor, increasing */
  uint8_t *cls;          /* per change: pulse_bf16_class(old bits) */
  uint32_t *rank;        /* per change: base elements of its class before
                            it in the chunk */
  uint64_t rank_capacity;
  uint32_t hist[PULSE_CLASS_COUNT]; /* the chunk's base elements per class */
} pulse_detect_chunk;

/* An `isa` for pulse_detect_chunk_ranked beside pulse_isa's: the AVX-512
 * form with the software rounding of FP32 (AUTO takes the CPU's BF16
 * rounding where it has AVX512_BF16), so tests reach both; AVX2 or scalar
 * on a CPU without AVX-512. */
#define PULSE_DETECT_RANKED_AVX512 ((pulse_isa)3)

/** Detects the changes of the n elements from `first` of a tensor (cur: its
 * new values, F32 or BF16; snapshot: its BF16 base, both from element 0)
 * into out (emptied first): positions and bits as pulse_detect_ref finds
 * them, classes, ranks and hist as pulse_chunk_classify gives them for the
 * chunk's base. The snapshot is not written. `isa` as for
 * pulse_detect_fast_tuned, or PULSE_DETECT_RANKED_AVX512. On error out's content is unspecified. */
pulse_status pulse_detect_chunk_ranked(const void *cur, pulse_dtype dtype,
                                       const uint16_t *snapshot, uint64_t first, uint32_t n,
                                       pulse_isa isa, pulse_detect_chunk *out);

/** Frees the arrays (the struct may be reused from {0}). NULL is fine. */
void pulse_detect_chunk_free(pulse_detect_chunk *c);

#endif /* PULSE_DETECT_RANKED_IMPL_H */
