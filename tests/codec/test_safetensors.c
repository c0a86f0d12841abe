/* test_safetensors.c - safetensors reader, writer and sharded models. */
#include <criterion/criterion.h>

#include <dirent.h>
#include <ftw.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_safetensors.h"

/* ---------------------------------------------------------------- helpers */

/* A file from a raw header (not padded) and data_len bytes of data. */
static pulse_buffer raw_file(const char *header, size_t data_len) {
  size_t h = strlen(header);
  pulse_buffer b = {malloc(8 + h + data_len), 8 + h + data_len};
  cr_assert_not_null(b.data);
  for (int i = 0; i < 8; i++)
    b.data[i] = (uint8_t)((uint64_t)h >> (8 * i));
  memcpy(b.data + 8, header, h);
  for (size_t i = 0; i < data_len; i++)
    b.data[8 + h + i] = (uint8_t)i;
  return b;
}

/* Status of opening a raw file; the handle, if any, is closed. */
static pulse_status open_raw(const char *header, size_t data_len) {
  pulse_buffer b = raw_file(header, data_len);
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open_memory(b.data, b.size, &f);
  if (st != PULSE_OK)
    cr_assert_null(f);
  pulse_st_close(f);
  pulse_buffer_free(&b);
  return st;
}

#define assert_rejects(header, data_len, status)                               \
  do {                                                                         \
    pulse_status st_ = open_raw((header), (data_len));                         \
    cr_assert_eq(st_, (status), "expected %s, got %s (%s)",                    \
                 pulse_status_name(status), pulse_status_name(st_),            \
                 pulse_error_detail());                                        \
    cr_assert_neq(pulse_error_detail()[0], '\0');                              \
  } while (0)

static char *tmp_dir(void) {
  char *d = strdup("/tmp/pulse-st-test-XXXXXX");
  cr_assert_not_null(mkdtemp(d));
  return d;
}

static int rm_one(const char *path, const struct stat *sb, int flag,
                  struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void rm_rf(char *dir) {
  nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static char *join(const char *dir, const char *name) {
  char *p = malloc(strlen(dir) + strlen(name) + 2);
  sprintf(p, "%s/%s", dir, name);
  return p;
}

static size_t dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  size_t n = 0;
  const struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
      n++;
  closedir(d);
  return n;
}

static void write_bytes(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(data, 1, n, f), n);
  fclose(f);
}

static pulse_st_write_tensor wt(const char *name, pulse_dtype dtype,
                                uint32_t ndim, const uint64_t *shape,
                                const void *data) {
  pulse_st_write_tensor t = {name, dtype, ndim, {0}, data};
  for (uint32_t i = 0; i < ndim; i++)
    t.shape[i] = shape[i];
  return t;
}

static void assert_tensor(const pulse_st_tensor *got,
                          const pulse_st_write_tensor *want) {
  cr_assert_str_eq(got->name, want->name);
  cr_assert_eq(got->dtype, want->dtype);
  cr_assert_eq(got->ndim, want->ndim);
  uint64_t numel = 1;
  for (uint32_t d = 0; d < want->ndim; d++) {
    cr_assert_eq(got->shape[d], want->shape[d]);
    numel *= want->shape[d];
  }
  for (uint32_t d = want->ndim; d < PULSE_MAX_DIMS; d++)
    cr_assert_eq(got->shape[d], 0);
  cr_assert_eq(got->numel, numel);
  cr_assert_eq(got->nbytes, numel * pulse_dtype_size(want->dtype));
  if (got->nbytes > 0)
    cr_assert_eq(memcmp(got->data, want->data, got->nbytes), 0, "data of '%s'",
                 want->name);
  /* Written files keep every tensor aligned to its dtype. */
  cr_assert_eq((uintptr_t)got->data % pulse_dtype_size(got->dtype), 0);
}

/* The sample set: all dtypes, a scalar, zero-size tensors, unicode. */
static const float f32_data[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-30f, -0.0f};
static const uint16_t bf16_data[4] = {0x3f80, 0xbf80, 0x7f80, 0x0001};
static const uint16_t f16_data[3] = {0x3c00, 0xc000, 0x7bff};
static const float scalar_data[1] = {42.0f};

static size_t sample_tensors(pulse_st_write_tensor *t) {
  static const uint64_t s23[] = {2, 3}, s4[] = {4}, s13[] = {1, 3},
                        s05[] = {0, 5}, s0[] = {0};
  size_t n = 0;
  t[n++] = wt("model.layers.0.weight", PULSE_DTYPE_F32, 2, s23, f32_data);
  t[n++] = wt("empty.a", PULSE_DTYPE_BF16, 2, s05, NULL);
  t[n++] = wt("bias", PULSE_DTYPE_BF16, 1, s4, bf16_data);
  t[n++] = wt("scalar", PULSE_DTYPE_F32, 0, NULL, scalar_data);
  t[n++] = wt("caf\xc3\xa9 \"q\"\\\n", PULSE_DTYPE_F16, 2, s13, f16_data);
  t[n++] = wt("empty.b", PULSE_DTYPE_F16, 1, s0, NULL);
  return n;
}

static const pulse_st_kv sample_meta[] = {
    {"step", "17"}, {"format", "pt"}, {"quote\"d", "multi\nline \xe2\x82\xac"}};

static void assert_sample(const pulse_st_file *f) {
  pulse_st_write_tensor want[8];
  size_t n = sample_tensors(want);
  cr_assert_eq(pulse_st_tensor_count(f), n);
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor t;
    cr_assert_eq(pulse_st_tensor_get(f, i, &t), PULSE_OK);
    assert_tensor(&t, &want[i]);
    cr_assert_eq(pulse_st_tensor_find(f, want[i].name, &t), PULSE_OK);
    assert_tensor(&t, &want[i]);
  }
  pulse_st_tensor t;
  cr_assert_eq(pulse_st_tensor_get(f, n, &t), PULSE_ERR_ARG);
  cr_assert_eq(pulse_st_tensor_find(f, "nope", &t), PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_st_tensor_find(f, "__metadata__", &t),
               PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_st_metadata_count(f), 3);
  cr_assert_str_eq(pulse_st_metadata_get(f, "step"), "17");
  cr_assert_str_eq(pulse_st_metadata_get(f, "quote\"d"),
                   "multi\nline \xe2\x82\xac");
  cr_assert_null(pulse_st_metadata_get(f, "missing"));
  const char *k, *v;
  cr_assert_eq(pulse_st_metadata_at(f, 0, &k, &v), PULSE_OK);
  cr_assert_str_eq(k, "format"); /* ascending key order */
  cr_assert_str_eq(v, "pt");
  cr_assert_eq(pulse_st_metadata_at(f, 2, &k, &v), PULSE_OK);
  cr_assert_str_eq(k, "step");
  cr_assert_eq(pulse_st_metadata_at(f, 3, &k, &v), PULSE_ERR_ARG);
}

/* ------------------------------------------------------------ round trips */

Test(safetensors, serialize_round_trips_all_dtypes_scalars_and_empties) {
  pulse_st_write_tensor t[8];
  size_t n = sample_tensors(t);
  pulse_buffer buf = {0};
  cr_assert_eq(pulse_st_serialize(t, n, sample_meta, 3, &buf), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t hlen = 0;
  for (int i = 7; i >= 0; i--)
    hlen = hlen << 8 | buf.data[i];
  cr_assert_eq(hlen % 8, 0, "header padded to 8 bytes");
  cr_assert_eq(buf.data[8], '{');
  cr_assert_eq(buf.data[8 + hlen - 1] == ' ' || buf.data[8 + hlen - 1] == '}',
               1);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open_memory(buf.data, buf.size, &f), PULSE_OK, "%s",
               pulse_error_detail());
  assert_sample(f);
  pulse_st_close(f);
  pulse_buffer_free(&buf);
}

Test(safetensors, serialize_is_deterministic) {
  pulse_st_write_tensor t[8];
  size_t n = sample_tensors(t);
  pulse_buffer a = {0}, b = {0};
  cr_assert_eq(pulse_st_serialize(t, n, sample_meta, 3, &a), PULSE_OK);
  cr_assert_eq(pulse_st_serialize(t, n, sample_meta, 3, &b), PULSE_OK);
  cr_assert_eq(a.size, b.size);
  cr_assert_eq(memcmp(a.data, b.data, a.size), 0);
  pulse_buffer_free(&a);
  pulse_buffer_free(&b);
}

Test(safetensors, empty_file_round_trips) {
  pulse_buffer buf = {0};
  cr_assert_eq(pulse_st_serialize(NULL, 0, NULL, 0, &buf), PULSE_OK);
  cr_assert_eq(buf.size, 16);
  cr_assert_eq(memcmp(buf.data + 8, "{}      ", 8), 0);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open_memory(buf.data, buf.size, &f), PULSE_OK);
  cr_assert_eq(pulse_st_tensor_count(f), 0);
  cr_assert_eq(pulse_st_metadata_count(f), 0);
  pulse_st_tensor t;
  cr_assert_eq(pulse_st_tensor_find(f, "a", &t), PULSE_ERR_NOT_FOUND);
  pulse_st_close(f);
  pulse_buffer_free(&buf);
}

Test(safetensors, many_tensors_keep_order_and_are_found_by_name) {
  enum { N = 3000 };
  static uint16_t data[N][3];
  static char names[N][32];
  static pulse_st_write_tensor t[N];
  for (size_t i = 0; i < N; i++) {
    /* Names in an order unrelated to the storage order. */
    snprintf(names[i], sizeof names[i], "t%zu", (i * 7919) % N);
    for (int k = 0; k < 3; k++)
      data[i][k] = (uint16_t)(i * 3 + k);
    uint64_t shape[1] = {(i % 4 == 0) ? 0 : 3};
    t[i] = wt(names[i], PULSE_DTYPE_BF16, 1, shape, data[i]);
  }
  pulse_buffer buf = {0};
  cr_assert_eq(pulse_st_serialize(t, N, NULL, 0, &buf), PULSE_OK);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open_memory(buf.data, buf.size, &f), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_st_tensor_count(f), N);
  for (size_t i = 0; i < N; i++) {
    pulse_st_tensor got;
    cr_assert_eq(pulse_st_tensor_get(f, i, &got), PULSE_OK);
    assert_tensor(&got, &t[i]);
    cr_assert_eq(pulse_st_tensor_find(f, names[i], &got), PULSE_OK);
    cr_assert_str_eq(got.name, names[i]);
  }
  pulse_st_close(f);
  pulse_buffer_free(&buf);
}

Test(safetensors, written_file_is_readable_and_replaces_atomically) {
  char *dir = tmp_dir();
  char *path = join(dir, "model.safetensors");
  pulse_st_write_tensor t[8];
  size_t n = sample_tensors(t);
  cr_assert_eq(pulse_st_write(path, t, n, sample_meta, 3), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(dir_entries(dir), 1, "no temporary file left behind");
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open(path, &f), PULSE_OK, "%s", pulse_error_detail());
  assert_sample(f);

  /* Overwrite while the old file is still open and mapped: the old mapping
   * stays intact and the path now holds the new content. */
  uint64_t s1[] = {1};
  pulse_st_write_tensor one = wt("only", PULSE_DTYPE_F32, 1, s1, scalar_data);
  cr_assert_eq(pulse_st_write(path, &one, 1, NULL, 0), PULSE_OK);
  assert_sample(f);
  pulse_st_close(f);
  cr_assert_eq(pulse_st_open(path, &f), PULSE_OK);
  cr_assert_eq(pulse_st_tensor_count(f), 1);
  pulse_st_tensor got;
  cr_assert_eq(pulse_st_tensor_get(f, 0, &got), PULSE_OK);
  assert_tensor(&got, &one);
  cr_assert_eq(pulse_st_metadata_count(f), 0);
  pulse_st_close(f);
  cr_assert_eq(dir_entries(dir), 1);

  /* A failing write leaves the old file as it was. */
  pulse_st_write_tensor dup[2] = {one, one};
  cr_assert_eq(pulse_st_write(path, dup, 2, NULL, 0), PULSE_ERR_DUPLICATE);
  cr_assert_eq(pulse_st_open(path, &f), PULSE_OK);
  cr_assert_eq(pulse_st_tensor_count(f), 1);
  pulse_st_close(f);
  cr_assert_eq(dir_entries(dir), 1);
  free(path);
  rm_rf(dir);
}

Test(safetensors, write_into_missing_directory_fails_and_leaves_nothing) {
  char *dir = tmp_dir();
  char *missing = join(dir, "no/such/dir/model.safetensors");
  uint64_t s1[] = {1};
  pulse_st_write_tensor one = wt("x", PULSE_DTYPE_F32, 1, s1, scalar_data);
  pulse_status st = pulse_st_write(missing, &one, 1, NULL, 0);
  cr_assert_eq(st, PULSE_ERR_IO, "%s", pulse_status_name(st));
  cr_assert(strstr(pulse_error_detail(), "no/such/dir") != NULL, "%s",
            pulse_error_detail());
  cr_assert_eq(dir_entries(dir), 0);
  free(missing);
  rm_rf(dir);
}

Test(safetensors, write_over_a_directory_fails_and_removes_the_temp_file) {
  char *dir = tmp_dir();
  char *sub = join(dir, "taken");
  cr_assert_eq(mkdir(sub, 0700), 0);
  char *inner = join(sub, "keep");
  write_bytes(inner, "x", 1);
  uint64_t s1[] = {1};
  pulse_st_write_tensor one = wt("x", PULSE_DTYPE_F32, 1, s1, scalar_data);
  cr_assert_eq(pulse_st_write(sub, &one, 1, NULL, 0), PULSE_ERR_IO);
  cr_assert_eq(dir_entries(dir), 1, "only the directory itself remains");
  cr_assert_eq(dir_entries(sub), 1);
  free(inner);
  free(sub);
  rm_rf(dir);
}

typedef struct {
  const char *path;
  volatile int stop;
  int bad;
  int seen_a, seen_b;
} reader_state;

static void *reader_loop(void *arg) {
  reader_state *rs = arg;
  while (!rs->stop) {
    pulse_st_file *f;
    if (pulse_st_open(rs->path, &f) != PULSE_OK) {
      rs->bad++;
      continue;
    }
    pulse_st_tensor t;
    if (pulse_st_tensor_get(f, 0, &t) != PULSE_OK)
      rs->bad++;
    else if (strcmp(t.name, "a") == 0 && t.numel == 1000)
      rs->seen_a++;
    else if (strcmp(t.name, "b") == 0 && t.numel == 3)
      rs->seen_b++;
    else
      rs->bad++;
    pulse_st_close(f);
  }
  return NULL;
}

Test(safetensors, readers_see_old_or_new_content_during_overwrites) {
  char *dir = tmp_dir();
  char *path = join(dir, "live.safetensors");
  static float big[1000];
  uint64_t sa[] = {1000}, sb[] = {3};
  pulse_st_write_tensor a = wt("a", PULSE_DTYPE_F32, 1, sa, big);
  pulse_st_write_tensor b = wt("b", PULSE_DTYPE_F32, 1, sb, f32_data);
  cr_assert_eq(pulse_st_write(path, &a, 1, NULL, 0), PULSE_OK);
  reader_state rs = {path, 0, 0, 0, 0};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, reader_loop, &rs), 0);
  for (int i = 0; i < 40; i++)
    cr_assert_eq(pulse_st_write(path, i % 2 ? &a : &b, 1, NULL, 0), PULSE_OK);
  rs.stop = 1;
  pthread_join(th, NULL);
  cr_assert_eq(rs.bad, 0, "%d opens saw a partial or missing file", rs.bad);
  cr_assert_gt(rs.seen_a + rs.seen_b, 0);
  cr_assert_eq(dir_entries(dir), 1);
  free(path);
  rm_rf(dir);
}

Test(safetensors, writer_rejects_bad_input) {
  uint64_t s1[] = {1}, s9[] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  pulse_buffer buf = {0};
  pulse_st_write_tensor t = wt("x", PULSE_DTYPE_F32, 1, s1, scalar_data);
  pulse_st_write_tensor two[2] = {t, t};
  cr_assert_eq(pulse_st_serialize(two, 2, NULL, 0, &buf), PULSE_ERR_DUPLICATE);
  cr_assert(strstr(pulse_error_detail(), "'x'") != NULL);
  pulse_st_write_tensor bad = t;
  bad.dtype = PULSE_DTYPE_INVALID;
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_DTYPE);
  bad = t;
  bad.name = "__metadata__";
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_ARG);
  bad.name = "bad\xc0\x80";
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_ARG);
  bad.name = NULL;
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_ARG);
  bad = t;
  bad.data = NULL;
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_ARG);
  bad = wt("x", PULSE_DTYPE_F32, 8, s9, scalar_data);
  bad.ndim = 9;
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_ARG);
  uint64_t huge[] = {UINT64_MAX / 2, 3};
  bad = wt("x", PULSE_DTYPE_F32, 2, huge, scalar_data);
  cr_assert_eq(pulse_st_serialize(&bad, 1, NULL, 0, &buf), PULSE_ERR_OVERFLOW);
  pulse_st_kv kv[2] = {{"k", "1"}, {"k", "2"}};
  cr_assert_eq(pulse_st_serialize(&t, 1, kv, 2, &buf), PULSE_ERR_DUPLICATE);
  kv[1].key = NULL;
  cr_assert_eq(pulse_st_serialize(&t, 1, kv, 2, &buf), PULSE_ERR_ARG);
  cr_assert_null(buf.data);
  cr_assert_eq(pulse_st_serialize(&t, 1, NULL, 0, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_st_write(NULL, &t, 1, NULL, 0), PULSE_ERR_ARG);
  cr_assert_eq(pulse_st_write("", &t, 1, NULL, 0), PULSE_ERR_ARG);
  cr_assert_eq(pulse_st_write("/tmp/", &t, 1, NULL, 0), PULSE_ERR_ARG);
}

/* ---------------------------------------------------------------- reading */

Test(safetensors, reads_unpadded_headers_and_ignores_unknown_fields) {
  pulse_buffer b = raw_file("{\"x\":{\"dtype\":\"F16\",\"shape\":[3],"
                            "\"data_offsets\":[0,6],\"extra\":[1]},"
                            "\"__metadata__\":null}\t\r\n ",
                            6);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open_memory(b.data, b.size, &f), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_st_tensor t;
  cr_assert_eq(pulse_st_tensor_find(f, "x", &t), PULSE_OK);
  cr_assert_eq(t.nbytes, 6);
  cr_assert_eq(pulse_st_metadata_count(f), 0);
  pulse_st_close(f);
  pulse_buffer_free(&b);
}

Test(safetensors, storage_order_follows_offsets_not_header_order) {
  pulse_buffer b = raw_file(
      "{\"late\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]},"
      "\"z0\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]},"
      "\"early\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
      "\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
      12);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open_memory(b.data, b.size, &f), PULSE_OK, "%s",
               pulse_error_detail());
  const char *want[] = {"early", "z0", "z1", "late"};
  for (size_t i = 0; i < 4; i++) {
    pulse_st_tensor t;
    cr_assert_eq(pulse_st_tensor_get(f, i, &t), PULSE_OK);
    cr_assert_str_eq(t.name, want[i]);
  }
  pulse_st_close(f);
  pulse_buffer_free(&b);
}

Test(safetensors, rejects_short_files_and_bad_header_lengths) {
  uint8_t small[7] = {0};
  pulse_st_file *f = NULL;
  for (size_t n = 0; n < 8; n++)
    cr_assert_eq(pulse_st_open_memory(small, n, &f), PULSE_ERR_TRUNCATED);
  cr_assert_eq(pulse_st_open_memory(NULL, 0, &f), PULSE_ERR_TRUNCATED);
  uint8_t past[10] = {3, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  cr_assert_eq(pulse_st_open_memory(past, sizeof past, &f),
               PULSE_ERR_TRUNCATED);
  uint8_t big[10] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0, '{', '}'};
  cr_assert_eq(pulse_st_open_memory(big, sizeof big, &f), PULSE_ERR_OVERFLOW);
  uint8_t max[10] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
  cr_assert_eq(pulse_st_open_memory(max, sizeof max, &f), PULSE_ERR_OVERFLOW);
  cr_assert_null(f);
  cr_assert_eq(pulse_st_open_memory(past, sizeof past, NULL), PULSE_ERR_ARG);
}

Test(safetensors, rejects_headers_that_are_not_json_objects) {
  assert_rejects("", 0, PULSE_ERR_JSON);
  assert_rejects("{not json}", 0, PULSE_ERR_JSON);
  assert_rejects("[]", 0, PULSE_ERR_JSON);
  assert_rejects("\"x\"", 0, PULSE_ERR_JSON);
  assert_rejects(" {}", 0, PULSE_ERR_JSON);
  assert_rejects("{}x", 0, PULSE_ERR_JSON);
  assert_rejects("{\"a\":1}", 0, PULSE_ERR_JSON);
}

#define F32_ONE(name) "\"" name "\":{\"dtype\":\"F32\",\"shape\":[1],"
#define OFFS(a, b) "\"data_offsets\":[" #a "," #b "]}"

Test(safetensors, rejects_missing_fields) {
  assert_rejects("{\"a\":{\"shape\":[1]," OFFS(0, 4) "}", 4, PULSE_ERR_JSON);
  cr_assert(strstr(pulse_error_detail(), "'a'") != NULL);
  cr_assert(strstr(pulse_error_detail(), "dtype") != NULL);
  assert_rejects("{\"a\":{\"dtype\":\"F32\"," OFFS(0, 4) "}", 4,
                 PULSE_ERR_JSON);
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
                 PULSE_ERR_JSON);
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":{}," OFFS(0, 4) "}", 4,
                 PULSE_ERR_JSON);
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1]," OFFS(0, 4) "}", 4,
                 PULSE_ERR_JSON);
}

Test(safetensors, rejects_unknown_dtypes_naming_the_tensor) {
  assert_rejects("{\"w.q\":{\"dtype\":\"F64\",\"shape\":[1]," OFFS(0, 8) "}", 8,
                 PULSE_ERR_DTYPE);
  cr_assert(strstr(pulse_error_detail(), "'w.q'") != NULL, "%s",
            pulse_error_detail());
  cr_assert(strstr(pulse_error_detail(), "F64") != NULL);
  assert_rejects("{\"a\":{\"dtype\":\"I64\",\"shape\":[1]," OFFS(0, 8) "}", 8,
                 PULSE_ERR_DTYPE);
  assert_rejects("{\"a\":{\"dtype\":\"\",\"shape\":[1]," OFFS(0, 8) "}", 8,
                 PULSE_ERR_DTYPE);
}

Test(safetensors, rejects_offsets_that_are_not_two_integers) {
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[0.0,4]}}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[\"0\",4]}}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[0]}}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[0,4,4]}}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[-1,3]}}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") "\"data_offsets\":[0,99999999999999999999]}}",
                 4, PULSE_ERR_OFFSETS);
}

Test(safetensors, rejects_offsets_out_of_order_or_past_the_data) {
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[0]," OFFS(4, 0) "}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") OFFS(0, 4) "}", 3, PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") OFFS(4, 8) "}", 8, PULSE_ERR_OFFSETS);
}

Test(safetensors, rejects_size_not_numel_times_dtype_size) {
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]," OFFS(0, 4) "}", 4,
                 PULSE_ERR_SIZE_MISMATCH);
  assert_rejects("{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,2]," OFFS(0, 16) "}",
                 16, PULSE_ERR_SIZE_MISMATCH);
  assert_rejects("{\"a\":{\"dtype\":\"F16\",\"shape\":[]," OFFS(0, 0) "}", 0,
                 PULSE_ERR_SIZE_MISMATCH);
}

Test(safetensors, rejects_gaps_overlaps_and_trailing_bytes) {
  assert_rejects("{" F32_ONE("a") OFFS(0, 4) "," F32_ONE("b") OFFS(8, 12) "}",
                 12, PULSE_ERR_OFFSETS);
  cr_assert(strstr(pulse_error_detail(), "gap") != NULL);
  assert_rejects("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]," OFFS(
                     0, 8) "," F32_ONE("b") OFFS(4, 8) "}",
                 8, PULSE_ERR_OFFSETS);
  cr_assert(strstr(pulse_error_detail(), "overlap") != NULL);
  assert_rejects("{" F32_ONE("a") OFFS(0, 4) "," F32_ONE("b") OFFS(0, 4) "}", 4,
                 PULSE_ERR_OFFSETS);
  assert_rejects("{" F32_ONE("a") OFFS(0, 4) "}", 5, PULSE_ERR_TRAILING);
  assert_rejects("{}", 1, PULSE_ERR_TRAILING);
}

Test(safetensors, rejects_duplicate_names) {
  assert_rejects("{" F32_ONE("a") OFFS(0, 4) "," F32_ONE("a") OFFS(4, 8) "}", 8,
                 PULSE_ERR_DUPLICATE);
  cr_assert(strstr(pulse_error_detail(), "'a'") != NULL);
  assert_rejects("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                 PULSE_ERR_DUPLICATE);
  assert_rejects("{\"__metadata__\":{},\"__metadata__\":{}}", 0,
                 PULSE_ERR_DUPLICATE);
}

Test(safetensors, rejects_metadata_that_is_not_a_string_map) {
  assert_rejects("{\"__metadata__\":{\"step\":1}}", 0, PULSE_ERR_JSON);
  cr_assert(strstr(pulse_error_detail(), "step") != NULL);
  assert_rejects("{\"__metadata__\":{\"a\":null}}", 0, PULSE_ERR_JSON);
  assert_rejects("{\"__metadata__\":[]}", 0, PULSE_ERR_JSON);
  assert_rejects("{\"__metadata__\":\"x\"}", 0, PULSE_ERR_JSON);
}

Test(safetensors, rejects_shape_and_numel_overflow_and_too_many_dims) {
  assert_rejects(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616]," OFFS(0,
                                                                         4) "}",
      4, PULSE_ERR_OVERFLOW);
  assert_rejects(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967297]," OFFS(
          0, 4) "}",
      4, PULSE_ERR_OVERFLOW);
  assert_rejects(
      "{\"a\":{\"dtype\":\"BF16\",\"shape\":[9223372036854775808]," OFFS(0,
                                                                         4) "}",
      4, PULSE_ERR_OVERFLOW);
  assert_rejects(
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1]," OFFS(0, 4) "}",
      4, PULSE_ERR_UNSUPPORTED);
  /* Exactly PULSE_MAX_DIMS is fine. */
  cr_assert_eq(
      open_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1]," OFFS(
                   0, 4) "}",
               4),
      PULSE_OK, "%s", pulse_error_detail());
}

Test(safetensors, rejects_headers_whose_json_tree_would_be_too_large) {
  /* Two bytes per JSON value: the tree would take ~60 bytes per byte. */
  size_t n = 400000;
  char *h = malloc(2 * n + 64);
  size_t at = (size_t)sprintf(h, "{\"__metadata__\":{\"a\":[");
  for (size_t i = 0; i < n; i++)
    at += (size_t)sprintf(h + at, i ? ",0" : "0");
  strcpy(h + at, "]}}");
  assert_rejects(h, 0, PULSE_ERR_OVERFLOW);
  cr_assert(strstr(pulse_error_detail(), "memory") != NULL, "%s",
            pulse_error_detail());
  free(h);
}

/* Directory of the rejected inputs, next to this source file. */
static char *reject_dir(void) {
  char *src = strdup(__FILE__);
  char *d = join(dirname(src), "reject/safetensors");
  free(src);
  return d;
}

static uint8_t *slurp(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(n > 0 ? (size_t)n : 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *size = (size_t)n;
  return b;
}

Test(safetensors, rejects_every_file_in_the_reject_folder_with_its_status) {
  char *dir = reject_dir();
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s", dir);
  size_t checked = 0;
  const struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *sep = strstr(de->d_name, "--");
    if (de->d_name[0] == '.' || sep == NULL)
      continue;
    char want[64];
    snprintf(want, sizeof want, "%.*s", (int)(sep - de->d_name), de->d_name);
    char *path = join(dir, de->d_name);
    size_t size;
    uint8_t *bytes = slurp(path, &size);
    pulse_st_file *f = NULL;
    pulse_status st = pulse_st_open_memory(bytes, size, &f);
    cr_expect_str_eq(pulse_status_name(st), want, "%s: %s", de->d_name,
                     pulse_error_detail());
    cr_expect_null(f);
    pulse_st_close(f);
    /* The same through a mapped file. */
    st = pulse_st_open(path, &f);
    cr_expect_str_eq(pulse_status_name(st), want, "%s (file): %s", de->d_name,
                     pulse_error_detail());
    pulse_st_close(f);
    free(bytes);
    free(path);
    checked++;
  }
  closedir(d);
  cr_assert_geq(checked, 40, "only %zu reject files in %s", checked, dir);
  free(dir);
}

Test(safetensors, every_truncation_of_a_valid_file_is_rejected) {
  pulse_st_write_tensor t[8];
  size_t n = sample_tensors(t);
  pulse_buffer buf = {0};
  cr_assert_eq(pulse_st_serialize(t, n, sample_meta, 3, &buf), PULSE_OK);
  for (size_t len = 0; len < buf.size; len++) {
    uint8_t *copy = malloc(len > 0 ? len : 1);
    memcpy(copy, buf.data, len);
    pulse_st_file *f = NULL;
    cr_assert_neq(pulse_st_open_memory(copy, len, &f), PULSE_OK, "len %zu",
                  len);
    free(copy);
  }
  pulse_buffer_free(&buf);
}

Test(safetensors, open_reports_missing_and_non_regular_files) {
  pulse_st_file *f = NULL;
  cr_assert_eq(pulse_st_open("/nonexistent/pulse.safetensors", &f),
               PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_st_open("/tmp", &f), PULSE_ERR_IO);
  cr_assert_null(f);
  cr_assert_eq(pulse_st_open(NULL, &f), PULSE_ERR_ARG);
  pulse_st_close(NULL);
}

Test(safetensors, reads_a_file_written_by_pytorch_tooling) {
  const char *path = "/tmp/adamw_gpt/step0000.safetensors";
  if (access(path, R_OK) != 0)
    cr_skip_test("%s not present", path);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open(path, &f), PULSE_OK, "%s", pulse_error_detail());
  cr_assert_gt(pulse_st_tensor_count(f), 0);
  uint64_t end = 0;
  for (size_t i = 0; i < pulse_st_tensor_count(f); i++) {
    pulse_st_tensor t;
    cr_assert_eq(pulse_st_tensor_get(f, i, &t), PULSE_OK);
    cr_assert_eq(t.dtype, PULSE_DTYPE_BF16);
    end += t.nbytes;
  }
  cr_assert_gt(end, 0);
  pulse_st_close(f);
}

/* ----------------------------------------------------------------- models */

/* Writes shard `name` in dir with one BF16 tensor per name given. */
static void write_shard(const char *dir, const char *name, const char **names,
                        size_t n) {
  static const uint16_t vals[2] = {1, 2};
  uint64_t s2[] = {2};
  pulse_st_write_tensor t[8];
  for (size_t i = 0; i < n; i++)
    t[i] = wt(names[i], PULSE_DTYPE_BF16, 1, s2, vals);
  char *path = join(dir, name);
  cr_assert_eq(pulse_st_write(path, t, n, NULL, 0), PULSE_OK);
  free(path);
}

static void write_text(const char *dir, const char *name, const char *text) {
  char *path = join(dir, name);
  write_bytes(path, text, strlen(text));
  free(path);
}

/* Two shards: b-shard holds x, y; a-shard holds z. */
static char *sharded_dir(void) {
  char *dir = tmp_dir();
  const char *b[] = {"x", "y"}, *a[] = {"z"};
  write_shard(dir, "b-shard.safetensors", b, 2);
  write_shard(dir, "a-shard.safetensors", a, 1);
  return dir;
}

static pulse_status open_index(const char *dir, const char *json) {
  write_text(dir, "model.safetensors.index.json", json);
  char *path = join(dir, "model.safetensors.index.json");
  pulse_st_model *m = NULL;
  pulse_status st = pulse_st_model_open(path, &m);
  if (st != PULSE_OK)
    cr_assert_null(m);
  pulse_st_model_close(m);
  free(path);
  return st;
}

Test(safetensors, model_opens_a_sharded_index_in_shard_name_order) {
  char *dir = sharded_dir();
  write_text(dir, "model.safetensors.index.json",
             "{\"metadata\":{\"total_size\":12,\"format\":\"pt\",\"ok\":true,"
             "\"skip\":null},\"weight_map\":{\"x\":\"b-shard.safetensors\","
             "\"z\":\"a-shard.safetensors\",\"y\":\"b-shard.safetensors\"}}");
  /* By index file and by directory. */
  char *index = join(dir, "model.safetensors.index.json");
  const char *paths[] = {index, dir};
  for (size_t p = 0; p < 2; p++) {
    pulse_st_model *m;
    cr_assert_eq(pulse_st_model_open(paths[p], &m), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert_eq(pulse_st_model_shard_count(m), 2);
    cr_assert_eq(pulse_st_model_tensor_count(m), 3);
    const char *want[] = {"z", "x", "y"};
    for (size_t i = 0; i < 3; i++) {
      pulse_st_tensor t;
      cr_assert_eq(pulse_st_model_tensor_get(m, i, &t), PULSE_OK);
      cr_assert_str_eq(t.name, want[i]);
      cr_assert_eq(t.numel, 2);
      cr_assert_eq(((const uint16_t *)t.data)[1], 2);
    }
    pulse_st_tensor t;
    cr_assert_eq(pulse_st_model_tensor_find(m, "y", &t), PULSE_OK);
    cr_assert_str_eq(t.name, "y");
    cr_assert_eq(pulse_st_model_tensor_find(m, "w", &t), PULSE_ERR_NOT_FOUND);
    cr_assert_eq(pulse_st_model_tensor_get(m, 3, &t), PULSE_ERR_ARG);
    cr_assert_eq(pulse_st_model_metadata_count(m), 3);
    cr_assert_str_eq(pulse_st_model_metadata_get(m, "total_size"), "12");
    cr_assert_str_eq(pulse_st_model_metadata_get(m, "ok"), "true");
    cr_assert_null(pulse_st_model_metadata_get(m, "skip"));
    const char *k, *v;
    cr_assert_eq(pulse_st_model_metadata_at(m, 0, &k, &v), PULSE_OK);
    cr_assert_str_eq(k, "format");
    cr_assert_not_null(pulse_st_model_shard(m, 1));
    cr_assert_null(pulse_st_model_shard(m, 2));
    pulse_st_model_close(m);
  }
  free(index);
  rm_rf(dir);
}

Test(safetensors, model_opens_single_files_and_directories) {
  char *dir = tmp_dir();
  pulse_st_write_tensor t[8];
  size_t n = sample_tensors(t);
  char *path = join(dir, "weights.safetensors");
  cr_assert_eq(pulse_st_write(path, t, n, sample_meta, 3), PULSE_OK);
  const char *paths[] = {path, dir};
  for (size_t p = 0; p < 2; p++) {
    pulse_st_model *m;
    cr_assert_eq(pulse_st_model_open(paths[p], &m), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert_eq(pulse_st_model_tensor_count(m), n);
    for (size_t i = 0; i < n; i++) {
      pulse_st_tensor got;
      cr_assert_eq(pulse_st_model_tensor_get(m, i, &got), PULSE_OK);
      assert_tensor(&got, &t[i]);
    }
    cr_assert_str_eq(pulse_st_model_metadata_get(m, "step"), "17");
    cr_assert_eq(pulse_st_model_metadata_count(m), 3);
    pulse_st_model_close(m);
  }
  /* Two candidates and no model.safetensors: ambiguous. */
  char *other = join(dir, "other.safetensors");
  cr_assert_eq(pulse_st_write(other, t, 1, NULL, 0), PULSE_OK);
  pulse_st_model *m = NULL;
  cr_assert_eq(pulse_st_model_open(dir, &m), PULSE_ERR_ARG);
  /* model.safetensors wins over the others. */
  char *model = join(dir, "model.safetensors");
  cr_assert_eq(pulse_st_write(model, t, 2, NULL, 0), PULSE_OK);
  cr_assert_eq(pulse_st_model_open(dir, &m), PULSE_OK);
  cr_assert_eq(pulse_st_model_tensor_count(m), 2);
  pulse_st_model_close(m);
  free(model);
  free(other);
  free(path);
  rm_rf(dir);
}

Test(safetensors, model_rejects_missing_paths_and_empty_directories) {
  char *dir = tmp_dir();
  pulse_st_model *m = NULL;
  cr_assert_eq(pulse_st_model_open(dir, &m), PULSE_ERR_NOT_FOUND);
  char *missing = join(dir, "nope.safetensors");
  cr_assert_eq(pulse_st_model_open(missing, &m), PULSE_ERR_NOT_FOUND);
  cr_assert_null(m);
  cr_assert_eq(pulse_st_model_open(NULL, &m), PULSE_ERR_ARG);
  pulse_st_model_close(NULL);
  free(missing);
  rm_rf(dir);
}

Test(safetensors, model_rejects_an_index_naming_a_missing_shard) {
  char *dir = sharded_dir();
  pulse_status st = open_index(
      dir, "{\"weight_map\":{\"x\":\"b-shard.safetensors\",\"y\":"
           "\"b-shard.safetensors\",\"z\":\"c-shard.safetensors\"}}");
  cr_assert_eq(st, PULSE_ERR_NOT_FOUND, "%s", pulse_status_name(st));
  cr_assert(strstr(pulse_error_detail(), "c-shard") != NULL, "%s",
            pulse_error_detail());
  rm_rf(dir);
}

Test(safetensors, model_rejects_shard_paths_leaving_the_directory) {
  char *dir = sharded_dir();
  const char *bad[] = {"../a-shard.safetensors",
                       "/tmp/a-shard.safetensors",
                       "sub/a-shard.safetensors",
                       "..",
                       ".",
                       ""};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    char json[256];
    snprintf(json, sizeof json, "{\"weight_map\":{\"z\":\"%s\"}}", bad[i]);
    pulse_status st = open_index(dir, json);
    cr_assert_eq(st, PULSE_ERR_CORRUPT, "'%s' gave %s", bad[i],
                 pulse_status_name(st));
  }
  rm_rf(dir);
}

Test(safetensors, model_rejects_weight_maps_that_disagree_with_shards) {
  char *dir = sharded_dir();
  /* A mapped tensor its shard does not hold. */
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"x\":\"b-shard.safetensors\","
                               "\"y\":\"b-shard.safetensors\",\"z\":"
                               "\"a-shard.safetensors\",\"w\":"
                               "\"a-shard.safetensors\"}}"),
               PULSE_ERR_NOT_FOUND);
  cr_assert(strstr(pulse_error_detail(), "'w'") != NULL);
  /* A shard tensor the map leaves out. */
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"x\":\"b-shard.safetensors\","
                               "\"z\":\"a-shard.safetensors\"}}"),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "'y'") != NULL);
  /* A tensor mapped to the wrong shard. */
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"x\":\"a-shard.safetensors\","
                               "\"y\":\"b-shard.safetensors\",\"z\":"
                               "\"a-shard.safetensors\"}}"),
               PULSE_ERR_NOT_FOUND);
  /* A name listed twice. */
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"x\":\"b-shard.safetensors\","
                               "\"x\":\"b-shard.safetensors\",\"y\":"
                               "\"b-shard.safetensors\",\"z\":"
                               "\"a-shard.safetensors\"}}"),
               PULSE_ERR_DUPLICATE);
  /* Malformed indexes. */
  cr_assert_eq(open_index(dir, "{\"metadata\":{}}"), PULSE_ERR_JSON);
  cr_assert_eq(open_index(dir, "{\"weight_map\":[]}"), PULSE_ERR_JSON);
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"z\":1}}"), PULSE_ERR_JSON);
  cr_assert_eq(open_index(dir, "{\"weight_map\":{}"), PULSE_ERR_JSON);
  cr_assert_eq(open_index(dir, "[]"), PULSE_ERR_JSON);
  cr_assert_eq(open_index(dir, "{\"metadata\":3,\"weight_map\":{}}"),
               PULSE_ERR_JSON);
  /* An empty map is an empty model. */
  cr_assert_eq(open_index(dir, "{\"weight_map\":{}}"), PULSE_OK);
  rm_rf(dir);
}

Test(safetensors, model_rejects_an_invalid_shard_naming_it) {
  char *dir = sharded_dir();
  char *path = join(dir, "a-shard.safetensors");
  write_bytes(path, "\x02\0\0\0\0\0\0\0[]", 10);
  cr_assert_eq(open_index(dir, "{\"weight_map\":{\"x\":\"b-shard.safetensors\","
                               "\"y\":\"b-shard.safetensors\",\"z\":"
                               "\"a-shard.safetensors\"}}"),
               PULSE_ERR_JSON);
  cr_assert(strstr(pulse_error_detail(), "a-shard") != NULL, "%s",
            pulse_error_detail());
  free(path);
  rm_rf(dir);
}
