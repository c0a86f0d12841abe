/* Encoding from the rank form (what a GPU kernel hands the host) gives the
 * very bytes of encoding from the base, and a bad rank form is refused. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"

#define N 5000u
#define CHUNK_LOG2 10u

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

typedef struct {
  uint16_t base[N];
  pulse_changes ch;
  uint32_t hist[((N - 1) >> CHUNK_LOG2) + 1][PULSE_CLASS_COUNT];
  uint8_t cls[N];
  uint32_t rank[N];
} fixture;

static void make(fixture *f, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->ch = (pulse_changes)PULSE_CHANGES_INIT;
  for (uint32_t i = 0; i < N; i++) /* exponents 0x78..0x7F: several classes */
    f->base[i] = (uint16_t)(0x3C00u + (rng(&seed) & 0x3FFu));
  for (uint32_t i = 0; i < N; i++)
    if (rng(&seed) % 20 == 0)
      pulse_changes_push(&f->ch, i, f->base[i], (uint16_t)(f->base[i] + 1 + (rng(&seed) & 3)));
  /* The rank form, chunk by chunk, as a kernel would produce it. */
  uint64_t j = 0;
  for (uint32_t c = 0; c * (1u << CHUNK_LOG2) < N; c++) {
    uint32_t first = c << CHUNK_LOG2, n = N - first < (1u << CHUNK_LOG2) ? N - first : (1u << CHUNK_LOG2);
    uint32_t pos[1u << CHUNK_LOG2], k = 0;
    uint64_t j0 = j;
    while (j < f->ch.count && f->ch.pos[j] < first + n)
      pos[k++] = (uint32_t)(f->ch.pos[j++] - first);
    pulse_chunk_classify(f->base + first, n, pos, k, f->hist[c], f->rank + j0, f->cls + j0);
  }
}

static pulse_status encode_version(fixture *f, int rank_form, unsigned version,
                                   pulse_buffer *out) {
  pulse_tensor_digest d = pulse_digest_bf16(f->base, N);
  pulse_encode_tensor t = {{"w", PULSE_DTYPE_BF16, 1, {N}}, f->base, &f->ch, &d, NULL, NULL, NULL};
  if (rank_form) {
    t.base = NULL;
    t.chunk_hist = &f->hist[0][0];
    t.change_class = f->cls;
    t.change_rank = f->rank;
  }
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.chunk_log2 = CHUNK_LOG2;
  o.format_version = version;
  return pulse_patch_encode(&o, &t, 1, out);
}

static pulse_status encode(fixture *f, int rank_form, pulse_buffer *out) {
  return encode_version(f, rank_form, 0, out);
}

Test(rank_form, encodes_the_same_bytes_as_the_base) {
  for (uint64_t seed = 1; seed <= 5; seed++) {
    fixture *f = malloc(sizeof *f);
    make(f, seed * 7919);
    pulse_buffer a, b;
    cr_assert_eq(encode(f, 0, &a), PULSE_OK, "%s", pulse_error_detail());
    cr_assert_eq(encode(f, 1, &b), PULSE_OK, "%s", pulse_error_detail());
    cr_assert_eq(a.size, b.size, "seed %llu", (unsigned long long)seed);
    cr_assert_eq(memcmp(a.data, b.data, a.size), 0, "seed %llu", (unsigned long long)seed);
    pulse_buffer_free(&a), pulse_buffer_free(&b);
    pulse_changes_free(&f->ch);
    free(f);
  }
}

/* Version 3's value model counts each change under the class its chunk
 * codes: from the base on the CPU, from the rank form on a device. Both
 * must give the same model, so the same bytes. */
Test(rank_form, encodes_the_same_version_3_bytes_as_the_base) {
  for (uint64_t seed = 1; seed <= 5; seed++) {
    fixture *f = malloc(sizeof *f);
    make(f, seed * 104729);
    pulse_buffer a, b;
    cr_assert_eq(encode_version(f, 0, 3, &a), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert_eq(encode_version(f, 1, 3, &b), PULSE_OK, "%s",
                 pulse_error_detail());
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(a.data, a.size, &p), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert_eq(pulse_patch_format_version(p), 3);
    cr_assert_gt(pulse_patch_value_model_size(p), 0);
    pulse_patch_free(p);
    cr_assert_eq(a.size, b.size, "seed %llu", (unsigned long long)seed);
    cr_assert_eq(memcmp(a.data, b.data, a.size), 0, "seed %llu",
                 (unsigned long long)seed);
    pulse_buffer_free(&a), pulse_buffer_free(&b);
    pulse_changes_free(&f->ch);
    free(f);
  }
}

Test(rank_form, refuses_ranks_no_decoder_could_invert) {
  fixture *f = malloc(sizeof *f);
  make(f, 42);
  cr_assert_gt(f->ch.count, 2);
  pulse_buffer out;
  f->rank[1] = f->hist[0][f->cls[1]]; /* past its class */
  cr_assert_eq(encode(f, 1, &out), PULSE_ERR_ARG);
  cr_assert_null(out.data);
  pulse_changes_free(&f->ch);
  make(f, 42);
  f->hist[0][0] += 1; /* counts no longer cover the chunk */
  cr_assert_eq(encode(f, 1, &out), PULSE_ERR_ARG);
  pulse_changes_free(&f->ch);
  free(f);
}
