/* pulse_loco_auth.h - authenticated PULSELoCo: every message a trainer
 * acts on (payloads, manifests, states, membership views, leaves and
 * dones, drift digests, the collaboration's claims, grants and
 * partitioned blobs: the kinds below) is signed by its sender's Ed25519
 * key (pulse_sign.h); the members are pinned (a key list given at start,
 * or admitted by a member's signature when they join); an unsigned,
 * forged, replayed (older round) or foreign message is refused and
 * counted, and the round proceeds without it.
 *
 * What is signed (one text per kind, "\n" one LF byte, hex lower-case):
 *
 *   pulse-loco-<kind>/1\n     <kind>: payload, manifest, state, members,
 *                             leave, done, digests, sync, sketch, slice,
 *                             reduced, verdict, claim, grant, sent,
 *                             joined, port, join, progress, outcome
 *   round <round>\n
 *   signer <64 hex: public key>\n
 *   size <bytes>\n
 *   sha256 <64 hex: of the bytes>\n
 *
 *   pulse-loco-admit/1\n  round <round>\n  sponsor <hex>\n  member <hex>\n
 *
 * Transport: for HTTP answers X-Pulse-Loco-Round, X-Pulse-Loco-Key (64
 * hex) and X-Pulse-Loco-Signature (128 hex) next to the body; a POST's as
 * its query values round, key and sig over "PATH?id=ID&seq=N", N a number
 * its sender never used before (a POST repeated, in its round or not, is
 * a replay); datagrams
 * through their sender's signed chunk list; a client-mode peer's uploads
 * as a 104-byte trailer (docs/protocols/loco-exchange.md "Authentication"). This module checks;
 * the exchange (pulse_loco_coord, coordinator_auth.c) and the
 * collaboration (collab_auth.c) call it on every message before using it.
 *
 * Thread-safety: a handle is used by one thread at a time. Nothing here
 * prints to stdout. */
#ifndef PULSE_LOCO_AUTH_H
#define PULSE_LOCO_AUTH_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_sign.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PULSE_LOCO_AUTH_MAX_MEMBERS 4096u

/* What a signature covers (docs/protocols/loco-exchange.md "Authentication" says what each
 * body is). A signature of one kind never passes as another. */
typedef enum {
  PULSE_LOCO_AUTH_PAYLOAD = 1,   /* a round payload (or its chunk list) */
  PULSE_LOCO_AUTH_MANIFEST = 2,  /* a round manifest */
  PULSE_LOCO_AUTH_STATE = 3,     /* a state a joiner or re-syncing member
                                    loads (/v1/loco/state/R) */
  PULSE_LOCO_AUTH_MEMBERS = 4,   /* a membership view (/v1/loco/members) */
  PULSE_LOCO_AUTH_LEAVE = 5,     /* a leave request */
  PULSE_LOCO_AUTH_DONE = 6,      /* a member's "round R done" */
  PULSE_LOCO_AUTH_DIGESTS = 7,   /* the reference's range digests */
  PULSE_LOCO_AUTH_SYNC = 8,      /* the SHA-256 of each re-sync range */
  PULSE_LOCO_AUTH_SKETCH = 9,    /* the reference's range sketches */
  PULSE_LOCO_AUTH_SLICE = 10,    /* a partitioned slice (collaboration) */
  PULSE_LOCO_AUTH_REDUCED = 11,  /* an owner's reduced range */
  PULSE_LOCO_AUTH_VERDICT = 12,  /* a peer's verdict on the reduced ranges */
  PULSE_LOCO_AUTH_CLAIM = 13,    /* a claim of samples or a readiness */
  PULSE_LOCO_AUTH_GRANT = 14,    /* a writer's answer to one */
  PULSE_LOCO_AUTH_SENT = 15,     /* "all my datagrams of round R are sent" */
  PULSE_LOCO_AUTH_JOINED = 16,   /* a coordinator's answer to a join: the
                                    round it admits the joiner from */
  PULSE_LOCO_AUTH_PORT = 17,     /* a trainer's datagram port */
  PULSE_LOCO_AUTH_JOIN = 18,     /* a join request */
  PULSE_LOCO_AUTH_PROGRESS = 19, /* a writer's progress record */
  PULSE_LOCO_AUTH_OUTCOME = 20,  /* a contributor's partitioned outcome */
  PULSE_LOCO_AUTH_PROMISE = 21   /* the rank a member promised in a round
                                    and what it accepted (collaboration) */
} pulse_loco_auth_kind;
#define PULSE_LOCO_AUTH_KINDS 21u /* the largest kind */

/* Why bodies were refused, since create (for the metrics). */
typedef struct {
  uint64_t accepted;
  uint64_t unsigned_bodies; /* no signature or no signer */
  uint64_t forged;          /* a signature that does not verify */
  uint64_t replayed;        /* a round older than the current one, or than
                               one already accepted from the signer */
  uint64_t foreign;         /* signed by a key that is not a member */
  uint64_t admitted;        /* members admitted by a member's signature */
} pulse_loco_auth_figures;

/* A pinned member: its trainer id and Ed25519 public key. */
typedef struct {
  uint32_t id;
  uint8_t key[PULSE_KEY_BYTES];
} pulse_loco_member_key;

/* A member's signature admitting a newcomer's key (pulse_loco_auth.h, the
 * admission text), valid while the group has not passed round `round`. */
typedef struct pulse_loco_admission {
  uint8_t key[PULSE_KEY_BYTES];     /* the newcomer's */
  uint8_t sponsor[PULSE_KEY_BYTES]; /* the member's who signed */
  uint64_t round;
  uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES];
} pulse_loco_admission;

/* Options; start from pulse_loco_auth_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_AUTH_OPTS_VERSION */
  /* This trainer's key (signs its payloads and manifests, and admissions);
   * borrowed, must outlive the handle. Its public key is a member. */
  const pulse_sign_key *key;
  /* The pinned members' public keys, 32 bytes each (copied). */
  const uint8_t *members;
  size_t member_count;
} pulse_loco_auth_opts;

#define PULSE_LOCO_AUTH_OPTS_VERSION 1u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_loco_auth_opts_init(pulse_loco_auth_opts *opts);

typedef struct pulse_loco_auth pulse_loco_auth;

/** Creates a handle whose members are opts->members plus the own key.
 * @return PULSE_OK and *out (free with pulse_loco_auth_free);
 * PULSE_ERR_ARG (no key, more than PULSE_LOCO_AUTH_MAX_MEMBERS members,
 * another options version); PULSE_ERR_NOMEM. */
pulse_status pulse_loco_auth_create(const pulse_loco_auth_opts *opts,
                                    pulse_loco_auth **out);

/** Frees a handle. NULL is fine. */
void pulse_loco_auth_free(pulse_loco_auth *auth);

/** The round being run: bodies of older rounds are replays from now on. */
void pulse_loco_auth_round(pulse_loco_auth *auth, uint64_t round);

/** Signs `n` bytes of kind `kind` for `round` with the own key; the own
 * public key (the signer to send along) in `pub` (may be NULL).
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_INTERNAL. */
pulse_status pulse_loco_auth_sign(const pulse_loco_auth *auth,
                                  pulse_loco_auth_kind kind, uint64_t round,
                                  const void *bytes, size_t n,
                                  uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES],
                                  uint8_t pub[PULSE_KEY_BYTES]);

/** Checks a body that came with `round`, `signer` and `sig` (either NULL:
 * unsigned). Accepted when the signer is a member, the signature verifies
 * over the text above, and the round is neither older than the current one
 * nor than one already accepted from this signer for this kind. Every
 * answer is counted.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (unsigned, forged or foreign, the
 * detail saying which); PULSE_ERR_BASE_STEP (a replayed older round);
 * PULSE_ERR_ARG. */
pulse_status pulse_loco_auth_check(pulse_loco_auth *auth,
                                   pulse_loco_auth_kind kind, uint64_t round,
                                   const uint8_t *signer, const void *bytes,
                                   size_t n, const uint8_t *sig);

/** The own key's admission of `newcomer` from `round` on, for a joining
 * trainer to present to the others.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_INTERNAL. */
pulse_status pulse_loco_auth_admit_sign(const pulse_loco_auth *auth,
                                        uint64_t round,
                                        const uint8_t newcomer[PULSE_KEY_BYTES],
                                        uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]);

/** Admits `newcomer` as a member when `sponsor` is a member and `sig` is
 * its admission signature (pulse_loco_auth_admit_sign) for `round`, not
 * older than the current round. Admitting a member again is fine.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (a sponsor that is no member, or a
 * signature that does not verify); PULSE_ERR_BASE_STEP (an old round's
 * admission); PULSE_ERR_OVERFLOW (too many members); PULSE_ERR_NOMEM;
 * PULSE_ERR_ARG. */
pulse_status pulse_loco_auth_admit(pulse_loco_auth *auth, uint64_t round,
                                   const uint8_t newcomer[PULSE_KEY_BYTES],
                                   const uint8_t sponsor[PULSE_KEY_BYTES],
                                   const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]);

/** pulse_loco_auth_admit without the round's replay check: for an
 * admission a member learns after the fact, of a newcomer that a signed
 * manifest already lists (the coordinator checked its round when it
 * admitted it; the newcomer's later rounds may be past it). The sponsor
 * must still be a member and the signature verify. Same returns, never
 * PULSE_ERR_BASE_STEP. */
pulse_status pulse_loco_auth_admit_seen(pulse_loco_auth *auth, uint64_t round,
                                        const uint8_t newcomer[PULSE_KEY_BYTES],
                                        const uint8_t sponsor[PULSE_KEY_BYTES],
                                        const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]);

/** 1 when `pub` is a member. */
int pulse_loco_auth_is_member(const pulse_loco_auth *auth,
                              const uint8_t pub[PULSE_KEY_BYTES]);

/** The counters since create. */
void pulse_loco_auth_figures_get(const pulse_loco_auth *auth,
                                  pulse_loco_auth_figures *out);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_AUTH_H */
