/* test_cuda_fp8.c - the FP8 kernels (cuda/fp8.cu) against the CPU
 * reference, byte for byte: pulse_cuda_fp8_quantize against
 * pulse_fp8_quantize_ref, and a device pulse_cuda_fp8_track against a host
 * pulse_fp8_track fed the same steps (same E4M3FN bytes, same scales, same
 * figures), over shapes with partial edge blocks, scales per block and per
 * tensor, zero blocks, amax going up and down, blocks zeroed and sign
 * flips; a NaN or infinity, or a position outside the tensor, refused
 * with the FP8 tensor and its scales untouched. */
#include "cuda_testutil.h"
#include "pulse_fp8.h"
#include "pulse_fp8_elem.h"

typedef struct {
  uint64_t rows, cols;
} shape;

static const shape shapes[] = {{0, 0},     {0, 5},     {1, 1},   {1, 300},
                               {3, 129},   {128, 128}, {130, 257}, {257, 130},
                               {300, 77},  {129, 1}};

static const pulse_fp8_scale scales[] = {PULSE_FP8_SCALE_BLOCK,
                                         PULSE_FP8_SCALE_TENSOR};

static uint16_t f32_to_bf16(uint32_t f) { return pulse_bf16_from_f32_bits(f); }

/* Weight-like BF16 values, with what the quantizer must get right: blocks
 * of zeros (both signs), a few large values per block (its amax), BF16
 * subnormals, the largest finite values, tiny values that round to an
 * E4M3FN subnormal or zero. */
static void make_weights(uint64_t seed, uint64_t rows, uint64_t cols,
                         uint16_t *x) {
  for (uint64_t r = 0; r < rows; r++)
    for (uint64_t c = 0; c < cols; c++) {
      uint64_t i = r * cols + c, h = pulse_rng_at(seed, i);
      uint64_t block = (r / 128) * 7 + c / 128;
      uint16_t v = f32_to_bf16(tu_weight_f32(h));
      if (pulse_rng_at(seed ^ 0xB10C, block) % 5 == 0) /* a zero block */
        v = h & 1 ? 0x8000u : 0x0000u;
      else if (h % 97 == 0) /* an outlier */
        v = (uint16_t)((v & 0x8000u) | (0x4000u + (h >> 20) % 0x0F00u));
      else if (h % 89 == 0) /* BF16 subnormals and extremes */
        v = (const uint16_t[]){0x0001, 0x8001, 0x007F, 0x0080, 0x7F7F,
                               0xFF7F, 0x0000, 0x8000}[(h >> 12) % 8];
      else if (h % 83 == 0) /* far below the block's amax */
        v = (uint16_t)((v & 0x8000u) | (0x2000u + (h >> 24) % 0x0800u));
      x[i] = v;
    }
}

/* The reference bytes and scales of x. */
static void reference(const uint16_t *x, uint64_t rows, uint64_t cols,
                      pulse_fp8_scale scale, uint8_t *q, float *s) {
  pulse_fp8_tensor t = {rows, cols, q, s, scale};
  OK(pulse_fp8_quantize_ref(x, &t, 1));
}

typedef struct {
  uint64_t rows, cols, numel, scales;
  int device; /* where its memory is */
  pulse_fp8_scale scale;
  uint16_t *x_d;
  uint8_t *q_d;
  float *s_d;
  pulse_cuda_fp8_tensor t;
} dev_fp8;

/* Device copies of x and an FP8 tensor filled with 0xA5 (so that a byte
 * left unwritten shows). */
static dev_fp8 dev_make(const uint16_t *x, uint64_t rows, uint64_t cols,
                        pulse_fp8_scale scale) {
  dev_fp8 d;
  d.rows = rows, d.cols = cols, d.numel = rows * cols, d.scale = scale;
  OK(pulse_cuda_get_device(&d.device));
  OK(pulse_fp8_scale_count(rows, cols, scale, &d.scales));
  d.x_d = dev_upload(x, (size_t)d.numel * 2);
  d.q_d = dev_alloc((size_t)d.numel);
  d.s_d = dev_alloc((size_t)d.scales * 4);
  OK(pulse_cuda_fill(d.q_d, 0xA5, (size_t)d.numel, NULL));
  OK(pulse_cuda_fill(d.s_d, 0xA5, (size_t)d.scales * 4, NULL));
  OK(pulse_cuda_sync(NULL));
  d.t = (pulse_cuda_fp8_tensor){rows, cols, d.q_d, d.s_d, scale};
  return d;
}

static void dev_free(dev_fp8 *d) {
  pulse_cuda_free(d->x_d), pulse_cuda_free(d->q_d), pulse_cuda_free(d->s_d);
}

/* The device FP8 tensor equals q and s, byte for byte. */
static void expect_fp8(const dev_fp8 *d, const uint8_t *q, const float *s,
                       const char *what) {
  uint8_t *q_got = dev_download(d->q_d, (size_t)d->numel);
  float *s_got = dev_download(d->s_d, (size_t)d->scales * 4);
  long long at = tu_memdiff(q_got, q, (size_t)d->numel);
  cr_assert_eq(at, -1,
               "%s: %llux%llu scale %d: byte %lld (%lld, %lld) is 0x%02x, "
               "reference 0x%02x",
               what, (unsigned long long)d->rows, (unsigned long long)d->cols,
               (int)d->scale, at, d->cols ? at / (long long)d->cols : 0,
               d->cols ? at % (long long)d->cols : 0,
               at >= 0 ? q_got[at] : 0, at >= 0 ? q[at] : 0);
  at = tu_memdiff(s_got, s, (size_t)d->scales * 4);
  cr_assert_eq(at, -1, "%s: %llux%llu scale %d: scale %lld differs", what,
               (unsigned long long)d->rows, (unsigned long long)d->cols,
               (int)d->scale, at / 4);
  free(q_got), free(s_got);
}

static void check_quantize(uint64_t seed, shape sh, pulse_fp8_scale scale,
                           pulse_cuda_workspace *ws, void *stream) {
  uint64_t n = sh.rows * sh.cols, scales = 0;
  OK(pulse_fp8_scale_count(sh.rows, sh.cols, scale, &scales));
  uint16_t *x = tu_alloc((size_t)n * 2);
  uint8_t *q = tu_alloc((size_t)n);
  float *s = tu_alloc((size_t)scales * 4);
  make_weights(seed, sh.rows, sh.cols, x);
  reference(x, sh.rows, sh.cols, scale, q, s);
  dev_fp8 d = dev_make(x, sh.rows, sh.cols, scale);
  OK(pulse_cuda_fp8_quantize(ws, d.x_d, &d.t, stream));
  expect_fp8(&d, q, s, "quantize");
  dev_free(&d);
  free(x), free(q), free(s);
}

Test(cuda_fp8, quantize_matches_the_reference) {
  GPU_TEST_START();
  for (size_t i = 0; i < COUNT_OF(shapes); i++)
    for (size_t k = 0; k < COUNT_OF(scales); k++)
      check_quantize(i * 2 + k, shapes[i], scales[k], NULL, NULL);
}

Test(cuda_fp8, quantize_with_a_workspace_on_the_callers_stream) {
  GPU_TEST_START();
  pulse_cuda_workspace *ws = NULL;
  void *stream = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  OK(pulse_cuda_stream_create(&stream));
  for (uint64_t seed = 0; seed < 3; seed++)
    for (size_t k = 0; k < COUNT_OF(scales); k++)
      check_quantize(100 + seed, (shape){200 + seed * 61, 140 + seed * 3},
                     scales[k], ws, stream);
  pulse_cuda_stream_free(stream);
  pulse_cuda_workspace_free(ws);
}

/* Every BF16 value that is finite, at a fixed scale: a tensor whose first
 * element is the block's amax and the rest run through all finite bits. */
Test(cuda_fp8, every_finite_bf16_value_matches_the_reference) {
  GPU_TEST_START();
  static const uint16_t amax[] = {0x7F7F, 0x3F80, 0x0001, 0x43E0};
  uint64_t rows = 512, cols = 128; /* 65536 elements: every BF16 pattern */
  uint16_t *x = tu_alloc(rows * cols * 2);
  uint8_t *q = tu_alloc(rows * cols);
  float s = 0;
  for (size_t a = 0; a < COUNT_OF(amax); a++) {
    for (uint64_t i = 0; i < rows * cols; i++) {
      uint16_t v = (uint16_t)i;
      /* Not finite, or above the amax: the amax itself instead. */
      x[i] = pulse_fp8_bf16_finite(v) && pulse_fp8_bf16_abs(v) <= amax[a]
                 ? v
                 : amax[a];
    }
    reference(x, rows, cols, PULSE_FP8_SCALE_TENSOR, q, &s);
    dev_fp8 d = dev_make(x, rows, cols, PULSE_FP8_SCALE_TENSOR);
    OK(pulse_cuda_fp8_quantize(NULL, d.x_d, &d.t, NULL));
    expect_fp8(&d, q, &s, "every value");
    dev_free(&d);
  }
  free(x), free(q);
}

/* The FP8 tensor is still all 0xA5 bytes. */
static void expect_untouched(const dev_fp8 *d, const char *what) {
  uint8_t *q = dev_download(d->q_d, (size_t)d->numel);
  uint8_t *s = dev_download(d->s_d, (size_t)d->scales * 4);
  for (uint64_t i = 0; i < d->numel; i++)
    cr_assert_eq(q[i], 0xA5, "%s: byte %llu written", what,
                 (unsigned long long)i);
  for (uint64_t i = 0; i < d->scales * 4; i++)
    cr_assert_eq(s[i], 0xA5, "%s: scale byte %llu written", what,
                 (unsigned long long)i);
  free(q), free(s);
}

Test(cuda_fp8, nan_or_infinity_is_refused_and_nothing_written) {
  GPU_TEST_START();
  static const uint16_t bad[] = {0x7FC0, 0xFFC1, 0x7F80, 0xFF80, 0x7F81};
  const uint64_t rows = 260, cols = 300;
  uint16_t *x = tu_alloc(rows * cols * 2);
  for (size_t b = 0; b < COUNT_OF(bad); b++)
    for (size_t k = 0; k < COUNT_OF(scales); k++) {
      make_weights(7 + b, rows, cols, x);
      /* Two bad values: the first in row-major order is named. */
      uint64_t r = 131 + b, c = 257 - b;
      x[r * cols + c] = bad[b];
      x[(r + 50) * cols + 3] = bad[(b + 1) % COUNT_OF(bad)];
      dev_fp8 d = dev_make(x, rows, cols, scales[k]);
      cr_assert_eq(pulse_cuda_fp8_quantize(NULL, d.x_d, &d.t, NULL),
                   PULSE_ERR_UNSUPPORTED);
      char want[64];
      snprintf(want, sizeof want, "element (%llu, %llu) is %s",
               (unsigned long long)r, (unsigned long long)c,
               (bad[b] & 0x7F) ? "NaN" : "infinite");
      cr_assert(strstr(pulse_error_detail(), want) != NULL,
                "detail '%s' does not say '%s'", pulse_error_detail(), want);
      expect_untouched(&d, "quantize");
      pulse_cuda_fp8_track *tr = NULL;
      cr_assert_eq(pulse_cuda_fp8_track_create(d.x_d, &d.t, NULL, &tr),
                   PULSE_ERR_UNSUPPORTED);
      cr_assert_null(tr);
      expect_untouched(&d, "track create");
      dev_free(&d);
    }
  free(x);
}

/* ------------------------------------------------------------- steps */

/* One step's changes: offsets (distinct, in no particular order) and new
 * bits, made from the current values x. */
typedef struct {
  uint64_t *off;
  uint16_t *bits;
  uint64_t n;
} step;

/* The element holding block (br, bc)'s amax, and that amax. */
static uint64_t block_amax_at(const uint16_t *x, uint64_t rows, uint64_t cols,
                              uint64_t br, uint64_t bc) {
  uint64_t best = br * 128 * cols + bc * 128;
  for (uint64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
    for (uint64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++)
      if (pulse_fp8_bf16_abs(x[r * cols + c]) >
          pulse_fp8_bf16_abs(x[best]))
        best = r * cols + c;
  return best;
}

/* Kinds of step: small moves of about 1% of the weights; the amax of some
 * blocks up; the amax of some blocks down; a block zeroed; sign flips and
 * -0.0; many changes. Every kind also carries some small moves. */
enum { STEP_SMALL, STEP_UP, STEP_DOWN, STEP_ZERO, STEP_SIGNS, STEP_MANY,
       STEP_KINDS };

static void make_step(uint64_t seed, int kind, const uint16_t *x,
                      uint64_t rows, uint64_t cols, step *st) {
  uint64_t n = rows * cols;
  uint16_t *want = tu_alloc((size_t)n * 2);
  memcpy(want, x, (size_t)n * 2);
  double density = kind == STEP_MANY ? 0.3 : 0.01;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t h = pulse_rng_at(seed, i);
    if (!tu_chance(h, density))
      continue;
    uint16_t v = x[i];
    uint16_t moved = (uint16_t)(h & 2 ? v + 1 + (h >> 8) % 3 : v - 1 - (h >> 8) % 3);
    want[i] = pulse_fp8_bf16_finite(moved) ? moved : (uint16_t)(v ^ 0x8000u);
  }
  uint64_t grid_r = (rows + 127) / 128, grid_c = (cols + 127) / 128;
  for (uint64_t br = 0; br < grid_r; br++)
    for (uint64_t bc = 0; bc < grid_c; bc++) {
      uint64_t h = pulse_rng_at(seed ^ 0xB10C, br * grid_c + bc);
      if (h % 3 != 0 && kind != STEP_ZERO)
        continue;
      uint64_t at = block_amax_at(x, rows, cols, br, bc);
      uint16_t a = pulse_fp8_bf16_abs(x[at]);
      if (kind == STEP_UP) { /* a new largest element elsewhere */
        uint64_t r = br * 128 + (h >> 8) % 128, c = bc * 128 + (h >> 16) % 128;
        if (r < rows && c < cols && a < 0x7E00)
          want[r * cols + c] = (uint16_t)((h & 0x8000u) | (a + 0x80u + (h >> 24) % 0x100));
      } else if (kind == STEP_DOWN && a != 0) { /* the largest goes down */
        want[at] = (uint16_t)((x[at] & 0x8000u) | (a > 0x100 ? a - 0x100 : 0));
      } else if (kind == STEP_ZERO && h % 4 == 0) { /* the whole block */
        for (uint64_t r = br * 128; r < rows && r < br * 128 + 128; r++)
          for (uint64_t c = bc * 128; c < cols && c < bc * 128 + 128; c++)
            want[r * cols + c] = h & 8 ? 0x8000u : 0x0000u;
      } else if (kind == STEP_SIGNS) {
        want[at] = (uint16_t)(x[at] ^ 0x8000u);
        want[(at + 1) % n] = 0x8000u;
      }
    }
  st->off = tu_alloc((size_t)n * 8 + 8);
  st->bits = tu_alloc((size_t)n * 2 + 2);
  st->n = 0;
  for (uint64_t k = 0; k < n; k++) {
    uint64_t i = n - 1 - k; /* decreasing: the order must not matter */
    if (want[i] != x[i]) {
      st->off[st->n] = i;
      st->bits[st->n++] = want[i];
    }
  }
  free(want);
}

static void step_free(step *st) { free(st->off), free(st->bits); }

/* Stages, writes and commits one step on the host track and on the device
 * track, and compares bytes, scales and figures. */
static void run_step(pulse_fp8_track *host, uint16_t *x, const uint8_t *q,
                     const float *s, pulse_cuda_fp8_track *dev,
                     const dev_fp8 *d, const step *st, void *stream,
                     const char *what) {
  pulse_fp8_staged *staged = NULL;
  OK(pulse_fp8_track_stage(host, st->off, st->bits, st->n, &staged));
  pulse_fp8_stage_figures want = pulse_fp8_staged_figures_get(staged);
  pulse_fp8_staged_commit(staged);
  pulse_fp8_staged_free(staged);
  for (uint64_t k = 0; k < st->n; k++)
    x[st->off[k]] = st->bits[k];

  /* The change arrays on the tensor's device; the caller's current device
   * stays what it was for the calls. */
  int current = 0;
  OK(pulse_cuda_get_device(&current));
  OK(pulse_cuda_set_device(d->device));
  uint64_t *pos_d = dev_upload(st->off, (size_t)st->n * 8);
  uint16_t *new_d = dev_upload(st->bits, (size_t)st->n * 2);
  OK(pulse_cuda_set_device(current));
  OK(pulse_cuda_fp8_track_stage(dev, pos_d, new_d, st->n, stream));
  pulse_cuda_bf16_tensor table = {d->x_d, d->numel};
  uint64_t first[2] = {0, st->n};
  OK(pulse_cuda_scatter(NULL, &table, 1, first, pos_d, new_d, stream));
  pulse_fp8_stage_figures got;
  OK(pulse_cuda_fp8_track_commit(dev, stream, &got));
  cr_assert(got.changes == want.changes && got.blocks_touched == want.blocks_touched &&
                got.blocks_rescanned == want.blocks_rescanned &&
                got.blocks_rescaled == want.blocks_rescaled &&
                got.elements_quantized == want.elements_quantized,
            "%s: figures changes %llu/%llu touched %llu/%llu rescanned "
            "%llu/%llu rescaled %llu/%llu elements %llu/%llu (device/host)",
            what, (unsigned long long)got.changes, (unsigned long long)want.changes,
            (unsigned long long)got.blocks_touched,
            (unsigned long long)want.blocks_touched,
            (unsigned long long)got.blocks_rescanned,
            (unsigned long long)want.blocks_rescanned,
            (unsigned long long)got.blocks_rescaled,
            (unsigned long long)want.blocks_rescaled,
            (unsigned long long)got.elements_quantized,
            (unsigned long long)want.elements_quantized);
  OK(pulse_cuda_sync(stream));
  int after = -1;
  OK(pulse_cuda_get_device(&after));
  cr_assert_eq(after, current, "%s: the calls left device %d current", what, after);
  expect_fp8(d, q, s, what);
  pulse_cuda_free(pos_d), pulse_cuda_free(new_d);
}

/* A device track and a host track side by side over every kind of step;
 * after each, the host track also equals a fresh reference quantization
 * (the host track's own promise, checked again here). */
static void check_track(uint64_t seed, shape sh, pulse_fp8_scale scale,
                        void *stream) {
  uint64_t n = sh.rows * sh.cols, scales = 0;
  OK(pulse_fp8_scale_count(sh.rows, sh.cols, scale, &scales));
  uint16_t *x = tu_alloc((size_t)n * 2);
  uint8_t *q = tu_alloc((size_t)n), *q_ref = tu_alloc((size_t)n);
  float *s = tu_alloc((size_t)scales * 4), *s_ref = tu_alloc((size_t)scales * 4);
  make_weights(seed, sh.rows, sh.cols, x);
  pulse_fp8_tensor t = {sh.rows, sh.cols, q, s, scale};
  pulse_fp8_track *host = NULL;
  OK(pulse_fp8_track_create(x, &t, 1, &host));
  dev_fp8 d = dev_make(x, sh.rows, sh.cols, scale);
  pulse_cuda_fp8_track *dev = NULL;
  OK(pulse_cuda_fp8_track_create(d.x_d, &d.t, stream, &dev));
  expect_fp8(&d, q, s, "track create");
  for (int k = 0; k < 2 * STEP_KINDS; k++) {
    step st;
    char what[96];
    snprintf(what, sizeof what, "%llux%llu scale %d step %d",
             (unsigned long long)sh.rows, (unsigned long long)sh.cols,
             (int)scale, k);
    make_step(seed * 100 + (uint64_t)k, k % STEP_KINDS, x, sh.rows, sh.cols, &st);
    run_step(host, x, q, s, dev, &d, &st, stream, what);
    reference(x, sh.rows, sh.cols, scale, q_ref, s_ref);
    cr_assert_eq(tu_memdiff(q, q_ref, (size_t)n), -1, "%s: host track", what);
    cr_assert_eq(tu_memdiff(s, s_ref, (size_t)scales * 4), -1,
                 "%s: host track scales", what);
    step_free(&st);
  }
  pulse_cuda_fp8_track_free(dev);
  pulse_fp8_track_free(host);
  dev_free(&d);
  free(x), free(q), free(q_ref), free(s), free(s_ref);
}

Test(cuda_fp8, track_steps_match_the_host_track, .timeout = 300) {
  GPU_TEST_START();
  static const shape track_shapes[] = {{260, 300}, {129, 129}, {1, 200}, {300, 1}};
  for (size_t i = 0; i < COUNT_OF(track_shapes); i++)
    for (size_t k = 0; k < COUNT_OF(scales); k++)
      check_track(i * 2 + k + 1, track_shapes[i], scales[k], NULL);
}

Test(cuda_fp8, track_on_the_callers_stream) {
  GPU_TEST_START();
  void *stream = NULL;
  OK(pulse_cuda_stream_create(&stream));
  check_track(42, (shape){140, 390}, PULSE_FP8_SCALE_BLOCK, stream);
  pulse_cuda_stream_free(stream);
}

/* A refused stage leaves everything as it was, and the track goes on. */
Test(cuda_fp8, track_refuses_nan_and_bad_positions_and_writes_nothing) {
  GPU_TEST_START();
  const uint64_t rows = 200, cols = 260, n = rows * cols;
  uint64_t scales = 0;
  OK(pulse_fp8_scale_count(rows, cols, PULSE_FP8_SCALE_BLOCK, &scales));
  uint16_t *x = tu_alloc(n * 2);
  uint8_t *q = tu_alloc(n);
  float *s = tu_alloc(scales * 4);
  make_weights(9, rows, cols, x);
  pulse_fp8_tensor t = {rows, cols, q, s, PULSE_FP8_SCALE_BLOCK};
  pulse_fp8_track *host = NULL;
  OK(pulse_fp8_track_create(x, &t, 1, &host));
  dev_fp8 d = dev_make(x, rows, cols, PULSE_FP8_SCALE_BLOCK);
  pulse_cuda_fp8_track *dev = NULL;
  OK(pulse_cuda_fp8_track_create(d.x_d, &d.t, NULL, &dev));
  cr_assert_eq(pulse_cuda_fp8_track_commit(dev, NULL, NULL), PULSE_ERR_ARG,
               "a commit with nothing staged");

  step st;
  make_step(5, STEP_UP, x, rows, cols, &st);
  cr_assert(st.n > 10);
  uint64_t *pos_d = dev_upload(st.off, st.n * 8);
  /* A NaN and an infinity among the changes: the lower entry is named. */
  uint16_t *bad_bits = tu_alloc(st.n * 2);
  memcpy(bad_bits, st.bits, st.n * 2);
  bad_bits[st.n / 2] = 0xFFC0;
  bad_bits[st.n - 1] = 0x7F80;
  uint16_t *new_d = dev_upload(bad_bits, st.n * 2);
  cr_assert_eq(pulse_cuda_fp8_track_stage(dev, pos_d, new_d, st.n, NULL),
               PULSE_ERR_UNSUPPORTED);
  char want[64];
  snprintf(want, sizeof want, "element (%llu, %llu) would be NaN",
           (unsigned long long)(st.off[st.n / 2] / cols),
           (unsigned long long)(st.off[st.n / 2] % cols));
  cr_assert(strstr(pulse_error_detail(), want) != NULL, "detail '%s', want '%s'",
            pulse_error_detail(), want);
  cr_assert_eq(pulse_cuda_fp8_track_commit(dev, NULL, NULL), PULSE_ERR_ARG,
               "a refused stage left something to commit");
  expect_fp8(&d, q, s, "after a NaN");
  pulse_cuda_free(new_d);

  /* A position past the end. */
  uint64_t *bad_off = tu_alloc(st.n * 8);
  memcpy(bad_off, st.off, st.n * 8);
  bad_off[3] = n;
  uint64_t *bad_pos_d = dev_upload(bad_off, st.n * 8);
  new_d = dev_upload(st.bits, st.n * 2);
  cr_assert_eq(pulse_cuda_fp8_track_stage(dev, bad_pos_d, new_d, st.n, NULL),
               PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "entry 3") != NULL, "detail '%s'",
            pulse_error_detail());
  expect_fp8(&d, q, s, "after a bad position");

  /* A stage dropped commits nothing. */
  OK(pulse_cuda_fp8_track_stage(dev, pos_d, new_d, st.n, NULL));
  pulse_cuda_fp8_track_drop(dev);
  cr_assert_eq(pulse_cuda_fp8_track_commit(dev, NULL, NULL), PULSE_ERR_ARG);
  expect_fp8(&d, q, s, "after a drop");

  /* The same step, good this time, matches the host track. */
  run_step(host, x, q, s, dev, &d, &st, NULL, "after the refusals");
  /* And a whole requantization (an anchor) after replacing the tensor. */
  make_weights(10, rows, cols, x);
  OK(pulse_cuda_upload(d.x_d, x, n * 2, NULL));
  OK(pulse_cuda_fp8_track_requantize(dev, NULL));
  reference(x, rows, cols, PULSE_FP8_SCALE_BLOCK, q, s);
  expect_fp8(&d, q, s, "requantize");

  pulse_cuda_free(pos_d), pulse_cuda_free(new_d), pulse_cuda_free(bad_pos_d);
  step_free(&st);
  free(bad_bits), free(bad_off);
  pulse_cuda_fp8_track_free(dev);
  pulse_fp8_track_free(host);
  dev_free(&d);
  free(x), free(q), free(s);
}

Test(cuda_fp8, bad_arguments_are_refused) {
  GPU_TEST_START();
  uint16_t host_x[4] = {0};
  dev_fp8 d = dev_make(host_x, 2, 2, PULSE_FP8_SCALE_BLOCK);
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, d.x_d, NULL, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, NULL, &d.t, NULL), PULSE_ERR_ARG);
  pulse_cuda_fp8_tensor bad = d.t;
  bad.scale = (pulse_fp8_scale)7;
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, d.x_d, &bad, NULL), PULSE_ERR_ARG);
  bad = d.t;
  bad.q_d = (uint8_t *)host_x; /* host memory */
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, d.x_d, &bad, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, (const uint16_t *)((char *)d.x_d + 1),
                                       &d.t, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_fp8_track_create(d.x_d, &d.t, NULL, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_fp8_track_stage(NULL, NULL, NULL, 0, NULL), PULSE_ERR_ARG);
  expect_untouched(&d, "bad arguments");
  dev_free(&d);
}

/* One track per device (a tensor-parallel rank each), driven from a thread
 * whose current device stays 0; memory of two devices in one call is
 * refused. */
Test(cuda_fp8, tracks_run_on_the_device_that_owns_the_memory) {
  GPU_TEST_START();
  if (pulse_cuda_device_count() < 2)
    cr_skip_test("one device (the emulator fakes two)");
  const uint64_t rows = 150, cols = 140, n = rows * cols;
  uint64_t scales = 0;
  OK(pulse_fp8_scale_count(rows, cols, PULSE_FP8_SCALE_BLOCK, &scales));
  uint16_t *x[2];
  uint8_t *q[2];
  float *s[2];
  pulse_fp8_track *host[2];
  dev_fp8 d[2];
  pulse_cuda_fp8_track *dev[2];
  for (int r = 0; r < 2; r++) {
    x[r] = tu_alloc(n * 2), q[r] = tu_alloc(n), s[r] = tu_alloc(scales * 4);
    make_weights(30 + (uint64_t)r, rows, cols, x[r]);
    pulse_fp8_tensor t = {rows, cols, q[r], s[r], PULSE_FP8_SCALE_BLOCK};
    OK(pulse_fp8_track_create(x[r], &t, 1, &host[r]));
    OK(pulse_cuda_set_device(r));
    d[r] = dev_make(x[r], rows, cols, PULSE_FP8_SCALE_BLOCK);
    OK(pulse_cuda_set_device(0));
    OK(pulse_cuda_fp8_track_create(d[r].x_d, &d[r].t, NULL, &dev[r]));
    expect_fp8(&d[r], q[r], s[r], "create on a rank's device");
  }
  for (int k = 0; k < 4; k++)
    for (int r = 0; r < 2; r++) {
      step st;
      make_step(70 + (uint64_t)(10 * k + r), k % STEP_KINDS, x[r], rows, cols, &st);
      run_step(host[r], x[r], q[r], s[r], dev[r], &d[r], &st, NULL, "a rank's step");
      step_free(&st);
    }
  pulse_cuda_fp8_tensor mixed = d[1].t;
  mixed.q_d = d[0].q_d; /* bytes of device 0 for a tensor on device 1 */
  cr_assert_eq(pulse_cuda_fp8_quantize(NULL, d[1].x_d, &mixed, NULL), PULSE_ERR_ARG);
  cr_assert_not_null(strstr(pulse_error_detail(), "device"), "%s", pulse_error_detail());
  uint64_t off = 5;
  uint16_t bits = 0x3F80;
  uint64_t *pos_d = dev_upload(&off, 8); /* on device 0 */
  uint16_t *new_d = dev_upload(&bits, 2);
  cr_assert_eq(pulse_cuda_fp8_track_stage(dev[1], pos_d, new_d, 1, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_cuda_fp8_track_commit(dev[1], NULL, NULL), PULSE_ERR_ARG);
  expect_fp8(&d[1], q[1], s[1], "after a refused stage");
  pulse_cuda_free(pos_d), pulse_cuda_free(new_d);
  for (int r = 0; r < 2; r++) {
    pulse_cuda_fp8_track_free(dev[r]);
    pulse_fp8_track_free(host[r]);
    dev_free(&d[r]);
    free(x[r]), free(q[r]), free(s[r]);
  }
}
