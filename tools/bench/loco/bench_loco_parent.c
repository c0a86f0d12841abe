/* bench_loco_parent.c - the parent of `pulse-bench loco`: forks the
 * baselines, the replay and the trainers (before any of them starts a
 * thread), reads their pipes until all close, tells the trainers when to
 * start, join and quit, and waits for them. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_loco_impl.h"

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
  return bench_loco_run_baseline(&b->a, c->baseline - 1, out);
}

static int replay_body(bench *b, child *c, int in, int out) {
  (void)c, (void)in;
  return bench_loco_run_replay(&b->a, out);
}

static int trainer_body(bench *b, child *c, int in, int out) {
  return bench_loco_run_trainer(&b->a, c->id, c->founder, in, out, &b->pd);
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
    bench_loco_on_line(b, c, start);
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

/* Forks the baselines and the trainers, reads them to the end and waits for
 * them. @return 1 when all ended well. */
int bench_loco_run_all(bench *b) {
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
                bench_loco_method[c->baseline - 1].name, status);
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
