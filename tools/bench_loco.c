/* bench_loco.c - `pulse-bench loco`: DDP, DiLoCo and PULSELoCo on the
 * built-in training problem (tools/toolkit_problem.h). PULSELoCo runs for
 * real: one process per trainer, exchanging payloads over HTTP on
 * 127.0.0.1; DDP and DiLoCo run in two more processes, in memory (their bytes
 * are dense FP32 and need no coder; their losses are computed for real).
 *
 * Processes are forked before any of them starts a thread; each child
 * speaks to this parent through two pipes, one line per message:
 *   trainer -> parent  "url ID URL", "round R BYTES SENT CONTRIB MEMBERS
 *                      FETCHED RESYNCED LOSS", "done ID ROUND DIGEST",
 *                      "error TEXT"
 *   parent -> trainer  "start N ID URL ID URL ...", "join URL"
 *   baselines -> parent "init LOSS FLOOR P", "ddp R LOSS BYTES", "diloco R
 *                      LOSS BYTES", "error TEXT" (DDP and DiLoCo run in two
 *                      processes) */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_impl.h"
#include "pulse_loco.h"
#include "toolkit_args.h"
#include "toolkit_report.h"
#include "toolkit_sim.h"

#define PROG "pulse-bench loco"
#define MAX_TRAINERS 64
#define LINE_MAX_ 8192

typedef struct {
  uint32_t trainers, rounds, inner, deadline_ms;
  uint64_t params, seed;
  double drop_rate, lr;
  int join_round;  /* an extra trainer joins once this many rounds are done; -1
                      none */
  int leave_round; /* the last founder leaves in this round; -1 none */
  int json;
  const char *report; /* --report DIR */
} loco_args;

void bench_loco_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench loco [options]\n"
      "  DDP, DiLoCo and PULSELoCo on the built-in fine-tuning problem (a "
      "2-layer\n"
      "  MLP distilled towards a nearby teacher, Adam inner steps). PULSELoCo "
      "runs\n"
      "  one process per trainer over HTTP on 127.0.0.1; DDP (dense FP32 "
      "gradient\n"
      "  every step) and DiLoCo (dense FP32 pseudo-gradient every round) run "
      "in\n"
      "  memory. Prints per round the held-out loss and bytes of each method, "
      "then\n"
      "  a summary against the targets (>= 10x fewer bytes than DiLoCo, >= "
      "100x\n"
      "  fewer than DDP, final loss within 2%% of DiLoCo's).\n"
      "  --trainers N     trainers (default 3)\n"
      "  --rounds R       outer rounds (default 50)\n"
      "  --inner H        inner Adam steps per round (default 20)\n"
      "  --params P       model parameters, about (default 70000)\n"
      "  --seed S         problem and data seed (default 1)\n"
      "  --lr X           inner Adam learning rate (default 2e-5)\n"
      "  --drop-rate X    probability that a trainer's payload is lost in a "
      "round\n"
      "                   (the coordinator treats the fetch as failed; default "
      "0)\n"
      "  --deadline-ms D  per-round payload deadline (default 2000)\n"
      "  --join-round J   one more trainer joins once J rounds are done\n"
      "  --leave-round L  the last founding trainer leaves in round L\n"
      "  --json           one JSON object per round, then a summary object\n"
      "  --report DIR     also write DIR/rounds.csv and DIR/report.html "
      "(charts)\n"
      "Bytes are what trainers send: DDP 4*P per trainer per inner step, "
      "DiLoCo\n"
      "4*P per trainer per round, PULSELoCo the encoded payloads "
      "(loco/PAYLOAD.md).\n"
      "Exit status: 0 when the run completed (targets are reported, not "
      "enforced),\n"
      "1 when a trainer failed, 2 bad usage.\n");
}

/* --------------------------------------------------------------- children */

static pulse_tk_problem *make_problem(const loco_args *a) {
  pulse_tk_problem_opts po = PULSE_TK_PROBLEM_OPTS_INIT;
  po.seed = a->seed;
  po.lr = (float)a->lr;
  po.hidden = pulse_tk_problem_hidden_for(&po, a->params);
  pulse_tk_problem *p = NULL;
  if (pulse_tk_problem_create(&po, &p) != PULSE_OK)
    return NULL;
  return p;
}

static int child_fail(int out, const char *what, pulse_status st) {
  dprintf(out, "error %s: %s (%s): %s\n", what, pulse_status_str(st),
          pulse_status_name(st), pulse_error_detail());
  return 1;
}

typedef struct {
  int out;
  const char *method;
} baseline_sink;

static void baseline_round(void *user, const pulse_tk_sim_round *r) {
  baseline_sink *s = user;
  dprintf(s->out, "%s %u %.9g %" PRIu64 "\n", s->method, r->round, r->loss,
          r->bytes);
}

static int run_baseline(const loco_args *a, int which, int out) {
  pulse_tk_problem *p = make_problem(a);
  if (p == NULL)
    return child_fail(out, "problem", PULSE_ERR_NOMEM);
  uint64_t P = pulse_tk_problem_param_count(p);
  float *theta = malloc(P * sizeof *theta);
  if (theta == NULL)
    return child_fail(out, "baseline", PULSE_ERR_NOMEM);
  pulse_tk_problem_init(p, theta);
  double loss;
  pulse_tk_problem_eval(p, theta, &loss, NULL);
  if (which == 0)
    dprintf(out, "init %.9g %.9g %" PRIu64 "\n", loss,
            pulse_tk_problem_floor(p), P);
  free(theta);
  pulse_tk_sim_opts so = PULSE_TK_SIM_OPTS_INIT;
  so.trainers = a->trainers;
  so.rounds = a->rounds;
  so.inner = a->inner;
  const pulse_tk_sim_method methods[2] = {PULSE_TK_SIM_DDP,
                                          PULSE_TK_SIM_DILOCO};
  const char *names[2] = {"ddp", "diloco"};
  for (int m = which; m == which; m++) {
    so.method = methods[m];
    baseline_sink s = {out, names[m]};
    pulse_status st = pulse_tk_sim_run(p, &so, baseline_round, &s, NULL);
    if (st != PULSE_OK)
      return child_fail(out, names[m], st);
  }
  pulse_tk_problem_free(p);
  return 0;
}

static int read_line(FILE *in, char *line, size_t cap) {
  if (fgets(line, (int)cap, in) == NULL)
    return 0;
  line[strcspn(line, "\n")] = '\0';
  return 1;
}

static int run_trainer(const loco_args *a, uint32_t id, int founder, int in_fd,
                       int out) {
  FILE *in = fdopen(in_fd, "r");
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
    for (uint32_t h = 0; h < a->inner; h++)
      pulse_tk_learner_step(l, local);
    int leaving = a->leave_round >= 0 && id == a->trainers - 1 &&
                  pulse_loco_round(ctx) == (uint64_t)a->leave_round;
    pulse_loco_step_info info;
    st = pulse_loco_node_step(node, local,
                              (uint64_t)pulse_tk_problem_batch(p) * a->inner,
                              leaving, &info);
    if (st != PULSE_OK)
      return child_fail(out, "outer step", st);
    double loss = -1.0;
    if (pacer)
      pulse_tk_problem_eval(p, pulse_loco_global(ctx), &loss, NULL);
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
  pulse_tk_learner_free(l);
  pulse_loco_node_free(node);
  pulse_loco_free(ctx);
  pulse_tk_problem_free(p);
  free(local);
  fclose(in);
  return 0;
}

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
  int is_baseline; /* 1: DDP, 2: DiLoCo */
  int founder, told, done;
  uint64_t final_round, digest;
} child;

typedef struct {
  double loss_ddp, loss_diloco, loss_pl;
  uint64_t bytes_ddp, bytes_diloco, bytes_pl, max_pl, sent, fetched;
  uint32_t contributors, members, reports;
  int have_ddp, have_diloco, have_pl;
} round_row;

typedef struct {
  loco_args a;
  child kids[MAX_TRAINERS + 2];
  size_t nkids;
  round_row *rows; /* rows[0..rounds] */
  double init_loss, floor;
  uint64_t P;
  uint32_t pacer_rounds;
  int failed;
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
  return run_baseline(&b->a, c->is_baseline - 1, out);
}

static int trainer_body(bench *b, child *c, int in, int out) {
  return run_trainer(&b->a, c->id, c->founder, in, out);
}

static void on_line(bench *b, child *c, char *line) {
  if (strncmp(line, "error ", 6) == 0) {
    fprintf(stderr, PROG ": %s %u: %s\n",
            c->is_baseline ? "baseline" : "trainer", c->id, line + 6);
    b->failed = 1;
    return;
  }
  unsigned r;
  double loss;
  uint64_t v1, v2, v3;
  unsigned u1, u2;
  int resynced;
  if (c->is_baseline) {
    if (sscanf(line, "init %lf %lf %" SCNu64, &loss, &b->floor, &v1) == 3) {
      b->init_loss = loss;
      b->P = v1;
    } else if (sscanf(line, "ddp %u %lf %" SCNu64, &r, &loss, &v1) == 3 &&
               r <= b->a.rounds) {
      b->rows[r].loss_ddp = loss, b->rows[r].bytes_ddp = v1,
      b->rows[r].have_ddp = 1;
    } else if (sscanf(line, "diloco %u %lf %" SCNu64, &r, &loss, &v1) == 3 &&
               r <= b->a.rounds) {
      b->rows[r].loss_diloco = loss, b->rows[r].bytes_diloco = v1,
      b->rows[r].have_diloco = 1;
    }
    return;
  }
  if (sscanf(line, "url %u %63s", &u1, c->url) == 2) {
    return;
  } else if (sscanf(line,
                    "round %u %" SCNu64 " %" SCNu64 " %u %u %" SCNu64 " %d %lf",
                    &r, &v1, &v2, &u1, &u2, &v3, &resynced, &loss) == 8 &&
             r >= 1 && r <= b->a.rounds) {
    round_row *row = &b->rows[r];
    row->bytes_pl += v1;
    row->max_pl = v1 > row->max_pl ? v1 : row->max_pl;
    row->sent += v2;
    row->fetched += v3;
    row->reports++;
    if (c->id == 0) {
      row->loss_pl = loss, row->have_pl = 1;
      row->contributors = u1, row->members = u2;
      b->pacer_rounds = r;
    }
  } else if (sscanf(line, "done %u %" SCNu64 " %" SCNx64, &u1, &v1, &v2) == 3) {
    c->done = 1, c->final_round = v1, c->digest = v2;
  }
}

/* Reads every child until all pipes close; tells founders to start once
 * all have their URL, and the joiner to join at its round. */
static void event_loop(bench *b) {
  int started = 0;
  for (;;) {
    struct pollfd pf[MAX_TRAINERS + 2];
    size_t idx[MAX_TRAINERS + 2], n = 0;
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
    for (size_t k = 0; k < n; k++) {
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      child *c = &b->kids[idx[k]];
      ssize_t got = read(c->from, c->buf + c->len, sizeof c->buf - 1 - c->len);
      if (got <= 0) {
        close(c->from), close(c->to);
        c->open = 0;
        continue;
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
    if (!started) {
      int ready = 1;
      for (size_t i = 0; i < b->nkids; i++)
        if (!b->kids[i].is_baseline && b->kids[i].url[0] == '\0' &&
            b->kids[i].open)
          ready = 0;
      if (ready) {
        char msg[LINE_MAX_];
        int len = snprintf(msg, sizeof msg, "start %u", b->a.trainers);
        for (size_t i = 0; i < b->nkids; i++)
          if (b->kids[i].founder)
            len += snprintf(msg + len, sizeof msg - (size_t)len, " %u %s",
                            b->kids[i].id, b->kids[i].url);
        for (size_t i = 0; i < b->nkids; i++)
          if (b->kids[i].founder && b->kids[i].open)
            dprintf(b->kids[i].to, "%s\n", msg);
        started = 1;
      }
    }
    for (size_t i = 0; i < b->nkids; i++) {
      child *c = &b->kids[i];
      if (started && !c->is_baseline && !c->founder && !c->told && c->open &&
          b->pacer_rounds >= (uint32_t)b->a.join_round) {
        dprintf(c->to, "join %s\n", b->kids[2].url); /* kids[2]: trainer 0 */
        c->told = 1;
      }
    }
  }
}

/* ----------------------------------------------------------------- output */

static double ratio(uint64_t a, uint64_t b) {
  return b ? (double)a / (double)b : 0.0;
}

static void report(const bench *b, double seconds, int identical) {
  const loco_args *a = &b->a;
  uint64_t tot_ddp = 0, tot_dil = 0, tot_pl = 0, sent = 0, fetched = 0;
  for (uint32_t r = 1; r <= a->rounds; r++) {
    const round_row *w = &b->rows[r];
    tot_ddp += w->bytes_ddp, tot_dil += w->bytes_diloco, tot_pl += w->bytes_pl,
        sent += w->sent;
    fetched += w->fetched;
    double density = w->reports
                         ? (double)w->sent / ((double)w->reports * (double)b->P)
                         : 0.0;
    if (a->json) {
      printf("{\"round\":%u,\"loss_ddp\":%.6f,\"loss_diloco\":%.6f,\"loss_"
             "pulseloco\":%.6f,"
             "\"bytes_ddp\":%" PRIu64 ",\"bytes_diloco\":%" PRIu64
             ",\"bytes_pulseloco\":%" PRIu64
             ",\"bytes_pulseloco_max_trainer\":%" PRIu64 ",\"density\":%.5f,"
             "\"contributors\":%u,\"members\":%u}\n",
             r, w->loss_ddp, w->loss_diloco, w->loss_pl, w->bytes_ddp,
             w->bytes_diloco, w->bytes_pl, w->max_pl, density, w->contributors,
             w->members);
    } else {
      if (r == 1)
        printf("round   loss: DDP    DiLoCo    PULSELoCo   bytes/trainer: DDP  "
               "   DiLoCo "
               "PULSELoCo  density contrib\n");
      uint32_t n = w->reports ? w->reports : 1;
      printf("%5u %11.5f %9.5f %10.5f %21" PRIu64 " %10" PRIu64 " %9" PRIu64
             " %7.2f%% %3u/%u\n",
             r, w->loss_ddp, w->loss_diloco, w->loss_pl,
             w->bytes_ddp / a->trainers, w->bytes_diloco / a->trainers,
             w->bytes_pl / n, 100.0 * density, w->contributors, w->members);
    }
  }
  const round_row *last = &b->rows[a->rounds];
  double gap =
      last->loss_diloco > 0 ? last->loss_pl / last->loss_diloco - 1.0 : 0.0;
  double per_round = (double)a->trainers * a->rounds;
  int t10 = tot_pl * 10 <= tot_dil, t100 = tot_pl * 100 <= tot_ddp,
      t2 = gap <= 0.02;
  if (a->json) {
    printf(
        "{\"summary\":true,\"trainers\":%u,\"rounds\":%u,\"inner\":%u,"
        "\"params\":%" PRIu64 ",\"seed\":%" PRIu64
        ",\"drop_rate\":%g,\"bytes_ddp\":%" PRIu64 ",\"bytes_diloco\":%" PRIu64
        ",\"bytes_pulseloco\":%" PRIu64
        ",\"http_bytes_fetched_pulseloco\":%" PRIu64
        ",\"bytes_per_trainer_round_ddp\":%.1f,\"bytes_per_trainer_round_"
        "diloco\":%.1f,"
        "\"bytes_per_trainer_round_pulseloco\":%.1f,\"bytes_per_entry_"
        "pulseloco\":%.3f,"
        "\"initial_loss\":%.6f,\"loss_floor\":%.6f,\"final_loss_ddp\":%.6f,"
        "\"final_loss_diloco\":%.6f,\"final_loss_pulseloco\":%.6f,"
        "\"pulseloco_vs_diloco_loss\":%.5f,\"reduction_vs_diloco\":%.2f,"
        "\"reduction_vs_ddp\":%.2f,\"target_10x_diloco\":%s,\"target_100x_"
        "ddp\":%s,"
        "\"target_loss_2pct\":%s,\"replicas_identical\":%s,\"seconds\":%.2f}\n",
        a->trainers, a->rounds, a->inner, b->P, a->seed, a->drop_rate, tot_ddp,
        tot_dil, tot_pl, fetched, tot_ddp / per_round, tot_dil / per_round,
        tot_pl / per_round, ratio(tot_pl, sent), b->init_loss, b->floor,
        last->loss_ddp, last->loss_diloco, last->loss_pl, gap,
        ratio(tot_dil, tot_pl), ratio(tot_ddp, tot_pl), t10 ? "true" : "false",
        t100 ? "true" : "false", t2 ? "true" : "false",
        identical ? "true" : "false", seconds);
    return;
  }
  printf("\nsummary: %" PRIu64
         " parameters, %u trainers, %u rounds x %u inner steps, seed %" PRIu64
         "\n  held-out loss: start %.5f, floor %.5f (the teacher's entropy)\n",
         b->P, a->trainers, a->rounds, a->inner, a->seed, b->init_loss,
         b->floor);
  printf("  %-10s %14" PRIu64
         " bytes  %12.0f B/trainer/round  final loss %.5f\n",
         "DDP", tot_ddp, tot_ddp / per_round, last->loss_ddp);
  printf("  %-10s %14" PRIu64
         " bytes  %12.0f B/trainer/round  final loss %.5f\n",
         "DiLoCo", tot_dil, tot_dil / per_round, last->loss_diloco);
  printf("  %-10s %14" PRIu64
         " bytes  %12.0f B/trainer/round  final loss %.5f (%+.2f%% vs "
         "DiLoCo), %.2f B per sent entry\n",
         "PULSELoCo", tot_pl, tot_pl / per_round, last->loss_pl, 100.0 * gap,
         ratio(tot_pl, sent));
  printf("  PULSELoCo sends %.1fx fewer bytes than DiLoCo (target 10x: %s), "
         "%.1fx fewer than "
         "DDP (target 100x: %s); final loss within 2%% of DiLoCo: %s\n",
         ratio(tot_dil, tot_pl), t10 ? "met" : "MISSED", ratio(tot_ddp, tot_pl),
         t100 ? "met" : "MISSED", t2 ? "met" : "MISSED");
  printf("  HTTP bodies the PULSELoCo trainers downloaded (payloads, "
         "manifests): %" PRIu64
         " bytes\n  replicas identical at the end: %s; %.1f s\n",
         fetched, identical ? "yes" : "NO", seconds);
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
                                     "loss_DDP",
                                     "loss_DiLoCo",
                                     "loss_PULSELoCo",
                                     "bytes_DDP",
                                     "bytes_DiLoCo",
                                     "bytes_PULSELoCo",
                                     "cumulative_bytes_DDP",
                                     "cumulative_bytes_DiLoCo",
                                     "cumulative_bytes_PULSELoCo"};
  pulse_report_table *t = pulse_report_table_add(rep, "rounds", cols, 10);
  double cum[3] = {0, 0, 0};
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    const round_row *w = &b->rows[r];
    cum[0] += (double)w->bytes_ddp, cum[1] += (double)w->bytes_diloco,
        cum[2] += (double)w->bytes_pl;
    const double v[] = {r,
                        w->loss_ddp,
                        w->loss_diloco,
                        w->loss_pl,
                        (double)w->bytes_ddp,
                        (double)w->bytes_diloco,
                        (double)w->bytes_pl,
                        cum[0],
                        cum[1],
                        cum[2]};
    pulse_report_row(t);
    for (size_t k = 0; k < sizeof v / sizeof v[0]; k++)
      pulse_report_num(t, v[k]);
  }
  pulse_report_chart_spec c1 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Cumulative bytes sent by all trainers",
                                "round",
                                "round",
                                "cumulative bytes (B)",
                                cols + 7,
                                3,
                                0,
                                1};
  pulse_report_chart_spec c2 = {PULSE_REPORT_LINE,
                                "rounds",
                                "Held-out loss per round",
                                "round",
                                "round",
                                "loss (nats)",
                                cols + 1,
                                3,
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
          !(a->lr > 0 && a->lr < 1))
        return usage_error("--lr needs a number in (0, 1), got '%s'",
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
    } else {
      return usage_error("unknown option '%s'", arg);
    }
  }
  if (a->join_round >= (int)a->rounds)
    return usage_error("--join-round must be below --rounds%s", "");
  if (a->leave_round >= (int)a->rounds - 1 ||
      (a->leave_round >= 0 && a->trainers < 2))
    return usage_error(
        "--leave-round needs 2 trainers and a round before the last%s", "");
  return -1; /* go on */
}

int bench_loco_main(int argc, char **argv) {
  static bench b; /* large: kept off the stack */
  memset(&b, 0, sizeof b);
  b.a = (loco_args){3, 50, 20, 2000, 70000, 1, 0.0, 2e-5, -1, -1, 0, NULL};
  int rc = parse(argc, argv, &b.a);
  if (rc >= 0)
    return rc;
  b.rows = calloc(b.a.rounds + 1u, sizeof *b.rows);
  if (b.rows == NULL)
    return fprintf(stderr, PROG ": out of memory\n"), 1;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* kids[0], kids[1]: DDP and DiLoCo; kids[2..N+1]: founders 0..N-1; then
   * the joiner N. */
  b.kids[0].is_baseline = 1;
  b.kids[1].is_baseline = 2;
  b.nkids = 2;
  for (uint32_t i = 0; i < b.a.trainers; i++) {
    b.kids[b.nkids].id = i;
    b.kids[b.nkids++].founder = 1;
  }
  if (b.a.join_round > 0)
    b.kids[b.nkids++].id = b.a.trainers;
  for (size_t i = 0; i < b.nkids && rc < 0; i++)
    if (spawn(&b, &b.kids[i],
              b.kids[i].is_baseline ? baseline_body : trainer_body) != 0)
      rc = 1;
  if (rc < 0)
    event_loop(&b);
  int children_ok = rc < 0;
  for (size_t i = 0; i < b.nkids; i++) {
    int status = 0;
    if (b.kids[i].pid > 0 && waitpid(b.kids[i].pid, &status, 0) > 0 &&
        !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      fprintf(stderr, PROG ": %s %u ended with status %d\n",
              b.kids[i].is_baseline ? "baseline" : "trainer", b.kids[i].id,
              status);
      children_ok = 0;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double seconds = (double)(t1.tv_sec - t0.tv_sec) +
                   1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  /* Everyone that stayed to the end holds the same theta_g. */
  int identical = 1, finished = 0;
  uint64_t digest = 0;
  for (size_t i = 2; i < b.nkids; i++) {
    if (!b.kids[i].done)
      identical = 0;
    else if (b.kids[i].final_round == b.a.rounds) {
      if (finished++ && b.kids[i].digest != digest)
        identical = 0;
      digest = b.kids[i].digest;
    }
  }
  int complete = b.rows[b.a.rounds].have_ddp &&
                 b.rows[b.a.rounds].have_diloco && b.rows[b.a.rounds].have_pl;
  if (!children_ok || b.failed || !complete) {
    fprintf(stderr, PROG ": the run did not complete\n");
    free(b.rows);
    return 1;
  }
  report(&b, seconds, identical && finished > 0);
  int report_rc = b.a.report != NULL ? write_report(&b, argc, argv) : 0;
  free(b.rows);
  return identical && report_rc == 0 ? 0 : 1;
}
