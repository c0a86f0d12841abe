/* fuzz_graph_file.c - libFuzzer target for gossip graph files
 * (loco/gossip/graph_file.c, pulse_gossip_graph_parse): untrusted text.
 *
 * Input: the file's bytes; the first byte also picks the weights (MH or
 * uniform) when the file gives none. Checked: parsing never crashes; a
 * refused file comes back as PULSE_ERR_CORRUPT with no graph (or
 * PULSE_ERR_NOMEM); an accepted graph passes pulse_gossip_graph_check
 * (symmetric, non-negative, rows and columns summing to one, connected),
 * its neighbour lists increase strictly and agree with its weights.
 * Corpus: tests/fuzz/corpus/graph_file. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "pulse_gossip.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pulse_gossip_weights w =
      size > 0 && (data[0] & 1) ? PULSE_GOSSIP_WEIGHTS_UNIFORM
                                : PULSE_GOSSIP_WEIGHTS_MH;
  pulse_gossip_graph *g = (pulse_gossip_graph *)&w;
  pulse_status st = pulse_gossip_graph_parse((const char *)data, size, w, &g);
  if (st != PULSE_OK) {
    CHECK(st == PULSE_ERR_CORRUPT || st == PULSE_ERR_NOMEM);
    CHECK(g == NULL);
    return 0;
  }
  CHECK(g != NULL);
  CHECK(pulse_gossip_graph_check(g, 1e-6) == PULSE_OK);
  uint32_t n = pulse_gossip_graph_nodes(g);
  uint64_t ends = 0;
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t *nb = pulse_gossip_graph_neighbours(g, i);
    uint32_t d = pulse_gossip_graph_degree(g, i);
    ends += d;
    for (uint32_t k = 0; k < d; k++) {
      CHECK(nb[k] < n && nb[k] != i);
      CHECK(k == 0 || nb[k] > nb[k - 1]);
      CHECK(pulse_gossip_graph_weight(g, i, nb[k]) > 0.0);
    }
  }
  CHECK(ends == 2 * pulse_gossip_graph_edge_count(g));
  pulse_gossip_graph_free(g);
  return 0;
}
