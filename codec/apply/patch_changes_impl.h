/* patch_changes_impl.h - what a staged patch changes, for a caller that
 * keeps a copy of the targets elsewhere (the subscriber's file target
 * journals them); internal to pulse (pulse_codec_internal). */
#ifndef PULSE_PATCH_CHANGES_IMPL_H
#define PULSE_PATCH_CHANGES_IMPL_H

#include "pulse_codec.h"
#include "pulse_codec_stream.h"
#include "pulse_region.h"

/** The changes staged for tensor `i` of the patch's table (each position
 * once, in no promised order: through a class index they come class by
 * class within each chunk; old and new bits), once finish returned PULSE_OK
 * and until the stream is freed; NULL for a tensor no target holds, or
 * before that. */
const pulse_changes *patch_stream_changes(const pulse_patch_stream *s, size_t i);

/** The same for a pulse_patch_stage result. */
const pulse_changes *patch_staged_changes(const pulse_patch_staged *s, size_t i);

/** The changes staged for region k's block (pulse_region_stage's
 * regions[k]): *count of them, each an index into the region's data (in
 * increasing order) and its new bits; valid until the staged changes are
 * freed. For a caller that follows the blocks with something of its own
 * (the subscriber's FP8 targets). */
void patch_region_staged_block(const pulse_region_staged *s, size_t k, uint64_t *count,
                               const uint64_t **at, const uint16_t **new_bits);

#endif
