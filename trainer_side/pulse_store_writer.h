/* pulse_store_writer.h - what only the single writer of a store (its
 * publisher, or pulse-publish before it writes) does to the store folder.
 * Reading, checking and verifying a store is codec's (pulse_store.h),
 * shared with the inference side; removing files is not.
 *
 * Thread-safety: one writer per store folder, by design. Nothing here
 * prints to stdout. */
#ifndef PULSE_STORE_WRITER_H
#define PULSE_STORE_WRITER_H

#include <stddef.h>

#include "pulse_status.h"
#include "pulse_store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What pulse_store_recover removed. */
typedef struct {
  size_t temporaries; /* ".NAME.tmp-*" files left by an interrupted write */
  size_t orphans;     /* objects no head names (a crash between writing an
                         object and moving the head, or a retention cut) */
  size_t catchups;    /* cached catch-up patches (derived, never needed) */
  size_t retiring;    /* objects no head names kept: their grace period
                         (pulse_store_recover_grace) is not over */
} pulse_store_recovery;

/** Brings a store folder into a clean state after a crash; only the single
 * writer of a store (its publisher) may call it, before writing. Creates the
 * folder layout when missing; removes temporary files, every object the head
 * does not name and the catch-up cache; checks that every object the head
 * names exists with its size. Never touches head.json or a named object.
 * `out` may be NULL.
 * Takes the store's writer lock (docs/protocols/sync.md, "Writing a store") for the
 * call: a store held by a live publisher is refused (PULSE_ERR_IO, the
 * detail naming the holder) and nothing is removed.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (a named object missing or of the
 * wrong size: the store needs attention, nothing was removed); PULSE_ERR_IO
 * (another writer holds the store); any error of
 * pulse_store_head_load but PULSE_ERR_NOT_FOUND (an empty store is fine);
 * PULSE_ERR_IO. */
pulse_status pulse_store_recover(const char *dir, pulse_store_recovery *out);

/** pulse_store_recover, but an object no head names whose file was modified
 * less than `grace_seconds` ago stays: the publisher stamps an object's
 * modification time when the head stops naming it, and keeps it
 * downloadable for its grace period (pulse_pub_opts.grace_seconds,
 * docs/protocols/sync.md "Retention"). A grace of 0 is pulse_store_recover.
 * @return as pulse_store_recover; PULSE_ERR_ARG for a negative grace. */
pulse_status pulse_store_recover_grace(const char *dir, double grace_seconds,
                                       pulse_store_recovery *out);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_STORE_WRITER_H */
