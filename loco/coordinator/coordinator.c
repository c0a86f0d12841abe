/* coordinator.c - a trainer's side of the PULSELoCo exchange over HTTP
 * (pulse_loco.h, docs/protocols/loco-exchange.md "Exchange"). One round, for the members M of
 * round r and coordinator c = min(M):
 *
 *   every member   prepares its payload and serves it at /v1/loco/round/r
 *   c              fetches the others' payloads until the deadline; the
 *                  contributor set C is c plus every valid payload that
 *                  arrived; publishes relays and the manifest (C with sizes
 *                  and SHA-256, and the members of round r + 1)
 *   the others     fetch the manifest, then each listed payload (from its
 *                  sender, else from c's relay), check the hashes
 *   every member   finishes with exactly C, so every theta_g stays the same
 *                  bits; a member left out of C keeps all of s in e
 *
 * Joins and leaves take effect between rounds through the manifest. */
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_testing.h"
#include "peer_http_impl.h"
#include "loco_impl.h"
#include "manifest_impl.h"
#include "coordinator_auth_impl.h"
#include "coordinator_impl.h"
#include "payload_impl.h"
#include "pulse_log.h"
#include "rng_impl.h"
#include "status_impl.h"


/* ---------------------------------------------------------- POST handler */

static unsigned on_post(void *user, const char *path, const char *id_text,
                        const char *url, char *reply, size_t cap) {
  pulse_loco_coord *n = user;
  uint32_t id;
  if (!loco_parse_id(id_text, &id)) {
    snprintf(reply, cap, "{\"error\":\"id missing or malformed\"}");
    return 400;
  }
  unsigned status = 200;
  pthread_mutex_lock(&n->lock);
  if (strcmp(path, "/v1/loco/join") == 0) {
    if (!loco_url_valid(url) || strlen(url) >= sizeof n->pending[0].url) {
      snprintf(reply, cap, "{\"error\":\"url must be http://A.B.C.D:PORT\"}");
      status = 400;
    } else if (n->npending == LOCO_MAX_MEMBERS) {
      snprintf(reply, cap, "{\"error\":\"too many pending joins\"}");
      status = 503;
    } else {
      size_t i = 0;
      while (i < n->npending && n->pending[i].id != id)
        i++;
      n->pending[i].id = id;
      snprintf(n->pending[i].url, sizeof n->pending[i].url, "%s", url);
      n->npending += i == n->npending;
      /* A trainer dropped after missed rounds joins again under its id:
       * the admission of its previous join must be gone before this POST
       * is answered, or it reads that stale round and waits for a state
       * this node no longer serves (the liveness defect of issue 16). */
      char admission[64];
      snprintf(admission, sizeof admission, "/v1/loco/join/%u", id);
      loco_server_drop(n->srv, admission, 0);
      snprintf(reply, cap, "{\"pending\":true}");
      status = 202;
    }
  } else if (strcmp(path, "/v1/loco/leave") == 0) {
    if (n->nleaving < LOCO_MAX_MEMBERS)
      n->leaving[n->nleaving++] = id;
    snprintf(reply, cap, "{\"ok\":true}");
  } else if (strncmp(path, "/v1/loco/round/", 15) == 0) {
    char *end;
    unsigned long long r = strtoull(path + 15, &end, 10);
    if (end == path + 15 || strcmp(end, "/done") != 0) {
      snprintf(reply, cap, "{\"error\":\"no such endpoint\"}");
      status = 404;
    } else {
      if (n->nacks == sizeof n->acks / sizeof n->acks[0])
        n->nacks = 0; /* only the latest rounds matter */
      n->acks[n->nacks++] = (ack){r, id};
      snprintf(reply, cap, "{\"ok\":true}");
    }
  } else {
    snprintf(reply, cap, "{\"error\":\"no such endpoint\"}");
    status = 404;
  }
  pthread_mutex_unlock(&n->lock);
  return status;
}

/* ---------------------------------------------------------------- helpers */

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)
#define MANIFESTS_KEPT 64u

void loco_node_set_members(pulse_loco_coord *n, const pulse_loco_member *m,
                        size_t count) {
  uint32_t misses[LOCO_MAX_MEMBERS];
  for (size_t i = 0; i < count; i++) {
    int old = loco_member_find(n->members, n->nmembers, m[i].id);
    misses[i] = old >= 0 ? n->misses[old] : 0;
  }
  memmove(n->members, m, count * sizeof *m);
  memcpy(n->misses, misses, count * sizeof *misses);
  n->nmembers = count;
}

/* Both signed by this node when it authenticates (auth hooks). */
static pulse_status publish_view(pulse_loco_coord *n) {
  return loco_auth_put_view(n, pulse_loco_round(n->ctx),
                            n->nmembers ? n->members[0].id : n->id);
}

pulse_status loco_node_publish_state(pulse_loco_coord *n) {
  return loco_auth_put_state(n);
}

void loco_node_url_fmt(char *dst, size_t cap, const char *base, const char *fmt,
                    ...) {
  int k = snprintf(dst, cap, "%s", base);
  if (k < 0 || (size_t)k >= cap)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dst + k, cap - (size_t)k, fmt, ap);
  va_end(ap);
}

/* ------------------------------------------------------------ create/free */

void pulse_loco_coord_opts_init(pulse_loco_coord_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_LOCO_COORD_OPTS_VERSION;
  o->deadline_ms = 2000;
  o->manifest_timeout_ms = 10000;
  o->max_misses = 3;
  o->transport = PULSE_LOCO_TRANSPORT_HTTP;
  o->max_datagram = 1472;
  o->quiet_ms = 30;
  o->resync_range = 1024;
  o->resync_period = 1;
  o->drift_budget = 0.01;
  o->auth = PULSE_LOCO_AUTH_AUTO;
}

pulse_status pulse_loco_coord_create(const pulse_loco_coord_opts *opts,
                                    pulse_loco *ctx, pulse_loco_coord **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco node: NULL output");
  *out = NULL;
  if (opts != NULL && opts->struct_version != PULSE_LOCO_COORD_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_VERSION,
                      "loco node: options of version %u, this library's are "
                      "%u (start from pulse_loco_coord_opts_init)",
                      opts->struct_version, PULSE_LOCO_COORD_OPTS_VERSION);
  pulse_loco_test_hooks hooks = {0};
  if (opts != NULL && opts->test_hooks != NULL)
    hooks = *opts->test_hooks;
  if (opts == NULL || ctx == NULL || opts->deadline_ms == 0 ||
      opts->manifest_timeout_ms == 0 || opts->max_misses == 0 ||
      !(hooks.drop_rate >= 0.0 && hooks.drop_rate <= 1.0) ||
      (unsigned)opts->transport > PULSE_LOCO_TRANSPORT_UDP ||
      (unsigned)opts->auth > PULSE_LOCO_AUTH_OFF)
    return pulse_fail(PULSE_ERR_ARG, "loco node: bad options");
  if (opts->transport == PULSE_LOCO_TRANSPORT_UDP &&
      (opts->max_datagram < pulse_loco_chunk_bound() ||
       opts->max_datagram > LOCO_UDP_MAX || opts->quiet_ms == 0 ||
       !(hooks.datagram_drop >= 0.0 && hooks.datagram_drop <= 1.0) ||
       opts->resync_range == 0 ||
       opts->resync_range % PULSE_LOCO_CHUNK_CELL != 0 ||
       opts->resync_period == 0 || !(opts->drift_budget >= 0.0) ||
       ctx->opts.rule != PULSE_LOCO_RULE_DROP || ctx->opts.gate_mean))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco node: bad UDP options (datagram %zu..%u bytes, "
                      "ranges of whole cells, the drop rule, no gate_mean)",
                      pulse_loco_chunk_bound(), LOCO_UDP_MAX);
  if (opts->transport != PULSE_LOCO_TRANSPORT_UDP && opts->udp_port != 0)
    return pulse_fail(PULSE_ERR_ARG, "loco node: udp_port %u without the UDP "
                      "transport", (unsigned)opts->udp_port);
  pulse_loco_coord *n = calloc(1, sizeof *n);
  if (n == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco node");
  n->opts = *opts;
  n->opts.test_hooks = NULL; /* the caller's: copied into hooks */
  n->hooks = hooks;
  n->ctx = ctx;
  n->id = pulse_loco_trainer_id(ctx);
  pthread_mutex_init(&n->lock, NULL);
  const char *host = opts->host ? opts->host : "127.0.0.1";
  snprintf(n->url, sizeof n->url, "http://%s:1", host);
  if (strlen(host) > 15 || !loco_url_valid(n->url)) {
    pthread_mutex_destroy(&n->lock);
    free(n);
    return pulse_fail(PULSE_ERR_ARG, "loco node: host '%s' is not an IPv4 "
                      "address", host);
  }
  pulse_status st =
      loco_server_start_port(host, opts->port, on_post, NULL, n, 0, &n->srv);
  if (st != PULSE_OK) {
    pthread_mutex_destroy(&n->lock);
    free(n);
    return st;
  }
  snprintf(n->url, sizeof n->url, "http://%s:%u", host,
           (unsigned)loco_server_port(n->srv));
  if ((st = loco_auth_start(n, opts)) != PULSE_OK) { /* auth hook */
    pulse_loco_coord_free(n);
    return st;
  }
  if (opts->transport == PULSE_LOCO_TRANSPORT_UDP &&
      (st = loco_node_udp_start(n)) != PULSE_OK) {
    pulse_loco_coord_free(n);
    return st;
  }
  *out = n;
  return PULSE_OK;
}

void pulse_loco_coord_free(pulse_loco_coord *n) {
  if (n == NULL)
    return;
  loco_server_stop(n->srv);
  loco_auth_stop(n); /* auth hook: after the server (its gate, metrics) */
  loco_node_udp_stop(n);
  pthread_mutex_destroy(&n->lock);
  free(n);
}

const char *pulse_loco_coord_url(const pulse_loco_coord *n) {
  return n->url;
}

void pulse_loco_coord_members(const pulse_loco_coord *n, pulse_loco_member *m,
                             size_t max, size_t *count) {
  for (size_t i = 0; i < n->nmembers && i < max; i++)
    m[i] = n->members[i];
  if (count)
    *count = n->nmembers;
}

pulse_status pulse_loco_coord_start(pulse_loco_coord *n,
                                   const pulse_loco_member *members,
                                   size_t count) {
  if (n == NULL || members == NULL || count == 0 || count > LOCO_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_ARG, "loco node: 1..%u founding members",
                      LOCO_MAX_MEMBERS);
  pulse_loco_member sorted[LOCO_MAX_MEMBERS];
  PULSE_TRY(loco_members_founding(members, count, n->id, "loco node", "node", 0, sorted));
  PULSE_TRY(loco_auth_check_founders(n, sorted, count)); /* auth hook */
  loco_node_set_members(n, sorted, count);
  PULSE_TRY(loco_node_publish_state(n));
  return publish_view(n);
}

/* ------------------------------------------------------------------- join */

pulse_status loco_node_get_json(const char *url, unsigned timeout_ms,
                             loco_manifest *m, uint64_t *fetched) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st = loco_http_wait(url, timeout_ms, MANIFEST_CAP, &b);
  if (st == PULSE_OK) {
    *fetched += b.size;
    st = loco_manifest_parse(b.data, b.size, m);
  }
  pulse_bytebuf_free(&b);
  return st;
}

static unsigned left_ms(uint64_t end) {
  uint64_t now = loco_now_ms();
  return now >= end ? 1u : (unsigned)(end - now);
}

/* Loads the newest state the coordinator at `coord` serves, of round
 * min_round or later, and takes the members of that round from its view.
 * The coordinator keeps only its last two states: a member that fell
 * behind (slow, re-joining, re-syncing while the others moved on) asks
 * for the round it needs and would wait for a state that is gone. The
 * view (GET /v1/loco/members) is published after the state of its round,
 * so the state it names is there unless the group moved on meanwhile:
 * then read the view again. */
pulse_status loco_node_catch_up(pulse_loco_coord *n, const char *coord,
                                uint32_t coord_id, uint64_t min_round,
                                float *theta_r, uint64_t end) {
  char url[160];
  pulse_status st;
  for (;;) {
    loco_manifest view;
    loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/members");
    /* Signed by the node at coord (auth hook). */
    PULSE_TRY(loco_auth_get_view(n, url, left_ms(end), coord_id, &view));
    if (view.round >= min_round &&
        loco_member_find(view.members, view.nmembers, view.coordinator) >= 0) {
      loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/state/%llu",
              (unsigned long long)view.round);
      pulse_bytebuf b = PULSE_BYTEBUF_INIT;
      unsigned wait = left_ms(end);
      /* Signed by that node for that round (auth hook): a state of
       * another round, or not its, is refused before it is imported. */
      st = loco_auth_get(n, url, wait < 500u ? wait : 500u,
                         loco_state_cap(n->ctx->n), PULSE_LOCO_AUTH_STATE,
                         view.round, view.round, coord_id, &b);
      if (st == PULSE_OK) {
        n->fetched += b.size;
        st = pulse_loco_state_import(n->ctx, b.data, b.size, theta_r);
        if (st == PULSE_OK)
          loco_node_set_members(n, view.members, view.nmembers);
      }
      pulse_bytebuf_free(&b);
      if (st == PULSE_OK || st != PULSE_ERR_IO) {
        loco_manifest_free(&view);
        return st;
      }
    }
    loco_manifest_free(&view);
    if (loco_now_ms() >= end)
      return pulse_fail(PULSE_ERR_IO,
                        "loco node: no state of round %llu or later at %s",
                        (unsigned long long)min_round, coord);
    loco_sleep_ms(2);
  }
}

/* Registers with the coordinator named by `seed`'s view and loads the
 * state of the first round the coordinator admits this node to. */
static pulse_status join_via(pulse_loco_coord *n, const char *seed,
                             float *theta_r, uint64_t end) {
  char url[160];
  loco_manifest view;
  loco_node_url_fmt(url, sizeof url, seed, "/v1/loco/members");
  /* Signed by the seed, any member (auth hook). */
  PULSE_TRY(loco_auth_get_view(n, url, left_ms(end), LOCO_AUTH_ANY_SIGNER,
                               &view));
  int c = loco_member_find(view.members, view.nmembers, view.coordinator);
  char coord[64];
  if (c < 0) {
    loco_manifest_free(&view);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco join: the coordinator is not a member");
  }
  snprintf(coord, sizeof coord, "%s", view.members[c].url);
  uint32_t coord_id = view.coordinator;
  loco_manifest_free(&view);
  char join[800]; /* the auth hook adds the signature and the admission */
  size_t at = (size_t)snprintf(join, sizeof join, "%s", coord);
  snprintf(join + at, sizeof join - at, "/v1/loco/join?id=%u&url=%s", n->id,
           n->url);
  uint64_t seq = loco_auth_join_query(n, join + at, join + strlen(join),
                                      sizeof join - strlen(join));
  long status;
  PULSE_TRY(loco_http_post(join, left_ms(end), &status));
  if (status != 202)
    return pulse_fail(PULSE_ERR_IO, "loco join: %s answered %ld", coord,
                      status);
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/join/%u", n->id);
  pulse_status st;
  uint64_t round = 0;
  for (;;) {
    /* Signed by the coordinator for this join (auth hook). */
    st = loco_auth_get_admission(n, url, left_ms(end), coord_id, seq, &round);
    if (st == PULSE_OK && round > pulse_loco_round(n->ctx))
      break;
    if (st != PULSE_OK && st != PULSE_ERR_CORRUPT)
      break;
    /* An admission of an earlier join under this id (the coordinator
     * drops it when this join arrives; this guards an older coordinator,
     * or one served by a hostile host: refused): not this join's, poll
     * again until the next manifest admits. */
    if (loco_now_ms() >= end) {
      if (st == PULSE_OK)
        st = pulse_fail(PULSE_ERR_IO, "loco join: only a stale admission (%llu)",
                        (unsigned long long)round);
      break;
    }
    loco_sleep_ms(5);
  }
  if (st != PULSE_OK)
    return st;
  /* The state of the admission round, or a later one when the group moved
   * on meanwhile; the members come with it. */
  PULSE_TRY(loco_node_catch_up(n, coord, coord_id, round, theta_r, end));
  if (loco_member_find(n->members, n->nmembers, n->id) < 0)
    return pulse_fail(PULSE_ERR_IO,
                      "loco join: dropped again before the first round");
  round = pulse_loco_round(n->ctx);
  loco_auth_post(n, coord, PULSE_LOCO_AUTH_DONE, round - 1, left_ms(end));
  PULSE_TRY(loco_node_publish_state(n));
  return publish_view(n);
}

pulse_status pulse_loco_coord_join(pulse_loco_coord *n, const char *seed_url,
                                  float *theta_r, uint32_t timeout_ms) {
  if (n == NULL || seed_url == NULL || !loco_url_valid(seed_url))
    return pulse_fail(PULSE_ERR_ARG,
                      "loco join: seed must be http://A.B.C.D:PORT");
  uint64_t end = loco_now_ms() + timeout_ms;
  pulse_status st;
  do {
    st = join_via(n, seed_url, theta_r, end);
    if (st == PULSE_OK)
      return st;
    loco_sleep_ms(5);
  } while (loco_now_ms() < end);
  return st;
}

/* ------------------------------------------------------------------ round */

/* Uniform in [0, 1) from (seed, round, sender): a simulated loss, the key
 * mixed once. pulse_rng_next mixes its state plus one increment, so the
 * state starts one increment back: the draws stay those of every run so
 * far (and of tools/sim/sim_trainers.c). */
static double drop_draw(uint64_t seed, uint64_t round, uint32_t sender) {
  uint64_t key =
      seed ^ (round * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)sender << 40);
  uint64_t state = key - 0x9E3779B97F4A7C15ull;
  return pulse_rng_uniform(&state);
}

double pulse_loco_datagram_draw(uint64_t seed, uint64_t round, uint32_t sender,
                                uint32_t receiver, uint64_t index) {
  /* Another key than drop_draw's (the receiver and the index mixed in),
   * through one more mixing step: neighbouring indices must not give
   * correlated draws. */
  uint64_t key = seed ^ (round * 0x9E3779B97F4A7C15ull) ^
                 ((uint64_t)sender << 40) ^ ((uint64_t)receiver << 20) ^
                 (index * 0xD1B54A32D192ED03ull);
  pulse_rng_uniform(&key);
  return pulse_rng_uniform(&key);
}

pulse_status pulse_loco_transport_parse(const char *name,
                                        pulse_loco_transport *out) {
  if (name != NULL && out != NULL && strcmp(name, "http") == 0)
    return *out = PULSE_LOCO_TRANSPORT_HTTP, PULSE_OK;
  if (name != NULL && out != NULL && strcmp(name, "udp") == 0)
    return *out = PULSE_LOCO_TRANSPORT_UDP, PULSE_OK;
  return pulse_fail(PULSE_ERR_ARG, "loco: transport must be http or udp");
}

static int acked_by_all(pulse_loco_coord *n, uint64_t round,
                        const pulse_loco_member *m, size_t count) {
  pthread_mutex_lock(&n->lock);
  size_t have = 0;
  for (size_t i = 0; i < count; i++) {
    int seen = m[i].id == n->id;
    for (size_t a = 0; a < n->nacks && !seen; a++)
      seen = n->acks[a].round == round && n->acks[a].id == m[i].id;
    have += seen;
  }
  pthread_mutex_unlock(&n->lock);
  return have == count;
}

pulse_status pulse_loco_coord_linger(pulse_loco_coord *n, uint32_t timeout_ms) {
  if (n == NULL || !n->coordinated)
    return PULSE_OK;
  uint64_t end = loco_now_ms() + timeout_ms;
  while (!acked_by_all(n, n->coordinated_round, n->owed, n->nowed)) {
    if (loco_now_ms() >= end)
      return pulse_fail(
          PULSE_ERR_IO,
          "loco node: members still fetching round %llu after %u ms",
          (unsigned long long)n->coordinated_round, timeout_ms);
    loco_sleep_ms(2);
  }
  return PULSE_OK;
}

pulse_status loco_node_close_round(pulse_loco_coord *n, uint64_t r,
                                   int leaving, const loco_contrib_ref *refs,
                                   size_t c, pulse_loco_member *next,
                                   size_t *nn_out) {
  size_t M = n->nmembers;
  /* Members of the next round: minus leavers and the long silent, plus the
   * pending joiners. */
  pulse_loco_member admitted[LOCO_MAX_MEMBERS];
  size_t nn = 0, na = 0;
  pulse_status st = PULSE_OK;
  pthread_mutex_lock(&n->lock);
  for (size_t j = 0; j < M; j++) {
    uint32_t id = n->members[j].id;
    int leaves = (id == n->id && leaving) ||
                 (id != n->id && n->misses[j] >= n->opts.max_misses);
    for (size_t k = 0; k < n->nleaving && !leaves; k++)
      leaves = n->leaving[k] == id;
    if (!leaves)
      next[nn++] = n->members[j];
    else
      PULSE_LOG_AT(PULSE_LOG_INFO,
                   "loco round %llu: trainer %u leaves the group",
                   (unsigned long long)r, id);
  }
  n->nleaving = 0;
  for (size_t k = 0; k < n->npending && nn < LOCO_MAX_MEMBERS; k++)
    if (loco_member_find(next, nn, n->pending[k].id) < 0 &&
        n->pending[k].id != n->id) {
      next[nn++] = n->pending[k];
      admitted[na++] = n->pending[k];
      PULSE_LOG_AT(
          PULSE_LOG_INFO, "loco round %llu: trainer %u joins from round %llu",
          (unsigned long long)r, n->pending[k].id, (unsigned long long)(r + 1));
    }
  n->npending = 0;
  pthread_mutex_unlock(&n->lock);
  qsort(next, nn, sizeof *next, loco_member_by_id);

  /* Admissions, then the manifest: once it is visible, all it names can
   * be fetched (an HTTP coordinator published its relays before). */
  char path[96];
  for (size_t k = 0; k < na && st == PULSE_OK; k++) /* signed (auth hook) */
    st = loco_auth_put_admission(n, admitted[k].id, r + 1);
  loco_manifest man = {r, n->id, 1, (loco_contrib_ref *)refs, c, next, nn};
  pulse_bytebuf mb = PULSE_BYTEBUF_INIT;
  if (st == PULSE_OK)
    st = loco_manifest_write(&man, &mb);
  if (st == PULSE_OK) {
    snprintf(path, sizeof path, "/v1/loco/round/%llu/manifest",
             (unsigned long long)r);
    st = loco_auth_put(n, path, PULSE_LOCO_AUTH_MANIFEST, r, mb.data,
                       mb.size); /* signed (auth hook) */
  }
  pulse_bytebuf_free(&mb);
  *nn_out = nn;
  return st;
}

static pulse_status coordinate(pulse_loco_coord *n, uint64_t r,
                               const uint8_t *own, size_t own_size, int leaving,
                               float *theta_r, pulse_loco_coord_step_figures *info) {
  size_t M = n->nmembers;
  loco_fetch *t = calloc(M, sizeof *t);
  char(*urls)[160] = calloc(M, sizeof *urls);
  pulse_loco_contribution *set = calloc(M, sizeof *set);
  loco_contrib_ref *refs = calloc(M, sizeof *refs);
  pulse_status st = PULSE_OK;
  if (!t || !urls || !set || !refs) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco node: round %llu",
                    (unsigned long long)r);
    goto done;
  }
  for (size_t j = 0; j < M; j++) {
    loco_node_url_fmt(urls[j], sizeof urls[j], n->members[j].url, "/v1/loco/round/%llu",
            (unsigned long long)r);
    t[j].url = urls[j];
    t[j].max_bytes = loco_payload_cap(n->ctx->n);
    t[j].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  /* Gather everyone else's payload until the deadline. */
  loco_fetch *others = t + 1; /* members[0] is this node (lowest id) */
  st = loco_http_gather(others, M - 1, loco_now_ms() + n->opts.deadline_ms);
  if (st != PULSE_OK)
    goto done;
  size_t c = 0;
  set[c] = (pulse_loco_contribution){own, own_size};
  refs[c].id = n->id;
  refs[c].bytes = own_size;
  loco_sha256(own, own_size, refs[c].sha256);
  c++;
  for (size_t j = 1; j < M; j++) {
    uint32_t id = n->members[j].id;
    pulse_loco_payload_header h;
    int ok = t[j].done;
    if (ok)
      n->fetched += t[j].body.size;
    int lost = ok && n->hooks.drop_rate > 0.0 &&
               drop_draw(n->hooks.drop_seed, r, id) < n->hooks.drop_rate;
    if (lost)
      ok = 0; /* simulated loss */
    if (ok && !loco_auth_accept(n, PULSE_LOCO_AUTH_PAYLOAD, r, id, &t[j].sig,
                                t[j].body.data, t[j].body.size))
      ok = 0; /* refused by authentication (counted): left out */
    if (ok &&
        (pulse_loco_payload_peek(t[j].body.data, t[j].body.size, &h) !=
             PULSE_OK ||
         h.sender != id ||
         pulse_loco_check(n->ctx, t[j].body.data, t[j].body.size) != PULSE_OK))
      ok = 0; /* a payload that does not check is as good as lost */
    /* Misses count silence only: a member whose payload came back but was
     * lost (simulated) is alive, and loss must not evict it (issue 16). */
    int silent = !t[j].done || (!ok && !lost);
    n->misses[j] = silent ? n->misses[j] + 1 : 0;
    if (!ok) {
      PULSE_LOG_AT(PULSE_LOG_INFO, "loco round %llu: trainer %u left out (%s)",
                   (unsigned long long)r, id,
                   t[j].done ? "lost or invalid" : "deadline");
      continue;
    }
    set[c] = (pulse_loco_contribution){t[j].body.data, t[j].body.size};
    refs[c].id = id;
    refs[c].bytes = t[j].body.size;
    loco_sha256(t[j].body.data, t[j].body.size, refs[c].sha256);
    c++;
  }
  /* Relays first: once the manifest is visible, all it names can be
   * fetched. */
  for (size_t k = 0; k < c && st == PULSE_OK; k++) {
    char path[96];
    snprintf(path, sizeof path, "/v1/loco/round/%llu/from/%u",
             (unsigned long long)r, refs[k].id);
    /* The original signer's signature goes with it (auth hook). */
    int j = loco_member_find(n->members, M, refs[k].id);
    st = loco_auth_relay(n, path, set[k].data, set[k].size,
                         k == 0 ? NULL : &t[j].sig);
  }
  pulse_loco_member next[LOCO_MAX_MEMBERS];
  size_t nn = 0;
  if (st == PULSE_OK)
    st = loco_node_close_round(n, r, leaving, refs, c, next, &nn);
  pulse_loco_finish_figures fi;
  if (st == PULSE_OK)
    st = pulse_loco_set_members(n->ctx, (uint32_t)M);
  if (st == PULSE_OK)
    st = pulse_loco_finish(n->ctx, set, c, theta_r, &fi);
  if (st != PULSE_OK)
    goto done;
  info->contributors = (uint32_t)c;
  info->self_included = 1;
  n->coordinated = 1;
  n->coordinated_round = r;
  memcpy(n->owed, next, nn * sizeof *next);
  n->nowed = nn;
  loco_node_set_members(n, next, nn);
  st = loco_node_publish_state(n);
  if (st == PULSE_OK)
    st = publish_view(n);
  if (st == PULSE_OK && leaving) /* the others still need this round's data */
    pulse_loco_coord_linger(n, n->opts.manifest_timeout_ms);
done:
  for (size_t j = 0; t && j < M; j++)
    pulse_bytebuf_free(&t[j].body);
  free(t), free(urls), free(set), free(refs);
  return st;
}

/* The round the coordinator at `coord` is at (its view), 0 when it does
 * not answer within the deadline. */
static uint64_t group_round(pulse_loco_coord *n, const char *coord,
                            uint32_t coord_id) {
  char url[160];
  loco_manifest view;
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/members");
  if (loco_auth_get_view(n, url, n->opts.deadline_ms, coord_id, &view) !=
      PULSE_OK)
    return 0;
  uint64_t r = view.round;
  loco_manifest_free(&view);
  return r;
}

/* Fetches the round's contributions that are not this node's own into
 * t[k] (done, body): from each sender first, then from the coordinator's
 * relay; a body counts only with the size and SHA-256 the manifest names.
 * *self_included tells whether the manifest lists this node. */
static pulse_status fetch_contributions(pulse_loco_coord *n, uint64_t r,
                                        const char *coord,
                                        const loco_manifest *man, loco_fetch *t,
                                        char (*urls)[160], int *self_included) {
  size_t C = man->ncontrib;
  pulse_status st = PULSE_OK;
  for (int pass = 0; pass < 2 && st == PULSE_OK; pass++) {
    size_t want = 0;
    for (size_t k = 0; k < C; k++) {
      if (man->contrib[k].id == n->id) {
        *self_included = 1;
        t[k].done = 1;
        continue;
      }
      if (t[k].done)
        continue;
      int m = loco_member_find(n->members, n->nmembers, man->contrib[k].id);
      if (pass == 0)
        loco_node_url_fmt(urls[k], sizeof urls[k], n->members[m].url,
                "/v1/loco/round/%llu", (unsigned long long)r);
      else
        loco_node_url_fmt(urls[k], sizeof urls[k], coord, "/v1/loco/round/%llu/from/%u",
                (unsigned long long)r, man->contrib[k].id);
      t[k].url = urls[k];
      t[k].max_bytes = (size_t)man->contrib[k].bytes;
      want++;
    }
    if (want == 0)
      break;
    if (pass == 1 && group_round(n, coord, man->coordinator) > r + 2)
      break; /* the coordinator moved on and dropped its relays of r */
    /* The pending ones only: a gather over a compacted copy. */
    loco_fetch *w = calloc(want, sizeof *w);
    size_t *idx = calloc(want, sizeof *idx);
    if (!w || !idx) {
      free(w), free(idx);
      st = pulse_fail(PULSE_ERR_NOMEM, "loco node: fetch list");
      break;
    }
    size_t q = 0;
    for (size_t k = 0; k < C; k++)
      if (!t[k].done) {
        w[q] = t[k];
        w[q].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
        idx[q++] = k;
      }
    unsigned budget =
        pass == 0 ? n->opts.deadline_ms : n->opts.manifest_timeout_ms;
    st = loco_http_gather(w, want, loco_now_ms() + budget);
    for (size_t a = 0; a < want; a++) {
      size_t k = idx[a];
      uint8_t sha[32];
      if (w[a].done) {
        n->fetched += w[a].body.size;
        loco_sha256(w[a].body.data, w[a].body.size, sha);
      }
      if (w[a].done && w[a].body.size == man->contrib[k].bytes &&
          memcmp(sha, man->contrib[k].sha256, 32) == 0 &&
          loco_auth_accept(n, PULSE_LOCO_AUTH_PAYLOAD, r, man->contrib[k].id,
                           &w[a].sig, w[a].body.data, w[a].body.size)) {
        pulse_bytebuf_free(&t[k].body);
        t[k].body = w[a].body;
        t[k].done = 1;
      } else {
        pulse_bytebuf_free(&w[a].body);
      }
    }
    free(w), free(idx);
  }
  return st;
}

/* A member's round: the manifest, then the payloads it lists. */
static pulse_status follow(pulse_loco_coord *n, uint64_t r, const uint8_t *own,
                           size_t own_size, int leaving, float *theta_r,
                           pulse_loco_coord_step_figures *info) {
  /* A copy: the members (and so members[0]) change when the round ends. */
  char coord[sizeof n->members[0].url];
  snprintf(coord, sizeof coord, "%s", n->members[0].url);
  uint32_t coord_id = n->members[0].id;
  char url[160];
  if (leaving) /* signed (auth hook) */
    loco_auth_post(n, coord, PULSE_LOCO_AUTH_LEAVE, r,
                   n->opts.manifest_timeout_ms);
  loco_node_url_fmt(url, sizeof url, coord, "/v1/loco/round/%llu/manifest",
          (unsigned long long)r);
  loco_manifest man;
  memset(&man, 0, sizeof man);
  pulse_status st = loco_auth_get_manifest(n, url, r, n->members[0].id,
                                           &man); /* checked (auth hook) */
  if (st == PULSE_OK &&
      (man.round != r || man.coordinator != n->members[0].id ||
       !man.has_contributors || man.ncontrib == 0))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco node: manifest of round %llu does not fit",
                    (unsigned long long)r);
  for (size_t k = 0; st == PULSE_OK && k < man.ncontrib; k++)
    if (loco_member_find(n->members, n->nmembers, man.contrib[k].id) < 0 ||
        man.contrib[k].bytes > loco_payload_cap(n->ctx->n))
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco node: manifest lists a non-member or an "
                      "oversized payload");
  if (st != PULSE_OK) {
    /* No usable manifest: nobody can say whether this payload was used.
     * The caller abandons the round, keeping all of s (a coordinator that
     * crashes is not survived: docs/formats/loco-payload.md). */
    loco_manifest_free(&man);
    return st;
  }
  size_t C = man.ncontrib;
  loco_fetch *t = calloc(C, sizeof *t);
  char(*urls)[160] = calloc(C, sizeof *urls);
  pulse_loco_contribution *set = calloc(C, sizeof *set);
  int self_included = 0;
  if (!t || !urls || !set) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco node: round %llu",
                    (unsigned long long)r);
    goto done;
  }
  st = fetch_contributions(n, r, coord, &man, t, urls, &self_included);
  size_t have = 0;
  for (size_t k = 0; k < C; k++) {
    if (!t[k].done)
      continue;
    if (man.contrib[k].id == n->id)
      set[have++] = (pulse_loco_contribution){own, own_size};
    else
      set[have++] = (pulse_loco_contribution){t[k].body.data, t[k].body.size};
  }
  info->contributors = (uint32_t)C;
  info->self_included = self_included;
  if (st == PULSE_OK && have == C)
    st = pulse_loco_set_members(n->ctx, (uint32_t)n->nmembers);
  if (st == PULSE_OK && have == C)
    st = pulse_loco_finish(n->ctx, set, C, theta_r, NULL);
  if (st == PULSE_OK && have == C) {
    loco_node_set_members(n, man.members, man.nmembers);
  } else {
    /* Not every payload: re-sync from the coordinator's state of r + 1
     * after applying the error-feedback rule. */
    if (n->ctx->prepared)
      pulse_loco_abandon(n->ctx, self_included);
    st = loco_node_catch_up(n, coord, coord_id, r + 1, theta_r,
                  loco_now_ms() + n->opts.manifest_timeout_ms);
    if (st == PULSE_OK) {
      info->resynced = 1;
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco round %llu: trainer %u missed payloads, re-synced",
                   (unsigned long long)r, n->id);
    }
  }
  if (st == PULSE_OK)
    st = loco_node_publish_state(n); /* for joiners that ask this member */
  if (st == PULSE_OK) /* signed (auth hook) */
    loco_auth_post(n, coord, PULSE_LOCO_AUTH_DONE, r,
                   n->opts.manifest_timeout_ms);
done:
  for (size_t k = 0; t && k < C; k++)
    pulse_bytebuf_free(&t[k].body);
  free(t), free(urls), free(set);
  loco_manifest_free(&man);
  return st;
}

/* What the node sent since the last step returned (server answers
 * completed, datagrams taken by the socket), and the mark moved on. */
static uint64_t take_bytes_sent(pulse_loco_coord *n) {
  uint64_t now = loco_server_bytes_sent(n->srv) +
                 (n->udp != NULL ? loco_udp_bytes_sent(n->udp) : 0);
  uint64_t d = now - n->sent_mark;
  n->sent_mark = now;
  return d;
}

pulse_status pulse_loco_coord_step(pulse_loco_coord *n, float *theta_r,
                                  uint64_t samples, uint32_t flags,
                                  pulse_loco_coord_step_figures *info) {
  int leaving = (flags & PULSE_LOCO_LEAVING) != 0;
  if (n == NULL || theta_r == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco node: NULL argument");
  pulse_loco_coord_step_figures local;
  if (info == NULL)
    info = &local;
  memset(info, 0, sizeof *info);
  n->fetched = 0;
  loco_auth_begin_step(n, pulse_loco_round(n->ctx)); /* auth hook */
  if (n->dropped) {
    /* Join again; the caller's next step runs the admission round. */
    PULSE_TRY(pulse_loco_coord_join(n, n->rejoin_url, theta_r,
                                   n->opts.manifest_timeout_ms));
    n->dropped = 0;
    info->rejoined = 1;
    info->round = pulse_loco_round(n->ctx);
    info->members = (uint32_t)n->nmembers;
    info->coordinator = n->members[0].id;
    info->fetched_bytes = n->fetched;
    info->bytes_sent = take_bytes_sent(n);
    return PULSE_OK;
  }
  if (n->nmembers == 0 || loco_member_find(n->members, n->nmembers, n->id) < 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco node: not a member (start or join first)");
  uint64_t r = pulse_loco_round(n->ctx);
  info->round = r;
  info->members = (uint32_t)n->nmembers;
  info->coordinator = n->members[0].id;
  const uint8_t *payload;
  size_t size;
  pulse_loco_prepare_figures pi;
  PULSE_TRY(pulse_loco_prepare(n->ctx, theta_r, samples,
                               leaving ? PULSE_LOCO_LEAVING : 0, &payload,
                               &size, &pi));
  info->sent = pi.sent;
  info->payload_bytes = size;
  char coord_url[64];
  snprintf(coord_url, sizeof coord_url, "%s", n->members[0].url);
  n->coordinated = 0;
  pulse_status st;
  if (n->opts.transport == PULSE_LOCO_TRANSPORT_UDP) {
    st = loco_node_udp_round(n, r, leaving, theta_r, info);
    goto ended;
  }
  char path[64];
  snprintf(path, sizeof path, "/v1/loco/round/%llu", (unsigned long long)r);
  st = loco_auth_put(n, path, PULSE_LOCO_AUTH_PAYLOAD, r, payload,
                     size); /* signed (auth hook) */
  if (st != PULSE_OK) {
    pulse_loco_abandon(n->ctx, 0);
    return st;
  }
  /* The payload buffer is the context's until finish: keep a copy to hand
   * back to finish as this node's own contribution. */
  uint8_t *own = malloc(size);
  if (own == NULL) {
    pulse_loco_abandon(n->ctx, 0);
    return pulse_fail(PULSE_ERR_NOMEM, "loco node: payload copy");
  }
  memcpy(own, payload, size);
  if (n->members[0].id == n->id)
    st = coordinate(n, r, own, size, leaving, theta_r, info);
  else
    st = follow(n, r, own, size, leaving, theta_r, info);
  free(own);
ended:
  info->fetched_bytes = n->fetched;
  info->bytes_sent = take_bytes_sent(n);
  loco_auth_end_step(n, info); /* auth hook */
  if (n->ctx->prepared)
    pulse_loco_abandon(n->ctx, 0); /* failed before finishing: keep all of s */
  /* Payloads and relays of the last two rounds; manifests (a few hundred
   * bytes) of the last MANIFESTS_KEPT, so a member that fell behind still
   * learns whether its payload counted (the error feedback rule). */
  loco_server_drop_except(n->srv, "/v1/loco/round/", r > 0 ? r - 1 : 0,
                          "/manifest");
  if (r > MANIFESTS_KEPT)
    loco_server_drop(n->srv, "/v1/loco/round/", r - MANIFESTS_KEPT);
  if (st != PULSE_OK || leaving)
    return st;
  /* Dropped after missed rounds while alive: the next step joins again
   * (not this one: a run that ends now has no round left to admit it). */
  if (loco_member_find(n->members, n->nmembers, n->id) < 0) {
    n->ctx->need_state = 1;
    n->dropped = 1;
    snprintf(n->rejoin_url, sizeof n->rejoin_url, "%s",
             n->nmembers ? n->members[0].url : coord_url);
    return PULSE_OK;
  }
  return publish_view(n);
}
