/* test_collab_auth.c - the collaboration's authentication, its first part
 * (issue 35 item 7; docs/protocols/loco-exchange.md "Authentication"): a
 * hostile seed feeds a joining peer membership views and states that are
 * unsigned, forged, replayed (another round's) or signed by a stranger: the
 * peer refuses each before it takes anything (its weights unchanged, the
 * refusal counted by reason and kind at /metrics), then takes the honest ones.
 * A writer serving such manifests: the others refuse them, apply nothing and
 * end with the same bits. Peers with keys run rounds and admit a joiner,
 * everything signed checked, nothing refused, the same bits. */
#include "collab_auth_testutil.h"

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
  cr_assert_eq(loco_server_start(at_no_post, NULL, &srv), PULSE_OK);
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
  loco_sig good = at_sign(k0, PULSE_LOCO_AUTH_MEMBERS, 2, view.data, view.size);
  loco_sig sgood =
      at_sign(k0, PULSE_LOCO_AUTH_STATE, 2, state[2].data, state[2].size);
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
      bad = at_sign(kx, PULSE_LOCO_AUTH_MEMBERS, 2, view.data, view.size);
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
      bad = at_sign(kx, PULSE_LOCO_AUTH_STATE, 2, body, size);
    } else {
      body = state[1].data;
      size = state[1].size;
      bad = at_sign(k0, PULSE_LOCO_AUTH_STATE, 1, body, size);
    }
    cr_assert_eq(
        loco_server_put_signed(srv, "/v1/loco/state/2", body, size, &bad),
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

Test(loco_collab_auth, signed_peers_admit_a_joiner_and_refuse_nothing,
     .timeout = 120) {
  ca_group g;
  ca_group_start(&g, 3, 2, 6);
  volatile uint64_t round0 = 0;
  for (int i = 0; i < 3; i++)
    g.r[i].round_of_0 = &round0;
  g.r[2].join_seed = g.m[1].url;
  ca_group_run(&g);
  for (int i = 0; i < 3; i++) {
    ca_runner *r = &g.r[i];
    cr_assert_eq(r->st, PULSE_OK, "peer %d: %s", i, r->detail);
    cr_assert_eq(pulse_loco_round(r->ctx), 6, "peer %d", i);
    cr_assert_eq(pulse_loco_global_digest(r->ctx),
                 pulse_loco_global_digest(g.r[0].ctx), "peer %d", i);
    for (int w = 0; w < 4; w++)
      cr_assert_eq(ca_refused(r->c, (const char *[]){"unsigned", "forged",
                                                     "replayed", "foreign"}[w]),
                   0, "peer %d", i);
  }
  /* The joiner checked the view and the state it loaded. */
  cr_assert_geq(ca_metric(g.r[2].c, "pulse_loco_auth_accepted_total"), 2);
  ca_group_free(&g);
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
  /* A replay needs a manifest of peer 0's before: rounds 0 to 3. */
  uint64_t bad_round = mode == LOCO_AUTH_TAMPER_REPLAYED ? 3 : 0;
  ca_group g;
  ca_group_start(&g, 3, 3, bad_round + 1);
  cr_assert_eq(
      collab_auth_tamper(g.r[0].c, mode,
                         LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_MANIFEST)),
      PULSE_OK);
  ca_group_run(&g);
  for (int i = 1; i < 3; i++) {
    cr_assert_neq(g.r[i].st, PULSE_OK, "%s: peer %d took the manifest", why, i);
    cr_assert_eq(pulse_loco_round(g.r[i].ctx), bad_round, "%s: peer %d", why,
                 i);
    cr_assert_geq(ca_refused(g.r[i].c, why), 1, "%s: peer %d", why, i);
    cr_assert_geq(ca_refused_kind(g.r[i].c, "manifest"), 1, "%s", why);
  }
  cr_assert_eq(pulse_loco_global_digest(g.r[1].ctx),
               pulse_loco_global_digest(g.r[2].ctx), "%s", why);
  ca_group_free(&g);
}

Test(loco_collab_auth, unsigned_manifests_are_refused, .timeout = 120) {
  bad_manifests(LOCO_AUTH_TAMPER_UNSIGNED, "unsigned");
}
Test(loco_collab_auth, forged_manifests_are_refused, .timeout = 120) {
  bad_manifests(LOCO_AUTH_TAMPER_FORGED, "forged");
}
Test(loco_collab_auth, replayed_manifests_are_refused, .timeout = 120) {
  bad_manifests(LOCO_AUTH_TAMPER_REPLAYED, "replayed");
}
Test(loco_collab_auth, foreign_manifests_are_refused, .timeout = 120) {
  bad_manifests(LOCO_AUTH_TAMPER_FOREIGN, "foreign");
}

/* Peer 1 serves its payloads in `mode`: the writers (peers 0 and 2) leave
 * them out, count them and keep peer 1 a member; everyone ends with the
 * same bits (a left-out payload stays in its sender's error feedback). */
static void bad_payloads(unsigned mode, const char *why) {
  ca_group g;
  ca_group_start(&g, 3, 3, 4); /* writers 0, 1, 2, 0; a replay from round 1 */
  cr_assert_eq(
      collab_auth_tamper(g.r[1].c, mode,
                         LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_PAYLOAD)),
      PULSE_OK);
  ca_group_run(&g);
  uint64_t refused = 0;
  for (int i = 0; i < 3; i++) {
    ca_runner *r = &g.r[i];
    cr_assert_eq(r->st, PULSE_OK, "%s: peer %d: %s", why, i, r->detail);
    cr_assert_eq(pulse_loco_round(r->ctx), 4, "%s: peer %d", why, i);
    cr_assert_eq(pulse_loco_global_digest(r->ctx),
                 pulse_loco_global_digest(g.r[0].ctx), "%s: peer %d", why, i);
    refused += ca_refused_kind(r->c, "payload");
  }
  cr_assert_geq(refused, 1, "%s", why);
  cr_assert_geq(ca_refused(g.r[0].c, why) + ca_refused(g.r[2].c, why), 1, "%s",
                why);
  /* Still a member: the next round lists it. */
  pulse_loco_member next[3];
  size_t count = 0;
  pulse_loco_collab_members(g.r[0].c, next, 3, &count);
  cr_assert_eq(count, 3, "%s", why);
  ca_group_free(&g);
}

Test(loco_collab_auth, unsigned_payloads_are_left_out, .timeout = 120) {
  bad_payloads(LOCO_AUTH_TAMPER_UNSIGNED, "unsigned");
}
Test(loco_collab_auth, forged_payloads_are_left_out, .timeout = 120) {
  bad_payloads(LOCO_AUTH_TAMPER_FORGED, "forged");
}
Test(loco_collab_auth, replayed_payloads_are_left_out, .timeout = 120) {
  bad_payloads(LOCO_AUTH_TAMPER_REPLAYED, "replayed");
}
Test(loco_collab_auth, foreign_payloads_are_left_out, .timeout = 120) {
  bad_payloads(LOCO_AUTH_TAMPER_FOREIGN, "foreign");
}
