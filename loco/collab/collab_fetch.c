/* collab_fetch.c - the all-to-all finish of a collaboration round
 * (collab_round.c, docs/protocols/loco-collaboration.md "Collaboration"): every member fetches the
 * payloads the manifest lists, from their senders and then from any member
 * that re-serves them (relays, put as soon as fetched), and finishes with
 * exactly them. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"

/* Keeps body as t[j] when it is the payload the manifest lists for
 * contributor j (size, SHA-256, and the sample count the writer checked:
 * partitioned, from the header it read), and, when it was fetched (not
 * read back from this peer's own relay), re-serves it at once as
 * /v1/loco/round/R/from/ID: a member that cannot reach the sender (dead
 * after the manifest) gets it from any member that has it. Frees body
 * otherwise. */
static pulse_status take_listed(pulse_loco_collab *c, uint64_t r,
                                const loco_manifest *man, size_t j,
                                pulse_bytebuf *body, loco_fetch *t,
                                int fetched) {
  if (fetched)
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
  if (!fetched)
    return PULSE_OK;
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
    if (c->members[i].id != c->id && collab_serves(c->members[i].url) &&
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
        st = take_listed(c, r, man, of[a], &p[a].body, t, 1);
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
 * t[j] (take_listed), until `end`: those this peer already serves as
 * relays (the writer checked and re-serves every payload it lists: it
 * fetched each once, not twice), then from their senders (for at most
 * claim_timeout_ms), then through other members' relays (fetch_relayed). */
static pulse_status fetch_listed(pulse_loco_collab *c, uint64_t r,
                                 const char *src, const loco_manifest *man,
                                 loco_fetch *t, char (*urls)[160],
                                 uint64_t end) {
  size_t C = man->ncontrib, want = 0;
  pulse_status st = PULSE_OK;
  for (size_t j = 0; j < C && st == PULSE_OK; j++) {
    if (t[j].done || man->contrib[j].id == c->id)
      continue;
    char path[96];
    pulse_bytebuf held = PULSE_BYTEBUF_INIT;
    snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/from/%u", r,
             man->contrib[j].id);
    if (loco_server_copy(c->srv, path, &held))
      st = take_listed(c, r, man, j, &held, t, 0);
    pulse_bytebuf_free(&held);
  }
  for (size_t j = 0; st == PULSE_OK && j < C; j++) {
    if (t[j].done || man->contrib[j].id == c->id)
      continue;
    int m = loco_member_find(c->members, c->nmembers, man->contrib[j].id);
    snprintf(urls[j], sizeof urls[j], "%s/v1/loco/round/%" PRIu64,
             m < 0 ? src : c->members[m].url, r);
    want++;
  }
  if (st != PULSE_OK || want == 0)
    return st;
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
  st = loco_http_gather(w, want, direct < end ? direct : end);
  for (size_t a = 0; a < want; a++) {
    if (st == PULSE_OK && w[a].done)
      st = take_listed(c, r, man, idx[a], &w[a].body, t, 1);
    pulse_bytebuf_free(&w[a].body);
  }
  free(w), free(idx);
  if (st == PULSE_OK)
    st = fetch_relayed(c, r, src, man, t, end);
  return st;
}

/* The all-to-all finish of round r over man's contributors: their
 * payloads into t (fetch_listed, until `end`), then pulse_loco_finish
 * when this peer has a payload and every listed one (*complete). */
pulse_status collab_finish_listed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, const loco_manifest *man,
                                  loco_fetch *t, char (*urls)[160],
                                  pulse_loco_contribution *set,
                                  const uint8_t *own, size_t size,
                                  uint64_t done, uint64_t end, float *theta_r,
                                  pulse_loco_collab_figures *info,
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
  pulse_loco_finish_figures fi;
  memset(&fi, 0, sizeof fi);
  PULSE_TRY(pulse_loco_finish(c->ctx, set, C, theta_r, &fi));
  info->samples = fi.samples;
  *complete = 1;
  return PULSE_OK;
}
