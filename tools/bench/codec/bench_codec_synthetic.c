/* bench_codec_synthetic.c - `pulse-bench codec` on a synthetic trajectory
 * (sim_synth): the FP32 master weights move by Adam steps, detection reads
 * them against the BF16 snapshot. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_codec_impl.h"
#include "cli_time.h"
#include "sim_synth.h"

/* What the bench holds per parameter beside the trajectory: the base and
 * the receiver's weights (BF16) and a class index (2.13 bytes), rounded
 * up for the changes and patches of a step. */
#define BENCH_BYTES_PER_PARAM 7u

/* MemAvailable of /proc/meminfo in bytes; 0 where it cannot be read. */
static uint64_t mem_available(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  if (f == NULL)
    return 0;
  char line[128];
  uint64_t kib = 0;
  while (fgets(line, sizeof line, f) != NULL)
    if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1)
      break;
  fclose(f);
  return kib * 1024;
}

/* A trajectory that cannot fit is refused before it is made, with the way
 * to measure it anyway: the trajectory's snapshots on disk need only the
 * bench's share. Past the memory the kernel would kill the bench midway. */
static int check_memory(const codec_args *a) {
  uint64_t avail = mem_available();
  uint64_t need = a->params * (PULSE_SYNTH_BYTES_PER_PARAM + BENCH_BYTES_PER_PARAM);
  if (avail == 0 || a->params > UINT64_MAX / 64 || need <= avail)
    return 0;
  fprintf(stderr,
          PROG ": %" PRIu64 " parameters need about %.1f GB (%u bytes a parameter for the "
               "synthetic trajectory's Adam state, %u for the bench) and %.1f GB is "
               "available; write the trajectory to disk and measure its snapshots, "
               "which needs about %u bytes a parameter:\n"
               "  pulse-bench trajectory --out DIR --params %" PRIu64 " --steps %" PRIu64
               " --lr %g --seed %" PRIu64 "\n"
               "  pulse-bench codec --snapshots DIR/step*.safetensors\n",
          a->params, (double)need / 1e9, PULSE_SYNTH_BYTES_PER_PARAM, BENCH_BYTES_PER_PARAM,
          (double)avail / 1e9, BENCH_BYTES_PER_PARAM + 2, a->params, a->steps, a->lr,
          a->seed);
  return 1;
}

int bench_codec_run_synthetic(const codec_args *a) {
  if (check_memory(a) != 0)
    return 1;
  pulse_synth_opts so;
  pulse_synth_opts_init(&so);
  so.params = a->params;
  so.seed = a->seed;
  so.lr = a->lr;
  so.threads = a->threads;
  pulse_synth *syn = NULL;
  double t0 = pulse_cli_now();
  pulse_status st = pulse_synth_create(&so, &syn);
  if (st != PULSE_OK)
    return bench_codec_fail_status("synthetic trajectory", st);
  double create_s = pulse_cli_since(t0);

  codec_ctx c;
  memset(&c, 0, sizeof c);
  bench_table *tb = &c.table;
  tb->count = pulse_synth_tensor_count(syn);
  tb->total = pulse_synth_param_count(syn);
  tb->info = calloc(tb->count, sizeof *tb->info);
  tb->numel = calloc(tb->count, sizeof *tb->numel);
  tb->offset = calloc(tb->count, sizeof *tb->offset);
  int rc = 1;
  if (tb->info == NULL || tb->numel == NULL || tb->offset == NULL) {
    fprintf(stderr, PROG ": out of memory\n");
    goto done;
  }
  for (size_t i = 0; i < tb->count; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(syn, i);
    tb->info[i] = t->info;
    tb->numel[i] = t->numel;
    tb->offset[i] = t->offset;
  }
  if (bench_codec_ctx_alloc(&c) != 0)
    goto done;
  const float *master = pulse_synth_master(syn);
  const uint16_t *bf16 = pulse_synth_bf16(syn);
  for (size_t i = 0; i < tb->count; i++) {
    c.cur[i] = master + tb->offset[i];
    c.cur_dtype[i] = PULSE_DTYPE_F32;
  }
  memcpy(c.old_bf16, bf16, (size_t)tb->total * 2);

  char source[256];
  snprintf(source, sizeof source,
           "synthetic (sim_synth): %" PRIu64 " params in %zu tensors, "
           "Adam lr %g, seed %" PRIu64,
           tb->total, tb->count, a->lr, a->seed);
  if (!a->json) {
    printf(PROG ": %s, %" PRIu64 " steps from a fresh optimizer (generated "
                "in %.2f s)\n",
           source, a->steps, create_s);
    printf("entropy bound model: %s\n", BENCH_BOUND_MODEL);
    printf("timings: one thread (decode + apply: %d, 0 = one per core), median "
           "of %d "
           "repetitions; detection reads FP32 master weights + the BF16 "
           "snapshot\n",
           a->apply_threads, a->reps);
  }

  summary sum;
  memset(&sum, 0, sizeof sum);
  for (uint64_t k = 1; k <= a->steps; k++) {
    step_result r;
    memset(&r, 0, sizeof r);
    t0 = pulse_cli_now();
    st = pulse_synth_step(syn);
    if (st != PULSE_OK) {
      bench_codec_fail_status("synthetic step", st);
      goto done;
    }
    r.generate_s = pulse_cli_since(t0);
    r.step = k;
    r.base_step = k - 1;
    if (bench_codec_measure_step(&c, a, bf16, &r) != 0)
      goto done;
    bench_codec_report_step(a, &sum, &r);
    memcpy(c.old_bf16, bf16, (size_t)tb->total * 2);
  }
  if (a->json)
    bench_codec_print_summary_json(&sum, source, a->apply_threads);
  else
    bench_codec_print_summary_text(&sum);
  rc = 0;
done:
  bench_codec_ctx_free(&c);
  free(tb->info);
  free(tb->numel);
  free(tb->offset);
  pulse_synth_free(syn);
  return rc;
}
