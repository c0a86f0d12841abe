/* test_collab_auth.c - the collaboration's authentication, its first part
 * (issue 35 item 7; PAYLOAD.md "Authentication"): a hostile seed feeds a
 * joining peer membership views and states that are unsigned, forged,
 * replayed (another round's) or signed by a stranger: the peer refuses
 * each before it takes anything (its weights unchanged, the refusal
 * counted by reason and kind at /metrics), then takes the honest ones. A
 * writer serving such manifests: the others refuse them, apply nothing
 * and end with the same bits. Peers with keys run rounds and admit a
 * joiner, everything signed checked, nothing refused, the same bits. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "loco_testutil.h"
#include "manifest_impl.h"
#include "peer_http_impl.h"
#include "collab_impl.h"
#include "pulse_loco_collab.h"

#define CA_P 3000u

static unsigned no_post(void *user, const char *path, const char *id,
                        const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{}");
  return 404;
}

static pulse_loco *ca_ctx(uint32_t id, const float *theta) {
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
static int ca_partitioned;
static uint32_t ca_claim_ms, ca_round_ms;

static pulse_loco_collab *ca_peer(pulse_loco *ctx, const pulse_sign_key *k,
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

static loco_sig ca_sign(const pulse_sign_key *k, pulse_loco_auth_kind kind,
                        uint64_t round, const void *data, size_t size) {
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
static uint64_t ca_metric(const pulse_loco_collab *c, const char *name) {
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

static uint64_t ca_refused(const pulse_loco_collab *c, const char *why) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_total{reason=\"%s\"}",
           why);
  return ca_metric(c, line);
}

static uint64_t ca_refused_kind(const pulse_loco_collab *c, const char *kind) {
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_kind_total{kind=\"%s\"}",
           kind);
  return ca_metric(c, line);
}

Test(loco_collab_auth, a_joiner_refuses_a_hostile_seeds_views_and_states,
     .timeout = 60) {
  pulse_sign_key *k0, *k5, *kx;
  cr_assert_eq(pulse_sign_key_generate(&k0), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&k5), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco_member_key pins[2] = {{0, {0}}, {5, {0}}};
  pulse_sign_key_public(k0, pins[0].key);
  pulse_sign_key_public(k5, pins[1].key);
  /* Member 0's states of rounds 1 and 2. */
  float *theta = malloc(CA_P * sizeof *theta);
  for (uint32_t i = 0; i < CA_P; i++)
    theta[i] = 0.01f * (float)(i % 89) - 0.4f;
  pulse_loco *c0 = ca_ctx(0, theta);
  pulse_buffer state[3] = {{NULL, 0}, {NULL, 0}, {NULL, 0}};
  for (int r = 0; r < 2; r++) {
    for (uint32_t i = 0; i < CA_P; i += 3)
      theta[i] += 0.003f;
    const uint8_t *pl;
    size_t sz;
    cr_assert_eq(pulse_loco_prepare(c0, theta, 32, 0, &pl, &sz, NULL),
                 PULSE_OK);
    pulse_loco_contribution own = {pl, sz};
    cr_assert_eq(pulse_loco_finish(c0, &own, 1, theta, NULL), PULSE_OK);
    cr_assert_eq(pulse_loco_state_export(c0, &state[r + 1]), PULSE_OK);
  }
  pulse_loco *c5ctx = ca_ctx(5, NULL);
  uint64_t before = pulse_loco_global_digest(c5ctx);
  pulse_loco_collab *c5 = ca_peer(c5ctx, k5, pins, 2);
  loco_server *srv;
  cr_assert_eq(loco_server_start(no_post, NULL, &srv), PULSE_OK);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", loco_server_port(srv));
  /* The view a seed serves: round 2, member 0 (the seed) and the joiner. */
  pulse_loco_member m[2] = {{0, ""}, {5, ""}};
  snprintf(m[0].url, sizeof m[0].url, "%s", url);
  snprintf(m[1].url, sizeof m[1].url, "%s", pulse_loco_collab_url(c5));
  loco_manifest v;
  memset(&v, 0, sizeof v);
  v.round = 2;
  v.members = m;
  v.nmembers = 2;
  pulse_bytebuf view = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_manifest_write(&v, &view), PULSE_OK);
  loco_sig good = ca_sign(k0, PULSE_LOCO_AUTH_MEMBERS, 2, view.data, view.size);
  loco_sig sgood = ca_sign(k0, PULSE_LOCO_AUTH_STATE, 2, state[2].data,
                           state[2].size);
  float *local = malloc(CA_P * sizeof *local);

  /* Views: a join through the seed takes nothing from a bad one. */
  const char *why[] = {"unsigned", "forged", "foreign"};
  for (int k = 0; k < 3; k++) {
    loco_sig bad = good;
    if (k == 0)
      bad.present = 0;
    else if (k == 1)
      bad.sig[9] ^= 4;
    else
      bad = ca_sign(kx, PULSE_LOCO_AUTH_MEMBERS, 2, view.data, view.size);
    cr_assert_eq(loco_server_put_signed(srv, "/v1/loco/members", view.data,
                                        view.size, &bad),
                 PULSE_OK);
    uint64_t was = ca_refused(c5, why[k]);
    cr_assert_neq(pulse_loco_collab_join(c5, url, local, 300), PULSE_OK,
                  "view %d taken", k);
    cr_assert_gt(ca_refused(c5, why[k]), was, "view %d", k);
    cr_assert_eq(pulse_loco_round(c5ctx), 0);
  }
  cr_assert_geq(ca_refused_kind(c5, "members"), 3);

  /* States of round 2: unsigned, its bytes changed under its signature, a
   * stranger's, round 1's with its signature. Nothing is imported. */
  uint8_t *flipped = malloc(state[2].size);
  memcpy(flipped, state[2].data, state[2].size);
  flipped[state[2].size / 3] ^= 0x20;
  const char *swhy[] = {"unsigned", "forged", "foreign", "replayed"};
  for (int k = 0; k < 4; k++) {
    const void *body = state[2].data;
    size_t size = state[2].size;
    loco_sig bad = sgood;
    if (k == 0) {
      bad.present = 0;
    } else if (k == 1) {
      body = flipped;
    } else if (k == 2) {
      bad = ca_sign(kx, PULSE_LOCO_AUTH_STATE, 2, body, size);
    } else {
      body = state[1].data;
      size = state[1].size;
      bad = ca_sign(k0, PULSE_LOCO_AUTH_STATE, 1, body, size);
    }
    cr_assert_eq(loco_server_put_signed(srv, "/v1/loco/state/2", body, size,
                                        &bad),
                 PULSE_OK);
    uint64_t was = ca_refused(c5, swhy[k]);
    cr_assert_neq(pulse_loco_collab_import(c5, url, 2, local, 3000), PULSE_OK,
                  "state %d imported", k);
    cr_assert_eq(ca_refused(c5, swhy[k]), was + 1, "state %d", k);
    cr_assert_eq(pulse_loco_global_digest(c5ctx), before, "state %d", k);
    cr_assert_eq(pulse_loco_round(c5ctx), 0);
  }
  cr_assert_eq(ca_refused_kind(c5, "state"), 4);

  /* The honest view and state: the join goes through, with member 0's
   * bits. */
  cr_assert_eq(loco_server_put_signed(srv, "/v1/loco/members", view.data,
                                      view.size, &good),
               PULSE_OK);
  cr_assert_eq(loco_server_put_signed(srv, "/v1/loco/state/2", state[2].data,
                                      state[2].size, &sgood),
               PULSE_OK);
  cr_assert_eq(pulse_loco_collab_join(c5, url, local, 5000), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_loco_round(c5ctx), 2);
  cr_assert_eq(pulse_loco_global_digest(c5ctx), pulse_loco_global_digest(c0));
  cr_assert_eq(ca_refused_kind(c5, "state"), 4);

  free(local);
  free(flipped);
  pulse_bytebuf_free(&view);
  loco_server_stop(srv);
  pulse_loco_collab_free(c5);
  for (int r = 0; r < 3; r++)
    pulse_buffer_free(&state[r]);
  pulse_loco_free(c0);
  pulse_loco_free(c5ctx);
  free(theta);
  pulse_sign_key_free(k0);
  pulse_sign_key_free(k5);
  pulse_sign_key_free(kx);
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

static int ca_step(void *user, float *theta, uint64_t samples) {
  uint32_t id = *(const uint32_t *)user;
  loco_sleep_ms(3); /* a step takes time: the peers share each round */
  for (uint32_t i = 0; i < CA_P; i += 7)
    theta[i] -= 1e-4f * (float)((i + id) % 5) * (float)samples;
  return 0;
}

static void *ca_run(void *arg) {
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
    r->st = pulse_loco_collab_round(r->c, r->theta, 16, ca_step, &id, 0,
                                    &info);
    if (r->round_of_0 != NULL && r->join_seed == NULL)
      *r->round_of_0 = pulse_loco_round(r->ctx);
  }
  if (r->st != PULSE_OK)
    snprintf(r->detail, sizeof r->detail, "%s", pulse_error_detail());
  return NULL;
}

Test(loco_collab_auth, signed_peers_admit_a_joiner_and_refuse_nothing,
     .timeout = 120) {
  pulse_sign_key *k[3];
  pulse_loco_member_key pins[3];
  for (uint32_t i = 0; i < 3; i++) {
    cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(k[i], pins[i].key);
  }
  float *init = malloc(CA_P * sizeof *init);
  for (uint32_t i = 0; i < CA_P; i++)
    init[i] = 0.02f * (float)(i % 61) - 0.5f;
  ca_runner r[3];
  memset(r, 0, sizeof r);
  volatile uint64_t round0 = 0;
  pulse_loco_member m[2];
  for (uint32_t i = 0; i < 3; i++) {
    r[i].ctx = ca_ctx(i, i < 2 ? init : NULL);
    r[i].c = ca_peer(r[i].ctx, k[i], pins, 3);
    r[i].theta = malloc(CA_P * sizeof(float));
    memcpy(r[i].theta, init, CA_P * sizeof(float));
    r[i].rounds = 6;
    r[i].round_of_0 = &round0;
    if (i < 2) {
      m[i].id = i;
      snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(r[i].c));
    }
  }
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pulse_loco_collab_start(r[i].c, m, 2), PULSE_OK, "%s",
                 pulse_error_detail());
  r[2].join_seed = m[1].url;
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    pthread_create(&th[i], NULL, ca_run, &r[i]);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(r[i].st, PULSE_OK, "peer %d: %s", i, r[i].detail);
    cr_assert_eq(pulse_loco_round(r[i].ctx), 6, "peer %d", i);
    cr_assert_eq(pulse_loco_global_digest(r[i].ctx),
                 pulse_loco_global_digest(r[0].ctx), "peer %d", i);
    for (int w = 0; w < 4; w++)
      cr_assert_eq(ca_refused(r[i].c, (const char *[]){"unsigned", "forged",
                                                        "replayed",
                                                        "foreign"}[w]),
                   0, "peer %d", i);
  }
  /* The joiner checked the view and the state it loaded. */
  cr_assert_geq(ca_metric(r[2].c, "pulse_loco_auth_accepted_total"), 2);
  for (int i = 0; i < 3; i++) {
    pulse_loco_collab_free(r[i].c);
    pulse_loco_free(r[i].ctx);
    free(r[i].theta);
    pulse_sign_key_free(k[i]);
  }
  free(init);
}

Test(loco_collab_auth, configurations_that_cannot_be_verified_are_refused) {
  pulse_loco *ctx = ca_ctx(1, NULL);
  pulse_sign_key *k, *other;
  cr_assert_eq(pulse_sign_key_generate(&k), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&other), PULSE_OK);
  pulse_loco_member_key pins[2] = {{1, {0}}, {2, {0}}};
  pulse_sign_key_public(other, pins[0].key);
  pulse_sign_key_public(other, pins[1].key);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  /* Members' keys, none of its own. */
  co.member_keys = pins;
  co.member_key_count = 1;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  /* Its own id pinned with another key. */
  co.sign_key = k;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  /* One key for two ids. */
  pins[0].id = 3;
  co.member_key_count = 2;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  /* An older options version. */
  co.member_key_count = 1;
  co.struct_version = 4;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_VERSION);
  co.struct_version = PULSE_LOCO_COLLAB_OPTS_VERSION;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  pulse_sign_key_free(k);
  pulse_sign_key_free(other);
}

/* Peer 0 writes rounds 0 and 3 (of 3 peers) and serves its manifests in
 * `mode`: the others refuse the bad one (their round fails, nothing of it
 * applied) and count it; they end with the same bits. */
static void bad_manifests(unsigned mode, const char *why) {
  pulse_sign_key *k[3];
  pulse_loco_member_key pins[3];
  for (uint32_t i = 0; i < 3; i++) {
    cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(k[i], pins[i].key);
  }
  float *init = malloc(CA_P * sizeof *init);
  for (uint32_t i = 0; i < CA_P; i++)
    init[i] = 0.02f * (float)(i % 61) - 0.5f;
  ca_runner r[3];
  memset(r, 0, sizeof r);
  pulse_loco_member m[3];
  /* A replay needs a manifest of peer 0's before: rounds 0 to 3. */
  uint64_t bad_round = mode == 3 ? 3 : 0;
  for (uint32_t i = 0; i < 3; i++) {
    r[i].ctx = ca_ctx(i, init);
    r[i].c = ca_peer(r[i].ctx, k[i], pins, 3);
    r[i].theta = malloc(CA_P * sizeof(float));
    memcpy(r[i].theta, init, CA_P * sizeof(float));
    r[i].rounds = bad_round + 1;
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(r[i].c));
  }
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pulse_loco_collab_start(r[i].c, m, 3), PULSE_OK);
  cr_assert_eq(collab_auth_tamper(r[0].c, mode,
                                  1u << (PULSE_LOCO_AUTH_MANIFEST - 1)),
               PULSE_OK);
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    pthread_create(&th[i], NULL, ca_run, &r[i]);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  for (int i = 1; i < 3; i++) {
    cr_assert_neq(r[i].st, PULSE_OK, "%s: peer %d took the manifest", why, i);
    cr_assert_eq(pulse_loco_round(r[i].ctx), bad_round, "%s: peer %d", why, i);
    cr_assert_geq(ca_refused(r[i].c, why), 1, "%s: peer %d", why, i);
    cr_assert_geq(ca_refused_kind(r[i].c, "manifest"), 1, "%s", why);
  }
  cr_assert_eq(pulse_loco_global_digest(r[1].ctx),
               pulse_loco_global_digest(r[2].ctx), "%s", why);
  for (int i = 0; i < 3; i++) {
    pulse_loco_collab_free(r[i].c);
    pulse_loco_free(r[i].ctx);
    free(r[i].theta);
    pulse_sign_key_free(k[i]);
  }
  free(init);
}

Test(loco_collab_auth, unsigned_manifests_are_refused, .timeout = 120) {
  bad_manifests(1, "unsigned");
}
Test(loco_collab_auth, forged_manifests_are_refused, .timeout = 120) {
  bad_manifests(2, "forged");
}
Test(loco_collab_auth, replayed_manifests_are_refused, .timeout = 120) {
  bad_manifests(3, "replayed");
}
Test(loco_collab_auth, foreign_manifests_are_refused, .timeout = 120) {
  bad_manifests(4, "foreign");
}

/* Peer 1 serves its payloads in `mode`: the writers (peers 0 and 2) leave
 * them out, count them and keep peer 1 a member; everyone ends with the
 * same bits (a left-out payload stays in its sender's error feedback). */
static void bad_payloads(unsigned mode, const char *why) {
  pulse_sign_key *k[3];
  pulse_loco_member_key pins[3];
  for (uint32_t i = 0; i < 3; i++) {
    cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(k[i], pins[i].key);
  }
  float *init = malloc(CA_P * sizeof *init);
  for (uint32_t i = 0; i < CA_P; i++)
    init[i] = 0.02f * (float)(i % 61) - 0.5f;
  ca_runner r[3];
  memset(r, 0, sizeof r);
  pulse_loco_member m[3];
  for (uint32_t i = 0; i < 3; i++) {
    r[i].ctx = ca_ctx(i, init);
    r[i].c = ca_peer(r[i].ctx, k[i], pins, 3);
    r[i].theta = malloc(CA_P * sizeof(float));
    memcpy(r[i].theta, init, CA_P * sizeof(float));
    r[i].rounds = 4; /* writers 0, 1, 2, 0; a replay from round 1 on */
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(r[i].c));
  }
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pulse_loco_collab_start(r[i].c, m, 3), PULSE_OK);
  cr_assert_eq(collab_auth_tamper(r[1].c, mode,
                                  1u << (PULSE_LOCO_AUTH_PAYLOAD - 1)),
               PULSE_OK);
  pthread_t th[3];
  for (int i = 0; i < 3; i++)
    pthread_create(&th[i], NULL, ca_run, &r[i]);
  for (int i = 0; i < 3; i++)
    pthread_join(th[i], NULL);
  uint64_t refused = 0;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(r[i].st, PULSE_OK, "%s: peer %d: %s", why, i, r[i].detail);
    cr_assert_eq(pulse_loco_round(r[i].ctx), 4, "%s: peer %d", why, i);
    cr_assert_eq(pulse_loco_global_digest(r[i].ctx),
                 pulse_loco_global_digest(r[0].ctx), "%s: peer %d", why, i);
    refused += ca_refused_kind(r[i].c, "payload");
  }
  cr_assert_geq(refused, 1, "%s", why);
  cr_assert_geq(ca_refused(r[0].c, why) + ca_refused(r[2].c, why), 1, "%s",
                why);
  /* Still a member: the next round lists it. */
  pulse_loco_member next[3];
  size_t count = 0;
  pulse_loco_collab_members(r[0].c, next, 3, &count);
  cr_assert_eq(count, 3, "%s", why);
  for (int i = 0; i < 3; i++) {
    pulse_loco_collab_free(r[i].c);
    pulse_loco_free(r[i].ctx);
    free(r[i].theta);
    pulse_sign_key_free(k[i]);
  }
  free(init);
}

Test(loco_collab_auth, unsigned_payloads_are_left_out, .timeout = 120) {
  bad_payloads(1, "unsigned");
}
Test(loco_collab_auth, forged_payloads_are_left_out, .timeout = 120) {
  bad_payloads(2, "forged");
}
Test(loco_collab_auth, replayed_payloads_are_left_out, .timeout = 120) {
  bad_payloads(3, "replayed");
}
Test(loco_collab_auth, foreign_payloads_are_left_out, .timeout = 120) {
  bad_payloads(4, "foreign");
}

/* Partitioned, peer 1 serves its blobs of `kind` (slices, its reduced
 * range, its verdict) unsigned, forged or signed by a stranger (the
 * faults in `modes`, bit 1 << mode): the others
 * refuse them (as blobs that never came: the exchange fails and the round
 * ends as for a peer that died in it), count them, and every peer ends
 * with the same bits. */
static void bad_blobs(pulse_loco_auth_kind kind, const char *word,
                      unsigned modes) {
  static const char *const why[] = {"", "unsigned", "forged", "", "foreign"};
  for (unsigned mode = 1; mode <= 4; mode++) {
    /* (3, a blob's replay: its body is not the signer's to choose) */
    if (!(modes & (1u << mode)))
      continue;
    pulse_sign_key *k[3];
    pulse_loco_member_key pins[3];
    for (uint32_t i = 0; i < 3; i++) {
      cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
      pins[i].id = i;
      pulse_sign_key_public(k[i], pins[i].key);
    }
    float *init = malloc(CA_P * sizeof *init);
    for (uint32_t i = 0; i < CA_P; i++)
      init[i] = 0.02f * (float)(i % 61) - 0.5f;
    ca_runner r[3];
    memset(r, 0, sizeof r);
    pulse_loco_member m[3];
    ca_partitioned = 1;
    /* A refused blob fails the exchange: its deadline is waited out. */
    ca_claim_ms = 1000;
    ca_round_ms = 2000;
    for (uint32_t i = 0; i < 3; i++) {
      r[i].ctx = ca_ctx(i, init);
      r[i].c = ca_peer(r[i].ctx, k[i], pins, 3);
      r[i].theta = malloc(CA_P * sizeof(float));
      memcpy(r[i].theta, init, CA_P * sizeof(float));
      r[i].rounds = 3;
      m[i].id = i;
      snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(r[i].c));
    }
    ca_partitioned = 0;
    ca_claim_ms = ca_round_ms = 0;
    for (int i = 0; i < 3; i++)
      cr_assert_eq(pulse_loco_collab_start(r[i].c, m, 3), PULSE_OK);
    cr_assert_eq(collab_auth_tamper(r[1].c, mode, 1u << (kind - 1)), PULSE_OK);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
      pthread_create(&th[i], NULL, ca_run, &r[i]);
    for (int i = 0; i < 3; i++)
      pthread_join(th[i], NULL);
    uint64_t refused = 0, reason = 0;
    for (int i = 0; i < 3; i++) {
      cr_assert_eq(r[i].st, PULSE_OK, "%s %s: peer %d: %s", word, why[mode], i,
                   r[i].detail);
      cr_assert_eq(pulse_loco_round(r[i].ctx), 3);
      cr_assert_eq(pulse_loco_global_digest(r[i].ctx),
                   pulse_loco_global_digest(r[0].ctx), "%s %s: peer %d", word,
                   why[mode], i);
      refused += ca_refused_kind(r[i].c, word);
      reason += ca_refused(r[i].c, why[mode]);
    }
    cr_assert_geq(refused, 1, "%s %s", word, why[mode]);
    cr_assert_geq(reason, 1, "%s %s", word, why[mode]);
    for (int i = 0; i < 3; i++) {
      pulse_loco_collab_free(r[i].c);
      pulse_loco_free(r[i].ctx);
      free(r[i].theta);
      pulse_sign_key_free(k[i]);
    }
    free(init);
  }
}

Test(loco_collab_auth, bad_slices_are_refused, .timeout = 120) {
  /* Each refusal waits the exchange's deadline out: two faults. */
  bad_blobs(PULSE_LOCO_AUTH_SLICE, "slice", 1u << 2 | 1u << 4);
}
Test(loco_collab_auth, bad_reduced_ranges_are_refused, .timeout = 120) {
  bad_blobs(PULSE_LOCO_AUTH_REDUCED, "reduced", 1u << 1 | 1u << 2);
}
Test(loco_collab_auth, bad_verdicts_are_refused, .timeout = 120) {
  bad_blobs(PULSE_LOCO_AUTH_VERDICT, "verdict", 1u << 1 | 1u << 2 | 1u << 4);
}

/* ------------------------------------------------------ claims and grants */

/* POSTs PATH?id=1 to base, signed by h for `round` (h NULL: unsigned; flip:
 * one signature bit changed). @return the HTTP status. */
static long ca_post(const char *base, const pulse_sign_key *k, uint64_t round,
                    const char *path_id, int flip) {
  char url[600];
  int n = snprintf(url, sizeof url, "%s%s", base, path_id);
  if (k != NULL) {
    loco_sig s = ca_sign(k, PULSE_LOCO_AUTH_CLAIM, round, path_id,
                         strlen(path_id));
    s.sig[5] ^= (uint8_t)flip;
    char key[65], sig[129];
    for (int i = 0; i < 32; i++)
      snprintf(key + 2 * i, 3, "%02x", s.key[i]);
    for (int i = 0; i < 64; i++)
      snprintf(sig + 2 * i, 3, "%02x", s.sig[i]);
    snprintf(url + n, sizeof url - (size_t)n, "&round=%llu&key=%s&sig=%s",
             (unsigned long long)round, key, sig);
  }
  long status = 0;
  cr_assert_eq(loco_http_post(url, 5000, &status), PULSE_OK);
  return status;
}

Test(loco_collab_auth, claims_not_signed_by_their_member_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  for (uint32_t i = 0; i < 2; i++) {
    cr_assert_eq(pulse_sign_key_generate(&k[i]), PULSE_OK);
    pins[i].id = i;
    pulse_sign_key_public(k[i], pins[i].key);
  }
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco *ctx[2];
  pulse_loco_collab *c[2];
  pulse_loco_member m[2];
  for (uint32_t i = 0; i < 2; i++) {
    ctx[i] = ca_ctx(i, NULL);
    c[i] = ca_peer(ctx[i], k[i], pins, 2);
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(c[i]));
  }
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pulse_loco_collab_start(c[i], m, 2), PULSE_OK);
  const char *base = pulse_loco_collab_url(c[0]);
  const char *claim3 = "/v1/collab/claim/3/0/16/0/0?id=1";
  const char *claim0 = "/v1/collab/claim/0/0/16/0/0?id=1";
  /* Unsigned, forged, a stranger's, peer 0's own key for peer 1. */
  cr_assert_eq(ca_post(base, NULL, 3, claim3, 0), 401);
  cr_assert_eq(ca_post(base, k[1], 3, claim3, 1), 401);
  cr_assert_eq(ca_post(base, kx, 3, claim3, 0), 401);
  cr_assert_eq(ca_post(base, k[0], 3, claim3, 0), 401);
  /* Peer 1's: through to the writer's table (not at round 3: 503), its
   * answer signed by peer 0 for what was asked. */
  char url[600];
  long status = 0;
  loco_sig ans;
  memset(&ans, 0, sizeof ans);
  {
    loco_sig s = ca_sign(k[1], PULSE_LOCO_AUTH_CLAIM, 3, claim3,
                         strlen(claim3));
    char key[65], sig[129];
    for (int i = 0; i < 32; i++)
      snprintf(key + 2 * i, 3, "%02x", s.key[i]);
    for (int i = 0; i < 64; i++)
      snprintf(sig + 2 * i, 3, "%02x", s.sig[i]);
    snprintf(url, sizeof url, "%s%s&round=3&key=%s&sig=%s", base, claim3, key,
             sig);
  }
  cr_assert_eq(loco_http_post_signed(url, 5000, &status, &ans), PULSE_OK);
  cr_assert_neq(status, 401);
  cr_assert(ans.present, "the answer is not signed");
  char text[128];
  int len = snprintf(text, sizeof text, "%s\nstatus %ld", claim3, status);
  pulse_loco_auth_opts o;
  pulse_loco_auth_opts_init(&o);
  o.key = kx;
  o.members = pins[0].key;
  o.member_count = 1;
  pulse_loco_auth *check;
  cr_assert_eq(pulse_loco_auth_create(&o, &check), PULSE_OK);
  cr_assert_eq(pulse_loco_auth_check(check, PULSE_LOCO_AUTH_GRANT, ans.round,
                                     ans.key, text, (size_t)len, ans.sig),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_loco_auth_free(check);
  /* An older round's claim after round 3's: a replay. */
  cr_assert_eq(ca_post(base, k[1], 0, claim0, 0), 401);
  cr_assert_eq(ca_refused(c[0], "unsigned"), 1);
  cr_assert_eq(ca_refused(c[0], "forged"), 2);
  cr_assert_eq(ca_refused(c[0], "foreign"), 1);
  cr_assert_eq(ca_refused(c[0], "replayed"), 1);
  cr_assert_eq(ca_refused_kind(c[0], "claim"), 5);
  /* An acknowledgement unsigned. */
  cr_assert_eq(ca_post(base, NULL, 0, "/v1/loco/round/0/done?id=1", 0), 401);
  cr_assert_eq(ca_refused_kind(c[0], "done"), 1);
  for (int i = 0; i < 2; i++) {
    pulse_loco_collab_free(c[i]);
    pulse_loco_free(ctx[i]);
    pulse_sign_key_free(k[i]);
  }
  pulse_sign_key_free(kx);
}

/* A hostile writer: every claim granted (200), its answer signed in
 * `ca_grant_mode` (0 honest by key ca_grant_key, 1 unsigned, 2 forged, 3
 * of another round, 4 a stranger's). */
static int ca_grant_mode;
static const pulse_sign_key *ca_grant_key, *ca_grant_stranger;

static unsigned grant_all(void *user, const char *path, const char *id,
                          const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{\"granted\":true}");
  return 200;
}

static void sign_grant(void *user, const char *path, const char *id,
                       unsigned status, loco_sig *sig) {
  (void)user;
  char text[352];
  int len = snprintf(text, sizeof text, "%s?id=%s\nstatus %u", path, id,
                     status);
  uint64_t r = strtoull(path + strlen("/v1/collab/claim/"), NULL, 10);
  memset(sig, 0, sizeof *sig);
  if (ca_grant_mode == 1)
    return;
  *sig = ca_sign(ca_grant_mode == 4 ? ca_grant_stranger : ca_grant_key,
                 PULSE_LOCO_AUTH_GRANT, ca_grant_mode == 3 ? r + 1 : r, text,
                 (size_t)len);
  if (ca_grant_mode == 2)
    sig->sig[30] ^= 2;
}

Test(loco_collab_auth, grants_not_signed_by_the_writer_are_refused,
     .timeout = 60) {
  pulse_sign_key *k0, *k1, *kx;
  cr_assert_eq(pulse_sign_key_generate(&k0), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&k1), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  ca_grant_key = k0;
  ca_grant_stranger = kx;
  pulse_loco_member_key pins[2] = {{0, {0}}, {1, {0}}};
  pulse_sign_key_public(k0, pins[0].key);
  pulse_sign_key_public(k1, pins[1].key);
  loco_server *srv;
  cr_assert_eq(loco_server_start(grant_all, NULL, &srv), PULSE_OK);
  loco_server_set_reply_signer(srv, sign_grant, NULL);
  pulse_loco *ctx = ca_ctx(1, NULL);
  pulse_loco_collab *c = ca_peer(ctx, k1, pins, 2);
  pulse_loco_member m[2] = {{0, ""}, {1, ""}};
  snprintf(m[0].url, sizeof m[0].url, "http://127.0.0.1:%u",
           loco_server_port(srv));
  snprintf(m[1].url, sizeof m[1].url, "%s", pulse_loco_collab_url(c));
  cr_assert_eq(pulse_loco_collab_start(c, m, 2), PULSE_OK);
  /* Round 0's writer is trainer 0: the hostile server. */
  const char *why[] = {"", "unsigned", "forged", "forged", "foreign"};
  for (int mode = 1; mode <= 4; mode++) {
    ca_grant_mode = mode;
    uint64_t was = ca_refused(c, why[mode]);
    cr_assert_eq(collab_tell_writer(c, 0, 0, 0, 16, 0, 0, 0),
                 COLLAB_UNVERIFIED, "grant %d taken", mode);
    cr_assert_eq(ca_refused(c, why[mode]), was + 1, "grant %d", mode);
  }
  cr_assert_eq(ca_refused_kind(c, "grant"), 4);
  ca_grant_mode = 0;
  cr_assert_eq(collab_tell_writer(c, 0, 0, 0, 16, 0, 0, 0), COLLAB_GRANTED);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  loco_server_stop(srv);
  pulse_sign_key_free(k0);
  pulse_sign_key_free(k1);
  pulse_sign_key_free(kx);
}
