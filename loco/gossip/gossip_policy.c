/* gossip_policy.c - the adaptive graph (pulse_gossip.h): each round, a
 * number of one-peer steps along the hypercube's dimensions (rotating over
 * the rounds), more when the measured replica variance is above its
 * target, fewer when it is well below, within a byte budget; log2 N steps
 * make every replica the exact average. Each decision is logged. */
#include <string.h>
#include <math.h>
#include <stdlib.h>

#include "graph_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

struct pulse_gossip_policy {
  pulse_gossip_policy_opts o;
  uint32_t dims;      /* log2 N: the steps of an exact average */
  uint32_t steps;     /* of the last decision (0: none yet) */
  uint32_t first_dim; /* the last decision's first dimension */
  uint32_t next_dim;  /* where the next round's sweep starts */
  uint64_t round;     /* of the last decision */
  int started;
};

void pulse_gossip_policy_opts_init(pulse_gossip_policy_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_GOSSIP_POLICY_OPTS_VERSION;
  o->budget = 0.25;
  o->weights = PULSE_GOSSIP_WEIGHTS_MH;
}

pulse_status pulse_gossip_policy_create(const pulse_gossip_policy_opts *o,
                                        pulse_gossip_policy **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: NULL output");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("gossip policy", o, PULSE_GOSSIP_POLICY_OPTS_VERSION));
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

/* The perfect matching i -- i XOR 2^dim (one round of the one-peer
 * exponential graph): not connected on its own; log2 N of them along
 * every dimension in turn make the exact average. */
static pulse_status dim_graph(const pulse_gossip_policy *p, uint32_t dim,
                              pulse_gossip_graph **out) {
  uint32_t n = p->o.nodes, bit = 1u << dim;
  uint32_t(*e)[2] = malloc((size_t)n / 2u * sizeof *e);
  if (e == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip policy: edges");
  size_t c = 0;
  for (uint32_t i = 0; i < n; i++)
    if ((i & bit) == 0) {
      e[c][0] = i;
      e[c++][1] = i | bit;
    }
  pulse_status st = graph_from_edges_any(n, (const uint32_t(*)[2])e, c,
                                         p->o.weights, out);
  free(e);
  return st;
}

pulse_status pulse_gossip_policy_step_graph(const pulse_gossip_policy *p,
                                            uint32_t step,
                                            pulse_gossip_graph **graph) {
  if (graph == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: NULL output");
  *graph = NULL;
  if (p == NULL || step >= p->steps)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: step %u of %u", step,
                      p ? p->steps : 0u);
  return dim_graph(p, (p->first_dim + step) % p->dims, graph);
}

pulse_status pulse_gossip_policy_decide(pulse_gossip_policy *p, uint64_t round,
                                        double measured, double bytes_so_far,
                                        double payload_bytes,
                                        double full_payload_bytes,
                                        pulse_gossip_graph **graph,
                                        pulse_gossip_decision *d) {
  if (p == NULL || graph == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: NULL argument");
  *graph = NULL;
  if (p->started && round <= p->round)
    return pulse_fail(PULSE_ERR_ARG, "gossip policy: round %llu is not after "
                      "%llu", (unsigned long long)round,
                      (unsigned long long)p->round);
  uint32_t want = p->steps;
  const char *why = "variance within target";
  if (!p->started || isnan(measured)) {
    why = "no measurement yet: one step";
    want = 1;
  } else if (measured > p->o.target) {
    why = "variance above target: one step more";
    if (want < p->dims)
      want++;
  } else if (measured < 0.5 * p->o.target) {
    why = "variance below half the target: one step less";
    if (want > 1)
      want--;
  }
  /* The budget: what the complete graph (N - 1 payloads a node, each a
   * whole round's change: priced at full_payload_bytes) would have sent by
   * the end of this round, times the fraction; less, spread evenly, what
   * the final exact rounds will need. A step costs one payload a node,
   * priced at the mean payload. */
  double unit = payload_bytes > 0.0 && isfinite(payload_bytes) ? payload_bytes
                                                               : 1.0;
  double ref = full_payload_bytes > 0.0 && isfinite(full_payload_bytes)
                   ? full_payload_bytes
                   : unit;
  double n = (double)p->o.nodes, full = n * (n - 1.0) * ref;
  double allowed = p->o.budget * (double)(round + 1u) * full;
  uint64_t R = p->o.rounds, F = R > 0 ? p->o.final_rounds : 0;
  if (F > 0) {
    double total = p->o.budget * (double)R * full -
                   (double)F * p->dims * n * unit;
    allowed = total * (double)(round + 1u) / (double)(R - F);
  }
  double spent = bytes_so_far > 0.0 ? bytes_so_far : 0.0;
  if (F > 0 && round >= R - F) {
    want = p->dims;
    why = "final rounds: exact average (log2 N steps)";
  } else {
    while (want > 1 && spent + n * want * unit > allowed) {
      want--;
      why = "byte budget: fewer steps";
    }
  }
  p->steps = want;
  p->first_dim = p->next_dim;
  p->next_dim = (p->next_dim + want) % p->dims;
  p->round = round;
  p->started = 1;
  PULSE_TRY(dim_graph(p, p->first_dim, graph));
  PULSE_LOG_AT(PULSE_LOG_INFO, "gossip policy: round %llu variance %.4g "
               "(target %.4g): %u one-peer steps from dimension %u (%s)",
               (unsigned long long)round, measured, p->o.target, want,
               p->first_dim, why);
  if (d) {
    d->round = round;
    d->measured = measured;
    d->rung = want - 1u;
    d->degree = 1;
    d->reason = why;
    d->steps = want;
    d->first_dim = p->first_dim;
    d->target = p->o.target;
  }
  return PULSE_OK;
}
