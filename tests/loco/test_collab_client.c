/* test_collab_client.c - client-mode peers of a PULSELoCo collaboration
 * (pulse_loco_collab.h opts.client_of, docs/protocols/loco-collaboration.md "Collaboration"): a peer
 * that listens nowhere uploads its payload to a serving member, which
 * serves it to the others under the client's URL; the client is otherwise
 * a full member. Peers are child processes on loopback
 * (collab_testutil.h); the hostile uploads come from this process. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "collab_testutil.h"
#include "peer_http_impl.h"
#include "manifest_impl.h"
#include "partition_impl.h"
#include "pulse_loco_partition.h"

/* Three serving peers 1..3, then `clients` client-mode peers 4.. hosted by
 * host_index's peer; all of them founders. */
static void cc_spawn(ct_child *ks, ct_peer_cfg *cfg, size_t serving,
                     size_t clients, size_t host_index) {
  ct_client_of[0] = '\0';
  for (size_t i = 0; i < serving; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (size_t i = 0; i < serving; i++)
    ct_hello(&ks[i]);
  snprintf(ct_client_of, sizeof ct_client_of, "%s", ks[host_index].url);
  for (size_t i = serving; i < serving + clients; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (size_t i = serving; i < serving + clients; i++)
    ct_hello(&ks[i]);
  ct_client_of[0] = '\0';
}

Test(collab_client, a_client_contributes_and_receives_like_the_others,
     .timeout = 60) {
  /* Peers 1..3 serve, peer 4 is a client hosted by peer 2. Every round
   * counts as contributors the peers that are in, the client among them
   * when it is, and holds the sum of their samples (in [T, T + the
   * largest step)); the client is in all rounds but at most one; every peer ends with the
   * same bits; peer 2 stored the client's uploads, no other peer did. */
  const uint64_t T = 60, R = 4;
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  /* The client steps fastest: it is in every round unless it is late to
   * one (a loaded machine, its first claim: no grant; or its upload
   * reaching the host after the round moved on: the host refuses it and
   * its samples stay in its error feedback), and then that round goes on
   * without it, as for any late peer. The serving peers step slowly
   * enough that, without the client, they fill a round in about 130 ms:
   * at 4 ms a step (27 ms) a loaded ASan run here had the client in 2
   * rounds of 4. */
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] =
        (ct_peer_cfg){i + 1, i < 3 ? 3 : 2, T, R, -1, i < 3 ? 20000 : 1000};
  cc_spawn(ks, cfg, 3, 1, 1);
  char want[96];
  snprintf(want, sizeof want, "%s/v1/hosted/4", ks[1].url);
  cr_expect_str_eq(ks[3].url, want, "the client's URL is at its host");
  ct_start(ks, 4);
  ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, NULL, NULL);
  uint64_t with_client = 0;
  for (uint64_t r = 0; r < R; r++) {
    for (size_t i = 0; i < 4; i++)
      cr_assert(log.have[i][r], "peer %zu has no round %" PRIu64, i + 1, r);
    const ct_round *c = &log.row[3][r];
    /* A client that is in counts like any peer: the contributors are the
     * peers that say they are in (a serving peer may be late too). */
    unsigned in = 0;
    for (size_t i = 0; i < 4; i++)
      in += log.row[i][r].included != 0;
    cr_expect_eq(c->contrib, in, "round %" PRIu64 ": %u contributors, %u "
                 "peers in", r, c->contrib, in);
    if (c->included) {
      with_client++;
      cr_expect_gt(c->own, 0u);
    }
    cr_expect_neq(c->writer, 4u, "round %" PRIu64 ": a client wrote it", r);
    cr_expect(c->samples >= T && c->samples < T + 3,
              "round %" PRIu64 ": %" PRIu64 " samples", r, c->samples);
    /* The round's total is the sum of what the peers that are in did,
     * the client's among it when it is in. */
    uint64_t own = 0;
    for (size_t i = 0; i < 4; i++)
      own += log.row[i][r].included ? log.row[i][r].own : 0;
    cr_expect_eq(own, c->samples, "round %" PRIu64, r);
    for (size_t i = 0; i < 3; i++) {
      cr_expect_eq(log.row[i][r].digest, c->digest,
                   "round %" PRIu64 ": peer %zu differs from the client", r,
                   i + 1);
      cr_expect_eq(log.row[i][r].samples, c->samples);
    }
  }
  for (size_t i = 0; i < 4; i++) {
    cr_expect_eq(log.final_round[i], R);
    cr_expect_eq(log.final_digest[i], log.final_digest[3],
                 "peer %zu ends other than the client", i + 1);
  }
  uint64_t missed = R - with_client;
  cr_expect_leq(missed, 1u, "the client was in %" PRIu64 " rounds of %" PRIu64,
                with_client, R);
  /* An upload per round it was in; a late one stored or refused. */
  cr_expect_geq(log.stored[1], with_client, "the host stored %" PRIu64
                " uploads", log.stored[1]);
  cr_expect_leq(log.stored[1] + log.refused[1], with_client + missed);
  cr_expect_eq(log.stored[0] + log.stored[2], 0u, "a peer that is not the "
               "client's host stored its uploads");
  ct_quit(ks, 4);
}

Test(collab_client, a_partitioned_client_contributes_and_owns_no_range,
     .timeout = 60) {
  /* Partitioned averaging, peers 1..3 serve (the range owners), peer 4 is
   * a client hosted by peer 2: the owners reduce its range out of its
   * upload at its host. Every round the client is in with its samples,
   * the exchange finished it on every peer (no all-to-all fallback), and
   * every peer holds the weights an all-to-all finish over the same
   * payloads gives, bit for bit. Steps are slow (30-90 ms) so that every
   * peer is in every round, as the replay wants (at 10-30 ms a loaded ASan
   * run saw a round 0 with two contributors: the others had not begun). */
  const uint64_t step = 4, T = 48, R = 4;
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] = (ct_peer_cfg){i + 1, step, T, R, -1, i < 3 ? 30000u * (i + 1)
                                                         : 30000u};
  ct_partitioned = 1;
  cc_spawn(ks, cfg, 3, 1, 1);
  ct_partitioned = 0;
  ct_start(ks, 4);
  ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, NULL, NULL);
  ct_quit(ks, 4);
  for (uint64_t r = 0; r < R; r++) {
    const ct_round *c = &log.row[3][r];
    cr_expect_gt(c->own, 0u, "round %" PRIu64 ": the client did nothing", r);
    cr_expect(c->included, "round %" PRIu64 ": the client is not in", r);
    uint64_t own = 0;
    for (size_t i = 0; i < 4; i++) {
      cr_expect_eq(log.row[i][r].contrib, 4u, "round %" PRIu64 ": peer %zu "
                   "counts %u contributors", r, i + 1, log.row[i][r].contrib);
      cr_expect(log.partitioned[i][r], "round %" PRIu64 ": peer %zu did not "
                "finish by the partitioned exchange", r, i + 1);
      cr_expect_eq(log.row[i][r].samples, c->samples);
      own += log.row[i][r].own;
    }
    cr_expect_eq(own, c->samples, "round %" PRIu64 ": the client's samples "
                 "are not in the total", r);
    cr_expect_neq(c->writer, 4u, "round %" PRIu64 ": a client wrote it", r);
  }
  ct_replay_all_to_all(&log, 4, R, step);
  for (size_t i = 0; i < 4; i++)
    cr_expect_eq(log.final_digest[i], log.final_digest[3],
                 "peer %zu ends other than the client", i + 1);
  /* Each round: the client's payload, its slice for each of the three
   * owners and its verdict. */
  cr_expect_eq(log.stored[1], R * 5, "the host stored %" PRIu64 " uploads",
               log.stored[1]);
  cr_expect_eq(log.refused[1], 0u);
}

Test(collab_client, a_partitioned_client_follows_an_all_to_all_fallback,
     .timeout = 90) {
  /* Peers 1..3 serve, client 4 is hosted by peer 2; owner 3 stops for
   * good in round 1 once its slices are out and is killed: nobody gets its
   * reduced range, every exchange of round 1 fails and nobody finished.
   * Peers 1 and 2 (they said "failed") finish round 1 all-to-all over the
   * two of them; the client, which publishes no outcome, is not in it: its
   * payload goes back to its error feedback and it imports their state.
   * The three survivors hold the same weights in every round, and the
   * client is in again, through the exchange, in the last round. */
  const uint64_t R = 4;
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, 48, R, -1, CT_KILL_STEP_US};
  ct_partitioned = 1;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  loco_partition_test_stall_id = 3;
  loco_partition_test_stall_round = 1;
  loco_partition_test_stall_phase = 1;
  cc_spawn(ks, cfg, 3, 1, 1);
  loco_partition_test_stall_phase = 0;
  ct_round_timeout_ms = 0;
  ct_partitioned = 0;
  ct_start(ks, 4);
  char url[256];
  snprintf(url, sizeof url, "%s/v1/loco/part/1/0/slice/1", ks[2].url);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_wait(url, 30000, 1 << 20, &b), PULSE_OK,
               "owner 3 never published its slices of round 1");
  pulse_bytebuf_free(&b);
  ct_kill(&ks[2]);
  ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, NULL, NULL);
  ct_quit(ks, 4);
  const size_t surv[3] = {0, 1, 3};
  for (uint64_t r = 0; r < R; r++)
    for (size_t s = 0; s < 3; s++) {
      cr_assert(log.have[surv[s]][r], "peer %zu has no round %" PRIu64,
                surv[s] + 1, r);
      cr_expect_eq(log.row[surv[s]][r].digest, log.row[3][r].digest,
                   "round %" PRIu64 ": peer %zu differs from the client", r,
                   surv[s] + 1);
    }
  const ct_round *c1 = &log.row[3][1];
  cr_expect_not(c1->included, "the client is in a round it had no say in");
  cr_expect(c1->resynced, "the client did not import the state");
  cr_expect_not(log.partitioned[3][1]);
  for (size_t s = 0; s < 2; s++)
    if (log.row[s][1].own > 0) {
      cr_expect_eq(log.row[s][1].contrib, 2u, "peer %zu: round 1 over %u",
                   s + 1, log.row[s][1].contrib);
      cr_expect_not(log.partitioned[s][1]);
    }
  cr_expect_eq(c1->contrib, 2u, "the client counts %u contributors",
               c1->contrib);
  const ct_round *last = &log.row[3][R - 1];
  cr_expect(last->included && log.partitioned[3][R - 1],
            "the client is not back in by the exchange");
  cr_expect_eq(last->contrib, 3u);
  for (size_t s = 0; s < 3; s++)
    cr_expect_eq(log.final_digest[surv[s]], log.final_digest[3]);
}

/* Kills peer 2 (the client's host) once peers 1 and 3 and the client
 * (user: the ct_log) all reported round 1. Peer 2 is also round 1's
 * writer (the rule's second serving member): killed when only the client
 * had reported it (loaded ASan run in CI), it took with it the only copies
 * of its own payload and of the client's it hosted while peers 1 and 3
 * held its manifest but not yet those payloads; nobody alive that
 * finished the round serves state (a client listens nowhere), so both
 * failed with "no peer served the state of round 2". The test is about a
 * host that dies, not a writer dying in its close. */
static void kill_host_after_round_1(ct_child *ks, size_t n, size_t i,
                                    const ct_round *r, void *user) {
  (void)n, (void)i, (void)r;
  const ct_log *log = user;
  if (ks[1].pid > 0 && log->have[0][1] && log->have[2][1] && log->have[3][1])
    ct_kill(&ks[1]);
}

Test(collab_client, a_client_whose_host_dies_moves_to_another, .timeout = 90) {
  /* Peer 4's host (peer 2) is killed once the others ended round 1: the
   * client loses a round (its next upload finds no host), rejoins through
   * another serving member (peer 3, the next one, when it answers in
   * time), contributes again and ends with the survivors' bits. */
  const uint64_t T = 36, R = 12;
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  /* Steps slow enough that the rounds after the loss leave the client
   * time to rejoin (a few tens of milliseconds). */
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 3, T, R, -1, 4000u};
  cc_spawn(ks, cfg, 3, 1, 1);
  ct_start(ks, 4);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, kill_host_after_round_1, &log);
  cr_expect_geq(log.lost[3], 1, "the client lost no round");
  cr_expect_eq(log.final_round[3], R);
  cr_expect_eq(log.final_digest[0], log.final_digest[3]);
  cr_expect_eq(log.final_digest[2], log.final_digest[3]);
  /* Back in: a later round of the survivors lists the client's payload,
   * now hosted by another serving peer. */
  int back = 0;
  for (uint64_t r = 3; r < R; r++)
    back |= log.have[0][r] && log.row[0][r].contrib == 3u &&
            log.have[3][r] && log.row[3][r].included;
  cr_expect(back, "the client is not back in");
  /* Peer 3 is the next serving member, but a loaded machine may keep it
   * from answering the client's view request in time: then peer 1. */
  cr_expect_geq(log.stored[0] + log.stored[2], 1u,
                "no surviving peer hosted the client");
  ct_quit(ks, 4);
}

/* Sends the joiner (child 3) its join through the client (child 2) once
 * the client reports round 0. */
static void join_through_the_client(ct_child *ks, size_t n, size_t i,
                                    const ct_round *r, void *user) {
  (void)n, (void)user;
  static int sent;
  if (i == 2 && r->round == 0 && !sent) {
    dprintf(ks[3].to, "join %s\n", ks[2].url);
    sent = 1;
  }
}

Test(collab_client, a_joiner_through_a_clients_url_joins_through_its_host,
     .timeout = 60) {
  /* Peers 1 and 2 serve, 3 is a client of peer 1; peer 4 joins giving
   * the client's URL as its seed (a client serves no state: the join goes
   * to its host). Everyone, the client and the joiner included, ends with
   * the same bits, and the joiner's payload counts in a later round. */
  const uint64_t T = 36, R = 10;
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 3, T, R, -1, 3000u};
  cc_spawn(ks, cfg, 2, 1, 0);
  ct_spawn(&ks[3], &cfg[3]);
  ct_hello(&ks[3]);
  ct_start(ks, 3);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, join_through_the_client, NULL);
  for (size_t i = 0; i < 4; i++) {
    cr_expect_eq(log.final_round[i], R, "peer %zu", i + 1);
    cr_expect_eq(log.final_digest[i], log.final_digest[0], "peer %zu", i + 1);
  }
  /* A round where the joiner is in with samples of its own, and every
   * peer that reported it counts the peers that are in: the joiner among
   * them. (Not "a round with 4 contributors", as before: a loaded ASan
   * run here had none, the client or the joiner being late to one of the
   * few rounds after the join costing that round as for any late peer.) */
  int counted = 0;
  for (uint64_t r = 1; r < R; r++) {
    if (!log.have[3][r] || !log.row[3][r].included || log.row[3][r].own == 0)
      continue;
    counted = 1;
    unsigned in = 0;
    for (size_t i = 0; i < 4; i++)
      in += log.have[i][r] && log.row[i][r].included;
    for (size_t i = 0; i < 4; i++)
      if (log.have[i][r])
        cr_expect_eq(log.row[i][r].contrib, in, "round %" PRIu64 ": peer %zu "
                     "counts %u contributors, %u peers in", r, i + 1,
                     log.row[i][r].contrib, in);
  }
  cr_expect(counted, "no round with the joiner's payload");
  ct_quit(ks, 4);
}

/* ---------------------------------------------------- hostile uploads */

/* A POST of body to base + path; the status. */
static long cc_post(const char *base, const char *path, const void *body,
                    size_t size) {
  char url[256];
  snprintf(url, sizeof url, "%s%s", base, path);
  long status = 0;
  cr_assert_eq(loco_http_post_body(url, 2000, body, size, NULL, &status),
               PULSE_OK);
  return status;
}

static long cc_get(const char *base, const char *path) {
  char url[256];
  snprintf(url, sizeof url, "%s%s", base, path);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  cr_assert_eq(loco_http_get(url, 2000, 1 << 20, &b, &status), PULSE_OK);
  pulse_bytebuf_free(&b);
  return status;
}

/* Sends raw bytes on a new connection to base's port, then closes it. */
static void cc_raw(const char *base, const char *text, size_t n) {
  uint32_t addr;
  uint16_t port;
  cr_assert(loco_url_parse(base, &addr, &port));
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(send(fd, text, n, MSG_NOSIGNAL), (ssize_t)n);
  close(fd);
}

Test(collab_client, hostile_uploads_are_refused_and_nothing_is_stored,
     .timeout = 30) {
  /* This process is peer 1, serving, whose founding members are itself
   * and client 7 that it hosts. Uploads: a good one (stored, served back
   * bit for bit), then a non-member, a member hosted elsewhere, a round
   * not yet begun, an id that is not the path's, a body that does not
   * decode, another sender's payload, a body over the limit (declared, and
   * chunked without a length), a body cut short: each refused with its
   * status, none stored, and the peer still answers. The same for the
   * partitioned exchange's slices and verdicts. */
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CT_P;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.chunk_log2 = 10;
  float *theta = calloc(CT_P, sizeof *theta), *theta7 = calloc(CT_P, 4);
  for (uint64_t i = 0; i < CT_P; i++)
    theta[i] = theta7[i] = (float)((double)(i % 17u) / 8.0 - 1.0);
  pulse_loco *ctx = NULL, *ctx7 = NULL;
  o.trainer_id = 1;
  cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK);
  o.trainer_id = 7;
  cr_assert_eq(pulse_loco_create(&o, theta7, &ctx7), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK);
  const char *base = pulse_loco_collab_url(c);
  pulse_loco_member m[2] = {{1, ""}, {7, ""}};
  snprintf(m[0].url, sizeof m[0].url, "%s", base);
  snprintf(m[1].url, sizeof m[1].url, "%s/v1/hosted/7", base);
  cr_assert_eq(pulse_loco_collab_start(c, m, 2), PULSE_OK, "%s",
               pulse_error_detail());

  /* Client 7's payload of round 0, and peer 1's own (another sender). */
  for (uint64_t i = 0; i < CT_P; i++)
    theta7[i] += 0.01f * (float)(i % 5u);
  const uint8_t *p7;
  size_t n7;
  cr_assert_eq(pulse_loco_prepare(ctx7, theta7, 6, 0, &p7, &n7, NULL),
               PULSE_OK);
  uint8_t *good = malloc(n7);
  memcpy(good, p7, n7);
  const char *path7 = "/v1/hosted/7/v1/loco/round/0?id=7";
  cr_expect_eq(cc_post(base, path7, good, n7), 200);
  pulse_bytebuf back = PULSE_BYTEBUF_INIT;
  char url[256];
  snprintf(url, sizeof url, "%s/v1/hosted/7/v1/loco/round/0", base);
  cr_assert_eq(loco_http_wait(url, 2000, n7, &back), PULSE_OK);
  cr_expect(back.size == n7 && memcmp(back.data, good, n7) == 0,
            "the host serves other bytes than the client uploaded");
  pulse_bytebuf_free(&back);

  uint8_t junk[300];
  memset(junk, 0xA5, sizeof junk);
  cr_expect_eq(cc_post(base, "/v1/hosted/9/v1/loco/round/0?id=9", good, n7),
               403, "a non-member");
  cr_expect_eq(cc_post(base, "/v1/hosted/1/v1/loco/round/0?id=1", good, n7),
               403, "a member not hosted here");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/round/3?id=7", good, n7),
               503, "a round not begun here");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/round/0?id=8", good, n7),
               400, "an id other than the path's");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/round/0", good, n7), 400,
               "no id");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/nonsense?id=7", good, n7),
               404, "not a payload path");
  cr_expect_eq(cc_post(base, "/v1/hosted/07/v1/loco/round/0?id=7", good, n7),
               404, "a leading zero in the client's id");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/round/00?id=7", good, n7),
               404, "a leading zero in the round");
  cr_expect_eq(cc_post(base, path7, junk, sizeof junk), 422,
               "a body that does not decode");
  cr_expect_eq(cc_post(base, path7, NULL, 0), 422, "an empty body");
  const uint8_t *p1;
  size_t n1;
  cr_assert_eq(pulse_loco_prepare(ctx, theta, 4, 0, &p1, &n1, NULL),
               PULSE_OK);
  cr_expect_eq(cc_post(base, path7, p1, n1), 422, "another sender's payload");
  /* The partitioned exchange's blobs: a slice of client 7 for owner 1 and
   * its verdict are stored; a slice for a non-member owner, another
   * sender's slice, a verdict of another peer or attempt, one that does
   * not decode, a round not begun and a malformed attempt are not. */
  pulse_buffer slice = {NULL, 0};
  cr_assert_eq(pulse_loco_slice_encode(ctx7, 0, CT_P / 2, &slice), PULSE_OK);
  const char *part = "/v1/hosted/7/v1/loco/part/0/0/";
  char at[128];
  snprintf(at, sizeof at, "%sslice/1?id=7", part);
  cr_expect_eq(cc_post(base, at, slice.data, slice.size), 200, "a slice");
  cr_expect_eq(cc_post(base, at, p1, n1), 422, "another sender's slice");
  snprintf(at, sizeof at, "%sslice/9?id=7", part);
  cr_expect_eq(cc_post(base, at, slice.data, slice.size), 422,
               "a slice for a non-member");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/part/3/0/slice/1?id=7",
                       slice.data, slice.size),
               503, "a slice of a round not begun");
  pulse_loco_verdict *v = calloc(1, sizeof *v);
  cr_assert_not_null(v);
  v->peer = 7;
  pulse_buffer vb = {NULL, 0};
  cr_assert_eq(pulse_loco_verdict_encode(v, &vb), PULSE_OK);
  snprintf(at, sizeof at, "%sverdict?id=7", part);
  cr_expect_eq(cc_post(base, at, vb.data, vb.size), 200, "a verdict");
  cr_expect_eq(cc_post(base, at, junk, sizeof junk), 422, "a junk verdict");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/part/0/1/verdict?id=7",
                       vb.data, vb.size),
               422, "a verdict of another attempt");
  cr_expect_eq(cc_post(base, "/v1/hosted/7/v1/loco/part/0/123/verdict?id=7",
                       vb.data, vb.size),
               404, "no such attempt");
  pulse_buffer_free(&vb);
  v->peer = 1;
  cr_assert_eq(pulse_loco_verdict_encode(v, &vb), PULSE_OK);
  cr_expect_eq(cc_post(base, at, vb.data, vb.size), 422,
               "another peer's verdict");
  pulse_buffer_free(&vb);
  free(v);
  snprintf(url, sizeof url, "%s%sslice/1", base, part);
  cr_assert_eq(loco_http_wait(url, 2000, slice.size, &back), PULSE_OK);
  cr_expect(back.size == slice.size &&
                memcmp(back.data, slice.data, slice.size) == 0,
            "the host serves another slice than the client uploaded");
  pulse_bytebuf_free(&back);
  pulse_buffer_free(&slice);
  snprintf(url, sizeof url, "%s/v1/hosted/7/v1/loco/round/0", base);
  pulse_loco_abandon(ctx, 0);
  size_t huge = 16u * CT_P + 64u * 1024u;
  uint8_t *big = calloc(1, huge);
  cr_expect_eq(cc_post(base, path7, big, huge), 413, "a body over the limit");
  free(big);
  /* Chunked, no length: refused once read (the status on the wire). */
  {
    uint32_t addr;
    uint16_t port;
    cr_assert(loco_url_parse(base, &addr, &port));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(addr);
    cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    const char *head = "POST /v1/hosted/7/v1/loco/round/0?id=7 HTTP/1.1\r\n"
                       "Host: x\r\nTransfer-Encoding: chunked\r\n\r\n";
    cr_assert_eq(send(fd, head, strlen(head), MSG_NOSIGNAL),
                 (ssize_t)strlen(head));
    char chunk[8192 + 16];
    int k = snprintf(chunk, sizeof chunk, "2000\r\n");
    memset(chunk + k, 'x', 8192);
    memcpy(chunk + k + 8192, "\r\n", 2);
    for (size_t sent = 0; sent < huge; sent += 8192)
      cr_assert_gt(send(fd, chunk, (size_t)k + 8194, MSG_NOSIGNAL), 0);
    cr_assert_eq(send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL), 5);
    char answer[256] = "";
    ssize_t got = recv(fd, answer, sizeof answer - 1, 0);
    cr_assert_gt(got, 12);
    cr_expect(strncmp(answer, "HTTP/1.1 413", 12) == 0, "%.40s", answer);
    close(fd);
  }
  /* Cut short: 1000 bytes promised, 10 sent, then gone. */
  const char *cut = "POST /v1/hosted/7/v1/loco/round/0?id=7 HTTP/1.1\r\n"
                    "Host: x\r\nContent-Length: 1000\r\n\r\n0123456789";
  cc_raw(base, cut, strlen(cut));
  usleep(50000);

  /* Nothing else was stored: the good upload still is what is served. */
  cr_expect_eq(cc_get(base, "/v1/hosted/9/v1/loco/round/0"), 404);
  cr_assert_eq(loco_http_wait(url, 2000, n7, &back), PULSE_OK);
  cr_expect(back.size == n7 && memcmp(back.data, good, n7) == 0,
            "a refused upload replaced the good one");
  pulse_bytebuf_free(&back);
  uint64_t stored = 0, refused = 0;
  pulse_loco_collab_hosted(c, &stored, &refused);
  cr_expect_eq(stored, 3u);
  cr_expect_eq(refused, 18u, "%" PRIu64 " refusals counted", refused);
  cr_expect_eq(cc_get(base, "/healthz"), 200, "the peer stopped answering");
  /* The same counts in /metrics, and the 413s under the upload route. */
  pulse_bytebuf text = PULSE_BYTEBUF_INIT;
  long st = 0;
  snprintf(url, sizeof url, "%s/metrics", base);
  cr_assert_eq(loco_http_get(url, 2000, 1 << 20, &text, &st), PULSE_OK);
  cr_assert_eq(st, 200);
  pulse_bytebuf_byte(&text, 0);
  const char *mt = (const char *)text.data;
  cr_expect(strstr(mt, "pulse_loco_hosted_uploads_total{result=\"stored\"} 3\n"),
            "%s", mt);
  cr_expect(strstr(mt, "pulse_loco_hosted_uploads_total{result=\"refused\"} 18\n"),
            "%s", mt);
  cr_expect(strstr(mt, "pulse_http_requests_total{route=\"upload\","
                      "code=\"413\"} 2\n") != NULL,
            "not the two 413s in /metrics: %s", mt);
  /* The uploads that did not decode or were not the client's (422), by
   * their own code, not as "other". */
  cr_expect(strstr(mt, "pulse_http_requests_total{route=\"upload\","
                      "code=\"422\"} 8\n") != NULL,
            "not the eight 422s in /metrics: %s", mt);
  pulse_bytebuf_free(&text);
  free(good);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  pulse_loco_free(ctx7);
  free(theta), free(theta7);
}

Test(collab_client, a_client_takes_partitioned_averaging_not_bad_hosts) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CT_P;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.trainer_id = 5;
  float *theta = calloc(CT_P, sizeof *theta);
  pulse_loco *ctx = NULL;
  cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  pulse_loco_collab *c = NULL;
  /* Partitioned is fine for a client (it owns no range). */
  co.client_of = "http://127.0.0.1:9";
  co.partitioned = 1;
  cr_expect_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_loco_collab_free(c);
  c = NULL;
  co.partitioned = 0;
  co.client_of = "http://localhost:9";
  cr_expect_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  co.client_of = "http://127.0.0.1:9";
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK);
  cr_expect_str_eq(pulse_loco_collab_url(c), "http://127.0.0.1:9/v1/hosted/5");
  /* A hosted URL must carry the member's own id. */
  pulse_loco_member m[2] = {{4, "http://127.0.0.1:9"},
                            {5, "http://127.0.0.1:9/v1/hosted/6"}};
  cr_expect_eq(pulse_loco_collab_start(c, m, 2), PULSE_ERR_ARG);
  snprintf(m[1].url, sizeof m[1].url, "http://127.0.0.1:9/v1/hosted/5");
  cr_expect_eq(pulse_loco_collab_start(c, m, 2), PULSE_OK, "%s",
               pulse_error_detail());
  /* The writer rule skips the client. */
  for (uint64_t r = 0; r < 4; r++)
    cr_expect_eq(pulse_loco_collab_writer(m, 2, r, 0), 4u);
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  free(theta);
}
