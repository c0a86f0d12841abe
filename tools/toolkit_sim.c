/* toolkit_sim.c - DDP, DiLoCo and PULSELoCo on the built-in problem in one
 * process (toolkit_sim.h): the reference the multi-process HTTP run is
 * compared against, and what the convergence tests use. DiLoCo and
 * PULSELoCo share every line but the gate: both go through pulse_loco
 * contexts and real payloads. */
#include <stdlib.h>
#include <string.h>

#include "pulse_loco.h"
#include "rng_impl.h"
#include "status_impl.h"
#include "toolkit_sim.h"

/* Uniform in [0, 1) from (seed, round, trainer): whether a payload is lost. */
static double drop_draw(uint64_t seed, uint64_t round, uint32_t trainer) {
  uint64_t s =
      seed ^ (round * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)trainer << 40);
  return pulse_rng_uniform(&s);
}

typedef struct {
  const pulse_tk_problem *p;
  const pulse_tk_sim_opts *o;
  uint64_t P;
  pulse_tk_learner **learners;
  pulse_tk_sim_cb cb;
  void *user;
} run;

static void report(run *r, pulse_tk_sim_round *rr, const float *theta) {
  pulse_tk_problem_eval(r->p, theta, &rr->loss, &rr->accuracy);
  if (r->cb)
    r->cb(r->user, rr);
}

static pulse_status run_ddp(run *r, float *theta) {
  uint64_t P = r->P;
  uint32_t N = r->o->trainers;
  float *g = malloc(P * sizeof *g), *sum = malloc(P * sizeof *sum);
  if (!g || !sum) {
    free(g), free(sum);
    return pulse_fail(PULSE_ERR_NOMEM, "loco sim: gradients");
  }
  float invN = 1.0f / (float)N;
  for (uint32_t round = 1; round <= r->o->rounds; round++) {
    double tl = 0.0;
    for (uint32_t h = 0; h < r->o->inner; h++) {
      memset(sum, 0, P * sizeof *sum);
      for (uint32_t i = 0; i < N; i++) {
        tl += pulse_tk_learner_grad(r->learners[i], theta, g);
        for (uint64_t j = 0; j < P; j++)
          sum[j] += g[j];
      }
      for (uint64_t j = 0; j < P; j++)
        sum[j] *= invN;
      /* One optimizer for the one replicated model. */
      pulse_tk_learner_adam(r->learners[0], theta, sum);
    }
    pulse_tk_sim_round rr = {round,
                             0,
                             0,
                             tl / ((double)N * r->o->inner),
                             4u * P * N * r->o->inner,
                             4u * P * r->o->inner,
                             0,
                             N};
    report(r, &rr, theta);
  }
  free(g), free(sum);
  return PULSE_OK;
}

static pulse_status run_loco(run *r, float *theta) {
  uint64_t P = r->P;
  uint32_t N = r->o->trainers;
  int dense = r->o->method == PULSE_TK_SIM_DILOCO;
  pulse_loco **ctx = calloc(N, sizeof *ctx);
  float **local = calloc(N, sizeof *local);
  pulse_loco_contribution *set = calloc(N, sizeof *set);
  uint8_t **copies = calloc(N, sizeof *copies);
  size_t *sizes = calloc(N, sizeof *sizes);
  pulse_status st = PULSE_OK;
  if (!ctx || !local || !set || !copies || !sizes) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: trainers");
    goto done;
  }
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    pulse_loco_opts lo = PULSE_LOCO_OPTS_INIT;
    lo.param_count = P;
    lo.trainer_id = i;
    lo.alpha = r->o->alpha;
    lo.mu = r->o->mu;
    if (dense) {
      lo.gate = PULSE_LOCO_GATE_NONE;
      lo.values = PULSE_LOCO_VALUES_RAW;
      lo.pos_model = PULSE_POS_PLAIN;
    }
    st = pulse_loco_create(&lo, theta, &ctx[i]);
    local[i] = malloc(P * sizeof *local[i]);
    if (st == PULSE_OK && local[i] == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: local parameters");
    if (st == PULSE_OK)
      memcpy(local[i], theta, P * sizeof *theta);
  }
  uint64_t samples = (uint64_t)r->o->inner * pulse_tk_problem_batch(r->p);
  for (uint32_t round = 1; round <= r->o->rounds && st == PULSE_OK; round++) {
    pulse_tk_sim_round rr = {round, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
      for (uint32_t h = 0; h < r->o->inner; h++)
        rr.train_loss += pulse_tk_learner_step(r->learners[i], local[i]);
      const uint8_t *data;
      size_t size;
      pulse_loco_prepare_info pi;
      st = pulse_loco_prepare(ctx[i], local[i], samples, 0, &data, &size, &pi);
      if (st != PULSE_OK)
        break;
      free(copies[i]);
      copies[i] = malloc(size);
      if (copies[i] == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: payload copy");
        break;
      }
      memcpy(copies[i], data, size);
      sizes[i] = size;
      uint64_t sent = dense ? 4u * P : size;
      rr.bytes += sent;
      rr.max_trainer_bytes =
          sent > rr.max_trainer_bytes ? sent : rr.max_trainer_bytes;
      rr.entries += pi.sent;
    }
    if (st != PULSE_OK)
      break;
    uint32_t n = 0;
    for (uint32_t i = 0; i < N; i++)
      if (i == 0 || dense ||
          drop_draw(r->o->drop_seed, round, i) >= r->o->drop_rate) {
        set[n].data = copies[i];
        set[n++].size = sizes[i];
      }
    rr.contributors = n;
    rr.train_loss /= (double)N * r->o->inner;
    for (uint32_t i = 0; i < N && st == PULSE_OK; i++)
      st = pulse_loco_finish(ctx[i], set, n, local[i], NULL);
    if (st == PULSE_OK)
      report(r, &rr, pulse_loco_global(ctx[0]));
  }
  if (st == PULSE_OK)
    memcpy(theta, pulse_loco_global(ctx[0]), P * sizeof *theta);
done:
  for (uint32_t i = 0; ctx && i < N; i++) {
    pulse_loco_free(ctx[i]);
    free(local[i]);
    free(copies[i]);
  }
  free(ctx), free(local), free(set), free(copies), free(sizes);
  return st;
}

pulse_status pulse_tk_sim_run(const pulse_tk_problem *p,
                              const pulse_tk_sim_opts *o, pulse_tk_sim_cb cb,
                              void *user, float *theta_final) {
  if (p == NULL || o == NULL || o->struct_version != PULSE_TK_SIM_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco sim: options missing or of another version");
  if (o->trainers == 0 || o->trainers > 4096 || o->rounds == 0 ||
      o->inner == 0 || o->method > PULSE_TK_SIM_PULSELOCO)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco sim: bad trainers, rounds, inner or method");
  uint64_t P = pulse_tk_problem_param_count(p);
  run r = {p, o, P, calloc(o->trainers, sizeof(pulse_tk_learner *)), cb, user};
  float *theta = malloc(P * sizeof *theta);
  pulse_status st = PULSE_OK;
  if (r.learners == NULL || theta == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim");
  for (uint32_t i = 0; i < o->trainers && st == PULSE_OK; i++)
    st = pulse_tk_learner_create(p, i, &r.learners[i]);
  if (st == PULSE_OK) {
    pulse_tk_problem_init(p, theta);
    pulse_tk_sim_round r0 = {0, 0, 0, 0, 0, 0, 0, 0};
    report(&r, &r0, theta);
    st = o->method == PULSE_TK_SIM_DDP ? run_ddp(&r, theta)
                                       : run_loco(&r, theta);
  }
  if (st == PULSE_OK && theta_final)
    memcpy(theta_final, theta, P * sizeof *theta);
  for (uint32_t i = 0; r.learners && i < o->trainers; i++)
    pulse_tk_learner_free(r.learners[i]);
  free(r.learners), free(theta);
  return st;
}
