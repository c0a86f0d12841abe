/* bench_loco_collab.c - `pulse-bench loco --target-batch T ...`: PULSELoCo
 * as an open collaboration (loco/pulse_loco_collab.h) on the built-in
 * problem, one process per peer on 127.0.0.1, peers throttled to given
 * speeds (samples per second) so that scaling shows on a small machine,
 * and churn (joins, clean leaves, kill -9 of a peer or of a round's writer)
 * at given rounds.
 *
 * Each peer speaks to this parent through two pipes, one line each:
 *   peer -> parent  "url ID URL"
 *                   "round R SAMPLES OWN CONTRIB WRITER TAKEOVERS IN OUT
 *                    BUSY_MS WALL_MS LOSS MEMBERS" (MEMBERS: ids of the next
 *                    round, comma separated; LOSS nan: it comes apart)
 *                   "loss R LOSS" (from the next round's lowest id, once
 *                    evaluated off the peer's critical path)
 *                   "done ID ROUND DIGEST BUSY_MS ALIVE_MS", "error TEXT"
 *   parent -> peer  "start N ID URL ...", "join URL", "leave", "quit" */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_collab.h"
#include "bench_netns.h"
#include "sim_problem.h"
#include "cli_report.h"
#include "cli_time.h"

#define PROG "pulse-bench loco"
#define MAXP 32
#define MAXR 1000
#define MAXEV 16

typedef struct {
  char kind[16]; /* join, leave, kill, kill-writer */
  uint32_t round;
  int fired;
} churn_event;

typedef struct {
  uint32_t trainers, rounds;
  uint64_t target, params, seed;
  double speeds[MAXP];
  uint32_t nspeeds;
  churn_event ev[MAXEV];
  uint32_t nev;
  int json;
  const char *report;
  uint32_t claim_ms, round_ms;
  int partitioned; /* --averaging partitioned */
  uint32_t check;  /* --partition-check: PULSE_LOCO_COLLAB_CHECK_* */
  uint32_t clients; /* --clients K: the last K founders in client mode */
  int equal_ranges; /* --ranges equal */
  /* pulse_loco_opts.gate_mean: --gate-mean 1, --no-gate-mean 0; neither:
   * on when partitioned (where it cuts the reduced ranges' bytes in, the
   * issue's 3x), off all-to-all (where it only grows the payloads). */
  int gate_mean;
  /* --netns NAME=ADDR,...: peer i runs in network namespace
   * netns[(i - 1) % nnetns] (/run/netns/NAME) and listens on ADDR. */
  pulse_tk_netns netns[MAXP];
  uint32_t nnetns;
} collab_args;

void bench_loco_collab_usage(FILE *out) {
  fprintf(out,
          "  collaboration mode (pulse_loco_collab.h; any of these flags):\n"
          "  --target-batch T   a round ends when the peers' samples reach T\n"
          "                     (the writer grants steps while below T)\n"
          "  --peer-speeds LIST samples per second of each peer, comma list "
          "(peer i\n"
          "                     gets LIST[i mod n]; 0 or none: "
          "unthrottled)\n"
          "  --churn SPEC       comma list of EVENT:ROUND, EVENT join, leave, "
          "kill,\n"
          "                     kill-writer (kill -9 of the writer of that "
          "round)\n"
          "  --averaging A      all-to-all (default) or partitioned (peers "
          "reduce\n"
          "                     disjoint ranges; same weights bit for bit)\n"
          "  --partition-check C  rotating (default: one range recomputed a "
          "round),\n"
          "                     full (every range every round) or receipts\n"
          "  --gate-mean        the outer step applies only the entries of "
          "the mean that\n"
          "                     2 peers sent or that pass the BF16 gate\n"
          "                     (pulse_loco_opts.gate_mean; the rest waits in "
          "its\n"
          "                     senders' error feedback); the default with\n"
          "                     --averaging partitioned\n"
          "  --no-gate-mean     every entry of the mean applied (the default "
          "all-to-all)\n"
          "  --trainers N       founding peers (default: the speeds given, "
          "else 3)\n"
          "  --clients K        the last K founders are client-mode peers "
          "(behind NAT:\n"
          "                     they listen nowhere and upload their payload "
          "to a\n"
          "                     serving founder, round robin; partitioned, "
          "they own\n"
          "                     no range)\n"
          "  --ranges R         partitioned range sizes: bandwidth (default: "
          "in\n"
          "                     proportion to each peer's measured download "
          "rate)\n"
          "                     or equal\n"
          "  --netns N=A,...    peer i runs in network namespace N_((i-1) mod "
          "k)\n"
          "                     (made by `ip netns add`) and listens on its "
          "address A\n"
          "                     (root; throttle a link with tc there)\n"
          "  --rounds R --seed S --params P --json --report DIR as above\n");
}

/* ------------------------------------------------------------------ peer */

typedef struct {
  pulse_tk_learner *l;
  double speed; /* samples/s, 0: unthrottled */
  uint32_t batch;
} peer_step;

static int do_step(void *user, float *theta, uint64_t samples) {
  peer_step *s = user;
  double t0 = pulse_tk_now();
  for (uint64_t done = 0; done < samples; done += s->batch)
    pulse_tk_learner_step(s->l, theta);
  if (s->speed > 0) {
    double want = (double)samples / s->speed, took = pulse_tk_since(t0);
    if (want > took)
      usleep((useconds_t)((want - took) * 1e6));
  }
  return 0;
}

static pulse_tk_problem *make_problem(const collab_args *a) {
  pulse_tk_problem_opts po = PULSE_TK_PROBLEM_OPTS_INIT;
  po.seed = a->seed;
  po.hidden = pulse_tk_problem_hidden_for(&po, a->params);
  pulse_tk_problem *p = NULL;
  if (pulse_tk_problem_create(&po, &p) != PULSE_OK)
    return NULL;
  return p;
}

/* The held-out loss of each round, off the peer's critical path. The
 * evaluating member (the next round's lowest id) hands a copy of the
 * global weights to a thread under SCHED_IDLE, which runs only when
 * nothing else wants the CPU, and reports "loss R LOSS" when done; the
 * peer waits for it before "done". Evaluated in line, the loss made that
 * member late to every next round: at 1,000,000 params it was busy 32% of
 * its time against 48% for the others and sent smaller payloads, so its
 * bytes in over its payload and the run's busy figures measured the
 * bench, not the collaboration. Copies wait at most EVAL_QUEUE_BYTES;
 * beyond, a round is evaluated in line. */
#define EVAL_QUEUE_BYTES (1ull << 30)

typedef struct eval_job {
  struct eval_job *next;
  uint64_t round;
  float *theta;
} eval_job;

typedef struct {
  const pulse_tk_problem *p; /* pulse_tk_problem_eval reads it only */
  uint64_t P;
  int out;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  eval_job *head, **tail;
  uint64_t queued_bytes;
  int started, closing;
} loss_evaluator;

static void report_loss(int out, uint64_t round, double loss) {
  char line[96];
  int n = snprintf(line, sizeof line, "loss %" PRIu64 " %.9g\n", round, loss);
  if (write(out, line, (size_t)n) != n) /* one write: lines do not mix */
    return;
}

static void *evaluate_losses(void *arg) {
  loss_evaluator *ev = arg;
  struct sched_param none = {0};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &none); /* best effort */
  pthread_mutex_lock(&ev->lock);
  for (;;) {
    while (ev->head == NULL && !ev->closing)
      pthread_cond_wait(&ev->cond, &ev->lock);
    eval_job *j = ev->head;
    if (j == NULL)
      break;
    ev->head = j->next;
    if (ev->head == NULL)
      ev->tail = &ev->head;
    pthread_mutex_unlock(&ev->lock);
    double loss = NAN, acc;
    pulse_tk_problem_eval(ev->p, j->theta, &loss, &acc);
    report_loss(ev->out, j->round, loss);
    free(j->theta);
    free(j);
    pthread_mutex_lock(&ev->lock);
    ev->queued_bytes -= ev->P * sizeof(float);
  }
  pthread_mutex_unlock(&ev->lock);
  return NULL;
}

static void evaluator_start(loss_evaluator *ev, const pulse_tk_problem *p,
                            uint64_t P, int out) {
  memset(ev, 0, sizeof *ev);
  ev->p = p;
  ev->P = P;
  ev->out = out;
  ev->tail = &ev->head;
  pthread_mutex_init(&ev->lock, NULL);
  pthread_cond_init(&ev->cond, NULL);
  ev->started = pthread_create(&ev->thread, NULL, evaluate_losses, ev) == 0;
}

/* Queues the loss of `round` at theta (copied), or evaluates it here when
 * the thread or the memory for a copy is missing. */
static void evaluator_post(loss_evaluator *ev, uint64_t round,
                           const float *theta) {
  uint64_t bytes = ev->P * sizeof(float);
  eval_job *j = NULL;
  pthread_mutex_lock(&ev->lock);
  int room = ev->started && ev->queued_bytes + bytes <= EVAL_QUEUE_BYTES;
  pthread_mutex_unlock(&ev->lock);
  if (room && (j = calloc(1, sizeof *j)) != NULL &&
      (j->theta = malloc((size_t)bytes)) != NULL) {
    memcpy(j->theta, theta, (size_t)bytes);
    j->round = round;
    pthread_mutex_lock(&ev->lock);
    *ev->tail = j;
    ev->tail = &j->next;
    ev->queued_bytes += bytes;
    pthread_cond_signal(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    return;
  }
  free(j);
  double loss = NAN, acc;
  pulse_tk_problem_eval(ev->p, theta, &loss, &acc);
  report_loss(ev->out, round, loss);
}

/* Evaluates what is queued, then stops the thread. */
static void evaluator_finish(loss_evaluator *ev) {
  if (ev->started) {
    pthread_mutex_lock(&ev->lock);
    ev->closing = 1;
    pthread_cond_signal(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    pthread_join(ev->thread, NULL);
  }
  pthread_mutex_destroy(&ev->lock);
  pthread_cond_destroy(&ev->cond);
}

static int peer_fail(int out, const char *what) {
  dprintf(out, "error %s: %s\n", what, pulse_error_detail());
  return 1;
}

static int run_peer(const collab_args *a, uint32_t id, double speed,
                    const char *client_of, int in, int out) {
  const char *host = NULL;
  if (a->nnetns > 0) { /* before any socket: they belong to a namespace */
    const pulse_tk_netns *ns = &a->netns[(id - 1) % a->nnetns];
    if (pulse_tk_netns_enter(ns) != 0)
      return peer_fail(out, "network namespace");
    host = ns->addr;
  }
  FILE *fin = fdopen(in, "r");
  pulse_tk_problem *p = make_problem(a);
  if (p == NULL)
    return peer_fail(out, "problem");
  uint64_t P = pulse_tk_problem_param_count(p);
  float *theta = calloc(P, sizeof *theta);
  pulse_tk_problem_init(p, theta);
  pulse_loco_opts o = PULSE_LOCO_OPTS_INIT;
  o.param_count = P;
  o.trainer_id = id;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.gate_mean = a->gate_mean;
  pulse_loco *ctx = NULL;
  pulse_loco_collab *c = NULL;
  peer_step st = {NULL, speed, pulse_tk_problem_batch(p)};
  pulse_loco_collab_opts co = PULSE_LOCO_COLLAB_OPTS_INIT;
  co.target_batch = a->target;
  co.claim_timeout_ms = a->claim_ms;
  co.round_timeout_ms = a->round_ms;
  co.partitioned = a->partitioned;
  co.partition_check = a->check;
  co.client_of = client_of;
  co.host = host;
  co.equal_ranges = a->equal_ranges;
  if (pulse_tk_learner_create(p, id, &st.l) != PULSE_OK ||
      pulse_loco_create(&o, theta, &ctx) != PULSE_OK ||
      pulse_loco_collab_create(&co, ctx, &c) != PULSE_OK)
    return peer_fail(out, "create");
  dprintf(out, "url %u %s\n", id, pulse_loco_collab_url(c));
  char line[8192];
  if (!fgets(line, sizeof line, fin))
    return 1;
  if (strncmp(line, "start ", 6) == 0) {
    pulse_loco_member m[MAXP];
    int n = 0, off = 0, k = 0;
    sscanf(line + 6, "%d%n", &n, &off);
    const char *q = line + 6 + off;
    for (int i = 0; i < n && i < MAXP; i++) {
      sscanf(q, " %u %63s%n", &m[i].id, m[i].url, &k);
      q += k;
    }
    if (pulse_loco_collab_start(c, m, (size_t)n) != PULSE_OK)
      return peer_fail(out, "start");
  } else {
    char seed[64] = "";
    sscanf(line, "join %63s", seed);
    if (pulse_loco_collab_join(c, seed, theta, 60000) != PULSE_OK)
      return peer_fail(out, "join");
  }
  fcntl(in, F_SETFL, fcntl(in, F_GETFL) | O_NONBLOCK);
  /* Static: a failed round returns at once, the caller _exits, and the
   * thread may still be reading it meanwhile (one peer a process). */
  static loss_evaluator losses;
  evaluator_start(&losses, p, P, out);
  int leaving = 0, left = 0, lost = 0;
  uint64_t busy = 0, t0 = (uint64_t)(pulse_tk_now() * 1000.0);
  while (pulse_loco_round(ctx) < a->rounds && !left) {
    if (!leaving && fgets(line, sizeof line, fin) &&
        strncmp(line, "leave", 5) == 0)
      leaving = 1;
    clearerr(fin);
    pulse_loco_collab_info info;
    pulse_status rs = pulse_loco_collab_round(
        c, theta, st.batch, do_step, &st,
        leaving ? PULSE_LOCO_COLLAB_LEAVING : 0, &info);
    /* A client whose host died loses that round; its next call rejoins
     * through another host. */
    if (rs != PULSE_OK && client_of != NULL && lost++ < 3)
      continue;
    if (rs != PULSE_OK)
      return peer_fail(out, "round");
    lost = 0;
    busy += info.busy_ms;
    left = info.left;
    pulse_loco_member m[MAXP];
    size_t nm = 0;
    pulse_loco_collab_members(c, m, MAXP, &nm);
    char ids[MAXP * 12] = "";
    int w = 0;
    for (size_t i = 0; i < nm && i < MAXP; i++)
      w += snprintf(ids + w, sizeof ids - (size_t)w, "%s%u", i ? "," : "",
                    m[i].id);
    dprintf(out,
            "round %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %u %" PRIu64
            " %" PRIu64 " %" PRIu64 " %" PRIu64 " %.9g %s %" PRIu64 " %d\n",
            info.round, info.samples, info.own_samples, info.contributors,
            info.writer, info.takeovers, info.bytes_in, info.bytes_out,
            info.busy_ms, info.wall_ms, NAN, nm ? ids : "-",
            info.payload_bytes, info.partitioned);
    /* After the round's line: the parent takes a loss for a round it has. */
    if (!left && nm > 0 && m[0].id == id)
      evaluator_post(&losses, info.round, pulse_loco_global(ctx));
  }
  uint64_t alive = (uint64_t)(pulse_tk_now() * 1000.0) - t0;
  evaluator_finish(&losses);
  dprintf(out, "done %u %" PRIu64 " %016" PRIx64 " %" PRIu64 " %" PRIu64 "\n",
          id, pulse_loco_round(ctx), pulse_loco_global_digest(ctx), busy,
          alive);
  fcntl(in, F_SETFL, fcntl(in, F_GETFL) & ~O_NONBLOCK);
  while (fgets(line, sizeof line, fin) || errno == EAGAIN) {
    if (strncmp(line, "quit", 4) == 0)
      break;
    line[0] = '\0';
    if (feof(fin))
      break;
    clearerr(fin);
    usleep(10000);
  }
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  pulse_tk_learner_free(st.l);
  pulse_tk_problem_free(p);
  free(theta);
  return 0;
}

/* ---------------------------------------------------------------- parent */

typedef struct {
  pid_t pid;
  int to, from, alive, done, errored;
  uint32_t id;
  char url[64];
  char buf[1 << 15];
  size_t have;
  uint64_t busy_ms, alive_ms, final_round, digest;
} peer;

typedef struct {
  int have;
  uint64_t samples, contributors, writer, takeovers;
  uint32_t members;
  uint32_t by_exchange; /* peers whose round the partitioned exchange ended */
  double loss, t_s;
  uint64_t in[MAXP + 1], out[MAXP + 1]; /* by id (ids 1..MAXP) */
  uint64_t payload[MAXP + 1];            /* each peer's own payload size */
  int reported[MAXP + 1];
  uint32_t next[MAXP];
  size_t nnext;
} round_row;

typedef struct {
  collab_args a;
  peer p[MAXP];
  size_t n;
  round_row rows[MAXR];
  double start;
  uint64_t rng;
  int failed;
} collab_bench;

static uint64_t next_rand(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  uint64_t z = *s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Peer id, serving (client_of NULL) or in client mode hosted there. */
static int spawn_peer(collab_bench *b, uint32_t id, const char *client_of) {
  peer *q = &b->p[b->n];
  int a[2], c[2];
  if (pipe(a) != 0 || pipe(c) != 0)
    return -1;
  double speed =
      b->a.nspeeds ? b->a.speeds[(id - 1) % b->a.nspeeds] : 0.0;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    close(a[1]), close(c[0]);
    _exit(run_peer(&b->a, id, speed, client_of, a[0], c[1]));
  }
  close(a[0]), close(c[1]);
  memset(q, 0, sizeof *q);
  q->pid = pid;
  q->to = a[1];
  q->from = c[0];
  q->id = id;
  q->alive = 1;
  b->n++;
  /* Its URL first. */
  while (q->url[0] == '\0') {
    struct pollfd pf = {q->from, POLLIN, 0};
    if (poll(&pf, 1, 30000) <= 0)
      return -1;
    ssize_t got = read(q->from, q->buf + q->have, sizeof q->buf - q->have - 1);
    if (got <= 0)
      return -1;
    q->have += (size_t)got;
    char *nl = memchr(q->buf, '\n', q->have);
    if (nl) {
      *nl = '\0';
      unsigned x;
      if (sscanf(q->buf, "url %u %63s", &x, q->url) != 2)
        return fprintf(stderr, PROG ": peer %u: %s\n", id, q->buf), -1;
      size_t used = (size_t)(nl + 1 - q->buf);
      memmove(q->buf, nl + 1, q->have - used);
      q->have -= used;
    }
  }
  return 0;
}

static peer *live_member(collab_bench *b, uint32_t id) {
  for (size_t i = 0; i < b->n; i++)
    if (b->p[i].id == id && b->p[i].alive && !b->p[i].done)
      return &b->p[i];
  return NULL;
}

/* Events of round R fire when round R - 1 is first reported: the peers
 * are then in round R. */
static void fire_events(collab_bench *b, uint32_t reported) {
  const round_row *row = &b->rows[reported];
  for (uint32_t e = 0; e < b->a.nev; e++) {
    churn_event *ev = &b->a.ev[e];
    if (ev->fired || ev->round != reported + 1)
      continue;
    ev->fired = 1;
    uint32_t writer = row->nnext
                          ? row->next[(reported + 1) % row->nnext]
                          : 0;
    if (strcmp(ev->kind, "join") == 0) {
      uint32_t id = 0;
      for (size_t i = 0; i < b->n; i++)
        id = b->p[i].id > id ? b->p[i].id : id;
      id++;
      if (id > MAXP || spawn_peer(b, id, NULL) != 0) {
        b->failed = 1;
        continue;
      }
      peer *seed = NULL;
      for (size_t t = 0; t < 4 * MAXP && seed == NULL && row->nnext; t++) {
        seed = live_member(b, row->next[next_rand(&b->rng) % row->nnext]);
        /* A serving member (a client's host might be the dead one). */
        if (seed != NULL && strstr(seed->url, "/v1/hosted/") != NULL)
          seed = NULL;
      }
      if (seed == NULL) {
        b->failed = 1;
        continue;
      }
      dprintf(b->p[b->n - 1].to, "join %s\n", seed->url);
      continue;
    }
    /* A random live member, not the writer (kill-writer: the writer). */
    peer *v = NULL;
    if (strcmp(ev->kind, "kill-writer") == 0)
      v = live_member(b, writer);
    for (size_t t = 0; t < 4 * MAXP && v == NULL && row->nnext; t++) {
      uint32_t id = row->next[next_rand(&b->rng) % row->nnext];
      if (id != writer)
        v = live_member(b, id);
    }
    if (v == NULL)
      continue;
    if (strcmp(ev->kind, "leave") == 0) {
      dprintf(v->to, "leave\n");
    } else {
      kill(v->pid, SIGKILL);
      v->alive = 0;
    }
  }
}

static void on_line(collab_bench *b, peer *q, char *line) {
  if (strncmp(line, "error", 5) == 0) {
    fprintf(stderr, PROG ": peer %u: %s\n", q->id, line);
    q->errored = 1;
    b->failed = 1;
    return;
  }
  uint64_t r, s, own, bin, bout, busy, wall, pay = 0;
  unsigned contrib, writer, tk;
  double loss;
  char ids[MAXP * 12];
  int part = 0;
  if (sscanf(line,
             "round %" SCNu64 " %" SCNu64 " %" SCNu64 " %u %u %u %" SCNu64
             " %" SCNu64 " %" SCNu64 " %" SCNu64 " %lf %383s %" SCNu64 " %d",
             &r, &s, &own, &contrib, &writer, &tk, &bin, &bout, &busy, &wall,
             &loss, ids, &pay, &part) >= 12) {
    if (r >= MAXR)
      return;
    round_row *row = &b->rows[r];
    int first = !row->have;
    if (first) {
      row->have = 1;
      row->t_s = pulse_tk_since(b->start);
      row->loss = NAN;
      row->nnext = 0;
      for (char *t = strtok(ids, ","); t && row->nnext < MAXP;
           t = strtok(NULL, ","))
        if (strcmp(t, "-") != 0)
          row->next[row->nnext++] = (uint32_t)strtoul(t, NULL, 10);
    }
    if (s > row->samples)
      row->samples = s;
    /* A call that only rejoined (a dropped peer, a client whose host
     * died) reports no contributors and no writer: not the round's. */
    if (contrib > 0) {
      row->contributors = contrib;
      row->writer = writer;
    }
    if (tk > row->takeovers)
      row->takeovers = tk;
    row->members++;
    row->by_exchange += part == 1;
    if (q->id <= MAXP) {
      row->in[q->id] = bin;
      row->out[q->id] = bout;
      row->payload[q->id] = pay;
      row->reported[q->id] = 1;
    }
    if (!isnan(loss))
      row->loss = loss;
    if (first)
      fire_events(b, (uint32_t)r);
    return;
  }
  if (sscanf(line, "loss %" SCNu64 " %lf", &r, &loss) == 2) {
    if (r < MAXR && !isnan(loss))
      b->rows[r].loss = loss;
    return;
  }
  unsigned id;
  if (sscanf(line, "done %u %" SCNu64 " %" SCNx64 " %" SCNu64 " %" SCNu64, &id,
             &q->final_round, &q->digest, &q->busy_ms, &q->alive_ms) == 5)
    q->done = 1;
}

static void event_loop(collab_bench *b) {
  for (;;) {
    struct pollfd pf[MAXP];
    size_t map[MAXP], k = 0;
    for (size_t i = 0; i < b->n; i++)
      if (b->p[i].alive && !b->p[i].done && !b->p[i].errored) {
        pf[k] = (struct pollfd){b->p[i].from, POLLIN, 0};
        map[k++] = i;
      }
    if (k == 0 || b->failed)
      return;
    if (poll(pf, k, 1000) < 0 && errno != EINTR)
      return;
    for (size_t j = 0; j < k; j++) {
      if (!(pf[j].revents & (POLLIN | POLLHUP)))
        continue;
      peer *q = &b->p[map[j]];
      ssize_t got =
          read(q->from, q->buf + q->have, sizeof q->buf - q->have - 1);
      if (got <= 0) {
        if (!q->done)
          q->alive = 0; /* gone without a word: a peer left or was killed */
        continue;
      }
      q->have += (size_t)got;
      char *nl;
      while ((nl = memchr(q->buf, '\n', q->have)) != NULL) {
        *nl = '\0';
        on_line(b, q, q->buf);
        size_t used = (size_t)(nl + 1 - q->buf);
        memmove(q->buf, nl + 1, q->have - used);
        q->have -= used;
      }
    }
  }
}

/* ---------------------------------------------------------------- output */

static void print_rounds(const collab_bench *b, uint32_t last) {
  double cum = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    if (!w->have)
      continue;
    cum += (double)w->samples;
    if (!b->a.json) {
      printf("round %3u  samples %6" PRIu64 "  peers %2u  contributors %2" PRIu64
             "  writer %2" PRIu64 "%s  t %7.2f s  loss %s",
             r, w->samples, w->members, w->contributors, w->writer,
             w->takeovers ? " (takeover)" : "", w->t_s, "");
      if (isnan(w->loss))
        printf("-\n");
      else
        printf("%.6f\n", w->loss);
      continue;
    }
    printf("{\"round\":%u,\"samples\":%" PRIu64 ",\"peers\":%u,"
           "\"contributors\":%" PRIu64 ",\"writer\":%" PRIu64
           ",\"takeovers\":%" PRIu64 ",\"by_exchange\":%u,\"t_s\":%.3f,"
           "\"samples_seen\":%.0f,",
           r, w->samples, w->members, w->contributors, w->writer,
           w->takeovers, w->by_exchange, w->t_s, cum);
    for (int dir = 0; dir < 3; dir++) {
      printf("\"%s\":{",
             dir == 2 ? "payload" : dir ? "bytes_out" : "bytes_in");
      int first = 1;
      for (uint32_t id = 1; id <= MAXP; id++)
        if (w->reported[id]) {
          printf("%s\"%u\":%" PRIu64, first ? "" : ",", id,
                 dir == 2 ? w->payload[id] : dir ? w->out[id] : w->in[id]);
          first = 0;
        }
      printf("},");
    }
    if (isnan(w->loss))
      printf("\"loss\":null}\n");
    else
      printf("\"loss\":%.9g}\n", w->loss);
  }
}

/* Bytes in over the peer's own payload, the measure of
 * partitioned averaging (at most 3x at 8 peers): the mean over non-writer
 * peer-rounds, the worst peer's mean over its non-writer rounds, the worst
 * non-writer peer-round, and the writers' mean. Peer-rounds without a
 * payload (a joiner's first, a client's missed round) do not count. */
typedef struct {
  double mean, worst_peer, worst_peer_round, writer;
  uint64_t count;
} in_ratios;

static in_ratios ratios_of(const collab_bench *b, uint32_t last) {
  in_ratios q = {0, 0, 0, 0, 0};
  static double sum[MAXP + 1];
  static uint64_t n[MAXP + 1];
  memset(sum, 0, sizeof sum), memset(n, 0, sizeof n);
  double wsum = 0;
  uint64_t wn = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    for (uint32_t id = 1; id <= MAXP; id++) {
      if (!w->reported[id] || w->payload[id] == 0)
        continue;
      double x = (double)w->in[id] / (double)w->payload[id];
      if (id == w->writer) {
        wsum += x, wn++;
        continue;
      }
      sum[id] += x, n[id]++;
      q.mean += x, q.count++;
      q.worst_peer_round = x > q.worst_peer_round ? x : q.worst_peer_round;
    }
  }
  q.mean = q.count ? q.mean / (double)q.count : 0;
  q.writer = wn ? wsum / (double)wn : 0;
  for (uint32_t id = 1; id <= MAXP; id++)
    if (n[id] && sum[id] / (double)n[id] > q.worst_peer)
      q.worst_peer = sum[id] / (double)n[id];
  return q;
}

static int write_report(const collab_bench *b, uint32_t last, int argc,
                        char **argv) {
  pulse_report *rep = NULL;
  if (pulse_report_create(b->a.report, "loco", argc, argv, &rep) != PULSE_OK)
    return fprintf(stderr, PROG ": report: %s\n", pulse_error_detail()), 1;
  static const char *const cols[] = {"round", "samples_seen", "loss", "peers",
                                     "t_s"};
  pulse_report_table *t = pulse_report_table_add(rep, "collab_rounds", cols, 5);
  double cum = 0;
  for (uint32_t r = 0; r < last; r++) {
    const round_row *w = &b->rows[r];
    if (!w->have)
      continue;
    cum += (double)w->samples;
    pulse_report_row(t);
    pulse_report_num(t, r);
    pulse_report_num(t, cum);
    pulse_report_num(t, w->loss);
    pulse_report_num(t, w->members);
    pulse_report_num(t, w->t_s);
  }
  static const char *const loss_col[] = {"loss"};
  static const char *const peers_col[] = {"peers"};
  pulse_report_chart_spec a = {PULSE_REPORT_LINE, "collab_rounds",
                               "Held-out loss against samples seen",
                               "samples_seen", "samples seen",
                               "held-out loss (nats)", loss_col, 1, 0, 0};
  pulse_report_chart(rep, &a);
  pulse_report_chart_spec p = {PULSE_REPORT_LINE, "collab_rounds",
                               "Peers over time", "t_s", "time (s)",
                               "peers in the round", peers_col, 1, 0, 0};
  pulse_report_chart(rep, &p);
  char detail[256] = "";
  if (pulse_report_close(rep, detail, sizeof detail) != PULSE_OK)
    return fprintf(stderr, PROG ": report: %s\n", detail), 1;
  return 0;
}

/* ------------------------------------------------------------------ args */

static int bad(const char *what, const char *v) {
  fprintf(stderr, PROG ": %s '%s'\n", what, v ? v : "(missing)");
  return 2;
}

static int parse_u(const char *v, uint64_t lo, uint64_t hi, uint64_t *out) {
  if (v == NULL || *v < '0' || *v > '9')
    return 0;
  char *end;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (errno || *end || x < lo || x > hi)
    return 0;
  *out = x;
  return 1;
}

static int parse(int argc, char **argv, collab_args *a) {
  for (int i = 1; i < argc; i++) {
    const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    uint64_t x;
    if (strcmp(f, "--json") == 0) {
      a->json = 1;
      continue;
    }
    if (strcmp(f, "--gate-mean") == 0 || strcmp(f, "--no-gate-mean") == 0) {
      a->gate_mean = strcmp(f, "--gate-mean") == 0;
      continue;
    }
    i++;
    if (strcmp(f, "--target-batch") == 0) {
      if (!parse_u(v, 1, 1ull << 40, &a->target))
        return bad("--target-batch wants a count >= 1, not", v);
    } else if (strcmp(f, "--rounds") == 0) {
      if (!parse_u(v, 1, MAXR - 1, &x))
        return bad("--rounds wants 1..999, not", v);
      a->rounds = (uint32_t)x;
    } else if (strcmp(f, "--trainers") == 0) {
      if (!parse_u(v, 1, MAXP, &x))
        return bad("--trainers wants 1..32, not", v);
      a->trainers = (uint32_t)x;
    } else if (strcmp(f, "--seed") == 0) {
      if (!parse_u(v, 0, UINT64_MAX, &a->seed))
        return bad("--seed wants a number, not", v);
    } else if (strcmp(f, "--params") == 0) {
      if (!parse_u(v, 100, 1ull << 26, &a->params))
        return bad("--params wants 100..2^26, not", v);
    } else if (strcmp(f, "--claim-timeout-ms") == 0) {
      if (!parse_u(v, 1, 600000, &x))
        return bad("--claim-timeout-ms wants 1..600000, not", v);
      a->claim_ms = (uint32_t)x;
    } else if (strcmp(f, "--round-timeout-ms") == 0) {
      if (!parse_u(v, 1, 600000, &x))
        return bad("--round-timeout-ms wants 1..600000, not", v);
      a->round_ms = (uint32_t)x;
    } else if (strcmp(f, "--report") == 0) {
      if (v == NULL)
        return bad("--report wants a directory, not", v);
      a->report = v;
    } else if (strcmp(f, "--averaging") == 0) {
      if (v != NULL && strcmp(v, "all-to-all") == 0) {
        a->partitioned = 0;
        continue;
      }
      if (v != NULL && strcmp(v, "partitioned") == 0) {
        a->partitioned = 1;
        continue;
      }
      return bad("--averaging wants all-to-all or partitioned, not", v);
    } else if (strcmp(f, "--partition-check") == 0) {
      static const char *const names[] = {"rotating", "full", "receipts"};
      uint32_t k = 0;
      while (k < 3 && (v == NULL || strcmp(v, names[k]) != 0))
        k++;
      if (k == 3)
        return bad("--partition-check wants rotating, full or receipts, not",
                   v);
      a->check = k;
    } else if (strcmp(f, "--ranges") == 0) {
      if (v == NULL || (strcmp(v, "bandwidth") && strcmp(v, "equal")))
        return bad("--ranges wants bandwidth or equal, not", v);
      a->equal_ranges = strcmp(v, "equal") == 0;
    } else if (strcmp(f, "--netns") == 0) {
      if (v == NULL || pulse_tk_netns_parse(v, a->netns, MAXP, &a->nnetns) != 0)
        return bad("--netns wants NAME=A.B.C.D,..., not", v);
    } else if (strcmp(f, "--clients") == 0) {
      if (!parse_u(v, 0, MAXP - 1, &x))
        return bad("--clients wants 0..31, not", v);
      a->clients = (uint32_t)x;
    } else if (strcmp(f, "--peer-speeds") == 0) {
      if (v == NULL)
        return bad("--peer-speeds wants a comma list, not", v);
      char copy[1024];
      snprintf(copy, sizeof copy, "%s", v);
      a->nspeeds = 0;
      for (char *t = strtok(copy, ","); t; t = strtok(NULL, ",")) {
        char *end;
        double s = strtod(t, &end);
        if (*end || !(s >= 0 && s < 1e12) || a->nspeeds == MAXP)
          return bad("--peer-speeds wants samples/s >= 0, not", t);
        a->speeds[a->nspeeds++] = s;
      }
    } else if (strcmp(f, "--churn") == 0) {
      if (v == NULL)
        return bad("--churn wants EVENT:ROUND,..., not", v);
      char copy[1024];
      snprintf(copy, sizeof copy, "%s", v);
      for (char *t = strtok(copy, ","); t; t = strtok(NULL, ",")) {
        char *colon = strchr(t, ':');
        if (colon == NULL || a->nev == MAXEV)
          return bad("--churn event must be EVENT:ROUND, not", t);
        *colon = '\0';
        if (strcmp(t, "join") && strcmp(t, "leave") && strcmp(t, "kill") &&
            strcmp(t, "kill-writer"))
          return bad("--churn event must be join, leave, kill or "
                     "kill-writer, not",
                     t);
        if (!parse_u(colon + 1, 1, MAXR - 1, &x))
          return bad("--churn round must be 1..999, not", colon + 1);
        snprintf(a->ev[a->nev].kind, sizeof a->ev[a->nev].kind, "%s", t);
        a->ev[a->nev].round = (uint32_t)x;
        a->nev++;
      }
    } else {
      return bad("unknown option (collaboration mode; see --help)", f);
    }
  }
  if (a->trainers == 0)
    a->trainers = a->nspeeds ? a->nspeeds : 3;
  if (a->gate_mean < 0)
    a->gate_mean = a->partitioned;
  if (a->clients >= a->trainers) {
    fprintf(stderr, PROG ": --clients %u wants fewer than the %u founders "
            "(at least one serves)\n", a->clients, a->trainers);
    return 2;
  }
  return -1;
}

int bench_loco_collab_main(int argc, char **argv) {
  static collab_bench b;
  memset(&b, 0, sizeof b);
  b.a.rounds = 30;
  b.a.target = 1024;
  b.a.params = 20000;
  b.a.seed = 1;
  b.a.claim_ms = 1500;
  b.a.round_ms = 5000;
  b.a.gate_mean = -1; /* by the averaging, once parsed */
  int rc = parse(argc, argv, &b.a);
  if (rc >= 0)
    return rc;
  b.rng = b.a.seed ^ 0xC011ABull;
  signal(SIGPIPE, SIG_IGN);
  uint32_t serving = b.a.trainers - b.a.clients;
  for (uint32_t i = 0; i < b.a.trainers; i++) {
    /* Clients after every serving founder is up: each names one. */
    const char *host = i < serving ? NULL : b.p[(i - serving) % serving].url;
    if (spawn_peer(&b, i + 1, host) != 0)
      return fprintf(stderr, PROG ": could not start peer %u\n", i + 1), 1;
  }
  char line[8192];
  int off = snprintf(line, sizeof line, "start %u", b.a.trainers);
  for (size_t i = 0; i < b.n; i++)
    off += snprintf(line + off, sizeof line - (size_t)off, " %u %s",
                    b.p[i].id, b.p[i].url);
  b.start = pulse_tk_now();
  for (size_t i = 0; i < b.n; i++)
    dprintf(b.p[i].to, "%s\n", line);
  event_loop(&b);
  double wall = pulse_tk_since(b.start);
  for (size_t i = 0; i < b.n; i++)
    if (b.p[i].alive)
      dprintf(b.p[i].to, "quit\n");
  for (size_t i = 0; i < b.n; i++) {
    int status;
    for (int t = 0; t < 200 && waitpid(b.p[i].pid, &status, WNOHANG) == 0;
         t++)
      usleep(10000);
    kill(b.p[i].pid, SIGKILL);
    waitpid(b.p[i].pid, &status, 0);
  }
  uint32_t last = 0;
  while (last < b.a.rounds && b.rows[last].have)
    last++;
  /* Survivors' final states. */
  int identical = 1, survivors = 0;
  uint64_t digest = 0;
  double busy_min = 1.0;
  for (size_t i = 0; i < b.n; i++) {
    if (!b.p[i].done || b.p[i].final_round != b.a.rounds)
      continue;
    if (survivors++ == 0)
      digest = b.p[i].digest;
    identical &= b.p[i].digest == digest;
  }
  uint64_t samples = 0;
  double final_loss = NAN, t_end = 0;
  for (uint32_t r = 0; r < last; r++) {
    samples += b.rows[r].samples;
    if (!isnan(b.rows[r].loss))
      final_loss = b.rows[r].loss;
    t_end = b.rows[r].t_s;
  }
  print_rounds(&b, last);
  double sps = t_end > 0 ? (double)samples / t_end : 0;
  in_ratios q = ratios_of(&b, last);
  if (b.a.json) {
    printf("{\"summary\":true,\"final_loss\":%.9g,\"samples\":%" PRIu64
           ",\"samples_per_s\":%.2f,\"rounds\":%u,\"wall_s\":%.3f,"
           "\"target_batch\":%" PRIu64 ",\"gate_mean\":%s,\"identical\":%s,"
           "\"in_over_payload\":{\"mean\":%.3f,\"worst_peer\":%.3f,"
           "\"worst_peer_round\":%.3f,\"writer\":%.3f},\"busy\":{",
           final_loss, samples, sps, last, wall, b.a.target,
           b.a.gate_mean ? "true" : "false", identical ? "true" : "false",
           q.mean, q.worst_peer, q.worst_peer_round, q.writer);
  } else {
    printf("rounds %u  samples %" PRIu64 "  samples/s %.1f  final loss %.6f"
           "  survivors identical: %s\nmean gate %s; bytes in / own payload: "
           "mean %.2fx, worst peer %.2fx, worst peer-round %.2fx, writers "
           "%.2fx\nbusy:",
           last, samples, sps, final_loss, identical ? "yes" : "no",
           b.a.gate_mean ? "on" : "off", q.mean,
           q.worst_peer, q.worst_peer_round, q.writer);
  }
  int first = 1;
  for (size_t i = 0; i < b.n; i++) {
    if (!b.p[i].done || b.p[i].alive_ms == 0)
      continue;
    double f = (double)b.p[i].busy_ms / (double)b.p[i].alive_ms;
    if (f < busy_min)
      busy_min = f;
    if (b.a.json)
      printf("%s\"%u\":%.4f", first ? "" : ",", b.p[i].id, f);
    else
      printf(" %u:%.1f%%", b.p[i].id, 100 * f);
    first = 0;
  }
  if (b.a.json)
    printf("},\"busy_min\":%.4f}\n", busy_min);
  else
    printf("  (min %.1f%%)\n", 100 * busy_min);
  if (b.a.report && write_report(&b, last, argc, argv) != 0)
    return 1;
  if (b.failed || last < b.a.rounds) {
    fprintf(stderr, PROG ": the collaboration did not complete (%u of %u "
            "rounds)\n", last, b.a.rounds);
    return 1;
  }
  return 0;
}
