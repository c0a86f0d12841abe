/* writer_lock_impl.h - one writer per store (docs/protocols/sync.md, "Writing a store
 * (one writer)"): a lock on STORE/writer.lock that a publisher holds for its
 * life and recovery holds while it removes files, so that a second
 * publisher, on this host or another one sharing the folder, is refused
 * before it writes anything. */
#ifndef PULSE_WRITER_LOCK_IMPL_H
#define PULSE_WRITER_LOCK_IMPL_H

#include "pulse_status.h"
#include "pulse_store_writer.h"

/* The lock file, at the store's root; never served, never uploaded. */
#define PUB_WRITER_LOCK_FILE "writer.lock"

/** Takes the store's writer lock (an open-file-description lock, which the
 * kernel, or the NFS server, drops when the holder dies, so a crash leaves
 * no stale lock) and writes the holder's name into the file: "pid P on host
 * H since T". `dir` must exist.
 * @return PULSE_OK and *fd (give it to pub_writer_unlock); PULSE_ERR_IO
 * (held by another writer: the detail names the holder; or the file cannot
 * be opened or locked). */
pulse_status pub_writer_lock(const char *dir, int *fd);

/** Releases the lock (closes fd); fd < 0 is fine. */
void pub_writer_unlock(int fd);

/** pulse_store_recover_grace for a caller that holds the writer lock. */
pulse_status pub_store_recover_held(const char *dir, double grace_seconds,
                                    pulse_store_recovery *out);

/** Creates the store folder (and objects/, catchup/) when missing. */
pulse_status pub_store_dirs(const char *dir);

#endif
