/* test_collab_auth_exchange.c - the collaboration's authentication
 * beyond views, states, manifests and payloads (test_collab_auth.c):
 * partitioned slices, reduced ranges and verdicts of one peer that are
 * unsigned, forged or a stranger's are refused by the others, which end
 * with the same bits; claims not signed by their member are refused by the
 * writer (401, counted), and a writer's answers that the member cannot
 * verify are refused by it. */
#include "collab_auth_testutil.h"

/* Partitioned, peer 1 serves its blobs of `kind` (slices, its reduced
 * range, its verdict) unsigned, forged or signed by a stranger (the
 * faults in `modes`, bit 1 << mode): the others
 * refuse them (as blobs that never came: the exchange fails and the round
 * ends as for a peer that died in it), count them, and every peer ends
 * with the same bits. */
static void bad_blobs(pulse_loco_auth_kind kind, const char *word,
                      unsigned modes) {
  for (unsigned mode = LOCO_AUTH_TAMPER_UNSIGNED;
       mode <= LOCO_AUTH_TAMPER_FOREIGN; mode++) {
    /* (REPLAYED, a blob's replay: its body is not the signer's to choose) */
    if (!(modes & (1u << mode)))
      continue;
    ca_partitioned = 1;
    /* A refused blob fails the exchange: its deadline is waited out. */
    ca_claim_ms = 1000;
    ca_round_ms = 2000;
    ca_group g;
    ca_group_start(&g, 3, 3, 3);
    ca_partitioned = 0;
    ca_claim_ms = ca_round_ms = 0;
    cr_assert_eq(
        collab_auth_tamper(g.r[1].c, mode, LOCO_AUTH_TAMPER_KIND(kind)),
        PULSE_OK);
    ca_group_run(&g);
    uint64_t refused = 0, reasons = 0;
    for (int i = 0; i < 3; i++) {
      ca_runner *r = &g.r[i];
      cr_assert_eq(r->st, PULSE_OK, "%s %s: peer %d: %s", word, reason[mode], i,
                   r->detail);
      cr_assert_eq(pulse_loco_round(r->ctx), 3);
      cr_assert_eq(pulse_loco_global_digest(r->ctx),
                   pulse_loco_global_digest(g.r[0].ctx), "%s %s: peer %d", word,
                   reason[mode], i);
      refused += ca_refused_kind(r->c, word);
      reasons += ca_refused(r->c, reason[mode]);
    }
    cr_assert_geq(refused, 1, "%s %s", word, reason[mode]);
    cr_assert_geq(reasons, 1, "%s %s", word, reason[mode]);
    ca_group_free(&g);
  }
}

Test(loco_collab_auth, bad_slices_are_refused, .timeout = 120) {
  /* Each refusal waits the exchange's deadline out: two faults. */
  bad_blobs(PULSE_LOCO_AUTH_SLICE, "slice",
            1u << LOCO_AUTH_TAMPER_FORGED | 1u << LOCO_AUTH_TAMPER_FOREIGN);
}
Test(loco_collab_auth, bad_reduced_ranges_are_refused, .timeout = 120) {
  bad_blobs(PULSE_LOCO_AUTH_REDUCED, "reduced",
            1u << LOCO_AUTH_TAMPER_UNSIGNED | 1u << LOCO_AUTH_TAMPER_FORGED);
}
Test(loco_collab_auth, bad_verdicts_are_refused, .timeout = 120) {
  bad_blobs(PULSE_LOCO_AUTH_VERDICT, "verdict",
            1u << LOCO_AUTH_TAMPER_UNSIGNED | 1u << LOCO_AUTH_TAMPER_FORGED |
                1u << LOCO_AUTH_TAMPER_FOREIGN);
}

/* ------------------------------------------------------ claims and grants */

/* POSTs PATH?id=1 to base, signed by k for `round` (k NULL: unsigned;
 * flip: one signature bit changed), with a number never used before.
 * @return the HTTP status. */
static long ca_post(const char *base, const pulse_sign_key *k, uint64_t round,
                    const char *path_id, int flip) {
  char url[600];
  at_post_url(url, sizeof url, base, path_id, k, PULSE_LOCO_AUTH_CLAIM, round,
              path_id, loco_auth_seq_next(), flip);
  return at_post(url);
}

Test(loco_collab_auth, claims_not_signed_by_their_member_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
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
  uint64_t seq = loco_auth_seq_next();
  at_post_url(url, sizeof url, base, claim3, k[1], PULSE_LOCO_AUTH_CLAIM, 3,
              claim3, seq, 0);
  cr_assert_eq(loco_http_post_signed(url, 5000, &status, &ans), PULSE_OK);
  cr_assert_neq(status, 401);
  cr_assert(ans.present, "the answer is not signed");
  /* The answer names the request's number. */
  char text[160];
  int len = snprintf(text, sizeof text, "%s&seq=%llu\nstatus %ld", claim3,
                     (unsigned long long)seq, status);
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
  /* The same claim again, in its round: a replay (the writer would grant
   * its samples twice). */
  cr_assert_eq(at_post(url), 401);
  cr_assert_eq(ca_refused(c[0], "replayed"), 1);
  /* An older round's claim after round 3's: a replay. */
  cr_assert_eq(ca_post(base, k[1], 0, claim0, 0), 401);
  cr_assert_eq(ca_refused(c[0], "unsigned"), 1);
  cr_assert_eq(ca_refused(c[0], "forged"), 2);
  cr_assert_eq(ca_refused(c[0], "foreign"), 1);
  cr_assert_eq(ca_refused(c[0], "replayed"), 2);
  cr_assert_eq(ca_refused_kind(c[0], "claim"), 6);
  /* An acknowledgement unsigned. */
  cr_assert_eq(ca_post(base, NULL, 0, "/v1/loco/round/0/done?id=1", 0), 401);
  cr_assert_eq(ca_refused_kind(c[0], "done"), 1);
  for (int i = 0; i < 2; i++) {
    pulse_loco_collab_free(c[i]);
    pulse_loco_free(ctx[i]);
  }
  at_keys_free(2, k);
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
  int len =
      snprintf(text, sizeof text, "%s?id=%s\nstatus %u", path, id, status);
  uint64_t r = strtoull(path + strlen("/v1/collab/claim/"), NULL, 10);
  memset(sig, 0, sizeof *sig);
  if (ca_grant_mode == 1)
    return;
  *sig = at_sign(ca_grant_mode == 4 ? ca_grant_stranger : ca_grant_key,
                 PULSE_LOCO_AUTH_GRANT, ca_grant_mode == 3 ? r + 1 : r, text,
                 (size_t)len);
  if (ca_grant_mode == 2)
    sig->sig[30] ^= 2;
}

Test(loco_collab_auth, grants_not_signed_by_the_writer_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  ca_grant_key = k[0];
  ca_grant_stranger = kx;
  loco_server *srv;
  cr_assert_eq(loco_server_start(grant_all, NULL, &srv), PULSE_OK);
  loco_server_set_reply_signer(srv, sign_grant, NULL);
  pulse_loco *ctx = ca_ctx(1, NULL);
  pulse_loco_collab *c = ca_peer(ctx, k[1], pins, 2);
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
    cr_assert_eq(collab_tell_writer(c, 0, 0, 0, 16, 0, 0, 0), COLLAB_UNVERIFIED,
                 "grant %d taken", mode);
    cr_assert_eq(ca_refused(c, why[mode]), was + 1, "grant %d", mode);
  }
  cr_assert_eq(ca_refused_kind(c, "grant"), 4);
  ca_grant_mode = 0;
  cr_assert_eq(collab_tell_writer(c, 0, 0, 0, 16, 0, 0, 0), COLLAB_GRANTED);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  loco_server_stop(srv);
  at_keys_free(2, k);
  pulse_sign_key_free(kx);
}
