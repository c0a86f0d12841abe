/* test_patch_region.c - patches applied into blocks of tensors
 * (pulse_region.h): row blocks (column-parallel shards, several in one
 * fused buffer) and column blocks (row-parallel shards) end bit for bit at
 * the target's slice, over both format versions, densities and chunk
 * sizes that cut blocks; the blocks' digests add up to the target
 * digest; whole-tensor regions, and row and column blocks with halos,
 * decode class-model patches (two in a row: the halo follows), checked
 * against the patch's digests where block and halo are the whole tensor.
 * Hostile and wrong input (a wrong whole base, a halo that is not the
 * base's, overlapping blocks, a block outside its tensor, a name twice or
 * unknown, a halo missing or misaligned, a class-model chunk beyond what a
 * region holds) is refused with nothing written, across every region of
 * the call. */
#include "patch_testutil.h"

#include <criterion/criterion.h>

#include "pulse_region.h"

/* A 2-D tensor `rows` x `cols` with changes at `density`. */
static void make2(pt_tensor *t, const char *name, uint64_t rows, uint64_t cols,
                  double density, uint64_t seed) {
  uint64_t shape[2] = {rows, cols};
  pt_tensor_make(t, name, 2, shape, PT_WEIGHTS_NORMAL, density, 1, seed);
}

static pulse_patch *encode_open(const pt_tensor *ts, size_t n, pulse_pos_model model,
                                unsigned version, uint32_t chunk_log2, pulse_buffer *buf) {
  pulse_encode_opts o = pt_opts(model, chunk_log2, 1);
  o.format_version = version;
  pulse_status st = pt_encode(&o, ts, n, buf);
  cr_assert_eq(st, PULSE_OK, "encode: %s", pulse_error_detail());
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(buf->data, buf->size, &p), PULSE_OK, "open: %s",
               pulse_error_detail());
  return p;
}

/* A region over `dst` holding block rows [r0, r0+nr) cols [c0, c0+nc) of t
 * copied from `src` (t's base or target), with its digest. */
static pulse_region block_of(const pt_tensor *t, const uint16_t *src, uint64_t r0, uint64_t nr,
                             uint64_t c0, uint64_t nc, uint16_t *dst, uint64_t stride) {
  uint64_t C = t->shape[1];
  for (uint64_t r = 0; r < nr; r++)
    memcpy(dst + r * stride, src + (r0 + r) * C + c0, nc * 2);
  pulse_region g = {t->name, r0, nr, c0, nc, dst, stride, {0, 0}, 0, NULL, {0, 0}};
  cr_assert_eq(pulse_region_digest(&g, C, &g.digest), PULSE_OK);
  return g;
}

/* The block in dst equals the slice of `want`. */
static void expect_block(const pt_tensor *t, const uint16_t *want, const pulse_region *g,
                         const char *label) {
  uint64_t C = t->shape[1];
  for (uint64_t r = 0; r < g->rows; r++)
    for (uint64_t c = 0; c < g->cols; c++)
      cr_assert_eq(g->data[r * g->stride + c], want[(g->row0 + r) * C + g->col0 + c],
                   "%s: '%s' (%llu, %llu) differs", label, t->name,
                   (unsigned long long)(g->row0 + r), (unsigned long long)(g->col0 + c));
}

static pulse_status stage_commit(const pulse_patch *p, pulse_region *g, size_t n) {
  pulse_region_staged *s = NULL;
  pulse_status st = pulse_region_stage(p, g, n, 2, &s);
  if (st == PULSE_OK)
    pulse_region_staged_commit(s);
  pulse_region_staged_free(s);
  return st;
}

Test(region, row_and_column_blocks_end_at_the_targets_slices) {
  static const double densities[] = {0.0, 0.01, 0.3, 1.0};
  static const uint32_t chunk_logs[] = {10, 12, 20};
  for (unsigned version = 1; version <= 3; version++)
    for (size_t di = 0; di < PT_COUNT_OF(densities); di++)
      for (size_t ci = 0; ci < PT_COUNT_OF(chunk_logs); ci++) {
        pt_tensor ts[2];
        make2(&ts[0], "q", 96, 40, densities[di], 11 + di);  /* column-parallel */
        make2(&ts[1], "o", 40, 96, densities[di], 23 + di);  /* row-parallel */
        pulse_buffer buf = {NULL, 0};
        pulse_patch *p = encode_open(ts, 2, PULSE_POS_PLAIN, version, chunk_logs[ci], &buf);
        char label[96];
        snprintf(label, sizeof label, "v%u density %g chunk 2^%u", version, densities[di],
                 chunk_logs[ci]);
        for (uint64_t tp = 1; tp <= 4; tp *= 2) {
          pulse_tensor_digest qsum = {0, 0}, osum = {0, 0};
          for (uint64_t rank = 0; rank < tp; rank++) {
            /* The rank's buffer: 7 rows of padding before its q rows (as if
             * another part came first in a fused buffer), and its o columns. */
            uint64_t qr = 96 / tp, oc = 96 / tp;
            uint16_t *fused = pt_alloc((7 + qr) * 40 * 2);
            uint16_t *cols = pt_alloc(40 * oc * 2);
            pulse_region g[2] = {
                block_of(&ts[0], ts[0].base, rank * qr, qr, 0, 40, fused + 7 * 40, 40),
                block_of(&ts[1], ts[1].base, 0, 40, rank * oc, oc, cols, oc)};
            pulse_status st = stage_commit(p, g, 2);
            cr_assert_eq(st, PULSE_OK, "%s tp %llu: %s", label, (unsigned long long)tp,
                         pulse_error_detail());
            expect_block(&ts[0], ts[0].target, &g[0], label);
            expect_block(&ts[1], ts[1].target, &g[1], label);
            for (uint64_t i = 0; i < 7 * 40; i++)
              cr_assert_eq(fused[i], 0, "%s: padding before the block was written", label);
            /* The kept digest is the new block's. */
            pulse_tensor_digest d;
            cr_assert_eq(pulse_region_digest(&g[0], 40, &d), PULSE_OK);
            cr_assert(d.a == g[0].digest.a && d.b == g[0].digest.b, "%s: kept digest", label);
            qsum.a += g[0].digest.a, qsum.b += g[0].digest.b;
            osum.a += g[1].digest.a, osum.b += g[1].digest.b;
            free(fused), free(cols);
          }
          pulse_patch_tensor pt;
          pulse_patch_tensor_get(p, 0, &pt);
          cr_assert(qsum.a == pt.target_digest.a && qsum.b == pt.target_digest.b,
                    "%s: row blocks do not add up to the target digest", label);
          pulse_patch_tensor_get(p, 1, &pt);
          cr_assert(osum.a == pt.target_digest.a && osum.b == pt.target_digest.b,
                    "%s: column blocks do not add up to the target digest", label);
        }
        pulse_patch_free(p);
        pulse_buffer_free(&buf);
        pt_tensors_free(ts, 2);
      }
}

Test(region, fused_parts_share_one_buffer_and_one_transaction) {
  /* q, k, v rows of one rank one after the other, as engines fuse them. */
  pt_tensor ts[3];
  make2(&ts[0], "q_proj", 64, 32, 0.1, 1);
  make2(&ts[1], "k_proj", 16, 32, 0.1, 2);
  make2(&ts[2], "v_proj", 16, 32, 0.1, 3);
  pulse_buffer buf = {NULL, 0};
  pulse_patch *p = encode_open(ts, 3, PULSE_POS_PLAIN, 2, 10, &buf);
  uint16_t *qkv = pt_alloc((32 + 8 + 8) * 32 * 2);
  pulse_region g[3] = {block_of(&ts[0], ts[0].base, 32, 32, 0, 32, qkv, 32),
                       block_of(&ts[1], ts[1].base, 8, 8, 0, 32, qkv + 32 * 32, 32),
                       block_of(&ts[2], ts[2].base, 8, 8, 0, 32, qkv + 40 * 32, 32)};
  cr_assert_eq(stage_commit(p, g, 3), PULSE_OK, "%s", pulse_error_detail());
  for (int i = 0; i < 3; i++)
    expect_block(&ts[i], ts[i].target, &g[i], "fused");
  free(qkv);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, 3);
}

Test(region, whole_tensors_take_class_model_patches_checked_against_the_patch) {
  pt_tensor t;
  make2(&t, "w", 50, 60, 0.05, 9);
  pulse_buffer buf = {NULL, 0};
  pulse_patch *p = encode_open(&t, 1, PULSE_POS_CLASS, 2, 10, &buf);
  uint16_t *dst = pt_alloc(50 * 60 * 2);
  pulse_region g = block_of(&t, t.base, 0, 50, 0, 60, dst, 60);
  cr_assert_eq(stage_commit(p, &g, 1), PULSE_OK, "%s", pulse_error_detail());
  expect_block(&t, t.target, &g, "whole, class model");
  /* A whole base other than the patch's, with a kept digest that matches
   * its memory: refused by the patch's own base digest. */
  g = block_of(&t, t.base, 0, 50, 0, 60, dst, 60);
  dst[5] ^= 1;
  cr_assert_eq(pulse_region_digest(&g, 60, &g.digest), PULSE_OK);
  uint16_t *before = pt_copy(dst, 50 * 60);
  cr_assert_eq(stage_commit(p, &g, 1), PULSE_ERR_BASE_DIGEST);
  cr_assert_eq(pt_first_diff(before, dst, 50 * 60), PT_NONE, "a refused base was written");
  free(before), free(dst);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensor_free(&t);
}

/* The step after prev: changes at `density` from prev's target. */
static void next_step(pt_tensor *n, const pt_tensor *prev, const char *name, double density,
                      uint64_t seed) {
  pt_tensor_shape(n, name, prev->ndim, prev->shape);
  uint64_t s = seed;
  n->base = pt_copy(prev->target, prev->numel);
  pt_make_changes(n->base, n->numel, density, 1, &s, &n->changes);
  n->target = pt_copy(n->base, n->numel);
  pt_apply_changes(n->target, &n->changes);
}

/* Gives g a halo at alignment 2^log2 taken from src, t's whole bits. */
static void with_halo(pulse_region *g, const pt_tensor *t, const uint16_t *src, uint32_t log2) {
  uint64_t lo, hi, count;
  g->halo_log2 = log2;
  cr_assert_eq(pulse_region_span(g, t->numel, t->shape[1], log2, &lo, &hi, &count), PULSE_OK);
  g->halo = count ? pt_alloc(count * 2) : NULL;
  cr_assert_eq(pulse_region_halo_take(g, src, t->numel, t->shape[1]), PULSE_OK, "%s",
               pulse_error_detail());
}

/* g's halo holds `want`'s bits around its block, with their digest. */
static void expect_halo(const pt_tensor *t, const uint16_t *want, const pulse_region *g,
                        const char *label) {
  uint64_t lo, hi, count;
  cr_assert_eq(pulse_region_span(g, t->numel, t->shape[1], g->halo_log2, &lo, &hi, &count),
               PULSE_OK);
  pulse_region w = *g;
  w.halo = count ? pt_alloc(count * 2) : NULL;
  cr_assert_eq(pulse_region_halo_take(&w, want, t->numel, t->shape[1]), PULSE_OK);
  cr_assert(count == 0 || memcmp(w.halo, g->halo, count * 2) == 0, "%s: halo of '%s' differs",
            label, t->name);
  cr_assert(w.halo_digest.a == g->halo_digest.a && w.halo_digest.b == g->halo_digest.b,
            "%s: halo digest of '%s'", label, t->name);
  free(w.halo);
}

Test(region, class_model_into_blocks_with_halos_ends_at_the_targets_slices) {
  /* Chunks of 2^10 over 96 x 40 and 40 x 96 tensors: row blocks meet
   * chunks that straddle their first and last rows (the halo holds the
   * rest: partial spans, derived digests), column blocks every chunk (the
   * halo is the rest of the tensor: checked against the patch's digests).
   * Two patches in a row: the halo follows the first. */
  static const double densities[] = {0.01, 0.3, 1.0};
  for (unsigned version = 1; version <= 3; version++)
    for (size_t di = 0; di < PT_COUNT_OF(densities); di++)
      for (uint64_t tp = 1; tp <= 4; tp *= 2)
        for (uint64_t rank = 0; rank < tp; rank++) {
          pt_tensor ts[2], next[2];
          make2(&ts[0], "q", 96, 40, densities[di], 31 + di);
          make2(&ts[1], "o", 40, 96, densities[di], 47 + di);
          pulse_buffer buf = {NULL, 0}, buf2 = {NULL, 0};
          pulse_patch *p = encode_open(ts, 2, PULSE_POS_CLASS, version, 10, &buf);
          /* The second step: from the first's target. */
          for (int i = 0; i < 2; i++)
            next_step(&next[i], &ts[i], i ? "o" : "q", densities[di], 61 + di + i);
          pulse_patch *p2 = encode_open(next, 2, PULSE_POS_CLASS, version, 10, &buf2);
          char label[96];
          snprintf(label, sizeof label, "v%u density %g tp %llu rank %llu", version,
                   densities[di], (unsigned long long)tp, (unsigned long long)rank);
          uint64_t qr = 96 / tp, oc = 96 / tp;
          uint16_t *rows = pt_alloc(qr * 40 * 2), *cols = pt_alloc(40 * oc * 2);
          pulse_region g[2] = {block_of(&ts[0], ts[0].base, rank * qr + 0, qr, 0, 40, rows, 40),
                               block_of(&ts[1], ts[1].base, 0, 40, rank * oc, oc, cols, oc)};
          with_halo(&g[0], &ts[0], ts[0].base, 10);
          with_halo(&g[1], &ts[1], ts[1].base, 10);
          cr_assert_eq(stage_commit(p, g, 2), PULSE_OK, "%s: %s", label, pulse_error_detail());
          for (int i = 0; i < 2; i++) {
            expect_block(&ts[i], ts[i].target, &g[i], label);
            expect_halo(&ts[i], ts[i].target, &g[i], label);
          }
          cr_assert_eq(stage_commit(p2, g, 2), PULSE_OK, "%s, second: %s", label,
                       pulse_error_detail());
          for (int i = 0; i < 2; i++) {
            expect_block(&next[i], next[i].target, &g[i], label);
            expect_halo(&next[i], next[i].target, &g[i], label);
            pulse_tensor_digest d;
            cr_assert_eq(pulse_region_digest(&g[i], next[i].shape[1], &d), PULSE_OK);
            cr_assert(d.a == g[i].digest.a && d.b == g[i].digest.b, "%s: kept digest", label);
          }
          free(rows), free(cols), free(g[0].halo), free(g[1].halo);
          pulse_patch_free(p), pulse_patch_free(p2);
          pulse_buffer_free(&buf), pulse_buffer_free(&buf2);
          pt_tensors_free(ts, 2), pt_tensors_free(next, 2);
        }
}

Test(region, class_model_chunks_inside_a_blocks_rows_decode_from_the_block_itself) {
  /* Rows of 4096 elements and chunks of 2^10: most chunks lie inside one
   * row of the block, where the decoder reads the base from the block's own
   * memory (padded strides, so a wrong row step would show), the others
   * straddle block and halo and are gathered. Two patches in a row. */
  for (unsigned version = 1; version <= 3; version++) {
    pt_tensor ts[2], next[2];
    make2(&ts[0], "cols", 6, 4096, 0.02, 71 + version);
    make2(&ts[1], "rows", 6, 4096, 0.02, 83 + version);
    pulse_buffer buf = {NULL, 0}, buf2 = {NULL, 0};
    pulse_patch *p = encode_open(ts, 2, PULSE_POS_CLASS, version, 10, &buf);
    for (int i = 0; i < 2; i++)
      next_step(&next[i], &ts[i], i ? "rows" : "cols", 0.02, 97 + version + i);
    pulse_patch *p2 = encode_open(next, 2, PULSE_POS_CLASS, version, 10, &buf2);
    uint64_t cstride = 2048 + 13, rstride = 4096 + 7;
    uint16_t *cmem = pt_alloc(6 * cstride * 2), *rmem = pt_alloc(2 * rstride * 2);
    pulse_region g[2] = {block_of(&ts[0], ts[0].base, 0, 6, 1000, 2048, cmem, cstride),
                         block_of(&ts[1], ts[1].base, 2, 2, 0, 4096, rmem, rstride)};
    with_halo(&g[0], &ts[0], ts[0].base, 10);
    with_halo(&g[1], &ts[1], ts[1].base, 10);
    char label[32];
    snprintf(label, sizeof label, "v%u", version);
    cr_assert_eq(stage_commit(p, g, 2), PULSE_OK, "%s: %s", label, pulse_error_detail());
    for (int i = 0; i < 2; i++) {
      expect_block(&ts[i], ts[i].target, &g[i], label);
      expect_halo(&ts[i], ts[i].target, &g[i], label);
    }
    cr_assert_eq(stage_commit(p2, g, 2), PULSE_OK, "%s, second: %s", label,
                 pulse_error_detail());
    for (int i = 0; i < 2; i++) {
      expect_block(&next[i], next[i].target, &g[i], label);
      expect_halo(&next[i], next[i].target, &g[i], label);
    }
    free(cmem), free(rmem), free(g[0].halo), free(g[1].halo);
    pulse_patch_free(p), pulse_patch_free(p2);
    pulse_buffer_free(&buf), pulse_buffer_free(&buf2);
    pt_tensors_free(ts, 2), pt_tensors_free(next, 2);
  }
}

Test(region, class_model_beyond_what_the_region_holds_is_refused) {
  pt_tensor t;
  make2(&t, "w", 50, 60, 0.05, 9);
  pulse_buffer buf = {NULL, 0}, big = {NULL, 0};
  pulse_patch *p = encode_open(&t, 1, PULSE_POS_CLASS, 2, 10, &buf);
  pulse_patch *p12 = encode_open(&t, 1, PULSE_POS_CLASS, 2, 12, &big);
  uint16_t *dst = pt_alloc(50 * 30 * 2);
  /* No halo: a column block holds no whole chunk. */
  pulse_region g = block_of(&t, t.base, 0, 50, 30, 30, dst, 30);
  uint16_t *before = pt_copy(dst, 50 * 30);
  cr_assert_eq(stage_commit(p, &g, 1), PULSE_ERR_UNSUPPORTED);
  cr_assert(strstr(pulse_error_detail(), "'w'") != NULL, "%s", pulse_error_detail());
  /* A halo of 2^10 around a row block, chunks of 2^12: the chunk passes
   * the span. */
  pulse_region r = block_of(&t, t.base, 20, 10, 0, 60, dst, 60);
  with_halo(&r, &t, t.base, 10);
  pulse_tensor_digest kept = r.digest;
  cr_assert_eq(stage_commit(p12, &r, 1), PULSE_ERR_UNSUPPORTED);
  cr_assert(strstr(pulse_error_detail(), "2^12") != NULL, "%s", pulse_error_detail());
  cr_assert(r.digest.a == kept.a && r.digest.b == kept.b, "a refused stage moved the digest");
  /* Block and halo are the whole tensor: a halo that is not the base's
   * (its digest made to match it) is caught by the patch's base digest. */
  pulse_region c = block_of(&t, t.base, 0, 50, 30, 30, dst, 30);
  with_halo(&c, &t, t.base, 12);
  c.halo[3] ^= 1;
  uint16_t *other = pt_copy(t.base, t.numel);
  other[3] ^= 1; /* position 3 is in the halo: column 3 of row 0 */
  cr_assert_eq(pulse_region_halo_take(&c, other, t.numel, 60), PULSE_OK);
  memcpy(before, dst, 50 * 30 * 2);
  cr_assert_eq(stage_commit(p, &c, 1), PULSE_ERR_BASE_DIGEST);
  cr_assert_eq(pt_first_diff(before, dst, 50 * 30), PT_NONE, "a refused base was written");
  free(before), free(dst), free(other), free(r.halo), free(c.halo);
  pulse_patch_free(p), pulse_patch_free(p12);
  pulse_buffer_free(&buf), pulse_buffer_free(&big);
  pt_tensor_free(&t);
}

/* Two regions of a plain patch; `spoil` breaks the call, which must then
 * write neither block. */
static void refused(void (*spoil)(pulse_region *g, const pt_tensor *ts), pulse_status want,
                    const char *label) {
  pt_tensor ts[2];
  make2(&ts[0], "a", 32, 32, 0.2, 4);
  make2(&ts[1], "b", 32, 32, 0.2, 5);
  pulse_buffer buf = {NULL, 0};
  pulse_patch *p = encode_open(ts, 2, PULSE_POS_PLAIN, 2, 10, &buf);
  uint16_t *mem = pt_alloc(2 * 16 * 32 * 2);
  pulse_region g[2] = {block_of(&ts[0], ts[0].base, 0, 16, 0, 32, mem, 32),
                       block_of(&ts[1], ts[1].base, 16, 16, 0, 32, mem + 16 * 32, 32)};
  spoil(g, ts);
  uint16_t *before = pt_copy(mem, 2 * 16 * 32);
  pulse_region_staged *s = NULL;
  pulse_status st = pulse_region_stage(p, g, 2, 2, &s);
  cr_assert_eq(st, want, "%s: %s, wanted %s (%s)", label, pulse_status_name(st),
               pulse_status_name(want), pulse_error_detail());
  cr_assert_null(s, "%s: staged changes after a failure", label);
  cr_assert_eq(pt_first_diff(before, mem, 2 * 16 * 32), PT_NONE, "%s: a block was written",
               label);
  free(before), free(mem);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, 2);
}

static void halo_missing(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].halo_log2 = 10; /* a row block of half a 1024-element chunk: a halo of 512 */
}
static void halo_alignment(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  static uint16_t room[1024];
  g[1].halo_log2 = 9;
  g[1].halo = room;
}
static void overlap(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].data = g[0].data + 5 * 32;
}
static void outside(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].row0 = 17; /* 17 + 16 rows > 32 */
}
static void columns_outside(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].col0 = UINT64_MAX - 3;
}
static void narrow_stride(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].stride = 31;
}
static void twice(pulse_region *g, const pt_tensor *ts) { g[1].name = ts[0].name; }
static void unknown(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].name = "model.layers.9.mlp.up_proj.weight";
}
static void unaligned(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].data = (uint16_t *)((uint8_t *)g[1].data + 1);
}
static void huge_span(pulse_region *g, const pt_tensor *ts) {
  (void)ts;
  g[1].stride = UINT64_MAX / 4;
}

Test(region, hostile_regions_are_refused_and_nothing_is_written) {
  refused(halo_missing, PULSE_ERR_ARG, "a halo without its bits");
  refused(halo_alignment, PULSE_ERR_ARG, "a halo aligned below 2^10");
  refused(overlap, PULSE_ERR_ARG, "overlapping blocks");
  refused(outside, PULSE_ERR_ARG, "rows outside the tensor");
  refused(columns_outside, PULSE_ERR_ARG, "columns past 2^64");
  refused(narrow_stride, PULSE_ERR_ARG, "stride below cols");
  refused(twice, PULSE_ERR_ARG, "a tensor twice");
  refused(unknown, PULSE_ERR_NOT_FOUND, "a name not in the table");
  refused(unaligned, PULSE_ERR_ARG, "unaligned data");
  refused(huge_span, PULSE_ERR_OVERFLOW, "a span past the address space");
}

Test(region, empty_calls_and_null_arguments) {
  pt_tensor t;
  make2(&t, "w", 8, 8, 0.5, 1);
  pulse_buffer buf = {NULL, 0};
  pulse_patch *p = encode_open(&t, 1, PULSE_POS_PLAIN, 2, 10, &buf);
  pulse_region_staged *s = NULL;
  cr_assert_eq(pulse_region_stage(p, NULL, 0, 1, &s), PULSE_OK);
  cr_assert_eq(pulse_region_staged_changes(s), 0);
  pulse_region_staged_commit(s);
  pulse_region_staged_free(s);
  cr_assert_eq(pulse_region_stage(NULL, NULL, 0, 1, &s), PULSE_ERR_ARG);
  cr_assert_eq(pulse_region_stage(p, NULL, 1, 1, &s), PULSE_ERR_ARG);
  cr_assert_eq(pulse_region_stage(p, NULL, 0, 1, NULL), PULSE_ERR_ARG);
  pulse_region_staged_free(NULL);
  uint64_t shape[3] = {4, 5, 6}, rows, cols;
  cr_assert_eq(pulse_region_view(shape, 3, &rows, &cols), PULSE_OK);
  cr_assert(rows == 4 && cols == 30);
  cr_assert_eq(pulse_region_view(shape, 0, &rows, &cols), PULSE_OK);
  cr_assert(rows == 1 && cols == 1);
  cr_assert_eq(pulse_region_view(shape, PULSE_MAX_DIMS + 1, &rows, &cols), PULSE_ERR_ARG);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensor_free(&t);
}
