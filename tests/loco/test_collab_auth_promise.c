/* test_collab_auth_promise.c - what a takeover writer reads of the
 * members' acceptances (docs/protocols/loco-collaboration.md "Commit"):
 * each member's statement at /v1/loco/round/R/accepted is signed by it
 * and names the highest rank it promised; a writer taking over at rank k
 * counts only a statement signed by the member and promised at k or
 * above (one from before the promise, as a hostile path would replay it,
 * could hide an acceptance), and refuses the others, counted by kind. */
#include "collab_auth_testutil.h"

/* What peer 0, taking round r over at rank k, reads of itself and peer 1
 * (which contacted it): how many answered, and whether a manifest of
 * round r was found. */
static size_t read_at(ca_group *g, uint64_t r, uint32_t k, int *found) {
  collab_record rec[1];
  memset(rec, 0, sizeof rec);
  rec[0].id = 1;
  rec[0].contacted = 1;
  loco_manifest man;
  pulse_bytebuf raw = PULSE_BYTEBUF_INIT;
  loco_sig sig;
  size_t answered =
      collab_read_accepted(g->r[0].c, r, k, rec, 1, &man, &raw, &sig, found);
  if (*found) {
    cr_assert_eq(man.round, r);
    loco_manifest_free(&man);
  }
  pulse_bytebuf_free(&raw);
  return answered;
}

Test(loco_collab_auth, a_takeover_counts_only_signed_statements_at_its_rank,
     .timeout = 60) {
  ca_group g;
  ca_group_start(&g, 3, 3, 2);
  ca_group_run(&g);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(g.r[i].st, PULSE_OK, "peer %d: %s", i, g.r[i].detail);
  const uint64_t r = 1; /* the last round the peers ran */

  /* Peer 1 promised rank 0 only: its statement cannot speak for rank 1
   * (peer 0's own counts, whether it accepted round 1's manifest or not:
   * with three members two acceptances commit, so the third may never
   * have accepted). */
  int found = 0;
  cr_assert_eq(read_at(&g, r, 1, &found), 1, "a statement promised below 1");

  /* Once peer 1 promises rank 1 it serves that: it counts. Round 1 was
   * committed by two of the three, so peer 0 or peer 1 accepted it: the
   * manifest is found. */
  collab_promise(g.r[1].c, r, 1);
  cr_assert_eq(read_at(&g, r, 1, &found), 2);
  cr_assert(found, "neither peer 0 nor peer 1 accepted round 1's manifest");

  /* Its statements at rank 2 unsigned, forged, or a stranger's: refused,
   * counted, not an answer. */
  const unsigned modes[] = {LOCO_AUTH_TAMPER_UNSIGNED, LOCO_AUTH_TAMPER_FORGED,
                            LOCO_AUTH_TAMPER_FOREIGN};
  for (uint32_t m = 0; m < 3; m++) {
    uint64_t before = ca_refused_kind(g.r[0].c, "promise");
    cr_assert_eq(
        collab_auth_tamper(g.r[1].c, modes[m],
                           LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_PROMISE)),
        PULSE_OK);
    collab_promise(g.r[1].c, r, 2 + m);
    cr_assert_eq(read_at(&g, r, 2 + m, &found), 1, "fault %u", modes[m]);
    cr_assert_gt(ca_refused_kind(g.r[0].c, "promise"), before, "fault %u",
                 modes[m]);
  }

  /* Honest again at rank 5: it counts, and the manifest is still found. */
  cr_assert_eq(collab_auth_tamper(g.r[1].c, LOCO_AUTH_TAMPER_NONE, 0),
               PULSE_OK);
  collab_promise(g.r[1].c, r, 5);
  cr_assert_eq(read_at(&g, r, 5, &found), 2);
  cr_assert(found);
  ca_group_free(&g);
}
