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
 *              locate, digest moves), beside a D2D copy of the BF16 weights
 * and once each, end to end with the host coder: pulse_cuda_patch_encode
 * and pulse_cuda_patch_apply. Without a device it says so and exits 0. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_impl.h"
#include "parallel_impl.h"
#include "pulse_cuda.h"
#include "pulse_elem.h"
#include "toolkit_args.h"
#include "toolkit_report.h"
#include "toolkit_time.h"

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

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

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
  pulse_tk_fail(PROG, what, st);
  return 1;
}

static double median(double *s, int n) {
  return pulse_tk_median(s, (size_t)n);
}

/* ---------------------------------------------------------------- main */

static int parse(int argc, char **argv, gpu_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *v;
    int r;
    uint64_t u;
    if (pulse_tk_opt_flag(argv[i], "--help")) {
      bench_gpu_usage(stdout);
      return 0;
    } else if (pulse_tk_opt_flag(argv[i], "--no-e2e")) {
      a->e2e = 0;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return fprintf(stderr, PROG ": --report needs a folder\n"), 2;
      a->report = v;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &a->params) != 0 || a->params < 1024)
        return fprintf(stderr, PROG ": --params needs an integer >= 1024\n"), 2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--tensors", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_u64(v, &u) != 0 || u < 1 || u > 100000)
        return fprintf(stderr,
                       PROG ": --tensors needs an integer in 1..100000\n"),
               2;
      a->tensors = (uint32_t)u;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--density", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_double(v, &a->density) != 0 ||
          !(a->density >= 0.0) || a->density > 1.0)
        return fprintf(stderr, PROG ": --density needs a number in 0..1\n"), 2;
    } else if ((r = pulse_tk_opt_value(argc, argv, &i, "--reps", &v)) != 0) {
      if (r < 0 || pulse_tk_parse_int(v, 1, MAX_REPS, &a->reps) != 0)
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
                       uint8_t *cm_cls, uint32_t *cm_rank) {
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
      }
    }
    at = end;
  }
  chunk_first[g] = at;
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
  const uint64_t N = a.params;
  const uint32_t T = a.tensors < N ? a.tensors : (uint32_t)N;
  const uint32_t chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  int rc = 1;
  double samples[MAX_REPS + 1], t0;
  uint32_t *cur = malloc((size_t)N * 4);
  uint16_t *snap = malloc((size_t)N * 2);
  uint64_t *numel = calloc(T + 1, 8), *tensor_changes = calloc(T + 1, 8),
           *first = calloc(T + 1, 8);
  char(*names)[32] = calloc(T + 1, 32);
  pulse_cuda_detect_tensor *table = calloc(T + 1, sizeof *table);
  pulse_cuda_bf16_tensor *target = calloc(T + 1, sizeof *target),
                         *base = calloc(T + 1, sizeof *base);
  pulse_cuda_encode_tensor *enc = calloc(T + 1, sizeof *enc);
  pulse_cuda_target *apply_t = calloc(T + 1, sizeof *apply_t);
  pulse_tensor_digest *digests = calloc(T + 1, sizeof *digests);
  uint64_t *pos = NULL, *chunk_first = NULL;
  uint8_t *cls = NULL, *cm_cls = NULL;
  uint32_t *rank = NULL, *cm_rank = NULL;
  void *cur_d = NULL, *snap_d = NULL, *copy_d = NULL, *target_d = NULL;
  pulse_cuda_changes out = {0, NULL, NULL, NULL, NULL, NULL, NULL, 0};
  void *locate_d = NULL;
  pulse_cuda_workspace *ws = NULL;
  pulse_cuda_class_index *idx = NULL;
  pulse_buffer patch = {NULL, 0};
  pulse_patch *opened = NULL;
  uint64_t total = 0, chunks = 0;
  if (!cur || !snap || !numel || !tensor_changes || !first || !names ||
      !table || !target || !base || !enc || !apply_t || !digests) {
    fprintf(stderr, PROG ": out of host memory for %" PRIu64 " parameters\n",
            N);
    goto done;
  }
  fill_job fj = {cur, snap, N, a.density};
  pulse_parallel_for(0, (size_t)((N + (1u << 20) - 1) >> 20), fill_block, &fj);
  if (check(pulse_cuda_workspace_create(&ws), "workspace") ||
      check(pulse_cuda_alloc(&cur_d, (size_t)N * 4), "device weights") ||
      check(pulse_cuda_alloc(&snap_d, (size_t)N * 2), "device snapshot") ||
      check(pulse_cuda_alloc(&copy_d, (size_t)N * 6), "device copy") ||
      check(pulse_cuda_alloc(&target_d, (size_t)N * 2), "device target") ||
      check(pulse_cuda_upload(cur_d, cur, (size_t)N * 4, NULL), "upload") ||
      check(pulse_cuda_upload(snap_d, snap, (size_t)N * 2, NULL), "upload") ||
      check(pulse_cuda_copy(target_d, snap_d, (size_t)N * 2, NULL), "copy") ||
      check(pulse_cuda_sync(NULL), "sync"))
    goto done;
  uint64_t off = 0;
  for (uint32_t t = 0; t < T; t++) {
    numel[t] = N / T + (t < N % T ? 1 : 0);
    snprintf(names[t], 32, "layer.%u.weight", t);
    table[t] =
        (pulse_cuda_detect_tensor){(uint32_t *)cur_d + off, PULSE_DTYPE_F32,
                                   (uint16_t *)snap_d + off, numel[t]};
    base[t] = (pulse_cuda_bf16_tensor){(uint16_t *)snap_d + off, numel[t]};
    target[t] = (pulse_cuda_bf16_tensor){(uint16_t *)target_d + off, numel[t]};
    off += numel[t];
  }
  printf("gpu: %" PRIu64
         " parameters in %u tensors (FP32 master + BF16 snapshot), "
         "density %.2f%%\n",
         N, T, 100.0 * a.density);

  /* The copy: the bytes detection reads, device to device. */
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_copy(copy_d, cur_d, (size_t)N * 4, NULL), "copy") ||
        check(pulse_cuda_copy((uint8_t *)copy_d + (size_t)N * 4, snap_d,
                              (size_t)N * 2, NULL),
              "copy") ||
        check(pulse_cuda_sync(NULL), "sync"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double copy6 = median(samples + 1, a.reps);
  gpu_row("D2D copy (FP32 + BF16)", copy6);
  printf("gpu: copy: %.2f GB D2D in %.3f ms = %.1f GB/s\n", 6e-9 * (double)N,
         1e3 * copy6, 6e-9 * (double)N / copy6);

  /* Encode: detection with the rank form, the whole table. */
  pulse_cuda_detect_opts dopts = PULSE_CUDA_DETECT_OPTS_INIT;
  if (check(pulse_cuda_detect(ws, table, T, &dopts, NULL, NULL, &total, NULL),
            "detect size"))
    goto done;
  if (check(pulse_cuda_chunk_count(table, T, chunk_log2, &chunks), "chunks"))
    goto done;
  out.capacity = total;
  out.chunk_capacity = chunks;
  if (check(pulse_cuda_alloc((void **)&out.pos_d, (size_t)total * 8 + 8),
            "changes") ||
      check(pulse_cuda_alloc((void **)&out.old_d, (size_t)total * 2 + 8),
            "changes") ||
      check(pulse_cuda_alloc((void **)&out.new_d, (size_t)total * 2 + 8),
            "changes") ||
      check(pulse_cuda_alloc((void **)&out.class_d, (size_t)total + 8),
            "changes") ||
      check(pulse_cuda_alloc((void **)&out.rank_d, (size_t)total * 4 + 8),
            "changes") ||
      check(pulse_cuda_alloc((void **)&out.chunk_hist_d,
                             (size_t)chunks * 1024 + 8),
            "changes"))
    goto done;
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_detect(ws, table, T, &dopts, &out, tensor_changes,
                                &total, NULL),
              "detect"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double detect = median(samples + 1, a.reps);
  gpu_row("detect (rank form)", detect);
  printf("gpu: encode: detect %" PRIu64
         " changes (rank form) in %.3f ms = %.1f GB/s read, "
         "%.1f%% of the copy (target >= 80%%)\n",
         total, 1e3 * detect, 6e-9 * (double)N / detect,
         100.0 * copy6 / detect);
  for (uint32_t t = 0; t < T; t++)
    first[t + 1] = first[t] + tensor_changes[t];

  /* Apply: scatter of decoded positions and new bits, beside a copy of the
   * BF16 weights. */
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_copy(copy_d, target_d, (size_t)N * 2, NULL), "copy") ||
        check(pulse_cuda_sync(NULL), "sync"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double copy2 = median(samples + 1, a.reps);
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_scatter(ws, target, T, first, out.pos_d, out.new_d,
                                 NULL),
              "scatter"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double scatter = median(samples + 1, a.reps);
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_changes_digest(ws, first, T, out.pos_d, out.old_d,
                                        out.new_d, digests, NULL),
              "digest moves"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double moves = median(samples + 1, a.reps);
  for (int r = 0; r <= a.reps; r++) {
    pulse_cuda_class_index_free(idx);
    idx = NULL;
    t0 = pulse_tk_now();
    if (check(pulse_cuda_class_index_build(base, T, chunk_log2, NULL, &idx),
              "class index"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double index = median(samples + 1, a.reps);
  pos = malloc((size_t)total * 8 + 8);
  cls = malloc((size_t)total + 8);
  rank = malloc((size_t)total * 4 + 8);
  cm_cls = malloc((size_t)total + 8);
  cm_rank = malloc((size_t)total * 4 + 8);
  chunk_first = malloc((size_t)(chunks + 1) * 8);
  if (!pos || !cls || !rank || !cm_cls || !cm_rank || !chunk_first ||
      check(pulse_cuda_download(pos, out.pos_d, (size_t)total * 8, NULL),
            "download") ||
      check(pulse_cuda_download(cls, out.class_d, (size_t)total, NULL),
            "download") ||
      check(pulse_cuda_download(rank, out.rank_d, (size_t)total * 4, NULL),
            "download") ||
      check(pulse_cuda_alloc(&locate_d, (size_t)total * 8 + 8),
            "locate output"))
    goto done;
  class_major(tensor_changes, numel, T, chunk_log2, pos, cls, rank, chunk_first,
              cm_cls, cm_rank);
  for (int r = 0; r <= a.reps; r++) {
    t0 = pulse_tk_now();
    if (check(pulse_cuda_locate(idx, chunk_first, cm_cls, cm_rank, locate_d,
                                NULL),
              "locate"))
      goto done;
    samples[r] = pulse_tk_since(t0);
  }
  double locate = median(samples + 1, a.reps);
  gpu_row("apply: scatter", scatter), gpu_row("D2D copy (BF16)", copy2);
  gpu_row("class counts", index), gpu_row("locate", locate), gpu_row("digest moves", moves);
  printf("gpu: apply: scatter of %" PRIu64
         " changes in %.3f ms (target < 2 ms for 1%% of 10^9); "
         "D2D copy of the %.2f GB of BF16 weights %.3f ms\n",
         total, 1e3 * scatter, 2e-9 * (double)N, 1e3 * copy2);
  printf("gpu: apply, other device steps: class counts %.3f ms, locate %.3f ms "
         "(with %.1f MB "
         "of ranks uploaded), digest moves %.3f ms; all with scatter %.3f ms\n",
         1e3 * index, 1e3 * locate, 8e-6 * (double)total, 1e3 * moves,
         1e3 * (index + locate + moves + 2 * scatter));

  if (a.e2e) {
    /* End to end: the host range coder included. */
    pulse_encode_opts eo = PULSE_ENCODE_OPTS_INIT;
    eo.threads = 0;
    if (check(pulse_cuda_digest(ws, base, T, digests, NULL), "digests"))
      goto done;
    for (uint32_t t = 0; t < T; t++)
      enc[t] = (pulse_cuda_encode_tensor){
          {names[t], PULSE_DTYPE_BF16, 1, {numel[t]}},
          table[t].cur_d,
          PULSE_DTYPE_F32,
          table[t].snapshot_d,
          &digests[t]};
    t0 = pulse_tk_now();
    if (check(pulse_cuda_patch_encode(ws, &eo, enc, T, 0, NULL, &patch, NULL),
              "patch encode"))
      goto done;
    double e2e_enc = pulse_tk_since(t0);
    gpu_row("encode end to end", e2e_enc);
    printf("gpu: encode end to end (pulse_cuda_patch_encode, host coder on all "
           "cores): %.3f s, "
           "patch %.2f MB = %.3f bytes/change\n",
           e2e_enc, 1e-6 * (double)patch.size,
           total ? (double)patch.size / (double)total : 0.0);
    if (check(pulse_patch_open(patch.data, patch.size, &opened),
              "patch open") ||
        check(pulse_cuda_copy(target_d, snap_d, (size_t)N * 2, NULL), "copy"))
      goto done;
    for (uint32_t t = 0; t < T; t++)
      apply_t[t] = (pulse_cuda_target){names[t], target[t].data_d, numel[t],
                                       &digests[t]};
    pulse_apply_opts ao = PULSE_APPLY_OPTS_INIT;
    ao.threads = 0;
    t0 = pulse_tk_now();
    if (check(pulse_cuda_patch_apply(ws, opened, apply_t, T, &ao, NULL, NULL),
              "patch apply"))
      goto done;
    double e2e_apply = pulse_tk_since(t0);
    gpu_row("apply end to end", e2e_apply);
    printf("gpu: apply end to end (pulse_cuda_patch_apply, host decoder on all "
           "cores): %.3f s\n",
           e2e_apply);
  }
  rc = 0;
done:
  pulse_patch_free(opened);
  pulse_buffer_free(&patch);
  pulse_cuda_class_index_free(idx);
  pulse_cuda_workspace_free(ws);
  pulse_cuda_free(cur_d), pulse_cuda_free(snap_d), pulse_cuda_free(copy_d);
  pulse_cuda_free(target_d), pulse_cuda_free(locate_d);
  pulse_cuda_free(out.pos_d), pulse_cuda_free(out.old_d),
      pulse_cuda_free(out.new_d);
  pulse_cuda_free(out.class_d), pulse_cuda_free(out.rank_d),
      pulse_cuda_free(out.chunk_hist_d);
  free(cur), free(snap), free(numel), free(tensor_changes), free(first),
      free(names);
  free(table), free(target), free(base), free(enc), free(apply_t),
      free(digests);
  free(pos), free(cls), free(rank), free(cm_cls), free(cm_rank),
      free(chunk_first);
  return gpu_report_close(rep, rc);
}
