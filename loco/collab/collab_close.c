/* collab_close.c - the close of a collaboration round (collab_round.c,
 * docs/protocols/loco-collaboration.md "Collaboration"): the writer of round r at rank k waits for
 * every member's readiness, fetches and checks their payloads, serves the
 * relays and writes the manifest (a taken-over writer first adopts a
 * manifest some member already has, then proposes again what its backers
 * accepted), which counts once more than half of the members accepted it
 * (collab_commit.c); every other member says ready, accepts the writer's
 * proposal and polls the writer for the manifest, moving to the next rank
 * when the writer is gone. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)

/* ------------------------------------------------------------- the writer */

/* The writers of ranks below k are dead for this round. */
static int dead_writer(const pulse_loco_collab *c, uint64_t r, uint32_t k,
                       uint32_t id) {
  for (uint32_t j = 0; j < k && j < c->nmembers; j++)
    if (pulse_loco_collab_writer(c->members, c->nmembers, r, j) == id)
      return 1;
  return 0;
}

/* Whether a takeover of round r at rank k is backed, from the table's
 * records (rec, n of them, by member): more than half of the round's
 * serving members (the acceptors of the commit step, collab_commit.c)
 * sent this table a message at rank k, each having found W(r, k - 1) dead
 * by itself and promised k first, this peer counting itself when `self`.
 * A member cut off from a live writer by a partition backs no takeover
 * alone: the others still hear that writer, and its manifest is what this
 * peer follows. */
int collab_takeover_backed(const pulse_loco_collab *c, uint64_t r, uint32_t k,
                           const collab_record *rec, size_t n, int self) {
  (void)k;
  size_t backers = self ? 1u : 0u;
  for (size_t i = 0; i < c->nmembers; i++) {
    uint32_t id = c->members[i].id;
    if (id == c->id || !collab_serves(c->members[i].url) ||
        collab_found_dead(c, r, id))
      continue;
    for (size_t j = 0; j < n; j++)
      backers += rec[j].id == id && rec[j].contacted;
  }
  return 2 * backers > collab_acceptors(c, r);
}

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
 * dead writer), signed by the writer it names (auth hook; its bytes and
 * signature into raw and sig). *found is its source's index, -1 when
 * none. */
static void look_for_manifest(pulse_loco_collab *c, uint64_t r, uint32_t k,
                              loco_manifest *m, pulse_bytebuf *raw,
                              loco_sig *sig, int *found) {
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
        if (x.round == r && x.has_contributors && x.ncontrib > 0 &&
            collab_auth_accept_by(c, PULSE_LOCO_AUTH_MANIFEST, r,
                                  x.coordinator, &t[j].sig, t[j].body.data,
                                  t[j].body.size)) {
          *m = x;
          *found = (int)idx[j];
          pulse_bytebuf_free(raw);
          *raw = t[j].body;
          t[j].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
          *sig = t[j].sig;
        } else {
          loco_manifest_free(&x);
        }
      }
    }
    pulse_bytebuf_free(&t[j].body);
  }
  free(t), free(urls), free(idx);
}

/* A taken-over writer (k > 0) adopts a manifest of r some member already
 * has (into *man, its source's URL into src): 1 when it did. A manifest a
 * member serves there is committed (collab_commit.c): the round's. */
int collab_adopt_manifest(pulse_loco_collab *c, uint64_t r, uint32_t k,
                          loco_manifest *man, char *src, size_t src_cap,
                          pulse_bytebuf *raw, loco_sig *sig) {
  int found;
  look_for_manifest(c, r, k, man, raw, sig, &found);
  if (found < 0)
    return 0;
  snprintf(src, src_cap, "%s", c->members[found].url);
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "loco collab round %" PRIu64 ": adopted %u's manifest", r,
               c->members[found].id);
  return 1;
}

/* A takeover that most members did not back: the writer below is alive
 * to them, so this peer writes nothing and adopts the manifest they get
 * from it (they re-serve it), within a round timeout and a claim timeout
 * of its own deadline; else an error: nobody wrote round r that this peer
 * can reach, and it writes no manifest of its own beside theirs. */
static pulse_status follow_live_writer(pulse_loco_collab *c, uint64_t r,
                                       uint32_t k, loco_manifest *man,
                                       char *src, size_t src_cap,
                                       pulse_bytebuf *raw, loco_sig *sig) {
  uint64_t end = loco_now_ms() + c->opts.round_timeout_ms +
                 c->opts.claim_timeout_ms;
  PULSE_LOG_AT(PULSE_LOG_WARN,
               "loco collab round %" PRIu64 ": writer %u is gone for this "
               "peer only; following the others' manifest",
               r, pulse_loco_collab_writer(c->members, c->nmembers, r, k - 1));
  do {
    if (collab_adopt_manifest(c, r, k, man, src, src_cap, raw, sig))
      return PULSE_OK;
    loco_sleep_ms(100);
  } while (loco_now_ms() < end);
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab: round %" PRIu64 ": its writer is out of "
                    "reach, and so are more than half of the members or "
                    "they still hear it; no member serves its manifest (a "
                    "partition, or more than half of the members dead)",
                    r);
}

/* The writer's close, passed between its parts: the table's records as it
 * closed (rec, M of them), the joiners pending (pend), the payloads fetched
 * (t, by member), the contributions (set, refs, by contributor; ok, by
 * member) and the next round's members (next). */
typedef struct {
  pulse_loco_collab *c;
  uint64_t r;
  uint32_t k;
  size_t M;
  collab_record *rec;
  pulse_loco_member *pend;
  size_t npend;
  loco_fetch *t;
  char (*urls)[160];
  pulse_loco_contribution *set;
  loco_contrib_ref *refs;
  size_t nc;
  pulse_loco_member *next;
  size_t nn;
  int *ok;
} close_state;

/* Every member's readiness, or the deadline `end`: closes the table and
 * copies its records and the joiners pending; the largest step granted. */
static uint64_t wait_readiness(close_state *s, uint64_t end) {
  pulse_loco_collab *c = s->c;
  uint64_t max_step = 0;
  for (;;) {
    size_t waiting = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < c->nrec; i++)
      waiting += !c->rec[i].ready && !dead_writer(c, s->r, s->k, c->rec[i].id);
    if (waiting == 0 || loco_now_ms() >= end) {
      c->closed = 1;
      memcpy(s->rec, c->rec, s->M * sizeof *s->rec);
      for (size_t i = 0; i < c->npending; i++)
        if (loco_member_find(c->members, c->nmembers, c->pending[i].id) < 0 &&
            collab_auth_listable_locked(c, c->pending[i].id, s->r)) {
          s->pend[s->npend].id = c->pending[i].id;
          snprintf(s->pend[s->npend].url, sizeof s->pend[s->npend].url, "%s",
                   c->pending[i].url);
          s->npend++;
        }
      max_step = c->max_step;
      pthread_mutex_unlock(&c->lock);
      break;
    }
    pthread_mutex_unlock(&c->lock);
    loco_sleep_ms(1);
  }
  return max_step;
}

/* The ready members' payloads into t. */
static pulse_status fetch_payloads(close_state *s) {
  pulse_loco_collab *c = s->c;
  loco_fetch *t = s->t;
  size_t want = 0;
  for (size_t i = 0; i < s->M; i++) {
    if (s->rec[i].id == c->id || !s->rec[i].ready ||
        s->rec[i].ready_samples == 0)
      continue;
    snprintf(s->urls[i], sizeof s->urls[i], "%s/v1/loco/round/%" PRIu64,
             c->members[i].url, s->r);
    t[i].url = s->urls[i];
    t[i].max_bytes = loco_payload_cap(c->ctx->n);
    t[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    /* Partitioned: the owners decode every slice; the writer reads only
     * each payload's header (and its size and SHA-256 from the answer). */
    t[i].head = c->opts.partitioned ? LOCO_HEADER_SIZE : 0;
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
  for (size_t i = 0; i < s->M; i++)
    if (t[i].url != NULL)
      w[q] = t[i], idx[q++] = i;
  pulse_status st =
      loco_http_gather(w, want, loco_now_ms() + c->opts.round_timeout_ms);
  for (size_t a = 0; a < want; a++)
    t[idx[a]] = w[a];
  free(w), free(idx);
  return st;
}

/* Why member i's fetched payload (header h) is refused, NULL when it is
 * not. */
static const char *payload_fault(const close_state *s, size_t i,
                                 pulse_loco_payload_header *h) {
  pulse_loco_collab *c = s->c;
  const loco_fetch *t = &s->t[i];
  int head_only = t->head > 0;
  /* What the table granted (at rank 0 every sample; after a takeover
   * what the sender said it had done before, plus grants): the payload
   * must carry exactly that. */
  uint64_t owed = s->rec[i].granted;
  const char *why = NULL;
  if (pulse_loco_payload_peek(t->body.data, t->body.size, h) != PULSE_OK)
    why = "does not decode";
  else if (h->sender != s->rec[i].id)
    why = "names another sender";
  else if (h->round != s->r)
    why = "is of another round";
  else if (h->samples != owed || h->samples != s->rec[i].ready_samples)
    why = "carries other samples than granted";
  else if (head_only && (h->param_count != c->ctx->n ||
                         h->base_digest != c->ctx->digest))
    why = "is built on another theta_g";
  else if (head_only && (!t->has_sha256 || t->total > loco_payload_cap(c->ctx->n)))
    why = "has no digest or is oversized";
  else if (!head_only &&
           pulse_loco_check(c->ctx, t->body.data, t->body.size) != PULSE_OK)
    why = "does not check";
  return why;
}

/* The contributions (set, refs; ok by member): the writer's own payload
 * and every fetched one that checks; an offender is dropped. */
static void collect_contributions(close_state *s, const uint8_t *own,
                                  size_t own_size, uint64_t own_samples) {
  pulse_loco_collab *c = s->c;
  collab_record *rec = s->rec;
  loco_fetch *t = s->t;
  loco_contrib_ref *refs = s->refs;
  for (size_t i = 0; i < s->M; i++) {
    uint32_t id = rec[i].id;
    size_t nc = s->nc;
    if (id == c->id) {
      s->ok[i] = own_samples > 0;
      if (s->ok[i]) {
        s->set[nc] = (pulse_loco_contribution){own, own_size};
        refs[nc].id = id;
        refs[nc].bytes = own_size;
        loco_sha256(own, own_size, refs[nc].sha256);
        refs[nc].samples = own_samples;
        refs[nc].bandwidth = loco_bandwidth_quantize(rec[i].bandwidth);
        s->nc++;
      }
      continue;
    }
    if (!t[i].done)
      continue;
    c->fetched += t[i].body.size;
    int head_only = t[i].head > 0;
    pulse_loco_payload_header h;
    /* Signed by its sender for this round (auth hook): the whole body, or
     * the size and digest its server gave for a header-only read (the
     * manifest lists them: every reader checks the bytes against them).
     * Refused, it is left out of this round like a lost one (counted);
     * its sender stays a member: a hostile host on the path must not
     * evict it. */
    if (!(head_only && !t[i].has_sha256) && /* payload_fault drops it */
        !(head_only
              ? collab_auth_accept_by_digest(c, PULSE_LOCO_AUTH_PAYLOAD, s->r,
                                             id, &t[i].sig, t[i].total,
                                             t[i].sha256)
              : collab_auth_accept_by(c, PULSE_LOCO_AUTH_PAYLOAD, s->r, id,
                                      &t[i].sig, t[i].body.data,
                                      t[i].body.size))) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab round %" PRIu64 ": %u left out (its payload "
                   "is not signed by it for this round)",
                   s->r, id);
      continue;
    }
    const char *why = payload_fault(s, i, &h);
    if (why != NULL) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab round %" PRIu64 ": %u dropped (its payload "
                   "%s)",
                   s->r, id, why);
      rec[i].ready = 0; /* an offender: out of this round and the next */
      continue;
    }
    s->ok[i] = 1;
    refs[nc].id = id;
    refs[nc].samples = h.samples;
    refs[nc].bandwidth = loco_bandwidth_quantize(rec[i].bandwidth);
    if (head_only) {
      s->set[nc] = (pulse_loco_contribution){NULL, 0}; /* no relay */
      refs[nc].bytes = t[i].total;
      memcpy(refs[nc].sha256, t[i].sha256, 32);
    } else {
      s->set[nc] = (pulse_loco_contribution){t[i].body.data, t[i].body.size};
      refs[nc].bytes = t[i].body.size;
      loco_sha256(t[i].body.data, t[i].body.size, refs[nc].sha256);
    }
    s->nc++;
  }
}

/* The next round: the ready members (but leavers that flushed), then
 * the joiners. */
static void next_members(close_state *s) {
  pulse_loco_member *next = s->next;
  size_t nn = 0;
  for (size_t i = 0; i < s->M; i++)
    if (s->rec[i].ready && !(s->rec[i].leaving && s->ok[i]))
      next[nn++] = s->c->members[i];
  for (size_t j = 0; j < s->npend && nn < LOCO_MAX_MEMBERS; j++)
    if (loco_member_find(next, nn, s->pend[j].id) < 0)
      next[nn++] = s->pend[j];
  qsort(next, nn, sizeof *next, loco_member_by_id);
  s->nn = nn;
}

/* Relays first: once the manifest is visible, all it names is here. */
static pulse_status serve_relays(close_state *s) {
  pulse_status st = PULSE_OK;
  for (size_t j = 0; j < s->nc && st == PULSE_OK; j++) {
    if (s->set[j].data == NULL)
      continue; /* read by its header only */
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", s->r,
             s->refs[j].id);
    st = loco_server_put(s->c->srv, path, s->set[j].data, s->set[j].size);
  }
  return st;
}

/* The writer's close of round r at rank k: readiness, payloads, checks,
 * relays, manifest (into *man). */
static pulse_status write_round(pulse_loco_collab *c, uint64_t r, uint32_t k,
                                const uint8_t *own, size_t own_size,
                                uint64_t own_samples, int leaving,
                                loco_manifest *man, char *src, size_t src_cap,
                                pulse_bytebuf *raw, loco_sig *sig,
                                pulse_loco_collab_figures *info) {
  collab_promise(c, r, k);
  if (k > 0 && collab_adopt_manifest(c, r, k, man, src, src_cap, raw, sig))
    return PULSE_OK;
  snprintf(src, src_cap, "%s", c->url);
  pthread_mutex_lock(&c->lock);
  collab_open_table(c, r, k);
  collab_ready_locked(c, r, k, c->id, own_samples, leaving);
  collab_bandwidth_locked(c, c->id, collab_reported_bandwidth(c));
  pthread_mutex_unlock(&c->lock);
  /* Every member's readiness, or the deadline. */
  uint64_t end = loco_now_ms() + c->opts.round_timeout_ms +
                 (k > 0 ? c->opts.claim_timeout_ms : 0u);
  close_state s;
  memset(&s, 0, sizeof s);
  s.c = c, s.r = r, s.k = k;
  size_t M = s.M = c->nmembers;
  s.rec = calloc(M, sizeof *s.rec);
  s.pend = calloc(LOCO_MAX_MEMBERS, sizeof *s.pend);
  s.t = calloc(M, sizeof *s.t);
  s.urls = calloc(M, sizeof *s.urls);
  s.set = calloc(M, sizeof *s.set);
  s.refs = calloc(M, sizeof *s.refs);
  s.next = calloc(M + LOCO_MAX_MEMBERS, sizeof *s.next);
  s.ok = calloc(M, sizeof *s.ok);
  pulse_status st = PULSE_OK;
  if (!s.rec || !s.pend || !s.t || !s.urls || !s.set || !s.refs || !s.next ||
      !s.ok) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, r);
    goto done;
  }
  info->max_step = wait_readiness(&s, end);
  if (k > 0) {
    /* Those that did not back it: a dead one is no acceptor. */
    uint32_t *heard = calloc(M + 1u, sizeof *heard);
    size_t nh = 0;
    for (size_t i = 0; heard && i < M; i++)
      if (s.rec[i].contacted)
        heard[nh++] = s.rec[i].id;
    if (heard)
      collab_probe_dead(c, r, heard, nh);
    free(heard);
  }
  if (k > 0 && !collab_takeover_backed(c, r, k, s.rec, M, 1)) {
    st = follow_live_writer(c, r, k, man, src, src_cap, raw, sig);
    goto done;
  }
  if (k > 0) {
    /* The commit step's first phase: what the members that promised k
     * accepted; the highest-ranked is proposed again, not a new one. */
    int found = 0;
    size_t answered =
        collab_read_accepted(c, r, k, s.rec, M, man, raw, sig, &found);
    if (2u * answered <= collab_acceptors(c, r)) {
      if (found)
        loco_manifest_free(man), pulse_bytebuf_free(raw);
      st = follow_live_writer(c, r, k, man, src, src_cap, raw, sig);
      goto done;
    }
    if (found) {
      st = collab_commit(c, r, k, man, raw, sig, src, src_cap);
      goto done;
    }
  }
  st = fetch_payloads(&s);
  if (st != PULSE_OK)
    goto done;
  collect_contributions(&s, own, own_size, own_samples);
  if (s.nc == 0) {
    st = pulse_fail(PULSE_ERR_IO, "loco collab: round %" PRIu64
                    " has no contribution", r);
    goto done;
  }
  next_members(&s);
  st = serve_relays(&s);
  if (st == PULSE_OK)
    st = make_manifest(r, c->id, s.refs, s.nc, s.next, s.nn, man);
  /* Acted on only once more than half of the members accepted it. */
  if (st == PULSE_OK)
    st = collab_commit(c, r, k, man, raw, sig, src, src_cap);
done:
  for (size_t i = 0; s.t && i < M; i++)
    pulse_bytebuf_free(&s.t[i].body);
  free(s.rec), free(s.pend), free(s.t), free(s.urls), free(s.set);
  free(s.refs), free(s.next), free(s.ok);
  return st;
}

/* ------------------------------------------------------------- a follower */

/* Readiness to W(r, k) and its manifest; moves to the next rank when the
 * writer is gone, and writes the round itself when its turn comes. */
pulse_status collab_get_manifest(pulse_loco_collab *c, uint64_t r,
                                 uint32_t *k, const uint8_t *own,
                                 size_t own_size, uint64_t done, int leaving,
                                 loco_manifest *man, char *src, size_t cap,
                                 pulse_bytebuf *raw, loco_sig *sig,
                                 pulse_loco_collab_figures *info) {
  uint32_t told = UINT32_MAX, accepted_k = UINT32_MAX;
  int accept_told = 0;
  uint64_t dead_since = 0, start = loco_now_ms();
  /* Past the writer's wait, the manifest is looked for at every member
   * too: a writer cut off from most of them commits nothing, and the
   * others commit the round at another rank. */
  uint64_t look = start + c->opts.round_timeout_ms + c->opts.claim_timeout_ms;
  uint64_t limit = 4u * c->opts.claim_timeout_ms + 4u * c->opts.round_timeout_ms;
  for (;;) {
    PULSE_TRY(collab_sync_rank(c, r, k));
    uint32_t w = pulse_loco_collab_writer(c->members, c->nmembers, r, *k);
    if (w == c->id)
      return write_round(c, r, *k, own, own_size, done, leaving, man, src, cap,
                         raw, sig, info);
    const char *wurl = collab_url_of(c, w);
    int gone = 0;
    if (told != *k) {
      unsigned s = collab_tell_writer(c, r, *k, 1, 0, done, 0, leaving);
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
          loco_http_get_signed(url, c->opts.claim_timeout_ms, MANIFEST_CAP, &b,
                               &status, sig);
      if (st != PULSE_OK) {
        pulse_bytebuf_free(&b);
        return st;
      }
      if (status == 200) {
        c->fetched += b.size;
        st = loco_manifest_parse(b.data, b.size, man);
        /* Signed by the writer it names, for this round (auth hook; before
         * anything else is read from it: another round's is a replay):
         * refused, nothing of it is used (as no manifest at all). */
        if (st == PULSE_OK &&
            !collab_auth_accept_by(c, PULSE_LOCO_AUTH_MANIFEST, r,
                                   man->coordinator, sig, b.data, b.size)) {
          loco_manifest_free(man);
          st = pulse_fail(PULSE_ERR_CORRUPT,
                          "loco collab: the manifest of round %" PRIu64
                          " from %s is refused",
                          r, wurl);
        }
        if (st == PULSE_OK &&
            (man->round != r || !man->has_contributors || man->ncontrib == 0)) {
          loco_manifest_free(man);
          st = pulse_fail(PULSE_ERR_CORRUPT,
                          "loco collab: manifest of round %" PRIu64
                          " does not fit",
                          r);
        }
        if (st == PULSE_OK) {
          pulse_bytebuf_free(raw);
          *raw = b;
          b = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
        }
        pulse_bytebuf_free(&b);
        if (st == PULSE_OK)
          snprintf(src, cap, "%s", wurl);
        return st;
      }
      pulse_bytebuf_free(&b);
      gone = status == 0;
      /* The writer's proposal, accepted (a client is no acceptor). */
      if (!gone && c->host_url[0] == '\0') {
        if (accepted_k != *k)
          accepted_k = *k, accept_told = 0;
        PULSE_TRY(collab_follow_proposal(c, r, *k, wurl, &accept_told));
      }
    }
    uint64_t now = loco_now_ms();
    if (now >= look) {
      if (collab_adopt_manifest(c, r, 0, man, src, cap, raw, sig))
        return PULSE_OK;
      look = loco_now_ms() + 250u;
      now = loco_now_ms();
    }
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
