/* collab_finish.c - how a collaboration round ends when the all-to-all
 * fetch is not the whole story (collab_round.c, docs/formats/loco-payload.md
 * "Collaboration"): the partitioned finish (loco_partition_round over the
 * manifest's contributors), each contributor's outcome ("finished" or
 * "failed"), the settling of one that failed, and catching up: importing
 * the state of r + 1 from a member that finished. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "partition_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"

/* How long a contributor takes at most to get what it finishes with: the
 * partitioned exchange, or the listed payloads (from their senders, then
 * relays). */
uint64_t collab_exchange_ms(const pulse_loco_collab *c) {
  return (uint64_t)c->opts.round_timeout_ms + c->opts.claim_timeout_ms;
}

/* How long a member waits for the state of r + 1: the contributors may end
 * r only after that deadline, the settling of a failed one and an
 * all-to-all finish over those that said "failed". */
uint64_t collab_catch_up_window(const pulse_loco_collab *c) {
  return 2u * collab_exchange_ms(c) + 2u * c->opts.claim_timeout_ms;
}

/* How long one try at a state may take: a claim timeout to find it
 * missing or its source gone (a loaded peer answers late: 500 ms found
 * no server under load), plus twice the state's transfer time at this
 * peer's measured download rate (none measured yet: nothing more). A large
 * state over a slow link is then not cut off halfway and started again. */
static uint32_t state_try_ms(const pulse_loco_collab *c) {
  uint64_t ms = c->opts.claim_timeout_ms;
  if (c->bandwidth > 0)
    ms += 2000u * (uint64_t)loco_state_cap(c->ctx->n) / c->bandwidth;
  return ms > 600000u ? 600000u : (uint32_t)ms;
}

/* Whether url is one to ask for a state: not empty, not hosted (a client
 * serves none), not this peer's, not among the n already listed. */
static int state_source(const pulse_loco_collab *c, const char *url,
                        const char **seen, size_t n) {
  if (!collab_serves(url) || strcmp(url, c->url) == 0)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(seen[i], url) == 0)
      return 0;
  return 1;
}

/* Imports the state of round `round` from the manifest's source, a
 * contributor or any other serving member: every member that finished or
 * imported it serves the same bytes, so any live holder will do, and one
 * that died (or does not have it yet) only costs its try. */
pulse_status collab_catch_up(pulse_loco_collab *c, uint64_t round,
                             const char *src, const loco_manifest *man,
                             float *theta_r, uint64_t window_ms) {
  uint64_t end = loco_now_ms() + window_ms;
  size_t cap = 1 + (man ? man->ncontrib : 0) + c->nmembers, n = 0;
  const char **urls = calloc(cap, sizeof *urls);
  if (urls == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: state sources");
  if (src != NULL && state_source(c, src, urls, n))
    urls[n++] = src;
  for (size_t j = 0; man != NULL && j < man->ncontrib; j++) {
    const char *u = collab_url_of(c, man->contrib[j].id);
    if (state_source(c, u, urls, n))
      urls[n++] = u;
  }
  for (size_t i = 0; i < c->nmembers; i++)
    if (state_source(c, c->members[i].url, urls, n))
      urls[n++] = c->members[i].url;
  pulse_status st = PULSE_ERR_IO;
  /* A pass where nobody served it and some member is two rounds past it
   * (it keeps the state of its round and the one before): that state is
   * gone, waiting longer brings nothing. */
  uint64_t past = 0;
  while (st != PULSE_OK && loco_now_ms() < end && past < round + 2) {
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    for (size_t j = 0; j < n && st != PULSE_OK; j++) {
      uint64_t at = 0;
      st = collab_get_state(c, urls[j], round, state_try_ms(c), &b, &at);
      if (st == PULSE_OK)
        st = collab_import_state(c, urls[j], round, &b, theta_r);
      past = at > past ? at : past;
    }
    pulse_bytebuf_free(&b);
    if (st != PULSE_OK)
      loco_sleep_ms(5);
  }
  free(urls);
  if (st == PULSE_OK)
    return st;
  if (past >= round + 2)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "loco collab: no peer serves the state of round "
                      "%" PRIu64 " any more (a member is at round %" PRIu64
                      ")",
                      round, past);
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab: no peer served the state of round %" PRIu64
                    " within %" PRIu64 " ms",
                    round, window_ms);
}

/* The partitioned finish of round r (opts.partitioned): the manifest's
 * contributors, with the samples the writer granted and checked, reduce
 * their ranges (loco_partition_round); ctx finished, theta_r = theta_g,
 * bit-identical to pulse_loco_finish over the same set. Not this peer's
 * payload listed, a count missing, or the exchange failed: an error, ctx
 * still prepared (the caller then finishes all-to-all). */
pulse_status collab_reduce_partitioned(pulse_loco_collab *c, uint64_t r,
                                       const char *src,
                                       const loco_manifest *man,
                                       const uint8_t *own, size_t size,
                                       float *theta_r,
                                       pulse_loco_collab_figures *info,
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
    urls[j] = collab_url_of(c, ids[j]);
    samples[j] = man->contrib[j].samples;
    /* A client-mode member owns nothing: its rate does not weigh. */
    bw[j] = collab_serves(urls[j]) ? man->contrib[j].bandwidth : 0;
  }
  /* Range sizes in proportion to the manifest's rates, within the plan's
   * bound (docs/protocols/loco-collaboration.md "Collaboration"): every member reads the same
   * manifest, so every member plans the same ranges. */
  if (st == PULSE_OK) {
    pulse_loco_plan_weights(bw, C, weights);
    for (size_t j = 0; j < C; j++)
      if (!collab_serves(urls[j]))
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
  if (c->auth != NULL) { /* every blob signed and checked (auth hooks) */
    in.sign = collab_auth_sign_blob;
    in.accept = collab_auth_accept_blob;
    in.auth_user = c;
  }
  if (c->host_url[0] != '\0') { /* client mode: blobs through its host */
    in.upload = collab_client_upload;
    in.upload_user = c;
  }
  in.timeout_ms = (uint32_t)collab_exchange_ms(c);
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
    collab_auth_put(c, path, PULSE_LOCO_AUTH_PAYLOAD, r, own, size);
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
pulse_status collab_publish_outcome(pulse_loco_collab *c, uint64_t r,
                                    int finished) {
  /* The test hook's phase 4 (collab_impl.h): the word without the state,
   * then nothing more, as a finisher killed right after its word. */
  int dies = finished && loco_collab_test_stall_phase == 4 &&
             c->id == loco_collab_test_stall_id &&
             r == loco_collab_test_stall_round;
  if (finished && !dies)
    PULSE_TRY(collab_publish_state(c));
  pulse_status st = collab_auth_put_outcome(c, r, finished); /* auth hook */
  while (dies)
    loco_sleep_ms(1000);
  return st;
}

/* What a failed contributor last heard of another's outcome. */
enum { HEARD_NOTHING = 0, HEARD_FAILED, HEARD_FINISHED };

/* The state of r + 1 from a contributor whose last word is "finished"
 * (into *state, its URL into from): 1 when one served it. A word is no
 * served state: one whose state cannot be had (it died after its word,
 * or serves none) loses it (heard back to nothing) until it says it
 * again. */
static int state_of_a_finisher(pulse_loco_collab *c, uint64_t r,
                               const loco_manifest *man, uint8_t *heard,
                               uint8_t *warned, pulse_bytebuf *state,
                               char *from, size_t cap) {
  for (size_t j = 0; j < man->ncontrib; j++) {
    if (heard[j] != HEARD_FINISHED)
      continue;
    const char *u = collab_url_of(c, man->contrib[j].id);
    if (collab_get_state(c, u, r + 1, state_try_ms(c), state, NULL) ==
        PULSE_OK) {
      snprintf(from, cap, "%s", u);
      return 1;
    }
    if (!warned[j]) /* once: it is asked again as long as it says so */
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab round %" PRIu64 ": %s said it finished but "
                   "serves no state of round %" PRIu64 " (%s)",
                   r, u, r + 1, pulse_error_detail());
    warned[j] = 1;
    heard[j] = HEARD_NOTHING;
  }
  return 0;
}

/* A contributor whose exchange failed: the other serving contributors'
 * outcomes, read again and again until one that said "finished" serves
 * its state of r + 1 (into *state, its URL into `from`: this peer imports
 * it, so every survivor ends r with the same weights, and says "finished"
 * in its turn), or every one answered and none has a state, or `end`
 * passed. Then alive[j] says whose last word was "failed": those (and
 * this peer) finish r all-to-all, the rule every survivor applies to the
 * same answers (a dead peer answers nobody; a finisher that died after
 * its word, before anyone imported its state, left it nowhere).
 * Returns 1 (a state), 0 (nobody's) or -1 (out of memory). */
static int settle(pulse_loco_collab *c, uint64_t r, const loco_manifest *man,
                  uint64_t end, pulse_bytebuf *state, char *from, size_t cap,
                  uint8_t *alive) {
  size_t C = man->ncontrib;
  loco_fetch *t = calloc(C ? C : 1, sizeof *t);
  char(*urls)[160] = calloc(C ? C : 1, sizeof *urls);
  uint8_t *answered = calloc(C ? C : 1, 1);
  uint8_t *heard = calloc(C ? C : 1, 2), *warned = heard + C;
  size_t *idx = calloc(C ? C : 1, sizeof *idx);
  int found = 0;
  memset(alive, 0, C);
  if (!t || !urls || !answered || !heard || !idx) {
    free(t), free(urls), free(answered), free(heard), free(idx);
    return -1;
  }
  for (;;) {
    size_t q = 0, left = 0, finishers = 0;
    for (size_t j = 0; j < C; j++) {
      const char *u = collab_url_of(c, man->contrib[j].id);
      /* Client-mode contributors publish no outcome (docs/formats/loco-payload.md). */
      if (man->contrib[j].id == c->id || u[0] == '\0' ||
          loco_url_hosted(u, NULL, 0, NULL))
        continue;
      left += !answered[j];
      finishers += heard[j] == HEARD_FINISHED;
      snprintf(urls[q], sizeof urls[q], "%s/v1/loco/round/%" PRIu64 "/outcome",
               u, r);
      t[q] = (loco_fetch){0};
      t[q].url = urls[q];
      t[q].max_bytes = 64;
      t[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
      idx[q++] = j;
    }
    uint64_t now = loco_now_ms();
    if ((left == 0 && finishers == 0) || now >= end)
      break;
    loco_http_gather(t, q, now + 50u < end ? now + 50u : end);
    for (size_t a = 0; a < q; a++) {
      if (t[a].done) {
        size_t j = idx[a];
        c->fetched += t[a].body.size;
        answered[j] = 1;
        /* Checked as signed by that contributor (auth hook). */
        int word = collab_auth_outcome(c, r, man->contrib[j].id, &t[a]);
        if (word != 0)
          heard[j] = word == 2 ? HEARD_FINISHED : HEARD_FAILED;
      }
      pulse_bytebuf_free(&t[a].body);
    }
    found = state_of_a_finisher(c, r, man, heard, warned, state, from, cap);
    if (found)
      break;
  }
  for (size_t j = 0; j < C; j++)
    alive[j] = heard[j] == HEARD_FAILED;
  free(t), free(urls), free(answered), free(heard), free(idx);
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
pulse_status collab_settle_failed(pulse_loco_collab *c, uint64_t r,
                                  const char *src, loco_manifest *man,
                                  loco_fetch *t, int self_in, uint64_t done,
                                  uint64_t end, float *theta_r,
                                  pulse_loco_collab_figures *info,
                                  int *imported) {
  size_t C = man->ncontrib;
  *imported = 0;
  pulse_status st = collab_publish_outcome(c, r, 0);
  uint8_t *alive = calloc(C ? C : 1, 1);
  char from[64] = "";
  pulse_bytebuf state = PULSE_BYTEBUF_INIT;
  int found =
      alive ? settle(c, r, man, end, &state, from, sizeof from, alive) : -1;
  if (st == PULSE_OK && found < 0)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco collab: round %" PRIu64, r);
  if (st == PULSE_OK && found > 0) {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab round %" PRIu64 ": importing the state of "
                 "round %" PRIu64 " from %s, which finished it",
                 r, r + 1, from);
    pulse_loco_abandon(c->ctx, self_in);
    /* The state in hand; should it not import, any other holder's. */
    st = collab_import_state(c, from, r + 1, &state, theta_r);
    if (st != PULSE_OK)
      st = collab_catch_up(c, r + 1, from, man, theta_r,
                           collab_catch_up_window(c));
    /* It serves that state now and says so: a survivor that heard the
     * same word from a finisher since dead gets it here. */
    if (st == PULSE_OK)
      st = collab_publish_outcome(c, r, 1);
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
    st =
        collab_catch_up(c, r + 1, src, man, theta_r, collab_catch_up_window(c));
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
  pulse_bytebuf_free(&state);
  return st;
}

pulse_status collab_catch_up_or_rejoin(pulse_loco_collab *c, uint64_t r,
                                       const char *src,
                                       const loco_manifest *man,
                                       float *theta_r,
                                       pulse_loco_collab_figures *info) {
  if (loco_member_find(man->members, man->nmembers, c->id) < 0) {
    /* Not a member of r + 1 (cut off from the writer): its next call joins
     * again and imports the state the others are at then, which the
     * state of r + 1 would only delay (under a partition the others may
     * be rounds past it by the time it came). */
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab round %" PRIu64 ": left out of round %" PRIu64
                 "; this peer joins again",
                 r, r + 1);
    info->resynced = 0;
    return PULSE_OK; /* end_round marks it dropped */
  }
  pulse_status st =
      collab_catch_up(c, r + 1, src, man, theta_r, collab_catch_up_window(c));
  info->resynced = st == PULSE_OK;
  return st;
}

/* No payload of its own, or not every listed one (and no settling left):
 * the state of r + 1 from a peer that finished (the keep rule kept all of
 * s in e unless the manifest used it). */
pulse_status collab_import_finished(pulse_loco_collab *c, uint64_t r,
                                    const char *src, const loco_manifest *man,
                                    const loco_fetch *t, float *theta_r,
                                    pulse_loco_collab_figures *info) {
  if (c->ctx->prepared)
    pulse_loco_abandon(c->ctx, info->self_included);
  pulse_status st = collab_catch_up_or_rejoin(c, r, src, man, theta_r, info);
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
