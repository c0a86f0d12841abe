/* bench_loco_lines.c - the lines the children of `pulse-bench loco` write,
 * read into the rounds' rows: a baseline's arms, a trainer's rounds,
 * exchanges, authentication and end, the replay's bias; the drift over all
 * pairs measured once a round's members have written it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bench_loco_impl.h"

static void on_baseline_line(bench *b, const child *c, const char *line) {
  int m = c->baseline - 1;
  size_t klen = strlen(bench_loco_method[m].key);
  unsigned r;
  double loss, reward;
  uint64_t v[4];
  if (sscanf(line, "init %lf %lf %" SCNu64 " %lf", &loss, &b->floor, &v[0],
             &reward) == 4) {
    b->init_loss = loss, b->init_reward = reward;
    b->P = v[0];
  } else if (strncmp(line, bench_loco_method[m].key, klen) == 0 &&
             line[klen] == ' ' &&
             sscanf(line + klen,
                    " %u %lf %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                    " %lf",
                    &r, &loss, &v[0], &v[1], &v[2], &v[3], &reward) == 7 &&
             r <= b->a.rounds) {
    round_row *w = &b->rows[r];
    w->loss[m] = loss, w->reward[m] = reward;
    w->bytes[m] = v[0], w->wire[m] = v[1];
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
  double loss, reward;
  uint64_t v1, v2, v3;
  int resynced;
  if (sscanf(line, "url %u %63s", &u1, c->url) == 2)
    return;
  int k = sscanf(line, "auth %" SCNu64 " %" SCNu64 " %" SCNu64, &v1, &v2, &v3);
  if (k >= 2) {
    b->auth_accepted += v1;
    b->auth_refused += v2;
    if (k == 3)
      b->auth_bytes += v3;
    return;
  }
  if (sscanf(line,
             "round %u %" SCNu64 " %" SCNu64 " %u %u %" SCNu64 " %d %lf %lf",
             &r, &v1, &v2, &u1, &u2, &v3, &resynced, &loss, &reward) == 9 &&
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
      w->reward[PULSELOCO] = reward;
      w->contributors = u1, w->members = u2;
      b->pacer_rounds = r;
      measure_pair_drift(b, r);
    }
  } else if (strncmp(line, "exchange ", 9) == 0) {
    uint64_t x[9];
    double drift;
    if (sscanf(line + 9,
               "%u %" SCNu64 " %" SCNu64 " %lf %" SCNu64 " %" SCNu64 " %" SCNu64
               " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
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

void bench_loco_on_line(bench *b, child *c, char *line) {
  unsigned r;
  double v;
  if (c->replay && strncmp(line, "error ", 6) != 0) {
    uint64_t P;
    double d;
    if (sscanf(line, "bias %u %lf %lf", &r, &v, &d) == 3 && r >= 1 &&
        r <= b->a.rounds)
      b->rows[r].bias = v, b->rows[r].replay_drift = d,
      b->rows[r].have_bias = 1;
    else if (sscanf(line, "init %lf %lf %" SCNu64 " %lf", &v, &b->floor, &P,
                    &d) == 4)
      b->init_loss = v, b->P = P, b->init_reward = d;
    return;
  }
  if (strncmp(line, "error ", 6) == 0) {
    if (c->replay)
      fprintf(stderr, PROG ": PULSELoCo replay: %s\n", line + 6);
    else if (c->baseline)
      fprintf(stderr, PROG ": %s: %s\n",
              bench_loco_method[c->baseline - 1].name, line + 6);
    else
      fprintf(stderr, PROG ": trainer %u: %s\n", c->id, line + 6);
    b->failed = 1;
  } else if (c->baseline) {
    on_baseline_line(b, c, line);
  } else {
    on_trainer_line(b, c, line);
  }
}
