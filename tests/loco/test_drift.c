/* test_drift.c - replicas that received different chunks (docs/formats/loco-payload.md
 * "Drift"): with chunks lost independently per receiver the replicas
 * drift apart; the drift stays under its budget, per-range digests find
 * every range that differs, and after re-synchronizing those ranges from
 * the reference replica every replica holds the same bits again, round
 * after round. */
#include "loco_testutil.h"

#define DT 4
#define DP 4000
#define RANGE 512 /* parameters per digest */
#define DGRAM 1200
#define ROUNDS 6
#define LOSS 0.2
#define BUDGET 1e-2 /* max drift allowed before a re-sync */

static const uint32_t dids[DT] = {0, 1, 2, 3};

/* One round of every trainer over chunks, each chunk of each sender lost
 * independently for each receiver. */
static void chunked_round(pulse_loco **ctx, uint64_t round, uint64_t *rng) {
  pulse_buffer chunks[DT];
  uint64_t count[DT];
  for (uint32_t i = 0; i < DT; i++) {
    const float *g = pulse_loco_global(ctx[i]);
    float *local = malloc(DP * sizeof *local);
    for (uint64_t j = 0; j < DP; j++)
      local[j] = g[j] - lt_normal(rng) * fabsf(g[j]) * 0x1p-9f;
    const uint8_t *d;
    size_t size;
    cr_assert_eq(pulse_loco_prepare(ctx[i], local, 50, 0, &d, &size, NULL),
                 PULSE_OK, "%s", pulse_error_detail());
    pulse_loco_payload_header h;
    pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
    cr_assert_eq(pulse_loco_payload_decode(d, size, g, NULL, DP, &h, &e),
                 PULSE_OK);
    cr_assert_eq(h.round, round);
    cr_assert_eq(pulse_loco_chunks_encode(&h, DP, e.pos, e.val, e.count, DGRAM,
                                          &chunks[i], &count[i]),
                 PULSE_OK);
    pulse_loco_entries_free(&e);
    free(local);
  }
  for (uint32_t me = 0; me < DT; me++) {
    pulse_loco_inbox *in;
    cr_assert_eq(pulse_loco_inbox_create(ctx[me], dids, DT, &in), PULSE_OK);
    for (uint32_t i = 0; i < DT; i++) {
      if (i == me)
        continue;
      const uint8_t *p = chunks[i].data;
      size_t left = chunks[i].size;
      for (uint64_t k = 0; k < count[i]; k++) {
        size_t cs;
        cr_assert_eq(pulse_loco_chunk_size(p, left, &cs), PULSE_OK);
        if (pulse_rng_uniform(rng) >= LOSS)
          cr_assert_eq(pulse_loco_inbox_add(in, p, cs), PULSE_OK, "%s",
                       pulse_error_detail());
        p += cs, left -= cs;
      }
    }
    cr_assert_eq(pulse_loco_finish_inbox(ctx[me], in, NULL, NULL), PULSE_OK);
    pulse_loco_inbox_free(in);
  }
  for (uint32_t i = 0; i < DT; i++)
    pulse_buffer_free(&chunks[i]);
}

static double max_drift(pulse_loco **ctx) {
  double worst = 0.0;
  for (uint32_t a = 0; a < DT; a++)
    for (uint32_t b = a + 1; b < DT; b++) {
      double d = pulse_loco_drift(pulse_loco_global(ctx[a]),
                                  pulse_loco_global(ctx[b]), DP);
      worst = d > worst ? d : worst;
    }
  return worst;
}

/* Copies every range whose digest differs from replica 0's; returns how
 * many ranges were copied. */
static uint64_t resync_from_reference(pulse_loco **ctx) {
  uint64_t copied = 0;
  for (uint64_t start = 0; start < DP; start += RANGE) {
    uint64_t len = DP - start < RANGE ? DP - start : RANGE, want;
    cr_assert_eq(pulse_loco_range_digest(ctx[0], start, len, &want), PULSE_OK);
    for (uint32_t i = 1; i < DT; i++) {
      uint64_t have;
      cr_assert_eq(pulse_loco_range_digest(ctx[i], start, len, &have),
                   PULSE_OK);
      if (have == want)
        continue;
      cr_assert_eq(pulse_loco_resync_range(ctx[i], start, len,
                                           pulse_loco_global(ctx[0]) + start,
                                           pulse_loco_momentum(ctx[0]) + start),
                   PULSE_OK);
      copied++;
    }
  }
  return copied;
}

Test(loco, chunk_loss_drift_stays_under_budget_and_resync_restores_the_bits,
     .timeout = 60) {
  float theta[DP];
  lt_fill_weights(theta, DP, 31, 0.5f);
  pulse_loco *ctx[DT];
  for (uint32_t i = 0; i < DT; i++)
    ctx[i] = lt_ctx(DP, dids[i], theta);
  uint64_t rng = 77, copied = 0;
  double worst = 0.0;
  for (uint64_t r = 0; r < ROUNDS; r++) {
    chunked_round(ctx, r, &rng);
    double drift = max_drift(ctx);
    worst = drift > worst ? drift : worst;
    cr_assert(drift < BUDGET, "round %llu: drift %g over the budget",
              (unsigned long long)r, drift);
    copied += resync_from_reference(ctx);
    for (uint32_t i = 1; i < DT; i++) {
      cr_assert_eq(memcmp(pulse_loco_global(ctx[i]), pulse_loco_global(ctx[0]),
                          DP * sizeof(float)),
                   0, "round %llu: replica %u differs after the re-sync",
                   (unsigned long long)r, i);
      cr_assert_eq(memcmp(pulse_loco_momentum(ctx[i]),
                          pulse_loco_momentum(ctx[0]), DP * sizeof(float)),
                   0);
      cr_assert_eq(pulse_loco_global_digest(ctx[i]),
                   pulse_loco_global_digest(ctx[0]));
    }
  }
  cr_log_info("max drift %g, %llu ranges re-synced", worst,
              (unsigned long long)copied);
  /* The loss did make the replicas drift: the checks above could fail. */
  cr_assert(worst > 0.0 && copied > 0, "no drift: %g, %llu ranges", worst,
            (unsigned long long)copied);
  for (uint32_t i = 0; i < DT; i++)
    pulse_loco_free(ctx[i]);
}

Test(loco, resync_refuses_bad_ranges_and_non_finite_values) {
  float theta[256] = {0}, bad[4] = {1.0f, NAN, 0.0f, 0.0f};
  pulse_loco *ctx = lt_ctx(256, 0, theta);
  uint64_t d;
  cr_assert_eq(pulse_loco_range_digest(ctx, 250, 7, &d), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_range_digest(ctx, 0, 0, &d), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_resync_range(ctx, 254, 4, bad, bad), PULSE_ERR_ARG);
  uint64_t before = pulse_loco_global_digest(ctx);
  cr_assert_eq(pulse_loco_resync_range(ctx, 0, 4, bad, bad), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_loco_global_digest(ctx), before);
  pulse_loco_free(ctx);
}

/* Between re-syncs a member estimates its drift from the reference's range
 * sketches instead of its values (docs/formats/loco-chunks.md "Drift"): close to the exact
 * drift when ranges differ, and exactly 0 over ranges flagged as equal. */
Test(loco, sketch_estimates_the_drift_without_the_values, .timeout = 60) {
  enum { SP = 65536, SR = 1024, SC = SP / SR };
  float *theta = malloc(SP * sizeof *theta), *moved = malloc(SP * sizeof *moved);
  float *zero = calloc(SP, sizeof *zero);
  double *sketch = malloc(SC * PULSE_LOCO_SKETCH * sizeof *sketch);
  uint8_t differ[SC];
  lt_fill_weights(theta, SP, 5, 0.5f);
  pulse_loco *ref = lt_ctx(SP, 0, theta), *mine = lt_ctx(SP, 1, theta);
  for (uint64_t k = 0; k < SC; k++)
    cr_assert_eq(pulse_loco_range_sketch(ref, k * SR, SR,
                                         sketch + k * PULSE_LOCO_SKETCH),
                 PULSE_OK);
  uint64_t rng = 9;
  const double scales[] = {1e-4, 1e-3, 1e-2};
  for (size_t s = 0; s < 3; s++) {
    /* Every other range moved by a relative `scale`. */
    memcpy(moved, theta, SP * sizeof *moved);
    for (uint64_t k = 0; k < SC; k += 2)
      for (uint64_t i = k * SR; i < (k + 1) * SR; i++)
        moved[i] += (float)scales[s] * lt_normal(&rng) * fabsf(theta[i]);
    cr_assert_eq(pulse_loco_resync_range(mine, 0, SP, moved, zero), PULSE_OK);
    for (uint64_t k = 0; k < SC; k++) {
      uint64_t a, b;
      pulse_loco_range_digest(ref, k * SR, SR, &a);
      pulse_loco_range_digest(mine, k * SR, SR, &b);
      differ[k] = a != b;
    }
    double exact = pulse_loco_drift(moved, theta, SP);
    double est = pulse_loco_drift_estimate(mine, SR, differ, sketch);
    cr_log_info("scale %g: drift %g, estimate %g", scales[s], exact, est);
    cr_assert(exact > 0.0);
    cr_assert(est > 0.8 * exact && est < 1.2 * exact,
              "scale %g: estimate %g, drift %g", scales[s], est, exact);
  }
  /* Ranges flagged as equal count nothing; no flag, no drift. */
  memset(differ, 0, sizeof differ);
  cr_assert_eq(pulse_loco_drift_estimate(mine, SR, differ, sketch), 0.0);
  pulse_loco_free(ref), pulse_loco_free(mine);
  free(theta), free(moved), free(zero), free(sketch);
}
