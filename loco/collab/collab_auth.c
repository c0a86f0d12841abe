/* collab_auth.c - authenticated collaboration, its first part (issue 35
 * item 7; docs/protocols/loco-exchange.md "Authentication"): the membership views and states a
 * peer serves are signed with its key; those a joiner or a catching-up
 * member loads are checked against the members' keys before anything is
 * taken from them. Refusals are counted by reason and kind for /metrics.
 * The main thread signs and checks; the server thread reads the counters:
 * both under the peer's lock. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth_impl.h"
#include "collab_impl.h"
#include "pulse_log.h"

static int accept_by_window(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                            uint64_t floor, uint64_t ceiling, uint32_t id,
                            const loco_sig *sig, uint64_t size,
                            const uint8_t sha[32]);
static int pinned_key_locked(const pulse_loco_collab *c, uint32_t id,
                             uint8_t key[PULSE_KEY_BYTES]);
static int learn_key(pulse_loco_collab *c, uint32_t id, const char *base);

/* ------------------------------------------------------------ pinned keys */

/* The key bound to trainer id into key. Caller holds lock. @return 1 when
 * there is one. */
static int pinned_key_locked(const pulse_loco_collab *c, uint32_t id,
                             uint8_t key[PULSE_KEY_BYTES]) {
  for (size_t i = 0; i < c->auth_npins; i++)
    if (c->auth_pins[i].id == id) {
      memcpy(key, c->auth_pins[i].key, PULSE_KEY_BYTES);
      return 1;
    }
  return 0;
}

/* Binds id to key, listable through round `until`. Caller holds lock.
 * @return 1 when bound (or already so), 0 when the id has another key or
 * the key speaks for another id, -1 out of memory. */
static int pin_locked(pulse_loco_collab *c, uint32_t id, const uint8_t *key,
                      uint64_t until) {
  for (size_t i = 0; i < c->auth_npins; i++) {
    int same_id = c->auth_pins[i].id == id;
    int same_key = memcmp(c->auth_pins[i].key, key, PULSE_KEY_BYTES) == 0;
    if (same_id && same_key) {
      if (c->auth_until[i] != UINT64_MAX && until > c->auth_until[i])
        c->auth_until[i] = until;
      return 1;
    }
    if (same_id || same_key)
      return 0;
  }
  if (c->auth_npins == c->auth_cappins) {
    size_t cap = 2 * c->auth_cappins;
    pulse_loco_member_key *p = realloc(c->auth_pins, cap * sizeof *p);
    if (p == NULL)
      return -1;
    c->auth_pins = p;
    uint64_t *u = realloc(c->auth_until, cap * sizeof *u);
    if (u == NULL)
      return -1;
    c->auth_until = u;
    c->auth_cappins = cap;
  }
  c->auth_pins[c->auth_npins].id = id;
  memcpy(c->auth_pins[c->auth_npins].key, key, PULSE_KEY_BYTES);
  c->auth_until[c->auth_npins++] = until;
  return 1;
}

void collab_auth_listed_locked(pulse_loco_collab *c,
                               const pulse_loco_member *m, size_t count) {
  for (size_t i = 0; c->auth != NULL && i < c->auth_npins; i++)
    if (c->auth_until[i] != UINT64_MAX &&
        loco_member_find(m, count, c->auth_pins[i].id) >= 0)
      c->auth_until[i] = UINT64_MAX;
}

int collab_auth_listable_locked(const pulse_loco_collab *c, uint32_t id,
                                uint64_t r) {
  if (c->auth == NULL)
    return 1;
  for (size_t i = 0; i < c->auth_npins; i++)
    if (c->auth_pins[i].id == id)
      return r <= c->auth_until[i];
  return 0;
}

/* Learns the key of trainer id, a member of the current round admitted
 * after this peer started, from its key blob (GET /v1/loco/key at its
 * URL; at `base` when id is UINT32_MAX: the member serving there): bound
 * when a member's admission of it holds (the sponsor a member, the
 * signature verifies; its round window was the admitting member's check).
 * As the coordinator exchange does (coordinator_auth.c). @return 1 when
 * a key was bound. */
static int learn_key(pulse_loco_collab *c, uint32_t id, const char *base) {
  char url[160];
  url[0] = '\0';
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; i < c->nmembers; i++) {
    const pulse_loco_member *m = &c->members[i];
    if (m->id == c->id || (id != UINT32_MAX ? m->id != id
                                            : base == NULL ||
                                                  strcmp(m->url, base) != 0))
      continue;
    id = m->id;
    /* A client-mode member's URL is its host's: no key blob of its own. */
    if (!loco_url_hosted(m->url, NULL, 0, NULL))
      snprintf(url, sizeof url, "%s/v1/loco/key", m->url);
    break;
  }
  /* Not a member of this peer's round yet (a joiner addressed as a
   * writer before its first round): the last signed view it accepted. */
  for (size_t i = 0; i < c->auth_nview && url[0] == '\0' && id != UINT32_MAX;
       i++) {
    const pulse_loco_member *m = &c->auth_view[i];
    if (m->id == id && m->id != c->id &&
        !loco_url_hosted(m->url, NULL, 0, NULL))
      snprintf(url, sizeof url, "%s/v1/loco/key", m->url);
  }
  uint8_t key[PULSE_KEY_BYTES];
  int known = id != UINT32_MAX && pinned_key_locked(c, id, key);
  pthread_mutex_unlock(&c->lock);
  if (url[0] == '\0' || known)
    return 0;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  pulse_status st = loco_http_get(url, c->opts.claim_timeout_ms,
                                  LOCO_AUTH_KEY_BLOB_MAX, &b, &status);
  uint32_t claimed = 0;
  int admitted = 0, ok = 0;
  pulse_loco_admission adm;
  if (st == PULSE_OK && status == 200)
    ok = loco_auth_key_blob_parse(b.data, b.size, &claimed, key, &admitted,
                                  &adm) &&
         claimed == id && admitted;
  pulse_bytebuf_free(&b);
  if (!ok)
    return 0;
  pthread_mutex_lock(&c->lock);
  /* Its admission's sponsor must be a member this peer knows; a key that
   * speaks for another id, or an id with another key, is not bound. */
  ok = pulse_loco_auth_admit_seen(c->auth, adm.round, key, adm.sponsor,
                                  adm.sig) == PULSE_OK &&
       pin_locked(c, id, key, UINT64_MAX) == 1;
  pthread_mutex_unlock(&c->lock);
  if (ok)
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "loco collab: peer %u: learned trainer %u's key (admitted "
                 "until round %llu)",
                 c->id, id, (unsigned long long)adm.round);
  return ok;
}

void collab_auth_note_view(pulse_loco_collab *c, const loco_manifest *view) {
  if (c->auth == NULL || view->nmembers == 0)
    return;
  pthread_mutex_lock(&c->lock);
  pulse_loco_member *m =
      realloc(c->auth_view, view->nmembers * sizeof *c->auth_view);
  if (m != NULL) { /* else the last one stays */
    memcpy(m, view->members, view->nmembers * sizeof *m);
    c->auth_view = m;
    c->auth_nview = view->nmembers;
  }
  pthread_mutex_unlock(&c->lock);
}

pulse_status collab_auth_publish_key(pulse_loco_collab *c) {
  if (c->auth == NULL)
    return PULSE_OK;
  char text[LOCO_AUTH_KEY_BLOB_MAX];
  pthread_mutex_lock(&c->lock);
  int len = loco_auth_key_blob_write(text, sizeof text, c->id,
                                     c->auth_pins[0].key, /* its own */
                                     c->has_admission ? &c->admission : NULL);
  pthread_mutex_unlock(&c->lock);
  if (len < 0)
    return pulse_fail(PULSE_ERR_INTERNAL, "loco collab: key blob");
  return loco_server_put(c->srv, "/v1/loco/key", text, (size_t)len);
}

pulse_status pulse_loco_collab_admit(const pulse_loco_collab *c,
                                     const uint8_t newcomer[PULSE_KEY_BYTES],
                                     uint64_t until_round,
                                     pulse_loco_admission *out) {
  if (c == NULL || newcomer == NULL || out == NULL || c->auth == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: admit needs a peer that authenticates "
                      "(sign_key)");
  pthread_mutex_t *lock = (pthread_mutex_t *)&c->lock;
  memcpy(out->key, newcomer, PULSE_KEY_BYTES);
  out->round = until_round;
  pthread_mutex_lock(lock);
  memcpy(out->sponsor, c->auth_pins[0].key, PULSE_KEY_BYTES); /* its own */
  pulse_status st =
      pulse_loco_auth_admit_sign(c->auth, until_round, newcomer, out->sig);
  pthread_mutex_unlock(lock);
  return st;
}

pulse_status collab_auth_start(pulse_loco_collab *c,
                               const pulse_loco_collab_opts *o) {
  c->auth = NULL;
  if (o->sign_key == NULL) {
    if (o->member_key_count > 0 || o->admission != NULL)
      return pulse_fail(PULSE_ERR_ARG,
                        "loco collab: members' keys or an admission but no "
                        "key of this peer: the others could not check what "
                        "it serves");
    return PULSE_OK;
  }
  if ((o->member_keys == NULL && o->member_key_count > 0) ||
      o->member_key_count >= PULSE_LOCO_AUTH_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: at most %u members' keys",
                      PULSE_LOCO_AUTH_MAX_MEMBERS - 1u);
  uint8_t own[PULSE_KEY_BYTES];
  pulse_sign_key_public(o->sign_key, own);
  uint8_t *keys = malloc((o->member_key_count + 1) * PULSE_KEY_BYTES);
  if (keys == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: keys");
  for (size_t i = 0; i < o->member_key_count; i++) {
    /* A config that cannot be verified: this peer's id under another key,
     * or one key for two ids. */
    int clash = o->member_keys[i].id == c->id &&
                memcmp(o->member_keys[i].key, own, PULSE_KEY_BYTES) != 0;
    for (size_t j = 0; j < i && !clash; j++)
      clash = (o->member_keys[j].id == o->member_keys[i].id) !=
              (memcmp(o->member_keys[j].key, o->member_keys[i].key,
                      PULSE_KEY_BYTES) == 0);
    if (clash) {
      free(keys);
      return pulse_fail(PULSE_ERR_ARG,
                        "loco collab: members' keys cannot be verified: a "
                        "trainer id with two keys (this peer's own "
                        "included), or one key for two ids");
    }
    memcpy(keys + PULSE_KEY_BYTES * i, o->member_keys[i].key, PULSE_KEY_BYTES);
  }
  if (o->admission != NULL &&
      memcmp(o->admission->key, own, PULSE_KEY_BYTES) != 0) {
    free(keys);
    return pulse_fail(PULSE_ERR_ARG,
                      "loco collab: the admission is for another key than "
                      "this peer's");
  }
  if (o->admission != NULL) {
    c->has_admission = 1;
    c->admission = *o->admission;
  }
  /* By id, this peer's own included (for what a named trainer signs). */
  c->auth_cappins = o->member_key_count + 1 + 16;
  c->auth_pins = malloc(c->auth_cappins * sizeof *c->auth_pins);
  c->auth_until = malloc(c->auth_cappins * sizeof *c->auth_until);
  if (c->auth_pins == NULL || c->auth_until == NULL) {
    free(keys);
    return pulse_fail(PULSE_ERR_NOMEM, "loco collab: keys");
  }
  c->auth_pins[0].id = c->id;
  memcpy(c->auth_pins[0].key, own, PULSE_KEY_BYTES);
  c->auth_npins = 1;
  for (size_t i = 0; i < o->member_key_count; i++)
    c->auth_pins[c->auth_npins++] = o->member_keys[i];
  for (size_t i = 0; i < c->auth_npins; i++)
    c->auth_until[i] = UINT64_MAX;
  pulse_loco_auth_opts ao;
  pulse_loco_auth_opts_init(&ao);
  ao.key = o->sign_key;
  ao.members = keys;
  ao.member_count = o->member_key_count;
  pulse_status st = pulse_loco_auth_create(&ao, &c->auth);
  free(keys);
  return st;
}

void collab_auth_stop(pulse_loco_collab *c) {
  pulse_loco_auth_free(c->auth);
  c->auth = NULL;
  free(c->auth_pins);
  free(c->auth_until);
  free(c->auth_view);
  c->auth_view = NULL;
  c->auth_nview = 0;
  c->auth_pins = NULL;
  c->auth_until = NULL;
  c->auth_npins = c->auth_cappins = 0;
  loco_tamper_clear(&c->tamper);
}

/* Signs n bytes of kind `kind` for round with this peer's key, under a
 * test's fault. 0: it could not (the message goes unsigned). */
static int sign_bytes(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                      uint64_t round, const void *data, size_t size,
                      loco_sig *sig) {
  memset(sig, 0, sizeof *sig);
  if (c->auth == NULL)
    return 0;
  pthread_mutex_lock(&c->lock);
  pulse_status st = pulse_loco_auth_sign(c->auth, kind, round, data, size,
                                         sig->sig, sig->key);
  pthread_mutex_unlock(&c->lock);
  if (st != PULSE_OK)
    return 0;
  sig->present = 1;
  sig->round = round;
  /* A test's fault: a replay needs the old body, which a blob's signer
   * does not choose; the other faults are the signature's. */
  loco_tamper_sign(&c->tamper, kind, round, data, size, sig);
  return 1;
}

int collab_auth_sign(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                     uint64_t r, const void *data, size_t size,
                     loco_sig *sig) {
  return sign_bytes(c, kind, r, data, size, sig);
}

/* What a partitioned blob's signature covers: its path (round, attempt,
 * what it is: "/v1/loco/part/R/A/WHAT") and the SHA-256 of its bytes, so
 * that a blob of another attempt of the round, or another of the
 * signer's blobs, served in its place does not verify. */
static int part_text(const char *path, const void *data, size_t size,
                     char out[400]) {
  uint8_t sha[32];
  char hex[65];
  loco_sha256(data, size, sha);
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", sha[i]);
  int len = snprintf(out, 400, "pulse-loco-part/1\npath %s\nsha256 %s\n",
                     path, hex);
  return len > 0 && len < 400 ? len : -1;
}

int collab_auth_sign_blob(void *user, pulse_loco_auth_kind kind, uint64_t round,
                          const char *path, const void *data, size_t size,
                          loco_sig *sig) {
  if (path == NULL)
    return sign_bytes(user, kind, round, data, size, sig);
  char text[400];
  int len = part_text(path, data, size, text);
  if (len < 0) {
    memset(sig, 0, sizeof *sig);
    return 0;
  }
  return sign_bytes(user, kind, round, text, (size_t)len, sig);
}

int collab_auth_accept_blob(void *user, pulse_loco_auth_kind kind,
                            uint64_t round, uint32_t id, const char *path,
                            const loco_sig *sig, const void *data,
                            size_t size) {
  if (path == NULL) /* a client's whole payload: its bytes, as uploaded */
    return collab_auth_accept_by(user, kind, round, id, sig, data, size);
  char text[400];
  int len = part_text(path, data, size, text);
  return collab_auth_accept_by(user, kind, round, id, sig, text,
                               len < 0 ? 0 : (size_t)len);
}

int collab_auth_trailer(pulse_loco_collab *c, uint64_t r, const void *data,
                        size_t size, uint8_t trailer[COLLAB_SIG_TRAILER]) {
  if (c->auth == NULL)
    return 0;
  pthread_mutex_lock(&c->lock);
  pulse_status st = pulse_loco_auth_sign(c->auth, PULSE_LOCO_AUTH_PAYLOAD, r,
                                         data, size, trailer + 40, trailer + 8);
  pthread_mutex_unlock(&c->lock);
  for (int i = 0; i < 8; i++)
    trailer[i] = (uint8_t)(r >> (8 * i));
  return st == PULSE_OK;
}

pulse_status collab_auth_tamper(pulse_loco_collab *c, unsigned mode,
                                unsigned kinds) {
  if (c->auth == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco collab: tamper needs a key");
  return loco_tamper_set(&c->tamper, mode, kinds);
}

int collab_auth_accept_by(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                          uint64_t r, uint32_t id, const loco_sig *sig,
                          const void *data, size_t size) {
  if (c->auth == NULL)
    return 1;
  uint8_t sha[32];
  loco_sha256(data, size, sha);
  return collab_auth_accept_by_digest(c, kind, r, id, sig, size, sha);
}

int collab_auth_accept_by_digest(pulse_loco_collab *c,
                                 pulse_loco_auth_kind kind, uint64_t r,
                                 uint32_t id, const loco_sig *sig,
                                 uint64_t size, const uint8_t sha[32]) {
  return accept_by_window(c, kind, r, r, id, sig, size, sha);
}

/* collab_auth_accept_by_digest for a round in [floor, ceiling]. */
static int accept_by_window(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                            uint64_t floor, uint64_t ceiling, uint32_t id,
                            const loco_sig *sig, uint64_t size,
                            const uint8_t sha[32]) {
  if (c->auth == NULL)
    return 1;
  loco_sig bound;
  if (sig != NULL && sig->present) {
    uint8_t key[PULSE_KEY_BYTES];
    pthread_mutex_lock(&c->lock);
    int have = pinned_key_locked(c, id, key);
    pthread_mutex_unlock(&c->lock);
    /* A member admitted after this peer started: learn its key (not for
     * an unsigned body: nothing to check it with anyway). */
    if (!have && learn_key(c, id, NULL)) {
      pthread_mutex_lock(&c->lock);
      have = pinned_key_locked(c, id, key);
      pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->lock);
    int member = pulse_loco_auth_is_member(c->auth, sig->key);
    if (member && !have) {
      c->auth_foreign_extra++;
      c->auth_refused_kind[kind - 1]++;
    }
    pthread_mutex_unlock(&c->lock);
    if (member && !have) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "loco collab: peer %u: a %s of round %llu from trainer "
                   "%u, whose key is not pinned: refused",
                   c->id, loco_auth_kind_word(kind),
                   (unsigned long long)sig->round, id);
      return 0;
    }
    /* Checked under the key pinned for that id: another member's
     * signature does not verify under it (forged). A stranger's key stays
     * as it came: foreign. */
    bound = *sig;
    if (member)
      memcpy(bound.key, key, PULSE_KEY_BYTES);
    sig = &bound;
  }
  return collab_auth_accept_digest(c, kind, floor, ceiling, sig, size, sha);
}

pulse_status collab_auth_put(pulse_loco_collab *c, const char *path,
                             pulse_loco_auth_kind kind, uint64_t r,
                             const void *data, size_t size) {
  if (c->auth == NULL)
    return loco_server_put(c->srv, path, data, size);
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  sig.present = 1;
  sig.round = r;
  pthread_mutex_lock(&c->lock);
  pulse_status st =
      pulse_loco_auth_sign(c->auth, kind, r, data, size, sig.sig, sig.key);
  pthread_mutex_unlock(&c->lock);
  /* Under a test's fault, what a hostile or broken peer serves. */
  return st == PULSE_OK
             ? loco_tamper_put(&c->tamper, c->srv, path, kind, r, data, size,
                               &sig)
             : st;
}

pulse_status collab_auth_put_locked(pulse_loco_collab *c, const char *path,
                                    pulse_loco_auth_kind kind, uint64_t r,
                                    const void *data, size_t size) {
  if (c->auth == NULL)
    return loco_server_put(c->srv, path, data, size);
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  sig.present = 1;
  sig.round = r;
  PULSE_TRY(
      pulse_loco_auth_sign(c->auth, kind, r, data, size, sig.sig, sig.key));
  return loco_tamper_put(&c->tamper, c->srv, path, kind, r, data, size, &sig);
}

/* ------------------------------------------------------------- outcomes */

pulse_status collab_auth_put_outcome(pulse_loco_collab *c, uint64_t r,
                                     int finished) {
  char path[96], text[48];
  snprintf(path, sizeof path, "/v1/loco/round/%llu/outcome",
           (unsigned long long)r);
  const char *word = finished ? "finished" : "failed";
  if (c->auth == NULL)
    return loco_server_put(c->srv, path, word, strlen(word));
  /* Numbered: a contributor's "failed" then "finished" in one round; the
   * first served again after the second is a replay. */
  int len = snprintf(text, sizeof text, "%s %llu", word,
                     (unsigned long long)loco_auth_seq_next());
  return collab_auth_put(c, path, PULSE_LOCO_AUTH_OUTCOME, r, text,
                         (size_t)len);
}

int collab_auth_outcome(pulse_loco_collab *c, uint64_t r, uint32_t id,
                        const loco_fetch *t) {
  const char *body = (const char *)t->body.data;
  size_t n = t->body.size;
  int word = n >= 8 && memcmp(body, "finished", 8) == 0 ? 2
             : n >= 6 && memcmp(body, "failed", 6) == 0 ? 1
                                                        : 0;
  size_t at = word == 2 ? 8 : 6;
  if (c->auth == NULL)
    return word != 0 && n == at ? word : 0;
  /* "WORD N": N its number, signed with it. */
  char digits[24];
  uint64_t seq = 0;
  if (word == 0 || n <= at + 1 || n - at - 1 >= sizeof digits ||
      body[at] != ' ')
    word = 0;
  if (word != 0) {
    memcpy(digits, body + at + 1, n - at - 1);
    digits[n - at - 1] = '\0';
    char *end = NULL;
    seq = strtoull(digits, &end, 10);
    if (digits[0] < '0' || digits[0] > '9' || *end != '\0' || seq == 0)
      word = 0;
  }
  loco_sig sig = t->sig;
  sig.seq = seq;
  uint8_t sha[32];
  loco_sha256(t->body.data, n, sha);
  /* A malformed body is checked all the same (unsigned, forged...), and
   * then not taken. */
  int ok = accept_by_window(c, PULSE_LOCO_AUTH_OUTCOME, r, r, id, &sig, n, sha);
  return ok ? word : 0;
}

int collab_auth_accept(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                       uint64_t floor, uint64_t ceiling, const char *base,
                       const loco_sig *sig, const void *data, size_t size) {
  if (c->auth == NULL)
    return 1;
  if (sig != NULL && sig->present && base != NULL) {
    pthread_mutex_lock(&c->lock);
    int member = pulse_loco_auth_is_member(c->auth, sig->key);
    pthread_mutex_unlock(&c->lock);
    /* Any member's signature holds: the member serving at base, admitted
     * after this peer started, is learned first. */
    if (!member)
      learn_key(c, UINT32_MAX, base);
  }
  uint8_t sha[32];
  loco_sha256(data, size, sha);
  return collab_auth_accept_digest(c, kind, floor, ceiling, sig, size, sha);
}

int collab_auth_accept_digest(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                              uint64_t floor, uint64_t ceiling,
                              const loco_sig *sig, uint64_t size,
                              const uint8_t sha[32]) {
  if (c->auth == NULL)
    return 1;
  int present = sig != NULL && sig->present;
  if (present) { /* its three header lines, each with CRLF */
    uint64_t d = 1;
    for (uint64_t v = sig->round; v >= 10; v /= 10)
      d++;
    c->auth_bytes += 260u + d;
  }
  /* (A signed POST, with its number, checked at the writer's gate: its
   * query is what it carries, "&seq=N&round=R&key=HEX&sig=HEX".) */
  pulse_status st;
  pthread_mutex_lock(&c->lock);
  if (present && sig->round > ceiling &&
      pulse_loco_auth_is_member(c->auth, sig->key)) {
    c->auth_forged_extra++;
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "loco auth: a %s of round %llu served for round %llu: "
                    "refused",
                    loco_auth_kind_word(kind), (unsigned long long)sig->round,
                    (unsigned long long)ceiling);
  } else {
    /* Any member's key (the handle's set); older than the floor, or than
     * one of this kind accepted from that member: a replay. */
    pulse_loco_auth_round(c->auth, floor);
    st = loco_auth_check_seq(c->auth, kind, present ? sig->round : floor,
                             present ? sig->key : NULL, size, sha,
                             present ? sig->sig : NULL,
                             present ? sig->seq : 0);
  }
  if (st != PULSE_OK)
    c->auth_refused_kind[kind - 1]++;
  pthread_mutex_unlock(&c->lock);
  if (st != PULSE_OK) {
    PULSE_LOG_AT(PULSE_LOG_WARN, "loco collab: peer %u: %s", c->id,
                 pulse_error_detail());
    return 0;
  }
  return 1;
}

void collab_auth_metrics(pulse_loco_collab *c, pulse_bytebuf *text) {
  if (c->auth == NULL)
    return;
  pulse_loco_auth_figures f;
  uint64_t by_kind[PULSE_LOCO_AUTH_KINDS];
  pthread_mutex_lock(&c->lock);
  pulse_loco_auth_figures_get(c->auth, &f);
  f.forged += c->auth_forged_extra;
  f.foreign += c->auth_foreign_extra;
  memcpy(by_kind, c->auth_refused_kind, sizeof by_kind);
  uint64_t joins_refused = c->auth_joins_refused;
  pthread_mutex_unlock(&c->lock);
  pulse_bytebuf_printf(
      text,
      "# HELP pulse_loco_auth_accepted_total Signed views and states that "
      "passed.\n"
      "# TYPE pulse_loco_auth_accepted_total counter\n"
      "pulse_loco_auth_accepted_total %llu\n"
      "# HELP pulse_loco_auth_refused_total Views and states refused, by "
      "reason.\n"
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
      "# HELP pulse_loco_auth_refused_kind_total The same refusals by what "
      "was refused.\n"
      "# TYPE pulse_loco_auth_refused_kind_total counter\n",
      (unsigned long long)f.accepted, (unsigned long long)f.unsigned_bodies,
      (unsigned long long)f.forged, (unsigned long long)f.replayed,
      (unsigned long long)f.foreign, (unsigned long long)f.admitted,
      (unsigned long long)joins_refused);
  for (unsigned k = 0; k < PULSE_LOCO_AUTH_KINDS; k++)
    pulse_bytebuf_printf(text,
                         "pulse_loco_auth_refused_kind_total{kind=\"%s\"} "
                         "%llu\n",
                         loco_auth_kind_word((pulse_loco_auth_kind)(k + 1)),
                         (unsigned long long)by_kind[k]);
}

/* ------------------------------------------------- claims and grants */

uint64_t collab_auth_query(pulse_loco_collab *c, pulse_loco_auth_kind kind,
                           uint64_t r, const char *text, char *dst,
                           size_t cap) {
  if (cap == 0)
    return 0;
  dst[0] = '\0';
  if (c->auth == NULL)
    return 0;
  /* Signed with a number never sent before: a repeat is a replay. */
  uint64_t seq = loco_auth_seq_next();
  char signed_text[400];
  int len = loco_auth_post_text(signed_text, sizeof signed_text, text, seq);
  int n_seq = snprintf(dst, cap, "&seq=%llu", (unsigned long long)seq);
  loco_sig sig;
  if (len < 0 || n_seq < 0 || (size_t)n_seq >= cap ||
      !sign_bytes(c, kind, r, signed_text, (size_t)len, &sig))
    return seq; /* sent unsigned: refused, as any unsigned request */
  loco_auth_post_query(&sig, dst + n_seq, cap - (size_t)n_seq);
  return seq;
}

/* The kind and round of a POST that must be signed: a claim, readiness or
 * acceptance ("/v1/collab/claim/R/...", ".../ready/R/...",
 * ".../accept/R/K"), an acknowledgement
 * ("/v1/loco/round/R/done"); 0 for any other. */
static pulse_loco_auth_kind signed_post(const char *path, uint64_t *r) {
  if (strcmp(path, "/v1/loco/join") == 0)
    return *r = 0, PULSE_LOCO_AUTH_JOIN; /* any round: its signature's */
  static const char *const prefixes[] = {
      "/v1/collab/claim/", "/v1/collab/ready/", "/v1/collab/accept/",
      "/v1/loco/round/"};
  for (int i = 0; i < 4; i++) {
    size_t k = strlen(prefixes[i]);
    if (strncmp(path, prefixes[i], k) != 0)
      continue;
    char *end = NULL;
    unsigned long long v = strtoull(path + k, &end, 10);
    if (end == path + k)
      return 0;
    *r = v;
    if (i < 3)
      return *end == '/' ? PULSE_LOCO_AUTH_CLAIM : 0;
    return strcmp(end, "/done") == 0 ? PULSE_LOCO_AUTH_DONE : 0;
  }
  return 0;
}

/* A join (server thread) of trainer id whose key (sig->key) nobody
 * pinned here, with a member's admission of that key in its query: the
 * join's own signature must verify under the key, the sponsor be a member
 * of the current round, the admission's signature verify and its round
 * not be past (pulse_loco_auth_admit); then the key is bound to id,
 * listable while the admission holds. The join is then checked as any
 * (its number). @return 0: nothing to admit here (a pinned id, no
 * signature, no admission: the join's own check decides, a key no member
 * pinned or admitted being foreign); 1: admitted; -1: refused (counted by
 * reason and kind). */
static int join_admission(pulse_loco_collab *c, uint32_t id,
                          const loco_sig *sig, size_t len,
                          const uint8_t sha[32],
                          const char *(*query)(void *rq, const char *key),
                          void *rq) {
  uint8_t key[PULSE_KEY_BYTES];
  pulse_loco_admission adm;
  if (!sig->present)
    return 0;
  pthread_mutex_lock(&c->lock);
  int pinned = pinned_key_locked(c, id, key);
  /* Pinned, or listed once (for good, as a pinned key); or a key that is
   * another trainer's. An admitted joiner not listed yet may bring a
   * newer admission of the same key. */
  int known = pinned ? collab_auth_listable_locked(c, id, UINT64_MAX) ||
                           memcmp(key, sig->key, PULSE_KEY_BYTES) != 0
                     : pulse_loco_auth_is_member(c->auth, sig->key);
  pthread_mutex_unlock(&c->lock);
  if (known || !loco_auth_admission_read(query, rq, sig->key, &adm))
    return 0;
  const char *why = NULL;
  pulse_status st = PULSE_OK;
  /* Its own signature first: a join that its key did not sign (another
   * trainer's admission replayed under this id) binds nothing. */
  int signed_ok = loco_auth_verify_body(PULSE_LOCO_AUTH_JOIN, sig->round,
                                        sig->key, len, sha, sig->sig);
  pthread_mutex_lock(&c->lock);
  uint32_t sponsor = UINT32_MAX;
  for (size_t i = 0; i < c->auth_npins && sponsor == UINT32_MAX; i++)
    if (memcmp(c->auth_pins[i].key, adm.sponsor, PULSE_KEY_BYTES) == 0)
      sponsor = c->auth_pins[i].id;
  if (!signed_ok) {
    c->auth_forged_extra++;
    why = "the join's signature does not verify under its key";
  } else if (sponsor == UINT32_MAX ||
             loco_member_find(c->members, c->nmembers, sponsor) < 0) {
    c->auth_foreign_extra++;
    why = "its sponsor is no member of this round";
  } else {
    /* Valid while the group has not passed its round (older: a replay). */
    pulse_loco_auth_round(c->auth, c->cur_round);
    st = pulse_loco_auth_admit(c->auth, adm.round, sig->key, adm.sponsor,
                               adm.sig);
    if (st != PULSE_OK)
      why = "the admission does not hold";
    else if (pin_locked(c, id, sig->key, adm.round) != 1)
      why = "no room, or the key is another trainer's";
  }
  if (why != NULL)
    c->auth_refused_kind[PULSE_LOCO_AUTH_JOIN - 1]++;
  uint64_t round = c->cur_round;
  pthread_mutex_unlock(&c->lock);
  if (why != NULL) {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco collab: peer %u: trainer %u's join refused at round "
                 "%llu: %s%s%s",
                 c->id, id, (unsigned long long)round, why,
                 st != PULSE_OK ? ": " : "",
                 st != PULSE_OK ? pulse_error_detail() : "");
    return -1;
  }
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "loco collab: peer %u: trainer %u admitted by trainer %u's "
               "admission (until round %llu)",
               c->id, id, sponsor, (unsigned long long)adm.round);
  return 1;
}

void collab_auth_join_query(pulse_loco_collab *c, const char *text, char *dst,
                            size_t cap) {
  collab_auth_query(c, PULSE_LOCO_AUTH_JOIN, pulse_loco_round(c->ctx), text,
                    dst, cap);
  size_t used = strlen(dst);
  if (c->auth != NULL && c->has_admission && used > 0 && used < cap)
    loco_auth_admission_query(&c->admission, dst + used, cap - used);
}

unsigned collab_auth_gate(void *user, const char *path,
                          const char *(*query)(void *rq, const char *key),
                          void *rq, char *reply, size_t cap) {
  pulse_loco_collab *c = user;
  uint64_t r = 0;
  pulse_loco_auth_kind kind = signed_post(path, &r);
  const char *id_text = query(rq, "id");
  char *end = NULL;
  unsigned long long id = id_text ? strtoull(id_text, &end, 10) : 0;
  if (c->auth == NULL || kind == 0 || id_text == NULL || end == id_text ||
      *end != '\0' || id > UINT32_MAX)
    return 0; /* not one to check, or the callback's 400 */
  char text[400];
  loco_sig sig;
  int len = loco_auth_post_read(path, query, rq, text, sizeof text, &sig);
  if (len < 0)
    return 0;
  uint8_t sha[32];
  loco_sha256((const uint8_t *)text, (size_t)len, sha);
  if (kind == PULSE_LOCO_AUTH_JOIN) {
    /* A key nobody pinned comes in on a member's admission, or not at
     * all. */
    int admitted = join_admission(c, (uint32_t)id, &sig, (size_t)len, sha,
                                  query, rq);
    if (admitted < 0) {
      pthread_mutex_lock(&c->lock);
      c->auth_joins_refused++;
      pthread_mutex_unlock(&c->lock);
      snprintf(reply, cap,
               "{\"error\":\"join refused: the admission of trainer %llu "
               "does not hold\"}",
               id);
      return COLLAB_UNVERIFIED;
    }
  }
  /* A joiner runs no round of the group yet: any round of its own. */
  uint64_t ceiling = kind == PULSE_LOCO_AUTH_JOIN ? UINT64_MAX : r;
  if (accept_by_window(c, kind, r, ceiling, (uint32_t)id, &sig, (size_t)len,
                       sha))
    return 0;
  if (kind == PULSE_LOCO_AUTH_JOIN) {
    pthread_mutex_lock(&c->lock);
    c->auth_joins_refused++;
    pthread_mutex_unlock(&c->lock);
  }
  snprintf(reply, cap,
           "{\"error\":\"not signed by trainer %llu for round "
           "%llu\"}",
           id, (unsigned long long)r);
  return COLLAB_UNVERIFIED;
}

void collab_auth_sign_reply(void *user, const char *path, const char *id,
                            unsigned status, loco_sig *sig) {
  pulse_loco_collab *c = user;
  uint64_t r = 0;
  memset(sig, 0, sizeof *sig);
  if (c->auth == NULL || id == NULL ||
      signed_post(path, &r) != PULSE_LOCO_AUTH_CLAIM)
    return;
  char text[352];
  int len =
      snprintf(text, sizeof text, "%s?id=%s\nstatus %u", path, id, status);
  if (len < 0 || (size_t)len >= sizeof text ||
      !sign_bytes(c, PULSE_LOCO_AUTH_GRANT, r, text, (size_t)len, sig))
    memset(sig, 0, sizeof *sig); /* unsigned: the member refuses it */
}

int collab_auth_grant_ok(pulse_loco_collab *c, uint64_t r, uint32_t w,
                         const char *text, uint64_t seq, unsigned status,
                         const loco_sig *sig) {
  if (c->auth == NULL)
    return 1;
  /* The answer to this request, numbered: an answer to another one (an
   * earlier claim of the same samples) replayed is not this one's. */
  char signed_text[400];
  int len = snprintf(signed_text, sizeof signed_text, "%s&seq=%llu\nstatus %u",
                     text, (unsigned long long)seq, status);
  if (len < 0 || (size_t)len >= sizeof signed_text)
    return 0;
  return collab_auth_accept_by(c, PULSE_LOCO_AUTH_GRANT, r, w, sig, signed_text,
                               (size_t)len);
}
