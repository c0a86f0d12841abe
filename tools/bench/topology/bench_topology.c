/* bench_topology.c - `pulse-bench topology`: decentralized training on the
 * built-in problem (tools/sim/sim_problem.h) with compressed gossip
 * (loco/pulse_gossip.h) over several graphs, and what each graph does to
 * the replicas' variance, the loss and the bytes.
 *
 * Every arm runs N trainers in this process (each with its own replica,
 * data shard and gossip context; every payload really encoded, handed to
 * its neighbour and decoded), or with --processes one process per trainer
 * exchanging over HTTP on 127.0.0.1 (bench_topology_http.c), which must give
 * the same numbers. A round: `inner` SGD steps per trainer on its own
 * mini-batches with equal Gaussian gradient noise, then one gossip round on
 * the arm's graph, then the figures (after mixing). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_impl.h"
#include "bench_topology_impl.h"
#include "pulse_elem.h"
#include "pulse_loco.h"
#include "rng_impl.h"
#include "cli_args.h"

const char *const topo_arm_name[ARM_COUNT] = {
    "ring", "torus", "exponential", "complete", "adaptive", "onepeer"};

void bench_topology_usage(FILE *out) {
  fprintf(out,
          "usage: pulse-bench topology [options]\n"
          "  Decentralized training on the built-in problem: N trainers take "
          "SGD steps\n"
          "  with equal gradient noise and gossip with their graph neighbours "
          "(BF16-gated\n"
          "  payloads with error feedback, CHOCO copies); per round the "
          "replicas'\n"
          "  variance, consensus distance, loss and bytes, per arm.\n"
          "  --nodes N        trainers (2..64; adaptive and onepeer need a "
          "power of 2; 16)\n"
          "  --rounds R       gossip rounds (40)\n"
          "  --inner H        SGD steps per round (4)\n"
          "  --seed S         problem, data and noise seed (1)\n"
          "  --params P       model size, about (10000)\n"
          "  --lr X           SGD step (0.05)\n"
          "  --noise X        gradient noise std per entry (0.1)\n"
          "  --arms LIST      ring,torus,exponential,complete,adaptive "
          "(default; also onepeer)\n"
          "  --target X       adaptive: variance target (default: automatic, "
          "see README)\n"
          "  --budget X       adaptive: fraction of the complete graph's bytes "
          "(0.25)\n"
          "  --final-rounds K adaptive: last K rounds exact (log2 N one-peer "
          "steps; 2; 0: none)\n"
          "  --gate none      exact payloads instead of BF16-gated ones\n"
          "  --processes      one process per trainer over HTTP on 127.0.0.1\n"
          "  --json           one JSON object per arm and round, then one "
          "summary object per arm\n"
          "  --report DIR     DIR/report.html (variance and loss against "
          "rounds) and CSV tables\n");
}

/* ------------------------------------------------------------- the round */

void topo_gossip_opts(const topo_setup *s, uint32_t i, pulse_gossip_opts *o) {
  pulse_gossip_opts_init(o);
  o->nodes = s->a->nodes;
  o->self = i;
  o->param_count = s->P;
  o->gate = s->a->gate_none ? PULSE_LOCO_GATE_NONE : PULSE_LOCO_GATE_BF16;
  o->chunk_log2 = 16;
}

static float normal(uint64_t *st) {
  uint64_t r = pulse_rng_next(st);
  double u1 = ((double)(r >> 11) + 0.5) * 0x1p-53;
  double u2 = (double)(pulse_rng_next(st) >> 11) * 0x1p-53;
  return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void topo_local_steps(const topo_setup *s, pulse_sim_learner *l, uint32_t i,
                      uint32_t t, float *x, float *grad) {
  const topo_args *a = s->a;
  float lr = (float)a->lr, sd = (float)a->noise;
  for (uint32_t h = 0; h < a->inner; h++) {
    pulse_sim_learner_grad(l, x, grad);
    uint64_t st = pulse_rng_at(a->seed ^ 0x6055197ull,
                               ((uint64_t)t * a->inner + h) * 4096u + i);
    for (uint64_t p = 0; p < s->P; p++)
      x[p] -= lr * (grad[p] + sd * normal(&st));
  }
}

/* Mean over parameters of the squared mean parameter. */
static double mean_square(const topo_setup *s, const float *const *xs) {
  uint32_t n = s->a->nodes;
  double msq = 0.0;
  for (uint64_t p = 0; p < s->P; p++) {
    double m = 0.0;
    for (uint32_t i = 0; i < n; i++)
      m += xs[i][p];
    m /= n;
    msq += m * m;
  }
  return msq / (double)s->P;
}

double topo_update_variance(const topo_setup *s, const float *const *xs,
                            const float *const *before) {
  uint32_t n = s->a->nodes;
  double upd = 0.0;
  for (uint64_t p = 0; p < s->P; p++) {
    double um = 0.0, u = 0.0;
    for (uint32_t i = 0; i < n; i++)
      um += (double)xs[i][p] - before[i][p];
    um /= n;
    for (uint32_t i = 0; i < n; i++) {
      double e = ((double)xs[i][p] - before[i][p]) - um;
      u += e * e;
    }
    upd += u / (n - 1.0); /* unbiased: the per-node noise variance */
  }
  return upd / (double)s->P / mean_square(s, xs);
}

void topo_measure(const topo_setup *s, const float *const *xs,
                  topo_row *row) {
  uint32_t n = s->a->nodes;
  double var = 0.0, dist = 0.0, loss = 0.0;
  for (uint64_t p = 0; p < s->P; p++) {
    double m = 0.0, v = 0.0;
    for (uint32_t i = 0; i < n; i++)
      m += xs[i][p];
    m /= n;
    for (uint32_t i = 0; i < n; i++) {
      double d = xs[i][p] - m;
      v += d * d;
    }
    var += v / n;
    dist += v;
  }
  for (uint32_t i = 0; i < n; i++) {
    double li, acc;
    pulse_sim_problem_eval(s->prob, xs[i], &li, &acc);
    loss += li;
  }
  row->variance = var / (double)s->P / mean_square(s, xs);
  row->consensus = sqrt(dist / n);
  row->loss = loss / n;
}

pulse_status topo_graph(const topo_args *a, topo_arm arm, uint32_t t,
                        pulse_gossip_graph **g) {
  static const pulse_gossip_topology map[] = {
      PULSE_GOSSIP_RING, PULSE_GOSSIP_TORUS, PULSE_GOSSIP_EXPONENTIAL,
      PULSE_GOSSIP_COMPLETE};
  if (arm == ARM_ONEPEER)
    return pulse_gossip_graph_make(PULSE_GOSSIP_ONE_PEER_EXP, a->nodes, t,
                                   PULSE_GOSSIP_WEIGHTS_MH, g);
  return pulse_gossip_graph_make(map[arm], a->nodes, 0,
                                 PULSE_GOSSIP_WEIGHTS_MH, g);
}

double topo_factor(const topo_args *a, topo_arm arm) {
  if (arm == ARM_ADAPTIVE)
    return NAN;
  if (arm == ARM_ONEPEER) {
    uint32_t L = 0;
    while ((1u << L) < a->nodes)
      L++;
    pulse_gossip_graph *seq[32] = {0};
    const pulse_gossip_graph *cseq[32];
    double f = NAN;
    int ok = L > 0;
    for (uint32_t t = 0; t < L && ok; t++) {
      ok = topo_graph(a, arm, t, &seq[t]) == PULSE_OK;
      cseq[t] = seq[t];
    }
    if (ok)
      f = pulse_gossip_predicted_variance_seq(cseq, L);
    for (uint32_t t = 0; t < L; t++)
      pulse_gossip_graph_free(seq[t]);
    return f;
  }
  pulse_gossip_graph *g;
  if (topo_graph(a, arm, 0, &g) != PULSE_OK)
    return NAN;
  double f = pulse_gossip_graph_predicted_variance(g);
  pulse_gossip_graph_free(g);
  return f < 1e-12 ? 0.0 : f; /* the complete graph's 0, not its rounding */
}

void topo_summarize(const topo_args *a, topo_result *r) {
  uint32_t R = a->rounds, from = R / 2;
  double v = 0.0, pr = 0.0, bytes = 0.0, deg = 0.0;
  for (uint32_t t = 0; t < R; t++) {
    bytes += r->rows[t].bytes_per_node;
    deg += r->rows[t].degree;
    if (t >= from) {
      v += r->rows[t].variance;
      pr += r->rows[t].predicted;
    }
  }
  r->sum.variance = v / (R - from);
  r->sum.predicted = pr / (R - from); /* NaN stays NaN */
  r->sum.bytes_per_node = bytes;
  r->sum.final_loss = r->rows[R - 1].loss;
  r->sum.mean_degree = deg / R;
}


pulse_status topo_policy_create(const topo_args *a, pulse_gossip_policy **p) {
  pulse_gossip_policy_opts po;
  pulse_gossip_policy_opts_init(&po);
  po.nodes = a->nodes;
  po.target = a->target > 0.0 ? a->target : 1.0; /* automatic: set after
                                                   round 0's local steps */
  po.budget = a->budget;
  po.rounds = a->rounds;
  po.final_rounds = a->final_rounds;
  return pulse_gossip_policy_create(&po, p);
}

uint64_t topo_gossip_round(topo_arm arm, uint32_t t, uint32_t k) {
  return arm == ARM_ADAPTIVE ? (uint64_t)t * TOPO_MAX_STEPS + k : t;
}

pulse_loco_gate_mode topo_step_gate(const topo_args *a, topo_arm arm,
                                    uint32_t count, uint32_t k) {
  uint32_t dims = 0;
  while ((1u << dims) < a->nodes)
    dims++;
  if (a->gate_none ||
      (arm == ARM_ADAPTIVE && count == dims && k + 1 == count))
    return PULSE_LOCO_GATE_NONE;
  return PULSE_LOCO_GATE_BF16;
}

void topo_free_steps(pulse_gossip_graph **steps, uint32_t count) {
  for (uint32_t k = 0; k < count; k++) {
    pulse_gossip_graph_free(steps[k]);
    steps[k] = NULL;
  }
}

pulse_status topo_round_graphs(const topo_args *a, topo_arm arm, uint32_t t,
                               pulse_gossip_policy *policy, double last_var,
                               double spent, double last_payload,
                               double last_full, topo_result *r,
                               pulse_gossip_graph **steps, uint32_t *count) {
  *count = 0;
  pulse_status st;
  if (arm != ARM_ADAPTIVE) {
    st = topo_graph(a, arm, t, &steps[0]);
    *count = st == PULSE_OK;
    return st;
  }
  pulse_gossip_decision d;
  st = pulse_gossip_policy_decide(policy, t, last_var, spent, last_payload,
                                  last_full, &steps[0], &d);
  if (st != PULSE_OK)
    return st;
  *count = 1;
  for (uint32_t k = 1; k < d.steps && k < TOPO_MAX_STEPS; k++) {
    st = pulse_gossip_policy_step_graph(policy, k, &steps[k]);
    if (st != PULSE_OK) {
      topo_free_steps(steps, *count);
      *count = 0;
      return st;
    }
    *count = k + 1;
  }
  if (t == 0 && !(a->target > 0.0))
    d.target = NAN; /* automatic: set from this round's noise, after it */
  r->reason[t] = d.reason;
  r->decision[t] = d;
  return PULSE_OK;
}

/* ------------------------------------------------------------ in process */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int run_arm(const topo_setup *s, topo_arm arm, topo_result *r) {
  const topo_args *a = s->a;
  uint32_t n = a->nodes;
  size_t bytes = (size_t)s->P * sizeof(float);
  pulse_gossip **g = calloc(n, sizeof *g);
  pulse_sim_learner **l = calloc(n, sizeof *l);
  float **before = calloc(n, sizeof *before);
  const float **xs = calloc(n, sizeof *xs);
  float *grad = malloc(bytes);
  pulse_gossip_graph *steps[TOPO_MAX_STEPS] = {NULL};
  uint32_t nsteps = 0;
  pulse_gossip_policy *policy = NULL;
  int ok = g && l && before && xs && grad;
  for (uint32_t i = 0; ok && i < n; i++) {
    pulse_gossip_opts o;
    topo_gossip_opts(s, i, &o);
    ok = pulse_gossip_create(&o, s->init, &g[i]) == PULSE_OK &&
         pulse_sim_learner_create(s->prob, i, &l[i]) == PULSE_OK &&
         (before[i] = malloc(bytes)) != NULL;
    if (ok)
      xs[i] = pulse_gossip_params(g[i]);
  }
  if (ok && arm == ARM_ADAPTIVE)
    ok = topo_policy_create(a, &policy) == PULSE_OK;
  double factor = topo_factor(a, arm);
  double spent = 0.0, last_payload = 0.0, last_full = 0.0, last_var = NAN;
  double t0 = now_s();
  for (uint32_t t = 0; ok && t < a->rounds; t++) {
    topo_row *row = &r->rows[t];
    /* The round's graphs first: they depend only on earlier rounds. */
    topo_free_steps(steps, nsteps);
    ok = topo_round_graphs(a, arm, t, policy, last_var, spent, last_payload,
                           last_full, r, steps, &nsteps) == PULSE_OK;
    for (uint32_t i = 0; ok && i < n; i++) {
      memcpy(before[i], xs[i], bytes);
      topo_local_steps(s, l[i], i, t, pulse_gossip_params(g[i]), grad);
    }
    /* The noise of this round's local steps (before mixing). */
    double noise = ok ? topo_update_variance(s, xs, (const float *const *)before)
                      : 0.0;
    if (ok && policy && t == 0 && !(a->target > 0.0))
      ok = pulse_gossip_policy_set_target(policy, ADAPTIVE_TARGET_FACTOR *
                                                      noise) == PULSE_OK;
    if (!ok)
      break;
    uint64_t delivered = 0, payloads = 0, edges = 0, first = 0, first_n = 0;
    for (uint32_t k = 0; ok && k < nsteps; k++) {
      const pulse_gossip_graph *G = steps[k];
      uint64_t id = topo_gossip_round(arm, t, k);
      pulse_loco_gate_mode gate = topo_step_gate(a, arm, nsteps, k);
      for (uint32_t i = 0; ok && i < n; i++)
        ok = pulse_gossip_set_gate(g[i], gate) == PULSE_OK &&
             pulse_gossip_prepare(g[i], id, G, NULL) == PULSE_OK;
      for (uint32_t i = 0; ok && i < n; i++) {
        const uint32_t *nb = pulse_gossip_graph_neighbours(G, i);
        for (uint32_t e = 0; ok && e < pulse_gossip_graph_degree(G, i); e++) {
          const uint8_t *data;
          size_t size;
          ok = pulse_gossip_payload(g[nb[e]], i, &data, &size) == PULSE_OK &&
               pulse_gossip_receive(g[i], nb[e], data, size) == PULSE_OK;
          delivered += size;
          payloads++;
        }
      }
      for (uint32_t i = 0; ok && i < n; i++)
        ok = pulse_gossip_finish(g[i], NULL) == PULSE_OK;
      edges += pulse_gossip_graph_edge_count(G);
      if (k == 0)
        first = delivered, first_n = payloads;
    }
    if (!ok)
      break;
    topo_measure(s, xs, row);
    row->noise = noise;
    row->predicted = factor * noise;
    row->bytes_per_node = (double)delivered / n;
    row->degree = (uint32_t)((2 * edges + n / 2) / n);
    row->steps = nsteps;
    spent += (double)delivered;
    last_payload = payloads ? (double)delivered / payloads : last_payload;
    last_full = first_n ? (double)first / first_n : last_full;
    last_var = row->variance;
    if (!a->json && !a->processes)
      topo_print_round(a, r, t);
  }
  if (!ok)
    fprintf(stderr, TOPO_PROG ": %s: %s\n", topo_arm_name[arm],
            pulse_error_detail());
  r->sum.seconds = now_s() - t0;
  uint64_t digest = 0;
  for (uint32_t i = 0; ok && i < n; i++)
    digest = digest * 31u + pulse_loco_digest_f32(xs[i], s->P);
  r->digest = digest;
  for (uint32_t i = 0; i < n; i++) {
    if (g)
      pulse_gossip_free(g[i]);
    if (l)
      pulse_sim_learner_free(l[i]);
    if (before)
      free(before[i]);
  }
  free(g), free(l), free(before), free(xs), free(grad);
  topo_free_steps(steps, nsteps);
  pulse_gossip_policy_free(policy);
  return ok ? 0 : 1;
}

/* ------------------------------------------------------------- arguments */

static int usage_error(const char *what, const char *value) {
  fprintf(stderr, TOPO_PROG ": %s%s\n(try: pulse-bench topology --help)\n",
          what, value);
  return 2;
}

static int parse_arms(const char *list, int *arms) {
  memset(arms, 0, ARM_COUNT * sizeof *arms);
  char buf[256];
  if (strlen(list) >= sizeof buf)
    return -1;
  strcpy(buf, list);
  int any = 0;
  for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int found = 0;
    for (int k = 0; k < ARM_COUNT; k++)
      if (strcmp(tok, topo_arm_name[k]) == 0)
        arms[k] = found = any = 1;
    if (!found)
      return -1;
  }
  return any ? 0 : -1;
}

static int parse(int argc, char **argv, topo_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    int m, k;
    if (pulse_cli_opt_flag(arg, "--help") || pulse_cli_opt_flag(arg, "-h")) {
      bench_topology_usage(stdout);
      return 0;
    } else if (pulse_cli_opt_flag(arg, "--json")) {
      a->json = 1;
    } else if (pulse_cli_opt_flag(arg, "--processes")) {
      a->processes = 1;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (m < 0)
        return usage_error("--report needs a folder", "");
      a->report = v;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--nodes", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 2, 64, &k) != 0)
        return usage_error("--nodes needs 2..64, got ", m < 0 ? "" : v);
      a->nodes = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--rounds", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 2, 100000, &k) != 0)
        return usage_error("--rounds needs 2..100000, got ", m < 0 ? "" : v);
      a->rounds = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--inner", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 1, 100000, &k) != 0)
        return usage_error("--inner needs 1..100000, got ", m < 0 ? "" : v);
      a->inner = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a->seed) != 0)
        return usage_error("--seed needs an integer, got ", m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_u64(v, &a->params) != 0 ||
          a->params < 1000 || a->params > 10000000)
        return usage_error("--params needs 1000..1e7, got ", m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->lr) != 0 || !(a->lr > 0))
        return usage_error("--lr needs a positive number, got ",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--noise", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->noise) != 0 || !(a->noise >= 0))
        return usage_error("--noise needs a number >= 0, got ", m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--target", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->target) != 0 ||
          !(a->target > 0))
        return usage_error("--target needs a positive number, got ",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--budget", &v)) != 0) {
      if (m < 0 || pulse_cli_parse_double(v, &a->budget) != 0 ||
          !(a->budget > 0 && a->budget <= 1))
        return usage_error("--budget needs a number in (0, 1], got ",
                           m < 0 ? "" : v);
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--final-rounds",
                                       &v)) != 0) {
      if (m < 0 || pulse_cli_parse_int(v, 0, 100000, &k) != 0)
        return usage_error("--final-rounds needs 0..100000, got ",
                           m < 0 ? "" : v);
      a->final_rounds = (uint32_t)k;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--gate", &v)) != 0) {
      if (m < 0 || (strcmp(v, "none") != 0 && strcmp(v, "bf16") != 0))
        return usage_error("--gate needs bf16 or none, got ", m < 0 ? "" : v);
      a->gate_none = strcmp(v, "none") == 0;
    } else if ((m = pulse_cli_opt_value(argc, argv, &i, "--arms", &v)) != 0) {
      if (m < 0 || parse_arms(v, a->arms) != 0)
        return usage_error("--arms needs a list of ring, torus, exponential, "
                           "complete, adaptive, onepeer; got ",
                           m < 0 ? "" : v);
    } else {
      return usage_error("unknown option ", arg);
    }
  }
  if (a->final_rounds >= a->rounds)
    return usage_error("--final-rounds must be below --rounds", "");
  int pow2 = (a->nodes & (a->nodes - 1u)) == 0;
  if ((a->arms[ARM_ADAPTIVE] || a->arms[ARM_ONEPEER]) && !pow2)
    return usage_error("the adaptive and onepeer arms need a power-of-two "
                       "--nodes", "");
  return -1;
}

int bench_topology_main(int argc, char **argv) {
  topo_args a = {16, 40, 4, 1, 10000, 0.05, 0.1, 0.0, 0.25, 2, {0}, 0, 0, 0, NULL};
  for (int k = 0; k <= ARM_ADAPTIVE; k++)
    a.arms[k] = 1;
  int rc = parse(argc, argv, &a);
  if (rc >= 0)
    return rc;
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.seed = a.seed;
  po.test_count = 256;
  po.hidden = pulse_sim_problem_hidden_for(&po, a.params);
  topo_setup s = {&a, NULL, 0, NULL};
  if (pulse_sim_problem_create(&po, &s.prob) != PULSE_OK)
    return pulse_cli_fail(TOPO_PROG, "problem", PULSE_ERR_ARG);
  s.P = pulse_sim_problem_param_count(s.prob);
  s.init = malloc((size_t)s.P * sizeof *s.init);
  topo_result res[ARM_COUNT];
  memset(res, 0, sizeof res);
  int count = 0, failed = s.init == NULL;
  if (!failed)
    pulse_sim_problem_init(s.prob, s.init);
  if (!a.json)
    printf("pulse-bench topology: %u trainers, %" PRIu64 " parameters, %u "
           "rounds of %u SGD steps (lr %g, gradient noise %g), %s payloads\n",
           a.nodes, s.P, a.rounds, a.inner, a.lr, a.noise,
           a.gate_none ? "exact" : "BF16-gated");
  for (int k = 0; k < ARM_COUNT && !failed; k++) {
    if (!a.arms[k])
      continue;
    topo_result *r = &res[count];
    r->arm = (topo_arm)k;
    r->rows = calloc(a.rounds, sizeof *r->rows);
    r->reason = calloc(a.rounds, sizeof *r->reason);
    r->decision = calloc(a.rounds, sizeof *r->decision);
    if (r->rows == NULL || r->reason == NULL || r->decision == NULL) {
      failed = 1;
      break;
    }
    count++;
    failed = a.processes ? topo_run_http(&s, (topo_arm)k, r)
                         : run_arm(&s, (topo_arm)k, r);
    if (!failed) {
      topo_summarize(&a, r);
      if (a.json || a.processes)
        for (uint32_t t = 0; t < a.rounds; t++)
          topo_print_round(&a, r, t);
    }
  }
  if (!failed) {
    topo_print_summaries(&a, res, count);
    if (a.report)
      failed = topo_write_report(&a, res, count, argc, argv);
  }
  for (int k = 0; k < count; k++)
    free(res[k].rows), free(res[k].reason), free(res[k].decision);
  free(s.init);
  pulse_sim_problem_free(s.prob);
  return failed ? 1 : 0;
}
