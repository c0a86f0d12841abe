/* bench_gpu.c - `pulse-bench gpu`: the device encode and apply against a
 * device-to-device copy of the same bytes, in the same run.
 *
 * A synthetic table (FP32 master weights and their BF16 snapshot, a given
 * share of elements changed) lives in device memory. Timed, each the median
 * of --reps runs after a warm-up, every run ending with a synchronization:
 *   copy       cudaMemcpy D2D of what detection reads (weights + snapshot)
 *   encode     pulse_cuda_detect with the rank form (the whole table)
 *   apply      pulse_cuda_scatter of the decoded positions and new bits,
 *              and the other device steps of an apply (class counts,
 *              locate, digest moves), beside a D2D copy of the BF16 weights;
 *              and all the device work of applying the step once its bytes
 *              are on the device (decoded keys and deltas uploaded), as
 *              pulse_cuda_patch_stream_finish and _commit run it: class
 *              counts of the base, locate, gather, digest moves, scatter
 * and once each, end to end with the host coder: pulse_cuda_patch_encode
 * and pulse_cuda_patch_apply. Everything runs on one stream of its own.
 * Without a device it says so and exits 0. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_impl.h"
#include "cuda_impl.h"
#include "parallel_impl.h"
#include "pulse_cuda.h"
#include "pulse_elem.h"
#include "rng_impl.h"
#include "cli_args.h"
#include "cli_report.h"
#include "cli_time.h"

#define PROG "pulse-bench gpu"
#define MAX_REPS 100

void bench_gpu_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench gpu [options]\n"
      "  device encode and apply against a device-to-device copy (needs a "
      "GPU;\n"
      "  without one prints \"no CUDA device\" and exits 0)\n"
      "  --params N    parameters (default 1e9)\n"
      "  --tensors T   tensors they are split into (default 64)\n"
      "  --density D   share of elements changed (default 0.01)\n"
      "  --reps R      timed repetitions, median reported (default 5)\n"
      "  --no-e2e      skip the end-to-end patch encode/apply (host coder)\n"
      "  --report DIR  also write DIR/timings.csv and DIR/report.html (charts)\n");
}

typedef struct {
  uint64_t params;
  uint32_t tensors;
  double density;
  int reps, e2e;
  const char *report; /* --report DIR */
} gpu_args;

/* --report: one row per timed operation (NULL table: no report). */
static pulse_report_table *gpu_rt;

static void gpu_row(const char *what, double seconds) {
  pulse_report_row(gpu_rt);
  pulse_report_text(gpu_rt, what);
  pulse_report_num(gpu_rt, seconds * 1e3);
}

/* Adds the chart and writes the report; rc, or 1 when it cannot. */
static int gpu_report_close(pulse_report *rep, int rc) {
  if (rep == NULL)
    return rc;
  static const char *const y[] = {"ms"};
  pulse_report_chart_spec c = {PULSE_REPORT_BAR, "timings", "Device operations (median)",
                               "operation", "operation", "time (ms)", y, 1, 0, 1};
  pulse_report_chart(rep, &c);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: %s\n", why), 1;
  return rc;
}

/* ------------------------------------------------------------ the data */

typedef struct {
  uint32_t *cur; /* FP32 bits */
  uint16_t *snap;
  uint64_t n;
  double density;
} fill_job;

/* Value number 0 of the project's generator seeded with x: a hash of x. */
static uint64_t mix(uint64_t x) { return pulse_rng_next(&x); }

/* Weight-like FP32 values (|w| around 2^-6); the snapshot is their BF16, a
 * few ulps off where the element changed. */
static void fill_block(void *ctx, size_t b) {
  fill_job *job = ctx;
  uint64_t lo = (uint64_t)b << 20,
           hi = lo + (1u << 20) < job->n ? lo + (1u << 20) : job->n;
  uint64_t threshold = (uint64_t)(job->density * 18446744073709551615.0);
  for (uint64_t i = lo; i < hi; i++) {
    uint64_t r = mix(i);
    uint32_t f = (uint32_t)(r >> 63) << 31 |
                 (112u + (uint32_t)((r >> 40) % 14u)) << 23 |
                 ((uint32_t)(r >> 8) & 0x7FFFFFu);
    job->cur[i] = f;
    uint16_t b16 = pulse_bf16_from_f32_bits(f);
    uint64_t c = mix(i ^ 0xABCDEF);
    if (job->density >= 1.0 || (job->density > 0.0 && c < threshold))
      b16 = (uint16_t)(b16 + ((c & 1) ? 1 : 0xFFFF));
    job->snap[i] = b16;
  }
}

/* ------------------------------------------------------------- timing */

static int check(pulse_status st, const char *what) {
  if (st == PULSE_OK)
    return 0;
  pulse_cli_fail(PROG, what, st);
  return 1;
}

static double median(double *s, int n) {
  return pulse_cli_median(s, (size_t)n);
}

/* ---------------------------------------------------------------- main */

static int parse(int argc, char **argv, gpu_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *v;
    int r;
    uint64_t u;
    if (pulse_cli_opt_flag(argv[i], "--help")) {
      bench_gpu_usage(stdout);
      return 0;
    } else if (pulse_cli_opt_flag(argv[i], "--no-e2e")) {
      a->e2e = 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return fprintf(stderr, PROG ": --report needs a folder\n"), 2;
      a->report = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->params) != 0 || a->params < 1024)
        return fprintf(stderr, PROG ": --params needs an integer >= 1024\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--tensors", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &u) != 0 || u < 1 || u > 100000)
        return fprintf(stderr,
                       PROG ": --tensors needs an integer in 1..100000\n"),
               2;
      a->tensors = (uint32_t)u;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--density", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_double(v, &a->density) != 0 ||
          !(a->density >= 0.0) || a->density > 1.0)
        return fprintf(stderr, PROG ": --density needs a number in 0..1\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--reps", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, MAX_REPS, &a->reps) != 0)
        return fprintf(stderr, PROG ": --reps needs an integer in 1..%d\n",
                       MAX_REPS),
               2;
    } else {
      fprintf(stderr, PROG ": unknown option '%s'\n", argv[i]);
      bench_gpu_usage(stderr);
      return 2;
    }
  }
  return -1; /* go on */
}

/* Class-major entries per chunk (what a decoder hands to locate), made from
 * the detection's rank form on the host, outside the timing. */
static int class_major(const uint64_t *tensor_changes, const uint64_t *numel,
                       uint32_t tensors, uint32_t chunk_log2,
                       const uint64_t *pos, const uint8_t *cls,
                       const uint32_t *rank, uint64_t *chunk_first,
                       uint8_t *cm_cls, uint32_t *cm_rank, uint64_t *cm_from) {
  uint64_t at = 0, g = 0;
  for (uint32_t t = 0; t < tensors; t++) {
    uint64_t n = numel[t], chunks = n ? ((n - 1) >> chunk_log2) + 1 : 0, j = at;
    uint64_t end = at + tensor_changes[t];
    for (uint64_t c = 0; c < chunks; c++, g++) {
      uint64_t j0 = j;
      while (j < end && (pos[j] >> chunk_log2) == c)
        j++;
      uint32_t count[PULSE_CLASS_COUNT] = {0}, next[PULSE_CLASS_COUNT];
      for (uint64_t k = j0; k < j; k++)
        count[cls[k]]++;
      uint32_t run = 0;
      for (unsigned c2 = 0; c2 < PULSE_CLASS_COUNT; c2++) {
        next[c2] = run;
        run += count[c2];
      }
      chunk_first[g] = j0;
      for (uint64_t k = j0; k < j; k++) {
        uint64_t slot = j0 + next[cls[k]]++;
        cm_cls[slot] = cls[k];
        cm_rank[slot] = rank[k];
        cm_from[slot] = k;
      }
    }
    at = end;
  }
  chunk_first[g] = at;
  return 0;
}

/* Everything one run holds (host and device), freed by gpu_free. */
typedef struct {
  const gpu_args *a;
  uint64_t N;
  uint32_t T, chunk_log2;
  double samples[MAX_REPS + 1];
  uint32_t *cur;
  uint16_t *snap;
  uint64_t *numel, *tensor_changes, *first;
  char (*names)[32];
  pulse_cuda_detect_tensor *table;
  pulse_cuda_bf16_tensor *target, *base;
  pulse_cuda_encode_tensor *enc;
  pulse_cuda_target *apply_t;
  pulse_tensor_digest *digests;
  uint64_t *pos, *chunk_first;
  uint8_t *cls, *cm_cls;
  uint32_t *rank, *cm_rank;
  uint64_t *cm_from; /* class-major entry -> detection entry */
  void *cur_d, *snap_d, *copy_d, *target_d, *locate_d;
  void *stream; /* every call's */
  void *keys_d, *chunk_first_d, *delta_d, *old_d, *new_d;
  pulse_tensor_digest *moves;
  pulse_cuda_changes out;
  pulse_cuda_workspace *ws;
  pulse_cuda_class_index *idx;
  pulse_buffer patch;
  pulse_patch *opened;
  uint64_t total, chunks;
  double copy6; /* the D2D copy of the bytes detection reads */
} gpu_run;

static void gpu_free(gpu_run *g) {
  pulse_patch_free(g->opened);
  pulse_buffer_free(&g->patch);
  pulse_cuda_class_index_free(g->idx);
  pulse_cuda_workspace_free(g->ws);
  pulse_cuda_free(g->cur_d), pulse_cuda_free(g->snap_d), pulse_cuda_free(g->copy_d);
  pulse_cuda_free(g->target_d), pulse_cuda_free(g->locate_d);
  pulse_cuda_free(g->keys_d), pulse_cuda_free(g->chunk_first_d), pulse_cuda_free(g->delta_d);
  pulse_cuda_free(g->old_d), pulse_cuda_free(g->new_d);
  free(g->moves);
  pulse_cuda_stream_free(g->stream);
  pulse_cuda_free(g->out.pos_d), pulse_cuda_free(g->out.old_d), pulse_cuda_free(g->out.new_d);
  pulse_cuda_free(g->out.class_d), pulse_cuda_free(g->out.rank_d),
      pulse_cuda_free(g->out.chunk_hist_d);
  free(g->cur), free(g->snap), free(g->numel), free(g->tensor_changes), free(g->first),
      free(g->names);
  free(g->table), free(g->target), free(g->base), free(g->enc), free(g->apply_t),
      free(g->digests);
  free(g->pos), free(g->cls), free(g->rank), free(g->cm_cls), free(g->cm_rank), free(g->cm_from),
      free(g->chunk_first);
}

/* Host tables, the data, and its copies on the device (weights, snapshot,
 * a target equal to the snapshot); 0 or 1 (said on stderr). */
static int gpu_setup(gpu_run *g) {
  uint64_t N = g->N;
  uint32_t T = g->T;
  g->cur = malloc((size_t)N * 4);
  g->snap = malloc((size_t)N * 2);
  g->numel = calloc(T + 1, 8), g->tensor_changes = calloc(T + 1, 8), g->first = calloc(T + 1, 8);
  g->names = calloc(T + 1, 32);
  g->table = calloc(T + 1, sizeof *g->table);
  g->target = calloc(T + 1, sizeof *g->target), g->base = calloc(T + 1, sizeof *g->base);
  g->enc = calloc(T + 1, sizeof *g->enc);
  g->apply_t = calloc(T + 1, sizeof *g->apply_t);
  g->digests = calloc(T + 1, sizeof *g->digests);
  g->moves = calloc(T + 1, sizeof *g->moves);
  if (!g->moves || !g->cur || !g->snap || !g->numel || !g->tensor_changes || !g->first || !g->names ||
      !g->table || !g->target || !g->base || !g->enc || !g->apply_t || !g->digests) {
    fprintf(stderr, PROG ": out of host memory for %" PRIu64 " parameters\n", N);
    return 1;
  }
  fill_job fj = {g->cur, g->snap, N, g->a->density};
  pulse_parallel_for(0, (size_t)((N + (1u << 20) - 1) >> 20), fill_block, &fj);
  if (check(pulse_cuda_stream_create(&g->stream), "stream") ||
      check(pulse_cuda_workspace_create(&g->ws), "workspace") ||
      check(pulse_cuda_alloc(&g->cur_d, (size_t)N * 4), "device weights") ||
      check(pulse_cuda_alloc(&g->snap_d, (size_t)N * 2), "device snapshot") ||
      check(pulse_cuda_alloc(&g->copy_d, (size_t)N * 6), "device copy") ||
      check(pulse_cuda_alloc(&g->target_d, (size_t)N * 2), "device target") ||
      check(pulse_cuda_upload(g->cur_d, g->cur, (size_t)N * 4, g->stream), "upload") ||
      check(pulse_cuda_upload(g->snap_d, g->snap, (size_t)N * 2, g->stream), "upload") ||
      check(pulse_cuda_copy(g->target_d, g->snap_d, (size_t)N * 2, g->stream), "copy") ||
      check(pulse_cuda_sync(g->stream), "sync"))
    return 1;
  uint64_t off = 0;
  for (uint32_t t = 0; t < T; t++) {
    g->numel[t] = N / T + (t < N % T ? 1 : 0);
    snprintf(g->names[t], 32, "layer.%u.weight", t);
    g->table[t] = (pulse_cuda_detect_tensor){(uint32_t *)g->cur_d + off, PULSE_DTYPE_F32,
                                             (uint16_t *)g->snap_d + off, g->numel[t]};
    g->base[t] = (pulse_cuda_bf16_tensor){(uint16_t *)g->snap_d + off, g->numel[t]};
    g->target[t] = (pulse_cuda_bf16_tensor){(uint16_t *)g->target_d + off, g->numel[t]};
    off += g->numel[t];
  }
  return 0;
}

/* The copy: the bytes detection reads, device to device. */
static int gpu_time_copy(gpu_run *g) {
  uint64_t N = g->N;
  for (int r = 0; r <= g->a->reps; r++) {
    double t0 = pulse_cli_now();
    if (check(pulse_cuda_copy(g->copy_d, g->cur_d, (size_t)N * 4, g->stream), "copy") ||
        check(pulse_cuda_copy((uint8_t *)g->copy_d + (size_t)N * 4, g->snap_d, (size_t)N * 2,
                              g->stream),
              "copy") ||
        check(pulse_cuda_sync(g->stream), "sync"))
      return 1;
    g->samples[r] = pulse_cli_since(t0);
  }
  g->copy6 = median(g->samples + 1, g->a->reps);
  gpu_row("D2D copy (FP32 + BF16)", g->copy6);
  printf("gpu: copy: %.2f GB D2D in %.3f ms = %.1f GB/s\n", 6e-9 * (double)N, 1e3 * g->copy6,
         6e-9 * (double)N / g->copy6);
  return 0;
}

/* Encode: detection with the rank form, the whole table. */
static int gpu_time_detect(gpu_run *g) {
  uint64_t N = g->N;
  uint32_t T = g->T;
  pulse_cuda_changes *out = &g->out;
  pulse_cuda_detect_opts dopts;
  pulse_cuda_detect_opts_init(&dopts);
  if (check(pulse_cuda_detect(g->ws, g->table, T, &dopts, NULL, NULL, &g->total, g->stream),
            "detect size") ||
      check(pulse_cuda_chunk_count(g->table, T, g->chunk_log2, &g->chunks), "chunks"))
    return 1;
  uint64_t total = g->total;
  out->capacity = total;
  out->chunk_capacity = g->chunks;
  if (check(pulse_cuda_alloc((void **)&out->pos_d, (size_t)total * 8 + 8), "changes") ||
      check(pulse_cuda_alloc((void **)&out->old_d, (size_t)total * 2 + 8), "changes") ||
      check(pulse_cuda_alloc((void **)&out->new_d, (size_t)total * 2 + 8), "changes") ||
      check(pulse_cuda_alloc((void **)&out->class_d, (size_t)total + 8), "changes") ||
      check(pulse_cuda_alloc((void **)&out->rank_d, (size_t)total * 4 + 8), "changes") ||
      check(pulse_cuda_alloc((void **)&out->chunk_hist_d, (size_t)g->chunks * 1024 + 8),
            "changes"))
    return 1;
  for (int r = 0; r <= g->a->reps; r++) {
    double t0 = pulse_cli_now();
    if (check(pulse_cuda_detect(g->ws, g->table, T, &dopts, out, g->tensor_changes, &g->total,
                                g->stream),
              "detect"))
      return 1;
    g->samples[r] = pulse_cli_since(t0);
  }
  double detect = median(g->samples + 1, g->a->reps);
  gpu_row("detect (rank form)", detect);
  printf("gpu: encode: detect %" PRIu64 " changes (rank form) in %.3f ms = %.1f GB/s read, "
         "%.1f%% of the copy (target >= 80%%)\n",
         g->total, 1e3 * detect, 6e-9 * (double)N / detect, 100.0 * g->copy6 / detect);
  for (uint32_t t = 0; t < T; t++)
    g->first[t + 1] = g->first[t] + g->tensor_changes[t];
  return 0;
}

/* The class-major rank form on the host, and locate from it on the device:
 * the median seconds into *locate. */
static int gpu_time_locate(gpu_run *g, double *locate) {
  uint64_t total = g->total;
  g->pos = malloc((size_t)total * 8 + 8);
  g->cls = malloc((size_t)total + 8);
  g->rank = malloc((size_t)total * 4 + 8);
  g->cm_cls = malloc((size_t)total + 8);
  g->cm_rank = malloc((size_t)total * 4 + 8);
  g->cm_from = malloc((size_t)total * 8 + 8);
  g->chunk_first = malloc((size_t)(g->chunks + 1) * 8);
  if (!g->pos || !g->cls || !g->rank || !g->cm_cls || !g->cm_rank || !g->cm_from ||
      !g->chunk_first ||
      check(pulse_cuda_download(g->pos, g->out.pos_d, (size_t)total * 8, g->stream), "download") ||
      check(pulse_cuda_download(g->cls, g->out.class_d, (size_t)total, g->stream), "download") ||
      check(pulse_cuda_download(g->rank, g->out.rank_d, (size_t)total * 4, g->stream),
            "download") ||
      check(pulse_cuda_alloc(&g->locate_d, (size_t)total * 8 + 8), "locate output"))
    return 1;
  class_major(g->tensor_changes, g->numel, g->T, g->chunk_log2, g->pos, g->cls, g->rank,
              g->chunk_first, g->cm_cls, g->cm_rank, g->cm_from);
  for (int r = 0; r <= g->a->reps; r++) {
    double t0 = pulse_cli_now();
    if (check(pulse_cuda_locate(g->idx, g->chunk_first, g->cm_cls, g->cm_rank, g->locate_d,
                                g->stream),
              "locate"))
      return 1;
    g->samples[r] = pulse_cli_since(t0);
  }
  *locate = median(g->samples + 1, g->a->reps);
  return 0;
}

/* The device work of applying the step once its decoded bytes are on the
 * device (keys, chunk ranges and deltas uploaded outside the timing, as the
 * patch stream's decode threads do while the patch downloads): the class
 * counts of the base, locate, gather with the digest moves, and the
 * scatter, in the workspace with the internal steps the patch stream
 * runs. The target goes back to the base before each run. */
static int gpu_time_on_device(gpu_run *g, double *seconds) {
  uint64_t K = g->total, chunks = g->chunks;
  uint64_t *keys = malloc((size_t)K * 8 + 8);
  uint16_t *delta = malloc((size_t)K * 2 + 8);
  uint16_t *old_bits = malloc((size_t)K * 2 + 8), *new_bits = malloc((size_t)K * 2 + 8);
  int rc = 1;
  if (!keys || !delta || !old_bits || !new_bits) {
    fprintf(stderr, PROG ": out of host memory\n");
    goto done;
  }
  for (uint64_t j = 0; j < K; j++)
    keys[j] = (uint64_t)g->cm_cls[j] << 32 | g->cm_rank[j];
  if (check(pulse_cuda_download(old_bits, g->out.old_d, (size_t)K * 2, g->stream), "download") ||
      check(pulse_cuda_download(new_bits, g->out.new_d, (size_t)K * 2, g->stream), "download"))
    goto done;
  for (uint64_t j = 0; j < K; j++) /* in the keys' order */
    delta[j] = pulse_bf16_delta(old_bits[g->cm_from[j]], new_bits[g->cm_from[j]]);
  if (check(pulse_cuda_alloc(&g->keys_d, (size_t)K * 8 + 8), "keys") ||
      check(pulse_cuda_alloc(&g->chunk_first_d, (size_t)(chunks + 1) * 8), "chunks") ||
      check(pulse_cuda_alloc(&g->delta_d, (size_t)K * 2 + 8), "deltas") ||
      check(pulse_cuda_alloc(&g->old_d, (size_t)K * 2 + 8), "old bits") ||
      check(pulse_cuda_alloc(&g->new_d, (size_t)K * 2 + 8), "new bits") ||
      check(pulse_cuda_upload(g->keys_d, keys, (size_t)K * 8, g->stream), "upload") ||
      check(pulse_cuda_upload(g->chunk_first_d, g->chunk_first, (size_t)(chunks + 1) * 8,
                              g->stream),
            "upload") ||
      check(pulse_cuda_upload(g->delta_d, delta, (size_t)K * 2, g->stream), "upload"))
    goto done;
  for (int r = 0; r <= g->a->reps; r++) {
    pulse_cuda_class_index *idx = NULL;
    if (check(pulse_cuda_copy(g->target_d, g->snap_d, (size_t)g->N * 2, g->stream), "copy") ||
        check(pulse_cuda_sync(g->stream), "sync"))
      goto done;
    double t0 = pulse_cli_now();
    pulse_status st = pulse_cuda_class_index_build_in_(g->ws, g->target, g->T, g->chunk_log2,
                                                       g->stream, &idx);
    if (st == PULSE_OK)
      st = pulse_cuda_locate_in_(idx, g->chunk_first_d, g->keys_d, K, g->locate_d, g->stream);
    if (st == PULSE_OK)
      st = pulse_cuda_gather_(g->ws, g->target, g->T, g->first, g->locate_d, g->delta_d,
                              g->old_d, g->new_d, g->stream);
    if (st == PULSE_OK)
      st = pulse_cuda_changes_digest_in_(g->ws, g->first, g->T, g->locate_d, g->old_d, g->new_d,
                                         g->moves, g->stream);
    if (st == PULSE_OK)
      st = pulse_cuda_scatter_in_(g->ws, g->target, g->T, g->first, g->locate_d, g->new_d,
                                  g->stream);
    g->samples[r] = pulse_cli_since(t0);
    pulse_cuda_class_index_free(idx);
    if (check(st, "apply on the device"))
      goto done;
  }
  /* The step landed: the target is the weights' BF16 now. */
  uint16_t *got = malloc((size_t)g->N * 2);
  int same = 1;
  if (got == NULL ||
      check(pulse_cuda_download(got, g->target_d, (size_t)g->N * 2, g->stream), "download"))
    goto done;
  for (uint64_t i = 0; i < g->N && same; i++)
    same = got[i] == pulse_bf16_from_f32_bits(g->cur[i]);
  free(got);
  if (!same) {
    fprintf(stderr, PROG ": apply on the device: the target is not the step's weights\n");
    goto done;
  }
  *seconds = median(g->samples + 1, g->a->reps);
  rc = 0;
done:
  free(keys), free(delta), free(old_bits), free(new_bits);
  return rc;
}

/* Apply: scatter of decoded positions and new bits, beside a copy of the
 * BF16 weights, and the other device steps of an apply. */
static int gpu_time_apply(gpu_run *g) {
  uint64_t N = g->N;
  uint32_t T = g->T;
  int reps = g->a->reps;
  double *samples = g->samples, t0;
  for (int r = 0; r <= reps; r++) {
    t0 = pulse_cli_now();
    if (check(pulse_cuda_copy(g->copy_d, g->target_d, (size_t)N * 2, g->stream), "copy") ||
        check(pulse_cuda_sync(g->stream), "sync"))
      return 1;
    samples[r] = pulse_cli_since(t0);
  }
  double copy2 = median(samples + 1, reps);
  for (int r = 0; r <= reps; r++) {
    t0 = pulse_cli_now();
    if (check(pulse_cuda_scatter(g->ws, g->target, T, g->first, g->out.pos_d, g->out.new_d,
                                 g->stream),
              "scatter"))
      return 1;
    samples[r] = pulse_cli_since(t0);
  }
  double scatter = median(samples + 1, reps);
  for (int r = 0; r <= reps; r++) {
    t0 = pulse_cli_now();
    if (check(pulse_cuda_changes_digest(g->ws, g->first, T, g->out.pos_d, g->out.old_d,
                                        g->out.new_d, g->digests, g->stream),
              "digest moves"))
      return 1;
    samples[r] = pulse_cli_since(t0);
  }
  double moves = median(samples + 1, reps);
  for (int r = 0; r <= reps; r++) {
    pulse_cuda_class_index_free(g->idx);
    g->idx = NULL;
    t0 = pulse_cli_now();
    if (check(pulse_cuda_class_index_build(g->base, T, g->chunk_log2, g->stream, &g->idx),
              "class index"))
      return 1;
    samples[r] = pulse_cli_since(t0);
  }
  double index = median(samples + 1, reps), locate = 0, on_device = 0;
  if (gpu_time_locate(g, &locate) != 0 || gpu_time_on_device(g, &on_device) != 0)
    return 1;
  gpu_row("apply: scatter", scatter), gpu_row("D2D copy (BF16)", copy2);
  gpu_row("class counts", index), gpu_row("locate", locate), gpu_row("digest moves", moves);
  printf("gpu: apply: scatter of %" PRIu64 " changes in %.3f ms (target < 2 ms for 1%% of 10^9); "
         "D2D copy of the %.2f GB of BF16 weights %.3f ms\n",
         g->total, 1e3 * scatter, 2e-9 * (double)N, 1e3 * copy2);
  gpu_row("apply on the device, bytes there", on_device);
  printf("gpu: apply on the device: %.3f ms for %" PRIu64 " changes of %" PRIu64
         " parameters once the decoded bytes are there (class counts, locate, gather, "
         "digest moves, scatter, as the patch stream runs them; target < 2 ms for 1%% of "
         "10^9)\n",
         1e3 * on_device, g->total, N);
  printf("gpu: apply, other device steps: class counts %.3f ms, locate %.3f ms "
         "(with %.1f MB "
         "of ranks uploaded), digest moves %.3f ms; all with scatter %.3f ms\n",
         1e3 * index, 1e3 * locate, 8e-6 * (double)g->total, 1e3 * moves,
         1e3 * (index + locate + moves + 2 * scatter));
  return 0;
}

/* End to end: the host range coder included. */
static int gpu_time_e2e(gpu_run *g) {
  uint32_t T = g->T;
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.threads = 0;
  if (check(pulse_cuda_digest(g->ws, g->base, T, g->digests, g->stream), "digests"))
    return 1;
  for (uint32_t t = 0; t < T; t++)
    g->enc[t] = (pulse_cuda_encode_tensor){{g->names[t], PULSE_DTYPE_BF16, 1, {g->numel[t]}},
                                           g->table[t].cur_d,
                                           PULSE_DTYPE_F32,
                                           g->table[t].snapshot_d,
                                           &g->digests[t]};
  double t0 = pulse_cli_now();
  if (check(pulse_cuda_patch_encode(g->ws, &eo, g->enc, T, 0, g->stream, &g->patch, NULL),
            "patch encode"))
    return 1;
  double e2e_enc = pulse_cli_since(t0);
  gpu_row("encode end to end", e2e_enc);
  printf("gpu: encode end to end (pulse_cuda_patch_encode, host coder on all "
         "cores): %.3f s, "
         "patch %.2f MB = %.3f bytes/change\n",
         e2e_enc, 1e-6 * (double)g->patch.size,
         g->total ? (double)g->patch.size / (double)g->total : 0.0);
  if (check(pulse_patch_open(g->patch.data, g->patch.size, &g->opened), "patch open") ||
      check(pulse_cuda_copy(g->target_d, g->snap_d, (size_t)g->N * 2, g->stream), "copy"))
    return 1;
  for (uint32_t t = 0; t < T; t++)
    g->apply_t[t] =
        (pulse_cuda_target){g->names[t], g->target[t].data_d, g->numel[t], &g->digests[t]};
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = 0;
  t0 = pulse_cli_now();
  if (check(pulse_cuda_patch_apply(g->ws, g->opened, g->apply_t, T, &ao, g->stream, NULL),
            "patch apply"))
    return 1;
  double e2e_apply = pulse_cli_since(t0);
  gpu_row("apply end to end", e2e_apply);
  printf("gpu: apply end to end (pulse_cuda_patch_apply, host decoder on all "
         "cores): %.3f s\n",
         e2e_apply);
  return 0;
}

int bench_gpu_main(int argc, char **argv) {
  gpu_args a = {1000000000ull, 64, 0.01, 5, 1, NULL};
  int pr = parse(argc, argv, &a);
  if (pr >= 0)
    return pr;
  pulse_report *rep = NULL;
  if (a.report != NULL) {
    if (pulse_report_create(a.report, "gpu", argc, argv, &rep) != PULSE_OK)
      return fprintf(stderr, PROG ": --report: cannot make %s\n", a.report), 1;
    static const char *const cols[] = {"operation", "ms"};
    gpu_rt = pulse_report_table_add(rep, "timings", cols, 2);
  }
  if (!pulse_cuda_available()) {
    const char *why = pulse_cuda_unavailable_reason();
    char line[300];
    if (strcmp(why, "no CUDA device") == 0)
      snprintf(line, sizeof line, "gpu: no CUDA device");
    else
      snprintf(line, sizeof line, "gpu: no CUDA device (%.200s)", why);
    printf("%s\n", line);
    pulse_report_note(rep, line);
    return gpu_report_close(rep, 0);
  }
  static gpu_run g; /* static: large, and one per process */
  memset(&g, 0, sizeof g);
  g.a = &a;
  g.N = a.params;
  g.T = a.tensors < g.N ? a.tensors : (uint32_t)g.N;
  g.chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  int rc = gpu_setup(&g);
  if (rc == 0)
    printf("gpu: %" PRIu64 " parameters in %u tensors (FP32 master + BF16 snapshot), "
           "density %.2f%%\n",
           g.N, g.T, 100.0 * a.density);
  if (rc == 0)
    rc = gpu_time_copy(&g);
  if (rc == 0)
    rc = gpu_time_detect(&g);
  if (rc == 0)
    rc = gpu_time_apply(&g);
  if (rc == 0 && a.e2e)
    rc = gpu_time_e2e(&g);
  gpu_free(&g);
  return gpu_report_close(rep, rc);
}
