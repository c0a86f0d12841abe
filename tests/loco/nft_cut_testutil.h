/* nft_cut_testutil.h - cuts between collaboration members for the
 * partition tests (test_collab_fail_*.c): every peer is on 127.0.0.1, so
 * an nft rule tells two apart by the user each child runs as (ct_uid_base
 * + its id) and drops what one sends to the other's port, both ways. Each
 * test run makes its own table (the pid in its name: runs beside it keep
 * theirs); the cut ends after a given time in a shell in the background,
 * whatever the peers do meanwhile, and the test deletes the table again
 * when it ends. Needs root and nft: ct_nft_usable says whether to skip. */
#ifndef PULSE_NFT_CUT_TESTUTIL_H
#define PULSE_NFT_CUT_TESTUTIL_H

#include "collab_testutil.h"

/* The exit status of a shell command; -1 when it could not run. */
static inline int ct_sh(const char *cmd) {
  int rc = system(cmd);
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

static inline int ct_nft_usable(void) {
  return geteuid() == 0 && ct_sh("nft list tables >/dev/null 2>&1") == 0;
}

/* This run's table for the test `what`. */
static inline void ct_nft_table(char *table, size_t size, const char *what) {
  snprintf(table, size, "pulse_collab_%s_%d", what, (int)getpid());
}

static inline unsigned ct_port_of(const ct_child *k) {
  const char *colon = strrchr(k->url, ':');
  return colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
}

/* Cuts each pair (pairs[j][0], pairs[j][1]) of ks, run as users uid_base +
 * id, from each other for cut_ms. */
static inline void ct_nft_cut(const char *table, const ct_child *ks,
                              uint32_t uid_base, const size_t (*pairs)[2],
                              size_t npairs, unsigned cut_ms) {
  char cmd[2048];
  int off = snprintf(cmd, sizeof cmd,
                     "nft add table inet %1$s && nft add chain inet %1$s out "
                     "'{ type filter hook output priority 0; }'",
                     table);
  for (size_t j = 0; j < npairs; j++) {
    const ct_child *a = &ks[pairs[j][0]], *b = &ks[pairs[j][1]];
    off += snprintf(cmd + off, sizeof cmd - (size_t)off,
                    " && nft add rule inet %1$s out meta skuid %2$u tcp dport "
                    "%3$u drop && nft add rule inet %1$s out meta skuid %4$u "
                    "tcp dport %5$u drop",
                    table, uid_base + a->id, ct_port_of(b), uid_base + b->id,
                    ct_port_of(a));
    cr_assert_lt((size_t)off, sizeof cmd, "nft: too many pairs");
  }
  cr_assert_eq(ct_sh(cmd), 0, "nft: %s", cmd);
  snprintf(cmd, sizeof cmd,
           "(sleep %u.%03u; nft delete table inet %s) >/dev/null 2>&1 &",
           cut_ms / 1000, cut_ms % 1000, table);
  cr_assert_eq(ct_sh(cmd), 0);
}

/* Ends every cut now (nothing when the table is gone already). */
static inline void ct_nft_heal(const char *table) {
  char cmd[160];
  snprintf(cmd, sizeof cmd, "nft delete table inet %s 2>/dev/null", table);
  ct_sh(cmd);
}

#endif
