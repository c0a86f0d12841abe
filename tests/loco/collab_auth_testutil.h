/* collab_auth_testutil.h - helpers of the collaboration's authentication
 * tests (test_collab_auth.c, test_collab_auth_exchange.c): peers with keys
 * in threads of this process, signing as a member would, a peer's
 * /metrics read line by line. */
#ifndef PULSE_COLLAB_AUTH_TESTUTIL_H
#define PULSE_COLLAB_AUTH_TESTUTIL_H

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "collab_impl.h"
#include "loco_testutil.h"
#include "manifest_impl.h"
#include "peer_http_impl.h"
#include "pulse_loco_collab.h"

#define CA_P 3000u

static inline unsigned no_post(void *user, const char *path, const char *id,
                               const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{}");
  return 404;
}

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

static inline loco_sig ca_sign(const pulse_sign_key *k,
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

/* A line of a peer's /metrics ("NAME{LABELS}"). */
static inline uint64_t ca_metric(const pulse_loco_collab *c, const char *name) {
  char url[160];
  snprintf(url, sizeof url, "%s/metrics", pulse_loco_collab_url(c));
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  cr_assert_eq(loco_http_get(url, 5000, 1u << 20, &b, &status), PULSE_OK);
  cr_assert_eq(status, 200);
  pulse_bytebuf_put(&b, "", 1);
  char pattern[160];
  snprintf(pattern, sizeof pattern, "\n%s ", name);
  const char *at = strstr((const char *)b.data, pattern);
  cr_assert(at != NULL, "no %s in /metrics", name);
  unsigned long long v = strtoull(at + strlen(pattern), NULL, 10);
  pulse_bytebuf_free(&b);
  return v;
}

static inline uint64_t ca_refused(const pulse_loco_collab *c, const char *why) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_total{reason=\"%s\"}",
           why);
  return ca_metric(c, line);
}

static inline uint64_t ca_refused_kind(const pulse_loco_collab *c,
                                       const char *kind) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_kind_total{kind=\"%s\"}",
           kind);
  return ca_metric(c, line);
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

#endif
