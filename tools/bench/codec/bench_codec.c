/* bench_codec.c - `pulse-bench codec`: per step, change density, patch sizes
 * of both format versions (class and plain positions) against the
 * baselines and the entropy bound, throughputs of
 * change detection, patch encoding and decode+apply, and a bit-exact check
 * that applying the patch rebuilds the new BF16 state.
 *
 * Inputs: a synthetic trajectory (sim_synth) or consecutive safetensors
 * snapshots. Timed work runs on one thread (decode + apply on
 * --apply-threads, the receiver's threads); each figure is the median of
 * --reps repetitions. */
#include "bench_impl.h"
#include "hugepage_impl.h"

#include "pulse_safetensors.h"
#include "cli_args.h"
#include "cli_report.h"
#include "sim_synth.h"
#include "cli_time.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define PROG "pulse-bench codec"
#define MAX_REPS 1000

/* The codings measured: both position models in both format versions;
 * the first is the default. */
enum { CODINGS = 4 };
static const struct {
  unsigned version;
  pulse_pos_model model;
  const char *label; /* text tables */
  const char *key;   /* JSON keys and report columns */
} codings[CODINGS] = {
    {2, PULSE_POS_CLASS, "v2, class positions (default)", "v2"},
    {2, PULSE_POS_PLAIN, "v2, plain positions", "v2_plain"},
    {1, PULSE_POS_CLASS, "v1, class positions (range coder)", "v1"},
    {1, PULSE_POS_PLAIN, "v1, plain positions (range coder)", "v1_plain"},
};

typedef struct {
  uint64_t params, steps, seed;
  double lr;
  int threads, reps, json;
  int apply_threads; /* decode + apply threads (a receiver's opts.threads) */
  int synth_opts_given; /* any of --params --steps --lr --seed */
  char **snapshots;
  int snapshot_count;
  const char *report;       /* --report DIR */
  pulse_report_table *rt;   /* its per-step table, or NULL */
  struct summary *rep_sum;  /* the summary so far, for the report */
} codec_args;

/* Everything measured on one step. */
typedef struct {
  uint64_t step, base_step, params, changed;
  uint64_t tensors; /* in the table: the bound allows 96 B of overhead each */
  uint64_t bytes[CODINGS];
  bench_baseline_bytes base;
  bench_entropy_bits ent;
  uint64_t weight_bytes, snapshot_bytes; /* what detection reads */
  double detect_s, memcpy_s, encode_s[CODINGS], apply_s[CODINGS];
  double decode_s[CODINGS]; /* streams alone, no base; 0 when impossible (v1 class) */
  /* Class codings applied through a receiver's class index (built before
   * the timing, as a receiver holds it from the previous step; the commit's
   * index upkeep is timed); 0 for plain codings. */
  double apply_indexed_s[CODINGS];
  double index_build_s;  /* building the indexes of the base, one thread */
  uint64_t index_bytes;  /* the indexes' memory */
  double generate_s; /* synthetic: time of the optimizer step; else 0 */
} step_result;

/* Buffers shared by the steps. */
typedef struct {
  bench_table table;
  uint16_t *old_bf16; /* base state (table.total values) */
  uint16_t *work;     /* apply target */
  uint8_t *copy_dst;  /* memcpy destination */
  size_t copy_cap;
  pulse_changes *changes;       /* per tensor */
  pulse_tensor_digest *digests; /* per tensor, of old_bf16 */
  pulse_encode_tensor *enc;     /* per tensor */
  pulse_host_tensor *targets;
  pulse_class_index **index; /* per tensor, for indexed applies */
  const void **cur;       /* per tensor: new weights as detection reads them */
  pulse_dtype *cur_dtype; /* per tensor */
} codec_ctx;

void bench_codec_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench codec [options]\n"
      "  Patch sizes of format versions 2 and 1 (class and plain positions)\n"
      "  against dense, int32+BF16, varint-gap baselines (through zstd at\n"
      "  levels 1, 3 and 19; the smallest is \"the baseline\", named; dense\n"
      "  BF16 at level 19 on 16 slices of 512 KiB above 8 MiB, scaled) and\n"
      "  the empirical entropy bound; throughputs of change detection, patch encode,\n"
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
      "                 through a class index) and apply_noindex_mchanges_per_s\n"
      "                 (without) are these\n"
      "  --json         one JSON object per step, then a summary object\n"
      "  --report DIR   also write DIR/steps.csv, DIR/per_changed.csv and\n"
      "                 DIR/report.html (charts)\n"
      "  --help         this text\n"
      "Other timed work runs on one thread. Exit status: 0 ok, 1 failure or\n"
      "a patch that does not rebuild the new state bit for bit, 2 usage.\n");
}

/* ---------------------------------------------------------------- helpers */

static int fail_status(const char *what, pulse_status st) {
  const char *detail = pulse_error_detail();
  fprintf(stderr, PROG ": %s: %s%s%s%s\n", what, pulse_status_str(st),
          detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
  return 1;
}

/* Decimal with thousands separators, into buf (32 bytes). */
static const char *fmt_u64(uint64_t v, char *buf) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  int out = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0 && (n - i) % 3 == 0)
      buf[out++] = ',';
    buf[out++] = tmp[i];
  }
  buf[out] = '\0';
  return buf;
}

static double per(double num, double den) {
  return den > 0 ? num / den : 0.0;
}

static void ctx_free(codec_ctx *c) {
  free(c->old_bf16);
  free(c->work);
  free(c->copy_dst);
  if (c->changes != NULL)
    for (size_t i = 0; i < c->table.count; i++)
      pulse_changes_free(&c->changes[i]);
  free(c->changes);
  free(c->digests);
  free(c->enc);
  free(c->targets);
  free(c->index);
  free(c->cur);
  free(c->cur_dtype);
}

/* Allocates the per-tensor and per-state buffers once the table is known. */
static int ctx_alloc(codec_ctx *c) {
  size_t n = c->table.count;
  uint64_t total = c->table.total;
  c->old_bf16 = malloc((size_t)total * 2 + 1);
  /* The apply's target lives where a receiver's do: pulse_sub allocates
   * each tensor on huge pages (hugepage_impl.h), where the random accesses
   * of an apply do not miss the TLB (with 4 KiB pages an indexed apply of
   * the default trajectory ran at 0.7x). */
  c->work = pulse_hugepage_alloc((size_t)total * 2 + 1);
  c->changes = calloc(n, sizeof *c->changes);
  c->digests = calloc(n, sizeof *c->digests);
  c->enc = calloc(n, sizeof *c->enc);
  c->targets = calloc(n, sizeof *c->targets);
  c->index = calloc(n + 1, sizeof *c->index);
  c->cur = calloc(n, sizeof *c->cur);
  c->cur_dtype = calloc(n, sizeof *c->cur_dtype);
  /* memcpy destination: up to F32 weights plus the BF16 snapshot */
  c->copy_cap = (size_t)total * 6 + 1;
  c->copy_dst = malloc(c->copy_cap);
  if (c->old_bf16 == NULL || c->work == NULL || c->changes == NULL ||
      c->digests == NULL || c->enc == NULL || c->targets == NULL || c->index == NULL ||
      c->cur == NULL || c->cur_dtype == NULL || c->copy_dst == NULL) {
    fprintf(stderr, PROG ": out of memory for %" PRIu64 " parameters\n", total);
    return 1;
  }
  /* Touch the pages now so the first timing does not pay for faults. */
  memset(c->copy_dst, 0, c->copy_cap);
  memset(c->work, 0, (size_t)total * 2);
  for (size_t i = 0; i < n; i++)
    c->changes[i] = (pulse_changes)PULSE_CHANGES_INIT;
  return 0;
}

/* ------------------------------------------------------------ one step */

static int encode_patch(codec_ctx *c, const step_result *r, int coding, int reps,
                        double *secs, pulse_buffer *out) {
  pulse_encode_opts opts = PULSE_ENCODE_OPTS_INIT;
  opts.step = r->step;
  opts.base_step = r->base_step;
  opts.pos_model = codings[coding].model;
  opts.format_version = codings[coding].version;
  opts.threads = 1;
  double t[MAX_REPS];
  for (int k = 0; k < reps; k++) {
    pulse_buffer_free(out);
    double t0 = pulse_tk_now();
    pulse_status st = pulse_patch_encode(&opts, c->enc, c->table.count, out);
    t[k] = pulse_tk_since(t0);
    if (st != PULSE_OK)
      return fail_status(codings[coding].label, st);
  }
  *secs = pulse_tk_median(t, (size_t)reps);
  return 0;
}

/* Decodes every stream of `patch` without the base (the coder alone, what a
 * receiver's host does for a GPU target), `reps` times; 0 s when the coding
 * cannot be decoded without the base. */
static int decode_streams(const pulse_buffer *patch, const char *label, int reps, double *secs) {
  double t[MAX_REPS];
  *secs = 0;
  for (int k = 0; k < reps; k++) {
    pulse_patch *p = NULL;
    pulse_status st = pulse_patch_open(patch->data, patch->size, &p);
    double t0 = pulse_tk_now();
    if (st == PULSE_OK)
      st = pulse_patch_check_streams(p, 1);
    t[k] = pulse_tk_since(t0);
    pulse_patch_free(p);
    if (st == PULSE_ERR_UNSUPPORTED)
      return 0;
    if (st != PULSE_OK)
      return fail_status(label, st);
  }
  *secs = pulse_tk_median(t, (size_t)reps);
  return 0;
}

static void free_indexes(codec_ctx *c) {
  for (size_t i = 0; i < c->table.count; i++) {
    pulse_class_index_free(c->index[i]);
    c->index[i] = NULL;
  }
}

/* Opens and applies `patch` to a copy of the base, `reps` times; checks
 * that the result equals new_bf16 bit for bit. indexed: through class
 * indexes of the base, built before each timed apply (r->index_build_s and
 * r->index_bytes get the build's figures). */
static int apply_patch(codec_ctx *c, step_result *r, const pulse_buffer *patch,
                       const char *label, const uint16_t *new_bf16, int reps, int threads,
                       int indexed, double *secs) {
  const bench_table *tb = &c->table;
  pulse_apply_opts opts = PULSE_APPLY_OPTS_INIT;
  opts.threads = threads;
  opts.class_index = c->index; /* NULL entries unless indexed */
  double t[MAX_REPS];
  for (int k = 0; k < reps; k++) {
    memcpy(c->work, c->old_bf16, (size_t)tb->total * 2);
    for (size_t i = 0; i < tb->count; i++) {
      c->targets[i].name = tb->info[i].name;
      c->targets[i].data = c->work + tb->offset[i];
      c->targets[i].numel = tb->numel[i];
      c->targets[i].digest = &c->digests[i];
    }
    free_indexes(c);
    if (indexed) {
      double b0 = pulse_tk_now();
      r->index_bytes = 0;
      for (size_t i = 0; i < tb->count; i++) {
        pulse_status st =
            pulse_class_index_build(c->targets[i].data, c->targets[i].numel, 1, &c->index[i]);
        if (st != PULSE_OK) {
          free_indexes(c);
          return fail_status("class index", st);
        }
        r->index_bytes += pulse_class_index_bytes(c->index[i]);
      }
      r->index_build_s = pulse_tk_since(b0);
    }
    pulse_patch *p = NULL;
    double t0 = pulse_tk_now();
    pulse_status st = pulse_patch_open(patch->data, patch->size, &p);
    if (st == PULSE_OK)
      st = pulse_patch_apply(p, c->targets, tb->count, &opts);
    t[k] = pulse_tk_since(t0);
    uint64_t total_changed = p ? pulse_patch_total_changed(p) : 0;
    pulse_patch_free(p);
    if (indexed && st == PULSE_OK) /* the commits kept each index exact */
      for (size_t i = 0; i < tb->count && st == PULSE_OK; i++)
        st = pulse_class_index_check(c->index[i], c->targets[i].data, c->targets[i].numel);
    free_indexes(c);
    if (st != PULSE_OK) {
      char what[64];
      snprintf(what, sizeof what, "step %" PRIu64 ": apply (%s)", r->step,
               label);
      return fail_status(what, st);
    }
    if (total_changed != r->changed) {
      fprintf(stderr,
              PROG ": step %" PRIu64 ": patch (%s) says %" PRIu64
                   " changes, detection found %" PRIu64 "\n",
              r->step, label, total_changed, r->changed);
      return 1;
    }
  }
  *secs = pulse_tk_median(t, (size_t)reps);
  if (memcmp(c->work, new_bf16, (size_t)tb->total * 2) != 0) {
    uint64_t first = 0;
    while (c->work[first] == new_bf16[first])
      first++;
    fprintf(stderr,
            PROG ": step %" PRIu64 ": verify FAILED (%s): the applied state "
                 "differs from the new BF16 state, first at element %" PRIu64
                 " (0x%04x, expected 0x%04x)\n",
            r->step, label, first, c->work[first], new_bf16[first]);
    return 1;
  }
  return 0;
}

/* Measures one step: the base state is c->old_bf16, the new weights are
 * c->cur / c->cur_dtype per tensor, and their BF16 state is new_bf16. */
static int measure_step(codec_ctx *c, const codec_args *a,
                        const uint16_t *new_bf16, step_result *r) {
  const bench_table *tb = &c->table;
  pulse_status st;
  r->params = tb->total;
  r->snapshot_bytes = tb->total * 2;
  r->weight_bytes = 0;
  for (size_t i = 0; i < tb->count; i++) {
    c->digests[i] =
        pulse_digest_bf16(c->old_bf16 + tb->offset[i], tb->numel[i]);
    r->weight_bytes += tb->numel[i] * pulse_dtype_size(c->cur_dtype[i]);
  }

  /* Change detection against the snapshot, one thread; the snapshot is left
   * alone so every repetition does the same work. */
  double t[MAX_REPS];
  for (int k = 0; k < a->reps; k++) {
    double t0 = pulse_tk_now();
    for (size_t i = 0; i < tb->count; i++) {
      c->changes[i].count = 0;
      st = pulse_detect_fast(c->cur[i], c->cur_dtype[i],
                             c->old_bf16 + tb->offset[i], tb->numel[i], 0, 1,
                             &c->changes[i]);
      if (st != PULSE_OK)
        return fail_status("change detection", st);
    }
    t[k] = pulse_tk_since(t0);
  }
  r->detect_s = pulse_tk_median(t, (size_t)a->reps);
  r->changed = 0;
  r->tensors = tb->count;
  for (size_t i = 0; i < tb->count; i++)
    r->changed += c->changes[i].count;

  /* memcpy of the same bytes, for scale. */
  for (int k = 0; k < a->reps; k++) {
    double t0 = pulse_tk_now();
    uint8_t *dst = c->copy_dst;
    for (size_t i = 0; i < tb->count; i++) {
      size_t n = (size_t)(tb->numel[i] * pulse_dtype_size(c->cur_dtype[i]));
      memcpy(dst, c->cur[i], n);
      dst += n;
    }
    memcpy(dst, c->old_bf16, (size_t)tb->total * 2);
    t[k] = pulse_tk_since(t0);
  }
  r->memcpy_s = pulse_tk_median(t, (size_t)a->reps);

  /* Every coding: encode, then apply and check. */
  for (size_t i = 0; i < tb->count; i++) {
    c->enc[i].info = tb->info[i];
    c->enc[i].base = c->old_bf16 + tb->offset[i];
    c->enc[i].changes = &c->changes[i];
    c->enc[i].base_digest = &c->digests[i];
  }
  for (int k = 0; k < CODINGS; k++) {
    pulse_buffer patch = {NULL, 0};
    int rc = encode_patch(c, r, k, a->reps, &r->encode_s[k], &patch);
    r->bytes[k] = patch.size;
    if (rc == 0)
      rc = apply_patch(c, r, &patch, codings[k].label, new_bf16, a->reps, a->apply_threads, 0,
                       &r->apply_s[k]);
    r->apply_indexed_s[k] = 0;
    if (rc == 0 && codings[k].model == PULSE_POS_CLASS)
      rc = apply_patch(c, r, &patch, codings[k].label, new_bf16, a->reps, a->apply_threads, 1,
                       &r->apply_indexed_s[k]);
    if (rc == 0)
      rc = decode_streams(&patch, codings[k].label, a->reps, &r->decode_s[k]);
    pulse_buffer_free(&patch);
    if (rc != 0)
      return rc;
  }

  st = bench_baselines_compute(tb, c->changes, new_bf16, &r->base);
  if (st != PULSE_OK)
    return fail_status("baselines", st);
  st = bench_entropy_compute(tb, c->old_bf16, c->changes, &r->ent);
  if (st != PULSE_OK)
    return fail_status("entropy", st);
  return 0;
}

/* ------------------------------------------------------------- output */

static double bound_bytes(const bench_entropy_bits *e) {
  return (e->positions_class_bits + e->values_bits) / 8.0;
}

/* The size target: within 5% of the bound plus 96 bytes per tensor. */
static double allowance_bytes(const step_result *r) {
  return 1.05 * bound_bytes(&r->ent) + 96.0 * (double)r->tensors;
}

typedef struct {
  const char *label;
  double bytes;
} row;

/* The baselines' rows, in output order: each encoding raw (where it has a
 * raw row), then through zstd at every level. */
static size_t baseline_rows(const bench_baseline_bytes *b, row *rows,
                            char (*labels)[96]) {
  size_t n = 0;
  for (int k = 0; k < BENCH_ZKINDS; k++) {
    if (k == BENCH_DENSE_Z)
      rows[n++] = (row){"dense BF16", (double)b->dense};
    if (k == BENCH_INT32_Z)
      rows[n++] = (row){"int32 index + BF16 value", (double)b->int32_bf16};
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
      bench_baseline_label(k, l, labels[n], sizeof labels[n]);
      if (k == BENCH_DENSE_Z && l == 2 && b->dense_z19_read < b->dense)
        strcat(labels[n], " (sampled)");
      rows[n] = (row){labels[n], (double)b->zstd[k][l]};
      n++;
    }
  }
  return n;
}

static void print_rows(const step_result *r, double divide) {
  row rows[9 + 2 + BENCH_ZKINDS * BENCH_ZSTD_LEVELS] = {
      {codings[0].label, (double)r->bytes[0]},
      {codings[1].label, (double)r->bytes[1]},
      {codings[2].label, (double)r->bytes[2]},
      {codings[3].label, (double)r->bytes[3]},
      {"entropy bound (positions|class + values)", bound_bytes(&r->ent)},
      {"  positions | tensor, old exponent class",
       r->ent.positions_class_bits / 8.0},
      {"  positions | tensor only", r->ent.positions_tensor_bits / 8.0},
      {"  values (zig-zag delta)", r->ent.values_bits / 8.0},
      {"  values | old exponent class", r->ent.values_class_bits / 8.0},
  };
  char labels[sizeof rows / sizeof rows[0]][96];
  size_t n = 9 + baseline_rows(&r->base, rows + 9, labels + 9);
  printf("  %-44s %14s %10s\n", "encoding", "bytes", "B/changed");
  for (size_t i = 0; i < n; i++) {
    char b[32];
    printf("  %-44s %14s %10.3f\n", rows[i].label,
           fmt_u64((uint64_t)(rows[i].bytes / divide + 0.5), b),
           per(rows[i].bytes, (double)r->changed));
  }
  int kind, li;
  char best[96], b[32];
  uint64_t bb = bench_baseline_best(&r->base, &kind, &li);
  bench_baseline_label(kind, li, best, sizeof best);
  printf("  the baseline (the smallest zstd row measured whole): %s, %s bytes; "
         "v2 is %.2fx smaller\n",
         best, fmt_u64((uint64_t)((double)bb / divide + 0.5), b),
         per((double)bb, (double)r->bytes[0]));
}

static void print_speeds(const step_result *r) {
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  printf("  detect   %.1f MB (weights + snapshot) in %.2f ms = %.2f GB/s; "
         "memcpy %.2f GB/s\n",
         moved / 1e6, r->detect_s * 1e3, per(moved, r->detect_s) / 1e9,
         per(moved, r->memcpy_s) / 1e9);
  printf("  %-36s %10s %10s %12s %14s %14s\n", "coding", "encode ms", "apply ms",
         "M changed/s", "indexed M/s (+)", "decode M/s (*)");
  for (int k = 0; k < CODINGS; k++) {
    char dec[32] = "-", ix[32] = "-";
    if (r->decode_s[k] > 0)
      snprintf(dec, sizeof dec, "%.1f", per((double)r->changed, r->decode_s[k]) / 1e6);
    if (r->apply_indexed_s[k] > 0)
      snprintf(ix, sizeof ix, "%.1f", per((double)r->changed, r->apply_indexed_s[k]) / 1e6);
    printf("  %-36s %10.2f %10.2f %12.1f %14s %14s\n", codings[k].label, r->encode_s[k] * 1e3,
           r->apply_s[k] * 1e3, per((double)r->changed, r->apply_s[k]) / 1e6, ix, dec);
  }
  printf("  (+) through a receiver's class index (%.2f B/param, built in %.1f ms), its upkeep "
         "included\n",
         per((double)r->index_bytes, (double)r->params), r->index_build_s * 1e3);
  printf("  (*) streams alone, without the base: the host's share of a GPU apply\n");
}

static void print_step_text(const step_result *r) {
  char b1[32], b2[32];
  printf("\nstep %" PRIu64 " (base %" PRIu64 "): %s of %s changed (%.3f%%), "
         "verify OK",
         r->step, r->base_step, fmt_u64(r->changed, b1), fmt_u64(r->params, b2),
         100.0 * per((double)r->changed, (double)r->params));
  if (r->generate_s > 0)
    printf(" (generated in %.2f s)", r->generate_s);
  printf("\n");
  print_rows(r, 1.0);
  print_speeds(r);
}

/* The baselines' sizes ("bytes_<key>"), or with `per_changed` their bytes
 * per changed parameter ("<key>_per_changed"), and the baseline named. */
static void print_baselines_json(const bench_baseline_bytes *b, const double *per_changed) {
  char key[64];
  double c = per_changed ? *per_changed : 0;
  if (per_changed)
    printf(",\"dense_per_changed\":%.6g,\"int32_bf16_per_changed\":%.6g",
           per((double)b->dense, c), per((double)b->int32_bf16, c));
  else
    printf(",\"bytes_dense\":%" PRIu64 ",\"bytes_int32_bf16\":%" PRIu64, b->dense,
           b->int32_bf16);
  for (int k = 0; k < BENCH_ZKINDS; k++)
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
      bench_baseline_key(k, l, key, sizeof key);
      if (per_changed)
        printf(",\"%s_per_changed\":%.6g", key, per((double)b->zstd[k][l], c));
      else
        printf(",\"bytes_%s\":%" PRIu64, key, b->zstd[k][l]);
    }
  int kind, li;
  uint64_t best = bench_baseline_best(b, &kind, &li);
  char label[96];
  bench_baseline_key(kind, li, key, sizeof key);
  bench_baseline_label(kind, li, label, sizeof label);
  printf(",\"dense_zstd19_read_bytes\":%" PRIu64 ",\"baseline\":\"%s\""
         ",\"baseline_name\":\"%s\"",
         b->dense_z19_read, key, label);
  if (per_changed)
    printf(",\"baseline_per_changed\":%.6g", per((double)best, c));
  else
    printf(",\"bytes_baseline\":%" PRIu64, best);
}

static void print_step_json(const step_result *r) {
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  printf("{\"step\":%" PRIu64 ",\"base_step\":%" PRIu64 ",\"params\":%" PRIu64
         ",\"changed\":%" PRIu64 ",\"density\":%.6g",
         r->step, r->base_step, r->params, r->changed,
         per((double)r->changed, (double)r->params));
  for (int k = 0; k < CODINGS; k++)
    printf(",\"bytes_%s\":%" PRIu64, codings[k].key, r->bytes[k]);
  print_baselines_json(&r->base, NULL);
  printf(",\"tensors\":%" PRIu64 ",\"bound_allowance_bytes\":%.1f", r->tensors,
         allowance_bytes(r));
  printf(",\"bound_bytes\":%.1f,\"bound_positions_bytes\":%.1f"
         ",\"bound_positions_tensor_bytes\":%.1f,\"bound_values_bytes\":%.1f"
         ",\"bound_values_class_bytes\":%.1f",
         bound_bytes(&r->ent), r->ent.positions_class_bits / 8.0,
         r->ent.positions_tensor_bits / 8.0, r->ent.values_bits / 8.0,
         r->ent.values_class_bits / 8.0);
  printf(",\"weight_bytes\":%" PRIu64 ",\"snapshot_bytes\":%" PRIu64
         ",\"detect_s\":%.6g,\"encode_bytes_per_s\":%.6g"
         ",\"memcpy_bytes_per_s\":%.6g",
         r->weight_bytes, r->snapshot_bytes, r->detect_s,
         per(moved, r->detect_s), per(moved, r->memcpy_s));
  for (int k = 0; k < CODINGS; k++)
    printf(",\"patch_encode_%s_s\":%.6g,\"apply_%s_s\":%.6g"
           ",\"apply_%s_changed_per_s\":%.6g,\"decode_%s_changed_per_s\":%.6g",
           codings[k].key, r->encode_s[k], codings[k].key, r->apply_s[k],
           codings[k].key, per((double)r->changed, r->apply_s[k]), codings[k].key,
           per((double)r->changed, r->decode_s[k]));
  for (int k = 0; k < CODINGS; k++)
    if (codings[k].model == PULSE_POS_CLASS)
      printf(",\"apply_%s_indexed_changed_per_s\":%.6g", codings[k].key,
             per((double)r->changed, r->apply_indexed_s[k]));
  printf(",\"class_index_bytes\":%" PRIu64 ",\"class_index_build_s\":%.6g", r->index_bytes,
         r->index_build_s);
  printf(",\"apply_mchanges_per_s\":%.6g,\"apply_noindex_mchanges_per_s\":%.6g",
         per((double)r->changed, r->apply_indexed_s[0]) / 1e6,
         per((double)r->changed, r->apply_s[0]) / 1e6);
  /* The default coding under the plain names. */
  printf(",\"patch_encode_s\":%.6g,\"apply_s\":%.6g,\"apply_changed_per_s\":%.6g"
         ",\"apply_plain_changed_per_s\":%.6g,\"verify\":\"ok\"}\n",
         r->encode_s[0], r->apply_s[0], per((double)r->changed, r->apply_s[0]),
         per((double)r->changed, r->apply_s[1]));
}

/* Sums sizes over steps; throughputs are averaged per step. */
typedef struct summary {
  step_result sum;
  double encode_bps, memcpy_bps, apply_cps[CODINGS], decode_cps[CODINGS];
  double indexed_cps[CODINGS];
  uint64_t within[CODINGS]; /* steps inside the bound's allowance */
  uint64_t steps;
} summary;

static void summary_add(summary *s, const step_result *r) {
  step_result *t = &s->sum;
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  t->params += r->params;
  t->changed += r->changed;
  for (int k = 0; k < CODINGS; k++) {
    t->bytes[k] += r->bytes[k];
    t->encode_s[k] += r->encode_s[k];
    s->apply_cps[k] += per((double)r->changed, r->apply_s[k]);
    s->decode_cps[k] += per((double)r->changed, r->decode_s[k]);
    s->indexed_cps[k] += per((double)r->changed, r->apply_indexed_s[k]);
    s->within[k] += (double)r->bytes[k] <= allowance_bytes(r);
  }
  t->base.dense += r->base.dense;
  t->base.int32_bf16 += r->base.int32_bf16;
  t->base.dense_z19_read += r->base.dense_z19_read;
  for (int k = 0; k < BENCH_ZKINDS; k++)
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++)
      t->base.zstd[k][l] += r->base.zstd[k][l];
  t->ent.positions_class_bits += r->ent.positions_class_bits;
  t->ent.positions_tensor_bits += r->ent.positions_tensor_bits;
  t->ent.values_bits += r->ent.values_bits;
  t->ent.values_class_bits += r->ent.values_class_bits;
  s->encode_bps += per(moved, r->detect_s);
  s->memcpy_bps += per(moved, r->memcpy_s);
  s->steps++;
}

static void print_summary_text(const summary *s) {
  const step_result *t = &s->sum;
  double n = (double)(s->steps ? s->steps : 1);
  char b1[32];
  printf("\nsummary over %" PRIu64 " steps: %.3f%% changed on average; "
         "bytes are per step, B/changed is total bytes / total changed\n",
         s->steps, 100.0 * per((double)t->changed, (double)t->params));
  print_rows(t, n);
  double def = (double)t->bytes[0], bound = bound_bytes(&t->ent);
  int bk, bl;
  char best[96];
  double bb = (double)bench_baseline_best(&t->base, &bk, &bl);
  bench_baseline_label(bk, bl, best, sizeof best);
  printf("  v2 / the baseline (%s) = %.3f   v2 / int32+BF16+zstd-1 = %.3f   "
         "v2 / gap+abs+zstd-1 (prod.) = %.3f\n",
         best, per(def, bb), per(def, (double)t->base.zstd[BENCH_INT32_Z][0]),
         per(def, (double)t->base.zstd[BENCH_GAP_ABS_Z][0]));
  printf("  to the bound: v2 %.3f, v2 plain %.3f, v1 %.3f, v1 plain %.3f\n", per(def, bound),
         per((double)t->bytes[1], bound), per((double)t->bytes[2], bound),
         per((double)t->bytes[3], bound));
  printf("  steps within 5%% + 96 B/tensor of the bound: v2 %" PRIu64 "/%" PRIu64
         ", v2 plain %" PRIu64 ", v1 %" PRIu64 ", v1 plain %" PRIu64 "\n",
         s->within[0], s->steps, s->within[1], s->within[2], s->within[3]);
  printf("  mean per step: detect %.2f GB/s, memcpy %.2f GB/s\n", s->encode_bps / n / 1e9,
         s->memcpy_bps / n / 1e9);
  for (int k = 0; k < CODINGS; k++) {
    printf("  %-36s encode %8.2f ms, apply %7.1f M changed/s", codings[k].label,
           t->encode_s[k] / n * 1e3, s->apply_cps[k] / n / 1e6);
    if (s->indexed_cps[k] > 0)
      printf(", indexed %7.1f M/s", s->indexed_cps[k] / n / 1e6);
    if (s->decode_cps[k] > 0)
      printf(", decode alone %7.1f M/s", s->decode_cps[k] / n / 1e6);
    printf("\n");
  }
  printf("  verify OK: %s changes over %" PRIu64 " steps rebuilt bit for bit\n",
         fmt_u64(t->changed, b1), s->steps);
  double dense_z = (double)t->base.zstd[BENCH_DENSE_Z][0];
  for (int l = 1; l < BENCH_ZSTD_LEVELS; l++)
    if ((double)t->base.zstd[BENCH_DENSE_Z][l] < dense_z)
      dense_z = (double)t->base.zstd[BENCH_DENSE_Z][l];
  printf("  bandwidth: a v2 patch is %.1fx smaller than dense BF16, %.1fx smaller than "
         "dense BF16 through zstd (its best level), %.2fx smaller than the baseline\n",
         per((double)t->base.dense, def), per(dense_z, def), per(bb, def));
}

static void print_summary_json(const summary *s, const char *source, int apply_threads) {
  const step_result *t = &s->sum;
  double n = (double)(s->steps ? s->steps : 1);
  double c = (double)t->changed;
  printf("{\"summary\":true,\"source\":\"%s\",\"bound_model\":\"%s\""
         ",\"steps\":%" PRIu64 ",\"params_total\":%" PRIu64
         ",\"changed_total\":%" PRIu64 ",\"density\":%.6g",
         source, BENCH_BOUND_MODEL, s->steps, t->params, t->changed,
         per(c, (double)t->params));
  double bound = bound_bytes(&t->ent);
  int bk, bl;
  uint64_t best = bench_baseline_best(&t->base, &bk, &bl);
  for (int k = 0; k < CODINGS; k++)
    printf(",\"%s_per_changed\":%.6g,\"ratio_%s_bound\":%.6g"
           ",\"ratio_%s_int32_bf16_zstd\":%.6g,\"ratio_%s_delta_abs_zstd\":%.6g"
           ",\"ratio_%s_baseline\":%.6g"
           ",\"patch_encode_%s_s\":%.6g,\"apply_%s_changed_per_s\":%.6g"
           ",\"decode_%s_changed_per_s\":%.6g",
           codings[k].key, per((double)t->bytes[k], c), codings[k].key,
           per((double)t->bytes[k], bound), codings[k].key,
           per((double)t->bytes[k], (double)t->base.zstd[BENCH_INT32_Z][0]), codings[k].key,
           per((double)t->bytes[k], (double)t->base.zstd[BENCH_GAP_ABS_Z][0]), codings[k].key,
           per((double)t->bytes[k], (double)best), codings[k].key,
           t->encode_s[k] / n, codings[k].key, s->apply_cps[k] / n, codings[k].key,
           s->decode_cps[k] / n);
  for (int k = 0; k < CODINGS; k++)
    printf(",\"steps_within_bound_allowance_%s\":%" PRIu64, codings[k].key, s->within[k]);
  for (int k = 0; k < CODINGS; k++)
    if (codings[k].model == PULSE_POS_CLASS)
      printf(",\"apply_%s_indexed_changed_per_s\":%.6g", codings[k].key,
             s->indexed_cps[k] / n);
  printf(",\"apply_threads\":%d,\"apply_mchanges_per_s\":%.6g"
         ",\"apply_noindex_mchanges_per_s\":%.6g",
         apply_threads, s->indexed_cps[0] / n / 1e6, s->apply_cps[0] / n / 1e6);
  printf(",\"bound_per_changed\":%.6g", per(bound, c));
  print_baselines_json(&t->base, &c);
  printf(",\"encode_bytes_per_s\":%.6g,\"memcpy_bytes_per_s\":%.6g"
         ",\"patch_encode_s\":%.6g,\"apply_changed_per_s\":%.6g"
         ",\"apply_plain_changed_per_s\":%.6g,\"verify\":\"ok\"}\n",
         s->encode_bps / n, s->memcpy_bps / n, t->encode_s[0] / n, s->apply_cps[0] / n,
         s->apply_cps[1] / n);
}

/* The baselines' cells of a report row, in report_cols' order (after the
 * bound): dense raw, its zstd levels, int32 raw, its levels, the gap ones. */
static void report_baselines(pulse_report_table *rt, const bench_baseline_bytes *b) {
  for (int k = 0; k < BENCH_ZKINDS; k++) {
    if (k == BENCH_DENSE_Z)
      pulse_report_num(rt, (double)b->dense);
    if (k == BENCH_INT32_Z)
      pulse_report_num(rt, (double)b->int32_bf16);
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++)
      pulse_report_num(rt, (double)b->zstd[k][l]);
  }
}

static void report_step(const codec_args *a, summary *s, const step_result *r) {
  summary_add(s, r);
  if (a->rt != NULL) {
    const double v[] = {(double)r->step, (double)r->changed,
                        100.0 * per((double)r->changed, (double)r->params), (double)r->bytes[0],
                        (double)r->bytes[1], (double)r->bytes[2], (double)r->bytes[3],
                        bound_bytes(&r->ent)};
    pulse_report_row(a->rt);
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
      pulse_report_num(a->rt, v[i]);
    report_baselines(a->rt, &r->base);
    *a->rep_sum = *s;
  }
  if (a->json)
    print_step_json(r);
  else
    print_step_text(r);
  fflush(stdout);
}

/* ------------------------------------------------------- synthetic input */

static int run_synthetic(const codec_args *a) {
  pulse_synth_opts so = PULSE_SYNTH_OPTS_INIT;
  so.params = a->params;
  so.seed = a->seed;
  so.lr = a->lr;
  so.threads = a->threads;
  pulse_synth *syn = NULL;
  double t0 = pulse_tk_now();
  pulse_status st = pulse_synth_create(&so, &syn);
  if (st != PULSE_OK)
    return fail_status("synthetic trajectory", st);
  double create_s = pulse_tk_since(t0);

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
  if (ctx_alloc(&c) != 0)
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
    printf("timings: one thread (decode + apply: %d, 0 = one per core), median of %d "
           "repetitions; detection reads FP32 master weights + the BF16 snapshot\n",
           a->apply_threads, a->reps);
  }

  summary sum;
  memset(&sum, 0, sizeof sum);
  for (uint64_t k = 1; k <= a->steps; k++) {
    step_result r;
    memset(&r, 0, sizeof r);
    t0 = pulse_tk_now();
    st = pulse_synth_step(syn);
    if (st != PULSE_OK) {
      fail_status("synthetic step", st);
      goto done;
    }
    r.generate_s = pulse_tk_since(t0);
    r.step = k;
    r.base_step = k - 1;
    if (measure_step(&c, a, bf16, &r) != 0)
      goto done;
    report_step(a, &sum, &r);
    memcpy(c.old_bf16, bf16, (size_t)tb->total * 2);
  }
  if (a->json)
    print_summary_json(&sum, source, a->apply_threads);
  else
    print_summary_text(&sum);
  rc = 0;
done:
  ctx_free(&c);
  free(tb->info);
  free(tb->numel);
  free(tb->offset);
  pulse_synth_free(syn);
  return rc;
}

/* ------------------------------------------------------ snapshot input */

/* Owned copies of one snapshot, in the table's layout. */
typedef struct {
  uint16_t *bf16; /* the BF16 state (F32 tensors cast by the one rounding) */
  float *f32;     /* F32 tensors as stored (NULL when there are none) */
  pulse_dtype *dtype; /* per tensor, as stored */
  uint64_t step;
  int has_step;
} snapshot;

static void snapshot_free(snapshot *s) {
  free(s->bf16);
  free(s->f32);
  free(s->dtype);
  memset(s, 0, sizeof *s);
}

static int same_shape(const pulse_tensor_info *a, const pulse_st_tensor *b) {
  if (a->ndim != b->ndim)
    return 0;
  for (uint32_t d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d])
      return 0;
  return 1;
}

/* Builds the table from the first model (names are copied). */
static int table_from_model(const pulse_st_model *m, const char *path,
                            bench_table *tb) {
  tb->count = pulse_st_model_tensor_count(m);
  tb->info = calloc(tb->count ? tb->count : 1, sizeof *tb->info);
  tb->numel = calloc(tb->count ? tb->count : 1, sizeof *tb->numel);
  tb->offset = calloc(tb->count ? tb->count : 1, sizeof *tb->offset);
  if (tb->info == NULL || tb->numel == NULL || tb->offset == NULL) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  uint64_t total = 0;
  for (size_t i = 0; i < tb->count; i++) {
    pulse_st_tensor t;
    pulse_status st = pulse_st_model_tensor_get(m, i, &t);
    if (st != PULSE_OK)
      return fail_status(path, st);
    char *name = strdup(t.name);
    if (name == NULL) {
      fprintf(stderr, PROG ": out of memory\n");
      return 1;
    }
    tb->info[i].name = name;
    tb->info[i].dtype = PULSE_DTYPE_BF16;
    tb->info[i].ndim = t.ndim;
    memcpy(tb->info[i].shape, t.shape, sizeof t.shape);
    tb->numel[i] = t.numel;
    tb->offset[i] = total;
    total += t.numel;
  }
  tb->total = total;
  if (total == 0) {
    fprintf(stderr, PROG ": %s: no parameters\n", path);
    return 1;
  }
  return 0;
}

/* Reads one snapshot into `out` (allocated here) in the table's layout. */
static int snapshot_load(const char *path, const bench_table *tb,
                         const pulse_st_model *m, snapshot *out) {
  size_t n = pulse_st_model_tensor_count(m);
  if (n != tb->count) {
    fprintf(stderr, PROG ": %s: %zu tensors, the first snapshot has %zu\n",
            path, n, tb->count);
    return 1;
  }
  out->bf16 = malloc((size_t)tb->total * 2);
  out->dtype = calloc(tb->count, sizeof *out->dtype);
  if (out->bf16 == NULL || out->dtype == NULL) {
    fprintf(stderr, PROG ": out of memory\n");
    return 1;
  }
  const char *step = pulse_st_model_metadata_get(m, "step");
  out->has_step = step != NULL && pulse_tk_parse_u64(step, &out->step) == 0;
  for (size_t i = 0; i < tb->count; i++) {
    pulse_st_tensor t;
    pulse_status st = pulse_st_model_tensor_find(m, tb->info[i].name, &t);
    if (st != PULSE_OK) {
      fprintf(stderr, PROG ": %s: tensor %s: %s\n", path, tb->info[i].name,
              pulse_status_str(st));
      return 1;
    }
    if (!same_shape(&tb->info[i], &t)) {
      fprintf(stderr, PROG ": %s: tensor %s changes shape\n", path, t.name);
      return 1;
    }
    uint16_t *dst = out->bf16 + tb->offset[i];
    out->dtype[i] = t.dtype;
    if (t.dtype == PULSE_DTYPE_BF16) {
      memcpy(dst, t.data, (size_t)t.nbytes);
    } else if (t.dtype == PULSE_DTYPE_F32) {
      if (out->f32 == NULL) {
        out->f32 = malloc((size_t)tb->total * 4);
        if (out->f32 == NULL) {
          fprintf(stderr, PROG ": out of memory\n");
          return 1;
        }
      }
      /* Copy first: the mapping may leave F32 data unaligned. */
      float *f = out->f32 + tb->offset[i];
      memcpy(f, t.data, (size_t)t.nbytes);
      pulse_bf16_cast_f32(f, dst, t.numel);
    } else {
      fprintf(stderr,
              PROG ": %s: tensor %s is %s; snapshots must be BF16 or F32\n",
              path, t.name, pulse_dtype_name(t.dtype));
      return 1;
    }
  }
  return 0;
}

static int open_and_load(const char *path, bench_table *tb, snapshot *out) {
  pulse_st_model *m = NULL;
  pulse_status st = pulse_st_model_open(path, &m);
  if (st != PULSE_OK)
    return fail_status(path, st);
  int rc = 0;
  if (tb->info == NULL)
    rc = table_from_model(m, path, tb);
  if (rc == 0)
    rc = snapshot_load(path, tb, m, out);
  pulse_st_model_close(m);
  return rc;
}

static int run_snapshots(const codec_args *a) {
  codec_ctx c;
  memset(&c, 0, sizeof c);
  bench_table *tb = &c.table;
  snapshot prev, next;
  memset(&prev, 0, sizeof prev);
  memset(&next, 0, sizeof next);
  int rc = open_and_load(a->snapshots[0], tb, &prev);
  if (rc == 0)
    rc = ctx_alloc(&c);
  if (rc != 0)
    goto done;
  rc = 1;
  memcpy(c.old_bf16, prev.bf16, (size_t)tb->total * 2);
  uint64_t prev_step = prev.has_step ? prev.step : 0;

  char source[512];
  snprintf(source, sizeof source,
           "snapshots: %d files from %.300s, %" PRIu64 " params in %zu tensors",
           a->snapshot_count, a->snapshots[0], tb->total, tb->count);
  for (char *p = source; *p; p++)
    if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20)
      *p = '_'; /* keep the JSON string plain */
  if (!a->json) {
    printf(PROG ": %s\n", source);
    printf("entropy bound model: %s\n", BENCH_BOUND_MODEL);
    printf("timings: one thread (decode + apply: %d, 0 = one per core), median of %d "
           "repetitions; detection reads the new weights as stored + the BF16 snapshot\n",
           a->apply_threads, a->reps);
  }

  summary sum;
  memset(&sum, 0, sizeof sum);
  for (int f = 1; f < a->snapshot_count; f++) {
    if (open_and_load(a->snapshots[f], tb, &next) != 0)
      goto done;
    step_result r;
    memset(&r, 0, sizeof r);
    r.base_step = prev_step;
    r.step = next.has_step ? next.step : (uint64_t)f;
    for (size_t i = 0; i < tb->count; i++) {
      c.cur_dtype[i] = next.dtype[i];
      if (next.dtype[i] == PULSE_DTYPE_F32)
        c.cur[i] = next.f32 + tb->offset[i];
      else
        c.cur[i] = next.bf16 + tb->offset[i];
    }
    if (measure_step(&c, a, next.bf16, &r) != 0)
      goto done;
    report_step(a, &sum, &r);
    memcpy(c.old_bf16, next.bf16, (size_t)tb->total * 2);
    prev_step = r.step;
    snapshot_free(&prev);
    prev = next;
    memset(&next, 0, sizeof next);
  }
  if (a->json)
    print_summary_json(&sum, source, a->apply_threads);
  else
    print_summary_text(&sum);
  rc = 0;
done:
  snapshot_free(&prev);
  snapshot_free(&next);
  ctx_free(&c);
  if (tb->info != NULL)
    for (size_t i = 0; i < tb->count; i++)
      free((char *)tb->info[i].name);
  free(tb->info);
  free(tb->numel);
  free(tb->offset);
  return rc;
}

/* ------------------------------------------------------------- report */

static const char *const report_cols[] = {
    "step",          "changed",        "density_pct",     "v2_class",         "v2_plain",
    "v1_class",      "v1_plain",       "entropy_bound",   "dense_bf16",       "dense_zstd1",
    "dense_zstd3",   "dense_zstd19",   "int32_bf16",      "int32_bf16_zstd1", "int32_bf16_zstd3",
    "int32_bf16_zstd19", "gap_abs_zstd1", "gap_abs_zstd3", "gap_abs_zstd19", "gap_xor_zstd1",
    "gap_xor_zstd3", "gap_xor_zstd19"};
#define REPORT_COLS (sizeof report_cols / sizeof report_cols[0])

/* Runs the benchmark collecting --report tables, then writes the report. */
static int run_with_report(codec_args *a, int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(a->report, "codec", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: cannot make %s\n", a->report), 1;
  summary sum;
  memset(&sum, 0, sizeof sum);
  a->rep_sum = &sum;
  a->rt = pulse_report_table_add(rep, "steps", report_cols, REPORT_COLS);
  int rc = a->snapshots != NULL ? run_snapshots(a) : run_synthetic(a);
  /* B/changed over the whole run, one row per encoding (steps columns 3..) */
  static const char *const pc_cols[] = {"encoding", "bytes_per_changed"};
  pulse_report_table *pc = pulse_report_table_add(rep, "per_changed", pc_cols, 2);
  const step_result *t = &sum.sum;
  const bench_baseline_bytes *b = &t->base;
  const double tot[] = {(double)t->bytes[0],
                        (double)t->bytes[1],
                        (double)t->bytes[2],
                        (double)t->bytes[3],
                        bound_bytes(&t->ent),
                        (double)b->dense,
                        (double)b->zstd[BENCH_DENSE_Z][0],
                        (double)b->zstd[BENCH_DENSE_Z][1],
                        (double)b->zstd[BENCH_DENSE_Z][2],
                        (double)b->int32_bf16,
                        (double)b->zstd[BENCH_INT32_Z][0],
                        (double)b->zstd[BENCH_INT32_Z][1],
                        (double)b->zstd[BENCH_INT32_Z][2],
                        (double)b->zstd[BENCH_GAP_ABS_Z][0],
                        (double)b->zstd[BENCH_GAP_ABS_Z][1],
                        (double)b->zstd[BENCH_GAP_ABS_Z][2],
                        (double)b->zstd[BENCH_GAP_XOR_Z][0],
                        (double)b->zstd[BENCH_GAP_XOR_Z][1],
                        (double)b->zstd[BENCH_GAP_XOR_Z][2]};
  for (size_t i = 0; i < sizeof tot / sizeof tot[0]; i++) {
    pulse_report_row(pc);
    pulse_report_text(pc, report_cols[3 + i]);
    pulse_report_num(pc, per(tot[i], (double)t->changed));
  }
  static const char *const density[] = {"density_pct"};
  static const char *const pcy[] = {"bytes_per_changed"};
  pulse_report_chart_spec c1 = {PULSE_REPORT_LINE, "steps", "Density: share of weights changed per step",
                                "step", "optimizer step", "changed weights (% of parameters)",
                                density, 1, 0, 0};
  pulse_report_chart_spec c2 = {PULSE_REPORT_LINE, "steps", "Bytes per step by encoding", "step",
                                "optimizer step", "bytes per step (B)", report_cols + 3,
                                REPORT_COLS - 3, 0, 1};
  pulse_report_chart_spec c3 = {PULSE_REPORT_BAR, "per_changed",
                                "Bytes per changed weight by encoding (whole run)", "encoding",
                                "encoding", "bytes per changed weight (B)", pcy, 1, 0, 1};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2), pulse_report_chart(rep, &c3);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK) {
    fprintf(stderr, PROG ": --report: %s\n", why);
    rc = 1;
  }
  return rc;
}

/* ------------------------------------------------------------ arguments */

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
                  .reps = 5};
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    int m;
    if (pulse_tk_opt_flag(arg, "--help") || pulse_tk_opt_flag(arg, "-h")) {
      bench_codec_usage(stdout);
      return 0;
    } else if (pulse_tk_opt_flag(arg, "--json")) {
      a.json = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (m < 0)
        return usage_error("--report needs a folder%s", "");
      a.report = v;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_u64(v, &a.params) != 0)
        return usage_error("--params needs a count, got '%s'", m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_u64(v, &a.steps) != 0 || a.steps == 0 ||
          a.steps > 1000000)
        return usage_error("--steps needs a count from 1, got '%s'",
                           m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_double(v, &a.lr) != 0 || a.lr < 0)
        return usage_error("--lr needs a non-negative number, got '%s'",
                           m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_u64(v, &a.seed) != 0)
        return usage_error("--seed needs an integer, got '%s'", m < 0 ? "" : v);
      a.synth_opts_given = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 0, 4096, &a.threads) != 0)
        return usage_error("--threads needs 0..4096, got '%s'", m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--apply-threads", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 0, 256, &a.apply_threads) != 0)
        return usage_error("--apply-threads needs 0..256, got '%s'", m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--reps", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, MAX_REPS, &a.reps) != 0)
        return usage_error("--reps needs 1..1000, got '%s'", m < 0 ? "" : v);
    } else if (pulse_tk_opt_flag(arg, "--snapshots")) {
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
    return a.snapshots != NULL ? run_snapshots(&a) : run_synthetic(&a);
  return run_with_report(&a, argc, argv);
}
