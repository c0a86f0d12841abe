/* test_graph.c - gossip graphs (loco/pulse_gossip.h): the built-in
 * topologies' mixing matrices are symmetric and doubly stochastic, the
 * one-peer graph averages exactly over log2 N rounds, the spectral variance
 * orders the topologies, and graph files that the gossip cannot use are
 * refused with the reason. */
#include <stdio.h>

#include "gossip_testutil.h"

static const pulse_gossip_topology static_topologies[] = {
    PULSE_GOSSIP_RING, PULSE_GOSSIP_TORUS, PULSE_GOSSIP_EXPONENTIAL,
    PULSE_GOSSIP_COMPLETE};

Test(loco, gossip_graphs_are_symmetric_doubly_stochastic_and_connected) {
  const uint32_t sizes[] = {1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 32};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (size_t t = 0; t < 4; t++)
      for (int w = 0; w < 2; w++) {
        uint32_t n = sizes[s];
        pulse_gossip_graph *g = NULL;
        cr_assert_eq(pulse_gossip_graph_make(static_topologies[t], n, 0,
                                             (pulse_gossip_weights)w, &g),
                     PULSE_OK);
        cr_assert_eq(pulse_gossip_graph_check(g, 1e-12), PULSE_OK,
                     "n %u topology %zu weights %d: %s", n, t, w,
                     pulse_error_detail());
        /* Independently of the check: rows and columns by hand. */
        for (uint32_t i = 0; i < n; i++) {
          double row = 0.0, col = 0.0;
          for (uint32_t j = 0; j < n; j++) {
            row += pulse_gossip_graph_weight(g, i, j);
            col += pulse_gossip_graph_weight(g, j, i);
            cr_assert_eq(pulse_gossip_graph_weight(g, i, j),
                         pulse_gossip_graph_weight(g, j, i));
          }
          cr_assert(fabs(row - 1.0) < 1e-12 && fabs(col - 1.0) < 1e-12);
        }
        pulse_gossip_graph_free(g);
      }
}

Test(loco, gossip_graph_degrees_are_the_topologys) {
  pulse_gossip_graph *g;
  struct {
    pulse_gossip_topology t;
    uint32_t n, degree;
  } cases[] = {{PULSE_GOSSIP_RING, 16, 2},        {PULSE_GOSSIP_TORUS, 16, 4},
               {PULSE_GOSSIP_TORUS, 12, 4},       {PULSE_GOSSIP_EXPONENTIAL, 16, 7},
               {PULSE_GOSSIP_EXPONENTIAL, 32, 9}, {PULSE_GOSSIP_COMPLETE, 16, 15},
               {PULSE_GOSSIP_RING, 2, 1}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    cr_assert_eq(pulse_gossip_graph_make(cases[c].t, cases[c].n, 0,
                                         PULSE_GOSSIP_WEIGHTS_MH, &g),
                 PULSE_OK);
    for (uint32_t i = 0; i < cases[c].n; i++)
      cr_assert_eq(pulse_gossip_graph_degree(g, i), cases[c].degree,
                   "case %zu node %u", c, i);
    pulse_gossip_graph_free(g);
  }
  /* Ring of 16 with MH weights: 1/3 each. */
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_RING, 16, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g), PULSE_OK);
  cr_assert(fabs(pulse_gossip_graph_weight(g, 0, 15) - 1.0 / 3) < 1e-15);
  cr_assert(fabs(pulse_gossip_graph_weight(g, 0, 0) - 1.0 / 3) < 1e-15);
  cr_assert_eq(pulse_gossip_graph_weight(g, 0, 2), 0.0);
  pulse_gossip_graph_free(g);
}

/* Irregular graph: MH and uniform weights differ but both are doubly
 * stochastic and symmetric. */
Test(loco, gossip_weights_of_an_irregular_graph_are_doubly_stochastic) {
  const uint32_t star[][2] = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {4, 5}};
  for (int w = 0; w < 2; w++) {
    pulse_gossip_graph *g;
    cr_assert_eq(pulse_gossip_graph_from_edges(6, star, 5,
                                               (pulse_gossip_weights)w, &g),
                 PULSE_OK);
    cr_assert_eq(pulse_gossip_graph_check(g, 1e-12), PULSE_OK, "%s",
                 pulse_error_detail());
    double expect = 1.0 / 5; /* MH 1/(1+max(4,1)); uniform 1/(1+dmax=4) */
    cr_assert(fabs(pulse_gossip_graph_weight(g, 0, 1) - expect) < 1e-15);
    cr_assert(fabs(pulse_gossip_graph_weight(g, 4, 5) -
                   (w == 0 ? 1.0 / 3 : 1.0 / 5)) < 1e-15);
    pulse_gossip_graph_free(g);
  }
}

/* One-peer exponential: every node has exactly one peer a round; the
 * product of log2 N consecutive rounds is the exact average J. */
Test(loco, one_peer_exponential_averages_exactly_over_log2_n_rounds) {
  const uint32_t n = 16;
  double x[16], y[16];
  uint64_t s = 5;
  double mean = 0.0;
  for (uint32_t i = 0; i < n; i++)
    mean += (x[i] = gt_normal(&s));
  mean /= n;
  for (uint64_t t = 3; t < 3 + 4; t++) {
    pulse_gossip_graph *g;
    cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_ONE_PEER_EXP, n, t,
                                         PULSE_GOSSIP_WEIGHTS_MH, &g),
                 PULSE_OK);
    for (uint32_t i = 0; i < n; i++) {
      cr_assert_eq(pulse_gossip_graph_degree(g, i), 1);
      y[i] = 0.0;
      for (uint32_t j = 0; j < n; j++)
        y[i] += pulse_gossip_graph_weight(g, i, j) * x[j];
    }
    memcpy(x, y, sizeof x);
    pulse_gossip_graph_free(g);
  }
  for (uint32_t i = 0; i < n; i++)
    cr_assert(fabs(x[i] - mean) < 1e-14, "node %u: %g vs %g", i, x[i], mean);
  pulse_gossip_graph *g;
  cr_assert_eq(pulse_gossip_graph_make(PULSE_GOSSIP_ONE_PEER_EXP, 12, 0,
                                       PULSE_GOSSIP_WEIGHTS_MH, &g),
               PULSE_ERR_ARG);
}

/* The spectral prediction: ring of N with MH weights has eigenvalues
 * 1/3 + 2/3 cos(2 pi k / N); the order is ring > torus > exponential >
 * complete = 0; the covariance recursion agrees with the spectrum. */
Test(loco, spectral_variance_orders_ring_torus_exponential_complete) {
  const uint32_t n = 16;
  double closed = 0.0;
  for (uint32_t k = 1; k < n; k++) {
    double l = 1.0 / 3 + 2.0 / 3 * cos(2 * 3.14159265358979323846 * k / n);
    closed += l * l / (1 - l * l);
  }
  closed /= n;
  double v[4];
  for (size_t t = 0; t < 4; t++) {
    pulse_gossip_graph *g;
    cr_assert_eq(pulse_gossip_graph_make(static_topologies[t], n, 0,
                                         PULSE_GOSSIP_WEIGHTS_MH, &g),
                 PULSE_OK);
    v[t] = pulse_gossip_graph_predicted_variance(g);
    const pulse_gossip_graph *seq[1] = {g};
    double rec = pulse_gossip_predicted_variance_seq(seq, 1);
    cr_assert(fabs(rec - v[t]) <= 1e-9 * (1 + v[t]), "topology %zu: %g vs %g",
              t, rec, v[t]);
    double eig[16];
    cr_assert_eq(pulse_gossip_graph_eigenvalues(g, eig), PULSE_OK);
    cr_assert(fabs(eig[0] - 1.0) < 1e-12);
    pulse_gossip_graph_free(g);
  }
  cr_assert(fabs(v[0] - closed) < 1e-9 * closed, "%g vs %g", v[0], closed);
  cr_assert(v[0] > v[1] && v[1] > v[2] && v[2] > v[3], "%g %g %g %g", v[0],
            v[1], v[2], v[3]);
  cr_assert(fabs(v[3]) < 1e-12);
}

static pulse_status parse(const char *text, pulse_gossip_graph **g) {
  return pulse_gossip_graph_parse(text, strlen(text), PULSE_GOSSIP_WEIGHTS_MH,
                                  g);
}

Test(loco, graph_files_are_read_with_computed_or_given_weights) {
  pulse_gossip_graph *g;
  cr_assert_eq(parse("pulse-graph 1\n# a path of 3\nnodes 3\nedge 0 1\n"
                     "edge 2 1  # either order\n", &g), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_gossip_graph_nodes(g), 3);
  cr_assert_eq(pulse_gossip_graph_edge_count(g), 2);
  cr_assert(fabs(pulse_gossip_graph_weight(g, 0, 1) - 1.0 / 3) < 1e-15);
  cr_assert(fabs(pulse_gossip_graph_weight(g, 0, 0) - 2.0 / 3) < 1e-15);
  pulse_gossip_graph_free(g);
  cr_assert_eq(parse("pulse-graph 1\nnodes 3\nedge 0 1 0.5\nedge 1 2 0.25\n"
                     "self 0 0.5\nself 1 0.25\nself 2 0.75\n", &g), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(pulse_gossip_graph_weight(g, 1, 2), 0.25);
  cr_assert_eq(pulse_gossip_graph_check(g, 1e-12), PULSE_OK);
  pulse_gossip_graph_free(g);
  /* Through a file. */
  char path[] = "/tmp/pulse_graph_XXXXXX";
  int fd = mkstemp(path);
  cr_assert(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("pulse-graph 1\nnodes 4\nedge 0 1\nedge 1 2\nedge 2 3\nedge 3 0\n", f);
  fclose(f);
  cr_assert_eq(pulse_gossip_graph_load(path, PULSE_GOSSIP_WEIGHTS_UNIFORM, &g),
               PULSE_OK);
  cr_assert_eq(pulse_gossip_graph_degree(g, 2), 2);
  pulse_gossip_graph_free(g);
  remove(path);
  cr_assert_eq(pulse_gossip_graph_load(path, PULSE_GOSSIP_WEIGHTS_MH, &g),
               PULSE_ERR_IO);
}

Test(loco, bad_graph_files_are_refused_with_the_reason) {
  struct {
    const char *text, *reason;
  } bad[] = {
      {"pulse-graph 1\nnodes 4\nedge 0 1\nedge 2 3\n", "disconnected"},
      {"pulse-graph 1\nnodes 3\nedge 0 1\nedge 1 1\nedge 1 2\n", "self-loop"},
      {"pulse-graph 1\nnodes 3\nedge 0 1\nedge 1 3\n", "unknown node 3"},
      {"pulse-graph 1\nnodes 3\nedge 0 1 0.5\nedge 1 2 0.5\nself 0 0.5\n"
       "self 1 0.25\nself 2 0.5\n", "sum to"},
      {"pulse-graph 1\nnodes 2\nedge 0 1 0.5\nself 0 0.5\n", "no 'self' line"},
      {"pulse-graph 1\nnodes 3\nedge 0 1 0.5\nedge 1 2\n", "every edge"},
      {"pulse-graph 1\nnodes 3\nedge 0 1\nedge 1 0\nedge 1 2\n", "duplicate"},
      {"pulse-graph 1\nnodes 2\nedge 0 1 -0.5\n", "not positive"},
      {"pulse-graph 1\nnodes 2\nedge 0 x\n", "node ids"},
      {"pulse-graph 2\nnodes 2\nedge 0 1\n", "version"},
      {"nodes 2\nedge 0 1\n", "pulse-graph"},
      {"pulse-graph 1\nedge 0 1\n", "before edges"},
      {"pulse-graph 1\nnodes 0\n", "needs N"},
      {"pulse-graph 1\nnodes 99999999999\n", "needs N"},
      {"pulse-graph 1\nnodes 2\nedge 0 1 nan\n", "finite"},
      {"pulse-graph 1\nnodes 2\nbogus 0 1\n", "unknown keyword"},
      {"", "no 'pulse-graph 1'"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    pulse_gossip_graph *g = (pulse_gossip_graph *)1;
    pulse_status st = parse(bad[i].text, &g);
    cr_assert_eq(st, PULSE_ERR_CORRUPT, "case %zu: status %d", i, (int)st);
    cr_assert_null(g, "case %zu", i);
    cr_assert(strstr(pulse_error_detail(), bad[i].reason) != NULL,
              "case %zu: '%s' lacks '%s'", i, pulse_error_detail(),
              bad[i].reason);
  }
  /* A NUL byte inside the text. */
  pulse_gossip_graph *g;
  const char nul[] = "pulse-graph 1\nnodes 2\nedge 0\0001\n";
  cr_assert_eq(pulse_gossip_graph_parse(nul, sizeof nul - 1,
                                        PULSE_GOSSIP_WEIGHTS_MH, &g),
               PULSE_ERR_CORRUPT);
  /* Edge lists: the same refusals as arguments. */
  const uint32_t loop[][2] = {{0, 0}}, far[][2] = {{0, 7}}, split[][2] = {{0, 1}};
  cr_assert_eq(pulse_gossip_graph_from_edges(2, loop, 1, 0, &g), PULSE_ERR_ARG);
  cr_assert_eq(pulse_gossip_graph_from_edges(2, far, 1, 0, &g), PULSE_ERR_ARG);
  cr_assert_eq(pulse_gossip_graph_from_edges(3, split, 1, 0, &g), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "disconnected") != NULL);
}
