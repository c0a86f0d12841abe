/* collab.c - a peer of an open PULSELoCo collaboration
 * (pulse_loco_collab.h, PAYLOAD.md "Collaboration"): create, start, join,
 * and the round (accumulate against the writer's grants, contribute, close
 * or follow the manifest, finish). The writer's table and the POST routes
 * are collab_writer.c. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collab_impl.h"
#include "pulse_log.h"

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)
static size_t state_cap(const pulse_loco *ctx) {
  return (size_t)(64u + 8u * ctx->n);
}

static void url_fmt(char *dst, size_t cap, const char *base, const char *fmt,
                    ...) PULSE_PRINTF_(4, 5);
static void url_fmt(char *dst, size_t cap, const char *base, const char *fmt,
                    ...) {
  int k = snprintf(dst, cap, "%s", base);
  if (k < 0 || (size_t)k >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst + k, cap - (size_t)k, fmt, ap);
  va_end(ap);
}

static unsigned left_ms(uint64_t end) {
  uint64_t now = loco_now_ms();
  return now >= end ? 1u : (unsigned)(end - now);
}

/* ------------------------------------------------------------ publishing */

/* The members of the next round, as the view joiners read
 * (GET /v1/loco/members: round, the writer at rank 0, members). */
pulse_status collab_publish_view(pulse_loco_collab *c) {
  uint64_t r = pulse_loco_round(c->ctx);
  return loco_serve_view(c->srv, r, pulse_loco_collab_writer(c->members, c->nmembers, r, 0),
                         c->members, c->nmembers);
}

pulse_status collab_publish_state(pulse_loco_collab *c) { return loco_serve_state(c->srv, c->ctx); }

/* This peer's own progress record (GET /v1/loco/progress). */
void collab_publish_own_progress(pulse_loco_collab *c, uint64_t r, uint64_t done,
                             uint64_t busy_ms) {
  char text[256];
  int k = snprintf(text, sizeof text,
                   "{\"id\":%u,\"round\":%" PRIu64 ",\"samples\":%" PRIu64
                   ",\"samples_per_s\":%.3f,\"target\":%" PRIu64 "}",
                   c->id, r, done, busy_ms ? done * 1000.0 / busy_ms : 0.0,
                   c->opts.target_batch);
  loco_server_put(c->srv, "/v1/loco/progress", text, (size_t)k);
}

/* Members of the round the context is at (main thread; under lock, as the
 * server thread reads them). */
void collab_set_members(pulse_loco_collab *c, const pulse_loco_member *m,
                        size_t count) {
  pthread_mutex_lock(&c->lock);
  memmove(c->members, m, count * sizeof *m);
  c->nmembers = count;
  c->cur_round = pulse_loco_round(c->ctx);
  /* Joiners the members now list are no longer pending. */
  size_t q = 0;
  for (size_t i = 0; i < c->npending; i++)
    if (loco_member_find(m, count, c->pending[i].id) < 0)
      c->pending[q++] = c->pending[i];
  c->npending = q;
  pthread_mutex_unlock(&c->lock);
}

/* ------------------------------------------------------------ create/free */

pulse_status pulse_loco_collab_create(const pulse_loco_collab_opts *opts,
                                      pulse_loco *ctx,
                                      pulse_loco_collab **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: NULL output");
  *out = NULL;
  if (opts == NULL || opts->struct_version != PULSE_LOCO_COLLAB_OPTS_VERSION ||
      ctx == NULL || opts->target_batch == 0 || opts->claim_timeout_ms == 0 ||
      opts->round_timeout_ms == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: bad options");
  if (ctx->opts.rule != PULSE_LOCO_RULE_KEEP)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: the context must use the keep rule (a "
                      "payload left out of a round stays in error feedback)");
  const char *host = opts->host ? opts->host : "127.0.0.1";
  char probe[64];
  snprintf(probe, sizeof probe, "http://%s:1", host);
  if (strlen(host) > 15 || !loco_url_valid(probe))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: host '%s' is not an IPv4 address", host);
  pulse_loco_collab *c = calloc(1, sizeof *c);
  if (c != NULL) {
    c->members = calloc(LOCO_MAX_MEMBERS, sizeof *c->members);
    c->rec = calloc(LOCO_MAX_MEMBERS, sizeof *c->rec);
    c->pending = calloc(LOCO_MAX_MEMBERS, sizeof *c->pending);
  }
  if (c == NULL || !c->members || !c->rec || !c->pending) {
    if (c)
      free(c->members), free(c->rec), free(c->pending);
    free(c);
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab");
  }
  c->opts = *opts;
  c->opts.host = NULL;
  c->ctx = ctx;
  c->id = pulse_loco_trainer_id(ctx);
  pthread_mutex_init(&c->lock, NULL);
  pulse_status st = loco_server_start_on(host, collab_on_post, c, &c->srv);
  if (st != PULSE_OK) {
    pulse_loco_collab_free(c);
    return st;
  }
  snprintf(c->url, sizeof c->url, "http://%s:%u", host,
           (unsigned)loco_server_port(c->srv));
  *out = c;
  return PULSE_OK;
}

void pulse_loco_collab_free(pulse_loco_collab *c) {
  if (c == NULL)
    return;
  loco_server_stop(c->srv);
  pthread_mutex_destroy(&c->lock);
  free(c->members), free(c->rec), free(c->pending);
  free(c);
}

const char *pulse_loco_collab_url(const pulse_loco_collab *c) {
  return c->url;
}

void pulse_loco_collab_members(const pulse_loco_collab *c,
                               pulse_loco_member *m, size_t max,
                               size_t *count) {
  for (size_t i = 0; i < c->nmembers && i < max; i++)
    m[i] = c->members[i];
  if (count)
    *count = c->nmembers;
}

pulse_status pulse_loco_collab_start(pulse_loco_collab *c,
                                     const pulse_loco_member *members,
                                     size_t count) {
  if (c == NULL || members == NULL || count == 0 || count > LOCO_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: 1..%u founding members",
                      LOCO_MAX_MEMBERS);
  pulse_loco_member *sorted = malloc(count * sizeof *sorted);
  if (sorted == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: members");
  pulse_status st = loco_members_founding(members, count, c->id, "loco collab", "peer", sorted);
  if (st == PULSE_OK)
    collab_set_members(c, sorted, count);
  free(sorted);
  if (st == PULSE_OK)
    st = collab_publish_state(c);
  if (st == PULSE_OK)
    st = collab_publish_view(c);
  return st;
}

/* ------------------------------------------------------------ state, join */

static pulse_status get_view(pulse_loco_collab *c, const char *base,
                             unsigned timeout_ms, loco_manifest *view) {
  char url[160];
  url_fmt(url, sizeof url, base, "/v1/loco/members");
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  pulse_status st = loco_http_get(url, timeout_ms, MANIFEST_CAP, &b, &status);
  if (st == PULSE_OK && status != 200)
    st = pulse_fail(PULSE_ERR_IO, "loco collab: GET %s: HTTP %ld", url,
                    status);
  if (st == PULSE_OK) {
    c->fetched += b.size;
    st = loco_manifest_parse(b.data, b.size, view);
  }
  pulse_bytebuf_free(&b);
  return st;
}

pulse_status pulse_loco_collab_import(pulse_loco_collab *c, const char *base,
                                      uint64_t round, float *theta_r,
                                      uint32_t timeout_ms) {
  if (c == NULL || base == NULL || !loco_url_valid(base))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: state source must be http://A.B.C.D:PORT");
  char url[160];
  url_fmt(url, sizeof url, base, "/v1/loco/state/%" PRIu64, round);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  pulse_status st =
      loco_http_get(url, timeout_ms, state_cap(c->ctx), &b, &status);
  if (st == PULSE_OK && status == 404) {
    /* Say where that peer is: its states are the last two rounds. */
    loco_manifest view;
    memset(&view, 0, sizeof view);
    if (get_view(c, base, timeout_ms, &view) == PULSE_OK)
      st = pulse_fail(PULSE_ERR_NOT_FOUND,
                      "loco collab: %s does not serve the state of round "
                      "%" PRIu64 " (it is at round %" PRIu64
                      " and keeps rounds %" PRIu64 "..%" PRIu64 ")",
                      base, round, view.round,
                      view.round > 0 ? view.round - 1 : 0, view.round);
    else
      st = pulse_fail(PULSE_ERR_NOT_FOUND,
                      "loco collab: %s does not serve the state of round "
                      "%" PRIu64,
                      base, round);
    loco_manifest_free(&view);
  } else if (st == PULSE_OK && status != 200) {
    st = pulse_fail(PULSE_ERR_IO, "loco collab: GET %s: HTTP %ld", url,
                    status);
  }
  if (st == PULSE_OK) {
    c->fetched += b.size;
    /* The state's own digests are checked by the import; its round must
     * be the one asked for. */
    uint64_t had = pulse_loco_round(c->ctx);
    (void)had;
    st = pulse_loco_state_import(c->ctx, b.data, b.size, theta_r);
    if (st == PULSE_OK && pulse_loco_round(c->ctx) != round)
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco collab: %s served round %" PRIu64
                      " for round %" PRIu64,
                      base, pulse_loco_round(c->ctx), round);
  }
  pulse_bytebuf_free(&b);
  return st;
}

pulse_status pulse_loco_collab_join(pulse_loco_collab *c, const char *seed,
                                    float *theta_r, uint32_t timeout_ms) {
  if (c == NULL || seed == NULL || theta_r == NULL || !loco_url_valid(seed))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab join: seed must be http://A.B.C.D:PORT");
  uint64_t end = loco_now_ms() + timeout_ms;
  pulse_status st = PULSE_OK;
  do {
    loco_manifest view;
    memset(&view, 0, sizeof view);
    st = get_view(c, seed, left_ms(end), &view);
    if (st == PULSE_OK && loco_member_find(view.members, view.nmembers, c->id) >= 0) {
      st = pulse_loco_collab_import(c, seed, view.round, theta_r, left_ms(end));
      if (st == PULSE_OK) {
        collab_set_members(c, view.members, view.nmembers);
        c->dropped = 0;
        st = collab_publish_state(c);
        if (st == PULSE_OK)
          st = collab_publish_view(c);
        loco_manifest_free(&view);
        return st;
      }
    } else if (st == PULSE_OK) {
      /* Ask every member: whoever writes the next round admits. */
      for (size_t i = 0; i < view.nmembers; i++) {
        char url[200];
        long status;
        snprintf(url, sizeof url, "%s/v1/loco/join?id=%u&url=%s",
                 view.members[i].url, c->id, c->url);
        loco_http_post(url, 300, &status);
      }
    }
    loco_manifest_free(&view);
    loco_sleep_ms(20);
  } while (loco_now_ms() < end);
  return st != PULSE_OK ? st
                        : pulse_fail(PULSE_ERR_IO,
                                     "loco collab join: not admitted through "
                                     "%s in %u ms",
                                     seed, timeout_ms);
}
