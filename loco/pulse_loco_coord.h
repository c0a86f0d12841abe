/* pulse_loco_coord.h - the coordinator exchange of PULSELoCo: trainers of a
 * known group run rounds in step, and each round's coordinator (the lowest
 * member id) gathers the payloads and publishes the round's manifest
 * (docs/protocols/loco-exchange.md, "Exchange"); contributions travel over HTTP or as datagrams.
 * A pulse_loco_coord is one trainer's member of it, over its pulse_loco
 * context (pulse_loco.h).
 *
 * Thread-safety: a member is used by one thread at a time, the thread of
 * its context. Errors: a non-OK pulse_status, with details in
 * pulse_error_detail(). Nothing here prints to stdout. No libcurl or
 * libmicrohttpd type appears in this header. */
#ifndef PULSE_LOCO_COORD_H
#define PULSE_LOCO_COORD_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_loco.h"
#include "pulse_loco_auth.h" /* pulse_sign_key, pulse_loco_auth_figures */
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A trainer's side of the exchange over HTTP (docs/protocols/loco-exchange.md, "Exchange"):
 * a libmicrohttpd server on 127.0.0.1 (or opts.host; port opts.port, by
 * default 0: the kernel picks) that serves
 * this trainer's round payloads, the state, and, on the round's coordinator
 * (the lowest member id), the round manifest; and libcurl fetches from peers
 * with a per-round deadline. The node borrows the context: both live on one
 * thread; the server thread reads only copies. */
typedef struct pulse_loco_coord pulse_loco_coord;

/* Whether the exchange signs and checks (pulse_loco_coord_opts.auth). */
typedef enum {
  PULSE_LOCO_AUTH_AUTO = 0, /* on when a signing key is given */
  PULSE_LOCO_AUTH_ON = 1,   /* refuse to create without a key */
  PULSE_LOCO_AUTH_OFF = 2   /* nothing signed or checked (comparisons) */
} pulse_loco_auth_mode;

/* How a round's contributions travel (pulse_loco_coord_opts.transport). */
typedef enum {
  PULSE_LOCO_TRANSPORT_HTTP = 0, /* whole payloads through the coordinator */
  PULSE_LOCO_TRANSPORT_UDP = 1   /* chunks as datagrams, all to all */
} pulse_loco_transport;

/* Member options; start from pulse_loco_coord_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_COORD_OPTS_VERSION */
  /* How long the coordinator waits for the members' payloads, counted from
   * when its own is ready; a member late past it is left out of the round. */
  uint32_t deadline_ms;
  /* How long a member waits for the coordinator's manifest (and then for
   * each listed payload) before it gives the round up. */
  uint32_t manifest_timeout_ms;
  /* Consecutive missed rounds after which the coordinator drops a member
   * (it re-joins by itself if it is still alive). */
  uint32_t max_misses;
  /* How the round's contributions travel (docs/protocols/loco-datagrams.md "Exchange over
   * datagrams"): PULSE_LOCO_TRANSPORT_HTTP (whole payloads through the
   * coordinator) or PULSE_LOCO_TRANSPORT_UDP (every trainer sends its
   * chunks to every other as datagrams, no retransmission; the manifest,
   * joins and re-syncs stay on HTTP). Every member of a run must use the
   * same. UDP needs the drop rule. */
  pulse_loco_transport transport;
  /* UDP: the largest datagram (chunk) sent, >= pulse_loco_chunk_bound(). */
  uint32_t max_datagram;
  /* UDP: once every sender has been heard from in a round, the receiver
   * stops waiting after this long without a new datagram (a lost chunk is
   * never resent); deadline_ms caps the whole wait. */
  uint32_t quiet_ms;
  /* UDP, drift: digests cover ranges of this many parameters (a multiple
   * of PULSE_LOCO_CHUNK_CELL). Every round each member compares its range
   * digests with the reference replica's (the coordinator's). After round r
   * with r + 1 a multiple of resync_period it fetches the ranges that
   * differ, measures its drift and copies them; after the others it
   * estimates its drift from the reference's range sketches and keeps its
   * differing ranges (docs/formats/loco-chunks.md "Drift") unless the estimate exceeds
   * drift_budget, which re-syncs them. */
  uint32_t resync_range;
  uint32_t resync_period;
  double drift_budget;
  /* The IPv4 address this node listens on, HTTP and datagrams ("A.B.C.D";
   * NULL: 127.0.0.1): an address of this machine its peers reach (trainers
   * on other hosts or network namespaces). Borrowed during create. */
  const char *host;
  /* The TCP port of its HTTP server on host (0, the default: the kernel
   * picks a free one; pulse_loco_coord_url says which). A port that is
   * taken fails the create (PULSE_ERR_IO). */
  uint16_t port;
  /* UDP transport: the port of its datagram socket on host (0, the
   * default: the kernel picks; pulse_loco_coord_udp_port says which); must
   * be 0 under HTTP. A port that is taken fails the create (PULSE_ERR_IO). */
  uint16_t udp_port;
  /* Authentication (pulse_loco_auth.h, docs/protocols/loco-exchange.md "Authentication"). This trainer's Ed25519 key signs its payloads,
   * manifests (and UDP chunk lists); borrowed, must outlive the node. NULL:
   * no key. */
  const pulse_sign_key *sign_key;
  /* The pinned members: (trainer id, public key) pairs (copied). Every
   * founding member must be here (or be this node); a joiner not here
   * needs an admission. */
  const pulse_loco_member_key *member_keys;
  size_t member_key_count;
  /* PULSE_LOCO_AUTH_AUTO (on when sign_key is given), _ON (refuse to
   * create without a key) or _OFF (nothing signed or checked, even with a
   * key: for comparisons). Every member of a run must agree. */
  pulse_loco_auth_mode auth;
  /* A joiner's admission by a member (pulse_loco_coord_admit), presented
   * when it joins; NULL when its key is pinned. Copied. */
  const pulse_loco_admission *admission;
  /* Simulated loss and measurement probes for tests and benchmarks
   * (pulse_loco_testing.h, a header that is not installed); NULL in
   * production. Copied at create. */
  const struct pulse_loco_test_hooks *test_hooks;
} pulse_loco_coord_opts;

#define PULSE_LOCO_COORD_OPTS_VERSION 5u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_loco_coord_opts_init(pulse_loco_coord_opts *opts);

/** Parses "http" or "udp" into a PULSE_LOCO_TRANSPORT_* value.
 * @return PULSE_OK or PULSE_ERR_ARG. */
pulse_status pulse_loco_transport_parse(const char *name,
                                        pulse_loco_transport *out);

/** Starts the node's HTTP server for ctx (borrowed; must outlive the node)
 * on opts->host (127.0.0.1 by default) and opts->port (0: chosen by the
 * kernel), and its datagram socket on the same address under the UDP
 * transport (opts->udp_port, 0: chosen by the kernel).
 * @return PULSE_OK; PULSE_ERR_ARG (options); PULSE_ERR_VERSION;
 * PULSE_ERR_IO (the server could not start: a port taken, an address not
 * of this machine); PULSE_ERR_NOMEM. */
pulse_status pulse_loco_coord_create(const pulse_loco_coord_opts *opts,
                                    pulse_loco *ctx, pulse_loco_coord **out);

/** Stops the server and frees the node (not the context). NULL is fine. */
void pulse_loco_coord_free(pulse_loco_coord *node);

/** This node's base URL, "http://HOST:PORT" (valid for its life). */
const char *pulse_loco_coord_url(const pulse_loco_coord *node);

/** This node's datagram port (UDP transport, on its host), 0 under HTTP.
 * Peers learn it from GET /v1/loco/udp. */
uint16_t pulse_loco_coord_udp_port(const pulse_loco_coord *node);

/** Sets the founding members of the run (this node among them), all
 * starting at the context's current round with the same theta_g. */
pulse_status pulse_loco_coord_start(pulse_loco_coord *node,
                                   const pulse_loco_member *members,
                                   size_t count);

/** Admits the key `newcomer` (a trainer that will join, with this
 * admission in its options) on behalf of this member, valid until the
 * group passes round `until_round`. The node must authenticate (a key).
 * @return PULSE_OK; PULSE_ERR_ARG (no key, NULL); PULSE_ERR_INTERNAL. */
pulse_status pulse_loco_coord_admit(const pulse_loco_coord *node,
                                   const uint8_t newcomer[PULSE_KEY_BYTES],
                                   uint64_t until_round,
                                   pulse_loco_admission *out);

/** Joins a running group through any member's URL: registers with the
 * coordinator, waits until a manifest admits this node, and imports the
 * state of the round it starts at (theta_g, b, round; e is kept), setting
 * theta_r (P floats) = theta_g. Waits at most timeout_ms.
 * @return PULSE_OK; PULSE_ERR_IO (no answer in time); a state error. */
pulse_status pulse_loco_coord_join(pulse_loco_coord *node, const char *seed_url,
                                  float *theta_r, uint32_t timeout_ms);

/* What one pulse_loco_coord_step did. */
typedef struct {
  uint64_t round;
  uint32_t members;      /* of this round */
  uint32_t contributors; /* payloads averaged */
  uint32_t coordinator;  /* id */
  int self_included;
  int resynced;  /* could not get every payload: state re-imported */
  uint64_t sent; /* entries in this node's payload */
  uint64_t payload_bytes;
  /* Bytes received this step: the HTTP bodies it downloaded and, under
   * UDP, the datagrams it took from its socket (whatever became of them). */
  uint64_t fetched_bytes;
  int rejoined; /* this step only joined again (the node had been dropped
                   after missed rounds): no round ran; the context is at
                   the admission round */
  /* UDP transport only. */
  uint64_t datagrams_sent;    /* chunks handed to the socket, all receivers */
  uint64_t datagrams_dropped; /* lost by the simulated datagram_drop */
  uint64_t datagrams_received;
  uint64_t datagrams_refused_source; /* not from the claimed sender's socket,
                                        or cut by the receive buffer */
  uint64_t datagrams_early; /* of a later round, kept for it */
  pulse_loco_inbox_figures chunks; /* what this round's inbox took and refused */
  double drift; /* ||theta_g - reference|| / ||reference|| after the round,
                   before any re-sync (0 on the reference) */
  uint32_t drift_ranges;    /* ranges whose digest differed */
  uint32_t resynced_ranges; /* ranges copied from the reference */
  uint64_t resync_bytes;    /* HTTP bodies of the drift check and re-sync */
  uint64_t wait_ms;         /* time spent receiving the round's chunks */
  /* Authentication: what this step's checks accepted and
   * refused (payloads, manifests and UDP chunk lists, by reason), and the
   * datagrams refused for want of a place in their sender's signed chunk
   * list (or of an older round). A refused contribution is left out. */
  pulse_loco_auth_figures auth;
  uint64_t datagrams_refused_auth;
  /* The bytes this trainer received this step only because it
   * authenticates (docs/protocols/loco-exchange.md "Authentication", sizes): the signature
   * headers of every signed answer it fetched, the signed query values of
   * the POSTs it answered, its senders' chunk lists and the re-sync sums.
   * 0 when it does not authenticate. */
  uint64_t auth_bytes;
  /* Bytes this node put on the wire since its previous step returned (the
   * first step: since create): the bodies of the HTTP answers its server
   * completed (payloads, relays, manifests, states, views, the answers to
   * POSTs and the 404s of polls; /metrics left out; its own POSTs carry no
   * body) and under UDP the datagrams its socket took (chunks and end
   * markers to every receiver; not those the simulated datagram_drop
   * withheld or the path refused). An answer still on its way when the
   * step returns counts in the next step; summed over a run's steps it is
   * everything the node sent but what it served after its last step (to a
   * linger, a late joiner). Counted where the bytes leave, not from
   * payload sizes. */
  uint64_t bytes_sent;
} pulse_loco_coord_step_figures;

/** One outer step over HTTP: prepare, publish, exchange (coordinator:
 * gather with the deadline and publish the manifest; others: fetch the
 * manifest and the listed payloads), finish, theta_r = theta_g. With
 * PULSE_LOCO_LEAVING in `flags` this is the node's last round: it flushes its residual,
 * tells the coordinator, and returns once the others no longer need it.
 * A node the manifest no longer lists (dropped after missed rounds) joins
 * again by itself, in its next step (which then runs no round and says
 * `rejoined`).
 * @return PULSE_OK; PULSE_ERR_IO (no coordinator, timeouts); a context
 * error. */
pulse_status pulse_loco_coord_step(pulse_loco_coord *node, float *theta_r,
                                  uint64_t samples, uint32_t flags,
                                  pulse_loco_coord_step_figures *info);

/** Before freeing a node at the end of a run: when this node coordinated
 * the last round, waits until every member of the next round acknowledged
 * it (they fetch its manifest, relays and state), at most timeout_ms.
 * Returns at once otherwise: a member that did not coordinate learns
 * nothing of the others' progress, and over datagrams with authentication
 * the others still fetch its signed chunk list of the last round (docs/formats/loco-payload.md
 * "Exchange over datagrams"), so the caller keeps every node up until all
 * trainers of the run are done (pulse-bench loco does: its parent says
 * when); freed early, a slower trainer refuses that member's chunks of the
 * last round. A leaving node does this inside its last step.
 * @return PULSE_OK, or PULSE_ERR_IO when some member did not acknowledge. */
pulse_status pulse_loco_coord_linger(pulse_loco_coord *node, uint32_t timeout_ms);

/** Current members (of the next round) into members (capacity max);
 * *count gets the number of members (may exceed max). */
void pulse_loco_coord_members(const pulse_loco_coord *node,
                             pulse_loco_member *members, size_t max,
                             size_t *count);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_COORD_H */
