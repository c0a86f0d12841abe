/* test_patch_stream.c - staging a patch while its bytes arrive
 * (pulse_codec_stream.h): fed in random slices it gives exactly what
 * pulse_patch_stage gives, for both position models, thread counts, shards
 * and tables with untouched tensors; a flipped byte anywhere gives the
 * status pulse_patch_apply gives and never a wrong target; a truncated
 * object never commits; bytes past what was fed are never read. */
#include "patch_testutil.h"
#include "pulse_codec_stream.h"

#include <criterion/criterion.h>

/* Both position models in the default format version and in version 3. */
enum { CODINGS = 4 };
static const pulse_pos_model models[CODINGS] = {
    PULSE_POS_PLAIN, PULSE_POS_CLASS, PULSE_POS_PLAIN, PULSE_POS_CLASS};
static const unsigned versions[CODINGS] = {0, 0, 3, 3};
static const char *const model_names[CODINGS] = {"plain", "class", "plain v3",
                                                 "class v3"};

/* Tensors over several chunks of 2^10, one without changes, one tiny. */
static size_t make_tensors(pt_tensor *ts, double density, uint64_t seed) {
  uint64_t shape2[2] = {9, 1000};
  pt_tensor_make1(&ts[0], "a", 5000, PT_WEIGHTS_NORMAL, density, 1, seed);
  pt_tensor_make(&ts[1], "b.weight", 2, shape2, PT_WEIGHTS_NORMAL, density, 0,
                 seed + 1);
  pt_tensor_make1(&ts[2], "c", 300, PT_WEIGHTS_NORMAL, 0.0, 0, seed + 2);
  pt_tensor_make1(&ts[3], "d", 7, PT_WEIGHTS_EDGE, 0.6, 1, seed + 3);
  pt_tensor_make1(&ts[4], "e", 2049, PT_WEIGHTS_ANY, density * 3, 1, seed + 4);
  return 5;
}

/* Streams `bytes` (size) into copies of the bases of the first n tensors:
 * the bytes arrive in random slices into a buffer that holds garbage past
 * what arrived; the patch is opened once pulse_patch_stream_need says the
 * table is there. `fed` < size stops feeding there (a truncated object).
 * On success the copies are committed. Returns the first failing status;
 * *h gets the targets (free with pt_hosts_free). */
static pulse_status stream_patch(const pt_tensor *ts, size_t n,
                                 const uint8_t *bytes, size_t size, size_t fed,
                                 const pulse_apply_opts *ao, uint64_t seed,
                                 pulse_host_tensor **h_out) {
  uint8_t *buf = pt_alloc(size);
  memset(buf, 0xA5, size);
  pulse_host_tensor *h = pt_hosts(ts, n);
  *h_out = h;
  pulse_patch *p = NULL;
  pulse_patch_stream *s = NULL;
  pulse_status st = PULSE_OK;
  size_t avail = 0, need = 0;
  uint64_t r = seed;
  int opened = 0;
  while (st == PULSE_OK) {
    if (!opened && pulse_patch_stream_need(buf, avail, &need) != PULSE_OK) {
      st = pulse_patch_stream_need(buf, avail, &need);
      break;
    }
    if (!opened && avail >= need) {
      opened = 1;
      st = pulse_patch_open(buf, size, &p);
      if (st == PULSE_OK)
        st = pulse_patch_stream_begin(p, h, n, ao, &s);
      if (st != PULSE_OK)
        break;
      pulse_patch_stream_feed(s, avail); /* what arrived before begin */
    }
    if (avail >= fed)
      break;
    uint64_t most = pulse_rng_below(&r, 4) == 0 ? 4000 : 60;
    size_t slice = 1 + (size_t)pulse_rng_below(&r, most);
    if (slice > fed - avail)
      slice = fed - avail;
    memcpy(buf + avail, bytes + avail, slice);
    avail += slice;
    pulse_patch_stream_feed(s, avail); /* NULL before begin: ignored */
  }
  if (st == PULSE_OK && !opened)
    st = pulse_patch_open(buf, fed, &p); /* what a short object gives */
  if (st == PULSE_OK)
    st = pulse_patch_stream_finish(s);
  if (st == PULSE_OK)
    pulse_patch_stream_commit(s);
  else
    pulse_patch_stream_commit(s); /* must write nothing */
  pulse_patch_stream_free(s);
  pulse_patch_free(p);
  free(buf);
  return st;
}

/* The reference: pulse_patch_stage and commit on copies of the bases. */
static pulse_status stage_patch(const pt_tensor *ts, size_t n,
                                const uint8_t *bytes, size_t size,
                                const pulse_apply_opts *ao,
                                pulse_host_tensor **h_out) {
  pulse_host_tensor *h = pt_hosts(ts, n);
  *h_out = h;
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(bytes, size, &p);
  if (st == PULSE_OK)
    st = pulse_patch_apply(p, h, n, ao);
  pulse_patch_free(p);
  return st;
}

static void assert_same(const pt_tensor *ts, size_t n,
                        const pulse_host_tensor *a, const pulse_host_tensor *b,
                        const char *label) {
  for (size_t i = 0; i < n; i++) {
    uint64_t bad = pt_first_diff(a[i].data, b[i].data, ts[i].numel);
    cr_assert_eq(bad, PT_NONE,
                 "%s: tensor '%s' differs from the staged result at %llu",
                 label, ts[i].name, (unsigned long long)bad);
  }
}

Test(patch_stream, random_slices_give_what_stage_gives) {
  static const int threads[] = {1, 2, 4, 0};
  static const double densities[] = {0.001, 0.02, 0.3};
  for (int m = 0; m < CODINGS; m++)
    for (size_t d = 0; d < PT_COUNT_OF(densities); d++)
      for (size_t k = 0; k < PT_COUNT_OF(threads); k++) {
        pt_tensor ts[5];
        uint64_t seed = 100 + 10 * (uint64_t)d + (uint64_t)k;
        size_t n = make_tensors(ts, densities[d], seed);
        pulse_encode_opts o = pt_opts(models[m], 10, 1);
        o.format_version = versions[m];
        pulse_buffer buf = {NULL, 0};
        cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
        char label[96];
        snprintf(label, sizeof label, "%s density %g threads %d",
                 model_names[m], densities[d], threads[k]);
        for (int partial = 0; partial < 2; partial++) {
          pulse_apply_opts ao;
          pulse_apply_opts_init(&ao);
          ao.threads = threads[k];
          ao.partial_table = partial;
          /* A shard holder streams into the first three tensors only. */
          size_t count = partial ? 3 : n;
          pulse_host_tensor *ref = NULL, *got = NULL;
          pulse_status want =
              stage_patch(ts, count, buf.data, buf.size, &ao, &ref);
          cr_assert_eq(want, PULSE_OK, "%s: stage: %s", label,
                       pulse_error_detail());
          for (uint64_t round = 0; round < 3; round++) {
            pulse_status st =
                stream_patch(ts, count, buf.data, buf.size, buf.size, &ao,
                             seed * 7 + round, &got);
            cr_assert_eq(st, PULSE_OK, "%s partial %d: %s (%s)", label, partial,
                         pulse_status_name(st), pulse_error_detail());
            assert_same(ts, count, ref, got, label);
            for (size_t i = 0; i < count; i++)
              cr_assert_eq(
                  pt_first_diff(got[i].data, ts[i].target, ts[i].numel),
                  PT_NONE, "%s: '%s' reaches its target", label, ts[i].name);
            pt_hosts_free(got, count);
          }
          pt_hosts_free(ref, count);
        }
        pulse_buffer_free(&buf);
        pt_tensors_free(ts, n);
      }
}

Test(patch_stream, stream_gives_its_times) {
  pt_tensor ts[5];
  size_t n = make_tensors(ts, 0.05, 3);
  pulse_encode_opts o = pt_opts(PULSE_POS_CLASS, 10, 1);
  pulse_buffer buf = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(buf.data, buf.size, &p), PULSE_OK);
  pulse_host_tensor *h = pt_hosts(ts, n);
  pulse_patch_stream *s = NULL;
  cr_assert_eq(pulse_patch_stream_begin(p, h, n, NULL, &s), PULSE_OK);
  pulse_patch_stream_feed(s, buf.size);
  cr_assert_eq(pulse_patch_stream_finish(s), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_patch_stream_finish(s), PULSE_ERR_ARG, "finish once");
  pulse_patch_stream_figures t = pulse_patch_stream_figures_get(s);
  cr_assert_gt(t.decode_seconds, 0.0);
  cr_assert_geq(t.decode_wall_seconds, 0.0);
  cr_assert_geq(t.tail_seconds, 0.0);
  cr_assert_leq(t.tail_seconds, t.decode_wall_seconds + 1e-9);
  for (size_t i = 0; i < n; i++) /* nothing written before commit */
    cr_assert_eq(pt_first_diff(h[i].data, ts[i].base, ts[i].numel), PT_NONE);
  pulse_patch_stream_commit(s);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(pt_first_diff(h[i].data, ts[i].target, ts[i].numel), PT_NONE);
  pulse_patch_stream_free(s);
  pulse_patch_stream_free(NULL);
  pt_hosts_free(h, n);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, n);
}

Test(patch_stream, need_reads_the_table_size_and_rejects_non_patches) {
  pt_tensor ts[5];
  size_t n = make_tensors(ts, 0.01, 4);
  pulse_encode_opts o = pt_opts(PULSE_POS_PLAIN, 10, 1);
  pulse_buffer buf = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
  pt_raw_patch raw;
  cr_assert(pt_raw_parse(buf.data, buf.size, &raw));
  size_t need = 0;
  for (size_t avail = 0; avail < PT_HEADER_SIZE; avail += 7) {
    cr_assert_eq(pulse_patch_stream_need(buf.data, avail, &need), PULSE_OK);
    cr_assert_eq(need, PT_HEADER_SIZE);
  }
  cr_assert_eq(pulse_patch_stream_need(buf.data, buf.size, &need), PULSE_OK);
  cr_assert_eq(need, PT_HEADER_SIZE + raw.table_size);
  /* The table alone is enough to open. */
  pulse_patch *p = NULL;
  uint8_t *partial = pt_alloc(buf.size);
  memcpy(partial, buf.data, need);
  cr_assert_eq(pulse_patch_open(partial, buf.size, &p), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_patch_free(p);
  free(partial);
  uint8_t bad[PT_HEADER_SIZE];
  memcpy(bad, buf.data, sizeof bad);
  bad[3] ^= 1;
  cr_assert_eq(pulse_patch_stream_need(bad, 4, &need), PULSE_ERR_MAGIC);
  cr_assert_eq(pulse_patch_stream_need(bad, 3, &need), PULSE_OK,
               "too short to tell");
  memcpy(bad, buf.data, sizeof bad);
  bad[PT_OFF_VERSION] = 9;
  cr_assert_eq(pulse_patch_stream_need(bad, sizeof bad, &need),
               PULSE_ERR_VERSION);
  cr_assert_eq(pulse_patch_stream_need(NULL, 0, NULL), PULSE_ERR_ARG);
  pt_raw_free(&raw);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, n);
}

/* Every byte flipped: the stream gives the status pulse_patch_apply gives,
 * and the targets end untouched or exactly at the targets. The step fields
 * (16..31) are not covered by anything inside a patch: the object's
 * SHA-256 is (the subscriber checks it before it commits). */
Test(patch_stream, flipped_byte_anywhere_is_rejected_as_stage_rejects_it) {
  for (int m = 0; m < CODINGS; m++) {
    pt_tensor ts[5];
    size_t n = make_tensors(ts, 0.01, 20);
    pulse_encode_opts o = pt_opts(models[m], 10, 1);
    o.format_version = versions[m];
    pulse_buffer buf = {NULL, 0};
    cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
    uint8_t *b = pt_alloc(buf.size);
    size_t rejected = 0, flips = 0;
    uint64_t r = 77;
    for (size_t at = 0; at < buf.size; at++) {
      if (at >= PT_OFF_STEP && at < PT_OFF_BASE_STATE)
        continue;
      /* Every header and table byte; a sample of the body. */
      if (at >= PT_HEADER_SIZE + 400 && pulse_rng_below(&r, 4) != 0)
        continue;
      memcpy(b, buf.data, buf.size);
      b[at] ^= (uint8_t)(at & 1 ? 0x01 : 0xFF);
      pulse_apply_opts ao;
      pulse_apply_opts_init(&ao);
      ao.threads = 1 + (int)(at % 3);
      pulse_host_tensor *ref = NULL, *got = NULL;
      pulse_status want = stage_patch(ts, n, b, buf.size, &ao, &ref);
      pulse_status st =
          stream_patch(ts, n, b, buf.size, buf.size, &ao, at, &got);
      cr_assert_eq(st, want, "%s: byte %zu: stream %s, stage %s",
                   model_names[m], at, pulse_status_name(st),
                   pulse_status_name(want));
      for (size_t i = 0; i < n; i++) {
        const uint16_t *expect = st == PULSE_OK ? ts[i].target : ts[i].base;
        cr_assert_eq(pt_first_diff(got[i].data, expect, ts[i].numel), PT_NONE,
                     "%s: byte %zu: %s but '%s' is not its %s", model_names[m],
                     at, pulse_status_name(st), ts[i].name,
                     st == PULSE_OK ? "target" : "base");
      }
      flips++;
      rejected += st != PULSE_OK;
      pt_hosts_free(ref, n);
      pt_hosts_free(got, n);
    }
    /* Only slack in the last bytes of a chunk stream can go unnoticed
     * (and then decodes to the same result). */
    cr_assert_gt(rejected, flips * 9 / 10, "%s: %zu of %zu flips rejected",
                 model_names[m], rejected, flips);
    free(b);
    pulse_buffer_free(&buf);
    pt_tensors_free(ts, n);
  }
}

Test(patch_stream, truncated_object_never_commits) {
  for (int m = 0; m < CODINGS; m++) {
    pt_tensor ts[5];
    size_t n = make_tensors(ts, 0.02, 30);
    pulse_encode_opts o = pt_opts(models[m], 10, 1);
    o.format_version = versions[m];
    pulse_buffer buf = {NULL, 0};
    cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
    static const size_t short_by[] = {1, 2, 5, 100, 1000};
    for (size_t k = 0; k < PT_COUNT_OF(short_by); k++) {
      size_t fed = buf.size - short_by[k];
      for (int threads = 1; threads <= 3; threads++) {
        pulse_apply_opts ao;
        pulse_apply_opts_init(&ao);
        ao.threads = threads;
        pulse_host_tensor *got = NULL;
        pulse_status st =
            stream_patch(ts, n, buf.data, buf.size, fed, &ao, k, &got);
        cr_assert_eq(st, PULSE_ERR_TRUNCATED, "%s: %zu bytes short: %s",
                     model_names[m], short_by[k], pulse_status_name(st));
        for (size_t i = 0; i < n; i++)
          cr_assert_eq(pt_first_diff(got[i].data, ts[i].base, ts[i].numel),
                       PT_NONE, "%s: '%s' untouched", model_names[m],
                       ts[i].name);
        pt_hosts_free(got, n);
      }
    }
    /* Shorter than the table: the patch cannot even be opened. */
    pulse_host_tensor *got = NULL;
    pulse_apply_opts ao;
    pulse_apply_opts_init(&ao);
    cr_assert_eq(stream_patch(ts, n, buf.data, buf.size, 50, &ao, 1, &got),
                 PULSE_ERR_TRUNCATED);
    pt_hosts_free(got, n);
    pulse_buffer_free(&buf);
    pt_tensors_free(ts, n);
  }
}

Test(patch_stream, wrong_base_or_targets_fail_at_begin) {
  pt_tensor ts[5];
  size_t n = make_tensors(ts, 0.02, 40);
  pulse_encode_opts o = pt_opts(PULSE_POS_CLASS, 10, 1);
  pulse_buffer buf = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, n, &buf), PULSE_OK);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(buf.data, buf.size, &p), PULSE_OK);
  pulse_host_tensor *h = pt_hosts(ts, n);
  pulse_patch_stream *s = (pulse_patch_stream *)&s;
  h[1].data[3] ^= 1;
  cr_assert_eq(pulse_patch_stream_begin(p, h, n, NULL, &s),
               PULSE_ERR_BASE_DIGEST);
  cr_assert_null(s);
  h[1].data[3] ^= 1;
  cr_assert_eq(pulse_patch_stream_begin(p, h, n - 1, NULL, &s),
               PULSE_ERR_NOT_FOUND);
  h[0].numel--;
  cr_assert_eq(pulse_patch_stream_begin(p, h, n, NULL, &s),
               PULSE_ERR_SIZE_MISMATCH);
  h[0].numel++;
  pulse_apply_opts old;
  pulse_apply_opts_init(&old);
  old.struct_version = 99;
  cr_assert_eq(pulse_patch_stream_begin(p, h, n, &old, &s), PULSE_ERR_VERSION);
  cr_assert_eq(pulse_patch_stream_begin(NULL, h, n, NULL, &s), PULSE_ERR_ARG);
  /* Freed before any byte of the body arrived: the threads leave. */
  cr_assert_eq(pulse_patch_stream_begin(p, h, n, NULL, &s), PULSE_OK);
  pulse_patch_stream_feed(s, 200);
  pulse_patch_stream_free(s);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(pt_first_diff(h[i].data, ts[i].base, ts[i].numel), PT_NONE);
  pt_hosts_free(h, n);
  pulse_patch_free(p);
  pulse_buffer_free(&buf);
  pt_tensors_free(ts, n);
}
