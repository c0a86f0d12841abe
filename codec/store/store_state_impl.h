/* store_state_impl.h - internal pieces of state rebuilding
 * (pulse_codec_internal), shared by verification, the publisher's resume and
 * the server's catch-up builder. */
#ifndef PULSE_STORE_STATE_IMPL_H
#define PULSE_STORE_STATE_IMPL_H

#include "pulse_safetensors.h"
#include "pulse_store.h"

/** Opens an anchor and checks its metadata: it names the anchor's step and
 * a state digest (into *named). Close *file with pulse_st_close. */
pulse_status store_anchor_open(const char *dir,
                               const pulse_store_object *anchor,
                               pulse_st_file **file, pulse_state_digest *named);

/** Tensor i of an opened anchor, which must be BF16. */
pulse_status store_anchor_tensor(const pulse_st_file *f,
                                 const pulse_store_object *anchor, size_t i,
                                 pulse_st_tensor *t);

/** The anchor's tensors' state digest against the one it names
 * (PULSE_ERR_CORRUPT naming the anchor). */
pulse_status store_anchor_digest_check(const pulse_store_object *anchor,
                                       const pulse_state_digest *computed,
                                       const pulse_state_digest *named);

/** Opens an anchor, checks its metadata (step, state digest) against its
 * tensors, and returns its state; with keep_bits 0 only the table and the
 * digests are kept (bits[] stay NULL). */
pulse_status store_anchor_load(const char *dir,
                               const pulse_store_object *anchor, int keep_bits,
                               pulse_store_state *out);

/** Reads a patch object whole and checks its size and SHA-256. */
pulse_status store_patch_read(const char *dir, const pulse_store_object *o,
                              pulse_buffer *out);

/* A patch object mapped read-only (store_patch_map). */
typedef struct {
  const uint8_t *data;
  size_t size;
} store_patch_mapping;

/** store_patch_read's checks and errors, the object mapped instead of
 * copied; release with store_patch_unmap (an empty one is fine). */
pulse_status store_patch_map(const char *dir, const pulse_store_object *o,
                             store_patch_mapping *out);
void store_patch_unmap(store_patch_mapping *m);

/** A patch's steps against its object's and the state's step `at`
 * (PULSE_ERR_BASE_STEP). */
pulse_status store_patch_steps_check(const pulse_store_object *o,
                                     const pulse_patch *p, uint64_t at);

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

/** The anchor a rebuild of `step` starts from (the newest at or below it);
 * PULSE_ERR_NOT_FOUND when the step is not retained. */
pulse_status store_replay_anchor(const pulse_store_head *head, uint64_t step,
                                 size_t *anchor);

/** The end of a replay towards `step`: it reached it (else
 * PULSE_ERR_NOT_FOUND), and the head step's state has the head's digest
 * (else PULSE_ERR_CORRUPT). */
pulse_status store_replay_end_check(const pulse_store_head *head, uint64_t step,
                                    uint64_t reached,
                                    const pulse_state_digest *digest);

#endif /* PULSE_STORE_STATE_IMPL_H */
