/* pulse_gossip.h - decentralized training: trainers average only with their
 * neighbours in a communication graph (docs/design.md), with
 * compressed gossip in the CHOCO pattern (Koloskova et al.
 * 2019) over PULSELoCo's payload format (docs/formats/loco-payload.md).
 *
 * Graphs. A pulse_gossip_graph is an undirected graph on N nodes and its
 * mixing matrix W: symmetric, doubly stochastic, w_ij > 0 exactly on the
 * edges and the diagonal. Built in (ring, 2-D torus, exponential with
 * neighbours at distance 2^k, complete, and the time-varying one-peer
 * exponential graph), from an edge list, or read from a text file that is
 * checked (connected, no self-loops, nodes in range, rows summing to one).
 *
 * Gossip. One pulse_gossip per trainer holds its parameters x (P floats,
 * which the caller's local steps change in place) and, per edge (i, j) it
 * ever used, two public copies both ends hold bit for bit: c_i@j (what j
 * knows of i) and c_j@i. A round on graph G:
 *
 *   pulse_gossip_prepare    for each neighbour j: s = c_i@j - x; the
 *                           entries whose change is BF16-visible (the
 *                           PULSELoCo gate, bf16(c) != bf16(c - s)) become
 *                           the payload to j; the rest waits in x - c_i@j
 *                           (the error feedback: nothing is dropped)
 *   ... exchange: each payload to its neighbour (in memory, or HTTP)
 *   pulse_gossip_receive    j's payload, checked (sender, round, base
 *                           digest of c_j@i) and held for finish
 *   pulse_gossip_drop_edge  (only when j says it did not get i's payload)
 *   pulse_gossip_finish     for each neighbour that answered and was not
 *                           dropped: c_j@i and c_i@j updated;
 *                           x += gamma * sum_j w_ij (c_j@i - c_i@j), summed
 *                           in double in increasing j; a neighbour that did
 *                           not answer is left out of this round and its
 *                           weight goes to the self weight (the row still
 *                           sums to one and stays symmetric with the
 *                           neighbour's, so the mean is kept)
 *
 * An edge takes part in a round only when both ends got each other's
 * payload. A failure seen by one end only (its fetch failed, the peer's
 * succeeded) is repaired by telling the end that did get its payload
 * through (pulse_gossip_drop_edge, e.g. from the peer's acknowledgement):
 * then both ends leave the edge out of the round, copies and mix alike,
 * and it is in step for the next one. Without that call such an edge goes
 * out of step: the next payload on it is refused by its base digest and
 * the edge stays out of the mix.
 *
 * With a symmetric W the mixing terms of the two ends of an edge cancel:
 * the sum of x over the trainers is what the local steps made it (up to
 * float rounding). Copies start at the common initial parameters, so an
 * edge first used late (a time-varying graph) starts from there.
 *
 * Thread-safety: a graph is read-only after creation and may be shared; a
 * gossip context is used by one thread at a time. Errors: a non-OK
 * pulse_status with details in pulse_error_detail(). Nothing here prints to
 * stdout. */
#ifndef PULSE_GOSSIP_H
#define PULSE_GOSSIP_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_loco.h" /* pulse_loco_gate_mode, pulse_loco_value_coding */
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ graphs */

typedef struct pulse_gossip_graph pulse_gossip_graph;

#define PULSE_GOSSIP_MAX_NODES 4096u

/* Built-in topologies. */
typedef enum {
  PULSE_GOSSIP_RING = 0,        /* i +- 1 */
  PULSE_GOSSIP_TORUS = 1,       /* 2-D r x c grid with wrap-around, r <= c,
                                   r the largest divisor of N <= sqrt(N) */
  PULSE_GOSSIP_EXPONENTIAL = 2, /* i +- 2^k for 2^k < N */
  PULSE_GOSSIP_COMPLETE = 3,
  PULSE_GOSSIP_ONE_PEER_EXP = 4 /* time-varying: at round t, i pairs with
                                   i XOR 2^(t mod log2 N); N a power of 2 */
} pulse_gossip_topology;

/* Mixing weights of an edge list. */
typedef enum {
  /* Metropolis-Hastings: w_ij = 1 / (1 + max(d_i, d_j)). */
  PULSE_GOSSIP_WEIGHTS_MH = 0,
  /* Uniform (maximum degree): w_ij = 1 / (1 + d_max), 1/(d+1) on a regular
   * graph. */
  PULSE_GOSSIP_WEIGHTS_UNIFORM = 1
} pulse_gossip_weights;

/** Builds topology `t` on `nodes` nodes (1..PULSE_GOSSIP_MAX_NODES; the
 * one-peer graph needs a power of two) for round `round` (only the
 * time-varying one-peer graph depends on it: one round of it is a perfect
 * matching, connected only over log2 N rounds). Duplicate neighbours of
 * small N (a ring of 2, a torus of width 2) are one edge.
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_graph_make(pulse_gossip_topology t, uint32_t nodes,
                                     uint64_t round, pulse_gossip_weights w,
                                     pulse_gossip_graph **out);

/** Builds a graph from `count` undirected edges (pairs of node ids; either
 * order; duplicates refused) with weights `w`. The graph must be connected.
 * @return PULSE_OK; PULSE_ERR_ARG (node out of range, self-loop, duplicate
 * edge, disconnected: the reason in the detail); PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_graph_from_edges(uint32_t nodes,
                                           const uint32_t (*edges)[2],
                                           size_t count, pulse_gossip_weights w,
                                           pulse_gossip_graph **out);

/** Parses a graph file (untrusted text of `size` bytes):
 *
 *     pulse-graph 1
 *     nodes N
 *     edge I J [W]        one per undirected edge
 *     self I W            only with weighted edges: node I's own weight
 *
 * '#' starts a comment. Either no edge has a weight (then `w` computes them)
 * or every edge and every node's self line has one; each row of the
 * resulting W must then sum to one within 1e-9 (W is symmetric by
 * construction, so columns do too).
 * @return PULSE_OK; PULSE_ERR_CORRUPT with the reason (line number and what:
 * syntax, unknown node, self-loop, duplicate edge, disconnected, weights not
 * summing to one, negative or missing weights); PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_graph_parse(const char *text, size_t size,
                                      pulse_gossip_weights w,
                                      pulse_gossip_graph **out);

/** Reads and parses a graph file (at most 16 MiB).
 * @return as pulse_gossip_graph_parse, or PULSE_ERR_IO. */
pulse_status pulse_gossip_graph_load(const char *path, pulse_gossip_weights w,
                                     pulse_gossip_graph **out);

/** Frees a graph. NULL is fine. */
void pulse_gossip_graph_free(pulse_gossip_graph *g);

uint32_t pulse_gossip_graph_nodes(const pulse_gossip_graph *g);
/** Undirected edges. */
uint64_t pulse_gossip_graph_edge_count(const pulse_gossip_graph *g);
uint32_t pulse_gossip_graph_degree(const pulse_gossip_graph *g, uint32_t i);
/** Node i's neighbours in increasing order (degree entries; borrowed for
 * the graph's life). */
const uint32_t *pulse_gossip_graph_neighbours(const pulse_gossip_graph *g,
                                              uint32_t i);
/** w_ij (i == j: the self weight; 0 when not neighbours or out of range). */
double pulse_gossip_graph_weight(const pulse_gossip_graph *g, uint32_t i,
                                 uint32_t j);

/** Checks what the gossip relies on: W symmetric, non-negative, rows and
 * columns summing to one within tol, the graph connected (one round of a
 * time-varying graph, e.g. a one-peer matching, is not: check its weights
 * and the union of its rounds).
 * @return PULSE_OK or PULSE_ERR_CORRUPT with the reason. */
pulse_status pulse_gossip_graph_check(const pulse_gossip_graph *g, double tol);

/** The eigenvalues of W in decreasing order into eig (N doubles; the first
 * is 1). Jacobi rotations: meant for N up to a few hundred.
 * @return PULSE_OK, PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_graph_eigenvalues(const pulse_gossip_graph *g,
                                            double *eig);

/** The stationary across-replica variance, per unit of per-round noise
 * variance, of x <- W (x + xi) with xi independent N(0, 1) on every node
 * (mean over nodes of (x_i - mean)^2, measured after mixing): (1/N) times
 * the sum over the eigenvalues but the first of l^2 / (1 - l^2). 0 for the
 * complete graph with MH weights; infinite when disconnected.
 * @return the value, or NaN when the eigenvalues could not be computed. */
double pulse_gossip_graph_predicted_variance(const pulse_gossip_graph *g);

/** The same for a periodic sequence of graphs (period >= 1, one N): the
 * covariance recursion C <- W_t (C + I - J) W_t over enough periods to settle,
 * the variance averaged over the last period. Agrees with the spectral
 * value for period 1.
 * @return the value, or NaN (bad arguments, no memory). */
double pulse_gossip_predicted_variance_seq(const pulse_gossip_graph *const *seq,
                                           size_t period);

/* ------------------------------------------------------------------ gossip */

typedef struct pulse_gossip pulse_gossip;

/* Options; start from pulse_gossip_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_GOSSIP_OPTS_VERSION */
  uint32_t nodes;          /* N of every graph used */
  uint32_t self;           /* this trainer's id, < nodes */
  uint64_t param_count;    /* P >= 1, at most PULSE_LOCO_MAX_PARAMS */
  float gamma;             /* consensus step, (0, 1]; 1 with the BF16 gate */
  /* PULSE_LOCO_GATE_BF16: send the BF16-visible part; GATE_NONE: every
   * entry whose copy differs (exact gossip, the baseline). */
  pulse_loco_gate_mode gate;
  pulse_loco_value_coding values;
  pulse_pos_model pos_model; /* as pulse_loco_opts */
  uint32_t chunk_log2; /* 10..30 */
} pulse_gossip_opts;

#define PULSE_GOSSIP_OPTS_VERSION 1u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_gossip_opts_init(pulse_gossip_opts *opts);

/** Creates a trainer's gossip state with x = theta_init (P floats, copied;
 * the same on every trainer: edge copies start there).
 * @return PULSE_OK, PULSE_ERR_ARG (a bad option), PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_create(const pulse_gossip_opts *opts,
                                 const float *theta_init, pulse_gossip **out);

/** Frees a context. NULL is fine. */
void pulse_gossip_free(pulse_gossip *g);

/** This trainer's parameters x (P floats). The caller's local steps change
 * them in place between rounds (not between prepare and finish). Valid for
 * the context's life. */
float *pulse_gossip_params(pulse_gossip *g);

/** Sets the gate of the rounds prepared from now on (each payload says
 * its own, so receivers need no notice): e.g. one exact round (GATE_NONE)
 * that empties the error feedback where the replicas must agree.
 * @return PULSE_OK; PULSE_ERR_ARG (a round is prepared, unknown gate). */
pulse_status pulse_gossip_set_gate(pulse_gossip *g, pulse_loco_gate_mode gate);

/** What pulse_gossip_prepare did (may be NULL). */
typedef struct {
  uint64_t round;
  uint32_t neighbours;    /* payloads made */
  uint64_t entries;       /* over all of them */
  uint64_t payload_bytes; /* their encoded sizes summed */
} pulse_gossip_prepare_figures;

/** Starts round `round` (strictly greater than the last one) on graph
 * `graph` (borrowed until finish; N must match): makes one payload per
 * neighbour. Identical copies share one encoding.
 * @return PULSE_OK; PULSE_ERR_ARG (a round is prepared, a round not after
 * the last, N differs); PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_prepare(pulse_gossip *g, uint64_t round,
                                  const pulse_gossip_graph *graph,
                                  pulse_gossip_prepare_figures *info);

/** The payload this trainer sends to neighbour `to` in the prepared round
 * (borrowed until finish or free).
 * @return PULSE_OK; PULSE_ERR_ARG (no prepared round, `to` no neighbour). */
pulse_status pulse_gossip_payload(const pulse_gossip *g, uint32_t to,
                                  const uint8_t **data, size_t *size);

/** Takes neighbour `from`'s payload of the prepared round (untrusted bytes):
 * decoded against this trainer's copy of `from`, whose digest must be the
 * payload's base, and held until finish applies it to that copy (unless
 * the edge is dropped).
 * @return PULSE_OK; PULSE_ERR_ARG (no prepared round, `from` no neighbour,
 * already received); PULSE_ERR_BASE_STEP (another round);
 * PULSE_ERR_CORRUPT (another sender); PULSE_ERR_BASE_DIGEST (the copies
 * differ); a decode error. Nothing changes on error. */
pulse_status pulse_gossip_receive(pulse_gossip *g, uint32_t from,
                                  const uint8_t *data, size_t size);

/** Leaves neighbour `peer` out of the prepared round at this end: call it
 * when the peer reports that it did not get this trainer's payload (a
 * one-sided failure), so that finish neither commits this trainer's payload
 * to the peer's copy nor applies the peer's payload (if it came) nor mixes
 * with it, exactly as the peer does; the edge's weight goes to the self
 * weight at both ends (the mix stays symmetric, the mean is kept, the
 * copies stay in step).
 * @return PULSE_OK; PULSE_ERR_ARG (no prepared round, `peer` no
 * neighbour). */
pulse_status pulse_gossip_drop_edge(pulse_gossip *g, uint32_t peer);

/** What pulse_gossip_finish did (may be NULL). */
typedef struct {
  uint64_t round;
  uint32_t neighbours; /* of the graph */
  uint32_t answered;   /* whose payload arrived and who got ours (not
                          dropped): mixed */
  double self_weight;  /* after moving the missing ones' weight there */
} pulse_gossip_finish_figures;

/** Ends the prepared round: commits this trainer's payloads to the
 * neighbours that answered and mixes x with them (see the top). A
 * neighbour that did not answer is logged and left out.
 * @return PULSE_OK, PULSE_ERR_ARG (no prepared round). */
pulse_status pulse_gossip_finish(pulse_gossip *g,
                                 pulse_gossip_finish_figures *info);

/* --------------------------------------------------------- adaptive graph */

/* The adaptive policy sets each round's communication as a number s of
 * one-peer steps (1 <= s <= log2 N, N a power of two): step k pairs i with
 * i XOR 2^d for the next dimension d of a sweep that goes on across the
 * rounds (the time-varying one-peer exponential graph), one gossip round
 * each (the caller runs them in order after its local steps). A step costs
 * one payload a node (the complete graph: N - 1) and log2 N steps make
 * every replica the exact average of the round, at log2 N / (N - 1) of the
 * complete graph's payloads. It steers by the measured replica variance:
 * above `target` one step more, below target / 2 one step less, and it
 * never takes more steps than keep the bytes sent so far within the budget
 * (`budget` times the bytes the complete graph would have sent, priced at
 * the size of a payload that carries a whole round's change). When the run's length is known, its
 * last `final_rounds` rounds take log2 N steps (the replicas end as the
 * average), their bytes set aside from the budget from the start. */
typedef struct pulse_gossip_policy pulse_gossip_policy;

typedef struct {
  uint32_t struct_version; /* PULSE_GOSSIP_POLICY_OPTS_VERSION */
  uint32_t nodes;          /* a power of two, >= 2 */
  double target;           /* variance to stay under (same units as measured) */
  double budget;           /* fraction of the complete graph's bytes, (0, 1] */
  pulse_gossip_weights weights;
  uint64_t rounds;       /* the run's length; 0 when unknown */
  uint32_t final_rounds; /* complete-graph rounds at the end (with rounds) */
} pulse_gossip_policy_opts;

#define PULSE_GOSSIP_POLICY_OPTS_VERSION 1u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_gossip_policy_opts_init(pulse_gossip_policy_opts *opts);

/* One decision (the log). */
typedef struct {
  uint64_t round;
  double measured;     /* the variance it was given */
  uint32_t rung;       /* steps - 1 */
  uint32_t degree;     /* of every node in each step's graph: 1 */
  const char *reason;  /* static text: "variance above target", ... */
  uint32_t steps;      /* one-peer steps this round (payloads a node) */
  uint32_t first_dim;  /* step k uses dimension (first_dim + k) % log2 N */
  double target;       /* the target it steered by */
} pulse_gossip_decision;

pulse_status pulse_gossip_policy_create(const pulse_gossip_policy_opts *opts,
                                        pulse_gossip_policy **out);
void pulse_gossip_policy_free(pulse_gossip_policy *p); /* NULL is fine */

/** Replaces the target (e.g. once the first round measured the noise that
 * sets it). @return PULSE_OK or PULSE_ERR_ARG (not finite and positive). */
pulse_status pulse_gossip_policy_set_target(pulse_gossip_policy *p,
                                            double target);

/** Decides round `round` (after the last decided one) from the last
 * measured variance (NaN before the first measurement), the bytes all
 * nodes sent so far, the bytes of one payload (mean over the last round;
 * prices the steps) and the bytes of one payload of the last round's first
 * step (its copies are a round old: it carries a whole round's change, as
 * every payload of the complete graph does; prices the budget's reference;
 * <= 0: payload_bytes). *graph is the round's first step (owned by the
 * caller; pulse_gossip_policy_step_graph gives every step). The decision
 * is logged (info level) and returned in *d (may be NULL).
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_policy_decide(pulse_gossip_policy *p, uint64_t round,
                                        double measured, double bytes_so_far,
                                        double payload_bytes,
                                        double full_payload_bytes,
                                        pulse_gossip_graph **graph,
                                        pulse_gossip_decision *d);

/** Step `step` (< the last decision's steps) of the last decided round:
 * a perfect matching along one hypercube dimension, MH (or the policy's)
 * weights 1/2. *graph is owned by the caller.
 * @return PULSE_OK, PULSE_ERR_ARG (no such step), PULSE_ERR_NOMEM. */
pulse_status pulse_gossip_policy_step_graph(const pulse_gossip_policy *p,
                                            uint32_t step,
                                            pulse_gossip_graph **graph);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_GOSSIP_H */
