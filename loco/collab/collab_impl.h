/* collab_impl.h - private to loco/: the collaboration peer
 * (pulse_loco_collab.h, docs/protocols/loco-collaboration.md "Collaboration"): its fields, shared by
 * the peer's setup, publishing and client mode (collab.c), the writer's
 * table and the POST routes (collab_writer.c), and one round: the round
 * and accumulating (collab_round.c), the close (collab_close.c) and its
 * commit step (collab_commit.c), the all-to-all finish (collab_fetch.c), the partitioned finish, outcomes,
 * settling and catching up (collab_finish.c). */
#ifndef PULSE_LOCO_COLLAB_IMPL_H
#define PULSE_LOCO_COLLAB_IMPL_H

#include <pthread.h>

#include "auth_tamper_impl.h"
#include "peer_http_impl.h"
#include "loco_impl.h"
#include "manifest_impl.h"
#include "payload_impl.h"
#include "pulse_loco_collab.h"
#include "status_impl.h"

/* Members a peer notes dead in one round (collab_commit.c). */
#define LOCO_PX_DEAD_MAX 64u

/* Claim answers (HTTP statuses of POST /v1/collab/claim/...). */
#define COLLAB_GRANTED 200u
#define COLLAB_FULL 202u      /* the round reached its target: stop */
#define COLLAB_NOT_YET 503u   /* the writer is not at that round yet */
#define COLLAB_PAST 409u      /* the writer is past that round */
#define COLLAB_NOT_MEMBER 403u
#define COLLAB_NOT_WRITER 421u

/* What the writer of a round knows of one member (a progress record). */
typedef struct {
  uint32_t id;
  int contacted;          /* claimed or said ready this round */
  int ready;              /* its payload is served (or it has none) */
  int leaving;            /* its payload flushes its residual */
  uint64_t granted;       /* samples granted by this writer */
  uint64_t done;          /* samples it says it did */
  uint64_t ready_samples; /* the count it says its payload carries */
  uint64_t rate_milli;    /* its samples per second, times 1000 */
  uint64_t bandwidth;     /* its download rate (bytes/s) with its
                             readiness; 0: not measured */
  uint32_t accepted_k1;   /* 1 + the rank at which it accepted this
                             writer's proposal (collab_commit.c); 0: none */
} collab_record;

/* A joiner waiting for admission. */
typedef struct {
  uint32_t id;
  char url[64];
} collab_pending;

struct pulse_loco_collab {
  pulse_loco_collab_opts opts;
  pulse_loco *ctx;
  loco_server *srv;
  char url[64];
  uint32_t id;
  uint64_t fetched; /* bodies downloaded this round */
  uint64_t pushed;  /* client mode: bodies uploaded this round */
  /* This peer's download rate in bytes/s, smoothed over rounds (an EWMA
   * of each round's per-transfer measure, loco_http_rate_take); 0 until
   * a round moved enough bytes. Reported with its readiness. */
  uint64_t bandwidth;
  /* Client mode: the host's URL ("" when this peer serves). */
  char host_url[64];
  /* Hosting: uploads stored and refused (under lock). */
  uint64_t hosted_stored, hosted_refused;
  int dropped;      /* the last manifest did not list this peer */
  char rejoin_url[64];
  /* Written by the main thread under lock, read by the server thread. */
  pthread_mutex_t lock;
  pulse_loco_member *members; /* of the round the context is at, by id */
  size_t nmembers;
  uint64_t cur_round; /* the round this peer runs (its context's) */
  /* The writer's table of round table_round, for writer rank table_k;
   * `closed`: no more grants (target reached or a taken-over round). */
  int table_open;
  uint64_t table_round;
  uint32_t table_k;
  int closed;
  collab_record *rec; /* members of table_round, in their order */
  size_t nrec;
  uint64_t total;    /* samples granted in the table's round */
  uint64_t max_step; /* largest step granted in it */
  collab_pending *pending;
  size_t npending;
  /* Authentication (collab_auth.c; NULL: off): the handle, and refusals
   * decided here (a body of a later round: forged), under lock. */
  pulse_loco_auth *auth;
  uint64_t auth_forged_extra, auth_foreign_extra;
  /* The members' keys by id (copied), and the keys learned since: a
   * joiner admitted here, a member's key read from its key blob. Under
   * lock (the server thread adds and reads them too). auth_until: for
   * each, the last round its admission lets it be listed in (UINT64_MAX:
   * pinned, or learned from a member that is listed already). */
  pulse_loco_member_key *auth_pins;
  uint64_t *auth_until;
  size_t auth_npins, auth_cappins;
  /* This peer's admission (opts.admission), sent with its joins and
   * served in its key blob. */
  int has_admission;
  pulse_loco_admission admission;
  uint64_t auth_joins_refused; /* under lock */
  /* The members of the last signed view this peer accepted (a joiner's,
   * before it runs a round), under lock: where it learns the key of a
   * member that claims at it before it holds the members of a round. */
  pulse_loco_member *auth_view;
  size_t auth_nview;
  loco_tamper tamper; /* fault injection (tests, collab_auth_tamper) */
  /* The commit step (collab_commit.c), this peer as an acceptor of round
   * px_round: the highest rank it sent a message at (a promise: it accepts
   * no proposal of a lower rank), and the rank of the proposal it accepted
   * last (px_accepted 0: none). Main thread only. */
  uint64_t px_round;
  uint32_t px_promised;
  int px_accepted;
  uint32_t px_rank;
  /* The proposal accepted last: its manifest's bytes and its writer's
   * signature, served again with every new promise. */
  pulse_bytebuf px_raw;
  loco_sig px_wsig;
  /* Members of px_round found dead by this peer (their port refuses
   * connections): not counted among the acceptors. */
  uint32_t px_dead[LOCO_PX_DEAD_MAX];
  size_t px_ndead;
  uint64_t auth_bytes; /* signature headers received, main thread */
  uint64_t auth_refused_kind[PULSE_LOCO_AUTH_KINDS];
  /* Acknowledgements of round ends ("done"), the latest ones. */
  struct {
    uint64_t round;
    uint32_t id;
  } acks[256];
  size_t nacks;
};

/* Publishing (collab.c): the view of the next round's members
 * (/v1/loco/members), the context's state (/v1/loco/state/ROUND), this
 * peer's progress record (/v1/loco/progress); the members of the
 * context's round (under lock; clears the pending joins they list). */
pulse_status collab_publish_view(pulse_loco_collab *c);
pulse_status collab_publish_state(pulse_loco_collab *c);
void collab_publish_own_progress(pulse_loco_collab *c, uint64_t r,
                                 uint64_t done, uint64_t busy_ms);
void collab_set_members(pulse_loco_collab *c, const pulse_loco_member *m,
                        size_t count);

/* Authentication (collab_auth.c): views and states signed by the peer
 * that serves them, checked before use. Each is the unauthenticated call
 * when the peer has no key. */
pulse_status collab_auth_start(pulse_loco_collab *c,
                               const pulse_loco_collab_opts *opts);
void collab_auth_stop(pulse_loco_collab *c);
/* Publishes a body of kind `kind` for round r, signed. */
pulse_status collab_auth_put(pulse_loco_collab *c, const char *path,
                             pulse_loco_auth_kind kind, uint64_t r,
                             const void *data, size_t size);
/* collab_auth_put for a caller that holds c->lock (the writer's table). */
pulse_status collab_auth_put_locked(pulse_loco_collab *c, const char *path,
                                    pulse_loco_auth_kind kind, uint64_t r,
                                    const void *data, size_t size);
/* A contributor's partitioned outcome of round r (/v1/loco/round/R/outcome):
 * "finished" or "failed", with a key "WORD N" signed (kind OUTCOME, N a
 * number never served before: an earlier word served again is a
 * replay); and the word read from contributor id's answer t, checked: 2
 * finished, 1 failed, 0 none (refused, counted, or malformed). */
pulse_status collab_auth_put_outcome(pulse_loco_collab *c, uint64_t r,
                                     int finished);
int collab_auth_outcome(pulse_loco_collab *c, uint64_t r, uint32_t id,
                        const loco_fetch *t);
/* 1 when a body that came with `sig` (from the peer at base; NULL: not
 * known) is signed by a member's key for a
 * round in [floor, ceiling] (below: a replay, above: forged), not older
 * than one of its kind accepted from that member; 0 when refused (counted,
 * logged). A signer this peer does not know yet, when base is a member
 * of the current round: its key blob is read there and its admission
 * checked first (learned, as for a body of a named trainer). Always 1
 * without a key. */
int collab_auth_accept(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                       uint64_t floor, uint64_t ceiling, const char *base,
                       const loco_sig *sig, const void *data, size_t size);
/* collab_auth_accept for a body of round r that trainer `id` must have
 * signed (a manifest, by the writer it names): another member's
 * signature is forged, a key not pinned for that id foreign. The key of
 * a member of the current round that was admitted after this peer started
 * is learned from its key blob (GET /v1/loco/key) when its admission
 * holds (the sponsor a member, the signature verifies). */
int collab_auth_accept_by(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                          uint64_t r, uint32_t id, const loco_sig *sig,
                          const void *data, size_t size);
/* The same two for a body known by its size and SHA-256 (a payload whose
 * header only was read, its digest from its server's answer). */
int collab_auth_accept_digest(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                              uint64_t floor, uint64_t ceiling,
                              const loco_sig *sig, uint64_t size,
                              const uint8_t sha[32]);
int collab_auth_accept_by_digest(pulse_loco_collab *c,
                                 pulse_loco_auth_kind kind, uint64_t r,
                                 uint32_t id, const loco_sig *sig,
                                 uint64_t size, const uint8_t sha[32]);
/* The partitioned exchange's hooks (loco_partition_in.sign and .accept,
 * user the peer). */
int collab_auth_sign_blob(void *user, pulse_loco_auth_kind kind,
                          uint64_t round, const char *path, const void *data,
                          size_t size, loco_sig *sig);
int collab_auth_accept_blob(void *user, pulse_loco_auth_kind kind,
                            uint64_t round, uint32_t id, const char *path,
                            const loco_sig *sig, const void *data,
                            size_t size);
/* Notes the members of a signed view this peer accepted (auth_view). */
void collab_auth_note_view(pulse_loco_collab *c, const loco_manifest *view);
/* Publishes this peer's key blob (GET /v1/loco/key, with its admission
 * when it has one), once its server runs. */
pulse_status collab_auth_publish_key(pulse_loco_collab *c);
/* The join query's signature and admission ("&seq=N&round=R&key=HEX&sig=HEX
 * [&sponsor=HEX&until=R&asig=HEX]") after text "/v1/loco/join?id=ID&url=U". */
void collab_auth_join_query(pulse_loco_collab *c, const char *text, char *dst,
                            size_t cap);
/* Members listed by a manifest or view this peer took (m, count): an
 * admitted key among them is bound for good from now on (it rejoins as a
 * pinned one would). Caller holds lock. */
void collab_auth_listed_locked(pulse_loco_collab *c,
                               const pulse_loco_member *m, size_t count);
/* Whether pending joiner id may be listed in round r: its key pinned, or
 * admitted here by an admission valid through r (always without a key).
 * Caller holds lock. */
int collab_auth_listable_locked(const pulse_loco_collab *c, uint32_t id,
                                uint64_t r);
/* Claims, readinesses and acknowledgements (POSTs to a writer) are signed
 * by their member over "PATH?id=ID&seq=N" (query "&seq=N&round=R&key=HEX
 * &sig=HEX", written by collab_auth_query, which returns N, a number
 * never sent before; nothing without a key); the writer's answer to a
 * claim or readiness is signed by it over "PATH?id=ID&seq=N\nstatus S"
 * (in the answer's X-Pulse-Loco-* headers). */
uint64_t collab_auth_query(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                           uint64_t r, const char *text, char *dst,
                           size_t cap);
/* The server's POST gate (loco_server_set_gate): refuses (401, counted) a
 * claim, readiness or acknowledgement not signed by the key pinned for
 * its id. */
unsigned collab_auth_gate(void *user, const char *path,
                          const char *(*query)(void *rq, const char *key),
                          void *rq, char *reply, size_t cap);
/* The server's answer signer (loco_server_set_reply_signer): the answer
 * to a claim or readiness. */
void collab_auth_sign_reply(void *user, const char *path, const char *id,
                            unsigned status, loco_sig *sig);
/* Whether a writer's answer (status, its signature) to the request `text`
 * of round r is writer w's, signed (always without a key). */
int collab_auth_grant_ok(pulse_loco_collab *c, uint64_t r, uint32_t w,
                         const char *text, uint64_t seq, unsigned status,
                         const loco_sig *sig);
/* A claim's answer refused by authentication (not a writer's status). */
#define COLLAB_UNVERIFIED 401u

/* A client-mode peer's upload of its payload carries its signature after
 * the payload: u64 LE round, the 32-byte key, the 64-byte signature. */
#define COLLAB_SIG_TRAILER 104u
/* The payload of round r signed into trailer (COLLAB_SIG_TRAILER bytes);
 * 0 when the peer has no key (nothing written). */
int collab_auth_trailer(pulse_loco_collab *c, uint64_t r, const void *data,
                        size_t size, uint8_t trailer[COLLAB_SIG_TRAILER]);
/* Fault injection (tests/loco/test_collab_auth*.c, auth_tamper_impl.h):
 * what this peer signs of the kinds `kinds` (LOCO_AUTH_TAMPER_KIND bits)
 * gets fault `mode` (LOCO_AUTH_TAMPER_*): unsigned, forged, replayed
 * (the previous round's body of that kind with its signature; a blob's or
 * a POST's is not the signer's to replay) or a stranger's. */
pulse_status collab_auth_tamper(pulse_loco_collab *c, unsigned mode,
                                unsigned kinds);
/* The counters, for /metrics (server thread). */
void collab_auth_metrics(pulse_loco_collab *c, pulse_bytebuf *text);

/* Client mode (collab.c): hosting a client's uploads (the server's upload
 * callback), and a client's upload of its payload of round r to its host.
 * A push that fails (the host gone, or refused) leaves the peer dropped
 * with another serving member as its next host (its next call rejoins);
 * an error. */
unsigned collab_on_upload(void *user, const char *path, const char *id,
                          const uint8_t *body, size_t size, char *reply,
                          size_t cap);
pulse_status collab_client_push(pulse_loco_collab *c, uint64_t r,
                                const uint8_t *payload, size_t size);
/* A client's blob of the partitioned exchange (path "/v1/loco/part/..."),
 * user the peer: to its host, which serves it under the client's URL
 * (loco_partition_in.upload). */
pulse_status collab_client_upload(void *user, const char *path,
                                  const uint8_t *data, size_t size,
                                  const loco_sig *sig);

/* The writer's side (collab_writer.c). */
unsigned collab_on_post(void *user, const char *path, const char *id,
                        const char *url, char *reply, size_t cap);
/* Opens (or keeps) the table of round r for rank k; k > 0 is a takeover:
 * the round closes with what was done (no grants). Caller holds lock. */
void collab_open_table(pulse_loco_collab *c, uint64_t r, uint32_t k);
/* A claim of b samples by member id (done so far, rate) in round r at rank
 * k: one of the COLLAB_* answers. Caller holds lock. */
unsigned collab_claim_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                             uint32_t id, uint64_t b, uint64_t done,
                             uint64_t rate_milli);
unsigned collab_ready_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                             uint32_t id, uint64_t samples, int leaving);
/* An acceptance by member id of the proposal of round r at rank k
 * (POST /v1/collab/accept/R/K): 200, or a COLLAB_* refusal. Caller holds
 * lock. */
unsigned collab_accept_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                              uint32_t id);
/* Notes the download rate member id reported with its readiness (bytes/s,
 * 0: none) in the open table. Caller holds lock. */
void collab_bandwidth_locked(pulse_loco_collab *c, uint32_t id, uint64_t bw);

/* Tests only: when non-zero, every peer reports this many bytes/s times
 * its id instead of what it measured (unequal ranges on demand). */
extern uint64_t loco_collab_test_bandwidth_per_id;

/* Tests only (a writer killed after its manifest, a member late to fetch
 * the payloads): in round loco_collab_test_stall_round the peer with id
 * loco_collab_test_stall_id, when it writes that round, stops for good
 * (sleeps until killed) once it published the manifest, having first
 * dropped its own payload (phase 1: nobody can fetch it, from it or as a
 * relay) or not (phase 2); or (phase 3, any member) waits 1 s before
 * fetching the listed payloads; or (phase 4, any member that finishes the
 * round) says "finished" without serving its state of round + 1 and stops
 * for good: a finisher that dies after its word, before anyone imported
 * its state; or (phase 5, a member that does not write the round) waits
 * a round timeout and two claim timeouts before it says it is ready, so
 * the writer leaves it out, and waits 2 s before it joins again; or
 * (phase 6) is left out as in phase 5 and waits 2 s once its join had the
 * first view from its seed (time to kill the seed mid-join). Phase 0:
 * never (the default). */
extern uint32_t loco_collab_test_stall_id;
extern uint64_t loco_collab_test_stall_round;
extern int loco_collab_test_stall_phase;

/* Whether a takeover of round r at rank k is backed by more than half of
 * the members that are not its dead writers (collab_close.c), from the
 * table's records (rec, n); self: this peer counts itself. Caller holds
 * lock when rec is the table's. */
int collab_takeover_backed(const pulse_loco_collab *c, uint64_t r, uint32_t k,
                           const collab_record *rec, size_t n, int self);

/* A manifest of r some member re-serves (one committed, from the writer
 * it names or a later rank), looked for at every serving member but this
 * one and the dead writers below rank k (collab_close.c): into *man, its
 * bytes and signature into raw and sig, its source's URL into src; 1 when
 * found. */
int collab_adopt_manifest(pulse_loco_collab *c, uint64_t r, uint32_t k,
                          loco_manifest *man, char *src, size_t src_cap,
                          pulse_bytebuf *raw, loco_sig *sig);

/* ---------------------------------- the commit step (collab_commit.c)
 *
 * A round's manifest counts (is served at /v1/loco/round/R/manifest, and
 * acted on) only once more than half of the round's serving members
 * accepted it at the rank it was proposed at; an acceptor that sent a
 * message at rank k (promised k) accepts no proposal of a lower rank; a
 * writer taking over at rank k reads, from more than half of the serving
 * members that promised k, the manifest each accepted last
 * (/v1/loco/round/R/accepted) and proposes the highest-ranked one instead
 * of its own. So at most one manifest per round is ever committed. */

/* The acceptors of round r: the serving members of the context's round
 * but those this peer found dead (their port refuses connections: a
 * killed peer; a partitioned one drops or times out, and counts). */
size_t collab_acceptors(const pulse_loco_collab *c, uint64_t r);
int collab_found_dead(const pulse_loco_collab *c, uint64_t r, uint32_t id);
/* Probes every serving member of round r but this peer, the dead ones and
 * the skip list (a TCP connection, 250 ms at most): those that refuse are
 * noted dead. */
void collab_probe_dead(pulse_loco_collab *c, uint64_t r, const uint32_t *skip,
                       size_t nskip);
/* This peer promises rank k in round r (before any message at rank k):
 * a higher promise is served at /v1/loco/round/R/accepted at once, so a
 * writer it tells at rank k reads a statement at k or above. */
void collab_promise(pulse_loco_collab *c, uint64_t r, uint32_t k);
/* A follower at rank k: W(r, k)'s proposal (at wurl), checked (signed by
 * the writer it names, of round r), accepted when no higher rank was
 * promised, and the acceptance told to the writer (*told). An error when
 * the proposal is refused (as a refused manifest). */
pulse_status collab_follow_proposal(pulse_loco_collab *c, uint64_t r,
                                    uint32_t k, const char *wurl, int *told);
/* A writer taking over at rank k > 0: the highest-ranked manifest
 * accepted by the members that promised k (those the table's records rec,
 * n of them, say contacted it) and this peer, into man, raw and sig
 * (*found); @return how many of them answered (this peer included). */
size_t collab_read_accepted(pulse_loco_collab *c, uint64_t r, uint32_t k,
                            const collab_record *rec, size_t n,
                            loco_manifest *man, pulse_bytebuf *raw,
                            loco_sig *sig, int *found);
/* The writer of round r at rank k proposes man (raw and sig: its bytes
 * and signature as they came when it re-proposes one it read; raw empty:
 * its own), accepts it and waits for more than half of the serving members
 * to accept: PULSE_OK, committed. Without that many, the manifest some
 * member re-serves (committed at another rank) replaces man (src: its
 * source); none within the bound: an error naming the partition. */
pulse_status collab_commit(pulse_loco_collab *c, uint64_t r, uint32_t k,
                           loco_manifest *man, pulse_bytebuf *raw,
                           loco_sig *sig, char *src, size_t src_cap);
/* A body signed as the auth hooks sign (collab_auth.c; 0 without a key,
 * nothing signed). */
int collab_auth_sign(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                     uint64_t r, const void *data, size_t size, loco_sig *sig);

/* Publishes the table as GET /v1/loco/progress/round (JSON). */
void collab_publish_progress(pulse_loco_collab *c);

/* ------------------------------------------------ one round, by its parts */

/* collab_round.c: the URL of member id of the context's round ("" when it
 * is none); whether a member URL serves (a client-mode member's is hosted:
 * only serving members own partitioned ranges); the download rate this
 * peer reports (bytes/s; 0: not measured). */
const char *collab_url_of(const pulse_loco_collab *c, uint32_t id);
int collab_serves(const char *url);
uint64_t collab_reported_bandwidth(const pulse_loco_collab *c);
/* collab_round.c: moves *k to the rank a member said it writes round r at,
 * when higher (PULSE_ERR_IO past the last rank: every writer is gone); one
 * claim of b samples (or, with `ready`, a readiness) to
 * the writer W(r, k): a COLLAB_* answer, 0 when the writer did not
 * answer. */
pulse_status collab_sync_rank(pulse_loco_collab *c, uint64_t r, uint32_t *k);
unsigned collab_tell_writer(pulse_loco_collab *c, uint64_t r, uint32_t k,
                            int ready, uint64_t b, uint64_t done,
                            uint64_t rate_milli, int leaving);

/* collab_close.c: readiness to W(r, k) and its manifest (into *man, its
 * source's URL into src); moves to the next rank when the writer is gone,
 * and closes the round itself when its turn comes. */
pulse_status collab_get_manifest(pulse_loco_collab *c, uint64_t r,
                                 uint32_t *k, const uint8_t *own,
                                 size_t own_size, uint64_t done, int leaving,
                                 loco_manifest *man, char *src, size_t cap,
                                 pulse_bytebuf *raw, loco_sig *sig,
                                 pulse_loco_collab_figures *info);
/* (raw, sig: the manifest's bytes and its writer's signature as they came,
 * for this peer to serve them again; raw left empty when this peer wrote
 * it.) */

/* collab_fetch.c: the all-to-all finish of round r over man's
 * contributors: their payloads into t (by man's order; urls the same
 * length), from their senders and relays until `end`, then
 * pulse_loco_finish over set when this peer has a payload and every
 * listed one (*complete). */
pulse_status collab_finish_listed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, const loco_manifest *man,
                                  loco_fetch *t, char (*urls)[160],
                                  pulse_loco_contribution *set,
                                  const uint8_t *own, size_t size,
                                  uint64_t done, uint64_t end, float *theta_r,
                                  pulse_loco_collab_figures *info,
                                  int *complete);

/* collab_finish.c: how long a contributor takes at most to get what it
 * finishes with; how long a member waits for the state of r + 1. */
uint64_t collab_exchange_ms(const pulse_loco_collab *c);
uint64_t collab_catch_up_window(const pulse_loco_collab *c);
/* The state of `round` served at base, its signature checked (auth
 * hook), into *out (replaced); nothing imported. PULSE_ERR_NOT_FOUND when
 * base does not serve it (*at, when not NULL: the round its view says it
 * is at, when it gave one; it keeps the states of that round and the one
 * before). */
pulse_status collab_get_state(pulse_loco_collab *c, const char *base,
                              uint64_t round, uint32_t timeout_ms,
                              pulse_bytebuf *out, uint64_t *at);
/* Imports a state collab_get_state got from base (ctx not prepared); an
 * error when it is not of `round` or does not import. */
pulse_status collab_import_state(pulse_loco_collab *c, const char *base,
                                 uint64_t round, const pulse_bytebuf *b,
                                 float *theta_r);
/* Imports the state of round `round` from src, one of man's contributors
 * (man may be NULL) or any other serving member, trying each in turn until
 * window_ms passed. */
pulse_status collab_catch_up(pulse_loco_collab *c, uint64_t round,
                             const char *src, const loco_manifest *man,
                             float *theta_r, uint64_t window_ms);
/* The partitioned finish of round r: PULSE_OK when ctx finished (theta_r
 * = theta_g); an error leaves ctx prepared (*self_dropped: this peer was
 * found an offender). */
pulse_status collab_reduce_partitioned(pulse_loco_collab *c, uint64_t r,
                                       const char *src,
                                       const loco_manifest *man,
                                       const uint8_t *own, size_t size,
                                       float *theta_r,
                                       pulse_loco_collab_figures *info,
                                       int *self_dropped);
/* Serves /v1/loco/round/R/outcome: "finished" (the state of r + 1 served
 * first) or "failed". */
pulse_status collab_publish_outcome(pulse_loco_collab *c, uint64_t r,
                                    int finished);
/* A contributor that cannot finish r over man's whole set says "failed"
 * and settles: *imported when it imported a state of r + 1 (the round is
 * over), else man and t are cut to the contributors that finish r
 * all-to-all. */
pulse_status collab_settle_failed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, loco_manifest *man,
                                  loco_fetch *t, int self_in, uint64_t done,
                                  uint64_t end, float *theta_r,
                                  pulse_loco_collab_figures *info,
                                  int *imported);
/* The state of r + 1 (collab_catch_up, info->resynced); when man's next
 * round does not list this peer (it was cut off from the writer: a
 * partition), none: PULSE_OK, the round ends with this peer dropped, and
 * its next call joins again and imports the state the others are at. */
pulse_status collab_catch_up_or_rejoin(pulse_loco_collab *c, uint64_t r,
                                       const char *src,
                                       const loco_manifest *man,
                                       float *theta_r,
                                       pulse_loco_collab_figures *info);
/* Without its own payload or every listed one: the state of r + 1 from a
 * member that finished; info counts the samples it knows were in it. */
pulse_status collab_import_finished(pulse_loco_collab *c, uint64_t r,
                                    const char *src, const loco_manifest *man,
                                    const loco_fetch *t, float *theta_r,
                                    pulse_loco_collab_figures *info);

#endif
