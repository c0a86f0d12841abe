/* bench_loco_problem.c - what every child of `pulse-bench loco` shares: the
 * problem each builds alike, the parent's check that it can be built, and
 * a child's error line. */
#include <stdio.h>

#include "bench_loco_impl.h"

/* The problem every process builds alike (same seed, same data split and
 * initial weights); --lr 0 (the default) is the problem's own rate. */
pulse_sim_problem *bench_loco_make_problem(const loco_args *a) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.seed = a->seed;
  po.kind = a->problem;
  po.text_path = a->text_path;
  if (a->lr > 0)
    po.lr = (float)a->lr;
  else if (a->problem == PULSE_SIM_PROBLEM_TEXT)
    po.lr = PULSE_SIM_TEXT_LR;
  else if (a->problem == PULSE_SIM_PROBLEM_TEXT_SFT)
    po.lr = PULSE_SIM_TEXT_SFT_LR;
  else if (a->problem == PULSE_SIM_PROBLEM_TEXT_RL)
    po.lr = PULSE_SIM_TEXT_RL_LR;
  po.compute = (uint32_t)a->compute;
  po.parametrization = a->parametrization;
  po.hidden = pulse_sim_problem_hidden_for(&po, a->params);
  pulse_sim_problem *p = NULL;
  if (pulse_sim_problem_create(&po, &p) != PULSE_OK)
    return NULL;
  return p;
}

/* Checks, before any process starts, that the problem can be built: the
 * text problem reads files that may be missing. @return 0 when it can. */
const char *bench_loco_problem_name(uint32_t kind) {
  return kind == PULSE_SIM_PROBLEM_TEXT       ? "text"
         : kind == PULSE_SIM_PROBLEM_TEXT_SFT ? "text-sft"
         : kind == PULSE_SIM_PROBLEM_TEXT_RL  ? "text-rl"
                                              : "teacher";
}

int bench_loco_default_compute(uint32_t kind) {
  return kind == PULSE_SIM_PROBLEM_TEXT_SFT  ? PULSE_SIM_TEXT_SFT_COMPUTE
         : kind == PULSE_SIM_PROBLEM_TEXT_RL ? PULSE_SIM_TEXT_RL_COMPUTE
                                             : PULSE_SIM_COMPUTE_FP32;
}

const char *bench_loco_compute_name(int compute) {
  return compute == PULSE_SIM_COMPUTE_BF16 ? "bf16" : "fp32";
}

int bench_loco_check_problem(const loco_args *a, uint64_t *bytes,
                             uint64_t *digest, uint64_t *P,
                             double *pretrain_loss, uint32_t *pretrain_steps,
                             double *lr) {
  pulse_sim_problem *p = bench_loco_make_problem(a);
  if (p == NULL) {
    fprintf(stderr, PROG ": cannot build the %s problem: %s\n",
            bench_loco_problem_name(a->problem),
            pulse_error_detail());
    return 1;
  }
  pulse_sim_problem_data(p, bytes, digest);
  *P = pulse_sim_problem_param_count(p);
  /* Text SFT and RL: this build pretrained (or read the cached
   * checkpoint), so every child reads the cache. */
  *pretrain_loss = pulse_sim_problem_pretrain_loss(p);
  *pretrain_steps = pulse_sim_problem_pretrain_steps(p);
  *lr = pulse_sim_problem_lr(p);
  pulse_sim_problem_free(p);
  return 0;
}

int bench_loco_child_fail(int out, const char *what, pulse_status st) {
  dprintf(out, "error %s: %s (%s): %s\n", what, pulse_status_str(st),
          pulse_status_name(st), pulse_error_detail());
  return 1;
}
