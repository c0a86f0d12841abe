/* collab_auth_testutil.h - helpers of the collaboration's authentication
 * tests (test_collab_auth.c, test_collab_auth_exchange.c), over the ones
 * every loco auth test shares (auth_testutil.h): peers with keys in
 * threads of this process, a group of them run for some rounds, a peer's
 * /metrics read line by line. */
#ifndef PULSE_COLLAB_AUTH_TESTUTIL_H
#define PULSE_COLLAB_AUTH_TESTUTIL_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "auth_testutil.h"
#include "collab_impl.h"
#include "loco_testutil.h"
#include "manifest_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco_collab.h"

#define CA_P 3000u

static inline pulse_loco *ca_ctx(uint32_t id, const float *theta) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CA_P;
  o.trainer_id = id;
  o.rule = PULSE_LOCO_RULE_KEEP;
  pulse_loco *ctx;
  cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK, "%s",
               pulse_error_detail());
  return ctx;
}

/* opts.partitioned and the timeouts (0: 2000 and 8000 ms) of the peers
 * made after they are set. */
static int ca_partitioned __attribute__((unused));
static uint32_t ca_claim_ms __attribute__((unused)),
    ca_round_ms __attribute__((unused));

static inline pulse_loco_collab *ca_peer(pulse_loco *ctx,
                                         const pulse_sign_key *k,
                                         const pulse_loco_member_key *pins,
                                         size_t npins) {
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  co.partitioned = ca_partitioned;
  co.target_batch = 64;
  co.claim_timeout_ms = ca_claim_ms ? ca_claim_ms : 2000;
  co.round_timeout_ms = ca_round_ms ? ca_round_ms : 8000;
  co.sign_key = k;
  co.member_keys = pins;
  co.member_key_count = npins;
  pulse_loco_collab *c;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  return c;
}

/* A line of a peer's /metrics ("NAME{LABELS}"), its refusals by reason
 * and by kind. */
static inline uint64_t ca_metric(const pulse_loco_collab *c, const char *name) {
  return at_metric(pulse_loco_collab_url(c), name);
}

static inline uint64_t ca_refused(const pulse_loco_collab *c, const char *why) {
  return at_refused(pulse_loco_collab_url(c), why);
}

static inline uint64_t ca_refused_kind(const pulse_loco_collab *c,
                                       const char *kind) {
  return at_refused_kind(pulse_loco_collab_url(c), kind);
}

/* ------------------------------------------------- an honest collaboration */

typedef struct {
  pulse_loco_collab *c;
  pulse_loco *ctx;
  float *theta;
  uint64_t rounds;
  const char *join_seed; /* NULL: a founder */
  volatile uint64_t *round_of_0;
  pulse_status st;
  char detail[256];
} ca_runner;

static inline int ca_step(void *user, float *theta, uint64_t samples) {
  uint32_t id = *(const uint32_t *)user;
  loco_sleep_ms(3); /* a step takes time: the peers share each round */
  for (uint32_t i = 0; i < CA_P; i += 7)
    theta[i] -= 1e-4f * (float)((i + id) % 5) * (float)samples;
  return 0;
}

static inline void *ca_run(void *arg) {
  ca_runner *r = arg;
  uint32_t id = pulse_loco_trainer_id(r->ctx);
  r->st = PULSE_OK;
  if (r->join_seed != NULL) {
    while (*r->round_of_0 < 2)
      loco_sleep_ms(2);
    r->st = pulse_loco_collab_join(r->c, r->join_seed, r->theta, 30000);
  }
  while (r->st == PULSE_OK && pulse_loco_round(r->ctx) < r->rounds) {
    pulse_loco_collab_figures info;
    r->st = pulse_loco_collab_round(r->c, r->theta, 16, ca_step, &id, 0, &info);
    if (r->round_of_0 != NULL && r->join_seed == NULL)
      *r->round_of_0 = pulse_loco_round(r->ctx);
  }
  if (r->st != PULSE_OK)
    snprintf(r->detail, sizeof r->detail, "%s", pulse_error_detail());
  return NULL;
}

/* A group of n peers with keys, every key pinned on every peer, the first
 * `founders` started as the members of round 0 (the others join through
 * a founder when the test says so), each to run `rounds` rounds from the
 * same weights. */
#define CA_MAX 4
typedef struct {
  size_t n;
  pulse_sign_key *k[CA_MAX];
  pulse_loco_member_key pins[CA_MAX];
  pulse_loco_member m[CA_MAX];
  ca_runner r[CA_MAX];
  float *init;
} ca_group;

static inline void ca_group_start(ca_group *g, size_t n, size_t founders,
                                  uint64_t rounds) {
  memset(g, 0, sizeof *g);
  g->n = n;
  at_keys(n, g->k, g->pins);
  g->init = malloc(CA_P * sizeof *g->init);
  for (uint32_t i = 0; i < CA_P; i++)
    g->init[i] = 0.02f * (float)(i % 61) - 0.5f;
  for (uint32_t i = 0; i < n; i++) {
    ca_runner *r = &g->r[i];
    r->ctx = ca_ctx(i, i < founders ? g->init : NULL);
    r->c = ca_peer(r->ctx, g->k[i], g->pins, n);
    r->theta = malloc(CA_P * sizeof(float));
    memcpy(r->theta, g->init, CA_P * sizeof(float));
    r->rounds = rounds;
    g->m[i].id = i;
    snprintf(g->m[i].url, sizeof g->m[i].url, "%s",
             pulse_loco_collab_url(r->c));
  }
  for (size_t i = 0; i < founders; i++)
    cr_assert_eq(pulse_loco_collab_start(g->r[i].c, g->m, founders), PULSE_OK,
                 "%s", pulse_error_detail());
}

/* Runs every peer's rounds, one thread each, until all returned. */
static inline void ca_group_run(ca_group *g) {
  pthread_t th[CA_MAX];
  for (size_t i = 0; i < g->n; i++)
    pthread_create(&th[i], NULL, ca_run, &g->r[i]);
  for (size_t i = 0; i < g->n; i++)
    pthread_join(th[i], NULL);
}

static inline void ca_group_free(ca_group *g) {
  for (size_t i = 0; i < g->n; i++) {
    pulse_loco_collab_free(g->r[i].c);
    pulse_loco_free(g->r[i].ctx);
    free(g->r[i].theta);
  }
  at_keys_free(g->n, g->k);
  free(g->init);
}

#endif
