/* test_collab_fail.c - two failures in one round of a partitioned
 * collaboration (docs/protocols/loco-collaboration.md "Collaboration", a
 * peer killed mid-exchange): a range owner killed once it served its
 * reduced range (the first failure; in one pattern it is the round's
 * writer), and the one member that finished the exchange without it killed
 * right after it said "finished", before anyone imported its state (the
 * second). The two other members missed the dead owner's range (a test
 * hook delays their fetch), read the word "finished" and find its state
 * nowhere: they must end the round alike, and every later one, with no
 * error and within the stated bound. */
#include "collab_impl.h"
#include "collab_testutil.h"
#include "partition_impl.h"

#define CF_N 4
#define CF_ROUNDS 4
#define CF_ROUND 1

/* Reads child k's lines to its "done": each round's record into row
 * (have[r] says it came) and the final digest; an error fails the test. */
static void cf_read_rounds(ct_child *k, ct_round *row, int *have,
                           uint64_t *final_digest) {
  char line[512];
  for (;;) {
    cr_assert(ct_read_line(k, line, sizeof line, 60000), "peer %u went quiet",
              k->id);
    cr_assert_neq(strncmp(line, "error", 5), 0, "peer %u: %s", k->id, line);
    ct_round r;
    if (ct_parse_round(line, &r) && r.round < CF_ROUNDS) {
      row[r.round] = r;
      have[r.round] = 1;
    } else if (sscanf(line, "done %*u %" SCNx64, final_digest) == 1) {
      return;
    }
  }
}

/* The pattern in round CF_ROUND: `owner` (an index; round 1's writer is
 * peer 2, index 1) stops after its reduced range and is killed; peer 1
 * (index 0) finishes the exchange, says "finished" without serving its
 * state and is killed; the two others wait before fetching the reduced
 * ranges, so they never get the owner's. */
static void owner_and_finisher_killed(size_t owner) {
  ct_child ks[CF_N];
  ct_partitioned = 1;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  for (uint32_t i = 0; i < CF_N; i++) {
    ct_peer_cfg cfg = {i + 1, 4, 48, CF_ROUNDS, -1, CT_KILL_STEP_US};
    loco_partition_test_stall_id = loco_collab_test_stall_id = i + 1;
    loco_partition_test_stall_round = loco_collab_test_stall_round = CF_ROUND;
    loco_partition_test_stall_phase = i == owner ? 2 : i == 0 ? 0 : 3;
    loco_collab_test_stall_phase = i == 0 ? 4 : 0;
    ct_spawn(&ks[i], &cfg);
  }
  loco_partition_test_stall_phase = loco_collab_test_stall_phase = 0;
  ct_round_timeout_ms = 0;
  for (size_t i = 0; i < CF_N; i++)
    ct_hello(&ks[i]);
  ct_start(ks, CF_N);
  char url[256];
  /* The owner is killed once peer 1 holds every range (its verdict). */
  snprintf(url, sizeof url, "%s/v1/loco/part/%d/0/reduced", ks[owner].url,
           CF_ROUND);
  ct_wait_for(url, NULL);
  snprintf(url, sizeof url, "%s/v1/loco/part/%d/0/verdict", ks[0].url,
           CF_ROUND);
  ct_wait_for(url, NULL);
  ct_kill(&ks[owner]);
  /* Peer 1 finishes at the exchange's deadline, as the others fail; they
   * read outcomes every 50 ms: a second gives them its word before it
   * dies. */
  snprintf(url, sizeof url, "%s/v1/loco/round/%d/outcome", ks[0].url, CF_ROUND);
  ct_wait_for(url, "finished");
  usleep(1000000);
  ct_kill(&ks[0]);
  static ct_round row[CF_N][CF_ROUNDS];
  static int have[CF_N][CF_ROUNDS];
  uint64_t final_digest[CF_N] = {0};
  memset(row, 0, sizeof row);
  memset(have, 0, sizeof have);
  size_t surv[2], ns = 0;
  for (size_t i = 1; i < CF_N; i++)
    if (i != owner)
      surv[ns++] = i;
  for (size_t s = 0; s < 2; s++)
    cf_read_rounds(&ks[surv[s]], row[s], have[s], &final_digest[s]);
  for (size_t r = 0; r < CF_ROUNDS; r++) {
    cr_assert(have[0][r] && have[1][r], "round %zu not reported", r);
    cr_assert_eq(row[0][r].digest, row[1][r].digest,
                 "round %zu: the survivors differ", r);
  }
  cr_assert_eq(final_digest[0], final_digest[1]);
  /* Both stepped in the round of the kills (else it proves little), and
   * neither finished it over the whole set: nobody they can reach holds
   * that state. */
  for (size_t s = 0; s < 2; s++) {
    cr_assert_gt(row[s][CF_ROUND].own, 0, "peer %zu did no step", surv[s] + 1);
    cr_assert_lt(row[s][CF_ROUND].contrib, CF_N);
  }
  ct_quit(ks, CF_N);
}

Test(collab_fail, the_writer_and_a_finisher_after_its_word_killed_in_one_round,
     .timeout = 120) {
  owner_and_finisher_killed(1); /* peer 2 writes round 1 */
}

Test(collab_fail, an_owner_and_a_finisher_after_its_word_killed_in_one_round,
     .timeout = 120) {
  owner_and_finisher_killed(2);
}

/* A member left out of a round rejoins through the member that wrote it
 * (the manifest's source); when that member died since, it rejoins
 * through another member of its last view instead of ending with an
 * error. Peer 4 says it is ready past round 1's wait (test hook, phase 5)
 * and is left out; once it reported round 1, peer 2 (round 1's writer) is
 * killed, while peer 4 waits 2 s before joining again. */
#define CF_REJOIN_ROUNDS 60

typedef struct {
  unsigned kill_after_ms; /* from peer 4's report of round CF_ROUND */
  int killed, left_out, rejoined;
} cf_rejoin;

/* Once peer 4 reported round CF_ROUND: kill_after_ms later, peer 2 (its
 * source) is killed; then peer 4 must resync. */
static void kill_source(ct_child *ks, size_t n, size_t i, const ct_round *r,
                        void *user) {
  (void)n;
  cf_rejoin *w = user;
  if (i != 3)
    return;
  if (!w->killed && r->round == CF_ROUND) {
    w->left_out = !r->included;
    usleep(w->kill_after_ms * 1000u);
    ct_kill(&ks[1]);
    w->killed = 1;
  } else if (w->killed && r->resynced) {
    w->rejoined = 1;
  }
}

/* CF_N peers; peer 4 is left out of round CF_ROUND (test hook `phase`) and
 * its source is killed kill_after_ms after peer 4 reported that round; every
 * survivor reaches the last round with the same weights, and peer 4 joined
 * again. */
static void rejoin_when_source_dies(int phase, unsigned kill_after_ms) {
  ct_child ks[CF_N];
  ct_partitioned = 0;
  ct_round_timeout_ms = CT_KILL_ROUND_TIMEOUT_MS;
  loco_collab_test_stall_id = 4;
  loco_collab_test_stall_round = CF_ROUND;
  loco_collab_test_stall_phase = phase;
  for (uint32_t i = 0; i < CF_N; i++) {
    ct_peer_cfg cfg = {i + 1, 4, 96, CF_REJOIN_ROUNDS, -1, CT_KILL_STEP_US};
    ct_spawn(&ks[i], &cfg);
  }
  loco_collab_test_stall_phase = 0;
  ct_round_timeout_ms = 0;
  for (size_t i = 0; i < CF_N; i++)
    ct_hello(&ks[i]);
  ct_start(ks, CF_N);
  static ct_log log;
  memset(&log, 0, sizeof log);
  cf_rejoin w = {kill_after_ms, 0, 0, 0};
  /* A dead member costs the survivors a wait; the rejoin a round or two:
   * a minute and a half at most, loaded. */
  ct_collect_spins = 9000;
  ct_collect(ks, CF_N, &log, kill_source, &w);
  ct_collect_spins = 0;
  cr_assert(w.killed, "peer 4 never reported round %d", CF_ROUND);
  cr_assert(w.left_out, "peer 4 was not left out of round %d", CF_ROUND);
  cr_assert(w.rejoined, "peer 4 did not join again");
  size_t alive[] = {0, 2, 3};
  for (size_t a = 0; a < 3; a++) {
    size_t i = alive[a];
    cr_assert_eq(log.final_round[i], CF_REJOIN_ROUNDS, "peer %zu", i + 1);
    cr_assert_eq(log.final_digest[i], log.final_digest[0],
                 "peer %zu ends apart from peer 1", i + 1);
  }
  ct_quit(ks, CF_N);
}

Test(collab_fail,
     a_member_left_out_rejoins_through_another_when_its_source_died,
     .timeout = 180) {
  rejoin_when_source_dies(5, 0);
}

/* A member left out of a round joins again through the member that wrote
 * it; when that member dies while the joiner waits to be admitted (it
 * answered the joiner's first request: test hook, phase 6, peer 4 then
 * waits 2 s), the join goes on through another member of the view it had
 * instead of ending with an error after its timeout. */
Test(collab_fail, a_member_joining_again_goes_on_when_its_seed_dies_mid_join,
     .timeout = 180) {
  /* Peer 4 chooses its seed and asks it once, then waits 2 s. */
  rejoin_when_source_dies(6, 1000);
}
