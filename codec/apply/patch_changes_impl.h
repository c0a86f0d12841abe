/* patch_changes_impl.h - what a staged patch changes, for a caller that
 * keeps a copy of the targets elsewhere (the subscriber's file target
 * journals them); internal to pulse (pulse_codec_internal). */
#ifndef PULSE_PATCH_CHANGES_IMPL_H
#define PULSE_PATCH_CHANGES_IMPL_H

#include "pulse_codec.h"
#include "pulse_codec_stream.h"

/** The changes staged for tensor `i` of the patch's table (positions
 * strictly increasing, old and new bits), once finish returned PULSE_OK
 * and until the stream is freed; NULL for a tensor no target holds, or
 * before that. */
const pulse_changes *patch_stream_changes(const pulse_patch_stream *s, size_t i);

/** The same for a pulse_patch_stage result. */
const pulse_changes *patch_staged_changes(const pulse_patch_staged *s, size_t i);

#endif
