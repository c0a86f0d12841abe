/* pulse_store.h - the durable store a publisher writes and servers and
 * subscribers read: its wire format (head, object naming, signatures,
 * layout), which both sides must agree on, so it lives in codec/.
 *
 * A store is a folder (docs/protocols/sync.md has the full layout):
 *
 *   head.json                        the one mutable file: newest step, its
 *                                    state digest, the retained objects, and
 *                                    an Ed25519 signature over them
 *   objects/<sha256>.pulse           patches (docs/formats/patch.md), immutable
 *   objects/<sha256>.safetensors     anchors: whole BF16 states, immutable
 *   catchup/                         cache of squashed catch-up patches
 *
 * Objects are named by the SHA-256 of their bytes and never change once
 * written (temporary file, fsync, rename); only head.json moves, atomically.
 * A crash at any point therefore leaves the previous head and everything it
 * names intact; at worst a temporary file or an object no head names stays
 * behind, which the writer's pulse_store_recover (trainer_side,
 * pulse_store_writer.h) removes.
 *
 * Every file is untrusted: a corrupted or hostile head or object gives a
 * clear error, never a crash.
 *
 * Thread-safety: functions are reentrant; a parsed head is read-only and may
 * be read from several threads at once. Nothing here prints to stdout. */
#ifndef PULSE_STORE_H
#define PULSE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_sign.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PULSE_STORE_HEAD_FILE "head.json"
#define PULSE_STORE_OBJECTS_DIR "objects"
#define PULSE_STORE_CATCHUP_DIR "catchup"
/* Heads are written in format 2; format 1 (no run, time or link) is still
 * read (docs/protocols/sync.md, "Head versions"). */
#define PULSE_STORE_HEAD_FORMAT "pulse-head/2"
#define PULSE_STORE_HEAD_FORMAT_V1 "pulse-head/1"
/* Bytes of a run identity (random, made with a store's first head). */
#define PULSE_STORE_RUN_BYTES 16
/* Largest head.json accepted, in bytes. */
#define PULSE_STORE_MAX_HEAD_BYTES ((size_t)16 << 20)
/* Most patches or anchors one head may name. */
#define PULSE_STORE_MAX_OBJECTS 100000u
/* Room for "objects/" + 64 hex digits + ".safetensors" + NUL. */
#define PULSE_STORE_PATH_MAX 96

typedef enum { PULSE_STORE_PATCH = 1, PULSE_STORE_ANCHOR = 2 } pulse_store_kind;

/* One object named by a head. */
typedef struct {
  pulse_store_kind kind;
  uint64_t step;      /* target step of a patch; the step of an anchor */
  uint64_t base_step; /* patches: the step it applies to; anchors: == step */
  char path[PULSE_STORE_PATH_MAX]; /* relative to the store folder, e.g.
                                      "objects/<sha256>.pulse"; the URL path
                                      is "/v1/" followed by it */
  uint8_t sha256[32];              /* of the whole file; also its name */
  uint64_t size;                   /* bytes */
} pulse_store_object;

/* ------------------------------------------------------------------- head */

/* A parsed, checked head (opaque). */
typedef struct pulse_store_head pulse_store_head;

/** Parses `size` bytes of head JSON and checks everything that can be
 * checked without the objects: the format name, every field and its type,
 * hex spellings, object paths (content-addressed, never leaving objects/),
 * a patch chain that ends at the head step, anchors placed on retained
 * steps, and, when the head carries a public key, the Ed25519 signature over
 * its canonical form (docs/protocols/sync.md), and a key rotation record's
 * signature by the old key when there is one. The bytes are copied.
 * @return PULSE_OK and *out (free with pulse_store_head_free);
 * PULSE_ERR_OVERFLOW (larger than PULSE_STORE_MAX_HEAD_BYTES or too many
 * objects); PULSE_ERR_JSON (not strict JSON, or a field missing or of the
 * wrong type); PULSE_ERR_VERSION (another format); PULSE_ERR_CORRUPT
 * (inconsistent fields or a signature that does not verify);
 * PULSE_ERR_NOMEM; PULSE_ERR_ARG. */
pulse_status pulse_store_head_parse(const uint8_t *bytes, size_t size,
                                    pulse_store_head **out);

/** Reads and parses DIR/head.json.
 * @return as pulse_store_head_parse, plus PULSE_ERR_NOT_FOUND when the store
 * has no head yet and PULSE_ERR_IO. */
pulse_status pulse_store_head_load(const char *dir, pulse_store_head **out);

/** Releases a head. NULL is fine. */
void pulse_store_head_free(pulse_store_head *head);

/** The newest step. */
uint64_t pulse_store_head_step(const pulse_store_head *head);

/** State digest of the newest step (docs/formats/patch.md), borrowed from the head. */
const pulse_state_digest *
pulse_store_head_state_digest(const pulse_store_head *head);

/** 1 and the signer's public key in `pub` (may be NULL) when the head is
 * signed (its signature was checked by parse), else 0. Whether that key is
 * the one to trust is the caller's decision: compare it with a pinned key. */
int pulse_store_head_signer(const pulse_store_head *head,
                            uint8_t pub[PULSE_KEY_BYTES]);

/** 1 when the head carries a key rotation record (docs/protocols/sync.md,
 * "Key rotation"), checked by parse: the key `from` (may be NULL) signed
 * that the head's signer succeeds it for the head's run from `*step` (may
 * be NULL) on. A worker that trusts `from` may then trust the signer, and
 * from then on only the signer; else 0. */
int pulse_store_head_rotation(const pulse_store_head *head,
                              uint8_t from[PULSE_KEY_BYTES],
                              uint64_t *step);

/** The head's format version: 1 (pulse-head/1) or 2 (pulse-head/2, which
 * also signs a run identity, a publication time and a link to the previous
 * head). */
unsigned pulse_store_head_version(const pulse_store_head *head);

/** 1 and the run identity in `run` (may be NULL) for a version-2 head; 0
 * for a version-1 head, which names no run. A run is made at random with
 * the first head of a store and kept by every later head of it: a new store
 * is a new run, even under the same signing key. */
int pulse_store_head_run(const pulse_store_head *head,
                         uint8_t run[PULSE_STORE_RUN_BYTES]);

/** When the head was published, in unix seconds (the publisher's clock);
 * 0 for a version-1 head, which does not say. */
uint64_t pulse_store_head_published(const pulse_store_head *head);

/** 1 when the head links to the head it replaced: its step in *step and
 * the SHA-256 of its bytes (its ETag) in sha256 (either may be NULL); 0 for
 * the first head of a run and for version-1 heads. */
int pulse_store_head_previous(const pulse_store_head *head, uint64_t *step,
                              uint8_t sha256[32]);

/** Retained patches, oldest first: patch i + 1 applies to patch i's target,
 * the last one ends at the head step. Pointers borrow from the head. */
size_t pulse_store_head_patch_count(const pulse_store_head *head);
const pulse_store_object *pulse_store_head_patch(const pulse_store_head *head,
                                                 size_t i);

/** Retained anchors, oldest first (at least one). The oldest anchor sits at
 * the base of the oldest patch, so every retained step can be rebuilt. */
size_t pulse_store_head_anchor_count(const pulse_store_head *head);
const pulse_store_object *pulse_store_head_anchor(const pulse_store_head *head,
                                                  size_t i);

/** Oldest retained step: the oldest anchor's. Every step from it to the
 * head that is a patch target (or the oldest anchor itself) can be rebuilt
 * and caught up from. */
uint64_t pulse_store_head_oldest_step(const pulse_store_head *head);

/** 1 when `step` is a retained step (see pulse_store_head_oldest_step). */
int pulse_store_head_has_step(const pulse_store_head *head, uint64_t step);

/** The head's JSON bytes as parsed (what a server sends), borrowed. */
const uint8_t *pulse_store_head_bytes(const pulse_store_head *head,
                                      size_t *size);

/* ------------------------------------------------------------------ state */

/* A whole BF16 state rebuilt from the store. Arrays are owned by the struct
 * and in the store's tensor table order; free with pulse_store_state_free. */
typedef struct {
  uint64_t step;
  size_t count;
  pulse_tensor_info *info; /* names owned by the struct */
  uint64_t *numel;
  uint16_t **bits;
  pulse_tensor_digest *digests;
  pulse_state_digest state_digest;
} pulse_store_state;

#define PULSE_STORE_STATE_INIT                                                 \
  {                                                                            \
    0, 0, NULL, NULL, NULL, NULL, {                                            \
      { 0 }                                                                    \
    }                                                                          \
  }

/** Rebuilds the state at retained step `step`: the newest anchor at or
 * below it, then the retained patches up to it applied transactionally. The
 * anchor's state digest and each patch's SHA-256 and size are checked
 * against the head, and the result against the step's state digest (the
 * head's, for the head step). `threads` as in pulse_apply_opts.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (step not retained, or an object
 * missing); PULSE_ERR_CORRUPT (an object that does not match the head);
 * any error of pulse_st_open and pulse_patch_apply; PULSE_ERR_NOMEM. */
pulse_status pulse_store_state_rebuild(const char *dir,
                                       const pulse_store_head *head,
                                       uint64_t step, int threads,
                                       pulse_store_state *out);

/** Releases a state and resets it to PULSE_STORE_STATE_INIT. NULL is fine. */
void pulse_store_state_free(pulse_store_state *state);

/* ----------------------------------------------------------- verification */

/* What pulse_store_verify found. */
typedef struct {
  uint64_t head_step;
  uint64_t oldest_step;
  size_t patches, anchors;
  uint64_t object_bytes; /* sum of the named objects' sizes */
  int head_signed;
  size_t strays; /* temporaries and unnamed objects (not an error) */
  char state_digest_hex[65];
} pulse_store_verify_figures;

/* pulse_store_verify flags (or-ed). */
typedef enum {
  PULSE_STORE_VERIFY_HASHES = 1u, /* SHA-256 of every named object */
  PULSE_STORE_VERIFY_STATE = 2u   /* rebuild the head state from the oldest
                                     anchor through every patch */
} pulse_store_verify_flag;

/** Read-only check of a store: the head parses (signature included), every
 * object it names exists with its size, and with the flags their hashes and
 * the whole chain. `pinned` (may be NULL) is the public key the head must be
 * signed by. `out` may be NULL.
 * @return PULSE_OK when the store is consistent; PULSE_ERR_NOT_FOUND (no
 * head, or a named object missing); PULSE_ERR_CORRUPT (wrong size, hash,
 * signer or state); or any error of the steps above. */
pulse_status pulse_store_verify(const char *dir, unsigned flags,
                                const uint8_t *pinned, pulse_store_verify_figures *out);

/** SHA-256 of a whole file.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND; PULSE_ERR_IO; PULSE_ERR_ARG. */
pulse_status pulse_store_file_sha256(const char *path, uint8_t sha256[32],
                                     uint64_t *size);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_STORE_H */
