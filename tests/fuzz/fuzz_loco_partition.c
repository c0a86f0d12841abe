/* fuzz_loco_partition.c - libFuzzer target for the decoders of a
 * partitioned round (docs/protocols/loco-collaboration.md "Partitioned averaging"): the reduced-range
 * blob (PLRD) a trainer fetches from each owner, read by
 * pulse_loco_finish_reduced, and the verdict (PLVD) it fetches from every
 * other trainer. The input is a 1-byte selector then the bytes: selector
 * odd, a verdict; even, a blob for range ((selector & 0x7f) / 2) % 3 of a
 * prepared round of three trainers (the other ranges' blobs honest), whose
 * trainers have the mean gate (pulse_loco_opts.gate_mean) off when the
 * selector's bit 7 is clear and on when it is set (docs/formats/loco-payload.md "The round",
 * "Gated means": the honest blobs then carry only the accepted means).
 *
 * Besides memory errors it traps on broken promises: a blob that decodes
 * with averages outside its range, not increasing or non-finite; a finish
 * that fails yet changed the context, or that succeeds with a non-finite
 * weight; a verdict that decodes and does not encode back to the same
 * bytes. And the mean gate's: each blob (and the round's other blobs) is
 * also read by the same trainer of a twin round with the other setting,
 * with the GATED_MEANS flag (bit 0 of byte 6) flipped, which is all the
 * setting changes for a reader: the same decode status and averages; a
 * blob one reader takes, the other refuses unflipped; the same finish
 * status and blamed owner, and on success the same theta_g and momentum
 * bit for bit, and the same error feedback except at trainer 0's sent
 * entries whose applied mean is 0, which the gated reader keeps (e = s)
 * and the ungated one clears.
 *
 * Seeds: build with -DLOCO_FUZZ_MAKE_SEEDS and run with the corpus folder
 * as argument (see the end of the file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_elem.h"
#include "pulse_loco_partition.h"
#include "rng_impl.h"

#define P_FUZZ 700u
/* docs/protocols/loco-collaboration.md "Reduced range": byte 6 holds the flags, bit 0 GATED_MEANS. */
#define FLAGS_AT 6u
#define GATED_MEANS 1u
/* The selector's bit that picks the gated round. */
#define SEL_GATED 0x80u

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
 * honest blob of every range, the same with its GATED_MEANS flag flipped
 * (what the twin round's reader is given), and the averages trainer 0
 * applies from the honest blobs (+0.0 where none). */
typedef struct {
  pulse_loco *t[3];
  pulse_loco_plan plan;
  pulse_buffer blob[3];
  pulse_buffer flipped[3];
  float avg[P_FUZZ];
} fuzz_round;

/* The same round twice, gate_mean off ([0]) and on ([1]): same theta_g,
 * theta_r, samples and plan. Trainer 0's sent entries (the same in both:
 * the option changes no payload of round 0) and its signal s there. */
typedef struct {
  fuzz_round r[2];
  uint8_t sent[P_FUZZ];
  float s[P_FUZZ];
} fuzz_pair;

/* A copy of a blob with its GATED_MEANS flag flipped (unchanged when too
 * short to have one); the caller frees data. */
static pulse_buffer flip_flag(const uint8_t *data, size_t size) {
  pulse_buffer b = {malloc(size + 1), size};
  CHECK(b.data != NULL);
  if (size > 0)
    memcpy(b.data, data, size);
  if (size > FLAGS_AT)
    b.data[FLAGS_AT] ^= GATED_MEANS;
  return b;
}

static void make_round(fuzz_round *r, int gate_mean) {
  float theta[P_FUZZ], local[P_FUZZ];
  uint64_t rng = 3;
  for (uint32_t i = 0; i < P_FUZZ; i++) {
    uint64_t z = pulse_rng_next(&rng);
    theta[i] = (z & 15u) == 0 ? 0.0f : ((float)(z >> 40) * 0x1p-23f - 1.0f);
  }
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = P_FUZZ;
    o.trainer_id = IDS[k];
    o.gate_mean = gate_mean;
    CHECK(pulse_loco_create(&o, theta, &r->t[k]) == PULSE_OK);
    /* A third of the elements moved by trainer 0 alone, by little (its
     * entry passes the gate, the mean of 5/16 of it mostly does not: the
     * gate rejects it), a third by trainer 6 alone, by much (its mean
     * passes), a third by all (a quorum of 2 senders: trainer 6's 1.0
     * sends nothing). */
    for (uint32_t i = 0; i < P_FUZZ; i++) {
      float f = i % 3 == 0   ? (k == 0 ? 0.995f : 1.0f)
                : i % 3 == 1 ? (k == 2 ? 0.8f : 1.0f)
                             : 0.98f + 0.01f * (float)k;
      local[i] = theta[i] * f;
    }
    CHECK(pulse_loco_prepare(r->t[k], local, SAMPLES[k], 0, NULL, NULL, NULL) ==
          PULSE_OK);
  }
  uint64_t w[3] = {1, 2, 1};
  CHECK(pulse_loco_plan_make(P_FUZZ, IDS, w, 3, &r->plan) == PULSE_OK);
  memset(r->avg, 0, sizeof r->avg);
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
    r->flipped[k] = flip_flag(r->blob[k].data, r->blob[k].size);
    pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
    CHECK(pulse_loco_reduced_decode(r->t[0], &r->plan, k, SAMPLES,
                                    r->blob[k].data, r->blob[k].size,
                                    &d) == PULSE_OK);
    for (uint64_t j = 0; j < d.avg.count; j++)
      r->avg[d.avg.pos[j]] = d.avg.val[j];
    pulse_loco_reduced_free(&d);
  }
}

static void free_round(fuzz_round *r) {
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_free(r->t[k]);
    pulse_buffer_free(&r->blob[k]);
    free(r->flipped[k].data);
  }
}

static void make_pair(fuzz_pair *pr) {
  make_round(&pr->r[0], 0);
  make_round(&pr->r[1], 1);
  pulse_buffer own[2];
  for (int g = 0; g < 2; g++)
    CHECK(pulse_loco_slice_encode(pr->r[g].t[0], 0, P_FUZZ, &own[g]) ==
          PULSE_OK);
  CHECK(own[0].size == own[1].size &&
        memcmp(own[0].data, own[1].data, own[0].size) == 0);
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  pulse_loco_payload_header h;
  CHECK(pulse_loco_payload_decode(own[0].data, own[0].size,
                                  pulse_loco_global(pr->r[0].t[0]), NULL,
                                  P_FUZZ, &h, &e) == PULSE_OK);
  memset(pr->sent, 0, sizeof pr->sent);
  memset(pr->s, 0, sizeof pr->s);
  for (uint64_t j = 0; j < e.count; j++)
    pr->sent[e.pos[j]] = 1, pr->s[e.pos[j]] = e.val[j];
  /* The honest gated means are the ungated ones less some the gate
   * rejects (those fail pulse_loco_gate on theta_g); the round must have
   * such, some where trainer 0 sent, or the keep path is never reached. */
  const float *theta = pulse_loco_global(pr->r[0].t[0]);
  uint32_t rejected = 0, kept = 0;
  for (uint32_t p = 0; p < P_FUZZ; p++) {
    float u = pr->r[0].avg[p], g = pr->r[1].avg[p];
    if (g != 0.0f)
      CHECK(memcmp(&u, &g, sizeof u) == 0);
    else if (u != 0.0f) {
      CHECK(!pulse_loco_gate(theta[p], u));
      rejected++;
      kept += pr->sent[p];
    }
  }
  CHECK(rejected > 0 && kept > 0);
  pulse_loco_entries_free(&e);
  pulse_buffer_free(&own[0]);
  pulse_buffer_free(&own[1]);
}

static void free_pair(fuzz_pair *pr) {
  free_round(&pr->r[0]);
  free_round(&pr->r[1]);
}

/* What a failed call must leave as it was. */
typedef struct {
  uint64_t round, global, residual, momentum;
} ctx_digest;

static ctx_digest digest_of(const pulse_loco *t) {
  ctx_digest d = {pulse_loco_round(t), pulse_loco_global_digest(t),
                  pulse_loco_digest_f32(pulse_loco_residual(t), P_FUZZ),
                  pulse_loco_digest_f32(pulse_loco_momentum(t), P_FUZZ)};
  return d;
}

static int same_digest(ctx_digest a, ctx_digest b) {
  return a.round == b.round && a.global == b.global &&
         a.residual == b.residual && a.momentum == b.momentum;
}

static int same_reduced(const pulse_loco_reduced *a,
                        const pulse_loco_reduced *b) {
  if (a->owner != b->owner || a->round != b->round || a->start != b->start ||
      a->end != b->end || a->ncontrib != b->ncontrib ||
      a->avg.count != b->avg.count)
    return 0;
  for (uint32_t i = 0; i < a->ncontrib; i++)
    if (a->contrib[i].id != b->contrib[i].id ||
        a->contrib[i].samples != b->contrib[i].samples ||
        a->contrib[i].entries != b->contrib[i].entries ||
        a->contrib[i].receipt != b->contrib[i].receipt)
      return 0;
  for (uint64_t j = 0; j < a->avg.count; j++)
    if (a->avg.pos[j] != b->avg.pos[j] ||
        memcmp(&a->avg.val[j], &b->avg.val[j], sizeof a->avg.val[j]) != 0)
      return 0;
  return 1;
}

static void fuzz_blob(int gated, uint32_t k, const uint8_t *data, size_t size) {
  static fuzz_pair pr;
  static int ready;
  if (!ready)
    make_pair(&pr), ready = 1;
  /* a: the round the selector names; b: its twin of the other setting. */
  fuzz_round *a = &pr.r[gated], *b = &pr.r[!gated];
  pulse_buffer flipped = flip_flag(data, size);
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT, d2 = PULSE_LOCO_REDUCED_INIT;
  pulse_status st =
      pulse_loco_reduced_decode(a->t[0], &a->plan, k, SAMPLES, data, size, &d);
  CHECK(pulse_loco_reduced_decode(b->t[0], &b->plan, k, SAMPLES, flipped.data,
                                  flipped.size, &d2) == st);
  /* The averages trainer 0 would apply with this blob for range k. */
  static float avg[P_FUZZ];
  if (st == PULSE_OK) {
    for (uint64_t j = 0; j < d.avg.count; j++) {
      CHECK(d.avg.pos[j] >= a->plan.start[k] &&
            d.avg.pos[j] < a->plan.start[k + 1]);
      CHECK(j == 0 || d.avg.pos[j] > d.avg.pos[j - 1]);
      CHECK(isfinite(d.avg.val[j]));
    }
    CHECK(d.ncontrib == 3);
    CHECK(same_reduced(&d, &d2));
    /* Means of one setting are refused by a reader of the other. */
    pulse_loco_reduced d3 = PULSE_LOCO_REDUCED_INIT;
    CHECK(pulse_loco_reduced_decode(b->t[0], &b->plan, k, SAMPLES, data, size,
                                    &d3) == PULSE_ERR_CORRUPT);
    memcpy(avg, a->avg, sizeof avg);
    for (uint64_t p = a->plan.start[k]; p < a->plan.start[k + 1]; p++)
      avg[p] = 0.0f;
    for (uint64_t j = 0; j < d.avg.count; j++)
      avg[d.avg.pos[j]] = d.avg.val[j];
  }
  pulse_loco_reduced_free(&d);
  pulse_loco_reduced_free(&d2);
  /* A finish with this blob in place of range k's, on trainer 0 of each
   * twin (these keep their rounds prepared for the next input). */
  pulse_loco_contribution set_a[3], set_b[3];
  for (uint32_t i = 0; i < 3; i++) {
    set_a[i] = (pulse_loco_contribution){a->blob[i].data, a->blob[i].size};
    set_b[i] =
        (pulse_loco_contribution){a->flipped[i].data, a->flipped[i].size};
  }
  set_a[k] = (pulse_loco_contribution){data, size};
  set_b[k] = (pulse_loco_contribution){flipped.data, flipped.size};
  ctx_digest before_a = digest_of(a->t[0]), before_b = digest_of(b->t[0]);
  pulse_loco_reduced_verdict va, vb;
  pulse_status sa = pulse_loco_finish_reduced(a->t[0], &a->plan, set_a, SAMPLES,
                                              NULL, NULL, &va);
  pulse_status sb = pulse_loco_finish_reduced(b->t[0], &b->plan, set_b, SAMPLES,
                                              NULL, NULL, &vb);
  free(flipped.data);
  CHECK(sa == sb && va.has_offender == vb.has_offender &&
        va.offender == vb.offender);
  if (sa != PULSE_OK) {
    CHECK(same_digest(digest_of(a->t[0]), before_a));
    CHECK(same_digest(digest_of(b->t[0]), before_b));
    CHECK(va.has_offender && va.offender == IDS[k]);
    return;
  }
  CHECK(st == PULSE_OK);
  const float *g = pulse_loco_global(a->t[0]);
  for (uint32_t i = 0; i < P_FUZZ; i++)
    CHECK(isfinite(g[i]));
  CHECK(memcmp(g, pulse_loco_global(b->t[0]), P_FUZZ * sizeof *g) == 0);
  CHECK(memcmp(pulse_loco_momentum(a->t[0]), pulse_loco_momentum(b->t[0]),
               P_FUZZ * sizeof *g) == 0);
  /* The error feedback: the gated reader keeps s where trainer 0 sent and
   * the applied mean is 0 (not applied: deferred); the ungated one clears
   * every sent entry; elsewhere they agree. */
  const float *eu = pulse_loco_residual(pr.r[0].t[0]);
  const float *eg = pulse_loco_residual(pr.r[1].t[0]);
  for (uint32_t p = 0; p < P_FUZZ; p++) {
    float want = eu[p];
    if (pr.sent[p] && avg[p] == 0.0f) {
      CHECK(eu[p] == 0.0f);
      want = pr.s[p];
    }
    CHECK(memcmp(&eg[p], &want, sizeof want) == 0);
  }
  /* It finished: start over for the next input. */
  free_pair(&pr);
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
    fuzz_blob((data[0] & SEL_GATED) != 0,
              (uint32_t)((data[0] & ~SEL_GATED) / 2u) % 3u, data + 1, size - 1);
  return 0;
}

#ifdef LOCO_FUZZ_MAKE_SEEDS
/* clang -DLOCO_FUZZ_MAKE_SEEDS -fsanitize=fuzzer-no-link,address,undefined \
 *    -Iloco -Icodec tests/fuzz/fuzz_loco_partition.c build-fuzz/loco/\
 *    libpulse_loco.a ... (linked as fuzz_loco_chunk.c's seed writer) \
 *    && ./a.out tests/fuzz/corpus/loco_partition
 * writes the honest blob of each range, gate off (blob_K) and on
 * (gated_blob_K), range 2's with a mean that overflows the step
 * ([gated_]overflowing_average) and one verdict, framed as the fuzzer
 * reads them. */
static void write_seed(const char *dir, const char *name, uint8_t sel,
                       const uint8_t *data, size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  CHECK(fwrite(&sel, 1, 1, f) == 1 && fwrite(data, 1, size, f) == size);
  CHECK(fclose(f) == 0);
}

/* Range 2's honest blob of round r with its averages replaced by one
 * finite mean so large that the step would take theta_g out of the finite
 * numbers (coded with q = 0: it does not fit scaled), which the finish
 * must refuse, naming owner 6. */
static pulse_buffer overflowing_blob(const fuzz_round *r) {
  size_t head = 64u + 28u * 3u; /* docs/protocols/loco-collaboration.md "Reduced range" */
  uint64_t pos = r->plan.start[2] + 5u, weight = 0;
  float val = 3e38f;
  for (uint32_t i = 0; i < 3; i++)
    weight += SAMPLES[i];
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.pos_model = PULSE_POS_PLAIN;
  h.values = PULSE_LOCO_VALUES_MODELED;
  h.chunk_log2 = 20;
  h.sender = IDS[2];
  h.samples = weight;
  h.base_digest = pulse_loco_global_digest(r->t[0]);
  pulse_buffer avg;
  CHECK(pulse_loco_payload_encode(&h, pulse_loco_global(r->t[0]), NULL, P_FUZZ,
                                  &pos, &val, 1, &avg) == PULSE_OK);
  pulse_buffer b = {malloc(head + avg.size), head + avg.size};
  CHECK(b.data != NULL && r->blob[2].size > head);
  memcpy(b.data, r->blob[2].data, head);
  b.data[5] = 0; /* q */
  memcpy(b.data + head, avg.data, avg.size);
  pulse_buffer_free(&avg);
  return b;
}

int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  static fuzz_pair pr;
  make_pair(&pr);
  char name[64];
  for (int g = 0; g < 2; g++) {
    uint8_t sel = g ? SEL_GATED : 0u;
    for (uint32_t k = 0; k < 3; k++) {
      snprintf(name, sizeof name, "%sblob_%u", g ? "gated_" : "", k);
      write_seed(argv[1], name, (uint8_t)(sel | 2u * k), pr.r[g].blob[k].data,
                 pr.r[g].blob[k].size);
    }
    pulse_buffer b = overflowing_blob(&pr.r[g]);
    snprintf(name, sizeof name, "%soverflowing_average", g ? "gated_" : "");
    write_seed(argv[1], name, (uint8_t)(sel | 4u), b.data, b.size);
    free(b.data);
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
  write_seed(argv[1], "verdict", 1, b.data, b.size);
  pulse_buffer_free(&b);
  free_pair(&pr);
  return 0;
}
#endif
