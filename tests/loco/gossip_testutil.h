/* gossip_testutil.h - helpers of the gossip and graph tests: a seeded
 * normal generator and a small in-memory run of N gossip contexts (every
 * payload handed over in memory, nodes that are "down" for a round left
 * out of it entirely). */
#ifndef PULSE_GOSSIP_TESTUTIL_H
#define PULSE_GOSSIP_TESTUTIL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_gossip.h"
#include "rng_impl.h"

static inline double gt_normal(uint64_t *s) {
  double u = pulse_rng_uniform(s), v = pulse_rng_uniform(s);
  return sqrt(-2.0 * log(u + 1e-300)) * cos(6.283185307179586 * v);
}

typedef struct {
  uint32_t n;
  uint64_t P;
  pulse_gossip **node;
  uint64_t bytes; /* payload bytes delivered so far */
} gt_run;

static inline void gt_run_init(gt_run *r, uint32_t n, uint64_t P,
                               pulse_loco_gate_mode gate, const float *init) {
  r->n = n;
  r->P = P;
  r->bytes = 0;
  r->node = calloc(n, sizeof *r->node);
  for (uint32_t i = 0; i < n; i++) {
    pulse_gossip_opts o;
    pulse_gossip_opts_init(&o);
    o.nodes = n;
    o.self = i;
    o.param_count = P;
    o.gate = gate;
    o.chunk_log2 = 10;
    if (gate == PULSE_LOCO_GATE_NONE)
      o.values = PULSE_LOCO_VALUES_RAW;
    cr_assert_eq(pulse_gossip_create(&o, init, &r->node[i]), PULSE_OK);
  }
}

static inline void gt_run_free(gt_run *r) {
  for (uint32_t i = 0; i < r->n; i++)
    pulse_gossip_free(r->node[i]);
  free(r->node);
}

/* One round on g; alive (may be NULL: all) says who takes part. */
static inline void gt_round(gt_run *r, uint64_t round,
                            const pulse_gossip_graph *g, const uint8_t *alive) {
  for (uint32_t i = 0; i < r->n; i++)
    if (!alive || alive[i])
      cr_assert_eq(pulse_gossip_prepare(r->node[i], round, g, NULL), PULSE_OK,
                   "prepare %u: %s", i, pulse_error_detail());
  for (uint32_t i = 0; i < r->n; i++) {
    if (alive && !alive[i])
      continue;
    const uint32_t *nb = pulse_gossip_graph_neighbours(g, i);
    for (uint32_t a = 0; a < pulse_gossip_graph_degree(g, i); a++) {
      uint32_t j = nb[a];
      if (alive && !alive[j])
        continue;
      const uint8_t *d;
      size_t sz;
      cr_assert_eq(pulse_gossip_payload(r->node[j], i, &d, &sz), PULSE_OK);
      cr_assert_eq(pulse_gossip_receive(r->node[i], j, d, sz), PULSE_OK,
                   "receive %u from %u: %s", i, j, pulse_error_detail());
      r->bytes += sz;
    }
  }
  for (uint32_t i = 0; i < r->n; i++)
    if (!alive || alive[i])
      cr_assert_eq(pulse_gossip_finish(r->node[i], NULL), PULSE_OK);
}

/* Mean over parameters of the across-replica (population) variance. */
static inline double gt_variance(const gt_run *r) {
  double total = 0.0;
  for (uint64_t p = 0; p < r->P; p++) {
    double m = 0.0, v = 0.0;
    for (uint32_t i = 0; i < r->n; i++)
      m += pulse_gossip_params(r->node[i])[p];
    m /= r->n;
    for (uint32_t i = 0; i < r->n; i++) {
      double d = pulse_gossip_params(r->node[i])[p] - m;
      v += d * d;
    }
    total += v / r->n;
  }
  return total / (double)r->P;
}

#endif
