/* Sharded publish (pulse_pub_shard.h): 4 ranks, each holding only its
 * blocks, make the very bytes of the patch a single publisher of the
 * gathered FP32 weights writes, step after step, for every sharding (flat
 * ranges, dim-0 blocks, rectangular column/row blocks, tensor sets, a mix);
 * the tiling is checked (overlaps, gaps, blocks outside their tensor,
 * unknown names refused with the tensor named); a failed step is retried. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_pub_shard.h"
#include "pulse_safetensors.h"
#include "shard_impl.h"
#include "shard_testutil.h"
#include "trainer_testutil.h"

#define RANKS 4
#define NT 4
#define LOG2 10u /* 1024-element chunks: blocks straddle chunks */

static const char *names[NT] = {"attn.w", "embed", "mlp.w3", "norm"};
static const uint32_t ndims[NT] = {2, 1, 3, 1};
static const uint64_t shapes[NT][3] = {{96, 40}, {5000}, {24, 30, 7}, {64}};

/* The norm's weights start wider than the others'. */
static const double spreads[NT] = {0.08, 0.08, 0.08, 2.0};
static const sm_spec spec = {NT, names, ndims, shapes, spreads, 1};

static void model_init(sm_model *m, uint64_t seed) {
  sm_model_init(m, &spec, seed);
}

/* An Adam-like step: most weights move by about lr, which changes some
 * BF16 values and moves a few across exponent classes. */
static void model_step(sm_model *m) {
  sm_model_step(m, 0.3, 2e-3);
}

/* The single publisher's patch of the step, from the gathered weights. */
static pulse_buffer single_patch(sm_model *m, uint64_t step) {
  return sm_single_patch(m, step, LOG2);
}

/* Dimension d of tensor t split into RANKS parts (uneven), rank r's. */
static void split_dim(sm_blocks *r, int rank, int t, uint32_t d) {
  uint64_t start[3] = {0}, ext[3];
  for (uint32_t k = 0; k < ndims[t]; k++)
    ext[k] = shapes[t][k];
  uint64_t n = shapes[t][d], lo = n * (uint64_t)rank / RANKS, hi = n * (uint64_t)(rank + 1) / RANKS;
  start[d] = lo, ext[d] = hi - lo;
  if (hi > lo)
    sm_blocks_rect(r, &spec, t, start, ext);
}

typedef enum { FLAT, DIM0, RECT, SETS, MIX } sharding;

static void blocks_of(sharding s, const sm_model *m, sm_blocks *rb) {
  memset(rb, 0, sizeof(sm_blocks) * RANKS);
  if (s == FLAT) { /* FSDP1: the concatenation of every tensor, in 4 ranges */
    uint64_t total = 0;
    for (int t = 0; t < NT; t++)
      total += m->numel[t];
    for (int r = 0; r < RANKS; r++) {
      uint64_t lo = total * r / RANKS + 37 * (r > 0), hi = r + 1 < RANKS ? total * (r + 1) / RANKS + 37 : total;
      uint64_t at = 0;
      for (int t = 0; t < NT; t++) {
        uint64_t a = lo > at ? lo : at, e = hi < at + m->numel[t] ? hi : at + m->numel[t];
        if (a < e)
          sm_blocks_flat(&rb[r], &spec, t, a - at, e - a);
        at += m->numel[t];
      }
    }
  }
  for (int r = 0; r < RANKS && s == DIM0; r++)
    for (int t = 0; t < NT; t++)
      split_dim(&rb[r], r, t, 0);
  for (int r = 0; r < RANKS && s == RECT; r++) {
    /* attn.w: a 2x2 grid; embed: column-parallel (dim 0); mlp.w3:
     * row-parallel (dim 1); norm: replicated on no one but rank 0 */
    uint64_t st[2] = {(uint64_t)(r / 2) * 48, (uint64_t)(r % 2) * 17};
    uint64_t ex[2] = {48, r % 2 ? 23 : 17};
    sm_blocks_rect(&rb[r], &spec, 0, st, ex);
    split_dim(&rb[r], r, 1, 0);
    split_dim(&rb[r], r, 2, 1);
    if (r == 0) {
      uint64_t z[1] = {0}, n[1] = {64};
      sm_blocks_rect(&rb[r], &spec, 3, z, n);
    }
  }
  for (int t = 0; t < NT && s == SETS; t++) { /* pipeline stages */
    uint64_t z[3] = {0}, e[3];
    for (uint32_t k = 0; k < ndims[t]; k++)
      e[k] = shapes[t][k];
    sm_blocks_rect(&rb[(t + 1) % RANKS], &spec, t, z, e);
  }
  if (s == MIX) {
    for (int r = 0; r < RANKS; r++) {
      uint64_t st[2] = {(uint64_t)(r / 2) * 50, (uint64_t)(r % 2) * 20};
      uint64_t ex[2] = {r / 2 ? 46 : 50, 20};
      sm_blocks_rect(&rb[r], &spec, 0, st, ex);
      sm_blocks_flat(&rb[r], &spec, 1, 1250 * (uint64_t)r + 3 * (r > 0),
                     r == 3 ? 1250 - 3 : 1250 + 3 * (r < 3) - 3 * (r > 0));
      split_dim(&rb[r], r, 3, 0);
    }
    uint64_t z[3] = {0}, e[3] = {24, 30, 7};
    sm_blocks_rect(&rb[2], &spec, 2, z, e);
  }
}

/* Every rank's shard of the blocks rb of m's table. */
static void shards_make(const sm_model *m, const sm_blocks *rb,
                        pulse_pub_shard **sh) {
  for (int r = 0; r < RANKS; r++) {
    pulse_pub_shard_opts o;
    pulse_pub_shard_opts_init(&o);
    o.tensors = m->info, o.tensor_count = NT;
    o.blocks = rb[r].b, o.block_count = rb[r].n;
    o.chunk_log2 = LOG2;
    cr_assert_eq(pulse_pub_shard_create(&o, &sh[r]), PULSE_OK, "%s", pulse_error_detail());
  }
}

static void detect_all(pulse_pub_shard **sh, const sm_blocks *rb,
                       const sm_model *m, pulse_buffer *parts) {
  for (int r = 0; r < RANKS; r++) {
    pulse_pub_tensor t[3 * NT];
    float *d[3 * NT];
    for (size_t b = 0; b < rb[r].n; b++) {
      uint64_t n;
      d[b] = sm_block_data(m, &rb[r].b[b], &n);
      t[b] = (pulse_pub_tensor){d[b], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    }
    cr_assert_eq(pulse_pub_shard_detect(sh[r], t, rb[r].n, &parts[r]), PULSE_OK, "%s",
                 pulse_error_detail());
    for (size_t b = 0; b < rb[r].n; b++)
      free(d[b]);
  }
}

/* A model of `seed` tiled by `s` over the ranks, its snapshot taken (step
 * 0), then one step: the ranks' parts of step 1. */
static void second_step_parts(sm_model *m, unsigned seed, sharding s,
                              sm_blocks *rb, pulse_pub_shard **sh,
                              pulse_buffer *parts) {
  model_init(m, seed);
  blocks_of(s, m, rb);
  shards_make(m, rb, sh);
  detect_all(sh, rb, m, parts);
  for (int r = 0; r < RANKS; r++)
    pulse_buffer_free(&parts[r]);
  model_step(m);
  detect_all(sh, rb, m, parts);
}

static void run_sharding(sharding s, uint64_t seed) {
  sm_model m;
  model_init(&m, seed);
  sm_blocks rb[RANKS];
  blocks_of(s, &m, rb);
  const pulse_pub_block *bl[RANKS];
  size_t bc[RANKS];
  for (int r = 0; r < RANKS; r++)
    bl[r] = rb[r].b, bc[r] = rb[r].n;
  cr_assert_eq(pulse_pub_blocks_check(m.info, NT, bl, bc, RANKS), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_shard *sh[RANKS];
  shards_make(&m, rb, sh);
  pulse_buffer parts[RANKS], counts[RANKS];
  detect_all(sh, rb, &m, parts); /* step 0: the snapshot */
  for (int r = 0; r < RANKS; r++)
    pulse_buffer_free(&parts[r]);
  uint64_t total_changes = 0, part_bytes = 0;
  for (uint64_t step = 1; step <= 5; step++) {
    model_step(&m);
    pulse_state_digest want_base;
    pulse_tensor_digest d[NT];
    for (int t = 0; t < NT; t++)
      d[t] = pulse_digest_bf16(m.snap[t], m.numel[t]);
    pulse_tensor_info bf[NT];
    memcpy(bf, m.info, sizeof bf);
    for (int t = 0; t < NT; t++)
      bf[t].dtype = PULSE_DTYPE_BF16;
    cr_assert_eq(pulse_state_digest_compute(bf, d, NT, &want_base), PULSE_OK);
    pulse_buffer want = single_patch(&m, step);
    detect_all(sh, rb, &m, parts);
    for (int r = 0; r < RANKS; r++)
      part_bytes += parts[r].size;
    /* Each rank counts from its own part and the others' cut for it (what
     * a rank other than the encoding one receives): the same counts. */
    for (int r = 0; r < RANKS; r++) {
      pulse_buffer cut[RANKS];
      for (int q = 0; q < RANKS; q++) {
        if (q == r) {
          cut[q] = parts[q];
          continue;
        }
        cr_assert_eq(pulse_pub_shard_part_for(sh[q], &parts[q], rb[r].b, rb[r].n, &cut[q]),
                     PULSE_OK, "%s", pulse_error_detail());
        cr_assert_leq(cut[q].size, parts[q].size);
      }
      cr_assert_eq(pulse_pub_shard_count(sh[r], cut, RANKS, &counts[r]), PULSE_OK, "%s",
                   pulse_error_detail());
      pulse_buffer whole = {0};
      cr_assert_eq(pulse_pub_shard_count(sh[r], parts, RANKS, &whole), PULSE_OK);
      cr_assert(whole.size == counts[r].size &&
                    memcmp(whole.data, counts[r].data, whole.size) == 0,
                "rank %d step %llu: the counts from cut parts are those from whole ones", r,
                (unsigned long long)step);
      pulse_buffer_free(&whole);
      for (int q = 0; q < RANKS; q++)
        if (q != r)
          pulse_buffer_free(&cut[q]);
    }
    pulse_encode_opts eo;
    pulse_encode_opts_init(&eo);
    eo.step = step, eo.base_step = step - 1, eo.chunk_log2 = LOG2, eo.threads = 1;
    pulse_buffer got = {0};
    pulse_state_digest base;
    /* counts in another order than the parts: they add up */
    pulse_buffer rev[RANKS];
    for (int r = 0; r < RANKS; r++)
      rev[r] = counts[RANKS - 1 - r];
    cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, rev, RANKS, &base, &got),
                 PULSE_OK, "%s", pulse_error_detail());
    cr_assert_eq(memcmp(base.bytes, want_base.bytes, 32), 0, "base state digest, step %llu",
                 (unsigned long long)step);
    cr_assert_eq(got.size, want.size, "sharding %d step %llu: %zu bytes, single %zu", (int)s,
                 (unsigned long long)step, got.size, want.size);
    cr_assert_eq(memcmp(got.data, want.data, got.size), 0,
                 "sharding %d step %llu: the bytes of the single publish", (int)s,
                 (unsigned long long)step);
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(got.data, got.size, &p), PULSE_OK);
    total_changes += pulse_patch_total_changed(p);
    pulse_patch_free(p);
    for (int r = 0; r < RANKS; r++) {
      pulse_pub_shard_advance(sh[r]);
      pulse_buffer_free(&parts[r]);
      pulse_buffer_free(&counts[r]);
    }
    pulse_buffer_free(&got);
    pulse_buffer_free(&want);
  }
  cr_assert_gt(total_changes, 1000, "the steps changed something: %llu",
               (unsigned long long)total_changes);
  /* Parts carry the changes of chunks that several ranks meet; a rank
   * codes the chunks its blocks cover, whose changes never leave it. */
  /* (a change in a whole part takes 3 bytes or more) */
  uint64_t headers = 5 * RANKS * 64, change_bytes = 3 * total_changes;
  for (int r = 0; r < RANKS; r++)
    headers += 5 * 200 * rb[r].n;
  if (s == SETS) /* every chunk is one rank's */
    cr_assert_eq(part_bytes, headers, "parts: %llu bytes", (unsigned long long)part_bytes);
  if (s == FLAT || s == DIM0) /* 1024-element chunks: most straddle blocks here */
    cr_assert_lt(part_bytes - headers, change_bytes, "parts carry %llu of %llu change bytes",
                 (unsigned long long)(part_bytes - headers), (unsigned long long)change_bytes);
  /* Each rank's snapshot is the published BF16 of its blocks. */
  for (int r = 0; r < RANKS; r++) {
    for (size_t b = 0; b < rb[r].n; b++) {
      uint64_t n;
      float *d = sm_block_data(&m, &rb[r].b[b], &n);
      uint16_t *bits = malloc(n * 2 + 2);
      pulse_bf16_cast_f32(d, bits, n);
      cr_assert_eq(memcmp(bits, pulse_pub_shard_snapshot(sh[r], b), n * 2), 0);
      free(d), free(bits);
    }
    pulse_pub_shard_free(sh[r]);
  }
  sm_model_free(&m);
}

Test(shard, flat_ranges_make_the_single_publishers_bytes) { run_sharding(FLAT, 1); }
Test(shard, dim0_blocks_make_the_single_publishers_bytes) { run_sharding(DIM0, 2); }
Test(shard, rectangular_blocks_make_the_single_publishers_bytes) { run_sharding(RECT, 3); }
Test(shard, tensor_sets_make_the_single_publishers_bytes) { run_sharding(SETS, 4); }
Test(shard, a_mix_makes_the_single_publishers_bytes) { run_sharding(MIX, 5); }

static pulse_status check_dim0_with(void (*edit)(sm_blocks *)) {
  sm_model m;
  model_init(&m, 9);
  sm_blocks rb[RANKS];
  blocks_of(DIM0, &m, rb);
  edit(rb);
  const pulse_pub_block *bl[RANKS];
  size_t bc[RANKS];
  for (int r = 0; r < RANKS; r++)
    bl[r] = rb[r].b, bc[r] = rb[r].n;
  pulse_status st = pulse_pub_blocks_check(m.info, NT, bl, bc, RANKS);
  sm_model_free(&m);
  return st;
}

static void overlap(sm_blocks *rb) {
  rb[1].b[2].start[0] -= 1, rb[1].b[2].extent[0] += 1;
}
static void gap(sm_blocks *rb) {
  rb[3].b[0].extent[0] -= 1;
}
static void outside(sm_blocks *rb) {
  rb[3].b[1].extent[0] += 1;
}
static void unknown(sm_blocks *rb) {
  rb[2].b[3].name = "mlp.w4";
}
static void other_shape(sm_blocks *rb) {
  rb[0].b[2].extent[1] = 31;
}

Test(shard, overlapping_missing_and_inconsistent_blocks_are_refused_naming_the_tensor) {
  cr_assert_eq(check_dim0_with(overlap), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "'mlp.w3'") && strstr(pulse_error_detail(), "overlap"),
            "%s", pulse_error_detail());
  cr_assert_eq(check_dim0_with(gap), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "'attn.w'") &&
                strstr(pulse_error_detail(), "in no rank's block"),
            "%s", pulse_error_detail());
  cr_assert_eq(check_dim0_with(outside), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "'embed'") && strstr(pulse_error_detail(), "outside"),
            "%s", pulse_error_detail());
  cr_assert_eq(check_dim0_with(unknown), PULSE_ERR_NOT_FOUND);
  cr_assert(strstr(pulse_error_detail(), "'mlp.w4'"), "%s", pulse_error_detail());
  cr_assert_eq(check_dim0_with(other_shape), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "'mlp.w3'"), "%s", pulse_error_detail());
}

Test(shard, a_part_of_another_table_is_refused_and_a_failed_step_is_retried) {
  sm_model m;
  sm_blocks rb[RANKS];
  pulse_pub_shard *sh[RANKS];
  pulse_buffer parts[RANKS], again[RANKS], counts[RANKS];
  second_step_parts(&m, 11, SETS, rb, sh, parts);
  /* The step fails somewhere: every rank aborts, then retries it. */
  for (int r = 0; r < RANKS; r++)
    pulse_pub_shard_abort(sh[r]);
  detect_all(sh, rb, &m, again);
  for (int r = 0; r < RANKS; r++)
    cr_assert(parts[r].size == again[r].size &&
                  memcmp(parts[r].data, again[r].data, parts[r].size) == 0,
              "rank %d: the retried part is the first one", r);
  for (int r = 0; r < RANKS; r++)
    cr_assert_eq(pulse_pub_shard_count(sh[r], again, RANKS, &counts[r]), PULSE_OK);
  /* A rank that describes another table: its part is refused. */
  pulse_tensor_info other[NT];
  memcpy(other, m.info, sizeof other);
  other[2].shape[2] = 8;
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.chunk_log2 = LOG2;
  pulse_buffer out = {0};
  cr_assert_eq(pulse_pub_shard_encode(other, NT, &eo, again, RANKS, counts, RANKS, NULL, &out),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "another table"), "%s", pulse_error_detail());
  /* Counts of a part set that is not these parts: refused. */
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, again, RANKS - 1, counts, RANKS, NULL,
                                      &out),
               PULSE_ERR_ARG); /* tensors without their blocks */
  /* Hostile counts: cut short, they are refused; any byte changed, they
   * are refused or read within their bounds (an ASan build checks the
   * reads). */
  for (size_t cut = 0; cut < counts[1].size; cut += 7) {
    pulse_buffer c = {counts[1].data, cut};
    pulse_buffer set[RANKS] = {counts[0], c, counts[2], counts[3]};
    cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, again, RANKS, set, RANKS, NULL, &out),
                 PULSE_ERR_CORRUPT, "counts cut to %zu bytes", cut);
  }
  for (size_t at = 0; at < counts[1].size; at++) {
    uint8_t *b = counts[1].data;
    b[at] ^= 0xA5;
    pulse_status got = pulse_pub_shard_encode(m.info, NT, &eo, again, RANKS, counts, RANKS,
                                              NULL, &out);
    b[at] ^= 0xA5;
    /* class counts that cannot be the chunk's: the patch coder refuses them */
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT || got == PULSE_ERR_ARG,
              "byte %zu: %s: %s", at, pulse_status_name(got), pulse_error_detail());
    pulse_buffer_free(&out);
  }
  /* Every chunk here is one rank's: its stream comes in its counts. The
   * same counts twice name their chunks twice: refused. */
  pulse_buffer twice[RANKS + 1] = {counts[0], counts[1], counts[2], counts[3], counts[1]};
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, again, RANKS, twice, RANKS + 1, NULL,
                                      &out),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "coded twice"), "%s", pulse_error_detail());
  /* Streams coded with another position model than the encoder's. */
  eo.pos_model = PULSE_POS_PLAIN;
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, again, RANKS, counts, RANKS, NULL, &out),
               PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "position model"), "%s", pulse_error_detail());
  eo.pos_model = PULSE_POS_CLASS;
  /* Counts of another step (the parts of a step detected again from the
   * same snapshot, with more changes): refused. */
  model_step(&m);
  for (int r = 0; r < RANKS; r++)
    pulse_buffer_free(&parts[r]);
  detect_all(sh, rb, &m, parts);
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS, NULL, &out),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "not of these parts"), "%s", pulse_error_detail());
  /* A truncated part. */
  again[1].size -= 1;
  cr_assert_eq(pulse_pub_shard_count(sh[0], again, RANKS, &out), PULSE_ERR_CORRUPT);
  again[1].size += 1;
  for (int r = 0; r < RANKS; r++) {
    pulse_buffer_free(&parts[r]), pulse_buffer_free(&again[r]), pulse_buffer_free(&counts[r]);
    pulse_pub_shard_free(sh[r]);
  }
  sm_model_free(&m);
}

/* Counts of column and row blocks carry entries and class counts of shared
 * chunks, which the encoder sums chunk by chunk as it codes: counts cut
 * short are refused, any byte changed is refused or read within bounds (an
 * ASan build checks the reads), and a rank's counts left out (ranks that do
 * not add up) or given twice are refused. */
Test(shard, hostile_counts_of_shared_chunks_are_refused_or_read_within_bounds) {
  sm_model m;
  sm_blocks rb[RANKS];
  pulse_pub_shard *sh[RANKS];
  pulse_buffer parts[RANKS], counts[RANKS];
  second_step_parts(&m, 13, RECT, rb, sh, parts);
  for (int r = 0; r < RANKS; r++)
    cr_assert_eq(pulse_pub_shard_count(sh[r], parts, RANKS, &counts[r]), PULSE_OK);
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = 1, eo.base_step = 0, eo.chunk_log2 = LOG2, eo.threads = 1;
  pulse_buffer out = {0};
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS, NULL, &out),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_buffer_free(&out);
  cr_assert_gt(counts[1].size, 2000, "counts of shared chunks: %zu bytes", counts[1].size);
  for (size_t cut = 0; cut < counts[1].size; cut += 5) {
    pulse_buffer set[RANKS] = {counts[0], {counts[1].data, cut}, counts[2], counts[3]};
    cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, set, RANKS, NULL, &out),
                 PULSE_ERR_CORRUPT, "counts cut to %zu bytes", cut);
  }
  for (size_t at = 0; at < counts[1].size; at++) {
    uint8_t *b = counts[1].data;
    b[at] ^= 0x5A;
    pulse_status got = pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS,
                                              NULL, &out);
    b[at] ^= 0x5A;
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT || got == PULSE_ERR_ARG,
              "byte %zu: %s: %s", at, pulse_status_name(got), pulse_error_detail());
    pulse_buffer_free(&out);
  }
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS - 1, NULL,
                                      &out),
               PULSE_ERR_CORRUPT, "three ranks' counts do not add up");
  cr_assert(strstr(pulse_error_detail(), "add up"), "%s", pulse_error_detail());
  pulse_buffer twice[RANKS + 1] = {counts[0], counts[1], counts[2], counts[3], counts[2]};
  cr_assert_neq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, twice, RANKS + 1, NULL,
                                       &out),
                PULSE_OK);
  for (int r = 0; r < RANKS; r++) {
    pulse_buffer_free(&parts[r]), pulse_buffer_free(&counts[r]);
    pulse_pub_shard_free(sh[r]);
  }
  sm_model_free(&m);
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* A part's deltas travel as signed steps (zigzag): every delta a change
 * can have comes back, the small steps Adam makes in one byte. */
Test(shard, every_delta_survives_its_zigzag) {
  for (uint32_t d = 1; d <= 0xFFFF; d++) {
    uint64_t z = shard_zigzag((uint16_t)d);
    cr_assert(z != 0 && z <= 0xFFFF && shard_unzigzag(z) == d, "delta %u: %llu", d,
              (unsigned long long)z);
  }
  cr_assert_eq(shard_zigzag(1), 2);
  cr_assert_eq(shard_zigzag(0xFFFF), 1);  /* -1 */
  cr_assert_lt(shard_zigzag(0xFFC1), 128); /* -63: one LEB128 byte */
}

/* Parts carry LEB128 position gaps, classes and deltas: a part cut short
 * is refused by every reader (count, encode, part_for, the state digest);
 * any byte changed is refused or read within bounds (an ASan build checks
 * the reads); a part cut for counting (no deltas) cannot be encoded. */
Test(shard, hostile_parts_are_refused_or_read_within_bounds) {
  sm_model m;
  sm_blocks rb[RANKS];
  pulse_pub_shard *sh[RANKS];
  pulse_buffer parts[RANKS], counts[RANKS], cut = {0}, out = {0};
  second_step_parts(&m, 17, RECT, rb, sh, parts);
  for (int r = 0; r < RANKS; r++)
    cr_assert_eq(pulse_pub_shard_count(sh[r], parts, RANKS, &counts[r]), PULSE_OK);
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = 1, eo.base_step = 0, eo.chunk_log2 = LOG2, eo.threads = 1;
  cr_assert_eq(pulse_pub_shard_part_for(sh[1], &parts[1], rb[0].b, rb[0].n, &cut), PULSE_OK);
  cr_assert_gt(parts[1].size, 3000, "a part of shared chunks: %zu bytes", parts[1].size);
  pulse_state_digest dg;
  for (size_t len = 0; len < parts[1].size; len += 3) {
    pulse_buffer set[RANKS] = {parts[0], {parts[1].data, len}, parts[2], parts[3]};
    cr_assert_eq(pulse_pub_shard_count(sh[0], set, RANKS, &out), PULSE_ERR_CORRUPT, "%zu", len);
    cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, set, RANKS, counts, RANKS, NULL, &out),
                 PULSE_ERR_CORRUPT, "part cut to %zu bytes", len);
    cr_assert_eq(pulse_pub_shard_part_for(sh[1], &set[1], rb[0].b, rb[0].n, &out),
                 PULSE_ERR_CORRUPT, "%zu", len);
    cr_assert_eq(pulse_pub_shard_state_digest(m.info, NT, LOG2, set, RANKS, 1, &dg),
                 PULSE_ERR_CORRUPT, "%zu", len);
  }
  for (size_t at = 0; at < parts[1].size; at++) {
    uint8_t *b = parts[1].data;
    b[at] ^= 0x3C;
    pulse_status got = pulse_pub_shard_count(sh[0], parts, RANKS, &out);
    pulse_buffer_free(&out);
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT, "byte %zu: %s: %s", at,
              pulse_status_name(got), pulse_error_detail());
    got = pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS, NULL, &out);
    pulse_buffer_free(&out);
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT || got == PULSE_ERR_ARG,
              "byte %zu: %s: %s", at, pulse_status_name(got), pulse_error_detail());
    got = pulse_pub_shard_part_for(sh[1], &parts[1], rb[0].b, rb[0].n, &out);
    pulse_buffer_free(&out);
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT, "byte %zu: %s", at,
              pulse_status_name(got));
    b[at] ^= 0x3C;
  }
  /* The same for a cut part, which counting reads. */
  for (size_t at = 0; at < cut.size; at++) {
    cut.data[at] ^= 0x3C;
    pulse_buffer set[RANKS] = {parts[0], cut, parts[2], parts[3]};
    pulse_status got = pulse_pub_shard_count(sh[0], set, RANKS, &out);
    pulse_buffer_free(&out);
    cr_assert(got == PULSE_OK || got == PULSE_ERR_CORRUPT, "byte %zu: %s", at,
              pulse_status_name(got));
    cut.data[at] ^= 0x3C;
  }
  pulse_buffer set[RANKS] = {parts[0], cut, parts[2], parts[3]};
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, set, RANKS, counts, RANKS, NULL, &out),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "no deltas"), "%s", pulse_error_detail());
  /* The first block with changes (64-byte part header, 200-byte block
   * headers: u64 changes at 48, u64 change bytes at 192): one change more
   * than its bytes hold, a delta of 0, a position past the tensor's end. */
  uint8_t *p = parts[1].data, *blk = p + 64;
  while (le64(blk + 48) == 0)
    blk += 200 + le64(blk + 192);
  uint8_t *ch = blk + 200;
  put_le64(blk + 48, le64(blk + 48) + 1);
  cr_assert_eq(pulse_pub_shard_count(sh[0], parts, RANKS, &out), PULSE_ERR_CORRUPT);
  put_le64(blk + 48, le64(blk + 48) - 1);
  size_t gap_len = 1;
  while (ch[gap_len - 1] & 0x80)
    gap_len++;
  uint8_t keep = ch[gap_len + 1]; /* after the gap and the class: the delta */
  ch[gap_len + 1] = 0;
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS, NULL, &out),
               PULSE_ERR_CORRUPT);
  ch[gap_len + 1] = keep;
  /* A block whose first change is past element 127 (a gap of 2 bytes or
   * more), its gap's last byte made 0x7F: a position past its tensor. */
  uint8_t *far = NULL;
  for (uint8_t *x = p + 64; far == NULL && x < p + parts[1].size; x += 200 + le64(x + 192))
    if (le64(x + 48) > 0 && (x[200] & 0x80))
      far = x + 201;
  cr_assert_not_null(far);
  while (*far & 0x80)
    far++;
  uint8_t g0 = *far;
  *far = 0x7F;
  cr_assert_eq(pulse_pub_shard_count(sh[0], parts, RANKS, &out), PULSE_ERR_CORRUPT);
  *far = g0;
  /* Untouched, they still make the patch. */
  cr_assert_eq(pulse_pub_shard_encode(m.info, NT, &eo, parts, RANKS, counts, RANKS, NULL, &out),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_buffer_free(&out), pulse_buffer_free(&cut);
  for (int r = 0; r < RANKS; r++) {
    pulse_buffer_free(&parts[r]), pulse_buffer_free(&counts[r]);
    pulse_pub_shard_free(sh[r]);
  }
  sm_model_free(&m);
}

/* The single publisher's anchor of the model's BF16 snapshot. */
static uint8_t *single_anchor(const sm_model *m, uint64_t step,
                              pulse_state_digest *digest, size_t *size,
                              const char *path) {
  pulse_st_write_tensor t[NT];
  pulse_tensor_digest d[NT];
  pulse_tensor_info bf[NT];
  for (int i = 0; i < NT; i++) {
    memset(&t[i], 0, sizeof t[i]);
    t[i].name = names[i];
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = ndims[i];
    memcpy(t[i].shape, m->info[i].shape, sizeof t[i].shape);
    t[i].data = m->snap[i];
    d[i] = pulse_digest_bf16(m->snap[i], m->numel[i]);
    bf[i] = m->info[i], bf[i].dtype = PULSE_DTYPE_BF16;
  }
  cr_assert_eq(pulse_state_digest_compute(bf, d, NT, digest), PULSE_OK);
  char step_s[32], hex[65];
  snprintf(step_s, sizeof step_s, "%llu", (unsigned long long)step);
  pulse_state_digest_hex(digest, hex);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", hex}};
  cr_assert_eq(pulse_st_write(path, t, NT, meta, 2), PULSE_OK, "%s", pulse_error_detail());
  return tu_read(path, size);
}

Test(shard, every_rank_writes_its_blocks_of_the_single_publishers_anchor) {
  char *dir = tu_make_dir();
  char want_path[4096], got_path[4096];
  snprintf(want_path, sizeof want_path, "%s/want.safetensors", dir);
  sm_model m;
  model_init(&m, 21);
  sm_blocks rb[RANKS];
  blocks_of(MIX, &m, rb);
  pulse_pub_shard *sh[RANKS];
  shards_make(&m, rb, sh);
  pulse_buffer parts[RANKS];
  for (uint64_t step = 0; step < 3; step++) {
    if (step > 0)
      model_step(&m);
    detect_all(sh, rb, &m, parts);
    if (step > 0) { /* the single publisher's snapshot moves to the step */
      pulse_buffer p = single_patch(&m, step);
      pulse_buffer_free(&p);
    }
    pulse_state_digest want_d, got_d;
    size_t want_n = 0, got_n = 0;
    uint8_t *want = single_anchor(&m, step, &want_d, &want_n, want_path);
    cr_assert_eq(pulse_pub_shard_state_digest(m.info, NT, LOG2, parts, RANKS, 1, &got_d), PULSE_OK,
                 "%s", pulse_error_detail());
    cr_assert_eq(memcmp(got_d.bytes, want_d.bytes, 32), 0, "the step's state digest");
    snprintf(got_path, sizeof got_path, "%s/got-%llu.safetensors", dir, (unsigned long long)step);
    for (int r = RANKS; r-- > 0;) /* any order */
      cr_assert_eq(pulse_pub_shard_anchor_write(sh[r], got_path, step, &got_d, step > 0),
                   PULSE_OK, "%s", pulse_error_detail());
    uint8_t *got = tu_read(got_path, &got_n);
    cr_assert(got_n == want_n && memcmp(got, want, got_n) == 0,
              "step %llu: the anchor's bytes are the single publisher's (%zu, %zu)",
              (unsigned long long)step, got_n, want_n);
    free(got), free(want);
    for (int r = 0; r < RANKS; r++) {
      pulse_pub_shard_advance(sh[r]);
      pulse_buffer_free(&parts[r]);
    }
  }
  for (int r = 0; r < RANKS; r++)
    pulse_pub_shard_free(sh[r]);
  sm_model_free(&m);
  tu_rm_rf(dir);
}

/* ------------------------------------------ steps through the store */

#include <sys/wait.h>
#include <unistd.h>

#include "pulse_publisher.h"
#include "pulse_store.h"

static void pub_opts(pulse_pub_opts *o, const sm_model *m) {
  pulse_pub_opts_init(o);
  o->tensors = m->info;
  o->tensor_count = NT;
  o->chunk_log2 = LOG2;
  o->anchor_every = 2;
  o->keep_patches = 3;
  o->keep_anchors = 2;
  o->anchor_sync = 1;
  o->threads = 1;
  o->grace_seconds = 0;
}

/* The single publisher of the gathered weights, steps 0..last. */
static void publish_single(const char *dir, uint64_t seed, uint64_t last) {
  sm_model m;
  model_init(&m, seed);
  pulse_pub_opts o;
  pub_opts(&o, &m);
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s", pulse_error_detail());
  for (uint64_t step = 0; step <= last; step++) {
    if (step > 0)
      model_step(&m);
    pulse_pub_tensor t[NT];
    for (int i = 0; i < NT; i++)
      t[i] = (pulse_pub_tensor){m.w[i], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    cr_assert_eq(pulse_pub_commit(pub, step, t, NT, NULL), PULSE_OK, "%s", pulse_error_detail());
  }
  pulse_pub_free(pub);
  sm_model_free(&m);
}

/* One rank of a sharded job (a child process): steps first..last, from the
 * store when it has a head. fail_step: the step at which this rank dies
 * (_exit, before it writes anything of it), 0 for none; err_step: a step it
 * skips once (an error in the trainer) and then retries. Exit status 0 when
 * every step it took published, 3 when a step failed as it should. */
static int g_overlap; /* rank 3 describes a block one row into rank 2's */

static int run_rank(const char *dir, sharding s, uint64_t seed, int rank, uint64_t first,
                    uint64_t last, uint64_t fail_step, uint64_t err_step, int timeout_ms) {
  sm_model m;
  model_init(&m, seed);
  sm_blocks rb[RANKS];
  blocks_of(s, &m, rb);
  if (g_overlap && rank == 3)
    rb[3].b[0].start[0] -= 1, rb[3].b[0].extent[0] += 1;
  pulse_pub_shard_opts so;
  pulse_pub_shard_opts_init(&so);
  so.tensors = m.info, so.tensor_count = NT;
  so.blocks = rb[rank].b, so.block_count = rb[rank].n;
  so.chunk_log2 = LOG2;
  pulse_pub_shard *sh = NULL;
  if (pulse_pub_shard_create(&so, &sh) != PULSE_OK)
    return 10;
  pulse_pub *committer = NULL;
  if (rank == 0) {
    pulse_pub_opts o;
    pub_opts(&o, &m);
    if (pulse_pub_create_committer(dir, &o, &committer) != PULSE_OK) {
      fprintf(stderr, "rank 0: %s\n", pulse_error_detail());
      return 11;
    }
  }
  if (first > 0 && pulse_pub_shard_resume(sh, dir) != PULSE_OK) {
    fprintf(stderr, "rank %d: resume: %s\n", rank, pulse_error_detail());
    return 12;
  }
  for (uint64_t k = 1; k < first; k++) /* the weights of the steps before */
    model_step(&m);
  pulse_pub_shard_step_opts po;
  pulse_pub_shard_step_opts_init(&po);
  po.rank = rank, po.world = RANKS, po.committer = committer, po.timeout_ms = timeout_ms;
  int rc = 0;
  for (uint64_t step = first; step <= last && rc == 0; step++) {
    if (step > 0)
      model_step(&m);
    if (fail_step > 0 && step == fail_step)
      _exit(4); /* killed mid-step: the others have started it */
    pulse_pub_tensor t[3 * NT];
    float *d[3 * NT];
    for (size_t b = 0; b < rb[rank].n; b++) {
      uint64_t n;
      d[b] = sm_block_data(&m, &rb[rank].b[b], &n);
      t[b] = (pulse_pub_tensor){d[b], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    }
    for (int attempt = 0; attempt < 2; attempt++) {
      if (err_step > 0 && step == err_step && attempt == 0) {
        /* This rank raised: the others' attempt fails with a timeout. */
        if (rank == 1 && timeout_ms < 10000) {
          usleep((useconds_t)timeout_ms * 1500);
          continue;
        }
        if (rank == 1) { /* fails inside the step: the others stop at once */
          if (pulse_pub_shard_step(sh, dir, &po, step, t, rb[rank].n - 1, NULL) == PULSE_OK)
            rc = 22;
          continue;
        }
        pulse_status st = pulse_pub_shard_step(sh, dir, &po, step, t, rb[rank].n, NULL);
        if (st == PULSE_OK)
          break; /* a late rank that came into the retry at once */
        int has = 0;
        uint64_t hs = 0;
        pulse_store_head *h = NULL;
        if (pulse_store_head_load(dir, &h) == PULSE_OK)
          has = 1, hs = pulse_store_head_step(h);
        pulse_store_head_free(h);
        if (!has || hs != step - 1)
          rc = 21; /* the previous step stays */
        continue;
      }
      pulse_status st = pulse_pub_shard_step(sh, dir, &po, step, t, rb[rank].n, NULL);
      if (st != PULSE_OK) {
        fprintf(stderr, "rank %d step %llu: %s\n", rank, (unsigned long long)step,
                pulse_error_detail());
        rc = strstr(pulse_error_detail(), "'attn.w'") && strstr(pulse_error_detail(), "overlap")
                 ? 5
                 : 3;
      }
      break;
    }
    for (size_t b = 0; b < rb[rank].n; b++)
      free(d[b]);
  }
  pulse_pub_free(committer);
  pulse_pub_shard_free(sh);
  sm_model_free(&m);
  return rc;
}

static void run_job(const char *dir, sharding s, uint64_t seed, uint64_t first, uint64_t last,
                    int dying_rank, uint64_t fail_step, uint64_t err_step, int want[RANKS]) {
  pid_t pid[RANKS];
  for (int r = 0; r < RANKS; r++) {
    pid[r] = fork();
    cr_assert(pid[r] >= 0);
    if (pid[r] == 0)
      _exit(run_rank(dir, s, seed, r, first, last, r == dying_rank ? fail_step : 0, err_step,
                     dying_rank == -2 ? 30000 : fail_step || err_step ? 1500 : 20000));
  }
  for (int r = 0; r < RANKS; r++) {
    int status = 0;
    cr_assert_eq(waitpid(pid[r], &status, 0), pid[r]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == want[r], "rank %d exited %d, not %d", r,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1, want[r]);
  }
}

/* The two stores name the same objects (the same bytes) at the head. */
static void assert_same_store(const char *a, const char *b, uint64_t step) {
  pulse_store_head *x = NULL, *y = NULL;
  cr_assert_eq(pulse_store_head_load(a, &x), PULSE_OK);
  cr_assert_eq(pulse_store_head_load(b, &y), PULSE_OK);
  cr_assert_eq(pulse_store_head_step(x), step);
  cr_assert_eq(pulse_store_head_step(y), step);
  cr_assert_eq(memcmp(pulse_store_head_state_digest(x), pulse_store_head_state_digest(y), 32), 0);
  cr_assert_eq(pulse_store_head_patch_count(x), pulse_store_head_patch_count(y));
  cr_assert_eq(pulse_store_head_anchor_count(x), pulse_store_head_anchor_count(y));
  for (size_t i = 0; i < pulse_store_head_patch_count(x); i++)
    cr_assert_eq(memcmp(pulse_store_head_patch(x, i)->sha256, pulse_store_head_patch(y, i)->sha256,
                        32), 0, "patch %zu", i);
  for (size_t i = 0; i < pulse_store_head_anchor_count(x); i++)
    cr_assert_eq(memcmp(pulse_store_head_anchor(x, i)->sha256,
                        pulse_store_head_anchor(y, i)->sha256, 32), 0, "anchor %zu", i);
  pulse_store_head_free(x), pulse_store_head_free(y);
  cr_assert_eq(pulse_store_verify(a, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE, NULL,
                                  NULL), PULSE_OK, "%s", pulse_error_detail());
}

static void store_job(sharding s, uint64_t seed) {
  char *dir = tu_make_dir();
  char single[4096], sharded[4096];
  snprintf(single, sizeof single, "%s/single", dir);
  snprintf(sharded, sizeof sharded, "%s/sharded", dir);
  publish_single(single, seed, 5);
  int ok[RANKS] = {0, 0, 0, 0};
  run_job(sharded, s, seed, 0, 5, -1, 0, 0, ok);
  assert_same_store(sharded, single, 5);
  tu_rm_rf(dir);
}

Test(shard_store, four_processes_publish_flat_ranges_as_one_publisher, .timeout = 120) {
  store_job(FLAT, 31);
}
Test(shard_store, four_processes_publish_rectangular_blocks_as_one_publisher, .timeout = 120) {
  store_job(RECT, 32);
}
Test(shard_store, four_processes_publish_a_mix_as_one_publisher, .timeout = 120) {
  store_job(MIX, 33);
}

Test(shard_store, a_rank_killed_mid_step_leaves_the_previous_step_and_a_restarted_job_goes_on,
     .timeout = 120) {
  char *dir = tu_make_dir();
  char single[4096], sharded[4096];
  snprintf(single, sizeof single, "%s/single", dir);
  snprintf(sharded, sizeof sharded, "%s/sharded", dir);
  publish_single(single, 41, 5);
  /* Rank 2 dies in step 3; the others give the step up. */
  int want[RANKS] = {3, 3, 4, 3};
  run_job(sharded, DIM0, 41, 0, 5, 2, 3, 0, want);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(sharded, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_step(h), 2, "the head stays at the previous step");
  pulse_store_head_free(h);
  cr_assert_eq(pulse_store_verify(sharded, PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                                  NULL, NULL), PULSE_OK, "%s", pulse_error_detail());
  /* A restarted job resumes from the store. */
  int ok[RANKS] = {0, 0, 0, 0};
  run_job(sharded, DIM0, 41, 3, 5, -1, 0, 0, ok);
  assert_same_store(sharded, single, 5);
  tu_rm_rf(dir);
}

Test(shard_store, a_rank_that_raises_leaves_the_previous_step_and_the_retry_publishes,
     .timeout = 120) {
  char *dir = tu_make_dir();
  char single[4096], sharded[4096];
  snprintf(single, sizeof single, "%s/single", dir);
  snprintf(sharded, sizeof sharded, "%s/sharded", dir);
  publish_single(single, 51, 4);
  int ok[RANKS] = {0, 0, 0, 0};
  run_job(sharded, SETS, 51, 0, 4, -1, 0, 2, ok);
  assert_same_store(sharded, single, 4);
  tu_rm_rf(dir);
}

Test(shard_store, a_second_committer_on_a_live_store_is_refused) {
  char *dir = tu_make_dir();
  sm_model m;
  model_init(&m, 61);
  pulse_pub_opts o;
  pub_opts(&o, &m);
  pulse_pub *a = NULL, *b = NULL;
  cr_assert_eq(pulse_pub_create_committer(dir, &o, &a), PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(pulse_pub_create_committer(dir, &o, &b), PULSE_ERR_IO);
  cr_assert_eq(pulse_pub_create(dir, &o, &b), PULSE_ERR_IO);
  pulse_pub_tensor t[NT];
  for (int i = 0; i < NT; i++)
    t[i] = (pulse_pub_tensor){m.w[i], PULSE_DTYPE_F32, PULSE_PUB_HOST};
  cr_assert_eq(pulse_pub_commit(a, 0, t, NT, NULL), PULSE_ERR_ARG, "a committer commits made steps");
  pulse_pub_free(a);
  sm_model_free(&m);
  tu_rm_rf(dir);
}

Test(shard_store, a_rank_that_fails_inside_a_step_stops_the_others_at_once, .timeout = 120) {
  char *dir = tu_make_dir();
  char single[4096], sharded[4096];
  snprintf(single, sizeof single, "%s/single", dir);
  snprintf(sharded, sizeof sharded, "%s/sharded", dir);
  publish_single(single, 71, 3);
  int ok[RANKS] = {0, 0, 0, 0};
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  /* dying_rank -2: no death, a 30 s timeout; rank 1 fails step 2 inside */
  run_job(sharded, MIX, 71, 0, 3, -2, 0, 2, ok);
  clock_gettime(CLOCK_MONOTONIC, &b);
  double took = (double)(b.tv_sec - a.tv_sec) + 1e-9 * (double)(b.tv_nsec - a.tv_nsec);
  cr_assert_lt(took, 15.0, "the others did not wait out the 30 s timeout (%.1f s)", took);
  assert_same_store(sharded, single, 3);
  tu_rm_rf(dir);
}

Test(shard_store, overlapping_blocks_are_refused_by_every_rank_before_anything_is_written,
     .timeout = 120) {
  char *dir = tu_make_dir();
  char sharded[4096], objects[4200];
  snprintf(sharded, sizeof sharded, "%s/sharded", dir);
  g_overlap = 1;
  int want[RANKS] = {5, 5, 5, 5};
  run_job(sharded, DIM0, 81, 0, 2, -1, 0, 0, want);
  g_overlap = 0;
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(sharded, &h), PULSE_ERR_NOT_FOUND, "no head");
  snprintf(objects, sizeof objects, "%s/objects", sharded);
  cr_assert_eq(tt_count(objects), 0, "nothing written");
  tu_rm_rf(dir);
}
