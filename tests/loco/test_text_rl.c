/* test_text_rl.c - text RL of `pulse-bench loco --problem text-rl`
 * (tools/sim/sim_rl.h over sim_text.h): the prefix-match reward on
 * hand-made samples, group-normalized advantages, a policy-gradient step
 * that raises the probability of the high-reward sample and lowers the
 * other's, RL steps from the pretrained checkpoint that raise the held-out
 * reward, determinism in the seed and the trainer, and bad options as a
 * clear error. Texts are written to temporary files; pretraining is never
 * cached (PULSE_CACHE_DIR names a folder that cannot be made). */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "loco_testutil.h"
#include "sim_problem.h"
#include "sim_rl.h"
#include "sim_text.h"

/* n bytes of a few words in a seeded order: within a word every byte
 * follows from the ones before, so a continuation can be learnt. */
static void write_words(char *path, size_t cap, size_t n) {
  static const char *const words[8] = {"reward ", "policy ", "sample ",
                                       "group ",  "mean ",   "the ",
                                       "of ",     "step "};
  snprintf(path, cap, "/tmp/pulse_rl_XXXXXX");
  lt_write_words(path, words, 11, n);
}

static pulse_sim_problem_opts rl_opts(const char *path) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.kind = PULSE_SIM_PROBLEM_TEXT_RL;
  po.text_path = path;
  po.context = 3, po.embed = 4, po.hidden = 16;
  po.batch = 8, po.rl_group = 4, po.rl_length = 3;
  po.test_count = 200;
  po.pretrain_steps = 300, po.pretrain_lr = 1e-2f;
  po.lr = 3e-3f;
  return po;
}

static void no_cache(void) {
  setenv("PULSE_CACHE_DIR", "/proc/pulse-test-no-cache", 1);
}

Test(text_rl, reward_counts_the_matching_prefix) {
  const uint8_t *truth = (const uint8_t *)"policy";
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"policy", truth, 6), 6u);
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"polite", truth, 6), 4u);
  /* A byte right after a wrong one earns nothing: a prefix. */
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"xolicy", truth, 6), 0u);
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"pxlicy", truth, 6), 1u);
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"pol", truth, 3), 3u);
  cr_expect_eq(pulse_sim_rl_reward((const uint8_t *)"x", truth, 0), 0u);
}

Test(text_rl, advantages_are_group_normalized) {
  double r[4] = {0, 1, 2, 3}, a[4];
  pulse_sim_rl_advantages(r, 4, a);
  /* mean 1.5, population std sqrt(1.25) */
  double sd = sqrt(1.25) + PULSE_SIM_RL_STD_EPS, sum = 0.0, sq = 0.0;
  for (int i = 0; i < 4; i++) {
    cr_expect(fabs(a[i] - (r[i] - 1.5) / sd) < 1e-12, "adv[%d] = %g", i, a[i]);
    sum += a[i], sq += a[i] * a[i];
  }
  cr_expect(fabs(sum) < 1e-12, "advantages sum to %g", sum);
  cr_expect(fabs(sq / 4 - 1.0) < 1e-3, "mean square %g, not 1", sq / 4);
  /* A group that scored alike has nothing to learn. */
  double same[3] = {2, 2, 2}, z[3];
  pulse_sim_rl_advantages(same, 3, z);
  for (int i = 0; i < 3; i++)
    cr_expect_eq(z[i], 0.0);
}

/* log pi(sample | prompt) of a `len`-byte sample after the k bytes at
 * prompt, from rows 0..len of s. */
static double log_prob(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                       const float *theta, const uint8_t *seq, uint32_t k,
                       uint32_t len) {
  const uint8_t *ctx[8];
  for (uint32_t j = 0; j < len; j++)
    ctx[j] = seq + j;
  const float *l = pulse_sim_text_forward(t, s, theta, ctx, 0, len);
  double lp = 0.0;
  for (uint32_t j = 0; j < len; j++) {
    const float *row = l + (size_t)j * 256;
    double sum = 0.0;
    for (int c = 0; c < 256; c++)
      sum += exp((double)row[c]);
    lp += (double)row[seq[k + j]] - log(sum);
  }
  return lp;
}

Test(text_rl, policy_gradient_step_favours_the_rewarded_sample) {
  char path[64];
  write_words(path, sizeof path, 8000);
  pulse_sim_problem_opts po = rl_opts(path);
  pulse_sim_text *t;
  cr_assert_eq(pulse_sim_text_create(&po, &t), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t P = pulse_sim_text_param_count(t), n;
  float *theta = malloc(P * 4), *grad = calloc(P, 4);
  pulse_sim_text_init(t, theta);
  const uint32_t *prompts = pulse_sim_text_rl_prompts(t, 0, &n);
  cr_assert_gt(n, 0u);
  const uint8_t *text = pulse_sim_text_data(t);
  uint32_t pos = prompts[0], k = 3, L = 3;
  /* A group of two: the true continuation (reward 3) and "QQQ" (0). */
  uint8_t good[6], bad[6];
  memcpy(good, text + pos - k, k + L);
  memcpy(bad, text + pos - k, k);
  memset(bad + k, 'Q', L);
  double reward[2] = {pulse_sim_rl_reward(good + k, text + pos, L),
                      pulse_sim_rl_reward(bad + k, text + pos, L)};
  cr_assert_eq(reward[0], 3.0);
  cr_assert_eq(reward[1], 0.0);
  double adv[2];
  pulse_sim_rl_advantages(reward, 2, adv);
  pulse_sim_text_scratch *s;
  cr_assert_eq(pulse_sim_text_scratch_create(t, 2 * L, &s), PULSE_OK);
  double good0 = log_prob(t, s, theta, good, k, L);
  double bad0 = log_prob(t, s, theta, bad, k, L);
  const uint8_t *ctx[6];
  uint8_t y[6];
  float w[6];
  for (uint32_t j = 0; j < L; j++) {
    ctx[j] = good + j, y[j] = good[k + j], w[j] = (float)(adv[0] / 2);
    ctx[L + j] = bad + j, y[L + j] = bad[k + j], w[L + j] = (float)(adv[1] / 2);
  }
  pulse_sim_text_forward(t, s, theta, ctx, 0, 2 * L);
  pulse_sim_text_backward(t, s, theta, ctx, y, w, 2 * L, grad);
  for (uint64_t i = 0; i < P; i++)
    theta[i] -= 0.05f * grad[i];
  double good1 = log_prob(t, s, theta, good, k, L);
  double bad1 = log_prob(t, s, theta, bad, k, L);
  cr_expect_gt(good1, good0 + 1e-3, "log pi(rewarded) %g -> %g", good0, good1);
  cr_expect_lt(bad1, bad0 - 1e-3, "log pi(unrewarded) %g -> %g", bad0, bad1);
  pulse_sim_text_scratch_free(s);
  free(theta), free(grad);
  pulse_sim_text_free(t);
  unlink(path);
}

Test(text_rl, rl_steps_raise_the_held_out_reward) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 20000);
  pulse_sim_problem_opts po = rl_opts(path);
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = malloc(P * 4);
  pulse_sim_problem_init(p, theta); /* the pretrained checkpoint */
  double before = pulse_sim_problem_reward(p, theta), sampled = 0.0;
  cr_assert(before > 0.0 && before < 3.0, "held-out reward %g", before);
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  for (int i = 0; i < 200; i++)
    sampled += -pulse_sim_learner_step(l, theta) / 200;
  double after = pulse_sim_problem_reward(p, theta);
  cr_expect_gt(after, before + 0.05, "held-out reward %g -> %g", before, after);
  cr_expect(sampled > 0.0 && sampled < 3.0, "mean sampled reward %g", sampled);
  pulse_sim_learner_free(l);
  free(theta);
  pulse_sim_problem_free(p);
  unlink(path);
}

Test(text_rl, deterministic_in_the_seed_and_the_trainer) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 8000);
  pulse_sim_problem_opts po = rl_opts(path);
  po.pretrain_steps = 20;
  pulse_sim_problem *a, *b, *c;
  cr_assert_eq(pulse_sim_problem_create(&po, &a), PULSE_OK);
  cr_assert_eq(pulse_sim_problem_create(&po, &b), PULSE_OK);
  po.seed = 2;
  cr_assert_eq(pulse_sim_problem_create(&po, &c), PULSE_OK);
  uint64_t P = pulse_sim_problem_param_count(a);
  float *ta = malloc(P * 4), *tb = malloc(P * 4), *tc = malloc(P * 4);
  float *ga = malloc(P * 4), *gb = malloc(P * 4);
  pulse_sim_problem_init(a, ta), pulse_sim_problem_init(b, tb);
  pulse_sim_problem_init(c, tc);
  cr_assert_eq(memcmp(ta, tb, P * 4), 0, "same seed, other checkpoint");
  cr_assert_eq(pulse_sim_problem_reward(a, ta),
               pulse_sim_problem_reward(b, tb));
  pulse_sim_learner *l1, *l2, *l3, *l4;
  cr_assert_eq(pulse_sim_learner_create(a, 1, &l1), PULSE_OK);
  cr_assert_eq(pulse_sim_learner_create(b, 1, &l2), PULSE_OK);
  cr_assert_eq(pulse_sim_learner_create(a, 2, &l3), PULSE_OK);
  cr_assert_eq(pulse_sim_learner_create(c, 1, &l4), PULSE_OK);
  int moved = 0;
  for (int step = 0; step < 5; step++) {
    double x = pulse_sim_learner_grad(l1, ta, ga),
           y = pulse_sim_learner_grad(l2, tb, gb);
    cr_assert_eq(x, y, "step %d: sampled reward %g against %g", step, -x, -y);
    cr_assert_eq(memcmp(ga, gb, P * 4), 0, "step %d: other gradients", step);
    for (uint64_t i = 0; i < P && !moved; i++)
      moved = ga[i] != 0.0f;
  }
  cr_assert(moved, "five steps, every group scored alike: nothing tested");
  /* Another trainer, another seed: other prompts and samples. */
  pulse_sim_learner_grad(l1, ta, ga);
  pulse_sim_learner_grad(l3, ta, gb);
  cr_expect_neq(memcmp(ga, gb, P * 4), 0, "two trainers sampled alike");
  float *gc = malloc(P * 4);
  pulse_sim_learner_grad(l4, ta, gc);
  cr_expect_neq(memcmp(ga, gc, P * 4), 0, "two seeds sampled alike");
  pulse_sim_learner_free(l1), pulse_sim_learner_free(l2);
  pulse_sim_learner_free(l3), pulse_sim_learner_free(l4);
  free(ta), free(tb), free(tc), free(ga), free(gb), free(gc);
  pulse_sim_problem_free(a), pulse_sim_problem_free(b),
      pulse_sim_problem_free(c);
  unlink(path);
}

Test(text_rl, bad_groups_or_lengths_are_an_error) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 4000);
  pulse_sim_problem_opts po = rl_opts(path);
  pulse_sim_problem *p = (pulse_sim_problem *)1;
  po.rl_group = 1; /* no group to normalize in */
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  cr_expect_null(p);
  po.rl_group = po.batch + 1;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  po.rl_group = 4, po.rl_length = 0;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  po.rl_length = 65;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  cr_expect(strstr(pulse_error_detail(), "text RL") != NULL, "detail: %s",
            pulse_error_detail());
  po.rl_length = 3, po.pretrain_steps = 0;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  unlink(path);
}
