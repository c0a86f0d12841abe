/* test_class_index.c - a receiver's class index (pulse_class_index): built
 * over any data it describes that data exactly; applying through it gives
 * exactly what applying without it gives, staged or streamed, for every
 * coding and chunk size, step after step, with commits that move elements
 * between classes keeping it exact; an index of other data is ignored, never
 * trusted; hostile bytes fail the same way with or without it and leave both
 * the weights and the index as they were. Applies in a row reuse one
 * staging block, whatever the last one left in it. */
#include "patch_testutil.h"
#include "pulse_codec_stream.h"

#include <stddef.h>

#include <criterion/criterion.h>

/* Codings: the class model in every version (the index's users) and plain,
 * which must leave the index current without using it. */
enum { CODINGS = 4 };
static const char *const coding_names[CODINGS] = {"class", "class v1", "plain",
                                                  "class v3"};

static pulse_encode_opts coding_opts(int coding, uint32_t chunk_log2) {
  pulse_encode_opts o = pt_opts(coding == 2 ? PULSE_POS_PLAIN : PULSE_POS_CLASS, chunk_log2, 2);
  o.format_version = coding == 1 ? 1 : coding == 3 ? 3 : PULSE_PATCH_VERSION;
  return o;
}

static void assert_index_describes(const pulse_class_index *ix, const uint16_t *data, uint64_t n,
                                   const char *label) {
  pulse_status st = pulse_class_index_check(ix, data, n);
  cr_assert_eq(st, PULSE_OK, "%s: index check: %s (%s)", label, pulse_status_name(st),
               pulse_error_detail());
}

Test(class_index, describes_the_data_for_sizes_around_blocks_and_any_bits) {
  static const uint64_t sizes[] = {0, 1, 4095, 4096, 4097, 3 * 4096 + 5, 100000};
  static const pt_weights kinds[] = {PT_WEIGHTS_NORMAL, PT_WEIGHTS_ANY, PT_WEIGHTS_CONST};
  for (size_t z = 0; z < PT_COUNT_OF(sizes); z++)
    for (size_t k = 0; k < PT_COUNT_OF(kinds); k++) {
      uint64_t n = sizes[z], s = 11 + z * 7 + k;
      uint16_t *data = pt_alloc((size_t)n * 2 + 2);
      for (uint64_t i = 0; i < n; i++)
        data[i] = pt_weight(&s, kinds[k]);
      pulse_class_index *ix = NULL;
      cr_assert_eq(pulse_class_index_build(data, n, (int)k, &ix), PULSE_OK);
      char label[64];
      snprintf(label, sizeof label, "%llu elements, kind %zu", (unsigned long long)n, k);
      assert_index_describes(ix, data, n, label);
      pulse_tensor_digest d = pulse_digest_bf16(data, n), got = pulse_class_index_digest(ix);
      cr_assert(got.a == d.a && got.b == d.b, "%s: digest", label);
      cr_assert_geq(pulse_class_index_bytes(ix), (size_t)n * 2, "%s: bytes", label);
      cr_assert_leq(pulse_class_index_bytes(ix), (size_t)n * 2 + (size_t)n / 4 + 4096,
                    "%s: about 2.1 bytes per element", label);
      pulse_class_index_free(ix);
      free(data);
    }
  pulse_class_index_free(NULL);
  cr_assert_eq(pulse_class_index_bytes(NULL), 0);
}

Test(class_index, check_notices_data_that_changed_behind_it) {
  uint64_t n = 10000, s = 5;
  uint16_t *data = pt_alloc(n * 2);
  for (uint64_t i = 0; i < n; i++)
    data[i] = pt_weight(&s, PT_WEIGHTS_NORMAL);
  pulse_class_index *ix = NULL;
  cr_assert_eq(pulse_class_index_build(data, n, 1, &ix), PULSE_OK);
  data[4097] ^= 0x0080; /* another exponent */
  cr_assert_eq(pulse_class_index_check(ix, data, n), PULSE_ERR_CORRUPT);
  data[4097] ^= 0x0080;
  cr_assert_eq(pulse_class_index_check(ix, data, n), PULSE_OK);
  cr_assert_eq(pulse_class_index_check(ix, data, n - 1), PULSE_ERR_SIZE_MISMATCH);
  pulse_class_index_free(ix);
  cr_assert_eq(pulse_class_index_build(NULL, 5, 1, &ix), PULSE_ERR_ARG);
  cr_assert_null(ix, "a failed build leaves *out NULL");
  free(data);
}

/* A trajectory of `steps` patches over tensors of these sizes: each step
 * changes elements at `density`, some by any 16 bits (new exponents, so
 * commits move elements between classes). */
typedef struct {
  size_t n;
  pt_tensor ts[3];
} trajectory_step;

static void step_make(trajectory_step *st, uint16_t *const *cur, const uint64_t *numel,
                      double density, uint64_t seed) {
  static const char *const names[] = {"layers.0.w", "layers.0.b", "head"};
  st->n = 3;
  uint64_t s = seed;
  for (size_t i = 0; i < st->n; i++) {
    pt_tensor *t = &st->ts[i];
    pt_tensor_shape(t, names[i], 1, &numel[i]);
    t->base = pt_copy(cur[i], numel[i]);
    pt_make_changes(t->base, t->numel, density, 1, &s, &t->changes);
    t->target = pt_copy(t->base, t->numel);
    pt_apply_changes(t->target, &t->changes);
  }
}

static uint64_t class_moves(const trajectory_step *st) {
  uint64_t moves = 0;
  for (size_t i = 0; i < st->n; i++) {
    const pulse_changes *c = &st->ts[i].changes;
    for (uint64_t j = 0; j < c->count; j++)
      moves += pulse_bf16_class(c->old_bits[j]) != pulse_bf16_class(c->new_bits[j]);
  }
  return moves;
}

/* Applies bytes to h through the indexes ix (parallel to h, or NULL),
 * staged (streamed = 0) or streamed in one feed. */
static pulse_status apply_bytes(const pulse_buffer *buf, pulse_host_tensor *h,
                                pulse_class_index *const *ix, size_t n, int streamed) {
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(buf->data, buf->size, &p);
  if (st != PULSE_OK)
    return st;
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = 2;
  ao.class_index = ix;
  if (!streamed) {
    st = pulse_patch_apply(p, h, n, &ao);
  } else {
    pulse_patch_stream *s = NULL;
    st = pulse_patch_stream_begin(p, h, n, &ao, &s);
    if (st == PULSE_OK) {
      pulse_patch_stream_feed(s, buf->size);
      st = pulse_patch_stream_finish(s);
    }
    if (st == PULSE_OK)
      pulse_patch_stream_commit(s);
    pulse_patch_stream_free(s);
  }
  pulse_patch_free(p);
  return st;
}

Test(class_index, applying_through_it_is_bit_exact_and_keeps_it_current) {
  static const uint32_t chunk_log2s[] = {10, 12, 13, 20};
  static const double densities[] = {0.003, 0.05, 0.5};
  const uint64_t numel[3] = {3 * 4096 + 1000, 4096, 77};
  uint64_t moves = 0;
  for (int coding = 0; coding < CODINGS; coding++)
    for (size_t c = 0; c < PT_COUNT_OF(chunk_log2s); c++)
      for (int streamed = 0; streamed < 2; streamed++) {
        uint64_t s = 1000u * (uint64_t)coding + 10u * c + (uint64_t)streamed;
        uint16_t *cur[3];
        pulse_host_tensor with[3] = {{0}}, without[3] = {{0}};
        pulse_class_index *wix[3] = {NULL, NULL, NULL};
        for (size_t i = 0; i < 3; i++) {
          cur[i] = pt_alloc(numel[i] * 2);
          for (uint64_t e = 0; e < numel[i]; e++)
            cur[i][e] = pt_weight(&s, PT_WEIGHTS_NORMAL);
        }
        for (size_t d = 0; d < PT_COUNT_OF(densities); d++) {
          char label[96];
          snprintf(label, sizeof label, "%s chunk 2^%u %s density %g", coding_names[coding],
                   chunk_log2s[c], streamed ? "streamed" : "staged", densities[d]);
          trajectory_step st;
          step_make(&st, cur, numel, densities[d], s + d);
          moves += class_moves(&st);
          pulse_encode_opts o = coding_opts(coding, chunk_log2s[c]);
          pulse_buffer buf = {NULL, 0};
          cr_assert_eq(pt_encode(&o, st.ts, 3, &buf), PULSE_OK, "%s: encode", label);
          for (size_t i = 0; i < 3; i++) {
            with[i].name = without[i].name = st.ts[i].name;
            with[i].numel = without[i].numel = numel[i];
            with[i].data = cur[i];
            if (without[i].data == NULL)
              without[i].data = pt_copy(cur[i], numel[i]);
            if (wix[i] == NULL) /* built once, kept by commits */
              cr_assert_eq(pulse_class_index_build(cur[i], numel[i], 1, &wix[i]), PULSE_OK);
          }
          pulse_status a = apply_bytes(&buf, with, wix, 3, streamed);
          pulse_status b = apply_bytes(&buf, without, NULL, 3, streamed);
          cr_assert_eq(a, PULSE_OK, "%s: with the index: %s", label, pulse_error_detail());
          cr_assert_eq(b, PULSE_OK, "%s: without: %s", label, pulse_error_detail());
          for (size_t i = 0; i < 3; i++) {
            cr_assert_eq(pt_first_diff(st.ts[i].target, with[i].data, numel[i]), PT_NONE,
                         "%s: '%s' through the index", label, st.ts[i].name);
            cr_assert_eq(pt_first_diff(st.ts[i].target, without[i].data, numel[i]), PT_NONE,
                         "%s: '%s' without", label, st.ts[i].name);
            assert_index_describes(wix[i], with[i].data, numel[i], label);
          }
          pulse_buffer_free(&buf);
          pt_tensors_free(st.ts, 3);
          /* Applies reuse the staging of the one before (slab_cache.c):
           * larger, smaller, and none after it is handed back. */
          if (d == 1 && streamed)
            pulse_apply_cache_free();
        }
        for (size_t i = 0; i < 3; i++) {
          pulse_class_index_free(wix[i]);
          free(cur[i]), free(without[i].data);
        }
      }
  cr_assert_gt(moves, 1000, "commits moved elements between classes (%llu)",
               (unsigned long long)moves);
}

/* One tensor, its patch, and a target copy of its base. */
typedef struct {
  pt_tensor t;
  pulse_buffer buf;
  pulse_host_tensor h;
  pulse_class_index *ix;
} one_fixture;

static void one_make(one_fixture *f, int coding, uint64_t numel, uint32_t chunk_log2,
                     uint64_t seed) {
  pt_tensor_make1(&f->t, "w", numel, PT_WEIGHTS_NORMAL, 0.02, 1, seed);
  pulse_encode_opts o = coding_opts(coding, chunk_log2);
  f->buf = (pulse_buffer){NULL, 0};
  cr_assert_eq(pt_encode(&o, &f->t, 1, &f->buf), PULSE_OK);
  f->h = (pulse_host_tensor){f->t.name, pt_copy(f->t.base, numel), numel, NULL};
  f->ix = NULL;
}

static void one_free(one_fixture *f) {
  pulse_class_index_free(f->ix);
  free(f->h.data);
  pulse_buffer_free(&f->buf);
  pt_tensor_free(&f->t);
}

Test(class_index, an_index_of_other_data_is_ignored_and_stays_stale) {
  for (int coding = 0; coding < CODINGS; coding++) {
    one_fixture f;
    one_make(&f, coding, 20000, 12, 3 + (uint64_t)coding);
    /* Built over other bits, then the data set to the patch's base: the
     * index's digest is not the data's, so apply must not use it. */
    uint16_t *other = pt_copy(f.t.base, f.t.numel);
    for (uint64_t i = 0; i < f.t.numel; i += 3)
      other[i] ^= 0x0100;
    cr_assert_eq(pulse_class_index_build(other, f.t.numel, 1, &f.ix), PULSE_OK);
    pulse_tensor_digest stale = pulse_class_index_digest(f.ix);
    cr_assert_eq(apply_bytes(&f.buf, &f.h, &f.ix, 1, coding == 0), PULSE_OK, "%s: %s",
                 coding_names[coding], pulse_error_detail());
    cr_assert_eq(pt_first_diff(f.t.target, f.h.data, f.t.numel), PT_NONE, "%s: target",
                 coding_names[coding]);
    pulse_tensor_digest after = pulse_class_index_digest(f.ix);
    cr_assert(after.a == stale.a && after.b == stale.b, "%s: the stale index was not touched",
              coding_names[coding]);
    assert_index_describes(f.ix, other, f.t.numel, "the stale index");
    free(other);
    one_free(&f);
  }
  /* An index of another size is ignored too. */
  one_fixture f;
  one_make(&f, 0, 9000, 12, 9);
  cr_assert_eq(pulse_class_index_build(f.t.base, 8999, 1, &f.ix), PULSE_OK);
  cr_assert_eq(apply_bytes(&f.buf, &f.h, &f.ix, 1, 0), PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(pt_first_diff(f.t.target, f.h.data, f.t.numel), PT_NONE);
  one_free(&f);
}

/* Options of another version (version 1 had no class_index) are refused,
 * and read no further than their version field. */
Test(class_index, apply_options_of_another_version_are_refused) {
  one_fixture f;
  one_make(&f, 0, 9000, 12, 13);
  /* A caller built against version 1 has no room for class_index (ASan
   * sees a read past this allocation). */
  struct {
    uint32_t struct_version;
    int threads, partial_table;
  } *old = pt_alloc(offsetof(pulse_apply_opts, class_index));
  old->struct_version = 1;
  old->threads = 1;
  pulse_apply_opts *v1 = (pulse_apply_opts *)(void *)old;
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(f.buf.data, f.buf.size, &p), PULSE_OK);
  cr_assert_eq(pulse_patch_apply(p, &f.h, 1, v1), PULSE_ERR_VERSION, "version 1");
  old->struct_version = PULSE_APPLY_OPTS_VERSION + 1;
  cr_assert_eq(pulse_patch_apply(p, &f.h, 1, v1), PULSE_ERR_VERSION, "an unknown version");
  pulse_apply_opts now;
  pulse_apply_opts_init(&now);
  now.threads = 1;
  cr_assert_eq(pulse_patch_apply(p, &f.h, 1, &now), PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(pt_first_diff(f.t.target, f.h.data, f.t.numel), PT_NONE);
  pulse_patch_free(p);
  free(v1);
  one_free(&f);
}

/* Every byte of the patch flipped: applying through the index fails exactly
 * when applying without it fails (with the same status), the weights are
 * then untouched and the index still describes them; otherwise both reach
 * the same weights and the index follows. */
Test(class_index, flipped_bytes_fail_alike_and_leave_weights_and_index_alone) {
  for (int coding = 0; coding < CODINGS; coding++) {
    one_fixture f;
    one_make(&f, coding, 9000, 12, 21 + (uint64_t)coding);
    uint8_t *b = pt_alloc(f.buf.size);
    static const uint8_t masks[] = {0x01, 0x80, 0xFF};
    size_t failed = 0;
    for (size_t at = 0; at < f.buf.size; at++)
      for (size_t k = 0; k < PT_COUNT_OF(masks); k++) {
        memcpy(b, f.buf.data, f.buf.size);
        b[at] ^= masks[k];
        pulse_buffer flipped = {b, f.buf.size};
        pulse_host_tensor with = {"w", pt_copy(f.t.base, f.t.numel), f.t.numel, NULL};
        pulse_host_tensor without = {"w", pt_copy(f.t.base, f.t.numel), f.t.numel, NULL};
        pulse_class_index *wix = NULL;
        cr_assert_eq(pulse_class_index_build(with.data, f.t.numel, 1, &wix), PULSE_OK);
        int streamed = (int)(at & 1);
        pulse_status a = apply_bytes(&flipped, &with, &wix, 1, streamed);
        pulse_status e = apply_bytes(&flipped, &without, NULL, 1, streamed);
        cr_assert_eq(a, e, "%s: byte %zu ^ 0x%02X: %s with the index, %s without",
                     coding_names[coding], at, masks[k], pulse_status_name(a),
                     pulse_status_name(e));
        cr_assert_eq(pt_first_diff(without.data, with.data, f.t.numel), PT_NONE,
                     "%s: byte %zu ^ 0x%02X: same weights", coding_names[coding], at, masks[k]);
        if (a != PULSE_OK) {
          failed++;
          cr_assert_eq(pt_first_diff(f.t.base, with.data, f.t.numel), PT_NONE,
                       "%s: byte %zu: untouched", coding_names[coding], at);
        }
        cr_assert_eq(pulse_class_index_check(wix, with.data, f.t.numel), PULSE_OK,
                     "%s: byte %zu ^ 0x%02X: index: %s", coding_names[coding], at, masks[k],
                     pulse_error_detail());
        pulse_class_index_free(wix);
        free(with.data), free(without.data);
      }
    cr_assert_gt(failed, f.buf.size, "%s: most flips fail", coding_names[coding]);
    free(b);
    one_free(&f);
  }
}

/* The commit in two halves (data under the readers' lock, then the
 * indexes): each half may be called again without harm, the index moves
 * happen once, and the indexes end describing the new weights. */
Test(class_index, commit_halves_repeat_harmlessly) {
  for (int streamed = 0; streamed < 2; streamed++) {
    one_fixture f;
    one_make(&f, 0, 30000, 12, 31 + (uint64_t)streamed);
    uint64_t moves = 0;
    for (uint64_t j = 0; j < f.t.changes.count; j++)
      moves += pulse_bf16_class(f.t.changes.old_bits[j]) !=
               pulse_bf16_class(f.t.changes.new_bits[j]);
    cr_assert_gt(moves, 0, "some changes move between classes");
    cr_assert_eq(pulse_class_index_build(f.h.data, f.t.numel, 1, &f.ix), PULSE_OK);
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(f.buf.data, f.buf.size, &p), PULSE_OK);
    pulse_apply_opts ao;
    pulse_apply_opts_init(&ao);
    ao.class_index = &f.ix;
    if (!streamed) {
      pulse_patch_staged *s = NULL;
      cr_assert_eq(pulse_patch_stage(p, &f.h, 1, &ao, &s), PULSE_OK, "%s",
                   pulse_error_detail());
      pulse_patch_staged_commit_data(s);
      pulse_patch_staged_commit_data(s);
      pulse_patch_staged_commit_indexes(s);
      pulse_patch_staged_commit_indexes(s);
      pulse_patch_staged_commit(s);
      pulse_patch_staged_free(s);
    } else {
      pulse_patch_stream *s = NULL;
      cr_assert_eq(pulse_patch_stream_begin(p, &f.h, 1, &ao, &s), PULSE_OK);
      pulse_patch_stream_commit_indexes(s); /* before finish: nothing */
      pulse_patch_stream_feed(s, f.buf.size);
      cr_assert_eq(pulse_patch_stream_finish(s), PULSE_OK, "%s", pulse_error_detail());
      pulse_patch_stream_commit_indexes(s); /* before the data: nothing */
      assert_index_describes(f.ix, f.t.base, f.t.numel, "before the data");
      pulse_patch_stream_commit_data(s);
      pulse_patch_stream_commit_data(s);
      pulse_patch_stream_commit_indexes(s);
      pulse_patch_stream_commit_indexes(s);
      pulse_patch_stream_commit(s);
      pulse_patch_stream_free(s);
    }
    cr_assert_eq(pt_first_diff(f.t.target, f.h.data, f.t.numel), PT_NONE);
    assert_index_describes(f.ix, f.h.data, f.t.numel, streamed ? "streamed" : "staged");
    pulse_patch_free(p);
    one_free(&f);
  }
}

/* The memory stated in pulse_codec.h and docs/formats/patch.md: 2 bytes per element
 * plus 528 per block of 4096, at most 2.2 bytes per element from 10,000
 * elements up. */
Test(class_index, holds_at_most_2_2_bytes_per_element_from_10000_elements) {
  static const uint64_t sizes[] = {10000, 12289, 65536, 1000001, 3u << 20};
  for (size_t z = 0; z < PT_COUNT_OF(sizes); z++) {
    uint64_t n = sizes[z];
    uint16_t *data = pt_alloc((size_t)n * 2);
    pulse_class_index *ix = NULL;
    cr_assert_eq(pulse_class_index_build(data, n, 2, &ix), PULSE_OK);
    size_t bytes = pulse_class_index_bytes(ix);
    cr_assert_leq((double)bytes, 2.2 * (double)n, "%llu elements: %zu bytes",
                  (unsigned long long)n, bytes);
    cr_assert_leq(bytes, (size_t)n * 2 + 528 * ((size_t)(n + 4095) / 4096) + 256,
                  "%llu elements: %zu bytes", (unsigned long long)n, bytes);
    pulse_class_index_free(ix);
    free(data);
  }
}
