/* bench_loco_collab_args.c - the command line of `pulse-bench loco` in
 * collaboration mode: its usage text (after the fixed-membership run's)
 * and the options. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_impl.h"
#include "bench_loco_collab_impl.h"

void bench_loco_collab_usage(FILE *out) {
  fprintf(out,
          "  collaboration mode (pulse_loco_collab.h; any of these flags):\n"
          "  --target-batch T   a round ends when the peers' samples reach T\n"
          "                     (the writer grants steps while below T)\n"
          "  --peer-speeds LIST samples per second of each peer, comma list "
          "(peer i\n"
          "                     gets LIST[i mod n]; 0 or none: "
          "unthrottled)\n"
          "  --churn SPEC       comma list of EVENT:ROUND, EVENT join, leave, "
          "kill\n"
          "                     (kill -9 of a random member, not the writer "
          "of that\n"
          "                     round or of the one before), kill-writer (of "
          "the\n"
          "                     writer of that round) or\n"
          "                     kill-finisher (of the first member to say it "
          "finished\n"
          "                     that round); events of one round combine "
          "(two\n"
          "                     failures: kill-writer:R,kill-finisher:R);\n"
          "                     partition (two members cut from each other "
          "for a\n"
          "                     round timeout and two claim timeouts, then "
          "healed:\n"
          "                     root and nft, each peer runs as its own "
          "user)\n"
          "  --averaging A      all-to-all (default) or partitioned (peers "
          "reduce\n"
          "                     disjoint ranges; same weights bit for bit)\n"
          "  --partition-check C  rotating (default: one range recomputed a "
          "round),\n"
          "                     full (every range every round) or receipts\n"
          "  --gate-mean        the outer step applies only the entries of "
          "the mean that\n"
          "                     2 peers sent or that pass the BF16 gate\n"
          "                     (pulse_loco_opts.gate_mean; the rest waits in "
          "its\n"
          "                     senders' error feedback); the default with\n"
          "                     --averaging partitioned\n"
          "  --no-gate-mean     every entry of the mean applied (the default "
          "all-to-all)\n"
          "  --no-auth          peers neither sign nor check (by default each "
          "signs\n"
          "                     the views, states, manifests, payloads and "
          "partitioned\n"
          "                     blobs it serves and checks those it loads, "
          "every\n"
          "                     peer's key pinned, and signs its claims "
          "and answers)\n"
          "  --trainers N       founding peers (default: the speeds given, "
          "else 3)\n"
          "  --clients K        the last K founders are client-mode peers "
          "(behind NAT:\n"
          "                     they listen nowhere and upload their payload "
          "to a\n"
          "                     serving founder, round robin; partitioned, "
          "they own\n"
          "                     no range)\n"
          "  --ranges R         partitioned range sizes: bandwidth (default: "
          "in\n"
          "                     proportion to each peer's measured download "
          "rate)\n"
          "                     or equal\n"
          "  --netns N=A,...    peer i runs in network namespace N_((i-1) mod "
          "k)\n"
          "                     (made by `ip netns add`) and listens on its "
          "address A\n"
          "                     (root; throttle a link with tc there)\n"
          "  --claim-timeout-ms M  a writer that does not answer this long "
          "is taken\n"
          "                     for dead, the next takes over (default 1500)\n"
          "  --round-timeout-ms M  how long a ready writer waits for the other "
          "members\n"
          "                     to be ready (default 5000)\n"
          "  --rounds R --seed S --params P --json --report DIR as above\n");
}

static int bad(const char *what, const char *v) {
  fprintf(stderr, PROG ": %s '%s'\n", what, v ? v : "(missing)");
  return 2;
}

static int parse_u(const char *v, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (v == NULL || *v < '0' || *v > '9')
    return 0;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    return 0;
  *out = x;
  return 1;
}

int bench_loco_collab_parse(int argc, char **argv, collab_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t x;
    if (strcmp(f, "--json") == 0) {
      a->json = 1;
      continue;
    }
    if (strcmp(f, "--no-auth") == 0) {
      a->no_auth = 1;
      continue;
    }
    if (strcmp(f, "--gate-mean") == 0 || strcmp(f, "--no-gate-mean") == 0) {
      a->gate_mean = strcmp(f, "--gate-mean") == 0;
      continue;
    }
    i++;
    if (strcmp(f, "--target-batch") == 0) {
      if (!parse_u(v, 1, 1ull << 40, &a->target))
        return bad("--target-batch wants a count >= 1, not", v);
    } else if (strcmp(f, "--rounds") == 0) {
      if (!parse_u(v, 1, MAXR - 1, &x))
        return bad("--rounds wants 1..999, not", v);
      a->rounds = (uint32_t)x;
    } else if (strcmp(f, "--trainers") == 0) {
      if (!parse_u(v, 1, MAXP, &x))
        return bad("--trainers wants 1..32, not", v);
      a->trainers = (uint32_t)x;
    } else if (strcmp(f, "--seed") == 0) {
      if (!parse_u(v, 0, UINT64_MAX, &a->seed))
        return bad("--seed wants a number, not", v);
    } else if (strcmp(f, "--params") == 0) {
      if (!parse_u(v, 100, 1ull << 26, &a->params))
        return bad("--params wants 100..2^26, not", v);
    } else if (strcmp(f, "--claim-timeout-ms") == 0) {
      if (!parse_u(v, 1, 600000, &x))
        return bad("--claim-timeout-ms wants 1..600000, not", v);
      a->claim_ms = (uint32_t)x;
    } else if (strcmp(f, "--round-timeout-ms") == 0) {
      if (!parse_u(v, 1, 600000, &x))
        return bad("--round-timeout-ms wants 1..600000, not", v);
      a->round_ms = (uint32_t)x;
    } else if (strcmp(f, "--report") == 0) {
      if (v == NULL)
        return bad("--report wants a directory, not", v);
      a->report = v;
    } else if (strcmp(f, "--averaging") == 0) {
      if (v != NULL && strcmp(v, "all-to-all") == 0) {
        a->partitioned = 0;
        continue;
      }
      if (v != NULL && strcmp(v, "partitioned") == 0) {
        a->partitioned = 1;
        continue;
      }
      return bad("--averaging wants all-to-all or partitioned, not", v);
    } else if (strcmp(f, "--partition-check") == 0) {
      static const char *const names[] = {"rotating", "full", "receipts"};
      uint32_t k = 0;
      while (k < 3 && (v == NULL || strcmp(v, names[k]) != 0))
        k++;
      if (k == 3)
        return bad("--partition-check wants rotating, full or receipts, not",
                   v);
      a->check = k;
    } else if (strcmp(f, "--ranges") == 0) {
      if (v == NULL || (strcmp(v, "bandwidth") && strcmp(v, "equal")))
        return bad("--ranges wants bandwidth or equal, not", v);
      a->equal_ranges = strcmp(v, "equal") == 0;
    } else if (strcmp(f, "--netns") == 0) {
      if (v == NULL ||
          pulse_sim_netns_parse(v, a->netns, MAXP, &a->nnetns) != 0)
        return bad("--netns wants NAME=A.B.C.D,..., not", v);
    } else if (strcmp(f, "--clients") == 0) {
      if (!parse_u(v, 0, MAXP - 1, &x))
        return bad("--clients wants 0..31, not", v);
      a->clients = (uint32_t)x;
    } else if (strcmp(f, "--peer-speeds") == 0) {
      if (v == NULL)
        return bad("--peer-speeds wants a comma list, not", v);
      char copy[1024];
      snprintf(copy, sizeof copy, "%s", v);
      a->nspeeds = 0;
      for (char *t = strtok(copy, ","); t; t = strtok(NULL, ",")) {
        char *end;
        double s = strtod(t, &end);
        if (*end || !(s >= 0 && s < 1e12) || a->nspeeds == MAXP)
          return bad("--peer-speeds wants samples/s >= 0, not", t);
        a->speeds[a->nspeeds++] = s;
      }
    } else if (strcmp(f, "--churn") == 0) {
      if (v == NULL)
        return bad("--churn wants EVENT:ROUND,..., not", v);
      char copy[1024];
      snprintf(copy, sizeof copy, "%s", v);
      for (char *t = strtok(copy, ","); t; t = strtok(NULL, ",")) {
        char *colon = strchr(t, ':');
        if (colon == NULL || a->nev == MAXEV)
          return bad("--churn event must be EVENT:ROUND, not", t);
        *colon = '\0';
        if (strcmp(t, "join") && strcmp(t, "leave") && strcmp(t, "kill") &&
            strcmp(t, "kill-writer") && strcmp(t, "kill-finisher") &&
            strcmp(t, "partition"))
          return bad("--churn event must be join, leave, kill, kill-writer, "
                     "kill-finisher or partition, not",
                     t);
        if (strcmp(t, "partition") == 0)
          a->uid_base = BENCH_CUT_UID_BASE; /* packets told apart by user */
        if (!parse_u(colon + 1, 1, MAXR - 1, &x))
          return bad("--churn round must be 1..999, not", colon + 1);
        snprintf(a->ev[a->nev].kind, sizeof a->ev[a->nev].kind, "%s", t);
        a->ev[a->nev].round = (uint32_t)x;
        a->nev++;
      }
    } else {
      return bad("unknown option (collaboration mode; see --help)", f);
    }
  }
  if (a->trainers == 0)
    a->trainers = a->nspeeds ? a->nspeeds : 3;
  if (a->gate_mean < 0)
    a->gate_mean = a->partitioned;
  if (a->uid_base != 0 && a->nnetns > 0) {
    fprintf(stderr, PROG ": --churn partition does not go with --netns\n");
    return 2;
  }
  if (a->clients >= a->trainers) {
    fprintf(stderr,
            PROG ": --clients %u wants fewer than the %u founders "
                 "(at least one serves)\n",
            a->clients, a->trainers);
    return 2;
  }
  return -1;
}
