/* test_collab_bad.c - bad input to a PULSELoCo collaboration
 * (pulse_loco_collab.h): a member whose payload carries fewer samples than
 * it claimed (a lying progress record; all-to-all and partitioned), claims
 * and readiness from a peer that is not a member of the round, and a
 * joiner asking for a state no peer keeps. The honest peers are child processes (collab_testutil.h);
 * the offender is this process, speaking the protocol by hand. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "collab_testutil.h"
#include "peer_http_impl.h"
#include "manifest_impl.h"

static unsigned accept_post(void *user, const char *path, const char *id,
                            const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{}");
  return 200;
}

/* POSTs until the writer is at the round: 503 means not yet, and so does
 * 421 (not that round's writer) while the peer has not read the start
 * line the test sent it down its pipe (a loaded machine let the claim
 * arrive first, answered 421 within a millisecond of the start). */
static long post_until_open(const char *url) {
  long status = 0;
  for (int i = 0; i < 500; i++) {
    cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
    if (status != 503 && status != 421)
      break;
    usleep(2000);
  }
  return status;
}

/* Peers 1 and 2 honest; peer 3 (this process) claims a step of 4 samples,
 * is granted, then serves a payload that says 2 and tells the writer it
 * is ready with 4. A partitioned writer reads only each payload's header
 * (a Range request; size and SHA-256 from the answer) and drops it all
 * the same: the header is the served payload's own. */
static void short_payload_drops_its_sender(int partitioned) {
  const uint64_t T = 40;
  ct_peer_cfg cfg[2];
  ct_child ks[2];
  /* Steps of 200 ms, as below: this process's claim must reach round 0's
   * writer while the round is open, also on a loaded machine (with 30 ms
   * steps the honest peers filled it first in some loaded ASan runs, and
   * the claim got 409, past). */
  for (uint32_t i = 0; i < 2; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, T, 3, -1, 200000};
  ct_partitioned = partitioned;
  for (int i = 0; i < 2; i++)
    ct_spawn(&ks[i], &cfg[i]);
  ct_partitioned = 0;
  for (int i = 0; i < 2; i++)
    ct_hello(&ks[i]);
  loco_server *srv = NULL;
  cr_assert_eq(loco_server_start(accept_post, NULL, &srv), PULSE_OK);
  char me[64];
  snprintf(me, sizeof me, "http://127.0.0.1:%u",
           (unsigned)loco_server_port(srv));
  char line[1024];
  snprintf(line, sizeof line, "start 3 1 %s 2 %s 3 %s\n", ks[0].url,
           ks[1].url, me);
  for (int i = 0; i < 2; i++)
    dprintf(ks[i].to, "%s", line);
  /* The writer of round 0 is the first member by id: peer 1. */
  char url[256];
  snprintf(url, sizeof url, "%s/v1/collab/claim/0/0/4/0/1000?id=3", ks[0].url);
  cr_assert_eq(post_until_open(url), 200, "the claim is granted");
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CT_P;
  o.trainer_id = 3;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.chunk_log2 = 10;
  float *theta = calloc(CT_P, sizeof *theta);
  for (uint64_t i = 0; i < CT_P; i++)
    theta[i] = (float)((double)((i * 37u) % 101u) / 50.0 - 1.0);
  pulse_loco *ctx = NULL;
  cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK);
  ct_step_state st = {3, 0};
  ct_step(&st, theta, 4);
  const uint8_t *payload;
  size_t size;
  cr_assert_eq(pulse_loco_prepare(ctx, theta, 2, 0, &payload, &size, NULL),
               PULSE_OK);
  cr_assert_eq(loco_server_put(srv, "/v1/loco/round/0", payload, size),
               PULSE_OK);
  long status;
  snprintf(url, sizeof url, "%s/v1/collab/ready/0/0/4/0?id=3", ks[0].url);
  cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
  cr_assert_eq(status, 200);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 2, &log, NULL, NULL);
  /* Round 0 went on without it: the two honest payloads, their samples
   * only, the same bits on both; and it is no member afterwards (the
   * next rounds did not wait for it). */
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(log.row[i][0].contrib, 2);
    cr_assert_eq(log.row[i][0].samples,
                 log.row[0][0].own + log.row[1][0].own);
    cr_assert_eq(log.row[i][0].digest, log.row[0][0].digest);
    cr_assert_eq(log.row[i][2].contrib, 2);
    for (int r = 0; r < 3; r++)
      cr_assert_eq(log.partitioned[i][r], partitioned, "peer %d round %d", i,
                   r);
  }
  cr_assert_eq(log.final_digest[0], log.final_digest[1]);
  /* All-to-all, the writer downloaded the payload; partitioned, at most a
   * header's bytes of it. */
  if (partitioned)
    cr_assert_lt(loco_server_bytes_served(srv), size,
                 "the writer downloaded the liar's whole payload");
  else
    cr_assert_geq(loco_server_bytes_served(srv), size);
  ct_quit(ks, 2);
  pulse_loco_free(ctx);
  free(theta);
  loco_server_stop(srv);
}

Test(collab_bad, a_payload_short_of_its_claims_drops_its_sender,
     .timeout = 60) {
  short_payload_drops_its_sender(0);
}

Test(collab_bad, partitioned_a_payload_short_of_its_claims_drops_its_sender,
     .timeout = 60) {
  short_payload_drops_its_sender(1);
}

Test(collab_bad, a_peer_outside_the_round_cannot_claim_or_contribute,
     .timeout = 60) {
  const uint64_t T = 40;
  ct_peer_cfg cfg[2];
  ct_child ks[2];
  /* Steps of 200 ms: round 0 lasts at least 1 s, so the claims below reach
   * its writer while it is open on a loaded machine too (after it, the
   * writer answers 409, past, before it looks at who asks; with 30 ms steps
   * a busy machine let round 0 end first about one run in five). */
  for (uint32_t i = 0; i < 2; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, T, 3, -1, 200000};
  for (int i = 0; i < 2; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (int i = 0; i < 2; i++)
    ct_hello(&ks[i]);
  ct_start(ks, 2);
  /* Peer 9 never joined: its claim and its readiness (a payload for a
   * round it is not a member of) are refused; the round's total is only
   * the members' samples. */
  char url[256];
  snprintf(url, sizeof url, "%s/v1/collab/claim/0/0/4/0/1000?id=9", ks[0].url);
  long claimed = post_until_open(url);
  cr_assert_eq(claimed, 403, "a non-member's claim answered %ld", claimed);
  snprintf(url, sizeof url, "%s/v1/collab/ready/0/0/4/0?id=9", ks[0].url);
  long status;
  cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
  cr_assert_eq(status, 403);
  /* Malformed claims are refused too. */
  snprintf(url, sizeof url, "%s/v1/collab/claim/0/0/4?id=1", ks[0].url);
  cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
  cr_assert_eq(status, 404);
  snprintf(url, sizeof url, "%s/v1/collab/claim/0/0/4/0/1?id=01", ks[0].url);
  cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
  cr_assert_eq(status, 400);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 2, &log, NULL, NULL);
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(log.row[i][0].contrib, 2);
    cr_assert_geq(log.row[i][0].samples, T);
    cr_assert_lt(log.row[i][0].samples, T + 4);
    cr_assert_eq(log.row[i][0].samples,
                 log.row[0][0].own + log.row[1][0].own);
  }
  cr_assert_eq(log.final_digest[0], log.final_digest[1]);
  ct_quit(ks, 2);
}

Test(collab_bad, a_state_no_peer_keeps_is_a_clear_error, .timeout = 60) {
  ct_peer_cfg cfg[2];
  ct_child ks[2];
  for (uint32_t i = 0; i < 2; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, 16, 4, -1, 0};
  for (int i = 0; i < 2; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (int i = 0; i < 2; i++)
    ct_hello(&ks[i]);
  ct_start(ks, 2);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 2, &log, NULL, NULL); /* both at round 4, serving states 3 and 4 */
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CT_P;
  o.trainer_id = 7;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.chunk_log2 = 10;
  pulse_loco *ctx = NULL;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK);
  float *theta = calloc(CT_P, sizeof *theta);
  uint64_t before = pulse_loco_global_digest(ctx);
  cr_assert_eq(pulse_loco_collab_import(c, ks[1].url, 1, theta, 2000),
               PULSE_ERR_NOT_FOUND);
  const char *why = pulse_error_detail();
  cr_assert(strstr(why, "round 1") && strstr(why, "rounds 3..4"), "%s", why);
  cr_assert_eq(pulse_loco_round(ctx), 0);
  cr_assert_eq(pulse_loco_global_digest(ctx), before);
  /* The state it does keep imports, bit for bit. */
  cr_assert_eq(pulse_loco_collab_import(c, ks[1].url, 4, theta, 2000),
               PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(pulse_loco_round(ctx), 4);
  cr_assert_eq(pulse_loco_global_digest(ctx), log.final_digest[1]);
  /* A context of another shape refuses it and is unchanged. */
  o.param_count = CT_P + 1;
  pulse_loco *other = NULL;
  cr_assert_eq(pulse_loco_create(&o, NULL, &other), PULSE_OK);
  pulse_loco_collab *c2 = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, other, &c2), PULSE_OK);
  float *theta2 = calloc(CT_P + 1, sizeof *theta2);
  cr_assert_neq(pulse_loco_collab_import(c2, ks[1].url, 4, theta2, 2000),
                PULSE_OK);
  cr_assert_eq(pulse_loco_round(other), 0);
  pulse_loco_collab_free(c2);
  pulse_loco_free(other);
  free(theta2);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  free(theta);
  ct_quit(ks, 2);
}

Test(collab_bad, options_and_rules_are_checked) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = 64;
  pulse_loco *ctx = NULL;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  /* The drop rule would let a left-out payload's mass go. */
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  cr_assert_null(c);
  pulse_loco_free(ctx);
  o.rule = PULSE_LOCO_RULE_KEEP;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx), PULSE_OK);
  co.target_batch = 0;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  co.target_batch = 8;
  co.host = "localhost";
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  co.host = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK);
  pulse_loco_member m[2] = {{1, "http://127.0.0.1:1"}, {1, "http://127.0.0.1:2"}};
  cr_assert_eq(pulse_loco_collab_start(c, m, 2), PULSE_ERR_ARG, "duplicate");
  m[1].id = 2;
  cr_assert_eq(pulse_loco_collab_start(c, m, 2), PULSE_ERR_ARG, "not a member");
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  /* The rule: rank k of round r is members[(r + k) mod n]. */
  pulse_loco_member s[3] = {{2, ""}, {5, ""}, {9, ""}};
  cr_assert_eq(pulse_loco_collab_writer(s, 3, 0, 0), 2);
  cr_assert_eq(pulse_loco_collab_writer(s, 3, 4, 0), 5);
  cr_assert_eq(pulse_loco_collab_writer(s, 3, 4, 1), 9);
  cr_assert_eq(pulse_loco_collab_writer(s, 3, 4, 2), 2);
  cr_assert_eq(pulse_loco_collab_writer(s, 0, 4, 2), UINT32_MAX);
}

/* A TCP port of 127.0.0.1 free a moment ago (bound with port 0, closed). */
static uint16_t free_tcp_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  close(fd);
  return ntohs(a.sin_port);
}

Test(collab_bad, a_listen_port_is_honoured_and_a_taken_one_refused) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = 64;
  o.rule = PULSE_LOCO_RULE_KEEP;
  pulse_loco *ctx = NULL, *ctx2 = NULL;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx), PULSE_OK);
  o.trainer_id = 1;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx2), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  cr_assert_eq(co.port, 0, "the kernel's choice by default");
  co.port = free_tcp_port();
  pulse_loco_collab *c = NULL, *c2 = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  char want[64];
  snprintf(want, sizeof want, "http://127.0.0.1:%u", (unsigned)co.port);
  cr_assert_str_eq(pulse_loco_collab_url(c), want);
  /* It answers there. */
  char url[96];
  snprintf(url, sizeof url, "%s/healthz", want);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  cr_assert_eq(loco_http_get(url, 10000, 4096, &b, &status), PULSE_OK);
  cr_assert_eq(status, 200);
  pulse_bytebuf_free(&b);
  /* A second peer on the same port: a clear error naming it. */
  cr_assert_eq(pulse_loco_collab_create(&co, ctx2, &c2), PULSE_ERR_IO);
  cr_assert_null(c2);
  snprintf(want, sizeof want, ":%u", (unsigned)co.port);
  cr_assert(strstr(pulse_error_detail(), want) != NULL, "%s",
            pulse_error_detail());
  /* A client-mode peer listens nowhere: a port is refused. */
  co.client_of = pulse_loco_collab_url(c);
  cr_assert_eq(pulse_loco_collab_create(&co, ctx2, &c2), PULSE_ERR_ARG);
  cr_assert_null(c2);
  co.client_of = NULL;
  co.port = 0;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx2, &c2), PULSE_OK);
  cr_assert_neq(strcmp(pulse_loco_collab_url(c2), pulse_loco_collab_url(c)), 0);
  pulse_loco_collab_free(c2);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx2);
  pulse_loco_free(ctx);
}

/* Every number in a collaboration's paths, URLs and ids follows one rule
 * (loco_take_decimal): digits only, no sign, no leading zero, a bounded
 * count of them, ended where the path says. */
Test(collab_bad, numbers_in_paths_and_ids_follow_one_rule) {
  static const struct {
    const char *text;
    unsigned digits;
    char stop;
    int ok;
    uint64_t value;
    size_t moved;
  } cases[] = {
      {"0", 10, '\0', 1, 0, 1},
      {"7/rest", 10, '/', 1, 7, 2},
      {"18446744073709551615", 20, '\0', 1, UINT64_MAX, 20},
      {"9999999999999999999", 19, '\0', 1, 9999999999999999999ull, 19},
      {"12345678901234567890", 19, '\0', 0, 0, 0}, /* too many digits */
      {"07", 10, '\0', 0, 0, 0},                   /* leading zero */
      {"00", 10, '\0', 0, 0, 0},
      {"", 10, '\0', 0, 0, 0},
      {"+7", 10, '\0', 0, 0, 0},
      {"-7", 10, '\0', 0, 0, 0},
      {" 7", 10, '\0', 0, 0, 0},
      {"7 ", 10, '\0', 0, 0, 0},
      {"7x", 10, '\0', 0, 0, 0},
      {"7", 10, '/', 0, 0, 0}, /* the '/' the path needs is missing */
      {"7/", 10, '\0', 0, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *p = cases[i].text;
    uint64_t v = 12345;
    int ok = loco_take_decimal(&p, cases[i].digits, cases[i].stop, &v);
    cr_expect_eq(ok, cases[i].ok, "'%s'", cases[i].text);
    if (ok) {
      cr_expect_eq(v, cases[i].value, "'%s'", cases[i].text);
      cr_expect_eq((size_t)(p - cases[i].text), cases[i].moved);
    } else {
      cr_expect_eq(p, cases[i].text, "'%s': moved on failure", cases[i].text);
      cr_expect_eq(v, 12345u, "'%s': written on failure", cases[i].text);
    }
  }
  uint32_t id = 0;
  cr_expect(loco_parse_id("4294967295", &id) && id == UINT32_MAX);
  cr_expect_not(loco_parse_id("4294967296", &id));
  cr_expect_not(loco_parse_id("01", &id));
  cr_expect_not(loco_parse_id(NULL, &id));
  cr_expect(loco_url_hosted("http://127.0.0.1:80/v1/hosted/12", NULL, 0, &id) &&
            id == 12);
  cr_expect_not(loco_url_hosted("http://127.0.0.1:80/v1/hosted/012", NULL, 0,
                                NULL));
  cr_expect_not(loco_url_hosted("http://127.0.0.1:80/v1/hosted/", NULL, 0,
                                NULL));
}
