/* coordinator_impl.h - private to loco/: the node of the exchange (pulse_loco.h,
 * docs/protocols/loco-exchange.md "Exchange") shared by its HTTP round (coordinator.c) and its
 * datagram round (coordinator_udp.c). */
#ifndef PULSE_LOCO_COORD_IMPL_H
#define PULSE_LOCO_COORD_IMPL_H

#include <pthread.h>

#include "loco_impl.h"
#include "manifest_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco_testing.h"
#include "status_impl.h"
#include "udp_impl.h"

/* A datagram end marker (coordinator_udp.c, docs/protocols/loco-datagrams.md "Exchange over
 * datagrams"): "PLCE", 36 bytes, sender at byte 8 and round at byte 12 as
 * in a chunk. */
#define LOCO_END_MAGIC 0x45434C50u
#define LOCO_END_SIZE 36u

typedef struct {
  uint64_t round;
  uint32_t id;
} ack;

/* A peer's datagram endpoint, by id and HTTP URL (a re-joiner under the
 * same id may come back on another port). */
typedef struct {
  uint32_t id;
  char url[64];
  uint32_t addr; /* from the URL */
  uint16_t port;
} loco_udp_peer;

struct pulse_loco_coord {
  pulse_loco_coord_opts opts;
  pulse_loco_test_hooks hooks; /* a copy of opts.test_hooks (zeros: none) */
  pulse_loco *ctx;
  loco_server *srv;
  char url[64];
  uint32_t id;
  pulse_loco_member
      members[LOCO_MAX_MEMBERS]; /* of the context's round, by id */
  uint32_t misses[LOCO_MAX_MEMBERS];
  size_t nmembers;
  uint64_t fetched; /* bytes of bodies fetched this round */
  /* Bytes sent (server answers and datagrams) when the last step returned:
   * the next step's bytes_sent starts there. */
  uint64_t sent_mark;
  /* Dropped by the group after missed rounds: the next step joins again
   * through rejoin_url (the coordinator that dropped this node). */
  int dropped;
  char rejoin_url[64];
  /* The last round this node coordinated, and who must acknowledge it. */
  int coordinated;
  uint64_t coordinated_round;
  pulse_loco_member owed[LOCO_MAX_MEMBERS];
  size_t nowed;

  /* Written by the server thread (POSTs), read by the node: under lock. */
  pthread_mutex_t lock;
  pulse_loco_member pending[LOCO_MAX_MEMBERS];
  size_t npending;
  uint32_t leaving[LOCO_MAX_MEMBERS];
  size_t nleaving;
  ack acks[4 * LOCO_MAX_MEMBERS];
  size_t nacks;

  /* UDP transport (coordinator_udp.c): the socket, the peers' datagram ports
   * (learned over HTTP, GET /v1/loco/udp), datagrams of later rounds that
   * came early; between re-syncs, the ranges where this replica differs
   * from the reference and the reference's theta_g digest, the base its
   * chunks name (NULL: the reference's bits). */
  loco_udp *udp;
  loco_udp_peer peers[LOCO_MAX_MEMBERS];
  size_t npeers;
  loco_datagram *early;
  size_t nearly;
  uint8_t *drifted;
  uint64_t ref_base;

  /* Authentication (coordinator_auth.c): NULL when the node does not sign and
   * check. */
  struct loco_node_auth *auth;
};


/* The members' helpers (coordinator.c). */
void loco_node_set_members(pulse_loco_coord *n, const pulse_loco_member *m,
                           size_t count);
/* Publishes the context's state at /v1/loco/state/ROUND. */
pulse_status loco_node_publish_state(pulse_loco_coord *n);
/* base URL + formatted path */
void loco_node_url_fmt(char *dst, size_t cap, const char *base,
                       const char *fmt, ...) PULSE_PRINTF_(4, 5);
/* A manifest or a view (JSON) from url; its size adds to n->fetched. */
pulse_status loco_node_get_json(const char *url, unsigned timeout_ms,
                                loco_manifest *m, uint64_t *fetched);
/* Imports the newest state of round min_round or later from the
 * coordinator at `coord`, trainer `coord_id` (and its members), before
 * `end`. Authenticating, its view and its state must be signed by
 * coord_id (a leaving coordinator's view names its successor). */
pulse_status loco_node_catch_up(pulse_loco_coord *n, const char *coord,
                                uint32_t coord_id, uint64_t min_round,
                                float *theta_r, uint64_t end);
/* The coordinator's end of round r: the members of round r + 1 (minus
 * leavers and the long silent; n->misses must be up to date; plus the
 * pending joiners), their admissions and the manifest with the
 * contributors refs[0..c), published in that order. next gets the members
 * of r + 1 (LOCO_MAX_MEMBERS room), *nn their count. */
pulse_status loco_node_close_round(pulse_loco_coord *n, uint64_t r,
                                   int leaving, const loco_contrib_ref *refs,
                                   size_t c, pulse_loco_member *next,
                                   size_t *nn);

/* The datagram round (coordinator_udp.c): from the prepared round r to its end
 * (chunks out, chunks in until complete, quiet or the deadline, finish,
 * manifest, drift check and re-sync). */
pulse_status loco_node_udp_round(pulse_loco_coord *n, uint64_t r, int leaving,
                                 float *theta_r, pulse_loco_coord_step_figures *info);
/* Opens the socket and publishes its port (at create); frees it all. */
pulse_status loco_node_udp_start(pulse_loco_coord *n);
/* Serves this node's datagram port again (/v1/loco/udp, signed). */
pulse_status loco_node_udp_publish_port(pulse_loco_coord *n);
void loco_node_udp_stop(pulse_loco_coord *n);

#endif
