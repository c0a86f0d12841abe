/* auth_testutil.h - helpers of the authenticated-exchange tests
 * (test_auth_node.c, test_auth_msgs.c): keys and their pins, signatures
 * and signed POSTs made as a member would, a server's /metrics read line
 * by line (these shared with the collaboration's, collab_auth_testutil.h);
 * trainers in threads of this process, each with its key, every key
 * pinned on every node. */
#ifndef PULSE_LOCO_AUTH_TESTUTIL_H
#define PULSE_LOCO_AUTH_TESTUTIL_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "auth_impl.h"
#include "coordinator_auth_impl.h"
#include "loco_testutil.h"
#include "peer_http_impl.h"
#include "pulse_loco_coord.h"
#include "sim_trainers.h"

#define AT 3
#define ROUNDS 3
#define INNER 2

/* ------------------------------------- shared by every loco auth test */

/* A POST callback that knows no route (a hostile server's, serving only
 * what a test puts). */
static inline unsigned at_no_post(void *user, const char *path, const char *id,
                                  const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{}");
  return 404;
}

/* n keys, and their pins: trainer i holds k[i]. */
static inline void at_keys(size_t n, pulse_sign_key **k,
                           pulse_loco_member_key *pins) {
  for (uint32_t i = 0; i < n; i++) {
    cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(k[i], pins[i].key);
  }
}

static inline void at_keys_free(size_t n, pulse_sign_key **k) {
  for (size_t i = 0; i < n; i++)
    pulse_sign_key_free(k[i]);
}

/* A body's signature by k as a member would make it. */
static inline loco_sig at_sign(const pulse_sign_key *k,
                               pulse_loco_auth_kind kind, uint64_t round,
                               const void *data, size_t size) {
  pulse_loco_auth_opts o;
  pulse_loco_auth_opts_init(&o);
  o.key = k;
  pulse_loco_auth *h;
  cr_assert_eq(pulse_loco_auth_create(&o, &h), PULSE_OK);
  loco_sig s;
  memset(&s, 0, sizeof s);
  s.present = 1;
  s.round = round;
  cr_assert_eq(pulse_loco_auth_sign(h, kind, round, data, size, s.sig, s.key),
               PULSE_OK);
  pulse_loco_auth_free(h);
  return s;
}

/* The URL of a POST of `text` ("PATH?id=ID") to base as a member sends
 * it (auth_impl.h, signed POSTs): numbered `seq`, signed by k (NULL:
 * unsigned) for `round` over `signed_text` and the number (the text it
 * claims to be: text itself, or another to forge), one signature bit
 * flipped when `flip`. */
static inline void at_post_url(char *url, size_t cap, const char *base,
                               const char *text, const pulse_sign_key *k,
                               pulse_loco_auth_kind kind, uint64_t round,
                               const char *signed_text, uint64_t seq,
                               int flip) {
  int n =
      snprintf(url, cap, "%s%s&seq=%llu", base, text, (unsigned long long)seq);
  if (k == NULL)
    return;
  char what[400];
  int len = snprintf(what, sizeof what, "%s&seq=%llu", signed_text,
                     (unsigned long long)seq);
  loco_sig s = at_sign(k, kind, round, what, (size_t)len);
  s.sig[5] ^= (uint8_t)flip;
  loco_auth_post_query(&s, url + n, cap - (size_t)n);
}

/* POSTs url. @return the HTTP status. */
static inline long at_post(const char *url) {
  long status = 0;
  cr_assert_eq(loco_http_post(url, 5000, &status), PULSE_OK);
  return status;
}

/* The value of one line ("NAME{LABELS}") of the /metrics at base. */
static inline uint64_t at_metric(const char *base, const char *name) {
  char url[160];
  snprintf(url, sizeof url, "%s/metrics", base);
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

/* Refusals at base's /metrics by reason ("unsigned", ...) and by kind. */
static inline uint64_t at_refused(const char *base, const char *why) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_total{reason=\"%s\"}",
           why);
  return at_metric(base, line);
}

static inline uint64_t at_refused_kind(const char *base, const char *kind) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_kind_total{kind=\"%s\"}",
           kind);
  return at_metric(base, line);
}

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
  pulse_sign_key *k[8];
  at_keys(n, k, pins);
  for (uint32_t i = 0; i < n; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].key = k[i];
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

/* ------------------------------------------------- the exchange's nodes */

/* A line of a node's /metrics. */
static inline uint64_t metric(const pulse_loco_coord *node, const char *name) {
  return at_metric(pulse_loco_coord_url(node), name);
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
