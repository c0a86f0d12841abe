/* test_patch_hostile.c - pulse_patch_open, decode_tensor and apply on
 * hostile bytes: every header field and table field edited to a bad value
 * gives its own status; flipped, truncated and random bytes never crash,
 * never write a target and never succeed with a wrong result; the folder
 * tests/codec/reject/patch holds inputs that must be rejected.
 *
 * Patches are made by the encoder, parsed by the hand-written reader of
 * patch_testutil.h, edited, and written back. */
#include "patch_testutil.h"
#include "pulse_codec_stream.h"

#include <criterion/criterion.h>
#include <dirent.h>

/* Every hostile case runs over both position models in both format
 * versions. */
enum {
  CODING_PLAIN = 0,
  CODING_CLASS = 1,
  CODINGS = 6
}; /* the first two: default version */
static const pulse_pos_model models[CODINGS] = {
    PULSE_POS_PLAIN, PULSE_POS_CLASS, PULSE_POS_PLAIN,
    PULSE_POS_CLASS, PULSE_POS_PLAIN, PULSE_POS_CLASS};
static const unsigned versions[CODINGS] = {
    PULSE_PATCH_VERSION, PULSE_PATCH_VERSION, 1, 1, 3, 3};
static const char *const model_names[CODINGS] = {
    "plain", "class", "plain v1", "class v1", "plain v3", "class v3"};

/* A small valid patch: "w" (3000 elements, 3 chunks of 2^10), "v" (7) and
 * "z" (no changes). */
typedef struct {
  pt_tensor ts[3];
  pulse_buffer buf;
  pt_raw_patch raw;
} hostile_fixture;

static void fixture_make(hostile_fixture *f, int coding, uint64_t seed) {
  pt_tensor_make1(&f->ts[0], "w", 3000, PT_WEIGHTS_NORMAL, 0.02, 1, seed);
  pt_tensor_make1(&f->ts[1], "v", 7, PT_WEIGHTS_EDGE, 0.6, 1, seed + 1);
  pt_tensor_make1(&f->ts[2], "z", 40, PT_WEIGHTS_NORMAL, 0.0, 0, seed + 2);
  pulse_encode_opts o = pt_opts(models[coding], 10, 1);
  o.format_version = versions[coding];
  cr_assert_eq(pt_encode(&o, f->ts, 3, &f->buf), PULSE_OK);
  cr_assert(pt_raw_parse(f->buf.data, f->buf.size, &f->raw),
            "the hand-written reader parses the encoder's output");
}

static void fixture_free(hostile_fixture *f) {
  pt_raw_free(&f->raw);
  pulse_buffer_free(&f->buf);
  pt_tensors_free(f->ts, 3);
}

static pulse_status open_status(const uint8_t *bytes, size_t size) {
  pulse_patch *p = (pulse_patch *)&p; /* must be reset to NULL on failure */
  pulse_status st = pulse_patch_open(bytes, size, &p);
  if (st != PULSE_OK)
    cr_assert_null(p, "failed open leaves *out NULL");
  pulse_patch_free(st == PULSE_OK ? p : NULL);
  return st;
}

static pulse_status open_raw(const pt_raw_patch *raw) {
  pulse_buffer b = pt_raw_write(raw);
  pulse_status st = open_status(b.data, b.size);
  free(b.data);
  return st;
}

/* Opens bytes and, when that works, decodes every tensor and applies the
 * patch to copies of the fixture's bases. The targets must end either
 * untouched (failure) or exactly at the fixture's targets (success). Returns
 * the first failing status, or PULSE_OK. */
static pulse_status try_patch(const pt_tensor *ts, size_t n,
                              const uint8_t *bytes, size_t size, int partial,
                              int threads) {
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(bytes, size, &p);
  if (st != PULSE_OK)
    return st;
  for (size_t i = 0; i < pulse_patch_tensor_count(p) && i < n; i++) {
    pulse_changes got = PULSE_CHANGES_INIT;
    pulse_patch_tensor e;
    cr_assert_eq(pulse_patch_tensor_get(p, i, &e), PULSE_OK);
    if (e.numel == ts[i].numel &&
        pulse_patch_decode_tensor(p, i, ts[i].base, ts[i].numel, &got) ==
            PULSE_OK) {
      cr_assert_eq(got.count, e.changed);
      for (uint64_t j = 0; j < got.count; j++) {
        cr_assert_lt(got.pos[j], e.numel, "decoded position in range");
        cr_assert(j == 0 || got.pos[j] > got.pos[j - 1], "increasing");
        cr_assert_eq(got.old_bits[j], ts[i].base[got.pos[j]]);
        cr_assert_neq(got.old_bits[j], got.new_bits[j]);
      }
    }
    pulse_changes_free(&got);
  }
  pulse_host_tensor *h = pt_hosts(ts, n);
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.partial_table = partial;
  ao.threads = threads;
  st = pulse_patch_apply(p, h, n, &ao);
  for (size_t i = 0; i < n; i++) {
    /* A shard holder's target that the patch does not name (an edited
     * name) is left alone even when apply succeeds. */
    size_t idx;
    int named = pulse_patch_tensor_find(p, ts[i].name, &idx) == PULSE_OK;
    int reached = st == PULSE_OK && named;
    const uint16_t *want = reached ? ts[i].target : ts[i].base;
    uint64_t bad = pt_first_diff(want, h[i].data, ts[i].numel);
    cr_assert_eq(bad, PT_NONE,
                 "apply %s but tensor '%s' differs from its %s at %llu",
                 pulse_status_name(st), ts[i].name, reached ? "target" : "base",
                 (unsigned long long)bad);
  }
  pt_hosts_free(h, n);
  pulse_patch_free(p);
  return st;
}

static pulse_status try_raw(const hostile_fixture *f, const pt_raw_patch *raw) {
  pulse_buffer b = pt_raw_write(raw);
  pulse_status st = try_patch(f->ts, 3, b.data, b.size, 0, 1);
  free(b.data);
  return st;
}

/* ---------------------------------------------------- the hand-written view */

Test(patch, layout_matches_the_format_text) {
  for (int m = 0; m < CODINGS; m++) {
    hostile_fixture f;
    fixture_make(&f, m, 1);
    const pt_raw_patch *r = &f.raw;
    cr_assert_arr_eq(r->magic, "PULSEPCH", 8);
    cr_assert_eq(r->version, versions[m]);
    cr_assert_eq(r->model, (uint8_t)models[m]);
    cr_assert_eq(r->chunk_log2, 10);
    cr_assert_eq(r->step, 8);
    cr_assert_eq(r->base_step, 7);
    cr_assert_eq(r->count, 3);
    cr_assert_eq(r->body_size, f.buf.size - PT_HEADER_SIZE - r->table_size);
    cr_assert_eq(r->tensors[0].name_len, 1);
    cr_assert_eq(r->tensors[0].name[0], 'w');
    cr_assert_eq(r->tensors[0].dtype, PULSE_DTYPE_BF16);
    cr_assert_eq(r->tensors[0].dims[0], 3000);
    cr_assert_eq(r->tensors[0].chunk_count, 3);
    cr_assert_eq(r->tensors[2].changed, 0);
    cr_assert_eq(r->tensors[2].chunk_count, 0, "no chunk entries");
    uint64_t sum = 0;
    for (size_t i = 0; i < 3; i++) {
      sum += r->tensors[i].changed;
      pulse_tensor_digest d = pulse_digest_bf16(f.ts[i].base, f.ts[i].numel);
      cr_assert(r->tensors[i].digest[0] == d.a &&
                r->tensors[i].digest[1] == d.b);
    }
    cr_assert_eq(r->total_changed, sum);
    pulse_buffer again = pt_raw_write(r);
    cr_assert_eq(again.size, f.buf.size);
    cr_assert_arr_eq(again.data, f.buf.data, f.buf.size, "rewritten bytes");
    free(again.data);
    fixture_free(&f);
  }
}

/* ----------------------------------------------------------- the header */

Test(patch, short_buffers_are_truncated) {
  hostile_fixture f;
  fixture_make(&f, CODING_CLASS, 2);
  uint8_t one = 'P';
  cr_assert_eq(open_status(NULL, 0), PULSE_ERR_TRUNCATED);
  cr_assert_eq(open_status(&one, 0), PULSE_ERR_TRUNCATED);
  for (size_t len = 1; len < PT_HEADER_SIZE; len++)
    cr_assert_eq(open_status(f.buf.data, len), PULSE_ERR_TRUNCATED, "%zu bytes",
                 len);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(NULL, 5, &p), PULSE_ERR_ARG);
  cr_assert_eq(pulse_patch_open(f.buf.data, f.buf.size, NULL), PULSE_ERR_ARG);
  fixture_free(&f);
}

Test(patch, every_truncation_fails_cleanly) {
  for (int m = 0; m < CODINGS; m++) {
    hostile_fixture f;
    fixture_make(&f, m, 3);
    for (size_t len = 0; len < f.buf.size; len++) {
      uint8_t *copy = pt_alloc(len);
      memcpy(copy, f.buf.data, len); /* exact-size copy: ASan sees overreads */
      cr_assert_eq(open_status(copy, len), PULSE_ERR_TRUNCATED,
                   "%s: %zu of %zu bytes", model_names[m], len, f.buf.size);
      free(copy);
    }
    fixture_free(&f);
  }
}

Test(patch, header_fields_out_of_range) {
  hostile_fixture f;
  fixture_make(&f, CODING_CLASS, 4);
  uint8_t *b = pt_alloc(f.buf.size + 1);
  const size_t n = f.buf.size;
  const uint32_t table = f.raw.table_size;
  const uint64_t body = f.raw.body_size;
#define EDIT(off, value, width, want)                                          \
  do {                                                                         \
    memcpy(b, f.buf.data, n);                                                  \
    pt_put_le(b, off, value, width);                                           \
    cr_assert_eq(open_status(b, n), want, "%s = %llu", #off,                   \
                 (unsigned long long)(value));                                 \
  } while (0)
  for (size_t k = 0; k < 8; k++)
    EDIT(k, f.buf.data[k] ^ 0x20u, 1, PULSE_ERR_MAGIC);
  EDIT(PT_OFF_VERSION, 0, 2, PULSE_ERR_VERSION);
  EDIT(PT_OFF_VERSION, PULSE_PATCH_VERSION_MAX + 1, 2, PULSE_ERR_VERSION);
  EDIT(PT_OFF_VERSION, 0x100, 2, PULSE_ERR_VERSION);
  EDIT(PT_OFF_VERSION, 0xFFFF, 2, PULSE_ERR_VERSION);
  EDIT(PT_OFF_MODEL, 2, 1, PULSE_ERR_VERSION);
  EDIT(PT_OFF_MODEL, 0xFF, 1, PULSE_ERR_VERSION);
  EDIT(PT_OFF_CHUNK_LOG2, 0, 1, PULSE_ERR_CORRUPT);
  EDIT(PT_OFF_CHUNK_LOG2, 9, 1, PULSE_ERR_CORRUPT);
  EDIT(PT_OFF_CHUNK_LOG2, 31, 1, PULSE_ERR_CORRUPT);
  EDIT(PT_OFF_CHUNK_LOG2, 0xFF, 1, PULSE_ERR_CORRUPT);
  EDIT(PT_OFF_TABLE_SIZE, table + 1u, 4, PULSE_ERR_TRUNCATED);
  EDIT(PT_OFF_TABLE_SIZE, table - 1u, 4, PULSE_ERR_TRAILING);
  EDIT(PT_OFF_TABLE_SIZE, 0xFFFFFFFFu, 4, PULSE_ERR_TRUNCATED);
  EDIT(PT_OFF_BODY_SIZE, body + 1u, 8, PULSE_ERR_TRUNCATED);
  EDIT(PT_OFF_BODY_SIZE, body - 1u, 8, PULSE_ERR_TRAILING);
  EDIT(PT_OFF_BODY_SIZE, 1ull << 63, 8, PULSE_ERR_TRUNCATED);
  EDIT(PT_OFF_COUNT, 4, 8, PULSE_ERR_TRUNCATED);
  EDIT(PT_OFF_COUNT, 0, 8, PULSE_ERR_TRAILING); /* the table is left over */
  EDIT(PT_OFF_COUNT, 2, 8, PULSE_ERR_TRAILING);
  EDIT(PT_OFF_TOTAL_CHANGED, f.raw.total_changed + 1, 8, PULSE_ERR_CORRUPT);
  EDIT(PT_OFF_TOTAL_CHANGED, f.raw.total_changed - 1, 8, PULSE_ERR_CORRUPT);
#undef EDIT
  /* One byte more or less than the header says. */
  memcpy(b, f.buf.data, n);
  b[n] = 0;
  cr_assert_eq(open_status(b, n + 1), PULSE_ERR_TRAILING);
  cr_assert_eq(open_status(b, n - 1), PULSE_ERR_TRUNCATED);
  free(b);
  fixture_free(&f);
}

/* table_size + body_size is computed in 64 bits: a body size near 2^64
 * wraps the sum below the buffer length, and the patch is reported as
 * having trailing bytes rather than as truncated. */
Test(patch, body_size_near_u64_max_is_truncated) {
  hostile_fixture f;
  fixture_make(&f, CODING_PLAIN, 5);
  uint8_t *b = pt_alloc(f.buf.size);
  static const uint64_t sizes[] = {UINT64_MAX, UINT64_MAX - 7, 1ull << 63};
  for (size_t k = 0; k < PT_COUNT_OF(sizes); k++) {
    memcpy(b, f.buf.data, f.buf.size);
    pt_put_le(b, PT_OFF_BODY_SIZE, sizes[k], 8);
    pulse_status st = open_status(b, f.buf.size);
    cr_expect_eq(st, PULSE_ERR_TRUNCATED,
                 "body_size 0x%016llx claims more bytes than follow: got %s",
                 (unsigned long long)sizes[k], pulse_status_name(st));
  }
  free(b);
  fixture_free(&f);
}

/* A huge tensor count is rejected before anything is allocated for it
 * (under ASan a huge calloc would abort the test). */
Test(patch, huge_tensor_count_is_rejected_without_allocating) {
  hostile_fixture f;
  fixture_make(&f, CODING_CLASS, 6);
  uint8_t *b = pt_alloc(f.buf.size);
  static const uint64_t counts[] = {1ull << 20,     1ull << 32, 1ull << 40,
                                    1ull << 56,     1ull << 57, 1ull << 62,
                                    UINT64_MAX / 2, UINT64_MAX};
  for (size_t k = 0; k < PT_COUNT_OF(counts); k++) {
    memcpy(b, f.buf.data, f.buf.size);
    pt_put_le(b, PT_OFF_COUNT, counts[k], 8);
    pulse_status st = open_status(b, f.buf.size);
    cr_assert(st == PULSE_ERR_TRUNCATED || st == PULSE_ERR_OVERFLOW,
              "count 0x%llx: %s", (unsigned long long)counts[k],
              pulse_status_name(st));
  }
  free(b);
  fixture_free(&f);
}

/* ------------------------------------------------------------ the table */

Test(patch, table_fields_out_of_range) {
  hostile_fixture f;
  fixture_make(&f, CODING_CLASS, 7);
  pt_raw_patch *r = &f.raw;
  pt_raw_tensor *w = &r->tensors[0], *v = &r->tensors[1], *z = &r->tensors[2];
  const pt_raw_tensor w0 = *w, v0 = *v, z0 = *z;
  cr_assert_eq(open_raw(r), PULSE_OK, "unedited");
#define CHECK(what, want)                                                      \
  do {                                                                         \
    pt_raw_fix_sizes(r);                                                       \
    pulse_status st_ = open_raw(r);                                            \
    cr_assert_eq(st_, want, "%s: got %s (%s)", what, pulse_status_name(st_),   \
                 pulse_error_detail());                                        \
    *w = w0, *v = v0, *z = z0;                                                 \
  } while (0)
  v->name[0] = 'w';
  CHECK("duplicate name", PULSE_ERR_DUPLICATE);
  z->name_len = 0;
  CHECK("empty name", PULSE_ERR_CORRUPT);
  v->name[1] = 0, v->name_len = 2;
  CHECK("NUL in name", PULSE_ERR_CORRUPT);
  memset(z->name, 'z', PULSE_MAX_NAME + 1), z->name_len = PULSE_MAX_NAME + 1;
  CHECK("1025-byte name", PULSE_ERR_CORRUPT);
  memset(z->name, 'z', PULSE_MAX_NAME), z->name_len = PULSE_MAX_NAME;
  CHECK("1024-byte name", PULSE_OK);
  static const uint8_t dtypes[] = {0, 2, 3, 4, 0xFF};
  for (size_t k = 0; k < PT_COUNT_OF(dtypes); k++) {
    v->dtype = dtypes[k];
    CHECK("dtype", PULSE_ERR_DTYPE);
  }
  z->ndim = PULSE_MAX_DIMS + 1;
  for (int d = 0; d < PULSE_MAX_DIMS + 1; d++)
    z->dims[d] = d ? 1 : 40;
  CHECK("9 dimensions", PULSE_ERR_CORRUPT);
  z->ndim = 2, z->dims[0] = 1ull << 32, z->dims[1] = 1ull << 32;
  CHECK("dims product 2^64", PULSE_ERR_OVERFLOW);
  z->ndim = 2, z->dims[0] = UINT64_MAX, z->dims[1] = 2;
  CHECK("dims product past 2^64", PULSE_ERR_OVERFLOW);
  v->changed = 8; /* 7 elements */
  CHECK("changed > numel", PULSE_ERR_OVERFLOW);
  z->section_size = 1;
  r->body_len++; /* a byte for it, so the count is the only fault */
  r->body = realloc(r->body, r->body_len);
  r->body[r->body_len - 1] = 0;
  CHECK("bytes without changes", PULSE_ERR_CORRUPT);
  CHECK("body longer than the sections", PULSE_ERR_CORRUPT);
  r->body_len--;
  v->section_size += 1;
  CHECK("section past the body", PULSE_ERR_OVERFLOW);
  w->section_size -= 1;
  CHECK("sections shorter than the body", PULSE_ERR_CORRUPT);
  r->extra_table = pt_alloc(1), r->extra_table_len = 1;
  CHECK("byte after the table", PULSE_ERR_TRAILING);
  r->extra_table_len = 0;
  CHECK("unedited again", PULSE_OK);
#undef CHECK
  fixture_free(&f);
}

Test(patch, chunk_entries_inconsistent_with_the_tensor) {
  for (int m = 0; m < CODINGS; m++) {
    hostile_fixture f;
    fixture_make(&f, m, 8);
    pt_raw_patch *r = &f.raw;
    pt_raw_tensor *w = &r->tensors[0];
    cr_assert_eq(w->chunk_count, 3);
    for (size_t c = 0; c < 3; c++)
      cr_assert_geq(w->chunks[c].changed, 2, "every chunk has changes");
    const pt_raw_tensor w0 = *w;
    const uint64_t total0 = r->total_changed;
    pt_raw_chunk saved[3];
    memcpy(saved, w->chunks, sizeof saved);
#define CHECK(what, want)                                                      \
  do {                                                                         \
    pt_raw_fix_sizes(r);                                                       \
    pulse_status st_ = open_raw(r);                                            \
    cr_assert_eq(st_, want, "%s: %s: got %s (%s)", model_names[m], what,       \
                 pulse_status_name(st_), pulse_error_detail());                \
    memcpy(w->chunks, saved, sizeof saved);                                    \
    *w = w0, r->total_changed = total0;                                        \
  } while (0)
    w->chunks[1].changed++;
    CHECK("chunk changes sum above the tensor's", PULSE_ERR_CORRUPT);
    w->chunks[1].changed--;
    CHECK("chunk changes sum below the tensor's", PULSE_ERR_CORRUPT);
    /* Version 3 sends no section size of several chunks (their bytes make
     * it): the next section then runs past the body. */
    w->chunks[1].bytes++;
    CHECK("chunk bytes sum above the section",
          versions[m] == 3 ? PULSE_ERR_OVERFLOW : PULSE_ERR_CORRUPT);
    w->chunks[1].bytes--;
    CHECK("chunk bytes sum below the section", PULSE_ERR_CORRUPT);
    /* The last chunk holds 3000 - 2048 = 952 elements. */
    uint64_t more = 953 - w->chunks[2].changed;
    w->chunks[2].changed += more, w->changed += more, r->total_changed += more;
    CHECK("more changes than elements in a chunk", PULSE_ERR_CORRUPT);
    w->chunks[0].bytes += w->chunks[1].bytes, w->chunks[1].bytes = 0;
    CHECK("changes without bytes in a chunk", PULSE_ERR_CORRUPT);
    w->chunks[0].changed += w->chunks[1].changed, w->chunks[1].changed = 0;
    CHECK("bytes without changes in a chunk", PULSE_ERR_CORRUPT);
    CHECK("unedited", PULSE_OK);
#undef CHECK
    /* Sums kept, split moved: it opens, but the streams no longer decode. */
    for (int variant = 0; variant < 4; variant++) {
      size_t from = (size_t)variant % 3, to = (from + 1) % 3;
      if (variant < 2)
        w->chunks[from].changed--, w->chunks[to].changed++;
      else
        w->chunks[from].bytes--, w->chunks[to].bytes++;
      pt_raw_fix_sizes(r);
      pulse_status st = try_raw(&f, r);
      cr_assert(st == PULSE_ERR_CORRUPT || st == PULSE_ERR_POSITION ||
                    st == PULSE_ERR_TARGET_DIGEST,
                "%s: moved %s from chunk %zu to %zu: %s", model_names[m],
                variant < 2 ? "a change" : "a byte", from, to,
                pulse_status_name(st));
      memcpy(w->chunks, saved, sizeof saved);
    }
    fixture_free(&f);
  }
}

/* Varints must be minimal and fit 64 bits. */
Test(patch, malformed_varints_are_rejected) {
  hostile_fixture f;
  fixture_make(&f, CODING_PLAIN, 9);
  const size_t at = PT_HEADER_SIZE; /* name_len of the first tensor: 0x01 */
  cr_assert_eq(f.buf.data[at], 1);
  for (int variant = 0; variant < 3; variant++) {
    /* 0x81 0x00 (non-minimal 1); eleven 0xFF bytes then 0x01 (too long);
     * 0x81, eight 0x80, 0x02 (1 plus bit 64: accepted only if bits past 64
     * were dropped). */
    size_t grow = variant == 0 ? 1 : variant == 1 ? 11 : 9;
    uint8_t *b = pt_alloc(f.buf.size + grow);
    memcpy(b, f.buf.data, at);
    if (variant == 0) {
      b[at] = 0x81, b[at + 1] = 0x00;
    } else if (variant == 1) {
      memset(b + at, 0xFF, grow);
      b[at + grow] = 0x01;
    } else {
      memset(b + at, 0x80, grow);
      b[at] = 0x81, b[at + grow] = 0x02;
    }
    memcpy(b + at + grow + 1, f.buf.data + at + 1, f.buf.size - at - 1);
    pt_put_le(b, PT_OFF_TABLE_SIZE, f.raw.table_size + grow, 4);
    pulse_status st = open_status(b, f.buf.size + grow);
    cr_assert_neq(st, PULSE_OK, "variant %d", variant);
    free(b);
  }
  fixture_free(&f);
}

/* ------------------------------------------------------------- the body */

/* Every byte of the whole patch (header, table, body) flipped three ways:
 * apply either fails with the targets untouched or reaches exactly the
 * intended targets (try_patch checks both). */
Test(patch, flipping_any_byte_never_yields_a_wrong_result) {
  for (int m = 0; m < CODINGS; m++) {
    hostile_fixture f;
    fixture_make(&f, m, 10);
    uint8_t *b = pt_alloc(f.buf.size);
    size_t ok = 0, failed = 0; /* body flips */
    static const uint8_t masks[] = {0x01, 0x80, 0xFF};
    for (size_t at = 0; at < f.buf.size; at++)
      for (size_t k = 0; k < PT_COUNT_OF(masks); k++) {
        memcpy(b, f.buf.data, f.buf.size);
        b[at] ^= masks[k];
        pulse_status st = try_patch(f.ts, 3, b, f.buf.size, (int)(at & 1),
                                    1 + (int)(k & 1) * 2);
        if (at < PT_HEADER_SIZE + f.raw.table_size)
          continue;
        if (st == PULSE_OK)
          ok++;
        else
          failed++;
        cr_assert(st == PULSE_OK || st == PULSE_ERR_CORRUPT ||
                      st == PULSE_ERR_POSITION || st == PULSE_ERR_TARGET_DIGEST,
                  "%s: body byte %zu ^ 0x%02X: %s", model_names[m], at,
                  masks[k], pulse_status_name(st));
      }
    /* A body flip can only succeed through slack in the last bytes of a
     * stream (and then with the right result): most must fail. */
    cr_assert_gt(failed, 20 * ok, "%s: %zu body flips applied, %zu failed",
                 model_names[m], ok, failed);
    free(b);
    fixture_free(&f);
  }
}

Test(patch, random_bodies_fail_without_writing) {
  for (int m = 0; m < CODINGS; m++) {
    hostile_fixture f;
    fixture_make(&f, m, 11);
    const size_t body_at = PT_HEADER_SIZE + f.raw.table_size;
    uint8_t *b = pt_alloc(f.buf.size);
    uint64_t s = 12345;
    for (int round = 0; round < 400; round++) {
      memcpy(b, f.buf.data, f.buf.size);
      for (size_t k = body_at; k < f.buf.size; k++)
        b[k] = (uint8_t)pulse_rng_next(&s);
      if (round & 1) { /* streams that pass the first-byte check */
        size_t at = body_at;
        for (size_t t = 0; t < 3; t++)
          for (size_t c = 0; c < f.raw.tensors[t].chunk_count; c++) {
            if (f.raw.tensors[t].chunks[c].bytes)
              b[at] = 0;
            at += f.raw.tensors[t].chunks[c].bytes;
          }
      }
      pulse_status st = try_patch(f.ts, 3, b, f.buf.size, round & 2, 3);
      cr_assert(st == PULSE_ERR_CORRUPT || st == PULSE_ERR_POSITION ||
                    st == PULSE_ERR_TARGET_DIGEST,
                "%s round %d: %s", model_names[m], round,
                pulse_status_name(st));
    }
    memset(b + body_at, 0, f.buf.size - body_at);
    cr_assert_neq(try_patch(f.ts, 3, b, f.buf.size, 0, 1), PULSE_OK, "zeros");
    free(b);
    fixture_free(&f);
  }
}

/* A chunk stream one byte short or long, the sizes adjusted to match: the
 * stream must be consumed exactly. */
Test(patch, chunk_stream_length_must_match_its_content) {
  for (int m = 0; m < CODINGS; m++)
    for (int longer = 0; longer < 2; longer++) {
      hostile_fixture f;
      fixture_make(&f, m, 12);
      size_t tested = 0, at = 0;
      for (size_t t = 0; t < 3; t++)
        for (size_t c = 0; c < f.raw.tensors[t].chunk_count; c++) {
          uint64_t len = f.raw.tensors[t].chunks[c].bytes;
          at += len;
          if (len == 0)
            continue;
          pt_raw_patch r = f.raw;
          pt_raw_tensor *tensors = pt_alloc(3 * sizeof *tensors);
          memcpy(tensors, f.raw.tensors, 3 * sizeof *tensors);
          pt_raw_chunk *chunks =
              pt_alloc(tensors[t].chunk_count * sizeof *chunks);
          memcpy(chunks, tensors[t].chunks,
                 tensors[t].chunk_count * sizeof *chunks);
          tensors[t].chunks = chunks;
          r.tensors = tensors;
          uint8_t *body = pt_alloc(f.raw.body_len + 1);
          /* Insert a zero byte at the stream's end, or drop its last. */
          size_t keep = longer ? at : at - 1;
          memcpy(body, f.raw.body, keep);
          if (longer)
            body[keep++] = 0;
          memcpy(body + keep, f.raw.body + at, f.raw.body_len - at);
          r.body = body;
          r.body_len = keep + f.raw.body_len - at;
          chunks[c].bytes = longer ? len + 1 : len - 1;
          tensors[t].section_size =
              f.raw.tensors[t].section_size + r.body_len - f.raw.body_len;
          if (chunks[c].bytes > 0) {
            pt_raw_fix_sizes(&r);
            pulse_status st = try_raw(&f, &r);
            cr_assert(st == PULSE_ERR_CORRUPT || st == PULSE_ERR_POSITION,
                      "%s tensor %zu chunk %zu %s: %s", model_names[m], t, c,
                      longer ? "+1 byte" : "-1 byte", pulse_status_name(st));
            tested++;
          }
          free(body), free(chunks), free(tensors);
        }
      cr_assert_geq(tested, 3);
      fixture_free(&f);
    }
}

/* -------------------------------------------------- the reject folder */

#ifndef PATCH_REJECT_DIR
#define PATCH_REJECT_DIR_FROM_FILE 1
#endif

static void reject_dir(char *out, size_t cap) {
#ifdef PATCH_REJECT_DIR_FROM_FILE
  const char *file = __FILE__;
  const char *slash = strrchr(file, '/');
  int dir_len = slash ? (int)(slash - file) : 1;
  snprintf(out, cap, "%.*s/reject/patch", dir_len, slash ? file : ".");
#else
  snprintf(out, cap, "%s", PATCH_REJECT_DIR);
#endif
}

static uint8_t *read_file(const char *path, size_t *size) {
  FILE *fp = fopen(path, "rb");
  cr_assert_not_null(fp, "open %s", path);
  fseek(fp, 0, SEEK_END);
  long len = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  uint8_t *data = pt_alloc((size_t)len);
  cr_assert_eq(fread(data, 1, (size_t)len, fp), (size_t)len, "read %s", path);
  fclose(fp);
  *size = (size_t)len;
  return data;
}

/* Each file is named STATUS--what.bin: opening it, or applying it to an
 * all-zero base of every tensor it names, fails with that status. */
Test(patch, reject_folder_inputs_fail_with_their_status) {
  char dir[1024];
  reject_dir(dir, sizeof dir);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "reject folder %s", dir);
  size_t files = 0;
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL) {
    const char *name = ent->d_name;
    size_t len = strlen(name);
    if (len < 5 || strcmp(name + len - 4, ".bin") != 0)
      continue;
    const char *sep = strstr(name, "--");
    cr_assert_not_null(sep, "%s: name is STATUS--what.bin", name);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t size;
    uint8_t *bytes = read_file(path, &size);
    pulse_patch *p = NULL;
    pulse_status st = pulse_patch_open(bytes, size, &p);
    if (st == PULSE_OK) {
      size_t n = pulse_patch_tensor_count(p);
      pulse_host_tensor *h = pt_alloc((n + 1) * sizeof *h);
      for (size_t i = 0; i < n; i++) {
        pulse_patch_tensor e;
        cr_assert_eq(pulse_patch_tensor_get(p, i, &e), PULSE_OK);
        cr_assert_leq(e.numel, 1u << 20, "%s: keep reject files small", name);
        h[i].name = e.info.name;
        h[i].numel = e.numel;
        h[i].data = pt_alloc((size_t)e.numel * 2);
      }
      st = pulse_patch_apply(p, h, n, NULL);
      for (size_t i = 0; i < n; i++) {
        for (uint64_t j = 0; j < h[i].numel; j++)
          cr_assert_eq(h[i].data[j], 0, "%s: target written", name);
        free(h[i].data);
      }
      free(h);
      pulse_patch_free(p);
    }
    cr_assert_neq(st, PULSE_OK, "%s was accepted", name);
    cr_assert(strncmp(name, pulse_status_name(st), (size_t)(sep - name)) == 0 &&
                  strlen(pulse_status_name(st)) == (size_t)(sep - name),
              "%s: got %s", name, pulse_status_name(st));
    free(bytes);
    files++;
  }
  closedir(d);
  cr_assert_geq(files, 15, "only %zu files in %s", files, dir);
}

/* The fuzzer's seeds are valid patches against its deterministic base, so
 * the fuzzer starts from inputs that reach the end of apply. */
Test(patch, fuzz_seeds_apply_to_the_fuzz_base) {
  char dir[1024];
  reject_dir(dir, sizeof dir);
  char *cut = strstr(dir, "/codec/reject/patch");
  cr_assert_not_null(cut);
  snprintf(cut, sizeof dir - (size_t)(cut - dir), "/fuzz/corpus/patch");
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "corpus folder %s", dir);
  size_t files = 0, models_seen[2] = {0, 0}, versions_seen[4] = {0, 0, 0, 0};
  struct dirent *ent;
  while ((ent = readdir(d)) != NULL) {
    if (strncmp(ent->d_name, "seed-", 5) != 0)
      continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
    size_t size;
    uint8_t *bytes = read_file(path, &size);
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(bytes, size, &p), PULSE_OK, "%s: %s",
                 ent->d_name, pulse_error_detail());
    /* Chunks of 2^10, or of 2^12 (whole class-index blocks) for the seeds
     * the fuzzer also applies through an index. */
    uint32_t want_log2 = strstr(ent->d_name, "index-blocks") != NULL ? 12 : 10;
    cr_assert_eq(pulse_patch_chunk_log2(p), want_log2, "%s", ent->d_name);
    models_seen[pulse_patch_pos_model(p) == PULSE_POS_CLASS]++;
    /* Stored bytes, written by the encoder of their day: older versions
     * must keep applying ("seed-v1-", "seed-v3-", the rest version 2). */
    unsigned want_version = strncmp(ent->d_name, "seed-v1-", 8) == 0   ? 1
                            : strncmp(ent->d_name, "seed-v3-", 8) == 0 ? 3
                                                                       : 2;
    cr_assert_eq(pulse_patch_format_version(p), want_version, "%s",
                 ent->d_name);
    versions_seen[want_version]++;
    size_t n = pulse_patch_tensor_count(p);
    pulse_host_tensor *h = pt_alloc((n + 1) * sizeof *h);
    for (size_t i = 0; i < n; i++) {
      pulse_patch_tensor e;
      cr_assert_eq(pulse_patch_tensor_get(p, i, &e), PULSE_OK);
      h[i].name = e.info.name;
      h[i].numel = e.numel;
      h[i].data = pt_alloc((size_t)e.numel * 2);
      for (uint64_t j = 0; j < e.numel; j++)
        h[i].data[j] = pt_fuzz_base_bits(i, j);
    }
    cr_assert_eq(pulse_patch_apply(p, h, n, NULL), PULSE_OK, "%s: %s",
                 ent->d_name, pulse_error_detail());
    for (size_t i = 0; i < n; i++)
      free(h[i].data);
    free(h);
    pulse_patch_free(p);
    free(bytes);
    files++;
  }
  closedir(d);
  cr_assert_geq(files, 5, "only %zu seeds in %s", files, dir);
  cr_assert(models_seen[0] > 0 && models_seen[1] > 0, "both models seeded");
  for (unsigned v = 1; v <= 3; v++)
    cr_assert_geq(versions_seen[v], 10, "version %u: %zu seeds", v,
                  versions_seen[v]);
}

/* A decoder announces what it reads, and a patch of a newer version says
 * so, on every way in (whole patch, the stream's header check). */
Test(patch, a_newer_format_version_is_refused_as_newer) {
  unsigned oldest = 0, newest = 0;
  pulse_patch_versions_supported(&oldest, &newest);
  cr_assert_eq(oldest, PULSE_PATCH_VERSION_MIN);
  cr_assert_eq(newest, PULSE_PATCH_VERSION_MAX);
  cr_assert_geq(newest, 3u);
  pulse_patch_versions_supported(NULL, NULL);
  hostile_fixture f;
  fixture_make(&f, CODING_CLASS, 12);
  char want[96];
  snprintf(want, sizeof want,
           "format version %u is newer than this decoder (%u..%u)", newest + 1,
           oldest, newest);
  pt_put_le(f.buf.data, PT_OFF_VERSION, newest + 1, 2);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(f.buf.data, f.buf.size, &p), PULSE_ERR_VERSION);
  cr_assert_null(p);
  cr_assert_not_null(strstr(pulse_error_detail(), want), "%s",
                     pulse_error_detail());
  size_t need = 0;
  cr_assert_eq(pulse_patch_stream_need(f.buf.data, f.buf.size, &need),
               PULSE_ERR_VERSION);
  cr_assert_not_null(strstr(pulse_error_detail(), want), "%s",
                     pulse_error_detail());
  fixture_free(&f);
}
