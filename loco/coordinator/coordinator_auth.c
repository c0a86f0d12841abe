/* coordinator_auth.c - authenticated PULSELoCo in the exchange (coordinator_auth_impl.h,
 * docs/protocols/loco-exchange.md "Authentication"): signing what this node serves, checking
 * what it fetches and the POSTs it answers against the keys bound to the
 * members' trainer ids, joins gated by pinned keys or admissions, the
 * counters in /metrics and in the step info. Datagrams:
 * coordinator_auth_udp.c; views, states and signed POSTs sent:
 * coordinator_auth_msgs.c. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco_coord.h"
#include "endian_impl.h"
#include "auth_impl.h"
#include "coordinator_auth_impl.h"
#include "coordinator_auth_state.h"
#include "coordinator_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"

#define KEY_PATH "/v1/loco/key"
/* As coordinator.c's MANIFEST_CAP: the largest manifest fetched. */
#define MANIFEST_MAX ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)

/* The digits of a round in decimal. */
static unsigned digits(uint64_t v) {
  unsigned d = 1;
  while (v >= 10)
    v /= 10, d++;
  return d;
}

static int accept_core(pulse_loco_coord *n, pulse_loco_auth_kind kind,
                       uint64_t floor, uint64_t ceiling, uint32_t id,
                       const loco_sig *sig, const void *data, size_t size,
                       uint32_t *signer);

/* ------------------------------------------------------------ bindings */

static binding *bound_id(const loco_node_auth *a, uint32_t id) {
  for (size_t i = 0; i < a->nids; i++)
    if (a->ids[i].id == id)
      return &a->ids[i];
  return NULL;
}

static binding *bound_key(const loco_node_auth *a, const uint8_t *key) {
  for (size_t i = 0; i < a->nids; i++)
    if (memcmp(a->ids[i].key, key, PULSE_KEY_BYTES) == 0)
      return &a->ids[i];
  return NULL;
}

/* Binds id to key. @return 1 when bound (or already so), 0 when the id
 * has another key or the key speaks for another id, -1 out of memory. */
static int bind(loco_node_auth *a, uint32_t id, const uint8_t *key) {
  binding *b = bound_id(a, id);
  if (b != NULL)
    return memcmp(b->key, key, PULSE_KEY_BYTES) == 0;
  if (bound_key(a, key) != NULL)
    return 0;
  if (a->nids == a->capids) {
    size_t cap = a->capids ? 2 * a->capids : 16;
    binding *m = realloc(a->ids, cap * sizeof *m);
    if (m == NULL)
      return -1;
    a->ids = m;
    a->capids = cap;
  }
  a->ids[a->nids].id = id;
  memcpy(a->ids[a->nids++].key, key, PULSE_KEY_BYTES);
  return 1;
}

/* -------------------------------------------------------------- counters */

static void totals(const loco_node_auth *a, pulse_loco_auth_figures *c) {
  pulse_loco_auth_figures_get(a->auth, c);
  c->accepted += a->extra.accepted;
  c->unsigned_bodies += a->extra.unsigned_bodies;
  c->forged += a->extra.forged;
  c->replayed += a->extra.replayed;
  c->foreign += a->extra.foreign;
  c->admitted += a->extra.admitted;
}

static void metrics(void *user, pulse_bytebuf *text) {
  loco_node_auth *a = ((pulse_loco_coord *)user)->auth;
  pulse_loco_auth_figures c;
  pthread_mutex_lock(&a->lock);
  totals(a, &c);
  uint64_t datagrams = a->datagrams_refused, joins = a->joins_refused;
  uint64_t replayed = a->datagrams_replayed;
  uint64_t by_kind[PULSE_LOCO_AUTH_KINDS];
  memcpy(by_kind, a->refused_kind, sizeof by_kind);
  pthread_mutex_unlock(&a->lock);
  pulse_bytebuf_printf(
      text,
      "# HELP pulse_loco_auth_accepted_total Signed payloads, manifests and "
      "chunk lists that passed.\n"
      "# TYPE pulse_loco_auth_accepted_total counter\n"
      "pulse_loco_auth_accepted_total %llu\n"
      "# HELP pulse_loco_auth_refused_total Payloads, manifests and chunk "
      "lists refused (left out of the round), by reason.\n"
      "# TYPE pulse_loco_auth_refused_total counter\n"
      "pulse_loco_auth_refused_total{reason=\"unsigned\"} %llu\n"
      "pulse_loco_auth_refused_total{reason=\"forged\"} %llu\n"
      "pulse_loco_auth_refused_total{reason=\"replayed\"} %llu\n"
      "pulse_loco_auth_refused_total{reason=\"foreign\"} %llu\n"
      "# HELP pulse_loco_auth_admitted_total Members admitted by a member's "
      "signature.\n"
      "# TYPE pulse_loco_auth_admitted_total counter\n"
      "pulse_loco_auth_admitted_total %llu\n"
      "# HELP pulse_loco_auth_joins_refused_total Joins refused (no pinned "
      "key, no valid admission).\n"
      "# TYPE pulse_loco_auth_joins_refused_total counter\n"
      "pulse_loco_auth_joins_refused_total %llu\n"
      "# HELP pulse_loco_auth_datagrams_refused_total Datagrams refused: not "
      "in their sender's signed chunk list (unlisted), or of an older round "
      "(replayed).\n"
      "# TYPE pulse_loco_auth_datagrams_refused_total counter\n"
      "pulse_loco_auth_datagrams_refused_total{reason=\"unlisted\"} %llu\n"
      "pulse_loco_auth_datagrams_refused_total{reason=\"replayed\"} %llu\n",
      (unsigned long long)c.accepted, (unsigned long long)c.unsigned_bodies,
      (unsigned long long)c.forged, (unsigned long long)c.replayed,
      (unsigned long long)c.foreign, (unsigned long long)c.admitted,
      (unsigned long long)joins,
      (unsigned long long)(datagrams - replayed), (unsigned long long)replayed);
  pulse_bytebuf_printf(text,
                       "# HELP pulse_loco_auth_refused_kind_total The same "
                       "refusals by what was refused.\n"
                       "# TYPE pulse_loco_auth_refused_kind_total counter\n");
  for (unsigned k = 0; k < PULSE_LOCO_AUTH_KINDS; k++)
    pulse_bytebuf_printf(text,
                         "pulse_loco_auth_refused_kind_total{kind=\"%s\"} %llu\n",
                         loco_auth_kind_word((pulse_loco_auth_kind)(k + 1)), (unsigned long long)by_kind[k]);
}

/* ------------------------------------------------------------ key blob */

/* What a member tells the others of its key (auth_key.c: its key blob,
 * with its admission when it has one). */
static pulse_status publish_key(pulse_loco_coord *n) {
  loco_node_auth *a = n->auth;
  char text[LOCO_AUTH_KEY_BLOB_MAX];
  int len = loco_auth_key_blob_write(text, sizeof text, n->id, a->own,
                                     a->has_admission ? &a->admission : NULL);
  if (len < 0)
    return pulse_fail(PULSE_ERR_INTERNAL, "loco node: key blob too long");
  return loco_server_put(n->srv, KEY_PATH, text, (size_t)len);
}

static int unhex_exact(const char *s, uint8_t *out, size_t n) {
  return s != NULL && strlen(s) == 2 * n && store_unhex(s, 2 * n, out, n) == 0;
}

/* Learns the key of member `id` (admitted after this node started) from
 * its key blob: bound when it is pinned under that id, or when a member's
 * admission of it verifies. @return 1 when the id has a key now. */
static int learn_key(pulse_loco_coord *n, uint32_t id) {
  loco_node_auth *a = n->auth;
  int m = loco_member_find(n->members, n->nmembers, id);
  if (m < 0)
    return 0;
  char url[160];
  loco_node_url_fmt(url, sizeof url, n->members[m].url, KEY_PATH);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_status st =
      loco_http_wait(url, n->opts.deadline_ms, LOCO_AUTH_KEY_BLOB_MAX, &b);
  uint32_t claimed = 0;
  uint8_t key[32];
  int admitted = 0, ok = 0;
  pulse_loco_admission adm;
  if (st == PULSE_OK) {
    n->fetched += b.size;
    ok = loco_auth_key_blob_parse(b.data, b.size, &claimed, key, &admitted,
                                  &adm) &&
         claimed == id;
  }
  pulse_bytebuf_free(&b);
  if (!ok)
    return 0;
  pthread_mutex_lock(&a->lock);
  if (bound_id(a, id) == NULL && bound_key(a, key) == NULL && admitted &&
      pulse_loco_auth_admit_seen(a->auth, adm.round, key, adm.sponsor,
                                 adm.sig) == PULSE_OK)
    bind(a, id, key);
  binding *bk = bound_id(a, id);
  ok = bk != NULL && memcmp(bk->key, key, 32) == 0;
  pthread_mutex_unlock(&a->lock);
  return ok;
}

/* ------------------------------------------------------------- joins */

/* Remembers joiner id's join number (for its admission). Caller holds
 * a->lock. @return 0 out of memory. */
static int join_seq_set(loco_node_auth *a, uint32_t id, uint64_t seq) {
  for (size_t i = 0; i < a->njoins; i++)
    if (a->joins[i].id == id)
      return a->joins[i].seq = seq, 1;
  if (a->njoins == a->capjoins) {
    size_t cap = a->capjoins ? 2 * a->capjoins : 16;
    void *m = realloc(a->joins, cap * sizeof *a->joins);
    if (m == NULL)
      return 0;
    a->joins = m;
    a->capjoins = cap;
  }
  a->joins[a->njoins].id = id;
  a->joins[a->njoins++].seq = seq;
  return 1;
}

uint64_t loco_auth_join_seq(pulse_loco_coord *n, uint32_t id) {
  loco_node_auth *a = n->auth;
  uint64_t seq = 0;
  if (a == NULL)
    return 0;
  pthread_mutex_lock(&a->lock);
  for (size_t i = 0; i < a->njoins; i++)
    if (a->joins[i].id == id)
      seq = a->joins[i].seq;
  pthread_mutex_unlock(&a->lock);
  return seq;
}

static unsigned signed_post_gate(pulse_loco_coord *n, const char *path,
                                 pulse_loco_auth_kind kind, uint32_t id,
                                 const char *(*query)(void *rq,
                                                      const char *key),
                                 void *rq, char *reply, size_t cap);

/* The checks of a POST (server thread): a join's key is the one bound to
 * its id, or a member's admission of it verifies; a leave or a done is
 * signed by the key bound to the id it speaks for. */
static unsigned post_gate(void *user, const char *path,
                          const char *(*query)(void *rq, const char *key),
                          void *rq, char *reply, size_t cap) {
  pulse_loco_coord *n = user;
  loco_node_auth *a = n->auth;
  uint32_t id;
  if (!loco_parse_id(query(rq, "id"), &id))
    return 0; /* the callback's 400 */
  size_t len = strlen(path);
  if (strcmp(path, "/v1/loco/leave") == 0)
    return signed_post_gate(n, path, PULSE_LOCO_AUTH_LEAVE, id, query, rq,
                            reply, cap);
  if (strncmp(path, "/v1/loco/round/", 15) == 0 && len > 20 &&
      strcmp(path + len - 5, "/done") == 0)
    return signed_post_gate(n, path, PULSE_LOCO_AUTH_DONE, id, query, rq,
                            reply, cap);
  if (strcmp(path, "/v1/loco/join") != 0)
    return 0; /* the callback answers (404) */
  uint8_t key[32];
  pulse_loco_admission adm;
  const char *until = query(rq, "until");
  char *end = NULL;
  unsigned long long u = until ? strtoull(until, &end, 10) : 0;
  int has_adm = until != NULL && end != until && *end == '\0' &&
                unhex_exact(query(rq, "sponsor"), adm.sponsor, 32) &&
                unhex_exact(query(rq, "asig"), adm.sig, 64);
  /* The join itself, signed by the joiner's key over its id, its URL and
   * a number it never sent before (checked once the key is bound). */
  char text[240];
  loco_sig sig;
  int tlen = loco_auth_post_read(path, query, rq, text, sizeof text, &sig);
  unsigned status = 0;
  pthread_mutex_lock(&a->lock);
  /* Counted by reason too, as a signed body refused: without a key or
   * signature (unsigned), a key bound to another trainer (forged), a key
   * no member pinned or admitted (foreign). */
  uint64_t *why = NULL;
  if (!unhex_exact(query(rq, "key"), key, 32) || !sig.present) {
    snprintf(reply, cap, "{\"error\":\"join refused: no key or signature\"}");
    status = 403;
    why = &a->extra.unsigned_bodies;
  } else if (bound_id(a, id) != NULL || bound_key(a, key) != NULL) {
    int known_key = bound_key(a, key) != NULL;
    if (bind(a, id, key) != 1) {
      snprintf(reply, cap,
               "{\"error\":\"join refused: trainer %u has another key, or "
               "this key is another trainer's\"}",
               id);
      status = 403;
      why = known_key ? &a->extra.forged : &a->extra.foreign;
    }
  } else if (!has_adm) {
    snprintf(reply, cap,
             "{\"error\":\"join refused: the key is not pinned and no "
             "admission came with it\"}");
    status = 403;
    why = &a->extra.foreign;
  } else if (pulse_loco_auth_admit(a->auth, (uint64_t)u, key, adm.sponsor,
                                   adm.sig) != PULSE_OK) {
    snprintf(reply, cap, "{\"error\":\"join refused: the admission does not "
                         "hold\"}");
    status = 403;
  } else if (bind(a, id, key) != 1) {
    snprintf(reply, cap, "{\"error\":\"join refused: no room\"}");
    status = 503;
  }
  if (why != NULL) {
    (*why)++;
    a->refused_kind[PULSE_LOCO_AUTH_JOIN - 1]++;
  }
  if (sig.present) /* "&seq=N&round=R&key=" 64 hex "&sig=" 128 hex */
    a->overhead += 214u + digits(sig.seq) + digits(sig.round);
  pthread_mutex_unlock(&a->lock);
  if (status == 0 && (tlen < 0 || !accept_core(n, PULSE_LOCO_AUTH_JOIN, 0,
                                               UINT64_MAX, id, &sig, text,
                                               (size_t)tlen, NULL))) {
    snprintf(reply, cap, "{\"error\":\"join refused: not signed by its "
                         "trainer's key, or a replay\"}");
    status = 403;
  }
  pthread_mutex_lock(&a->lock);
  if (status != 0)
    a->joins_refused++;
  else if (!join_seq_set(a, id, sig.seq))
    status = 503, snprintf(reply, cap, "{\"error\":\"join refused: no room\"}");
  pthread_mutex_unlock(&a->lock);
  if (status != 0)
    PULSE_LOG_AT(PULSE_LOG_WARN, "loco auth: trainer %u: %s", id, reply);
  return status;
}

/* A leave or done POST (server thread): signed (query round, key, sig)
 * over its path and id, "PATH?id=ID", by the key bound to that id. A leave
 * older than the round being run, or a done older than the round before
 * it, is a replay: the coordinator acts on neither. Refused: 403, counted
 * as any refused body. */
static unsigned signed_post_gate(pulse_loco_coord *n, const char *path,
                                 pulse_loco_auth_kind kind, uint32_t id,
                                 const char *(*query)(void *rq,
                                                      const char *key),
                                 void *rq, char *reply, size_t cap) {
  loco_node_auth *a = n->auth;
  char text[200];
  loco_sig sig;
  int len = loco_auth_post_read(path, query, rq, text, sizeof text, &sig);
  if (len < 0)
    return 0; /* no such path: the callback's 404 */
  /* No key learning here (the server thread does not fetch): the
   * coordinator bound every member it admitted. */
  pthread_mutex_lock(&a->lock);
  uint64_t floor = a->round;
  if (sig.present) /* "&seq=N&round=R&key=" 64 hex "&sig=" 128 hex */
    a->overhead += 214u + digits(sig.seq) + digits(sig.round);
  int stranger = sig.present && bound_id(a, id) == NULL;
  if (stranger) {
    a->extra.foreign++;
    a->refused_kind[kind - 1]++;
  }
  pthread_mutex_unlock(&a->lock);
  if (kind == PULSE_LOCO_AUTH_DONE && floor > 0)
    floor--; /* a member acknowledges a round after the coordinator closed it */
  if (!stranger && accept_core(n, kind, floor, UINT64_MAX, id, &sig, text,
                               (size_t)len, NULL))
    return 0;
  snprintf(reply, cap, "{\"error\":\"%s refused: not signed by trainer %u "
                       "for this round\"}",
           kind == PULSE_LOCO_AUTH_LEAVE ? "leave" : "done", id);
  return 403;
}

uint64_t loco_auth_join_query(pulse_loco_coord *n, const char *text,
                              char *dst, size_t cap) {
  loco_node_auth *a = n->auth;
  if (a == NULL || cap == 0)
    return 0;
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  loco_auth_sign_query(n, PULSE_LOCO_AUTH_JOIN, pulse_loco_round(n->ctx), text,
                       dst, cap, &sig.seq);
  size_t used = strlen(dst);
  if (a->has_admission && used < cap)
    loco_auth_admission_query(&a->admission, dst + used, cap - used);
  return sig.seq;
}

void loco_auth_sign_query(const pulse_loco_coord *n, pulse_loco_auth_kind kind,
                          uint64_t r, const char *text, char *dst, size_t cap,
                          uint64_t *seq) {
  loco_node_auth *a = n->auth;
  if (cap == 0)
    return;
  dst[0] = '\0';
  if (a == NULL)
    return;
  /* Signed with a number never sent before: a repeat is a replay. */
  loco_sig sig = {1, r, {0}, {0}, loco_auth_seq_next()};
  if (seq != NULL)
    *seq = sig.seq;
  char signed_text[400];
  int len = loco_auth_post_text(signed_text, sizeof signed_text, text, sig.seq);
  int n_seq = snprintf(dst, cap, "&seq=%llu", (unsigned long long)sig.seq);
  if (len < 0 || n_seq < 0 || (size_t)n_seq >= cap)
    return; /* sent unsigned: refused, as any unsigned request */
  pthread_mutex_lock(&a->lock);
  pulse_status st = pulse_loco_auth_sign(a->auth, kind, r, signed_text,
                                         (size_t)len, sig.sig, sig.key);
  pthread_mutex_unlock(&a->lock);
  if (st == PULSE_OK) /* a test's fault: what a hostile trainer posts */
    st = loco_tamper_sign(&a->tamper, kind, r, signed_text, (size_t)len, &sig);
  if (st == PULSE_OK)
    loco_auth_post_query(&sig, dst + n_seq, cap - (size_t)n_seq);
}

pulse_status pulse_loco_coord_admit(const pulse_loco_coord *n,
                                   const uint8_t newcomer[32],
                                   uint64_t until_round,
                                   pulse_loco_admission *out) {
  if (n == NULL || newcomer == NULL || out == NULL || n->auth == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco node: admit needs a node that authenticates");
  loco_node_auth *a = n->auth;
  memcpy(out->key, newcomer, 32);
  memcpy(out->sponsor, a->own, 32);
  out->round = until_round;
  pthread_mutex_lock(&a->lock);
  pulse_status st =
      pulse_loco_auth_admit_sign(a->auth, until_round, newcomer, out->sig);
  pthread_mutex_unlock(&a->lock);
  return st;
}

/* --------------------------------------------------------- start, stop */

pulse_status loco_auth_start(pulse_loco_coord *n,
                             const pulse_loco_coord_opts *o) {
  n->auth = NULL;
  if ((unsigned)o->auth > PULSE_LOCO_AUTH_OFF)
    return pulse_fail(PULSE_ERR_ARG, "loco node: auth must be AUTO, ON or OFF");
  if (o->auth == PULSE_LOCO_AUTH_OFF)
    return PULSE_OK;
  if (o->sign_key == NULL) {
    if (o->auth == PULSE_LOCO_AUTH_ON)
      return pulse_fail(PULSE_ERR_ARG,
                        "loco node: authentication asked for without a key "
                        "to sign this trainer's payloads with");
    if (o->member_key_count > 0 || o->admission != NULL)
      return pulse_fail(PULSE_ERR_ARG,
                        "loco node: pinned members or an admission but no key "
                        "of this trainer: the others could not verify its "
                        "payloads (give sign_key, or PULSE_LOCO_AUTH_OFF)");
    return PULSE_OK;
  }
  if ((o->member_keys == NULL && o->member_key_count > 0) ||
      o->member_key_count >= PULSE_LOCO_AUTH_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_ARG, "loco node: at most %u pinned keys",
                      PULSE_LOCO_AUTH_MAX_MEMBERS - 1u);
  loco_node_auth *a = calloc(1, sizeof *a);
  uint8_t *keys = malloc((o->member_key_count + 1) * 32u);
  if (a == NULL || keys == NULL) {
    free(a), free(keys);
    return pulse_fail(PULSE_ERR_NOMEM, "loco node: authentication");
  }
  pthread_mutex_init(&a->lock, NULL);
  n->auth = a;
  pulse_sign_key_public(o->sign_key, a->own);
  for (size_t i = 0; i < o->member_key_count; i++)
    memcpy(keys + 32u * i, o->member_keys[i].key, 32);
  pulse_loco_auth_opts ao;
  pulse_loco_auth_opts_init(&ao);
  ao.key = o->sign_key;
  ao.members = keys;
  ao.member_count = o->member_key_count;
  pulse_status st = pulse_loco_auth_create(&ao, &a->auth);
  free(keys);
  int b = st == PULSE_OK ? bind(a, n->id, a->own) : 1;
  for (size_t i = 0; st == PULSE_OK && b == 1 && i < o->member_key_count; i++)
    b = bind(a, o->member_keys[i].id, o->member_keys[i].key);
  if (st == PULSE_OK && b != 1)
    st = b < 0 ? pulse_fail(PULSE_ERR_NOMEM, "loco node: pinned keys")
               : pulse_fail(PULSE_ERR_ARG,
                            "loco node: pinned keys cannot be verified: a "
                            "trainer id with two keys (this trainer's own "
                            "included), or one key for two ids");
  if (st == PULSE_OK && o->admission != NULL) {
    if (memcmp(o->admission->key, a->own, 32) != 0)
      st = pulse_fail(PULSE_ERR_ARG,
                      "loco node: the admission is for another key than "
                      "this trainer's");
    a->has_admission = 1;
    a->admission = *o->admission;
  }
  if (st == PULSE_OK)
    st = publish_key(n);
  if (st != PULSE_OK) {
    loco_auth_stop(n);
    return st;
  }
  loco_server_set_gate(n->srv, post_gate, n);
  loco_server_set_metrics(n->srv, metrics, n);
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "loco auth: trainer %u signs and checks (%zu pinned keys%s)",
               n->id, o->member_key_count,
               a->has_admission ? ", admitted" : "");
  return PULSE_OK;
}

/* Called once the server has stopped (nothing calls the gate or the
 * metrics any more). */
void loco_auth_stop(pulse_loco_coord *n) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return;
  n->auth = NULL;
  pulse_loco_auth_free(a->auth);
  loco_tamper_clear(&a->tamper);
  loco_auth_lists_clear(a);
  free(a->joins);
  pulse_buffer_free(&a->chunks_prev);
  pulse_buffer_free(&a->chunks_cur);
  free(a->ids);
  pthread_mutex_destroy(&a->lock);
  free(a);
}

pulse_status loco_auth_check_founders(const pulse_loco_coord *n,
                                      const pulse_loco_member *m,
                                      size_t count) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return PULSE_OK;
  pthread_mutex_lock(&a->lock);
  size_t i = 0;
  while (i < count && bound_id(a, m[i].id) != NULL)
    i++;
  pthread_mutex_unlock(&a->lock);
  if (i < count)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco node: founding member %u has no pinned key: its "
                      "payloads could not be verified",
                      m[i].id);
  return PULSE_OK;
}

/* ------------------------------------------------------------- steps */

void loco_auth_begin_step(pulse_loco_coord *n, uint64_t r) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return;
  pthread_mutex_lock(&a->lock);
  pulse_loco_auth_round(a->auth, r);
  a->round = r;
  totals(a, &a->step_base);
  a->step_datagrams = a->datagrams_refused;
  a->step_overhead = a->overhead;
  pthread_mutex_unlock(&a->lock);
}

uint64_t loco_auth_round_now(pulse_loco_coord *n) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return 0;
  pthread_mutex_lock(&a->lock);
  uint64_t r = a->round;
  pthread_mutex_unlock(&a->lock);
  return r;
}

void loco_auth_end_step(pulse_loco_coord *n, pulse_loco_coord_step_figures *info) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return;
  pulse_loco_auth_figures c;
  pthread_mutex_lock(&a->lock);
  totals(a, &c);
  info->datagrams_refused_auth = a->datagrams_refused - a->step_datagrams;
  info->auth_bytes = a->overhead - a->step_overhead;
  pthread_mutex_unlock(&a->lock);
  const pulse_loco_auth_figures *b = &a->step_base;
  info->auth.accepted = c.accepted - b->accepted;
  info->auth.unsigned_bodies = c.unsigned_bodies - b->unsigned_bodies;
  info->auth.forged = c.forged - b->forged;
  info->auth.replayed = c.replayed - b->replayed;
  info->auth.foreign = c.foreign - b->foreign;
  info->auth.admitted = c.admitted - b->admitted;
}

/* ------------------------------------------------------- serving bodies */

pulse_status loco_auth_put(pulse_loco_coord *n, const char *path,
                           pulse_loco_auth_kind kind, uint64_t r,
                           const void *data, size_t size) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return loco_server_put(n->srv, path, data, size);
  loco_sig sig = {1, r, {0}, {0}, 0};
  pthread_mutex_lock(&a->lock);
  pulse_status st =
      pulse_loco_auth_sign(a->auth, kind, r, data, size, sig.sig, sig.key);
  pthread_mutex_unlock(&a->lock);
  if (st != PULSE_OK)
    return st;
  if (kind == PULSE_LOCO_AUTH_PAYLOAD)
    a->own_payload = sig;
  /* Under a test's fault, what a hostile or broken trainer serves. */
  return loco_tamper_put(&a->tamper, n->srv, path, kind, r, data, size, &sig);
}

pulse_status loco_auth_relay(pulse_loco_coord *n, const char *path,
                             const void *data, size_t size,
                             const loco_sig *sig) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return loco_server_put(n->srv, path, data, size);
  return loco_server_put_signed(n->srv, path, data, size,
                                sig != NULL ? sig : &a->own_payload);
}

/* ------------------------------------------------------ checking bodies */

void loco_auth_count_replayed(pulse_loco_coord *n, pulse_loco_auth_kind kind) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return;
  pthread_mutex_lock(&a->lock);
  a->extra.accepted--; /* its signature passed, counted accepted there */
  a->extra.replayed++;
  a->refused_kind[kind - 1]++;
  pthread_mutex_unlock(&a->lock);
}

void loco_auth_count_bytes(pulse_loco_coord *n, uint64_t bytes) {
  loco_node_auth *a = n->auth;
  if (a == NULL)
    return;
  pthread_mutex_lock(&a->lock);
  a->overhead += bytes;
  pthread_mutex_unlock(&a->lock);
}

int loco_auth_accept_window(pulse_loco_coord *n, pulse_loco_auth_kind kind,
                            uint64_t floor, uint64_t ceiling, uint32_t id,
                            const loco_sig *sig, const void *data, size_t size,
                            uint32_t *signer) {
  /* A fetched answer: its three signature header lines, each with CRLF
   * ("X-Pulse-Loco-Round: R", "X-Pulse-Loco-Key: " and 64 hex,
   * "X-Pulse-Loco-Signature: " and 128 hex). */
  if (n->auth != NULL && sig != NULL && sig->present)
    loco_auth_count_bytes(n, 260u + digits(sig->round));
  return accept_core(n, kind, floor, ceiling, id, sig, data, size, signer);
}

static int accept_core(pulse_loco_coord *n, pulse_loco_auth_kind kind,
                       uint64_t floor, uint64_t ceiling, uint32_t id,
                       const loco_sig *sig, const void *data, size_t size,
                       uint32_t *signer) {
  loco_node_auth *a = n->auth;
  if (signer != NULL)
    *signer = id;
  if (a == NULL)
    return 1;
  const char *what = loco_auth_kind_word(kind);
  int any = id == LOCO_AUTH_ANY_SIGNER, present = sig != NULL && sig->present;
  pthread_mutex_lock(&a->lock);
  int known = any || bound_id(a, id) != NULL;
  pthread_mutex_unlock(&a->lock);
  /* A member admitted after this node started: learn its key (not for an
   * unsigned body: nothing to check it with anyway). */
  if (!known && present)
    known = learn_key(n, id);
  pulse_status st;
  pthread_mutex_lock(&a->lock);
  binding *b = any ? (present ? bound_key(a, sig->key) : NULL) : bound_id(a, id);
  uint8_t key[32];
  uint32_t bound = 0;
  if (b != NULL)
    memcpy(key, b->key, 32), bound = b->id;
  if (!present) {
    st = pulse_loco_auth_check(a->auth, kind, floor, NULL, data, size, NULL);
  } else if (!pulse_loco_auth_is_member(a->auth, sig->key)) {
    /* Signed by a stranger: counted as foreign by the handle. */
    st = pulse_loco_auth_check(a->auth, kind, sig->round, sig->key, data, size,
                               sig->sig);
  } else if (b == NULL) {
    a->extra.foreign++;
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco auth: a %s of round %llu from trainer %u, whose key "
                    "is unknown: refused",
                    what, (unsigned long long)floor, id);
  } else if (sig->round > ceiling) {
    a->extra.forged++;
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco auth: a %s of round %llu served for round %llu: "
                    "refused",
                    what, (unsigned long long)sig->round,
                    (unsigned long long)ceiling);
  } else {
    /* Checked against the key bound to the id it comes from: another
     * member's signature does not verify under it (forged). Below the
     * floor, or below a round of this kind already accepted from the
     * signer: a replay (the handle's floor is the window's for this
     * check, the round being run again after). */
    uint8_t sha[32];
    loco_sha256(data, size, sha);
    pulse_loco_auth_round(a->auth, floor);
    st = loco_auth_check_seq(a->auth, kind, sig->round, key, size, sha,
                             sig->sig, sig->seq);
    pulse_loco_auth_round(a->auth, a->round);
  }
  if (st != PULSE_OK)
    a->refused_kind[kind - 1]++;
  pthread_mutex_unlock(&a->lock);
  if (st != PULSE_OK) {
    PULSE_LOG_AT(PULSE_LOG_WARN, "loco round %llu: trainer %u's %s: %s",
                 (unsigned long long)floor, id, what, pulse_error_detail());
    return 0;
  }
  if (signer != NULL)
    *signer = bound;
  return 1;
}

int loco_auth_accept(pulse_loco_coord *n, pulse_loco_auth_kind kind, uint64_t r,
                     uint32_t id, const loco_sig *sig, const void *data,
                     size_t size) {
  return loco_auth_accept_window(n, kind, r, r, id, sig, data, size, NULL);
}

pulse_status loco_auth_get_manifest(pulse_loco_coord *n, const char *url,
                                    uint64_t r, uint32_t coordinator,
                                    loco_manifest *m) {
  if (n->auth == NULL)
    return loco_node_get_json(url, n->opts.manifest_timeout_ms, m,
                              &n->fetched);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  loco_sig sig;
  pulse_status st = loco_http_wait_signed(url, n->opts.manifest_timeout_ms,
                                          MANIFEST_MAX, &b, &sig);
  if (st == PULSE_OK) {
    n->fetched += b.size;
    if (loco_auth_accept(n, PULSE_LOCO_AUTH_MANIFEST, r, coordinator, &sig,
                         b.data, b.size)) {
      st = loco_manifest_parse(b.data, b.size, m);
    } else {
      char why[256];
      snprintf(why, sizeof why, "%s", pulse_error_detail());
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "loco node: the manifest of round %llu is refused (%s)",
                      (unsigned long long)r, why);
    }
  }
  pulse_bytebuf_free(&b);
  return st;
}

/* ------------------------------------------------------ fault injection */

pulse_status loco_auth_tamper(pulse_loco_coord *n, unsigned mode,
                              unsigned kinds) {
  if (n->auth == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco auth: tamper needs a key");
  PULSE_TRY(loco_tamper_set(&n->auth->tamper, mode, kinds));
  /* The port was served at create: served again, with the fault. */
  if (n->udp != NULL && (kinds & LOCO_AUTH_TAMPER_KIND(PULSE_LOCO_AUTH_PORT)))
    return loco_node_udp_publish_port(n);
  return PULSE_OK;
}
