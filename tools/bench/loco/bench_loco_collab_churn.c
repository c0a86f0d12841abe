/* bench_loco_collab_churn.c - the churn of `pulse-bench loco` in
 * collaboration mode (--churn): joins through a serving member, clean
 * leaves, kill -9 of a random member or of the round's writer, at given
 * rounds, the victims drawn from the run's seed. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "bench_loco_collab_impl.h"

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
