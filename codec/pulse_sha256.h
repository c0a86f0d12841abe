/* pulse_sha256.h - a SHA-256 whose running state is plain bytes, so that one
 * process hashes the first bytes of a file, sends the state to another, and
 * that one goes on with the next bytes: the digest of an object whose parts
 * are written by several processes (a sharded trainer's ranks uploading the
 * parts of one anchor, each rank hashing its part after the previous one's).
 *
 *   pulse_sha256_state s; pulse_sha256_begin(&s);
 *   pulse_sha256_add(&s, part1, n1);
 *   send(s.bytes, sizeof s.bytes) ...     // another process, same library:
 *   pulse_sha256_add(&s, part2, n2);
 *   pulse_sha256_end(&s, sha);            // SHA-256 of part1 || part2
 *
 * The bytes are meaningful only to a process running the same build of
 * libpulse (they hold OpenSSL's context as this build lays it out): send
 * them between the ranks of one job, never store them. A state that was not
 * made by pulse_sha256_begin (wrong tag, impossible counters) is refused.
 *
 * Thread-safety: a state is used by one thread at a time; the functions are
 * reentrant. */
#ifndef PULSE_SHA256_H
#define PULSE_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PULSE_SHA256_STATE_BYTES 128
#define PULSE_SHA256_BYTES 32

/* A running SHA-256, as plain bytes (copy, send, receive them as they are). */
typedef struct {
  uint8_t bytes[PULSE_SHA256_STATE_BYTES];
} pulse_sha256_state;

/** Starts a SHA-256 of no bytes in *state. */
void pulse_sha256_begin(pulse_sha256_state *state);

/** Hashes len more bytes of data (NULL is fine when len is 0).
 * @return PULSE_OK; PULSE_ERR_ARG (state NULL, data NULL with len > 0);
 * PULSE_ERR_CORRUPT (a state not begun by pulse_sha256_begin, already
 * ended, or damaged in transit), the state then unchanged. */
pulse_status pulse_sha256_add(pulse_sha256_state *state, const void *data,
                              size_t len);

/** Ends the hash: the SHA-256 of every byte added, in out. The state is
 * then ended (adding to it or ending it again is refused).
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_CORRUPT (as for add). */
pulse_status pulse_sha256_end(pulse_sha256_state *state,
                              uint8_t out[PULSE_SHA256_BYTES]);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SHA256_H */
