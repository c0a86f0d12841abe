/* fuzz_loco_partition.c - libFuzzer target for the decoders of a
 * partitioned round (PAYLOAD.md "Partitioned averaging"): the reduced-range
 * blob (PLRD) a trainer fetches from each owner, read by
 * pulse_loco_finish_reduced, and the verdict (PLVD) it fetches from every
 * other trainer. The input is a 1-byte selector then the bytes: selector
 * even, a blob for range (selector / 2) % 3 of a prepared round of three
 * trainers (the other ranges' blobs honest); odd, a verdict.
 *
 * Besides memory errors it traps on broken promises: a blob that decodes
 * with averages outside its range or non-finite; a finish that fails yet
 * changed the context, or that succeeds with a non-finite weight; a
 * verdict that decodes and does not encode back to the same bytes.
 *
 * Seeds: build with -DLOCO_FUZZ_MAKE_SEEDS and run with the corpus folder
 * as argument (see the end of the file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_partition.h"
#include "rng_impl.h"

#define P_FUZZ 700u

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_loco_partition: %s failed at line %d\n", #cond,    \
              __LINE__);                                                       \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

static const uint32_t IDS[3] = {1, 4, 6};
static const uint64_t SAMPLES[3] = {5, 9, 2};

/* Three trainers with the same theta_g, each with a prepared round; the
 * honest blob of every range. */
typedef struct {
  pulse_loco *t[3];
  pulse_loco_plan plan;
  pulse_buffer blob[3];
} fuzz_round;

static void make_round(fuzz_round *r) {
  float theta[P_FUZZ], local[P_FUZZ];
  uint64_t rng = 3;
  for (uint32_t i = 0; i < P_FUZZ; i++) {
    uint64_t z = pulse_rng_next(&rng);
    theta[i] = (z & 15u) == 0 ? 0.0f : ((float)(z >> 40) * 0x1p-23f - 1.0f);
  }
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_opts o = PULSE_LOCO_OPTS_INIT;
    o.param_count = P_FUZZ;
    o.trainer_id = IDS[k];
    CHECK(pulse_loco_create(&o, theta, &r->t[k]) == PULSE_OK);
    for (uint32_t i = 0; i < P_FUZZ; i++)
      local[i] = theta[i] * (0.98f + 0.01f * (float)k);
    CHECK(pulse_loco_prepare(r->t[k], local, SAMPLES[k], 0, NULL, NULL,
                             NULL) == PULSE_OK);
  }
  uint64_t w[3] = {1, 2, 1};
  CHECK(pulse_loco_plan_make(P_FUZZ, IDS, w, 3, &r->plan) == PULSE_OK);
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_reducer *red = NULL;
    CHECK(pulse_loco_reducer_create(r->t[k], &r->plan, k, SAMPLES, &red) ==
          PULSE_OK);
    for (uint32_t i = 0; i < 3; i++) {
      pulse_buffer s;
      CHECK(pulse_loco_slice_encode(r->t[i], r->plan.start[k],
                                    r->plan.start[k + 1], &s) == PULSE_OK);
      CHECK(pulse_loco_reducer_add(red, s.data, s.size) == PULSE_OK);
      pulse_buffer_free(&s);
    }
    CHECK(pulse_loco_reducer_finish(red, &r->blob[k]) == PULSE_OK);
    pulse_loco_reducer_free(red);
  }
}

static void free_round(fuzz_round *r) {
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_free(r->t[k]);
    pulse_buffer_free(&r->blob[k]);
  }
}

static void fuzz_blob(uint32_t k, const uint8_t *data, size_t size) {
  static fuzz_round r;
  static int ready;
  if (!ready)
    make_round(&r), ready = 1;
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
  if (pulse_loco_reduced_decode(r.t[0], &r.plan, k, SAMPLES, data, size,
                                &d) == PULSE_OK) {
    for (uint64_t j = 0; j < d.avg.count; j++) {
      CHECK(d.avg.pos[j] >= r.plan.start[k] &&
            d.avg.pos[j] < r.plan.start[k + 1]);
      CHECK(j == 0 || d.avg.pos[j] > d.avg.pos[j - 1]);
      CHECK(isfinite(d.avg.val[j]));
    }
    CHECK(d.ncontrib == 3);
  }
  pulse_loco_reduced_free(&d);
  /* A finish with this blob in place of range k's, on a fresh copy of
   * trainer 0 (this one keeps its round prepared for the next input). */
  pulse_loco_contribution set[3];
  for (uint32_t i = 0; i < 3; i++)
    set[i] = (pulse_loco_contribution){r.blob[i].data, r.blob[i].size};
  set[k] = (pulse_loco_contribution){data, size};
  uint64_t before = pulse_loco_global_digest(r.t[0]);
  pulse_loco_reduced_verdict v;
  pulse_status st = pulse_loco_finish_reduced(r.t[0], &r.plan, set, SAMPLES,
                                              NULL, NULL, &v);
  if (st != PULSE_OK) {
    CHECK(pulse_loco_global_digest(r.t[0]) == before);
    CHECK(pulse_loco_round(r.t[0]) == 0);
    return;
  }
  const float *g = pulse_loco_global(r.t[0]);
  for (uint32_t i = 0; i < P_FUZZ; i++)
    CHECK(isfinite(g[i]));
  /* It finished: start over for the next input. */
  free_round(&r);
  ready = 0;
}

static void fuzz_verdict(const uint8_t *data, size_t size) {
  static pulse_loco_verdict v;
  if (pulse_loco_verdict_decode(data, size, &v) != PULSE_OK)
    return;
  pulse_buffer b;
  CHECK(pulse_loco_verdict_encode(&v, &b) == PULSE_OK);
  CHECK(b.size == size && memcmp(b.data, data, size) == 0);
  pulse_buffer_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  if (data[0] & 1u)
    fuzz_verdict(data + 1, size - 1);
  else
    fuzz_blob((uint32_t)(data[0] / 2u) % 3u, data + 1, size - 1);
  return 0;
}

#ifdef LOCO_FUZZ_MAKE_SEEDS
/* cc -DLOCO_FUZZ_MAKE_SEEDS -Iloco -Icodec ... tests/fuzz/fuzz_loco_partition.c
 * (linked as fuzz_loco_chunk.c's seed writer) && ./a.out
 * tests/fuzz/corpus/loco_partition: the honest blob of each range and one
 * verdict, framed as the fuzzer reads them. */
int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  fuzz_round r;
  make_round(&r);
  char path[1024];
  for (uint32_t k = 0; k < 3; k++) {
    snprintf(path, sizeof path, "%s/blob_%u", argv[1], k);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    uint8_t sel = (uint8_t)(2u * k);
    fwrite(&sel, 1, 1, f);
    fwrite(r.blob[k].data, 1, r.blob[k].size, f);
    fclose(f);
  }
  static pulse_loco_verdict v;
  memset(&v, 0, sizeof v);
  v.peer = 4, v.count = 3;
  for (uint32_t k = 0; k < 3; k++) {
    v.items[k].owner = IDS[k];
    v.items[k].flags = k == 1 ? PULSE_LOCO_VERDICT_CHECKED : 0;
    v.items[k].blob_digest = 0x0123456789abcdefull + k;
  }
  pulse_buffer b;
  CHECK(pulse_loco_verdict_encode(&v, &b) == PULSE_OK);
  snprintf(path, sizeof path, "%s/verdict", argv[1]);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  uint8_t sel = 1;
  fwrite(&sel, 1, 1, f);
  fwrite(b.data, 1, b.size, f);
  fclose(f);
  pulse_buffer_free(&b);
  free_round(&r);
  return 0;
}
#endif
