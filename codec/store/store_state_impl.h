/* store_state_impl.h - internal pieces of state rebuilding
 * (pulse_codec_internal), shared by verification, the publisher's resume and
 * the server's catch-up builder. */
#ifndef PULSE_STORE_STATE_IMPL_H
#define PULSE_STORE_STATE_IMPL_H

#include "pulse_store.h"

/** Opens an anchor, checks its metadata (step, state digest) against its
 * tensors, and returns its state; with keep_bits 0 only the table and the
 * digests are kept (bits[] stay NULL). */
pulse_status store_anchor_load(const char *dir,
                               const pulse_store_object *anchor, int keep_bits,
                               pulse_store_state *out);

/** Reads a patch object whole and checks its size and SHA-256. */
pulse_status store_patch_read(const char *dir, const pulse_store_object *o,
                              pulse_buffer *out);

/** Applies one patch object's bytes to a state (transactional), moving its
 * step and digests forward. */
pulse_status store_state_apply_patch(pulse_store_state *s,
                                     const pulse_store_object *o,
                                     const uint8_t *bytes, size_t size,
                                     int threads);

/* Called after each patch during a replay; a non-OK status stops it. */
typedef pulse_status (*store_step_hook)(void *ctx, const pulse_store_state *s);

/** Loads anchor `anchor` of the head and applies the patches after it up to
 * `step`, calling hook after each. The head step's result is checked
 * against the head's state digest. */
pulse_status store_state_replay(const char *dir, const pulse_store_head *head,
                                size_t anchor, uint64_t step, int threads,
                                store_step_hook hook, void *ctx,
                                pulse_store_state *out);

#endif /* PULSE_STORE_STATE_IMPL_H */
