/* bench_sync_args.c - the command line of `pulse-bench sync`: its usage
 * text, the options and the links they name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_impl.h"
#include "bench_sync_impl.h"
#include "cli_args.h"

void bench_sync_usage(FILE *out) {
  fputs(
      "usage: pulse-bench sync [options]\n"
      "  per-step sync time and bytes on the wire, dense BF16 vs pulse: a "
      "publisher and\n"
      "  its HTTP server in this process; the worker that syncs: see "
      "--workers\n"
      "  --params N         parameters (default 1e8; 1e9 needs about 8 GB of "
      "memory)\n"
      "  --density X        fraction of weights that change per step (default "
      "0.01)\n"
      "  --steps S          synced steps per link and worker (default 3; the "
      "median is\n"
      "                     reported)\n"
      "  --links L          comma list of loopback, 100mbit, 1gbit, or any tc "
      "rate\n"
      "                     (default loopback,100mbit,1gbit; rate-limited "
      "links "
      "need root and\n"
      "                     `ip netns`, else they are skipped)\n"
      "  --workers W        comma list of who syncs, each for --steps steps "
      "per link, in\n"
      "                     this order (default host):\n"
      "                     host: a subscriber in this process, host "
      "targets;\n"
      "                     long-lived: one `pulse-pull --follow --out FILE "
      "--json` for all\n"
      "                     the steps of a link, as a worker that follows a "
      "trainer (its\n"
      "                     first step after its start, after which a kept "
      "class index is\n"
      "                     built, is not timed: first_step_s);\n"
      "                     one-shot: a new `pulse-pull --out FILE --json` "
      "per step (loads\n"
      "                     the file, syncs one step, exits), timed from "
      "outside.\n"
      "                     The pulse-pull workers run in the client "
      "namespace and share one\n"
      "                     file, first filled over loopback (untimed)\n"
      "  --pull PATH        the pulse-pull program (default: the one beside "
      "pulse-bench)\n"
      "  --burst SIZE       tbf bucket of the rate-limited links (default "
      "64kb: a bucket as\n"
      "                     large as a patch would let it through at memory "
      "speed)\n"
      "  --dense-sample B   time only the first B bytes of the dense download "
      "and scale\n"
      "                     them linearly to the whole checkpoint (said in "
      "the output)\n"
      "  --dense-full       time the whole dense download on every link "
      "(default: whole\n"
      "                     unless the link needs over 60 s for it at its "
      "rate; then the\n"
      "                     bytes of 60 s, scaled, and said so)\n"
      "  --plain            plain position model (about 40% more bytes on "
      "real\n"
      "                     trajectories; decodes without a class index)\n"
      "  --uniform          every weight changes with the same probability "
      "(default: by\n"
      "                     exponent, as under Adam; uniform leaves the class "
      "model\n"
      "                     nothing to use)\n"
      "  --index MODE       the workers' class index: auto (the default: "
      "kept only where it\n"
      "                     fits the memory budget and patches are sparse; "
      "pulse_sub_opts),\n"
      "                     on or off (class-model patches then decode with "
      "a pass over\n"
      "                     the weights); each worker's choice is printed\n"
      "  --no-index         the same as --index off\n"
      "  --memory-budget B  the workers' memory budget beside their targets "
      "(default: the\n"
      "                     library's, a tenth of the targets' bytes; e.g. 4G)\n"
      "  --no-stream        download each patch whole before decoding it (the "
      "workers\n"
      "                     otherwise decode chunks while the patch "
      "downloads)\n"
      "  --threads N        threads (default: one per core)\n"
      "  --device           host worker's targets in GPU memory: the host "
      "decodes the\n"
      "                     streams, the GPU places and writes the changes "
      "(without a CUDA\n"
      "                     device: says so and exits 0)\n"
      "  --seed N           generator seed (default 1)\n"
      "  --json             one JSON object per link and worker: params, "
      "density, link,\n"
      "                     link_bits_per_s, worker, steps, bytes_dense, "
      "bytes_pulse,\n"
      "                     patch_bytes, seconds_dense (the dense BF16 "
      "download over the\n"
      "                     link; dense_extrapolated, dense_sample_bytes, "
      "dense_object_bytes,\n"
      "                     seconds_dense_sample say how it was timed), "
      "seconds_commit (the\n"
      "                     publisher), the worker's split transfer_s, "
      "verify_s, decode_s,\n"
      "                     apply_s, write_s (making the file durable; null "
      "for the host\n"
      "                     worker and when pulse-pull does not report it), "
      "decode_overlap_s\n"
      "                     (null for pulse-pull), total_s (host: its sync "
      "call; long-lived:\n"
      "                     pulse-pull's total_s; one-shot: start to exit, "
      "from outside),\n"
      "                     local_s = total_s - transfer_s, "
      "ratio_local_vs_transfer,\n"
      "                     worker_sync_s (the worker's own total_s), "
      "load_s (one-shot:\n"
      "                     total_s - worker_sync_s: process start, loading "
      "the file, exit;\n"
      "                     else null), seen_s (long-lived: from the head's "
      "move, inside the\n"
      "                     commit, to its synced event; else total_s), "
      "seconds_pulse\n"
      "                     (= total_s), seconds_end_to_end (host, one-shot: "
      "seconds_commit +\n"
      "                     total_s; long-lived: from the commit's start to "
      "its synced event),\n"
      "                     the ratios\n"
      "  --report DIR       also write DIR/links.csv and DIR/report.html "
      "(charts)\n",
      out);
}

static int bs_parse_links(const char *spec, bs_link *links, size_t *n) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", spec);
  *n = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL && *n < 8;
       t = strtok_r(NULL, ",", &save)) {
    bs_link *l = &links[(*n)++];
    snprintf(l->name, sizeof l->name, "%s", t);
    if (strcmp(t, "loopback") == 0)
      l->rate[0] = '\0';
    else if (strspn(t, "0123456789.") > 0 &&
             strspn(t, "0123456789.kmgitbpsKMGITBPS") == strlen(t))
      snprintf(l->rate, sizeof l->rate, "%s", t);
    else
      return -1;
  }
  return *n > 0 ? 0 : -1;
}

static const char *const bs_worker_names[BS_WORKERS] = {"host", "long-lived",
                                                        "one-shot"};

const char *bs_worker_name(bs_worker w) {
  return (unsigned)w < BS_WORKERS ? bs_worker_names[w] : "?";
}

/* --workers: each kind at most once, in the order given. */
static int bs_parse_workers(const char *spec, bs_args *a) {
  char buf[128];
  if (strlen(spec) >= sizeof buf)
    return -1;
  snprintf(buf, sizeof buf, "%s", spec);
  a->nworkers = 0;
  a->file_workers = 0;
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t != NULL;
       t = strtok_r(NULL, ",", &save)) {
    int w = 0;
    while (w < BS_WORKERS && strcmp(t, bs_worker_names[w]) != 0)
      w++;
    for (size_t k = 0; k < a->nworkers && w < BS_WORKERS; k++)
      if (a->workers[k] == (bs_worker)w)
        return -1;
    if (w == BS_WORKERS)
      return -1;
    a->workers[a->nworkers++] = (bs_worker)w;
    a->file_workers |= w != BS_WORKER_HOST;
  }
  return a->nworkers > 0 ? 0 : -1;
}

/* The options that take a value; 1 when argv[*i] was one of them (read or
 * refused: *exit_code then set), 0 when it was not. */
static int bs_parse_value(int argc, char **argv, int *i, bs_args *a,
                          int *exit_code) {
  const char *v;
  int r;
  *exit_code = -1;
#define BS_BAD(msg)                                                            \
  (fprintf(stderr, "pulse-bench sync: " msg "\n"), *exit_code = 2, 1)
  if ((r = pulse_cli_opt_value(argc, argv, i, "--params", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_u64(v, &a->params) != 0 || a->params < 4096 ||
        a->params > 4000000000ull)
      return BS_BAD("--params needs 4096..4e9");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--density", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_double(v, &a->density) != 0 ||
        !(a->density > 0 && a->density < 0.5))
      return BS_BAD("--density needs 0 < X < 0.5");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--steps", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_u64(v, &a->steps) != 0 || a->steps < 1 ||
        a->steps > 200)
      return BS_BAD("--steps needs 1..200");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--links", &v)) != 0) {
    if (r < 0)
      return bench_sync_usage(stderr), *exit_code = 2, 1;
    a->links_spec = v;
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--burst", &v)) != 0) {
    if (r < 0 || strspn(v, "0123456789kmbKMB") != strlen(v) || v[0] == '\0')
      return BS_BAD("--burst needs a tc size (e.g. 64kb)");
    a->burst = v;
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--dense-sample", &v)) !=
             0) {
    if (r < 0 || pulse_cli_parse_u64(v, &a->dense_sample) != 0 ||
        a->dense_sample < 65536)
      return BS_BAD("--dense-sample needs >= 64k bytes");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--threads", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_int(v, 0, 256, &a->threads) != 0)
      return BS_BAD("--threads needs 0..256");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--index", &v)) != 0) {
    if (r >= 0 && strcmp(v, "auto") == 0)
      a->index = PULSE_SUB_CLASS_INDEX_AUTO;
    else if (r >= 0 && strcmp(v, "on") == 0)
      a->index = PULSE_SUB_CLASS_INDEX_ON;
    else if (r >= 0 && strcmp(v, "off") == 0)
      a->index = PULSE_SUB_CLASS_INDEX_OFF;
    else
      return BS_BAD("--index needs auto, on or off");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--memory-budget", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_u64(v, &a->memory_budget) != 0 || a->memory_budget == 0)
      return BS_BAD("--memory-budget needs a byte count of at least 1 (e.g. 4G)");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--seed", &v)) != 0) {
    if (r < 0 || pulse_cli_parse_u64(v, &a->seed) != 0)
      return BS_BAD("--seed needs an integer");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--workers", &v)) != 0) {
    if (r < 0 || bs_parse_workers(v, a) != 0)
      return BS_BAD("--workers takes host, long-lived, one-shot (comma list)");
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--pull", &v)) != 0) {
    if (r < 0)
      return bench_sync_usage(stderr), *exit_code = 2, 1;
    a->pull = v;
  } else if ((r = pulse_cli_opt_value(argc, argv, i, "--report", &v)) != 0) {
    if (r < 0)
      return bench_sync_usage(stderr), *exit_code = 2, 1;
    a->report = v;
  } else {
    return 0;
  }
#undef BS_BAD
  return 1;
}

/* Reads argv into *a. Returns -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
int bs_parse_args(int argc, char **argv, bs_args *a) {
  memset(a, 0, sizeof *a);
  a->params = 100000000, a->steps = 3, a->seed = 1, a->density = 0.01;
  a->links_spec = "loopback,100mbit,1gbit", a->burst = "64kb";
  a->workers[0] = BS_WORKER_HOST, a->nworkers = 1;
  for (int i = 1; i < argc; i++) {
    int code;
    if (pulse_cli_opt_flag(argv[i], "--help")) {
      bench_sync_usage(stdout);
      return 0;
    } else if (bs_parse_value(argc, argv, &i, a, &code)) {
      if (code >= 0)
        return code;
    } else if (pulse_cli_opt_flag(argv[i], "--dense-full")) {
      a->dense_full = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--plain")) {
      a->plain = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--no-stream")) {
      a->no_stream = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--no-index")) {
      a->index = PULSE_SUB_CLASS_INDEX_OFF;
    } else if (pulse_cli_opt_flag(argv[i], "--uniform")) {
      a->uniform = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--device")) {
      a->device = 1;
    } else if (pulse_cli_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else {
      fprintf(stderr, "pulse-bench sync: unknown argument '%s'\n", argv[i]);
      return bench_sync_usage(stderr), 2;
    }
  }
  if (a->dense_full && a->dense_sample)
    return fprintf(stderr, "pulse-bench sync: --dense-full and --dense-sample "
                           "exclude each other\n"),
           2;
  if (bs_parse_links(a->links_spec, a->links, &a->nlinks) != 0)
    return fprintf(stderr, "pulse-bench sync: --links takes loopback and tc "
                           "rates (100mbit)\n"),
           2;
  return -1;
}

/* Bytes of the dense download to time on link l: the whole checkpoint, or
 * a prefix (--dense-sample; or, by default, the bytes of BS_DENSE_FULL_S
 * at the link's rate when the whole would take longer). */
uint64_t bs_dense_bytes(const bs_args *a, const bs_link *l,
                        uint64_t anchor_size) {
  if (a->dense_full)
    return anchor_size;
  if (a->dense_sample)
    return a->dense_sample < anchor_size ? a->dense_sample : anchor_size;
  if (l->rate[0] == '\0')
    return anchor_size;
  double in_time = bs_rate_bps(l->rate) / 8.0 * BS_DENSE_FULL_S;
  return in_time < (double)anchor_size ? (uint64_t)in_time : anchor_size;
}
