/* bench_loco_print.c - what `pulse-bench loco` prints per round (a JSON
 * object, or a table row: every method, or PULSELoCo alone with
 * --only-pulseloco), then the summary (bench_loco_summary.c). */
#include <inttypes.h>
#include <stdio.h>

#include "bench_loco_impl.h"

static double density(const bench *b, const round_row *w) {
  return w->reports ? (double)w->sent / ((double)w->reports * (double)b->P)
                    : 0.0;
}

static void print_round_json(const bench *b, uint32_t r) {
  const round_row *w = &b->rows[r];
  printf("{\"round\":%u", r);
  for (int m = 0; m < METHODS; m++)
    printf(",\"loss_%s\":%.6f", bench_loco_method[m].key, w->loss[m]);
  if (b->a.problem == PULSE_SIM_PROBLEM_TEXT_RL)
    for (int m = 0; m < METHODS; m++)
      printf(",\"reward_%s\":%.6f", bench_loco_method[m].key, w->reward[m]);
  for (int m = 0; m < METHODS; m++)
    printf(",\"bytes_%s\":%" PRIu64 ",\"wire_bytes_%s\":%" PRIu64,
           bench_loco_method[m].key, w->bytes[m], bench_loco_method[m].key,
           w->wire[m]);
  for (int m = 0; m < BASELINES; m++)
    printf(",\"message_bytes_%s\":%" PRIu64, bench_loco_method[m].key,
           w->message[m]);
  printf(",\"bytes_pulseloco_max_trainer\":%" PRIu64
         ",\"density\":%.5f,\"contributors\":%u,\"members\":%u"
         ",\"drift\":%.6g,\"ref_drift\":%.6g,\"replay_drift\":%.6g,"
         "\"resynced_ranges\":%" PRIu64 ",\"round_ms\":%" PRIu64
         ",\"exchange_ms\":%" PRIu64 "}\n",
         w->max_trainer[PULSELOCO], density(b, w), w->contributors, w->members,
         w->pair_measured ? w->pair_drift : -1.0, w->drift, w->replay_drift,
         w->resynced_ranges, w->round_ms, w->exchange_ms);
}

/* --only-pulseloco: PULSELoCo's columns alone (the baselines did not run),
 * with the exchange's drift and time. */
static void print_round_text_only(const bench *b, uint32_t r) {
  const round_row *w = &b->rows[r];
  if (r == 1)
    printf("round PULSELoCo-loss  bytes/trainer  density contrib  "
           "pair-drift  ref-drift  re-synced  round-ms\n");
  printf("%5u %14.5f %14" PRIu64 " %7.2f%% %3u/%-3u %11.3g %10.3g %10" PRIu64
         " %9" PRIu64 "\n",
         r, w->loss[PULSELOCO],
         w->bytes[PULSELOCO] / (w->reports ? w->reports : 1),
         100.0 * density(b, w), w->contributors, w->members,
         w->pair_measured ? w->pair_drift : -1.0, w->drift, w->resynced_ranges,
         w->round_ms);
}

static void print_round_text(const bench *b, uint32_t r) {
  if (b->a.only_pulseloco) {
    print_round_text_only(b, r);
    return;
  }
  const round_row *w = &b->rows[r];
  /* Text RL: the reward it optimizes, in the place of the loss. */
  int rl = b->a.problem == PULSE_SIM_PROBLEM_TEXT_RL;
  const double *q = rl ? w->reward : w->loss;
  if (r == 1)
    printf("      ------------ held-out %s ------------   ------ bytes "
           "sent per trainer (mean) ------\n"
           "round  DDP-FP32 DiLoCo-BF16 DiLoCo-FP32 PULSELoCo     DDP-FP32 "
           "DiLoCo-BF16 DiLoCo-FP32 PULSELoCo  density contrib\n",
           rl ? "reward" : "-loss-");
  uint32_t n[METHODS] = {b->a.trainers, b->a.trainers, b->a.trainers,
                         w->reports ? w->reports : 1};
  printf("%5u %9.5f %11.5f %11.5f %9.5f   %10" PRIu64 " %11" PRIu64
         " %11" PRIu64 " %9" PRIu64 " %7.2f%% %3u/%u\n",
         r, q[DDP_FP32], q[DILOCO_BF16], q[DILOCO_FP32], q[PULSELOCO],
         w->bytes[DDP_FP32] / n[DDP_FP32],
         w->bytes[DILOCO_BF16] / n[DILOCO_BF16],
         w->bytes[DILOCO_FP32] / n[DILOCO_FP32],
         w->bytes[PULSELOCO] / n[PULSELOCO], 100.0 * density(b, w),
         w->contributors, w->members);
}

void bench_loco_report(const bench *b, double seconds, int identical) {
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    if (b->a.json)
      print_round_json(b, r);
    else
      print_round_text(b, r);
  }
  totals t;
  bench_loco_sum_up(b, &t);
  if (b->a.json)
    bench_loco_print_summary_json(b, &t, seconds, identical);
  else
    bench_loco_print_summary_text(b, &t, seconds, identical);
}
