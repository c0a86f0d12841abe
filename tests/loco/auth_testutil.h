/* auth_testutil.h - helpers of the authenticated-exchange tests
 * (test_auth_node.c, test_auth_msgs.c): trainers in threads of this
 * process, each with its key, every key pinned on every node; a node's
 * /metrics read line by line. */
#ifndef PULSE_LOCO_AUTH_TESTUTIL_H
#define PULSE_LOCO_AUTH_TESTUTIL_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "coordinator_auth_impl.h"
#include "loco_testutil.h"
#include "peer_http_impl.h"
#include "pulse_loco_coord.h"
#include "sim_trainers.h"

#define AT 3
#define ROUNDS 3
#define INNER 2

typedef struct {
  const pulse_sim_problem *p;
  uint32_t id;
  uint32_t rounds;
  pulse_loco *ctx;
  pulse_loco_coord *node;
  pulse_sign_key *key;
  const pulse_loco_member *members;
  size_t nmembers;
  int start;                /* founding member: node_start first */
  int no_linger;            /* end without waiting for acknowledgements */
  volatile int *hold;       /* wait at round hold_round while *hold is set */
  uint64_t hold_round;      /* 0: round 2 */
  uint64_t leave_at;        /* 0: never; else leaves in that round */
  volatile uint64_t *round; /* trainer 0: its round, for the test */
  pulse_status st;
  char detail[256];
  uint32_t rounds_done, min_contributors;
  pulse_loco_auth_figures auth; /* summed over its steps */
  uint64_t datagrams_refused_auth, datagrams_refused_source;
  uint32_t resynced;   /* steps that took the coordinator's whole state */
  uint64_t auth_bytes; /* received only because of authentication */
} atrainer;

static inline void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
  nanosleep(&ts, NULL);
}

static inline void *run_atrainer(void *arg) {
  atrainer *t = arg;
  uint64_t P = pulse_sim_problem_param_count(t->p);
  float *local = malloc(P * sizeof *local);
  memcpy(local, pulse_loco_global(t->ctx), P * sizeof *local);
  pulse_sim_learner *l = NULL;
  t->st = pulse_sim_learner_create(t->p, t->id, &l);
  t->min_contributors = UINT32_MAX;
  if (t->st == PULSE_OK && t->start)
    t->st = pulse_loco_coord_start(t->node, t->members, t->nmembers);
  while (t->st == PULSE_OK && pulse_loco_round(t->ctx) < t->rounds) {
    uint64_t hold_at = t->hold_round ? t->hold_round : 2;
    if (t->hold != NULL && pulse_loco_round(t->ctx) == hold_at)
      while (*t->hold)
        sleep_ms(2);
    for (uint32_t h = 0; h < INNER; h++)
      pulse_sim_learner_step(l, local);
    pulse_loco_coord_step_figures info;
    int leaving = t->leave_at != 0 && pulse_loco_round(t->ctx) == t->leave_at;
    t->st = pulse_loco_coord_step(t->node, local, 32u * INNER,
                                  leaving ? PULSE_LOCO_LEAVING : 0, &info);
    t->auth.accepted += info.auth.accepted;
    t->auth.unsigned_bodies += info.auth.unsigned_bodies;
    t->auth.forged += info.auth.forged;
    t->auth.replayed += info.auth.replayed;
    t->auth.foreign += info.auth.foreign;
    t->auth.admitted += info.auth.admitted;
    t->datagrams_refused_auth += info.datagrams_refused_auth;
    t->datagrams_refused_source += info.datagrams_refused_source;
    t->resynced += info.resynced;
    t->auth_bytes += info.auth_bytes;
    if (t->st != PULSE_OK)
      break;
    t->rounds_done++;
    if (info.contributors < t->min_contributors)
      t->min_contributors = info.contributors;
    if (t->round != NULL)
      *t->round = pulse_loco_round(t->ctx);
    if (leaving)
      break;
  }
  if (t->st == PULSE_OK && !t->no_linger)
    t->st = pulse_loco_coord_linger(t->node, 20000);
  if (t->st != PULSE_OK)
    snprintf(t->detail, sizeof t->detail, "%s", pulse_error_detail());
  pulse_sim_learner_free(l);
  free(local);
  return NULL;
}

static inline pulse_sim_problem *aproblem(void) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.hidden = 24;
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  return p;
}

static inline pulse_loco_coord_opts aopts(uint32_t transport) {
  pulse_loco_coord_opts no;
  pulse_loco_coord_opts_init(&no);
  no.transport = transport;
  no.deadline_ms = 8000; /* only a cap on loaded machines */
  no.manifest_timeout_ms = 20000;
  no.max_misses = 1000; /* a refused trainer stays a member */
  no.quiet_ms = 50;
  no.max_datagram = 1200;
  no.resync_range = 256;
  return no;
}

/* n trainers 0..n-1 with keys, every key pinned on every node. */
static inline void astart(atrainer *t, size_t n, const pulse_sim_problem *p,
                          pulse_loco_coord_opts no, pulse_loco_member *m,
                          pulse_loco_member_key *pins) {
  uint64_t P = pulse_sim_problem_param_count(p);
  float *init = malloc(P * sizeof *init);
  pulse_sim_problem_init(p, init);
  for (uint32_t i = 0; i < n; i++) {
    memset(&t[i], 0, sizeof t[i]);
    cr_assert_eq(pulse_sign_key_generate(&t[i].key), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(t[i].key, pins[i].key);
  }
  for (uint32_t i = 0; i < n; i++) {
    t[i].p = p;
    t[i].id = i;
    t[i].rounds = ROUNDS;
    t[i].start = 1;
    t[i].ctx = lt_ctx(P, i, init);
    no.sign_key = t[i].key;
    no.member_keys = pins;
    no.member_key_count = n;
    cr_assert_eq(pulse_loco_coord_create(&no, t[i].ctx, &t[i].node), PULSE_OK,
                 "%s", pulse_error_detail());
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_coord_url(t[i].node));
  }
  for (uint32_t i = 0; i < n; i++)
    t[i].members = m, t[i].nmembers = n;
  free(init);
}

static inline void arun(atrainer *t, size_t n) {
  pthread_t th[8];
  for (size_t i = 0; i < n; i++)
    pthread_create(&th[i], NULL, run_atrainer, &t[i]);
  for (size_t i = 0; i < n; i++)
    pthread_join(th[i], NULL);
}

static inline void afree(atrainer *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    pulse_loco_coord_free(t[i].node);
    pulse_loco_free(t[i].ctx);
    pulse_sign_key_free(t[i].key);
  }
}

/* The value of one line of a node's /metrics ("NAME{LABELS}"). */
static inline uint64_t metric(const pulse_loco_coord *node, const char *name) {
  char url[160];
  snprintf(url, sizeof url, "%s/metrics", pulse_loco_coord_url(node));
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  cr_assert_eq(loco_http_get(url, 5000, 1u << 20, &b, &status), PULSE_OK);
  cr_assert_eq(status, 200);
  pulse_bytebuf_put(&b, "", 1);
  char pattern[160];
  snprintf(pattern, sizeof pattern, "\n%s ", name);
  const char *at = strstr((const char *)b.data, pattern);
  cr_assert(at != NULL, "no %s in /metrics:\n%s", name, (char *)b.data);
  unsigned long long v = strtoull(at + strlen(pattern), NULL, 10);
  pulse_bytebuf_free(&b);
  return v;
}

static inline uint64_t refused(const pulse_loco_auth_figures *c,
                               unsigned mode) {
  switch (mode) {
  case LOCO_AUTH_TAMPER_UNSIGNED:
    return c->unsigned_bodies;
  case LOCO_AUTH_TAMPER_FORGED:
    return c->forged;
  case LOCO_AUTH_TAMPER_REPLAYED:
    return c->replayed;
  default:
    return c->foreign;
  }
}

static const char *const reason[]
    __attribute__((unused)) = {"", "unsigned", "forged", "replayed", "foreign"};

#endif
