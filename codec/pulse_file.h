/* pulse_file.h - crash-safe file replacement: write a hidden temporary file
 * next to the destination, fsync it, rename it over the destination, fsync
 * the directory. A crash at any point leaves either the old file or the new
 * one, never a partial file under the destination's name.
 *
 * Thread-safety: distinct handles may be used from distinct threads; one
 * handle is not to be shared. */
#ifndef PULSE_FILE_H
#define PULSE_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_atomic_file pulse_atomic_file;

/** Creates a new temporary file in the directory of `path` (a name starting
 * with '.', so globs for the destination's pattern never see it).
 * @return PULSE_OK; PULSE_ERR_ARG for an empty path or one ending in '/';
 * PULSE_ERR_IO when the directory is missing or not writable. */
pulse_status pulse_atomic_file_create(const char *path, pulse_atomic_file **out);

/** Appends n bytes. On error the handle stays valid: abort it. */
pulse_status pulse_atomic_file_write(pulse_atomic_file *f, const void *data, uint64_t n);

/** fsync, close, rename over the destination, fsync of the directory. The
 * handle is freed whatever the result; on error the temporary file is
 * removed and the destination is untouched (unless only the directory fsync
 * failed: the rename is then done but may not be durable yet). */
pulse_status pulse_atomic_file_commit(pulse_atomic_file *f);

/** Closes and removes the temporary file and frees the handle. NULL is fine. */
void pulse_atomic_file_abort(pulse_atomic_file *f);

/** Removes the temporary files that writers of `path` left behind when
 * they died (kill -9, a crash, a power cut) before renaming them: those in
 * the directory of `path` named as pulse_atomic_file_create names them for
 * this destination, whose writer no longer holds them (each writer holds a
 * lock on its temporary until the rename) and whose writer's process is gone
 * or which have not changed for two seconds. Temporaries of other
 * destinations and files of any other name are never touched. *removed
 * (may be NULL) gets the count.
 * @return PULSE_OK (also when the directory does not exist); PULSE_ERR_ARG;
 * PULSE_ERR_IO when the directory cannot be listed; PULSE_ERR_NOMEM. */
pulse_status pulse_atomic_file_clean(const char *path, unsigned *removed);

/** The three steps for one buffer. */
pulse_status pulse_file_write_atomic(const char *path, const void *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif
