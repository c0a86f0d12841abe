/* gossip.c - compressed gossip between graph neighbours (pulse_gossip.h):
 * per-edge public copies, the BF16 gate on the change relative to the copy
 * the neighbour holds, PULSELoCo payloads (docs/formats/loco-payload.md) through their API,
 * and the CHOCO mixing step. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_gossip.h"
#include "pulse_log.h"
#include "pulse_loco_testing.h" /* pulse_gossip_copy */
#include "pulse_loco_elem.h"
#include "status_impl.h"

/* One edge (self, peer), created the first round it is used. */
typedef struct {
  float *mine;   /* c_self@peer: this trainer's public copy as peer holds it */
  float *theirs; /* c_peer@self */
  /* The prepared round. */
  int active;   /* peer is a neighbour in this round's graph */
  int received; /* peer's payload arrived (decoded into `in`) */
  int dropped;  /* the peer did not get ours: both ends leave the edge out */
  pulse_loco_entries in; /* the peer's entries, applied to theirs by finish
                            when the edge takes part */
  uint32_t share; /* the neighbour whose payload this edge sends (itself, or
                     an earlier one whose copy `mine` is bit-identical) */
  pulse_buffer payload;
  uint64_t *pos; /* the entries sent (owned when share == peer) */
  float *val;
  uint64_t k;
} gossip_edge;

struct pulse_gossip {
  pulse_gossip_opts o;
  uint64_t P;
  float *x;
  float *init;
  double *acc; /* P: the mixing sum of one finish */
  gossip_edge *edge; /* nodes entries, by peer id */
  const pulse_gossip_graph *graph;
  int prepared;
  int started;
  uint64_t round;
};

static pulse_status check_opts(const pulse_gossip_opts *o) {
  PULSE_TRY(PULSE_OPTS_CHECK("gossip", o, PULSE_GOSSIP_OPTS_VERSION));
  if (o->nodes == 0 || o->nodes > PULSE_GOSSIP_MAX_NODES || o->self >= o->nodes)
    return pulse_fail(PULSE_ERR_ARG, "gossip: trainer %u of %u", o->self,
                      o->nodes);
  if (o->param_count == 0 || o->param_count > PULSE_LOCO_MAX_PARAMS)
    return pulse_fail(PULSE_ERR_ARG, "gossip: %llu parameters",
                      (unsigned long long)o->param_count);
  if (!(o->gamma > 0.0f && o->gamma <= 1.0f))
    return pulse_fail(PULSE_ERR_ARG, "gossip: gamma %g not in (0, 1]",
                      (double)o->gamma);
  if (o->gate != PULSE_LOCO_GATE_BF16 && o->gate != PULSE_LOCO_GATE_NONE)
    return pulse_fail(PULSE_ERR_ARG, "gossip: unknown gate %d", (int)o->gate);
  if (o->values != PULSE_LOCO_VALUES_RAW &&
      o->values != PULSE_LOCO_VALUES_MODELED)
    return pulse_fail(PULSE_ERR_ARG, "gossip: unknown value coding");
  if (o->chunk_log2 < 10 || o->chunk_log2 > 30)
    return pulse_fail(PULSE_ERR_ARG, "gossip: chunk_log2 %u not in 10..30",
                      o->chunk_log2);
  return PULSE_OK;
}

void pulse_gossip_opts_init(pulse_gossip_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_GOSSIP_OPTS_VERSION;
  o->gamma = 1.0f;
  o->gate = PULSE_LOCO_GATE_BF16;
  o->values = PULSE_LOCO_VALUES_MODELED;
  o->pos_model = PULSE_POS_AUTO;
  o->chunk_log2 = 20;
}

pulse_status pulse_gossip_create(const pulse_gossip_opts *opts,
                                 const float *theta_init, pulse_gossip **out) {
  if (out == NULL || theta_init == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip: NULL argument");
  *out = NULL;
  PULSE_TRY(check_opts(opts));
  pulse_gossip *g = calloc(1, sizeof *g);
  if (g == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip");
  g->o = *opts;
  g->P = opts->param_count;
  size_t bytes = (size_t)g->P * sizeof(float);
  g->x = malloc(bytes);
  g->init = malloc(bytes);
  g->acc = malloc((size_t)g->P * sizeof *g->acc);
  g->edge = calloc(opts->nodes, sizeof *g->edge);
  if (!g->x || !g->init || !g->acc || !g->edge) {
    pulse_gossip_free(g);
    return pulse_fail(PULSE_ERR_NOMEM, "gossip: parameters");
  }
  memcpy(g->x, theta_init, bytes);
  memcpy(g->init, theta_init, bytes);
  *out = g;
  return PULSE_OK;
}

static void edge_clear_round(gossip_edge *e, uint32_t peer) {
  if (e->share == peer) {
    pulse_buffer_free(&e->payload);
    free(e->pos), free(e->val);
  }
  e->payload = (pulse_buffer){NULL, 0};
  e->pos = NULL, e->val = NULL, e->k = 0;
  pulse_loco_entries_free(&e->in);
  e->in = (pulse_loco_entries)PULSE_LOCO_ENTRIES_INIT;
  e->active = e->received = e->dropped = 0;
  e->share = peer;
}

void pulse_gossip_free(pulse_gossip *g) {
  if (g == NULL)
    return;
  for (uint32_t j = 0; g->edge && j < g->o.nodes; j++) {
    gossip_edge *e = &g->edge[j];
    if (e->active)
      edge_clear_round(e, j);
    free(e->mine), free(e->theirs);
  }
  free(g->edge), free(g->x), free(g->init), free(g->acc);
  free(g);
}

float *pulse_gossip_params(pulse_gossip *g) { return g->x; }

pulse_status pulse_gossip_set_gate(pulse_gossip *g, pulse_loco_gate_mode gate) {
  if (g == NULL || g->prepared)
    return pulse_fail(PULSE_ERR_ARG, "gossip set gate: %s",
                      g ? "a round is prepared" : "NULL context");
  if (gate != PULSE_LOCO_GATE_BF16 && gate != PULSE_LOCO_GATE_NONE)
    return pulse_fail(PULSE_ERR_ARG, "gossip set gate: unknown gate %d",
                      (int)gate);
  g->o.gate = gate;
  return PULSE_OK;
}

const float *pulse_gossip_copy(const pulse_gossip *g, uint32_t j, int own) {
  if (g == NULL || j >= g->o.nodes)
    return NULL;
  return own ? g->edge[j].mine : g->edge[j].theirs;
}

/* Makes the payload of edge e (whose copies exist) from x. */
static pulse_status encode_edge(pulse_gossip *g, gossip_edge *e) {
  const float *c = e->mine, *x = g->x;
  int gated = g->o.gate == PULSE_LOCO_GATE_BF16;
  uint64_t k = 0;
  for (uint64_t p = 0; p < g->P; p++) {
    float s = c[p] - x[p];
    k += gated ? (uint64_t)pulse_loco_gate(c[p], s) : (uint64_t)(s != 0.0f);
  }
  e->pos = malloc((size_t)(k ? k : 1) * sizeof *e->pos);
  e->val = malloc((size_t)(k ? k : 1) * sizeof *e->val);
  if (e->pos == NULL || e->val == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip: entries");
  uint64_t n = 0;
  for (uint64_t p = 0; p < g->P; p++) {
    float s = c[p] - x[p];
    if (gated ? pulse_loco_gate(c[p], s) : s != 0.0f) {
      e->pos[n] = p;
      e->val[n++] = s;
    }
  }
  e->k = n;
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.version = PULSE_LOCO_PAYLOAD_VERSION;
  h.flags = gated ? PULSE_LOCO_PAYLOAD_GATED : 0u;
  h.pos_model = g->o.pos_model;
  h.values = (uint32_t)g->o.values;
  h.chunk_log2 = g->o.chunk_log2;
  h.sender = g->o.self;
  h.round = g->round;
  h.samples = 1;
  h.base_digest = pulse_loco_digest_f32(c, g->P);
  return pulse_loco_payload_encode(&h, c, NULL, g->P, e->pos, e->val, n,
                                   &e->payload);
}

pulse_status pulse_gossip_prepare(pulse_gossip *g, uint64_t round,
                                  const pulse_gossip_graph *graph,
                                  pulse_gossip_prepare_figures *info) {
  if (g == NULL || graph == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip prepare: NULL argument");
  if (g->prepared)
    return pulse_fail(PULSE_ERR_ARG, "gossip prepare: round %llu is prepared",
                      (unsigned long long)g->round);
  if (g->started && round <= g->round)
    return pulse_fail(PULSE_ERR_ARG, "gossip prepare: round %llu is not after "
                      "round %llu", (unsigned long long)round,
                      (unsigned long long)g->round);
  if (pulse_gossip_graph_nodes(graph) != g->o.nodes)
    return pulse_fail(PULSE_ERR_ARG, "gossip prepare: a graph of %u nodes for "
                      "a run of %u", pulse_gossip_graph_nodes(graph),
                      g->o.nodes);
  g->round = round;
  g->graph = graph;
  uint32_t self = g->o.self, deg = pulse_gossip_graph_degree(graph, self);
  const uint32_t *nb = pulse_gossip_graph_neighbours(graph, self);
  size_t bytes = (size_t)g->P * sizeof(float);
  pulse_status st = PULSE_OK;
  uint64_t entries = 0, pbytes = 0;
  for (uint32_t a = 0; a < deg && st == PULSE_OK; a++) {
    uint32_t j = nb[a];
    gossip_edge *e = &g->edge[j];
    if (e->mine == NULL) {
      e->mine = malloc(bytes);
      e->theirs = malloc(bytes);
      if (e->mine == NULL || e->theirs == NULL) {
        free(e->mine), free(e->theirs);
        e->mine = e->theirs = NULL;
        st = pulse_fail(PULSE_ERR_NOMEM, "gossip: copies of edge %u-%u", self,
                        j);
        break;
      }
      memcpy(e->mine, g->init, bytes);
      memcpy(e->theirs, g->init, bytes);
    }
    e->active = 1;
    e->received = 0;
    e->share = j;
    /* An earlier neighbour whose copy of us is the same bits gets the same
     * payload: one encoding (a static graph's copies all agree). */
    for (uint32_t b = 0; b < a; b++) {
      gossip_edge *f = &g->edge[nb[b]];
      if (f->share == nb[b] && memcmp(f->mine, e->mine, bytes) == 0) {
        e->share = nb[b];
        e->payload = f->payload;
        e->pos = f->pos, e->val = f->val, e->k = f->k;
        break;
      }
    }
    if (e->share == j)
      st = encode_edge(g, e);
    entries += e->k;
    pbytes += e->payload.size;
  }
  if (st != PULSE_OK) {
    for (uint32_t a = 0; a < deg; a++)
      if (g->edge[nb[a]].active)
        edge_clear_round(&g->edge[nb[a]], nb[a]);
    return st;
  }
  g->prepared = 1;
  g->started = 1;
  if (info) {
    info->round = round;
    info->neighbours = deg;
    info->entries = entries;
    info->payload_bytes = pbytes;
  }
  return PULSE_OK;
}

static gossip_edge *active_edge(const pulse_gossip *g, uint32_t peer,
                                const char *what) {
  if (g == NULL || !g->prepared) {
    pulse_fail(PULSE_ERR_ARG, "gossip %s: no prepared round", what);
    return NULL;
  }
  if (peer >= g->o.nodes || !g->edge[peer].active) {
    pulse_fail(PULSE_ERR_ARG, "gossip %s: %u is not a neighbour of %u in "
               "round %llu", what, peer, g->o.self,
               (unsigned long long)g->round);
    return NULL;
  }
  return &g->edge[peer];
}

pulse_status pulse_gossip_payload(const pulse_gossip *g, uint32_t to,
                                  const uint8_t **data, size_t *size) {
  gossip_edge *e = active_edge(g, to, "payload");
  if (e == NULL || data == NULL || size == NULL)
    return PULSE_ERR_ARG;
  *data = e->payload.data;
  *size = e->payload.size;
  return PULSE_OK;
}

pulse_status pulse_gossip_receive(pulse_gossip *g, uint32_t from,
                                  const uint8_t *data, size_t size) {
  gossip_edge *e = active_edge(g, from, "receive");
  if (e == NULL)
    return PULSE_ERR_ARG;
  if (e->received)
    return pulse_fail(PULSE_ERR_ARG, "gossip receive: %u's payload of round "
                      "%llu came twice", from, (unsigned long long)g->round);
  pulse_loco_payload_header h;
  PULSE_TRY(pulse_loco_payload_peek(data, size, &h));
  if (h.round != g->round)
    return pulse_fail(PULSE_ERR_BASE_STEP, "gossip receive: a payload of round "
                      "%llu in round %llu", (unsigned long long)h.round,
                      (unsigned long long)g->round);
  if (h.sender != from)
    return pulse_fail(PULSE_ERR_CORRUPT, "gossip receive: sender %u's payload "
                      "where %u's was expected", h.sender, from);
  if (h.base_digest != pulse_loco_digest_f32(e->theirs, g->P))
    return pulse_fail(PULSE_ERR_BASE_DIGEST, "gossip receive: %u's payload is "
                      "built on another copy than %u holds (edge out of step)",
                      from, g->o.self);
  pulse_loco_entries ent = PULSE_LOCO_ENTRIES_INIT;
  PULSE_TRY(pulse_loco_payload_decode(data, size, e->theirs, NULL, g->P, &h,
                                      &ent));
  /* Applied by finish, once it is known that the peer got ours too. */
  pulse_loco_entries_free(&e->in);
  e->in = ent;
  e->received = 1;
  return PULSE_OK;
}

pulse_status pulse_gossip_drop_edge(pulse_gossip *g, uint32_t peer) {
  gossip_edge *e = active_edge(g, peer, "drop edge");
  if (e == NULL)
    return PULSE_ERR_ARG;
  e->dropped = 1;
  return PULSE_OK;
}

pulse_status pulse_gossip_finish(pulse_gossip *g,
                                 pulse_gossip_finish_figures *info) {
  if (g == NULL || !g->prepared)
    return pulse_fail(PULSE_ERR_ARG, "gossip finish: no prepared round");
  uint32_t self = g->o.self, deg = pulse_gossip_graph_degree(g->graph, self);
  const uint32_t *nb = pulse_gossip_graph_neighbours(g->graph, self);
  double self_w = pulse_gossip_graph_weight(g->graph, self, self);
  uint32_t answered = 0;
  uint64_t P = g->P;
  memset(g->acc, 0, (size_t)P * sizeof *g->acc);
  for (uint32_t a = 0; a < deg; a++) {
    uint32_t j = nb[a];
    gossip_edge *e = &g->edge[j];
    double w = pulse_gossip_graph_weight(g->graph, self, j);
    if (!e->received || e->dropped) {
      /* Neither end moves this edge's copies this round (the peer took
       * nothing from us either: it was silent, or it said so and the
       * caller dropped the edge): its weight goes to the self weight at
       * both ends, so W stays symmetric and the mean is kept. */
      PULSE_LOG_AT(PULSE_LOG_INFO, "gossip: round %llu: neighbour %u of %u "
                   "%s; left out of the mix (weight %.4g to self)",
                   (unsigned long long)g->round, j, self,
                   e->received ? "did not get our payload" : "did not answer",
                   w);
      self_w += w;
      continue;
    }
    answered++;
    for (uint64_t i = 0; i < e->in.count; i++)
      e->theirs[e->in.pos[i]] = e->theirs[e->in.pos[i]] - e->in.val[i];
    for (uint64_t i = 0; i < e->k; i++)
      e->mine[e->pos[i]] = e->mine[e->pos[i]] - e->val[i];
    const float *cj = e->theirs, *ci = e->mine;
    for (uint64_t p = 0; p < P; p++)
      g->acc[p] += w * ((double)cj[p] - (double)ci[p]);
  }
  double gamma = (double)g->o.gamma;
  if (answered > 0)
    for (uint64_t p = 0; p < P; p++)
      g->x[p] = (float)((double)g->x[p] + gamma * g->acc[p]);
  for (uint32_t a = 0; a < deg; a++)
    edge_clear_round(&g->edge[nb[a]], nb[a]);
  /* Shared payloads belong to the edge that made them: clearing in order
   * frees each once (edge_clear_round frees only when share == peer). */
  g->prepared = 0;
  g->graph = NULL;
  if (info) {
    info->round = g->round;
    info->neighbours = deg;
    info->answered = answered;
    info->self_weight = self_w;
  }
  return PULSE_OK;
}
