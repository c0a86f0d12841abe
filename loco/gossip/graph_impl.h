/* graph_impl.h - private to loco/: the layout of a gossip graph (compressed
 * rows) shared by its builders, its file reader and its spectrum. */
#ifndef PULSE_GRAPH_IMPL_H
#define PULSE_GRAPH_IMPL_H

#include <stdint.h>

#include "pulse_gossip.h"

struct pulse_gossip_graph {
  uint32_t n;
  uint64_t edges;   /* undirected */
  uint64_t *start;  /* n + 1: node i's neighbours are nbr[start[i]..start[i+1]) */
  uint32_t *nbr;    /* increasing within a row */
  double *w;        /* w_ij, parallel to nbr */
  double *self;     /* w_ii */
};

/* An edge list being collected (pairs with a < b), then turned into rows. */
typedef struct {
  uint32_t n;
  size_t count, cap;
  uint32_t (*e)[2];
  double *w;    /* per edge (used when weighted) */
  int weighted; /* the weights are given: graph_build takes them */
} graph_edges;

/* Adds edge {a, b} (a != b, both < n) with weight w (ignored when the list
 * is unweighted). Duplicates are kept here and refused by graph_build. */
pulse_status graph_edges_add(graph_edges *l, uint32_t a, uint32_t b, double w);
void graph_edges_free(graph_edges *l);

/* Builds the rows from l: refuses duplicates and (need_connected) a
 * disconnected graph (PULSE_ERR_ARG with the reason); computes the weights with `w` when the
 * list is unweighted, else takes them with self weights `self` (n values,
 * required then).
 * Consumes nothing: the caller frees l. */
pulse_status graph_build(const graph_edges *l, pulse_gossip_weights w,
                         const double *self, int need_connected,
                         pulse_gossip_graph **out);

/* pulse_gossip_graph_from_edges without the connectivity requirement: one
 * round of a time-varying graph (a matching of the one-peer graph, a k-peer
 * rung of the adaptive policy) need not be connected; the rounds together
 * are. */
pulse_status graph_from_edges_any(uint32_t nodes, const uint32_t (*edges)[2],
                                  size_t count, pulse_gossip_weights w,
                                  pulse_gossip_graph **out);

/* 1 when every node is reachable from node 0. */
int graph_connected(const pulse_gossip_graph *g);

/* The dense W (n x n doubles, caller frees) or NULL (no memory). */
double *graph_dense(const pulse_gossip_graph *g);

#endif
