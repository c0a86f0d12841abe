/* make_patch_corpus.c - writes the seed corpus of fuzz_patch (small valid
 * patches against the fuzzer's deterministic base) and the must-reject
 * patches of tests/codec/reject/patch (named STATUS--what.bin; each fails
 * to open, or fails to apply to an all-zero base, with that status).
 *
 * Not built by CMake; from the repository root, after building the codec:
 *   cc -std=c11 -D_GNU_SOURCE -I codec -I tests/codec \
 *      tests/fuzz/make_patch_corpus.c build/codec/libpulse_codec.a \
 *      -lcrypto -lzstd -lm -lpthread -o /tmp/make_patch_corpus
 *   /tmp/make_patch_corpus tests/fuzz/corpus/patch tests/codec/reject/patch
 */
#include "patch_testutil.h"

static const char *seed_dir, *reject_dir;
static unsigned format_version; /* of the patches written; 0: the default */

static void write_file(const char *dir, const char *name, const uint8_t *data,
                       size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *fp = fopen(path, "wb");
  if (fp == NULL || (size && fwrite(data, 1, size, fp) != size) ||
      fclose(fp) != 0) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(1);
  }
  printf("%6zu %s\n", size, path);
}

/* ------------------------------------------------------------ seeds */

/* A tensor over the fuzzer's base with changes at `density`. */
static void fuzz_tensor(pt_tensor *t, size_t index, const char *name,
                        uint32_t ndim, const uint64_t *shape, double density,
                        int edges, uint64_t seed) {
  pt_tensor_shape(t, name, ndim, shape);
  t->base = pt_alloc((size_t)t->numel * 2);
  for (uint64_t i = 0; i < t->numel; i++)
    t->base[i] = pt_fuzz_base_bits(index, i);
  uint64_t s = seed;
  pt_make_changes(t->base, t->numel, density, edges, &s, &t->changes);
  t->target = pt_copy(t->base, t->numel);
  pt_apply_changes(t->target, &t->changes);
}

static void seed_chunks(const char *name, pulse_pos_model model, pt_tensor *ts, size_t n,
                        uint32_t chunk_log2) {
  pulse_encode_opts o = pt_opts(model, chunk_log2, 1);
  o.format_version = format_version;
  pulse_buffer b = {NULL, 0};
  if (pt_encode(&o, ts, n, &b) != PULSE_OK) {
    fprintf(stderr, "%s: %s\n", name, pulse_error_detail());
    exit(1);
  }
  write_file(seed_dir, name, b.data, b.size);
  pulse_buffer_free(&b);
  pt_tensors_free(ts, n);
}

static void seed(const char *name, pulse_pos_model model, pt_tensor *ts, size_t n) {
  seed_chunks(name, model, ts, n, 10);
}

static void write_seeds(void) {
  for (int m = 0; m < 6; m++) {
    pulse_pos_model model = m % 2 ? PULSE_POS_CLASS : PULSE_POS_PLAIN;
    static const char *const tags[] = {"plain",    "class",    "v1-plain",
                                       "v1-class", "v3-plain", "v3-class"};
    static const unsigned versions[] = {0, 0, 1, 1, 3, 3};
    const char *tag = tags[m];
    format_version = versions[m];
    char name[64];
    pt_tensor ts[3];
    uint64_t w = 1500, b[2] = {2, 3}, e = 0;
    fuzz_tensor(&ts[0], 0, "w", 1, &w, 0.05, 0, 1);
    fuzz_tensor(&ts[1], 1, "b", 2, b, 1.0, 1, 2);
    fuzz_tensor(&ts[2], 2, "e", 1, &e, 0.0, 0, 3);
    snprintf(name, sizeof name, "seed-%s-three-tensors.bin", tag);
    seed(name, model, ts, 3);

    uint64_t big = 2049;
    fuzz_tensor(&ts[0], 0, "dense", 1, &big, 0.5, 0, 4 + (uint64_t)m);
    snprintf(name, sizeof name, "seed-%s-dense.bin", tag);
    seed(name, model, ts, 1);

    uint64_t sparse = 4096;
    fuzz_tensor(&ts[0], 0, "sparse", 1, &sparse, 0.004, 1, 6 + (uint64_t)m);
    snprintf(name, sizeof name, "seed-%s-sparse.bin", tag);
    seed(name, model, ts, 1);

    uint64_t x[2] = {10, 30};
    fuzz_tensor(&ts[0], 0, "x", 2, x, 0.3, 1, 8);
    fuzz_tensor(&ts[1], 1, "scalar", 0, NULL, 1.0, 1, 9);
    snprintf(name, sizeof name, "seed-%s-edges.bin", tag);
    seed(name, model, ts, 2);

    /* Chunks of whole class-index blocks (4096): applied through an index. */
    uint64_t blocks = 9000;
    fuzz_tensor(&ts[0], 0, "blocks", 1, &blocks, 0.02, 1, 10 + (uint64_t)m);
    snprintf(name, sizeof name, "seed-%s-index-blocks.bin", tag);
    seed_chunks(name, model, ts, 1, 12);
  }
  format_version = 0;
  seed("seed-empty-table.bin", PULSE_POS_CLASS, NULL, 0);
}

/* ---------------------------------------------------------- rejects */

/* A valid patch from an all-zero base: "w" (1500), "v" (3x5), "z" (4, no
 * changes). */
static pulse_buffer zero_base_patch(pulse_pos_model model, int nonzero_base) {
  pt_tensor ts[3];
  uint64_t w = 1500, v[2] = {3, 5}, z = 4;
  pt_tensor_shape(&ts[0], "w", 1, &w);
  pt_tensor_shape(&ts[1], "v", 2, v);
  pt_tensor_shape(&ts[2], "z", 1, &z);
  uint64_t s = 77;
  for (int i = 0; i < 3; i++) {
    ts[i].base = pt_alloc((size_t)ts[i].numel * 2);
    if (nonzero_base)
      ts[i].base[0] = 0x3F80;
    if (i < 2)
      pt_make_changes(ts[i].base, ts[i].numel, 0.02 + 0.3 * i, 1, &s,
                      &ts[i].changes);
    ts[i].target = pt_copy(ts[i].base, ts[i].numel);
    pt_apply_changes(ts[i].target, &ts[i].changes);
  }
  pulse_encode_opts o = pt_opts(model, 10, 1);
  o.format_version = format_version;
  pulse_buffer b = {NULL, 0};
  if (pt_encode(&o, ts, 3, &b) != PULSE_OK)
    exit(1);
  pt_tensors_free(ts, 3);
  return b;
}

static pt_raw_patch raw_of(pulse_pos_model model) {
  pulse_buffer b = zero_base_patch(model, 0);
  pt_raw_patch r;
  if (!pt_raw_parse(b.data, b.size, &r))
    exit(1);
  pulse_buffer_free(&b);
  return r;
}

static void reject_raw(const char *name, pt_raw_patch *r, int fix) {
  if (fix)
    pt_raw_fix_sizes(r);
  pulse_buffer b = pt_raw_write(r);
  write_file(reject_dir, name, b.data, b.size);
  free(b.data);
  pt_raw_free(r);
}

/* The valid zero-base patch with one header field overwritten. */
static void reject_header(const char *name, size_t off, uint64_t value,
                          int width) {
  pulse_buffer b = zero_base_patch(PULSE_POS_PLAIN, 0);
  pt_put_le(b.data, off, value, width);
  write_file(reject_dir, name, b.data, b.size);
  pulse_buffer_free(&b);
}

static void write_rejects(void) {
  pulse_buffer b = zero_base_patch(PULSE_POS_CLASS, 0);
  write_file(reject_dir, "PULSE_ERR_TRUNCATED--empty.bin", b.data, 0);
  write_file(reject_dir, "PULSE_ERR_TRUNCATED--half-header.bin", b.data, 60);
  write_file(reject_dir, "PULSE_ERR_TRUNCATED--last-body-byte-missing.bin",
             b.data, b.size - 1);
  uint8_t *longer = pt_alloc(b.size + 1);
  memcpy(longer, b.data, b.size);
  write_file(reject_dir, "PULSE_ERR_TRAILING--byte-after-body.bin", longer,
             b.size + 1);
  free(longer);
  pulse_buffer_free(&b);
  b = zero_base_patch(PULSE_POS_PLAIN, 1);
  write_file(reject_dir, "PULSE_ERR_BASE_DIGEST--base-is-not-zero.bin", b.data,
             b.size);
  pulse_buffer_free(&b);

  reject_header("PULSE_ERR_MAGIC--bad-magic.bin", 0, 0x50554C5345504348ull, 8);
  reject_header("PULSE_ERR_VERSION--version-4.bin", PT_OFF_VERSION, 4, 2);
  reject_header("PULSE_ERR_VERSION--position-model-2.bin", PT_OFF_MODEL, 2, 1);
  reject_header("PULSE_ERR_CORRUPT--chunk-log2-9.bin", PT_OFF_CHUNK_LOG2, 9, 1);
  reject_header("PULSE_ERR_CORRUPT--chunk-log2-31.bin", PT_OFF_CHUNK_LOG2, 31,
                1);
  reject_header("PULSE_ERR_TRUNCATED--tensor-count-2-pow-40.bin", PT_OFF_COUNT,
                1ull << 40, 8);
  reject_header("PULSE_ERR_OVERFLOW--tensor-count-u64-max.bin", PT_OFF_COUNT,
                UINT64_MAX, 8);
  reject_header("PULSE_ERR_CORRUPT--total-changed-wrong.bin",
                PT_OFF_TOTAL_CHANGED, 1, 8);
  reject_header("PULSE_ERR_BASE_DIGEST--base-state-digest-wrong.bin",
                PT_OFF_BASE_STATE, 0x1234, 2);
  reject_header("PULSE_ERR_TARGET_DIGEST--target-state-digest-wrong.bin",
                PT_OFF_TARGET_STATE, 0x1234, 2);

  pt_raw_patch r = raw_of(PULSE_POS_PLAIN);
  r.tensors[1].name[0] = 'w';
  reject_raw("PULSE_ERR_DUPLICATE--name-twice.bin", &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.tensors[1].name[1] = 0, r.tensors[1].name_len = 2;
  reject_raw("PULSE_ERR_CORRUPT--name-with-nul.bin", &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.tensors[1].dtype = PULSE_DTYPE_F32;
  reject_raw("PULSE_ERR_DTYPE--dtype-f32.bin", &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.tensors[2].ndim = 9;
  for (int d = 0; d < 9; d++)
    r.tensors[2].dims[d] = d ? 1 : 4;
  reject_raw("PULSE_ERR_CORRUPT--nine-dimensions.bin", &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.tensors[2].ndim = 2,
  r.tensors[2].dims[0] = r.tensors[2].dims[1] = 1ull << 32;
  reject_raw("PULSE_ERR_OVERFLOW--dims-product-overflows.bin", &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.tensors[1].changed = 16; /* 15 elements */
  reject_raw("PULSE_ERR_OVERFLOW--changed-more-than-numel.bin", &r, 1);
  r = raw_of(PULSE_POS_CLASS);
  r.tensors[0].chunks[0].changed++;
  reject_raw("PULSE_ERR_CORRUPT--chunk-changes-sum-mismatch.bin", &r, 1);
  r = raw_of(PULSE_POS_CLASS);
  r.tensors[2].section_size = 1;
  r.body = realloc(r.body, ++r.body_len);
  r.body[r.body_len - 1] = 0;
  reject_raw("PULSE_ERR_CORRUPT--section-without-changes.bin", &r, 1);

  /* Open, but the body does not decode or reach the target. */
  r = raw_of(PULSE_POS_CLASS);
  r.tensors[0].digest[2] ^= 1;
  reject_raw("PULSE_ERR_TARGET_DIGEST--tensor-target-digest-wrong.bin", &r, 1);
  format_version = 1;
  r = raw_of(PULSE_POS_PLAIN);
  r.body[0] = 1; /* a range-coder stream starts with 0 */
  reject_raw("PULSE_ERR_CORRUPT--v1-stream-first-byte-not-zero.bin", &r, 1);
  format_version = 0;
  r = raw_of(PULSE_POS_PLAIN);
  {
    /* The last byte of the last stream of "v" with its top (padding) bit
     * set: "v" is plain, 15 elements, so its few changes never fill a
     * whole byte to the top. */
    r.body[r.body_len - 1] |= 0x80;
  }
  reject_raw("PULSE_ERR_CORRUPT--v2-padding-bit-set.bin", &r, 1);
  r = raw_of(PULSE_POS_CLASS);
  {
    /* One zero byte appended to the first stream of "w". */
    pt_raw_chunk *c = &r.tensors[0].chunks[0];
    uint8_t *body = pt_alloc(r.body_len + 1);
    memcpy(body, r.body, (size_t)c->bytes);
    memcpy(body + c->bytes + 1, r.body + c->bytes, r.body_len - c->bytes);
    free(r.body);
    r.body = body, r.body_len++;
    c->bytes++, r.tensors[0].section_size++;
  }
  reject_raw("PULSE_ERR_CORRUPT--stream-longer-than-its-content.bin", &r, 1);

  /* Version 3: the value model that closes the table. */
  format_version = 3;
  r = raw_of(PULSE_POS_CLASS);
  r.values_len = 0;
  reject_raw("PULSE_ERR_CORRUPT--v3-value-model-missing.bin", &r, 1);
  r = raw_of(PULSE_POS_CLASS);
  r.values_len--; /* its last byte holds at least one bit of the model */
  reject_raw("PULSE_ERR_CORRUPT--v3-value-model-cut-short.bin", &r, 1);
  r = raw_of(PULSE_POS_CLASS);
  r.values[0] = 0x00, r.values_len = 1; /* a valid model of no class */
  reject_raw("PULSE_ERR_CORRUPT--v3-value-model-without-the-chunks-class.bin",
             &r, 1);
  r = raw_of(PULSE_POS_PLAIN);
  r.values[r.values_len - 1] |=
      0x80; /* a padding bit (the model ends short of it) */
  reject_raw("PULSE_ERR_CORRUPT--v3-value-model-padding-bit-set.bin", &r, 1);
  format_version = 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SEED_DIR REJECT_DIR\n", argv[0]);
    return 2;
  }
  seed_dir = argv[1];
  reject_dir = argv[2];
  write_seeds();
  write_rejects();
  return 0;
}
