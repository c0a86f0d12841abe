/* test_shard_anchor_parts.c - an anchor cut into parts of any size: the
 * header and every rank's bytes of a part, placed, are exactly that range
 * of the file every rank's pulse_pub_shard_anchor_write makes
 * (pulse_pub_shard_anchor_header, _read, pulse_pub_anchor_owned, _place). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_pub_shard.h"
#include "pulse_safetensors.h"
#include "shard_testutil.h"

#define AP_RANKS 4
#define AP_NT 4

static const char *ap_names[AP_NT] = {"attn.w", "embed", "mlp.w3", "norm"};
static const uint32_t ap_ndims[AP_NT] = {2, 1, 3, 1};
static const uint64_t ap_shapes[AP_NT][3] = {{37, 29}, {1000}, {6, 10, 7}, {5}};

static const sm_spec ap_spec = {AP_NT, ap_names, ap_ndims, ap_shapes, NULL, 0};

/* Moves a third of the weights far enough to change their BF16 values. */
static void ap_model_step(sm_model *m) {
  sm_model_step(m, 0.3, 0.1);
}

/* A block of tensor t from (s0, s1, s2), (e0, e1, e2) long (the tensor's
 * dimensions of them). */
static void ap_rect(sm_blocks *r, int t, uint64_t s0, uint64_t e0, uint64_t s1,
                    uint64_t e1, uint64_t s2, uint64_t e2) {
  uint64_t s[3] = {s0, s1, s2}, e[3] = {e0, e1, e2};
  sm_blocks_rect(r, &ap_spec, t, s, e);
}

typedef enum { AP_FLAT, AP_DIM0, AP_ROWPAR, AP_MIX } ap_tiling;

/* Dimension d of tensor t cut at the given points, piece i to rank i. */
static void ap_split(sm_blocks *rb, int t, uint32_t d, const uint64_t *cut,
                     int ranks) {
  for (int r = 0; r < ranks; r++) {
    uint64_t s[3] = {0, 0, 0}, e[3];
    for (uint32_t k = 0; k < 3; k++)
      e[k] = ap_shapes[t][k];
    s[d] = cut[r], e[d] = cut[r + 1] - cut[r];
    ap_rect(&rb[r], t, s[0], e[0], s[1], e[1], s[2], e[2]);
  }
}

static int ap_blocks_of(ap_tiling s, sm_blocks *rb) {
  memset(rb, 0, sizeof(sm_blocks) * AP_RANKS);
  if (s == AP_FLAT) { /* FSDP1: the table's elements in 4 uneven ranges */
    static const uint64_t cut[AP_RANKS + 1] = {0, 401, 1700, 2000, 2498};
    uint64_t at = 0;
    for (int t = 0; t < AP_NT; t++) {
      uint64_t n = 1;
      for (uint32_t k = 0; k < ap_ndims[t]; k++)
        n *= ap_shapes[t][k];
      for (int r = 0; r < AP_RANKS; r++) {
        uint64_t a = cut[r] > at ? cut[r] : at,
                 e = cut[r + 1] < at + n ? cut[r + 1] : at + n;
        if (a < e)
          sm_blocks_flat(&rb[r], &ap_spec, t, a - at, e - a);
      }
      at += n;
    }
    return AP_RANKS;
  }
  if (s == AP_DIM0) { /* FSDP2: dim-0 blocks, 3 ranks */
    static const uint64_t a[4] = {0, 13, 25, 37}, e[4] = {0, 333, 334, 1000},
                          c[4] = {0, 1, 4, 6}, n[4] = {0, 2, 3, 5};
    ap_split(rb, 0, 0, a, 3), ap_split(rb, 1, 0, e, 3);
    ap_split(rb, 2, 0, c, 3), ap_split(rb, 3, 0, n, 3);
    return 3;
  }
  if (s == AP_ROWPAR) { /* Megatron row-parallel: runs of a few elements */
    static const uint64_t c3[4] = {0, 3, 4, 7}, e[4] = {0, 500, 900, 1000},
                          n[4] = {0, 1, 2, 5};
    /* attn.w: rank 1 holds two column bands that interleave row by row */
    ap_rect(&rb[0], 0, 0, 37, 5, 10, 0, 0);
    ap_rect(&rb[1], 0, 0, 37, 0, 5, 0, 0);
    ap_rect(&rb[1], 0, 0, 37, 20, 9, 0, 0);
    ap_rect(&rb[2], 0, 0, 37, 15, 5, 0, 0);
    ap_split(rb, 1, 0, e, 3);
    ap_split(rb, 2, 2, c3, 3); /* 3-D: the last dimension, runs of 3, 1, 3 */
    ap_split(rb, 3, 0, n, 3);
    return 3;
  }
  /* A mix: a 2x2 grid, flat ranges listed out of file order, a 3-D
   * tensor's middle dimension, a whole tensor, an empty block. */
  for (int r = 0; r < AP_RANKS; r++) {
    uint64_t s0 = r / 2 ? 20 : 0, s1 = r % 2 ? 11 : 0;
    sm_blocks_flat(&rb[r], &ap_spec, 1, 250 * (uint64_t)r, 250);
    ap_rect(&rb[r], 0, s0, r / 2 ? 17 : 20, s1, r % 2 ? 18 : 11, 0, 0);
  }
  static const uint64_t c1[5] = {0, 2, 5, 9, 10};
  ap_split(rb, 2, 1, c1, AP_RANKS);
  ap_rect(&rb[3], 3, 0, 5, 0, 0, 0, 0); /* norm, whole, on rank 3 */
  sm_blocks_flat(&rb[2], &ap_spec, 3, 5, 0); /* nothing of norm */
  return AP_RANKS;
}

static void ap_detect(pulse_pub_shard **sh, const sm_blocks *rb, int ranks,
                      const sm_model *m, pulse_buffer *parts) {
  for (int r = 0; r < ranks; r++) {
    pulse_pub_tensor t[SM_MAX_BLOCKS];
    float *d[SM_MAX_BLOCKS];
    for (size_t b = 0; b < rb[r].n; b++) {
      d[b] = sm_block_data(m, &rb[r].b[b], NULL);
      t[b] = (pulse_pub_tensor){d[b], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    }
    cr_assert_eq(pulse_pub_shard_detect(sh[r], t, rb[r].n, &parts[r]), PULSE_OK,
                 "%s", pulse_error_detail());
    for (size_t b = 0; b < rb[r].n; b++)
      free(d[b]);
  }
}

/* The file every rank's anchor_write makes, and its size. */
static uint8_t *ap_written(pulse_pub_shard **sh, int ranks, const char *dir,
                           uint64_t step, const pulse_state_digest *d,
                           int pending, size_t *size) {
  char path[4096];
  snprintf(path, sizeof path, "%s/anchor-%llu-%d", dir,
           (unsigned long long)step, pending);
  for (int r = ranks; r-- > 0;)
    cr_assert_eq(pulse_pub_shard_anchor_write(sh[r], path, step, d, pending),
                 PULSE_OK, "%s", pulse_error_detail());
  return tu_read(path, size);
}

/* The BF16 values of the gathered weights (a single publisher's state). */
static void ap_cast(const sm_model *m, uint16_t **bf) {
  for (int t = 0; t < AP_NT; t++) {
    bf[t] = malloc(m->numel[t] * 2);
    pulse_bf16_cast_f32(m->w[t], bf[t], m->numel[t]);
  }
}

/* The anchor a single publisher writes of the state bf (independent of
 * the shards): what every rank's bytes must make. */
static uint8_t *ap_single(const sm_model *m, uint16_t **bf, const char *dir,
                          uint64_t step, const pulse_state_digest *d,
                          size_t *size) {
  pulse_st_write_tensor t[AP_NT];
  memset(t, 0, sizeof t);
  for (int i = 0; i < AP_NT; i++) {
    t[i].name = ap_names[i];
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = ap_ndims[i];
    memcpy(t[i].shape, m->info[i].shape, sizeof t[i].shape);
    t[i].data = bf[i];
  }
  char step_s[32], hex[65], path[4096];
  snprintf(step_s, sizeof step_s, "%llu", (unsigned long long)step);
  pulse_state_digest_hex(d, hex);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", hex}};
  snprintf(path, sizeof path, "%s/single.safetensors", dir);
  cr_assert_eq(pulse_st_write(path, t, AP_NT, meta, 2), PULSE_OK, "%s",
               pulse_error_detail());
  return tu_read(path, size);
}

/* Every part of size `part` of the file, rebuilt from the header and
 * every rank's bytes of it. */
static void ap_check_parts(pulse_pub_shard **sh, const sm_blocks *rb, int ranks,
                           const sm_model *m, const pulse_buffer *header,
                           const uint8_t *file, uint64_t file_size,
                           uint64_t part, uint64_t seed, int pending) {
  uint64_t hs = header->size;
  uint8_t *dst = malloc(part < file_size ? part : file_size);
  for (uint64_t off = 0, n = 0; off < file_size; off += n) {
    n = part;
    if (part == 0) /* random sizes, 1 to 3000 */
      n = 1 + (uint64_t)(sm_rnd(&seed) * 3000);
    if (n > file_size - off)
      n = file_size - off;
    if (part == 0)
      dst = realloc(dst, n);
    memset(dst, 0xA5, n);
    if (off < hs)
      memcpy(dst, header->data + off, (hs - off < n ? hs - off : n));
    uint64_t owned_sum = 0;
    for (int r = 0; r < ranks; r++) {
      pulse_buffer got = {0};
      cr_assert_eq(
          pulse_pub_shard_anchor_read(sh[r], pending, hs, off, n, &got),
          PULSE_OK, "%s", pulse_error_detail());
      uint64_t owned = 0;
      cr_assert_eq(pulse_pub_anchor_owned(m->info, AP_NT, rb[r].b, rb[r].n, hs,
                                          off, n, &owned),
                   PULSE_OK, "%s", pulse_error_detail());
      cr_assert_eq(owned, got.size,
                   "rank %d owns what it reads of [%llu, +%llu)", r,
                   (unsigned long long)off, (unsigned long long)n);
      cr_assert_eq(pulse_pub_anchor_place(m->info, AP_NT, rb[r].b, rb[r].n, hs,
                                          off, n, got.data, got.size, dst),
                   PULSE_OK, "%s", pulse_error_detail());
      owned_sum += owned;
      pulse_buffer_free(&got);
    }
    uint64_t in_header = off < hs ? (hs - off < n ? hs - off : n) : 0;
    cr_assert_eq(owned_sum, n - in_header,
                 "the ranks own the part's data bytes [%llu, +%llu)",
                 (unsigned long long)off, (unsigned long long)n);
    cr_assert(
        memcmp(dst, file + off, n) == 0,
        "part [%llu, +%llu) of %llu (parts of %llu, pending %d) is the file's",
        (unsigned long long)off, (unsigned long long)n,
        (unsigned long long)file_size, (unsigned long long)part, pending);
  }
  free(dst);
}

static void ap_run(ap_tiling s, uint64_t seed) {
  char *dir = tu_make_dir();
  sm_model m;
  sm_model_init(&m, &ap_spec, seed);
  sm_blocks rb[AP_RANKS];
  int ranks = ap_blocks_of(s, rb);
  const pulse_pub_block *bl[AP_RANKS];
  size_t nb[AP_RANKS];
  for (int r = 0; r < ranks; r++)
    bl[r] = rb[r].b, nb[r] = rb[r].n;
  cr_assert_eq(pulse_pub_blocks_check(m.info, AP_NT, bl, nb, (size_t)ranks),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_pub_shard *sh[AP_RANKS];
  for (int r = 0; r < ranks; r++) {
    pulse_pub_shard_opts o;
    pulse_pub_shard_opts_init(&o);
    o.tensors = m.info, o.tensor_count = AP_NT;
    o.blocks = rb[r].b, o.block_count = rb[r].n;
    o.chunk_log2 = 10;
    cr_assert_eq(pulse_pub_shard_create(&o, &sh[r]), PULSE_OK, "%s",
                 pulse_error_detail());
  }
  pulse_buffer parts[AP_RANKS];
  uint16_t *before[AP_NT], *now[AP_NT];
  ap_cast(&m, before);
  for (int step = 0; step < 2; step++) {
    if (step > 0)
      ap_model_step(&m);
    ap_cast(&m, now);
    ap_detect(sh, rb, ranks, &m, parts);
    pulse_state_digest d;
    cr_assert_eq(pulse_pub_shard_state_digest(m.info, AP_NT, 10, parts,
                                              (size_t)ranks, step > 0, &d),
                 PULSE_OK, "%s", pulse_error_detail());
    /* step 0: the snapshot; step 1: the pending step's values, and the
     * snapshot (still step 0's) beside them */
    for (int pending = step > 0; pending >= 0; pending--) {
      size_t size = 0;
      uint8_t *file =
          ap_written(sh, ranks, dir, (uint64_t)step, &d, pending, &size);
      size_t want_n = 0;
      uint8_t *want = ap_single(&m, pending ? now : before, dir, (uint64_t)step,
                                &d, &want_n);
      cr_assert(
          want_n == size && memcmp(want, file, size) == 0,
          "step %d, pending %d: the ranks' anchor is the single publisher's",
          step, pending);
      free(want);
      for (int r = 0; r < ranks; r++) {
        pulse_buffer header = {0};
        uint64_t file_size = 0;
        cr_assert_eq(pulse_pub_shard_anchor_header(sh[r], (uint64_t)step, &d,
                                                   &header, &file_size),
                     PULSE_OK, "%s", pulse_error_detail());
        cr_assert_eq(file_size, size, "rank %d: the file's size", r);
        cr_assert(header.size > 8 &&
                      memcmp(header.data, file, header.size) == 0,
                  "rank %d: the header is the file's first bytes", r);
        if (r == ranks - 1) {
          const uint64_t sizes[] = {1, 7, 4096, 0 /* random */, file_size + 5};
          for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
            ap_check_parts(sh, rb, ranks, &m, &header, file, file_size,
                           sizes[k], seed + k, pending);
        }
        pulse_buffer_free(&header);
      }
      free(file);
      if (step == 0)
        break;
    }
    for (int r = 0; r < ranks; r++) {
      pulse_pub_shard_advance(sh[r]);
      pulse_buffer_free(&parts[r]);
    }
    for (int t = 0; t < AP_NT; t++)
      free(before[t]), before[t] = now[t];
  }
  for (int t = 0; t < AP_NT; t++)
    free(before[t]);
  for (int r = 0; r < ranks; r++)
    pulse_pub_shard_free(sh[r]);
  sm_model_free(&m);
  tu_rm_rf(dir);
}

Test(shard_anchor_parts, flat_ranges_rebuild_every_part_of_the_anchor) {
  ap_run(AP_FLAT, 11);
}
Test(shard_anchor_parts, dim0_blocks_rebuild_every_part_of_the_anchor) {
  ap_run(AP_DIM0, 12);
}
Test(shard_anchor_parts,
     row_parallel_and_3d_blocks_rebuild_every_part_of_the_anchor) {
  ap_run(AP_ROWPAR, 13);
}
Test(shard_anchor_parts,
     a_mix_with_a_whole_tensor_and_an_empty_block_rebuilds_every_part) {
  ap_run(AP_MIX, 14);
}

Test(shard_anchor_parts,
     bad_ranges_sizes_and_nulls_are_refused_and_nothing_is_placed) {
  sm_model m;
  sm_model_init(&m, &ap_spec, 15);
  sm_blocks rb[AP_RANKS];
  ap_blocks_of(AP_DIM0, rb);
  pulse_pub_shard_opts o;
  pulse_pub_shard_opts_init(&o);
  o.tensors = m.info, o.tensor_count = AP_NT;
  o.blocks = rb[1].b, o.block_count = rb[1].n;
  pulse_pub_shard *sh = NULL;
  cr_assert_eq(pulse_pub_shard_create(&o, &sh), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_state_digest d;
  memset(&d, 7, sizeof d);
  pulse_buffer header = {0}, got = {0};
  uint64_t file_size = 0;
  /* the header needs no snapshot; reading does */
  cr_assert_eq(pulse_pub_shard_anchor_header(sh, 3, &d, &header, &file_size),
               PULSE_OK);
  uint64_t hs = header.size;
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, 0, 10, &got),
               PULSE_ERR_ARG);
  pulse_buffer part = {0};
  ap_detect(&sh, &rb[1], 1, &m, &part);
  pulse_buffer_free(&part);
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 1, hs, 0, 10, &got),
               PULSE_ERR_ARG, "nothing is pending after the first detect");
  /* ranges past the file's end, and one whose end overflows */
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, file_size, 1, &got),
               PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "past the end") != NULL, "%s",
            pulse_error_detail());
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, 5, UINT64_MAX, &got),
               PULSE_ERR_ARG);
  uint64_t owned = 0;
  cr_assert_eq(pulse_pub_anchor_owned(m.info, AP_NT, rb[1].b, rb[1].n, hs,
                                      file_size - 3, 4, &owned),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_anchor_owned(m.info, AP_NT, rb[1].b, rb[1].n,
                                      UINT64_MAX, 0, 1, &owned),
               PULSE_ERR_OVERFLOW);
  /* the whole file's last byte is fine; an empty range at the end too */
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, file_size - 1, 1, &got),
               PULSE_OK);
  pulse_buffer_free(&got);
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, file_size, 0, &got),
               PULSE_OK);
  cr_assert_eq(got.size, 0);
  pulse_buffer_free(&got);
  /* NULLs */
  cr_assert_eq(pulse_pub_shard_anchor_header(NULL, 3, &d, &header, &file_size),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_shard_anchor_header(sh, 3, NULL, &header, &file_size),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_shard_anchor_header(sh, 3, &d, NULL, &file_size),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_shard_anchor_header(sh, 3, &d, &header, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_shard_anchor_read(NULL, 0, hs, 0, 1, &got),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, 0, 1, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_pub_anchor_owned(NULL, AP_NT, rb[1].b, rb[1].n, hs, 0, 1, &owned),
      PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_anchor_owned(m.info, AP_NT, NULL, 2, hs, 0, 1, &owned),
               PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_pub_anchor_owned(m.info, AP_NT, rb[1].b, rb[1].n, hs, 0, 1, NULL),
      PULSE_ERR_ARG);
  /* a part of rank 1's bytes: the wrong count places nothing */
  uint64_t off = hs + 100, len = 2000;
  cr_assert_eq(pulse_pub_shard_anchor_read(sh, 0, hs, off, len, &got),
               PULSE_OK);
  cr_assert_eq(pulse_pub_anchor_owned(m.info, AP_NT, rb[1].b, rb[1].n, hs, off,
                                      len, &owned),
               PULSE_OK);
  cr_assert(owned == got.size && owned > 0 && owned < len);
  uint8_t *dst = malloc(len), *same = malloc(len);
  memset(dst, 0x5A, len), memset(same, 0x5A, len);
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, rb[1].b, rb[1].n, hs, off,
                                      len, got.data, got.size - 1, dst),
               PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "own") != NULL, "%s",
            pulse_error_detail());
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, rb[2].b, rb[2].n, hs, off,
                                      len, got.data, got.size, dst),
               PULSE_ERR_ARG, "another rank's blocks own another count");
  cr_assert_eq(memcmp(dst, same, len), 0, "nothing was placed");
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, rb[1].b, rb[1].n, hs, off,
                                      len, NULL, got.size, dst),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, rb[1].b, rb[1].n, hs, off,
                                      len, got.data, got.size, NULL),
               PULSE_ERR_ARG);
  /* blocks of a name not in the table, or outside their tensor */
  pulse_pub_block bad = rb[1].b[0];
  bad.name = "nope";
  cr_assert_eq(
      pulse_pub_anchor_owned(m.info, AP_NT, &bad, 1, hs, off, len, &owned),
      PULSE_ERR_NOT_FOUND);
  bad = rb[1].b[0], bad.extent[0] += 100;
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, &bad, 1, hs, off, len,
                                      got.data, got.size, dst),
               PULSE_ERR_ARG);
  cr_assert_eq(memcmp(dst, same, len), 0, "nothing was placed");
  cr_assert_eq(pulse_pub_anchor_place(m.info, AP_NT, rb[1].b, rb[1].n, hs, off,
                                      len, got.data, got.size, dst),
               PULSE_OK);
  cr_assert_neq(memcmp(dst, same, len), 0);
  free(dst), free(same);
  pulse_buffer_free(&got), pulse_buffer_free(&header);
  pulse_pub_shard_free(sh);
  sm_model_free(&m);
}

/* Blocks of many changes (beyond the marks a reader seeks by): every part
 * of the pending step's anchor, from parts that start deep inside them. */
Test(shard_anchor_parts,
     parts_deep_inside_blocks_of_many_changes_are_the_pending_steps_bytes) {
  enum { BIG = 100000, SMALL = 300 };
  pulse_tensor_info info[2];
  memset(info, 0, sizeof info);
  info[0].name = "big", info[0].dtype = PULSE_DTYPE_BF16, info[0].ndim = 1;
  info[0].shape[0] = BIG;
  info[1].name = "small", info[1].dtype = PULSE_DTYPE_BF16, info[1].ndim = 1;
  info[1].shape[0] = SMALL;
  pulse_pub_block rb[2][2];
  memset(rb, 0, sizeof rb);
  rb[0][0] = (pulse_pub_block){"big", PULSE_PUB_BLOCK_FLAT, {0}, {61111}};
  rb[0][1] = (pulse_pub_block){"small", PULSE_PUB_BLOCK_FLAT, {0}, {SMALL}};
  rb[1][0] =
      (pulse_pub_block){"big", PULSE_PUB_BLOCK_FLAT, {61111}, {BIG - 61111}};
  uint16_t *bf[2][2];
  for (int v = 0; v < 2; v++) {
    bf[v][0] = malloc(BIG * 2), bf[v][1] = malloc(SMALL * 2);
    for (uint64_t i = 0; i < BIG; i++) /* 9 elements in 10 change */
      bf[v][0][i] =
          (uint16_t)(0x3c00 + (i % 97) + (v && i % 10 ? 1 + i % 5 : 0));
    for (uint64_t i = 0; i < SMALL; i++)
      bf[v][1][i] = (uint16_t)(0x4000 + i + v);
  }
  pulse_pub_shard *sh[2];
  for (int r = 0; r < 2; r++) {
    pulse_pub_shard_opts o;
    pulse_pub_shard_opts_init(&o);
    o.tensors = info, o.tensor_count = 2;
    o.blocks = rb[r], o.block_count = r == 0 ? 2 : 1;
    cr_assert_eq(pulse_pub_shard_create(&o, &sh[r]), PULSE_OK, "%s",
                 pulse_error_detail());
    for (int v = 0; v < 2; v++) {
      pulse_pub_tensor t[2] = {
          {bf[v][0] + rb[r][0].start[0], PULSE_DTYPE_BF16, PULSE_PUB_HOST},
          {bf[v][1], PULSE_DTYPE_BF16, PULSE_PUB_HOST}};
      pulse_buffer part = {0};
      cr_assert_eq(pulse_pub_shard_detect(sh[r], t, r == 0 ? 2 : 1, &part),
                   PULSE_OK, "%s", pulse_error_detail());
      pulse_buffer_free(&part);
    }
  }
  pulse_state_digest d;
  memset(&d, 3, sizeof d);
  pulse_st_write_tensor w[2];
  memset(w, 0, sizeof w);
  for (int i = 0; i < 2; i++) {
    w[i].name = info[i].name, w[i].dtype = PULSE_DTYPE_BF16, w[i].ndim = 1;
    w[i].shape[0] = info[i].shape[0], w[i].data = bf[1][i];
  }
  char *dir = tu_make_dir(), path[4096], hex[65];
  snprintf(path, sizeof path, "%s/want.safetensors", dir);
  pulse_state_digest_hex(&d, hex);
  pulse_st_kv meta[2] = {{"step", "9"}, {"state_digest", hex}};
  cr_assert_eq(pulse_st_write(path, w, 2, meta, 2), PULSE_OK);
  size_t size = 0;
  uint8_t *want = tu_read(path, &size);
  pulse_buffer header = {0};
  uint64_t file_size = 0;
  cr_assert_eq(pulse_pub_shard_anchor_header(sh[1], 9, &d, &header, &file_size),
               PULSE_OK);
  cr_assert_eq(file_size, size);
  const uint64_t parts[] = {4096, 333, 77777};
  for (size_t k = 0; k < 3; k++) {
    uint8_t *dst = malloc(parts[k]);
    for (uint64_t off = 0, n; off < file_size; off += n) {
      n = file_size - off < parts[k] ? file_size - off : parts[k];
      memset(dst, 0, n);
      if (off < header.size)
        memcpy(dst, header.data + off,
               header.size - off < n ? header.size - off : n);
      for (int r = 0; r < 2; r++) {
        pulse_buffer got = {0};
        cr_assert_eq(
            pulse_pub_shard_anchor_read(sh[r], 1, header.size, off, n, &got),
            PULSE_OK);
        cr_assert_eq(pulse_pub_anchor_place(info, 2, rb[r], r == 0 ? 2 : 1,
                                            header.size, off, n, got.data,
                                            got.size, dst),
                     PULSE_OK, "%s", pulse_error_detail());
        pulse_buffer_free(&got);
      }
      cr_assert(memcmp(dst, want + off, n) == 0,
                "part [%llu, +%llu) is the pending step's",
                (unsigned long long)off, (unsigned long long)n);
    }
    free(dst);
  }
  /* Ranges of rank 0 that start at, just before and just after the
   * changes that come before a mark (change 4096 j - 1, at element
   * k / 9 * 10 + 1 + k % 9: 9 elements in 10 change), on either byte. */
  for (uint64_t j = 1; j <= 9; j++) {
    uint64_t k = 4096 * j - 1, idx = k / 9 * 10 + 1 + k % 9;
    for (uint64_t at = 2 * idx - 2; at < 2 * idx + 4; at++) {
      uint64_t off = header.size + at;
      pulse_buffer got = {0};
      cr_assert_eq(
          pulse_pub_shard_anchor_read(sh[0], 1, header.size, off, 5, &got),
          PULSE_OK);
      cr_assert(got.size == 5 && memcmp(got.data, want + off, 5) == 0,
                "element %llu, byte %llu", (unsigned long long)idx,
                (unsigned long long)at);
      pulse_buffer_free(&got);
    }
  }
  for (int r = 0; r < 2; r++)
    pulse_pub_shard_free(sh[r]);
  for (int v = 0; v < 2; v++)
    free(bf[v][0]), free(bf[v][1]);
  free(want), pulse_buffer_free(&header);
  tu_rm_rf(dir);
}
