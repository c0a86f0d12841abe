/* bench_loco.c - `pulse-bench loco`: DDP, DiLoCo and PULSELoCo on the
 * built-in training problem (tools/sim/sim_problem.h), every method's
 * messages encoded and sent over HTTP on 127.0.0.1, and their bytes counted
 * as they went.
 *
 * PULSELoCo runs one process per trainer (pulse_loco_coord: payloads,
 * coordinator, manifest). The baselines run one process each, with their
 * trainers in turn inside it (tools/sim/sim_trainers.h): every trainer has its
 * own loco blob server and fetches every other trainer's message from it
 * (DDP: the FP32 gradient, every inner step; DiLoCo: the pseudo-gradient in
 * BF16, the reported baseline, and in FP32, every round). Every method's
 * losses are computed for real.
 *
 * Processes are forked before any of them starts a thread; each child
 * speaks to this parent through two pipes, one line per message:
 *   trainer -> parent  "url ID URL", "round R BYTES SENT CONTRIB MEMBERS
 *                      FETCHED RESYNCED LOSS REWARD", "done ID ROUND DIGEST",
 *                      "error TEXT"
 *   parent -> trainer  "start N ID URL ID URL ...", "join URL", "quit"
 *                      (every trainer is done or gone: end)
 *   baseline -> parent "init LOSS FLOOR P REWARD" (the first baseline
 *                      only), "arm R LOSS BYTES WIRE MAX_TRAINER
 *                      MAX_MESSAGE REWARD" (REWARD: text RL's held-out
 *                      reward, 0 for the other problems; -1 where a
 *                      trainer did not evaluate),
 *                      "error TEXT"
 *
 * This file: the methods and the run from the command line to the exit
 * status. The parts: bench_loco_args.c (the command line),
 * bench_loco_problem.c, bench_loco_baselines.c and bench_loco_trainer.c
 * (the children), bench_loco_parent.c and bench_loco_lines.c (forking and
 * reading them), bench_loco_print.c, bench_loco_summary.c and
 * bench_loco_report.c (the output); bench_loco_drift.c (drift over all
 * pairs). Collaboration mode is bench_loco_collab*.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_impl.h"
#include "bench_loco_impl.h"
#include "pulse_loco_coord.h"

/* In the order of the enum; --json keys and the child protocol use key. */
const bench_loco_method_info bench_loco_method[METHODS] = {
    {"ddp_fp32", "DDP-FP32", PULSE_SIM_DDP, PULSE_SIM_DENSE_FP32},
    {"diloco_bf16", "DiLoCo-BF16", PULSE_SIM_DILOCO, PULSE_SIM_DENSE_BF16},
    {"diloco_fp32", "DiLoCo-FP32", PULSE_SIM_DILOCO, PULSE_SIM_DENSE_FP32},
    {"pulseloco", "PULSELoCo", PULSE_SIM_PULSELOCO, PULSE_SIM_DENSE_FP32}};

/* Everyone that stayed to the end holds the same theta_g. */
static int replicas_identical(const bench *b) {
  int finished = 0;
  uint64_t digest = 0;
  for (size_t i = FIRST_TRAINER; i < b->nkids; i++) {
    if (!b->kids[i].done)
      return 0;
    if (b->kids[i].final_round == b->a.rounds) {
      if (finished++ && b->kids[i].digest != digest)
        return 0;
      digest = b->kids[i].digest;
    }
  }
  return finished > 0;
}

int bench_loco_main(int argc, char **argv) {
  /* Collaboration mode (issue 17): its own runner. */
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--target-batch") == 0 ||
        strcmp(argv[i], "--peer-speeds") == 0 ||
        strcmp(argv[i], "--churn") == 0 ||
        strcmp(argv[i], "--averaging") == 0 ||
        strcmp(argv[i], "--clients") == 0)
      return bench_loco_collab_main(argc, argv);
  static bench b; /* large: kept off the stack */
  memset(&b, 0, sizeof b);
  b.a = (loco_args){3,
                    50,
                    20,
                    2000,
                    70000,
                    1,
                    0.0,
                    0.0,
                    PULSE_LOCO_RULE_DROP,
                    -1,
                    -1,
                    0,
                    0,
                    NULL,
                    PULSE_LOCO_TRANSPORT_HTTP,
                    0.0,
                    1,
                    0.01,
                    {{{0}, {0}}},
                    0,
                    PULSE_SIM_PROBLEM_TEXT,
                    NULL,
                    -1,
                    PULSE_SIM_PARAM_SCALED,
                    0,
                    {NULL},
                    {{0, {0}}},
                    0};
  int rc = bench_loco_parse(argc, argv, &b.a);
  if (rc >= 0)
    return rc;
  uint64_t P = 0;
  if (bench_loco_check_problem(&b.a, &b.text_bytes, &b.text_digest, &P,
                               &b.pretrain_loss, &b.pretrain_steps,
                               &b.lr) != 0)
    return 1;
  /* Before any fork: every trainer writes its theta_g there. */
  bench_pair_drift_open(&b.pd, b.a.trainers + (b.a.join_round > 0), P);
  b.rows = calloc(b.a.rounds + 1u, sizeof *b.rows);
  if (b.rows == NULL)
    return fprintf(stderr, PROG ": out of memory\n"), 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int children_ok = bench_loco_run_all(&b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) +
                   1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  int complete = 1;
  for (int m = b.a.only_pulseloco ? PULSELOCO : 0; m < METHODS; m++)
    complete &= b.rows[b.a.rounds].have[m];
  if (!children_ok || b.failed || !complete) {
    fprintf(stderr, PROG ": the run did not complete\n");
    bench_pair_drift_close(&b.pd);
    free(b.rows);
    return 1;
  }
  int identical = replicas_identical(&b);
  bench_loco_report(&b, seconds, identical);
  bench_pair_drift_close(&b.pd);
  int report_rc =
      b.a.report != NULL ? bench_loco_write_report(&b, argc, argv) : 0;
  free(b.rows);
  /* A run that ends between re-syncs (rounds not a multiple of a period
   * above 1) ends with drifted replicas by design. */
  int between = b.a.transport == PULSE_LOCO_TRANSPORT_UDP &&
                b.a.resync_period > 1 && b.a.rounds % b.a.resync_period != 0;
  return (identical || between) && report_rc == 0 ? 0 : 1;
}
