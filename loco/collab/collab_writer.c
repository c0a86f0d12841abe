/* collab_writer.c - the writer's side of a collaboration round
 * (pulse_loco_collab.h, docs/protocols/loco-collaboration.md "Collaboration"): the table of claims
 * and readiness it keeps for its round, and the POST routes every peer
 * serves (claims, readiness, joins, acknowledgements). All of it runs on
 * the server thread under the peer's lock; the main thread opens the table
 * and reads it under the same lock.
 *
 * The stop rule: a claim of b samples is granted only while the samples
 * granted in the round are below T, and a granted claim adds b at once. So
 * the grants end at a total G with G - b < T <= G for the last grant's b:
 * T <= G < T + max b, whatever the order the claims arrive in. A payload
 * must then carry exactly what its sender was granted (a progress record
 * can lie, the payload's count is what is averaged, and a mismatch drops
 * the sender), so the realized batch of a round whose granted peers all
 * deliver is G. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "collab_impl.h"

uint32_t pulse_loco_collab_writer(const pulse_loco_member *m, size_t count,
                                  uint64_t round, uint32_t k) {
  /* Client-mode members (hosted URLs) cannot take claims: the rule runs
   * over the serving members only. */
  size_t serving = 0;
  for (size_t i = 0; m != NULL && i < count; i++)
    serving += !loco_url_hosted(m[i].url, NULL, 0, NULL);
  if (serving == 0)
    return UINT32_MAX;
  size_t want = (size_t)((round + k) % serving);
  for (size_t i = 0;; i++)
    if (!loco_url_hosted(m[i].url, NULL, 0, NULL) && want-- == 0)
      return m[i].id;
}

void collab_open_table(pulse_loco_collab *c, uint64_t r, uint32_t k) {
  if (c->table_open && c->table_round == r && c->table_k >= k)
    return;
  int same_round = c->table_open && c->table_round == r;
  c->table_open = 1;
  c->table_round = r;
  c->table_k = k;
  c->closed = 0;
  if (same_round)
    return; /* a higher rank for the same round: keep what is known */
  c->nrec = c->nmembers;
  for (size_t i = 0; i < c->nmembers; i++) {
    memset(&c->rec[i], 0, sizeof c->rec[i]);
    c->rec[i].id = c->members[i].id;
  }
  c->total = 0;
  c->max_step = 0;
}

static collab_record *record_of(pulse_loco_collab *c, uint32_t id) {
  for (size_t i = 0; i < c->nrec; i++)
    if (c->rec[i].id == id)
      return &c->rec[i];
  return NULL;
}

/* A member's first word to this table: what it did before (under a writer
 * that died; 0 at rank 0) counts as granted, so a taken-over round goes on
 * to T from where it was (its total may pass T + the largest step: the
 * samples of members not heard from yet are counted when they are). */
static void first_contact(pulse_loco_collab *c, collab_record *x,
                          uint64_t done) {
  if (x->contacted)
    return;
  x->contacted = 1;
  x->granted = done;
  c->total += done;
}

/* Routes a message of round r at rank k to this writer's table. */
static unsigned route(pulse_loco_collab *c, uint64_t r, uint32_t k) {
  if (r < c->cur_round)
    return COLLAB_PAST;
  if (r > c->cur_round)
    return COLLAB_NOT_YET;
  if (pulse_loco_collab_writer(c->members, c->nmembers, r, k) != c->id)
    return COLLAB_NOT_WRITER;
  /* Rank 0: the main thread opens the table when its round starts. A
   * higher rank is a takeover that a member saw before this peer did. */
  if (k > 0)
    collab_open_table(c, r, k);
  if (!c->table_open || c->table_round != r)
    return COLLAB_NOT_YET;
  return 0;
}

/* Member id's record at W(r, k)'s table into *x: 0, or the answer when
 * this peer is not that writer or id is not a member. */
static unsigned table_record(pulse_loco_collab *c, uint64_t r, uint32_t k,
                             uint32_t id, collab_record **x) {
  unsigned s = route(c, r, k);
  if (s != 0)
    return s;
  *x = record_of(c, id);
  return *x == NULL ? COLLAB_NOT_MEMBER : 0;
}

unsigned collab_claim_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                             uint32_t id, uint64_t b, uint64_t done,
                             uint64_t rate_milli) {
  collab_record *x;
  unsigned s = table_record(c, r, k, id, &x);
  if (s != 0)
    return s;
  first_contact(c, x, done);
  x->done = done;
  x->rate_milli = rate_milli;
  if (x->ready || c->closed || c->total >= c->opts.target_batch || b == 0)
    return COLLAB_FULL;
  c->total += b;
  x->granted += b;
  if (b > c->max_step)
    c->max_step = b;
  return COLLAB_GRANTED;
}

unsigned collab_ready_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                             uint32_t id, uint64_t samples, int leaving) {
  collab_record *x;
  unsigned s = table_record(c, r, k, id, &x);
  if (s != 0)
    return s;
  first_contact(c, x, samples);
  x->ready = 1;
  x->ready_samples = samples;
  x->leaving = leaving;
  return 200;
}

unsigned collab_accept_locked(pulse_loco_collab *c, uint64_t r, uint32_t k,
                              uint32_t id) {
  collab_record *x;
  unsigned s = table_record(c, r, k, id, &x);
  if (s != 0)
    return s;
  x->accepted_k1 = k + 1u;
  return 200;
}

void collab_bandwidth_locked(pulse_loco_collab *c, uint32_t id, uint64_t bw) {
  collab_record *x = record_of(c, id);
  if (x != NULL)
    x->bandwidth = bw;
}

void collab_publish_progress(pulse_loco_collab *c) {
  /* Expected time to T from the rates the members reported. */
  uint64_t rate = 0;
  for (size_t i = 0; i < c->nrec; i++)
    rate += c->rec[i].rate_milli;
  uint64_t left =
      c->total >= c->opts.target_batch ? 0 : c->opts.target_batch - c->total;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_printf(&b,
                       "{\"round\":%" PRIu64 ",\"writer\":%u,\"target\":%" PRIu64
                       ",\"granted\":%" PRIu64 ",\"eta_ms\":%" PRIu64
                       ",\"peers\":[",
                       c->table_round, c->id, c->opts.target_batch, c->total,
                       rate ? left * 1000000u / rate : 0);
  for (size_t i = 0; i < c->nrec; i++)
    pulse_bytebuf_printf(&b,
                         "%s{\"id\":%u,\"samples\":%" PRIu64
                         ",\"granted\":%" PRIu64 ",\"samples_per_s\":%.3f"
                         ",\"bytes_per_s\":%" PRIu64 ",\"ready\":%s}",
                         i ? "," : "", c->rec[i].id, c->rec[i].done,
                         c->rec[i].granted, c->rec[i].rate_milli / 1000.0,
                         c->rec[i].bandwidth,
                         c->rec[i].ready ? "true" : "false");
  pulse_bytebuf_printf(&b, "]}");
  if (b.data != NULL)
    collab_auth_put_locked(c, "/v1/loco/progress/round",
                           PULSE_LOCO_AUTH_PROGRESS, c->table_round, b.data,
                           b.size); /* signed (auth hook) */
  pulse_bytebuf_free(&b);
}

/* Reads n numbers separated by '/' after prefix (loco_take_decimal's
 * rule, up to 19 digits each), the last one ending the path. */
static int path_numbers(const char *path, const char *prefix, uint64_t *v,
                        int n) {
  size_t k = strlen(prefix);
  if (strncmp(path, prefix, k) != 0)
    return 0;
  const char *p = path + k;
  for (int i = 0; i < n; i++)
    if (!loco_take_decimal(&p, 19, i + 1 < n ? '/' : '\0', &v[i]))
      return 0;
  return 1;
}

unsigned collab_on_post(void *user, const char *path, const char *id_text,
                        const char *url, char *reply, size_t cap) {
  pulse_loco_collab *c = user;
  uint32_t id;
  if (!loco_parse_id(id_text, &id)) {
    snprintf(reply, cap, "{\"error\":\"id missing or malformed\"}");
    return 400;
  }
  uint64_t v[5];
  unsigned status = 404;
  pthread_mutex_lock(&c->lock);
  if (path_numbers(path, "/v1/collab/claim/", v, 5)) {
    /* ROUND/RANK/SAMPLES/DONE/RATE_MILLI */
    status = v[1] > UINT32_MAX ? 400u
                               : collab_claim_locked(c, v[0], (uint32_t)v[1],
                                                     id, v[2], v[3], v[4]);
    if (status == COLLAB_GRANTED || status == COLLAB_FULL)
      collab_publish_progress(c);
  } else if (path_numbers(path, "/v1/collab/ready/", v, 5) ||
             (v[4] = 0, path_numbers(path, "/v1/collab/ready/", v, 4))) {
    /* ROUND/RANK/SAMPLES/LEAVING[/BYTES_PER_S]: the sender's download rate
     * (0 or absent: not measured), listed in the manifest. */
    status = v[1] > UINT32_MAX || v[3] > 1
                 ? 400u
                 : collab_ready_locked(c, v[0], (uint32_t)v[1], id, v[2],
                                       (int)v[3]);
    if (status == 200)
      collab_bandwidth_locked(c, id, v[4]);
  } else if (path_numbers(path, "/v1/collab/accept/", v, 2)) {
    /* ROUND/RANK: the sender accepted this writer's proposal. */
    status = v[1] > UINT32_MAX
                 ? 400u
                 : collab_accept_locked(c, v[0], (uint32_t)v[1], id);
  } else if (strcmp(path, "/v1/loco/join") == 0) {
    if (url == NULL || !loco_member_url_valid(url, id) || strlen(url) >= 64) {
      status = 400;
    } else {
      size_t i = 0;
      while (i < c->npending && c->pending[i].id != id)
        i++;
      if (i < LOCO_MAX_MEMBERS) {
        c->pending[i].id = id;
        snprintf(c->pending[i].url, sizeof c->pending[i].url, "%s", url);
        c->npending += i == c->npending;
        status = 202;
      } else {
        status = 503;
      }
    }
  } else if (path_numbers(path, "/v1/loco/round/", v, 1) == 0 &&
             strncmp(path, "/v1/loco/round/", 15) == 0) {
    char *end;
    unsigned long long r = strtoull(path + 15, &end, 10);
    if (end != path + 15 && strcmp(end, "/done") == 0) {
      size_t cap_acks = sizeof c->acks / sizeof c->acks[0];
      if (c->nacks == cap_acks)
        c->nacks = 0; /* only the latest rounds matter */
      c->acks[c->nacks].round = r;
      c->acks[c->nacks].id = id;
      c->nacks++;
      status = 200;
    }
  }
  pthread_mutex_unlock(&c->lock);
  static const struct {
    unsigned status;
    const char *text;
  } said[] = {
      {200, "{\"granted\":true}"},
      {202, "{\"granted\":false}"},
      {400, "{\"error\":\"malformed request\"}"},
      {403, "{\"error\":\"not a member of that round\"}"},
      {404, "{\"error\":\"no such endpoint\"}"},
      {409, "{\"error\":\"that round is over here\"}"},
      {421, "{\"error\":\"not that round's writer at that rank\"}"},
      {503, "{\"error\":\"not at that round yet\"}"},
  };
  for (size_t i = 0; i < sizeof said / sizeof said[0]; i++)
    if (said[i].status == status)
      snprintf(reply, cap, "%s", said[i].text);
  return status;
}
