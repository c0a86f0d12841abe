/* test_text_problem.c - the text problem of `pulse-bench loco`
 * (tools/sim/sim_text.h through sim_problem.h): its gradient is the
 * derivative of its loss (central differences), it is deterministic in
 * the seed (data split, initial weights, mini-batches) and another seed
 * changes them, Adam on it lowers the held-out loss, a missing or too short
 * text is a clear error, and the default text (base-files' licences)
 * gives a model of the asked size (skipped where the licences are
 * missing). Small texts are written to temporary files. */
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "loco_testutil.h"
#include "sim_problem.h"
#include "sim_text.h"

/* A temporary file of `n` bytes of English-like text; the caller unlinks. */
static void write_text(char *path, size_t cap, size_t n) {
  snprintf(path, cap, "/tmp/pulse_text_XXXXXX");
  int fd = mkstemp(path);
  cr_assert(fd >= 0, "mkstemp: %s", strerror(errno));
  static const char *words[] = {"the ",   "licence ", "software ", "may ",
                                "copy ",  "and ",     "modify ",   "it, ",
                                "under ", "terms. ",  "you ",      "of "};
  uint64_t s = 5;
  FILE *f = fdopen(fd, "w");
  size_t out = 0;
  while (out < n) {
    const char *w = words[pulse_rng_below(&s, 12)];
    size_t len = strlen(w) < n - out ? strlen(w) : n - out;
    fwrite(w, 1, len, f);
    out += len;
  }
  fclose(f);
}

static pulse_sim_problem_opts tiny_opts(const char *path) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.kind = PULSE_SIM_PROBLEM_TEXT;
  po.text_path = path;
  po.context = 3;
  po.embed = 4;
  po.hidden = 16;
  po.batch = 8;
  po.test_count = 200;
  po.lr = 1e-2f;
  return po;
}

/* The loss of the first mini-batch of trainer 0's stream at theta, and its
 * gradient when grad is set. */
static double first_batch(const pulse_sim_problem *p, const float *theta,
                          float *grad) {
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *g = grad ? grad : malloc(P * sizeof *g);
  double loss = pulse_sim_learner_grad(l, theta, g);
  if (!grad)
    free(g);
  pulse_sim_learner_free(l);
  return loss;
}

Test(text_problem, gradient_is_the_derivative_of_the_loss) {
  char path[64];
  write_text(path, sizeof path, 6000);
  pulse_sim_problem_opts po = tiny_opts(path);
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  uint64_t P = pulse_sim_problem_param_count(p);
  /* E[256][4], W1[12][16], b1[16], W2[16][256], b2[256] */
  cr_assert_eq(P, 256u * 4 + 12u * 16 + 16 + 16u * 256 + 256);
  float *theta = malloc(P * sizeof *theta), *g = malloc(P * sizeof *g);
  pulse_sim_problem_init(p, theta);
  first_batch(p, theta, g);
  /* Coordinates in every block; E's rows of bytes in the text (others
   * have no gradient: checked too). */
  uint64_t idx[] = {(uint64_t)'t' * 4,
                    (uint64_t)'e' * 4 + 3,
                    (uint64_t)'Q' * 4,
                    1024 + 5,
                    1024 + 100,
                    1024 + 191,
                    1216 + 3,
                    1216 + 15,
                    1232 + 7 * 256 + 'e',
                    1232 + 3 * 256 + ' ',
                    5328 + 'o',
                    5328 + 'Z'};
  int checked_nonzero = 0;
  for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
    uint64_t i = idx[k];
    float keep = theta[i], h = 1e-2f;
    theta[i] = keep + h;
    double up = first_batch(p, theta, NULL);
    theta[i] = keep - h;
    double down = first_batch(p, theta, NULL);
    theta[i] = keep;
    double fd = (up - down) / (2.0 * (double)h);
    cr_expect(fabs(fd - g[i]) <= 1e-3 + 0.03 * fabs(fd),
              "parameter %llu: gradient %g, central difference %g",
              (unsigned long long)i, g[i], fd);
    checked_nonzero += fabs(fd) > 1e-4;
  }
  cr_expect_geq(checked_nonzero, 6, "too few coordinates with a gradient");
  cr_expect_eq(g[(uint64_t)'Q' * 4], 0.0f, "a byte not in the text moved");
  free(theta), free(g);
  pulse_sim_problem_free(p);
  unlink(path);
}

Test(text_problem, deterministic_in_the_seed) {
  char path[64];
  write_text(path, sizeof path, 8000);
  pulse_sim_problem_opts po = tiny_opts(path);
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
  cr_assert_eq(memcmp(ta, tb, P * 4), 0, "same seed, other weights");
  cr_assert_neq(memcmp(ta, tc, P * 4), 0, "another seed, same weights");
  double la, lb, lc;
  pulse_sim_problem_eval(a, ta, &la, NULL);
  pulse_sim_problem_eval(b, tb, &lb, NULL);
  pulse_sim_problem_eval(c, ta, &lc, NULL); /* c's held-out set, a's weights */
  cr_assert_eq(lt_bits((float)la), lt_bits((float)lb));
  cr_assert(la != lc, "another seed, the same held-out positions");
  /* Same trainer, same stream; another trainer, another batch. */
  pulse_sim_learner *l1, *l2, *l3;
  cr_assert_eq(pulse_sim_learner_create(a, 1, &l1), PULSE_OK);
  cr_assert_eq(pulse_sim_learner_create(b, 1, &l2), PULSE_OK);
  cr_assert_eq(pulse_sim_learner_create(a, 2, &l3), PULSE_OK);
  for (int step = 0; step < 3; step++) {
    double x = pulse_sim_learner_grad(l1, ta, ga),
           y = pulse_sim_learner_grad(l2, tb, gb);
    cr_assert_eq(x, y);
    cr_assert_eq(memcmp(ga, gb, P * 4), 0);
  }
  pulse_sim_learner_grad(l3, ta, gb);
  pulse_sim_learner_grad(l1, ta, ga);
  cr_assert_neq(memcmp(ga, gb, P * 4), 0, "two trainers drew the same data");
  pulse_sim_learner_free(l1), pulse_sim_learner_free(l2);
  pulse_sim_learner_free(l3);
  free(ta), free(tb), free(tc), free(ga), free(gb);
  pulse_sim_problem_free(a), pulse_sim_problem_free(b), pulse_sim_problem_free(c);
  unlink(path);
}

Test(text_problem, adam_lowers_the_held_out_loss) {
  char path[64];
  write_text(path, sizeof path, 20000);
  pulse_sim_problem_opts po = tiny_opts(path);
  po.hidden = 32;
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = malloc(P * sizeof *theta);
  pulse_sim_problem_init(p, theta);
  double before, after, acc;
  pulse_sim_problem_eval(p, theta, &before, NULL);
  pulse_sim_learner *l;
  cr_assert_eq(pulse_sim_learner_create(p, 0, &l), PULSE_OK);
  for (int i = 0; i < 300; i++)
    pulse_sim_learner_step(l, theta);
  pulse_sim_problem_eval(p, theta, &after, &acc);
  /* Twelve words: after 300 steps the next byte is far from uniform. */
  cr_expect_lt(after, before - 1.0, "loss %g -> %g", before, after);
  cr_expect_gt(acc, 0.3, "accuracy %g", acc);
  pulse_sim_learner_free(l);
  free(theta);
  pulse_sim_problem_free(p);
  unlink(path);
}

Test(text_problem, missing_or_short_text_is_an_error) {
  pulse_sim_problem_opts po = tiny_opts("/nonexistent/pulse-text");
  pulse_sim_problem *p = (pulse_sim_problem *)1;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_NOT_FOUND);
  cr_assert_null(p);
  cr_assert(strstr(pulse_error_detail(), "/nonexistent/pulse-text") != NULL,
            "detail: %s", pulse_error_detail());
  char path[64];
  write_text(path, sizeof path, 2 * PULSE_SIM_TEXT_BLOCK - 1);
  po.text_path = path;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
  unlink(path);
  po.text_path = NULL;
  po.context = 0;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_ERR_ARG);
}

Test(text_problem, default_text_gives_the_asked_size) {
  if (access(PULSE_SIM_TEXT_DIR "GPL-3", R_OK) != 0)
    cr_skip_test("no " PULSE_SIM_TEXT_DIR "GPL-3 (base-files): no text");
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.kind = PULSE_SIM_PROBLEM_TEXT;
  po.test_count = 16;
  po.hidden = pulse_sim_problem_hidden_for(&po, 1000000);
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t P = pulse_sim_problem_param_count(p), bytes, digest;
  cr_expect_geq(P, 1000000u);
  cr_expect_lt(P, 1000000u + 8u * 64 + 1 + 256,
               "more than one hidden unit over");
  pulse_sim_problem_data(p, &bytes, &digest);
  cr_expect_gt(bytes, 100000u);
  cr_expect_neq(digest, 0u);
  pulse_sim_problem_free(p);
}
