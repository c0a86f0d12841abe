/* bench_loco_collab_churn.c - the churn of `pulse-bench loco` in
 * collaboration mode (--churn): joins through a serving member, clean
 * leaves, kill -9 of a random member, of the round's writer or of the
 * first member to say it finished the round (a finisher killed after its
 * word, while others may still be fetching what it served), at given
 * rounds, the victims drawn from the run's seed. Events of one round
 * combine: kill-writer:R,kill-finisher:R is two failures in round R. A
 * partition cuts two members from each other (nft drops what each one's
 * user sends to the other's port) for a round timeout and two claim
 * timeouts, then heals. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_loco_collab_impl.h"
#include "cli_time.h"
#include "peer_http_impl.h"

static uint64_t next_rand(uint64_t *s) {
  *s += 0x9E3779B97F4A7C15ull;
  uint64_t z = *s;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static peer *live_member(collab_bench *b, uint32_t id) {
  for (size_t i = 0; i < b->n; i++)
    if (b->p[i].id == id && b->p[i].alive && !b->p[i].done)
      return &b->p[i];
  return NULL;
}

static int sh(const char *cmd) {
  int rc = system(cmd);
  return rc == -1 ? -1 : WEXITSTATUS(rc);
}

static unsigned port_of(const peer *q) {
  const char *colon = strrchr(q->url, ':');
  return colon ? (unsigned)strtoul(colon + 1, NULL, 10) : 0;
}

/* Two distinct live serving members, drawn from the run's seed, cut from
 * each other. */
static int cut(collab_bench *b, const round_row *row) {
  peer *v[2] = {NULL, NULL};
  for (size_t t = 0; t < 8 * MAXP && v[1] == NULL && row->nnext; t++) {
    peer *q = live_member(b, row->next[next_rand(&b->rng) % row->nnext]);
    if (q == NULL || strstr(q->url, "/v1/hosted/") != NULL || q == v[0])
      continue;
    v[v[0] == NULL ? 0 : 1] = q;
  }
  if (v[1] == NULL || b->cut_until > 0)
    return 0; /* nobody to cut, or a cut under way */
  snprintf(b->cut_table, sizeof b->cut_table, "pulse_bench_cut_%d",
           (int)getpid());
  char cmd[1024];
  snprintf(cmd, sizeof cmd,
           "nft add table inet %1$s && nft add chain inet %1$s out "
           "'{ type filter hook output priority 0; }' && "
           "nft add rule inet %1$s out meta skuid %2$u tcp dport %3$u drop && "
           "nft add rule inet %1$s out meta skuid %4$u tcp dport %5$u drop",
           b->cut_table, b->a.uid_base + v[0]->id, port_of(v[1]),
           b->a.uid_base + v[1]->id, port_of(v[0]));
  if (sh(cmd) != 0) {
    fprintf(stderr, PROG ": partition: nft failed (root and nft needed)\n");
    return -1;
  }
  fprintf(stderr, PROG ": members %u and %u cut from each other\n", v[0]->id,
          v[1]->id);
  b->cut_until = pulse_cli_now() +
                 (b->a.round_ms + 2.0 * b->a.claim_ms) / 1000.0;
  return 0;
}

void bench_loco_collab_heal(collab_bench *b, int now) {
  if (b->cut_until <= 0 || (!now && pulse_cli_now() < b->cut_until))
    return;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "nft delete table inet %s", b->cut_table);
  sh(cmd);
  b->cut_until = 0;
  fprintf(stderr, PROG ": the partition healed\n");
}

/* Events of round R fire when round R - 1 is first reported: the peers
 * are then in round R. */
void bench_loco_collab_fire_events(collab_bench *b, uint32_t reported) {
  const round_row *row = &b->rows[reported];
  for (uint32_t e = 0; e < b->a.nev; e++) {
    churn_event *ev = &b->a.ev[e];
    if (ev->fired || ev->round != reported + 1)
      continue;
    ev->fired = 1;
    uint32_t writer = row->nnext ? row->next[(reported + 1) % row->nnext] : 0;
    if (strcmp(ev->kind, "join") == 0) {
      uint32_t id = 0;
      for (size_t i = 0; i < b->n; i++)
        id = b->p[i].id > id ? b->p[i].id : id;
      id++;
      if (id > MAXP || bench_loco_collab_spawn_peer(b, id, NULL) != 0) {
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
    if (strcmp(ev->kind, "partition") == 0) {
      if (cut(b, row) != 0)
        b->failed = 1;
      continue;
    }
    if (strcmp(ev->kind, "kill-finisher") == 0) {
      b->finisher_round = reported + 1;
      b->watching = 1;
      continue;
    }
    /* A random live member, neither the writer of round R nor that of
     * R - 1 (kill-writer: the writer of R). The first report of R - 1
     * fires the event while others may still be finishing R - 1, whose
     * writer then serves what they lack: killing it there is a writer's
     * death in R - 1 and leaves R to the member that finished R - 1
     * first, its only contributor (the limit the protocol page states
     * when that member dies after its word, as kill-finisher:R does). */
    peer *v = NULL;
    uint32_t before = row->contributors > 0 ? row->writer : 0;
    if (strcmp(ev->kind, "kill-writer") == 0)
      v = live_member(b, writer);
    for (size_t t = 0; t < 4 * MAXP && v == NULL && row->nnext; t++) {
      uint32_t id = row->next[next_rand(&b->rng) % row->nnext];
      if (id != writer && id != before)
        v = live_member(b, id);
    }
    if (v == NULL)
      continue;
    if (strcmp(ev->kind, "leave") == 0) {
      dprintf(v->to, "leave\n");
    } else {
      kill(v->pid, SIGKILL);
      v->alive = 0;
      fprintf(stderr, PROG ": killed member %u (%s:%u)\n", v->id, ev->kind,
              ev->round);
    }
  }
}

void bench_loco_collab_watch_finishers(collab_bench *b) {
  /* Too late once a later round is under way: nobody says it any more. */
  if (b->finisher_round + 1 < MAXR && b->rows[b->finisher_round + 1].have)
    b->watching = 0;
  for (size_t i = 0; b->watching && i < b->n; i++) {
    peer *q = &b->p[i];
    /* A client publishes no outcome. */
    if (!q->alive || q->done || strstr(q->url, "/v1/hosted/") != NULL)
      continue;
    char url[160];
    snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/outcome", q->url,
             b->finisher_round);
    pulse_bytebuf body = PULSE_BYTEBUF_INIT;
    long status = 0;
    /* "finished", or "finished N" where peers sign their outcomes. */
    if (loco_http_get(url, 200, 64, &body, &status) == PULSE_OK &&
        status == 200 && body.size >= 8 &&
        memcmp(body.data, "finished", 8) == 0 &&
        (body.size == 8 || body.data[8] == ' ')) {
      kill(q->pid, SIGKILL);
      q->alive = 0;
      b->watching = 0;
      fprintf(stderr, PROG ": killed member %u (it said it finished round %" PRIu64
              ")\n", q->id, b->finisher_round);
    }
    pulse_bytebuf_free(&body);
  }
}
