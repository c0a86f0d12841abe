/* pulse_loco_collab.h - PULSELoCo as an open collaboration (
 * docs/protocols/loco-collaboration.md "Collaboration"): rounds end at a target global batch, peers
 * of any speed join and leave at any round, and no peer is special.
 *
 * A collaboration peer wraps a pulse_loco context (borrowed; created with
 * PULSE_LOCO_RULE_KEEP: a payload left out of a round stays in its
 * sender's error feedback) and an HTTP server on 127.0.0.1 (or opts.host;
 * port opts.port, 0 by default: the kernel picks).
 * One round, on every member:
 *
 *   accumulate   before each local step of b samples the peer claims b
 *                from the round's writer; the writer grants while the
 *                samples granted in the round are below the target T, so
 *                the round's total ends in [T, T + the largest step)
 *   contribute   once refused, the peer builds its payload over the samples
 *                it did (the payload's count is what counts), serves it and
 *                tells the writer it is ready
 *   close        the writer fetches the ready payloads, checks each (a
 *                sample count other than what it granted, another round, a
 *                non-member: dropped) and publishes the manifest
 *                (contributors and the members of the next round); every
 *                member finishes with exactly that set
 *
 * The writer of round r is W(r, k) = S[(r + k) mod |S|], S the members in
 * increasing id; k starts at 0 and a peer moves to k + 1 when W(r, k) stops
 * answering (connection refused or no answer within claim_timeout_ms). A
 * writer taking over first adopts a manifest of r that a member already
 * got from the dead one (each member re-serves what it used); else it
 * counts what each member says it did as granted and goes on to T (that
 * round may pass T + the largest step: the one round a dead writer costs).
 * Joins go through any member; a member that
 * is not ready within round_timeout_ms of the writer's own readiness is
 * left out of the next round (dead peers).
 *
 * Thread-safety: a peer and its context are used by one thread; the server
 * thread reads copies. Errors: a non-OK pulse_status with
 * pulse_error_detail(). Nothing here prints. */
#ifndef PULSE_LOCO_COLLAB_H
#define PULSE_LOCO_COLLAB_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_loco.h"
#include "pulse_loco_auth.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_loco_collab pulse_loco_collab;

/* Which partitioned ranges are recomputed by another member
 * (pulse_loco_collab_opts.partition_check). */
typedef enum {
  PULSE_LOCO_COLLAB_CHECK_ROTATING = 0, /* one a round, in rotation */
  PULSE_LOCO_COLLAB_CHECK_FULL = 1,     /* every range every round */
  PULSE_LOCO_COLLAB_CHECK_RECEIPTS = 2  /* none: receipts only */
} pulse_loco_collab_check;

/* Peer options; start from pulse_loco_collab_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_COLLAB_OPTS_VERSION */
  uint64_t target_batch;   /* T >= 1: samples of a round, all peers */
  /* A writer that refuses connections (or does not answer) this long is
   * taken for dead and the next by the rule takes over. */
  uint32_t claim_timeout_ms;
  /* How long a writer waits, once it is ready itself, for the other
   * members to be ready (a member in a local step finishes it first). */
  uint32_t round_timeout_ms;
  /* The IPv4 address to listen on (NULL: 127.0.0.1). Borrowed. */
  const char *host;
  /* The TCP port to listen on (0, the default: the kernel picks a free
   * one; pulse_loco_collab_url says which). A port that is taken fails the
   * create (PULSE_ERR_IO); a client-mode peer (client_of) listens nowhere
   * and must leave it 0. */
  uint16_t port;
  /* 0: every member fetches every listed payload and finishes (all-to-all).
   * 1: the members reduce disjoint parameter ranges and fetch the reduced
   * ranges back (pulse_loco_partition.h, docs/protocols/loco-collaboration.md "Partitioned
   * averaging"): the same theta_g bit for bit, near 2-3x its own payload
   * in and out per member as the collaboration grows. Every member must
   * use the same setting. A member whose partitioned exchange fails (a
   * peer killed mid-exchange) imports the state of a member that
   * finished it, or, when none did, finishes all-to-all over the
   * contributors that answered (docs/protocols/loco-collaboration.md "Collaboration"). The mean
   * gate is the context's (pulse_loco_opts.gate_mean), either way; every
   * member must have the same: partitioned, the reduced ranges of another
   * setting are refused. Set it with partitioned averaging (pulse-bench
   * does by default): the owners then write only the means that move a
   * weight or that 2 peers sent, about 2.7x a member's own payload in
   * per round at 8 members instead of 3.4x (docs/benchmarks/collaboration.md);
   * all-to-all it only makes the payloads larger. */
  int partitioned;
  /* Client mode (a peer that cannot accept connections, behind NAT): the
   * URL "http://A.B.C.D:PORT" of a serving member that hosts it; NULL: this
   * peer serves. A client listens nowhere: its URL (pulse_loco_collab_url)
   * is "HOST/v1/hosted/ID", where its host serves what it uploads (its
   * payload of each round) to the others, and it fetches everything else
   * itself. It is never a round's writer (the rule skips hosted members).
   * Its host gone, the round goes on without it and the peer's next call
   * rejoins through another serving member, which hosts it from then on.
   * Partitioned, it owns no range and publishes no verdict or outcome:
   * the owners reduce its range out of its uploaded payload, fetched from
   * its host, and it fetches the reduced ranges and verdicts like any
   * member (docs/protocols/loco-collaboration.md "Collaboration"). Borrowed. */
  const char *client_of;
  /* Partitioned: how the owners' reductions are checked besides each
   * sender's receipts (docs/protocols/loco-collaboration.md "Partitioned averaging"; every member
   * the same). PULSE_LOCO_COLLAB_CHECK_ROTATING (0, the default): one
   * range recomputed by another member per round, in rotation, so a wrong
   * average (right inputs, wrong arithmetic) is caught within as many
   * rounds as there are contributors but may reach the weights before;
   * FULL: every range every round (it never does; about 0.9x a payload
   * more in per member and round); RECEIPTS: none recomputed. */
  pulse_loco_collab_check partition_check;
  /* Partitioned: 0 (the default) sizes each member's range in proportion
   * to its measured download rate, which it reports to the writer and the
   * manifest lists (docs/protocols/loco-collaboration.md "Collaboration", range sizes); non-zero:
   * this peer reports none, and a manifest listing none gives equal
   * ranges (every member the same, for comparisons). */
  int equal_ranges;
  /* Authentication, its first part (docs/protocols/loco-exchange.md "Authentication",
   * "Collaboration"): with a key, this peer signs the membership views and
   * the states it serves, the manifests it writes, its payloads and its
   * partitioned slices, reduced ranges and verdicts, and checks those it
   * loads (a join, a catch-up, a round's manifest, as a writer the
   * payloads, the partitioned blobs) against the members' keys before it
   * takes anything from them: an unsigned, forged, replayed (another
   * round's) or foreign one is refused and counted
   * (pulse_loco_auth_refused_total at /metrics). Views and states: any
   * member's signature holds (every member that finished a round holds the
   * same state); anything else: the key pinned for the trainer it comes
   * from. Claims, readinesses and acknowledgements are signed by their
   * member, checked by the writer (refused: 401), and the writer's answers
   * signed by it. NULL: none of it; every member must agree. Borrowed,
   * must outlive the peer. */
  const pulse_sign_key *sign_key;
  /* The members' keys (copied): a peer checks what it loads against
   * these and its own. A joiner's key is here at the members, or the
   * joiner brings an admission (below). A joiner pins the keys of the
   * members it checks (the founders', or at least its sponsor's and its
   * seed's, as a joiner of the coordinator exchange does); members
   * admitted since are learned from their key blobs. */
  const pulse_loco_member_key *member_keys;
  size_t member_key_count;
  /* A joiner whose key is pinned nowhere: a member's admission of it
   * (pulse_loco_collab_admit), sent with its signed join and served in its
   * key blob (GET /v1/loco/key). The member that takes the join and the
   * writer that lists it check it (the sponsor a member of the current
   * round, the signature, the round not past); the others learn the key
   * from the blob when they first meet the new member's signed bodies and
   * check the admission themselves (docs/protocols/loco-exchange.md
   * "Authentication"). NULL: none. Copied; must be for sign_key's public
   * key (PULSE_ERR_ARG otherwise). */
  const pulse_loco_admission *admission;
} pulse_loco_collab_opts;

#define PULSE_LOCO_COLLAB_OPTS_VERSION 7u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_loco_collab_opts_init(pulse_loco_collab_opts *opts);

/** Starts the peer's server for ctx (borrowed, must outlive the peer; its
 * rule must be PULSE_LOCO_RULE_KEEP); a client-mode peer (opts.client_of)
 * starts none. Every serving peer hosts the client-mode members that name
 * it (docs/protocols/loco-collaboration.md "Collaboration").
 * @return PULSE_OK; PULSE_ERR_ARG (options, rule, client_of not a URL or
 * with partitioned or a port); PULSE_ERR_VERSION; PULSE_ERR_IO (cannot
 * listen: the port is taken, the address is not this machine's);
 * PULSE_ERR_NOMEM. */
pulse_status pulse_loco_collab_create(const pulse_loco_collab_opts *opts,
                                      pulse_loco *ctx,
                                      pulse_loco_collab **out);

/** Stops the server, frees the peer (not the context). NULL is fine. */
void pulse_loco_collab_free(pulse_loco_collab *c);

/** "http://HOST:PORT" of this peer (valid until its next round; a
 * client-mode peer's is "HOST/v1/hosted/ID" at its host, which changes
 * when it moves to another host). */
const char *pulse_loco_collab_url(const pulse_loco_collab *c);

/** What this peer did as a host of client-mode members: uploads stored and
 * uploads refused (a non-member, a client hosted elsewhere, a round that is
 * over, a body too large, cut short or that does not decode as that
 * client's payload of that round). Either may be NULL. */
void pulse_loco_collab_hosted(const pulse_loco_collab *c, uint64_t *stored,
                              uint64_t *refused);

/** Sets the founding members (this peer among them), all at the context's
 * round with the same theta_g. */
pulse_status pulse_loco_collab_start(pulse_loco_collab *c,
                                     const pulse_loco_member *members,
                                     size_t count);

/** Admits the key `newcomer` (a peer that will join with this admission
 * in its options, its key pinned nowhere) on behalf of this member, valid
 * while the collaboration has not passed round `until_round`. The peer
 * must authenticate (sign_key). The same admission as the coordinator
 * exchange's (pulse_loco_coord_admit, the pulse-loco-admit/1 text).
 * @return PULSE_OK; PULSE_ERR_ARG (no key, NULL); PULSE_ERR_INTERNAL. */
pulse_status pulse_loco_collab_admit(const pulse_loco_collab *c,
                                     const uint8_t newcomer[PULSE_KEY_BYTES],
                                     uint64_t until_round,
                                     pulse_loco_admission *out);

/** Joins through any member at seed_url (a client-mode member's URL: through
 * its host): asks every member to admit it,
 * waits until a manifest lists it, then imports the state of the round it
 * contributes from (theta_g, momentum, round; digests checked) from the
 * seed, theta_r (P floats) = theta_g. e is kept.
 * @return PULSE_OK; PULSE_ERR_IO (not admitted within timeout_ms); a state
 * error. */
pulse_status pulse_loco_collab_join(pulse_loco_collab *c, const char *seed_url,
                                    float *theta_r, uint32_t timeout_ms);

/** Imports the state of `round` served by the peer at url (what a joiner
 * does once admitted).
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (that peer no longer, or not yet,
 * serves that round's state: the detail names the round it is at);
 * PULSE_ERR_IO; a pulse_loco_state_import error. */
pulse_status pulse_loco_collab_import(pulse_loco_collab *c, const char *url,
                                      uint64_t round, float *theta_r,
                                      uint32_t timeout_ms);

/* One local step of `samples` samples on theta_r (P floats), the user's
 * inner optimizer. Returns 0 to go on, non-zero to end the round with an
 * error. */
typedef int (*pulse_loco_collab_step_fn)(void *user, float *theta_r,
                                         uint64_t samples);

/* What one round did. */
typedef struct {
  uint64_t round;
  uint32_t members;      /* of this round */
  uint32_t contributors; /* payloads averaged */
  uint32_t writer;       /* id of the peer whose manifest closed it */
  uint32_t takeovers;    /* writers found dead this round (k) */
  uint64_t samples;      /* the round's total over its contributors */
  uint64_t own_samples;  /* this peer's, in its payload (0: none) */
  uint64_t steps;        /* local steps this peer ran */
  uint64_t max_step;     /* the largest granted step, all peers */
  int self_included;
  int resynced; /* the state of round + 1 was imported (no payload of its
                   own, or not every payload) */
  int dropped;  /* the next round does not list this peer: it joins again
                   by itself in its next call (which then only joins) */
  int left;     /* LEAVING and the flush went out: the peer is gone */
  int partitioned; /* finished by the partitioned exchange (opts) */
  uint64_t bytes_in;  /* HTTP bodies this peer downloaded this round */
  uint64_t bytes_out; /* HTTP bodies its server answered this round */
  uint64_t payload_bytes; /* its own payload's size (0: none) */
  uint64_t busy_ms;   /* in local steps */
  uint64_t wall_ms;   /* the whole call */
  /* Bytes received this call only because the peer authenticates: the
   * signature headers of the signed bodies and answers it checked (views,
   * states, manifests, payloads, partitioned blobs, grants: 260 bytes and
   * the round's digits each). 0 without a key. */
  uint64_t auth_bytes;
  /* Entries in its own payload (0: none), as the coordinator exchange's
   * pulse_loco_coord_step_figures.sent: what its gate let through this
   * round (sent / the parameter count is its density). */
  uint64_t sent;
} pulse_loco_collab_figures;

/** Runs round pulse_loco_round(ctx): claims steps of step_samples (>= 1)
 * samples from the writer and runs each with step(user, theta_r, n) while
 * granted, contributes, closes (writer) or follows, finishes; theta_r =
 * theta_g. With PULSE_LOCO_LEAVING the peer flushes its residual in
 * this round (when it did at least one step; else info.left stays 0 and
 * the caller tries again next round) and, when it wrote the round, stays
 * until the members of the next round have what they need.
 * @return PULSE_OK; PULSE_ERR_IO (no writer answered, timeouts); a context
 * error; PULSE_ERR_INTERNAL when step() failed. */
pulse_status pulse_loco_collab_round(pulse_loco_collab *c, float *theta_r,
                                     uint64_t step_samples,
                                     pulse_loco_collab_step_fn step,
                                     void *user, uint32_t flags, /* PULSE_LOCO_LEAVING */
                                     pulse_loco_collab_figures *info);

/** Members of the next round (capacity max); *count gets how many. */
void pulse_loco_collab_members(const pulse_loco_collab *c,
                               pulse_loco_member *members, size_t max,
                               size_t *count);

/** The writer of round `round` at rank k among members (increasing id;
 * the rule every peer computes): S[(round + k) % |S|].id, S the serving
 * members (client-mode ones left out); UINT32_MAX when there is none. */
uint32_t pulse_loco_collab_writer(const pulse_loco_member *members,
                                  size_t count, uint64_t round, uint32_t k);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_COLLAB_H */
