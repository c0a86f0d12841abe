/* test_gossip.c - compressed gossip (loco/pulse_gossip.h): without noise it
 * reaches the exact average on every connected graph, its error feedback
 * loses no mass, a noise-only run's replica variance is the one the mixing
 * matrix's spectrum predicts, a silent neighbour is left out of its round,
 * a one-sided failure is dropped at both ends of the edge, payloads of another round, sender or copy are refused, and the adaptive
 * policy climbs, descends and keeps its budget. */
#include "gossip_testutil.h"
#include "pulse_elem.h"
#include "pulse_loco_testing.h"

#define P_SMALL 1024u

static void fill_init(float *x, uint64_t P, uint64_t seed) {
  uint64_t s = seed;
  for (uint64_t p = 0; p < P; p++)
    x[p] = (float)gt_normal(&s);
}

/* Node i's parameters moved away from the common start (a local step). */
static void perturb(gt_run *r, uint64_t seed, double scale) {
  uint64_t s = seed;
  for (uint32_t i = 0; i < r->n; i++) {
    float *x = pulse_gossip_params(r->node[i]);
    for (uint64_t p = 0; p < r->P; p++)
      x[p] += (float)(scale * gt_normal(&s));
  }
}

static void node_mean(const gt_run *r, double *mean) {
  for (uint64_t p = 0; p < r->P; p++) {
    double m = 0.0;
    for (uint32_t i = 0; i < r->n; i++)
      m += pulse_gossip_params(r->node[i])[p];
    mean[p] = m / r->n;
  }
}

static const pulse_gossip_topology topologies[] = {
    PULSE_GOSSIP_RING, PULSE_GOSSIP_TORUS, PULSE_GOSSIP_EXPONENTIAL,
    PULSE_GOSSIP_COMPLETE};

/* Exact gossip (every differing entry sent) converges to the average of
 * the starting points to float precision; the BF16-gated gossip keeps the
 * average and brings every replica within a BF16 step of it. */
Test(loco, gossip_without_noise_converges_to_the_exact_average) {
  const uint32_t n = 8;
  float *init = malloc(P_SMALL * sizeof *init);
  double *m0 = malloc(P_SMALL * sizeof *m0), *m1 = malloc(P_SMALL * sizeof *m1);
  fill_init(init, P_SMALL, 1);
  for (int gated = 0; gated < 2; gated++)
    for (size_t t = 0; t < 4; t++) {
      gt_run r;
      gt_run_init(&r, n, P_SMALL,
                  gated ? PULSE_LOCO_GATE_BF16 : PULSE_LOCO_GATE_NONE, init);
      perturb(&r, 10 + t, 0.05);
      node_mean(&r, m0);
      pulse_gossip_graph *g;
      cr_assert_eq(pulse_gossip_graph_make(topologies[t], n, 0,
                                           PULSE_GOSSIP_WEIGHTS_MH, &g),
                   PULSE_OK);
      for (uint64_t round = 0; round < 120; round++)
        gt_round(&r, round, g, NULL);
      node_mean(&r, m1);
      double worst = 0.0, drift = 0.0;
      for (uint64_t p = 0; p < P_SMALL; p++) {
        drift = fmax(drift, fabs(m1[p] - m0[p]));
        for (uint32_t i = 0; i < n; i++)
          worst = fmax(worst, fabs(pulse_gossip_params(r.node[i])[p] - m0[p]) /
                                  fmax(fabs(m0[p]), 1e-3));
      }
      /* BF16 keeps 8 significant bits: a step is 2^-7 relative at most. */
      double tol = gated ? 0x1p-7 : 1e-5;
      cr_assert(worst <= tol, "gated %d topology %zu: %g from the average",
                gated, t, worst);
      cr_assert(drift <= 1e-5, "gated %d topology %zu: the mean moved %g",
                gated, t, drift);
      pulse_gossip_graph_free(g);
      gt_run_free(&r);
    }
  free(init), free(m0), free(m1);
}

/* Error feedback loses no mass: with fresh changes every round (most of
 * them below a BF16 step), the sum of the replicas after mixing equals the
 * sum before it, and what a node did not send is still in x - c (its copy
 * as the neighbours hold it), never dropped. */
Test(loco, gossip_error_feedback_loses_no_mass) {
  const uint32_t n = 8;
  float *init = malloc(P_SMALL * sizeof *init);
  double *before = malloc(P_SMALL * sizeof *before),
         *after = malloc(P_SMALL * sizeof *after);
  fill_init(init, P_SMALL, 2);
  gt_run r;
  gt_run_init(&r, n, P_SMALL, PULSE_LOCO_GATE_BF16, init);
  pulse_gossip_graph *g;
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_EXPONENTIAL, n, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g), PULSE_OK);
  uint64_t unsent = 0;
  for (uint64_t round = 0; round < 40; round++) {
    perturb(&r, 100 + round, 1e-3); /* a few tenths of a BF16 step */
    node_mean(&r, before);
    gt_round(&r, round, g, NULL);
    node_mean(&r, after);
    for (uint64_t p = 0; p < P_SMALL; p++)
      cr_assert(fabs(after[p] - before[p]) <= 1e-6 * fmax(1.0, fabs(before[p])),
                "round %llu param %llu: %.9g -> %.9g", (unsigned long long)round,
                (unsigned long long)p, before[p], after[p]);
    /* The residual x - c stays below a BF16 step where nothing was sent. */
    const float *x = pulse_gossip_params(r.node[0]);
    const float *c = pulse_gossip_copy(r.node[0], 1, 1);
    for (uint64_t p = 0; p < P_SMALL; p++)
      if (x[p] != c[p])
        unsent++;
  }
  cr_assert(unsent > 0, "the gate held nothing back: the test proves nothing");
  pulse_gossip_graph_free(g);
  gt_run_free(&r);
  free(init), free(before), free(after);
}

/* A noise-only run: every round each node adds N(0, sigma^2) to every
 * parameter, then gossips (exact payloads). The measured variance after
 * mixing, averaged over rounds, matches sigma^2 times the spectral
 * prediction within its statistical error, and orders the topologies. */
Test(loco, noise_only_variance_matches_the_spectral_prediction,
     .timeout = 120) {
  const uint32_t n = 16, P = 1024, burn = 40, rounds = 240;
  const double sigma = 1e-3;
  float *init = calloc(P, sizeof *init);
  for (uint32_t p = 0; p < P; p++)
    init[p] = 1.0f + (float)p / P; /* O(1): float rounding far below sigma */
  double measured[4], predicted[4];
  for (size_t t = 0; t < 4; t++) {
    gt_run r;
    gt_run_init(&r, n, P, PULSE_LOCO_GATE_NONE, init);
    pulse_gossip_graph *g;
    cr_assert_eq(pulse_gossip_graph_make(topologies[t], n, 0,
                                         PULSE_GOSSIP_WEIGHTS_MH, &g),
                 PULSE_OK);
    predicted[t] = sigma * sigma * pulse_gossip_graph_predicted_variance(g);
    double sum = 0.0, sumsq = 0.0;
    for (uint32_t round = 0; round < burn + rounds; round++) {
      perturb(&r, 1000 * t + round, sigma);
      gt_round(&r, round, g, NULL);
      if (round >= burn) {
        double v = gt_variance(&r);
        sum += v;
        sumsq += v * v;
      }
    }
    measured[t] = sum / rounds;
    /* Rounds are correlated (AR(1) with the second eigenvalue, at most
     * 0.95 here: about 20 rounds per independent sample); the parameters
     * are independent. Error of the mean: sd(v) * sqrt(20 / rounds). */
    double sd = sqrt(fmax(sumsq / rounds - measured[t] * measured[t], 0.0));
    double err = 4.0 * sd * sqrt(20.0 / rounds) + 1e-3 * predicted[0];
    cr_assert(fabs(measured[t] - predicted[t]) <= err,
              "topology %zu: measured %.4g predicted %.4g (allowed %.3g)", t,
              measured[t], predicted[t], err);
    pulse_gossip_graph_free(g);
    gt_run_free(&r);
  }
  cr_assert(measured[0] > measured[1] && measured[1] > measured[2] &&
                measured[2] > measured[3],
            "%g %g %g %g", measured[0], measured[1], measured[2], measured[3]);
  cr_assert(measured[3] < 1e-6 * measured[0]);
  free(init);
}

/* Node 2 is silent for round 1: its neighbours leave it out of that round
 * (its weight moves to their self weight), the others' sum is kept, and
 * the run goes on with node 2 back, its edges' copies still in step. */
Test(loco, a_silent_neighbour_is_left_out_and_the_run_goes_on) {
  const uint32_t n = 4;
  float *init = malloc(P_SMALL * sizeof *init);
  fill_init(init, P_SMALL, 3);
  gt_run r;
  gt_run_init(&r, n, P_SMALL, PULSE_LOCO_GATE_NONE, init);
  pulse_gossip_graph *g;
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_RING, n, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g), PULSE_OK);
  perturb(&r, 7, 0.1);
  gt_round(&r, 0, g, NULL);
  perturb(&r, 8, 0.1);
  /* Round 1 without node 2: by hand for node 1 (neighbours 0 and 2). */
  uint8_t alive[4] = {1, 1, 0, 1};
  float *x1 = pulse_gossip_params(r.node[1]);
  double *expect = malloc(P_SMALL * sizeof *expect);
  float *x2_before = malloc(P_SMALL * sizeof *x2_before);
  memcpy(x2_before, pulse_gossip_params(r.node[2]), P_SMALL * sizeof(float));
  double living_before = 0.0, living_after = 0.0;
  for (uint32_t i = 0; i < n; i++)
    if (alive[i])
      for (uint32_t p = 0; p < P_SMALL; p++)
        living_before += pulse_gossip_params(r.node[i])[p];
  /* Exact gossip: node 0's copy becomes its x bit for bit or within a
   * rounding; compute from x directly with the MH weight 1/3. */
  for (uint32_t p = 0; p < P_SMALL; p++)
    expect[p] = x1[p] + (pulse_gossip_params(r.node[0])[p] - x1[p]) / 3.0;
  cr_assert_eq(pulse_gossip_prepare(r.node[1], 1, g, NULL), PULSE_OK);
  pulse_gossip_finish_figures fi;
  for (uint32_t i = 0; i < n; i++)
    if (alive[i] && i != 1)
      cr_assert_eq(pulse_gossip_prepare(r.node[i], 1, g, NULL), PULSE_OK);
  for (uint32_t i = 0; i < n; i++) {
    if (!alive[i])
      continue;
    const uint32_t *nb = pulse_gossip_graph_neighbours(g, i);
    for (uint32_t a = 0; a < 2; a++) {
      if (!alive[nb[a]])
        continue;
      const uint8_t *d;
      size_t sz;
      cr_assert_eq(pulse_gossip_payload(r.node[nb[a]], i, &d, &sz), PULSE_OK);
      cr_assert_eq(pulse_gossip_receive(r.node[i], nb[a], d, sz), PULSE_OK);
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    if (!alive[i])
      continue;
    cr_assert_eq(pulse_gossip_finish(r.node[i], &fi), PULSE_OK);
    if (i == 1 || i == 3) {
      cr_assert_eq(fi.answered, 1);
      cr_assert(fabs(fi.self_weight - 2.0 / 3) < 1e-15);
    }
  }
  for (uint32_t p = 0; p < P_SMALL; p++)
    cr_assert(fabs(x1[p] - expect[p]) <= 1e-6 * fmax(1.0, fabs(expect[p])),
              "param %u: %.9g vs %.9g", p, x1[p], expect[p]);
  cr_assert_eq(memcmp(x2_before, pulse_gossip_params(r.node[2]),
                      P_SMALL * sizeof(float)), 0);
  for (uint32_t i = 0; i < n; i++)
    if (alive[i])
      for (uint32_t p = 0; p < P_SMALL; p++)
        living_after += pulse_gossip_params(r.node[i])[p];
  cr_assert(fabs(living_after - living_before) <= 1e-6 * fabs(living_before) + 1e-3);
  /* Back in: later rounds accept every payload (copies in step). */
  for (uint64_t round = 2; round < 60; round++)
    gt_round(&r, round, g, NULL);
  cr_assert(gt_variance(&r) < 1e-10, "%g", gt_variance(&r));
  pulse_gossip_graph_free(g);
  gt_run_free(&r);
  free(init), free(expect), free(x2_before);
}

/* A one-sided failure: in round 1 node 0 never gets node 1's payload but
 * node 1 gets node 0's. Node 0 says so (the acknowledgement), node 1 drops
 * the edge: both ends leave it out (weight to self, copies untouched), the
 * sum of the parameters is kept, and every later payload on the edge is
 * accepted (its copies are in step) until the replicas agree. */
Test(loco, a_one_sided_failure_drops_the_edge_at_both_ends) {
  const uint32_t n = 4;
  float *init = malloc(P_SMALL * sizeof *init);
  double *mean0 = malloc(P_SMALL * sizeof *mean0);
  double *mean1 = malloc(P_SMALL * sizeof *mean1);
  fill_init(init, P_SMALL, 5);
  gt_run r;
  gt_run_init(&r, n, P_SMALL, PULSE_LOCO_GATE_NONE, init);
  pulse_gossip_graph *g;
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_RING, n, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g), PULSE_OK);
  perturb(&r, 11, 0.1);
  gt_round(&r, 0, g, NULL);
  perturb(&r, 12, 0.1);
  node_mean(&r, mean0);
  for (uint32_t i = 0; i < n; i++)
    cr_assert_eq(pulse_gossip_prepare(r.node[i], 1, g, NULL), PULSE_OK);
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t *nb = pulse_gossip_graph_neighbours(g, i);
    for (uint32_t a = 0; a < 2; a++) {
      if (i == 0 && nb[a] == 1)
        continue; /* lost on the way to node 0 only */
      const uint8_t *d;
      size_t sz;
      cr_assert_eq(pulse_gossip_payload(r.node[nb[a]], i, &d, &sz), PULSE_OK);
      cr_assert_eq(pulse_gossip_receive(r.node[i], nb[a], d, sz), PULSE_OK);
    }
  }
  cr_assert_eq(pulse_gossip_drop_edge(r.node[1], 3), PULSE_ERR_ARG,
               "3 is no neighbour of 1 on the ring");
  cr_assert_eq(pulse_gossip_drop_edge(r.node[1], 0), PULSE_OK);
  pulse_gossip_finish_figures fi;
  for (uint32_t i = 0; i < n; i++) {
    cr_assert_eq(pulse_gossip_finish(r.node[i], &fi), PULSE_OK);
    cr_assert_eq(fi.answered, i <= 1 ? 1u : 2u, "node %u mixed with %u", i,
                 fi.answered);
    if (i <= 1)
      cr_assert(fabs(fi.self_weight - 2.0 / 3) < 1e-15, "%g", fi.self_weight);
  }
  /* Both ends took the same decision: the mean did not move. */
  node_mean(&r, mean1);
  for (uint32_t p = 0; p < P_SMALL; p++)
    cr_assert(fabs(mean1[p] - mean0[p]) <= 1e-6 * fmax(1.0, fabs(mean0[p])),
              "param %u: mean %.9g became %.9g", p, mean0[p], mean1[p]);
  /* The edge's copies are in step: every later payload is accepted (gt_round
   * asserts it) and the replicas reach that mean. */
  for (uint64_t round = 2; round < 60; round++)
    gt_round(&r, round, g, NULL);
  cr_assert(gt_variance(&r) < 1e-10, "%g", gt_variance(&r));
  node_mean(&r, mean1);
  for (uint32_t p = 0; p < P_SMALL; p++)
    cr_assert(fabs(mean1[p] - mean0[p]) <= 1e-5 * fmax(1.0, fabs(mean0[p])),
              "param %u: mean %.9g became %.9g", p, mean0[p], mean1[p]);
  pulse_gossip_graph_free(g);
  gt_run_free(&r);
  free(init), free(mean0), free(mean1);
}

Test(loco, gossip_refuses_payloads_of_another_round_sender_or_copy) {
  const uint32_t n = 3;
  float *init = malloc(P_SMALL * sizeof *init);
  fill_init(init, P_SMALL, 4);
  gt_run r;
  gt_run_init(&r, n, P_SMALL, PULSE_LOCO_GATE_BF16, init);
  pulse_gossip_graph *g;
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_COMPLETE, n, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g), PULSE_OK);
  perturb(&r, 9, 0.05);
  gt_round(&r, 0, g, NULL);
  perturb(&r, 10, 0.05);
  for (uint32_t i = 0; i < n; i++)
    cr_assert_eq(pulse_gossip_prepare(r.node[i], 5, g, NULL), PULSE_OK);
  const uint8_t *d;
  size_t sz;
  cr_assert_eq(pulse_gossip_payload(r.node[1], 0, &d, &sz), PULSE_OK);
  uint8_t *copy = malloc(sz);
  memcpy(copy, d, sz);
  float before[8];
  memcpy(before, pulse_gossip_copy(r.node[0], 1, 0), sizeof before);
  /* 2's payload presented as 1's: another sender. */
  const uint8_t *d2;
  size_t sz2;
  cr_assert_eq(pulse_gossip_payload(r.node[2], 0, &d2, &sz2), PULSE_OK);
  cr_assert_eq(pulse_gossip_receive(r.node[0], 1, d2, sz2), PULSE_ERR_CORRUPT);
  /* Truncated, and every byte flipped in turn: an error or, when the flip
   * lands on a value bit, a different but valid payload; never a crash. */
  cr_assert_neq(pulse_gossip_receive(r.node[0], 1, copy, sz / 2), PULSE_OK);
  /* Not a neighbour in this round. */
  cr_assert_eq(pulse_gossip_receive(r.node[0], 0, copy, sz), PULSE_ERR_ARG);
  cr_assert_eq(memcmp(before, pulse_gossip_copy(r.node[0], 1, 0), sizeof before), 0);
  /* The copy out of step: base digest. */
  pulse_gossip *other;
  pulse_gossip_opts o;
  pulse_gossip_opts_init(&o);
  o.nodes = n, o.self = 0, o.param_count = P_SMALL, o.chunk_log2 = 10;
  float *shifted = malloc(P_SMALL * sizeof *shifted);
  for (uint32_t p = 0; p < P_SMALL; p++)
    shifted[p] = init[p] * 1.5f;
  cr_assert_eq(pulse_gossip_create(&o, shifted, &other), PULSE_OK);
  cr_assert_eq(pulse_gossip_prepare(other, 5, g, NULL), PULSE_OK);
  cr_assert_eq(pulse_gossip_receive(other, 1, copy, sz), PULSE_ERR_BASE_DIGEST);
  pulse_gossip_free(other);
  /* Another round. */
  pulse_gossip *later;
  cr_assert_eq(pulse_gossip_create(&o, init, &later), PULSE_OK);
  cr_assert_eq(pulse_gossip_prepare(later, 6, g, NULL), PULSE_OK);
  cr_assert_eq(pulse_gossip_receive(later, 1, copy, sz), PULSE_ERR_BASE_STEP);
  /* Rounds only go forward; one prepared at a time. */
  cr_assert_eq(pulse_gossip_prepare(later, 7, g, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_gossip_finish(later, NULL), PULSE_OK);
  cr_assert_eq(pulse_gossip_prepare(later, 6, g, NULL), PULSE_ERR_ARG);
  pulse_gossip_free(later);
  /* The good payload still goes in, once. */
  cr_assert_eq(pulse_gossip_receive(r.node[0], 1, copy, sz), PULSE_OK);
  cr_assert_eq(pulse_gossip_receive(r.node[0], 1, copy, sz), PULSE_ERR_ARG);
  for (uint32_t i = 0; i < n; i++)
    cr_assert_eq(pulse_gossip_finish(r.node[i], NULL), PULSE_OK);
  free(copy), free(shifted), free(init);
  pulse_gossip_graph_free(g);
  gt_run_free(&r);
}

/* x <- W x for a dense copy of a graph's W (n <= 16). */
static void mix_dense(const pulse_gossip_graph *g, double *x, uint32_t n) {
  double y[16];
  for (uint32_t i = 0; i < n; i++) {
    y[i] = 0.0;
    for (uint32_t j = 0; j < n; j++)
      y[i] += pulse_gossip_graph_weight(g, i, j) * x[j];
  }
  memcpy(x, y, n * sizeof *x);
}

/* The adaptive policy: starts with one one-peer step, takes more while the
 * variance is above target and fewer when well below, never spends past
 * its budget; each step is a perfect matching and log2 N steps make the
 * exact average. */
Test(loco, adaptive_policy_climbs_descends_and_keeps_its_budget) {
  pulse_gossip_policy_opts o;
  pulse_gossip_policy_opts_init(&o);
  o.nodes = 16;
  o.target = 1.0;
  o.budget = 0.25;
  pulse_gossip_policy *p;
  cr_assert_eq(pulse_gossip_policy_create(&o, &p), PULSE_OK);
  pulse_gossip_decision d;
  pulse_gossip_graph *g;
  double spent = 0.0, unit = 100.0;
  uint32_t last = 0, peak = 0, exact = 0;
  for (uint64_t round = 0; round < 40; round++) {
    double measured = round == 0 ? NAN : round < 20 ? 10.0 : 0.1;
    cr_assert_eq(pulse_gossip_policy_decide(p, round, measured, spent, unit, unit,
                                            &g, &d), PULSE_OK);
    cr_assert(d.reason != NULL);
    cr_assert(d.steps >= 1 && d.steps <= 4, "%u steps", d.steps);
    if (round == 0)
      cr_assert_eq(d.steps, 1);
    if (round > 0 && round < 20)
      cr_assert(d.steps >= last || strstr(d.reason, "budget"), "%s", d.reason);
    if (round > 21 && last > 1)
      cr_assert(d.steps < last);
    /* Every step a perfect matching; the round's steps average over
     * 2^steps nodes, all 16 (every replica the mean) with 4 of them. */
    double x[16];
    for (uint32_t i = 0; i < 16; i++)
      x[i] = (double)(i * i % 7) + 0.25 * i;
    for (uint32_t k = 0; k < d.steps; k++) {
      pulse_gossip_graph *s;
      cr_assert_eq(pulse_gossip_policy_step_graph(p, k, &s), PULSE_OK);
      for (uint32_t i = 0; i < 16; i++)
        cr_assert_eq(pulse_gossip_graph_degree(s, i), d.degree);
      cr_assert_eq(pulse_gossip_graph_check(s, 1e-12), PULSE_ERR_CORRUPT,
                   "a matching is not connected");
      mix_dense(s, x, 16);
      pulse_gossip_graph_free(s);
    }
    pulse_gossip_graph *none;
    cr_assert_eq(pulse_gossip_policy_step_graph(p, d.steps, &none),
                 PULSE_ERR_ARG);
    cr_assert_eq(none, NULL);
    cr_assert_eq(pulse_gossip_graph_degree(g, 5), d.degree);
    pulse_gossip_graph_free(g);
    if (d.steps == 4) {
      exact++;
      for (uint32_t i = 1; i < 16; i++)
        cr_assert(fabs(x[i] - x[0]) < 1e-12, "node %u: %g vs %g", i, x[i],
                  x[0]);
    }
    if (d.steps > peak)
      peak = d.steps;
    last = d.steps;
    spent += 16.0 * d.steps * unit;
    cr_assert(spent <= 0.25 * (round + 1) * 16 * 15 * unit + 1e-9,
              "round %llu: spent %g", (unsigned long long)round, spent);
  }
  cr_assert(peak >= 3 && exact > 0, "never climbed: %u", peak);
  cr_assert_eq(last, 1);
  cr_assert_eq(pulse_gossip_policy_decide(p, 39, 1.0, spent, unit, 0.0, &g, &d),
               PULSE_ERR_ARG, "a round not after the last");
  pulse_gossip_policy_free(p);
  /* The reference price: steps cost the mean payload, the complete graph
   * the first step's (a whole round's change). Priced alike, 4 steps a
   * round (4 of 15 payloads) are over a quarter and some rounds take 3;
   * with the complete graph's payloads 1.2x the mean, every round after
   * the climb takes 4. */
  for (int priced = 0; priced < 2; priced++) {
    cr_assert_eq(pulse_gossip_policy_create(&o, &p), PULSE_OK);
    uint32_t fewer = 0;
    spent = 0.0;
    for (uint64_t round = 0; round < 40; round++) {
      cr_assert_eq(pulse_gossip_policy_decide(p, round, round ? 10.0 : NAN,
                                              spent, unit,
                                              priced ? 1.2 * unit : 0.0, &g,
                                              &d), PULSE_OK);
      fewer += round >= 4 && d.steps < 4;
      spent += 16.0 * d.steps * unit;
      pulse_gossip_graph_free(g);
    }
    if (priced)
      cr_assert_eq(fewer, 0, "%u rounds under 4 steps", fewer);
    else
      cr_assert_gt(fewer, 0);
    pulse_gossip_policy_free(p);
  }
  /* A known length: the last 2 rounds are exact (4 steps), and the whole
   * run still spends at most the budget (set aside from the start). */
  o.rounds = 20;
  o.final_rounds = 2;
  cr_assert_eq(pulse_gossip_policy_create(&o, &p), PULSE_OK);
  spent = 0.0;
  for (uint64_t round = 0; round < 20; round++) {
    cr_assert_eq(pulse_gossip_policy_decide(p, round, round ? 10.0 : NAN,
                                            spent, unit, 0.0, &g, &d), PULSE_OK);
    if (round >= 18)
      cr_assert_eq(d.steps, 4, "round %llu", (unsigned long long)round);
    spent += 16.0 * d.steps * unit;
    pulse_gossip_graph_free(g);
  }
  cr_assert_leq(spent, 0.25 * 20 * 16 * 15 * unit, "spent %g", spent);
  pulse_gossip_policy_free(p);
  o.final_rounds = 20;
  cr_assert_eq(pulse_gossip_policy_create(&o, &p), PULSE_ERR_ARG);
  o.final_rounds = 0;
  o.nodes = 12;
  cr_assert_eq(pulse_gossip_policy_create(&o, &p), PULSE_ERR_ARG);
}
