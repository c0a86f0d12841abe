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

/** The three steps for one buffer. */
pulse_status pulse_file_write_atomic(const char *path, const void *data, size_t size);

#ifdef __cplusplus
}
#endif
#endif
