/* bench_loco_collab_churn.c - the churn of `pulse-bench loco` in
 * collaboration mode (--churn): joins through a serving member, clean
 * leaves, kill -9 of a random member, of the round's writer or of the
 * first member to say it finished the round (a finisher killed after its
 * word, while others may still be fetching what it served), at given
 * rounds, the victims drawn from the run's seed. Events of one round
 * combine: kill-writer:R,kill-finisher:R is two failures in round R. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "bench_loco_collab_impl.h"
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
    if (strcmp(ev->kind, "kill-finisher") == 0) {
      b->finisher_round = reported + 1;
      b->watching = 1;
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
    if (loco_http_get(url, 200, 64, &body, &status) == PULSE_OK &&
        status == 200 && body.size == 8 &&
        memcmp(body.data, "finished", 8) == 0) {
      kill(q->pid, SIGKILL);
      q->alive = 0;
      b->watching = 0;
    }
    pulse_bytebuf_free(&body);
  }
}
