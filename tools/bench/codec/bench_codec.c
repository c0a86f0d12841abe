/* bench_codec.c - `pulse-bench codec`: per step, change density, patch sizes
 * of both format versions (class and plain positions) against the
 * baselines and the entropy bound, throughputs of
 * change detection, patch encoding and decode+apply, and a bit-exact check
 * that applying the patch rebuilds the new BF16 state.
 *
 * Inputs: a synthetic trajectory (sim_synth) or consecutive safetensors
 * snapshots. Timed work runs on one thread (decode + apply on
 * --apply-threads, the receiver's threads); each figure is the median of
 * --reps repetitions.
 *
 * This file: the codings measured, the command line and the dispatch. The
 * parts: bench_codec_step.c (one step measured), bench_codec_print.c and
 * bench_codec_summary.c (the output), bench_codec_synthetic.c and
 * bench_codec_snapshots.c (the inputs), bench_codec_report.c (--report),
 * bench_codec_ctx.c and bench_codec_util.c (buffers and helpers). */
#include <stdio.h>
#include <string.h>

#include "bench_codec_impl.h"
#include "cli_args.h"
#include "sim_synth.h"

/* Both position models in versions 2 and 1, then version 3 (class
 * positions, values against the patch's value model); the first is the
 * default. */
const bench_codec_coding bench_codec_codings[CODINGS] = {
    {2, PULSE_POS_CLASS, "v2, class positions (default)", "v2"},
    {2, PULSE_POS_PLAIN, "v2, plain positions", "v2_plain"},
    {1, PULSE_POS_CLASS, "v1, class positions (range coder)", "v1"},
    {1, PULSE_POS_PLAIN, "v1, plain positions (range coder)", "v1_plain"},
    {3, PULSE_POS_CLASS, "v3, class positions (value model)", "v3"},
};

void bench_codec_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench codec [options]\n"
      "  Patch sizes of format versions 2 and 1 (class and plain positions)\n"
      "  and 3 (class positions)\n"
      "  against dense, int32+BF16, varint-gap baselines (through zstd at\n"
      "  levels 1, 3 and 19; the smallest is \"the baseline\", named; dense\n"
      "  BF16 at level 19 on 16 slices of 512 KiB above 8 MiB, scaled) and\n"
      "  the empirical entropy bound; throughputs of change detection, patch "
      "encode,\n"
      "  decode+apply and memcpy; bit-exact check of every patch.\n"
      "input (one of):\n"
      "  synthetic trajectory (default):\n"
      "    --params N     parameters (default 10000000; 1e7, 10M work)\n"
      "    --steps S      optimizer steps (default 5)\n"
      "    --lr X         Adam learning rate (default 2e-6)\n"
      "    --seed N       generator seed (default 1)\n"
      "    --threads T    generator threads (default: one per core)\n"
      "  --snapshots A.safetensors B.safetensors ...\n"
      "                 one model per step (BF16 or F32 tensors, file,\n"
      "                 shard index or folder); consecutive pairs are\n"
      "                 steps\n"
      "options:\n"
      "  --reps R       repetitions of each timing, median kept "
      "(default 5)\n"
      "  --apply-threads N  decode + apply on N threads, as a receiver with\n"
      "                 opts.threads = N (default 1; 0: one per core); the\n"
      "                 summary's apply_mchanges_per_s (default coding,\n"
      "                 through a class index) and "
      "apply_noindex_mchanges_per_s\n"
      "                 (without) are these, and apply_cpu_mchanges_per_s\n"
      "                 the same per second of CPU time (every thread's),\n"
      "                 which a loaded machine disturbs less\n"
      "  --json         one JSON object per step, then a summary object\n"
      "  --commit       instead: the publisher's commit (pulse_pub_commit) of\n"
      "                 FP32 master weights in memory, split where its time\n"
      "                 goes, against one pass over what it must read; then\n"
      "                 a receiver applies each patch (no index, one thread;\n"
      "                 class index, two threads and one) and is checked bit\n"
      "                 for bit. The model: --params (default 1e9) in\n"
      "                 --tensors T (default 128) of rows x 1024, --density D\n"
      "                 (default 0.01) of each moved per step, --steps\n"
      "                 (default 3), --seed; --threads T: the publisher's\n"
      "                 (default 0, one per core). About 10.1 bytes per\n"
      "                 parameter (1e9: 10 GB).\n"
      "  --report DIR   also write DIR/steps.csv, DIR/per_changed.csv and\n"
      "                 DIR/report.html (charts)\n"
      "  --help         this text\n"
      "Other timed work runs on one thread. Exit status: 0 ok, 1 failure or\n"
      "a patch that does not rebuild the new state bit for bit, 2 usage.\n");
}

/* -------------------------------------------------------------- arguments */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, PROG ": ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(try: pulse-bench codec --help)\n");
  return 2;
}

int bench_codec_main(int argc, char **argv) {
  codec_args a = {.params = 10000000,
                  .steps = 5,
                  .seed = 1,
                  .lr = 2e-6,
                  .threads = 0,
                  .apply_threads = 1,
                  .reps = 5,
                  .density = 0.01,
                  .tensors = 128};
  int density_given = 0, params_given = 0, steps_given = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    int m;
    if (pulse_cli_opt_flag(arg, "--help") || pulse_cli_opt_flag(arg, "-h")) {
      bench_codec_usage(stdout);
      return 0;
    } else if (pulse_cli_opt_flag(arg, "--json")) {
      a.json = 1;
    } else if (pulse_cli_opt_flag(arg, "--commit")) {
      a.commit = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--density", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a.density) != 0 || !(a.density > 0) ||
          a.density > 1)
        return usage_error("--density needs a fraction in (0, 1], got '%s'", m < 0 ? "" : v);
      density_given = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--tensors", &v)) != 0) {
      int t = 0;
      if (m < 0 || pulse_cli_parse_int(v, 1, 100000, &t) != 0)
        return usage_error("--tensors needs 1..100000, got '%s'", m < 0 ? "" : v);
      a.tensors = (size_t)t;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (m < 0)
        return usage_error("--report needs a folder%s", "");
      a.report = v;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a.params) != 0)
        return usage_error("--params needs a count, got '%s'", m < 0 ? "" : v);
      a.synth_opts_given = 1;
      params_given = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a.steps) != 0 || a.steps == 0 ||
          a.steps > 1000000)
        return usage_error("--steps needs a count from 1, got '%s'",
                           m < 0 ? "" : v);
      a.synth_opts_given = 1;
      steps_given = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a.lr) != 0 || a.lr < 0)
        return usage_error("--lr needs a non-negative number, got '%s'",
                           m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a.seed) != 0)
        return usage_error("--seed needs an integer, got '%s'", m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_int(v, 0, 4096, &a.threads) != 0)
        return usage_error("--threads needs 0..4096, got '%s'", m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--apply-threads",
                                        &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 0, 256, &a.apply_threads) != 0)
        return usage_error("--apply-threads needs 0..256, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--reps", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, MAX_REPS, &a.reps) != 0)
        return usage_error("--reps needs 1..1000, got '%s'", m < 0 ? "" : v);
    } else if (pulse_cli_opt_flag(arg, "--snapshots")) {
      a.snapshots = argv + i + 1;
      while (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
        i++;
        a.snapshot_count++;
      }
      if (a.snapshot_count < 2)
        return usage_error("%s needs at least two files", arg);
    } else {
      return usage_error("unknown option '%s'", arg);
    }
  }
  if (a.commit) {
    if (a.snapshots != NULL || a.report != NULL)
      return usage_error("%s measures its own model: no --snapshots or --report", "--commit");
    if (!params_given)
      a.params = 1000000000;
    if (!steps_given)
      a.steps = 3;
    if (a.params < 1024)
      return usage_error("--params must be at least %s with --commit", "1024");
    return bench_codec_run_commit(&a);
  }
  if (density_given || a.tensors != 128)
    return usage_error("%s: --density and --tensors describe --commit's model", "--density");
  if (a.snapshots != NULL && a.synth_opts_given)
    return usage_error("%s: --params, --steps, --lr and --seed describe the "
                       "synthetic input, not snapshots",
                       "--snapshots");
  if (a.snapshots == NULL && a.params < PULSE_SYNTH_MIN_PARAMS) {
    char msg[64];
    snprintf(msg, sizeof msg, "%u", PULSE_SYNTH_MIN_PARAMS);
    return usage_error("--params must be at least %s", msg);
  }
  if (a.report == NULL)
    return a.snapshots != NULL ? bench_codec_run_snapshots(&a)
                               : bench_codec_run_synthetic(&a);
  return bench_codec_run_with_report(&a, argc, argv);
}
