/* test_collab.c - an open PULSELoCo collaboration (pulse_loco_collab.h)
 * with its peers as processes on loopback (collab_testutil.h): the target
 * global batch bound, joins, clean leaves, kill -9 of the writer and of
 * another peer, and of the writer once its manifest is out. */
#include "collab_testutil.h"
#include "collab_impl.h"
#include "peer_http_impl.h"
#include "manifest_impl.h"

static void spawn_all(ct_child *ks, const ct_peer_cfg *cfg, size_t n) {
  for (size_t i = 0; i < n; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (size_t i = 0; i < n; i++)
    ct_hello(&ks[i]);
}

Test(collab, every_round_ends_in_T_to_T_plus_the_largest_step,
     .timeout = 60) {
  /* Steps of 3, 5 and 7 samples, a target of 40: the grants stop at the
   * first total >= 40, so every round holds 40..46 samples, whoever is
   * fastest; every peer ends with the same bits. */
  const uint64_t T = 40, steps[3] = {3, 5, 7};
  ct_peer_cfg cfg[3];
  ct_child ks[3];
  for (uint32_t i = 0; i < 3; i++)
    cfg[i] = (ct_peer_cfg){i + 1, steps[i], T, 6, -1, 200u * (i + 1)};
  spawn_all(ks, cfg, 3);
  ct_start(ks, 3);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 3, &log, NULL, NULL);
  uint64_t sent = 0;
  for (uint64_t r = 0; r < 6; r++) {
    uint64_t own = 0;
    for (size_t i = 0; i < 3; i++) {
      cr_assert(log.have[i][r]);
      const ct_round *x = &log.row[i][r];
      cr_assert_geq(x->samples, T, "round %llu: %llu samples",
                    (unsigned long long)r, (unsigned long long)x->samples);
      cr_assert_lt(x->samples, T + 7, "round %llu: %llu samples",
                   (unsigned long long)r, (unsigned long long)x->samples);
      cr_assert_eq(x->samples, log.row[0][r].samples);
      cr_assert_eq(x->digest, log.row[0][r].digest);
      cr_assert_eq(x->takeovers, 0);
      /* Its own payload's entries: none without samples (and no
       * payload), at most one a parameter (collab_testutil.h's replay
       * checks the exact count). */
      cr_assert_leq(x->sent, x->own > 0 ? CT_P : 0);
      cr_assert_eq(x->payload_bytes > 0, x->own > 0);
      sent += x->sent;
      own += x->own;
    }
    /* The round's total is the sum of what each peer did. */
    cr_assert_eq(own, log.row[0][r].samples);
  }
  cr_log_info("entries sent in 6 rounds, all peers: %llu",
              (unsigned long long)sent);
  cr_assert_gt(sent, 0, "no entry sent in 6 rounds");
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(log.final_digest[i], log.final_digest[0]);
  ct_quit(ks, 3);
}

/* Starts the joiner once round `at` is reported by the first founder. */
typedef struct {
  ct_child *joiner;
  uint64_t at;
  const char *seed;
  int sent;
} join_plan;

static void join_when(ct_child *ks, size_t n, size_t i, const ct_round *r,
                      void *user) {
  (void)ks, (void)n;
  join_plan *p = user;
  if (!p->sent && i == 0 && r->round >= p->at) {
    dprintf(p->joiner->to, "join %s\n", p->seed);
    p->sent = 1;
  }
}

Test(collab, a_joiner_through_any_peer_gets_the_state_bit_for_bit,
     .timeout = 60) {
  ct_peer_cfg cfg[3];
  ct_child ks[3];
  for (uint32_t i = 0; i < 3; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, 32, 7, -1, 20000};
  spawn_all(ks, cfg, 3);
  ct_start(ks, 2); /* peers 1 and 2 found; 3 joins through peer 2 */
  join_plan plan = {&ks[2], 1, ks[1].url, 0};
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 3, &log, join_when, &plan);
  uint64_t jr = log.joined_round[2];
  cr_assert_geq(jr, 2);
  cr_assert_lt(jr, 7);
  /* Its state at joining is the founders' after round jr - 1. */
  cr_assert(log.have[0][jr - 1]);
  cr_assert_eq(log.joined_digest[2], log.row[0][jr - 1].digest);
  /* It contributes (from its first round on, unless that round filled
   * before it got there), and everyone agrees. */
  int contributed = 0;
  for (uint64_t r = jr; r < 7; r++) {
    cr_assert(log.have[2][r]);
    cr_assert_eq(log.row[2][r].digest, log.row[0][r].digest);
    contributed |= log.row[2][r].included && log.row[2][r].own > 0;
  }
  cr_assert(contributed);
  for (size_t i = 0; i < 3; i++)
    cr_assert_eq(log.final_digest[i], log.final_digest[0]);
  ct_quit(ks, 3);
}

Test(collab, a_clean_leave_flushes_its_error_feedback, .timeout = 60) {
  ct_peer_cfg cfg[3];
  ct_child ks[3];
  for (uint32_t i = 0; i < 3; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, 32, 6, i == 1 ? 2 : -1, 300};
  spawn_all(ks, cfg, 3);
  ct_start(ks, 3);
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 3, &log, NULL, NULL);
  /* Peer 2 left in round 2 (or the first after it where it had steps):
   * its payload was used and its residual is all zeros. */
  uint64_t lr = log.final_round[1] - 1;
  cr_assert(log.have[1][lr]);
  cr_assert(log.row[1][lr].left);
  cr_assert(log.row[1][lr].included);
  cr_assert_eq(log.residual[1], 0.0);
  cr_assert_eq(log.row[1][lr].digest, log.row[0][lr].digest);
  /* The others go on without it, identical. */
  cr_assert_eq(log.final_round[0], 6);
  cr_assert_eq(log.final_digest[0], log.final_digest[2]);
  cr_assert_lt(log.row[0][lr + 1].contrib, 3);
  ct_quit(ks, 3);
}

/* Kills a peer once a peer reported round `at - 1` (the others are then
 * in round `at`, a round lasting far longer than the parent takes to
 * react): the writer of round `at` by the rule, or another peer. */
typedef struct {
  uint64_t at;
  int writer;
  size_t victim;
  int done;
} kill_plan;

static void kill_when(ct_child *ks, size_t n, size_t i, const ct_round *r,
                      void *user) {
  kill_plan *p = user;
  if (p->done || r->round + 1 < p->at)
    return;
  (void)i;
  p->at = r->round + 1;
  /* Members sorted by id are ks[0..n) (ids 1..n); the writer of round at
   * at rank 0 is members[at % n]. */
  size_t w = (size_t)(p->at % n);
  p->victim = p->writer ? w : (w + 1) % n;
  ct_kill(&ks[p->victim]);
  p->done = 1;
}

static void killed_peer_costs_at_most_one_round(int writer) {
  ct_peer_cfg cfg[4];
  ct_child ks[4];
  const uint64_t T = 48;
  for (uint32_t i = 0; i < 4; i++)
    cfg[i] = (ct_peer_cfg){i + 1, 4, T, 7, -1, 60000};
  spawn_all(ks, cfg, 4);
  ct_start(ks, 4);
  kill_plan plan = {3, writer, 0, 0};
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 4, &log, kill_when, &plan);
  cr_assert(plan.done);
  size_t first = plan.victim == 0 ? 1 : 0;
  for (size_t i = 0; i < 4; i++) {
    if (i == plan.victim)
      continue;
    cr_assert_eq(log.final_round[i], 7);
    cr_assert_eq(log.final_digest[i], log.final_digest[first]);
    /* The round of the kill closes without the dead peer (its granted
     * samples missing); every other round holds its target, and only
     * that round needed a new writer. */
    int short_rounds = 0;
    unsigned takeovers = 0;
    for (uint64_t r = 0; r < 7; r++) {
      cr_assert(log.have[i][r]);
      cr_assert_eq(log.row[i][r].digest, log.row[first][r].digest);
      short_rounds += log.row[i][r].samples < T;
      takeovers += log.row[i][r].takeovers;
      cr_assert_leq(log.row[i][r].takeovers, 1);
    }
    cr_assert_leq(short_rounds, 1);
    cr_assert_eq(takeovers, writer ? 1u : 0u);
    cr_assert_lt(log.row[i][6].contrib, 4);
  }
  ct_quit(ks, 4);
}

Test(collab, kill_9_of_the_writer_costs_at_most_one_round, .timeout = 60) {
  killed_peer_costs_at_most_one_round(1);
}

Test(collab, kill_9_of_another_peer_costs_at_most_one_round, .timeout = 60) {
  killed_peer_costs_at_most_one_round(0);
}

/* ------------------- all-to-all: the writer killed after its manifest */

/* Whether round r's manifest, as peer k re-serves it, lists id. */
static int lists(const ct_child *k, uint64_t r, uint32_t id) {
  char url[160];
  snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/manifest", k->url, r);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_wait(url, 2000, 1u << 20, &b), PULSE_OK, "%s", url);
  loco_manifest m;
  cr_assert_eq(loco_manifest_parse(b.data, b.size, &m), PULSE_OK);
  pulse_bytebuf_free(&b);
  int found = 0;
  for (size_t j = 0; j < m.ncontrib; j++)
    found |= m.contrib[j].id == id;
  loco_manifest_free(&m);
  return found;
}

#define KW_N 4
#define KW_ROUNDS 5
#define KW_ROUND 2

/* Four all-to-all peers; peer 3, the writer of round 2, is stopped by a
 * test hook once its manifest is out (stall phase `writer_phase`: 1 its
 * own payload dropped first, nobody can get it; 2 still served), and
 * peer `late` (0: none) waits 1 s before fetching round 2's payloads.
 * The test kills peer 3 once every survivor holds the manifest and, with
 * a late peer, the others said they finished round 2. The survivors'
 * reports into log; the test asserts what each case must give. */
static void writer_killed_after_its_manifest(int writer_phase, uint32_t late,
                                             ct_log *log) {
  ct_child ks[KW_N];
  ct_stall stalls[KW_N] = {
      {KW_ROUND, 0}, {KW_ROUND, 0}, {KW_ROUND, writer_phase}, {KW_ROUND, 0}};
  if (late)
    stalls[late - 1].phase = 3;
  ct_spawn_stalled(ks, KW_N, 4, 48, KW_ROUNDS,
                   CT_STALL_VARS(loco_collab_test_stall), stalls);
  char url[160];
  for (size_t i = 0; i < KW_N; i++) {
    snprintf(url, sizeof url, "%s/v1/loco/round/%d/manifest", ks[i].url,
             KW_ROUND);
    ct_wait_for(url, NULL);
  }
  /* Else the round has nothing to lose, and the test proves nothing. */
  cr_assert(lists(&ks[0], KW_ROUND, 3), "peer 3 did no step in round %d",
            KW_ROUND);
  for (size_t i = 0; late && i < KW_N; i++) {
    if (i == 2 || i + 1 == late)
      continue;
    snprintf(url, sizeof url, "%s/v1/loco/round/%d/outcome", ks[i].url,
             KW_ROUND);
    ct_wait_for(url, "finished");
  }
  ct_kill(&ks[2]);
  memset(log, 0, sizeof *log);
  ct_collect(ks, KW_N, log, NULL, NULL);
  /* Every survivor reports every round with the same weights; only the
   * kill's round may be short of T, and nobody took over (the manifest
   * was out). */
  for (size_t i = 0; i < KW_N; i++) {
    if (i == 2)
      continue;
    cr_assert_eq(log->final_round[i], KW_ROUNDS);
    cr_assert_eq(log->final_digest[i], log->final_digest[0]);
    int short_rounds = 0;
    for (uint64_t r = 0; r < KW_ROUNDS; r++) {
      cr_assert(log->have[i][r], "peer %zu: no round %" PRIu64, i + 1, r);
      cr_assert_eq(log->row[i][r].digest, log->row[0][r].digest,
                   "round %" PRIu64 ": peer %zu differs", r, i + 1);
      cr_assert_eq(log->row[i][r].takeovers, 0);
      short_rounds += log->row[i][r].samples < 48;
    }
    cr_assert_leq(short_rounds, 1);
    cr_assert_eq(log->row[i][KW_ROUND].writer, 3);
    cr_assert_eq(log->row[i][KW_ROUNDS - 1].contrib, 3);
  }
  ct_quit(ks, KW_N);
}

/* Every survivor with a payload in the kill's round finished it itself
 * (it imported no state) over `contrib` payloads, its own among them. */
static void survivors_finished_the_kill_round_over(const ct_log *log,
                                                   unsigned contrib) {
  for (size_t i = 0; i < KW_N; i++) {
    const ct_round *x = &log->row[i][KW_ROUND];
    if (i == 2 || x->own == 0)
      continue;
    cr_assert_eq(x->contrib, contrib, "peer %zu", i + 1);
    cr_assert(x->included, "peer %zu", i + 1);
    cr_assert_not(x->resynced, "peer %zu imported the state", i + 1);
  }
}

/* Nobody got the dead writer's payload: every survivor with a payload
 * says "failed", reads the others' outcomes (nobody finished) and
 * finishes round 2 over itself and the two others that said "failed". */
Test(collab, a_writer_killed_before_anyone_got_its_payload_costs_one_round,
     .timeout = 60) {
  static ct_log log;
  writer_killed_after_its_manifest(1, 0, &log);
  survivors_finished_the_kill_round_over(&log, 3);
}

/* Peers 1 and 2 got the writer's payload and finished round 2; peer 4,
 * late, finds the writer dead and fetches the payload from their relays:
 * it finishes round 2 itself over all four payloads, as they did. */
Test(collab, a_survivor_late_for_the_dead_writers_payload_gets_it_relayed,
     .timeout = 60) {
  static ct_log log;
  writer_killed_after_its_manifest(2, 4, &log);
  survivors_finished_the_kill_round_over(&log, 4);
  cr_assert_gt(log.row[3][KW_ROUND].own, 0, "peer 4 did no step in round %d",
               KW_ROUND);
}
