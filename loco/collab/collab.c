/* collab.c - a peer of an open PULSELoCo collaboration
 * (pulse_loco_collab.h, docs/protocols/loco-collaboration.md "Collaboration"): create, start, join,
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
#include "pulse_loco_partition.h"

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)

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
 * (GET /v1/loco/members: round, the writer at rank 0, members); signed
 * when the peer has a key (auth hook). */
pulse_status collab_publish_view(pulse_loco_collab *c) {
  uint64_t r = pulse_loco_round(c->ctx);
  loco_manifest v;
  memset(&v, 0, sizeof v);
  v.round = r;
  v.coordinator = pulse_loco_collab_writer(c->members, c->nmembers, r, 0);
  v.members = c->members;
  v.nmembers = c->nmembers;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st = loco_manifest_write(&v, &b);
  if (st == PULSE_OK)
    st = collab_auth_put(c, "/v1/loco/members", PULSE_LOCO_AUTH_MEMBERS, r,
                         b.data, b.size);
  pulse_bytebuf_free(&b);
  return st;
}

/* The context's state (/v1/loco/state/ROUND, the round before kept),
 * signed when the peer has a key (auth hook). */
pulse_status collab_publish_state(pulse_loco_collab *c) {
  pulse_buffer state = {NULL, 0};
  PULSE_TRY(pulse_loco_state_export(c->ctx, &state));
  char path[64];
  uint64_t r = pulse_loco_round(c->ctx);
  snprintf(path, sizeof path, "/v1/loco/state/%" PRIu64, r);
  pulse_status st =
      collab_auth_put(c, path, PULSE_LOCO_AUTH_STATE, r, state.data, state.size);
  pulse_buffer_free(&state);
  loco_server_drop(c->srv, "/v1/loco/state/", r > 0 ? r - 1 : 0);
  return st;
}

/* This peer's own progress record (GET /v1/loco/progress). */
void collab_publish_own_progress(pulse_loco_collab *c, uint64_t r, uint64_t done,
                             uint64_t busy_ms) {
  char text[256];
  int k = snprintf(text, sizeof text,
                   "{\"id\":%u,\"round\":%" PRIu64 ",\"samples\":%" PRIu64
                   ",\"samples_per_s\":%.3f,\"target\":%" PRIu64 "}",
                   c->id, r, done, busy_ms ? done * 1000.0 / busy_ms : 0.0,
                   c->opts.target_batch);
  collab_auth_put(c, "/v1/loco/progress", PULSE_LOCO_AUTH_PROGRESS, r, text,
                  (size_t)k); /* signed (auth hook) */
}

/* Members of the round the context is at (main thread; under lock, as the
 * server thread reads them). */
void collab_set_members(pulse_loco_collab *c, const pulse_loco_member *m,
                        size_t count) {
  pthread_mutex_lock(&c->lock);
  memmove(c->members, m, count * sizeof *m);
  c->nmembers = count;
  c->cur_round = pulse_loco_round(c->ctx);
  collab_auth_listed_locked(c, m, count);
  /* Joiners the members now list are no longer pending. */
  size_t q = 0;
  for (size_t i = 0; i < c->npending; i++)
    if (loco_member_find(m, count, c->pending[i].id) < 0)
      c->pending[q++] = c->pending[i];
  c->npending = q;
  pthread_mutex_unlock(&c->lock);
}

/* ------------------------------------------------------------ create/free */

/* /metrics: the uploads this peer took and refused as a host. */
static void hosted_metrics(void *user, pulse_bytebuf *text) {
  uint64_t stored = 0, refused = 0;
  pulse_loco_collab_hosted(user, &stored, &refused);
  pulse_bytebuf_printf(text,
                       "# HELP pulse_loco_hosted_uploads_total Client-mode "
                       "members' payload uploads this peer stored or "
                       "refused.\n"
                       "# TYPE pulse_loco_hosted_uploads_total counter\n"
                       "pulse_loco_hosted_uploads_total{result=\"stored\"} "
                       "%llu\n"
                       "pulse_loco_hosted_uploads_total{result=\"refused\"} "
                       "%llu\n",
                       (unsigned long long)stored, (unsigned long long)refused);
  collab_auth_metrics(user, text);
}

void pulse_loco_collab_opts_init(pulse_loco_collab_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_LOCO_COLLAB_OPTS_VERSION;
  o->target_batch = 64;
  o->claim_timeout_ms = 1500;
  o->round_timeout_ms = 5000;
  o->partition_check = PULSE_LOCO_COLLAB_CHECK_ROTATING;
}

pulse_status pulse_loco_collab_create(const pulse_loco_collab_opts *opts,
                                      pulse_loco *ctx,
                                      pulse_loco_collab **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: NULL output");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("loco collab", opts, PULSE_LOCO_COLLAB_OPTS_VERSION));
  if ((unsigned)opts->partition_check > PULSE_LOCO_COLLAB_CHECK_RECEIPTS ||
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
  const char *client_of = opts->client_of;
  if (client_of != NULL && (strlen(client_of) > 32 || !loco_url_valid(client_of)))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: client_of '%s' is not http://A.B.C.D:PORT",
                      client_of);
  if (client_of != NULL && opts->port != 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: port %u with client_of (a client-mode "
                      "peer listens nowhere)", (unsigned)opts->port);
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
  c->opts.client_of = NULL;
  c->opts.member_keys = NULL; /* copied into the handle */
  c->opts.member_key_count = 0;
  c->opts.admission = NULL; /* copied too */
  c->ctx = ctx;
  c->id = pulse_loco_trainer_id(ctx);
  pthread_mutex_init(&c->lock, NULL);
  pulse_status st = collab_auth_start(c, opts);
  if (st != PULSE_OK) {
    pulse_loco_collab_free(c);
    return st;
  }
  /* A serving peer takes uploads of one payload at most; a client's table
   * listens nowhere. */
  st = loco_server_start_port(client_of ? NULL : host, opts->port,
                              collab_on_post, collab_on_upload, c,
                              loco_payload_cap(ctx->n) + COLLAB_SIG_TRAILER,
                              &c->srv);
  if (st != PULSE_OK) {
    pulse_loco_collab_free(c);
    return st;
  }
  loco_server_set_metrics(c->srv, hosted_metrics, c);
  if (c->auth != NULL) { /* claims, readinesses, acknowledgements checked */
    loco_server_set_gate(c->srv, collab_auth_gate, c);
    loco_server_set_reply_signer(c->srv, collab_auth_sign_reply, c);
  }
  st = collab_auth_publish_key(c); /* what the others learn its key from */
  if (st != PULSE_OK) {
    pulse_loco_collab_free(c);
    return st;
  }
  if (client_of != NULL) {
    snprintf(c->host_url, sizeof c->host_url, "%s", client_of);
    snprintf(c->url, sizeof c->url, "%s" LOCO_HOSTED_PREFIX "%u", client_of,
             c->id);
  } else {
    snprintf(c->url, sizeof c->url, "http://%s:%u", host,
             (unsigned)loco_server_port(c->srv));
  }
  *out = c;
  return PULSE_OK;
}

void pulse_loco_collab_free(pulse_loco_collab *c) {
  if (c == NULL)
    return;
  loco_server_stop(c->srv);
  collab_auth_stop(c);
  pthread_mutex_destroy(&c->lock);
  free(c->members), free(c->rec), free(c->pending);
  pulse_bytebuf_free(&c->px_raw);
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
  pulse_status st = loco_members_founding(members, count, c->id, "loco collab", "peer", 1,
                                          sorted);
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
  loco_sig sig;
  pulse_status st =
      loco_http_get_signed(url, timeout_ms, MANIFEST_CAP, &b, &status, &sig);
  if (st == PULSE_OK && status != 200)
    st = pulse_fail(PULSE_ERR_IO, "loco collab: GET %s: HTTP %ld", url,
                    status);
  if (st == PULSE_OK) {
    c->fetched += b.size;
    st = loco_manifest_parse(b.data, b.size, view);
  }
  /* Any member's signature of the round it names, not older than this
   * peer's round (auth hook); parsed first, nothing taken from it yet. */
  if (st == PULSE_OK &&
      (!collab_auth_accept(c, PULSE_LOCO_AUTH_MEMBERS, pulse_loco_round(c->ctx),
                           view->round, base, &sig, b.data, b.size) ||
       (c->auth != NULL && sig.round != view->round))) {
    loco_manifest_free(view);
    st = pulse_fail(PULSE_ERR_CORRUPT, "loco collab: the view at %s is "
                                       "refused",
                    url);
  } else if (st == PULSE_OK) {
    collab_auth_note_view(c, view); /* where its members' keys are learned */
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
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st = collab_get_state(c, base, round, timeout_ms, &b, NULL);
  if (st == PULSE_OK)
    st = collab_import_state(c, base, round, &b, theta_r);
  pulse_bytebuf_free(&b);
  return st;
}

/* The state's own digests are checked by the import; its round must be
 * the one asked for. */
pulse_status collab_import_state(pulse_loco_collab *c, const char *base,
                                 uint64_t round, const pulse_bytebuf *b,
                                 float *theta_r) {
  pulse_status st = pulse_loco_state_import(c->ctx, b->data, b->size, theta_r);
  if (st == PULSE_OK && pulse_loco_round(c->ctx) != round)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco collab: %s served round %" PRIu64
                    " for round %" PRIu64,
                    base, pulse_loco_round(c->ctx), round);
  return st;
}

pulse_status collab_get_state(pulse_loco_collab *c, const char *base,
                              uint64_t round, uint32_t timeout_ms,
                              pulse_bytebuf *out, uint64_t *at) {
  char url[160];
  url_fmt(url, sizeof url, base, "/v1/loco/state/%" PRIu64, round);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  loco_sig sig;
  pulse_status st = loco_http_get_signed(url, timeout_ms,
                                         loco_state_cap(c->ctx->n), &b,
                                         &status, &sig);
  if (st == PULSE_OK && status == 404) {
    /* Say where that peer is: its states are the last two rounds. */
    loco_manifest view;
    memset(&view, 0, sizeof view);
    int have_view = get_view(c, base, timeout_ms, &view) == PULSE_OK;
    if (have_view && at != NULL)
      *at = view.round;
    if (have_view)
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
    /* Signed by a member for that round (auth hook): refused, nothing is
     * imported. */
    if (!collab_auth_accept(c, PULSE_LOCO_AUTH_STATE, round, round, base,
                            &sig, b.data, b.size))
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco collab: the state of round %" PRIu64
                      " at %s is refused",
                      round, base);
  }
  if (st == PULSE_OK) {
    pulse_bytebuf_free(out);
    *out = b;
  } else {
    pulse_bytebuf_free(&b);
  }
  return st;
}

/* The serving member after `via` (cyclically) in the last view the join
 * had (`known`; none yet: this peer's own), other than this peer, into
 * via: 1 when there is another one. */
static int next_seed(const pulse_loco_collab *c, const loco_manifest *known,
                     char *via, size_t cap) {
  const pulse_loco_member *m = known->nmembers ? known->members : c->members;
  size_t n = known->nmembers ? known->nmembers : c->nmembers, from = 0;
  for (size_t i = 0; i < n; i++)
    if (strcmp(m[i].url, via) == 0)
      from = i + 1;
  for (size_t k = 0; k < n; k++) {
    const pulse_loco_member *x = &m[(from + k) % n];
    if (x->id != c->id && strcmp(x->url, via) != 0 &&
        !loco_url_hosted(x->url, NULL, 0, NULL)) {
      snprintf(via, cap, "%s", x->url);
      return 1;
    }
  }
  return 0;
}

pulse_status pulse_loco_collab_join(pulse_loco_collab *c, const char *seed,
                                    float *theta_r, uint32_t timeout_ms) {
  /* A client-mode member's URL names its host: the join goes there (a
   * client serves no view or state of its own). */
  char host[64];
  if (seed != NULL && loco_url_hosted(seed, host, sizeof host, NULL))
    seed = host;
  if (c == NULL || seed == NULL || theta_r == NULL || !loco_url_valid(seed))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab join: seed must be http://A.B.C.D:PORT "
                      "(or a client-mode member's URL)");
  uint64_t end = loco_now_ms() + timeout_ms;
  pulse_status st = PULSE_OK;
  /* The seed may die while this peer waits to be admitted (a member killed
   * right after it answered): then the join goes on through the next
   * serving member of the last view it had (a client joins through its
   * host only: moving to another is its own path). */
  char via[64];
  snprintf(via, sizeof via, "%s", seed);
  loco_manifest known;
  memset(&known, 0, sizeof known);
  int moved = 0; /* said once */
  do {
    loco_manifest view;
    memset(&view, 0, sizeof view);
    st = get_view(c, via, left_ms(end), &view);
    if (st != PULSE_OK && st != PULSE_ERR_CORRUPT && c->host_url[0] == '\0' &&
        next_seed(c, &known, via, sizeof via) && !moved++)
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab join: %s (%s); joining through %s and the "
                   "other members",
                   seed, pulse_error_detail(), via);
    int got = st == PULSE_OK;
    /* Test hook (phase 6, collab_impl.h): time for a test to kill the seed
     * while this peer waits to be admitted. */
    if (got && known.nmembers == 0 && loco_collab_test_stall_phase == 6 &&
        c->id == loco_collab_test_stall_id)
      loco_sleep_ms(2000);
    int at = st == PULSE_OK ? loco_member_find(view.members, view.nmembers, c->id)
                            : -1;
    /* Listed under another URL (a client that moved to another host, not
     * yet left out by the members): not admitted yet. */
    if (at >= 0 && strcmp(view.members[at].url, c->url) != 0)
      at = -1;
    if (at >= 0) {
      st = pulse_loco_collab_import(c, via, view.round, theta_r, left_ms(end));
      if (st == PULSE_OK) {
        collab_set_members(c, view.members, view.nmembers);
        c->dropped = 0;
        st = collab_publish_state(c);
        if (st == PULSE_OK)
          st = collab_publish_view(c);
        loco_manifest_free(&view);
        loco_manifest_free(&known);
        return st;
      }
    } else if (st == PULSE_OK) {
      /* Ask every member: whoever writes the next round admits (a
       * client-mode member's URL reaches its host, which ignores it). */
      for (size_t i = 0; i < view.nmembers; i++) {
        char text[160], query[640], url[900];
        long status;
        snprintf(text, sizeof text, "/v1/loco/join?id=%u&url=%s", c->id,
                 c->url);
        /* Signed by this joiner, with its admission when it has one (auth
         * hook). */
        collab_auth_join_query(c, text, query, sizeof query);
        snprintf(url, sizeof url, "%s%s%s", view.members[i].url, text, query);
        loco_http_post(url, 300, &status);
      }
    }
    if (got) { /* the last view it had, where another seed is found */
      loco_manifest_free(&known);
      known = view;
    } else {
      loco_manifest_free(&view);
    }
    loco_sleep_ms(20);
  } while (loco_now_ms() < end);
  loco_manifest_free(&known);
  return st != PULSE_OK ? st
                        : pulse_fail(PULSE_ERR_IO,
                                     "loco collab join: not admitted through "
                                     "%s in %u ms",
                                     via, timeout_ms);
}

/* ------------------------------------------------------------ client mode */

void pulse_loco_collab_hosted(const pulse_loco_collab *c, uint64_t *stored,
                              uint64_t *refused) {
  pthread_mutex_t *lock = (pthread_mutex_t *)&c->lock;
  pthread_mutex_lock(lock);
  if (stored)
    *stored = c->hosted_stored;
  if (refused)
    *refused = c->hosted_refused;
  pthread_mutex_unlock(lock);
}

/* What a client uploads to its host (docs/protocols/loco-collaboration.md "Collaboration"). */
typedef enum { UP_PAYLOAD, UP_SLICE, UP_VERDICT } upload_kind;

typedef struct {
  upload_kind kind;
  uint32_t id;      /* the client's */
  uint64_t round;   /* R */
  uint64_t attempt; /* A (slices and verdicts) */
  uint32_t owner;   /* OWNER (slices) */
} upload_path;

/* Parses "/v1/hosted/ID" followed by "/v1/loco/round/R" (the payload),
 * "/v1/loco/part/R/A/slice/OWNER" or "/v1/loco/part/R/A/verdict". */
static int parse_upload_path(const char *path, upload_path *u) {
  static const char round_mid[] = "v1/loco/round/", part_mid[] = "v1/loco/part/";
  size_t k = strlen(LOCO_HOSTED_PREFIX);
  uint64_t v;
  if (strncmp(path, LOCO_HOSTED_PREFIX, k) != 0)
    return 0;
  const char *p = path + k;
  if (!loco_take_decimal(&p, 10, '/', &v) || v > UINT32_MAX)
    return 0;
  u->id = (uint32_t)v;
  u->attempt = 0;
  u->owner = 0;
  if (strncmp(p, round_mid, sizeof round_mid - 1) == 0) {
    p += sizeof round_mid - 1;
    u->kind = UP_PAYLOAD;
    return loco_take_decimal(&p, 19, '\0', &u->round);
  }
  if (strncmp(p, part_mid, sizeof part_mid - 1) != 0)
    return 0;
  p += sizeof part_mid - 1;
  if (!loco_take_decimal(&p, 19, '/', &u->round) ||
      !loco_take_decimal(&p, 2, '/', &u->attempt))
    return 0;
  if (strcmp(p, "verdict") == 0) {
    u->kind = UP_VERDICT;
    return 1;
  }
  if (strncmp(p, "slice/", 6) != 0)
    return 0;
  p += 6;
  u->kind = UP_SLICE;
  if (!loco_take_decimal(&p, 10, '\0', &v) || v > UINT32_MAX)
    return 0;
  u->owner = (uint32_t)v;
  return 1;
}

/* Why an upload is refused (NULL: stored): its status into *status. Caller
 * holds the lock. */
static const char *upload_refusal(pulse_loco_collab *c, const char *id_text,
                                  const uint8_t *body, size_t size,
                                  const upload_path *u, unsigned *status) {
  uint32_t qid;
  *status = 400;
  if (!loco_parse_id(id_text, &qid) || qid != u->id)
    return "id missing or not the path's";
  char mine[96];
  snprintf(mine, sizeof mine, "%s" LOCO_HOSTED_PREFIX "%u", c->url, u->id);
  int at = loco_member_find(c->members, c->nmembers, u->id);
  if (u->round > c->cur_round)
    return *status = 503, "not at that round yet";
  if (u->round < c->cur_round)
    return *status = 409, "that round is over here";
  if (at < 0 || strcmp(c->members[at].url, mine) != 0)
    return *status = 403, "not a client-mode member hosted here this round";
  if (u->kind == UP_VERDICT) {
    /* A verdict names its peer, round and attempt: they must be these. */
    pulse_loco_verdict *v = malloc(sizeof *v);
    if (v == NULL)
      return *status = 500, "out of memory";
    const char *why = NULL;
    if (pulse_loco_verdict_decode(body, size, v) != PULSE_OK)
      why = "the body does not decode as a verdict";
    else if (v->peer != u->id || v->round != u->round ||
             v->attempt != u->attempt)
      why = "the verdict is another peer's, round's or attempt's";
    free(v);
    if (why != NULL)
      *status = 422;
    return why;
  }
  /* A payload, or a slice (a payload of one range): the client's own, of
   * this round and model. Their entries are checked by whoever uses them,
   * as any member's. */
  if (u->kind == UP_SLICE && loco_member_find(c->members, c->nmembers,
                                              u->owner) < 0)
    return *status = 422, "the slice's owner is not a member";
  pulse_loco_payload_header h;
  if (body == NULL || pulse_loco_payload_peek(body, size, &h) != PULSE_OK)
    return *status = 422, "the body does not decode as a payload";
  if (h.sender != u->id || h.round != u->round || h.param_count != c->ctx->n)
    return *status = 422,
           "the payload is another sender's, round's or model's";
  return NULL;
}

unsigned collab_on_upload(void *user, const char *path, const char *id_text,
                          const uint8_t *body, size_t size, char *reply,
                          size_t cap) {
  pulse_loco_collab *c = user;
  upload_path u;
  unsigned status;
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  pthread_mutex_lock(&c->lock);
  const char *why = "no such upload path";
  status = 404;
  int parsed = parse_upload_path(path, &u);
  /* Authenticating, an upload comes with its signature after it (the
   * trailer): served with the blob, for its readers to check. */
  if (parsed && c->auth != NULL) { /* a payload, a slice, a verdict */
    if (size < COLLAB_SIG_TRAILER) {
      parsed = 0;
      why = "an upload without its signature";
      status = 403;
    } else {
      size -= COLLAB_SIG_TRAILER;
      const uint8_t *t = body + size;
      sig.present = 1;
      for (int i = 0; i < 8; i++)
        sig.round |= (uint64_t)t[i] << (8 * i);
      memcpy(sig.key, t + 8, 32);
      memcpy(sig.sig, t + 40, 64);
    }
  }
  if (parsed)
    why = upload_refusal(c, id_text, body, size, &u, &status);
  if (why != NULL)
    c->hosted_refused++;
  pthread_mutex_unlock(&c->lock);
  if (why != NULL) {
    snprintf(reply, cap, "{\"error\":\"%s\"}", why);
    return status;
  }
  /* Served from here as if it were this peer's own: the same path under
   * the client's URL; its uploads of older rounds go. */
  if (loco_server_put_signed(c->srv, path, body, size, &sig) != PULSE_OK) {
    snprintf(reply, cap, "{\"error\":\"out of memory\"}");
    pthread_mutex_lock(&c->lock);
    c->hosted_refused++;
    pthread_mutex_unlock(&c->lock);
    return 500;
  }
  if (u.round >= 2) {
    char prefix[64];
    snprintf(prefix, sizeof prefix, LOCO_HOSTED_PREFIX "%u/v1/loco/round/",
             u.id);
    loco_server_drop(c->srv, prefix, u.round - 1);
    snprintf(prefix, sizeof prefix, LOCO_HOSTED_PREFIX "%u/v1/loco/part/",
             u.id);
    loco_server_drop(c->srv, prefix, u.round - 1);
  }
  pthread_mutex_lock(&c->lock);
  c->hosted_stored++;
  pthread_mutex_unlock(&c->lock);
  snprintf(reply, cap, "{\"stored\":%zu}", size);
  return 200;
}

/* The next host after a failed one: the first serving member after it in
 * id order (wrapping) that answers; the old one when none does. */
static void pick_next_host(pulse_loco_collab *c) {
  size_t M = c->nmembers, from = 0;
  for (size_t i = 0; i < M; i++)
    if (strcmp(c->members[i].url, c->host_url) == 0)
      from = i + 1;
  for (size_t j = 0; j < M; j++) {
    const pulse_loco_member *m = &c->members[(from + j) % M];
    if (m->id == c->id || loco_url_hosted(m->url, NULL, 0, NULL) ||
        strcmp(m->url, c->host_url) == 0)
      continue;
    loco_manifest view;
    memset(&view, 0, sizeof view);
    pulse_status st = get_view(c, m->url, c->opts.claim_timeout_ms, &view);
    loco_manifest_free(&view);
    if (st == PULSE_OK) {
      snprintf(c->host_url, sizeof c->host_url, "%s", m->url);
      break;
    }
  }
  snprintf(c->url, sizeof c->url, "%.40s" LOCO_HOSTED_PREFIX "%u", c->host_url,
           c->id);
  snprintf(c->rejoin_url, sizeof c->rejoin_url, "%s", c->host_url);
}

pulse_status collab_client_push(pulse_loco_collab *c, uint64_t r,
                                const uint8_t *payload, size_t size) {
  char url[192];
  url_fmt(url, sizeof url, c->url, "/v1/loco/round/%" PRIu64 "?id=%u", r,
          c->id);
  /* The host may still finish the last round (503), or be gone (no answer:
   * as long as a writer is given before it counts as dead). */
  uint64_t end = loco_now_ms() + c->opts.claim_timeout_ms;
  long status = 0;
  pulse_bytebuf reply = PULSE_BYTEBUF_INIT;
  /* Authenticating, the signature goes after the payload (auth hook): the
   * host serves it with the payload. */
  uint8_t trailer[COLLAB_SIG_TRAILER];
  uint8_t *body = NULL;
  if (collab_auth_trailer(c, r, payload, size, trailer)) {
    body = malloc(size + COLLAB_SIG_TRAILER);
    if (body == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco collab: upload");
    memcpy(body, payload, size);
    memcpy(body + size, trailer, COLLAB_SIG_TRAILER);
    payload = body;
    size += COLLAB_SIG_TRAILER;
  }
  do {
    pulse_bytebuf_free(&reply);
    pulse_status st = loco_http_post_body(url, left_ms(end), payload, size,
                                          &reply, &status);
    if (st != PULSE_OK) {
      pulse_bytebuf_free(&reply);
      free(body);
      return st;
    }
    if (status == 200) {
      pulse_bytebuf_free(&reply);
      free(body);
      c->pushed += size;
      return PULSE_OK;
    }
    if (status != 0 && status != 503)
      break;
    loco_sleep_ms(status == 0 ? 5 : 2);
  } while (loco_now_ms() < end);
  char said[160] = "";
  if (reply.size > 0)
    snprintf(said, sizeof said, ": %.*s",
             (int)(reply.size < 120 ? reply.size : 120), (const char *)reply.data);
  pulse_bytebuf_free(&reply);
  free(body);
  char old[64];
  snprintf(old, sizeof old, "%s", c->host_url);
  c->dropped = 1;
  pick_next_host(c);
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab client %u: round %" PRIu64
                    ": host %s took no payload (HTTP %ld%s); the round goes "
                    "on without it (its samples stay in error feedback), the "
                    "next call rejoins through %s",
                    c->id, r, old, status, said, c->host_url);
}

pulse_status collab_client_upload(void *user, const char *path,
                                  const uint8_t *data, size_t size,
                                  const loco_sig *sig) {
  pulse_loco_collab *c = user;
  char url[256];
  url_fmt(url, sizeof url, c->url, "%s?id=%u", path, c->id);
  /* Authenticating, its signature after it (the trailer, as a payload's):
   * the host serves the blob with it. */
  uint8_t *body = NULL;
  if (c->auth != NULL && sig != NULL && sig->present) {
    body = malloc(size + COLLAB_SIG_TRAILER);
    if (body == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco collab: upload");
    memcpy(body, data, size);
    for (int i = 0; i < 8; i++)
      body[size + (size_t)i] = (uint8_t)(sig->round >> (8 * i));
    memcpy(body + size + 8, sig->key, 32);
    memcpy(body + size + 40, sig->sig, 64);
    data = body;
    size += COLLAB_SIG_TRAILER;
  }
  /* Within the exchange: a transport error is tried again for as long as
   * a claim may take; a refusal fails this exchange (the round then ends
   * as docs/formats/loco-payload.md says for a client whose exchange failed). */
  uint64_t end = loco_now_ms() + c->opts.claim_timeout_ms;
  long status = 0;
  pulse_bytebuf reply = PULSE_BYTEBUF_INIT;
  do {
    pulse_bytebuf_free(&reply);
    pulse_status st =
        loco_http_post_body(url, left_ms(end), data, size, &reply, &status);
    if (st != PULSE_OK) {
      free(body);
      return st;
    }
    if (status == 200) {
      pulse_bytebuf_free(&reply);
      free(body);
      c->pushed += size;
      return PULSE_OK;
    }
    if (status != 0)
      break;
    loco_sleep_ms(5);
  } while (loco_now_ms() < end);
  pulse_bytebuf_free(&reply);
  free(body);
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab client %u: host %s took no %s (HTTP %ld)",
                    c->id, c->host_url, path, status);
}
