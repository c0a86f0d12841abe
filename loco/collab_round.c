/* collab_round.c - one round of a collaboration peer
 * (pulse_loco_collab.h, PAYLOAD.md "Collaboration"):
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
 * with another set than another member did. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "partition_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)
#define MANIFESTS_KEPT 64u

uint64_t loco_collab_test_bandwidth_per_id;
uint32_t loco_collab_test_stall_id;
uint64_t loco_collab_test_stall_round;
int loco_collab_test_stall_phase;

/* The test hook (collab_impl.h) at `point` of round r: 1 the writer about
 * to publish its manifest, 2 the writer once it did, 3 a member about to
 * fetch the listed payloads. */
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
  }
}

/* A member URL that serves (a client-mode member's is hosted, or none):
 * only those own partitioned ranges. */
static int serves(const char *url) {
  return url[0] != '\0' && !loco_url_hosted(url, NULL, 0, NULL);
}

/* The download rate this peer reports (bytes/s; 0: not measured). */
static uint64_t reported_bandwidth(const pulse_loco_collab *c) {
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

static const char *url_of(const pulse_loco_collab *c, uint32_t id) {
  int i = loco_member_find(c->members, c->nmembers, id);
  return i < 0 ? "" : c->members[i].url;
}

/* The writers of ranks below k are dead for this round. */
static int dead_writer(const pulse_loco_collab *c, uint64_t r, uint32_t k,
                       uint32_t id) {
  for (uint32_t j = 0; j < k && j < c->nmembers; j++)
    if (pulse_loco_collab_writer(c->members, c->nmembers, r, j) == id)
      return 1;
  return 0;
}

/* A member told this peer it writes round r at a higher rank than the one
 * this peer uses: move to that rank. */
static void sync_rank(pulse_loco_collab *c, uint64_t r, uint32_t *k) {
  pthread_mutex_lock(&c->lock);
  if (c->table_open && c->table_round == r && c->table_k > *k)
    *k = c->table_k;
  pthread_mutex_unlock(&c->lock);
}

/* One claim (or, with samples 0 and `ready`, a readiness) to W(r, k): a
 * COLLAB_* answer, 0 when the writer did not answer. */
static unsigned tell_writer(pulse_loco_collab *c, uint64_t r, uint32_t k,
                            int ready, uint64_t b, uint64_t done,
                            uint64_t rate_milli, int leaving) {
  uint32_t w = pulse_loco_collab_writer(c->members, c->nmembers, r, k);
  if (w == c->id) {
    pthread_mutex_lock(&c->lock);
    collab_open_table(c, r, k);
    unsigned s = ready ? collab_ready_locked(c, r, k, c->id, done, leaving)
                       : collab_claim_locked(c, r, k, c->id, b, done,
                                             rate_milli);
    if (ready && s == 200)
      collab_bandwidth_locked(c, c->id, reported_bandwidth(c));
    if (!ready)
      collab_publish_progress(c);
    pthread_mutex_unlock(&c->lock);
    return s;
  }
  char url[256];
  if (ready)
    snprintf(url, sizeof url,
             "%s/v1/collab/ready/%" PRIu64 "/%u/%" PRIu64 "/%d/%" PRIu64
             "?id=%u",
             url_of(c, w), r, k, done, leaving, reported_bandwidth(c), c->id);
  else
    snprintf(url, sizeof url,
             "%s/v1/collab/claim/%" PRIu64 "/%u/%" PRIu64 "/%" PRIu64
             "/%" PRIu64 "?id=%u",
             url_of(c, w), r, k, b, done, rate_milli, c->id);
  long status = 0;
  loco_http_post(url, c->opts.claim_timeout_ms, &status);
  return (unsigned)status;
}

/* A round's outcome as the main thread sees it. */
typedef enum { GO_ON, FULL, BEHIND, NOT_MEMBER } claim_end;

/* Accumulates: claims and runs steps until the writer says full. */
static pulse_status accumulate(pulse_loco_collab *c, uint64_t r, uint32_t *k,
                               float *theta_r, uint64_t b,
                               pulse_loco_collab_step_fn step, void *user,
                               uint64_t *done, pulse_loco_collab_info *info,
                               claim_end *how) {
  uint64_t dead_since = 0, waiting_since = 0;
  uint64_t limit = 2u * c->opts.claim_timeout_ms + 4u * c->opts.round_timeout_ms;
  for (;;) {
    sync_rank(c, r, k);
    if (*k >= c->nmembers)
      return pulse_fail(PULSE_ERR_IO, "loco collab: round %" PRIu64
                        ": every writer is gone", r);
    uint64_t rate = info->busy_ms ? *done * 1000000u / info->busy_ms : 0;
    unsigned s = tell_writer(c, r, *k, 0, b, *done, rate, 0);
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

/* ------------------------------------------------------------- the writer */

/* Copies what a manifest names into m (owned arrays). */
static pulse_status make_manifest(uint64_t r, uint32_t writer,
                                  const loco_contrib_ref *refs, size_t c,
                                  const pulse_loco_member *next, size_t nn,
                                  loco_manifest *m) {
  memset(m, 0, sizeof *m);
  m->round = r;
  m->coordinator = writer;
  m->has_contributors = 1;
  m->contrib = malloc((c ? c : 1) * sizeof *refs);
  m->members = malloc((nn ? nn : 1) * sizeof *next);
  if (!m->contrib || !m->members) {
    loco_manifest_free(m);
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: manifest");
  }
  memcpy(m->contrib, refs, c * sizeof *refs);
  memcpy(m->members, next, nn * sizeof *next);
  m->ncontrib = c;
  m->nmembers = nn;
  return PULSE_OK;
}

/* A taken-over writer: a manifest of r some member already has (from the
 * dead writer). *found is its source's index, -1 when none. */
static void look_for_manifest(pulse_loco_collab *c, uint64_t r, uint32_t k,
                              loco_manifest *m, int *found) {
  *found = -1;
  size_t M = c->nmembers;
  loco_fetch *t = calloc(M, sizeof *t);
  char(*urls)[160] = calloc(M, sizeof *urls);
  size_t *idx = calloc(M, sizeof *idx);
  size_t q = 0;
  for (size_t i = 0; t && urls && idx && i < M; i++) {
    if (c->members[i].id == c->id || dead_writer(c, r, k, c->members[i].id))
      continue;
    snprintf(urls[q], sizeof urls[q], "%s/v1/loco/round/%" PRIu64 "/manifest",
             c->members[i].url, r);
    t[q].url = urls[q];
    t[q].max_bytes = MANIFEST_CAP;
    t[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    idx[q++] = i;
  }
  if (q > 0)
    loco_http_gather(t, q, loco_now_ms() + 300u);
  for (size_t j = 0; j < q; j++) {
    if (*found < 0 && t[j].done) {
      c->fetched += t[j].body.size;
      loco_manifest x;
      if (loco_manifest_parse(t[j].body.data, t[j].body.size, &x) ==
          PULSE_OK) {
        if (x.round == r && x.has_contributors && x.ncontrib > 0) {
          *m = x;
          *found = (int)idx[j];
        } else {
          loco_manifest_free(&x);
        }
      }
    }
    pulse_bytebuf_free(&t[j].body);
  }
  free(t), free(urls), free(idx);
}

/* The writer's close of round r at rank k: readiness, payloads, checks,
 * relays, manifest (into *man). */
static pulse_status write_round(pulse_loco_collab *c, uint64_t r, uint32_t k,
                                const uint8_t *own, size_t own_size,
                                uint64_t own_samples, int leaving,
                                loco_manifest *man, char *src, size_t src_cap,
                                pulse_loco_collab_info *info) {
  if (k > 0) {
    int found;
    look_for_manifest(c, r, k, man, &found);
    if (found >= 0) {
      snprintf(src, src_cap, "%s", c->members[found].url);
      PULSE_LOG_AT(PULSE_LOG_INFO,
                   "loco collab round %" PRIu64 ": adopted %u's manifest", r,
                   c->members[found].id);
      return PULSE_OK;
    }
  }
  snprintf(src, src_cap, "%s", c->url);
  pthread_mutex_lock(&c->lock);
  collab_open_table(c, r, k);
  collab_ready_locked(c, r, k, c->id, own_samples, leaving);
  collab_bandwidth_locked(c, c->id, reported_bandwidth(c));
  pthread_mutex_unlock(&c->lock);
  /* Every member's readiness, or the deadline. */
  uint64_t end = loco_now_ms() + c->opts.round_timeout_ms +
                 (k > 0 ? c->opts.claim_timeout_ms : 0u);
  size_t M = c->nmembers;
  collab_record *rec = calloc(M, sizeof *rec);
  pulse_loco_member *pend = calloc(LOCO_MAX_MEMBERS, sizeof *pend);
  loco_fetch *t = calloc(M, sizeof *t);
  char(*urls)[160] = calloc(M, sizeof *urls);
  pulse_loco_contribution *set = calloc(M, sizeof *set);
  loco_contrib_ref *refs = calloc(M, sizeof *refs);
  pulse_loco_member *next = calloc(M + LOCO_MAX_MEMBERS, sizeof *next);
  int *ok = calloc(M, sizeof *ok);
  pulse_status st = PULSE_OK;
  if (!rec || !pend || !t || !urls || !set || !refs || !next || !ok) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, r);
    goto done;
  }
  size_t npend = 0;
  uint64_t max_step = 0;
  for (;;) {
    size_t waiting = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nrec; i++)
      waiting += !c->rec[i].ready && !dead_writer(c, r, k, c->rec[i].id);
    if (waiting == 0 || loco_now_ms() >= end) {
      c->closed = 1;
      memcpy(rec, c->rec, M * sizeof *rec);
      for (size_t i = 0; i < c->npending; i++)
        if (loco_member_find(c->members, c->nmembers, c->pending[i].id) < 0) {
          pend[npend].id = c->pending[i].id;
          snprintf(pend[npend].url, sizeof pend[npend].url, "%s",
                   c->pending[i].url);
          npend++;
        }
      max_step = c->max_step;
      pthread_mutex_unlock(&c->lock);
      break;
    }
    pthread_mutex_unlock(&c->lock);
    loco_sleep_ms(1);
  }
  info->max_step = max_step;
  /* The ready members' payloads. */
  size_t want = 0;
  for (size_t i = 0; i < M; i++) {
    if (rec[i].id == c->id || !rec[i].ready || rec[i].ready_samples == 0)
      continue;
    snprintf(urls[i], sizeof urls[i], "%s/v1/loco/round/%" PRIu64,
             c->members[i].url, r);
    t[i].url = urls[i];
    t[i].max_bytes = loco_payload_cap(c->ctx->n);
    t[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    /* Partitioned: the owners decode every slice; the writer reads only
     * each payload's header (and its size and SHA-256 from the answer). */
    t[i].head = c->opts.partitioned ? LOCO_HEADER_SIZE : 0;
    want++;
  }
  if (want > 0) {
    loco_fetch *w = calloc(want, sizeof *w);
    size_t *idx = calloc(want, sizeof *idx);
    if (!w || !idx) {
      free(w), free(idx);
      st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: fetch list");
      goto done;
    }
    size_t q = 0;
    for (size_t i = 0; i < M; i++)
      if (t[i].url != NULL)
        w[q] = t[i], idx[q++] = i;
    st = loco_http_gather(w, want, loco_now_ms() + c->opts.round_timeout_ms);
    for (size_t a = 0; a < want; a++)
      t[idx[a]] = w[a];
    free(w), free(idx);
    if (st != PULSE_OK)
      goto done;
  }
  size_t nc = 0;
  for (size_t i = 0; i < M; i++) {
    uint32_t id = rec[i].id;
    if (id == c->id) {
      ok[i] = own_samples > 0;
      if (ok[i]) {
        set[nc] = (pulse_loco_contribution){own, own_size};
        refs[nc].id = id;
        refs[nc].bytes = own_size;
        loco_sha256(own, own_size, refs[nc].sha256);
        refs[nc].samples = own_samples;
        refs[nc].bandwidth = loco_bandwidth_quantize(rec[i].bandwidth);
        nc++;
      }
      continue;
    }
    if (!t[i].done)
      continue;
    c->fetched += t[i].body.size;
    int head_only = t[i].head > 0;
    pulse_loco_payload_header h;
    /* What the table granted (at rank 0 every sample; after a takeover
     * what the sender said it had done before, plus grants): the payload
     * must carry exactly that. */
    uint64_t owed = rec[i].granted;
    const char *why = NULL;
    if (pulse_loco_payload_peek(t[i].body.data, t[i].body.size, &h) !=
        PULSE_OK)
      why = "does not decode";
    else if (h.sender != id)
      why = "names another sender";
    else if (h.round != r)
      why = "is of another round";
    else if (h.samples != owed || h.samples != rec[i].ready_samples)
      why = "carries other samples than granted";
    else if (head_only && (h.param_count != c->ctx->n ||
                           h.base_digest != c->ctx->digest))
      why = "is built on another theta_g";
    else if (head_only && (!t[i].has_sha256 || t[i].total > loco_payload_cap(c->ctx->n)))
      why = "has no digest or is oversized";
    else if (!head_only &&
             pulse_loco_check(c->ctx, t[i].body.data, t[i].body.size) !=
                 PULSE_OK)
      why = "does not check";
    if (why != NULL) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab round %" PRIu64 ": %u dropped (its payload "
                   "%s)",
                   r, id, why);
      rec[i].ready = 0; /* an offender: out of this round and the next */
      continue;
    }
    ok[i] = 1;
    refs[nc].id = id;
    refs[nc].samples = h.samples;
    refs[nc].bandwidth = loco_bandwidth_quantize(rec[i].bandwidth);
    if (head_only) {
      set[nc] = (pulse_loco_contribution){NULL, 0}; /* no relay */
      refs[nc].bytes = t[i].total;
      memcpy(refs[nc].sha256, t[i].sha256, 32);
    } else {
      set[nc] = (pulse_loco_contribution){t[i].body.data, t[i].body.size};
      refs[nc].bytes = t[i].body.size;
      loco_sha256(t[i].body.data, t[i].body.size, refs[nc].sha256);
    }
    nc++;
  }
  if (nc == 0) {
    st = pulse_fail(PULSE_ERR_IO, "loco collab: round %" PRIu64
                    " has no contribution", r);
    goto done;
  }
  /* The next round: the ready members (but leavers that flushed), then
   * the joiners. */
  size_t nn = 0;
  for (size_t i = 0; i < M; i++)
    if (rec[i].ready && !(rec[i].leaving && ok[i]))
      next[nn++] = c->members[i];
  for (size_t j = 0; j < npend && nn < LOCO_MAX_MEMBERS; j++)
    if (loco_member_find(next, nn, pend[j].id) < 0)
      next[nn++] = pend[j];
  qsort(next, nn, sizeof *next, loco_member_by_id);
  /* Relays first: once the manifest is visible, all it names is here. */
  for (size_t j = 0; j < nc && st == PULSE_OK; j++) {
    if (set[j].data == NULL)
      continue; /* read by its header only */
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r,
             refs[j].id);
    st = loco_server_put(c->srv, path, set[j].data, set[j].size);
  }
  if (st == PULSE_OK)
    st = make_manifest(r, c->id, refs, nc, next, nn, man);
done:
  for (size_t i = 0; t && i < M; i++)
    pulse_bytebuf_free(&t[i].body);
  free(rec), free(pend), free(t), free(urls), free(set), free(refs);
  free(next), free(ok);
  return st;
}

/* ------------------------------------------------------------- a follower */

/* Readiness to W(r, k) and its manifest; moves to the next rank when the
 * writer is gone, and writes the round itself when its turn comes. */
static pulse_status get_manifest(pulse_loco_collab *c, uint64_t r,
                                 uint32_t *k, const uint8_t *own,
                                 size_t own_size, uint64_t done, int leaving,
                                 loco_manifest *man, char *src, size_t cap,
                                 pulse_loco_collab_info *info) {
  uint32_t told = UINT32_MAX;
  uint64_t dead_since = 0, start = loco_now_ms();
  uint64_t limit = 4u * c->opts.claim_timeout_ms + 4u * c->opts.round_timeout_ms;
  for (;;) {
    sync_rank(c, r, k);
    if (*k >= c->nmembers)
      return pulse_fail(PULSE_ERR_IO, "loco collab: round %" PRIu64
                        ": every writer is gone", r);
    uint32_t w = pulse_loco_collab_writer(c->members, c->nmembers, r, *k);
    if (w == c->id)
      return write_round(c, r, *k, own, own_size, done, leaving, man, src, cap,
                         info);
    const char *wurl = url_of(c, w);
    int gone = 0;
    if (told != *k) {
      unsigned s = tell_writer(c, r, *k, 1, 0, done, 0, leaving);
      if (s != 0)
        told = *k;
      else
        gone = 1;
    }
    if (!gone) {
      char url[160];
      snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/manifest", wurl,
               r);
      pulse_bytebuf b = PULSE_BYTEBUF_INIT;
      long status = 0;
      pulse_status st =
          loco_http_get(url, c->opts.claim_timeout_ms, MANIFEST_CAP, &b,
                        &status);
      if (st != PULSE_OK) {
        pulse_bytebuf_free(&b);
        return st;
      }
      if (status == 200) {
        c->fetched += b.size;
        st = loco_manifest_parse(b.data, b.size, man);
        pulse_bytebuf_free(&b);
        if (st == PULSE_OK &&
            (man->round != r || !man->has_contributors || man->ncontrib == 0)) {
          loco_manifest_free(man);
          st = pulse_fail(PULSE_ERR_CORRUPT,
                          "loco collab: manifest of round %" PRIu64
                          " does not fit",
                          r);
        }
        if (st == PULSE_OK)
          snprintf(src, cap, "%s", wurl);
        return st;
      }
      pulse_bytebuf_free(&b);
      gone = status == 0;
    }
    uint64_t now = loco_now_ms();
    if (gone) {
      if (dead_since == 0)
        dead_since = now;
      if (now - dead_since >= c->opts.claim_timeout_ms) {
        PULSE_LOG_AT(PULSE_LOG_WARN,
                     "loco collab round %" PRIu64 ": writer %u is gone", r, w);
        (*k)++;
        dead_since = 0;
        continue;
      }
    } else {
      dead_since = 0;
    }
    if (now - start > limit)
      return pulse_fail(PULSE_ERR_IO,
                        "loco collab: no manifest of round %" PRIu64 " from %u",
                        r, w);
    loco_sleep_ms(2);
  }
}

/* Keeps body as t[j] when it is the payload the manifest lists for
 * contributor j (size, SHA-256, and the sample count the writer checked:
 * partitioned, from the header it read), and re-serves it at once as
 * /v1/loco/round/R/from/ID: a member that cannot reach the sender (dead
 * after the manifest) gets it from any member that has it. Frees body
 * otherwise. */
static pulse_status take_listed(pulse_loco_collab *c, uint64_t r,
                                const loco_manifest *man, size_t j,
                                pulse_bytebuf *body, loco_fetch *t) {
  c->fetched += body->size;
  uint8_t sha[32];
  loco_sha256(body->data, body->size, sha);
  pulse_loco_payload_header h;
  if (body->size != man->contrib[j].bytes ||
      memcmp(sha, man->contrib[j].sha256, 32) != 0 ||
      (man->contrib[j].samples != 0 &&
       (pulse_loco_payload_peek(body->data, body->size, &h) != PULSE_OK ||
        h.samples != man->contrib[j].samples))) {
    pulse_bytebuf_free(body);
    return PULSE_OK;
  }
  t[j].body = *body;
  t[j].done = 1;
  *body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r,
           man->contrib[j].id);
  return loco_server_put(c->srv, path, t[j].body.data, t[j].body.size);
}

/* Head reads of relays at most, per try of fetch_relayed: with many
 * members and many payloads missing, each try asks a window of them,
 * another the next try. */
#define RELAY_PROBES 256u

/* The listed payloads still missing after their senders were asked, from
 * the members that re-serve them (/v1/loco/round/R/from/ID, put as soon as
 * fetched: the manifest's source and every serving member) until
 * `end`. Each try reads the header of each missing payload at the relays
 * for 100 ms (a 404 is not final: a member may still be fetching it), then
 * the whole payload from one relay that holds exactly the listed bytes
 * (size and SHA-256 from the answer). */
static pulse_status fetch_relayed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, const loco_manifest *man,
                                  loco_fetch *t, uint64_t end) {
  size_t C = man->ncontrib, cap = RELAY_PROBES, nb = 0;
  const char **bases = calloc(c->nmembers + 1, sizeof *bases);
  loco_fetch *p = calloc(cap, sizeof *p);
  char(*urls)[160] = calloc(cap, sizeof *urls);
  size_t *of = calloc(cap, sizeof *of);
  size_t *pick = calloc(C ? C : 1, sizeof *pick);
  pulse_status st = PULSE_OK;
  if (!bases || !p || !urls || !of || !pick)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: relay list");
  if (st == PULSE_OK && src[0] != '\0')
    bases[nb++] = src;
  for (size_t i = 0; st == PULSE_OK && i < c->nmembers; i++)
    if (c->members[i].id != c->id && serves(c->members[i].url) &&
        strcmp(c->members[i].url, src) != 0)
      bases[nb++] = c->members[i].url;
  for (size_t turn = 0; st == PULSE_OK && nb > 0 && loco_now_ms() < end;
       turn++) {
    size_t missing = 0, q = 0;
    for (size_t j = 0; j < C; j++)
      missing += !t[j].done && man->contrib[j].id != c->id;
    if (missing == 0)
      break;
    size_t per = cap / missing ? cap / missing : 1;
    for (size_t jj = 0; jj < C && q < cap; jj++) {
      size_t j = (jj + turn * cap) % C;
      uint32_t id = man->contrib[j].id;
      if (t[j].done || id == c->id)
        continue;
      for (size_t k = 0; k < per && k < nb && q < cap; k++) {
        const char *b = bases[(turn * per + k) % nb];
        snprintf(urls[q], sizeof urls[q],
                 "%s/v1/loco/round/%" PRIu64 "/from/%u", b, r, id);
        p[q] = (loco_fetch){0};
        p[q].url = urls[q];
        p[q].max_bytes = (size_t)man->contrib[j].bytes;
        p[q].head = LOCO_HEADER_SIZE;
        p[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
        of[q++] = j;
      }
    }
    if (q == 0)
      break; /* nobody else to ask */
    uint64_t now = loco_now_ms();
    st = loco_http_gather(p, q, now + 100u < end ? now + 100u : end);
    for (size_t j = 0; j < C; j++)
      pick[j] = SIZE_MAX;
    size_t want = 0;
    for (size_t aa = 0; aa < q; aa++) {
      size_t a = (aa + turn) % q, j = of[a]; /* not always the same relay */
      c->fetched += p[a].body.size;
      pulse_bytebuf_free(&p[a].body);
      if (pick[j] == SIZE_MAX && p[a].done &&
          p[a].total == man->contrib[j].bytes && p[a].has_sha256 &&
          memcmp(p[a].sha256, man->contrib[j].sha256, 32) == 0) {
        pick[j] = a;
        want++;
      }
    }
    if (st != PULSE_OK || want == 0)
      continue;
    size_t w = 0;
    for (size_t j = 0; j < C; j++)
      if (pick[j] != SIZE_MAX) {
        p[w] = (loco_fetch){0};
        p[w].url = urls[pick[j]];
        p[w].max_bytes = (size_t)man->contrib[j].bytes;
        p[w].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
        of[w++] = j;
      }
    st = loco_http_gather(p, w, end);
    for (size_t a = 0; a < w; a++) {
      if (st == PULSE_OK && p[a].done)
        st = take_listed(c, r, man, of[a], &p[a].body, t);
      if (t[of[a]].done)
        PULSE_LOG_AT(PULSE_LOG_INFO,
                     "loco collab round %" PRIu64 ": %u's payload relayed "
                     "by %s",
                     r, man->contrib[of[a]].id, p[a].url);
      pulse_bytebuf_free(&p[a].body);
    }
  }
  free(bases), free(p), free(urls), free(of), free(pick);
  return st;
}

/* The manifest's payloads that are not this peer's and not in t yet, into
 * t[j] (take_listed), until `end`: from their senders (for at most
 * claim_timeout_ms), then through relays (fetch_relayed). */
static pulse_status fetch_listed(pulse_loco_collab *c, uint64_t r,
                                 const char *src, const loco_manifest *man,
                                 loco_fetch *t, char (*urls)[160],
                                 uint64_t end) {
  size_t C = man->ncontrib, want = 0;
  for (size_t j = 0; j < C; j++) {
    if (t[j].done || man->contrib[j].id == c->id)
      continue;
    int m = loco_member_find(c->members, c->nmembers, man->contrib[j].id);
    snprintf(urls[j], sizeof urls[j], "%s/v1/loco/round/%" PRIu64,
             m < 0 ? src : c->members[m].url, r);
    want++;
  }
  if (want == 0)
    return PULSE_OK;
  loco_fetch *w = calloc(want, sizeof *w);
  size_t *idx = calloc(want, sizeof *idx);
  if (!w || !idx) {
    free(w), free(idx);
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: fetch list");
  }
  size_t q = 0;
  for (size_t j = 0; j < C; j++)
    if (!t[j].done && man->contrib[j].id != c->id) {
      w[q].url = urls[j];
      w[q].max_bytes = (size_t)man->contrib[j].bytes;
      w[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
      idx[q++] = j;
    }
  uint64_t direct = loco_now_ms() + c->opts.claim_timeout_ms;
  pulse_status st = loco_http_gather(w, want, direct < end ? direct : end);
  for (size_t a = 0; a < want; a++) {
    if (st == PULSE_OK && w[a].done)
      st = take_listed(c, r, man, idx[a], &w[a].body, t);
    pulse_bytebuf_free(&w[a].body);
  }
  free(w), free(idx);
  if (st == PULSE_OK)
    st = fetch_relayed(c, r, src, man, t, end);
  return st;
}

/* How long a contributor takes at most to get what it finishes with: the
 * partitioned exchange, or the listed payloads (from their senders, then
 * relays). */
static uint64_t exchange_ms(const pulse_loco_collab *c) {
  return (uint64_t)c->opts.round_timeout_ms + c->opts.claim_timeout_ms;
}

/* How long a member waits for the state of r + 1: the contributors may end
 * r only after that deadline, the settling of a failed one and an
 * all-to-all finish over those that said "failed". */
static uint64_t catch_up_window(const pulse_loco_collab *c) {
  return 2u * exchange_ms(c) + 2u * c->opts.claim_timeout_ms;
}

/* How long one try at a state may take: 500 ms to find it missing or its
 * source gone, plus twice the state's transfer time at this peer's
 * measured download rate (none measured yet: nothing more). A large state
 * over a slow link is then not cut off halfway and started again. */
static uint32_t state_try_ms(const pulse_loco_collab *c) {
  uint64_t ms = 500;
  if (c->bandwidth > 0)
    ms += 2000u * (uint64_t)loco_state_cap(c->ctx->n) / c->bandwidth;
  return ms > 600000u ? 600000u : (uint32_t)ms;
}

/* Imports the state of round `round` from the manifest's source or a
 * contributor (they all finished it). */
static pulse_status catch_up(pulse_loco_collab *c, uint64_t round,
                             const char *src, const loco_manifest *man,
                             float *theta_r, uint64_t window_ms) {
  uint64_t end = loco_now_ms() + window_ms;
  pulse_status st = PULSE_ERR_IO;
  while (loco_now_ms() < end) {
    for (size_t j = 0; j <= (man ? man->ncontrib : 0); j++) {
      const char *base = src;
      if (j > 0) {
        if (man->contrib[j - 1].id == c->id)
          continue;
        base = url_of(c, man->contrib[j - 1].id);
      }
      if (base[0] == '\0' || strcmp(base, c->url) == 0)
        continue;
      st = pulse_loco_collab_import(c, base, round, theta_r,
                                     state_try_ms(c));
      if (st == PULSE_OK)
        return st;
    }
    loco_sleep_ms(5);
  }
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab: no peer served the state of round %" PRIu64,
                    round);
}

/* ------------------------------------------------------------- the round */

/* The partitioned finish of round r (opts.partitioned): the manifest's
 * contributors, with the samples the writer granted and checked, reduce
 * their ranges (loco_partition_round); ctx finished, theta_r = theta_g,
 * bit-identical to pulse_loco_finish over the same set. Not this peer's
 * payload listed, a count missing, or the exchange failed: an error, ctx
 * still prepared (the caller then finishes all-to-all). */
static pulse_status reduce_partitioned(pulse_loco_collab *c, uint64_t r,
                                       const char *src,
                                       const loco_manifest *man,
                                       const uint8_t *own, size_t size,
                                       float *theta_r,
                                       pulse_loco_collab_info *info,
                                       int *self_dropped) {
  size_t C = man->ncontrib;
  int self = -1;
  *self_dropped = 0;
  for (size_t j = 0; j < C; j++) {
    if (man->contrib[j].samples == 0)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "loco collab: manifest of round %" PRIu64
                        " lacks sample counts",
                        r);
    if (man->contrib[j].id == c->id)
      self = (int)j;
  }
  if (self < 0)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: own payload not listed");
  uint32_t *ids = calloc(C, sizeof *ids);
  const char **urls = calloc(C, sizeof *urls);
  uint64_t *samples = calloc(C, sizeof *samples);
  uint64_t *bw = calloc(C, sizeof *bw), *weights = calloc(C, sizeof *weights);
  pulse_status st = PULSE_OK;
  if (!ids || !urls || !samples || !bw || !weights)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: partition lists");
  for (size_t j = 0; st == PULSE_OK && j < C; j++) {
    ids[j] = man->contrib[j].id;
    urls[j] = url_of(c, ids[j]);
    samples[j] = man->contrib[j].samples;
    /* A client-mode member owns nothing: its rate does not weigh. */
    bw[j] = serves(urls[j]) ? man->contrib[j].bandwidth : 0;
  }
  /* Range sizes in proportion to the manifest's rates, within the plan's
   * bound (PAYLOAD.md "Collaboration"): every member reads the same
   * manifest, so every member plans the same ranges. */
  if (st == PULSE_OK) {
    pulse_loco_plan_weights(bw, C, weights);
    for (size_t j = 0; j < C; j++)
      if (!serves(urls[j]))
        weights[j] = 0;
  }
  loco_partition_in in;
  loco_partition_out out;
  memset(&in, 0, sizeof in);
  memset(&out, 0, sizeof out);
  in.ctx = c->ctx;
  in.theta_r = theta_r;
  in.count = C;
  in.ids = ids;
  in.urls = urls;
  in.samples = samples;
  in.weights = weights;
  in.relay_url = src;
  in.srv = c->srv;
  if (c->host_url[0] != '\0') { /* client mode: blobs through its host */
    in.upload = collab_client_upload;
    in.upload_user = c;
  }
  in.timeout_ms = (uint32_t)exchange_ms(c);
  /* A peer killed mid-exchange sends no verdict: who holds every reduced
   * range finishes without it (the others import its state). */
  in.lenient_verdicts = 1;
  /* Rotating: range k recomputed in rounds with (r + k) % C == 0, one a
   * round. */
  in.check_period = c->opts.partition_check == PULSE_LOCO_COLLAB_CHECK_FULL
                        ? 1u
                        : (uint32_t)C;
  in.receipts_only =
      c->opts.partition_check == PULSE_LOCO_COLLAB_CHECK_RECEIPTS;
  if (st == PULSE_OK)
    st = loco_partition_round(&in, &out);
  c->fetched += out.bytes_in;
  for (size_t o = 0; o < out.noffenders; o++)
    *self_dropped |= out.offenders[o] == c->id;
  if (st == PULSE_OK) {
    /* What a takeover writer adopting this manifest relays from here. */
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r, c->id);
    loco_server_put(c->srv, path, own, size);
    info->partitioned = 1;
    uint64_t owned = out.range_end - out.range_start; /* for the log */
    PULSE_LOG_AT(PULSE_LOG_DEBUG,
                 "loco collab round %" PRIu64 " partitioned (peer %u): own "
                 "payload %" PRIu64 ", in: slices %" PRIu64 " reduced %" PRIu64
                 " checks %" PRIu64 " verdicts %" PRIu64 ", out %" PRIu64
                 "; listed at %" PRIu64 " bytes/s (measured %" PRIu64
                 "), owns %" PRIu64 " of %" PRIu64 " parameters",
                 r, c->id, out.own_payload, out.slice_bytes_in,
                 out.reduced_bytes_in, out.check_bytes_in,
                 out.verdict_bytes_in, out.bytes_out, bw[self], c->bandwidth,
                 owned, (uint64_t)c->ctx->n);
    info->contributors = out.contributors;
    info->self_included = out.self_included;
    info->own_samples = out.self_included ? samples[self] : 0;
    for (size_t j = 0; j < C; j++) {
      int dropped = 0;
      for (size_t o = 0; o < out.noffenders; o++)
        dropped |= out.offenders[o] == ids[j];
      info->samples += dropped ? 0 : samples[j];
    }
  } else {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab round %" PRIu64
                 ": partitioned exchange failed (%s)",
                 r, pulse_error_detail());
  }
  free(ids), free(urls), free(samples), free(bw), free(weights);
  return st;
}

/* After the partitioned exchange of round r every contributor says how it
 * ended at /v1/loco/round/R/outcome: "finished" (its state of r + 1 is
 * served first) or "failed" (ctx still prepared). */
static pulse_status publish_outcome(pulse_loco_collab *c, uint64_t r,
                                    int finished) {
  if (finished)
    PULSE_TRY(collab_publish_state(c));
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/outcome", r);
  const char *text = finished ? "finished" : "failed";
  return loco_server_put(c->srv, path, text, strlen(text));
}

/* A contributor whose exchange failed: the other contributors' outcomes,
 * until one finished (its URL into `from`: this peer imports its state,
 * so every survivor ends r with the same weights), or every one answered
 * or `end` passed. Then alive[j] says which said "failed": when nobody
 * finished, those (and this peer) finish r all-to-all, the rule every
 * survivor applies to the same answers (a dead peer answers nobody).
 * Returns 1 (found), 0 (nobody finished) or -1 (out of memory). */
static int settle(pulse_loco_collab *c, uint64_t r, const loco_manifest *man,
                  uint64_t end, char *from, size_t cap, uint8_t *alive) {
  size_t C = man->ncontrib;
  loco_fetch *t = calloc(C ? C : 1, sizeof *t);
  char(*urls)[160] = calloc(C ? C : 1, sizeof *urls);
  uint8_t *answered = calloc(C ? C : 1, 1);
  size_t *idx = calloc(C ? C : 1, sizeof *idx);
  int found = 0;
  memset(alive, 0, C);
  if (!t || !urls || !answered || !idx) {
    free(t), free(urls), free(answered), free(idx);
    return -1;
  }
  for (;;) {
    size_t q = 0, left = 0;
    for (size_t j = 0; j < C; j++) {
      const char *u = url_of(c, man->contrib[j].id);
      /* Client-mode contributors publish no outcome (PAYLOAD.md). */
      if (man->contrib[j].id == c->id || answered[j] || u[0] == '\0' ||
          loco_url_hosted(u, NULL, 0, NULL))
        continue;
      left++;
      snprintf(urls[q], sizeof urls[q], "%s/v1/loco/round/%" PRIu64 "/outcome",
               u, r);
      t[q] = (loco_fetch){0};
      t[q].url = urls[q];
      t[q].max_bytes = 64;
      t[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
      idx[q++] = j;
    }
    uint64_t now = loco_now_ms();
    if (left == 0 || now >= end)
      break;
    loco_http_gather(t, q, now + 50u < end ? now + 50u : end);
    for (size_t a = 0; a < q; a++) {
      if (t[a].done) {
        size_t j = idx[a];
        c->fetched += t[a].body.size;
        answered[j] = 1;
        if (t[a].body.size == 8 && memcmp(t[a].body.data, "finished", 8) == 0 &&
            !found) {
          found = 1;
          snprintf(from, cap, "%s", url_of(c, man->contrib[j].id));
        }
        alive[j] = t[a].body.size == 6 && memcmp(t[a].body.data, "failed", 6) == 0;
      }
      pulse_bytebuf_free(&t[a].body);
    }
    if (found)
      break;
  }
  free(t), free(urls), free(answered), free(idx);
  return found;
}

/* A contributor that cannot finish round r over the manifest's whole set
 * (partitioned: its exchange failed; all-to-all: a listed payload never
 * came) says "failed" and settles: a contributor that finished → this peer
 * imports its state of r + 1 (self_in: its own payload was in that finish,
 * for the keep rule); nobody finished → a client imports the state of the
 * serving members that said "failed" (which finish without it; its
 * payload stays in e), a serving peer cuts man to itself and those, and t
 * (the payloads it holds, by man's order) with it, to finish r all-to-all
 * over them. *imported: the round is over (with st). */
static pulse_status settle_failed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, loco_manifest *man,
                                  loco_fetch *t, int self_in, uint64_t done,
                                  uint64_t end, float *theta_r,
                                  pulse_loco_collab_info *info,
                                  int *imported) {
  size_t C = man->ncontrib;
  *imported = 0;
  pulse_status st = publish_outcome(c, r, 0);
  uint8_t *alive = calloc(C ? C : 1, 1);
  char from[64] = "";
  int found = alive ? settle(c, r, man, end, from, sizeof from, alive) : -1;
  if (st == PULSE_OK && found < 0)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, r);
  if (st == PULSE_OK && found > 0) {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab round %" PRIu64 ": importing the state of "
                 "round %" PRIu64 " from %s, which finished it",
                 r, r + 1, from);
    pulse_loco_abandon(c->ctx, self_in);
    st = catch_up(c, r + 1, from, man, theta_r, catch_up_window(c));
    *imported = 1;
    info->resynced = st == PULSE_OK;
    info->contributors = (uint32_t)C;
    info->self_included = self_in;
    info->own_samples = self_in ? done : 0;
    for (size_t j = 0; j < C; j++)
      info->samples += man->contrib[j].samples;
  } else if (st == PULSE_OK && c->host_url[0] != '\0') {
    /* A client: the serving contributors that said "failed" finish the
     * round all-to-all without it (it published no outcome); its samples
     * stay in e (keep rule) and it imports their state. */
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab client %u round %" PRIu64 ": nobody finished "
                 "it; the serving contributors finish it without this client",
                 c->id, r);
    pulse_loco_abandon(c->ctx, 0);
    st = catch_up(c, r + 1, src, man, theta_r, catch_up_window(c));
    *imported = 1;
    info->resynced = st == PULSE_OK;
    for (size_t j = 0; j < C; j++)
      if (alive[j]) {
        info->contributors++;
        info->samples += man->contrib[j].samples;
      }
  } else if (st == PULSE_OK) {
    size_t q = 0;
    for (size_t j = 0; j < C; j++) {
      if (man->contrib[j].id == c->id || alive[j]) {
        man->contrib[q] = man->contrib[j];
        t[q++] = t[j];
      } else {
        pulse_bytebuf_free(&t[j].body);
      }
    }
    for (size_t j = q; j < C; j++)
      t[j] = (loco_fetch){0};
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab round %" PRIu64 ": nobody finished it; "
                 "all-to-all over the %zu of %zu contributors that answered",
                 r, q, C);
    man->ncontrib = q;
  }
  free(alive);
  return st;
}

/* The all-to-all finish of round r over man's contributors: their
 * payloads into t (fetch_listed, until `end`), then pulse_loco_finish
 * when this peer has a payload and every listed one (*complete). */
static pulse_status finish_listed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, const loco_manifest *man,
                                  loco_fetch *t, char (*urls)[160],
                                  pulse_loco_contribution *set,
                                  const uint8_t *own, size_t size,
                                  uint64_t done, uint64_t end, float *theta_r,
                                  pulse_loco_collab_info *info,
                                  int *complete) {
  size_t C = man->ncontrib, have = 0;
  int self_included = 0;
  *complete = 0;
  PULSE_TRY(fetch_listed(c, r, src, man, t, urls, end));
  for (size_t j = 0; j < C; j++) {
    if (man->contrib[j].id == c->id) {
      self_included = own != NULL;
      if (own != NULL)
        set[have++] = (pulse_loco_contribution){own, size};
    } else if (t[j].done) {
      set[have++] = (pulse_loco_contribution){t[j].body.data, t[j].body.size};
    }
  }
  info->contributors = (uint32_t)C;
  info->self_included = self_included;
  info->own_samples = self_included ? done : 0;
  if (own == NULL || have < C)
    return PULSE_OK;
  pulse_loco_finish_info fi;
  memset(&fi, 0, sizeof fi);
  PULSE_TRY(pulse_loco_finish(c->ctx, set, C, theta_r, &fi));
  info->samples = fi.samples;
  *complete = 1;
  return PULSE_OK;
}

/* No payload of its own, or not every listed one (and no settling left):
 * the state of r + 1 from a peer that finished (the keep rule kept all of
 * s in e unless the manifest used it). */
static pulse_status import_finished(pulse_loco_collab *c, uint64_t r,
                                    const char *src, const loco_manifest *man,
                                    const loco_fetch *t, float *theta_r,
                                    pulse_loco_collab_info *info) {
  if (c->ctx->prepared)
    pulse_loco_abandon(c->ctx, info->self_included);
  pulse_status st = catch_up(c, r + 1, src, man, theta_r, catch_up_window(c));
  info->resynced = st == PULSE_OK;
  for (size_t j = 0; j < man->ncontrib; j++)
    if (t[j].done && t[j].body.size >= LOCO_HEADER_SIZE) {
      pulse_loco_payload_header h;
      if (pulse_loco_payload_peek(t[j].body.data, t[j].body.size, &h) ==
          PULSE_OK)
        info->samples += h.samples;
    }
  info->samples += info->own_samples;
  return st;
}

static void ack_round(pulse_loco_collab *c, const char *src, uint64_t r) {
  if (strcmp(src, c->url) == 0)
    return;
  char url[160];
  long status;
  snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/done?id=%u", src, r,
           c->id);
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

pulse_status pulse_loco_collab_round(pulse_loco_collab *c, float *theta_r,
                                     uint64_t b,
                                     pulse_loco_collab_step_fn step,
                                     void *user, uint32_t flags,
                                     pulse_loco_collab_info *info) {
  if (c == NULL || theta_r == NULL || step == NULL || b == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco collab round: bad argument");
  pulse_loco_collab_info local;
  if (info == NULL)
    info = &local;
  memset(info, 0, sizeof *info);
  uint64_t t0 = loco_now_ms();
  uint64_t served0 = loco_server_bytes_served(c->srv);
  c->fetched = 0;
  c->pushed = 0;
  uint64_t r = pulse_loco_round(c->ctx);
  info->round = r;
  if (c->dropped) {
    pulse_status st = pulse_loco_collab_join(
        c, c->rejoin_url, theta_r,
        4u * c->opts.round_timeout_ms + 4u * c->opts.claim_timeout_ms);
    info->dropped = st != PULSE_OK;
    info->resynced = st == PULSE_OK;
    info->bytes_in = c->fetched;
    info->wall_ms = loco_now_ms() - t0;
    return st;
  }
  if (loco_member_find(c->members, c->nmembers, c->id) < 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: not a member (start or join first)");
  info->members = (uint32_t)c->nmembers;
  uint32_t k = 0;
  if (pulse_loco_collab_writer(c->members, c->nmembers, r, 0) == c->id) {
    pthread_mutex_lock(&c->lock);
    collab_open_table(c, r, 0);
    pthread_mutex_unlock(&c->lock);
  }
  uint64_t done = 0;
  claim_end how = GO_ON;
  pulse_status st =
      accumulate(c, r, &k, theta_r, b, step, user, &done, info, &how);
  if (st != PULSE_OK)
    return st;
  collab_publish_own_progress(c, r, done, info->busy_ms);
  char src[64] = "";
  loco_manifest man;
  memset(&man, 0, sizeof man);
  if (how == NOT_MEMBER) {
    c->dropped = 1;
    snprintf(c->rejoin_url, sizeof c->rejoin_url, "%s",
             url_of(c, pulse_loco_collab_writer(c->members, c->nmembers, r, k)));
    info->dropped = 1;
    goto out;
  }
  int leaving = (flags & PULSE_LOCO_COLLAB_LEAVING) && done > 0;
  const uint8_t *payload = NULL;
  size_t size = 0;
  uint8_t *own = NULL;
  if (how == FULL && done > 0) {
    PULSE_TRY(pulse_loco_prepare(c->ctx, theta_r, done,
                                 leaving ? PULSE_LOCO_LEAVING : 0, &payload,
                                 &size, NULL));
    own = malloc(size);
    if (own == NULL) {
      pulse_loco_abandon(c->ctx, 0);
      return pulse_fail(PULSE_ERR_NOMEM, "loco collab: payload copy");
    }
    memcpy(own, payload, size);
    info->payload_bytes = size;
    char path[64];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64, r);
    st = loco_server_put(c->srv, path, own, size);
    if (st == PULSE_OK && c->host_url[0] != '\0') /* client mode */
      st = collab_client_push(c, r, own, size);
  }
  if (st == PULSE_OK)
    st = get_manifest(c, r, &k, own, size, own ? done : 0, leaving, &man, src,
                      sizeof src, info);
  info->takeovers = k;
  if (st == PULSE_OK) {
    info->writer = man.coordinator;
    for (size_t j = 0; j < man.ncontrib && st == PULSE_OK; j++)
      if (loco_member_find(c->members, c->nmembers, man.contrib[j].id) < 0 ||
          man.contrib[j].bytes > loco_payload_cap(c->ctx->n))
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "loco collab: manifest of round %" PRIu64
                        " lists a non-member or an oversized payload",
                        r);
  }
  if (st != PULSE_OK) {
    if (c->ctx->prepared)
      pulse_loco_abandon(c->ctx, 0); /* keep rule: all of s stays in e */
    free(own);
    loco_manifest_free(&man);
    return st;
  }
  /* Re-serve the manifest at once: a writer taking over if the source dies
   * adopts it from here. */
  pulse_bytebuf mb = PULSE_BYTEBUF_INIT;
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/manifest", r);
  st = loco_manifest_write(&man, &mb);
  int writer = man.coordinator == c->id && strcmp(src, c->url) == 0;
  test_stall(c, r, writer, 1);
  if (st == PULSE_OK)
    st = loco_server_put(c->srv, path, mb.data, mb.size);
  pulse_bytebuf_free(&mb);
  test_stall(c, r, writer, 2);
  size_t C = man.ncontrib;
  int listed = 0, settled = 0, state_served = 0;
  for (size_t j = 0; j < C; j++)
    listed |= man.contrib[j].id == c->id;
  loco_fetch *t = calloc(C, sizeof *t);
  char(*urls)[160] = calloc(C, sizeof *urls);
  pulse_loco_contribution *set = calloc(C, sizeof *set);
  if (st == PULSE_OK && (!t || !urls || !set))
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, r);
  uint64_t ex_end = loco_now_ms() + exchange_ms(c);
  if (st == PULSE_OK && c->opts.partitioned && (own == NULL || !listed)) {
    /* No payload of its own in the round: the state of r + 1 from a
     * contributor, without fetching their payloads. */
    if (c->ctx->prepared)
      pulse_loco_abandon(c->ctx, 0);
    st = catch_up(c, r + 1, src, &man, theta_r, catch_up_window(c));
    info->resynced = st == PULSE_OK;
    info->contributors = (uint32_t)C;
    for (size_t j = 0; j < C; j++)
      info->samples += man.contrib[j].samples;
    goto finished;
  }
  if (st == PULSE_OK && c->opts.partitioned) {
    int self_dropped = 0, imported = 0;
    if (reduce_partitioned(c, r, src, &man, own, size, theta_r, info,
                           &self_dropped) == PULSE_OK) {
      st = publish_outcome(c, r, 1);
      state_served = st == PULSE_OK;
      goto finished;
    }
    /* Failed (a peer's blob never came: killed mid-exchange, or an
     * offender): a contributor that finished wins, else the round is
     * finished all-to-all by those that answered. */
    st = settle_failed(c, r, src, &man, t, !self_dropped, done,
                       ex_end + 2u * c->opts.claim_timeout_ms, theta_r, info,
                       &imported);
    if (st != PULSE_OK || imported)
      goto finished;
    settled = 1;
    ex_end = loco_now_ms() + exchange_ms(c);
  }
  if (st == PULSE_OK && own != NULL && listed) {
    /* Its own payload as a relay at once, as every payload it fetches. */
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r, c->id);
    st = loco_server_put(c->srv, path, own, size);
  }
  if (st == PULSE_OK)
    test_stall(c, r, 0, 3);
  while (st == PULSE_OK) {
    int complete = 0, imported = 0;
    st = finish_listed(c, r, src, &man, t, urls, set, own, size, done, ex_end,
                       theta_r, info, &complete);
    if (st != PULSE_OK)
      break;
    if (complete) {
      if (!settled) {
        st = publish_outcome(c, r, 1);
        state_served = st == PULSE_OK;
      }
      break;
    }
    if (settled || own == NULL || !listed) {
      st = import_finished(c, r, src, &man, t, theta_r, info);
      break;
    }
    /* A listed payload never came, from its sender or any relay (its
     * sender died before anyone fetched it): as a failed partitioned
     * exchange, a contributor that finished wins, else the round is
     * finished all-to-all by those that said "failed". */
    st = settle_failed(c, r, src, &man, t, 1, done,
                       ex_end + 2u * c->opts.claim_timeout_ms, theta_r, info,
                       &imported);
    if (imported)
      break;
    settled = 1;
    ex_end = loco_now_ms() + exchange_ms(c);
  }
finished:
  for (size_t j = 0; t && j < C; j++)
    pulse_bytebuf_free(&t[j].body);
  free(t), free(urls), free(set);
  free(own);
  if (c->ctx->prepared)
    pulse_loco_abandon(c->ctx, 0);
  if (st != PULSE_OK) {
    loco_manifest_free(&man);
    return st;
  }
  info->left = leaving && info->self_included;
  /* Partitioned: a contributor that left still serves blobs the others
   * fetch (its reduced range, its verdict) until every member of r + 1
   * says it finished r; those acknowledgements go to it as to the source. */
  char gone[LOCO_MAX_MEMBERS > 64 ? 64 : LOCO_MAX_MEMBERS][64];
  size_t ngone = 0;
  for (size_t j = 0; info->partitioned && j < man.ncontrib; j++) {
    uint32_t id = man.contrib[j].id;
    const char *u = url_of(c, id);
    if (id != c->id && u[0] != '\0' && strcmp(u, src) != 0 &&
        loco_member_find(man.members, man.nmembers, id) < 0 &&
        ngone < sizeof gone / sizeof gone[0])
      snprintf(gone[ngone++], sizeof gone[0], "%s", u);
  }
  collab_set_members(c, man.members, man.nmembers);
  if (info->left && (strcmp(src, c->url) == 0 || info->partitioned))
    linger(c, r, &man);
  if (!info->left && loco_member_find(man.members, man.nmembers, c->id) < 0) {
    c->dropped = 1;
    snprintf(c->rejoin_url, sizeof c->rejoin_url, "%s", src);
    info->dropped = 1;
  }
  if (!state_served) /* publish_outcome served it already */
    st = collab_publish_state(c);
  if (st == PULSE_OK)
    st = collab_publish_view(c);
  ack_round(c, src, r);
  for (size_t g = 0; g < ngone; g++)
    ack_round(c, gone[g], r);
  loco_manifest_free(&man);
out:
  /* Payloads and relays of the last two rounds, manifests of more. */
  loco_server_drop_except(c->srv, "/v1/loco/round/", r > 0 ? r - 1 : 0,
                          "/manifest");
  if (r > MANIFESTS_KEPT)
    loco_server_drop(c->srv, "/v1/loco/round/", r - MANIFESTS_KEPT);
  info->bytes_in = c->fetched;
  info->bytes_out = loco_server_bytes_served(c->srv) - served0 + c->pushed;
  update_bandwidth(c);
  info->wall_ms = loco_now_ms() - t0;
  if (info->max_step == 0) {
    pthread_mutex_lock(&c->lock);
    if (c->table_round == r)
      info->max_step = c->max_step;
    pthread_mutex_unlock(&c->lock);
  }
  return st;
}
