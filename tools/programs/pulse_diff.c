/* pulse-diff BASE NEW -o PATCH: the patch that turns checkpoint BASE into
 * checkpoint NEW (NEW may hold FP32 master weights: they are cast to BF16 by
 * the one rounding, exactly as the trainer's BF16 copy would be). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_file.h"
#include "pulse_safetensors.h"
#include "cli_args.h"
#include "cli_files.h"
#include "cli_time.h"

static void usage(FILE *f) {
  fprintf(f, "usage: pulse-diff BASE NEW -o PATCH [options]\n"
             "  BASE, NEW        safetensors checkpoints (a file, a "
             "model.safetensors.index.json,\n"
             "                   or a directory); BASE is the state receivers "
             "hold (BF16, or F32\n"
             "                   cast to BF16), NEW may be BF16 or FP32 master "
             "weights\n"
             "  -o PATCH         where to write the patch (atomically)\n"
             "  --step N         step of NEW (default: NEW's metadata 'step', "
             "else BASE's + 1)\n"
             "  --base-step N    step of BASE (default: BASE's metadata "
             "'step', else 0)\n"
             "  --plain          plain position model: about 40%% more bytes, "
             "applied about 5x\n"
             "                   faster on a CPU (no pass over the base), "
             "squashes without weights\n"
             "  --chunk-log2 N   elements per chunk 2^N (10..30, default 20)\n"
             "  --format N       patch format version: 2 (default; fast static "
             "codes), 3\n"
             "                   (values against a per-patch model, ~4%% "
             "smaller) or 1\n"
             "                   (adaptive range coder: about 2%% smaller, "
             "3-7x slower to decode)\n"
             "  --threads N      threads (default: one per core)\n");
}

static int fail(const char *what, pulse_status st) { return pulse_cli_fail("pulse-diff", what, st); }

/* The command line, read by parse_args. */
typedef struct {
  const char *paths[2], *out_path;
  uint64_t step, base_step;
  int have_step, have_base_step, plain, threads, chunk_log2, format;
} diff_args;

/* Reads argv into *a. Returns -1 to go on, else the exit code (0 for
 * --help, 2 for bad usage, with the message printed). */
static int parse_args(int argc, char **argv, diff_args *a) {
  const char *v;
  int npaths = 0;
  memset(a, 0, sizeof *a);
  a->chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  a->format = PULSE_PATCH_VERSION;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help") || pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "-o", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      a->out_path = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--step", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->step) != 0)
        return fprintf(stderr, "pulse-diff: --step needs a non-negative integer\n"), 2;
      a->have_step = 1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--base-step", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->base_step) != 0)
        return fprintf(stderr, "pulse-diff: --base-step needs a non-negative integer\n"), 2;
      a->have_base_step = 1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--chunk-log2", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 10, 30, &a->chunk_log2) != 0)
        return fprintf(stderr, "pulse-diff: --chunk-log2 needs an integer in 10..30\n"), 2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--format", &v)) != 0) {
      if (r < 0 ||
          pulse_cli_parse_int(v, PULSE_PATCH_VERSION_MIN,
                              PULSE_PATCH_VERSION_MAX, &a->format) != 0)
        return fprintf(stderr,
                       "pulse-diff: --format needs an integer in %d..%d\n",
                       PULSE_PATCH_VERSION_MIN, PULSE_PATCH_VERSION_MAX),
               2;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &a->threads) != 0)
        return fprintf(stderr, "pulse-diff: --threads needs an integer in 0..256\n"), 2;
    } else if (pulse_cli_opt_flag(argv[i], "--plain")) {
      a->plain = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "pulse-diff: unknown option '%s'\n", argv[i]);
      return usage(stderr), 2;
    } else if (npaths < 2) {
      a->paths[npaths++] = argv[i];
    } else {
      return usage(stderr), 2;
    }
  }
  if (npaths != 2 || a->out_path == NULL)
    return usage(stderr), 2;
  return -1;
}

/* The changes of BASE's tensor i in NEW, into *changes. Returns 0 or the
 * exit code (the message printed). */
static int diff_tensor(const pulse_cli_state *base, size_t i, pulse_st_model *next, int threads,
                       pulse_changes *changes, uint64_t *numel) {
  pulse_st_tensor t;
  if (pulse_st_model_tensor_find(next, base->info[i].name, &t) != PULSE_OK) {
    fprintf(stderr, "pulse-diff: NEW has no tensor '%s' (it is in BASE)\n", base->info[i].name);
    return 1;
  }
  if (t.ndim != base->info[i].ndim ||
      memcmp(t.shape, base->info[i].shape, t.ndim * sizeof t.shape[0]) != 0) {
    fprintf(stderr, "pulse-diff: tensor '%s' has another shape in NEW\n", base->info[i].name);
    return 1;
  }
  if (t.dtype != PULSE_DTYPE_BF16 && t.dtype != PULSE_DTYPE_F32) {
    fprintf(stderr, "pulse-diff: tensor '%s' in NEW is %s: only BF16 and F32 are diffed "
                    "(F16 does not convert to BF16 exactly)\n",
            base->info[i].name, pulse_dtype_name(t.dtype));
    return 1;
  }
  /* The map may be unaligned for its dtype: copy in that case. */
  size_t esize = pulse_dtype_size(t.dtype);
  void *aligned = NULL;
  const void *cur = t.data;
  if (((uintptr_t)t.data % esize) != 0) {
    aligned = malloc(t.nbytes + 4);
    if (aligned == NULL)
      return fail("memory", PULSE_ERR_NOMEM);
    memcpy(aligned, t.data, t.nbytes);
    cur = aligned;
  }
  /* update_snapshot = 0: the base is only read, never written. */
  pulse_status st = pulse_detect_fast(cur, t.dtype, base->bits[i], t.numel, 0, threads, changes);
  free(aligned);
  if (st != PULSE_OK)
    return fail(base->info[i].name, st);
  *numel = t.numel;
  return 0;
}

/* Encodes the changes and writes the patch; prints the figures. */
static int write_patch(const diff_args *a, const pulse_encode_tensor *enc, size_t n,
                       uint64_t total, uint64_t changed, double t0) {
  pulse_encode_opts opts;
  pulse_encode_opts_init(&opts);
  opts.step = a->step;
  opts.base_step = a->base_step;
  opts.pos_model = a->plain ? PULSE_POS_PLAIN : PULSE_POS_CLASS;
  opts.chunk_log2 = (uint32_t)a->chunk_log2;
  opts.threads = a->threads;
  opts.format_version = (uint32_t)a->format;
  pulse_buffer patch = {NULL, 0};
  pulse_status st = pulse_patch_encode(&opts, enc, n, &patch);
  if (st != PULSE_OK)
    return fail("encode", st);
  int rc = 0;
  st = pulse_file_write_atomic(a->out_path, patch.data, patch.size);
  if (st != PULSE_OK) {
    rc = fail(a->out_path, st);
  } else {
    double dense = (double)total * 2.0;
    printf("pulse-diff: step %" PRIu64 " <- %" PRIu64 ": %" PRIu64 " of %" PRIu64
           " parameters changed (%.3f%%), patch %zu bytes (%.3f B/changed), "
           "dense BF16 %.0f bytes, %.1fx smaller, %.2f s\n",
           a->step, a->base_step, changed, total,
           total ? 100.0 * (double)changed / (double)total : 0.0, patch.size,
           changed ? (double)patch.size / (double)changed : 0.0, dense,
           patch.size ? dense / (double)patch.size : 0.0, pulse_cli_now() - t0);
  }
  pulse_buffer_free(&patch);
  return rc;
}

int main(int argc, char **argv) {
  diff_args a;
  int rc = parse_args(argc, argv, &a);
  if (rc >= 0)
    return rc;

  double t0 = pulse_cli_now();
  pulse_cli_state base;
  pulse_status st = pulse_cli_state_load(a.paths[0], 0, &base);
  if (st != PULSE_OK)
    return fail(a.paths[0], st);
  pulse_st_model *next = NULL;
  st = pulse_st_model_open(a.paths[1], &next);
  if (st != PULSE_OK) {
    pulse_cli_state_free(&base);
    return fail(a.paths[1], st);
  }
  if (!a.have_base_step && !pulse_cli_state_step(&base, &a.base_step))
    a.base_step = 0;
  if (!a.have_step) {
    const char *s = pulse_st_model_metadata_get(next, "step");
    if (s == NULL || pulse_cli_parse_u64(s, &a.step) != 0)
      a.step = a.base_step + 1;
  }

  rc = 0;
  size_t n = base.count;
  pulse_changes *changes = calloc(n + 1, sizeof *changes);
  pulse_encode_tensor *enc = calloc(n + 1, sizeof *enc);
  uint64_t total = 0, changed = 0;
  if (changes == NULL || enc == NULL) {
    rc = fail("memory", PULSE_ERR_NOMEM);
  } else if (pulse_st_model_tensor_count(next) != n) {
    fprintf(stderr, "pulse-diff: BASE has %zu tensors, NEW has %zu: not the same model\n", n,
            pulse_st_model_tensor_count(next));
    rc = 1;
  }
  for (size_t i = 0; i < n && rc == 0; i++) {
    uint64_t numel = 0;
    rc = diff_tensor(&base, i, next, a.threads, &changes[i], &numel);
    enc[i].info = base.info[i];
    enc[i].base = base.bits[i];
    enc[i].changes = &changes[i];
    total += numel;
    changed += changes[i].count;
  }
  if (rc == 0)
    rc = write_patch(&a, enc, n, total, changed, t0);
  for (size_t i = 0; changes && i < n; i++)
    pulse_changes_free(&changes[i]);
  free(changes), free(enc);
  pulse_st_model_close(next);
  pulse_cli_state_free(&base);
  return rc;
}
