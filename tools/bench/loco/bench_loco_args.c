/* bench_loco_args.c - the command line of `pulse-bench loco` (fixed
 * membership): its usage text (collaboration mode's follows it), the
 * options and the checks across them. */
#include <stdio.h>
#include <string.h>

#include "bench_impl.h"
#include "bench_loco_impl.h"
#include "cli_args.h"
#include "pulse_loco_coord.h"

void bench_loco_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench loco [options]\n"
      "  DDP, DiLoCo and PULSELoCo on the built-in problem (--problem; Adam "
      "inner\n"
      "  steps), every method's\n"
      "  messages encoded and sent over HTTP on 127.0.0.1:\n"
      "    PULSELoCo    one process per trainer: gated sparse payloads "
      "(docs/formats/loco-payload.md)\n"
      "                 through a coordinator, every round\n"
      "    DiLoCo-BF16  the dense pseudo-gradient rounded to BF16, every "
      "round: the\n"
      "                 baseline the targets are about\n"
      "    DiLoCo-FP32  the same in FP32, shown beside it\n"
      "    DDP-FP32     the dense FP32 gradient, every inner step\n"
      "  A baseline runs its trainers in one process, each with its own "
      "server; every\n"
      "  trainer fetches every other trainer's message (as every PULSELoCo "
      "trainer\n"
      "  gets every other payload). Prints per round the held-out loss and "
      "the bytes\n"
      "  each trainer sent, then a summary against the targets (>= 10x fewer "
      "bytes on\n"
      "  the wire than DiLoCo-BF16, >= 100x fewer than DDP-FP32, final loss "
      "within 2%%\n"
      "  of DiLoCo-BF16's).\n"
      "  --trainers N     trainers (default 3)\n"
      "  --rounds R       outer rounds (default 50)\n"
      "  --inner H        inner Adam steps per round (default 20)\n"
      "  --params P       model parameters, about (default 70000)\n"
      "  --seed S         problem and data seed (default 1)\n"
      "  --problem K      text (default: next-character prediction on "
      "base-files'\n"
      "                   licences in /usr/share/common-licenses, a held-out "
      "tenth for\n"
      "                   the loss), text-sft (the same model pretrained first,"
      "\n"
      "                   deterministic in the seed, the checkpoint cached in "
      "\n"
      "                   $PULSE_CACHE_DIR or ~/.cache/pulse, then fine-tuned "
      "on text\n"
      "                   pretraining never saw, at an RL-like rate), text-rl"
      "\n"
      "                   (the same checkpoint trained by RL: per inner step "
      "8 sampled\n"
      "                   4-byte continuations for each of 4 prompts of that "
      "text,\n"
      "                   rewarded by the prefix that matches the true one, "
      "group-\n"
      "                   normalized advantages; the summary adds each "
      "method's\n"
      "                   held-out expected reward over the last fifth of the "
      "rounds)\n"
      "                   or teacher (distillation towards a nearby teacher)\n"
      "  --text FILE      text: learn this file instead\n"
      "  --compute M      what the trainers compute with: fp32 (the FP32 "
      "weights) or\n"
      "                   bf16 (their BF16 rounding, as mixed-precision "
      "trainers and a\n"
      "                   BF16 inference engine do: forward, backward, RL "
      "sampling,\n"
      "                   held-out loss and reward; Adam updates the FP32 "
      "weights).\n"
      "                   Default: " PULSE_SIM_TEXT_COMPUTE_HELP "\n"
      "  --param P        text problems: where the layers' 1/sqrt(fan-in) "
      "scale lives:\n"
      "                   scaled (default: multipliers in the forward, "
      "weights O(1))\n"
      "                   or standard (in the weights, as in LLMs; text-sft "
      "and text-rl\n"
      "                   convert the cached checkpoint: the same function)\n"
      "  --lr X           inner Adam learning rate (default: the problem's, "
      "2e-3 for\n"
      "                   text, 5e-6 for text-sft and text-rl, 2e-5 for "
      "teacher)\n"
      "  --drop-rate X    probability that a PULSELoCo payload is lost in a "
      "round\n"
      "                   (the coordinator treats the fetch as failed; default "
      "0)\n"
      "  --deadline-ms D  per-round payload deadline (default 2000)\n"
      "  --rule NAME      what a round does with a payload that did not arrive "
      "(loco/\n"
      "                   docs/formats/loco-payload.md \"Loss rules\"): drop "
      "(default: divide by "
      "what\n"
      "                   arrived, the lost part goes), keep (divide by every "
      "trainer,\n"
      "                   the sender keeps it in error feedback), legacy "
      "(version 1: both\n"
      "                   corrections, biased)\n"
      "  --join-round J   one more PULSELoCo trainer joins once J rounds are "
      "done\n"
      "  --leave-round L  the last founding PULSELoCo trainer leaves in round "
      "L\n"
      "  --transport T    how PULSELoCo trainers exchange a round: http "
      "(default:\n"
      "                   whole payloads through the coordinator) or udp (each "
      "payload\n"
      "                   as datagram-sized chunks to every trainer, no "
      "retransmission;\n"
      "                   manifest and re-syncs over HTTP; needs --rule drop)\n"
      "  --drop P         udp: each datagram lost with probability P, in the "
      "send path\n"
      "                   (seeded by --seed; default 0)\n"
      "  --resync-period K  udp: a trainer re-syncs the ranges that differ "
      "from the\n"
      "                   reference replica after every round r with r + 1 "
      "a multiple\n"
      "                   of K (default 1); in between it estimates its "
      "drift from\n"
      "                   the reference's range sketches\n"
      "  --drift-budget D udp: ... or as soon as that estimate exceeds D "
      "(default 0.01)\n"
      "  --netns N=A,...  trainer i runs in network namespace N_(i mod k) "
      "(made by\n"
      "                   `ip netns add`) and listens on its address A (root; "
      "for tests\n"
      "                   over a real link: tests/cli/loco_udp_netns.sh)\n"
      "  --no-auth        PULSELoCo trainers neither sign nor check (by "
      "default each\n"
      "                   signs every message a trainer acts on (payloads, "
      "manifests,\n"
      "                   views, states, signed POSTs, drift digests, "
      "datagram lists\n"
      "                   and ports, joins) with a key made for the run and "
      "pins every\n"
      "                   trainer's: docs/protocols/loco-exchange.md, "
      "Authentication;\n"
      "                   the summary says what signing adds)\n"
      "  --only-pulseloco skip the three baselines (left out of the output): "
      "loss\n"
      "                   experiments with many trainers\n"
      "  --json           one JSON object per round, then a summary object\n"
      "  --report DIR     also write DIR/rounds.csv and DIR/report.html "
      "(charts)\n"
      "Bytes: \"sent\" is every encoded message (dense message: 40-byte header "
      "+ 4 or 2\n"
      "bytes per parameter; PULSELoCo payload) counted once; \"on the wire\" "
      "is "
      "the\n"
      "HTTP bodies that went between trainers (baselines: as their servers "
      "counted\n"
      "them; PULSELoCo: as its trainers downloaded them, manifests and states "
      "too).\n"
      "Ratios are on the wire and name their baseline.\n"
      "Exit status: 0 when the run completed (targets are reported, not "
      "enforced),\n"
      "1 when a trainer failed, 2 bad usage.\n");
  bench_loco_collab_usage(out);
}

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, PROG ": ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(try: pulse-bench loco --help)\n");
  return 2;
}

int bench_loco_parse(int argc, char **argv, loco_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    int m, k;
    uint64_t u;
    if (pulse_cli_opt_flag(arg, "--help") || pulse_cli_opt_flag(arg, "-h")) {
      bench_loco_usage(stdout);
      return 0;
    } else if (pulse_cli_opt_flag(arg, "--json")) {
      a->json = 1;
    } else if (pulse_cli_opt_flag(arg, "--only-pulseloco")) {
      a->only_pulseloco = 1;
    } else if (pulse_cli_opt_flag(arg, "--no-auth")) {
      a->no_auth = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (m < 0)
        return usage_error("--report needs a folder%s", "");
      a->report = v;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--trainers", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, MAX_TRAINERS - 1, &k) != 0)
        return usage_error("--trainers needs 1..63, got '%s'", m < 0 ? "" : v);
      a->trainers = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--rounds", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 100000, &k) != 0)
        return usage_error("--rounds needs 1..100000, got '%s'",
                           m < 0 ? "" : v);
      a->rounds = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--inner", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 1000000, &k) != 0)
        return usage_error("--inner needs 1..1000000, got '%s'",
                           m < 0 ? "" : v);
      a->inner = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &u) != 0 || u < 1000 || u > 100000000)
        return usage_error("--params needs 1000..1e8, got '%s'",
                           m < 0 ? "" : v);
      a->params = u;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a->seed) != 0)
        return usage_error("--seed needs an integer, got '%s'", m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->lr) != 0 ||
          !(a->lr >= 0 && a->lr < 1))
        return usage_error("--lr needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--drop-rate", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->drop_rate) != 0 ||
          !(a->drop_rate >= 0 && a->drop_rate < 1))
        return usage_error("--drop-rate needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--deadline-ms", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 600000, &k) != 0)
        return usage_error("--deadline-ms needs 1..600000, got '%s'",
                           m < 0 ? "" : v);
      a->deadline_ms = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--rule", &v)) != 0) {
      if (m < 0 || pulse_loco_rule_parse(v, &a->rule) != PULSE_OK)
        return usage_error("--rule needs drop, keep or legacy, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--transport", &v)) !=
               0) {
      if (m < 0 || pulse_loco_transport_parse(v, &a->transport) != PULSE_OK)
        return usage_error("--transport needs http or udp, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--drop", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->drop) != 0 ||
          !(a->drop >= 0 && a->drop < 1))
        return usage_error("--drop needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--resync-period",
                                        &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 100000, &k) != 0)
        return usage_error("--resync-period needs 1..100000, got '%s'",
                           m < 0 ? "" : v);
      a->resync_period = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--drift-budget",
                                        &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->drift_budget) != 0 ||
          !(a->drift_budget >= 0))
        return usage_error("--drift-budget needs a number >= 0, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--netns", &v)) != 0) {
      if (m < 0 || pulse_sim_netns_parse(v, a->netns, 8, &a->nnetns) != 0)
        return usage_error("--netns needs NAME=A.B.C.D[,NAME=A.B.C.D...] (at "
                           "most 8), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--problem", &v)) !=
               0) {
      if (m < 0 || (strcmp(v, "text") != 0 && strcmp(v, "text-sft") != 0 &&
                    strcmp(v, "text-rl") != 0 && strcmp(v, "teacher") != 0))
        return usage_error("--problem needs text, text-sft, text-rl or "
                           "teacher, got '%s'",
                           m < 0 ? "" : v);
      a->problem = strcmp(v, "text") == 0       ? PULSE_SIM_PROBLEM_TEXT
                   : strcmp(v, "text-sft") == 0 ? PULSE_SIM_PROBLEM_TEXT_SFT
                   : strcmp(v, "text-rl") == 0  ? PULSE_SIM_PROBLEM_TEXT_RL
                                                : PULSE_SIM_PROBLEM_TEACHER;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--compute", &v)) !=
               0) {
      if (m < 0 || (strcmp(v, "fp32") != 0 && strcmp(v, "bf16") != 0))
        return usage_error("--compute needs fp32 or bf16, got '%s'",
                           m < 0 ? "" : v);
      a->compute = strcmp(v, "bf16") == 0 ? PULSE_SIM_COMPUTE_BF16
                                          : PULSE_SIM_COMPUTE_FP32;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--param", &v)) != 0) {
      if (m < 0 || (strcmp(v, "scaled") != 0 && strcmp(v, "standard") != 0))
        return usage_error("--param needs scaled or standard, got '%s'",
                           m < 0 ? "" : v);
      a->parametrization = strcmp(v, "standard") == 0 ? PULSE_SIM_PARAM_STANDARD
                                                      : PULSE_SIM_PARAM_SCALED;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--text", &v)) != 0) {
      if (m < 0 || *v == '\0')
        return usage_error("--text needs a file%s", "");
      a->text_path = v;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--join-round", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 100000, &a->join_round) != 0)
        return usage_error("--join-round needs a round from 1, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--leave-round", &v)) !=
               0) {
      if (m < 0 || pulse_cli_parse_int(v, 0, 100000, &a->leave_round) != 0)
        return usage_error("--leave-round needs a round from 0, got '%s'",
                           m < 0 ? "" : v);
    } else if (strcmp(arg, "--gate-mean") == 0 ||
               strcmp(arg, "--no-gate-mean") == 0) {
      /* The fixed-membership run's replay (update_bias) has no mean gate. */
      return usage_error("%s is for collaboration mode (with --target-batch "
                         "T)",
                         arg);
    } else {
      return usage_error("unknown option '%s'", arg);
    }
  }
  if (a->compute < 0)
    a->compute = bench_loco_default_compute(a->problem);
  if (a->join_round >= (int)a->rounds)
    return usage_error("--join-round must be below --rounds%s", "");
  if (a->parametrization == PULSE_SIM_PARAM_STANDARD &&
      !pulse_sim_problem_is_text(a->problem))
    return usage_error("--param standard needs --problem text, text-sft or "
                       "text-rl%s",
                       "");
  if (a->text_path != NULL && !pulse_sim_problem_is_text(a->problem))
    return usage_error("--text needs --problem text, text-sft or text-rl%s",
                       "");
  if (a->transport == PULSE_LOCO_TRANSPORT_UDP &&
      (a->rule != PULSE_LOCO_RULE_DROP || a->drop_rate > 0))
    return usage_error("--transport udp needs --rule drop and loses datagrams "
                       "with --drop, not --drop-rate%s",
                       "");
  if (a->transport != PULSE_LOCO_TRANSPORT_UDP && a->drop > 0)
    return usage_error("--drop loses datagrams: it needs --transport udp%s",
                       "");
  if (a->leave_round >= (int)a->rounds - 1 ||
      (a->leave_round >= 0 && a->trainers < 2))
    return usage_error(
        "--leave-round needs 2 trainers and a round before the last%s", "");
  return -1; /* go on */
}
