/* coordinator_auth_impl.h - private to loco/: authenticated PULSELoCo in the
 * exchange (issue 15; pulse_loco_auth.h checks, docs/formats/loco-payload.md
 * "Authentication" says what travels). The node calls these hooks; each is
 * a no-op (or the unauthenticated call) when the node does not
 * authenticate (no key, or PULSE_LOCO_AUTH_OFF):
 *
 *   served      every payload and manifest this node publishes carries its
 *               signature headers; a relay carries its original signer's
 *   fetched     every payload (coordinator and members, from the sender or
 *               a relay) and manifest is checked before it is decoded: its
 *               signer must be the key bound to the trainer id it comes
 *               from, the signature must verify, its round must be this one
 *   datagrams   each sender publishes, signed, the SHA-256 of every chunk
 *               of its round before it sends them; a chunk is admitted
 *               only when its digest is in its sender's list
 *   joins       the coordinator admits a joiner whose key is pinned or who
 *               presents a member's admission of it; the others learn a
 *               new member's key from its /v1/loco/key (checked again)
 *
 * A refused body or datagram is counted (node metrics, step info) and left
 * out: the round proceeds without it. */
#ifndef PULSE_LOCO_COORD_AUTH_IMPL_H
#define PULSE_LOCO_COORD_AUTH_IMPL_H

#include "pulse_loco_coord.h"
#include "peer_http_impl.h"
#include "manifest_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_auth.h"
#include "udp_impl.h"
#include "auth_tamper_impl.h"

typedef struct loco_node_auth loco_node_auth;

/* At create, after the server started: checks the options (a config that
 * cannot be verified is refused with PULSE_ERR_ARG), sets n->auth (NULL
 * when off), serves /v1/loco/key, installs the join gate and the metrics. */
pulse_status loco_auth_start(pulse_loco_coord *n,
                             const pulse_loco_coord_opts *opts);
void loco_auth_stop(pulse_loco_coord *n);

/* Founding members must all have a pinned key. */
pulse_status loco_auth_check_founders(const pulse_loco_coord *n,
                                      const pulse_loco_member *m,
                                      size_t count);

/* The step of round r begins (bodies of older rounds are replays from now
 * on); it ended: info->auth and info->datagrams_refused_auth get what this
 * step refused. */
void loco_auth_begin_step(pulse_loco_coord *n, uint64_t r);
/* The round of the step being run (0 before the first, or unauthenticated). */
uint64_t loco_auth_round_now(pulse_loco_coord *n);
void loco_auth_end_step(pulse_loco_coord *n, pulse_loco_coord_step_figures *info);

/* Publishes a body of this node (kind, round r) signed. */
pulse_status loco_auth_put(pulse_loco_coord *n, const char *path,
                           pulse_loco_auth_kind kind, uint64_t r,
                           const void *data, size_t size);

/* Publishes a relay of a fetched payload with its original signature
 * (sig NULL: this node's own payload of the round). */
pulse_status loco_auth_relay(pulse_loco_coord *n, const char *path,
                             const void *data, size_t size,
                             const loco_sig *sig);

/* Any member's key may have signed the body (a seed's membership view). */
#define LOCO_AUTH_ANY_SIGNER UINT32_MAX

/* 1 when a body of kind `kind` that came with `sig` passes (always when the
 * node does not authenticate): signed by the key bound to trainer `id`
 * (LOCO_AUTH_ANY_SIGNER: by any member's bound key; *signer, when not
 * NULL, gets its id), its signed round at most `ceiling` (above: forged,
 * served for another round) and at least `floor` and not older than one
 * of this kind already accepted from the signer (else a replay). 0 when
 * refused (counted by reason and kind, logged). May fetch the key of a
 * newly admitted member (not with LOCO_AUTH_ANY_SIGNER). */
int loco_auth_accept_window(pulse_loco_coord *n, pulse_loco_auth_kind kind,
                            uint64_t floor, uint64_t ceiling, uint32_t id,
                            const loco_sig *sig, const void *data, size_t size,
                            uint32_t *signer);

/* Adds to the bytes authentication added to what this node received
 * (pulse_loco_coord_step_figures.auth_bytes); the signature headers of the
 * bodies loco_auth_accept_window sees, and the signed POSTs' query values,
 * are counted there. */
void loco_auth_count_bytes(pulse_loco_coord *n, uint64_t bytes);

/* A body loco_auth_accept_window accepted turned out to be a signed
 * message of another exchange (an admission of another join): counted
 * as replayed instead. */
void loco_auth_count_replayed(pulse_loco_coord *n, pulse_loco_auth_kind kind);

/* loco_auth_accept_window for a body of round r exactly. */
/* 1 when a body that came with `sig` from trainer `id` for round r passes
 * (always when the node does not authenticate); 0 when refused (counted,
 * logged). May fetch the key of a newly admitted member. */
int loco_auth_accept(pulse_loco_coord *n, pulse_loco_auth_kind kind, uint64_t r,
                     uint32_t id, const loco_sig *sig, const void *data,
                     size_t size);

/* The manifest of round r from url, checked as signed by `coordinator`
 * (loco_node_get_json when the node does not authenticate).
 * @return PULSE_OK; PULSE_ERR_CORRUPT when refused; a fetch error. */
pulse_status loco_auth_get_manifest(pulse_loco_coord *n, const char *url,
                                    uint64_t r, uint32_t coordinator,
                                    loco_manifest *m);

/* Appends to a join POST ("/v1/loco/join?id=ID&url=URL", `text`) what
 * the coordinator checks: its signature by this node's key (kind JOIN,
 * "&seq=N&round=R&key=HEX&sig=HEX") and this node's admission
 * ("&sponsor=HEX&until=R&asig=HEX"). @return the join's number N, which
 * its admission must name (0: the node does not authenticate). */
uint64_t loco_auth_join_query(pulse_loco_coord *n, const char *text,
                              char *dst, size_t cap);

/* The query a signed POST carries ("&seq=N&round=R&key=HEX&sig=HEX",
 * nothing when the node does not authenticate): this node's signature of
 * kind `kind` for round r over `text`, the request's "PATH?id=ID", and a
 * number it never sent before (into *seq when not NULL). */
void loco_auth_sign_query(const pulse_loco_coord *n, pulse_loco_auth_kind kind,
                          uint64_t r, const char *text, char *dst, size_t cap,
                          uint64_t *seq);

/* The number of the join of trainer id this coordinator accepted last (0:
 * none, or the node does not authenticate). */
uint64_t loco_auth_join_seq(pulse_loco_coord *n, uint32_t id);

/* Publishes the admission of joiner id from round r (/v1/loco/join/ID):
 * {"round":R,"id":ID,"seq":N}, N its join's number, signed (kind JOINED,
 * round r); {"round":R} when the node does not authenticate. */
pulse_status loco_auth_put_admission(pulse_loco_coord *n, uint32_t id,
                                     uint64_t r);

/* Reads this node's admission from url (loco_http_wait), signed by the
 * coordinator `coordinator`, naming this node and the join numbered seq
 * (another: a replay, counted). *round: the round it admits from.
 * @return PULSE_OK; PULSE_ERR_CORRUPT when refused or malformed; a fetch
 * error. */
pulse_status loco_auth_get_admission(pulse_loco_coord *n, const char *url,
                                     unsigned timeout_ms, uint32_t coordinator,
                                     uint64_t seq, uint64_t *round);

/* Signed messages other than payloads and manifests
 * (coordinator_auth_msgs.c). Each is the unauthenticated call when the
 * node does not authenticate. */

/* POSTs this node's leave (kind LEAVE, round r, path "/v1/loco/leave") or
 * done (kind DONE, round r, ".../round/R/done") to `coord`. */
void loco_auth_post(pulse_loco_coord *n, const char *coord,
                    pulse_loco_auth_kind kind, uint64_t r, unsigned timeout_ms);

/* GETs url (loco_http_wait, at most cap bytes) and accepts the body as
 * loco_auth_accept_window does. @return PULSE_OK; PULSE_ERR_CORRUPT when
 * refused; a fetch error. */
pulse_status loco_auth_get(pulse_loco_coord *n, const char *url,
                           unsigned timeout_ms, size_t cap,
                           pulse_loco_auth_kind kind, uint64_t floor,
                           uint64_t ceiling, uint32_t id, pulse_bytebuf *body);

/* A membership view from url, signed by trainer `signer` (the node at
 * url) or, LOCO_AUTH_ANY_SIGNER, by any member (a seed's), of a round not
 * older than the one being run; its bytes are added to n->fetched.
 * @return PULSE_OK; PULSE_ERR_CORRUPT when refused or malformed; a fetch
 * error. */
pulse_status loco_auth_get_view(pulse_loco_coord *n, const char *url,
                                unsigned timeout_ms, uint32_t signer,
                                loco_manifest *view);

/* Publishes this node's membership view (kind MEMBERS) and its state
 * (kind STATE, /v1/loco/state/R; older states dropped), signed, for
 * round `round` (the context's). */
pulse_status loco_auth_put_view(pulse_loco_coord *n, uint64_t round,
                                uint32_t coordinator);
pulse_status loco_auth_put_state(pulse_loco_coord *n);

/* UDP: publishes this node's signed chunk list of round r (before the
 * chunks are sent): the SHA-256 of each chunk, then of its end marker. */
pulse_status loco_auth_udp_publish(pulse_loco_coord *n, uint64_t r,
                                   const pulse_buffer *chunks,
                                   uint64_t nchunks, const uint8_t *end,
                                   size_t end_size);
/* UDP: 1 when a datagram (a chunk or an end marker naming a member) of
 * the round being received (r) may go on: its digest is in the sender's
 * signed list of its round; later rounds are checked in their round; older
 * rounds are replays (except the last round's end markers: late copies,
 * let through to be ignored). 0: refused and counted. */
int loco_auth_udp_admit(pulse_loco_coord *n, uint64_t r, const loco_datagram *d);

/* Fault injection for tests (tests/loco/test_auth_node.c,
 * auth_tamper_impl.h): what this node serves or posts of the kinds
 * `kinds` (LOCO_AUTH_TAMPER_KIND of each) is unsigned, forged, replayed
 * (the previous round's body and signature; over UDP the previous round's
 * datagrams) or signed by a stranger's key. With LOCO_AUTH_TAMPER_END, it
 * also sends, after its end markers of round r, one that is not in its
 * signed list (FORGED: a well-formed marker claiming one chunk more), of
 * round r - 2 (REPLAYED), or naming a trainer that is no member
 * (FOREIGN). A tamper of the port (kind PORT) serves it again at once. */
pulse_status loco_auth_tamper(pulse_loco_coord *n, unsigned mode,
                              unsigned kinds);
/* The tamper mode when it covers end markers (LOCO_AUTH_TAMPER_END), else 0. */
unsigned loco_auth_tamper_end(const pulse_loco_coord *n);
/* UDP, under REPLAYED: the chunks to send instead of this round's (the
 * previous round's, kept), else `chunks` itself; keeps this round's. */
const pulse_buffer *loco_auth_udp_outgoing(pulse_loco_coord *n,
                                           const pulse_buffer *chunks,
                                           uint64_t *nchunks);

#endif
