/* bench_loco_collab_peer.c - a peer of `pulse-bench loco` in collaboration
 * mode, one process each: its learner throttled to its speed, its
 * collaboration started or joined as the parent says, its rounds reported
 * line by line until the last, a leave or its end. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_loco_collab_impl.h"
#include "cli_time.h"
#include "pulse_loco.h"
#include "pulse_loco_collab.h"

typedef struct {
  pulse_sim_learner *l;
  double speed; /* samples/s, 0: unthrottled */
  uint32_t batch;
} peer_step;

static int do_step(void *user, float *theta, uint64_t samples) {
  peer_step *s = user;
  double t0 = pulse_cli_now();
  for (uint64_t done = 0; done < samples; done += s->batch)
    pulse_sim_learner_step(s->l, theta);
  if (s->speed > 0) {
    double want = (double)samples / s->speed, took = pulse_cli_since(t0);
    if (want > took)
      usleep((useconds_t)((want - took) * 1e6));
  }
  return 0;
}

static pulse_sim_problem *make_problem(const collab_args *a) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.seed = a->seed;
  po.hidden = pulse_sim_problem_hidden_for(&po, a->params);
  pulse_sim_problem *p = NULL;
  if (pulse_sim_problem_create(&po, &p) != PULSE_OK)
    return NULL;
  return p;
}

static int peer_fail(int out, const char *what) {
  dprintf(out, "error %s: %s\n", what, pulse_error_detail());
  return 1;
}

int bench_loco_collab_run_peer(const collab_args *a, uint32_t id, double speed,
                               const char *client_of, int in, int out) {
  const char *host = NULL;
  if (a->nnetns > 0) { /* before any socket: they belong to a namespace */
    const pulse_sim_netns *ns = &a->netns[(id - 1) % a->nnetns];
    if (pulse_sim_netns_enter(ns) != 0)
      return peer_fail(out, "network namespace");
    host = ns->addr;
  }
  FILE *fin = fdopen(in, "r");
  pulse_sim_problem *p = make_problem(a);
  if (p == NULL)
    return peer_fail(out, "problem");
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = calloc(P, sizeof *theta);
  pulse_sim_problem_init(p, theta);
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = P;
  o.trainer_id = id;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.gate_mean = a->gate_mean;
  pulse_loco *ctx = NULL;
  pulse_loco_collab *c = NULL;
  peer_step st = {NULL, speed, pulse_sim_problem_batch(p)};
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  co.target_batch = a->target;
  co.claim_timeout_ms = a->claim_ms;
  co.round_timeout_ms = a->round_ms;
  co.partitioned = a->partitioned;
  co.partition_check = a->check;
  co.client_of = client_of;
  co.host = host;
  co.equal_ranges = a->equal_ranges;
  if (!a->no_auth) {
    co.sign_key = a->keys[id];
    co.member_keys = a->pins;
    co.member_key_count = MAXP;
  }
  if (pulse_sim_learner_create(p, id, &st.l) != PULSE_OK ||
      pulse_loco_create(&o, theta, &ctx) != PULSE_OK ||
      pulse_loco_collab_create(&co, ctx, &c) != PULSE_OK)
    return peer_fail(out, "create");
  /* --churn partition: this peer's packets by its own user (its server
   * listens already). */
  if (a->uid_base != 0 &&
      setresuid(a->uid_base + id, a->uid_base + id, a->uid_base + id) != 0)
    return peer_fail(out, "setresuid (--churn partition needs root)");
  dprintf(out, "url %u %s\n", id, pulse_loco_collab_url(c));
  char line[8192];
  if (!fgets(line, sizeof line, fin))
    return 1;
  if (strncmp(line, "start ", 6) == 0) {
    pulse_loco_member m[MAXP];
    int n = 0, off = 0, k = 0;
    sscanf(line + 6, "%d%n", &n, &off);
    const char *q = line + 6 + off;
    for (int i = 0; i < n && i < MAXP; i++) {
      sscanf(q, " %u %63s%n", &m[i].id, m[i].url, &k);
      q += k;
    }
    if (pulse_loco_collab_start(c, m, (size_t)n) != PULSE_OK)
      return peer_fail(out, "start");
  } else {
    char seed[64] = "";
    sscanf(line, "join %63s", seed);
    if (pulse_loco_collab_join(c, seed, theta, 60000) != PULSE_OK)
      return peer_fail(out, "join");
  }
  fcntl(in, F_SETFL, fcntl(in, F_GETFL) | O_NONBLOCK);
  /* Static: a failed round returns at once, the caller _exits, and the
   * thread may still be reading it meanwhile (one peer a process). */
  static loss_evaluator losses;
  bench_loco_collab_evaluator_start(&losses, p, P, out);
  int leaving = 0, left = 0, lost = 0;
  uint64_t busy = 0, t0 = (uint64_t)(pulse_cli_now() * 1000.0);
  while (pulse_loco_round(ctx) < a->rounds && !left) {
    if (!leaving && fgets(line, sizeof line, fin) &&
        strncmp(line, "leave", 5) == 0)
      leaving = 1;
    clearerr(fin);
    pulse_loco_collab_figures info;
    pulse_status rs =
        pulse_loco_collab_round(c, theta, st.batch, do_step, &st,
                                leaving ? PULSE_LOCO_LEAVING : 0, &info);
    /* A client whose host died loses that round; its next call rejoins
     * through another host. */
    if (rs != PULSE_OK && client_of != NULL && lost++ < 3)
      continue;
    if (rs != PULSE_OK)
      return peer_fail(out, "round");
    lost = 0;
    busy += info.busy_ms;
    left = info.left;
    pulse_loco_member m[MAXP];
    size_t nm = 0;
    pulse_loco_collab_members(c, m, MAXP, &nm);
    char ids[MAXP * 12] = "";
    int w = 0;
    for (size_t i = 0; i < nm && i < MAXP; i++)
      w += snprintf(ids + w, sizeof ids - (size_t)w, "%s%u", i ? "," : "",
                    m[i].id);
    dprintf(out,
            "round %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %u %" PRIu64
            " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.9g %s %" PRIu64 " %d\n",
            info.round, info.samples, info.own_samples, info.contributors,
            info.writer, info.takeovers, info.bytes_in, info.bytes_out,
            info.busy_ms, info.wall_ms, NAN, nm ? ids : "-", info.payload_bytes,
            info.partitioned);
    dprintf(out, "auth %" PRIu64 "\n", info.auth_bytes);
    /* After the round's line: the parent takes a loss for a round it has. */
    if (!left && nm > 0 && m[0].id == id)
      bench_loco_collab_evaluator_post(&losses, info.round,
                                       pulse_loco_global(ctx));
  }
  uint64_t alive = (uint64_t)(pulse_cli_now() * 1000.0) - t0;
  bench_loco_collab_evaluator_finish(&losses);
  dprintf(out, "done %u %" PRIu64 " %016" PRIx64 " %" PRIu64 " %" PRIu64 "\n",
          id, pulse_loco_round(ctx), pulse_loco_global_digest(ctx), busy,
          alive);
  fcntl(in, F_SETFL, fcntl(in, F_GETFL) & ~O_NONBLOCK);
  while (fgets(line, sizeof line, fin) || errno == EAGAIN) {
    if (strncmp(line, "quit", 4) == 0)
      break;
    line[0] = '\0';
    if (feof(fin))
      break;
    clearerr(fin);
    usleep(10000);
  }
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  pulse_sim_learner_free(st.l);
  pulse_sim_problem_free(p);
  free(theta);
  return 0;
}
