/* store_impl.h - internal to pulse (pulse_codec_internal: the trainer and
 * inference sides share it): the head's in-memory form, its canonical
 * serialization and JSON writer, hex and SHA-256 helpers, path building and
 * the layout checks of a store folder (docs/protocols/sync.md). */
#ifndef PULSE_STORE_IMPL_H
#define PULSE_STORE_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_sign.h"
#include "pulse_store.h"

/* A key rotation record (docs/protocols/sync.md, "Key rotation"): the key `from`
 * names the head's signing key as its successor, for the run of the head,
 * from step `step` on; `signature` is from's over store_rotation_canonical. */
typedef struct {
  int present;
  uint64_t step;
  uint8_t from[PULSE_KEY_BYTES];
  uint8_t signature[PULSE_SIGN_SIGNATURE_BYTES];
} store_rotation;

struct pulse_store_head {
  uint8_t *bytes; /* the JSON as parsed or written */
  size_t size;
  uint64_t step;
  pulse_state_digest digest;
  int is_signed;
  uint8_t pub[PULSE_KEY_BYTES];
  uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES];
  pulse_store_object *patches;
  size_t npatches;
  pulse_store_object *anchors;
  size_t nanchors;
  unsigned version; /* 1 or 2; the fields below are version 2's */
  uint8_t run[PULSE_STORE_RUN_BYTES];
  uint64_t published;
  int has_previous;
  uint64_t previous_step;
  uint8_t previous_sha256[32];
  store_rotation rotation; /* a key rotation record (version 2, signed) */
};

/* The fields a new head is made of (borrowed). */
typedef struct {
  uint64_t step;
  pulse_state_digest digest;
  const pulse_store_object *patches;
  size_t npatches;
  const pulse_store_object *anchors;
  size_t nanchors;
  /* 2: a pulse-head/2 head with the fields below; 0 or 1: pulse-head/1
   * (the fields below are not written). */
  unsigned version;
  uint8_t run[PULSE_STORE_RUN_BYTES];
  uint64_t published; /* unix seconds */
  int has_previous;   /* 0: the first head of its run */
  uint64_t previous_step;
  uint8_t previous_sha256[32]; /* of the previous head's bytes */
  store_rotation rotation;      /* written when present (version 2 only) */
} store_head_fields;

/** The text a key rotation's signature covers: the run, the step, the old
 * and the new public key (docs/protocols/sync.md, "Key rotation"). Returns its length
 * (at most STORE_ROTATION_CANON_MAX - 1). */
#define STORE_ROTATION_CANON_MAX 320
int store_rotation_canonical(const uint8_t run[PULSE_STORE_RUN_BYTES],
                             uint64_t step,
                             const uint8_t from[PULSE_KEY_BYTES],
                             const uint8_t to[PULSE_KEY_BYTES],
                             char out[STORE_ROTATION_CANON_MAX]);

/** Makes the record by which `from` (the key heads were signed with) names
 * `to` as its successor for `run` from `step` on.
 * @return PULSE_OK; PULSE_ERR_ARG (the same key); PULSE_ERR_INTERNAL. */
pulse_status store_rotation_sign(const pulse_sign_key *from,
                                 const uint8_t to[PULSE_KEY_BYTES],
                                 const uint8_t run[PULSE_STORE_RUN_BYTES],
                                 uint64_t step, store_rotation *out);

/** A new random run identity (OpenSSL's generator).
 * @return PULSE_OK or PULSE_ERR_INTERNAL. */
pulse_status store_run_new(uint8_t run[PULSE_STORE_RUN_BYTES]);

/** Serializes a head as JSON, signed by `key` when it is not NULL. The
 * fields are not checked here: pulse_store_head_parse of the result is how
 * a writer proves them (the publisher does so before writing). */
pulse_status store_head_serialize(const store_head_fields *f,
                                  const pulse_sign_key *key, pulse_buffer *out);

/** The canonical byte string a head signature covers
 * (docs/protocols/sync.md). */
pulse_status store_head_canonical(const store_head_fields *f,
                                  const uint8_t *pub, pulse_buffer *out);

/** Sets obj->path from its kind and hash. */
void store_object_set_path(pulse_store_object *obj);

/** Lower-case hex of n bytes into out (2n + 1 bytes with the NUL). */
void store_hex(const uint8_t *bytes, size_t n, char *out);

/** Parses exactly 2n lower-case hex digits. @return 0, or -1. */
int store_unhex(const char *s, size_t len, uint8_t *out, size_t n);

/** SHA-256 of a buffer. */
void store_sha256(const void *data, size_t n, uint8_t out[32]);

/** "DIR/REL" into buf. @return 0, or -1 when it does not fit. */
int store_join(char *buf, size_t cap, const char *dir, const char *rel);

/** 1 when `name` is a temporary file of pulse_file.h (".X.tmp-..."). */
int store_is_temp_name(const char *name);

/** Parses an object file name "<64 hex>.pulse" / ".safetensors": 1 and the
 * kind and hash when it is one, else 0. */
int store_parse_object_name(const char *name, pulse_store_kind *kind,
                            uint8_t sha256[32]);

/** Checks that object `o` named by a head exists in store `dir` with its
 * size. @return PULSE_OK; PULSE_ERR_NOT_FOUND; PULSE_ERR_CORRUPT (not a
 * regular file, or another size); PULSE_ERR_IO; PULSE_ERR_ARG. */
pulse_status store_check_named(const char *dir, const pulse_store_object *o);

/* A file of a store folder that no head needs. */
typedef enum {
  STORE_STRAY_TEMPORARY = 1, /* ".NAME.tmp-*" of an interrupted write */
  STORE_STRAY_ORPHAN,        /* an object the head does not name */
  STORE_STRAY_CATCHUP        /* a cached catch-up patch (derived) */
} store_stray_kind;

/* Called for each stray; a non-OK status stops the walk. */
typedef pulse_status (*store_stray_fn)(void *ctx, const char *folder,
                                       const char *name, store_stray_kind kind);

/** Calls fn for every stray of store `dir`: temporaries in the folder and
 * in objects/, objects `head` does not name (every object when head is
 * NULL), and with `catchups` every file of catchup/. Files of objects/ that
 * are no object name are logged and left alone; a missing folder has none.
 * Verification counts the strays, the writer's recovery removes them. */
pulse_status store_strays(const char *dir, const pulse_store_head *head,
                          int catchups, store_stray_fn fn, void *ctx);

/* The text a catch-up's signature covers (docs/protocols/sync.md, "Catch-ups"): version
 * 2 with the run of a format-2 head, version 1 otherwise. The server signs
 * it, the subscriber verifies it. Returns its length, or -1 when `cap` is
 * too small. */
int store_catchup_canon(const pulse_store_head *head, uint64_t from,
                        uint64_t to, const char *state_digest_hex,
                        const char *sha256_hex, uint64_t size, char *out,
                        size_t cap);

#endif /* PULSE_STORE_IMPL_H */
