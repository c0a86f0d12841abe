/* bench_sync_print.c - the output of `pulse-bench sync`: medians over a
 * link's steps, the table or the JSON lines, and the report (--report). */
#include <inttypes.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench_sync_impl.h"

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median_of(const bs_sample *s, size_t n, size_t off) {
  double v[256];
  for (size_t i = 0; i < n; i++)
    v[i] = *(const double *)((const char *)&s[i] + off);
  qsort(v, n, sizeof v[0], cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static uint64_t median_u64(const bs_sample *s, size_t n, size_t off) {
  double v[256];
  for (size_t i = 0; i < n; i++)
    v[i] = (double)*(const uint64_t *)((const char *)&s[i] + off);
  qsort(v, n, sizeof v[0], cmp_double);
  return (uint64_t)(n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

/* Median of a figure that a step may lack (-1): -1 when any step does. */
static double median_opt(const bs_sample *s, size_t n, size_t off) {
  for (size_t i = 0; i < n; i++)
    if (*(const double *)((const char *)&s[i] + off) < 0)
      return -1;
  return median_of(s, n, off);
}

/* Medians of the steps. */
void bs_figures_of(const bs_sample *s, size_t n, bs_figures *f) {
  f->end_to_end = median_of(s, n, offsetof(bs_sample, end_to_end));
  f->commit = median_of(s, n, offsetof(bs_sample, commit));
  f->sync = median_of(s, n, offsetof(bs_sample, seconds));
  f->seen = median_of(s, n, offsetof(bs_sample, seen));
  f->worker_sync = median_of(s, n, offsetof(bs_sample, worker_sync));
  f->transfer = median_of(s, n, offsetof(bs_sample, transfer));
  f->verify = median_of(s, n, offsetof(bs_sample, verify));
  f->decode = median_of(s, n, offsetof(bs_sample, decode));
  f->apply = median_of(s, n, offsetof(bs_sample, apply));
  f->overlap = median_opt(s, n, offsetof(bs_sample, overlap));
  f->write = median_opt(s, n, offsetof(bs_sample, write));
  f->bytes_pulse = median_u64(s, n, offsetof(bs_sample, bytes));
  f->patch_bytes = median_u64(s, n, offsetof(bs_sample, patch_bytes));
  f->changed = median_u64(s, n, offsetof(bs_sample, changed));
  f->steps = n;
  f->peak_extra = 0;
  for (size_t i = 0; i < n; i++)
    if (s[i].peak_extra > f->peak_extra)
      f->peak_extra = s[i].peak_extra;
  f->class_index = n > 0 ? s[n - 1].class_index : 0;
}

static double bs_ratio(double baseline, double x) {
  return baseline > 0 && x > 0 ? baseline / x : 0;
}

/* ,"key":v or ,"key":null when v < 0 (not measured). */
static void bs_json_opt(const char *key, double v) {
  if (v < 0)
    printf(",\"%s\":null", key);
  else
    printf(",\"%s\":%.6f", key, v);
}

static const char *bs_targets_name(const bs_run *r, bs_worker w) {
  return w != BS_WORKER_HOST ? "file" : r->a->device ? "device" : "host";
}

static void bs_print_json(const bs_run *r, const bs_link *lk,
                          const bs_figures *f) {
  const bs_args *a = r->a;
  int limited = lk->rate[0] != '\0';
  double local = f->sync - f->transfer;
  printf("{\"params\":%" PRIu64
         ",\"density\":%.6f,\"link\":\"%s\",\"link_bits_per_s\":%.0f"
         ",\"worker\":\"%s\""
         ",\"bytes_dense\":%" PRIu64 ",\"bytes_pulse\":%" PRIu64
         ",\"patch_bytes\":%" PRIu64 ",\"seconds_dense\":%.6f"
         ",\"dense_what\":\"transfer of the whole BF16 checkpoint only\""
         ",\"dense_extrapolated\":%s,\"dense_sample_bytes\":%" PRIu64
         ",\"dense_object_bytes\":%" PRIu64 ",\"seconds_dense_sample\":%.6f"
         ",\"seconds_commit\":%.6f,\"seconds_pulse\":%.6f"
         ",\"seconds_end_to_end\":%.6f"
         ",\"ratio_bytes_vs_dense_bf16\":%.2f"
         ",\"ratio_sync_vs_dense_transfer\":%.2f"
         ",\"ratio_end_to_end_vs_dense_transfer\":%.2f"
         ",\"transfer_s\":%.6f,\"verify_s\":%.6f"
         ",\"decode_s\":%.6f,\"apply_s\":%.6f",
         r->m.total, (double)f->changed / (double)r->m.total, lk->name,
         limited ? bs_rate_bps(lk->rate) : 0.0, bs_worker_name(f->worker),
         f->bytes_dense, f->bytes_pulse, f->patch_bytes, f->dense_s,
         f->dense_timed_bytes < f->anchor_size ? "true" : "false",
         f->dense_timed_bytes, f->anchor_size, f->dense_measured_s, f->commit,
         f->sync, f->end_to_end,
         bs_ratio((double)f->bytes_dense, (double)f->bytes_pulse),
         bs_ratio(f->dense_s, f->sync), bs_ratio(f->dense_s, f->end_to_end),
         f->transfer, f->verify, f->decode, f->apply);
  bs_json_opt("write_s", f->write);
  bs_json_opt("decode_overlap_s", f->overlap);
  printf(",\"total_s\":%.6f,\"local_s\":%.6f", f->sync, local);
  bs_json_opt("ratio_local_vs_transfer",
              f->transfer > 0 ? local / f->transfer : -1);
  printf(",\"worker_sync_s\":%.6f", f->worker_sync);
  bs_json_opt("load_s",
              f->worker == BS_WORKER_ONE_SHOT ? f->sync - f->worker_sync : -1);
  bs_json_opt("first_step_s",
              f->worker == BS_WORKER_LONG_LIVED ? r->first_step_s : -1);
  printf(",\"peak_extra_bytes\":%" PRIu64 ",\"class_index\":\"%s\"", f->peak_extra,
         f->class_index ? "on" : "off");
  printf(",\"seen_s\":%.6f,\"streamed\":%s,\"steps\":%zu,\"positions\":"
         "\"%s\",\"targets\":\"%s\"}\n",
         f->seen, a->no_stream ? "false" : "true", f->steps,
         a->plain ? "plain" : "class", bs_targets_name(r, f->worker));
}

void bs_print_head(const bs_run *r) {
  if (r->a->json)
    return;
  if (r->a->file_workers) {
    printf("%-9s %-10s %8s %8s %7s %7s %7s %7s %7s %7s %8s %7s %8s %9s %7s\n",
           "link", "worker", "MB pulse", "transfer", "verify", "decode",
           "apply", "write", "total", "local", "local/xf", "commit", "end-end",
           "dense s", "x e2e");
    return;
  }
  printf("%-10s %12s %11s %8s %10s %9s %9s %10s %8s %8s\n", "link",
         "bytes dense", "bytes pulse", "x fewer", "dense s", "commit s",
         "sync s", "end-end s", "x sync", "x e2e");
}

/* A ratio with the digits that matter: 148x, 12.5x, 0.43x. */
static const char *bs_fmt_ratio(double x, char *buf, size_t size) {
  snprintf(buf, size, x >= 100 ? "%.0fx" : x >= 10 ? "%.1fx" : "%.2fx", x);
  return buf;
}

static void bs_print_dense_note(const bs_figures *f) {
  if (f->dense_timed_bytes < f->anchor_size)
    printf("%-10s   * dense timed on the first %" PRIu64 " of %" PRIu64
           " bytes (%.3f s) and scaled linearly\n",
           "", f->dense_timed_bytes, f->anchor_size, f->dense_measured_s);
}

/* The worker's peak memory above its targets, against the bound stated
 * for a worker without a class index that follows (host targets or a
 * long-lived pulse-pull): 32 bytes per changed weight (measured: 18-20 for
 * host targets, the staged changes and the patch; 27-32 for a file target,
 * which also journals the step's changes) + 64 MiB (threads, buffers); and
 * against a tenth of the targets' bytes + the patch. A one-shot pull also
 * loads the file. */
static void bs_print_memory(const bs_run *r, const bs_figures *f) {
  double mib = 1.0 / (1 << 20), model = (double)r->m.total * 2.0;
  double bound = 32.0 * (double)f->changed + 64.0 * (1 << 20);
  printf("%-10s   peak memory above the targets %.1f MiB, class index %s (targets %.1f MiB; "
         "bound 32 B x changed + 64 MiB = %.1f MiB; 10%% of the targets + patch = "
         "%.1f MiB)\n",
         "", (double)f->peak_extra * mib, f->class_index ? "on" : "off", model * mib,
         bound * mib, (model / 10 + (double)f->patch_bytes) * mib);
}

/* The host-only table (the default): bytes, sync and end to end. */
static void bs_print_row(const bs_run *r, const bs_link *lk, const bs_figures *f) {
  int prefix = f->dense_timed_bytes < f->anchor_size;
  char r1[32], r2[32], r3[32];
  printf("%-10s %12" PRIu64 " %11" PRIu64 " %8s %9.3f%s %9.4f %9.4f "
         "%10.4f %8s %8s\n",
         lk->name, f->bytes_dense, f->bytes_pulse,
         bs_fmt_ratio(bs_ratio((double)f->bytes_dense, (double)f->bytes_pulse),
                      r1, sizeof r1),
         f->dense_s, prefix ? "*" : " ", f->commit, f->sync, f->end_to_end,
         bs_fmt_ratio(bs_ratio(f->dense_s, f->sync), r2, sizeof r2),
         bs_fmt_ratio(bs_ratio(f->dense_s, f->end_to_end), r3, sizeof r3));
  printf("%-10s   sync split: transfer %.4f / verify %.4f / decode %.4f / "
         "apply %.4f s (+%.4f s decoding hidden behind the transfer)\n",
         "", f->transfer, f->verify, f->decode, f->apply, f->overlap);
  bs_print_memory(r, f);
  bs_print_dense_note(f);
}

/* The workers' table (--workers with a pulse-pull worker): the split. */
static void bs_print_worker_row(const bs_run *r, const bs_link *lk,
                                const bs_figures *f) {
  char write[16], lx[32], r3[32];
  if (f->write < 0)
    snprintf(write, sizeof write, "%7s", "-");
  else
    snprintf(write, sizeof write, "%7.3f", f->write);
  double local = f->sync - f->transfer;
  printf("%-9s %-10s %8.3f %8.3f %7.3f %7.3f %7.3f %s %7.3f %7.3f %8s %7.3f "
         "%8.3f %8.3f%s %7s\n",
         lk->name, bs_worker_name(f->worker), (double)f->bytes_pulse / 1e6,
         f->transfer, f->verify, f->decode, f->apply, write, f->sync, local,
         f->transfer > 0 ? bs_fmt_ratio(local / f->transfer, lx, sizeof lx)
                         : "-",
         f->commit, f->end_to_end, f->dense_s,
         f->dense_timed_bytes < f->anchor_size ? "*" : " ",
         bs_fmt_ratio(bs_ratio(f->dense_s, f->end_to_end), r3, sizeof r3));
  if (f->worker == BS_WORKER_ONE_SHOT)
    printf("%-10s   one-shot: load %.3f s (process start, reading the file, "
           "exit) + its own sync %.3f s\n",
           "", f->sync - f->worker_sync, f->worker_sync);
  else if (f->worker == BS_WORKER_LONG_LIVED)
    printf("%-10s   long-lived: %.3f s from the head's move to its synced "
           "event; its first step\n%-10s   after its start (untimed; a class index, when "
           "kept, is built after it): %.3f s\n",
           "", f->seen, "", r->first_step_s);
  bs_print_memory(r, f);
  bs_print_dense_note(f);
}

void bs_print_link(bs_run *r, const bs_link *lk, const bs_figures *f) {
  int limited = lk->rate[0] != '\0';
  if (r->a->json)
    bs_print_json(r, lk, f);
  else if (r->a->file_workers)
    bs_print_worker_row(r, lk, f);
  else
    bs_print_row(r, lk, f);
  fflush(stdout);
  char name[64];
  snprintf(name, sizeof name, "%s%s%s", lk->name,
           f->worker == BS_WORKER_HOST ? "" : " ",
           f->worker == BS_WORKER_HOST ? "" : bs_worker_name(f->worker));
  pulse_report_row(r->rt);
  pulse_report_text(r->rt, name);
  pulse_report_num(r->rt, limited ? bs_rate_bps(lk->rate) : NAN);
  const double cells[] = {(double)f->bytes_dense,
                          (double)f->bytes_pulse,
                          f->dense_s,
                          f->commit,
                          f->sync,
                          f->end_to_end,
                          (double)f->dense_timed_bytes,
                          f->transfer,
                          f->verify,
                          f->decode,
                          f->apply,
                          f->overlap < 0 ? NAN : f->overlap,
                          f->write < 0 ? NAN : f->write,
                          f->sync - f->transfer,
                          f->seen};
  for (size_t k = 0; k < sizeof cells / sizeof cells[0]; k++)
    pulse_report_num(r->rt, cells[k]);
}

void bs_print_legend(const bs_run *r) {
  const char *decoding =
      r->a->no_stream ? "after each download (--no-stream)"
                      : "runs while the patch downloads (streamed apply)";
  if (r->a->json)
    return;
  if (r->a->file_workers) {
    printf("seconds per step, medians over the steps. host = a subscriber in "
           "this process (host\n"
           "  targets); long-lived = one `pulse-pull --follow --out FILE`; "
           "one-shot = a new `pulse-pull\n"
           "  --out FILE` per step. transfer/verify/decode/apply/write = the "
           "worker's own split (write:\n"
           "  making the file durable, - when pulse-pull does not report it: "
           "then inside apply); total =\n"
           "  the worker's step (host: its sync; long-lived: pulse-pull's "
           "total_s; one-shot: start to exit,\n"
           "  timed from outside); local = total - transfer; local/xf = local "
           "/ transfer; commit = the\n"
           "  publisher's; end-end = commit + total (long-lived: from the "
           "commit's start to its synced\n"
           "  event; it may start before the commit returns); dense s = the "
           "whole BF16\n"
           "  checkpoint's transfer over the same link (no verify, no load); "
           "x e2e = dense s / end-end;\n"
           "  decoding %s\n",
           decoding);
    return;
  }
  printf("dense s = the whole BF16 checkpoint's transfer over the link "
         "(no verify, no load: a lower bound\n"
         "  of a dense sync); commit s = the publisher's commit; sync s = "
         "the subscriber's head, patch\n"
         "  transfer, verify, decode and apply; end-end s = commit + sync; "
         "x fewer = dense BF16 bytes /\n"
         "  pulse bytes (head included); x sync and x e2e = dense s / sync "
         "s and dense s / end-end s;\n"
         "  medians over the steps; decoding %s\n",
         decoding);
}

/* Opens the report (--report) with its table. */
int bs_report_open(bs_run *r, int argc, char **argv) {
  if (r->a->report == NULL)
    return 0;
  if (pulse_report_create(r->a->report, "sync", argc, argv, &r->rep) !=
      PULSE_OK)
    return fprintf(stderr, "pulse-bench sync: --report: cannot make %s\n",
                   r->a->report),
           1;
  static const char *const cols[] = {"link",
                                     "link_bits_per_s",
                                     "bytes_dense",
                                     "bytes_pulse",
                                     "seconds_dense",
                                     "seconds_commit",
                                     "seconds_pulse",
                                     "seconds_end_to_end",
                                     "dense_timed_bytes",
                                     "transfer_s",
                                     "verify_s",
                                     "decode_s",
                                     "apply_s",
                                     "decode_overlap_s",
                                     "write_s",
                                     "local_s",
                                     "seen_s"};
  r->rt = pulse_report_table_add(r->rep, "links", cols, 17);
  return 0;
}

int bs_report_close(bs_run *r, int rc) {
  if (r->rep == NULL)
    return rc;
  static const char *const secs[] = {"seconds_dense", "seconds_pulse",
                                     "seconds_end_to_end"};
  static const char *const bytes[] = {"bytes_dense", "bytes_pulse"};
  pulse_report_chart_spec c1 = {
      PULSE_REPORT_LINE,
      "links",
      "Time per step vs link: dense BF16 transfer vs pulse sync and end to end "
      "(commit + sync)",
      "link",
      "link (loopback, then rate-limited links)",
      "seconds per step (s)",
      secs,
      3,
      0,
      1};
  pulse_report_chart_spec c2 = {PULSE_REPORT_BAR,
                                "links",
                                "Bytes per step: dense BF16 vs pulse",
                                "link",
                                "link",
                                "bytes per step (B)",
                                bytes,
                                2,
                                0,
                                1};
  pulse_report_chart(r->rep, &c1), pulse_report_chart(r->rep, &c2);
  char why[512];
  if (pulse_report_close(r->rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, "pulse-bench sync: --report: %s\n", why);
    return 1;
  }
  return rc;
}
