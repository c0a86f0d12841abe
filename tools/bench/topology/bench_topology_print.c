/* bench_topology_print.c - what `pulse-bench topology` prints: a line per
 * round (text) or a JSON object per arm and round, one summary per arm, and
 * the --report folder (CSV tables, report.html with variance and loss
 * against rounds for every arm). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "bench_topology_impl.h"
#include "cli_report.h"

/* A double as JSON: null when not finite. */
static void json_num(const char *key, double v, int comma) {
  if (isfinite(v))
    printf("%s\"%s\":%.6g", comma ? "," : "", key, v);
  else
    printf("%s\"%s\":null", comma ? "," : "", key);
}

void topo_print_round(const topo_args *a, const topo_result *r, uint32_t t) {
  const topo_row *w = &r->rows[t];
  if (a->json) {
    printf("{\"arm\":\"%s\",\"round\":%u", topo_arm_name[r->arm], t);
    json_num("variance", w->variance, 1);
    json_num("predicted_variance", w->predicted, 1);
    json_num("noise", w->noise, 1);
    json_num("consensus_distance", w->consensus, 1);
    json_num("loss", w->loss, 1);
    json_num("bytes_per_node", w->bytes_per_node, 1);
    printf(",\"degree\":%u,\"steps\":%u", w->degree, w->steps);
    if (r->reason && r->reason[t]) {
      /* The policy's log: what it was told, what it chose and why. */
      const pulse_gossip_decision *d = &r->decision[t];
      printf(",\"decision\":\"%s\",\"graph\":\"one-peer steps on "
             "dimensions", r->reason[t]);
      for (uint32_t k = 0; k < d->steps; k++)
        printf("%s%u", k ? "," : " ",
               (d->first_dim + k) % (uint32_t)log2((double)a->nodes));
      printf("\"");
      json_num("measured_variance", d->measured, 1);
      json_num("target", d->target, 1);
    }
    printf("}\n");
    return;
  }
  if (t == 0)
    printf("\n%s\nround   variance  predicted  consensus     loss  "
           "bytes/node  degree\n",
           topo_arm_name[r->arm]);
  printf("%5u %10.4g %10.4g %10.4g %8.5f %11.0f %7u%s%s\n", t, w->variance,
         w->predicted, w->consensus, w->loss, w->bytes_per_node, w->degree,
         r->reason && r->reason[t] ? "  " : "",
         r->reason && r->reason[t] ? r->reason[t] : "");
}

static const topo_result *find(const topo_result *res, int count,
                               topo_arm arm) {
  for (int k = 0; k < count; k++)
    if (res[k].arm == arm)
      return &res[k];
  return NULL;
}

void topo_print_summaries(const topo_args *a, const topo_result *res,
                          int count) {
  const topo_result *full = find(res, count, ARM_COMPLETE);
  if (!a->json)
    printf("\narm          variance  predicted  measured/pred  bytes/node  "
           "final_loss  mean_degree  seconds\n");
  for (int k = 0; k < count; k++) {
    const topo_summary *m = &res[k].sum;
    /* The complete graph predicts 0 (to rounding): no ratio. */
    double ratio = m->predicted > 1e-6 * m->variance ? m->variance / m->predicted
                                                     : NAN;
    if (a->json) {
      printf("{\"summary\":true,\"arm\":\"%s\"", topo_arm_name[res[k].arm]);
      json_num("variance", m->variance, 1);
      json_num("predicted_variance", m->predicted, 1);
      json_num("bytes_per_node", m->bytes_per_node, 1);
      json_num("final_loss", m->final_loss, 1);
      json_num("mean_degree", m->mean_degree, 1);
      printf(",\"nodes\":%u,\"rounds\":%u,\"digest\":\"%016llx\"", a->nodes,
             a->rounds, (unsigned long long)res[k].digest);
      if (full) {
        json_num("variance_vs_complete", m->variance / full->sum.variance, 1);
        json_num("bytes_vs_complete",
                 m->bytes_per_node / full->sum.bytes_per_node, 1);
        json_num("loss_vs_complete", m->final_loss / full->sum.final_loss, 1);
      }
      printf("}\n");
    } else {
      printf("%-11s %10.4g %10.4g %14.3f %11.0f %11.5f %12.2f %8.1f\n",
             topo_arm_name[res[k].arm], m->variance, m->predicted, ratio,
             m->bytes_per_node, m->final_loss, m->mean_degree, m->seconds);
    }
  }
  if (!a->json)
    for (int k = 0; k < count; k++)
      printf("digest %-11s %016llx\n", topo_arm_name[res[k].arm],
             (unsigned long long)res[k].digest);
}

int topo_write_report(const topo_args *a, const topo_result *res, int count,
                      int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(a->report, "topology", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, TOPO_PROG ": --report: cannot make %s\n", a->report),
           1;
  /* One table per figure, a column per arm, so each chart is one table. */
  static const char *const what[] = {"variance", "loss", "bytes_per_node",
                                     "consensus_distance"};
  static const char *const ylabel[] = {
      "replica variance / mean squared parameter", "held-out loss (nats)",
      "payload bytes sent per node", "consensus distance (L2)"};
  const char *cols[ARM_COUNT + 1];
  cols[0] = "round";
  for (int k = 0; k < count; k++)
    cols[k + 1] = topo_arm_name[res[k].arm];
  for (int f = 0; f < 4; f++) {
    pulse_report_table *t =
        pulse_report_table_add(rep, what[f], cols, (size_t)count + 1);
    for (uint32_t r = 0; r < a->rounds; r++) {
      pulse_report_row(t);
      pulse_report_num(t, r);
      for (int k = 0; k < count; k++) {
        const topo_row *w = &res[k].rows[r];
        double v = f == 0 ? w->variance : f == 1 ? w->loss
                          : f == 2 ? w->bytes_per_node : w->consensus;
        pulse_report_num(t, v);
      }
    }
    char title[96];
    snprintf(title, sizeof title, "%s per round, every arm", what[f]);
    pulse_report_chart_spec c = {PULSE_REPORT_LINE, what[f], title, "round",
                                 "round", ylabel[f], cols + 1, (size_t)count,
                                 0, f == 0 || f == 3};
    pulse_report_chart(rep, &c);
  }
  static const char *const scols[] = {"arm", "variance", "predicted_variance",
                                      "bytes_per_node", "final_loss",
                                      "mean_degree"};
  pulse_report_table *st = pulse_report_table_add(rep, "summary", scols, 6);
  for (int k = 0; k < count; k++) {
    const topo_summary *m = &res[k].sum;
    pulse_report_row(st);
    pulse_report_text(st, topo_arm_name[res[k].arm]);
    pulse_report_num(st, m->variance);
    pulse_report_num(st, m->predicted);
    pulse_report_num(st, m->bytes_per_node);
    pulse_report_num(st, m->final_loss);
    pulse_report_num(st, m->mean_degree);
  }
  static const char *const bar_y[] = {"variance", "predicted_variance"};
  pulse_report_chart_spec b = {PULSE_REPORT_BAR, "summary",
                               "Variance over the last half, measured and "
                               "predicted", "arm", "arm",
                               "replica variance / mean squared parameter",
                               bar_y, 2, 0, 1};
  pulse_report_chart(rep, &b);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK)
    return fprintf(stderr, TOPO_PROG ": --report: %s\n", why), 1;
  return 0;
}
