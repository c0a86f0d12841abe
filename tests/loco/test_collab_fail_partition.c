/* test_collab_fail_partition.c - a network partition inside a
 * collaboration that heals (issue 35 item 8): two of four members cannot
 * reach each other for a few seconds (nft drops what each sends to the
 * other's port; every peer is on 127.0.0.1, so the rule tells them apart
 * by the user each child runs as), everyone else reaches everyone. No
 * peer dies, so when the partition heals every member must go on to the
 * last round with no error and end with the same weights as the others:
 * a member cut off imports the state when it can again, it does not fork.
 * Needs root and nft; skipped otherwise. */
#include "nft_cut_testutil.h"

#define CP_N 4
#define CP_ROUNDS 60
#define CP_UID 61000u

static char cp_table[64];

typedef struct {
  size_t a, b;     /* the two members cut from each other (indexes) */
  unsigned cut_ms; /* how long */
  int started;
} cp_plan;

/* Once a peer reported round 2: a and b lose each other for cut_ms, then
 * the table goes (a shell in the background, so the cut ends whatever
 * the peers do meanwhile). */
static void cut_when(ct_child *ks, size_t n, size_t i, const ct_round *r,
                     void *user) {
  (void)n, (void)i;
  cp_plan *p = user;
  if (p->started || r->round < 2)
    return;
  p->started = 1;
  const size_t cut[][2] = {{p->a, p->b}};
  ct_nft_cut(cp_table, ks, CP_UID, cut, 1, p->cut_ms);
  cr_log_info("members %u and %u cut from each other for %u ms", ks[p->a].id,
              ks[p->b].id, p->cut_ms);
}

static void partition_heals(int partitioned) {
  if (!ct_nft_usable())
    cr_skip_test("needs root and nft");
  ct_nft_table(cp_table, sizeof cp_table, "cut");
  ct_child ks[CP_N];
  ct_partitioned = partitioned;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  ct_uid_base = CP_UID;
  for (uint32_t i = 0; i < CP_N; i++) {
    ct_peer_cfg cfg = {i + 1, 4, 96, CP_ROUNDS, -1, CT_KILL_STEP_US};
    ct_spawn(&ks[i], &cfg);
  }
  ct_uid_base = 0;
  ct_round_timeout_ms = 0;
  for (size_t i = 0; i < CP_N; i++)
    ct_hello(&ks[i]);
  ct_start(ks, CP_N);
  /* Peers 2 and 3: round 2's writer is peer 3, so peer 2 loses its
   * writer while the others keep it. */
  cp_plan plan = {1, 2, 4000, 0};
  static ct_log log;
  memset(&log, 0, sizeof log);
  /* The others go on while the member cut off waits out the round and
   * joins again: a minute and a half at most, loaded. */
  ct_collect_spins = 9000;
  ct_collect(ks, CP_N, &log, cut_when, &plan);
  ct_collect_spins = 0;
  ct_nft_heal(cp_table);
  cr_assert(plan.started);
  for (size_t i = 0; i < CP_N; i++) {
    cr_assert_eq(log.final_round[i], CP_ROUNDS, "peer %zu", i + 1);
    cr_assert_eq(log.final_digest[i], log.final_digest[0],
                 "peer %zu ends apart from peer 1", i + 1);
  }
  ct_quit(ks, CP_N);
}

Test(collab_fail, a_partition_that_heals_leaves_no_fork, .timeout = 240) {
  partition_heals(0);
}

Test(collab_fail, a_partition_that_heals_leaves_no_fork_partitioned,
     .timeout = 240) {
  partition_heals(1);
}
