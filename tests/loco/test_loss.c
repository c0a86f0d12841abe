/* test_loss.c - PULSELoCo's loss rules (pulse_loco_rule, docs/formats/loco-payload.md "Loss
 * rules") on contexts in memory, over many seeded trials of random loss:
 * every rule kept is unbiased (the mean aggregate over trials equals the
 * lossless one within its statistical error), and mass is conserved
 * (nothing sent is counted twice, nothing kept in error feedback is lost).
 * Version 1's rule is run too, and must be caught by both checks.
 *
 * Every trial: N trainers, the same fixed local progress d[c][r] each
 * round (theta_r = theta_g - d), each payload lost independently with
 * probability LOSS (at least one arrives), mu = 0 so that a round's b is
 * exactly its aggregate. */
#include "loco_testutil.h"

#define N 4
#define PN 64
#define ROUNDS 3
#define LOSS 0.3
#define TRIALS 300

typedef struct {
  double total[PN];  /* sum over rounds of the aggregate (b) */
  double kept[PN];   /* sum over trainers of e at the end */
  double lost[PN];   /* sum of the entries of lost payloads */
  double scaled[PN]; /* sum over rounds of contributors * aggregate */
} trial_out;

static float g_theta0[PN];
static float g_d[ROUNDS + 1][N][PN]; /* round ROUNDS: 0, the flush */

static void make_signals(void) {
  lt_fill_weights(g_theta0, PN, 11, 0.05f);
  uint64_t s = 12;
  for (int r = 0; r < ROUNDS; r++)
    for (int c = 0; c < N; c++)
      for (int k = 0; k < PN; k++) /* some pass the gate, some wait in e */
        g_d[r][c][k] = lt_normal(&s) * (k % 3 == 0 ? 0.00005f : 0.002f);
  memset(g_d[ROUNDS], 0, sizeof g_d[ROUNDS]);
}

/* One trial of `rule`; with flush, a last lossless round sends every
 * trainer's whole residual (ungated). */
static void run_trial(pulse_loco_rule rule, uint64_t seed, int flush,
                      trial_out *out) {
  memset(out, 0, sizeof *out);
  pulse_loco *ctx[N];
  for (uint32_t c = 0; c < N; c++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = PN;
    o.trainer_id = c;
    o.mu = 0.0f;
    o.rule = rule;
    cr_assert_eq(pulse_loco_create(&o, g_theta0, &ctx[c]), PULSE_OK);
  }
  uint64_t rng = seed;
  int rounds = ROUNDS + (flush ? 1 : 0);
  for (int r = 0; r < rounds; r++) {
    int last = r == ROUNDS;
    int arrived[N], count;
    do {
      count = 0;
      for (int c = 0; c < N; c++)
        count += arrived[c] = last || pulse_rng_uniform(&rng) >= LOSS;
    } while (count == 0);
    pulse_loco_contribution set[N];
    uint8_t *copies[N];
    size_t n = 0;
    for (uint32_t c = 0; c < N; c++) {
      float theta_r[PN];
      const float *g = pulse_loco_global(ctx[c]);
      for (int k = 0; k < PN; k++)
        theta_r[k] = g[k] - g_d[r][c][k];
      const uint8_t *data;
      size_t size;
      cr_assert_eq(pulse_loco_prepare(ctx[c], theta_r, 100,
                                      last ? PULSE_LOCO_LEAVING : 0, &data,
                                      &size, NULL),
                   PULSE_OK, "%s", pulse_error_detail());
      copies[c] = malloc(size);
      memcpy(copies[c], data, size);
      if (arrived[c]) {
        set[n++] = (pulse_loco_contribution){copies[c], size};
      } else { /* what the lost payload carried */
        pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
        pulse_loco_payload_header h;
        cr_assert_eq(pulse_loco_payload_decode(data, size, g, NULL, PN, &h, &e),
                     PULSE_OK);
        for (uint64_t j = 0; j < e.count; j++)
          out->lost[e.pos[j]] += e.val[j];
        pulse_loco_entries_free(&e);
      }
    }
    for (uint32_t c = 0; c < N; c++) {
      cr_assert_eq(pulse_loco_set_members(ctx[c], N), PULSE_OK);
      cr_assert_eq(pulse_loco_finish(ctx[c], set, n, NULL, NULL), PULSE_OK,
                   "%s", pulse_error_detail());
    }
    const float *b = pulse_loco_momentum(ctx[0]); /* mu = 0: the aggregate */
    for (uint32_t c = 1; c < N; c++)
      cr_assert_eq(memcmp(b, pulse_loco_momentum(ctx[c]), sizeof(float) * PN),
                   0, "replicas differ");
    for (int k = 0; k < PN; k++) {
      out->total[k] += b[k];
      out->scaled[k] += (double)count * b[k];
    }
    for (uint32_t c = 0; c < N; c++)
      free(copies[c]);
  }
  for (uint32_t c = 0; c < N; c++) {
    const float *e = pulse_loco_residual(ctx[c]);
    for (int k = 0; k < PN; k++)
      out->kept[k] += e[k];
    pulse_loco_free(ctx[c]);
  }
}

/* The lossless aggregate, summed over the rounds: the mean progress. */
static void lossless_total(double *want) {
  for (int k = 0; k < PN; k++) {
    want[k] = 0.0;
    for (int r = 0; r < ROUNDS; r++)
      for (int c = 0; c < N; c++)
        want[k] += (double)g_d[r][c][k] / N;
  }
}

/* Mean and standard error over the trials of the projection
 * (total . want) / ||want||^2: 1 when unbiased. */
static void bias_of(pulse_loco_rule rule, double *mean, double *se) {
  double want[PN], norm = 0.0;
  lossless_total(want);
  for (int k = 0; k < PN; k++)
    norm += want[k] * want[k];
  double sum = 0.0, sum2 = 0.0;
  for (uint64_t t = 0; t < TRIALS; t++) {
    trial_out o;
    run_trial(rule, 1000 + t, 1, &o);
    double dot = 0.0;
    for (int k = 0; k < PN; k++)
      dot += o.total[k] * want[k];
    double x = dot / norm;
    sum += x, sum2 += x * x;
  }
  *mean = sum / TRIALS;
  double var = sum2 / TRIALS - *mean * *mean;
  *se = sqrt((var > 0 ? var : 0) / TRIALS);
}

Test(loco, every_kept_loss_rule_is_unbiased_under_random_loss, .timeout = 120) {
  make_signals();
  static const pulse_loco_rule kept[] = {PULSE_LOCO_RULE_KEEP,
                                         PULSE_LOCO_RULE_DROP};
  for (size_t i = 0; i < 2; i++) {
    double m, se;
    bias_of(kept[i], &m, &se);
    cr_log_info("rule %s: %.5f +- %.5f", pulse_loco_rule_name(kept[i]), m, se);
    cr_assert(fabs(m - 1.0) <= 4.0 * se + 1e-4,
              "rule %s: mean aggregate / lossless = %.5f +- %.5f",
              pulse_loco_rule_name(kept[i]), m, se);
  }
  /* The check can fail: version 1's rule counts lost mass twice. */
  double m, se;
  bias_of(PULSE_LOCO_RULE_LEGACY, &m, &se);
  cr_log_info("rule legacy: %.5f +- %.5f", m, se);
  cr_assert(m - 1.0 > 4.0 * se + 0.02,
            "legacy rule: %.5f +- %.5f, expected well above 1", m, se);
}

/* sum of |x| for the tolerance of a float sum */
static double l1(const double *x) {
  double s = 0.0;
  for (int k = 0; k < PN; k++)
    s += fabs(x[k]);
  return s;
}

Test(loco, loss_rules_conserve_mass_nothing_counted_twice_nothing_lost,
     .timeout = 60) {
  make_signals();
  double in[PN]; /* all progress of all trainers: N times the lossless mean */
  lossless_total(in);
  for (int k = 0; k < PN; k++)
    in[k] *= N;
  double worst_legacy = 0.0;
  for (uint64_t t = 0; t < 50; t++) {
    trial_out o;
    double diff[PN];
    /* keep: N * aggregate (every trainer's share) + residuals = progress */
    run_trial(PULSE_LOCO_RULE_KEEP, 5000 + t, 0, &o);
    for (int k = 0; k < PN; k++)
      diff[k] = N * o.total[k] + o.kept[k] - in[k];
    cr_assert(l1(diff) <= 1e-5 * l1(in), "keep: mass off by %g of %g", l1(diff),
              l1(in));
    /* drop: contributors * aggregate (what arrived) + residuals + what was
     * lost = progress: the lost part is gone, not counted */
    run_trial(PULSE_LOCO_RULE_DROP, 5000 + t, 0, &o);
    for (int k = 0; k < PN; k++)
      diff[k] = o.scaled[k] + o.kept[k] + o.lost[k] - in[k];
    cr_assert(l1(diff) <= 1e-5 * l1(in), "drop: mass off by %g of %g", l1(diff),
              l1(in));
    /* legacy: the aggregate stands in for the lost part (divided by what
     * arrived) and its sender keeps it too: the keep sum overshoots */
    run_trial(PULSE_LOCO_RULE_LEGACY, 5000 + t, 0, &o);
    for (int k = 0; k < PN; k++)
      diff[k] = N * o.total[k] + o.kept[k] - in[k];
    double off = l1(diff) / l1(in);
    worst_legacy = off > worst_legacy ? off : worst_legacy;
  }
  cr_log_info("legacy rule: mass off by up to %.3f", worst_legacy);
  cr_assert(worst_legacy > 1e-2,
            "legacy rule conserved mass (%g): the check cannot fail",
            worst_legacy);
}
