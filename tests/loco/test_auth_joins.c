/* test_auth_joins.c - joins in the authenticated exchange (issue 35 item
 * 7, docs/protocols/loco-exchange.md "Authentication"): a coordinator
 * refuses join POSTs that are unsigned, forged, signed with another
 * member's key or a stranger's, or replayed (the same POST again), and
 * takes the honest one; a joiner refuses admissions (/v1/loco/join/ID)
 * that are unsigned, forged, a stranger's or another join's, and takes
 * its own. Each refusal is counted by reason and kind at /metrics. */
#include "auth_testutil.h"

static uint64_t n_refused(const pulse_loco_coord *n, const char *why) {
  return at_refused(pulse_loco_coord_url(n), why);
}

static uint64_t n_refused_kind(const pulse_loco_coord *n, const char *kind) {
  return at_refused_kind(pulse_loco_coord_url(n), kind);
}

/* A node of trainer `id` with key k, `pins` pinned, not started. */
static pulse_loco_coord *node_of(uint32_t id, const pulse_sign_key *k,
                                 const pulse_loco_member_key *pins,
                                 size_t npins, pulse_loco **ctx) {
  *ctx = lt_ctx(100, id, NULL);
  pulse_loco_coord_opts no = aopts(PULSE_LOCO_TRANSPORT_HTTP);
  no.sign_key = k;
  no.member_keys = pins;
  no.member_key_count = npins;
  pulse_loco_coord *n;
  cr_assert_eq(pulse_loco_coord_create(&no, *ctx, &n), PULSE_OK, "%s",
               pulse_error_detail());
  return n;
}

Test(loco_auth_joins, join_posts_not_signed_by_their_joiner_are_refused,
     .timeout = 60) {
  /* Trainers 0 (the coordinator) and 1; trainer 1 joins. */
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco *c0;
  pulse_loco_coord *n0 = node_of(0, k[0], pins, 2, &c0);
  const char *base = pulse_loco_coord_url(n0);
  const char *join = "/v1/loco/join?id=1&url=http://127.0.0.1:9";
  const pulse_loco_auth_kind J = PULSE_LOCO_AUTH_JOIN;
  char url[800];
  struct {
    const pulse_sign_key *k;
    int flip;
    const char *why;
  } bad[] = {{NULL, 0, "unsigned"},
             {k[1], 1, "forged"},
             {k[0], 0, "forged"}, /* trainer 0's key for trainer 1 */
             {kx, 0, "foreign"}};
  uint64_t joins_refused = 0;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t was = n_refused(n0, bad[i].why);
    at_post_url(url, sizeof url, base, join, bad[i].k, J, 0, join,
                loco_auth_seq_next(), bad[i].flip);
    cr_assert_eq(at_post(url), 403, "join %zu", i);
    cr_assert_eq(n_refused(n0, bad[i].why), was + 1, "join %zu", i);
    joins_refused++;
  }
  /* The honest join, then the very same POST again: a replay. */
  uint64_t seq = loco_auth_seq_next();
  at_post_url(url, sizeof url, base, join, k[1], J, 0, join, seq, 0);
  cr_assert_eq(at_post(url), 202);
  cr_assert_eq(at_post(url), 403);
  joins_refused++;
  cr_assert_eq(n_refused(n0, "replayed"), 1);
  cr_assert_eq(n_refused_kind(n0, "join"), 5);
  cr_assert_eq(metric(n0, "pulse_loco_auth_joins_refused_total"),
               joins_refused);

  /* The admission the coordinator serves names the honest join: trainer
   * 1 takes it, and refuses it for any other join of its own. */
  cr_assert_eq(loco_auth_put_admission(n0, 1, 7), PULSE_OK);
  pulse_loco *c1;
  pulse_loco_coord *n1 = node_of(1, k[1], pins, 2, &c1);
  char adm[160];
  snprintf(adm, sizeof adm, "%s/v1/loco/join/1", base);
  uint64_t round = 0;
  cr_assert_eq(loco_auth_get_admission(n1, adm, 3000, 0, seq, &round), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(round, 7);
  cr_assert_neq(loco_auth_get_admission(n1, adm, 3000, 0, seq + 1, &round),
                PULSE_OK);
  cr_assert_eq(n_refused(n1, "replayed"), 1);
  cr_assert_eq(n_refused_kind(n1, "joined"), 1);
  pulse_loco_coord_free(n1);
  pulse_loco_free(c1);
  pulse_loco_coord_free(n0);
  pulse_loco_free(c0);
  at_keys_free(2, k);
  pulse_sign_key_free(kx);
}

Test(loco_auth_joins, a_joiner_refuses_admissions_not_its_coordinators,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco *c1;
  pulse_loco_coord *n1 = node_of(1, k[1], pins, 2, &c1);
  loco_server *srv;
  cr_assert_eq(loco_server_start(at_no_post, NULL, &srv), PULSE_OK);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/loco/join/1",
           loco_server_port(srv));
  const uint64_t seq = 12345;
  char body[96];
  int len = snprintf(body, sizeof body, "{\"round\":4,\"id\":1,\"seq\":%llu}",
                     (unsigned long long)seq);
  const pulse_loco_auth_kind A = PULSE_LOCO_AUTH_JOINED;
  loco_sig good = at_sign(k[0], A, 4, body, (size_t)len);
  /* Unsigned, forged, a stranger's, trainer 1's own key (not its
   * coordinator's), another kind's signature. */
  const char *why[] = {"unsigned", "forged", "foreign", "forged", "forged"};
  for (int i = 0; i < 5; i++) {
    loco_sig bad = good;
    if (i == 0)
      bad.present = 0;
    else if (i == 1)
      bad.sig[40] ^= 2;
    else if (i == 2)
      bad = at_sign(kx, A, 4, body, (size_t)len);
    else if (i == 3)
      bad = at_sign(k[1], A, 4, body, (size_t)len);
    else
      bad = at_sign(k[0], PULSE_LOCO_AUTH_MEMBERS, 4, body, (size_t)len);
    cr_assert_eq(
        loco_server_put_signed(srv, "/v1/loco/join/1", body, (size_t)len, &bad),
        PULSE_OK);
    uint64_t was = n_refused(n1, why[i]), round = 0;
    cr_assert_neq(loco_auth_get_admission(n1, url, 3000, 0, seq, &round),
                  PULSE_OK, "admission %d taken", i);
    cr_assert_eq(n_refused(n1, why[i]), was + 1, "admission %d", i);
  }
  cr_assert_eq(n_refused_kind(n1, "joined"), 5);
  cr_assert_eq(
      loco_server_put_signed(srv, "/v1/loco/join/1", body, (size_t)len, &good),
      PULSE_OK);
  uint64_t round = 0;
  cr_assert_eq(loco_auth_get_admission(n1, url, 3000, 0, seq, &round), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(round, 4);
  loco_server_stop(srv);
  pulse_loco_coord_free(n1);
  pulse_loco_free(c1);
  at_keys_free(2, k);
  pulse_sign_key_free(kx);
}
