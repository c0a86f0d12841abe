/* bench_codec_step.c - one step of `pulse-bench codec` measured: change
 * detection and memcpy for scale, then every coding encoded, applied (with
 * and without a class index) and decoded alone, each checked bit for bit
 * against the new state; the baselines and the entropy bound. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "bench_codec_impl.h"
#include "cli_time.h"

static int encode_patch(codec_ctx *c, const step_result *r, int coding,
                        int reps, double *secs, pulse_buffer *out) {
  pulse_encode_opts opts;
  pulse_encode_opts_init(&opts);
  opts.step = r->step;
  opts.base_step = r->base_step;
  opts.pos_model = bench_codec_codings[coding].model;
  opts.format_version = bench_codec_codings[coding].version;
  opts.threads = 1;
  double t[MAX_REPS];
  for (int k = 0; k < reps; k++) {
    pulse_buffer_free(out);
    double t0 = pulse_cli_now();
    pulse_status st = pulse_patch_encode(&opts, c->enc, c->table.count, out);
    t[k] = pulse_cli_since(t0);
    if (st != PULSE_OK)
      return bench_codec_fail_status(bench_codec_codings[coding].label, st);
  }
  *secs = pulse_cli_median(t, (size_t)reps);
  return 0;
}

/* Decodes every stream of `patch` without the base (the coder alone, what a
 * receiver's host does for a GPU target), `reps` times; 0 s when the coding
 * cannot be decoded without the base. */
static int decode_streams(const pulse_buffer *patch, const char *label,
                          int reps, double *secs) {
  double t[MAX_REPS];
  *secs = 0;
  for (int k = 0; k < reps; k++) {
    pulse_patch *p = NULL;
    pulse_status st = pulse_patch_open(patch->data, patch->size, &p);
    double t0 = pulse_cli_now();
    if (st == PULSE_OK)
      st = pulse_patch_check_streams(p, 1);
    t[k] = pulse_cli_since(t0);
    pulse_patch_free(p);
    if (st == PULSE_ERR_UNSUPPORTED)
      return 0;
    if (st != PULSE_OK)
      return bench_codec_fail_status(label, st);
  }
  *secs = pulse_cli_median(t, (size_t)reps);
  return 0;
}

static void free_indexes(codec_ctx *c) {
  for (size_t i = 0; i < c->table.count; i++) {
    pulse_class_index_free(c->index[i]);
    c->index[i] = NULL;
  }
}

/* This process's CPU time, every thread's, in seconds. */
static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Opens and applies `patch` to a copy of the base, `reps` times; checks
 * that the result equals new_bf16 bit for bit. indexed: through class
 * indexes of the base, built before each timed apply (r->index_build_s and
 * r->index_bytes get the build's figures). */
static int apply_patch(codec_ctx *c, step_result *r, const pulse_buffer *patch,
                       const char *label, const uint16_t *new_bf16, int reps,
                       int threads, int indexed, double *secs,
                       double *cpu_secs) {
  const bench_table *tb = &c->table;
  pulse_apply_opts opts;
  pulse_apply_opts_init(&opts);
  opts.threads = threads;
  opts.class_index = c->index; /* NULL entries unless indexed */
  double t[MAX_REPS], cpu[MAX_REPS];
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
      double b0 = pulse_cli_now();
      r->index_bytes = 0;
      for (size_t i = 0; i < tb->count; i++) {
        pulse_status st = pulse_class_index_build(
            c->targets[i].data, c->targets[i].numel, 1, &c->index[i]);
        if (st != PULSE_OK) {
          free_indexes(c);
          return bench_codec_fail_status("class index", st);
        }
        r->index_bytes += pulse_class_index_bytes(c->index[i]);
      }
      r->index_build_s = pulse_cli_since(b0);
    }
    pulse_patch *p = NULL;
    double c0 = cpu_now(), t0 = pulse_cli_now();
    pulse_status st = pulse_patch_open(patch->data, patch->size, &p);
    if (st == PULSE_OK)
      st = pulse_patch_apply(p, c->targets, tb->count, &opts);
    t[k] = pulse_cli_since(t0);
    cpu[k] = cpu_now() - c0;
    uint64_t total_changed = p ? pulse_patch_total_changed(p) : 0;
    pulse_patch_free(p);
    if (indexed && st == PULSE_OK) /* the commits kept each index exact */
      for (size_t i = 0; i < tb->count && st == PULSE_OK; i++)
        st = pulse_class_index_check(c->index[i], c->targets[i].data,
                                     c->targets[i].numel);
    free_indexes(c);
    if (st != PULSE_OK) {
      char what[64];
      snprintf(what, sizeof what, "step %" PRIu64 ": apply (%s)", r->step,
               label);
      return bench_codec_fail_status(what, st);
    }
    if (total_changed != r->changed) {
      fprintf(stderr,
              PROG ": step %" PRIu64 ": patch (%s) says %" PRIu64
                   " changes, detection found %" PRIu64 "\n",
              r->step, label, total_changed, r->changed);
      return 1;
    }
  }
  *secs = pulse_cli_median(t, (size_t)reps);
  *cpu_secs = pulse_cli_median(cpu, (size_t)reps);
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

/* Copies n bytes of src into the memcpy buffer from offset `at`, going
 * round when it is full; returns the offset after them. */
static size_t copy_round(codec_ctx *c, size_t at, const void *src, size_t n) {
  const uint8_t *from = src;
  while (n > 0) {
    size_t take = c->copy_cap - at < n ? c->copy_cap - at : n;
    memcpy(c->copy_dst + at, from, take);
    from += take, n -= take, at += take;
    if (at == c->copy_cap)
      at = 0;
  }
  return at;
}

/* Measures one step: the base state is c->old_bf16, the new weights are
 * c->cur / c->cur_dtype per tensor, and their BF16 state is new_bf16. */
int bench_codec_measure_step(codec_ctx *c, const codec_args *a,
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
    double t0 = pulse_cli_now();
    for (size_t i = 0; i < tb->count; i++) {
      c->changes[i].count = 0;
      st = pulse_detect_fast(c->cur[i], c->cur_dtype[i],
                             c->old_bf16 + tb->offset[i], tb->numel[i], 0, 1,
                             &c->changes[i]);
      if (st != PULSE_OK)
        return bench_codec_fail_status("change detection", st);
    }
    t[k] = pulse_cli_since(t0);
  }
  r->detect_s = pulse_cli_median(t, (size_t)a->reps);
  r->changed = 0;
  r->tensors = tb->count;
  for (size_t i = 0; i < tb->count; i++)
    r->changed += c->changes[i].count;

  /* memcpy of the same bytes, for scale. */
  for (int k = 0; k < a->reps; k++) {
    double t0 = pulse_cli_now();
    size_t at = 0;
    for (size_t i = 0; i < tb->count; i++)
      at = copy_round(c, at, c->cur[i],
                      (size_t)(tb->numel[i] * pulse_dtype_size(c->cur_dtype[i])));
    copy_round(c, at, c->old_bf16, (size_t)tb->total * 2);
    t[k] = pulse_cli_since(t0);
  }
  r->memcpy_s = pulse_cli_median(t, (size_t)a->reps);

  /* Every coding: encode, then apply and check. */
  for (size_t i = 0; i < tb->count; i++) {
    c->enc[i].info = tb->info[i];
    c->enc[i].base = c->old_bf16 + tb->offset[i];
    c->enc[i].changes = &c->changes[i];
    c->enc[i].base_digest = &c->digests[i];
  }
  for (int k = 0; k < CODINGS; k++) {
    pulse_buffer patch = {NULL, 0};
    double cpu = 0, indexed_cpu = 0;
    int rc = encode_patch(c, r, k, a->reps, &r->encode_s[k], &patch);
    r->bytes[k] = patch.size;
    if (rc == 0)
      rc = apply_patch(c, r, &patch, bench_codec_codings[k].label, new_bf16,
                       a->reps, a->apply_threads, 0, &r->apply_s[k], &cpu);
    r->apply_indexed_s[k] = 0;
    if (rc == 0 && bench_codec_codings[k].model == PULSE_POS_CLASS)
      rc = apply_patch(c, r, &patch, bench_codec_codings[k].label, new_bf16,
                       a->reps, a->apply_threads, 1, &r->apply_indexed_s[k],
                       &indexed_cpu);
    if (k == 0)
      r->apply_cpu_s = cpu, r->apply_indexed_cpu_s = indexed_cpu;
    if (rc == 0)
      rc = decode_streams(&patch, bench_codec_codings[k].label, a->reps,
                          &r->decode_s[k]);
    pulse_buffer_free(&patch);
    if (rc != 0)
      return rc;
  }

  st = bench_baselines_compute(tb, c->changes, new_bf16, &r->base);
  if (st != PULSE_OK)
    return bench_codec_fail_status("baselines", st);
  st = bench_entropy_compute(tb, c->old_bf16, c->changes, &r->ent);
  if (st != PULSE_OK)
    return bench_codec_fail_status("entropy", st);
  return 0;
}
