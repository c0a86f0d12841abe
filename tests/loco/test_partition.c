/* test_partition.c - partitioned averaging in memory (docs/formats/loco-payload.md
 * "Partitioned averaging"): the plan, and a partitioned round equal bit for
 * bit to pulse_loco_finish over the same contributors (theta_g, b, e, round)
 * across seeds, member counts, bandwidths, empty ranges and silent ranges. */
#include "loco_impl.h"
#include "loco_testutil.h"
#include "partition_impl.h"
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

/* Weights from reported bandwidths: the median's place for a missing one,
 * every one within [ceil(m/2), 2m] (so at most 4x apart however the
 * reports lie), reported ones inside that kept as they are, none reported
 * equal; and the plan from them in the rates' proportion. */
Test(partition, plan_weights_follow_bandwidth_within_a_bounded_ratio) {
  uint64_t seed = 11;
  for (int trial = 0; trial < 500; trial++) {
    uint32_t n = 1 + (uint32_t)(pulse_rng_next(&seed) % MAX_N);
    uint64_t bw[MAX_N], w[MAX_N], again[MAX_N], sorted[MAX_N];
    size_t nrep = 0;
    for (uint32_t k = 0; k < n; k++) {
      uint64_t x = pulse_rng_next(&seed);
      bw[k] = x % 5 == 0 ? 0 : x % 5 == 1 ? x : (x >> 40) + 1;
      if (bw[k] > 0)
        sorted[nrep++] = bw[k];
    }
    pulse_loco_plan_weights(bw, n, w);
    pulse_loco_plan_weights(bw, n, again);
    cr_assert_eq(memcmp(w, again, n * sizeof *w), 0);
    if (nrep == 0) {
      for (uint32_t k = 0; k < n; k++)
        cr_assert_eq(w[k], 1);
      continue;
    }
    for (size_t a = 1; a < nrep; a++) /* the median, by insertion sort */
      for (size_t b = a; b > 0 && sorted[b - 1] > sorted[b]; b--) {
        uint64_t t = sorted[b];
        sorted[b] = sorted[b - 1], sorted[b - 1] = t;
      }
    uint64_t m = sorted[(nrep - 1) / 2];
    m = m > (1ull << 62) ? 1ull << 62 : m;
    uint64_t lo = (m + 1) / 2, hi = 2 * m, wmin = UINT64_MAX, wmax = 0;
    for (uint32_t k = 0; k < n; k++) {
      cr_assert(w[k] >= lo && w[k] <= hi);
      if (bw[k] == 0)
        cr_assert_eq(w[k], m);
      else if (bw[k] >= lo && bw[k] <= hi)
        cr_assert_eq(w[k], bw[k]);
      wmin = w[k] < wmin ? w[k] : wmin;
      wmax = w[k] > wmax ? w[k] : wmax;
    }
    /* wmax <= 4 wmin, without overflowing 4 wmin. */
    uint64_t R = PULSE_LOCO_PLAN_MAX_RATIO;
    cr_assert(wmax / R < wmin || (wmax / R == wmin && wmax % R == 0),
              "%llu over %llu", (unsigned long long)wmax,
              (unsigned long long)wmin);
  }
  /* 1, 2, 3, 4 MB/s and one unknown: ranges in that proportion, the
   * unknown at the median (2); a liar at 10^18 gets twice the median's. */
  uint32_t ids[5] = {2, 4, 6, 8, 10};
  uint64_t bw[5] = {1000000, 2000000, 3000000, 4000000, 0}, w[5];
  pulse_loco_plan_weights(bw, 5, w);
  pulse_loco_plan plan;
  uint64_t P = 120 * PULSE_LOCO_PART_ALIGN;
  cr_assert_eq(pulse_loco_plan_make(P, ids, w, 5, &plan), PULSE_OK);
  const uint64_t cells[5] = {10, 20, 30, 40, 20};
  for (int k = 0; k < 5; k++)
    cr_assert_eq(plan.start[k + 1] - plan.start[k],
                 cells[k] * PULSE_LOCO_PART_ALIGN, "owner %d", k);
  uint64_t liar[4] = {1000, 1000, 1000, 1000000000000000000ull};
  pulse_loco_plan_weights(liar, 4, w);
  cr_assert_eq(pulse_loco_plan_make(P, ids, w, 4, &plan), PULSE_OK);
  for (int k = 0; k < 3; k++)
    cr_assert_eq(plan.start[k + 1] - plan.start[k], 24 * PULSE_LOCO_PART_ALIGN);
  cr_assert_eq(plan.start[4] - plan.start[3], 48 * PULSE_LOCO_PART_ALIGN);
}

#ifdef __SIZEOF_INT128__
/* The plans' floor(a * b / c) against 128-bit arithmetic, products far
 * past 2^64 included (an active plan's total cost times a sum of weights
 * can pass it). */
Test(partition, mul_div_is_exact) {
  uint64_t seed = 5;
  for (int t = 0; t < 100000; t++) {
    uint64_t a = pulse_rng_next(&seed) >> (pulse_rng_next(&seed) % 64);
    uint64_t b = pulse_rng_next(&seed) >> (pulse_rng_next(&seed) % 64);
    uint64_t c = pulse_rng_next(&seed) >> (pulse_rng_next(&seed) % 64);
    c = c ? c : 1;
    unsigned __int128 q = (unsigned __int128)a * b / c;
    if (q >> 64) /* outside the contract */
      continue;
    cr_assert_eq(loco_mul_div(a, b, c), (uint64_t)q,
                 "%llu * %llu / %llu", (unsigned long long)a,
                 (unsigned long long)b, (unsigned long long)c);
  }
  cr_assert_eq(loco_mul_div(UINT64_MAX, UINT64_MAX, UINT64_MAX), UINT64_MAX);
  cr_assert_eq(loco_mul_div(1ull << 40, 1ull << 40, 1ull << 30), 1ull << 50);
}

/* The cut at the largest sizes: 2^36 parameters (2^29 cells) among 1024
 * owners of weights near 2^24: each start is floor(cells * W_<k / W)
 * cells, computed here in 128 bits. */
Test(partition, plan_boundaries_are_exact_at_the_largest_sizes) {
  static uint32_t ids[PULSE_LOCO_PART_MAX];
  static uint64_t w[PULSE_LOCO_PART_MAX];
  static pulse_loco_plan plan;
  uint64_t seed = 11, total = 0;
  for (uint32_t k = 0; k < PULSE_LOCO_PART_MAX; k++) {
    ids[k] = k + 1;
    w[k] = (1ull << 23) + pulse_rng_next(&seed) % (1ull << 23);
    total += w[k];
  }
  const uint64_t P = PULSE_LOCO_MAX_PARAMS, A = PULSE_LOCO_PART_ALIGN;
  cr_assert_eq(pulse_loco_plan_make(P, ids, w, PULSE_LOCO_PART_MAX, &plan),
               PULSE_OK);
  unsigned __int128 cum = 0, cells = (P + A - 1) / A;
  for (uint32_t k = 0; k < PULSE_LOCO_PART_MAX; k++) {
    uint64_t want = (uint64_t)(cells * cum / total) * A;
    cr_assert_eq(plan.start[k], want, "owner %u", k);
    cum += w[k];
  }
}
#endif

Test(partition, an_active_plan_cuts_the_momentum_s_active_entries) {
  /* 64 cells of theta_g = 1; b moves bf16(1) (pulse_loco_gate) in every
   * element of the last 16 cells only, and is far too small to in the
   * first 48: costs 48 x 1 + 16 x (1 + 128) = 2112, 528 a share of 4.
   * Owner 1 starts after 48 + 3 x 129 = 435 <= 528 (4 would be 564):
   * cell 51; owner 2 after 48 + 7 x 129 = 951 <= 1056: cell 55; owner 3
   * after 48 + 11 x 129 = 1467 <= 1584: cell 59. */
  const uint64_t A = PULSE_LOCO_PART_ALIGN, P = 64 * A;
  float *theta = malloc(P * sizeof *theta);
  cr_assert_not_null(theta);
  for (uint64_t i = 0; i < P; i++)
    theta[i] = 1.0f;
  pulse_loco *ctx = lt_ctx(P, 1, theta);
  uint32_t ids[4] = {1, 2, 3, 4};
  pulse_loco_plan plan, flat;
  /* A zero momentum (round 0): the parameter count cut. */
  cr_assert_eq(pulse_loco_plan_make_active(ctx, ids, NULL, 4, &plan),
               PULSE_OK);
  cr_assert_eq(pulse_loco_plan_make(P, ids, NULL, 4, &flat), PULSE_OK);
  cr_assert_eq(memcmp(&plan, &flat, sizeof plan), 0);
  for (uint64_t i = 0; i < P; i++)
    ctx->b[i] = i < 48 * A ? 1e-9f : 0.25f;
  cr_assert(!lt_ref_gate(1.0f, 1e-9f) && lt_ref_gate(1.0f, 0.25f));
  cr_assert_eq(pulse_loco_plan_make_active(ctx, ids, NULL, 4, &plan),
               PULSE_OK);
  const uint64_t cells[5] = {0, 51, 55, 59, 64};
  for (int k = 0; k <= 4; k++)
    cr_assert_eq(plan.start[k], cells[k] * A, "owner %d starts at %llu", k,
                 (unsigned long long)plan.start[k]);
  /* Bandwidth still weighs: owner 4 at twice the others' rate gets twice
   * their share of the cost (2112 x 3 / 5 = 1267: 48 + 9 x 129 = 1209). */
  uint64_t w[4] = {1, 1, 1, 2};
  cr_assert_eq(pulse_loco_plan_make_active(ctx, ids, w, 4, &plan), PULSE_OK);
  cr_assert_eq(plan.start[3], 57 * A);
  cr_assert_eq(plan.start[4], P);
  /* No context: refused. */
  cr_assert_eq(pulse_loco_plan_make_active(NULL, ids, NULL, 4, &plan),
               PULSE_ERR_ARG);
  pulse_loco_free(ctx);
  free(theta);
}

/* Eight trainers, ids 0..7, equal ranges: the checkers' tests. */
static void eight_equal(pulse_loco_plan *plan) {
  uint32_t ids[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  cr_assert_eq(pulse_loco_plan_make(8 * 1024, ids, NULL, 8, plan), PULSE_OK);
}

/* The checkers of 7 periods of `period` rounds (period 1 and `direct`:
 * pulse_loco_plan_checker itself, else pulse_loco_plan_round_checker):
 * 8 / period ranges checked a round, never by their owner; each trainer
 * checks one range a period; each owner meets every other trainer as its
 * checker exactly once in the 7 periods. */
static void expect_checkers(const pulse_loco_plan *plan, uint32_t period,
                            int direct) {
  int pair_seen[8][8];
  memset(pair_seen, 0, sizeof pair_seen);
  for (uint64_t q = 0; q < 7; q++) {
    int load[8] = {0};
    for (uint64_t r = period * q; r < period * q + period; r++) {
      uint32_t checked = 0;
      for (uint32_t k = 0; k < 8; k++) {
        int c = direct ? pulse_loco_plan_checker(plan, r, 0, k, NULL)
                       : pulse_loco_plan_round_checker(plan, r, 0, period, k,
                                                       NULL);
        if (c < 0)
          continue;
        cr_assert_neq(c, (int)k);
        checked++, load[c]++;
        pair_seen[k][c]++;
      }
      cr_assert_eq(checked, 8 / period, "round %llu: %u ranges checked",
                   (unsigned long long)r, checked);
    }
    for (int j = 0; j < 8; j++)
      cr_assert_eq(load[j], 1, "period %llu: trainer %d checked %d ranges",
                   (unsigned long long)q, j, load[j]);
  }
  for (int k = 0; k < 8; k++)
    for (int j = 0; j < 8; j++)
      cr_assert_eq(pair_seen[k][j], j != k, "owner %d, checker %d", k, j);
}

Test(partition, a_rotating_check_reaches_every_trainer_once_a_period) {
  pulse_loco_plan plan;
  eight_equal(&plan);
  /* (A checked range and a checker that both turned with the round gave
   * one trainer every check.) */
  expect_checkers(&plan, 8, 0);
  /* Period 0 or 1: every range every round, as pulse_loco_plan_checker. */
  for (uint32_t k = 0; k < 8; k++) {
    cr_assert_eq(pulse_loco_plan_round_checker(&plan, 5, 1, 1, k, NULL),
                 pulse_loco_plan_checker(&plan, 5, 1, k, NULL));
    cr_assert_eq(pulse_loco_plan_round_checker(&plan, 5, 1, 0, k, NULL),
                 pulse_loco_plan_checker(&plan, 5, 1, k, NULL));
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
  pulse_loco_plan plan;
  eight_equal(&plan);
  expect_checkers(&plan, 1, 1); /* every range every round */
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
  int keep; /* the keep rule (its denominator: no averages' scale) */
  int gate_mean;
  uint64_t deferred; /* trainer 0's sent entries kept in its e */
  uint64_t quorum;   /* ... sent by a quorum of the contributors */
} pair_run;

static void run_create(pair_run *g, uint32_t n, uint64_t P, uint64_t seed,
                       const pulse_loco_opts *base) {
  memset(g, 0, sizeof *g);
  g->n = n, g->P = P;
  g->keep = base->rule == PULSE_LOCO_RULE_KEEP;
  g->gate_mean = base->gate_mean;
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
  /* Half the rounds, samples whose sum over their gcd is a power of two
   * 2^q (32 times 1, ..., 1, 2^q - (n - 1)): the owners code the averages
   * scaled by 2^q (PLRD byte 5), the other half q is 0. */
  unsigned pow2 = pulse_rng_next(rng) % 2 == 0 ? 1u : 0u;
  while (pow2 && (1u << pow2) < g->n)
    pow2++;
  for (uint32_t i = 0; i < g->n; i++) {
    samples[i] = 1 + pulse_rng_next(rng) % 200;
    if (pow2)
      samples[i] = 32u * (i + 1 < g->n ? 1u : (1u << pow2) - (g->n - 1u));
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
    /* The scale: 2^q = W / gcd under the drop rule (the keep rule's
     * denominator with absent members is not W: no scale). */
    unsigned q = pow2 && !g->keep ? pow2 : 0;
    if (g->n == 1 && pow2)
      q = 0; /* one contributor of 32: W / gcd = 1 */
    cr_assert_eq(blobs[k].data[5], q, "range %u: scale %u, want %u", k,
                 blobs[k].data[5], q);
    cr_assert_eq(blobs[k].data[6], g->gate_mean ? 1 : 0, "range %u: flags", k);
    bl[k] = (pulse_loco_contribution){blobs[k].data, blobs[k].size};
    pulse_loco_reducer_free(r);
  }
  /* Trainer 0's sent entries and how many contributors sent each, to
   * count those it keeps after the round: the mean gate's deferred ones
   * (none without it, none where a quorum sent). */
  pulse_loco_payload_header h0;
  pulse_loco_entries sent0 = PULSE_LOCO_ENTRIES_INIT;
  float *tg0 = malloc(g->P * sizeof *tg0);
  uint32_t *senders = calloc(g->P, sizeof *senders);
  for (uint32_t i = g->n; i-- > 0;) {
    pulse_loco_entries_free(&sent0);
    memcpy(tg0, pulse_loco_global(g->ref[0]), g->P * sizeof *tg0);
    cr_assert_eq(pulse_loco_payload_decode(set[i].data, set[i].size, tg0,
                                           NULL, g->P, &h0, &sent0),
                 PULSE_OK);
    for (uint64_t j = 0; j < sent0.count; j++)
      senders[sent0.pos[j]]++;
  }
  for (uint32_t i = 0; i < g->n; i++) {
    pulse_loco_finish_figures a, b;
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
  const float *e0 = pulse_loco_residual(g->part[0]);
  for (uint64_t j = 0; j < sent0.count; j++) {
    uint64_t p = sent0.pos[j];
    g->deferred += e0[p] != 0.0f;
    if (g->gate_mean && senders[p] >= LOCO_GATE_QUORUM) {
      cr_assert_eq(lt_bits(e0[p]), 0u, "%u of %u sent %llu, yet kept",
                   senders[p], g->n, (unsigned long long)p);
      g->quorum++;
    }
  }
  pulse_loco_entries_free(&sent0);
  free(tg0), free(senders);
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

/* Returns how many sent entries trainer 0 kept in e over the trials (the
 * mean gate's deferred ones); *quorum (may be NULL): how many it sent
 * where a quorum of the contributors did too (all applied). */
static uint64_t equivalence_trials(const pulse_loco_opts *base, int trials,
                                   uint64_t seed0, uint64_t *quorum) {
  uint64_t rng = seed0, deferred = 0;
  if (quorum)
    *quorum = 0;
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
    deferred += g.deferred;
    if (quorum)
      *quorum += g.quorum;
    run_free(&g);
  }
  return deferred;
}

Test(partition, equals_all_to_all_bit_for_bit, .timeout = 120) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  cr_assert_eq(equivalence_trials(&o, 36, 11, NULL), 0, "sent entries kept in e");
}

Test(partition, equals_all_to_all_under_other_options, .timeout = 120) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.rule = PULSE_LOCO_RULE_KEEP; /* denominator scaled to the members */
  o.values = PULSE_LOCO_VALUES_RAW;
  o.pos_model = PULSE_POS_PLAIN;
  o.chunk_log2 = 10;
  equivalence_trials(&o, 18, 101, NULL);
  pulse_loco_opts d;
  pulse_loco_opts_init(&d);
  d.gate = PULSE_LOCO_GATE_NONE; /* dense DiLoCo: every entry */
  equivalence_trials(&d, 9, 202, NULL);
}

/* The mean gate: owners write only the means it accepts (those that pass
 * the gate, those a quorum of the contributors sent, a leaving trainer's
 * flushed elements), the all-to-all finish gates its means alike; the same
 * bits, e included. Both happen: trainer 0 keeps some of the entries it
 * sent (where fewer than a quorum sent), and where a quorum sent, it
 * keeps none (one_round checks). Every other trial has a leaving trainer
 * in its last round. */
Test(partition, equals_all_to_all_with_the_mean_gate, .timeout = 120) {
  uint64_t quorum;
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.gate_mean = 1;
  cr_assert_gt(equivalence_trials(&o, 27, 303, &quorum), 0);
  cr_assert_gt(quorum, 0);
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.values = PULSE_LOCO_VALUES_RAW;
  cr_assert_gt(equivalence_trials(&o, 9, 404, &quorum), 0);
  cr_assert_gt(quorum, 0);
  pulse_loco_opts d;
  pulse_loco_opts_init(&d);
  d.gate = PULSE_LOCO_GATE_NONE;
  d.gate_mean = 1;
  equivalence_trials(&d, 9, 505, &quorum);
  cr_assert_gt(quorum, 0);
}

/* ------------------------------------------------------- bad reductions */

#include "partition_blob_impl.h"

/* Three trainers with a prepared round and the honest blobs of a plan. */
typedef struct {
  pulse_loco *t[3];
  uint32_t ids[3];
  uint64_t samples[3];
  pulse_loco_plan plan;
  pulse_buffer blob[3];
  pulse_loco_contribution set[3];
} small_round;

static void small_create(small_round *s, uint64_t P) {
  memset(s, 0, sizeof *s);
  float *theta = malloc(P * sizeof *theta), *r = malloc(P * sizeof *r);
  lt_fill_weights(theta, P, 5, 0.05f);
  uint64_t rng = 17;
  for (uint32_t i = 0; i < 3; i++) {
    s->ids[i] = 4 + i;
    s->samples[i] = 10 * (i + 1);
    s->t[i] = lt_ctx(P, s->ids[i], theta);
    for (uint64_t j = 0; j < P; j++)
      r[j] = theta[j] + lt_normal(&rng) * 0.003f;
    cr_assert_eq(pulse_loco_prepare(s->t[i], r, s->samples[i], 0, NULL, NULL,
                                    NULL),
                 PULSE_OK);
    cr_assert_eq(pulse_loco_set_members(s->t[i], 3), PULSE_OK);
  }
  cr_assert_eq(pulse_loco_plan_make(P, s->ids, NULL, 3, &s->plan), PULSE_OK);
  for (uint32_t k = 0; k < 3; k++) {
    pulse_loco_reducer *red;
    cr_assert_eq(pulse_loco_reducer_create(s->t[k], &s->plan, k, s->samples,
                                           &red),
                 PULSE_OK);
    for (uint32_t i = 0; i < 3; i++) {
      pulse_buffer b;
      cr_assert_eq(pulse_loco_slice_encode(s->t[i], s->plan.start[k],
                                           s->plan.start[k + 1], &b),
                   PULSE_OK);
      cr_assert_eq(pulse_loco_reducer_add(red, b.data, b.size), PULSE_OK);
      pulse_buffer_free(&b);
    }
    cr_assert_eq(pulse_loco_reducer_finish(red, &s->blob[k]), PULSE_OK);
    s->set[k] = (pulse_loco_contribution){s->blob[k].data, s->blob[k].size};
    pulse_loco_reducer_free(red);
  }
  free(theta), free(r);
}

static void small_free(small_round *s) {
  for (uint32_t i = 0; i < 3; i++) {
    pulse_loco_free(s->t[i]);
    pulse_buffer_free(&s->blob[i]);
  }
}

/* A blob like range k's, with its averages and receipts as the caller
 * changed them (`edit`). */
typedef void (*edit_fn)(pulse_loco_reduced *d);

static pulse_buffer forge(small_round *s, uint32_t k, edit_fn edit) {
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
  cr_assert_eq(pulse_loco_reduced_decode(s->t[0], &s->plan, k, NULL,
                                         s->blob[k].data, s->blob[k].size, &d),
               PULSE_OK, "%s", pulse_error_detail());
  edit(&d);
  loco_reduced_head h = {d.owner, d.members, d.ncontrib, d.round,
                         d.param_count, d.base_digest, d.start, d.end, 0};
  for (uint32_t i = 0; i < d.ncontrib; i++)
    h.weight += d.contrib[i].samples;
  pulse_buffer out;
  cr_assert_eq(loco_reduced_encode(s->t[0], &h, d.contrib, d.avg.pos,
                                   d.avg.val, d.avg.count, &out),
               PULSE_OK);
  pulse_loco_reduced_free(&d);
  return out;
}

static void wrong_value(pulse_loco_reduced *d) {
  d->avg.val[d->avg.count / 2] *= 1.0001f;
}
static void overflowing_value(pulse_loco_reduced *d) {
  d->avg.val[0] = 3e38f; /* finite, but the step leaves the floats */
}
static void wrong_receipt(pulse_loco_reduced *d) {
  d->contrib[1].receipt ^= 1; /* trainer 5's slice replaced */
}
static void wrong_samples(pulse_loco_reduced *d) {
  d->contrib[2].samples += 7; /* a contributor weighed more */
}

/* Whether ctx's state is still the prepared round's, untouched. */
static void assert_untouched(pulse_loco *ctx, uint64_t digest) {
  cr_assert_eq(pulse_loco_round(ctx), 0);
  cr_assert_eq(pulse_loco_global_digest(ctx), digest);
  cr_assert_eq(pulse_loco_set_members(ctx, 3), PULSE_OK, "still prepared");
}

Test(partition, a_wrong_receipt_sample_count_or_overflow_is_refused_with_its_owner) {
  small_round s;
  small_create(&s, 3000);
  uint64_t digest = pulse_loco_global_digest(s.t[1]);
  edit_fn edits[3] = {wrong_receipt, wrong_samples, overflowing_value};
  for (int e = 0; e < 3; e++) {
    pulse_buffer bad = forge(&s, 0, edits[e]);
    pulse_loco_contribution set[3] = {{bad.data, bad.size}, s.set[1], s.set[2]};
    pulse_loco_reduced_verdict v;
    /* Trainer 5 (index 1) finds its receipt wrong; any trainer finds the
     * samples differ from the granted ones. */
    cr_assert_eq(pulse_loco_finish_reduced(s.t[1], &s.plan, set, s.samples,
                                           NULL, NULL, &v),
                 PULSE_ERR_CORRUPT);
    cr_assert(v.has_offender);
    cr_assert_eq(v.offender, s.ids[0]);
    assert_untouched(s.t[1], digest);
    pulse_buffer_free(&bad);
  }
  small_free(&s);
}

Test(partition, a_wrong_average_is_caught_by_the_recomputation) {
  small_round s;
  small_create(&s, 3000);
  pulse_buffer bad = forge(&s, 2, wrong_value);
  /* Receipts and samples are right: the blob decodes and fits ... */
  pulse_loco_reduced d = PULSE_LOCO_REDUCED_INIT;
  cr_assert_eq(pulse_loco_reduced_decode(s.t[0], &s.plan, 2, s.samples,
                                         bad.data, bad.size, &d),
               PULSE_OK);
  pulse_loco_reduced_free(&d);
  /* ... but the checker's reduction of the same slices has other bytes, and
   * the verdicts name the owner. */
  cr_assert(bad.size != s.blob[2].size ||
            memcmp(bad.data, s.blob[2].data, bad.size) != 0);
  static pulse_loco_verdict v[3];
  for (uint32_t i = 0; i < 3; i++) {
    memset(&v[i], 0, sizeof v[i]);
    v[i].peer = s.ids[i], v[i].round = 0, v[i].attempt = 0, v[i].count = 3;
    for (uint32_t k = 0; k < 3; k++) {
      v[i].items[k].owner = s.ids[k];
      v[i].items[k].blob_digest = 42 + k;
    }
  }
  uint32_t off[3];
  size_t noff;
  cr_assert_eq(pulse_loco_verdicts_offenders(&s.plan, 0, 0, v, 3, off, &noff),
               PULSE_OK);
  cr_assert_eq(noff, 0);
  int checker = pulse_loco_plan_checker(&s.plan, 0, 0, 2, NULL);
  v[checker].items[2].flags =
      PULSE_LOCO_VERDICT_CHECKED | PULSE_LOCO_VERDICT_MISMATCH;
  cr_assert_eq(pulse_loco_verdicts_offenders(&s.plan, 0, 0, v, 3, off, &noff),
               PULSE_OK);
  cr_assert(noff == 1 && off[0] == s.ids[2]);
  /* An owner that served two versions is an offender too. */
  v[checker].items[2].flags = 0;
  v[0].items[1].blob_digest = 7;
  cr_assert_eq(pulse_loco_verdicts_offenders(&s.plan, 0, 0, v, 3, off, &noff),
               PULSE_OK);
  cr_assert(noff == 1 && off[0] == s.ids[1]);
  /* Verdicts of another round or plan are refused. */
  v[1].round = 1;
  cr_assert_eq(pulse_loco_verdicts_offenders(&s.plan, 0, 0, v, 3, off, &noff),
               PULSE_ERR_CORRUPT);
  pulse_buffer_free(&bad);
  small_free(&s);
}

Test(partition, hostile_blobs_are_refused_and_change_nothing) {
  small_round s;
  small_create(&s, 2000);
  uint64_t digest = pulse_loco_global_digest(s.t[0]);
  const pulse_buffer *b = &s.blob[1];
  /* Every truncation, every extension. */
  for (size_t n = 0; n < b->size; n += 1 + n / 64) {
    pulse_loco_contribution set[3] = {s.set[0], {b->data, n}, s.set[2]};
    cr_assert_neq(pulse_loco_finish_reduced(s.t[0], &s.plan, set, s.samples,
                                            NULL, NULL, NULL),
                  PULSE_OK);
  }
  uint8_t *longer = malloc(b->size + 1);
  memcpy(longer, b->data, b->size);
  longer[b->size] = 0;
  pulse_loco_contribution set[3] = {s.set[0], {longer, b->size + 1}, s.set[2]};
  cr_assert_neq(pulse_loco_finish_reduced(s.t[0], &s.plan, set, s.samples,
                                          NULL, NULL, NULL),
                PULSE_OK);
  /* Flipped bits in the header and in this trainer's receipt: always
   * refused (the others' receipts are their senders' to check, and the
   * recomputation's). */
  for (size_t at = 0; at < 64 + 28; at++) {
    memcpy(longer, b->data, b->size);
    longer[at] ^= (uint8_t)(1u << (at % 8));
    pulse_loco_contribution f[3] = {s.set[0], {longer, b->size}, s.set[2]};
    cr_assert_neq(pulse_loco_finish_reduced(s.t[0], &s.plan, f, s.samples,
                                            NULL, NULL, NULL),
                  PULSE_OK, "flip at %zu accepted", at);
  }
  /* Another scale than the rule's (10, 20, 30: W / gcd = 6, none). */
  memcpy(longer, b->data, b->size);
  cr_assert_eq(longer[5], 0);
  longer[5] = 1;
  pulse_loco_contribution sc[3] = {s.set[0], {longer, b->size}, s.set[2]};
  cr_assert_neq(pulse_loco_finish_reduced(s.t[0], &s.plan, sc, s.samples, NULL,
                                          NULL, NULL),
                PULSE_OK, "a blob scaled by 2^1 accepted");
  /* Means said gated to a trainer without the mean gate (every trainer
   * must have the same setting), and a flag nobody knows. */
  for (uint8_t flag = 1; flag <= 2; flag++) {
    memcpy(longer, b->data, b->size);
    cr_assert_eq(longer[6], 0);
    longer[6] = flag;
    pulse_loco_contribution gm[3] = {s.set[0], {longer, b->size}, s.set[2]};
    cr_assert_eq(pulse_loco_finish_reduced(s.t[0], &s.plan, gm, s.samples,
                                           NULL, NULL, NULL),
                 PULSE_ERR_CORRUPT, "flags %u accepted", flag);
  }
  /* A blob of another range, in the wrong place. */
  pulse_loco_contribution swapped[3] = {s.set[1], s.set[0], s.set[2]};
  cr_assert_neq(pulse_loco_finish_reduced(s.t[0], &s.plan, swapped, s.samples,
                                          NULL, NULL, NULL),
                PULSE_OK);
  assert_untouched(s.t[0], digest);
  /* And the honest blobs still finish. */
  cr_assert_eq(pulse_loco_finish_reduced(s.t[0], &s.plan, s.set, s.samples,
                                         NULL, NULL, NULL),
               PULSE_OK);
  free(longer);
  small_free(&s);
}

Test(partition, verdicts_round_trip_and_refuse_bad_bytes) {
  static pulse_loco_verdict v, back;
  memset(&v, 0, sizeof v);
  v.peer = 9, v.round = 77, v.attempt = 1, v.count = 5;
  for (uint32_t k = 0; k < 5; k++) {
    v.items[k].owner = 3 * k;
    v.items[k].flags = (uint8_t)(k & 15u);
    v.items[k].blob_digest = 0x1234567890ull * (k + 1);
  }
  pulse_buffer b;
  cr_assert_eq(pulse_loco_verdict_encode(&v, &b), PULSE_OK);
  cr_assert_eq(pulse_loco_verdict_decode(b.data, b.size, &back), PULSE_OK);
  cr_assert(back.peer == 9 && back.round == 77 && back.attempt == 1 &&
            back.count == 5);
  cr_assert_eq(memcmp(back.items, v.items, 5 * sizeof v.items[0]), 0);
  for (size_t n = 0; n < b.size; n++)
    cr_assert_neq(pulse_loco_verdict_decode(b.data, n, &back), PULSE_OK);
  b.data[28 + 4] = 0x80; /* an unknown flag */
  cr_assert_eq(pulse_loco_verdict_decode(b.data, b.size, &back),
               PULSE_ERR_CORRUPT);
  pulse_buffer_free(&b);
}
