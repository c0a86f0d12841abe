/* coordinator_auth_state.h - private to loco/coordinator: the state of a
 * node's authentication (coordinator_auth_impl.h), shared by its bodies
 * and joins (coordinator_auth.c) and its datagrams (coordinator_auth_udp.c). */
#ifndef PULSE_LOCO_COORD_AUTH_STATE_H
#define PULSE_LOCO_COORD_AUTH_STATE_H

#include <pthread.h>

#include "coordinator_auth_impl.h"

/* A trainer id and the key that speaks for it. */
typedef struct {
  uint32_t id;
  uint8_t key[PULSE_KEY_BYTES];
} binding;

/* A sender's signed chunk list of the round being received. */
typedef struct {
  uint32_t id;
  int ok;           /* 1: the list is here; 0: refused or not to be had */
  uint8_t *digests; /* SHA-256 of each chunk, sorted */
  size_t count;
} chunk_list;

struct loco_node_auth {
  /* The handle, the bindings and the counters: the server thread checks
   * joins and reads the metrics while the node's thread checks bodies. */
  pthread_mutex_t lock;
  pulse_loco_auth *auth;
  uint8_t own[PULSE_KEY_BYTES];
  binding *ids;
  size_t nids, capids;
  int has_admission;
  pulse_loco_admission admission;
  /* Refusals decided here rather than by the handle (a trainer id whose
   * key is unknown, a body of a later round), added to its counters. */
  pulse_loco_auth_figures extra;
  uint64_t datagrams_refused, joins_refused;
  uint64_t datagrams_replayed; /* of datagrams_refused: an older round's */
  uint64_t refused_kind[PULSE_LOCO_AUTH_KINDS]; /* refusals by kind - 1 */
  uint64_t round; /* the round being run (the handle's floor) */
  uint64_t overhead, step_overhead;  /* bytes authentication added, received */
  pulse_loco_auth_figures step_base; /* totals when the step began */
  uint64_t step_datagrams;
  loco_sig own_payload; /* this round's, for the relay of it */
  /* UDP: the senders' chunk lists of list_round. */
  uint64_t list_round;
  chunk_list *lists;
  size_t nlists;
  /* Joins accepted: each joiner's number, sent back in its admission. */
  struct {
    uint32_t id;
    uint64_t seq;
  } * joins;
  size_t njoins, capjoins;
  /* Fault injection (tests): the faults, and under REPLAYED over UDP the
   * last two rounds' chunks. */
  loco_tamper tamper;
  pulse_buffer chunks_prev, chunks_cur;
  uint64_t nchunks_prev, nchunks_cur;
};

/* Frees the senders' chunk lists (coordinator_auth_udp.c). */
void loco_auth_lists_clear(loco_node_auth *a);

#endif
