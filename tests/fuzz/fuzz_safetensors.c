/* fuzz_safetensors.c - libFuzzer target for the safetensors reader.
 *
 * Any input must be either rejected or fully readable: every tensor's bytes
 * and every metadata entry are touched (ASan checks they lie inside the
 * input), lookups by name agree with the table, and an accepted file
 * re-serializes to bytes that open to the same table, again and the same way
 * twice (the writer is deterministic). Corpus: tests/fuzz/corpus/safetensors
 * (tests/codec/reject/make_safetensors_rejects.py writes the seeds). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_safetensors.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

static volatile uint8_t sink;

static void same_tensor(const pulse_st_tensor *a, const pulse_st_tensor *b) {
  CHECK(strcmp(a->name, b->name) == 0);
  CHECK(a->dtype == b->dtype && a->ndim == b->ndim && a->numel == b->numel &&
        a->nbytes == b->nbytes);
  CHECK(memcmp(a->shape, b->shape, sizeof a->shape) == 0);
  CHECK(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
}

/* Re-serializes f and checks the result opens to the same table. */
static void round_trip(const pulse_st_file *f) {
  size_t n = pulse_st_tensor_count(f), mc = pulse_st_metadata_count(f);
  pulse_st_write_tensor *wt = calloc(n + 1, sizeof *wt);
  pulse_st_kv *kv = calloc(mc + 1, sizeof *kv);
  CHECK(wt != NULL && kv != NULL);
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor t;
    CHECK(pulse_st_tensor_get(f, i, &t) == PULSE_OK);
    wt[i].name = t.name;
    wt[i].dtype = t.dtype;
    wt[i].ndim = t.ndim;
    memcpy(wt[i].shape, t.shape, sizeof t.shape);
    wt[i].data = t.data;
  }
  for (size_t i = 0; i < mc; i++)
    CHECK(pulse_st_metadata_at(f, i, &kv[i].key, &kv[i].value) == PULSE_OK);

  pulse_buffer a = {0}, b = {0};
  pulse_status st = pulse_st_serialize(wt, n, kv, mc, &a);
  /* A header of nearly PULSE_ST_MAX_HEADER may grow past it when rewritten
   * with escapes; everything else the reader accepts, the writer writes. */
  if (st == PULSE_OK) {
    CHECK(pulse_st_serialize(wt, n, kv, mc, &b) == PULSE_OK);
    CHECK(a.size == b.size && memcmp(a.data, b.data, a.size) == 0);
    pulse_st_file *g = NULL;
    CHECK(pulse_st_open_memory(a.data, a.size, &g) == PULSE_OK);
    CHECK(pulse_st_tensor_count(g) == n && pulse_st_metadata_count(g) == mc);
    for (size_t i = 0; i < n; i++) {
      pulse_st_tensor x, y;
      CHECK(pulse_st_tensor_get(f, i, &x) == PULSE_OK);
      CHECK(pulse_st_tensor_get(g, i, &y) == PULSE_OK);
      same_tensor(&x, &y);
    }
    for (size_t i = 0; i < mc; i++) {
      const char *k1, *v1, *k2, *v2;
      CHECK(pulse_st_metadata_at(f, i, &k1, &v1) == PULSE_OK);
      CHECK(pulse_st_metadata_at(g, i, &k2, &v2) == PULSE_OK);
      CHECK(strcmp(k1, k2) == 0 && strcmp(v1, v2) == 0);
    }
    pulse_st_close(g);
  } else {
    CHECK(st == PULSE_ERR_OVERFLOW);
  }
  pulse_buffer_free(&a);
  pulse_buffer_free(&b);
  free(wt);
  free(kv);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* An exact-size copy, so reads past the end are caught. */
  uint8_t *copy = malloc(size > 0 ? size : 1);
  CHECK(copy != NULL);
  if (size > 0)
    memcpy(copy, data, size);
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open_memory(copy, size, &f);
  if (st != PULSE_OK) {
    CHECK(f == NULL);
    free(copy);
    return 0;
  }
  uint64_t covered = 0;
  const uint8_t *prev_end = NULL;
  for (size_t i = 0; i < pulse_st_tensor_count(f); i++) {
    pulse_st_tensor t, u;
    CHECK(pulse_st_tensor_get(f, i, &t) == PULSE_OK);
    CHECK(t.dtype == PULSE_DTYPE_F32 || t.dtype == PULSE_DTYPE_BF16 ||
          t.dtype == PULSE_DTYPE_F16);
    CHECK(t.ndim <= PULSE_MAX_DIMS);
    CHECK(t.nbytes == t.numel * pulse_dtype_size(t.dtype));
    const uint8_t *p = t.data;
    CHECK(p >= copy && p + t.nbytes <= copy + size);
    CHECK(prev_end == NULL || p == prev_end); /* contiguous storage */
    prev_end = p + t.nbytes;
    uint8_t acc = 0;
    for (uint64_t k = 0; k < t.nbytes; k++)
      acc ^= p[k];
    sink = acc;
    covered += t.nbytes;
    CHECK(pulse_st_tensor_find(f, t.name, &u) == PULSE_OK);
    CHECK(u.data == t.data && strcmp(u.name, t.name) == 0);
  }
  CHECK(prev_end == NULL || prev_end == copy + size);
  (void)covered;
  for (size_t i = 0; i < pulse_st_metadata_count(f); i++) {
    const char *k, *v;
    CHECK(pulse_st_metadata_at(f, i, &k, &v) == PULSE_OK);
    CHECK(pulse_st_metadata_get(f, k) == v);
    sink = (uint8_t)(strlen(k) + strlen(v));
  }
  round_trip(f);
  pulse_st_close(f);
  free(copy);
  return 0;
}
