/* sim_trainers.c - DDP, DiLoCo and PULSELoCo on the built-in problem in one
 * process (sim_trainers.h): the reference the multi-process HTTP run is
 * compared against, what the convergence tests use, and the baselines of
 * `pulse-bench loco`. Every trainer keeps its own replica and sends real
 * messages through the exchange. */
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_testing.h"
#include "outer_elem_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_elem.h"
#include "rng_impl.h"
#include "status_impl.h"
#include "sim_exchange.h"
#include "sim_trainers.h"

/* Uniform in [0, 1) from (seed, round, trainer): whether a payload is lost.
 * The node's draw (loco/coordinator/coordinator.c drop_draw: the state one increment before
 * the key), so the replay loses the payloads the HTTP run lost; it drew
 * one increment later before, other payloads than the run's (the replay's
 * update_bias 0.99959 of a run that lost none). */
static double drop_draw(uint64_t seed, uint64_t round, uint32_t trainer) {
  uint64_t s = (seed ^ (round * 0x9E3779B97F4A7C15ull) ^
                ((uint64_t)trainer << 40)) -
               0x9E3779B97F4A7C15ull;
  return pulse_rng_uniform(&s);
}

typedef struct {
  const pulse_sim_problem *p;
  const pulse_sim_opts *o;
  uint64_t P;
  uint32_t N;
  pulse_sim_learner **learners;
  pulse_sim_exchange *x;
  pulse_sim_message *msgs; /* N: what one trainer received */
  float **replica;        /* N: each trainer's parameters */
  pulse_sim_cb cb;
  void *user;
  uint64_t served; /* exchange bytes served before this round */
} run;

/* Evaluates trainer 0's parameters and hands the round to the callback. */
static void report(run *r, pulse_sim_round *rr, const float *theta) {
  pulse_sim_exchange_bytes b;
  pulse_sim_exchange_counts(r->x, &b);
  rr->wire_bytes = b.served - r->served;
  r->served = b.served;
  pulse_sim_problem_eval(r->p, theta, &rr->loss, &rr->accuracy);
  rr->reward = pulse_sim_problem_reward(r->p, theta);
  if (r->cb)
    r->cb(r->user, rr);
}

/* Counts one message of `size` bytes from trainer i into the round, where
 * sent[i] sums what trainer i sent in it. */
static void count_message(pulse_sim_round *rr, uint64_t *sent, uint32_t i,
                          uint64_t size) {
  rr->bytes += size;
  sent[i] += size;
  if (sent[i] > rr->max_trainer_bytes)
    rr->max_trainer_bytes = sent[i];
  if (size > rr->max_message_bytes)
    rr->max_message_bytes = size;
}

/* Decodes the dense message trainer `from` sent for `step` into x. */
static pulse_status read_dense(const run *r, const pulse_sim_message *m,
                               uint32_t from, uint64_t step, float *x,
                               uint64_t *samples) {
  pulse_sim_dense_header want = {r->o->values, from, step, 1, r->P}, got;
  PULSE_TRY(pulse_sim_dense_decode(m->data, m->size, &want, &got, x));
  if (got.sender != from)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco sim: trainer %u's message names sender %u", from,
                      got.sender);
  *samples = got.samples;
  return PULSE_OK;
}

/* Encodes x as trainer i's dense message of `step` and publishes it. */
static pulse_status send_dense(run *r, uint32_t i, uint64_t step,
                               uint64_t samples, const float *x, uint8_t *msg,
                               size_t size) {
  pulse_sim_dense_header h = {r->o->values, i, step, samples, r->P};
  PULSE_TRY(pulse_sim_dense_encode(&h, x, msg));
  return pulse_sim_exchange_put(r->x, i, step, msg, size);
}

/* One trainer's received gradients of `step`, summed in sender order and
 * divided by N (float arithmetic, the same on every replica). */
static pulse_status mean_gradient(run *r, uint32_t to, uint64_t step,
                                  size_t size, float *sum, float *tmp) {
  PULSE_TRY(pulse_sim_exchange_receive(r->x, to, step, size, r->msgs));
  memset(sum, 0, r->P * sizeof *sum);
  for (uint32_t j = 0; j < r->N; j++) {
    uint64_t samples = 0;
    PULSE_TRY(read_dense(r, &r->msgs[j], j, step, tmp, &samples));
    for (uint64_t k = 0; k < r->P; k++)
      sum[k] += tmp[k];
  }
  float inv = 1.0f / (float)r->N;
  for (uint64_t k = 0; k < r->P; k++)
    sum[k] *= inv;
  return PULSE_OK;
}

static pulse_status run_ddp(run *r) {
  uint64_t P = r->P;
  uint32_t N = r->N;
  size_t size = pulse_sim_dense_size(r->o->values, P);
  float *g = malloc(P * sizeof *g), *sum = malloc(P * sizeof *sum);
  uint8_t *msg = malloc(size);
  uint64_t *sent = calloc(N, sizeof *sent);
  pulse_status st = PULSE_OK;
  if (!g || !sum || !msg || !sent)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: gradients");
  uint64_t batch = pulse_sim_problem_batch(r->p);
  for (uint32_t round = 1; round <= r->o->rounds && st == PULSE_OK; round++) {
    pulse_sim_round rr = {round, 0, 0, 0, 0, 0, 0, 0, 0, N, 1.0, 0.0, 0.0};
    memset(sent, 0, N * sizeof *sent);
    for (uint32_t h = 0; h < r->o->inner && st == PULSE_OK; h++) {
      uint64_t step = (uint64_t)(round - 1) * r->o->inner + h;
      for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
        rr.train_loss +=
            pulse_sim_learner_grad(r->learners[i], r->replica[i], g);
        st = send_dense(r, i, step, batch, g, msg, size);
        count_message(&rr, sent, i, size);
      }
      /* Every replica averages what it received and takes the same Adam
       * step with its own moments (all equal: same start, same means). */
      for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
        st = mean_gradient(r, i, step, size, sum, g);
        if (st == PULSE_OK)
          pulse_sim_learner_adam(r->learners[i], r->replica[i], sum);
      }
    }
    rr.train_loss /= (double)N * r->o->inner;
    if (st == PULSE_OK)
      report(r, &rr, r->replica[0]);
  }
  free(g), free(sum), free(msg), free(sent);
  return st;
}

/* One replica's outer step from the received pseudo-gradients of `round`:
 * what pulse_loco_finish does for a dense round (sample-weighted mean, sums
 * in double in sender order, one rounding, then the Nesterov step). */
static pulse_status diloco_finish(run *r, uint32_t to, uint64_t round,
                                  size_t size, float *theta_g, float *b,
                                  double *acc, float *tmp) {
  PULSE_TRY(pulse_sim_exchange_receive(r->x, to, round, size, r->msgs));
  memset(acc, 0, r->P * sizeof *acc);
  uint64_t weight = 0;
  for (uint32_t j = 0; j < r->N; j++) {
    uint64_t samples = 0;
    PULSE_TRY(read_dense(r, &r->msgs[j], j, round, tmp, &samples));
    if (samples > UINT64_MAX - weight)
      return pulse_fail(PULSE_ERR_OVERFLOW, "loco sim: sample counts");
    weight += samples;
    double w = (double)samples;
    for (uint64_t k = 0; k < r->P; k++)
      acc[k] += w * (double)tmp[k];
  }
  double wsum = (double)weight;
  for (uint64_t k = 0; k < r->P; k++)
    pulse_loco_outer(&theta_g[k], &b[k], (float)(acc[k] / wsum), r->o->alpha,
                     r->o->mu);
  return PULSE_OK;
}

static pulse_status run_diloco(run *r) {
  uint64_t P = r->P;
  uint32_t N = r->N;
  size_t size = pulse_sim_dense_size(r->o->values, P);
  float **global = calloc(N, sizeof *global), **mom = calloc(N, sizeof *mom);
  float *tmp = malloc(P * sizeof *tmp);
  double *acc = malloc(P * sizeof *acc);
  uint8_t *msg = malloc(size);
  uint64_t *sent = calloc(N, sizeof *sent);
  pulse_status st = PULSE_OK;
  if (!global || !mom || !tmp || !acc || !msg || !sent)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: DiLoCo");
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    global[i] = malloc(P * sizeof *global[i]);
    mom[i] = calloc(P, sizeof *mom[i]);
    if (!global[i] || !mom[i])
      st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: DiLoCo replicas");
    else
      memcpy(global[i], r->replica[i], P * sizeof *global[i]);
  }
  uint64_t samples = (uint64_t)r->o->inner * pulse_sim_problem_batch(r->p);
  for (uint32_t round = 1; round <= r->o->rounds && st == PULSE_OK; round++) {
    pulse_sim_round rr = {round, 0, 0, 0, 0, 0, 0, 0, 0, N, 1.0, 0.0, 0.0};
    uint64_t seq = round - 1u;
    memset(sent, 0, N * sizeof *sent);
    for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
      float *local = r->replica[i];
      for (uint32_t h = 0; h < r->o->inner; h++)
        rr.train_loss += pulse_sim_learner_step(r->learners[i], local);
      /* The pseudo-gradient as the dense context computes it (e = 0). */
      for (uint64_t k = 0; k < P; k++)
        tmp[k] = pulse_loco_signal(global[i][k], local[k], 0.0f);
      st = send_dense(r, i, seq, samples, tmp, msg, size);
      count_message(&rr, sent, i, size);
    }
    for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
      st = diloco_finish(r, i, seq, size, global[i], mom[i], acc, tmp);
      if (st == PULSE_OK)
        memcpy(r->replica[i], global[i], P * sizeof *global[i]);
    }
    rr.train_loss /= (double)N * r->o->inner;
    if (st == PULSE_OK)
      report(r, &rr, global[0]);
  }
  for (uint32_t i = 0; global && i < N; i++)
    free(global[i]), free(mom[i]);
  free(global), free(mom), free(tmp), free(acc), free(msg), free(sent);
  return st;
}

/* The largest payload a context of P parameters can send (docs/formats/loco-payload.md:
 * header, chunk table, streams; with room to spare). */
static size_t payload_cap(uint64_t P) {
  return (size_t)(1024u + 32u * ((P >> 10) + 1u) + 16u * P);
}

/* The lossless replay of a round (sim_trainers.h, update_bias): trainer i's
 * signal with its shadow error feedback e0, gated as the context gates,
 * summed into acc; e0 keeps what the gate held back. */
static void shadow_add(uint64_t P, const float *theta_g, const float *theta_r,
                       float *e0, double *acc) {
  for (uint64_t k = 0; k < P; k++) {
    float s = pulse_loco_signal(theta_g[k], theta_r[k], e0[k]);
    if (pulse_loco_gate(theta_g[k], s)) {
      acc[k] += (double)s;
      e0[k] = 0.0f;
    } else {
      e0[k] = s;
    }
  }
}

/* (applied · lossless) / ||lossless||^2 from trainer 0's momentum before and
 * after the round and the lossless sum over N trainers. */
static double round_bias(uint64_t P, uint32_t N, float mu, const float *b_old,
                         const float *b_new, const double *acc) {
  double dot = 0.0, norm = 0.0;
  for (uint64_t k = 0; k < P; k++) {
    double lossless = acc[k] / (double)N;
    double applied = (double)b_new[k] - (double)mu * (double)b_old[k];
    dot += applied * lossless;
    norm += lossless * lossless;
  }
  return norm > 0.0 ? dot / norm : 1.0;
}

/* The node's drift check for trainer i after round seq (coordinator_udp.c
 * check_drift) against trainer 0, the reference: the ranges that differ
 * are copied in a re-sync round, or when the drift estimated from the
 * sketches (ref_sketch) exceeds the budget; otherwise they stay flagged in
 * mask (count ranges). */
static pulse_status check_drift(run *r, pulse_loco **ctx, uint32_t i,
                                uint64_t seq, const double *ref_sketch,
                                uint8_t *mask) {
  uint64_t P = r->P, L = r->o->resync_range, count = (P + L - 1) / L;
  uint32_t ndiff = 0;
  for (uint64_t k = 0; k < count; k++) {
    uint64_t a = k * L, len = P - a < L ? P - a : L, mine, ref;
    pulse_loco_range_digest(ctx[i], a, len, &mine);
    pulse_loco_range_digest(ctx[0], a, len, &ref);
    mask[k] = mine != ref;
    ndiff += mask[k];
  }
  if (ndiff == 0)
    return PULSE_OK;
  if ((seq + 1) % r->o->resync_period != 0 &&
      pulse_loco_drift_estimate(ctx[i], L, mask, ref_sketch) <=
          r->o->drift_budget)
    return PULSE_OK; /* left drifted: mask says where */
  /* The whole vector: the ranges that agree are the same bits. */
  PULSE_TRY(pulse_loco_resync_range(ctx[i], 0, P, pulse_loco_global(ctx[0]),
                                    pulse_loco_momentum(ctx[0])));
  memcpy(r->replica[i], pulse_loco_global(ctx[i]), (size_t)P * sizeof(float));
  memset(mask, 0, (size_t)count);
  return PULSE_OK;
}

/* A prepared round over datagrams (sim_trainers.h, chunked): every
 * trainer's payload as chunks, each lost per receiver by the node's draw,
 * every receiver's per-cell aggregate, then the drift checks against
 * trainer 0. drifted: per trainer, its ranges left differing from trainer
 * 0's since its last re-sync (N x count; trainer 0's stay 0). *drift: the
 * max over pairs before the checks. */
static pulse_status chunked_round(run *r, pulse_loco **ctx, uint64_t seq,
                                  uint8_t *drifted, double *drift) {
  uint32_t N = r->N;
  uint64_t P = r->P, L = r->o->resync_range, count = (P + L - 1) / L;
  pulse_buffer *chunks = calloc(N, sizeof *chunks);
  uint64_t *nchunks = calloc(N, sizeof *nchunks);
  uint32_t *ids = calloc(N, sizeof *ids);
  double *sketch = malloc((size_t)count * PULSE_LOCO_SKETCH * sizeof *sketch);
  pulse_status st = chunks && nchunks && ids && sketch
                        ? PULSE_OK
                        : pulse_fail(PULSE_ERR_NOMEM, "loco sim: chunks");
  /* The base every replica's chunks name: the reference's. */
  uint64_t base = pulse_loco_global_digest(ctx[0]);
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    ids[i] = i;
    pulse_loco_payload_header h;
    pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
    st = pulse_loco_payload_decode(r->msgs[i].data, r->msgs[i].size,
                                   pulse_loco_global(ctx[i]), NULL, P, &h, &e);
    h.base_digest = base;
    if (st == PULSE_OK)
      st = pulse_loco_chunks_encode(&h, P, e.pos, e.val, e.count,
                                    r->o->max_datagram, &chunks[i],
                                    &nchunks[i]);
    if (st == PULSE_OK && memchr(drifted + i * count, 1, (size_t)count))
      st = pulse_loco_chunks_mark_drifted(&chunks[i], nchunks[i], P,
                                          drifted + i * count, L);
    pulse_loco_entries_free(&e);
  }
  for (uint32_t to = 0; to < N && st == PULSE_OK; to++) {
    pulse_loco_inbox *in = NULL;
    st = pulse_loco_inbox_create(ctx[to], ids, N, &in);
    if (st == PULSE_OK && memchr(drifted + to * count, 1, (size_t)count))
      st = pulse_loco_inbox_set_drift(in, base, drifted + to * count, L);
    for (uint32_t from = 0; from < N && st == PULSE_OK; from++) {
      if (from == to)
        continue;
      const uint8_t *p = chunks[from].data;
      size_t left = chunks[from].size;
      for (uint64_t k = 0; k < nchunks[from] && st == PULSE_OK; k++) {
        size_t cs;
        st = pulse_loco_chunk_size(p, left, &cs);
        if (st == PULSE_OK &&
            !(r->o->datagram_drop > 0.0 &&
              pulse_loco_datagram_draw(r->o->drop_seed, seq, from, to, k) <
                  r->o->datagram_drop))
          st = pulse_loco_inbox_add(in, p, cs);
        p += cs, left -= cs;
      }
    }
    if (st == PULSE_OK)
      st = pulse_loco_finish_inbox(ctx[to], in, r->replica[to], NULL);
    pulse_loco_inbox_free(in);
  }
  *drift = 0.0;
  for (uint32_t a = 0; a < N && st == PULSE_OK; a++)
    for (uint32_t b = a + 1; b < N; b++) {
      double d =
          pulse_loco_drift(pulse_loco_global(ctx[a]), pulse_loco_global(ctx[b]), P);
      *drift = d > *drift ? d : *drift;
    }
  for (uint64_t k = 0; k < count && st == PULSE_OK && r->o->resync_period > 1;
       k++) {
    uint64_t a = k * L, len = P - a < L ? P - a : L;
    st = pulse_loco_range_sketch(ctx[0], a, len, sketch + k * PULSE_LOCO_SKETCH);
  }
  for (uint32_t i = 1; i < N && st == PULSE_OK; i++)
    st = check_drift(r, ctx, i, seq, sketch, drifted + i * count);
  for (uint32_t i = 0; chunks && i < N; i++)
    pulse_buffer_free(&chunks[i]);
  free(chunks), free(nchunks), free(ids), free(sketch);
  return st;
}

static pulse_status run_pulseloco(run *r) {
  uint64_t P = r->P;
  uint32_t N = r->N;
  pulse_loco **ctx = calloc(N, sizeof *ctx);
  pulse_loco_contribution *set = calloc(N, sizeof *set);
  uint64_t *sent = calloc(N, sizeof *sent);
  float *e0 = calloc((size_t)N * P, sizeof *e0);
  float *b_old = malloc(P * sizeof *b_old);
  double *acc = malloc(P * sizeof *acc);
  pulse_status st = PULSE_OK;
  if (!ctx || !set || !sent || !e0 || !b_old || !acc)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: trainers");
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    pulse_loco_opts lo;
    pulse_loco_opts_init(&lo);
    lo.param_count = P;
    lo.trainer_id = i;
    lo.alpha = r->o->alpha;
    lo.mu = r->o->mu;
    lo.rule = (pulse_loco_rule)r->o->rule;
    st = pulse_loco_create(&lo, r->replica[i], &ctx[i]);
  }
  uint64_t samples = (uint64_t)r->o->inner * pulse_sim_problem_batch(r->p);
  uint64_t nranges = (P + r->o->resync_range - 1) / r->o->resync_range;
  uint8_t *drifted = calloc((size_t)N * nranges, 1); /* chunked_round */
  if (drifted == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: trainers");
  for (uint32_t round = 1; round <= r->o->rounds && st == PULSE_OK; round++) {
    pulse_sim_round rr = {round, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0.0};
    uint64_t seq = round - 1u;
    memset(sent, 0, N * sizeof *sent);
    memset(acc, 0, P * sizeof *acc);
    memcpy(b_old, pulse_loco_momentum(ctx[0]), P * sizeof *b_old);
    for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
      for (uint32_t h = 0; h < r->o->inner; h++)
        rr.train_loss += pulse_sim_learner_step(r->learners[i], r->replica[i]);
      shadow_add(P, pulse_loco_global(ctx[i]), r->replica[i], e0 + i * P, acc);
      const uint8_t *data;
      size_t size;
      pulse_loco_prepare_figures pi;
      st = pulse_loco_prepare(ctx[i], r->replica[i], samples, 0, &data, &size,
                              &pi);
      if (st != PULSE_OK)
        break;
      count_message(&rr, sent, i, size);
      rr.entries += pi.sent;
      st = pulse_sim_exchange_put(r->x, i, seq, data, size);
    }
    if (r->o->chunked && st == PULSE_OK) {
      /* Every payload (as trainer 0 receives them), cut into chunks. */
      st = pulse_sim_exchange_receive(r->x, 0, seq, payload_cap(P), r->msgs);
      rr.contributors = N;
      if (st == PULSE_OK)
        st = chunked_round(r, ctx, seq, drifted, &rr.drift);
    }
    /* A lost payload was sent (and is counted) but leaves the round. */
    for (uint32_t i = 0; i < N && st == PULSE_OK && !r->o->chunked; i++) {
      st = pulse_sim_exchange_receive(r->x, i, seq, payload_cap(P), r->msgs);
      uint32_t n = 0;
      for (uint32_t j = 0; j < N && st == PULSE_OK; j++)
        if (j == 0 || drop_draw(r->o->drop_seed, seq, j) >= r->o->drop_rate)
          set[n++] =
              (pulse_loco_contribution){r->msgs[j].data, r->msgs[j].size};
      rr.contributors = n;
      if (st == PULSE_OK)
        st = pulse_loco_set_members(ctx[i], N);
      if (st == PULSE_OK)
        st = pulse_loco_finish(ctx[i], set, n, r->replica[i], NULL);
    }
    rr.train_loss /= (double)N * r->o->inner;
    if (st == PULSE_OK) {
      rr.update_bias =
          round_bias(P, N, r->o->mu, b_old, pulse_loco_momentum(ctx[0]), acc);
      report(r, &rr, pulse_loco_global(ctx[0]));
    }
  }
  for (uint32_t i = 0; ctx && i < N; i++)
    pulse_loco_free(ctx[i]);
  free(ctx), free(set), free(sent), free(e0), free(b_old), free(acc);
  free(drifted);
  return st;
}

/* Every trainer's replica must hold the same bits at the end. */
static pulse_status same_replicas(const run *r) {
  for (uint32_t i = 1; i < r->N; i++)
    if (memcmp(r->replica[i], r->replica[0], r->P * sizeof(float)) != 0)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco sim: trainer %u ended with other parameters "
                        "than trainer 0",
                        i);
  return PULSE_OK;
}

static pulse_status check_opts(const pulse_sim_problem *p,
                               const pulse_sim_opts *o) {
  if (p == NULL || o == NULL || o->struct_version != PULSE_SIM_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco sim: options missing or of another version");
  if (o->chunked &&
      (o->rule != PULSE_LOCO_RULE_DROP || o->resync_period == 0 ||
       o->resync_range == 0 || o->resync_range % PULSE_LOCO_CHUNK_CELL != 0 ||
       o->max_datagram < pulse_loco_chunk_bound() ||
       !(o->datagram_drop >= 0.0 && o->datagram_drop <= 1.0)))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco sim: chunked rounds need the drop rule, a period "
                      "and a datagram size");
  if (o->trainers == 0 || o->trainers > 4096 || o->rounds == 0 ||
      o->inner == 0 || o->method > PULSE_SIM_PULSELOCO ||
      pulse_sim_dense_size(o->values, 1) == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco sim: bad trainers, rounds, inner, method or "
                      "values");
  return PULSE_OK;
}

void pulse_sim_opts_init(pulse_sim_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_SIM_OPTS_VERSION;
  o->method = PULSE_SIM_PULSELOCO;
  o->trainers = 3;
  o->rounds = 50;
  o->inner = 20;
  o->alpha = 0.7f;
  o->mu = 0.9f;
  o->drop_seed = 1;
  o->values = PULSE_SIM_DENSE_FP32;
  o->max_datagram = 1472;
  o->resync_period = 1;
  o->drift_budget = 0.01;
  o->resync_range = 1024;
}

pulse_status pulse_sim_run(const pulse_sim_problem *p,
                              const pulse_sim_opts *o, pulse_sim_cb cb,
                              void *user, float *theta_final) {
  PULSE_TRY(check_opts(p, o));
  uint32_t N = o->trainers;
  uint64_t P = pulse_sim_problem_param_count(p);
  run r = {p,
           o,
           P,
           N,
           calloc(N, sizeof *r.learners),
           NULL,
           calloc(N, sizeof *r.msgs),
           calloc(N, sizeof *r.replica),
           cb,
           user,
           0};
  pulse_status st = PULSE_OK;
  if (r.learners == NULL || r.msgs == NULL || r.replica == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco sim");
  if (st == PULSE_OK)
    st = pulse_sim_exchange_create(N, o->over_http, &r.x);
  for (uint32_t i = 0; i < N && st == PULSE_OK; i++) {
    st = pulse_sim_learner_create(p, i, &r.learners[i]);
    r.replica[i] = malloc(P * sizeof *r.replica[i]);
    if (st == PULSE_OK && r.replica[i] == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "loco sim: replicas");
    if (st == PULSE_OK)
      pulse_sim_problem_init(p, r.replica[i]);
  }
  if (st == PULSE_OK) {
    pulse_sim_round r0 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1.0, 0.0, 0.0};
    report(&r, &r0, r.replica[0]);
    st = o->method == PULSE_SIM_DDP      ? run_ddp(&r)
         : o->method == PULSE_SIM_DILOCO ? run_diloco(&r)
                                            : run_pulseloco(&r);
  }
  /* Chunked rounds re-sync by their period: replicas may differ between. */
  if (st == PULSE_OK && !(o->chunked && o->resync_period > 1))
    st = same_replicas(&r);
  if (st == PULSE_OK && theta_final)
    memcpy(theta_final, r.replica[0], P * sizeof *theta_final);
  for (uint32_t i = 0; i < N; i++) {
    if (r.learners)
      pulse_sim_learner_free(r.learners[i]);
    if (r.replica)
      free(r.replica[i]);
  }
  pulse_sim_exchange_free(r.x);
  free(r.learners), free(r.msgs), free(r.replica);
  return st;
}
