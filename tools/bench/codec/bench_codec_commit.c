/* bench_codec_commit.c - `pulse-bench codec --commit`: the publisher's
 * commit at model scale, from FP32 master weights in memory, split where
 * its time goes, and a receiver's apply of each patch it writes.
 *
 * The model is the Python bench's (python/bench.py): --tensors tensors of
 * rows x 1024 FP32 weights, about normal with standard deviation 0.02; each
 * step multiplies about --density of each tensor's elements, drawn
 * uniformly with replacement, by 1 + 2^-6 (a move of one or two BF16
 * ulps). No optimizer state is kept: at 1e9 parameters the bench needs the
 * master weights (4 bytes a parameter), the publisher's snapshot (2), the
 * receiver's weights (2) and its class index (2.1), about 10 GB, where the
 * synthetic Adam trajectory of the other modes needs 18 bytes a parameter
 * before any buffer of its own.
 *
 * Per step: the commit (pulse_pub_commit, the whole call, and its split:
 * detection, encoding, the digests read back, the patch's hash, the head,
 * the wait for the patch's durable write, the head's rename), the snapshot
 * move the publisher does afterwards in the background, and "reads": one
 * pass over the master weights and the snapshot on the commit's threads,
 * the floor a commit that reads both cannot go below. Before the commit,
 * on the same snapshot, the reference path's compute is timed (detection
 * per tensor, then the encoder classifying from the base: what a commit did
 * before detection found the ranks); its patch must be the commit's, byte
 * for byte, and the ratio of the two, taken in the same step, is the
 * figure a busy machine does not blur. Then the receiver
 * applies the patch from the store three ways: without a class index on
 * one thread, through its class indexes on two threads and on one (each
 * apply but the last is undone, untimed, from its own staged changes), and
 * its weights are checked bit for bit against the publisher's snapshot. */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench_codec_impl.h"
#include "class_index_impl.h"
#include "cli_time.h"
#include "hugepage_impl.h"
#include "parallel_impl.h"
#include "patch_changes_impl.h"
#include "publisher_impl.h"
#include "pulse_publisher.h"
#include "pulse_sign.h"
#include "pulse_store.h"

#define COLS 1024u
#define INIT_BLOCK ((uint64_t)1 << 20)
#define MAX_STEPS 1000

/* ---------------------------------------------------------------- model */

typedef struct {
  size_t count;
  uint64_t total, rows;
  pulse_tensor_info *info;
  char (*names)[48];
  float *master;
  uint16_t *recv; /* the receiver's weights (huge pages, as pulse_sub's) */
  uint64_t seed;
} commit_model;

static uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* About normal (a sum of four uniforms), standard deviation 0.02. */
static void init_block(void *ctx, size_t b) {
  commit_model *m = ctx;
  uint64_t from = (uint64_t)b * INIT_BLOCK, to = from + INIT_BLOCK;
  if (to > m->total)
    to = m->total;
  for (uint64_t i = from; i < to; i++) {
    uint64_t h = splitmix(m->seed ^ (i * 0xD1B54A32D192ED03ull));
    double s = (double)(h & 0xFFFF) + (double)((h >> 16) & 0xFFFF) +
               (double)((h >> 32) & 0xFFFF) + (double)(h >> 48);
    m->master[i] = (float)((s - 131070.0) / 37837.0 * 0.02);
  }
}

typedef struct {
  commit_model *m;
  uint64_t step;
  double density;
} perturb_job;

/* Moves about `density` of tensor t's elements by one or two BF16 ulps. */
static void perturb_tensor(void *ctx, size_t t) {
  perturb_job *job = ctx;
  commit_model *m = job->m;
  uint64_t numel = m->rows * COLS;
  float *w = m->master + (uint64_t)t * numel;
  uint64_t draws = (uint64_t)((double)numel * job->density);
  uint64_t state = splitmix(m->seed ^ splitmix(job->step * 1000003u + t));
  for (uint64_t d = 0; d < draws; d++) {
    state = splitmix(state);
    uint64_t i = (uint64_t)(((unsigned __int128)(state >> 11) * numel) >> 53);
    w[i] *= 1.0f + 0x1p-6f;
  }
}

/* A pass over the bytes a commit must read (the master weights and the
 * snapshot), on the commit's threads. */
typedef struct {
  const commit_model *m;
  pulse_pub *pub;
  uint64_t *sink;
} read_job;

static void read_tensor(void *ctx, size_t t) {
  read_job *job = ctx;
  uint64_t numel = job->m->rows * COLS, acc = 0;
  const uint64_t *w = (const uint64_t *)(const void *)(job->m->master + t * numel);
  const uint64_t *s = (const uint64_t *)(const void *)pulse_pub_snapshot(job->pub, t);
  for (uint64_t i = 0; i < numel / 2; i++)
    acc += w[i];
  for (uint64_t i = 0; i < numel / 4; i++)
    acc += s[i];
  job->sink[t] = acc;
}

static double read_seconds(const commit_model *m, pulse_pub *pub, int threads) {
  uint64_t *sink = calloc(m->count, sizeof *sink);
  if (sink == NULL)
    return 0;
  read_job job = {m, pub, sink};
  double t0 = pulse_cli_now();
  pulse_parallel_for(threads, m->count, read_tensor, &job);
  double s = pulse_cli_since(t0);
  volatile uint64_t keep = 0;
  for (size_t i = 0; i < m->count; i++)
    keep += sink[i];
  (void)keep;
  free(sink);
  return s;
}

static int model_create(commit_model *m, const codec_args *a) {
  memset(m, 0, sizeof *m);
  m->count = a->tensors;
  m->rows = a->params / a->tensors / COLS;
  if (m->rows == 0)
    m->rows = 1;
  m->total = m->rows * COLS * m->count;
  m->seed = a->seed;
  m->info = calloc(m->count, sizeof *m->info);
  m->names = calloc(m->count, sizeof *m->names);
  m->master = malloc((size_t)m->total * sizeof(float));
  m->recv = pulse_hugepage_alloc((size_t)m->total * 2 + 2);
  if (m->info == NULL || m->names == NULL || m->master == NULL || m->recv == NULL) {
    fprintf(stderr, PROG ": out of memory for %" PRIu64 " parameters\n", m->total);
    return 1;
  }
  for (size_t i = 0; i < m->count; i++) {
    snprintf(m->names[i], sizeof m->names[i], "layers.%zu.weight", i);
    m->info[i].name = m->names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = 2;
    m->info[i].shape[0] = m->rows;
    m->info[i].shape[1] = COLS;
  }
  size_t blocks = (size_t)((m->total + INIT_BLOCK - 1) / INIT_BLOCK);
  pulse_parallel_for(a->threads, blocks, init_block, m);
  return 0;
}

static void model_free(commit_model *m) {
  free(m->info), free(m->names), free(m->master);
  free(m->recv);
}

/* -------------------------------------------------------------- receiver */

typedef struct {
  pulse_host_tensor *targets;
  pulse_tensor_digest *digests;
  pulse_class_index **index;
} receiver;

static int receiver_create(receiver *r, commit_model *m, pulse_pub *pub) {
  r->targets = calloc(m->count, sizeof *r->targets);
  r->digests = calloc(m->count, sizeof *r->digests);
  r->index = calloc(m->count + 1, sizeof *r->index);
  if (r->targets == NULL || r->digests == NULL || r->index == NULL)
    return fprintf(stderr, PROG ": out of memory\n"), 1;
  uint64_t numel = m->rows * COLS;
  for (size_t i = 0; i < m->count; i++) {
    uint16_t *data = m->recv + i * numel;
    memcpy(data, pulse_pub_snapshot(pub, i), numel * 2);
    r->digests[i] = pulse_digest_bf16(data, numel);
    r->targets[i] = (pulse_host_tensor){m->info[i].name, data, numel, &r->digests[i]};
    pulse_status st = pulse_class_index_build(data, numel, 0, &r->index[i]);
    if (st != PULSE_OK)
      return bench_codec_fail_status("class index", st);
  }
  return 0;
}

static void receiver_free(receiver *r, size_t count) {
  for (size_t i = 0; r->index != NULL && i < count; i++)
    pulse_class_index_free(r->index[i]);
  free(r->targets), free(r->digests), free(r->index);
}

/* The bytes of the patch of `step` in the store. */
static int read_patch(const char *dir, uint64_t step, pulse_buffer *out) {
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(dir, &h);
  if (st != PULSE_OK)
    return bench_codec_fail_status("head", st);
  char path[4200] = "";
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++) {
    const pulse_store_object *o = pulse_store_head_patch(h, i);
    if (o->step == step)
      snprintf(path, sizeof path, "%s/%s", dir, o->path);
  }
  pulse_store_head_free(h);
  FILE *f = path[0] ? fopen(path, "rb") : NULL;
  struct stat sb;
  if (f == NULL || fstat(fileno(f), &sb) != 0) {
    fprintf(stderr, PROG ": patch of step %" PRIu64 " not found (%s)\n", step, path);
    if (f)
      fclose(f);
    return 1;
  }
  out->size = (size_t)sb.st_size;
  out->data = malloc(out->size + 1);
  int rc = out->data == NULL || fread(out->data, 1, out->size, f) != out->size;
  fclose(f);
  if (rc)
    fprintf(stderr, PROG ": cannot read %s\n", path);
  return rc;
}

/* Applies the patch as a receiver does (open, stage, commit: timed); with
 * `undo`, then puts the weights (and indexes) back from the staged
 * changes, untimed. */
static int apply_once(receiver *r, const commit_model *m, const pulse_buffer *patch,
                      int threads, int indexed, int undo, double *secs) {
  pulse_apply_opts opts;
  pulse_apply_opts_init(&opts);
  opts.threads = threads;
  opts.class_index = indexed ? r->index : NULL;
  pulse_patch *p = NULL;
  pulse_patch_staged *s = NULL;
  double t0 = pulse_cli_now();
  pulse_status st = pulse_patch_open(patch->data, patch->size, &p);
  if (st == PULSE_OK)
    st = pulse_patch_stage(p, r->targets, m->count, &opts, &s);
  if (st == PULSE_OK)
    pulse_patch_staged_commit(s);
  *secs = pulse_cli_since(t0);
  if (st != PULSE_OK) {
    pulse_patch_free(p);
    return bench_codec_fail_status("apply", st);
  }
  for (size_t i = 0; i < m->count; i++) {
    const pulse_changes *c = patch_staged_changes(s, i);
    if (undo && c != NULL) {
      for (uint64_t j = 0; j < c->count; j++)
        r->targets[i].data[c->pos[j]] = c->old_bits[j];
      if (indexed) {
        pulse_class_index_move(r->index[i], c->pos, c->new_bits, c->old_bits, c->count);
        r->index[i]->digest = r->digests[i];
      }
    } else if (!undo) {
      pulse_patch_tensor pt;
      if (pulse_patch_tensor_get(p, i, &pt) == PULSE_OK)
        r->digests[i] = pt.target_digest;
    }
  }
  pulse_patch_staged_free(s);
  pulse_patch_free(p);
  return 0;
}

/* ------------------------------------------------------ reference path */

/* What a commit computed before detection found class ranks: detection per
 * tensor (pulse_detect_fast on the commit's threads) and the encoder given
 * the base, which classifies from it. Timed against the same snapshot the
 * commit then reads; its patch must be the commit's, byte for byte. */
typedef struct {
  pulse_changes *changes;
  pulse_encode_tensor *enc;
  pulse_tensor_digest *digests;
  pulse_buffer patch;
} reference;

static int reference_step(reference *ref, const commit_model *m, pulse_pub *pub, uint64_t step,
                          int threads, double *detect_s, double *encode_s) {
  uint64_t numel = m->rows * COLS;
  double t0 = pulse_cli_now();
  for (size_t i = 0; i < m->count; i++) {
    ref->changes[i].count = 0;
    pulse_status st = pulse_detect_fast(m->master + i * numel, PULSE_DTYPE_F32,
                                        (uint16_t *)pulse_pub_snapshot(pub, i), numel, 0,
                                        threads, &ref->changes[i]);
    if (st != PULSE_OK)
      return bench_codec_fail_status("reference detection", st);
    ref->enc[i] = (pulse_encode_tensor){.info = m->info[i],
                                        .base = pulse_pub_snapshot(pub, i),
                                        .changes = &ref->changes[i],
                                        .base_digest = &ref->digests[i]};
  }
  *detect_s = pulse_cli_since(t0);
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = step;
  eo.base_step = step - 1;
  eo.threads = threads;
  pulse_buffer_free(&ref->patch);
  t0 = pulse_cli_now();
  pulse_status st = pulse_patch_encode(&eo, ref->enc, m->count, &ref->patch);
  *encode_s = pulse_cli_since(t0);
  if (st != PULSE_OK)
    return bench_codec_fail_status("reference encode", st);
  for (size_t i = 0; i < m->count; i++) /* the base digests of the next step */
    ref->digests[i] = pulse_digest_apply_changes(ref->digests[i], &ref->changes[i]);
  return 0;
}

/* ------------------------------------------------------------------ run */

typedef struct {
  double commit, reads, move, perturb;
  double ref_detect, ref_encode; /* the reference path's compute */
  pulse_pub_figures f;
  pub_commit_split split;
  double apply_noindex, apply_index2, apply_index1;
} commit_step;

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static double med(commit_step *s, size_t n, size_t field_offset) {
  double v[MAX_STEPS];
  for (size_t i = 0; i < n; i++)
    memcpy(&v[i], (const char *)&s[i] + field_offset, sizeof(double));
  return pulse_cli_median(v, n);
}
#define MED(s, n, field) med(s, n, offsetof(commit_step, field))

static void print_step(const commit_step *s, uint64_t params, int json) {
  const pub_commit_split *x = &s->split;
  double split_sum = x->detect + x->encode + x->digests + x->hash + x->head + x->durable +
                     x->publish;
  double cps = (double)s->f.changed / 1e6;
  if (json) {
    printf("{\"step\": %" PRIu64 ", \"changed\": %" PRIu64 ", \"density\": %.5f, "
           "\"patch_bytes\": %" PRIu64 ", \"commit_ms\": %.2f, \"detect_ms\": %.2f, "
           "\"encode_ms\": %.2f, \"digests_ms\": %.2f, \"hash_ms\": %.2f, \"head_ms\": %.2f, "
           "\"durable_wait_ms\": %.2f, \"publish_ms\": %.2f, \"other_ms\": %.2f, "
           "\"reads_ms\": %.2f, \"snapshot_move_ms\": %.2f, \"ref_detect_ms\": %.2f, "
           "\"ref_encode_ms\": %.2f, "
           "\"apply_noindex_mchanges_per_s\": %.2f, \"apply_index_2t_mchanges_per_s\": %.2f, "
           "\"apply_index_1t_mchanges_per_s\": %.2f}\n",
           s->f.step, s->f.changed, (double)s->f.changed / (double)params, s->f.patch_bytes,
           s->commit * 1e3, x->detect * 1e3, x->encode * 1e3, x->digests * 1e3, x->hash * 1e3,
           x->head * 1e3, x->durable * 1e3, x->publish * 1e3, (s->commit - split_sum) * 1e3,
           s->reads * 1e3, s->move * 1e3, s->ref_detect * 1e3, s->ref_encode * 1e3,
           bench_codec_per(cps, s->apply_noindex),
           bench_codec_per(cps, s->apply_index2), bench_codec_per(cps, s->apply_index1));
    return;
  }
  char b1[32], b2[32];
  printf("step %" PRIu64 ": %s changed (%.3f%%), patch %s bytes (perturbed in %.2f s)\n",
         s->f.step, bench_codec_fmt_u64(s->f.changed, b1),
         100.0 * (double)s->f.changed / (double)params,
         bench_codec_fmt_u64(s->f.patch_bytes, b2), s->perturb);
  printf("  commit %8.1f ms = detect %.1f + encode %.1f + digests %.1f + hash %.1f + head "
         "%.1f + patch durable (wait) %.1f + head rename %.1f + other %.1f\n",
         s->commit * 1e3, x->detect * 1e3, x->encode * 1e3, x->digests * 1e3, x->hash * 1e3,
         x->head * 1e3, x->durable * 1e3, x->publish * 1e3, (s->commit - split_sum) * 1e3);
  printf("  reads (FP32 master + BF16 snapshot, once) %.1f ms; snapshot move (background, "
         "after the call) %.1f ms\n",
         s->reads * 1e3, s->move * 1e3);
  printf("  reference path (pulse_detect_fast per tensor, encoder classifying from the base; "
         "same bytes): detect %.1f + encode %.1f = %.1f ms; commit's detect + encode %.1f ms "
         "(x%.2f)\n",
         s->ref_detect * 1e3, s->ref_encode * 1e3, (s->ref_detect + s->ref_encode) * 1e3,
         (x->detect + x->encode) * 1e3,
         bench_codec_per(s->ref_detect + s->ref_encode, x->detect + x->encode));
  printf("  apply: no index 1 thread %.1f M changes/s; class index 2 threads %.1f M/s, "
         "1 thread %.1f M/s (x%.2f)\n",
         bench_codec_per(cps, s->apply_noindex), bench_codec_per(cps, s->apply_index2),
         bench_codec_per(cps, s->apply_index1), bench_codec_per(s->apply_index1, s->apply_index2));
}

static void print_summary(commit_step *s, size_t n, uint64_t params, int threads, int json) {
  double commit = MED(s, n, commit), reads = MED(s, n, reads);
  double i1 = MED(s, n, apply_index1), i2 = MED(s, n, apply_index2);
  double ni = MED(s, n, apply_noindex);
  double changed[MAX_STEPS];
  for (size_t i = 0; i < n; i++)
    changed[i] = (double)s[i].f.changed;
  double cps = pulse_cli_median(changed, n) / 1e6;
  double detect = MED(s, n, split.detect), encode = MED(s, n, split.encode);
  double digests = MED(s, n, split.digests), hash = MED(s, n, split.hash);
  double head = MED(s, n, split.head), durable = MED(s, n, split.durable);
  double publish = MED(s, n, split.publish), move = MED(s, n, move);
  double ref_detect = MED(s, n, ref_detect), ref_encode = MED(s, n, ref_encode);
  double speedup[MAX_STEPS];
  for (size_t i = 0; i < n; i++)
    speedup[i] = bench_codec_per(s[i].ref_detect + s[i].ref_encode,
                                 s[i].split.detect + s[i].split.encode);
  double ref_ratio = pulse_cli_median(speedup, n);
  /* Detection against the reads of the same step: the share of the commit
   * that a busy machine blurs least, as the reference ratio. */
  double over_reads[MAX_STEPS];
  for (size_t i = 0; i < n; i++)
    over_reads[i] = bench_codec_per(s[i].split.detect, s[i].reads);
  double detect_reads = pulse_cli_median(over_reads, n);
  if (json) {
    printf("{\"summary\": true, \"params\": %" PRIu64 ", \"steps\": %zu, \"threads\": %d, "
           "\"commit_ms\": %.2f, \"detect_ms\": %.2f, \"encode_ms\": %.2f, \"digests_ms\": %.2f, "
           "\"hash_ms\": %.2f, \"head_ms\": %.2f, \"durable_wait_ms\": %.2f, "
           "\"publish_ms\": %.2f, \"reads_ms\": %.2f, \"snapshot_move_ms\": %.2f, "
           "\"ref_detect_ms\": %.2f, \"ref_encode_ms\": %.2f, \"ref_over_commit_compute\": %.3f, "
           "\"detect_over_reads\": %.3f, "
           "\"apply_noindex_mchanges_per_s\": %.2f, \"apply_index_2t_mchanges_per_s\": %.2f, "
           "\"apply_index_1t_mchanges_per_s\": %.2f, \"apply_2t_over_1t\": %.3f}\n",
           params, n, threads, commit * 1e3, detect * 1e3, encode * 1e3, digests * 1e3,
           hash * 1e3, head * 1e3, durable * 1e3, publish * 1e3, reads * 1e3, move * 1e3,
           ref_detect * 1e3, ref_encode * 1e3, ref_ratio, detect_reads, bench_codec_per(cps, ni), bench_codec_per(cps, i2), bench_codec_per(cps, i1),
           bench_codec_per(i1, i2));
    return;
  }
  printf("medians over %zu steps (commit threads %d, 0 = one per core):\n", n, threads);
  printf("  commit %.1f ms (detect %.1f, encode %.1f, digests %.1f, hash %.1f, head %.1f, "
         "patch durable %.1f, head rename %.1f); reads alone %.1f ms; commit / reads x%.2f\n",
         commit * 1e3, detect * 1e3, encode * 1e3, digests * 1e3, hash * 1e3, head * 1e3,
         durable * 1e3, publish * 1e3, reads * 1e3, bench_codec_per(commit, reads));
  printf("  snapshot move (background) %.1f ms; per step, detect / reads: median x%.2f\n",
         move * 1e3, detect_reads);
  printf("  reference path: detect %.1f + encode %.1f ms; per step, reference / commit's "
         "detect + encode: median x%.2f\n",
         ref_detect * 1e3, ref_encode * 1e3, ref_ratio);
  printf("  apply: no index 1 thread %.1f M changes/s; class index 1 thread %.1f M/s, "
         "2 threads %.1f M/s (x%.2f)\n",
         bench_codec_per(cps, ni), bench_codec_per(cps, i1), bench_codec_per(cps, i2),
         bench_codec_per(i1, i2));
}

int bench_codec_run_commit(const codec_args *a) {
  if (a->steps > MAX_STEPS) {
    fprintf(stderr, PROG ": --commit: at most %d steps\n", MAX_STEPS);
    return 2;
  }
  commit_model m;
  receiver r;
  reference ref;
  memset(&ref, 0, sizeof ref);
  memset(&m, 0, sizeof m);
  memset(&r, 0, sizeof r);
  commit_step *steps = calloc((size_t)a->steps + 1, sizeof *steps);
  pulse_pub_tensor *pt = NULL;
  pulse_pub *pub = NULL;
  pulse_sign_key *key = NULL;
  int rc = 1, made = 0;
  const char *tmp = getenv("TMPDIR");
  char dir[600];
  snprintf(dir, sizeof dir, "%s/pulse-bench-commit-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
  double t0 = pulse_cli_now();
  if (steps == NULL || model_create(&m, a) != 0)
    goto done;
  if (!a->json)
    printf(PROG " --commit: %" PRIu64 " FP32 parameters in %zu tensors of %" PRIu64
                " x %u (made in %.1f s), %" PRIu64 " steps at ~%.2f%% density\n",
           m.total, m.count, m.rows, COLS, pulse_cli_since(t0), a->steps, 100 * a->density);
  if (mkdtemp(dir) == NULL) {
    fprintf(stderr, PROG ": mkdtemp %s: %s\n", dir, strerror(errno));
    goto done;
  }
  made = 1;
  pulse_status st = pulse_sign_key_generate(&key);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.tensors = m.info;
  po.tensor_count = m.count;
  po.key = key;
  po.anchor_every = 1000000; /* only the first state: anchors are not timed */
  po.threads = a->threads;
  po.grace_seconds = 0;
  if (st == PULSE_OK)
    st = pulse_pub_create(dir, &po, &pub);
  pt = calloc(m.count, sizeof *pt);
  if (st != PULSE_OK || pt == NULL) {
    bench_codec_fail_status("publisher", st != PULSE_OK ? st : PULSE_ERR_NOMEM);
    goto done;
  }
  uint64_t numel = m.rows * COLS;
  for (size_t i = 0; i < m.count; i++)
    pt[i] = (pulse_pub_tensor){m.master + i * numel, PULSE_DTYPE_F32, PULSE_PUB_HOST};
  t0 = pulse_cli_now();
  st = pulse_pub_commit(pub, 0, pt, m.count, NULL);
  pulse_pub_wait(pub);
  if (st != PULSE_OK) {
    bench_codec_fail_status("first commit", st);
    goto done;
  }
  if (receiver_create(&r, &m, pub) != 0)
    goto done;
  ref.changes = calloc(m.count, sizeof *ref.changes);
  ref.enc = calloc(m.count, sizeof *ref.enc);
  ref.digests = calloc(m.count, sizeof *ref.digests);
  if (ref.changes == NULL || ref.enc == NULL || ref.digests == NULL) {
    fprintf(stderr, PROG ": out of memory\n");
    goto done;
  }
  for (size_t i = 0; i < m.count; i++)
    ref.digests[i] = r.digests[i];
  if (!a->json)
    printf("first commit (an anchor) and the receiver's class indexes in %.1f s\n",
           pulse_cli_since(t0));
  for (uint64_t k = 1; k <= a->steps; k++) {
    commit_step *s = &steps[k - 1];
    perturb_job pj = {&m, k, a->density};
    t0 = pulse_cli_now();
    pulse_parallel_for(a->threads, m.count, perturb_tensor, &pj);
    s->perturb = pulse_cli_since(t0);
    s->reads = read_seconds(&m, pub, a->threads);
    if (reference_step(&ref, &m, pub, k, a->threads, &s->ref_detect, &s->ref_encode) != 0)
      goto done;
    t0 = pulse_cli_now();
    st = pulse_pub_commit(pub, k, pt, m.count, &s->f);
    s->commit = pulse_cli_since(t0);
    pulse_pub_wait(pub);
    if (st != PULSE_OK) {
      bench_codec_fail_status("commit", st);
      goto done;
    }
    s->split = pub->split;
    s->move = pub->job.move_seconds;
    pulse_buffer patch = {NULL, 0};
    if (read_patch(dir, k, &patch) == 0 &&
        (patch.size != ref.patch.size || memcmp(patch.data, ref.patch.data, patch.size) != 0)) {
      fprintf(stderr, PROG ": step %" PRIu64 ": the commit's patch (%zu bytes) is not the "
                      "reference path's (%zu bytes)\n", k, patch.size, ref.patch.size);
      pulse_buffer_free(&patch);
      goto done;
    }
    if (patch.data == NULL ||
        apply_once(&r, &m, &patch, 1, 0, 1, &s->apply_noindex) != 0 ||
        apply_once(&r, &m, &patch, 2, 1, 1, &s->apply_index2) != 0 ||
        apply_once(&r, &m, &patch, 1, 1, 0, &s->apply_index1) != 0) {
      pulse_buffer_free(&patch);
      goto done;
    }
    pulse_buffer_free(&patch);
    for (size_t i = 0; i < m.count; i++)
      if (memcmp(r.targets[i].data, pulse_pub_snapshot(pub, i), numel * 2) != 0) {
        fprintf(stderr, PROG ": step %" PRIu64 ": verify FAILED: tensor %zu of the receiver "
                        "differs from the publisher's snapshot\n", k, i);
        goto done;
      }
    print_step(s, m.total, a->json);
    fflush(stdout);
  }
  print_summary(steps, (size_t)a->steps, m.total, a->threads, a->json);
  if (!a->json)
    printf("verify OK: every step's patch rebuilt the publisher's snapshot bit for bit\n");
  rc = 0;
done:
  pulse_pub_free(pub);
  pulse_sign_key_free(key);
  receiver_free(&r, m.count);
  for (size_t i = 0; ref.changes != NULL && i < m.count; i++)
    pulse_changes_free(&ref.changes[i]);
  free(ref.changes), free(ref.enc), free(ref.digests);
  pulse_buffer_free(&ref.patch);
  model_free(&m);
  free(pt), free(steps);
  if (made)
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return rc;
}
