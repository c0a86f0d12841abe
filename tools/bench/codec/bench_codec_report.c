/* bench_codec_report.c - each step recorded (summary, --report's row, the
 * printed step) and the --report folder of `pulse-bench codec`: the steps'
 * table, bytes per changed weight by encoding, their charts. */
#include <stdio.h>
#include <string.h>

#include "bench_codec_impl.h"
#include "cli_report.h"

/* The baselines' cells of a report row, in report_cols' order (after the
 * bound): dense raw, its zstd levels, int32 raw, its levels, the gap ones. */
static void report_baselines(pulse_report_table *rt,
                             const bench_baseline_bytes *b) {
  for (int k = 0; k < BENCH_ZKINDS; k++) {
    if (k == BENCH_DENSE_Z)
      pulse_report_num(rt, (double)b->dense);
    if (k == BENCH_INT32_Z)
      pulse_report_num(rt, (double)b->int32_bf16);
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++)
      pulse_report_num(rt, (double)b->zstd[k][l]);
  }
}

void bench_codec_report_step(const codec_args *a, summary *s,
                             const step_result *r) {
  bench_codec_summary_add(s, r);
  if (a->rt != NULL) {
    const double v[] = {
        (double)r->step,
        (double)r->changed,
        100.0 * bench_codec_per((double)r->changed, (double)r->params),
        (double)r->bytes[0],
        (double)r->bytes[1],
        (double)r->bytes[2],
        (double)r->bytes[3],
        (double)r->bytes[4],
        bench_codec_bound_bytes(&r->ent)};
    pulse_report_row(a->rt);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
      pulse_report_num(a->rt, v[i]);
    report_baselines(a->rt, &r->base);
    *a->rep_sum = *s;
  }
  if (a->json)
    bench_codec_print_step_json(r);
  else
    bench_codec_print_step_text(r);
  fflush(stdout);
}

static const char *const report_cols[] = {"step",
                                          "changed",
                                          "density_pct",
                                          "v2_class",
                                          "v2_plain",
                                          "v1_class",
                                          "v1_plain",
                                          "v3_class",
                                          "entropy_bound",
                                          "dense_bf16",
                                          "dense_zstd1",
                                          "dense_zstd3",
                                          "dense_zstd19",
                                          "int32_bf16",
                                          "int32_bf16_zstd1",
                                          "int32_bf16_zstd3",
                                          "int32_bf16_zstd19",
                                          "gap_abs_zstd1",
                                          "gap_abs_zstd3",
                                          "gap_abs_zstd19",
                                          "gap_xor_zstd1",
                                          "gap_xor_zstd3",
                                          "gap_xor_zstd19"};
#define REPORT_COLS (sizeof report_cols / sizeof report_cols[0])

/* Runs the benchmark collecting --report tables, then writes the report. */
int bench_codec_run_with_report(codec_args *a, int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(a->report, "codec", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: cannot make %s\n", a->report), 1;
  summary sum;
  memset(&sum, 0, sizeof sum);
  a->rep_sum = &sum;
  a->rt = pulse_report_table_add(rep, "steps", report_cols, REPORT_COLS);
  int rc = a->snapshots != NULL ? bench_codec_run_snapshots(a)
                                : bench_codec_run_synthetic(a);
  /* B/changed over the whole run, one row per encoding (steps columns 3..) */
  static const char *const pc_cols[] = {"encoding", "bytes_per_changed"};
  pulse_report_table *pc =
      pulse_report_table_add(rep, "per_changed", pc_cols, 2);
  const step_result *t = &sum.sum;
  const bench_baseline_bytes *b = &t->base;
  const double tot[] = {(double)t->bytes[0],
                        (double)t->bytes[1],
                        (double)t->bytes[2],
                        (double)t->bytes[3],
                        (double)t->bytes[4],
                        bench_codec_bound_bytes(&t->ent),
                        (double)b->dense,
                        (double)b->zstd[BENCH_DENSE_Z][0],
                        (double)b->zstd[BENCH_DENSE_Z][1],
                        (double)b->zstd[BENCH_DENSE_Z][2],
                        (double)b->int32_bf16,
                        (double)b->zstd[BENCH_INT32_Z][0],
                        (double)b->zstd[BENCH_INT32_Z][1],
                        (double)b->zstd[BENCH_INT32_Z][2],
                        (double)b->zstd[BENCH_GAP_ABS_Z][0],
                        (double)b->zstd[BENCH_GAP_ABS_Z][1],
                        (double)b->zstd[BENCH_GAP_ABS_Z][2],
                        (double)b->zstd[BENCH_GAP_XOR_Z][0],
                        (double)b->zstd[BENCH_GAP_XOR_Z][1],
                        (double)b->zstd[BENCH_GAP_XOR_Z][2]};
  for (size_t i = 0; i < sizeof tot / sizeof tot[0]; i++) {
    pulse_report_row(pc);
    pulse_report_text(pc, report_cols[3 + i]);
    pulse_report_num(pc, bench_codec_per(tot[i], (double)t->changed));
  }
  static const char *const density[] = {"density_pct"};
  static const char *const pcy[] = {"bytes_per_changed"};
  pulse_report_chart_spec c1 = {PULSE_REPORT_LINE,
                                "steps",
                                "Density: share of weights changed per step",
                                "step",
                                "optimizer step",
                                "changed weights (% of parameters)",
                                density,
                                1,
                                0,
                                0};
  pulse_report_chart_spec c2 = {PULSE_REPORT_LINE,
                                "steps",
                                "Bytes per step by encoding",
                                "step",
                                "optimizer step",
                                "bytes per step (B)",
                                report_cols + 3,
                                REPORT_COLS - 3,
                                0,
                                1};
  pulse_report_chart_spec c3 = {
      PULSE_REPORT_BAR,
      "per_changed",
      "Bytes per changed weight by encoding (whole run)",
      "encoding",
      "encoding",
      "bytes per changed weight (B)",
      pcy,
      1,
      0,
      1};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2),
      pulse_report_chart(rep, &c3);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: %s\n", why);
    rc = 1;
  }
  return rc;
}
