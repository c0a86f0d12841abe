/* bench_topology_http.c - `pulse-bench topology --processes`: one process
 * per trainer, each with its own blob server on 127.0.0.1 (loco/transport/peer_http_impl.h,
 * the server and fetches PULSELoCo's exchange uses), gossiping over HTTP.
 * The parent does no training: it hands each round's graph to every
 * trainer, reads back their parameters and measures the round exactly as
 * the in-process run does, so the two print the same numbers.
 *
 * Processes are forked before anything starts a thread. Each child speaks
 * to the parent through two pipes of binary records (native byte order,
 * same machine):
 *   child -> parent   u16 port (once); per round: P floats after the local
 *                     steps, P floats after mixing, per step u64 bytes it
 *                     fetched
 *   parent -> child   u16 port of every trainer (once); per round: u32
 *                     step count (UINT32_MAX ends), then per step a u32
 *                     edge count and the edges (u32 pairs)
 *
 * A payload is served at /v1/gossip/ROUND/to/ID by its sender (ROUND: the
 * step's gossip round id); its receiver fetches it with a deadline. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_topology_impl.h"
#include "graph_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco.h"

#define FETCH_TIMEOUT_MS 20000u
#define END_OF_RUN UINT32_MAX

static int write_all(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return -1;
    p += w, n -= (size_t)w;
  }
  return 0;
}

static int read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r, n -= (size_t)r;
  }
  return 0;
}

/* ------------------------------------------------------------------ child */

/* The acknowledgements of a round: trainer i serves, for each neighbour,
 * whether its payload was taken ("1") or not ("0"), then reads each
 * neighbour's word about its own payload; an edge whose other end did not
 * take ours (or did not say) is dropped here too, so that both ends leave
 * it out (pulse_gossip_drop_edge: a one-sided failure repaired). */
static int child_acknowledge(pulse_gossip *g, loco_server *srv,
                             const uint16_t *ports, uint32_t i, uint64_t t,
                             uint32_t deg, const uint32_t *nb,
                             const uint8_t *took) {
  char path[96];
  for (uint32_t k = 0; k < deg; k++) {
    snprintf(path, sizeof path, "/v1/gossip/%llu/ack/%u",
             (unsigned long long)t, nb[k]);
    if (loco_server_put(srv, path, took[k] ? "1" : "0", 1) != PULSE_OK)
      return -1;
  }
  loco_fetch *f = calloc(deg ? deg : 1, sizeof *f);
  char (*url)[128] = calloc(deg ? deg : 1, sizeof *url);
  int rc = f && url ? 0 : -1;
  for (uint32_t k = 0; rc == 0 && k < deg; k++) {
    snprintf(url[k], sizeof url[k], "http://127.0.0.1:%u/v1/gossip/%llu/ack/%u",
             (unsigned)ports[nb[k]], (unsigned long long)t, i);
    f[k].url = url[k];
    f[k].max_bytes = 16;
    f[k].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  if (rc == 0 && deg > 0 &&
      loco_http_gather(f, deg, loco_now_ms() + FETCH_TIMEOUT_MS) != PULSE_OK)
    rc = -1;
  for (uint32_t k = 0; rc == 0 && k < deg; k++) {
    int taken = f[k].done && f[k].body.size == 1 && f[k].body.data[0] == '1';
    if (taken || !took[k])
      continue; /* both ends agree already */
    fprintf(stderr, TOPO_PROG ": trainer %u round %llu: %u did not take our "
            "payload; edge left out at both ends\n", i,
            (unsigned long long)t, nb[k]);
    if (pulse_gossip_drop_edge(g, nb[k]) != PULSE_OK)
      rc = -1;
  }
  for (uint32_t k = 0; f && k < deg; k++)
    pulse_bytebuf_free(&f[k].body);
  free(f), free(url);
  return rc;
}

/* One round of trainer i over HTTP on graph G; *fetched gets the payload
 * bytes that arrived. */
static int child_round(pulse_gossip *g, loco_server *srv, const uint16_t *ports,
                       uint32_t i, uint64_t t, const pulse_gossip_graph *G,
                       uint64_t *fetched) {
  char path[96];
  if (pulse_gossip_prepare(g, t, G, NULL) != PULSE_OK)
    return -1;
  uint32_t deg = pulse_gossip_graph_degree(G, i);
  const uint32_t *nb = pulse_gossip_graph_neighbours(G, i);
  for (uint32_t k = 0; k < deg; k++) {
    const uint8_t *data;
    size_t size;
    if (pulse_gossip_payload(g, nb[k], &data, &size) != PULSE_OK)
      return -1;
    snprintf(path, sizeof path, "/v1/gossip/%llu/to/%u",
             (unsigned long long)t, nb[k]);
    if (loco_server_put(srv, path, data, size) != PULSE_OK)
      return -1;
  }
  loco_fetch *f = calloc(deg ? deg : 1, sizeof *f);
  char (*url)[128] = calloc(deg ? deg : 1, sizeof *url);
  uint8_t *took = calloc(deg ? deg : 1, 1);
  int rc = f && url && took ? 0 : -1;
  for (uint32_t k = 0; rc == 0 && k < deg; k++) {
    snprintf(url[k], sizeof url[k],
             "http://127.0.0.1:%u/v1/gossip/%llu/to/%u",
             (unsigned)ports[nb[k]], (unsigned long long)t, i);
    f[k].url = url[k];
    f[k].max_bytes = (size_t)1 << 30;
    f[k].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  if (rc == 0 && deg > 0 &&
      loco_http_gather(f, deg, loco_now_ms() + FETCH_TIMEOUT_MS) != PULSE_OK)
    rc = -1;
  *fetched = 0;
  for (uint32_t k = 0; rc == 0 && k < deg; k++) {
    /* A neighbour that did not answer in time, or whose payload is
     * refused, is left out of this round by finish (its weight goes to
     * the self weight) and the run goes on. */
    if (!f[k].done) {
      fprintf(stderr, TOPO_PROG ": trainer %u round %llu: %u did not answer; "
              "left out of the round\n", i, (unsigned long long)t, nb[k]);
      continue;
    }
    if (pulse_gossip_receive(g, nb[k], f[k].body.data, f[k].body.size) !=
        PULSE_OK) {
      fprintf(stderr, TOPO_PROG ": trainer %u round %llu: %u's payload "
              "refused (%s); left out of the round\n", i,
              (unsigned long long)t, nb[k], pulse_error_detail());
      continue;
    }
    *fetched += f[k].body.size;
    took[k] = 1;
  }
  for (uint32_t k = 0; f && k < deg; k++)
    pulse_bytebuf_free(&f[k].body);
  free(f), free(url);
  if (rc == 0 && child_acknowledge(g, srv, ports, i, t, deg, nb, took) != 0)
    rc = -1;
  free(took);
  if (rc == 0 && pulse_gossip_finish(g, NULL) != PULSE_OK)
    rc = -1;
  return rc;
}

static int child_main(const topo_setup *s, topo_arm arm, uint32_t i, int rfd,
                      int wfd) {
  const topo_args *a = s->a;
  uint32_t n = a->nodes;
  pulse_gossip *g = NULL;
  pulse_sim_learner *l = NULL;
  loco_server *srv = NULL;
  pulse_gossip_opts o;
  topo_gossip_opts(s, i, &o);
  float *grad = malloc((size_t)s->P * sizeof *grad);
  uint16_t *ports = calloc(n, sizeof *ports);
  uint32_t(*edges)[2] = malloc((size_t)n * n * sizeof *edges);
  if (!grad || !ports || !edges || pulse_gossip_create(&o, s->init, &g) ||
      pulse_sim_learner_create(s->prob, i, &l) ||
      loco_server_start(NULL, NULL, &srv))
    return 1;
  uint16_t port = loco_server_port(srv);
  int rc = write_all(wfd, &port, sizeof port) ||
           read_all(rfd, ports, n * sizeof *ports);
  size_t bytes = (size_t)s->P * sizeof(float);
  pulse_gossip_graph *G[TOPO_MAX_STEPS] = {NULL};
  for (uint32_t t = 0; rc == 0; t++) {
    uint32_t nsteps = 0, count;
    if (read_all(rfd, &nsteps, sizeof nsteps)) {
      rc = 1;
      break;
    }
    if (nsteps == END_OF_RUN)
      break;
    if (nsteps == 0 || nsteps > TOPO_MAX_STEPS) {
      rc = 1;
      break;
    }
    for (uint32_t k = 0; rc == 0 && k < nsteps; k++)
      if (read_all(rfd, &count, sizeof count) || count > (size_t)n * n ||
          read_all(rfd, edges, count * sizeof *edges) ||
          graph_from_edges_any(n, (const uint32_t(*)[2])edges, count,
                               PULSE_GOSSIP_WEIGHTS_MH, &G[k]) != PULSE_OK)
        rc = 1;
    float *x = pulse_gossip_params(g);
    if (rc == 0) {
      topo_local_steps(s, l, i, t, x, grad);
      rc = write_all(wfd, x, bytes);
    }
    uint64_t fetched[TOPO_MAX_STEPS] = {0};
    for (uint32_t k = 0; rc == 0 && k < nsteps; k++)
      rc = pulse_gossip_set_gate(g, topo_step_gate(a, arm, nsteps, k)) !=
               PULSE_OK ||
           child_round(g, srv, ports, i, topo_gossip_round(arm, t, k), G[k],
                       &fetched[k]);
    rc = rc || write_all(wfd, x, bytes) ||
         write_all(wfd, fetched, nsteps * sizeof *fetched);
    for (uint32_t k = 0; k < TOPO_MAX_STEPS; k++) {
      pulse_gossip_graph_free(G[k]);
      G[k] = NULL;
    }
    /* Every trainer finished round t before the parent sends t + 1: what
     * it served for t and earlier is no longer fetched. */
    loco_server_drop(srv, "/v1/gossip/", topo_gossip_round(arm, t, 0));
  }
  loco_server_stop(srv);
  pulse_gossip_free(g);
  pulse_sim_learner_free(l);
  free(grad), free(ports), free(edges);
  return rc ? 1 : 0;
}

/* ----------------------------------------------------------------- parent */

/* G's edges (i < j) into edges; returns their count. */
static uint32_t edge_list(const pulse_gossip_graph *G, uint32_t (*edges)[2]) {
  uint32_t c = 0, n = pulse_gossip_graph_nodes(G);
  for (uint32_t i = 0; i < n; i++) {
    const uint32_t *nb = pulse_gossip_graph_neighbours(G, i);
    for (uint32_t k = 0; k < pulse_gossip_graph_degree(G, i); k++)
      if (nb[k] > i) {
        edges[c][0] = i;
        edges[c++][1] = nb[k];
      }
  }
  return c;
}

int topo_run_http(const topo_setup *s, topo_arm arm, topo_result *r) {
  const topo_args *a = s->a;
  uint32_t n = a->nodes;
  size_t bytes = (size_t)s->P * sizeof(float);
  pid_t *pid = calloc(n, sizeof *pid);
  int *to = malloc(n * sizeof *to), *from = malloc(n * sizeof *from);
  float **before = calloc(n, sizeof *before), **after = calloc(n, sizeof *after);
  uint32_t(*edges)[2] = malloc((size_t)n * n * sizeof *edges);
  uint16_t *ports = calloc(n, sizeof *ports);
  if (!pid || !to || !from || !before || !after || !edges || !ports)
    return 1;
  for (uint32_t i = 0; i < n; i++)
    to[i] = from[i] = -1;
  int ok = 1;
  fflush(stdout);
  fflush(stderr);
  for (uint32_t i = 0; ok && i < n; i++) {
    int down[2], up[2];
    before[i] = malloc(bytes);
    after[i] = malloc(bytes);
    if (!before[i] || !after[i] || pipe(down) || pipe(up)) {
      ok = 0;
      break;
    }
    pid[i] = fork();
    if (pid[i] == 0) {
      close(down[1]), close(up[0]);
      for (uint32_t j = 0; j < i; j++)
        close(to[j]), close(from[j]);
      _exit(child_main(s, arm, i, down[0], up[1]));
    }
    close(down[0]), close(up[1]);
    to[i] = down[1], from[i] = up[0];
    if (pid[i] < 0)
      ok = 0;
  }
  for (uint32_t i = 0; ok && i < n; i++)
    ok = read_all(from[i], &ports[i], sizeof ports[i]) == 0;
  for (uint32_t i = 0; ok && i < n; i++)
    ok = write_all(to[i], ports, n * sizeof *ports) == 0;
  double factor = topo_factor(a, arm);
  pulse_gossip_policy *policy = NULL;
  double spent = 0.0, last_payload = 0.0, last_full = 0.0, last_var = NAN;
  const float **cb = calloc(n, sizeof *cb), **ca = calloc(n, sizeof *ca);
  for (uint32_t i = 0; ok && i < n; i++) {
    memcpy(after[i], s->init, bytes); /* the state before round 0 */
    cb[i] = before[i], ca[i] = after[i];
  }
  if (ok && arm == ARM_ADAPTIVE)
    ok = topo_policy_create(a, &policy) == PULSE_OK;
  pulse_gossip_graph *G[TOPO_MAX_STEPS] = {NULL};
  uint32_t nsteps = 0;
  for (uint32_t t = 0; ok && t < a->rounds; t++) {
    topo_free_steps(G, nsteps);
    ok = topo_round_graphs(a, arm, t, policy, last_var, spent, last_payload,
                           last_full, r, G, &nsteps) == PULSE_OK;
    if (!ok)
      break;
    uint64_t edges_all = 0, payloads = 0, first_n = 0;
    for (uint32_t i = 0; ok && i < n; i++)
      ok = write_all(to[i], &nsteps, sizeof nsteps) == 0;
    for (uint32_t k = 0; ok && k < nsteps; k++) {
      uint32_t count = edge_list(G[k], edges);
      edges_all += count;
      payloads += 2u * (uint64_t)count;
      if (k == 0)
        first_n = 2u * (uint64_t)count;
      for (uint32_t i = 0; ok && i < n; i++)
        ok = write_all(to[i], &count, sizeof count) == 0 &&
             write_all(to[i], edges, count * sizeof *edges) == 0;
    }
    for (uint32_t i = 0; ok && i < n; i++)
      memcpy(before[i], after[i], bytes);
    uint64_t delivered = 0, first = 0;
    for (uint32_t i = 0; ok && i < n; i++)
      ok = read_all(from[i], after[i], bytes) == 0; /* after local steps */
    double noise = ok ? topo_update_variance(s, ca, cb) : 0.0;
    if (ok && policy && t == 0 && !(a->target > 0.0))
      ok = pulse_gossip_policy_set_target(policy, ADAPTIVE_TARGET_FACTOR *
                                                      noise) == PULSE_OK;
    for (uint32_t i = 0; ok && i < n; i++) {
      /* A node that failed to report delivered nothing. */
      uint64_t got[TOPO_MAX_STEPS] = {0};
      ok = read_all(from[i], after[i], bytes) == 0 &&
           read_all(from[i], got, nsteps * sizeof *got) == 0;
      for (uint32_t k = 0; k < nsteps; k++)
        delivered += got[k];
      first += got[0];
    }
    if (ok) {
      topo_row *row = &r->rows[t];
      topo_measure(s, ca, row);
      row->noise = noise;
      row->predicted = factor * noise;
      row->bytes_per_node = (double)delivered / n;
      row->degree = (uint32_t)((2 * edges_all + n / 2) / n);
      row->steps = nsteps;
      spent += (double)delivered;
      last_payload = payloads ? (double)delivered / payloads : last_payload;
      last_full = first_n ? (double)first / first_n : last_full;
      last_var = row->variance;
    }
  }
  topo_free_steps(G, nsteps);
  uint32_t end = END_OF_RUN;
  for (uint32_t i = 0; i < n; i++)
    if (to[i] >= 0) {
      if (write_all(to[i], &end, sizeof end) != 0)
        ok = 0;
      close(to[i]);
    }
  for (uint32_t i = 0; i < n; i++) {
    int status = 0;
    if (from[i] >= 0)
      close(from[i]);
    if (pid[i] > 0 && (waitpid(pid[i], &status, 0) < 0 ||
                       !WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
      fprintf(stderr, TOPO_PROG ": trainer %u ended with status %d\n", i,
              status);
      ok = 0;
    }
  }
  uint64_t digest = 0;
  for (uint32_t i = 0; ok && i < n; i++)
    digest = digest * 31u + pulse_loco_digest_f32(after[i], s->P);
  r->digest = digest;
  for (uint32_t i = 0; i < n; i++)
    free(before[i]), free(after[i]);
  free(before), free(after), free(cb), free(ca), free(edges), free(ports);
  free(pid), free(to), free(from);
  pulse_gossip_policy_free(policy);
  return ok ? 0 : 1;
}
