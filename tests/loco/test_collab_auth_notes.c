/* test_collab_auth_notes.c - the collaboration's joins, outcomes and
 * progress records, signed (issue 35 item 7, docs/protocols/
 * loco-exchange.md "Authentication"): a peer refuses join POSTs that are
 * unsigned, forged, another member's or a stranger's, or the same POST
 * again; a contributor that settles refuses partitioned outcomes that are
 * unsigned, forged, a stranger's, of another round or older than one it
 * took; progress records carry their writer's signature; a partitioned
 * blob signed for one attempt or place is refused in another. Each refusal
 * is counted by reason and kind at /metrics. */
#include "collab_auth_testutil.h"

Test(loco_collab_auth, joins_not_signed_by_their_joiner_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco *ctx = ca_ctx(0, NULL);
  pulse_loco_collab *c = ca_peer(ctx, k[0], pins, 2);
  pulse_loco_member m = {0, ""};
  snprintf(m.url, sizeof m.url, "%s", pulse_loco_collab_url(c));
  cr_assert_eq(pulse_loco_collab_start(c, &m, 1), PULSE_OK);
  const char *base = pulse_loco_collab_url(c);
  const char *join = "/v1/loco/join?id=1&url=http://127.0.0.1:9";
  const pulse_loco_auth_kind J = PULSE_LOCO_AUTH_JOIN;
  char url[800];
  struct {
    const pulse_sign_key *k;
    int flip;
    const char *why;
  } bad[] = {{NULL, 0, "unsigned"},
             {k[1], 1, "forged"},
             {k[0], 0, "forged"}, /* peer 0's key for trainer 1 */
             {kx, 0, "foreign"}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    uint64_t was = ca_refused(c, bad[i].why);
    at_post_url(url, sizeof url, base, join, bad[i].k, J, 0, join,
                loco_auth_seq_next(), bad[i].flip);
    cr_assert_eq(at_post(url), COLLAB_UNVERIFIED, "join %zu", i);
    cr_assert_eq(ca_refused(c, bad[i].why), was + 1, "join %zu", i);
  }
  /* The honest join goes on the pending list; the same POST again is a
   * replay. */
  at_post_url(url, sizeof url, base, join, k[1], J, 0, join,
              loco_auth_seq_next(), 0);
  cr_assert_eq(at_post(url), 202);
  cr_assert_eq(at_post(url), COLLAB_UNVERIFIED);
  cr_assert_eq(ca_refused(c, "replayed"), 1);
  cr_assert_eq(ca_refused_kind(c, "join"), 5);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  at_keys_free(2, k);
  pulse_sign_key_free(kx);
}

/* The outcome word contributor 0 serves at srv, as peer c reads it. */
static int outcome_read(pulse_loco_collab *c, loco_server *srv, uint64_t r,
                        const char *body, const loco_sig *sig) {
  char path[64], url[128];
  snprintf(path, sizeof path, "/v1/loco/round/%llu/outcome",
           (unsigned long long)r);
  cr_assert_eq(loco_server_put_signed(srv, path, body, strlen(body), sig),
               PULSE_OK);
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", loco_server_port(srv),
           path);
  loco_fetch t = {0};
  t.url = url;
  t.max_bytes = 64;
  t.body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_gather(&t, 1, loco_now_ms() + 3000), PULSE_OK);
  cr_assert(t.done);
  int word = collab_auth_outcome(c, r, 0, &t);
  pulse_bytebuf_free(&t.body);
  return word;
}

Test(loco_collab_auth, outcomes_not_signed_by_their_contributor_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2], *kx;
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  cr_assert_eq(pulse_sign_key_generate(&kx), PULSE_OK);
  pulse_loco *ctx = ca_ctx(1, NULL);
  pulse_loco_collab *c = ca_peer(ctx, k[1], pins, 2);
  loco_server *srv;
  cr_assert_eq(loco_server_start(at_no_post, NULL, &srv), PULSE_OK);
  const pulse_loco_auth_kind O = PULSE_LOCO_AUTH_OUTCOME;
  const char *fin = "finished 100", *old = "failed 50";
  loco_sig good = at_sign(k[0], O, 2, fin, strlen(fin));
  loco_sig bad = good;
  bad.present = 0;
  cr_assert_eq(outcome_read(c, srv, 2, fin, &bad), 0);
  bad = good;
  bad.sig[2] ^= 8;
  cr_assert_eq(outcome_read(c, srv, 2, fin, &bad), 0);
  bad = at_sign(kx, O, 2, fin, strlen(fin));
  cr_assert_eq(outcome_read(c, srv, 2, fin, &bad), 0);
  bad = at_sign(k[0], O, 3, fin, strlen(fin)); /* a later round's */
  cr_assert_eq(outcome_read(c, srv, 2, fin, &bad), 0);
  /* The honest word, read twice (a settling peer reads it again and
   * again), then an older word of the same round: a replay. */
  cr_assert_eq(outcome_read(c, srv, 2, fin, &good), 2, "%s",
               pulse_error_detail());
  cr_assert_eq(outcome_read(c, srv, 2, fin, &good), 2);
  bad = at_sign(k[0], O, 2, old, strlen(old));
  cr_assert_eq(outcome_read(c, srv, 2, old, &bad), 0);
  cr_assert_eq(ca_refused(c, "unsigned"), 1);
  cr_assert_eq(ca_refused(c, "forged"), 2);
  cr_assert_eq(ca_refused(c, "foreign"), 1);
  cr_assert_eq(ca_refused(c, "replayed"), 1);
  cr_assert_eq(ca_refused_kind(c, "outcome"), 5);

  /* Its own outcome and progress record, as it serves them: signed. */
  cr_assert_eq(collab_auth_put_outcome(c, 4, 0), PULSE_OK);
  collab_publish_own_progress(c, 4, 16, 100);
  const char *paths[] = {"/v1/loco/round/4/outcome", "/v1/loco/progress"};
  const pulse_loco_auth_kind kinds[] = {O, PULSE_LOCO_AUTH_PROGRESS};
  for (int i = 0; i < 2; i++) {
    char url[160];
    snprintf(url, sizeof url, "%s%s", pulse_loco_collab_url(c), paths[i]);
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long status = 0;
    loco_sig s;
    cr_assert_eq(loco_http_get_signed(url, 3000, 4096, &b, &status, &s),
                 PULSE_OK);
    cr_assert_eq(status, 200, "%s", paths[i]);
    cr_assert(s.present, "%s unsigned", paths[i]);
    pulse_loco_auth_opts o;
    pulse_loco_auth_opts_init(&o);
    o.key = kx;
    o.members = pins[1].key;
    o.member_count = 1;
    pulse_loco_auth *check;
    cr_assert_eq(pulse_loco_auth_create(&o, &check), PULSE_OK);
    cr_assert_eq(
        pulse_loco_auth_check(check, kinds[i], 4, s.key, b.data, b.size, s.sig),
        PULSE_OK, "%s: %s", paths[i], pulse_error_detail());
    pulse_loco_auth_free(check);
    pulse_bytebuf_free(&b);
  }
  loco_server_stop(srv);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  at_keys_free(2, k);
  pulse_sign_key_free(kx);
}

/* A partitioned blob's signature covers its path: the same signed bytes
 * served for another attempt of the round, or as another of its signer's
 * blobs, are refused (forged); in their place they pass. */
Test(loco_collab_auth, blobs_served_for_another_attempt_are_refused,
     .timeout = 60) {
  pulse_sign_key *k[2];
  pulse_loco_member_key pins[2];
  at_keys(2, k, pins);
  pulse_loco *ctx[2];
  pulse_loco_collab *c[2];
  for (uint32_t i = 0; i < 2; i++) {
    ctx[i] = ca_ctx(i, NULL);
    c[i] = ca_peer(ctx[i], k[i], pins, 2);
  }
  const pulse_loco_auth_kind R = PULSE_LOCO_AUTH_REDUCED;
  const char *path = "/v1/loco/part/3/0/reduced";
  const uint8_t blob[] = "a reduced range";
  loco_sig sig;
  cr_assert(collab_auth_sign_blob(c[0], R, 3, path, blob, sizeof blob, &sig));
  const char *elsewhere[] = {"/v1/loco/part/3/1/reduced",
                             "/v1/loco/part/3/0/verdict"};
  for (int i = 0; i < 2; i++)
    cr_assert_not(collab_auth_accept_blob(c[1], R, 3, 0, elsewhere[i], &sig,
                                          blob, sizeof blob),
                  "%s", elsewhere[i]);
  cr_assert_eq(ca_refused(c[1], "forged"), 2);
  cr_assert(
      collab_auth_accept_blob(c[1], R, 3, 0, path, &sig, blob, sizeof blob),
      "%s", pulse_error_detail());
  for (int i = 0; i < 2; i++) {
    pulse_loco_collab_free(c[i]);
    pulse_loco_free(ctx[i]);
  }
  at_keys_free(2, k);
}
