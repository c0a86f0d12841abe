/* auth_impl.h - private to loco/: pulse_loco_auth_check for a body known
 * by its size and SHA-256 only (pulse_loco_auth.h's text signs nothing
 * else): a collaboration writer that reads only a payload's header checks
 * its signature with the size and digest its server's answer gave, which
 * the manifest then lists for everyone to check the bytes against. The
 * same for a signed POST with its sequence number; and the signed POSTs'
 * text and query, written and read (auth_post.c) the same way by both
 * parts of the exchange. */
#ifndef PULSE_LOCO_AUTH_IMPL_H
#define PULSE_LOCO_AUTH_IMPL_H

#include <stdint.h>

#include "peer_http_impl.h"
#include "pulse_loco_auth.h"

/* Same answers and counters as pulse_loco_auth_check. */
pulse_status loco_auth_check_digest(pulse_loco_auth *auth,
                                    pulse_loco_auth_kind kind, uint64_t round,
                                    const uint8_t *signer, uint64_t n,
                                    const uint8_t sha[32], const uint8_t *sig);

/* loco_auth_check_digest for a signed message that carries its sender's
 * sequence number `seq` (in its signed bytes; 0: none): a signed POST,
 * accepted only when above every number of its kind accepted from that
 * signer; an outcome (a body read again and again), when not below. Else
 * a replay (PULSE_ERR_BASE_STEP, counted as replayed). */
pulse_status loco_auth_check_seq(pulse_loco_auth *auth,
                                 pulse_loco_auth_kind kind, uint64_t round,
                                 const uint8_t *signer, uint64_t n,
                                 const uint8_t sha[32], const uint8_t *sig,
                                 uint64_t seq);

/* The word of a kind in its signed text and in /metrics ("payload", ...). */
const char *loco_auth_kind_word(pulse_loco_auth_kind kind);

/* ------------------------------------------------------------ signed POSTs
 * A POST that must be signed carries "&seq=N&round=R&key=HEX&sig=HEX"
 * after "PATH?id=ID" (a join: "PATH?id=ID&url=URL"); the signed text is
 * that and "&seq=N". */

/* A sequence number this process never gave before: larger than any it
 * gave, and (from the wall clock in microseconds at its first call) than
 * any an earlier run of it gave. Thread-safe. */
uint64_t loco_auth_seq_next(void);

/* Writes "TEXT&seq=N" (text: "PATH?id=ID[&url=URL]") into dst. @return its
 * length, or -1 when it does not fit. */
int loco_auth_post_text(char *dst, size_t cap, const char *text, uint64_t seq);

/* The query values that follow the signed text: "&round=R&key=HEX&sig=HEX"
 * ("" for a signature not present). */
void loco_auth_post_query(const loco_sig *sig, char *dst, size_t cap);

/* Reads a POST's signature (query values seq, round, key, sig; sig->seq
 * the sequence number, sig->present 0 unless all four are well-formed)
 * and writes its signed text "PATH?id=ID[&url=URL]&seq=N" (without a
 * seq: no "&seq=N") into text. @return the text's length; -1 when the id is
 * missing or the text does not fit. */
int loco_auth_post_read(const char *path,
                        const char *(*query)(void *rq, const char *key),
                        void *rq, char *text, size_t cap, loco_sig *sig);

/* 1 when sig is signer's signature over the text of a body of kind `kind`
 * and round (n bytes, SHA-256 sha): no membership, no replay window,
 * nothing counted (a joiner's join checked before its admission admits its
 * key). */
int loco_auth_verify_body(pulse_loco_auth_kind kind, uint64_t round,
                          const uint8_t signer[32], uint64_t n,
                          const uint8_t sha[32], const uint8_t sig[64]);

/* ------------------------------------------------------------ admissions
 * (auth_key.c) One text in both parts of the exchange: a member's key
 * blob, served at GET /v1/loco/key, {"id":I,"key":"HEX"} or, admitted,
 * {"id":I,"key":"HEX","sponsor":"HEX","until":R,"sig":"HEX"}; and the
 * admission a joiner appends to its signed join,
 * "&sponsor=HEX&until=R&asig=HEX" (not in the join's signed text: the
 * admission is signed by its sponsor). */
#define LOCO_AUTH_KEY_BLOB_MAX 512u

/* Writes the key blob of (id, key), with adm when not NULL. @return its
 * length, -1 when it does not fit. */
int loco_auth_key_blob_write(char *dst, size_t cap, uint32_t id,
                             const uint8_t key[32],
                             const pulse_loco_admission *adm);

/* Parses a key blob (untrusted): 1 when well-formed, *admitted 1 and *adm
 * filled (its key the blob's) when it carries an admission. */
int loco_auth_key_blob_parse(const uint8_t *data, size_t size, uint32_t *id,
                             uint8_t key[32], int *admitted,
                             pulse_loco_admission *adm);

/* The query values of adm ("" for NULL). */
void loco_auth_admission_query(const pulse_loco_admission *adm, char *dst,
                               size_t cap);

/* Reads a join's admission of `key` from its query values: 1 when sponsor,
 * until and asig are all there and well-formed (nothing checked yet). */
int loco_auth_admission_read(const char *(*query)(void *rq, const char *key),
                             void *rq, const uint8_t key[32],
                             pulse_loco_admission *adm);

#endif
