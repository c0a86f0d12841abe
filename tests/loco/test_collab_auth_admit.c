/* test_collab_auth_admit.c - admissions in the authenticated
 * collaboration (issue 35 item 7; docs/protocols/loco-exchange.md
 * "Authentication"): a joiner whose key nobody pinned joins a running
 * collaboration on a member's admission (pulse_loco_collab_admit) and
 * contributes; a second one, admitted later, learns the first's key from
 * its key blob; all end with the same bits. Joins without an admission,
 * with one signed by a non-member, one whose round is past, or one of
 * another key are refused and counted, and the members go on. */
#include "collab_auth_testutil.h"

#include "pulse_loco_auth.h"

typedef struct {
  pulse_loco_collab *c;
  pulse_loco *ctx;
  float *theta;
  volatile uint64_t *until; /* rounds run while below it */
  volatile uint64_t *round_out;
  pulse_status st;
  char detail[256];
  uint64_t included;          /* rounds whose manifest listed its payload */
  uint32_t max_contributors;
} ad_runner;

static void *ad_run(void *arg) {
  ad_runner *r = arg;
  uint32_t id = pulse_loco_trainer_id(r->ctx);
  r->st = PULSE_OK;
  while (r->st == PULSE_OK && pulse_loco_round(r->ctx) < *r->until) {
    pulse_loco_collab_figures info;
    r->st = pulse_loco_collab_round(r->c, r->theta, 16, ca_step, &id, 0, &info);
    if (r->st == PULSE_OK) {
      r->included += info.self_included != 0;
      if (info.contributors > r->max_contributors)
        r->max_contributors = info.contributors;
    }
    if (r->round_out != NULL)
      *r->round_out = pulse_loco_round(r->ctx);
  }
  if (r->st != PULSE_OK)
    snprintf(r->detail, sizeof r->detail, "%s", pulse_error_detail());
  return NULL;
}

/* A joiner with key k (pinned nowhere), the founders' keys pinned, the
 * admission adm (NULL: none). */
static pulse_loco_collab *ad_joiner(pulse_loco *ctx, const pulse_sign_key *k,
                                    const pulse_loco_member_key *founders,
                                    size_t n, const pulse_loco_admission *adm) {
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  co.target_batch = 64;
  co.claim_timeout_ms = 2000;
  co.round_timeout_ms = 8000;
  co.sign_key = k;
  co.member_keys = founders;
  co.member_key_count = n;
  co.admission = adm;
  pulse_loco_collab *c;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  return c;
}

/* Joins that must be refused at the seed (founder 0): each fails, and the
 * seed counts it among the refused joins, by reason and as kind join. */
static void ad_refused_join(pulse_loco_collab *seed, pulse_loco_collab *j,
                            const char *why, float *local) {
  uint64_t joins = ca_metric(seed, "pulse_loco_auth_joins_refused_total");
  uint64_t reason = ca_refused(seed, why);
  uint64_t kind = ca_refused_kind(seed, "join");
  uint64_t admitted = ca_metric(seed, "pulse_loco_auth_admitted_total");
  /* Long enough for a loaded machine to ask more than once. */
  cr_assert_neq(pulse_loco_collab_join(j, pulse_loco_collab_url(seed), local,
                                       1500),
                PULSE_OK, "a join (%s) got in", why);
  cr_assert_gt(ca_metric(seed, "pulse_loco_auth_joins_refused_total"), joins,
               "%s", why);
  cr_assert_gt(ca_refused(seed, why), reason, "%s", why);
  cr_assert_gt(ca_refused_kind(seed, "join"), kind, "%s", why);
  cr_assert_eq(ca_metric(seed, "pulse_loco_auth_admitted_total"), admitted,
               "%s", why);
}

Test(loco_collab_auth_admit, admitted_joiners_join_and_bad_admissions_are_refused,
     .timeout = 180) {
  /* Founders 0 and 1, each pinning the other; joiners 6 and 10 honest,
   * 5, 7, 8, 9 not. */
  pulse_sign_key *k[2];
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  float *init = malloc(CA_P * sizeof *init);
  for (uint32_t i = 0; i < CA_P; i++)
    init[i] = 0.02f * (float)(i % 61) - 0.5f;
  volatile uint64_t until = UINT64_MAX, round0 = 0;
  ad_runner f[2];
  pulse_loco_member m[2];
  memset(f, 0, sizeof f);
  for (uint32_t i = 0; i < 2; i++) {
    f[i].ctx = ca_ctx(i, init);
    f[i].c = ca_peer(f[i].ctx, k[i], pins, 2);
    f[i].theta = malloc(CA_P * sizeof(float));
    memcpy(f[i].theta, init, CA_P * sizeof(float));
    f[i].until = &until;
    m[i].id = i;
    snprintf(m[i].url, sizeof m[i].url, "%s", pulse_loco_collab_url(f[i].c));
  }
  f[0].round_out = &round0;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pulse_loco_collab_start(f[i].c, m, 2), PULSE_OK, "%s",
                 pulse_error_detail());
  pthread_t th[4];
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, ad_run, &f[i]);
  while (round0 < 3)
    loco_sleep_ms(2);

  pulse_sign_key *kj[6]; /* ids 5..10 */
  uint8_t pub[6][PULSE_KEY_BYTES];
  for (int i = 0; i < 6; i++) {
    cr_assert_eq(pulse_sign_key_generate(&kj[i]), PULSE_OK);
    pulse_sign_key_public(kj[i], pub[i]);
  }
  pulse_loco *cj[6];
  for (int i = 0; i < 6; i++)
    cj[i] = ca_ctx(5u + (uint32_t)i, NULL);
  float *local = malloc(CA_P * sizeof *local);

  /* 5: no admission (foreign). */
  pulse_loco_collab *j5 = ad_joiner(cj[0], kj[0], pins, 2, NULL);
  ad_refused_join(f[0].c, j5, "foreign", local);
  /* 7: an admission by a key that is no member's (foreign). */
  pulse_sign_key *kx;
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco_auth_opts ao;
  pulse_loco_auth_opts_init(&ao);
  ao.key = kx;
  pulse_loco_auth *stranger;
  cr_assert_eq(pulse_loco_auth_create(&ao, &stranger), PULSE_OK);
  pulse_loco_admission a7;
  memcpy(a7.key, pub[2], PULSE_KEY_BYTES);
  pulse_sign_key_public(kx, a7.sponsor);
  a7.round = 1000;
  cr_assert_eq(pulse_loco_auth_admit_sign(stranger, 1000, pub[2], a7.sig),
               PULSE_OK);
  pulse_loco_collab *j7 = ad_joiner(cj[2], kj[2], pins, 2, &a7);
  ad_refused_join(f[0].c, j7, "foreign", local);
  /* 8: a member's admission until round 1, the group past it (replayed). */
  pulse_loco_admission a8;
  cr_assert_eq(pulse_loco_collab_admit(f[1].c, pub[3], 1, &a8), PULSE_OK);
  pulse_loco_collab *j8 = ad_joiner(cj[3], kj[3], pins, 2, &a8);
  ad_refused_join(f[0].c, j8, "replayed", local);
  /* 9: a member's admission of another key (5's), sent with 9's join
   * (forged). A peer refuses to be made with it; sent all the same. */
  pulse_loco_admission a9;
  cr_assert_eq(pulse_loco_collab_admit(f[1].c, pub[0], 1000, &a9), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  co.sign_key = kj[4];
  co.admission = &a9;
  pulse_loco_collab *bad = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, cj[4], &bad), PULSE_ERR_ARG);
  pulse_loco_collab *j9 = ad_joiner(cj[4], kj[4], pins, 2, NULL);
  j9->has_admission = 1;
  j9->admission = a9;
  ad_refused_join(f[0].c, j9, "forged", local);
  /* None of them is a member anywhere. */
  for (int i = 0; i < 2; i++) {
    pulse_loco_member now[8];
    size_t n = 0;
    pulse_loco_collab_members(f[i].c, now, 8, &n);
    cr_assert_eq(n, 2, "founder %d lists %zu members", i, n);
  }

  /* 6: founder 1's admission, joining through founder 0. */
  pulse_loco_admission a6;
  cr_assert_eq(pulse_loco_collab_admit(f[1].c, pub[1], round0 + 1000, &a6),
               PULSE_OK);
  ad_runner j[2];
  memset(j, 0, sizeof j);
  j[0].ctx = cj[1];
  j[0].c = ad_joiner(cj[1], kj[1], pins, 2, &a6);
  j[0].theta = malloc(CA_P * sizeof(float));
  j[0].until = &until;
  cr_assert_eq(pulse_loco_collab_join(j[0].c, m[0].url, j[0].theta, 30000),
               PULSE_OK, "%s", pulse_error_detail());
  pthread_create(&th[2], NULL, ad_run, &j[0]);
  /* 10: founder 0's admission, later: it learns 6's key from 6's key
   * blob when it first meets 6's signed bodies. */
  pulse_loco_admission a10;
  cr_assert_eq(pulse_loco_collab_admit(f[0].c, pub[5], round0 + 1000, &a10),
               PULSE_OK);
  j[1].ctx = cj[5];
  j[1].c = ad_joiner(cj[5], kj[5], pins, 2, &a10);
  j[1].theta = malloc(CA_P * sizeof(float));
  j[1].until = &until;
  cr_assert_eq(pulse_loco_collab_join(j[1].c, m[0].url, j[1].theta, 30000),
               PULSE_OK, "%s", pulse_error_detail());
  /* Everyone ends at the same round, a few after the last join. */
  until = pulse_loco_round(cj[5]) + 6;
  pthread_create(&th[3], NULL, ad_run, &j[1]);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);

  ad_runner *all[4] = {&f[0], &f[1], &j[0], &j[1]};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(all[i]->st, PULSE_OK, "peer %d: %s", i, all[i]->detail);
    cr_assert_eq(pulse_loco_round(all[i]->ctx), until, "peer %d", i);
    cr_assert_eq(pulse_loco_global_digest(all[i]->ctx),
                 pulse_loco_global_digest(f[0].ctx), "peer %d", i);
    /* Nothing of anyone refused but the bad joins. */
    const char *kinds[] = {"payload", "manifest", "state", "members",
                           "claim",   "grant",    "done",  "outcome"};
    for (int w = 0; w < 8; w++)
      cr_assert_eq(ca_refused_kind(all[i]->c, kinds[w]), 0, "peer %d: %s", i,
                   kinds[w]);
  }
  /* The joiners contributed: their payloads were averaged. */
  cr_assert_geq(j[0].included, 1);
  cr_assert_geq(j[1].included, 1);
  cr_assert_geq(f[0].max_contributors, 3);
  /* Both founders took both joins on their admissions; 10 learned 6's key
   * (and 6 took 10's join on its admission). */
  for (int i = 0; i < 2; i++)
    cr_assert_geq(ca_metric(f[i].c, "pulse_loco_auth_admitted_total"), 2,
                  "founder %d", i);
  cr_assert_geq(ca_metric(j[1].c, "pulse_loco_auth_admitted_total"), 1);
  cr_assert_geq(ca_metric(j[0].c, "pulse_loco_auth_admitted_total"), 1);

  for (int i = 0; i < 4; i++) {
    pulse_loco_collab_free(all[i]->c);
    free(all[i]->theta);
  }
  pulse_loco_collab_free(j5);
  pulse_loco_collab_free(j7);
  pulse_loco_collab_free(j8);
  pulse_loco_collab_free(j9);
  for (int i = 0; i < 2; i++)
    pulse_loco_free(f[i].ctx);
  for (int i = 0; i < 6; i++) {
    pulse_loco_free(cj[i]);
    pulse_sign_key_free(kj[i]);
  }
  pulse_loco_auth_free(stranger);
  pulse_sign_key_free(kx);
  at_keys_free(2, k);
  free(local);
  free(init);
}

Test(loco_collab_auth_admit, admit_needs_a_key_and_an_admission_its_own_key) {
  pulse_loco *ctx = ca_ctx(1, NULL);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  pulse_loco_admission adm;
  memset(&adm, 0, sizeof adm);
  /* An admission without a key of this peer. */
  co.admission = &adm;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  /* Without a key: nothing to admit with. */
  co.admission = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  uint8_t key[PULSE_KEY_BYTES] = {1};
  cr_assert_eq(pulse_loco_collab_admit(c, key, 5, &adm), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_collab_admit(NULL, key, 5, &adm), PULSE_ERR_ARG);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
}
