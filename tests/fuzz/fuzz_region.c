/* fuzz_region.c - libFuzzer target for patches applied into blocks of
 * tensors (pulse_region.h): pulse_patch_open on the input; when it opens,
 * every tensor up to a size bound gets the deterministic base of
 * patch_testutil.h (the corpus seeds are encoded against it), and one call
 * stages its lower rows into padded buffers, another its right columns,
 * each once without a halo and once with one (pulse_region.h).
 *
 * Besides memory errors (ASan/UBSan) it traps on broken promises: a failed
 * stage that wrote, staged changes after a failure, a committed block whose
 * kept digest is not its contents' digest, and a block that differs from
 * the whole tensor's decode (pulse_patch_decode_tensor) where both
 * succeeded, or a halo that differs from the decoded target's bits around
 * its block. A block may succeed where the whole tensor's decode fails: the
 * chunks it does not meet are not read. */
#include "../codec/patch_testutil.h"
#include "pulse_region.h"

#define MAX_NUMEL (1ull << 20) /* per tensor */
#define MAX_TOTAL (1ull << 22) /* all tensors of one input */
#define PAD 3                  /* columns of padding after each block row */

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_region: %s failed at line %d\n", #cond, __LINE__); \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

typedef struct {
  uint16_t *base; /* the whole tensor's base */
  uint16_t *want; /* base + decoded changes, when decoded */
  uint64_t rows, cols;
} tensor_state;

/* One stage call over blocks of the given tensors: `by_cols` takes the
 * right half of the columns, else the lower half of the rows; `halo`: each
 * block with a halo at 2^10 taken from the base (class-model chunks then
 * decode), checked after a commit against the decoded target's bits. */
static void run(const pulse_patch *p, tensor_state *ts, const size_t *idx, size_t k,
                int by_cols, int halo) {
  pulse_region *g = pt_alloc((k + 1) * sizeof *g);
  uint16_t **mem = pt_alloc((k + 1) * sizeof *mem);
  uint64_t *size = pt_alloc((k + 1) * sizeof *size);
  for (size_t j = 0; j < k; j++) {
    tensor_state *t = &ts[idx[j]];
    pulse_patch_tensor e;
    CHECK(pulse_patch_tensor_get(p, idx[j], &e) == PULSE_OK);
    uint64_t r0 = by_cols ? 0 : t->rows / 2, c0 = by_cols ? t->cols / 2 : 0;
    uint64_t nr = t->rows - r0, nc = t->cols - c0, stride = nc + PAD;
    size[j] = nr * stride;
    mem[j] = pt_alloc((size_t)(size[j] + 1) * 2);
    for (uint64_t r = 0; r < nr; r++)
      memcpy(mem[j] + r * stride, t->base + (r0 + r) * t->cols + c0, (size_t)nc * 2);
    g[j] = (pulse_region){e.info.name, r0, nr, c0, nc, mem[j], stride, {0, 0}, 0, NULL, {0, 0}};
    CHECK(pulse_region_digest(&g[j], t->cols, &g[j].digest) == PULSE_OK);
    if (halo) {
      uint64_t lo, hi, count;
      g[j].halo_log2 = 10;
      CHECK(pulse_region_span(&g[j], e.numel, t->cols, 10, &lo, &hi, &count) == PULSE_OK);
      g[j].halo = pt_alloc((size_t)(count + 1) * 2);
      CHECK(pulse_region_halo_take(&g[j], t->base, e.numel, t->cols) == PULSE_OK);
    }
  }
  uint16_t **before = pt_alloc((k + 1) * sizeof *before);
  for (size_t j = 0; j < k; j++)
    before[j] = pt_copy(mem[j], size[j]);
  pulse_region_staged *s = NULL;
  pulse_status st = pulse_region_stage(p, g, k, 1, &s);
  if (st != PULSE_OK) {
    CHECK(s == NULL);
    for (size_t j = 0; j < k; j++)
      CHECK(pt_first_diff(before[j], mem[j], size[j]) == PT_NONE);
  } else {
    pulse_region_staged_commit(s);
    pulse_region_staged_free(s);
    for (size_t j = 0; j < k; j++) {
      tensor_state *t = &ts[idx[j]];
      pulse_tensor_digest d;
      CHECK(pulse_region_digest(&g[j], t->cols, &d) == PULSE_OK);
      CHECK(d.a == g[j].digest.a && d.b == g[j].digest.b);
      for (uint64_t r = 0; t->want != NULL && r < g[j].rows; r++)
        CHECK(memcmp(mem[j] + r * g[j].stride,
                     t->want + (g[j].row0 + r) * t->cols + g[j].col0,
                     (size_t)g[j].cols * 2) == 0);
      if (halo && t->want != NULL) { /* the halo holds the target's bits */
        pulse_region w = g[j];
        uint64_t lo, hi, count;
        CHECK(pulse_region_span(&w, t->rows * t->cols, t->cols, 10, &lo, &hi, &count) ==
              PULSE_OK);
        w.halo = pt_alloc((size_t)(count + 1) * 2);
        CHECK(pulse_region_halo_take(&w, t->want, t->rows * t->cols, t->cols) == PULSE_OK);
        CHECK(memcmp(w.halo, g[j].halo, (size_t)count * 2) == 0);
        CHECK(w.halo_digest.a == g[j].halo_digest.a && w.halo_digest.b == g[j].halo_digest.b);
        free(w.halo);
      }
      for (uint64_t r = 0; r < g[j].rows; r++) /* padding untouched */
        for (uint64_t c = g[j].cols; c < g[j].stride && r * g[j].stride + c < size[j]; c++)
          CHECK(mem[j][r * g[j].stride + c] == 0);
    }
  }
  for (size_t j = 0; j < k; j++)
    free(mem[j]), free(before[j]), free(g[j].halo);
  free(g), free(mem), free(size), free(before);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pulse_patch *p = NULL;
  if (pulse_patch_open(data, size, &p) != PULSE_OK) {
    CHECK(p == NULL);
    return 0;
  }
  size_t n = pulse_patch_tensor_count(p), k = 0;
  tensor_state *ts = pt_alloc((n + 1) * sizeof *ts);
  size_t *idx = pt_alloc((n + 1) * sizeof *idx);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    pulse_patch_tensor e;
    CHECK(pulse_patch_tensor_get(p, i, &e) == PULSE_OK);
    if (e.numel == 0 || e.numel > MAX_NUMEL || total + e.numel > MAX_TOTAL)
      continue;
    CHECK(pulse_region_view(e.info.shape, e.info.ndim, &ts[i].rows, &ts[i].cols) == PULSE_OK);
    total += e.numel;
    ts[i].base = pt_alloc((size_t)e.numel * 2);
    for (uint64_t j = 0; j < e.numel; j++)
      ts[i].base[j] = pt_fuzz_base_bits(i, j);
    pulse_changes c = PULSE_CHANGES_INIT;
    if (pulse_patch_decode_tensor(p, i, ts[i].base, e.numel, &c) == PULSE_OK) {
      ts[i].want = pt_copy(ts[i].base, e.numel);
      pt_apply_changes(ts[i].want, &c);
    }
    pulse_changes_free(&c);
    idx[k++] = i;
  }
  for (int halo = 0; halo <= 1; halo++) {
    run(p, ts, idx, k, 0, halo);
    run(p, ts, idx, k, 1, halo);
  }
  for (size_t i = 0; i < n; i++)
    free(ts[i].base), free(ts[i].want);
  free(ts), free(idx);
  pulse_patch_free(p);
  return 0;
}
