/* test_partition.c - partitioned averaging in memory (PAYLOAD.md
 * "Partitioned averaging"): the plan, and a partitioned round equal bit for
 * bit to pulse_loco_finish over the same contributors (theta_g, b, e, round)
 * across seeds, member counts, bandwidths, empty ranges and silent ranges. */
#include "loco_testutil.h"
#include "pulse_loco_partition.h"

#define MAX_N 9u

/* ------------------------------------------------------------------ plan */

Test(partition, plan_covers_the_vector_in_aligned_proportional_ranges) {
  uint64_t seed = 7;
  for (int trial = 0; trial < 300; trial++) {
    uint32_t n = 1 + (uint32_t)(pulse_rng_next(&seed) % MAX_N);
    uint64_t P = 1 + pulse_rng_next(&seed) % 100000;
    uint32_t ids[MAX_N];
    uint64_t w[MAX_N], total = 0;
    for (uint32_t k = 0; k < n; k++) {
      ids[k] = (k ? ids[k - 1] : 0) + 1 + (uint32_t)(pulse_rng_next(&seed) % 5);
      w[k] = pulse_rng_next(&seed) % 4 == 0 ? 0 : pulse_rng_next(&seed) % 1000;
      total += w[k];
    }
    pulse_loco_plan plan, again;
    cr_assert_eq(pulse_loco_plan_make(P, ids, w, n, &plan), PULSE_OK);
    cr_assert_eq(pulse_loco_plan_make(P, ids, w, n, &again), PULSE_OK);
    cr_assert_eq(memcmp(&plan, &again, sizeof plan), 0);
    cr_assert_eq(plan.start[0], 0);
    cr_assert_eq(plan.start[n], P);
    uint64_t cells = (P + PULSE_LOCO_PART_ALIGN - 1) / PULSE_LOCO_PART_ALIGN;
    for (uint32_t k = 0; k < n; k++) {
      cr_assert_eq(plan.ids[k], ids[k]);
      cr_assert_leq(plan.start[k], plan.start[k + 1]);
      cr_assert(plan.start[k] % PULSE_LOCO_PART_ALIGN == 0 ||
                plan.start[k] == P);
      uint64_t len = plan.start[k + 1] - plan.start[k];
      if (total == 0)
        continue;
      if (w[k] == 0) {
        cr_assert_eq(len, 0, "weight 0 owns nothing");
        continue;
      }
      /* Within one cell of its share (boundaries round down to cells). */
      double share = (double)cells * (double)w[k] / (double)total;
      double got = (double)((len + PULSE_LOCO_PART_ALIGN - 1) /
                            PULSE_LOCO_PART_ALIGN);
      cr_assert(got >= share - 1.0001 && got <= share + 1.0001,
                "owner %u: %.1f cells for a share of %.1f", k, got, share);
    }
    cr_assert_eq(pulse_loco_plan_index(&plan, ids[n - 1]), (int)n - 1);
    cr_assert_eq(pulse_loco_plan_index(&plan, ids[n - 1] + 1), -1);
  }
}

Test(partition, plan_refuses_bad_arguments) {
  uint32_t ids[3] = {1, 1, 2};
  pulse_loco_plan plan;
  cr_assert_eq(pulse_loco_plan_make(100, ids, NULL, 3, &plan), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_plan_make(0, ids + 1, NULL, 2, &plan), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_plan_make(100, ids, NULL, 0, &plan), PULSE_ERR_ARG);
  cr_assert_eq(pulse_loco_plan_make(100, ids + 1, NULL, 2, &plan), PULSE_OK);
}

Test(partition, checkers_are_a_rotation_of_the_others) {
  uint32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  pulse_loco_plan plan;
  cr_assert_eq(pulse_loco_plan_make(8 * 1024, ids, NULL, 8, &plan), PULSE_OK);
  int partner_seen[8][8];
  memset(partner_seen, 0, sizeof partner_seen);
  for (uint64_t r = 0; r < 7; r++) {
    int load[8] = {0};
    for (uint32_t k = 0; k < 8; k++) {
      int c = pulse_loco_plan_checker(&plan, r, 0, k, NULL);
      cr_assert(c >= 0 && c != (int)k);
      load[c]++;
      partner_seen[k][c] = 1;
    }
    for (int j = 0; j < 8; j++)
      cr_assert_eq(load[j], 1, "one range to check per trainer and round");
  }
  for (int k = 0; k < 8; k++)
    for (int j = 0; j < 8; j++)
      cr_assert_eq(partner_seen[k][j], j != k, "every partner in 7 rounds");
  uint8_t eligible[8] = {1, 0, 0, 0, 0, 0, 0, 0};
  cr_assert_eq(pulse_loco_plan_checker(&plan, 3, 0, 5, eligible), 0);
  cr_assert_eq(pulse_loco_plan_checker(&plan, 3, 0, 0, eligible), -1);
}

/* ------------------------------------------------------- the equivalence */

typedef struct {
  uint32_t n;
  uint64_t P;
  uint32_t ids[MAX_N];
  pulse_loco *ref[MAX_N];  /* all-to-all */
  pulse_loco *part[MAX_N]; /* partitioned */
  float *theta_r[MAX_N];
} pair_run;

static void run_create(pair_run *g, uint32_t n, uint64_t P, uint64_t seed,
                       const pulse_loco_opts *base) {
  memset(g, 0, sizeof *g);
  g->n = n, g->P = P;
  float *theta = malloc(P * sizeof *theta);
  lt_fill_weights(theta, P, seed, 0.05f);
  for (uint32_t i = 0; i < n; i++) {
    g->ids[i] = 2 * i + (uint32_t)(seed % 3);
    pulse_loco_opts o = *base;
    o.param_count = P;
    o.trainer_id = g->ids[i];
    cr_assert_eq(pulse_loco_create(&o, theta, &g->ref[i]), PULSE_OK);
    cr_assert_eq(pulse_loco_create(&o, theta, &g->part[i]), PULSE_OK);
    g->theta_r[i] = malloc(P * sizeof(float));
  }
  free(theta);
}

static void run_free(pair_run *g) {
  for (uint32_t i = 0; i < g->n; i++) {
    pulse_loco_free(g->ref[i]);
    pulse_loco_free(g->part[i]);
    free(g->theta_r[i]);
  }
}

static void assert_same_bits(const float *a, const float *b, uint64_t n,
                             const char *what, uint32_t trainer) {
  for (uint64_t i = 0; i < n; i++)
    cr_assert_eq(lt_bits(a[i]), lt_bits(b[i]),
                 "%s of trainer %u differs at %llu: %a vs %a", what, trainer,
                 (unsigned long long)i, (double)a[i], (double)b[i]);
}

/* Every trainer's local progress: theta_g plus noise, except trainer 0 in
 * the first third of the vector (it sends nothing there). */
static void local_steps(pair_run *g, uint64_t *rng) {
  for (uint32_t i = 0; i < g->n; i++) {
    const float *tg = pulse_loco_global(g->ref[i]);
    float scale = 0.002f * (float)(1 + i % 3);
    for (uint64_t j = 0; j < g->P; j++)
      g->theta_r[i][j] =
          (i == 0 && j < g->P / 3) ? tg[j] : tg[j] + lt_normal(rng) * scale;
  }
}

/* One round both ways; `whole` adds some senders' whole payloads instead
 * of their slices. */
static void one_round(pair_run *g, const uint64_t *weights, uint64_t *rng,
                      int leaving_last) {
  local_steps(g, rng);
  pulse_loco_contribution set[MAX_N];
  uint64_t samples[MAX_N];
  for (uint32_t i = 0; i < g->n; i++) {
    samples[i] = 1 + pulse_rng_next(rng) % 200;
    uint32_t flags = (leaving_last && i == g->n - 1) ? PULSE_LOCO_LEAVING : 0;
    const uint8_t *p1, *p2;
    size_t s1, s2;
    cr_assert_eq(pulse_loco_prepare(g->ref[i], g->theta_r[i], samples[i],
                                    flags, &p1, &s1, NULL),
                 PULSE_OK, "%s", pulse_error_detail());
    cr_assert_eq(pulse_loco_prepare(g->part[i], g->theta_r[i], samples[i],
                                    flags, &p2, &s2, NULL),
                 PULSE_OK);
    cr_assert(s1 == s2 && memcmp(p1, p2, s1) == 0);
    /* A copy: a trainer's payload goes with its finish. */
    uint8_t *copy = malloc(s1);
    memcpy(copy, p1, s1);
    set[i] = (pulse_loco_contribution){copy, s1};
    cr_assert_eq(pulse_loco_set_members(g->ref[i], g->n + 1), PULSE_OK);
    cr_assert_eq(pulse_loco_set_members(g->part[i], g->n + 1), PULSE_OK);
  }
  pulse_loco_plan plan;
  cr_assert_eq(pulse_loco_plan_make(g->P, g->ids, weights, g->n, &plan),
               PULSE_OK);
  pulse_buffer blobs[MAX_N];
  pulse_loco_contribution bl[MAX_N];
  for (uint32_t k = 0; k < g->n; k++) {
    pulse_loco_reducer *r = NULL;
    cr_assert_eq(pulse_loco_reducer_create(g->part[k], &plan, k, samples, &r),
                 PULSE_OK);
    /* Slices arrive in any order. */
    uint32_t first = (uint32_t)(pulse_rng_next(rng) % g->n);
    for (uint32_t t = 0; t < g->n; t++) {
      uint32_t i = (first + t) % g->n;
      if (pulse_rng_next(rng) % 4 == 0) {
        cr_assert_eq(pulse_loco_reducer_add(r, set[i].data, set[i].size),
                     PULSE_OK, "%s", pulse_error_detail());
        continue;
      }
      pulse_buffer s;
      cr_assert_eq(pulse_loco_slice_encode(g->part[i], plan.start[k],
                                           plan.start[k + 1], &s),
                   PULSE_OK);
      cr_assert_eq(pulse_loco_reducer_add(r, s.data, s.size), PULSE_OK, "%s",
                   pulse_error_detail());
      cr_assert_eq(pulse_loco_reducer_add(r, s.data, s.size),
                   PULSE_ERR_DUPLICATE);
      pulse_buffer_free(&s);
    }
    cr_assert(pulse_loco_reducer_complete(r));
    cr_assert_eq(pulse_loco_reducer_finish(r, &blobs[k]), PULSE_OK, "%s",
                 pulse_error_detail());
    bl[k] = (pulse_loco_contribution){blobs[k].data, blobs[k].size};
    pulse_loco_reducer_free(r);
  }
  for (uint32_t i = 0; i < g->n; i++) {
    pulse_loco_finish_info a, b;
    pulse_loco_reduced_verdict v;
    cr_assert_eq(pulse_loco_finish(g->ref[i], set, g->n, NULL, &a), PULSE_OK);
    cr_assert_eq(pulse_loco_finish_reduced(g->part[i], &plan, bl, samples,
                                           NULL, &b, &v),
                 PULSE_OK, "%s", pulse_error_detail());
    cr_assert(a.round == b.round && a.contributors == b.contributors &&
              a.self_included == b.self_included && a.samples == b.samples &&
              a.entries == b.entries);
  }
  for (uint32_t k = 0; k < g->n; k++) {
    pulse_buffer_free(&blobs[k]);
    free((void *)set[k].data);
  }
  for (uint32_t i = 0; i < g->n; i++) {
    cr_assert_eq(pulse_loco_round(g->ref[i]), pulse_loco_round(g->part[i]));
    assert_same_bits(pulse_loco_global(g->ref[i]),
                     pulse_loco_global(g->part[i]), g->P, "theta_g", i);
    assert_same_bits(pulse_loco_momentum(g->ref[i]),
                     pulse_loco_momentum(g->part[i]), g->P, "b", i);
    assert_same_bits(pulse_loco_residual(g->ref[i]),
                     pulse_loco_residual(g->part[i]), g->P, "e", i);
  }
}

static void equivalence_trials(const pulse_loco_opts *base, int trials,
                               uint64_t seed0) {
  uint64_t rng = seed0;
  for (int t = 0; t < trials; t++) {
    uint32_t n = 1 + (uint32_t)(t % MAX_N);
    /* Small vectors give empty ranges (fewer cells than owners). */
    uint64_t P = t % 5 == 0 ? 1 + pulse_rng_next(&rng) % 400
                            : 500 + pulse_rng_next(&rng) % 3000;
    uint64_t w[MAX_N];
    for (uint32_t k = 0; k < n; k++)
      w[k] = t % 3 == 0 ? 1 : (pulse_rng_next(&rng) % 5 == 0 ? 0 : 1 + pulse_rng_next(&rng) % 50);
    pair_run g;
    run_create(&g, n, P, seed0 + (uint64_t)t, base);
    for (int round = 0; round < 3; round++)
      one_round(&g, w, &rng, round == 2 && t % 2 == 1);
    run_free(&g);
  }
}

Test(partition, equals_all_to_all_bit_for_bit, .timeout = 120) {
  pulse_loco_opts o = PULSE_LOCO_OPTS_INIT;
  equivalence_trials(&o, 36, 11);
}

Test(partition, equals_all_to_all_under_other_options, .timeout = 120) {
  pulse_loco_opts o = PULSE_LOCO_OPTS_INIT;
  o.rule = PULSE_LOCO_RULE_KEEP; /* denominator scaled to the members */
  o.values = PULSE_LOCO_VALUES_RAW;
  o.pos_model = PULSE_POS_PLAIN;
  o.chunk_log2 = 10;
  equivalence_trials(&o, 18, 101);
  pulse_loco_opts d = PULSE_LOCO_OPTS_INIT;
  d.gate = PULSE_LOCO_GATE_NONE; /* dense DiLoCo: every entry */
  equivalence_trials(&d, 9, 202);
}
