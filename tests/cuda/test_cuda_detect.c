/* test_cuda_detect.c - device change detection against the CPU reference,
 * byte for byte: change lists (pulse_detect_ref), per-tensor counts, the
 * rank form (pulse_chunk_classify on every chunk) and the updated snapshot,
 * over sizes around warp and tile edges, densities 0..100%, edge values
 * (NaN payloads, infinities, -0.0, subnormals, ties), both input dtypes and
 * multi-tensor tables. */
#include "chunk_impl.h"
#include "cuda_testutil.h"
#include "parallel_impl.h"

typedef struct {
  uint64_t numel;
  pulse_dtype dtype;
  void *cur;      /* host */
  uint16_t *snap; /* host: the base */
  void *cur_d;
  uint16_t *snap_d;
} dt_tensor;

static void dt_make(dt_tensor *t, uint64_t seed, uint64_t n, pulse_dtype dtype,
                    tu_values kind, double density) {
  t->numel = n;
  t->dtype = dtype;
  t->cur = tu_alloc((size_t)n * pulse_dtype_size(dtype));
  t->snap = tu_alloc((size_t)n * 2);
  tu_make_case(seed, n, dtype, kind, density, t->cur, t->snap);
  t->cur_d = dev_upload(t->cur, (size_t)n * pulse_dtype_size(dtype));
  t->snap_d = dev_upload(t->snap, (size_t)n * 2);
}

static void dt_free(dt_tensor *t) {
  free(t->cur), free(t->snap);
  pulse_cuda_free(t->cur_d), pulse_cuda_free(t->snap_d);
}

/* The rank form of one tensor's changes, chunk by chunk, on the host. */
typedef struct {
  const uint16_t *base;
  uint64_t numel;
  uint32_t chunk_log2;
  const pulse_changes *ch;
  const uint64_t *chunk_change; /* first change of each chunk (chunks + 1) */
  uint32_t *hist;               /* chunks * 256 */
  uint8_t *cls;
  uint32_t *rank;
} classify_job;

static void classify_one(void *ctx, size_t c) {
  classify_job *job = ctx;
  uint64_t first = (uint64_t)c << job->chunk_log2;
  uint64_t left = job->numel - first, full = 1ull << job->chunk_log2;
  uint32_t n = (uint32_t)(left < full ? left : full);
  uint64_t j0 = job->chunk_change[c], j1 = job->chunk_change[c + 1];
  uint32_t *pos = malloc((size_t)(j1 - j0) * sizeof *pos + 4);
  for (uint64_t j = j0; j < j1; j++)
    pos[j - j0] = (uint32_t)(job->ch->pos[j] - first);
  pulse_chunk_classify(job->base + first, n, pos, (uint32_t)(j1 - j0),
                       job->hist + (uint64_t)c * PULSE_CLASS_COUNT,
                       job->rank + j0, job->cls + j0);
  free(pos);
}

/* Reference rank form of tensor t (the base is its snapshot before update). */
static void ref_rank_form(const uint16_t *base, uint64_t numel,
                          uint32_t chunk_log2, const pulse_changes *ch,
                          uint32_t *hist, uint8_t *cls, uint32_t *rank) {
  uint64_t chunks = numel ? ((numel - 1) >> chunk_log2) + 1 : 0;
  uint64_t *chunk_change =
      tu_alloc((size_t)(chunks + 1) * sizeof *chunk_change);
  uint64_t j = 0;
  for (uint64_t c = 0; c < chunks; c++) {
    chunk_change[c] = j;
    while (j < ch->count && (ch->pos[j] >> chunk_log2) == c)
      j++;
  }
  chunk_change[chunks] = j;
  classify_job job = {base,         numel, chunk_log2, ch,
                      chunk_change, hist,  cls,        rank};
  pulse_parallel_for(0, (size_t)chunks, classify_one, &job);
  free(chunk_change);
}

/* Detects on the device and compares everything with the CPU. */
static void check_table(pulse_cuda_workspace *ws, dt_tensor *ts, size_t count,
                        uint32_t chunk_log2, int update, int large,
                        const char *what) {
  pulse_changes *ref = tu_alloc((count + 1) * sizeof *ref);
  uint16_t **ref_snap = tu_alloc((count + 1) * sizeof *ref_snap);
  pulse_cuda_detect_tensor *table = tu_alloc((count + 1) * sizeof *table);
  uint64_t ref_total = 0, chunks = 0;
  for (size_t t = 0; t < count; t++) {
    ref[t] = (pulse_changes)PULSE_CHANGES_INIT;
    ref_snap[t] = tu_alloc((size_t)ts[t].numel * 2);
    memcpy(ref_snap[t], ts[t].snap, (size_t)ts[t].numel * 2);
    if (large)
      OK(pulse_detect_fast(ts[t].cur, ts[t].dtype, ref_snap[t], ts[t].numel,
                           update, 0, &ref[t]));
    else
      OK(pulse_detect_ref(ts[t].cur, ts[t].dtype, ref_snap[t], ts[t].numel,
                          update, &ref[t]));
    ref_total += ref[t].count;
    table[t] = (pulse_cuda_detect_tensor){ts[t].cur_d, ts[t].dtype,
                                          ts[t].snap_d, ts[t].numel};
  }
  OK(pulse_cuda_chunk_count(table, count, chunk_log2, &chunks));
  pulse_cuda_detect_opts opts;
  pulse_cuda_detect_opts_init(&opts);
  opts.chunk_log2 = chunk_log2;
  opts.update_snapshot = update;

  /* Size query. */
  uint64_t *counts = tu_alloc((count + 1) * sizeof *counts), total = 0;
  OK(pulse_cuda_detect(ws, table, count, &opts, NULL, counts, &total, NULL));
  cr_assert_eq(total, ref_total, "%s: size query %llu, reference %llu", what,
               (unsigned long long)total, (unsigned long long)ref_total);
  for (size_t t = 0; t < count; t++)
    cr_assert_eq(counts[t], ref[t].count, "%s: tensor %zu", what, t);

  /* Detection with the rank form. */
  uint64_t cap = total + 3;
  pulse_cuda_changes out = {
      cap,
      dev_alloc((size_t)cap * 8),
      dev_alloc((size_t)cap * 2),
      dev_alloc((size_t)cap * 2),
      dev_alloc((size_t)cap),
      dev_alloc((size_t)cap * 4),
      dev_alloc((size_t)(chunks + 1) * PULSE_CLASS_COUNT * 4),
      chunks + 1};
  memset(counts, 0xFF, (count + 1) * sizeof *counts);
  OK(pulse_cuda_detect(ws, table, count, &opts, &out, counts, &total, NULL));
  cr_assert_eq(total, ref_total, "%s", what);
  uint64_t *pos = dev_download(out.pos_d, (size_t)total * 8);
  uint16_t *old_bits = dev_download(out.old_d, (size_t)total * 2);
  uint16_t *new_bits = dev_download(out.new_d, (size_t)total * 2);
  uint8_t *cls = dev_download(out.class_d, (size_t)total);
  uint32_t *rank = dev_download(out.rank_d, (size_t)total * 4);
  uint32_t *hist =
      dev_download(out.chunk_hist_d, (size_t)chunks * PULSE_CLASS_COUNT * 4);
  uint64_t at = 0, chunk_at = 0;
  for (size_t t = 0; t < count; t++) {
    const pulse_changes *r = &ref[t];
    cr_assert_eq(counts[t], r->count, "%s: tensor %zu", what, t);
    cr_assert_eq(tu_memdiff(pos + at, r->pos, (size_t)r->count * 8), -1,
                 "%s: tensor %zu positions", what, t);
    cr_assert_eq(tu_memdiff(old_bits + at, r->old_bits, (size_t)r->count * 2),
                 -1, "%s: tensor %zu old bits", what, t);
    cr_assert_eq(tu_memdiff(new_bits + at, r->new_bits, (size_t)r->count * 2),
                 -1, "%s: tensor %zu new bits", what, t);
    uint64_t n = ts[t].numel, tchunks = n ? ((n - 1) >> chunk_log2) + 1 : 0;
    uint32_t *rh = tu_alloc((size_t)tchunks * PULSE_CLASS_COUNT * 4);
    uint8_t *rc = tu_alloc((size_t)r->count);
    uint32_t *rr = tu_alloc((size_t)r->count * 4);
    ref_rank_form(ts[t].snap, n, chunk_log2, r, rh, rc, rr);
    cr_assert_eq(tu_memdiff(hist + chunk_at * PULSE_CLASS_COUNT, rh,
                            (size_t)tchunks * PULSE_CLASS_COUNT * 4),
                 -1, "%s: tensor %zu class counts", what, t);
    cr_assert_eq(tu_memdiff(cls + at, rc, (size_t)r->count), -1,
                 "%s: tensor %zu classes", what, t);
    cr_assert_eq(tu_memdiff(rank + at, rr, (size_t)r->count * 4), -1,
                 "%s: tensor %zu ranks", what, t);
    free(rh), free(rc), free(rr);
    /* The snapshot: the new bits with update, untouched without. */
    uint16_t *snap = dev_download(ts[t].snap_d, (size_t)n * 2);
    cr_assert_eq(
        tu_memdiff(snap, update ? ref_snap[t] : ts[t].snap, (size_t)n * 2), -1,
        "%s: tensor %zu snapshot", what, t);
    if (update)
      memcpy(ts[t].snap, snap, (size_t)n * 2);
    free(snap);
    at += r->count;
    chunk_at += tchunks;
  }
  free(pos), free(old_bits), free(new_bits), free(cls), free(rank), free(hist);
  pulse_cuda_free(out.pos_d), pulse_cuda_free(out.old_d),
      pulse_cuda_free(out.new_d);
  pulse_cuda_free(out.class_d), pulse_cuda_free(out.rank_d),
      pulse_cuda_free(out.chunk_hist_d);
  for (size_t t = 0; t < count; t++) {
    pulse_changes_free(&ref[t]);
    free(ref_snap[t]);
  }
  free(ref), free(ref_snap), free(table), free(counts);
}

Test(cuda_detect, single_tensors_match_the_reference) {
  GPU_TEST_START();
  static const uint64_t sizes[] = {0,    1,     31,    32,    33,
                                   127,  1000,  1024,  8191,  8192,
                                   8193, 20000, 70001, 140000};
  static const double densities[] = {0.0, 0.01, 0.4, 1.0};
  static const tu_values kinds[] = {TU_NORMAL, TU_EDGE, TU_ANY, TU_CONST};
  static const uint32_t chunk_log2s[] = {10, 12, 14, 20};
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (size_t si = 0; si < COUNT_OF(sizes); si++)
    for (size_t di = 0; di < COUNT_OF(densities); di++) {
      uint64_t n = sizes[si];
      pulse_dtype dtype = (si + di) % 2 ? PULSE_DTYPE_BF16 : PULSE_DTYPE_F32;
      tu_values kind = kinds[(si + 3 * di) % COUNT_OF(kinds)];
      uint32_t chunk_log2 = chunk_log2s[(si * 7 + di) % COUNT_OF(chunk_log2s)];
      int update = (si + di) % 3 != 0;
      char what[160];
      snprintf(what, sizeof what,
               "n %llu density %g dtype %s kind %d chunk 2^%u update %d",
               (unsigned long long)n, densities[di], pulse_dtype_name(dtype),
               (int)kind, chunk_log2, update);
      dt_tensor t;
      dt_make(&t, 1000 * si + di, n, dtype, kind, densities[di]);
      check_table(ws, &t, 1, chunk_log2, update, 0, what);
      if (update) /* again: the snapshot now holds the new bits, so nothing
                     changes */
        check_table(ws, &t, 1, chunk_log2, update, 0, what);
      dt_free(&t);
    }
  pulse_cuda_workspace_free(ws);
}

Test(cuda_detect, tables_match_the_reference_tensor_by_tensor) {
  GPU_TEST_START();
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  uint64_t seed = 77;
  for (int round = 0; round < 6; round++) {
    size_t count = 1 + (size_t)(pulse_rng_next(&seed) % (round < 3 ? 8 : 60));
    dt_tensor *ts = tu_alloc(count * sizeof *ts);
    for (size_t t = 0; t < count; t++) {
      uint64_t r = pulse_rng_next(&seed);
      uint64_t n = r % 7 == 0   ? 0
                   : r % 5 == 0 ? 9000 + (r >> 20) % 9000
                                : (r >> 12) % 3000;
      double density = r % 11 == 0   ? 1.0
                       : r % 13 == 0 ? 0.0
                                     : 0.02 * (double)((r >> 40) % 10);
      dt_make(&ts[t], seed + t, n,
              (r >> 8) & 1 ? PULSE_DTYPE_F32 : PULSE_DTYPE_BF16,
              (tu_values)((r >> 16) % 4), density);
    }
    char what[64];
    snprintf(what, sizeof what, "round %d, %zu tensors", round, count);
    check_table(ws, ts, count, round % 2 ? 10 : 14, round % 2, 0, what);
    for (size_t t = 0; t < count; t++)
      dt_free(&ts[t]);
    free(ts);
  }
  pulse_cuda_workspace_free(ws);
}

Test(cuda_detect, an_output_too_small_changes_nothing) {
  GPU_TEST_START();
  dt_tensor t;
  dt_make(&t, 5, 30000, PULSE_DTYPE_F32, TU_EDGE, 0.1);
  pulse_cuda_detect_tensor table = {t.cur_d, t.dtype, t.snap_d, t.numel};
  pulse_cuda_detect_opts opts;
  pulse_cuda_detect_opts_init(&opts);
  opts.update_snapshot = 1;
  uint64_t total = 0;
  OK(pulse_cuda_detect(NULL, &table, 1, &opts, NULL, NULL, &total, NULL));
  cr_assert_gt(total, 100);
  uint64_t cap = total - 1;
  uint8_t *sentinel = tu_alloc((size_t)cap * 8);
  memset(sentinel, 0x5A, (size_t)cap * 8);
  pulse_cuda_changes out = {cap,
                            dev_upload(sentinel, (size_t)cap * 8),
                            dev_upload(sentinel, (size_t)cap * 2),
                            dev_upload(sentinel, (size_t)cap * 2),
                            NULL,
                            NULL,
                            NULL,
                            0};
  uint64_t counts[1] = {0};
  cr_assert_eq(
      pulse_cuda_detect(NULL, &table, 1, &opts, &out, counts, &total, NULL),
      PULSE_ERR_OVERFLOW);
  cr_assert_eq(total, cap + 1);
  cr_assert_eq(counts[0], cap + 1);
  uint8_t *after = dev_download(out.pos_d, (size_t)cap * 8);
  cr_assert_eq(tu_memdiff(after, sentinel, (size_t)cap * 8), -1);
  free(after);
  after = dev_download(t.snap_d, (size_t)t.numel * 2);
  cr_assert_eq(tu_memdiff(after, t.snap, (size_t)t.numel * 2), -1,
               "the snapshot changed");
  free(after);
  pulse_cuda_free(out.pos_d), pulse_cuda_free(out.old_d),
      pulse_cuda_free(out.new_d);
  free(sentinel);
  dt_free(&t);
}

/* ------------------------------------------------- 10^9 elements (large) */

typedef struct {
  uint64_t seed;
  uint32_t *cur;
  uint16_t *snap;
  uint64_t n;
  double density;
} fill_job;

static void fill_one(void *ctx, size_t b) {
  fill_job *job = ctx;
  uint64_t lo = (uint64_t)b << 20,
           hi = lo + (1u << 20) < job->n ? lo + (1u << 20) : job->n;
  tu_make_case(job->seed + b, hi - lo, PULSE_DTYPE_F32, TU_NORMAL, job->density,
               job->cur + lo, job->snap + lo);
}

Test(cuda_detect, a_billion_elements_match_the_reference, .timeout = 600) {
  GPU_TEST_START();
  if (!gpu_large())
    cr_skip_test(
        "10^9 elements only with PULSE_GPU_LARGE=1 (tests/gpu/check.sh)");
  dt_tensor t;
  t.numel = 1000000000ull;
  t.dtype = PULSE_DTYPE_F32;
  t.cur = malloc((size_t)t.numel * 4);
  t.snap = malloc((size_t)t.numel * 2);
  cr_assert(t.cur != NULL && t.snap != NULL);
  fill_job job = {4242, t.cur, t.snap, t.numel, 0.01};
  pulse_parallel_for(0, (size_t)((t.numel + (1u << 20) - 1) >> 20), fill_one,
                     &job);
  t.cur_d = dev_upload(t.cur, (size_t)t.numel * 4);
  t.snap_d = dev_upload(t.snap, (size_t)t.numel * 2);
  check_table(NULL, &t, 1, 20, 1, 1, "10^9 F32 at 1%");
  dt_free(&t);
}
