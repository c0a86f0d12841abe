/* collab_round.c - one round of a collaboration peer
 * (pulse_loco_collab.h, docs/protocols/loco-collaboration.md "Collaboration"):
 *
 *   accumulate  claim a step from the writer W(r, k), run it, again, until
 *               the writer says the round is full
 *   contribute  prepare the payload over the samples done (none: no
 *               payload), serve it at /v1/loco/round/r, say ready
 *   close       the writer waits for every member's readiness (a member
 *               late past round_timeout_ms is left out, and out of the next
 *               round), fetches and checks the payloads, publishes relays
 *               and the manifest; the others poll the manifest
 *   finish      every member fetches the listed payloads (from their
 *               senders, else from any member, each re-serving what it
 *               fetched) and finishes with exactly them, then says
 *               "finished"; a member without a payload imports the state
 *               of r + 1 from one that finished; a contributor without
 *               every listed payload says "failed" and settles: it
 *               imports the state of one that finished, or (nobody did)
 *               finishes r over those that said "failed" and itself
 *
 * A writer that refuses connections for claim_timeout_ms is dead: the
 * member moves to rank k + 1, tells that writer, and the round closes
 * there. A taken-over writer first looks for a manifest of r that some
 * member already got from the dead writer (each member re-serves the
 * manifest and payloads it used) and adopts it: nobody finishes round r
 * with another set than another member did.
 *
 * This file holds the round itself (pulse_loco_collab_round), accumulating
 * and the small helpers the other parts share (collab_impl.h). The close is
 * in collab_close.c; the finish in collab_fetch.c (the listed payloads,
 * all-to-all) and collab_finish.c (partitioned, outcomes and settling,
 * catching up). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "pulse_log.h"

#define MANIFESTS_KEPT 64u

uint64_t loco_collab_test_bandwidth_per_id;
uint32_t loco_collab_test_stall_id;
uint64_t loco_collab_test_stall_round;
int loco_collab_test_stall_phase;

/* The test hook (collab_impl.h) at `point` of round r: 1 the writer about
 * to publish its manifest, 2 the writer once it did, 3 a member about to
 * fetch the listed payloads, 4 a member about to say it is ready. */
static void test_stall(pulse_loco_collab *c, uint64_t r, int writer,
                       int point) {
  int phase = loco_collab_test_stall_phase;
  if (phase == 0 || c->id != loco_collab_test_stall_id ||
      r != loco_collab_test_stall_round)
    return;
  if (point == 1 && phase == 1 && writer) {
    /* Before the manifest is out: nobody gets the writer's payload. */
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64, r);
    loco_server_drop(c->srv, path, 0);
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r,
             c->id);
    loco_server_drop(c->srv, path, 0);
  } else if (point == 2 && (phase == 1 || phase == 2) && writer) {
    for (;;)
      loco_sleep_ms(1000);
  } else if (point == 3 && phase == 3) {
    loco_sleep_ms(1000);
  } else if (point == 4 && (phase == 5 || phase == 6) && !writer) {
    /* Past the writer's wait: left out of the round. */
    loco_sleep_ms(c->opts.round_timeout_ms + 2u * c->opts.claim_timeout_ms);
  }
}

/* A member URL that serves (a client-mode member's is hosted, or none):
 * only those own partitioned ranges. */
int collab_serves(const char *url) {
  return url[0] != '\0' && !loco_url_hosted(url, NULL, 0, NULL);
}

/* The download rate this peer reports (bytes/s; 0: not measured). */
uint64_t collab_reported_bandwidth(const pulse_loco_collab *c) {
  if (c->opts.equal_ranges)
    return 0;
  return loco_collab_test_bandwidth_per_id
             ? loco_collab_test_bandwidth_per_id * c->id
             : c->bandwidth;
}

/* A round's measure (loco_http_rate_take: its large transfers' bytes over
 * their body time) into the smoothed rate: an EWMA of weight 1/4, so one
 * noisy round moves it a quarter of the way. A round that moved less than
 * 4 large bodies' worth says nothing and leaves it. */
static void update_bandwidth(pulse_loco_collab *c) {
  uint64_t bytes, us;
  loco_http_rate_take(&bytes, &us);
  if (bytes < 4u * LOCO_RATE_MIN_BYTES || us == 0)
    return;
  uint64_t rate = bytes > UINT64_MAX / 1000000u ? bytes / us * 1000000u
                                                : bytes * 1000000u / us;
  c->bandwidth =
      c->bandwidth == 0 ? rate : c->bandwidth - c->bandwidth / 4 + rate / 4;
}

const char *collab_url_of(const pulse_loco_collab *c, uint32_t id) {
  int i = loco_member_find(c->members, c->nmembers, id);
  return i < 0 ? "" : c->members[i].url;
}

/* Members told this peer it writes round r at a higher rank than the one
 * this peer uses: move to that rank once more than half of the members
 * did (one member cut off from a live writer is a partition, not a dead
 * writer: this peer keeps it, and the member follows its manifest). Past
 * the last rank, every writer of the round is gone: an error. */
pulse_status collab_sync_rank(pulse_loco_collab *c, uint64_t r, uint32_t *k) {
  pthread_mutex_lock(&c->lock);
  if (c->table_open && c->table_round == r && c->table_k > *k &&
      collab_takeover_backed(c, r, c->table_k, c->rec, c->nrec, 0))
    *k = c->table_k;
  pthread_mutex_unlock(&c->lock);
  if (*k >= c->nmembers)
    return pulse_fail(PULSE_ERR_IO, "loco collab: round %" PRIu64
                      ": every writer is gone", r);
  return PULSE_OK;
}

/* One claim (or, with samples 0 and `ready`, a readiness) to W(r, k): a
 * COLLAB_* answer, 0 when the writer did not answer. */
unsigned collab_tell_writer(pulse_loco_collab *c, uint64_t r, uint32_t k,
                            int ready, uint64_t b, uint64_t done,
                            uint64_t rate_milli, int leaving) {
  uint32_t w = pulse_loco_collab_writer(c->members, c->nmembers, r, k);
  /* A message at rank k promises k (collab_commit.c). */
  collab_promise(c, r, k);
  if (w == c->id) {
    pthread_mutex_lock(&c->lock);
    collab_open_table(c, r, k);
    unsigned s = ready ? collab_ready_locked(c, r, k, c->id, done, leaving)
                       : collab_claim_locked(c, r, k, c->id, b, done,
                                             rate_milli);
    if (ready && s == 200)
      collab_bandwidth_locked(c, c->id, collab_reported_bandwidth(c));
    if (!ready)
      collab_publish_progress(c);
    pthread_mutex_unlock(&c->lock);
    return s;
  }
  char text[256], query[300], url[640];
  if (ready)
    snprintf(text, sizeof text,
             "/v1/collab/ready/%" PRIu64 "/%u/%" PRIu64 "/%d/%" PRIu64
             "?id=%u",
             r, k, done, leaving, collab_reported_bandwidth(c), c->id);
  else
    snprintf(text, sizeof text,
             "/v1/collab/claim/%" PRIu64 "/%u/%" PRIu64 "/%" PRIu64
             "/%" PRIu64 "?id=%u",
             r, k, b, done, rate_milli, c->id);
  /* Signed by this member, its answer by the writer (auth hooks). */
  uint64_t seq =
      collab_auth_query(c, PULSE_LOCO_AUTH_CLAIM, r, text, query, sizeof query);
  snprintf(url, sizeof url, "%s%s%s", collab_url_of(c, w), text, query);
  long status = 0;
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  loco_http_post_signed(url, c->opts.claim_timeout_ms, &status, &sig);
  if (status != 0 &&
      !collab_auth_grant_ok(c, r, w, text, seq, (unsigned)status, &sig))
    status = COLLAB_UNVERIFIED; /* as no decision: asked again */
  return (unsigned)status;
}

/* A round's outcome as the main thread sees it. */
typedef enum { GO_ON, FULL, BEHIND, NOT_MEMBER } claim_end;

/* Accumulates: claims and runs steps until the writer says full. */
static pulse_status accumulate(pulse_loco_collab *c, uint64_t r, uint32_t *k,
                               float *theta_r, uint64_t b,
                               pulse_loco_collab_step_fn step, void *user,
                               uint64_t *done, pulse_loco_collab_figures *info,
                               claim_end *how) {
  uint64_t dead_since = 0, waiting_since = 0;
  uint64_t limit = 2u * c->opts.claim_timeout_ms + 4u * c->opts.round_timeout_ms;
  for (;;) {
    PULSE_TRY(collab_sync_rank(c, r, k));
    uint64_t rate = info->busy_ms ? *done * 1000000u / info->busy_ms : 0;
    unsigned s = collab_tell_writer(c, r, *k, 0, b, *done, rate, 0);
    uint64_t now = loco_now_ms();
    if (s == COLLAB_GRANTED) {
      dead_since = waiting_since = 0;
      if (step(user, theta_r, b) != 0)
        return pulse_fail(PULSE_ERR_INTERNAL,
                          "loco collab: the local step failed");
      uint64_t t = loco_now_ms();
      info->busy_ms += t - now;
      *done += b;
      info->steps++;
      continue;
    }
    if (s == COLLAB_FULL)
      return *how = FULL, PULSE_OK;
    if (s == COLLAB_PAST)
      return *how = BEHIND, PULSE_OK;
    if (s == COLLAB_NOT_MEMBER)
      return *how = NOT_MEMBER, PULSE_OK;
    if (s == 0 || s >= 500u) {
      if (s == 0 && dead_since == 0)
        dead_since = now;
      if (s == 0 && now - dead_since >= c->opts.claim_timeout_ms) {
        PULSE_LOG_AT(PULSE_LOG_WARN,
                     "loco collab round %" PRIu64 ": writer %u is gone", r,
                     pulse_loco_collab_writer(c->members, c->nmembers, r, *k));
        (*k)++;
        dead_since = 0;
        continue;
      }
    }
    if (waiting_since == 0)
      waiting_since = now;
    if (now - waiting_since > limit)
      return pulse_fail(PULSE_ERR_IO,
                        "loco collab: round %" PRIu64 ": writer answers %u",
                        r, s);
    loco_sleep_ms(s == 0 ? 5 : 1);
  }
}

static void ack_round(pulse_loco_collab *c, const char *src, uint64_t r) {
  if (strcmp(src, c->url) == 0)
    return;
  char text[96], query[300], url[480];
  long status;
  snprintf(text, sizeof text, "/v1/loco/round/%" PRIu64 "/done?id=%u", r,
           c->id);
  collab_auth_query(c, PULSE_LOCO_AUTH_DONE, r, text, query, sizeof query);
  snprintf(url, sizeof url, "%s%s%s", src, text, query);
  loco_http_post(url, c->opts.claim_timeout_ms, &status);
}

/* A leaving writer stays until the next round's members acknowledged. */
static void linger(pulse_loco_collab *c, uint64_t r, const loco_manifest *man) {
  uint64_t end = loco_now_ms() + c->opts.round_timeout_ms;
  while (loco_now_ms() < end) {
    size_t have = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < man->nmembers; i++) {
      int seen = man->members[i].id == c->id;
      for (size_t a = 0; a < c->nacks && !seen; a++)
        seen = c->acks[a].round == r && c->acks[a].id == man->members[i].id;
      have += seen;
    }
    pthread_mutex_unlock(&c->lock);
    if (have == man->nmembers)
      return;
    loco_sleep_ms(2);
  }
}

/* One round's state, passed between the parts of pulse_loco_collab_round. */
typedef struct {
  pulse_loco_collab *c;
  uint64_t r;
  float *theta_r;
  pulse_loco_collab_figures *info;
  uint64_t t0, served0; /* the round's start: its wall time, bytes served */
  uint64_t auth0;       /* and the signature bytes received */
  uint32_t k;           /* the writer's rank */
  uint64_t done;        /* samples accumulated */
  int leaving;
  uint8_t *own; /* this peer's payload (a copy), NULL when none */
  size_t size;
  loco_manifest man;
  pulse_bytebuf man_raw; /* its bytes as they came, with its writer's */
  loco_sig man_sig;      /* signature (empty: this peer wrote it) */
  char src[64]; /* the manifest's source */
  /* The finish: the listed payloads (man's order), whether this peer is
   * listed, settled a failed exchange, served the state of r + 1. */
  size_t C;
  loco_fetch *t;
  char (*urls)[160];
  pulse_loco_contribution *set;
  int listed, settled, state_served;
  uint64_t ex_end;
} round_state;

/* Whether a serving member answers at base (its view, within a claim
 * timeout). */
static int seed_answers(const pulse_loco_collab *c, const char *base) {
  char url[160];
  snprintf(url, sizeof url, "%s/v1/loco/members", base);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  loco_http_get(url, c->opts.claim_timeout_ms,
                (size_t)LOCO_MAX_MEMBERS * 256u + 4096u, &b, &status);
  pulse_bytebuf_free(&b);
  return status == 200;
}

/* The seed of a rejoin into buf: rejoin_url when it answers, else the
 * first serving member of the last view this peer had that answers (the
 * writer or source that dropped it may have died since, as a finisher
 * killed right after its word does), else rejoin_url all the same. A
 * client rejoins through its host (moving to another is its own path). */
static const char *rejoin_seed(const pulse_loco_collab *c, char *buf,
                               size_t cap) {
  snprintf(buf, cap, "%s", c->rejoin_url);
  if (c->host_url[0] != '\0' || seed_answers(c, c->rejoin_url))
    return buf;
  for (size_t i = 0; i < c->nmembers; i++) {
    const char *u = c->members[i].url;
    if (c->members[i].id != c->id && strcmp(u, c->rejoin_url) != 0 &&
        !loco_url_hosted(u, NULL, 0, NULL) && seed_answers(c, u)) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab: %s does not answer; joining again through "
                   "%s",
                   c->rejoin_url, u);
      snprintf(buf, cap, "%s", u);
      break;
    }
  }
  return buf;
}

/* Not a member of round r (its writer said so): dropped, rejoining through
 * that writer. */
static void mark_dropped(round_state *s) {
  pulse_loco_collab *c = s->c;
  c->dropped = 1;
  snprintf(c->rejoin_url, sizeof c->rejoin_url, "%s",
           collab_url_of(
               c, pulse_loco_collab_writer(c->members, c->nmembers, s->r, s->k)));
  s->info->dropped = 1;
}

/* The payload over the samples done, copied into s->own. */
static pulse_status prepare_own(round_state *s) {
  pulse_loco_collab *c = s->c;
  const uint8_t *payload = NULL;
  pulse_loco_prepare_figures pi;
  PULSE_TRY(pulse_loco_prepare(c->ctx, s->theta_r, s->done,
                               s->leaving ? PULSE_LOCO_LEAVING : 0, &payload,
                               &s->size, &pi));
  s->own = malloc(s->size);
  if (s->own == NULL) {
    pulse_loco_abandon(c->ctx, 0);
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: payload copy");
  }
  memcpy(s->own, payload, s->size);
  s->info->payload_bytes = s->size;
  s->info->sent = pi.sent;
  return PULSE_OK;
}

/* Serves the own payload at /v1/loco/round/r (client mode: pushes it to
 * the host too). */
static pulse_status serve_own(round_state *s) {
  pulse_loco_collab *c = s->c;
  char path[64];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64, s->r);
  /* Signed (auth hook): the writer checks it before it lists it. */
  pulse_status st =
      collab_auth_put(c, path, PULSE_LOCO_AUTH_PAYLOAD, s->r, s->own, s->size);
  if (st == PULSE_OK && c->host_url[0] != '\0') /* client mode */
    st = collab_client_push(c, s->r, s->own, s->size);
  return st;
}

/* The close (st: the contribution's status): the manifest of round r into
 * s->man, checked to list only members and payloads within the cap. */
static pulse_status close_round(round_state *s, pulse_status st) {
  pulse_loco_collab *c = s->c;
  pulse_loco_collab_figures *info = s->info;
  if (st == PULSE_OK)
    st = collab_get_manifest(c, s->r, &s->k, s->own, s->size,
                             s->own ? s->done : 0, s->leaving, &s->man, s->src,
                             sizeof s->src, &s->man_raw, &s->man_sig, info);
  info->takeovers = s->k;
  if (st == PULSE_OK) {
    const loco_manifest *man = &s->man;
    info->writer = man->coordinator;
    for (size_t j = 0; j < man->ncontrib && st == PULSE_OK; j++)
      if (loco_member_find(c->members, c->nmembers, man->contrib[j].id) < 0 ||
          man->contrib[j].bytes > loco_payload_cap(c->ctx->n))
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "loco collab: manifest of round %" PRIu64
                        " lists a non-member or an oversized payload",
                        s->r);
  }
  return st;
}

/* Re-serve the manifest at once: a writer taking over if the source dies
 * adopts it from here. The bytes and the writer's signature as they came;
 * this peer's own, signed by it (auth hook). */
static pulse_status serve_manifest(round_state *s) {
  pulse_loco_collab *c = s->c;
  pulse_bytebuf mb = PULSE_BYTEBUF_INIT;
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/manifest", s->r);
  pulse_status st = PULSE_OK;
  if (s->man_raw.size == 0)
    st = loco_manifest_write(&s->man, &mb);
  int writer = s->man.coordinator == c->id && strcmp(s->src, c->url) == 0;
  test_stall(c, s->r, writer, 1);
  if (st == PULSE_OK && s->man_raw.size > 0)
    st = loco_server_put_signed(c->srv, path, s->man_raw.data,
                                s->man_raw.size, &s->man_sig);
  else if (st == PULSE_OK)
    st = collab_auth_put(c, path, PULSE_LOCO_AUTH_MANIFEST, s->r, mb.data,
                         mb.size);
  pulse_bytebuf_free(&mb);
  test_stall(c, s->r, writer, 2);
  return st;
}

/* The partitioned finish; *over when it ended the round (else a failed
 * exchange was settled: the round goes on all-to-all). */
static pulse_status finish_partitioned(round_state *s, int *over) {
  pulse_loco_collab *c = s->c;
  pulse_loco_collab_figures *info = s->info;
  pulse_status st;
  *over = 1;
  if (s->own == NULL || !s->listed) {
    /* No payload of its own in the round: the state of r + 1 from a
     * contributor, without fetching their payloads. */
    if (c->ctx->prepared)
      pulse_loco_abandon(c->ctx, 0);
    st = collab_catch_up_or_rejoin(c, s->r, s->src, &s->man, s->theta_r, info);
    info->contributors = (uint32_t)s->C;
    for (size_t j = 0; j < s->C; j++)
      info->samples += s->man.contrib[j].samples;
    return st;
  }
  int self_dropped = 0, imported = 0;
  if (collab_reduce_partitioned(c, s->r, s->src, &s->man, s->own, s->size,
                                s->theta_r, info,
                                &self_dropped) == PULSE_OK) {
    st = collab_publish_outcome(c, s->r, 1);
    s->state_served = st == PULSE_OK;
    return st;
  }
  /* Failed (a peer's blob never came: killed mid-exchange, or an
   * offender): a contributor that finished wins, else the round is
   * finished all-to-all by those that answered. */
  st = collab_settle_failed(c, s->r, s->src, &s->man, s->t, !self_dropped,
                            s->done, s->ex_end + 2u * c->opts.claim_timeout_ms,
                            s->theta_r, info, &imported);
  if (st != PULSE_OK || imported)
    return st;
  s->settled = 1;
  s->ex_end = loco_now_ms() + collab_exchange_ms(c);
  *over = 0;
  return PULSE_OK;
}

/* The all-to-all finish: the listed payloads, from their senders and
 * relays; settles when one never came. */
static pulse_status finish_all_to_all(round_state *s) {
  pulse_loco_collab *c = s->c;
  pulse_status st = PULSE_OK;
  if (s->own != NULL && s->listed) {
    /* Its own payload as a relay at once, as every payload it fetches. */
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", s->r,
             c->id);
    st = collab_auth_put(c, path, PULSE_LOCO_AUTH_PAYLOAD, s->r, s->own,
                         s->size);
  }
  if (st == PULSE_OK)
    test_stall(c, s->r, 0, 3);
  /* Nothing of its own in the round and no member of the next: it joins
   * again (collab_catch_up_or_rejoin), the listed payloads are no use. */
  if (st == PULSE_OK && (s->own == NULL || !s->listed) &&
      loco_member_find(s->man.members, s->man.nmembers, c->id) < 0)
    return collab_import_finished(c, s->r, s->src, &s->man, s->t, s->theta_r,
                                  s->info);
  while (st == PULSE_OK) {
    int complete = 0, imported = 0;
    st = collab_finish_listed(c, s->r, s->src, &s->man, s->t, s->urls, s->set,
                              s->own, s->size, s->done, s->ex_end, s->theta_r,
                              s->info, &complete);
    if (st != PULSE_OK)
      break;
    if (complete) {
      if (!s->settled) {
        st = collab_publish_outcome(c, s->r, 1);
        s->state_served = st == PULSE_OK;
      }
      break;
    }
    if (s->settled || s->own == NULL || !s->listed) {
      st = collab_import_finished(c, s->r, s->src, &s->man, s->t, s->theta_r,
                                  s->info);
      break;
    }
    /* A listed payload never came, from its sender or any relay (its
     * sender died before anyone fetched it): as a failed partitioned
     * exchange, a contributor that finished wins, else the round is
     * finished all-to-all by those that said "failed". */
    st = collab_settle_failed(c, s->r, s->src, &s->man, s->t, 1, s->done,
                              s->ex_end + 2u * c->opts.claim_timeout_ms,
                              s->theta_r, s->info, &imported);
    if (imported)
      break;
    s->settled = 1;
    s->ex_end = loco_now_ms() + collab_exchange_ms(c);
  }
  return st;
}

/* The finish of round r over the manifest (st: the manifest's serving):
 * partitioned, else (or after a failed exchange) all-to-all. */
static pulse_status finish_round(round_state *s, pulse_status st) {
  pulse_loco_collab *c = s->c;
  s->C = s->man.ncontrib;
  for (size_t j = 0; j < s->C; j++)
    s->listed |= s->man.contrib[j].id == c->id;
  s->t = calloc(s->C, sizeof *s->t);
  s->urls = calloc(s->C, sizeof *s->urls);
  s->set = calloc(s->C, sizeof *s->set);
  if (st == PULSE_OK && (!s->t || !s->urls || !s->set))
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, s->r);
  s->ex_end = loco_now_ms() + collab_exchange_ms(c);
  int over = 0;
  if (st == PULSE_OK && c->opts.partitioned)
    st = finish_partitioned(s, &over);
  if (st == PULSE_OK && !over)
    st = finish_all_to_all(s);
  for (size_t j = 0; s->t && j < s->C; j++)
    pulse_bytebuf_free(&s->t[j].body);
  free(s->t), free(s->urls), free(s->set);
  return st;
}

/* Partitioned: a contributor that left still serves blobs the others
 * fetch (its reduced range, its verdict) until every member of r + 1
 * says it finished r; those acknowledgements go to it as to the source.
 * Their URLs into gone (at most cap). */
static size_t gone_contributors(const round_state *s, char (*gone)[64],
                                size_t cap) {
  const pulse_loco_collab *c = s->c;
  const loco_manifest *man = &s->man;
  size_t ngone = 0;
  for (size_t j = 0; s->info->partitioned && j < man->ncontrib; j++) {
    uint32_t id = man->contrib[j].id;
    const char *u = collab_url_of(c, id);
    if (id != c->id && u[0] != '\0' && strcmp(u, s->src) != 0 &&
        loco_member_find(man->members, man->nmembers, id) < 0 && ngone < cap)
      snprintf(gone[ngone++], sizeof gone[0], "%s", u);
  }
  return ngone;
}

/* A finished round: the next round's members, lingering when leaving, the
 * state and view served, the round acknowledged. */
static pulse_status end_round(round_state *s) {
  pulse_loco_collab *c = s->c;
  pulse_loco_collab_figures *info = s->info;
  const loco_manifest *man = &s->man;
  pulse_status st = PULSE_OK;
  info->left = s->leaving && info->self_included;
  char gone[LOCO_MAX_MEMBERS > 64 ? 64 : LOCO_MAX_MEMBERS][64];
  size_t ngone = gone_contributors(s, gone, sizeof gone / sizeof gone[0]);
  collab_set_members(c, man->members, man->nmembers);
  if (info->left && (strcmp(s->src, c->url) == 0 || info->partitioned))
    linger(c, s->r, man);
  if (!info->left && loco_member_find(man->members, man->nmembers, c->id) < 0) {
    c->dropped = 1;
    snprintf(c->rejoin_url, sizeof c->rejoin_url, "%s", s->src);
    info->dropped = 1;
  }
  if (!s->state_served) /* collab_publish_outcome served it already */
    st = collab_publish_state(c);
  if (st == PULSE_OK)
    st = collab_publish_view(c);
  ack_round(c, s->src, s->r);
  for (size_t g = 0; g < ngone; g++)
    ack_round(c, gone[g], s->r);
  return st;
}

/* The round's last part, however it ended but on an error: drops old
 * blobs, fills info's totals. */
static pulse_status round_tail(round_state *s, pulse_status st) {
  pulse_loco_collab *c = s->c;
  pulse_loco_collab_figures *info = s->info;
  uint64_t r = s->r;
  /* Payloads and relays of the last two rounds, manifests of more. */
  loco_server_drop_except(c->srv, "/v1/loco/round/", r > 0 ? r - 1 : 0,
                          "/manifest");
  if (r > MANIFESTS_KEPT)
    loco_server_drop(c->srv, "/v1/loco/round/", r - MANIFESTS_KEPT);
  info->bytes_in = c->fetched;
  info->bytes_out = loco_server_bytes_served(c->srv) - s->served0 + c->pushed;
  info->auth_bytes = c->auth_bytes - s->auth0;
  update_bandwidth(c);
  info->wall_ms = loco_now_ms() - s->t0;
  if (info->max_step == 0) {
    pthread_mutex_lock(&c->lock);
    if (c->table_round == r)
      info->max_step = c->max_step;
    pthread_mutex_unlock(&c->lock);
  }
  return st;
}

pulse_status pulse_loco_collab_round(pulse_loco_collab *c, float *theta_r,
                                     uint64_t b,
                                     pulse_loco_collab_step_fn step,
                                     void *user, uint32_t flags,
                                     pulse_loco_collab_figures *info) {
  if (c == NULL || theta_r == NULL || step == NULL || b == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco collab round: bad argument");
  pulse_loco_collab_figures local;
  if (info == NULL)
    info = &local;
  memset(info, 0, sizeof *info);
  uint64_t t0 = loco_now_ms();
  uint64_t served0 = loco_server_bytes_served(c->srv);
  uint64_t auth0 = c->auth_bytes;
  c->fetched = 0;
  c->pushed = 0;
  uint64_t r = pulse_loco_round(c->ctx);
  info->round = r;
  if (c->dropped) {
    /* Test hook (phase 5, collab_impl.h): time for a test to kill the
     * member this peer would rejoin through. */
    if (loco_collab_test_stall_phase == 5 && c->id == loco_collab_test_stall_id)
      loco_sleep_ms(2000);
    char seed[sizeof c->rejoin_url];
    pulse_status st = pulse_loco_collab_join(
        c, rejoin_seed(c, seed, sizeof seed), theta_r,
        4u * c->opts.round_timeout_ms + 4u * c->opts.claim_timeout_ms);
    info->dropped = st != PULSE_OK;
    info->resynced = st == PULSE_OK;
    info->bytes_in = c->fetched;
    info->auth_bytes = c->auth_bytes - auth0;
    info->wall_ms = loco_now_ms() - t0;
    return st;
  }
  if (loco_member_find(c->members, c->nmembers, c->id) < 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: not a member (start or join first)");
  info->members = (uint32_t)c->nmembers;
  round_state s;
  memset(&s, 0, sizeof s);
  s.c = c, s.r = r, s.theta_r = theta_r, s.info = info;
  s.t0 = t0, s.served0 = served0, s.auth0 = auth0;
  if (pulse_loco_collab_writer(c->members, c->nmembers, r, 0) == c->id) {
    pthread_mutex_lock(&c->lock);
    collab_open_table(c, r, 0);
    pthread_mutex_unlock(&c->lock);
  }
  claim_end how = GO_ON;
  pulse_status st =
      accumulate(c, r, &s.k, theta_r, b, step, user, &s.done, info, &how);
  if (st != PULSE_OK)
    return st;
  collab_publish_own_progress(c, r, s.done, info->busy_ms);
  if (how == NOT_MEMBER) {
    mark_dropped(&s);
    return round_tail(&s, st);
  }
  s.leaving = (flags & PULSE_LOCO_LEAVING) && s.done > 0;
  if (how == FULL && s.done > 0) {
    PULSE_TRY(prepare_own(&s));
    st = serve_own(&s);
  }
  test_stall(c, r, pulse_loco_collab_writer(c->members, c->nmembers, r, 0) ==
                      c->id,
             4);
  st = close_round(&s, st);
  if (st != PULSE_OK) {
    if (c->ctx->prepared)
      pulse_loco_abandon(c->ctx, 0); /* keep rule: all of s stays in e */
    free(s.own);
    loco_manifest_free(&s.man);
    pulse_bytebuf_free(&s.man_raw);
    return st;
  }
  st = serve_manifest(&s);
  st = finish_round(&s, st);
  free(s.own);
  if (c->ctx->prepared)
    pulse_loco_abandon(c->ctx, 0);
  if (st != PULSE_OK) {
    loco_manifest_free(&s.man);
    pulse_bytebuf_free(&s.man_raw);
    return st;
  }
  st = end_round(&s);
  loco_manifest_free(&s.man);
  pulse_bytebuf_free(&s.man_raw);
  return round_tail(&s, st);
}
