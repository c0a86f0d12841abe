/* bench_serve_print.c - what `pulse-bench serve` writes of its results:
 * one JSON object (--json) and the --report folder (a table and a chart per
 * benchmark). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>

#include "bench_serve_impl.h"
#include "cli_report.h"

void bench_serve_json(const serve_args *a, const serve_results *res) {
  const tp_result *pulse_tp = res->pulse_tp, *nginx_tp = res->nginx_tp;
  const poll_result *nr = &res->notify_r, *wr = &res->watch_r;
  const commit_result *cr = &res->cr;
  printf(
      "{\"mode\":\"serve\",\"throughput\":{\"object_mib\":%" PRIu64
      ",\"objects\":%d,"
      "\"seconds\":%.3f,\"rounds\":%d,\"workers\":%d,\"nginx\":%s,\"runs\":[",
      a->object_mb, a->objects, a->seconds, a->rounds, res->workers,
      res->have_nginx ? "true" : "false");
  for (int c = 0; !a->skip_throughput && c < a->nclients; c++) {
    printf("%s{\"clients\":%d,\"pulse_mbps\":%.1f,\"pulse_errors\":%d",
           c ? "," : "", a->clients[c], pulse_tp[c].mbps, pulse_tp[c].errors);
    if (res->have_nginx)
      printf(",\"nginx_mbps\":%.1f,\"nginx_errors\":%d,\"ratio\":%.3f",
             nginx_tp[c].mbps, nginx_tp[c].errors,
             nginx_tp[c].mbps > 0 ? pulse_tp[c].mbps / nginx_tp[c].mbps : 0);
    printf("}");
  }
  printf("]},\"longpoll\":{\"polls\":%d,\"notify_median_ms\":%.3f,\"notify_"
         "p90_ms\":%.3f,"
         "\"notify_max_ms\":%.3f,\"notify_from_hook_median_ms\":%.3f,\"watch_"
         "median_ms\":%.3f,"
         "\"watch_p90_ms\":%.3f,\"watch_max_ms\":%.3f,\"errors\":%d},",
         a->polls, nr->median_ms, nr->p90_ms, nr->max_ms, nr->hook_median_ms,
         wr->median_ms, wr->p90_ms, wr->max_ms, nr->errors + wr->errors);
  printf("\"commit\":{\"params\":%" PRIu64
         ",\"steps\":%d,\"bare_median_s\":%.6f,"
         "\"commit_median_s\":%.6f,\"write_median_s\":%.6f,"
         "\"ratio_of_medians\":%.4f,\"ratio_median\":%.4f,"
         "\"ratio_max\":%.4f,\"anchor_steps_ratio_max\":%.4f}}\n",
         cr->params, cr->steps, cr->bare_median_s, cr->commit_median_s,
         cr->write_median_s,
         cr->bare_median_s > 0 ? cr->commit_median_s / cr->bare_median_s : 0,
         cr->ratio_median, cr->ratio_max, cr->anchor_steps_ratio_max);
}

/* --report DIR: the three tables and their charts. 0 or 1. */
int bench_serve_report(const serve_args *a, int argc, char **argv,
                       const serve_results *res) {
  pulse_report *rep = NULL;
  if (pulse_report_create(a->report, "serve", argc, argv, &rep) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: cannot make %s\n", a->report);
    return 1;
  }
  int have_nginx = res->have_nginx;
  static const char *const tcols[] = {"clients", "pulse_MBps", "nginx_MBps",
                                      "pulse_errors", "nginx_errors"};
  pulse_report_table *tt = pulse_report_table_add(rep, "throughput", tcols, 5);
  for (int c = 0; !a->skip_throughput && c < a->nclients; c++) {
    pulse_report_row(tt);
    pulse_report_num(tt, a->clients[c]);
    pulse_report_num(tt, res->pulse_tp[c].mbps);
    pulse_report_num(tt, have_nginx ? res->nginx_tp[c].mbps : NAN);
    pulse_report_num(tt, res->pulse_tp[c].errors);
    pulse_report_num(tt, have_nginx ? res->nginx_tp[c].errors : NAN);
  }
  if (!a->skip_throughput && !have_nginx)
    pulse_report_note(rep,
                      "nginx not found: throughput measured for pulse only");
  static const char *const lcols[] = {"server", "median_ms", "p90_ms",
                                      "max_ms"};
  pulse_report_table *lt = pulse_report_table_add(rep, "longpoll", lcols, 4);
  const poll_result *pr[2] = {&res->notify_r, &res->watch_r};
  static const char *const pname[2] = {"notify (hook)", "watch (inotify)"};
  for (int k = 0; !a->skip_poll && k < 2; k++) {
    pulse_report_row(lt);
    pulse_report_text(lt, pname[k]);
    pulse_report_num(lt, pr[k]->median_ms);
    pulse_report_num(lt, pr[k]->p90_ms);
    pulse_report_num(lt, pr[k]->max_ms);
  }
  static const char *const ccols[] = {"params",           "bare_median_ms",
                                      "commit_median_ms", "write_median_ms",
                                      "ratio_median",     "ratio_max"};
  pulse_report_table *ct = pulse_report_table_add(rep, "commit", ccols, 6);
  if (!a->skip_commit) {
    const commit_result *cr = &res->cr;
    const double v[] = {(double)cr->params,        cr->bare_median_s * 1e3,
                        cr->commit_median_s * 1e3, cr->write_median_s * 1e3,
                        cr->ratio_median,          cr->ratio_max};
    pulse_report_row(ct);
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
      pulse_report_num(ct, v[k]);
  }
  pulse_report_chart_spec c1 = {
      PULSE_REPORT_BAR,
      "throughput",
      "Serving throughput per client count: pulse vs nginx",
      "clients",
      "concurrent clients",
      "throughput (MB/s)",
      tcols + 1,
      2,
      0,
      0};
  pulse_report_chart_spec c2 = {
      PULSE_REPORT_BAR,
      "longpoll",
      "Long-poll wake-up latency: rename of head.json to client",
      "server",
      "server",
      "latency (ms)",
      lcols + 1,
      3,
      0,
      0};
  pulse_report_chart_spec c3 = {PULSE_REPORT_BAR,
                                "commit",
                                "Commit vs bare encoder (median)",
                                "params",
                                "parameters",
                                "time per step (ms)",
                                ccols + 1,
                                3,
                                0,
                                0};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2),
      pulse_report_chart(rep, &c3);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: %s\n", why);
    return 1;
  }
  return 0;
}
