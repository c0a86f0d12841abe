/* bench_loco.c - `pulse-bench loco`: DDP, DiLoCo and PULSELoCo on the
 * built-in training problem (tools/sim/sim_problem.h), every method's
 * messages encoded and sent over HTTP on 127.0.0.1, and their bytes counted
 * as they went.
 *
 * PULSELoCo runs one process per trainer (pulse_loco_node: payloads,
 * coordinator, manifest). The baselines run one process each, with their
 * trainers in turn inside it (tools/sim/sim_trainers.h): every trainer has its
 * own loco blob server and fetches every other trainer's message from it
 * (DDP: the FP32 gradient, every inner step; DiLoCo: the pseudo-gradient in
 * BF16, the reported baseline, and in FP32, every round). Every method's
 * losses are computed for real.
 *
 * Processes are forked before any of them starts a thread; each child
 * speaks to this parent through two pipes, one line per message:
 *   trainer -> parent  "url ID URL", "round R BYTES SENT CONTRIB MEMBERS
 *                      FETCHED RESYNCED LOSS", "done ID ROUND DIGEST",
 *                      "error TEXT"
 *   parent -> trainer  "start N ID URL ID URL ...", "join URL", "quit"
 *                      (every trainer is done or gone: end)
 *   baseline -> parent "init LOSS FLOOR P" (the first baseline only),
 *                      "arm R LOSS BYTES WIRE MAX_TRAINER MAX_MESSAGE",
 *                      "error TEXT" */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_impl.h"
#include "bench_loco_drift.h"
#include "pulse_loco.h"
#include "cli_args.h"
#include "bench_netns.h"
#include "sim_problem.h"
#include "cli_report.h"
#include "sim_trainers.h"
#include "cli_time.h"

#define PROG "pulse-bench loco"
#define MAX_TRAINERS 64
#define LINE_MAX_ 8192

/* The methods, in the order of every table: three baselines, each in its
 * own process (kids[0..BASELINES)), then PULSELoCo. */
enum { DDP_FP32, DILOCO_BF16, DILOCO_FP32, PULSELOCO, METHODS };
#define BASELINES PULSELOCO
/* kids[BASELINES] is the in-process PULSELoCo replay; trainers follow. */
#define FIRST_TRAINER (BASELINES + 1)
#define REFERENCE DILOCO_BF16 /* the baseline the targets are about */

static const struct {
  const char *key;  /* in --json keys and the child protocol */
  const char *name; /* in the text and --report */
  pulse_tk_sim_method method;
  pulse_tk_dense_values values;
} METHOD[METHODS] = {
    {"ddp_fp32", "DDP-FP32", PULSE_TK_SIM_DDP, PULSE_TK_DENSE_FP32},
    {"diloco_bf16", "DiLoCo-BF16", PULSE_TK_SIM_DILOCO, PULSE_TK_DENSE_BF16},
    {"diloco_fp32", "DiLoCo-FP32", PULSE_TK_SIM_DILOCO, PULSE_TK_DENSE_FP32},
    {"pulseloco", "PULSELoCo", PULSE_TK_SIM_PULSELOCO, PULSE_TK_DENSE_FP32}};

typedef struct {
  uint32_t trainers, rounds, inner, deadline_ms;
  uint64_t params, seed;
  double drop_rate, lr;
  pulse_loco_rule rule;
  int join_round;  /* an extra trainer joins once this many rounds are done; -1
                      none */
  int leave_round; /* the last founder leaves in this round; -1 none */
  int json;
  int only_pulseloco; /* --only-pulseloco: no baselines */
  const char *report; /* --report DIR */
  uint32_t transport; /* PULSE_LOCO_TRANSPORT_* */
  double drop;        /* --drop: each datagram lost (UDP) */
  uint32_t resync_period;
  double drift_budget;
  /* --netns NAME=ADDR,...: trainer i runs in network namespace
   * netns[i % nnetns] (/run/netns/NAME) and listens on its address. */
  pulse_tk_netns netns[8];
  uint32_t nnetns;
  uint32_t problem;      /* PULSE_TK_PROBLEM_TEXT (default) or _TEACHER */
  const char *text_path; /* --text FILE; NULL: base-files' licences */
  /* Authentication (issue 15): every trainer signs with its key (made for
   * the run, before the trainers fork) and pins every trainer's; --no-auth
   * turns it off to compare. */
  int no_auth;
  pulse_sign_key *keys[MAX_TRAINERS];
  pulse_loco_member_key pins[MAX_TRAINERS];
  uint32_t npins;
} loco_args;

void bench_loco_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench loco [options]\n"
      "  DDP, DiLoCo and PULSELoCo on the built-in problem (--problem; Adam "
      "inner\n"
      "  steps), every method's\n"
      "  messages encoded and sent over HTTP on 127.0.0.1:\n"
      "    PULSELoCo    one process per trainer: gated sparse payloads "
      "(loco/PAYLOAD.md)\n"
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
      "                   the loss) or teacher (distillation towards a "
      "nearby teacher)\n"
      "  --text FILE      text: learn this file instead\n"
      "  --lr X           inner Adam learning rate (default: the problem's, "
      "2e-3 for\n"
      "                   text, 2e-5 for teacher)\n"
      "  --drop-rate X    probability that a PULSELoCo payload is lost in a "
      "round\n"
      "                   (the coordinator treats the fetch as failed; default "
      "0)\n"
      "  --deadline-ms D  per-round payload deadline (default 2000)\n"
      "  --rule NAME      what a round does with a payload that did not arrive "
      "(loco/\n"
      "                   PAYLOAD.md \"Loss rules\"): drop (default: divide by "
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
      "                   signs its payloads and manifests with a key made "
      "for the\n"
      "                   run and pins every trainer's: loco/PAYLOAD.md, "
      "Authentication)\n"
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

/* --------------------------------------------------------------- children */

static uint64_t now_ms(void) {
  return (uint64_t)(pulse_tk_now() * 1000.0);
}

/* The problem every process builds alike (same seed, same data split and
 * initial weights); --lr 0 (the default) is the problem's own rate. */
static pulse_tk_problem *make_problem(const loco_args *a) {
  pulse_tk_problem_opts po = PULSE_TK_PROBLEM_OPTS_INIT;
  po.seed = a->seed;
  po.kind = a->problem;
  po.text_path = a->text_path;
  if (a->lr > 0)
    po.lr = (float)a->lr;
  else if (a->problem == PULSE_TK_PROBLEM_TEXT)
    po.lr = PULSE_TK_TEXT_LR;
  po.hidden = pulse_tk_problem_hidden_for(&po, a->params);
  pulse_tk_problem *p = NULL;
  if (pulse_tk_problem_create(&po, &p) != PULSE_OK)
    return NULL;
  return p;
}

/* Checks, before any process starts, that the problem can be built: the
 * text problem reads files that may be missing. @return 0 when it can. */
static int check_problem(const loco_args *a, uint64_t *bytes,
                         uint64_t *digest, uint64_t *P) {
  pulse_tk_problem *p = make_problem(a);
  if (p == NULL) {
    fprintf(stderr, PROG ": cannot build the %s problem: %s\n",
            a->problem == PULSE_TK_PROBLEM_TEXT ? "text" : "teacher",
            pulse_error_detail());
    return 1;
  }
  pulse_tk_problem_data(p, bytes, digest);
  *P = pulse_tk_problem_param_count(p);
  pulse_tk_problem_free(p);
  return 0;
}

static int child_fail(int out, const char *what, pulse_status st) {
  dprintf(out, "error %s: %s (%s): %s\n", what, pulse_status_str(st),
          pulse_status_name(st), pulse_error_detail());
  return 1;
}

typedef struct {
  int out;
  const char *key;
} baseline_sink;

static void baseline_round(void *user, const pulse_tk_sim_round *r) {
  baseline_sink *s = user;
  dprintf(s->out,
          "%s %u %.9g %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
          s->key, r->round, r->loss, r->bytes, r->wire_bytes,
          r->max_trainer_bytes, r->max_message_bytes);
}

/* One baseline method over HTTP (METHOD[which]). */
static int run_baseline(const loco_args *a, int which, int out) {
  pulse_tk_problem *p = make_problem(a);
  if (p == NULL)
    return child_fail(out, "problem", PULSE_ERR_NOMEM);
  if (which == 0) {
    uint64_t P = pulse_tk_problem_param_count(p);
    float *theta = malloc(P * sizeof *theta);
    if (theta == NULL)
      return child_fail(out, "baseline", PULSE_ERR_NOMEM);
    pulse_tk_problem_init(p, theta);
    double loss;
    pulse_tk_problem_eval(p, theta, &loss, NULL);
    dprintf(out, "init %.9g %.9g %" PRIu64 "\n", loss,
            pulse_tk_problem_floor(p), P);
    free(theta);
  }
  pulse_tk_sim_opts so = PULSE_TK_SIM_OPTS_INIT;
  so.method = METHOD[which].method;
  so.values = METHOD[which].values;
  so.over_http = 1;
  so.trainers = a->trainers;
  so.rounds = a->rounds;
  so.inner = a->inner;
  baseline_sink s = {out, METHOD[which].key};
  pulse_status st = pulse_tk_sim_run(p, &so, baseline_round, &s, NULL);
  pulse_tk_problem_free(p);
  return st == PULSE_OK ? 0 : child_fail(out, METHOD[which].name, st);
}

typedef struct {
  int out;
} replay_sink;

static void replay_round(void *user, const pulse_tk_sim_round *r) {
  replay_sink *s = user;
  if (r->round > 0)
    dprintf(s->out, "bias %u %.9g %.9g\n", r->round, r->update_bias, r->drift);
}

/* PULSELoCo again in one process, the same rounds as the trainers (same
 * seed, rule and loss draws), for what needs every trainer's signal at
 * once: update_bias (sim_trainers.h). */
static int run_replay(const loco_args *a, int out) {
  pulse_tk_problem *p = make_problem(a);
  if (p == NULL)
    return child_fail(out, "problem", PULSE_ERR_NOMEM);
  pulse_tk_sim_opts so = PULSE_TK_SIM_OPTS_INIT;
  so.method = PULSE_TK_SIM_PULSELOCO;
  so.trainers = a->trainers;
  so.rounds = a->rounds;
  so.inner = a->inner;
  so.drop_rate = a->drop_rate;
  so.drop_seed = a->seed;
  so.rule = (int)a->rule;
  so.chunked = a->transport == PULSE_LOCO_TRANSPORT_UDP;
  so.datagram_drop = a->drop;
  so.resync_period = a->resync_period;
  so.drift_budget = a->drift_budget;
  uint64_t P = pulse_tk_problem_param_count(p);
  float *theta = malloc(P * sizeof *theta);
  if (theta == NULL)
    return child_fail(out, "replay", PULSE_ERR_NOMEM);
  pulse_tk_problem_init(p, theta);
  double loss;
  pulse_tk_problem_eval(p, theta, &loss, NULL);
  dprintf(out, "init %.9g %.9g %" PRIu64 "\n", loss, pulse_tk_problem_floor(p),
          P);
  free(theta);
  replay_sink s = {out};
  pulse_status st = pulse_tk_sim_run(p, &so, replay_round, &s, NULL);
  pulse_tk_problem_free(p);
  return st == PULSE_OK ? 0 : child_fail(out, "PULSELoCo replay", st);
}

static int read_line(FILE *in, char *line, size_t cap) {
  if (fgets(line, (int)cap, in) == NULL)
    return 0;
  line[strcspn(line, "\n")] = '\0';
  return 1;
}

/* pulse_loco_node_opts.drift_probe: a trainer's theta_g before re-sync. */
typedef struct {
  bench_pair_drift *pd;
  uint32_t id;
  uint64_t written; /* the last round written (1-based) */
} drift_probe_ctx;

static void drift_probe_write(void *user, uint64_t round,
                              const float *theta_g) {
  drift_probe_ctx *c = user;
  bench_pair_drift_write(c->pd, c->id, round + 1, theta_g);
  c->written = round + 1;
}

static int run_trainer(const loco_args *a, uint32_t id, int founder, int in_fd,
                       int out, bench_pair_drift *pd) {
  FILE *in = fdopen(in_fd, "r");
  const char *host = NULL;
  if (a->nnetns > 0) { /* before any socket: they belong to a namespace */
    const pulse_tk_netns *ns = &a->netns[id % a->nnetns];
    if (pulse_tk_netns_enter(ns) != 0) {
      dprintf(out, "error network namespace %s: %s\n", ns->name,
              strerror(errno));
      return 1;
    }
    host = ns->addr;
  }
  pulse_tk_problem *p = make_problem(a);
  if (in == NULL || p == NULL)
    return child_fail(out, "trainer set-up", PULSE_ERR_NOMEM);
  uint64_t P = pulse_tk_problem_param_count(p);
  float *local = malloc(P * sizeof *local);
  if (local == NULL)
    return child_fail(out, "trainer", PULSE_ERR_NOMEM);
  pulse_tk_problem_init(p, local);
  pulse_loco_opts lo = PULSE_LOCO_OPTS_INIT;
  lo.param_count = P;
  lo.trainer_id = id;
  lo.rule = a->rule;
  pulse_loco *ctx = NULL;
  pulse_status st = pulse_loco_create(&lo, founder ? local : NULL, &ctx);
  if (st != PULSE_OK)
    return child_fail(out, "context", st);
  pulse_loco_node_opts no = PULSE_LOCO_NODE_OPTS_INIT;
  no.deadline_ms = a->deadline_ms;
  no.manifest_timeout_ms =
      a->deadline_ms * 5u > 20000u ? a->deadline_ms * 5u : 20000u;
  no.drop_rate = a->drop_rate;
  no.drop_seed = a->seed;
  no.transport = a->transport;
  no.datagram_drop = a->drop;
  no.resync_period = a->resync_period;
  no.drift_budget = a->drift_budget;
  no.host = host;
  /* The drift over all pairs is measured before any re-sync: the node
   * hands theta_g over then; the reference (which never re-syncs) and
   * HTTP rounds are written after the step. */
  drift_probe_ctx probe = {pd, id, 0};
  no.drift_probe = drift_probe_write;
  no.drift_probe_user = &probe;
  if (!a->no_auth) {
    no.auth = PULSE_LOCO_AUTH_ON;
    no.sign_key = a->keys[id];
    no.member_keys = a->pins;
    no.member_key_count = a->npins;
  }
  pulse_loco_node *node = NULL;
  if ((st = pulse_loco_node_create(&no, ctx, &node)) != PULSE_OK)
    return child_fail(out, "node", st);
  dprintf(out, "url %u %s\n", id, pulse_loco_node_url(node));

  char line[LINE_MAX_];
  if (!read_line(in, line, sizeof line))
    return child_fail(out, "no start from the parent", PULSE_ERR_IO);
  if (strncmp(line, "start ", 6) == 0) {
    pulse_loco_member m[MAX_TRAINERS];
    unsigned count = 0;
    int used = 0;
    char *cur = line + 6;
    if (sscanf(cur, "%u%n", &count, &used) != 1 || count == 0 ||
        count > MAX_TRAINERS)
      return child_fail(out, "bad start line", PULSE_ERR_ARG);
    cur += used;
    for (unsigned i = 0; i < count; i++) {
      if (sscanf(cur, " %u %63s%n", &m[i].id, m[i].url, &used) != 2)
        return child_fail(out, "bad start line", PULSE_ERR_ARG);
      cur += used;
    }
    st = pulse_loco_node_start(node, m, count);
  } else if (strncmp(line, "join ", 5) == 0) {
    st = pulse_loco_node_join(node, line + 5, local, 60000);
  } else {
    st = PULSE_ERR_ARG;
  }
  if (st != PULSE_OK)
    return child_fail(out, "start or join", st);

  pulse_tk_learner *l = NULL;
  if ((st = pulse_tk_learner_create(p, id, &l)) != PULSE_OK)
    return child_fail(out, "learner", st);
  int pacer = id == 0;
  while (pulse_loco_round(ctx) < a->rounds) {
    uint64_t t0 = now_ms();
    for (uint32_t h = 0; h < a->inner; h++)
      pulse_tk_learner_step(l, local);
    uint64_t t1 = now_ms();
    int leaving = a->leave_round >= 0 && id == a->trainers - 1 &&
                  pulse_loco_round(ctx) == (uint64_t)a->leave_round;
    pulse_loco_step_info info;
    st = pulse_loco_node_step(node, local,
                              (uint64_t)pulse_tk_problem_batch(p) * a->inner,
                              leaving, &info);
    if (st != PULSE_OK)
      return child_fail(out, "outer step", st);
    if (info.rejoined) /* dropped after missed rounds: joined, no round ran */
      continue;
    uint64_t t2 = now_ms();
    /* Before the line that reports the round: the parent reads it then. */
    if (probe.written != info.round + 1)
      bench_pair_drift_write(pd, id, info.round + 1, pulse_loco_global(ctx));
    uint64_t refused =
        info.chunks.truncated + info.chunks.bad_checksum +
        info.chunks.malformed + info.chunks.unknown_sender +
        info.chunks.other_round + info.chunks.other_base +
        info.chunks.duplicate + info.datagrams_refused_source;
    dprintf(out,
            "exchange %" PRIu64 " %" PRIu64 " %" PRIu64 " %.9g %u %u %" PRIu64
            " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
            info.round + 1, t2 - t1, t2 - t0, info.drift, info.drift_ranges,
            info.resynced_ranges, info.resync_bytes, info.datagrams_sent,
            info.datagrams_dropped, info.chunks.accepted, refused);
    double loss = -1.0;
    if (pacer)
      pulse_tk_problem_eval(p, pulse_loco_global(ctx), &loss, NULL);
    dprintf(out, "auth %" PRIu64 " %" PRIu64 "\n", info.auth.accepted,
            info.auth.unsigned_bodies + info.auth.forged + info.auth.replayed +
                info.auth.foreign + info.datagrams_refused_auth);
    dprintf(out,
            "round %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %" PRIu64
            " %d %.9g\n",
            info.round + 1, info.payload_bytes, info.sent, info.contributors,
            info.members, info.fetched_bytes, info.resynced, loss);
    if (leaving)
      break;
  }
  /* A coordinator of the last round waits until the others have its data. */
  pulse_loco_node_linger(node, no.manifest_timeout_ms);
  dprintf(out, "done %u %" PRIu64 " %016" PRIx64 "\n", id,
          pulse_loco_round(ctx), pulse_loco_global_digest(ctx));
  /* The node serves until every trainer is done (the parent's "quit", or
   * its end): over UDP a trainer still receiving the last round fetches
   * every sender's signed chunk list; one whose server had closed lost
   * all that sender's chunks and, the fetch retrying to the deadline, the
   * rest of its round (a loaded run: 640 of 666 datagrams accepted, drift
   * 5e-05 without loss). */
  while (read_line(in, line, sizeof line) && strcmp(line, "quit") != 0)
    ;
  pulse_tk_learner_free(l);
  pulse_loco_node_free(node);
  pulse_loco_free(ctx);
  pulse_tk_problem_free(p);
  free(local);
  fclose(in);
  return 0;
}

/* ----------------------------------------------------------------- parent */

/* ----------------------------------------------------------------- parent */

typedef struct {
  pid_t pid;
  int to;   /* parent writes */
  int from; /* parent reads */
  char buf[LINE_MAX_];
  size_t len;
  int open;
  uint32_t id; /* trainers */
  char url[64];
  int baseline; /* METHOD index + 1 of a baseline process; 0: a trainer */
  int replay;   /* the in-process PULSELoCo replay */
  int founder, told, done, quit;
  uint64_t final_round, digest;
} child;

/* One round of every method. PULSELoCo: bytes = its payloads, wire = the
 * bodies its trainers downloaded, message = the largest payload. */
typedef struct {
  double loss[METHODS];
  uint64_t bytes[METHODS], wire[METHODS];
  uint64_t max_trainer[METHODS], message[METHODS];
  int have[METHODS];
  uint64_t sent; /* PULSELoCo entries */
  double bias;   /* PULSELoCo update_bias, from the replay */
  int have_bias;
  uint32_t contributors, members, reports;
  /* PULSELoCo exchange: trainer 0's round and exchange wall time, the
   * max drift over trainers against the reference, and sums over them. */
  uint64_t round_ms, exchange_ms;
  double drift, replay_drift;
  uint64_t drift_ranges, resynced_ranges, resync_bytes;
  uint64_t dgram_sent, dgram_dropped, chunks_accepted, chunks_refused;
  /* Drift over all trainer pairs after the round (bench_loco_drift.h):
   * the trainers that wrote it, and the figure once measured. */
  uint64_t wrote_mask;
  int pair_tried, pair_measured;
  double pair_drift;
} round_row;

typedef struct {
  loco_args a;
  child kids[MAX_TRAINERS + FIRST_TRAINER];
  size_t nkids;
  round_row *rows; /* rows[0..rounds] */
  double init_loss, floor;
  uint64_t P;
  uint32_t pacer_rounds;
  int failed;
  uint64_t auth_accepted, auth_refused; /* over every trainer and round */
  uint64_t text_bytes, text_digest; /* the text problem's data */
  bench_pair_drift pd;              /* drift over all trainer pairs */
} bench;

static int spawn(bench *b, child *c, int (*body)(bench *, child *, int, int)) {
  int down[2], up[2];
  if (pipe(down) != 0 || pipe(up) != 0)
    return fprintf(stderr, PROG ": pipe: %s\n", strerror(errno)), 1;
  fflush(stdout), fflush(stderr);
  pid_t pid = fork();
  if (pid < 0)
    return fprintf(stderr, PROG ": fork: %s\n", strerror(errno)), 1;
  if (pid == 0) {
    for (size_t i = 0; i < b->nkids; i++)
      if (b->kids[i].open && &b->kids[i] != c)
        close(b->kids[i].to), close(b->kids[i].from);
    close(down[1]), close(up[0]);
    _exit(body(b, c, down[0], up[1]));
  }
  close(down[0]), close(up[1]);
  c->pid = pid;
  c->to = down[1];
  c->from = up[0];
  c->open = 1;
  return 0;
}

static int baseline_body(bench *b, child *c, int in, int out) {
  (void)in;
  return run_baseline(&b->a, c->baseline - 1, out);
}

static int replay_body(bench *b, child *c, int in, int out) {
  (void)c, (void)in;
  return run_replay(&b->a, out);
}

static int trainer_body(bench *b, child *c, int in, int out) {
  return run_trainer(&b->a, c->id, c->founder, in, out, &b->pd);
}

static void on_baseline_line(bench *b, const child *c, const char *line) {
  int m = c->baseline - 1;
  size_t klen = strlen(METHOD[m].key);
  unsigned r;
  double loss;
  uint64_t v[4];
  if (sscanf(line, "init %lf %lf %" SCNu64, &loss, &b->floor, &v[0]) == 3) {
    b->init_loss = loss;
    b->P = v[0];
  } else if (strncmp(line, METHOD[m].key, klen) == 0 && line[klen] == ' ' &&
             sscanf(line + klen,
                    " %u %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64, &r,
                    &loss, &v[0], &v[1], &v[2], &v[3]) == 6 &&
             r <= b->a.rounds) {
    round_row *w = &b->rows[r];
    w->loss[m] = loss, w->bytes[m] = v[0], w->wire[m] = v[1];
    w->max_trainer[m] = v[2], w->message[m] = v[3], w->have[m] = 1;
  }
}

/* Round r's drift over all pairs, once each member of the round (as trainer
 * 0 counted them) has written its theta_g; tried once: a round whose slots
 * were overwritten meanwhile stays not measured. */
static void measure_pair_drift(bench *b, uint32_t r) {
  round_row *w = &b->rows[r];
  if (w->pair_tried || !w->have[PULSELOCO] || w->members == 0 ||
      (uint32_t)__builtin_popcountll(w->wrote_mask) < w->members)
    return;
  w->pair_tried = 1;
  w->pair_measured =
      bench_pair_drift_measure(&b->pd, r, w->wrote_mask, &w->pair_drift) == 0;
}

static void on_trainer_line(bench *b, child *c, const char *line) {
  unsigned r, u1, u2;
  double loss;
  uint64_t v1, v2, v3;
  int resynced;
  if (sscanf(line, "url %u %63s", &u1, c->url) == 2)
    return;
  if (sscanf(line, "auth %" SCNu64 " %" SCNu64, &v1, &v2) == 2) {
    b->auth_accepted += v1;
    b->auth_refused += v2;
    return;
  }
  if (sscanf(line, "round %u %" SCNu64 " %" SCNu64 " %u %u %" SCNu64 " %d %lf",
             &r, &v1, &v2, &u1, &u2, &v3, &resynced, &loss) == 8 &&
      r >= 1 && r <= b->a.rounds) {
    round_row *w = &b->rows[r];
    w->bytes[PULSELOCO] += v1;
    if (v1 > w->max_trainer[PULSELOCO])
      w->max_trainer[PULSELOCO] = w->message[PULSELOCO] = v1;
    w->wire[PULSELOCO] += v3;
    w->sent += v2;
    w->reports++;
    if (c->id == 0) {
      w->loss[PULSELOCO] = loss, w->have[PULSELOCO] = 1;
      w->contributors = u1, w->members = u2;
      b->pacer_rounds = r;
      measure_pair_drift(b, r);
    }
  } else if (strncmp(line, "exchange ", 9) == 0) {
    uint64_t x[9];
    double drift;
    if (sscanf(line + 9,
               "%u %" SCNu64 " %" SCNu64 " %lf %" SCNu64 " %" SCNu64
               " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
               &r, &x[0], &x[1], &drift, &x[2], &x[3], &x[4], &x[5], &x[6],
               &x[7], &x[8]) != 11 ||
        r < 1 || r > b->a.rounds)
      return;
    round_row *w = &b->rows[r];
    if (c->id == 0)
      w->exchange_ms = x[0], w->round_ms = x[1];
    if (drift > w->drift)
      w->drift = drift;
    w->drift_ranges += x[2], w->resynced_ranges += x[3];
    w->resync_bytes += x[4], w->dgram_sent += x[5], w->dgram_dropped += x[6];
    w->chunks_accepted += x[7], w->chunks_refused += x[8];
    if (c->id < 64)
      w->wrote_mask |= 1ull << c->id;
    measure_pair_drift(b, r);
  } else if (sscanf(line, "done %u %" SCNu64 " %" SCNx64, &u1, &v1, &v2) == 3) {
    c->done = 1, c->final_round = v1, c->digest = v2;
  }
}

static void on_line(bench *b, child *c, char *line) {
  unsigned r;
  double v;
  if (c->replay && strncmp(line, "error ", 6) != 0) {
    uint64_t P;
    double d;
    if (sscanf(line, "bias %u %lf %lf", &r, &v, &d) == 3 && r >= 1 &&
        r <= b->a.rounds)
      b->rows[r].bias = v, b->rows[r].replay_drift = d,
      b->rows[r].have_bias = 1;
    else if (sscanf(line, "init %lf %lf %" SCNu64, &v, &b->floor, &P) == 3)
      b->init_loss = v, b->P = P;
    return;
  }
  if (strncmp(line, "error ", 6) == 0) {
    if (c->replay)
      fprintf(stderr, PROG ": PULSELoCo replay: %s\n", line + 6);
    else if (c->baseline)
      fprintf(stderr, PROG ": %s: %s\n", METHOD[c->baseline - 1].name,
              line + 6);
    else
      fprintf(stderr, PROG ": trainer %u: %s\n", c->id, line + 6);
    b->failed = 1;
  } else if (c->baseline) {
    on_baseline_line(b, c, line);
  } else {
    on_trainer_line(b, c, line);
  }
}

/* Reads what a child wrote and hands over its complete lines. */
static void read_child(bench *b, child *c) {
  ssize_t got = read(c->from, c->buf + c->len, sizeof c->buf - 1 - c->len);
  if (got <= 0) {
    close(c->from), close(c->to);
    c->open = 0;
    return;
  }
  c->len += (size_t)got;
  char *start = c->buf, *nl;
  while ((nl = memchr(start, '\n', c->len - (size_t)(start - c->buf))) !=
         NULL) {
    *nl = '\0';
    on_line(b, c, start);
    start = nl + 1;
  }
  c->len -= (size_t)(start - c->buf);
  memmove(c->buf, start, c->len);
  if (c->len == sizeof c->buf - 1)
    c->len = 0; /* an overlong line: drop it */
}

/* Tells the founders to start once all have their URL (returns 1 then), and
 * the joiner to join once trainer 0 finished its round. */
static int tell_trainers(bench *b, int started) {
  if (!started) {
    for (size_t i = FIRST_TRAINER; i < b->nkids; i++)
      if (b->kids[i].url[0] == '\0' && b->kids[i].open)
        return 0;
    char msg[LINE_MAX_];
    int len = snprintf(msg, sizeof msg, "start %u", b->a.trainers);
    for (size_t i = 0; i < b->nkids; i++)
      if (b->kids[i].founder)
        len += snprintf(msg + len, sizeof msg - (size_t)len, " %u %s",
                        b->kids[i].id, b->kids[i].url);
    for (size_t i = 0; i < b->nkids; i++)
      if (b->kids[i].founder && b->kids[i].open)
        dprintf(b->kids[i].to, "%s\n", msg);
  }
  for (size_t i = FIRST_TRAINER; i < b->nkids; i++) {
    child *c = &b->kids[i];
    if (!c->founder && !c->told && c->open &&
        b->pacer_rounds >= (uint32_t)b->a.join_round) {
      dprintf(c->to, "join %s\n", b->kids[FIRST_TRAINER].url); /* trainer 0 */
      c->told = 1;
    }
  }
  return 1;
}

/* Every trainer done (or gone): each may end now, none is still fetching
 * from another. */
static void quit_trainers(bench *b) {
  for (size_t i = FIRST_TRAINER; i < b->nkids; i++)
    if (b->kids[i].open && !b->kids[i].done)
      return;
  for (size_t i = FIRST_TRAINER; i < b->nkids; i++)
    if (b->kids[i].open && !b->kids[i].quit) {
      dprintf(b->kids[i].to, "quit\n");
      b->kids[i].quit = 1;
    }
}

/* Reads every child until all pipes close. */
static void event_loop(bench *b) {
  int started = 0;
  for (;;) {
    struct pollfd pf[MAX_TRAINERS + FIRST_TRAINER];
    size_t idx[MAX_TRAINERS + FIRST_TRAINER], n = 0;
    for (size_t i = 0; i < b->nkids; i++)
      if (b->kids[i].open) {
        pf[n].fd = b->kids[i].from;
        pf[n].events = POLLIN;
        idx[n++] = i;
      }
    if (n == 0)
      return;
    if (poll(pf, n, 1000) < 0 && errno != EINTR)
      return;
    for (size_t k = 0; k < n; k++)
      if (pf[k].revents & (POLLIN | POLLHUP | POLLERR))
        read_child(b, &b->kids[idx[k]]);
    started = tell_trainers(b, started);
    quit_trainers(b);
  }
}

/* ----------------------------------------------------------------- output */

static double ratio(uint64_t a, uint64_t b) {
  return b ? (double)a / (double)b : 0.0;
}

/* The whole run, per method. */
typedef struct {
  uint64_t bytes[METHODS], wire[METHODS], message[METHODS];
  double final_loss[METHODS];
  double reduction[METHODS]; /* method's wire bytes / PULSELoCo's */
  double gap[METHODS];       /* PULSELoCo's final loss / method's - 1 */
  uint64_t entries;          /* PULSELoCo */
  double update_bias;        /* PULSELoCo, mean over rounds */
  int t10, t100, t2;
  /* PULSELoCo exchange */
  double max_drift, max_replay_drift, round_ms, exchange_ms;
  uint64_t resynced_ranges, resync_bytes, dgram_sent, dgram_dropped;
  uint64_t chunks_accepted, chunks_refused;
  /* drift over all pairs (max over the measured rounds) and round times
   * (trainer 0's, over rounds): sum_up_pairs_and_times */
  double max_pair_drift;
  uint32_t pair_rounds;
  bench_time_stats round_t, exchange_t;
} totals;

/* The drift over all trainer pairs and the spread of round wall times. */
static void sum_up_pairs_and_times(const bench *b, totals *t) {
  uint32_t R = b->a.rounds, n = 0;
  double *rt = malloc(R * sizeof *rt), *xt = malloc(R * sizeof *xt);
  for (uint32_t r = 1; r <= R; r++) {
    const round_row *w = &b->rows[r];
    if (w->pair_measured) {
      t->pair_rounds++;
      if (w->pair_drift > t->max_pair_drift)
        t->max_pair_drift = w->pair_drift;
    }
    if (rt && xt && w->have[PULSELOCO])
      rt[n] = (double)w->round_ms, xt[n++] = (double)w->exchange_ms;
  }
  bench_time_stats_of(rt, n, &t->round_t);
  bench_time_stats_of(xt, n, &t->exchange_t);
  free(rt), free(xt);
}

static void sum_up(const bench *b, totals *t) {
  memset(t, 0, sizeof *t);
  const round_row *last = &b->rows[b->a.rounds];
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    const round_row *w = &b->rows[r];
    for (int m = 0; m < METHODS; m++) {
      t->bytes[m] += w->bytes[m], t->wire[m] += w->wire[m];
      if (w->message[m] > t->message[m])
        t->message[m] = w->message[m];
    }
    t->entries += w->sent;
    t->update_bias += w->bias / (double)b->a.rounds;
    if (w->drift > t->max_drift)
      t->max_drift = w->drift;
    if (w->replay_drift > t->max_replay_drift)
      t->max_replay_drift = w->replay_drift;
    t->round_ms += (double)w->round_ms / (double)b->a.rounds;
    t->exchange_ms += (double)w->exchange_ms / (double)b->a.rounds;
    t->resynced_ranges += w->resynced_ranges;
    t->resync_bytes += w->resync_bytes;
    t->dgram_sent += w->dgram_sent, t->dgram_dropped += w->dgram_dropped;
    t->chunks_accepted += w->chunks_accepted;
    t->chunks_refused += w->chunks_refused;
  }
  for (int m = 0; m < METHODS; m++) {
    t->final_loss[m] = last->loss[m];
    t->reduction[m] = ratio(t->wire[m], t->wire[PULSELOCO]);
    t->gap[m] =
        last->loss[m] > 0 ? last->loss[PULSELOCO] / last->loss[m] - 1.0 : 0.0;
  }
  sum_up_pairs_and_times(b, t);
  t->t10 = t->wire[PULSELOCO] * 10 <= t->wire[REFERENCE];
  t->t100 = t->wire[PULSELOCO] * 100 <= t->wire[DDP_FP32];
  t->t2 = t->gap[REFERENCE] <= 0.02;
}

static double density(const bench *b, const round_row *w) {
  return w->reports ? (double)w->sent / ((double)w->reports * (double)b->P)
                    : 0.0;
}

static void print_round_json(const bench *b, uint32_t r) {
  const round_row *w = &b->rows[r];
  printf("{\"round\":%u", r);
  for (int m = 0; m < METHODS; m++)
    printf(",\"loss_%s\":%.6f", METHOD[m].key, w->loss[m]);
  for (int m = 0; m < METHODS; m++)
    printf(",\"bytes_%s\":%" PRIu64 ",\"wire_bytes_%s\":%" PRIu64,
           METHOD[m].key, w->bytes[m], METHOD[m].key, w->wire[m]);
  for (int m = 0; m < BASELINES; m++)
    printf(",\"message_bytes_%s\":%" PRIu64, METHOD[m].key, w->message[m]);
  printf(",\"bytes_pulseloco_max_trainer\":%" PRIu64
         ",\"density\":%.5f,\"contributors\":%u,\"members\":%u"
         ",\"drift\":%.6g,\"ref_drift\":%.6g,\"replay_drift\":%.6g,"
         "\"resynced_ranges\":%" PRIu64 ",\"round_ms\":%" PRIu64
         ",\"exchange_ms\":%" PRIu64 "}\n",
         w->max_trainer[PULSELOCO], density(b, w), w->contributors, w->members,
         w->pair_measured ? w->pair_drift : -1.0, w->drift, w->replay_drift,
         w->resynced_ranges, w->round_ms, w->exchange_ms);
}

/* --only-pulseloco: PULSELoCo's columns alone (the baselines did not run),
 * with the exchange's drift and time. */
static void print_round_text_only(const bench *b, uint32_t r) {
  const round_row *w = &b->rows[r];
  if (r == 1)
    printf("round PULSELoCo-loss  bytes/trainer  density contrib  "
           "pair-drift  ref-drift  re-synced  round-ms\n");
  printf("%5u %14.5f %14" PRIu64 " %7.2f%% %3u/%-3u %11.3g %10.3g %10" PRIu64
         " %9" PRIu64 "\n",
         r, w->loss[PULSELOCO],
         w->bytes[PULSELOCO] / (w->reports ? w->reports : 1),
         100.0 * density(b, w), w->contributors, w->members,
         w->pair_measured ? w->pair_drift : -1.0, w->drift,
         w->resynced_ranges, w->round_ms);
}

static void print_round_text(const bench *b, uint32_t r) {
  if (b->a.only_pulseloco) {
    print_round_text_only(b, r);
    return;
  }
  const round_row *w = &b->rows[r];
  if (r == 1)
    printf("      ------------- held-out loss --------------   ------ bytes "
           "sent per trainer (mean) ------\n"
           "round  DDP-FP32 DiLoCo-BF16 DiLoCo-FP32 PULSELoCo     DDP-FP32 "
           "DiLoCo-BF16 DiLoCo-FP32 PULSELoCo  density contrib\n");
  uint32_t n[METHODS] = {b->a.trainers, b->a.trainers, b->a.trainers,
                         w->reports ? w->reports : 1};
  printf("%5u %9.5f %11.5f %11.5f %9.5f   %10" PRIu64 " %11" PRIu64
         " %11" PRIu64 " %9" PRIu64 " %7.2f%% %3u/%u\n",
         r, w->loss[DDP_FP32], w->loss[DILOCO_BF16], w->loss[DILOCO_FP32],
         w->loss[PULSELOCO], w->bytes[DDP_FP32] / n[DDP_FP32],
         w->bytes[DILOCO_BF16] / n[DILOCO_BF16],
         w->bytes[DILOCO_FP32] / n[DILOCO_FP32],
         w->bytes[PULSELOCO] / n[PULSELOCO], 100.0 * density(b, w),
         w->contributors, w->members);
}

static const char *yes(int v) {
  return v ? "true" : "false";
}

static void print_summary_json(const bench *b, const totals *t, double seconds,
                               int identical) {
  const loco_args *a = &b->a;
  double per = (double)a->trainers * a->rounds;
  printf("{\"summary\":true,\"trainers\":%u,\"rounds\":%u,\"inner\":%u,"
         "\"params\":%" PRIu64 ",\"seed\":%" PRIu64
         ",\"drop_rate\":%g,\"baseline\":\"%s\"",
         a->trainers, a->rounds, a->inner, b->P, a->seed, a->drop_rate,
         METHOD[REFERENCE].key);
  for (int m = 0; m < METHODS; m++) {
    const char *k = METHOD[m].key;
    printf(",\"bytes_%s\":%" PRIu64 ",\"wire_bytes_%s\":%" PRIu64
           ",\"wire_bytes_per_trainer_round_%s\":%.1f,\"final_loss_%s\":%.6f",
           k, t->bytes[m], k, t->wire[m], k, (double)t->wire[m] / per, k,
           t->final_loss[m]);
    if (m != PULSELOCO)
      printf(",\"message_bytes_%s\":%" PRIu64 ",\"reduction_vs_%s\":%.2f"
             ",\"pulseloco_vs_%s_loss\":%.5f",
             k, t->message[m], k, t->reduction[m], k, t->gap[m]);
  }
  /* The arm's figures (issue 16): PULSELoCo under its rule and loss. */
  printf(",\"rule\":\"%s\",\"final_loss\":%.6f,\"bytes_per_trainer\":%.1f,"
         "\"update_bias\":%.5f",
         pulse_loco_rule_name(a->rule), t->final_loss[PULSELOCO],
         (double)t->bytes[PULSELOCO] / a->trainers, t->update_bias);
  printf(",\"problem\":\"%s\",\"text_bytes\":%" PRIu64
         ",\"text_digest\":\"%016" PRIx64 "\",\"max_drift\":%.6g,"
         "\"drift_rounds_measured\":%u,\"max_ref_drift\":%.6g,"
         "\"round_ms_median\":%.1f,\"round_ms_p10\":%.1f,"
         "\"round_ms_p90\":%.1f,\"exchange_ms_median\":%.1f",
         a->problem == PULSE_TK_PROBLEM_TEXT ? "text" : "teacher",
         b->text_bytes, b->text_digest, t->max_pair_drift, t->pair_rounds,
         t->max_drift, t->round_t.median, t->round_t.p10, t->round_t.p90,
         t->exchange_t.median);
  printf(",\"auth\":%s,\"auth_accepted\":%" PRIu64
         ",\"auth_refused\":%" PRIu64,
         a->no_auth ? "false" : "true", b->auth_accepted, b->auth_refused);
  printf(",\"transport\":\"%s\",\"drop\":%g,"
         "\"max_replay_drift\":%.6g,\"drift_budget\":%g,\"resync_period\":%u,"
         "\"resynced_ranges\":%" PRIu64 ",\"resync_bytes\":%" PRIu64
         ",\"datagrams_sent\":%" PRIu64 ",\"datagrams_dropped\":%" PRIu64
         ",\"chunks_accepted\":%" PRIu64 ",\"chunks_refused\":%" PRIu64
         ",\"round_ms\":%.1f,\"exchange_ms\":%.1f",
         a->transport == PULSE_LOCO_TRANSPORT_UDP ? "udp" : "http", a->drop,
         t->max_replay_drift, a->drift_budget, a->resync_period,
         t->resynced_ranges, t->resync_bytes, t->dgram_sent, t->dgram_dropped,
         t->chunks_accepted, t->chunks_refused, t->round_ms, t->exchange_ms);
  printf(",\"bytes_per_entry_pulseloco\":%.3f,\"initial_loss\":%.6f,"
         "\"loss_floor\":%.6f,\"target_10x_diloco_bf16\":%s,"
         "\"target_100x_ddp_fp32\":%s,\"target_loss_2pct_diloco_bf16\":%s,"
         "\"replicas_identical\":%s,\"seconds\":%.2f}\n",
         ratio(t->bytes[PULSELOCO], t->entries), b->init_loss, b->floor,
         yes(t->t10), yes(t->t100), yes(t->t2), yes(identical), seconds);
}

/* PULSELoCo against the baselines and the targets. */
static void print_versus_text(const bench *b, const totals *t) {
  const loco_args *a = &b->a;
  printf("  PULSELoCo: final loss %+.2f%% vs DiLoCo-BF16 (%+.2f%% vs "
         "DiLoCo-FP32), %.2f B per sent entry, %.2f%% of the entries sent\n",
         100.0 * t->gap[DILOCO_BF16], 100.0 * t->gap[DILOCO_FP32],
         ratio(t->bytes[PULSELOCO], t->entries),
         100.0 * (double)t->entries /
             ((double)b->P * (double)a->trainers * (double)a->rounds));
  printf("  PULSELoCo puts %.1fx fewer bytes on the wire than DiLoCo-BF16 "
         "(FP32: %.1fx), %.1fx fewer than DDP-FP32\n",
         t->reduction[DILOCO_BF16], t->reduction[DILOCO_FP32],
         t->reduction[DDP_FP32]);
  printf("  targets: >= 10x fewer than DiLoCo-BF16: %s; >= 100x fewer than "
         "DDP-FP32: %s; final loss within 2%% of DiLoCo-BF16's: %s\n",
         t->t10 ? "met" : "MISSED", t->t100 ? "met" : "MISSED",
         t->t2 ? "met" : "MISSED");
}

static void print_summary_text(const bench *b, const totals *t, double seconds,
                               int identical) {
  const loco_args *a = &b->a;
  double per = (double)a->trainers * a->rounds;
  printf("\nsummary: %" PRIu64
         " parameters, %u trainers, %u rounds x %u inner steps, seed %" PRIu64
         "\n  held-out loss: start %.5f, floor %.5f (the teacher's entropy; "
         "text: 0, unknown)\n"
         "  %-12s %14s %14s %20s %11s\n",
         b->P, a->trainers, a->rounds, a->inner, a->seed, b->init_loss,
         b->floor, "method", "bytes sent", "on the wire",
         "wire B/trainer/round", "final loss");
  /* --only-pulseloco: the baselines did not run; leave them out. */
  for (int m = a->only_pulseloco ? PULSELOCO : 0; m < METHODS; m++)
    printf("  %-12s %14" PRIu64 " %14" PRIu64 " %20.0f %11.5f\n",
           METHOD[m].name, t->bytes[m], t->wire[m], (double)t->wire[m] / per,
           t->final_loss[m]);
  if (a->only_pulseloco)
    printf("  PULSELoCo: %.2f B per sent entry, %.2f%% of the entries sent "
           "(baselines not run)\n",
           ratio(t->bytes[PULSELOCO], t->entries),
           100.0 * (double)t->entries /
               ((double)b->P * (double)a->trainers * (double)a->rounds));
  else
    print_versus_text(b, t);
  printf("  PULSELoCo rule %s: update bias %.4f (1 = unbiased; mean over "
         "rounds against a lossless replay of each)\n",
         pulse_loco_rule_name(a->rule), t->update_bias);
  if (a->transport == PULSE_LOCO_TRANSPORT_UDP)
    printf("  over UDP, each datagram lost with p = %g: %" PRIu64 " sent, %" PRIu64
           " lost, %" PRIu64 " refused; drift against the reference before "
           "re-sync %.3g (budget %g), %" PRIu64
           " ranges re-synced (%" PRIu64 " bytes)\n",
           a->drop, t->dgram_sent, t->dgram_dropped, t->chunks_refused,
           t->max_drift, a->drift_budget, t->resynced_ranges, t->resync_bytes);
  printf("  max drift over all trainer pairs (after a round's aggregate, "
         "before re-sync): %.3g (%u of %u rounds measured)\n",
         t->max_pair_drift, t->pair_rounds, a->rounds);
  printf("  a round: %.0f ms (trainer 0: inner steps and exchange; median "
         "%.0f, 10-90%% %.0f-%.0f), the exchange %.0f ms (median %.0f)\n",
         t->round_ms, t->round_t.median, t->round_t.p10, t->round_t.p90,
         t->exchange_ms, t->exchange_t.median);
  if (a->no_auth)
    printf("  authentication off (--no-auth)\n");
  else
    printf("  authentication on (Ed25519, every trainer's key pinned): %" PRIu64
           " bodies accepted, %" PRIu64 " bodies or datagrams refused\n",
           b->auth_accepted, b->auth_refused);
  printf("  replicas identical at the end: %s; %.1f s\n",
         identical ? "yes" : "NO", seconds);
}

static void report(const bench *b, double seconds, int identical) {
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    if (b->a.json)
      print_round_json(b, r);
    else
      print_round_text(b, r);
  }
  totals t;
  sum_up(b, &t);
  if (b->a.json)
    print_summary_json(b, &t, seconds, identical);
  else
    print_summary_text(b, &t, seconds, identical);
}

/* ------------------------------------------------------------- arguments */

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, PROG ": ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n(try: pulse-bench loco --help)\n");
  return 2;
}

/* --report: the rows report() printed, as a table and charts. */
static int write_report(const bench *b, int argc, char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(b->a.report, "loco", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: cannot make %s\n", b->a.report), 1;
  static const char *const cols[] = {"round",
                                     "loss_DDP-FP32",
                                     "loss_DiLoCo-BF16",
                                     "loss_DiLoCo-FP32",
                                     "loss_PULSELoCo",
                                     "wire_bytes_DDP-FP32",
                                     "wire_bytes_DiLoCo-BF16",
                                     "wire_bytes_DiLoCo-FP32",
                                     "wire_bytes_PULSELoCo",
                                     "cumulative_wire_bytes_DDP-FP32",
                                     "cumulative_wire_bytes_DiLoCo-BF16",
                                     "cumulative_wire_bytes_DiLoCo-FP32",
                                     "cumulative_wire_bytes_PULSELoCo"};
  pulse_report_table *t = pulse_report_table_add(rep, "rounds", cols, 13);
  double cum[METHODS] = {0};
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    const round_row *w = &b->rows[r];
    pulse_report_row(t);
    pulse_report_num(t, r);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, w->loss[m]);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, (double)w->wire[m]);
    for (int m = 0; m < METHODS; m++)
      pulse_report_num(t, cum[m] += (double)w->wire[m]);
  }
  pulse_report_chart_spec c1 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Cumulative bytes on the wire, all trainers",
                                "round",
                                "round",
                                "cumulative bytes (B)",
                                cols + 9,
                                METHODS,
                                0,
                                1};
  pulse_report_chart_spec c2 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Held-out loss per round",
                                "round",
                                "round",
                                "loss (nats)",
                                cols + 1,
                                METHODS,
                                0,
                                0};
  pulse_report_chart(rep, &c1), pulse_report_chart(rep, &c2);
  char why[512];
  if (pulse_report_close(rep, why, sizeof why) != PULSE_OK)
    return fprintf(stderr, PROG ": --report: %s\n", why), 1;
  return 0;
}

static int parse(int argc, char **argv, loco_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *v = NULL;
    int m, k;
    uint64_t u;
    if (pulse_tk_opt_flag(arg, "--help") || pulse_tk_opt_flag(arg, "-h")) {
      bench_loco_usage(stdout);
      return 0;
    } else if (pulse_tk_opt_flag(arg, "--json")) {
      a->json = 1;
    } else if (pulse_tk_opt_flag(arg, "--only-pulseloco")) {
      a->only_pulseloco = 1;
    } else if (pulse_tk_opt_flag(arg, "--no-auth")) {
      a->no_auth = 1;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (m < 0)
        return usage_error("--report needs a folder%s", "");
      a->report = v;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--trainers", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, MAX_TRAINERS - 1, &k) != 0)
        return usage_error("--trainers needs 1..63, got '%s'", m < 0 ? "" : v);
      a->trainers = (uint32_t)k;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--rounds", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, 100000, &k) != 0)
        return usage_error("--rounds needs 1..100000, got '%s'",
                           m < 0 ? "" : v);
      a->rounds = (uint32_t)k;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--inner", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, 1000000, &k) != 0)
        return usage_error("--inner needs 1..1000000, got '%s'",
                           m < 0 ? "" : v);
      a->inner = (uint32_t)k;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_u64(v, &u) != 0 || u < 1000 || u > 100000000)
        return usage_error("--params needs 1000..1e8, got '%s'",
                           m < 0 ? "" : v);
      a->params = u;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--seed", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_u64(v, &a->seed) != 0)
        return usage_error("--seed needs an integer, got '%s'", m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--lr", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_double(v, &a->lr) != 0 ||
          !(a->lr >= 0 && a->lr < 1))
        return usage_error("--lr needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--drop-rate", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_double(v, &a->drop_rate) != 0 ||
          !(a->drop_rate >= 0 && a->drop_rate < 1))
        return usage_error("--drop-rate needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--deadline-ms", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, 600000, &k) != 0)
        return usage_error("--deadline-ms needs 1..600000, got '%s'",
                           m < 0 ? "" : v);
      a->deadline_ms = (uint32_t)k;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--rule", &v)) != 0) {
      if (m < 0 || pulse_loco_rule_parse(v, &a->rule) != PULSE_OK)
        return usage_error("--rule needs drop, keep or legacy, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--transport", &v)) !=
               0) {
      if (m < 0 || pulse_loco_transport_parse(v, &a->transport) != PULSE_OK)
        return usage_error("--transport needs http or udp, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--drop", &v)) != 0) {
      if (m < 0 || pulse_tk_parse_double(v, &a->drop) != 0 ||
          !(a->drop >= 0 && a->drop < 1))
        return usage_error("--drop needs a number in [0, 1), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--resync-period",
                                       &v)) != 0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, 100000, &k) != 0)
        return usage_error("--resync-period needs 1..100000, got '%s'",
                           m < 0 ? "" : v);
      a->resync_period = (uint32_t)k;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--drift-budget", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_double(v, &a->drift_budget) != 0 ||
          !(a->drift_budget >= 0))
        return usage_error("--drift-budget needs a number >= 0, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--netns", &v)) != 0) {
      if (m < 0 || pulse_tk_netns_parse(v, a->netns, 8, &a->nnetns) != 0)
        return usage_error("--netns needs NAME=A.B.C.D[,NAME=A.B.C.D...] (at "
                           "most 8), got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--problem", &v)) !=
               0) {
      if (m < 0 || (strcmp(v, "text") != 0 && strcmp(v, "teacher") != 0))
        return usage_error("--problem needs text or teacher, got '%s'",
                           m < 0 ? "" : v);
      a->problem = strcmp(v, "text") == 0 ? PULSE_TK_PROBLEM_TEXT
                                          : PULSE_TK_PROBLEM_TEACHER;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--text", &v)) != 0) {
      if (m < 0 || *v == '\0')
        return usage_error("--text needs a file%s", "");
      a->text_path = v;
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--join-round", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_int(v, 1, 100000, &a->join_round) != 0)
        return usage_error("--join-round needs a round from 1, got '%s'",
                           m < 0 ? "" : v);
    } else if ((m = pulse_tk_opt_value(argc, argv, &i, "--leave-round", &v)) !=
               0) {
      if (m < 0 || pulse_tk_parse_int(v, 0, 100000, &a->leave_round) != 0)
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
  if (a->join_round >= (int)a->rounds)
    return usage_error("--join-round must be below --rounds%s", "");
  if (a->text_path != NULL && a->problem != PULSE_TK_PROBLEM_TEXT)
    return usage_error("--text needs --problem text%s", "");
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

/* Forks the baselines and the trainers, reads them to the end and waits for
 * them. @return 1 when all ended well. */
static int run_all(bench *b) {
  /* kids[0..BASELINES): the baselines; then founders 0..N-1; then the
   * joiner N. */
  for (int m = 0; m < BASELINES; m++) /* spawned unless --only-pulseloco */
    b->kids[b->nkids++].baseline = m + 1;
  b->kids[b->nkids++].replay = 1;
  for (uint32_t i = 0; i < b->a.trainers; i++) {
    b->kids[b->nkids].id = i;
    b->kids[b->nkids++].founder = 1;
  }
  if (b->a.join_round > 0)
    b->kids[b->nkids++].id = b->a.trainers;
  int ok = 1;
  /* Keys for every trainer (the joiner's pinned too), before the fork. */
  b->a.npins = 0;
  for (uint32_t i = 0; !b->a.no_auth && ok && i <= b->a.trainers; i++) {
    if (pulse_sign_key_generate(&b->a.keys[i]) != PULSE_OK) {
      fprintf(stderr, PROG ": keys: %s\n", pulse_error_detail());
      ok = 0;
      break;
    }
    b->a.pins[i].id = i;
    pulse_sign_key_public(b->a.keys[i], b->a.pins[i].key);
    b->a.npins++;
  }
  for (size_t i = 0; i < b->nkids && ok; i++)
    if (!(b->kids[i].baseline && b->a.only_pulseloco) &&
        spawn(b, &b->kids[i],
              b->kids[i].baseline ? baseline_body
              : b->kids[i].replay ? replay_body
                                  : trainer_body) != 0)
      ok = 0;
  if (ok)
    event_loop(b);
  for (size_t i = 0; i < b->nkids; i++) {
    int status = 0;
    const child *c = &b->kids[i];
    if (c->pid > 0 && waitpid(c->pid, &status, 0) > 0 &&
        !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      if (c->replay)
        fprintf(stderr, PROG ": the PULSELoCo replay ended with status %d\n",
                status);
      else if (c->baseline)
        fprintf(stderr, PROG ": %s ended with status %d\n",
                METHOD[c->baseline - 1].name, status);
      else
        fprintf(stderr, PROG ": trainer %u ended with status %d\n", c->id,
                status);
      ok = 0;
    }
  }
  for (uint32_t i = 0; i < b->a.npins; i++)
    pulse_sign_key_free(b->a.keys[i]);
  return ok;
}

/* Everyone that stayed to the end holds the same theta_g. */
static int replicas_identical(const bench *b) {
  int finished = 0;
  uint64_t digest = 0;
  for (size_t i = FIRST_TRAINER; i < b->nkids; i++) {
    if (!b->kids[i].done)
      return 0;
    if (b->kids[i].final_round == b->a.rounds) {
      if (finished++ && b->kids[i].digest != digest)
        return 0;
      digest = b->kids[i].digest;
    }
  }
  return finished > 0;
}

int bench_loco_main(int argc, char **argv) {
  /* Collaboration mode (issue 17): its own runner. */
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], "--target-batch") == 0 ||
        strcmp(argv[i], "--peer-speeds") == 0 ||
        strcmp(argv[i], "--churn") == 0 || strcmp(argv[i], "--averaging") == 0 ||
        strcmp(argv[i], "--clients") == 0)
      return bench_loco_collab_main(argc, argv);
  static bench b; /* large: kept off the stack */
  memset(&b, 0, sizeof b);
  b.a = (loco_args){3,    50, 20, 2000, 70000, 1, 0.0, 0.0, PULSE_LOCO_RULE_DROP,
                    -1,   -1, 0,  0,    NULL,  PULSE_LOCO_TRANSPORT_HTTP,
                    0.0, 1,  0.01, {{{0}, {0}}}, 0, PULSE_TK_PROBLEM_TEXT,
                    NULL, 0, {NULL}, {{0, {0}}}, 0};
  int rc = parse(argc, argv, &b.a);
  if (rc >= 0)
    return rc;
  uint64_t P = 0;
  if (check_problem(&b.a, &b.text_bytes, &b.text_digest, &P) != 0)
    return 1;
  /* Before any fork: every trainer writes its theta_g there. */
  bench_pair_drift_open(&b.pd, b.a.trainers + (b.a.join_round > 0), P);
  b.rows = calloc(b.a.rounds + 1u, sizeof *b.rows);
  if (b.rows == NULL)
    return fprintf(stderr, PROG ": out of memory\n"), 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int children_ok = run_all(&b);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) +
                   1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  int complete = 1;
  for (int m = b.a.only_pulseloco ? PULSELOCO : 0; m < METHODS; m++)
    complete &= b.rows[b.a.rounds].have[m];
  if (!children_ok || b.failed || !complete) {
    fprintf(stderr, PROG ": the run did not complete\n");
    bench_pair_drift_close(&b.pd);
    free(b.rows);
    return 1;
  }
  int identical = replicas_identical(&b);
  report(&b, seconds, identical);
  bench_pair_drift_close(&b.pd);
  int report_rc = b.a.report != NULL ? write_report(&b, argc, argv) : 0;
  free(b.rows);
  /* A run that ends between re-syncs (rounds not a multiple of a period
   * above 1) ends with drifted replicas by design. */
  int between = b.a.transport == PULSE_LOCO_TRANSPORT_UDP &&
                b.a.resync_period > 1 && b.a.rounds % b.a.resync_period != 0;
  return (identical || between) && report_rc == 0 ? 0 : 1;
}
