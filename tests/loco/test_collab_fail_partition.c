/* test_collab_fail_partition.c - a network partition inside a
 * collaboration that heals (issue 35 item 8): two of four members cannot
 * reach each other for a few seconds (nft drops what each sends to the
 * other's port; every peer is on 127.0.0.1, so the rule tells them apart
 * by the user each child runs as), everyone else reaches everyone. No
 * peer dies, so when the partition heals every member must go on to the
 * last round with no error and end with the same weights as the others:
 * a member cut off imports the state when it can again, it does not fork.
 * Needs root and nft; skipped otherwise. */
#include "collab_testutil.h"

#define CP_N 4
#define CP_ROUNDS 60
#define CP_UID 61000u

/* The test's own nft table (its pid in the name: runs beside it keep
 * theirs). */
static char cp_table[64];

static int cp_sh(const char *cmd) {
  int rc = system(cmd);
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

static void cp_heal(void) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "nft delete table inet %s 2>/dev/null", cp_table);
  cp_sh(cmd);
}

static unsigned cp_port(const ct_child *k) {
  const char *colon = strrchr(k->url, ':');
  return colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
}

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
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "nft add table inet %1$s && "
           "nft add chain inet %1$s out '{ type filter hook output priority 0; "
           "}' && "
           "nft add rule inet %1$s out meta skuid %2$u tcp dport %3$u drop && "
           "nft add rule inet %1$s out meta skuid %4$u tcp dport %5$u drop",
           cp_table, CP_UID + ks[p->a].id, cp_port(&ks[p->b]),
           CP_UID + ks[p->b].id, cp_port(&ks[p->a]));
  cr_assert_eq(cp_sh(cmd), 0, "nft: %s", cmd);
  snprintf(cmd, sizeof cmd,
           "(sleep %u.%03u; nft delete table inet %s) >/dev/null 2>&1 &",
           p->cut_ms / 1000, p->cut_ms % 1000, cp_table);
  cr_assert_eq(cp_sh(cmd), 0);
  cr_log_info("members %u and %u cut from each other for %u ms", ks[p->a].id,
              ks[p->b].id, p->cut_ms);
}

static void partition_heals(int partitioned) {
  if (geteuid() != 0 || cp_sh("nft list tables >/dev/null 2>&1") != 0)
    cr_skip_test("needs root and nft");
  snprintf(cp_table, sizeof cp_table, "pulse_collab_cut_%d", (int)getpid());
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
  cp_heal();
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
