/* pulse_codec_stream.h - staging a patch while its bytes arrive.
 *
 * The transaction of pulse_patch_stage / pulse_patch_staged_commit, with the
 * decode overlapped with the download: a patch's header and tensor table
 * come first (docs/formats/patch.md, "Layout") and its body is a run of independently
 * decodable chunk streams in table order, so every chunk can be decoded as
 * soon as its own bytes are there.
 *
 *   uint8_t *buf = malloc(size);            // the whole object, filling up
 *   ... bytes [0, avail) arrive ...
 *   size_t need;
 *   pulse_patch_stream_need(buf, avail, &need);   // until avail >= need
 *   pulse_patch_open(buf, size, &patch);          // header and table only
 *   pulse_patch_stream_begin(patch, targets, n, &opts, &s);
 *   ... more bytes arrive: pulse_patch_stream_feed(s, avail) ...
 *   ... the object's SHA-256 / signature checks pass ...
 *   pulse_patch_stream_finish(s);           // all decoded, target digests
 *   pulse_patch_stream_commit(s);           // writes, cannot fail
 *   pulse_patch_stream_free(s);
 *
 * Bytes are decoded before the object as a whole is verified: decoding is
 * fully bounds-checked and writes only to the stream's staging, so hostile
 * bytes can make finish fail but cannot touch a target. Committing is the
 * caller's decision and must come after its own checks of the object.
 *
 * Thread-safety: begin starts opts->threads decode threads (0: one per
 * core) that wait for bytes; pulse_patch_stream_feed may be called from any
 * one thread (typically a download callback) while they run. The other
 * functions are called from one thread. */
#ifndef PULSE_CODEC_STREAM_H
#define PULSE_CODEC_STREAM_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How many leading bytes of a patch pulse_patch_open needs (the fixed
 * header and the tensor table), judged from the first `avail` bytes: the
 * fixed header's size while fewer are there, then header plus table. Only
 * the magic, version and table size are looked at; pulse_patch_open checks
 * the rest.
 * @return PULSE_OK and *need; PULSE_ERR_MAGIC or PULSE_ERR_VERSION for
 * bytes that cannot start a patch (known from the first 10 bytes);
 * PULSE_ERR_ARG for NULL arguments. */
pulse_status pulse_patch_stream_need(const uint8_t *bytes, size_t avail,
                                     size_t *need);

/* A patch being staged while its body arrives. */
typedef struct pulse_patch_stream pulse_patch_stream;

/** Starts staging `patch` (opened over a buffer of the object's full size
 * of which the header and table are there) into `targets`, matched by name
 * as in pulse_patch_stage: checks the targets against the table and their
 * base digests (and the base state digest without opts->partial_table), then
 * starts the decode threads, which decode each chunk once
 * pulse_patch_stream_feed says its bytes are there. The patch, its bytes and
 * the targets array must outlive the stream; the targets' data must not
 * change until the stream is committed or freed.
 * @return PULSE_OK and *out (free with pulse_patch_stream_free); the errors
 * of pulse_patch_stage's checks (PULSE_ERR_NOT_FOUND, PULSE_ERR_SIZE_MISMATCH,
 * PULSE_ERR_BASE_DIGEST, PULSE_ERR_ARG, PULSE_ERR_NOMEM), nothing started. */
pulse_status pulse_patch_stream_begin(const pulse_patch *patch,
                                      pulse_host_tensor *targets, size_t count,
                                      const pulse_apply_opts *opts,
                                      pulse_patch_stream **out);

/** Says that bytes [0, avail) of the patch's buffer hold their final values
 * (avail only grows; a smaller value is ignored). Cheap: it wakes the
 * decode threads, which do the work. May be called from a thread other
 * than the one that called begin, but from one thread at a time. */
void pulse_patch_stream_feed(pulse_patch_stream *s, size_t avail);

/** Waits for every chunk to be decoded (all bytes must have been fed), then
 * derives the target digests from the base digests and the staged changes
 * and compares them with the table (and the target state digest without
 * partial_table). Nothing is written.
 * @return PULSE_OK: ready to commit; PULSE_ERR_TRUNCATED (not every byte
 * was fed), a chunk's decode error (PULSE_ERR_CORRUPT, ...),
 * PULSE_ERR_TARGET_DIGEST. A failed stream can only be freed. */
pulse_status pulse_patch_stream_finish(pulse_patch_stream *s);

/** Writes the staged changes into the targets; only after finish returned
 * PULSE_OK (otherwise it writes nothing). Cannot fail. Afterwards each
 * target holds the patch's target, whose digest is the table's
 * target_digest. */
void pulse_patch_stream_commit(pulse_patch_stream *s);

/** The two halves of pulse_patch_stream_commit, for a caller that holds
 * readers off only while the weights change: commit_data writes (again
 * harmless), then commit_indexes brings the options' class indexes up to
 * the new weights (once; only after commit_data). Between the two an index
 * no longer describes its target, and no patch may be applied with it. */
void pulse_patch_stream_commit_data(pulse_patch_stream *s);
void pulse_patch_stream_commit_indexes(pulse_patch_stream *s);

typedef struct {
  double verify_seconds;      /* base and target digest checks (wall) */
  double decode_seconds;      /* decoding, summed over chunks (CPU work) */
  double decode_wall_seconds; /* from begin until the last chunk was done */
  double tail_seconds;        /* finish waiting for decodes after the last
                                 byte was fed: the decode not hidden behind
                                 the download */
} pulse_patch_stream_figures;

/** Time figures (complete after finish). */
pulse_patch_stream_figures
pulse_patch_stream_figures_get(const pulse_patch_stream *s);

/** Stops the decode threads and frees the stream, committed or not; the
 * targets are untouched unless committed. NULL is fine. */
void pulse_patch_stream_free(pulse_patch_stream *s);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CODEC_STREAM_H */
