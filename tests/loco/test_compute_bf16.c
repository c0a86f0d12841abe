/* test_compute_bf16.c - the compute precision of the text problems
 * (tools/sim/sim_problem.h, opts.compute; `pulse-bench loco --compute`):
 * under PULSE_SIM_COMPUTE_BF16 the learners' gradient, text RL's samples,
 * the held-out loss and the reward are those of the BF16 rounding of the
 * weights, so a move below half a BF16 ulp changes none of them and a move
 * of one ulp does (with FP32 compute the small move shows); Adam still
 * updates FP32 master weights; both modes start from one pretrained
 * checkpoint; an unknown mode is a clear error. Texts are written to
 * temporary files; pretraining is never cached (PULSE_CACHE_DIR names a
 * folder that cannot be made). */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "loco_testutil.h"
#include "pulse_elem.h"
#include "sim_problem.h"

/* n bytes of a few words in a seeded order (a learnable continuation). */
static void write_words(char *path, size_t cap, size_t n) {
  static const char *const words[8] = {"weight ", "master ", "round ",
                                       "even ",   "half ",   "the ",
                                       "ulp ",    "moves "};
  snprintf(path, cap, "/tmp/pulse_bf16_XXXXXX");
  lt_write_words(path, words, 7, n);
}

static pulse_sim_problem_opts small_opts(const char *path, uint32_t kind,
                                         uint32_t compute) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.kind = kind;
  po.compute = compute;
  po.text_path = path;
  po.context = 3, po.embed = 4, po.hidden = 16;
  po.batch = 8, po.rl_group = 4, po.rl_length = 3;
  po.test_count = 200;
  po.pretrain_steps = 200, po.pretrain_lr = 1e-2f;
  po.lr = 1e-3f;
  return po;
}

static void no_cache(void) {
  setenv("PULSE_CACHE_DIR", "/proc/pulse-test-no-cache", 1);
}

static pulse_sim_problem *make(const char *path, uint32_t kind,
                               uint32_t compute) {
  pulse_sim_problem_opts po = small_opts(path, kind, compute);
  pulse_sim_problem *p = NULL;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK, "%s",
               pulse_error_detail());
  return p;
}

/* Every weight of `from` (BF16 values, so their low 16 bits are 0) with
 * `low` added to its bits: 0x4000 is a quarter of a BF16 ulp away from
 * zero (rounds back), 0x10000 one ulp. */
static void move_bits(const float *from, float *to, uint64_t n, uint32_t low) {
  for (uint64_t i = 0; i < n; i++)
    to[i] = lt_float(lt_bits(from[i]) + low);
}

/* The pretrained checkpoint rounded to BF16, and its quarter-ulp and
 * one-ulp moves. */
static void three_weights(const pulse_sim_problem *p, float **exact,
                          float **quarter, float **ulp) {
  uint64_t P = pulse_sim_problem_param_count(p);
  *exact = malloc(P * 4), *quarter = malloc(P * 4), *ulp = malloc(P * 4);
  pulse_sim_problem_init(p, *exact);
  for (uint64_t i = 0; i < P; i++)
    (*exact)[i] = lt_float(pulse_f32_bits_from_bf16(
        pulse_bf16_from_f32_bits(lt_bits((*exact)[i]))));
  move_bits(*exact, *quarter, P, 0x4000u);
  move_bits(*exact, *ulp, P, 0x10000u);
}

/* The gradient and loss of a fresh learner of trainer 0 (the same
 * mini-batch or samples every time) at theta. */
static double grad_of(const pulse_sim_problem *p, const float *theta,
                      float *grad) {
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  double loss = pulse_sim_learner_grad(l, theta, grad);
  pulse_sim_learner_free(l);
  return loss;
}

static double loss_of(const pulse_sim_problem *p, const float *theta) {
  double loss;
  pulse_sim_problem_eval(p, theta, &loss, NULL);
  return loss;
}

static void sub_ulp_moves_are_invisible(uint32_t kind) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem *p = make(path, kind, PULSE_SIM_COMPUTE_BF16);
  pulse_sim_problem *f = make(path, kind, PULSE_SIM_COMPUTE_FP32);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *exact, *quarter, *ulp;
  three_weights(p, &exact, &quarter, &ulp);
  float *g0 = malloc(P * 4), *g1 = malloc(P * 4), *g2 = malloc(P * 4);
  int rl = kind == PULSE_SIM_PROBLEM_TEXT_RL;

  /* BF16 compute: a quarter-ulp move changes nothing it computes. */
  double l0 = grad_of(p, exact, g0), l1 = grad_of(p, quarter, g1);
  cr_expect_eq(l0, l1, "mini-batch loss %.17g -> %.17g", l0, l1);
  cr_expect_eq(memcmp(g0, g1, P * 4), 0, "the gradient changed");
  cr_expect_eq(loss_of(p, exact), loss_of(p, quarter), "held-out loss");
  cr_expect_eq(pulse_sim_problem_reward(p, exact),
               pulse_sim_problem_reward(p, quarter), "held-out reward");
  int moved = 0;
  for (uint64_t i = 0; i < P && !moved; i++)
    moved = g0[i] != 0.0f;
  cr_assert(moved, "a zero gradient: nothing tested");

  /* A move of one ulp is a move of the BF16 weights. */
  grad_of(p, ulp, g2);
  cr_expect_neq(memcmp(g0, g2, P * 4), 0, "one ulp: the same gradient");
  cr_expect_neq(loss_of(p, exact), loss_of(p, ulp), "one ulp: same loss");
  if (rl)
    cr_expect_neq(pulse_sim_problem_reward(p, exact),
                  pulse_sim_problem_reward(p, ulp), "one ulp: same reward");

  /* FP32 compute sees the quarter-ulp move: the test above can fail. */
  grad_of(f, exact, g0), grad_of(f, quarter, g1);
  cr_expect_neq(memcmp(g0, g1, P * 4), 0, "FP32: the same gradient");
  cr_expect_neq(loss_of(f, exact), loss_of(f, quarter), "FP32: same loss");
  if (rl)
    cr_expect_neq(pulse_sim_problem_reward(f, exact),
                  pulse_sim_problem_reward(f, quarter), "FP32: same reward");

  free(exact), free(quarter), free(ulp), free(g0), free(g1), free(g2);
  pulse_sim_problem_free(p), pulse_sim_problem_free(f);
  unlink(path);
}

Test(compute_bf16, sft_sees_only_moves_of_the_bf16_weights) {
  sub_ulp_moves_are_invisible(PULSE_SIM_PROBLEM_TEXT_SFT);
}

Test(compute_bf16, rl_samples_and_rewards_the_bf16_weights) {
  sub_ulp_moves_are_invisible(PULSE_SIM_PROBLEM_TEXT_RL);
}

Test(compute_bf16, adam_updates_fp32_master_weights) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem_opts po =
      small_opts(path, PULSE_SIM_PROBLEM_TEXT_SFT, PULSE_SIM_COMPUTE_BF16);
  po.lr = 1e-6f; /* far below most weights' half ulp */
  pulse_sim_problem *p = NULL;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  float *exact, *quarter, *ulp;
  three_weights(p, &exact, &quarter, &ulp);
  uint64_t P = pulse_sim_problem_param_count(p), off_grid = 0, moved = 0;
  float *theta = malloc(P * 4);
  memcpy(theta, exact, P * 4);
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  pulse_sim_learner_step(l, theta);
  for (uint64_t i = 0; i < P; i++) {
    moved += theta[i] != exact[i];
    off_grid += (lt_bits(theta[i]) & 0xFFFFu) != 0;
  }
  /* Adam's first step moves every weight with a gradient by about lr:
   * the FP32 master keeps it, between BF16 values. */
  cr_expect_gt(moved, P / 2, "%llu of %llu weights moved",
               (unsigned long long)moved, (unsigned long long)P);
  cr_expect_gt(off_grid, P / 2, "%llu of %llu weights off the BF16 grid",
               (unsigned long long)off_grid, (unsigned long long)P);
  pulse_sim_learner_free(l);
  free(theta), free(exact), free(quarter), free(ulp);
  pulse_sim_problem_free(p);
  unlink(path);
}

Test(compute_bf16, both_modes_start_from_one_fp32_pretraining) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 12000);
  pulse_sim_problem *p =
      make(path, PULSE_SIM_PROBLEM_TEXT_RL, PULSE_SIM_COMPUTE_BF16);
  pulse_sim_problem *f =
      make(path, PULSE_SIM_PROBLEM_TEXT_RL, PULSE_SIM_COMPUTE_FP32);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *a = malloc(P * 4), *b = malloc(P * 4);
  pulse_sim_problem_init(p, a), pulse_sim_problem_init(f, b);
  cr_expect_eq(memcmp(a, b, P * 4), 0, "BF16 compute pretrained otherwise");
  /* Each reports the checkpoint's loss as it computes it: the learners'
   * starting loss. */
  cr_expect_eq(pulse_sim_problem_pretrain_loss(p), loss_of(p, a));
  cr_expect_eq(pulse_sim_problem_pretrain_loss(f), loss_of(f, b));
  cr_expect_neq(loss_of(p, a), loss_of(f, b), "rounding changed no loss");
  free(a), free(b);
  pulse_sim_problem_free(p), pulse_sim_problem_free(f);
  unlink(path);
}

Test(compute_bf16, unknown_mode_is_an_error) {
  no_cache();
  char path[64];
  write_words(path, sizeof path, 4000);
  pulse_sim_problem_opts po = small_opts(path, PULSE_SIM_PROBLEM_TEXT, 2);
  pulse_sim_problem *p = (pulse_sim_problem *)1;
  cr_expect_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  cr_expect_null(p);
  cr_expect(strstr(pulse_error_detail(), "compute") != NULL, "detail: %s",
            pulse_error_detail());
  unlink(path);
}
