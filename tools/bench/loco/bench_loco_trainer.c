/* bench_loco_trainer.c - a PULSELoCo trainer of `pulse-bench loco`, one
 * process each: its node (payloads, coordinator, manifest), the parent's
 * start or join, its rounds reported line by line, and its theta_g handed
 * to the drift over all pairs. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_loco_impl.h"
#include "cli_time.h"
#include "pulse_loco_testing.h"

static uint64_t now_ms(void) {
  return (uint64_t)(pulse_cli_now() * 1000.0);
}

static int read_line(FILE *in, char *line, size_t cap) {
  if (fgets(line, (int)cap, in) == NULL)
    return 0;
  line[strcspn(line, "\n")] = '\0';
  return 1;
}

/* pulse_loco_test_hooks.drift_probe: a trainer's theta_g before re-sync. */
typedef struct {
  bench_pair_drift *pd;
  uint32_t id;
  uint64_t written; /* the last round written (1-based) */
} drift_probe_ctx;

static void drift_probe_write(void *user, uint64_t round,
                              const float *theta_g) {
  drift_probe_ctx *c = user;
  bench_pair_drift_write(c->pd, c->id, round + 1, theta_g);
  c->written = round + 1;
}

/* Starts the node as the parent says: "start N ID URL ..." (a founder,
 * with every founder's URL) or "join URL" (the joiner, through that
 * trainer). @return 0, or 1 (said on `out`). */
static int start_or_join(FILE *in, int out, pulse_loco_coord *node,
                         float *local) {
  pulse_status st;
  char line[LINE_MAX_];
  if (!read_line(in, line, sizeof line))
    return bench_loco_child_fail(out, "no start from the parent", PULSE_ERR_IO);
  if (strncmp(line, "start ", 6) == 0) {
    pulse_loco_member m[MAX_TRAINERS];
    unsigned count = 0;
    int used = 0;
    char *cur = line + 6;
    if (sscanf(cur, "%u%n", &count, &used) != 1 || count == 0 ||
        count > MAX_TRAINERS)
      return bench_loco_child_fail(out, "bad start line", PULSE_ERR_ARG);
    cur += used;
    for (unsigned i = 0; i < count; i++) {
      if (sscanf(cur, " %u %63s%n", &m[i].id, m[i].url, &used) != 2)
        return bench_loco_child_fail(out, "bad start line", PULSE_ERR_ARG);
      cur += used;
    }
    st = pulse_loco_coord_start(node, m, count);
  } else if (strncmp(line, "join ", 5) == 0) {
    st = pulse_loco_coord_join(node, line + 5, local, 60000);
  } else {
    st = PULSE_ERR_ARG;
  }
  if (st != PULSE_OK)
    return bench_loco_child_fail(out, "start or join", st);
  return 0;
}

int bench_loco_run_trainer(const loco_args *a, uint32_t id, int founder,
                           int in_fd, int out, bench_pair_drift *pd) {
  FILE *in = fdopen(in_fd, "r");
  const char *host = NULL;
  if (a->nnetns > 0) { /* before any socket: they belong to a namespace */
    const pulse_sim_netns *ns = &a->netns[id % a->nnetns];
    if (pulse_sim_netns_enter(ns) != 0) {
      dprintf(out, "error network namespace %s: %s\n", ns->name,
              strerror(errno));
      return 1;
    }
    host = ns->addr;
  }
  pulse_sim_problem *p = bench_loco_make_problem(a);
  if (in == NULL || p == NULL)
    return bench_loco_child_fail(out, "trainer set-up", PULSE_ERR_NOMEM);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *local = malloc(P * sizeof *local);
  if (local == NULL)
    return bench_loco_child_fail(out, "trainer", PULSE_ERR_NOMEM);
  pulse_sim_problem_init(p, local);
  pulse_loco_opts lo;
  pulse_loco_opts_init(&lo);
  lo.param_count = P;
  lo.trainer_id = id;
  lo.rule = a->rule;
  pulse_loco *ctx = NULL;
  pulse_status st = pulse_loco_create(&lo, founder ? local : NULL, &ctx);
  if (st != PULSE_OK)
    return bench_loco_child_fail(out, "context", st);
  pulse_loco_coord_opts no;
  pulse_loco_coord_opts_init(&no);
  no.deadline_ms = a->deadline_ms;
  no.manifest_timeout_ms =
      a->deadline_ms * 5u > 20000u ? a->deadline_ms * 5u : 20000u;
  pulse_loco_test_hooks hooks = {0}; /* copied at create */
  hooks.drop_rate = a->drop_rate;
  hooks.drop_seed = a->seed;
  hooks.datagram_drop = a->drop;
  no.test_hooks = &hooks;
  no.transport = a->transport;
  no.resync_period = a->resync_period;
  no.drift_budget = a->drift_budget;
  no.host = host;
  /* The drift over all pairs is measured before any re-sync: the node
   * hands theta_g over then; the reference (which never re-syncs) and
   * HTTP rounds are written after the step. */
  drift_probe_ctx probe = {pd, id, 0};
  hooks.drift_probe = drift_probe_write;
  hooks.drift_probe_user = &probe;
  if (!a->no_auth) {
    no.auth = PULSE_LOCO_AUTH_ON;
    no.sign_key = a->keys[id];
    no.member_keys = a->pins;
    no.member_key_count = a->npins;
  }
  pulse_loco_coord *node = NULL;
  if ((st = pulse_loco_coord_create(&no, ctx, &node)) != PULSE_OK)
    return bench_loco_child_fail(out, "node", st);
  dprintf(out, "url %u %s\n", id, pulse_loco_coord_url(node));

  if (start_or_join(in, out, node, local) != 0)
    return 1;

  pulse_sim_learner *l = NULL;
  if ((st = pulse_sim_learner_create(p, id, &l)) != PULSE_OK)
    return bench_loco_child_fail(out, "learner", st);
  int pacer = id == 0;
  while (pulse_loco_round(ctx) < a->rounds) {
    uint64_t t0 = now_ms();
    for (uint32_t h = 0; h < a->inner; h++)
      pulse_sim_learner_step(l, local);
    uint64_t t1 = now_ms();
    int leaving = a->leave_round >= 0 && id == a->trainers - 1 &&
                  pulse_loco_round(ctx) == (uint64_t)a->leave_round;
    pulse_loco_coord_step_figures info;
    st = pulse_loco_coord_step(node, local,
                               (uint64_t)pulse_sim_problem_batch(p) * a->inner,
                               leaving, &info);
    if (st != PULSE_OK)
      return bench_loco_child_fail(out, "outer step", st);
    if (info.rejoined) /* dropped after missed rounds: joined, no round ran */
      continue;
    uint64_t t2 = now_ms();
    /* Before the line that reports the round: the parent reads it then. */
    if (probe.written != info.round + 1)
      bench_pair_drift_write(pd, id, info.round + 1, pulse_loco_global(ctx));
    uint64_t refused = info.chunks.truncated + info.chunks.bad_checksum +
                       info.chunks.malformed + info.chunks.unknown_sender +
                       info.chunks.other_round + info.chunks.other_base +
                       info.chunks.duplicate + info.datagrams_refused_source;
    dprintf(out,
            "exchange %" PRIu64 " %" PRIu64 " %" PRIu64 " %.9g %u %u %" PRIu64
            " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
            info.round + 1, t2 - t1, t2 - t0, info.drift, info.drift_ranges,
            info.resynced_ranges, info.resync_bytes, info.datagrams_sent,
            info.datagrams_dropped, info.chunks.accepted, refused);
    double loss = -1.0, reward = -1.0;
    if (pacer) {
      pulse_sim_problem_eval(p, pulse_loco_global(ctx), &loss, NULL);
      reward = pulse_sim_problem_reward(p, pulse_loco_global(ctx));
    }
    dprintf(out, "auth %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
            info.auth.accepted,
            info.auth.unsigned_bodies + info.auth.forged + info.auth.replayed +
                info.auth.foreign + info.datagrams_refused_auth,
            info.auth_bytes);
    dprintf(out,
            "round %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %" PRIu64
            " %d %.9g %.9g\n",
            info.round + 1, info.payload_bytes, info.sent, info.contributors,
            info.members, info.fetched_bytes, info.resynced, loss, reward);
    if (leaving)
      break;
  }
  /* A coordinator of the last round waits until the others have its data. */
  pulse_loco_coord_linger(node, no.manifest_timeout_ms);
  dprintf(out, "done %u %" PRIu64 " %016" PRIx64 "\n", id,
          pulse_loco_round(ctx), pulse_loco_global_digest(ctx));
  char line[LINE_MAX_];
  /* The node serves until every trainer is done (the parent's "quit", or
   * its end): over UDP a trainer still receiving the last round fetches
   * every sender's signed chunk list; one whose server had closed lost
   * all that sender's chunks and, the fetch retrying to the deadline, the
   * rest of its round (a loaded run: 640 of 666 datagrams accepted, drift
   * 5e-05 without loss). */
  while (read_line(in, line, sizeof line) && strcmp(line, "quit") != 0)
    ;
  pulse_sim_learner_free(l);
  pulse_loco_coord_free(node);
  pulse_loco_free(ctx);
  pulse_sim_problem_free(p);
  free(local);
  fclose(in);
  return 0;
}
