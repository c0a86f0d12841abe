/* bench_loco_report.c - the --report folder of `pulse-bench loco`: the
 * rounds' losses and bytes on the wire per method (text RL: and held-out
 * rewards), with their charts. */
#include <stdio.h>

#include "bench_loco_impl.h"
#include "cli_report.h"

/* --report: the rows bench_loco_report() printed, as a table and charts. */
int bench_loco_write_report(const bench *b, int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(b->a.report, "loco", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: cannot make %s\n", b->a.report), 1;
  static const char *const cols[] = {"round",
                                     "loss_DDP-FP32",
                                     "loss_DiLoCo-BF16",
                                     "loss_DiLoCo-FP32",
                                     "loss_PULSELoCo",
                                     "wire_bytes_DDP-FP32",
                                     "wire_bytes_DiLoCo-BF16",
                                     "wire_bytes_DiLoCo-FP32",
                                     "wire_bytes_PULSELoCo",
                                     "cumulative_wire_bytes_DDP-FP32",
                                     "cumulative_wire_bytes_DiLoCo-BF16",
                                     "cumulative_wire_bytes_DiLoCo-FP32",
                                     "cumulative_wire_bytes_PULSELoCo"};
  pulse_report_table *t = pulse_report_table_add(rep, "rounds", cols, 13);
  double cum[METHODS] = {0};
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    const round_row *w = &b->rows[r];
    pulse_report_row(t);
    pulse_report_num(t, r);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, w->loss[m]);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, (double)w->wire[m]);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, cum[m] += (double)w->wire[m]);
  }
  pulse_report_chart_spec c1 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Cumulative bytes on the wire, all trainers",
                                "round",
                                "round",
                                "cumulative bytes (B)",
                                cols + 9,
                                METHODS,
                                0,
                                1};
  pulse_report_chart_spec c2 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Held-out loss per round",
                                "round",
                                "round",
                                "loss (nats)",
                                cols + 1,
                                METHODS,
                                0,
                                0};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2);
  if (b->a.problem == PULSE_SIM_PROBLEM_TEXT_RL) {
    static const char *const rcols[] = {"round", "reward_DDP-FP32",
                                        "reward_DiLoCo-BF16",
                                        "reward_DiLoCo-FP32",
                                        "reward_PULSELoCo"};
    pulse_report_table *rt = pulse_report_table_add(rep, "rewards", rcols, 5);
    for (uint32_t r = 1; r <= b->a.rounds; r++) {
      pulse_report_row(rt);
      pulse_report_num(rt, r);
      for (int m = 0; m < METHODS; m++)
        pulse_report_num(rt, b->rows[r].reward[m]);
    }
    pulse_report_chart_spec c3 = {PULSE_REPORT_LINE,
                                  "rewards",
                                  "Held-out expected reward per round",
                                  "round",
                                  "round",
                                  "reward (matching bytes)",
                                  rcols + 1,
                                  METHODS,
                                  0,
                                  0};
    pulse_report_chart(rep, &c3);
  }
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: %s\n", why), 1;
  return 0;
}
