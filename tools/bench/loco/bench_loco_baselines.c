/* bench_loco_baselines.c - the children of `pulse-bench loco` that run in
 * one process each (sim_trainers.h): a baseline method over HTTP, and the
 * PULSELoCo replay for what needs every trainer's signal at once. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_loco_impl.h"
#include "pulse_loco_coord.h"

typedef struct {
  int out;
  const char *key;
} baseline_sink;

static void baseline_round(void *user, const pulse_sim_round *r) {
  baseline_sink *s = user;
  dprintf(s->out,
          "%s %u %.9g %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.9g\n",
          s->key, r->round, r->loss, r->bytes, r->wire_bytes,
          r->max_trainer_bytes, r->max_message_bytes, r->reward);
}

/* One baseline method over HTTP (bench_loco_method[which]). */
int bench_loco_run_baseline(const loco_args *a, int which, int out) {
  pulse_sim_problem *p = bench_loco_make_problem(a);
  if (p == NULL)
    return bench_loco_child_fail(out, "problem", PULSE_ERR_NOMEM);
  if (which == 0) {
    uint64_t P = pulse_sim_problem_param_count(p);
    float *theta = malloc(P * sizeof *theta);
    if (theta == NULL)
      return bench_loco_child_fail(out, "baseline", PULSE_ERR_NOMEM);
    pulse_sim_problem_init(p, theta);
    double loss;
    pulse_sim_problem_eval(p, theta, &loss, NULL);
    dprintf(out, "init %.9g %.9g %" PRIu64 " %.9g\n", loss,
            pulse_sim_problem_floor(p), P, pulse_sim_problem_reward(p, theta));
    free(theta);
  }
  pulse_sim_opts so;
  pulse_sim_opts_init(&so);
  so.method = bench_loco_method[which].method;
  so.values = bench_loco_method[which].values;
  so.over_http = 1;
  so.trainers = a->trainers;
  so.rounds = a->rounds;
  so.inner = a->inner;
  baseline_sink s = {out, bench_loco_method[which].key};
  pulse_status st = pulse_sim_run(p, &so, baseline_round, &s, NULL);
  pulse_sim_problem_free(p);
  return st == PULSE_OK
             ? 0
             : bench_loco_child_fail(out, bench_loco_method[which].name, st);
}

typedef struct {
  int out;
} replay_sink;

static void replay_round(void *user, const pulse_sim_round *r) {
  replay_sink *s = user;
  if (r->round > 0)
    dprintf(s->out, "bias %u %.9g %.9g\n", r->round, r->update_bias, r->drift);
}

/* PULSELoCo again in one process, the same rounds as the trainers (same
 * seed, rule and loss draws), for what needs every trainer's signal at
 * once: update_bias (sim_trainers.h). */
int bench_loco_run_replay(const loco_args *a, int out) {
  pulse_sim_problem *p = bench_loco_make_problem(a);
  if (p == NULL)
    return bench_loco_child_fail(out, "problem", PULSE_ERR_NOMEM);
  pulse_sim_opts so;
  pulse_sim_opts_init(&so);
  so.method = PULSE_SIM_PULSELOCO;
  so.trainers = a->trainers;
  so.rounds = a->rounds;
  so.inner = a->inner;
  so.drop_rate = a->drop_rate;
  so.drop_seed = a->seed;
  so.rule = (int)a->rule;
  so.chunked = a->transport == PULSE_LOCO_TRANSPORT_UDP;
  so.datagram_drop = a->drop;
  so.resync_period = a->resync_period;
  so.drift_budget = a->drift_budget;
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = malloc(P * sizeof *theta);
  if (theta == NULL)
    return bench_loco_child_fail(out, "replay", PULSE_ERR_NOMEM);
  pulse_sim_problem_init(p, theta);
  double loss;
  pulse_sim_problem_eval(p, theta, &loss, NULL);
  dprintf(out, "init %.9g %.9g %" PRIu64 " %.9g\n", loss,
          pulse_sim_problem_floor(p), P, pulse_sim_problem_reward(p, theta));
  free(theta);
  replay_sink s = {out};
  pulse_status st = pulse_sim_run(p, &so, replay_round, &s, NULL);
  pulse_sim_problem_free(p);
  return st == PULSE_OK ? 0
                        : bench_loco_child_fail(out, "PULSELoCo replay", st);
}
