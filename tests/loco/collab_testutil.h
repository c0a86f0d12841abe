/* collab_testutil.h - peers of a PULSELoCo collaboration as child
 * processes for the collaboration tests (test_collab*.c): each child makes
 * a context and a pulse_loco_collab peer on 127.0.0.1, says its URL, is
 * told to start (founders) or to join (through a given member), runs
 * rounds with a synthetic local step and reports each round on a pipe:
 *
 *   child -> parent  "url ID URL"
 *                    "round R SAMPLES OWN CONTRIB WRITER TAKEOVERS DIGEST
 *                     MAXSTEP LEFT RESYNCED INCLUDED PARTITIONED"
 *                    "joined R DIGEST"
 *                    "done R DIGEST RESIDUAL_ABS_SUM HOSTED_STORED
 *                     HOSTED_REFUSED"
 *                    "error TEXT"
 *   parent -> child  "start N ID URL ...", "join URL", "quit"
 *
 * Everything is loopback, port 0; children are killed and reaped by the
 * test, and die with it when it ends otherwise (a failed assertion, the
 * watchdog): a child left behind, stalled by a test hook or waiting for a
 * "quit", would hold the test run's output pipe open, and the run (ctest,
 * CI) would wait for it forever. */
#ifndef PULSE_COLLAB_TESTUTIL_H
#define PULSE_COLLAB_TESTUTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "peer_http_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_collab.h"

#define CT_P 2048u
#define CT_MAX 8

typedef struct {
  uint32_t id;
  uint64_t step;       /* samples per local step */
  uint64_t target;     /* T */
  uint64_t rounds;     /* run until the context is at this round */
  int64_t leave_round; /* flush and go in this round; -1 never */
  unsigned step_us;    /* time one step takes */
} ct_peer_cfg;

/* opts.partitioned of the children spawned after it is set. */
static int ct_partitioned;
/* opts.client_of of the children spawned after it is set ("": serve). */
static char ct_client_of[64];
/* Their round timeout (0: 3000 ms). */
static uint32_t ct_round_timeout_ms;
/* Non-zero: each child runs as user ct_uid_base + its id once its server
 * listens, so that a packet filter tells its packets apart from the
 * others' (nft `meta skuid`: every peer is on 127.0.0.1). */
static uid_t ct_uid_base;
/* How long ct_collect waits for the children, in 10 ms spins (0: 3000,
 * about 30 s). */
static int ct_collect_spins;
/* pulse_loco_opts.gate_mean of the children spawned after it is set, and
 * of ct_replay_all_to_all's contexts. */
static int ct_gate_mean;
/* The round timeout of the tests that kill a peer mid-exchange (a kill
 * round costs it, plus two claim timeouts): the rounds before the kill
 * must end by the exchange, under ASan with another test beside them on 2
 * cores too (loaded runs saw slices time out at 2000 ms). */
#define CT_KILL_ROUND_TIMEOUT_MS 5000u
/* Their peers' step time: a test hook stops a peer in a given round, so
 * every peer must be in that round. With 3 ms steps (T = 48, 4 samples a
 * step) two peers reached T in 18 ms, before two others, slowed by ASan
 * and a test beside them, had stepped at all, and those two sat the round
 * out: the stalled owner never got to the point the test waits for. */
#define CT_KILL_STEP_US 30000u

typedef struct {
  pid_t pid;
  int to, from; /* pipes */
  char url[64];
  uint32_t id;
  char buf[1 << 14];
  size_t have;
} ct_child;

typedef struct {
  uint32_t id;
  uint64_t n;
} ct_step_state;

/* A deterministic local step: a pull towards a per-peer target with
 * per-step noise (different on every peer, so payloads differ). */
static inline int ct_step(void *user, float *theta, uint64_t samples) {
  ct_step_state *s = user;
  for (uint64_t i = 0; i < CT_P; i++) {
    uint64_t h = (i * 0x9E3779B97F4A7C15ull) ^ (s->n * 0xD1B54A32D192ED03ull) ^
                 ((uint64_t)s->id << 48);
    h ^= h >> 29;
    float noise = (float)((double)(h % 2001) / 1000.0 - 1.0);
    theta[i] += 1e-3f * (float)samples * (0.05f * noise - 0.01f * theta[i]);
  }
  s->n++;
  return 0;
}

static unsigned ct_step_us;
static inline int ct_step_slow(void *user, float *theta, uint64_t samples) {
  if (ct_step_us)
    usleep(ct_step_us);
  return ct_step(user, theta, samples);
}

static inline double ct_abs_sum(const float *x, uint64_t n) {
  double s = 0;
  for (uint64_t i = 0; i < n; i++)
    s += fabs((double)x[i]);
  return s;
}

static inline void ct_child_main(const ct_peer_cfg *cfg, int in, int out) {
  FILE *fin = fdopen(in, "r");
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = CT_P;
  o.trainer_id = cfg->id;
  o.rule = PULSE_LOCO_RULE_KEEP;
  o.chunk_log2 = 10;
  o.gate_mean = ct_gate_mean;
  float *theta = calloc(CT_P, sizeof *theta);
  for (uint64_t i = 0; i < CT_P; i++)
    theta[i] = (float)((double)((i * 37u) % 101u) / 50.0 - 1.0);
  pulse_loco *ctx = NULL;
  pulse_loco_collab *c = NULL;
  pulse_loco_collab_opts co;
  pulse_loco_collab_opts_init(&co);
  co.target_batch = cfg->target;
  co.claim_timeout_ms = 1000; /* a loaded (sanitized) run answers late */
  co.round_timeout_ms = ct_round_timeout_ms ? ct_round_timeout_ms : 3000;
  co.partitioned = ct_partitioned;
  co.client_of = ct_client_of[0] ? ct_client_of : NULL;
  if (pulse_loco_create(&o, theta, &ctx) != PULSE_OK ||
      pulse_loco_collab_create(&co, ctx, &c) != PULSE_OK) {
    dprintf(out, "error create: %s\n", pulse_error_detail());
    _exit(1);
  }
  /* A change of user clears the parent-death signal: set it again. */
  if (ct_uid_base != 0 && (setresuid(ct_uid_base + cfg->id, ct_uid_base + cfg->id,
                                     ct_uid_base + cfg->id) != 0 ||
                           prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)) {
    dprintf(out, "error setresuid: %s\n", strerror(errno));
    _exit(1);
  }
  dprintf(out, "url %u %s\n", cfg->id, pulse_loco_collab_url(c));
  char line[4096];
  if (!fgets(line, sizeof line, fin))
    _exit(1);
  if (strncmp(line, "start ", 6) == 0) {
    pulse_loco_member m[CT_MAX];
    int n = 0, off = 0, k = 0;
    sscanf(line + 6, "%d%n", &n, &off);
    const char *p = line + 6 + off;
    for (int i = 0; i < n && i < CT_MAX; i++) {
      sscanf(p, " %u %63s%n", &m[i].id, m[i].url, &k);
      p += k;
    }
    if (pulse_loco_collab_start(c, m, (size_t)n) != PULSE_OK) {
      dprintf(out, "error start: %s\n", pulse_error_detail());
      _exit(1);
    }
  } else if (strncmp(line, "join ", 5) == 0) {
    char seed[64];
    sscanf(line + 5, "%63s", seed);
    if (pulse_loco_collab_join(c, seed, theta, 20000) != PULSE_OK) {
      dprintf(out, "error join: %s\n", pulse_error_detail());
      _exit(1);
    }
    dprintf(out, "joined %" PRIu64 " %016" PRIx64 "\n", pulse_loco_round(ctx),
            pulse_loco_global_digest(ctx));
  }
  ct_step_state st = {cfg->id, 0};
  ct_step_us = cfg->step_us;
  int left = 0, lost = 0;
  while (pulse_loco_round(ctx) < cfg->rounds && !left) {
    pulse_loco_collab_figures info;
    uint32_t flags = cfg->leave_round >= 0 &&
                             pulse_loco_round(ctx) >= (uint64_t)cfg->leave_round
                         ? PULSE_LOCO_LEAVING
                         : 0;
    pulse_status rs = pulse_loco_collab_round(c, theta, cfg->step,
                                              ct_step_slow, &st, flags, &info);
    /* A client whose host is gone loses that round and rejoins through
     * another host in its next call. */
    if (rs != PULSE_OK && ct_client_of[0] && lost++ < 3) {
      dprintf(out, "lost %" PRIu64 ": %s\n", pulse_loco_round(ctx),
              pulse_error_detail());
      continue;
    }
    if (rs != PULSE_OK) {
      dprintf(out, "error round %" PRIu64 ": %s\n", pulse_loco_round(ctx),
              pulse_error_detail());
      _exit(1);
    }
    left = info.left;
    dprintf(out,
            "round %" PRIu64 " %" PRIu64 " %" PRIu64 " %u %u %u %016" PRIx64
            " %" PRIu64 " %d %d %d %" PRIu64 " %" PRIu64 " %d\n",
            info.round, info.samples, info.own_samples, info.contributors,
            info.writer, info.takeovers, pulse_loco_global_digest(ctx),
            info.max_step, info.left, info.resynced, info.self_included,
            info.sent, info.payload_bytes, info.partitioned);
  }
  uint64_t stored = 0, refused = 0;
  pulse_loco_collab_hosted(c, &stored, &refused);
  dprintf(out, "done %" PRIu64 " %016" PRIx64 " %.9g %" PRIu64 " %" PRIu64 "\n",
          pulse_loco_round(ctx), pulse_loco_global_digest(ctx),
          ct_abs_sum(pulse_loco_residual(ctx), CT_P), stored, refused);
  /* Serve until told to go: the others may still fetch from this peer. */
  while (fgets(line, sizeof line, fin) && strncmp(line, "quit", 4) != 0)
    ;
  pulse_loco_collab_free(c);
  pulse_loco_free(ctx);
  _exit(0);
}

static inline void ct_spawn(ct_child *k, const ct_peer_cfg *cfg) {
  int a[2], b[2];
  cr_assert_eq(pipe(a), 0);
  cr_assert_eq(pipe(b), 0);
  fflush(NULL);
  pid_t parent = getpid();
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    /* Dies with the test's process, even if it died before this line. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
      _exit(1);
    close(a[1]), close(b[0]);
    ct_child_main(cfg, a[0], b[1]);
  }
  close(a[0]), close(b[1]);
  memset(k, 0, sizeof *k);
  k->pid = pid;
  k->to = a[1];
  k->from = b[0];
  k->id = cfg->id;
}

/* The child's next line (without newline) into line; 0 at EOF or after
 * timeout_ms. */
static inline int ct_read_line(ct_child *k, char *line, size_t cap,
                        unsigned timeout_ms) {
  for (unsigned waited = 0;;) {
    char *nl = memchr(k->buf, '\n', k->have);
    if (nl != NULL) {
      size_t n = (size_t)(nl - k->buf);
      size_t m = n < cap - 1 ? n : cap - 1;
      memcpy(line, k->buf, m);
      line[m] = '\0';
      memmove(k->buf, nl + 1, k->have - n - 1);
      k->have -= n + 1;
      return 1;
    }
    if (k->have == sizeof k->buf)
      return 0;
    unsigned slice = timeout_ms - waited < 20u ? timeout_ms - waited : 20u;
    struct pollfd p = {k->from, POLLIN, 0};
    int r = poll(&p, 1, (int)slice);
    waited += slice;
    if (r <= 0 && waited >= timeout_ms)
      return 0;
    if (r > 0) {
      ssize_t got = read(k->from, k->buf + k->have, sizeof k->buf - k->have);
      if (got <= 0)
        return 0;
      k->have += (size_t)got;
    }
  }
}

/* Reads the child's URL line. */
static inline void ct_hello(ct_child *k) {
  char line[256];
  cr_assert(ct_read_line(k, line, sizeof line, 10000), "no URL from %u",
            k->id);
  unsigned id;
  cr_assert_eq(sscanf(line, "url %u %63s", &id, k->url), 2, "%s", line);
}

static inline void ct_start(ct_child *ks, size_t n) {
  char line[2048];
  int off = snprintf(line, sizeof line, "start %zu", n);
  for (size_t i = 0; i < n; i++)
    off += snprintf(line + off, sizeof line - (size_t)off, " %u %s", ks[i].id,
                    ks[i].url);
  for (size_t i = 0; i < n; i++)
    dprintf(ks[i].to, "%s\n", line);
}

typedef struct {
  uint64_t round, samples, own;
  unsigned contrib, writer, takeovers;
  uint64_t digest, max_step;
  int left, resynced, included;
  uint64_t sent, payload_bytes; /* entries and bytes of its own payload */
} ct_round;

static inline int ct_parse_round(const char *line, ct_round *r) {
  return sscanf(line,
                "round %" SCNu64 " %" SCNu64 " %" SCNu64 " %u %u %u %" SCNx64
                " %" SCNu64 " %d %d %d %" SCNu64 " %" SCNu64,
                &r->round, &r->samples, &r->own, &r->contrib, &r->writer,
                &r->takeovers, &r->digest, &r->max_step, &r->left,
                &r->resynced, &r->included, &r->sent,
                &r->payload_bytes) == 13;
}

/* What the children said: rows[i][r] child i's report of round r (have
 * says it came; partitioned: the line's last field, finished by the
 * partitioned exchange), its join, its "lost" lines, and its end. */
#define CT_LOG_ROUNDS 16
typedef struct {
  ct_round row[CT_MAX][CT_LOG_ROUNDS];
  int have[CT_MAX][CT_LOG_ROUNDS], partitioned[CT_MAX][CT_LOG_ROUNDS];
  uint64_t joined_round[CT_MAX], joined_digest[CT_MAX];
  uint64_t final_round[CT_MAX], final_digest[CT_MAX];
  double residual[CT_MAX];
  uint64_t stored[CT_MAX], refused[CT_MAX]; /* uploads a host kept, refused */
  int done[CT_MAX], lost[CT_MAX];
} ct_log;

/* Called on each round line as it comes (ks, n, the child's index, its
 * report, user); it may kill children or send them lines. */
typedef void (*ct_on_round)(ct_child *ks, size_t n, size_t i,
                            const ct_round *r, void *user);

/* Collects lines of the live children until all are done; on_round may be
 * NULL. A child that errors fails the test. */
static inline void ct_collect(ct_child *ks, size_t n, ct_log *log,
                              ct_on_round on_round, void *user) {
  int max_spins = ct_collect_spins ? ct_collect_spins : 3000;
  for (int spins = 0; spins < max_spins; spins++) {
    int pending = 0;
    for (size_t i = 0; i < n; i++) {
      if (ks[i].pid <= 0 || log->done[i])
        continue;
      pending = 1;
      char line[1024];
      /* What this child said so far, then the next child: none starves. */
      while (ct_read_line(&ks[i], line, sizeof line, 0)) {
        ct_round r;
        if (strncmp(line, "error", 5) == 0)
          cr_assert_fail("peer %u: %s", ks[i].id, line);
        if (strncmp(line, "lost", 4) == 0) {
          log->lost[i]++;
          cr_log_info("peer %u %s", ks[i].id, line);
        } else if (ct_parse_round(line, &r)) {
          if (r.round < CT_LOG_ROUNDS) {
            const char *last = strrchr(line, ' ');
            log->row[i][r.round] = r;
            log->have[i][r.round] = 1;
            log->partitioned[i][r.round] =
                last != NULL && strcmp(last, " 1") == 0;
          }
          if (on_round)
            on_round(ks, n, i, &r, user);
          if (ks[i].pid <= 0)
            break;
        } else if (sscanf(line, "joined %" SCNu64 " %" SCNx64,
                          &log->joined_round[i],
                          &log->joined_digest[i]) == 2) {
        } else if (sscanf(line,
                          "done %" SCNu64 " %" SCNx64 " %lf %" SCNu64
                          " %" SCNu64,
                          &log->final_round[i], &log->final_digest[i],
                          &log->residual[i], &log->stored[i],
                          &log->refused[i]) == 5) {
          log->done[i] = 1;
          break;
        }
      }
    }
    if (!pending)
      return;
    usleep(10000);
  }
  cr_assert_fail("the peers did not finish in time");
}

static inline void ct_quit(ct_child *ks, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (ks[i].pid <= 0)
      continue;
    dprintf(ks[i].to, "quit\n");
  }
  for (size_t i = 0; i < n; i++) {
    if (ks[i].pid <= 0)
      continue;
    int status;
    for (int t = 0; t < 50 && waitpid(ks[i].pid, &status, WNOHANG) == 0; t++)
      usleep(20000);
    kill(ks[i].pid, SIGKILL);
    waitpid(ks[i].pid, &status, 0);
    close(ks[i].to), close(ks[i].from);
    ks[i].pid = 0;
  }
}

static inline void ct_kill(ct_child *k) {
  kill(k->pid, SIGKILL);
  int status;
  waitpid(k->pid, &status, 0);
  close(k->to), close(k->from);
  k->pid = 0;
}

/* Where a peer stops at a test hook (collab_impl.h, partition_impl.h):
 * in which round, at which phase (0: never). */
typedef struct {
  uint64_t round;
  int phase;
} ct_stall;

/* A module's test hook: its three variables in the test's process, which
 * a child inherits when it is spawned (fork). CT_STALL_VARS(loco_collab_
 * test_stall) names those of collab_impl.h. */
typedef struct {
  uint32_t *id;
  uint64_t *round;
  int *phase;
} ct_stall_vars;
#define CT_STALL_VARS(prefix)                                                  \
  ((ct_stall_vars){&prefix##_id, &prefix##_round, &prefix##_phase})

/* Peers 1..n for a test that kills one a hook stopped: steps of `step`
 * samples taking CT_KILL_STEP_US each (slow enough to kill one mid-round),
 * target T, until round `rounds`; peer i + 1 stops as stalls[i] says (the
 * hook is off again in the test's process once they are spawned). Then
 * reads their URLs and starts them as founders. */
static inline void ct_spawn_stalled(ct_child *ks, size_t n, uint64_t step,
                                    uint64_t T, uint64_t rounds,
                                    ct_stall_vars hook,
                                    const ct_stall *stalls) {
  for (uint32_t i = 0; i < n; i++) {
    /* The child has its own copy (fork): one cfg serves every spawn. */
    ct_peer_cfg cfg = {i + 1, step, T, rounds, -1, CT_KILL_STEP_US};
    *hook.id = i + 1;
    *hook.round = stalls[i].round;
    *hook.phase = stalls[i].phase;
    ct_spawn(&ks[i], &cfg);
  }
  *hook.phase = 0;
  for (size_t i = 0; i < n; i++)
    ct_hello(&ks[i]);
  ct_start(ks, n);
}

/* Waits until url answers 200 and, when want is not NULL, with exactly
 * that body: a peer a hook stopped reached the hook's point, or a peer
 * said how its round ended. Fails the test after 3000 tries 5 ms apart. */
static inline void ct_wait_for(const char *url, const char *want) {
  size_t n = want ? strlen(want) : 0;
  for (int i = 0; i < 3000; i++) {
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long status = 0;
    cr_assert_eq(loco_http_get(url, 1000, 1 << 20, &b, &status), PULSE_OK);
    int ok = status == 200 &&
             (want == NULL || (b.size == n && memcmp(b.data, want, n) == 0));
    pulse_bytebuf_free(&b);
    if (ok)
      return;
    usleep(5000);
  }
  cr_assert_fail("%s never came", url);
}

/* The reference for a clean run (every peer that stepped is in its round,
 * one that did not imports the state): the rounds as the n peers of log
 * reported them (each one's own samples, `step` a step), rerun in memory
 * from the children's start with pulse_loco_finish over every payload
 * (peer i of log has id i + 1).
 * Which peer did how many steps depends on timing, hence a replay. Every
 * peer's digest of each of the first `rounds` rounds must be the
 * replay's, bit for bit. */
static inline void ct_replay_all_to_all(const ct_log *log, size_t n,
                                        uint64_t rounds, uint64_t step) {
  cr_assert_leq(n, CT_MAX);
  cr_assert_leq(rounds, CT_LOG_ROUNDS);
  pulse_loco *ctx[CT_MAX];
  float *theta[CT_MAX];
  ct_step_state st[CT_MAX];
  for (size_t i = 0; i < n; i++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = CT_P;
    o.trainer_id = (uint32_t)(i + 1);
    o.rule = PULSE_LOCO_RULE_KEEP;
    o.chunk_log2 = 10;
    o.gate_mean = ct_gate_mean;
    theta[i] = calloc(CT_P, sizeof *theta[i]);
    cr_assert_not_null(theta[i]);
    for (uint64_t p = 0; p < CT_P; p++)
      theta[i][p] = (float)((double)((p * 37u) % 101u) / 50.0 - 1.0);
    cr_assert_eq(pulse_loco_create(&o, theta[i], &ctx[i]), PULSE_OK);
    st[i] = (ct_step_state){(uint32_t)(i + 1), 0};
  }
  for (uint64_t r = 0; r < rounds; r++) {
    pulse_loco_contribution set[CT_MAX];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
      const ct_round *x = &log->row[i][r];
      cr_assert(log->have[i][r], "round %" PRIu64 ": peer %zu silent", r, i + 1);
      cr_assert_eq(x->own % step, 0);
      cr_assert_eq(x->resynced, x->own == 0, "round %" PRIu64 ": peer %zu",
                   r, i + 1);
      if (x->own == 0) {
        cr_assert_eq(x->sent, 0); /* no payload */
        continue;
      }
      cr_assert(x->included);
      for (uint64_t s = 0; s < x->own / step; s++)
        ct_step(&st[i], theta[i], step);
      const uint8_t *data;
      size_t size;
      pulse_loco_prepare_figures pi;
      cr_assert_eq(pulse_loco_prepare(ctx[i], theta[i], x->own, 0, &data,
                                      &size, &pi),
                   PULSE_OK);
      /* The peer's figures name its payload: its entries and size. */
      cr_assert_eq(x->sent, pi.sent, "round %" PRIu64 ": peer %zu sent %"
                   PRIu64 " entries, its replay %" PRIu64, r, i + 1, x->sent,
                   pi.sent);
      cr_assert_eq(x->payload_bytes, size);
      set[k++] = (pulse_loco_contribution){data, size};
    }
    cr_assert_gt(k, 1, "round %" PRIu64 ": one contributor proves nothing", r);
    /* Payloads are borrowed until the first finish: copy them first. */
    uint8_t *copy[CT_MAX];
    for (size_t j = 0; j < k; j++) {
      copy[j] = malloc(set[j].size);
      cr_assert_not_null(copy[j]);
      memcpy(copy[j], set[j].data, set[j].size);
      set[j].data = copy[j];
    }
    uint64_t want = 0;
    size_t done_by = 0;
    for (size_t i = 0; i < n; i++)
      if (log->row[i][r].own > 0) {
        cr_assert_eq(pulse_loco_finish(ctx[i], set, k, theta[i], NULL),
                     PULSE_OK);
        want = pulse_loco_global_digest(ctx[i]);
        done_by = i;
      }
    /* A member without a payload imports the state (keeps its e). */
    for (size_t i = 0; i < n; i++)
      if (log->row[i][r].own == 0) {
        pulse_buffer b = {0};
        cr_assert_eq(pulse_loco_state_export(ctx[done_by], &b), PULSE_OK);
        cr_assert_eq(pulse_loco_state_import(ctx[i], b.data, b.size,
                                             theta[i]),
                     PULSE_OK);
        pulse_buffer_free(&b);
      }
    for (size_t j = 0; j < k; j++)
      free(copy[j]);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(log->row[i][r].digest, want,
                   "round %" PRIu64 ": peer %zu has %016" PRIx64
                   ", all-to-all %016" PRIx64,
                   r, i + 1, log->row[i][r].digest, want);
  }
  for (size_t i = 0; i < n; i++) {
    pulse_loco_free(ctx[i]);
    free(theta[i]);
  }
}

#endif
