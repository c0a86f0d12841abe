/* test_text_param.c - the text problems' parametrization
 * (tools/sim/sim_problem.h, opts.parametrization; `pulse-bench loco
 * --param`): the standard one is the scaled model with the forward's
 * 1/sqrt(fan-in) multipliers moved into W1 and W2 (the pretrained
 * checkpoint converted, the random start drawn that much smaller, the same
 * held-out loss), its gradient is the derivative of its loss, and the
 * teacher problem refuses it. Texts are written to temporary files;
 * pretraining is never cached. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "loco_testutil.h"
#include "sim_problem.h"

enum { K = 3, D = 4, H = 16, V = 256 };
/* Offsets of W1[k d][H] and W2[H][V] in theta (sim_text.h). */
#define W1_AT ((uint64_t)V * D)
#define W2_AT (W1_AT + (uint64_t)K * D * H + H)

static void write_words(char *path, size_t cap, size_t n) {
  static const char *const words[8] = {"scale ", "fan ", "in ",      "weight ",
                                       "layer ", "the ", "forward ", "of "};
  snprintf(path, cap, "/tmp/pulse_param_XXXXXX");
  lt_write_words(path, words, 3, n);
}

static pulse_sim_problem *make(const char *path, uint32_t kind,
                               uint32_t param) {
  setenv("PULSE_CACHE_DIR", "/proc/pulse-test-no-cache", 1);
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.kind = kind;
  po.parametrization = param;
  po.text_path = path;
  po.context = K, po.embed = D, po.hidden = H;
  po.batch = 8, po.test_count = 200;
  po.pretrain_steps = 200, po.pretrain_lr = 1e-2f;
  po.lr = 1e-3f;
  pulse_sim_problem *p = NULL;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK, "%s",
               pulse_error_detail());
  return p;
}

/* standard[i] == scaled[i] times W1's or W2's multiplier, bit for bit
 * (the same float product the conversion takes), the rest equal. */
static void expect_scaled_copy(const float *scaled, const float *standard,
                               uint64_t P) {
  float s1 = 1.0f / sqrtf((float)(K * D)), s2 = 1.0f / sqrtf((float)H);
  uint64_t bad = 0;
  for (uint64_t i = 0; i < P; i++) {
    float want = i >= W1_AT && i < W1_AT + (uint64_t)K * D * H ? scaled[i] * s1
                 : i >= W2_AT && i < W2_AT + (uint64_t)H * V   ? scaled[i] * s2
                                                               : scaled[i];
    bad += lt_bits(want) != lt_bits(standard[i]);
  }
  cr_expect_eq(bad, 0u,
               "%llu of %llu weights are not the scaled ones "
               "times their layer's multiplier",
               (unsigned long long)bad, (unsigned long long)P);
}

Test(text_param, standard_converts_the_checkpoint_to_the_same_model) {
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem *a =
      make(path, PULSE_SIM_PROBLEM_TEXT_SFT, PULSE_SIM_PARAM_SCALED);
  pulse_sim_problem *b =
      make(path, PULSE_SIM_PROBLEM_TEXT_SFT, PULSE_SIM_PARAM_STANDARD);
  uint64_t P = pulse_sim_problem_param_count(a);
  cr_assert_eq(P, pulse_sim_problem_param_count(b));
  float *ta = malloc(P * 4), *tb = malloc(P * 4);
  pulse_sim_problem_init(a, ta), pulse_sim_problem_init(b, tb);
  expect_scaled_copy(ta, tb, P);
  double la, lb;
  pulse_sim_problem_eval(a, ta, &la, NULL);
  pulse_sim_problem_eval(b, tb, &lb, NULL);
  cr_expect(fabs(lb - la) < 1e-5 * la, "held-out loss %.9g -> %.9g", la, lb);
  cr_expect_eq(pulse_sim_problem_pretrain_loss(b), lb,
               "the reported start is not the converted model's loss");
  free(ta), free(tb);
  pulse_sim_problem_free(a), pulse_sim_problem_free(b);
  unlink(path);
}

Test(text_param, standard_random_start_is_drawn_smaller) {
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem *a =
      make(path, PULSE_SIM_PROBLEM_TEXT, PULSE_SIM_PARAM_SCALED);
  pulse_sim_problem *b =
      make(path, PULSE_SIM_PROBLEM_TEXT, PULSE_SIM_PARAM_STANDARD);
  uint64_t P = pulse_sim_problem_param_count(a);
  float *ta = malloc(P * 4), *tb = malloc(P * 4);
  pulse_sim_problem_init(a, ta), pulse_sim_problem_init(b, tb);
  expect_scaled_copy(ta, tb, P);
  free(ta), free(tb);
  pulse_sim_problem_free(a), pulse_sim_problem_free(b);
  unlink(path);
}

/* The mini-batch loss of a fresh learner (always the same batch). */
static double batch_loss(const pulse_sim_problem *p, const float *theta,
                         float *grad) {
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  double loss = pulse_sim_learner_grad(l, theta, grad);
  pulse_sim_learner_free(l);
  return loss;
}

Test(text_param, standard_gradient_is_the_derivative_of_the_loss) {
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem *p =
      make(path, PULSE_SIM_PROBLEM_TEXT_SFT, PULSE_SIM_PARAM_STANDARD);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = malloc(P * 4), *g = malloc(P * 4), *scratch = malloc(P * 4);
  float *plus = malloc(P * 4), *minus = malloc(P * 4), *dir = malloc(P * 4);
  pulse_sim_problem_init(p, theta);
  batch_loss(p, theta, g);
  /* Along a random direction scaled to each weight (W1 and W2 are small):
   * central differences against the gradient's dot product. */
  uint64_t s = 17;
  double predicted = 0.0, eps = 1e-3;
  for (uint64_t i = 0; i < P; i++) {
    dir[i] = lt_normal(&s) * (fabsf(theta[i]) + 1e-3f);
    predicted += (double)g[i] * dir[i];
    plus[i] = theta[i] + (float)eps * dir[i];
    minus[i] = theta[i] - (float)eps * dir[i];
  }
  double measured =
      (batch_loss(p, plus, scratch) - batch_loss(p, minus, scratch)) /
      (2 * eps);
  cr_expect(fabs(measured - predicted) <= 0.03 * fabs(predicted) + 1e-4,
            "directional derivative %.6g, gradient says %.6g", measured,
            predicted);
  free(theta), free(g), free(scratch), free(plus), free(minus), free(dir);
  pulse_sim_problem_free(p);
  unlink(path);
}

Test(text_param, teacher_or_unknown_parametrization_is_an_error) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.parametrization = PULSE_SIM_PARAM_STANDARD; /* the teacher problem */
  pulse_sim_problem *p = (pulse_sim_problem *)1;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  cr_expect_null(p);
  cr_expect(strstr(pulse_error_detail(), "parametrization") != NULL,
            "detail: %s", pulse_error_detail());
  po.parametrization = 2;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
}
