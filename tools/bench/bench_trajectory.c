/* bench_trajectory.c - `pulse-bench trajectory`: writes the synthetic RL
 * trajectory as one safetensors checkpoint per step, the input the offline
 * tools, `pulse-bench codec --snapshots` and a publisher take from a real
 * trainer. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_impl.h"
#include "pulse_safetensors.h"
#include "cli_args.h"
#include "sim_synth.h"

void bench_trajectory_usage(FILE *out) {
  fprintf(out, "usage: pulse-bench trajectory --out DIR [options]\n"
               "  writes DIR/stepNNNN.safetensors for steps 0..S (step 0 = the start)\n"
               "  --params N   parameters (default 1e6)\n"
               "  --steps S    optimizer steps after the start (default 3)\n"
               "  --lr X       Adam learning rate (default 2e-6)\n"
               "  --seed N     generator seed (default 1)\n"
               "  --f32        write the FP32 master weights instead of their BF16 cast\n");
}

static int write_step(const char *dir, pulse_synth *s, int f32) {
  size_t n = pulse_synth_tensor_count(s);
  pulse_st_write_tensor *t = calloc(n + 1, sizeof *t);
  if (t == NULL)
    return fprintf(stderr, "pulse-bench trajectory: out of memory\n"), 1;
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *st = pulse_synth_tensor_get(s, i);
    t[i].name = st->info.name;
    t[i].dtype = f32 ? PULSE_DTYPE_F32 : PULSE_DTYPE_BF16;
    t[i].ndim = st->info.ndim;
    memcpy(t[i].shape, st->info.shape, sizeof t[i].shape);
    t[i].data = f32 ? (const void *)(pulse_synth_master(s) + st->offset)
                    : (const void *)(pulse_synth_bf16(s) + st->offset);
  }
  char path[4096], step[32];
  uint64_t k = pulse_synth_step_index(s);
  snprintf(step, sizeof step, "%" PRIu64, k);
  snprintf(path, sizeof path, "%s/step%04" PRIu64 ".safetensors", dir, k);
  pulse_st_kv meta[1] = {{"step", step}};
  pulse_status st = pulse_st_write(path, t, n, meta, 1);
  free(t);
  if (st != PULSE_OK)
    return fprintf(stderr, "pulse-bench trajectory: %s: %s: %s\n", path, pulse_status_str(st),
                   pulse_error_detail()),
           1;
  printf("%s\n", path);
  return 0;
}

int bench_trajectory_main(int argc, char **argv) {
  pulse_synth_opts opts;
  pulse_synth_opts_init(&opts);
  opts.params = 1000000;
  uint64_t steps = 3;
  const char *dir = NULL, *v;
  int f32 = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help")) {
      bench_trajectory_usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--out", &v)) != 0) {
      if (r < 0)
        return bench_trajectory_usage(stderr), 2;
      dir = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &opts.params) != 0 || opts.params < PULSE_SYNTH_MIN_PARAMS)
        return fprintf(stderr, "pulse-bench trajectory: --params needs an integer >= %u\n",
                       PULSE_SYNTH_MIN_PARAMS),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &steps) != 0 || steps > 100000)
        return fprintf(stderr, "pulse-bench trajectory: --steps needs an integer <= 100000\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_double(v, &opts.lr) != 0 || !(opts.lr > 0))
        return fprintf(stderr, "pulse-bench trajectory: --lr needs a positive number\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &opts.seed) != 0)
        return fprintf(stderr, "pulse-bench trajectory: --seed needs an integer\n"), 2;
    } else if (pulse_cli_opt_flag(argv[i], "--f32")) {
      f32 = 1;
    } else {
      fprintf(stderr, "pulse-bench trajectory: unknown argument '%s'\n", argv[i]);
      return bench_trajectory_usage(stderr), 2;
    }
  }
  if (dir == NULL)
    return bench_trajectory_usage(stderr), 2;
  mkdir(dir, 0755); /* an existing folder is fine; pulse_st_write reports the rest */
  pulse_synth *s = NULL;
  pulse_status st = pulse_synth_create(&opts, &s);
  if (st != PULSE_OK)
    return fprintf(stderr, "pulse-bench trajectory: %s: %s\n", pulse_status_str(st), pulse_error_detail()), 1;
  int rc = write_step(dir, s, f32);
  for (uint64_t k = 0; k < steps && rc == 0; k++) {
    st = pulse_synth_step(s);
    if (st != PULSE_OK) {
      fprintf(stderr, "pulse-bench trajectory: %s: %s\n", pulse_status_str(st), pulse_error_detail());
      rc = 1;
      break;
    }
    rc = write_step(dir, s, f32);
  }
  pulse_synth_free(s);
  return rc;
}
