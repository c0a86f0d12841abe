/* bench_loco_collab_parent.c - the parent of `pulse-bench loco` in
 * collaboration mode: forks a peer and reads its URL, then reads every
 * peer's lines into the rounds' rows until none is left. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_loco_collab_impl.h"
#include "cli_time.h"

/* Peer id, serving (client_of NULL) or in client mode hosted there. */
int bench_loco_collab_spawn_peer(collab_bench *b, uint32_t id,
                                 const char *client_of) {
  peer *q = &b->p[b->n];
  int a[2], c[2];
  if (pipe(a) != 0 || pipe(c) != 0)
    return -1;
  double speed = b->a.nspeeds ? b->a.speeds[(id - 1) % b->a.nspeeds] : 0.0;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    close(a[1]), close(c[0]);
    _exit(bench_loco_collab_run_peer(&b->a, id, speed, client_of, a[0], c[1]));
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
      row->t_s = pulse_cli_since(b->start);
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
      bench_loco_collab_fire_events(b, (uint32_t)r);
    return;
  }
  if (sscanf(line, "auth %" SCNu64, &r) == 1) {
    b->auth_bytes += r;
    b->auth_reports++;
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

void bench_loco_collab_event_loop(collab_bench *b) {
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
    /* A finisher is killed within about 20 ms of its word; a partition
     * heals within 100 ms of its time. */
    int wait_ms = b->watching ? 20 : b->cut_until > 0 ? 100 : 1000;
    if (poll(pf, k, wait_ms) < 0 && errno != EINTR)
      return;
    if (b->watching)
      bench_loco_collab_watch_finishers(b);
    bench_loco_collab_heal(b, 0);
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
