/* test_collab_partition.c - a collaboration with partitioned averaging
 * (pulse_loco_collab_opts.partitioned): its peers as processes on loopback
 * (collab_testutil.h) end every round with the weights that an all-to-all
 * finish over the same payloads gives, bit for bit. Which peer did how
 * many steps depends on timing, so the reference is a replay: the rounds
 * as the peers reported them (each peer's own samples), rerun in memory
 * with pulse_loco_finish over every payload. */
#include "collab_testutil.h"
#include "collab_impl.h"
#include "peer_http_impl.h"
#include "manifest_impl.h"
#include "partition_impl.h"

#define PT_PEERS 4
#define PT_ROUNDS 4

/* Reads peer k's lines to its "done": each round's record into row and
 * whether the partitioned exchange finished it (the line's last field)
 * into part, its final digest into final_digest; every one of `rounds`
 * rounds must be reported, and no error. */
static void pt_read_rounds(ct_child *k, size_t rounds, ct_round *row, int *part,
                           uint64_t *final_digest) {
  char line[512];
  size_t got = 0;
  for (;;) {
    cr_assert(ct_read_line(k, line, sizeof line, 30000), "peer %u went quiet",
              k->id);
    cr_assert_neq(strncmp(line, "error", 5), 0, "peer %u: %s", k->id, line);
    ct_round r;
    if (ct_parse_round(line, &r)) {
      cr_assert_lt(r.round, rounds);
      row[r.round] = r;
      const char *last = strrchr(line, ' ');
      part[r.round] = last != NULL && strcmp(last, " 1") == 0;
      got++;
    } else if (sscanf(line, "done %*u %" SCNx64, final_digest) == 1) {
      break;
    }
  }
  cr_assert_eq(got, rounds, "peer %u lost a round", k->id);
}

/* Reads round r's manifest as peer k re-serves it. */
static void pt_manifest(const ct_child *k, uint64_t r, loco_manifest *m) {
  char url[160];
  snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/manifest", k->url, r);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_wait(url, 2000, 1u << 20, &b), PULSE_OK, "%s", url);
  cr_assert_eq(loco_manifest_parse(b.data, b.size, m), PULSE_OK);
  pulse_bytebuf_free(&b);
}

/* PT_PEERS peers run PT_ROUNDS partitioned rounds, every peer reporting
 * bw_per_id times its id as its download rate (0: what it measured), and
 * end each round as the all-to-all replay does. With forced rates, each
 * round's manifest lists them and every member's plan from it gives
 * range sizes in their proportion. */
static void pt_replay(uint64_t bw_per_id) {
  const uint64_t step = 4, T = 48;
  ct_peer_cfg cfg[PT_PEERS];
  ct_child ks[PT_PEERS];
  for (uint32_t i = 0; i < PT_PEERS; i++)
    cfg[i] = (ct_peer_cfg){i + 1, step, T, PT_ROUNDS, -1, 10000u * (i + 1)};
  ct_partitioned = 1;
  loco_collab_test_bandwidth_per_id = bw_per_id; /* the children's */
  for (size_t i = 0; i < PT_PEERS; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (size_t i = 0; i < PT_PEERS; i++)
    ct_hello(&ks[i]);
  ct_start(ks, PT_PEERS);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, PT_PEERS, &log, NULL, NULL);
  for (uint64_t r = 0; bw_per_id > 0 && r < PT_ROUNDS; r++) {
    /* Every peer holds the same manifest; the one of the last peer serves. */
    loco_manifest m;
    pt_manifest(&ks[PT_PEERS - 1], r, &m);
    uint32_t ids[PT_PEERS];
    uint64_t bw[PT_PEERS], w[PT_PEERS];
    cr_assert_leq(m.ncontrib, PT_PEERS);
    for (size_t j = 0; j < m.ncontrib; j++) {
      ids[j] = m.contrib[j].id;
      bw[j] = m.contrib[j].bandwidth;
      cr_assert_eq(bw[j], loco_bandwidth_quantize(bw_per_id * ids[j]),
                   "round %llu: peer %u listed at %llu bytes/s",
                   (unsigned long long)r, ids[j], (unsigned long long)bw[j]);
    }
    pulse_loco_plan_weights(bw, m.ncontrib, w);
    pulse_loco_plan plan;
    cr_assert_eq(pulse_loco_plan_make(CT_P, ids, w, m.ncontrib, &plan),
                 PULSE_OK);
    /* Within a cell of the rates' proportion: a faster peer never owns
     * less than a slower one. */
    for (size_t j = 1; j < m.ncontrib; j++)
      cr_assert_geq(plan.start[j + 1] - plan.start[j],
                    plan.start[j] - plan.start[j - 1], "round %llu",
                    (unsigned long long)r);
    if (m.ncontrib == PT_PEERS)
      cr_assert_gt(plan.start[PT_PEERS] - plan.start[PT_PEERS - 1],
                   2 * (plan.start[1] - plan.start[0]),
                   "round %llu: 4x the rate, not twice the range",
                   (unsigned long long)r);
    loco_manifest_free(&m);
  }
  ct_quit(ks, PT_PEERS);
  loco_collab_test_bandwidth_per_id = 0;

  /* A clean run: every peer that stepped is in the round, finished by
   * the exchange (not the all-to-all fallback); then the replay: same
   * start, same steps, all-to-all finish, the same bits every round. */
  for (uint64_t r = 0; r < PT_ROUNDS; r++) {
    size_t stepped = 0;
    for (size_t i = 0; i < PT_PEERS; i++) {
      if (log.row[i][r].own == 0)
        continue;
      stepped++;
      cr_assert(log.partitioned[i][r],
                "round %llu: peer %zu finished all-to-all",
                (unsigned long long)r, i);
    }
    cr_assert_eq(log.row[0][r].contrib, stepped);
  }
  for (size_t i = 0; i < PT_PEERS; i++)
    cr_assert_eq(log.final_digest[i], log.final_digest[0]);
  ct_replay_all_to_all(&log, PT_PEERS, PT_ROUNDS, step);
}

Test(collab_partition, equals_an_all_to_all_replay_bit_for_bit,
     .timeout = 60) {
  pt_replay(0);
}

/* The mean gate on every peer (pulse_loco_opts.gate_mean): the owners
 * write only the accepted means, and the peers still equal an all-to-all
 * replay with the gate, bit for bit. */
Test(collab_partition, equals_an_all_to_all_replay_with_the_mean_gate,
     .timeout = 60) {
  ct_gate_mean = 1;
  pt_replay(0);
  ct_gate_mean = 0;
}

/* Peers reporting 1, 2, 3 and 4 MiB/s: weights that cut 1, 3, 5 and 7 of
 * 16 equal cells (the run's active plan cuts the cells' costs in that
 * proportion), the same weights as all-to-all (the plan moves work, not
 * results). */
Test(collab_partition, unequal_bandwidths_give_unequal_ranges_and_the_same_bits,
     .timeout = 60) {
  pt_replay(1u << 20);
}

/* The manifest's optional per-contributor "samples" (what the members of
 * a partitioned round check slices against): kept through a write and a
 * parse, absent = 0, and anything but a positive integer refused. */
Test(collab_partition, manifest_samples_round_trip_and_bad_ones_refused) {
  loco_contrib_ref refs[2] = {{3, 100, {1}, 64, 0}, {5, 200, {2}, 0, 0}};
  pulse_loco_member next[1] = {{3, "http://127.0.0.1:9"}};
  loco_manifest m = {7, 3, 1, refs, 2, next, 1};
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_manifest_write(&m, &b), PULSE_OK);
  loco_manifest x;
  cr_assert_eq(loco_manifest_parse(b.data, b.size, &x), PULSE_OK);
  cr_assert_eq(x.ncontrib, 2);
  cr_assert_eq(x.contrib[0].samples, 64);
  cr_assert_eq(x.contrib[1].samples, 0);
  loco_manifest_free(&x);
  char text[2048];
  cr_assert_lt(b.size, sizeof text);
  memcpy(text, b.data, b.size);
  text[b.size] = '\0';
  const char *at = strstr(text, "\"samples\":64");
  cr_assert_not_null(at);
  const char *bad[] = {"\"samples\":0", "\"samples\":-1", "\"samples\":\"64\"",
                       "\"samples\":6.5"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char doc[2048];
    size_t pre = (size_t)(at - text);
    snprintf(doc, sizeof doc, "%.*s%s%s", (int)pre, text, bad[i],
             at + strlen("\"samples\":64"));
    cr_assert_neq(loco_manifest_parse((const uint8_t *)doc, strlen(doc), &x),
                  PULSE_OK, "accepted %s", bad[i]);
  }
  pulse_bytebuf_free(&b);
}

/* The manifest's optional per-contributor "bandwidth" (what partitioned
 * ranges follow): kept through a write and a parse, absent = 0, and
 * anything but a positive integer in loco_bandwidth_quantize's form
 * refused: zero, negative, text, fractions, values outside [LOCO_BW_MIN,
 * LOCO_BW_MAX], bits below the 4 leading ones, overflow. */
Test(collab_partition,
     manifest_bandwidth_round_trips_and_bad_ones_are_refused) {
  cr_assert_eq(loco_bandwidth_quantize(0), 0);
  cr_assert_eq(loco_bandwidth_quantize(1), LOCO_BW_MIN);
  cr_assert_eq(loco_bandwidth_quantize(UINT64_MAX), LOCO_BW_MAX);
  cr_assert_eq(loco_bandwidth_quantize(1000000), 983040); /* 15 << 16 */
  for (uint64_t v = 1; v < (1ull << 44); v = v * 3 + 1) {
    uint64_t q = loco_bandwidth_quantize(v);
    cr_assert_eq(loco_bandwidth_quantize(q), q, "%llu", (unsigned long long)v);
    if (v >= LOCO_BW_MIN && v <= LOCO_BW_MAX)
      cr_assert(q <= v && q > v - v / 8, "%llu -> %llu",
                (unsigned long long)v, (unsigned long long)q);
  }
  loco_contrib_ref refs[2] = {{3, 100, {1}, 64, 983040}, {5, 200, {2}, 0, 0}};
  pulse_loco_member next[1] = {{3, "http://127.0.0.1:9"}};
  loco_manifest m = {7, 3, 1, refs, 2, next, 1};
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_manifest_write(&m, &b), PULSE_OK);
  loco_manifest x;
  cr_assert_eq(loco_manifest_parse(b.data, b.size, &x), PULSE_OK);
  cr_assert_eq(x.contrib[0].bandwidth, 983040);
  cr_assert_eq(x.contrib[1].bandwidth, 0);
  loco_manifest_free(&x);
  char text[2048];
  cr_assert_lt(b.size, sizeof text);
  memcpy(text, b.data, b.size);
  text[b.size] = '\0';
  const char *key = "\"bandwidth\":983040";
  const char *at = strstr(text, key);
  cr_assert_not_null(at);
  const char *bad[] = {"\"bandwidth\":0",
                       "\"bandwidth\":-1",
                       "\"bandwidth\":\"983040\"",
                       "\"bandwidth\":983040.5",
                       "\"bandwidth\":9.8304e5",
                       "\"bandwidth\":983041",
                       "\"bandwidth\":1000",
                       "\"bandwidth\":2199023255552",
                       "\"bandwidth\":18446744073709551616",
                       "\"bandwidth\":null",
                       "\"bandwidth\":[983040]"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char doc[2048];
    size_t pre = (size_t)(at - text);
    snprintf(doc, sizeof doc, "%.*s%s%s", (int)pre, text, bad[i],
             at + strlen(key));
    cr_assert_neq(loco_manifest_parse((const uint8_t *)doc, strlen(doc), &x),
                  PULSE_OK, "accepted %s", bad[i]);
  }
  pulse_bytebuf_free(&b);
}

static unsigned pt_accept_post(void *user, const char *path, const char *id,
                               const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{}");
  return 200;
}

/* A head fetch (loco_fetch.head, what the partitioned writer uses): the
 * first bytes only, with the whole body's size and SHA-256 from the
 * answer; a body shorter than the head asked is not done. */
Test(collab_partition, a_head_fetch_gives_size_and_digest_not_the_body) {
  loco_server *srv = NULL;
  cr_assert_eq(loco_server_start(pt_accept_post, NULL, &srv), PULSE_OK);
  uint8_t body[5000];
  for (size_t i = 0; i < sizeof body; i++)
    body[i] = (uint8_t)(i * 7u + 3u);
  cr_assert_eq(loco_server_put(srv, "/b", body, sizeof body), PULSE_OK);
  cr_assert_eq(loco_server_put(srv, "/short", body, 10), PULSE_OK);
  char u1[64], u2[64];
  snprintf(u1, sizeof u1, "http://127.0.0.1:%u/b",
           (unsigned)loco_server_port(srv));
  snprintf(u2, sizeof u2, "http://127.0.0.1:%u/short",
           (unsigned)loco_server_port(srv));
  loco_fetch f[2];
  memset(f, 0, sizeof f);
  f[0].url = u1, f[1].url = u2;
  for (int i = 0; i < 2; i++) {
    f[i].max_bytes = sizeof body;
    f[i].head = 56;
    f[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  cr_assert_eq(loco_http_gather(f, 2, loco_now_ms() + 300), PULSE_OK);
  cr_assert(f[0].done);
  cr_assert_eq(f[0].body.size, 56);
  cr_assert_eq(memcmp(f[0].body.data, body, 56), 0);
  cr_assert_eq(f[0].total, sizeof body);
  uint8_t sha[32];
  loco_sha256(body, sizeof body, sha);
  cr_assert(f[0].has_sha256);
  cr_assert_eq(memcmp(f[0].sha256, sha, 32), 0);
  cr_assert_not(f[1].done, "10 bytes are no 56-byte header");
  cr_assert_leq(loco_server_bytes_served(srv), 56 + 10);
  for (int i = 0; i < 2; i++)
    pulse_bytebuf_free(&f[i].body);
  loco_server_stop(srv);
}

/* The download rate's sums (loco_http_rate_take): the bodies of large
 * transfers only, counted once each, in at most the time the fetches took
 * (overlapping bodies once); a small body adds nothing; taking resets. */
Test(collab_partition, the_rate_counts_large_bodies_over_their_body_time) {
  loco_server *srv = NULL;
  cr_assert_eq(loco_server_start(pt_accept_post, NULL, &srv), PULSE_OK);
  size_t big = 64u * LOCO_RATE_MIN_BYTES; /* 1 MiB: a measurable body time */
  uint8_t *body = calloc(big, 1);
  cr_assert_not_null(body);
  cr_assert_eq(loco_server_put(srv, "/big", body, big), PULSE_OK);
  cr_assert_eq(loco_server_put(srv, "/small", body, 100), PULSE_OK);
  char u1[64], u2[64];
  snprintf(u1, sizeof u1, "http://127.0.0.1:%u/big",
           (unsigned)loco_server_port(srv));
  snprintf(u2, sizeof u2, "http://127.0.0.1:%u/small",
           (unsigned)loco_server_port(srv));
  uint64_t bytes, us;
  loco_http_rate_take(&bytes, &us); /* whatever came before */
  loco_fetch f[3];
  memset(f, 0, sizeof f);
  f[0].url = f[1].url = u1, f[2].url = u2;
  for (int i = 0; i < 3; i++) {
    f[i].max_bytes = big;
    f[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  uint64_t t0 = pulse_fetch_now_us();
  cr_assert_eq(loco_http_gather(f, 3, loco_now_ms() + 5000), PULSE_OK);
  uint64_t wall = pulse_fetch_now_us() - t0;
  cr_assert(f[0].done && f[1].done && f[2].done);
  loco_http_rate_take(&bytes, &us);
  cr_assert_eq(bytes, 2 * big, "the two large bodies, not the small one");
  cr_assert_gt(us, 0);
  cr_assert_leq(us, wall);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_wait(u2, 2000, big, &b), PULSE_OK);
  loco_http_rate_take(&bytes, &us);
  cr_assert_eq(bytes, 0);
  cr_assert_eq(us, 0);
  cr_assert_eq(loco_http_wait(u1, 2000, big, &b), PULSE_OK);
  loco_http_rate_take(&bytes, &us);
  cr_assert_eq(bytes, big);
  pulse_bytebuf_free(&b);
  for (int i = 0; i < 3; i++)
    pulse_bytebuf_free(&f[i].body);
  free(body);
  loco_server_stop(srv);
}

/* ---------------------------------------- kill -9 during the exchange */

/* Range owners killed by the test mid-exchange (a test hook stops each
 * at a given point of one round; the test waits for its blob there, then
 * kill -9): peer 3 in round 1 once it published its reduced range (every
 * survivor holds all ranges but never gets its verdict: they finish
 * without it), peer 1, round 3's writer, once it published its slices (nobody
 * gets its range: every survivor fails, says so, and the round is
 * finished all-to-all by those that answered). Each kill costs the
 * victim's next round; the survivors report every round, with the same
 * weights, to the end. */
Test(collab_partition, owners_killed_mid_exchange_leave_survivors_identical,
     .timeout = 90) {
  enum { N = 4, ROUNDS = 6 };
  const uint64_t step = 4, T = 48;
  ct_child ks[N];
  ct_partitioned = 1;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  /* Peer 1 stops in round 3 (phase 1), peer 3 in round 1 (phase 2). */
  const ct_stall stalls[N] = {{3, 1}, {3, 0}, {1, 2}, {3, 0}};
  ct_spawn_stalled(ks, N, step, T, ROUNDS,
                   CT_STALL_VARS(loco_partition_test_stall), stalls);
  ct_round_timeout_ms = 0;
  /* Killed once the others hold what it published (their verdicts say
   * they have every range; their ranges say they have every slice). */
  char url[256];
  for (size_t i = 0; i < N; i++) {
    snprintf(url, sizeof url, "%s/v1/loco/part/1/0/%s", ks[i].url,
             i == 2 ? "reduced" : "verdict");
    ct_wait_for(url, NULL);
  }
  ct_kill(&ks[2]);
  for (size_t i = 0; i < N; i++) {
    if (i == 2)
      continue;
    snprintf(url, sizeof url, "%s/v1/loco/part/3/0/%s", ks[i].url,
             i == 0 ? "slice/2" : "reduced");
    ct_wait_for(url, NULL);
  }
  ct_kill(&ks[0]);
  static ct_round row[2][ROUNDS];
  static int part[2][ROUNDS];
  uint64_t final_digest[2] = {0, 0};
  const size_t surv[2] = {1, 3}; /* peers 2 and 4 */
  for (size_t s = 0; s < 2; s++) {
    size_t i = surv[s];
    pt_read_rounds(&ks[i], ROUNDS, row[s], part[s], &final_digest[s]);
  }
  for (size_t r = 0; r < ROUNDS; r++)
    cr_assert_eq(row[0][r].digest, row[1][r].digest,
                 "round %zu: survivors differ", r);
  cr_assert_eq(final_digest[0], final_digest[1]);
  /* Round 1: all four ranges used, finished by the exchange; round 3
   * (whose writer, peer 1, was the one killed): all-to-all over the two
   * survivors (the victim's payload is lost). */
  for (size_t i = 0; i < 2; i++) {
    cr_assert_eq(row[i][3].writer, 1u);
    if (row[i][1].own > 0) {
      cr_assert_eq(row[i][1].contrib, 4);
      cr_assert(part[i][1], "peer %zu did not finish round 1 partitioned", i);
    }
    if (row[i][3].own > 0) {
      cr_assert_eq(row[i][3].contrib, 2);
      cr_assert_not(part[i][3]);
    }
    cr_assert_eq(row[i][ROUNDS - 1].contrib, 2);
  }
  ct_quit(ks, N);
}

/* A survivor that misses the dead owner's range while the others got it:
 * peer 4 waits (test hook) before fetching the reduced ranges of round 1,
 * peer 3 publishes its range and stops; once peers 1 and 2 published
 * their verdicts (they hold every range) the test kills peer 3. Peers 1
 * and 2 finish without its verdict; peer 4's exchange fails, it reads
 * that they finished and imports their state of round 2: the same
 * weights. */
Test(collab_partition, a_survivor_without_the_dead_range_imports_a_finisher,
     .timeout = 90) {
  enum { N = 4, ROUNDS = 4 };
  const uint64_t step = 4, T = 48;
  ct_child ks[N];
  ct_partitioned = 1;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  /* In round 1: peer 3 stops (phase 2), peer 4 waits (phase 3). */
  const ct_stall stalls[N] = {{1, 0}, {1, 0}, {1, 2}, {1, 3}};
  ct_spawn_stalled(ks, N, step, T, ROUNDS,
                   CT_STALL_VARS(loco_partition_test_stall), stalls);
  ct_round_timeout_ms = 0;
  char url[256];
  for (size_t i = 0; i < 3; i++) {
    snprintf(url, sizeof url, "%s/v1/loco/part/1/0/%s", ks[i].url,
             i == 2 ? "reduced" : "verdict");
    ct_wait_for(url, NULL);
  }
  ct_kill(&ks[2]);
  const size_t surv[3] = {0, 1, 3};
  static ct_round row[3][ROUNDS];
  static int part[3][ROUNDS];
  uint64_t final_digest[3] = {0, 0, 0};
  for (size_t s = 0; s < 3; s++) {
    size_t i = surv[s];
    pt_read_rounds(&ks[i], ROUNDS, row[s], part[s], &final_digest[s]);
  }
  for (size_t r = 0; r < ROUNDS; r++)
    for (size_t s = 1; s < 3; s++)
      cr_assert_eq(row[s][r].digest, row[0][r].digest,
                   "round %zu: survivor %zu differs", r, s);
  cr_assert_eq(final_digest[1], final_digest[0]);
  cr_assert_eq(final_digest[2], final_digest[0]);
  for (size_t s = 0; s < 2; s++)
    if (row[s][1].own > 0) {
      cr_assert(part[s][1], "peer %zu did not finish round 1 partitioned",
                surv[s] + 1);
      cr_assert_eq(row[s][1].contrib, 4);
    }
  if (row[2][1].own > 0) {
    cr_assert_not(part[2][1]);
    cr_assert(row[2][1].resynced, "peer 4 did not import the state");
    cr_assert(row[2][1].included, "peer 4's payload was used");
  }
  ct_quit(ks, N);
}

/* The check setting: rotating (0, the default), full, receipts; anything
 * else refused. */
Test(collab_partition, the_check_setting_is_checked) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = 64;
  o.rule = PULSE_LOCO_RULE_KEEP;
  pulse_loco *ctx = NULL;
  cr_assert_eq(pulse_loco_create(&o, NULL, &ctx), PULSE_OK);
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  cr_assert_eq(co.partition_check, PULSE_LOCO_COLLAB_CHECK_ROTATING);
  co.partitioned = 1;
  pulse_loco_collab *c = NULL;
  for (uint32_t k = 0; k <= PULSE_LOCO_COLLAB_CHECK_RECEIPTS; k++) {
    co.partition_check = k;
    cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_OK);
    pulse_loco_collab_free(c);
    c = NULL;
  }
  co.partition_check = PULSE_LOCO_COLLAB_CHECK_RECEIPTS + 1;
  cr_assert_eq(pulse_loco_collab_create(&co, ctx, &c), PULSE_ERR_ARG);
  cr_assert_null(c);
  pulse_loco_free(ctx);
}
