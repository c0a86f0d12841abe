/* test_gate.c - the BF16 visibility gate and the error feedback: the gate
 * against its definition on edge values, and mass conservation, bit for
 * bit, through real rounds of a context. */
#include "loco_impl.h"
#include "loco_testutil.h"
#include "pulse_loco_elem.h"

static const uint32_t edge_bits[] = {
    0x00000000u, 0x80000000u,                           /* +-0 */
    0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu, /* subnormals */
    0x00008000u, 0x00018000u, 0x00010000u,              /* subnormal ties */
    0x00800000u, 0x80800000u,                           /* FLT_MIN */
    0x3F800000u, 0xBF800000u,                           /* +-1 */
    0x3F808000u, 0x3F818000u, 0x3F807FFFu, 0x3F808001u, /* ties around 1 */
    0x3B800000u, 0x3B000000u, 0xBB800000u,              /* 2^-8, 2^-9 */
    0x3C000000u, 0x3BFFFFFFu,                           /* 2^-7 */
    0x7F7F7FFFu, 0x7F7F8000u, 0x7F7FFFFFu, 0xFF7FFFFFu, /* near overflow */
    0x7F800000u, 0xFF800000u,                           /* +-inf */
    0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x7FBFFFFFu, /* NaNs */
    0x3E99999Au, 0xC2F6E979u, 0x42280000u,              /* ordinary */
};
#define EDGE_COUNT (sizeof edge_bits / sizeof edge_bits[0])

Test(loco, gate_matches_its_definition_on_edge_values) {
  for (size_t i = 0; i < EDGE_COUNT; i++)
    for (size_t j = 0; j < EDGE_COUNT; j++) {
      float t = lt_float(edge_bits[i]), s = lt_float(edge_bits[j]);
      cr_assert_eq(pulse_loco_gate(t, s), lt_ref_gate(t, s),
                   "gate(0x%08x, 0x%08x): %d, definition says %d", edge_bits[i],
                   edge_bits[j], pulse_loco_gate(t, s), lt_ref_gate(t, s));
    }
}

Test(loco, gate_on_hand_computed_cases) {
  /* 1 + 2^-8 is the tie between 1.0 and 1.0078125: even is 1.0, no change. */
  cr_assert_eq(pulse_loco_gate(1.0f, -0x1p-8f), 0);
  /* 1 + 3*2^-8 ties between odd 0x3F81 and even 0x3F82: changes. */
  cr_assert_eq(pulse_loco_gate(1.0f, -0x3p-8f), 1);
  /* Just past the tie changes, just short does not. */
  cr_assert_eq(pulse_loco_gate(1.0f, -(0x1p-8f + 0x1p-23f)), 1);
  cr_assert_eq(pulse_loco_gate(1.0f, -(0x1p-8f - 0x1p-23f)), 0);
  /* Below 1.0 the BF16 ulp halves: 1 - 2^-9 ties to even 1.0. */
  cr_assert_eq(pulse_loco_gate(1.0f, 0x1p-9f), 0);
  cr_assert_eq(pulse_loco_gate(1.0f, 0x1p-9f + 0x1p-24f), 1);
  /* +0 - (+0) is +0: no change; +0 - (-0)... is +0 too; -0 - (+0) is -0. */
  cr_assert_eq(pulse_loco_gate(0.0f, 0.0f), 0);
  cr_assert_eq(pulse_loco_gate(-0.0f, 0.0f), 0);
  /* -0 - (-0) = +0: the sign bit changes, and a change is a change of bits. */
  cr_assert_eq(pulse_loco_gate(-0.0f, -0.0f), 1);
  /* Any s on a NaN theta: NaN stays the canonical NaN, no change. */
  cr_assert_eq(pulse_loco_gate(NAN, 1.0f), 0);
  /* A NaN s turns a number into NaN: a change. */
  cr_assert_eq(pulse_loco_gate(1.0f, NAN), 1);
  /* Infinite theta absorbs finite s; inf - inf is NaN. */
  cr_assert_eq(pulse_loco_gate(INFINITY, 1e30f), 0);
  cr_assert_eq(pulse_loco_gate(INFINITY, INFINITY), 1);
  /* FLT_MAX rounds to inf in BF16 already; so does FLT_MAX - 1e30. */
  cr_assert_eq(pulse_loco_gate(FLT_MAX, 1e30f), 0);
  /* The smallest subnormal step is far below a BF16 ulp of FLT_MIN... */
  cr_assert_eq(pulse_loco_gate(FLT_MIN, 0x1p-149f), 0);
  /* ...but subnormal theta lives on a 2^-133 grid: 2^-133 moves it. */
  cr_assert_eq(pulse_loco_gate(0x1p-140f, -0x1p-133f), 1);
}

Test(loco, gate_matches_its_definition_on_random_values) {
  uint64_t seed = 7;
  for (int i = 0; i < 200000; i++) {
    float t = lt_float((uint32_t)pulse_rng_next(&seed));
    /* s near the scale of a BF16 ulp of t, so both answers are common. */
    float s = lt_normal(&seed) * fabsf(t) * 0x1p-8f;
    if (i % 3 == 0)
      s = lt_float((uint32_t)pulse_rng_next(&seed));
    cr_assert_eq(pulse_loco_gate(t, s), lt_ref_gate(t, s),
                 "gate(0x%08x, 0x%08x)", lt_bits(t), lt_bits(s));
  }
}

/* The signal is one subtraction then one addition, as the design says. */
Test(loco, signal_is_e_plus_theta_g_minus_theta_r) {
  for (size_t i = 0; i < EDGE_COUNT; i++)
    for (size_t j = 0; j < EDGE_COUNT; j++)
      for (size_t k = 0; k < EDGE_COUNT; k += 3) {
        float g = lt_float(edge_bits[i]), r = lt_float(edge_bits[j]),
              e = lt_float(edge_bits[k]);
        volatile float delta = g - r;
        volatile float want = e + delta;
        float got = pulse_loco_signal(g, r, e);
        cr_assert(lt_bits(got) == lt_bits(want) || (isnan(got) && isnan(want)));
      }
}

/* One round of a context; checks that every entry of s = e_old + delta went
 * wholly to one side: sent (in the payload) or kept (the new e). */
static void check_round_rule(pulse_loco *ctx, const float *theta_r,
                             int included, pulse_loco_rule rule,
                             uint64_t *sent) {
  uint64_t P = pulse_loco_param_count(ctx);
  float *s = malloc(P * sizeof *s), *theta_g = malloc(P * sizeof *theta_g);
  const float *e_old = pulse_loco_residual(ctx);
  memcpy(theta_g, pulse_loco_global(ctx), P * sizeof *theta_g);
  for (uint64_t i = 0; i < P; i++) {
    volatile float delta = theta_g[i] - theta_r[i];
    s[i] = e_old[i] + delta;
  }
  const uint8_t *payload;
  size_t size;
  cr_assert_eq(pulse_loco_prepare(ctx, theta_r, 1, 0, &payload, &size, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  pulse_loco_payload_header h;
  pulse_loco_entries got = PULSE_LOCO_ENTRIES_INIT;
  cr_assert_eq(
      pulse_loco_payload_decode(payload, size, theta_g, NULL, P, &h, &got),
      PULSE_OK, "%s", pulse_error_detail());
  uint8_t *copy = malloc(size);
  memcpy(copy, payload, size);
  if (included) {
    pulse_loco_contribution c = {copy, size};
    cr_assert_eq(pulse_loco_finish(ctx, &c, 1, NULL, NULL), PULSE_OK, "%s",
                 pulse_error_detail());
  } else {
    cr_assert_eq(pulse_loco_abandon(ctx, 0), PULSE_OK);
  }
  const float *e_new = pulse_loco_residual(ctx);
  uint64_t j = 0;
  for (uint64_t i = 0; i < P; i++) {
    int is_sent = j < got.count && got.pos[j] == i;
    cr_assert_eq(is_sent, lt_ref_gate(theta_g[i], s[i]),
                 "entry %llu: sent %d vs the gate", (unsigned long long)i,
                 is_sent);
    if (is_sent) {
      cr_assert_eq(lt_bits(got.val[j]), lt_bits(s[i]), "entry %llu: sent value",
                   (unsigned long long)i);
      j++;
    }
    /* Left out, the sent part goes under the drop rule, stays otherwise. */
    if (is_sent && (included || rule == PULSE_LOCO_RULE_DROP))
      cr_assert_eq(lt_bits(e_new[i]), 0u, "entry %llu: sent, yet kept",
                   (unsigned long long)i);
    else
      cr_assert_eq(lt_bits(e_new[i]), lt_bits(s[i]),
                   "entry %llu: kept 0x%08x, s 0x%08x", (unsigned long long)i,
                   lt_bits(e_new[i]), lt_bits(s[i]));
  }
  cr_assert_eq(j, got.count);
  *sent += got.count;
  pulse_loco_entries_free(&got);
  free(copy), free(s), free(theta_g);
}

static void check_round(pulse_loco *ctx, const float *theta_r, int included,
                        uint64_t *sent) {
  check_round_rule(ctx, theta_r, included, PULSE_LOCO_RULE_DROP, sent);
}

Test(loco, error_feedback_conserves_mass_bit_exactly) {
  const uint64_t P = 50000;
  float *theta = malloc(P * sizeof *theta), *local = malloc(P * sizeof *local);
  lt_fill_weights(theta, P, 11, 0.5f);
  pulse_loco *ctx = lt_ctx(P, 0, theta);
  uint64_t seed = 12, sent = 0;
  for (int round = 0; round < 6; round++) {
    const float *g = pulse_loco_global(ctx);
    for (uint64_t i = 0; i < P; i++) {
      /* Local steps of a few BF16 ulps and less, plus edge values. */
      float step = lt_normal(&seed) * fabsf(g[i]) * 0x1p-9f;
      uint64_t pick = pulse_rng_next(&seed) % 64;
      if (pick == 0)
        step = 0.0f;
      else if (pick == 1)
        step = -0.0f;
      else if (pick == 2)
        step = 0x1p-149f;
      else if (pick == 3)
        step = 1e-38f;
      local[i] = g[i] - step;
    }
    check_round(ctx, local, 1, &sent);
  }
  cr_assert(sent > P / 100 && sent < 6 * P, "the gate sent %llu entries",
            (unsigned long long)sent);
  pulse_loco_free(ctx);
  free(theta), free(local);
}

/* A trainer left out of the round: under the keep (and legacy) rule it
 * keeps all of s, under the drop rule only what it did not send. */
Test(loco, excluded_trainer_keeps_what_its_loss_rule_says) {
  const uint64_t P = 20000;
  static const pulse_loco_rule rules[] = {
      PULSE_LOCO_RULE_DROP, PULSE_LOCO_RULE_KEEP, PULSE_LOCO_RULE_LEGACY};
  float *theta = malloc(P * sizeof *theta), *local = malloc(P * sizeof *local);
  lt_fill_weights(theta, P, 3, 1.0f);
  for (size_t r = 0; r < 3; r++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = P;
    o.trainer_id = 4;
    o.rule = rules[r];
    pulse_loco *ctx = NULL;
    cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK);
    uint64_t seed = 5, sent = 0;
    for (uint64_t i = 0; i < P; i++)
      local[i] = theta[i] + lt_normal(&seed) * 0.01f;
    check_round_rule(ctx, local, 0, rules[r], &sent);
    cr_assert(sent > 0);
    /* Abandoned: the context refuses a new round until a state import. */
    cr_assert_eq(pulse_loco_prepare(ctx, local, 1, 0, NULL, NULL, NULL),
                 PULSE_ERR_ARG);
    pulse_loco_free(ctx);
  }
  free(theta), free(local);
}

Test(loco, non_finite_pseudo_gradient_is_refused) {
  float theta[4] = {1.0f, 2.0f, 3.0f, 4.0f}, local[4] = {1.0f, NAN, 3.0f, 4.0f};
  pulse_loco *ctx = lt_ctx(4, 0, theta);
  cr_assert_eq(pulse_loco_prepare(ctx, local, 1, 0, NULL, NULL, NULL),
               PULSE_ERR_ARG);
  local[1] = 2.0f;
  cr_assert_eq(pulse_loco_prepare(ctx, local, 1, 0, NULL, NULL, NULL),
               PULSE_OK);
  pulse_loco_free(ctx);
}

/* The mean gate (pulse_loco_opts.gate_mean, docs/formats/loco-payload.md "The round"): the
 * step applies a mean where it passes the gate on theta_g or where a
 * quorum of the contributors (LOCO_GATE_QUORUM, 2) sent an entry; elsewhere
 * nothing moves and every contributor keeps what it sent there in e.
 * theta_g = 1 everywhere: bf16 moves down from 1 at |s| > 2^-9, up at
 * s < -2^-8. Three trainers of one sample each:
 *   element 0: 0.003, -, -:          1 sender, mean 0.001, below the gate
 *   element 1: 0.009 each:           3 senders, mean 0.009, passes
 *   element 2: 0.001 each, unsent:   mean 0
 *   element 3: 0.003, -0.005, -:     2 senders, mean -0.00067, below
 *   element 4: 0.003, 0.003, -0.005: 3 senders, mean 0.00033, below
 *   element 5: -, -, 0.009:          1 sender, mean 0.003, passes
 * So 0 waits in trainer 0's e and 3 and 4 are applied by the quorum.
 * Off, every sent entry is applied and cleared from e, as before. With a
 * leaving trainer 0 (its flush ungated), its elements are applied whole. */
#define GM_T 3
#define GM_P 6
static void gate_mean_round(int gate_mean, int leaving, uint32_t version,
                            pulse_loco *t[GM_T], float s[GM_T][GM_P]) {
  static const float theta[GM_P] = {1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f};
  static const float step[GM_T][GM_P] = {
      {0.003f, 0.009f, 0.001f, 0.003f, 0.003f, 0.0f},
      {0.0f, 0.009f, 0.001f, -0.005f, 0.003f, 0.0f},
      {0.0f, 0.009f, 0.001f, 0.0f, -0.005f, 0.009f}};
  pulse_loco_contribution set[GM_T];
  for (uint32_t i = 0; i < GM_T; i++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = GM_P;
    o.trainer_id = i;
    o.gate_mean = gate_mean;
    o.struct_version = version;
    cr_assert_eq(pulse_loco_create(&o, theta, &t[i]), PULSE_OK);
    float local[GM_P];
    for (int j = 0; j < GM_P; j++) {
      local[j] = theta[j] - step[i][j];
      s[i][j] = theta[j] - local[j];
    }
    const uint8_t *p;
    size_t n;
    uint32_t flags = leaving && i == 0 ? PULSE_LOCO_LEAVING : 0;
    cr_assert_eq(pulse_loco_prepare(t[i], local, 1, flags, &p, &n, NULL),
                 PULSE_OK);
    set[i] = (pulse_loco_contribution){malloc(n), n};
    memcpy((void *)set[i].data, p, n);
  }
  for (uint32_t i = 0; i < GM_T; i++)
    cr_assert_eq(pulse_loco_finish(t[i], set, GM_T, NULL, NULL), PULSE_OK, "%s",
                 pulse_error_detail());
  for (uint32_t i = 0; i < GM_T; i++) {
    free((void *)set[i].data);
    cr_assert_eq(pulse_loco_global_digest(t[0]),
                 pulse_loco_global_digest(t[i]));
  }
}

static void gate_mean_free(pulse_loco *t[GM_T]) {
  for (uint32_t i = 0; i < GM_T; i++)
    pulse_loco_free(t[i]);
}

Test(loco, gate_mean_applies_visible_or_quorum_means_and_defers_the_rest) {
  cr_assert_eq(LOCO_GATE_QUORUM, 2u, "the elements below assume 2");
  pulse_loco *on[GM_T], *off[GM_T];
  float s[GM_T][GM_P];
  gate_mean_round(0, 0, PULSE_LOCO_OPTS_VERSION, off, s);
  gate_mean_round(1, 0, PULSE_LOCO_OPTS_VERSION, on, s);
  /* On: elements 0 and 2 stay; 1, 3, 4 and 5 take the very step they take
   * without the gate (the same mean). */
  const float *g = pulse_loco_global(on[0]), *ref = pulse_loco_global(off[0]);
  cr_assert(g[0] == 1.0f && g[2] == 1.0f, "rejected means applied: %a %a", g[0],
            g[2]);
  cr_assert(ref[0] < 1.0f, "off, element 0 applied");
  for (int j = 1; j < GM_P; j++)
    if (j != 2) {
      cr_assert(g[j] != 1.0f, "element %d not applied", j);
      cr_assert_eq(lt_bits(g[j]), lt_bits(ref[j]), "element %d", j);
    }
  const float *e0 = pulse_loco_residual(on[0]);
  cr_assert_eq(lt_bits(e0[0]), lt_bits(s[0][0]), "the lone 0 waits in e");
  for (uint32_t i = 0; i < GM_T; i++) {
    const float *e = pulse_loco_residual(on[i]);
    cr_assert_eq(lt_bits(e[2]), lt_bits(s[i][2]), "unsent stays");
    for (int j = 1; j < GM_P; j++)
      if (j != 2)
        cr_assert_eq(lt_bits(e[j]), 0u, "trainer %u element %d kept", i, j);
    /* Off: what was sent is applied and gone from e. */
    e = pulse_loco_residual(off[i]);
    for (int j = 0; j < GM_P; j++)
      cr_assert_eq(lt_bits(e[j]), j == 2 ? lt_bits(s[i][2]) : 0u,
                   "off: trainer %u element %d", i, j);
  }
  gate_mean_free(on);
  gate_mean_free(off);
  /* On, trainer 0 leaving: its flush (0 to 4) is applied whole. */
  gate_mean_round(1, 1, PULSE_LOCO_OPTS_VERSION, on, s);
  g = pulse_loco_global(on[1]);
  cr_assert(g[0] < 1.0f && g[1] < 1.0f && g[2] < 1.0f && g[3] != 1.0f &&
            g[4] != 1.0f && g[5] < 1.0f);
  const float *e = pulse_loco_residual(on[1]);
  cr_assert(e[1] == 0.0f && e[3] == 0.0f && e[4] == 0.0f);
  cr_assert_eq(lt_bits(e[2]), lt_bits(s[1][2]), "trainer 1 sent no 2");
  gate_mean_free(on);
}

/* The mean gate is off by default, and options of another version (an
 * older caller's, before gate_mean) are refused, not read past their
 * version field. */
Test(loco, mean_gate_is_off_by_default_and_other_versions_are_refused) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  cr_assert_eq(o.struct_version, PULSE_LOCO_OPTS_VERSION);
  cr_assert_eq(o.gate_mean, 0);
  static const float theta[1] = {1.0f};
  pulse_loco *ctx = NULL;
  uint32_t *old = malloc(sizeof *old);
  *old = PULSE_LOCO_OPTS_VERSION - 1;
  cr_assert_eq(pulse_loco_create((const pulse_loco_opts *)(void *)old, theta, &ctx),
               PULSE_ERR_VERSION);
  cr_assert_null(ctx);
  free(old);
}
