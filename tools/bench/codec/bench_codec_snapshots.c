/* bench_codec_snapshots.c - `pulse-bench codec` on safetensors snapshots:
 * the table from the first, each next one loaded into its layout (F32
 * tensors cast by the one rounding), consecutive pairs measured as steps. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_codec_impl.h"
#include "cli_args.h"
#include "pulse_safetensors.h"

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
      return bench_codec_fail_status(path, st);
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
  out->has_step = step != NULL && pulse_cli_parse_u64(step, &out->step) == 0;
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
    return bench_codec_fail_status(path, st);
  int rc = 0;
  if (tb->info == NULL)
    rc = table_from_model(m, path, tb);
  if (rc == 0)
    rc = snapshot_load(path, tb, m, out);
  pulse_st_model_close(m);
  return rc;
}

int bench_codec_run_snapshots(const codec_args *a) {
  codec_ctx c;
  memset(&c, 0, sizeof c);
  bench_table *tb = &c.table;
  snapshot prev, next;
  memset(&prev, 0, sizeof prev);
  memset(&next, 0, sizeof next);
  int rc = open_and_load(a->snapshots[0], tb, &prev);
  if (rc == 0)
    rc = bench_codec_ctx_alloc(&c);
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
    printf("timings: one thread (decode + apply: %d, 0 = one per core), median "
           "of %d "
           "repetitions; detection reads the new weights as stored + the BF16 "
           "snapshot\n",
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
    if (bench_codec_measure_step(&c, a, next.bf16, &r) != 0)
      goto done;
    bench_codec_report_step(a, &sum, &r);
    memcpy(c.old_bf16, next.bf16, (size_t)tb->total * 2);
    prev_step = r.step;
    snapshot_free(&prev);
    prev = next;
    memset(&next, 0, sizeof next);
  }
  if (a->json)
    bench_codec_print_summary_json(&sum, source, a->apply_threads);
  else
    bench_codec_print_summary_text(&sum);
  rc = 0;
done:
  snapshot_free(&prev);
  snapshot_free(&next);
  bench_codec_ctx_free(&c);
  if (tb->info != NULL)
    for (size_t i = 0; i < tb->count; i++)
      free((char *)tb->info[i].name);
  free(tb->info);
  free(tb->numel);
  free(tb->offset);
  return rc;
}
