/* gossip_policy.c - the adaptive graph (pulse_gossip.h): a ladder of
 * increasingly dense graphs, climbed when the measured replica variance is
 * above its target and descended when it is well below, within a byte
 * budget. Each decision is logged. */
#include <math.h>
#include <stdlib.h>

#include "graph_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

struct pulse_gossip_policy {
  pulse_gossip_policy_opts o;
  uint32_t dims; /* log2 N */
  uint32_t rung;
  int started;
};

pulse_status pulse_gossip_policy_create(const pulse_gossip_policy_opts *o,
                                        pulse_gossip_policy **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: NULL output");
  *out = NULL;
  if (o == NULL || o->struct_version != PULSE_GOSSIP_POLICY_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: options missing or of "
                      "another version");
  if (o->nodes < 2 || o->nodes > PULSE_GOSSIP_MAX_NODES ||
      (o->nodes & (o->nodes - 1u)))
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: %u nodes (a power of two "
                      ">= 2)", o->nodes);
  if (!(o->target > 0.0) || !isfinite(o->target) || !(o->budget > 0.0) ||
      !(o->budget <= 1.0))
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: target %g must be > 0 and "
                      "budget %g in (0, 1]", o->target, o->budget);
  if (o->rounds > 0 && o->final_rounds >= o->rounds)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: %u final rounds of %llu",
                      o->final_rounds, (unsigned long long)o->rounds);
  pulse_gossip_policy *p = calloc(1, sizeof *p);
  if (p == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip policy");
  p->o = *o;
  while ((1u << p->dims) < o->nodes)
    p->dims++;
  *out = p;
  return PULSE_OK;
}

void pulse_gossip_policy_free(pulse_gossip_policy *p) { free(p); }

pulse_status pulse_gossip_policy_set_target(pulse_gossip_policy *p,
                                            double target) {
  if (p == NULL || !(target > 0.0) || !isfinite(target))
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: target %g", target);
  p->o.target = target;
  return PULSE_OK;
}

static uint32_t rung_degree(const pulse_gossip_policy *p, uint32_t rung) {
  return rung >= p->dims ? p->o.nodes - 1u : rung + 1u;
}

/* Rung r < dims: i linked to i XOR 2^d for the r + 1 dimensions d = round,
 * round + 1, ... (mod dims); rung dims: the complete graph. */
static pulse_status rung_graph(const pulse_gossip_policy *p, uint32_t rung,
                               uint64_t round, pulse_gossip_graph **out) {
  uint32_t n = p->o.nodes;
  if (rung >= p->dims)
    return pulse_gossip_graph_make(PULSE_GOSSIP_COMPLETE, n, round,
                                   p->o.weights, out);
  uint32_t k = rung + 1u;
  size_t count = (size_t)n / 2u * k;
  uint32_t(*e)[2] = malloc(count * sizeof *e);
  if (e == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip policy: edges");
  size_t c = 0;
  for (uint32_t m = 0; m < k; m++) {
    uint32_t bit = 1u << (uint32_t)((round + m) % p->dims);
    for (uint32_t i = 0; i < n; i++)
      if ((i & bit) == 0) {
        e[c][0] = i;
        e[c++][1] = i | bit;
      }
  }
  /* k < dims dimensions of the hypercube: disjoint sub-cubes, not
   * connected on their own; the rotation connects them over the rounds. */
  pulse_status st = graph_from_edges_any(n, (const uint32_t(*)[2])e, c,
                                         p->o.weights, out);
  free(e);
  return st;
}

pulse_status pulse_gossip_policy_decide(pulse_gossip_policy *p, uint64_t round,
                                        double measured, double bytes_so_far,
                                        double payload_bytes,
                                        pulse_gossip_graph **graph,
                                        pulse_gossip_decision *d) {
  if (p == NULL || graph == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: NULL argument");
  *graph = NULL;
  uint32_t want = p->rung;
  const char *why = "variance within target";
  if (!p->started || isnan(measured)) {
    why = "no measurement yet: sparsest graph";
    want = 0;
  } else if (measured > p->o.target) {
    why = "variance above target: denser";
    if (want < p->dims)
      want++;
  } else if (measured < 0.5 * p->o.target) {
    why = "variance below half the target: sparser";
    if (want > 0)
      want--;
  }
  /* The budget: what the complete graph would have sent by the end of this
   * round, times the fraction; less, spread evenly, what the final
   * complete rounds will need. */
  double unit = payload_bytes > 0.0 && isfinite(payload_bytes) ? payload_bytes
                                                               : 1.0;
  double n = (double)p->o.nodes, full = n * (n - 1.0) * unit;
  double allowed = p->o.budget * (double)(round + 1u) * full;
  uint64_t R = p->o.rounds, F = R > 0 ? p->o.final_rounds : 0;
  if (F > 0) {
    /* Priced at 1.25 payloads an edge: after sparse rounds the replicas
     * differ more, and the complete rounds' payloads are larger than the
     * last round's. */
    double total = p->o.budget * (double)R * full - 1.25 * (double)F * full;
    allowed = total * (double)(round + 1u) / (double)(R - F);
  }
  double spent = bytes_so_far > 0.0 ? bytes_so_far : 0.0;
  if (F > 0 && round >= R - F) {
    want = p->dims;
    why = "final rounds: complete graph (replicas made the average)";
  } else {
    while (want > 0 && spent + n * rung_degree(p, want) * unit > allowed) {
      want--;
      why = "byte budget: sparser";
    }
  }
  p->rung = want;
  p->started = 1;
  PULSE_TRY(rung_graph(p, want, round, graph));
  PULSE_LOG_AT(PULSE_LOG_INFO, "gossip policy: round %llu variance %.4g "
               "(target %.4g): rung %u, degree %u (%s)",
               (unsigned long long)round, measured, p->o.target, want,
               rung_degree(p, want), why);
  if (d) {
    d->round = round;
    d->measured = measured;
    d->rung = want;
    d->degree = rung_degree(p, want);
    d->reason = why;
  }
  return PULSE_OK;
}
