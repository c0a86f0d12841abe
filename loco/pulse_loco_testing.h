/* pulse_loco_testing.h - hooks of the PULSELoCo exchanges for tests and
 * benchmarks: simulated loss, drift probes, gossip copies. Not installed and not part
 * of libpulse.so's API: the project's tests and pulse-bench reach it
 * through the module's internal include path. A production caller leaves
 * pulse_loco_coord_opts.test_hooks NULL. */
#ifndef PULSE_LOCO_TESTING_H
#define PULSE_LOCO_TESTING_H

#include <stdint.h>

#include "pulse_gossip.h"
#include "pulse_loco_coord.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_loco_test_hooks {
  /* Simulated loss: the coordinator treats each fetched payload as lost
   * with this probability (deterministic in seed, round and sender). */
  double drop_rate;
  uint64_t drop_seed; /* of drop_rate and datagram_drop */
  /* UDP, simulated: each datagram, for each receiver, is dropped in the
   * send path with this probability (pulse_loco_datagram_draw with
   * drop_seed). */
  double datagram_drop;
  /* UDP, measurement (NULL: none): called on a member that checks its
   * drift, with its theta_g (P floats, not to be kept) after round
   * `round`'s aggregate and before any re-sync, so that a caller holding
   * every replica can measure the drift over all pairs. */
  void (*drift_probe)(void *user, uint64_t round, const float *theta_g);
  void *drift_probe_user;
} pulse_loco_test_hooks;

/** The draw of the simulated datagram loss (pulse_loco_test_hooks
 * .datagram_drop): uniform in [0, 1), a function of (seed, round, sender,
 * receiver, index of the chunk in the sender's round); the datagram is lost
 * when it is below the drop probability. So a replay of a run can lose
 * exactly the same datagrams. */
double pulse_loco_datagram_draw(uint64_t seed, uint64_t round, uint32_t sender,
                                uint32_t receiver, uint64_t index);

/** Gossip: this trainer's copy of neighbour j's public parameters, or of
 * its own as j holds it (own != 0); NULL when the edge was never used.
 * Borrowed until the next finish or free. */
const float *pulse_gossip_copy(const pulse_gossip *g, uint32_t j, int own);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_TESTING_H */
