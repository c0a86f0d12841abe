/* test_collab_fail_writer_cut.c - a round's writer cut off from more than
 * half of the members (issue 35 item 8): five members, and as round 2
 * starts its writer (peer 3) loses peers 1, 2 and 4 for a few seconds (nft
 * drops what each side sends to the other's port; every peer is on
 * 127.0.0.1, so the rule tells them apart by the user each child runs as);
 * peer 5 still reaches everyone. The three cut off take the round over at
 * rank 1, while the writer still hears peer 5: without a commit step both
 * sides closed round 2 (two histories). A round's manifest counts only
 * once more than half of its members accepted it at its rank, so the
 * writer and peer 5 cannot close it: they adopt the majority's manifest
 * (peer 5 at once, the writer once the partition heals), join again and
 * end with the same weights as the others. Needs root and nft; skipped
 * otherwise. */
#include "nft_cut_testutil.h"

#define WC_N 5
#define WC_ROUNDS 24
#define WC_UID 62000u
#define WC_WRITER 2u /* index of peer 3, the writer of round 2 */

static char wc_table[64];

typedef struct {
  unsigned cut_ms;
  int started;
} wc_plan;

/* Once the writer of round 2 reported round 1 (it starts round 2): it and
 * peers 1, 2 and 4 drop what they send to each other for cut_ms, then the
 * table goes (in the background, whatever the peers do meanwhile). */
static void wc_cut(ct_child *ks, size_t n, size_t i, const ct_round *r,
                   void *user) {
  (void)n;
  wc_plan *p = user;
  if (p->started || i != WC_WRITER || r->round < 1)
    return;
  p->started = 1;
  /* Peer 3 from peers 1, 2 and 4. */
  static const size_t cut[][2] = {
      {WC_WRITER, 0}, {WC_WRITER, 1}, {WC_WRITER, 3}};
  ct_nft_cut(wc_table, ks, WC_UID, cut, 3, p->cut_ms);
  const ct_child *w = &ks[WC_WRITER];
  cr_log_info("peer %u cut from peers 1, 2 and 4 for %u ms", w->id, p->cut_ms);
}

static void writer_cut(int partitioned) {
  if (!ct_nft_usable())
    cr_skip_test("needs root and nft");
  ct_nft_table(wc_table, sizeof wc_table, "wcut");
  ct_child ks[WC_N];
  ct_partitioned = partitioned;
  ct_uid_base = WC_UID;
  for (uint32_t i = 0; i < WC_N; i++) {
    ct_peer_cfg cfg = {i + 1, 4, 96, WC_ROUNDS, -1, CT_KILL_STEP_US};
    ct_spawn(&ks[i], &cfg);
  }
  ct_uid_base = 0;
  for (size_t i = 0; i < WC_N; i++)
    ct_hello(&ks[i]);
  ct_start(ks, WC_N);
  wc_plan plan = {5000, 0};
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect_spins = 12000;
  ct_collect(ks, WC_N, &log, wc_cut, &plan);
  ct_collect_spins = 0;
  ct_nft_heal(wc_table);
  cr_assert(plan.started);
  /* One history: round 2 as the majority closed it, then every peer at the
   * last round with the same weights. */
  for (size_t i = 0; i < WC_N; i++) {
    cr_assert_eq(log.final_round[i], WC_ROUNDS, "peer %zu", i + 1);
    cr_assert_eq(log.final_digest[i], log.final_digest[0],
                 "peer %zu ends apart from peer 1", i + 1);
  }
  for (size_t i = 1; i < WC_N; i++)
    if (log.have[0][2] && log.have[i][2] && i != WC_WRITER && i != 4)
      cr_assert_eq(log.row[i][2].digest, log.row[0][2].digest,
                   "round 2: peer %zu", i + 1);
  ct_quit(ks, WC_N);
}

Test(collab_fail, a_writer_cut_from_most_members_does_not_fork, .timeout = 240) {
  writer_cut(0);
}

Test(collab_fail, a_writer_cut_from_most_members_does_not_fork_partitioned,
     .timeout = 240) {
  writer_cut(1);
}

/* Three members, and as round 2 starts the two others die (kill -9): its
 * writer (peer 3) and peer 2. A dead member's port refuses connections, so
 * it is no acceptor: the survivor (peer 1, the writer at rank 1) takes the
 * round over, alone a majority of the members alive, and goes on to the
 * last round. Before, it needed more than half of the members that were
 * not dead writers (peers 1 and 2) and stopped with an error. */
typedef struct {
  int killed;
} wd_plan;

static void wd_kill(ct_child *ks, size_t n, size_t i, const ct_round *r,
                    void *user) {
  (void)n;
  wd_plan *p = user;
  if (p->killed || i != 0 || r->round < 1)
    return;
  p->killed = 1;
  ct_kill(&ks[2]);
  ct_kill(&ks[1]);
}

Test(collab_fail, the_survivor_of_two_deaths_among_three_goes_on,
     .timeout = 120) {
  ct_child ks[3];
  ct_partitioned = 0;
  for (uint32_t i = 0; i < 3; i++) {
    ct_peer_cfg cfg = {i + 1, 4, 48, 8, -1, CT_KILL_STEP_US};
    ct_spawn(&ks[i], &cfg);
  }
  for (size_t i = 0; i < 3; i++)
    ct_hello(&ks[i]);
  ct_start(ks, 3);
  wd_plan plan = {0};
  static ct_log log;
  memset(&log, 0, sizeof log);
  ct_collect(ks, 3, &log, wd_kill, &plan);
  cr_assert(plan.killed);
  cr_assert_eq(log.final_round[0], 8);
  cr_assert(log.have[0][2]);
  cr_assert_geq(log.row[0][2].takeovers, 1, "round 2 was not taken over");
  ct_quit(ks, 3);
}
