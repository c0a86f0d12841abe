/* graph.c - gossip graphs (pulse_gossip.h): edge lists turned into
 * compressed rows with symmetric doubly stochastic weights, the built-in
 * topologies, and the checks the gossip relies on. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"
#include "status_impl.h"

/* ----------------------------------------------------------- edge lists */

pulse_status graph_edges_add(graph_edges *l, uint32_t a, uint32_t b, double w) {
  if (a >= l->n || b >= l->n)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: edge %u-%u names a node "
                      "outside 0..%u", a, b, l->n - 1u);
  if (a == b)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: self-loop at node %u", a);
  if (l->count == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 64;
    uint32_t(*e)[2] = realloc(l->e, cap * sizeof *e);
    if (e == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "gossip graph: edges");
    l->e = e;
    double *nw = realloc(l->w, cap * sizeof *nw);
    if (nw == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "gossip graph: weights");
    l->w = nw;
    l->cap = cap;
  }
  l->e[l->count][0] = a < b ? a : b;
  l->e[l->count][1] = a < b ? b : a;
  l->w[l->count] = w;
  l->count++;
  return PULSE_OK;
}

void graph_edges_free(graph_edges *l) {
  free(l->e);
  free(l->w);
  l->e = NULL, l->w = NULL, l->count = l->cap = 0;
}

/* ---------------------------------------------------------------- build */

void pulse_gossip_graph_free(pulse_gossip_graph *g) {
  if (g == NULL)
    return;
  free(g->start), free(g->nbr), free(g->w), free(g->self);
  free(g);
}

int graph_connected(const pulse_gossip_graph *g) {
  uint32_t *stack = malloc(g->n * sizeof *stack);
  uint8_t *seen = calloc(g->n, 1);
  if (stack == NULL || seen == NULL) {
    free(stack), free(seen);
    return -1;
  }
  uint32_t top = 0, reached = 1;
  stack[top++] = 0;
  seen[0] = 1;
  while (top > 0) {
    uint32_t i = stack[--top];
    for (uint64_t k = g->start[i]; k < g->start[i + 1]; k++) {
      uint32_t j = g->nbr[k];
      if (!seen[j]) {
        seen[j] = 1;
        reached++;
        stack[top++] = j;
      }
    }
  }
  free(stack), free(seen);
  return reached == g->n;
}

typedef struct {
  uint32_t j;
  double w;
} graph_slot;

static int cmp_slot(const void *a, const void *b) {
  uint32_t x = ((const graph_slot *)a)->j, y = ((const graph_slot *)b)->j;
  return x < y ? -1 : x > y;
}

pulse_status graph_build(const graph_edges *l, pulse_gossip_weights wmode,
                         const double *self, int need_connected,
                         pulse_gossip_graph **out) {
  *out = NULL;
  uint32_t n = l->n;
  if (l->weighted && self == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: weighted edges without "
                      "self weights");
  if (wmode != PULSE_GOSSIP_WEIGHTS_MH && wmode != PULSE_GOSSIP_WEIGHTS_UNIFORM)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: unknown weights %d",
                      (int)wmode);
  pulse_gossip_graph *g = calloc(1, sizeof *g);
  if (g == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip graph");
  g->n = n;
  g->edges = l->count;
  g->start = calloc((size_t)n + 1, sizeof *g->start);
  g->nbr = malloc((2 * l->count + 1) * sizeof *g->nbr);
  g->w = malloc((2 * l->count + 1) * sizeof *g->w);
  g->self = malloc(n * sizeof *g->self);
  uint64_t *fill = calloc(n, sizeof *fill);
  if (!g->start || !g->nbr || !g->w || !g->self || !fill) {
    free(fill);
    pulse_gossip_graph_free(g);
    return pulse_fail(PULSE_ERR_NOMEM, "gossip graph: rows");
  }
  for (size_t k = 0; k < l->count; k++) {
    g->start[l->e[k][0] + 1]++;
    g->start[l->e[k][1] + 1]++;
  }
  for (uint32_t i = 0; i < n; i++)
    g->start[i + 1] += g->start[i];
  /* Rows in the list's order (with the given weights), then sorted by
   * neighbour so duplicates sit side by side. */
  graph_slot *slot = malloc((2 * l->count + 1) * sizeof *slot);
  if (slot == NULL) {
    free(fill);
    pulse_gossip_graph_free(g);
    return pulse_fail(PULSE_ERR_NOMEM, "gossip graph: rows");
  }
  for (size_t k = 0; k < l->count; k++) {
    uint32_t a = l->e[k][0], b = l->e[k][1];
    double w = l->weighted ? l->w[k] : 0.0;
    slot[g->start[a] + fill[a]++] = (graph_slot){b, w};
    slot[g->start[b] + fill[b]++] = (graph_slot){a, w};
  }
  free(fill);
  uint32_t dmax = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint64_t d = g->start[i + 1] - g->start[i];
    qsort(slot + g->start[i], (size_t)d, sizeof *slot, cmp_slot);
    for (uint64_t k = g->start[i]; k < g->start[i + 1]; k++) {
      g->nbr[k] = slot[k].j;
      g->w[k] = slot[k].w;
      if (k > g->start[i] && slot[k].j == slot[k - 1].j) {
        uint32_t j = slot[k].j;
        free(slot);
        pulse_gossip_graph_free(g);
        return pulse_fail(PULSE_ERR_ARG,
                          "gossip graph: duplicate edge %u-%u", i, j);
      }
    }
    if (d > dmax)
      dmax = (uint32_t)d;
  }
  free(slot);
  int conn = need_connected ? graph_connected(g) : 1;
  if (conn != 1) {
    pulse_gossip_graph_free(g);
    return conn < 0 ? pulse_fail(PULSE_ERR_NOMEM, "gossip graph")
                    : pulse_fail(PULSE_ERR_ARG,
                                 "gossip graph: disconnected (not every node "
                                 "is reachable from node 0)");
  }
  for (uint32_t i = 0; i < n; i++) {
    double sum = 0.0;
    uint64_t di = g->start[i + 1] - g->start[i];
    for (uint64_t k = g->start[i]; k < g->start[i + 1]; k++) {
      uint32_t j = g->nbr[k];
      double w = g->w[k];
      if (l->weighted) {
        /* given with the edge */
      } else if (wmode == PULSE_GOSSIP_WEIGHTS_MH) {
        uint64_t dj = g->start[j + 1] - g->start[j];
        w = 1.0 / (1.0 + (double)(di > dj ? di : dj));
      } else {
        w = 1.0 / (1.0 + (double)dmax);
      }
      g->w[k] = w;
      sum += w;
    }
    g->self[i] = l->weighted ? self[i] : 1.0 - sum;
  }
  *out = g;
  return PULSE_OK;
}

static pulse_status from_edges(uint32_t nodes, const uint32_t (*edges)[2],
                               size_t count, pulse_gossip_weights w,
                               int need_connected, pulse_gossip_graph **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: NULL output");
  *out = NULL;
  if (nodes == 0 || nodes > PULSE_GOSSIP_MAX_NODES || (count > 0 && !edges))
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: %u nodes (1..%u)", nodes,
                      PULSE_GOSSIP_MAX_NODES);
  graph_edges l = {nodes, 0, 0, NULL, NULL, 0};
  pulse_status st = PULSE_OK;
  for (size_t k = 0; k < count && st == PULSE_OK; k++)
    st = graph_edges_add(&l, edges[k][0], edges[k][1], 0.0);
  if (st == PULSE_OK)
    st = graph_build(&l, w, NULL, need_connected, out);
  graph_edges_free(&l);
  return st;
}

pulse_status pulse_gossip_graph_from_edges(uint32_t nodes,
                                           const uint32_t (*edges)[2],
                                           size_t count, pulse_gossip_weights w,
                                           pulse_gossip_graph **out) {
  return from_edges(nodes, edges, count, w, 1, out);
}

pulse_status graph_from_edges_any(uint32_t nodes, const uint32_t (*edges)[2],
                                  size_t count, pulse_gossip_weights w,
                                  pulse_gossip_graph **out) {
  return from_edges(nodes, edges, count, w, 0, out);
}

/* -------------------------------------------------------------- builtins */

/* Largest divisor of n not above sqrt(n). */
static uint32_t torus_rows(uint32_t n) {
  uint32_t r = 1;
  for (uint32_t d = 1; (uint64_t)d * d <= n; d++)
    if (n % d == 0)
      r = d;
  return r;
}

/* Adds {a, b} unless it is a self-loop or already in the list (small N). */
static pulse_status add_once(graph_edges *l, uint32_t a, uint32_t b) {
  if (a == b)
    return PULSE_OK;
  uint32_t x = a < b ? a : b, y = a < b ? b : a;
  for (size_t k = 0; k < l->count; k++)
    if (l->e[k][0] == x && l->e[k][1] == y)
      return PULSE_OK;
  return graph_edges_add(l, x, y, 0.0);
}

pulse_status pulse_gossip_graph_make(pulse_gossip_topology t, uint32_t n,
                                     uint64_t round, pulse_gossip_weights w,
                                     pulse_gossip_graph **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: NULL output");
  *out = NULL;
  if (n == 0 || n > PULSE_GOSSIP_MAX_NODES)
    return pulse_fail(PULSE_ERR_ARG, "gossip graph: %u nodes (1..%u)", n,
                      PULSE_GOSSIP_MAX_NODES);
  graph_edges l = {n, 0, 0, NULL, NULL, 0};
  pulse_status st = PULSE_OK;
  switch (t) {
  case PULSE_GOSSIP_RING:
    for (uint32_t i = 0; i < n && st == PULSE_OK; i++)
      st = add_once(&l, i, (i + 1) % n);
    break;
  case PULSE_GOSSIP_TORUS: {
    uint32_t r = torus_rows(n), c = n / r;
    for (uint32_t i = 0; i < n && st == PULSE_OK; i++) {
      uint32_t row = i / c, col = i % c;
      st = add_once(&l, i, row * c + (col + 1) % c);
      if (st == PULSE_OK)
        st = add_once(&l, i, ((row + 1) % r) * c + col);
    }
    break;
  }
  case PULSE_GOSSIP_EXPONENTIAL:
    for (uint32_t i = 0; i < n && st == PULSE_OK; i++)
      for (uint64_t d = 1; d < n && st == PULSE_OK; d *= 2)
        st = add_once(&l, i, (uint32_t)((i + d) % n));
    break;
  case PULSE_GOSSIP_COMPLETE:
    for (uint32_t i = 0; i < n && st == PULSE_OK; i++)
      for (uint32_t j = i + 1; j < n && st == PULSE_OK; j++)
        st = graph_edges_add(&l, i, j, 0.0);
    break;
  case PULSE_GOSSIP_ONE_PEER_EXP: {
    if (n & (n - 1u)) {
      st = pulse_fail(PULSE_ERR_ARG, "gossip graph: the one-peer exponential "
                      "graph needs a power-of-two node count, not %u", n);
      break;
    }
    uint32_t L = 0;
    while ((1u << L) < n)
      L++;
    if (L == 0)
      break;
    uint32_t bit = 1u << (round % L);
    for (uint32_t i = 0; i < n && st == PULSE_OK; i++)
      if ((i & bit) == 0)
        st = graph_edges_add(&l, i, i | bit, 0.0);
    break;
  }
  default:
    st = pulse_fail(PULSE_ERR_ARG, "gossip graph: unknown topology %d", (int)t);
  }
  if (st == PULSE_OK)
    st = graph_build(&l, w, NULL, t != PULSE_GOSSIP_ONE_PEER_EXP, out);
  graph_edges_free(&l);
  return st;
}

/* ------------------------------------------------------------- accessors */

uint32_t pulse_gossip_graph_nodes(const pulse_gossip_graph *g) { return g->n; }

uint64_t pulse_gossip_graph_edge_count(const pulse_gossip_graph *g) {
  return g->edges;
}

uint32_t pulse_gossip_graph_degree(const pulse_gossip_graph *g, uint32_t i) {
  return i < g->n ? (uint32_t)(g->start[i + 1] - g->start[i]) : 0;
}

const uint32_t *pulse_gossip_graph_neighbours(const pulse_gossip_graph *g,
                                              uint32_t i) {
  return i < g->n ? g->nbr + g->start[i] : NULL;
}

/* Index of j in i's row, or -1 (binary search: rows are sorted). */
static int64_t find(const pulse_gossip_graph *g, uint32_t i, uint32_t j) {
  uint64_t lo = g->start[i], hi = g->start[i + 1];
  while (lo < hi) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (g->nbr[mid] < j)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < g->start[i + 1] && g->nbr[lo] == j ? (int64_t)lo : -1;
}

double pulse_gossip_graph_weight(const pulse_gossip_graph *g, uint32_t i,
                                 uint32_t j) {
  if (i >= g->n || j >= g->n)
    return 0.0;
  if (i == j)
    return g->self[i];
  int64_t k = find(g, i, j);
  return k < 0 ? 0.0 : g->w[k];
}

double *graph_dense(const pulse_gossip_graph *g) {
  size_t n = g->n;
  double *W = calloc(n * n, sizeof *W);
  if (W == NULL)
    return NULL;
  for (uint32_t i = 0; i < g->n; i++) {
    W[i * n + i] = g->self[i];
    for (uint64_t k = g->start[i]; k < g->start[i + 1]; k++)
      W[i * n + g->nbr[k]] = g->w[k];
  }
  return W;
}

pulse_status pulse_gossip_graph_check(const pulse_gossip_graph *g,
                                      double tol) {
  if (g == NULL || !(tol >= 0.0))
    return pulse_fail(PULSE_ERR_ARG, "gossip graph check: bad arguments");
  double *colsum = calloc(g->n, sizeof *colsum);
  if (colsum == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip graph check");
  pulse_status st = PULSE_OK;
  for (uint32_t i = 0; i < g->n && st == PULSE_OK; i++) {
    double row = g->self[i];
    colsum[i] += g->self[i];
    if (!(g->self[i] >= 0.0))
      st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: node %u's self weight "
                      "%g is negative", i, g->self[i]);
    for (uint64_t k = g->start[i]; k < g->start[i + 1] && st == PULSE_OK; k++) {
      uint32_t j = g->nbr[k];
      if (j == i)
        st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: self-loop at %u", i);
      else if (!(g->w[k] > 0.0))
        st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: weight %u-%u is %g, "
                        "not positive", i, j, g->w[k]);
      else if (fabs(g->w[k] - pulse_gossip_graph_weight(g, j, i)) > tol)
        st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: w[%u][%u] = %.17g "
                        "but w[%u][%u] = %.17g (not symmetric)", i, j, g->w[k],
                        j, i, pulse_gossip_graph_weight(g, j, i));
      row += g->w[k];
      colsum[j] += g->w[k];
    }
    if (st == PULSE_OK && fabs(row - 1.0) > tol)
      st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: node %u's weights sum "
                      "to %.17g, not one", i, row);
  }
  for (uint32_t j = 0; j < g->n && st == PULSE_OK; j++)
    if (fabs(colsum[j] - 1.0) > tol)
      st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: column %u sums to "
                      "%.17g, not one", j, colsum[j]);
  free(colsum);
  if (st == PULSE_OK && graph_connected(g) != 1)
    st = pulse_fail(PULSE_ERR_CORRUPT, "gossip graph: disconnected");
  return st;
}
