/* bench_loco_collab_print.c - what `pulse-bench loco` in collaboration mode
 * prints per round (text or JSON), the bytes in over each peer's own
 * payload for the summary, and the --report folder. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_loco_collab_impl.h"
#include "cli_report.h"

void bench_loco_collab_print_rounds(const collab_bench *b, uint32_t last) {
  double cum = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    if (!w->have)
      continue;
    cum += (double)w->samples;
    if (!b->a.json) {
      printf("round %3u  samples %6" PRIu64
             "  peers %2u  contributors %2" PRIu64 "  writer %2" PRIu64
             "%s  t %7.2f s  loss %s",
             r, w->samples, w->members, w->contributors, w->writer,
             w->takeovers ? " (takeover)" : "", w->t_s, "");
      if (isnan(w->loss))
        printf("-\n");
      else
        printf("%.6f\n", w->loss);
      continue;
    }
    printf("{\"round\":%u,\"samples\":%" PRIu64 ",\"peers\":%u,"
           "\"contributors\":%" PRIu64 ",\"writer\":%" PRIu64
           ",\"takeovers\":%" PRIu64 ",\"by_exchange\":%u,\"t_s\":%.3f,"
           "\"samples_seen\":%.0f,",
           r, w->samples, w->members, w->contributors, w->writer, w->takeovers,
           w->by_exchange, w->t_s, cum);
    for (int dir = 0; dir < 3; dir++) {
      printf("\"%s\":{", dir == 2 ? "payload" : dir ? "bytes_out" : "bytes_in");
      int first = 1;
      for (uint32_t id = 1; id <= MAXP; id++)
        if (w->reported[id]) {
          printf("%s\"%u\":%" PRIu64, first ? "" : ",", id,
                 dir == 2 ? w->payload[id]
                 : dir    ? w->out[id]
                          : w->in[id]);
          first = 0;
        }
      printf("},");
    }
    if (isnan(w->loss))
      printf("\"loss\":null}\n");
    else
      printf("\"loss\":%.9g}\n", w->loss);
  }
}

in_ratios bench_loco_collab_ratios_of(const collab_bench *b, uint32_t last) {
  in_ratios q = {0, 0, 0, 0, 0};
  static double sum[MAXP + 1];
  static uint64_t n[MAXP + 1];
  memset(sum, 0, sizeof sum), memset(n, 0, sizeof n);
  double wsum = 0;
  uint64_t wn = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    for (uint32_t id = 1; id <= MAXP; id++) {
      if (!w->reported[id] || w->payload[id] == 0)
        continue;
      double x = (double)w->in[id] / (double)w->payload[id];
      if (id == w->writer) {
        wsum += x, wn++;
        continue;
      }
      sum[id] += x, n[id]++;
      q.mean += x, q.count++;
      q.worst_peer_round = x > q.worst_peer_round ? x : q.worst_peer_round;
    }
  }
  q.mean = q.count ? q.mean / (double)q.count : 0;
  q.writer = wn ? wsum / (double)wn : 0;
  for (uint32_t id = 1; id <= MAXP; id++)
    if (n[id] && sum[id] / (double)n[id] > q.worst_peer)
      q.worst_peer = sum[id] / (double)n[id];
  return q;
}

int bench_loco_collab_write_report(const collab_bench *b, uint32_t last,
                                   int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(b->a.report, "loco", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": report: %s\n", pulse_error_detail()), 1;
  static const char *const cols[] = {"round", "samples_seen", "loss", "peers",
                                     "t_s"};
  pulse_report_table *t = pulse_report_table_add(rep, "collab_rounds", cols, 5);
  double cum = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    if (!w->have)
      continue;
    cum += (double)w->samples;
    pulse_report_row(t);
    pulse_report_num(t, r);
    pulse_report_num(t, cum);
    pulse_report_num(t, w->loss);
    pulse_report_num(t, w->members);
    pulse_report_num(t, w->t_s);
  }
  static const char *const loss_col[] = {"loss"};
  static const char *const peers_col[] = {"peers"};
  pulse_report_chart_spec a = {PULSE_REPORT_LINE,
                               "collab_rounds",
                               "Held-out loss against samples seen",
                               "samples_seen",
                               "samples seen",
                               "held-out loss (nats)",
                               loss_col,
                               1,
                               0,
                               0};
  pulse_report_chart(rep, &a);
  pulse_report_chart_spec p = {PULSE_REPORT_LINE,
                               "collab_rounds",
                               "Peers over time",
                               "t_s",
                               "time (s)",
                               "peers in the round",
                               peers_col,
                               1,
                               0,
                               0};
  pulse_report_chart(rep, &p);
  char detail[256] = "";
  if (pulse_report_close(rep, detail, sizeof detail) != PULSE_OK)
    return fprintf(stderr, PROG ": report: %s\n", detail), 1;
  return 0;
}
