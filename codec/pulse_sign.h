/* pulse_sign.h - Ed25519 signing keys for pulse stores.
 *
 * A publisher signs each head (pulse_store.h) with an Ed25519 key so that
 * clients can trust the head, and through the SHA-256 it names every object,
 * even when they reach them through untrusted relays, caches or buckets.
 * Keys are stored as PKCS#8 PEM files (what `openssl genpkey -algorithm
 * ed25519` writes). Public keys travel as 32 raw bytes (64 hex digits).
 *
 * Thread-safety: a key may be used to sign from several threads at once;
 * free it only when no call uses it. Nothing here prints to stdout. */
#ifndef PULSE_SIGN_H
#define PULSE_SIGN_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The size of an Ed25519 public key: every key the API takes or gives
 * (publisher heads, subscribers' pins, trainer-exchange members). */
#define PULSE_KEY_BYTES 32
#define PULSE_SIGN_SIGNATURE_BYTES 64

/* A private Ed25519 key (opaque). */
typedef struct pulse_sign_key pulse_sign_key;

/** Generates a new random key.
 * @return PULSE_OK and *out (free with pulse_sign_key_free);
 * PULSE_ERR_INTERNAL when OpenSSL fails; PULSE_ERR_ARG for NULL out. */
pulse_status pulse_sign_key_generate(pulse_sign_key **out);

/** Loads a private key from a PEM file (PKCS#8, as written by
 * pulse_sign_key_save or openssl genpkey). The file is untrusted: anything
 * but an Ed25519 private key is refused.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no such file); PULSE_ERR_IO;
 * PULSE_ERR_CORRUPT (not a PEM private key); PULSE_ERR_UNSUPPORTED (a key of
 * another algorithm); PULSE_ERR_ARG. */
pulse_status pulse_sign_key_load(const char *path, pulse_sign_key **out);

/** Writes the private key to a new PEM file at `path` with mode 0600,
 * durably (fsync of the file and its directory). Never replaces an existing
 * file: a key is not something to lose by accident.
 * @return PULSE_OK; PULSE_ERR_IO (also when `path` exists);
 * PULSE_ERR_INTERNAL; PULSE_ERR_ARG. */
pulse_status pulse_sign_key_save(const pulse_sign_key *key, const char *path);

/** Copies the 32-byte public key into `pub`. */
void pulse_sign_key_public(const pulse_sign_key *key,
                           uint8_t pub[PULSE_KEY_BYTES]);

/** Releases a key (its memory is cleansed by OpenSSL). NULL is fine. */
void pulse_sign_key_free(pulse_sign_key *key);

/** Signs `len` bytes (pure Ed25519, RFC 8032, no pre-hash).
 * @return PULSE_OK; PULSE_ERR_INTERNAL when OpenSSL fails; PULSE_ERR_ARG. */
pulse_status pulse_sign(const pulse_sign_key *key, const void *msg, size_t len,
                        uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]);

/** Checks an Ed25519 signature of `len` bytes by the public key `pub`.
 * @return PULSE_OK when it is valid; PULSE_ERR_CORRUPT when it is not (or
 * the public key is not a valid point); PULSE_ERR_INTERNAL; PULSE_ERR_ARG. */
pulse_status pulse_sign_verify(const uint8_t pub[PULSE_KEY_BYTES],
                               const void *msg, size_t len,
                               const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIGN_H */
