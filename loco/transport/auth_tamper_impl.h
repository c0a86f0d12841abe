/* auth_tamper_impl.h - private to loco/: fault injection for the tests of
 * the trainer exchange's authentication (tests/loco/test_auth*.c,
 * test_collab_auth*.c). What a hostile or broken trainer serves or sends
 * in place of its signed messages: unsigned, forged (one signature bit
 * flipped), replayed (the previous round's body of the kind, with its
 * signature) or signed by a stranger's key. One piece for both parts: the
 * coordinator exchange (loco_auth_tamper) and the collaboration
 * (collab_auth_tamper) hold a loco_tamper and call it where they sign.
 * Used by one thread at a time (the node's or the peer's main thread). */
#ifndef PULSE_LOCO_AUTH_TAMPER_IMPL_H
#define PULSE_LOCO_AUTH_TAMPER_IMPL_H

#include <stdint.h>

#include "bytebuf_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco_auth.h"

/* The faults. */
#define LOCO_AUTH_TAMPER_NONE 0u
#define LOCO_AUTH_TAMPER_UNSIGNED 1u
#define LOCO_AUTH_TAMPER_FORGED 2u
#define LOCO_AUTH_TAMPER_REPLAYED 3u
#define LOCO_AUTH_TAMPER_FOREIGN 4u
/* The bit of a kind in a tamper's `kinds`; the coordinator's datagram end
 * markers have their own, above every kind's. */
#define LOCO_AUTH_TAMPER_KIND(kind) (1u << ((unsigned)(kind)-1u))
#define LOCO_AUTH_TAMPER_END (1u << 31)

/* A body kept for REPLAYED. */
typedef struct {
  int have;
  uint64_t round;
  pulse_bytebuf body;
  loco_sig sig;
} loco_tamper_kept;

/* Zeroed: no fault. */
typedef struct {
  unsigned mode;  /* LOCO_AUTH_TAMPER_* */
  unsigned kinds; /* LOCO_AUTH_TAMPER_KIND bits, LOCO_AUTH_TAMPER_END */
  pulse_sign_key *stranger_key; /* FOREIGN: a key no member pinned */
  pulse_loco_auth *stranger;
  loco_tamper_kept kept[PULSE_LOCO_AUTH_KINDS]; /* by kind - 1 */
} loco_tamper;

/* From now on, messages of `kinds` get fault `mode` (NONE: none).
 * @return PULSE_OK; PULSE_ERR_ARG (an unknown mode); a key's error. */
pulse_status loco_tamper_set(loco_tamper *t, unsigned mode, unsigned kinds);
/* Frees what the tamper holds and leaves it zeroed. */
void loco_tamper_clear(loco_tamper *t);
/* The mode when it covers `kind`, else LOCO_AUTH_TAMPER_NONE. */
unsigned loco_tamper_mode(const loco_tamper *t, pulse_loco_auth_kind kind);

/* The faults of a signature alone, for messages whose body the signer does
 * not serve itself (partitioned blobs, signed POSTs): sig (the honest one
 * over data) made unsigned, forged or a stranger's; REPLAYED leaves it.
 * @return PULSE_OK; a signing error. */
pulse_status loco_tamper_sign(loco_tamper *t, pulse_loco_auth_kind kind,
                              uint64_t round, const void *data, size_t size,
                              loco_sig *sig);

/* Serves at `path` on srv what this node serves in place of data signed
 * `sig` (kind, round): a kind the tamper covers gets its fault, REPLAYED
 * the previous round's body of the kind with its signature (the first
 * round's as is); any other as signed. */
pulse_status loco_tamper_put(loco_tamper *t, loco_server *srv, const char *path,
                             pulse_loco_auth_kind kind, uint64_t round,
                             const void *data, size_t size,
                             const loco_sig *sig);

#endif
