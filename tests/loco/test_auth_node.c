/* test_auth_node.c - authenticated PULSELoCo in the exchange (issue 15,
 * coordinator_auth_impl.h): trainers in threads of this process, each with its
 * key, the members' keys pinned. One trainer serves its payloads (or, as
 * the coordinator, its manifests) unsigned, forged, replayed from the
 * round before, or signed by a stranger's key, over HTTP and over
 * datagrams: the others refuse and count them (step info and /metrics),
 * the round goes on without that contribution, and the honest trainers'
 * weights stay the same bits. A joiner without an admission is refused;
 * with a member's admission it joins and its payloads are accepted. A
 * configuration that could not be verified is refused at create. */
#include "auth_testutil.h"

/* Trainer 2 serves bad payloads (HTTP) or chunk lists and datagrams (UDP)
 * in `mode`; the others refuse them, count them, and go on without. */
static void bad_payloads(uint32_t transport, unsigned mode) {
  pulse_sim_problem *p = aproblem();
  atrainer t[AT];
  pulse_loco_member m[AT];
  pulse_loco_member_key pins[AT];
  astart(t, AT, p, aopts(transport), m, pins);
  cr_assert_eq(loco_auth_tamper(t[2].node, mode,
                                LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_PAYLOAD)),
               PULSE_OK);
  arun(t, AT);
  for (size_t i = 0; i < AT; i++)
    cr_assert_eq(t[i].st, PULSE_OK, "trainer %zu: %s", i, t[i].detail);
  /* Replays start in round 1 (round 0 has nothing older to replay). */
  uint64_t bad_rounds = mode == LOCO_AUTH_TAMPER_REPLAYED ? ROUNDS - 1 : ROUNDS;
  char line[96];
  snprintf(line, sizeof line, "pulse_loco_auth_refused_total{reason=\"%s\"}",
           reason[mode]);
  if (transport == PULSE_LOCO_TRANSPORT_HTTP) {
    /* The coordinator fetches the payloads: it refuses trainer 2's. */
    cr_assert_geq(refused(&t[0].auth, mode), bad_rounds, "%s: %llu", line,
                  (unsigned long long)refused(&t[0].auth, mode));
    cr_assert_eq(metric(t[0].node, line), refused(&t[0].auth, mode));
    for (size_t i = 0; i < AT; i++)
      cr_assert_eq(t[i].min_contributors, AT - 1, "trainer %zu", i);
  } else {
    /* Every receiver refuses trainer 2's list and its datagrams; replayed
     * datagrams (round 0's again in round 1) are refused by their round,
     * without a look at the list. */
    for (size_t i = 0; i < 2; i++) {
      uint64_t unlisted = metric(
          t[i].node,
          "pulse_loco_auth_datagrams_refused_total{reason=\"unlisted\"}");
      uint64_t replayed = metric(
          t[i].node,
          "pulse_loco_auth_datagrams_refused_total{reason=\"replayed\"}");
      cr_assert_gt(t[i].datagrams_refused_auth, 0, "trainer %zu", i);
      cr_assert_eq(unlisted + replayed, t[i].datagrams_refused_auth);
      if (mode == LOCO_AUTH_TAMPER_REPLAYED) {
        /* Refused by their round; a slow run (ASan with other jobs) also
         * counted some as not listed: every one is refused and counted
         * either way (the sum above). */
        cr_assert_gt(replayed, 0, "trainer %zu", i);
      } else {
        cr_assert_geq(refused(&t[i].auth, mode), bad_rounds, "trainer %zu: %s",
                      i, line);
        cr_assert_eq(metric(t[i].node, line), refused(&t[i].auth, mode));
        cr_assert_eq(unlisted, t[i].datagrams_refused_auth, "trainer %zu", i);
      }
    }
  }
  /* The honest trainers accepted each other's every round. */
  cr_assert_gt(t[0].auth.accepted + t[1].auth.accepted, 0);
  cr_assert_eq(pulse_loco_global_digest(t[0].ctx),
               pulse_loco_global_digest(t[1].ctx),
               "the honest trainers' weights differ");
  cr_assert_eq(pulse_loco_round(t[0].ctx), ROUNDS);
  afree(t, AT);
  pulse_sim_problem_free(p);
}

Test(loco_auth_node, an_honest_run_accepts_everything_and_refuses_nothing,
     .timeout = 120) {
  pulse_sim_problem *p = aproblem();
  atrainer t[AT];
  pulse_loco_member m[AT];
  pulse_loco_member_key pins[AT];
  astart(t, AT, p, aopts(PULSE_LOCO_TRANSPORT_HTTP), m, pins);
  arun(t, AT);
  for (size_t i = 0; i < AT; i++) {
    cr_assert_eq(t[i].st, PULSE_OK, "trainer %zu: %s", i, t[i].detail);
    cr_assert_eq(t[i].min_contributors, AT);
    cr_assert_eq(t[i].auth.unsigned_bodies + t[i].auth.forged +
                     t[i].auth.replayed + t[i].auth.foreign,
                 0, "trainer %zu refused something", i);
    cr_assert_gt(t[i].auth.accepted, 0);
    cr_assert_eq(pulse_loco_global_digest(t[i].ctx),
                 pulse_loco_global_digest(t[0].ctx));
  }
  /* What signing added: the coordinator fetched 2 signed payloads a
   * round, a member the manifest and 2 payloads (261 bytes of signature
   * headers each at a one-digit round). */
  cr_assert_geq(t[0].auth_bytes, ROUNDS * 2u * 261u);
  cr_assert_geq(t[1].auth_bytes, ROUNDS * 3u * 261u);
  afree(t, AT);
  pulse_sim_problem_free(p);
}

Test(loco_auth_node, unsigned_payloads_over_http_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_HTTP, LOCO_AUTH_TAMPER_UNSIGNED);
}
Test(loco_auth_node, forged_payloads_over_http_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_HTTP, LOCO_AUTH_TAMPER_FORGED);
}
Test(loco_auth_node, replayed_payloads_over_http_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_HTTP, LOCO_AUTH_TAMPER_REPLAYED);
}
Test(loco_auth_node, foreign_payloads_over_http_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_HTTP, LOCO_AUTH_TAMPER_FOREIGN);
}
Test(loco_auth_node, unsigned_chunks_over_udp_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_UDP, LOCO_AUTH_TAMPER_UNSIGNED);
}
Test(loco_auth_node, forged_chunks_over_udp_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_UDP, LOCO_AUTH_TAMPER_FORGED);
}
Test(loco_auth_node, replayed_chunks_over_udp_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_UDP, LOCO_AUTH_TAMPER_REPLAYED);
}
Test(loco_auth_node, foreign_chunks_over_udp_are_refused, .timeout = 120) {
  bad_payloads(PULSE_LOCO_TRANSPORT_UDP, LOCO_AUTH_TAMPER_FOREIGN);
}

/* The coordinator (trainer 0) serves bad manifests: a member refuses the
 * first one and counts it; over HTTP it gives its step up (nothing
 * applied), as with no manifest at all; over datagrams the round's
 * aggregate is in and the member takes the coordinator's whole state. */
static void bad_manifests(uint32_t transport) {
  for (unsigned mode = LOCO_AUTH_TAMPER_UNSIGNED;
       mode <= LOCO_AUTH_TAMPER_FOREIGN; mode++) {
    pulse_sim_problem *p = aproblem();
    atrainer t[2];
    pulse_loco_member m[2];
    pulse_loco_member_key pins[2];
    pulse_loco_coord_opts no = aopts(transport);
    no.manifest_timeout_ms = 3000; /* the member's catch-up after refusal */
    astart(t, 2, p, no, m, pins);
    cr_assert_eq(
        loco_auth_tamper(t[0].node, mode,
                         LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_MANIFEST)),
        PULSE_OK);
    /* One round (a replay needs two). */
    uint32_t rounds = mode == LOCO_AUTH_TAMPER_REPLAYED ? 2 : 1;
    t[0].rounds = t[1].rounds = rounds;
    t[0].no_linger = 1; /* an HTTP member that refused never acknowledges */
    arun(t, 2);
    cr_assert_eq(t[0].st, PULSE_OK, "%s", t[0].detail);
    if (transport == PULSE_LOCO_TRANSPORT_HTTP) {
      cr_assert_eq(t[1].rounds_done, rounds - 1, "mode %s", reason[mode]);
      cr_assert_neq(t[1].st, PULSE_OK, "mode %s", reason[mode]);
    } else {
      cr_assert_eq(t[1].st, PULSE_OK, "mode %s: %s", reason[mode], t[1].detail);
      cr_assert_eq(pulse_loco_global_digest(t[1].ctx),
                   pulse_loco_global_digest(t[0].ctx));
    }
    cr_assert_geq(refused(&t[1].auth, mode), 1, "mode %s: %s", reason[mode],
                  t[1].detail);
    char line[96];
    snprintf(line, sizeof line, "pulse_loco_auth_refused_total{reason=\"%s\"}",
             reason[mode]);
    cr_assert_geq(metric(t[1].node, line), 1);
    afree(t, 2);
    pulse_sim_problem_free(p);
  }
}

Test(loco_auth_node, bad_manifests_over_http_are_refused, .timeout = 180) {
  bad_manifests(PULSE_LOCO_TRANSPORT_HTTP);
}
Test(loco_auth_node, bad_manifests_over_udp_are_refused, .timeout = 180) {
  bad_manifests(PULSE_LOCO_TRANSPORT_UDP);
}

Test(loco_auth_node, a_joiner_needs_a_members_admission, .timeout = 180) {
  pulse_sim_problem *p = aproblem();
  uint64_t P = pulse_sim_problem_param_count(p);
  atrainer t[2];
  pulse_loco_member m[2];
  pulse_loco_member_key pins[2];
  astart(t, 2, p, aopts(PULSE_LOCO_TRANSPORT_HTTP), m, pins);
  volatile int hold = 1;
  volatile uint64_t round = 0;
  for (int i = 0; i < 2; i++) {
    t[i].rounds = 8;
    t[i].hold = &hold;
  }
  t[0].round = &round;
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, run_atrainer, &t[i]);
  while (round < 2)
    sleep_ms(2);
  /* Two newcomers whose keys nobody pinned: 5 without an admission, 6
   * with trainer 1's. */
  pulse_sign_key *k5, *k6;
  cr_assert_eq(pulse_sign_key_generate(&k5), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&k6), PULSE_OK);
  uint8_t pub6[32];
  pulse_sign_key_public(k6, pub6);
  pulse_loco_admission adm;
  cr_assert_eq(pulse_loco_coord_admit(t[1].node, pub6, 100, &adm), PULSE_OK);
  pulse_loco *c5 = lt_ctx(P, 5, NULL), *c6 = lt_ctx(P, 6, NULL);
  pulse_loco_coord *n5, *n6;
  pulse_loco_coord_opts no = aopts(PULSE_LOCO_TRANSPORT_HTTP);
  no.sign_key = k5;
  no.member_keys = pins;
  no.member_key_count = 2;
  cr_assert_eq(pulse_loco_coord_create(&no, c5, &n5), PULSE_OK, "%s",
               pulse_error_detail());
  no.sign_key = k6;
  no.admission = &adm;
  cr_assert_eq(pulse_loco_coord_create(&no, c6, &n6), PULSE_OK, "%s",
               pulse_error_detail());
  float *local = malloc(P * sizeof *local);
  /* Long enough for a loaded machine to ask at least once. */
  cr_assert_neq(pulse_loco_coord_join(n5, m[1].url, local, 2000), PULSE_OK,
                "a joiner without an admission got in");
  cr_assert_geq(metric(t[0].node, "pulse_loco_auth_joins_refused_total"), 1);
  hold = 0;
  cr_assert_eq(pulse_loco_coord_join(n6, m[1].url, local, 20000), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_geq(metric(t[0].node, "pulse_loco_auth_admitted_total"), 1);
  atrainer j;
  memset(&j, 0, sizeof j);
  j.p = p;
  j.id = 6;
  j.rounds = 8;
  j.ctx = c6;
  j.node = n6;
  run_atrainer(&j);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  cr_assert_eq(j.st, PULSE_OK, "joiner: %s", j.detail);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(t[i].st, PULSE_OK, "trainer %d: %s", i, t[i].detail);
  cr_assert_eq(pulse_loco_round(c6), 8);
  cr_assert_eq(pulse_loco_global_digest(c6),
               pulse_loco_global_digest(t[0].ctx));
  cr_assert_eq(pulse_loco_global_digest(t[1].ctx),
               pulse_loco_global_digest(t[0].ctx));
  /* Its payloads counted: the rounds after its join had 3 contributors,
   * and nobody refused anything of it. */
  cr_assert_eq(j.min_contributors, 3);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(t[i].auth.unsigned_bodies + t[i].auth.forged +
                     t[i].auth.replayed + t[i].auth.foreign,
                 0, "trainer %d", i);
  free(local);
  pulse_loco_coord_free(n5);
  pulse_loco_coord_free(n6);
  pulse_loco_free(c5);
  pulse_loco_free(c6);
  pulse_sign_key_free(k5);
  pulse_sign_key_free(k6);
  afree(t, 2);
  pulse_sim_problem_free(p);
}

Test(loco_auth_node, configurations_that_cannot_be_verified_are_refused) {
  pulse_loco *ctx = lt_ctx(1024, 1, NULL);
  pulse_sign_key *k, *other;
  cr_assert_eq(pulse_sign_key_generate(&k), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&other), PULSE_OK);
  pulse_loco_member_key pins[2] = {{0, {0}}, {1, {0}}};
  pulse_sign_key_public(other, pins[0].key);
  pulse_sign_key_public(other, pins[1].key);
  pulse_loco_coord *n = NULL;
  pulse_loco_coord_opts no = aopts(PULSE_LOCO_TRANSPORT_HTTP);
  /* Authentication asked for, no key. */
  no.auth = PULSE_LOCO_AUTH_ON;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  /* Pinned members, no key of its own. */
  no.auth = PULSE_LOCO_AUTH_AUTO;
  no.member_keys = pins;
  no.member_key_count = 1;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  /* This trainer's id pinned with another key; one key for two ids. */
  no.sign_key = k;
  no.member_key_count = 2;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  pins[1].id = 2;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  /* An admission of another key. */
  no.member_key_count = 1;
  pulse_loco_admission adm;
  memset(&adm, 0, sizeof adm);
  no.admission = &adm;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_ERR_ARG);
  /* Fine, but a founding member without a pinned key cannot start. */
  no.admission = NULL;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_loco_member m[3] = {{0, ""}, {1, ""}, {7, ""}};
  for (int i = 0; i < 3; i++)
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_coord_url(n));
  cr_assert_eq(pulse_loco_coord_start(n, m, 3), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_coord_start(n, m, 2), PULSE_OK, "%s",
               pulse_error_detail());
  /* Off: nothing signed or checked, even with a key. */
  pulse_loco_coord_free(n);
  no.auth = PULSE_LOCO_AUTH_OFF;
  cr_assert_eq(pulse_loco_coord_create(&no, ctx, &n), PULSE_OK);
  pulse_loco_admission a2;
  cr_assert_eq(pulse_loco_coord_admit(n, pins[0].key, 1, &a2), PULSE_ERR_ARG);
  pulse_loco_coord_free(n);
  pulse_loco_free(ctx);
  pulse_sign_key_free(k);
  pulse_sign_key_free(other);
}
