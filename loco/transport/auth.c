/* auth.c - authenticated PULSELoCo (pulse_loco_auth.h): pinned members,
 * signed payloads and manifests, replays of older rounds refused, every
 * refusal counted. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"
#include "store_impl.h"

#include "pulse_loco_auth.h"
#include "auth_impl.h"

/* A member and the newest round accepted from it, per kind. */
typedef struct {
  uint8_t pub[PULSE_KEY_BYTES];
  uint64_t newest[PULSE_LOCO_AUTH_KINDS]; /* by kind - 1; UINT64_MAX: none */
  uint64_t seq[PULSE_LOCO_AUTH_KINDS];    /* a signed POST's, the largest
                                             accepted; 0: none */
} auth_member;

struct pulse_loco_auth {
  const pulse_sign_key *key;
  uint8_t own[PULSE_KEY_BYTES];
  auth_member *members;
  size_t count, cap;
  uint64_t round;
  pulse_loco_auth_figures c;
};

static auth_member *find(const pulse_loco_auth *a, const uint8_t *pub) {
  for (size_t i = 0; i < a->count; i++)
    if (memcmp(a->members[i].pub, pub, PULSE_KEY_BYTES) == 0)
      return &a->members[i];
  return NULL;
}

static pulse_status add(pulse_loco_auth *a, const uint8_t *pub) {
  if (find(a, pub) != NULL)
    return PULSE_OK;
  if (a->count >= PULSE_LOCO_AUTH_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_OVERFLOW, "loco auth: more than %u members",
                      PULSE_LOCO_AUTH_MAX_MEMBERS);
  if (a->count == a->cap) {
    size_t cap = a->cap ? 2 * a->cap : 16;
    auth_member *m = realloc(a->members, cap * sizeof *m);
    if (m == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "loco auth: members");
    a->members = m;
    a->cap = cap;
  }
  auth_member *m = &a->members[a->count++];
  memcpy(m->pub, pub, PULSE_KEY_BYTES);
  for (unsigned k = 0; k < PULSE_LOCO_AUTH_KINDS; k++)
    m->newest[k] = UINT64_MAX, m->seq[k] = 0;
  return PULSE_OK;
}

static int kind_valid(pulse_loco_auth_kind kind) {
  return kind >= PULSE_LOCO_AUTH_PAYLOAD &&
         (unsigned)kind <= PULSE_LOCO_AUTH_KINDS;
}

/* The word naming a kind in its signed text. */
static const char *kind_name(pulse_loco_auth_kind kind) {
  static const char *const names[PULSE_LOCO_AUTH_KINDS] = {
      "payload",  "manifest", "state",  "members", "leave",   "done",
      "digests",  "sync",     "sketch", "slice",   "reduced", "verdict",
      "claim",    "grant",    "sent",   "joined",  "port",    "join",
      "progress", "outcome",  "promise"};
  return names[kind - 1];
}

const char *loco_auth_kind_word(pulse_loco_auth_kind kind) {
  return kind_valid(kind) ? kind_name(kind) : "?";
}

/* The signed text of a body of n bytes whose SHA-256 is sha
 * (pulse_loco_auth.h). */
static int body_text(pulse_loco_auth_kind kind, uint64_t round,
                     const uint8_t *signer, uint64_t n, const uint8_t sha[32],
                     char out[400]) {
  char pub_hex[65], sha_hex[65];
  store_hex(sha, 32, sha_hex);
  store_hex(signer, PULSE_KEY_BYTES, pub_hex);
  return snprintf(out, 400,
                  "pulse-loco-%s/1\nround %" PRIu64 "\nsigner %s\nsize %" PRIu64 "\n"
                  "sha256 %s\n",
                  kind_name(kind), round, pub_hex, n, sha_hex);
}

static int admit_text(uint64_t round, const uint8_t *sponsor,
                      const uint8_t *member, char out[300]) {
  char s[65], m[65];
  store_hex(sponsor, PULSE_KEY_BYTES, s);
  store_hex(member, PULSE_KEY_BYTES, m);
  return snprintf(out, 300,
                  "pulse-loco-admit/1\nround %" PRIu64 "\nsponsor %s\n"
                  "member %s\n",
                  round, s, m);
}

int loco_auth_verify_body(pulse_loco_auth_kind kind, uint64_t round,
                          const uint8_t signer[32], uint64_t n,
                          const uint8_t sha[32], const uint8_t sig[64]) {
  if (!kind_valid(kind) || signer == NULL || sha == NULL || sig == NULL)
    return 0;
  char text[400];
  int len = body_text(kind, round, signer, n, sha, text);
  return pulse_sign_verify(signer, text, (size_t)len, sig) == PULSE_OK;
}

void pulse_loco_auth_opts_init(pulse_loco_auth_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_LOCO_AUTH_OPTS_VERSION;
}

pulse_status pulse_loco_auth_create(const pulse_loco_auth_opts *opts,
                                    pulse_loco_auth **out) {
  if (out == NULL || opts == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco auth: NULL argument");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("loco auth", opts, PULSE_LOCO_AUTH_OPTS_VERSION));
  if (opts->key == NULL || (opts->members == NULL && opts->member_count > 0) ||
      opts->member_count > PULSE_LOCO_AUTH_MAX_MEMBERS)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco auth: options of version %u with a key and at "
                      "most %u members needed",
                      PULSE_LOCO_AUTH_OPTS_VERSION,
                      PULSE_LOCO_AUTH_MAX_MEMBERS);
  pulse_loco_auth *a = calloc(1, sizeof *a);
  if (a == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco auth");
  a->key = opts->key;
  pulse_sign_key_public(opts->key, a->own);
  pulse_status st = add(a, a->own);
  for (size_t i = 0; st == PULSE_OK && i < opts->member_count; i++)
    st = add(a, opts->members + i * PULSE_KEY_BYTES);
  if (st != PULSE_OK) {
    pulse_loco_auth_free(a);
    return st;
  }
  *out = a;
  return PULSE_OK;
}

void pulse_loco_auth_free(pulse_loco_auth *auth) {
  if (auth == NULL)
    return;
  free(auth->members);
  free(auth);
}

void pulse_loco_auth_round(pulse_loco_auth *auth, uint64_t round) {
  if (auth != NULL)
    auth->round = round;
}

pulse_status pulse_loco_auth_sign(const pulse_loco_auth *auth,
                                  pulse_loco_auth_kind kind, uint64_t round,
                                  const void *bytes, size_t n,
                                  uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES],
                                  uint8_t pub[PULSE_KEY_BYTES]) {
  if (auth == NULL || sig == NULL || (bytes == NULL && n > 0) ||
      !kind_valid(kind))
    return pulse_fail(PULSE_ERR_ARG, "loco auth: sign: bad argument");
  char text[400];
  uint8_t sha[32];
  store_sha256(bytes, n, sha);
  int len = body_text(kind, round, auth->own, n, sha, text);
  if (pub != NULL)
    memcpy(pub, auth->own, PULSE_KEY_BYTES);
  return pulse_sign(auth->key, text, (size_t)len, sig);
}

pulse_status pulse_loco_auth_check(pulse_loco_auth *auth,
                                   pulse_loco_auth_kind kind, uint64_t round,
                                   const uint8_t *signer, const void *bytes,
                                   size_t n, const uint8_t *sig) {
  if (auth == NULL || (bytes == NULL && n > 0) ||
      !kind_valid(kind))
    return pulse_fail(PULSE_ERR_ARG, "loco auth: check: bad argument");
  uint8_t sha[32];
  store_sha256(bytes, n, sha);
  return loco_auth_check_digest(auth, kind, round, signer, n, sha, sig);
}

pulse_status loco_auth_check_digest(pulse_loco_auth *auth,
                                    pulse_loco_auth_kind kind, uint64_t round,
                                    const uint8_t *signer, uint64_t n,
                                    const uint8_t sha[32], const uint8_t *sig) {
  return loco_auth_check_seq(auth, kind, round, signer, n, sha, sig, 0);
}

pulse_status loco_auth_check_seq(pulse_loco_auth *auth,
                                 pulse_loco_auth_kind kind, uint64_t round,
                                 const uint8_t *signer, uint64_t n,
                                 const uint8_t sha[32], const uint8_t *sig,
                                 uint64_t seq) {
  if (auth == NULL || sha == NULL || !kind_valid(kind))
    return pulse_fail(PULSE_ERR_ARG, "loco auth: check: bad argument");
  const char *what = kind_name(kind);
  if (signer == NULL || sig == NULL) {
    auth->c.unsigned_bodies++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco auth: a %s of round %" PRIu64
                      " without a signature: refused",
                      what, round);
  }
  auth_member *m = find(auth, signer);
  char hex[65];
  store_hex(signer, PULSE_KEY_BYTES, hex);
  if (m == NULL) {
    auth->c.foreign++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco auth: a %s of round %" PRIu64
                      " signed by %s, which is not a member: refused",
                      what, round, hex);
  }
  char text[400];
  int len = body_text(kind, round, signer, n, sha, text);
  if (pulse_sign_verify(signer, text, (size_t)len, sig) != PULSE_OK) {
    auth->c.forged++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco auth: a %s of round %" PRIu64
                      " whose signature by %s does not verify: refused",
                      what, round, hex);
  }
  uint64_t *newest = &m->newest[kind - 1];
  if (round < auth->round || (*newest != UINT64_MAX && round < *newest)) {
    auth->c.replayed++;
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "loco auth: a %s of round %" PRIu64
                      " by %s, older than round %" PRIu64 ": a replay, refused",
                      what, round, hex,
                      round < auth->round ? auth->round : *newest);
  }
  /* A message its signer made once (a POST's sequence number), seen
   * again: a replay within its round, or of an older one. */
  uint64_t *last = &m->seq[kind - 1];
  /* An outcome is a served body, read again and again: the same number
   * again is the same message; only an older one is a replay. */
  int again = kind == PULSE_LOCO_AUTH_OUTCOME && seq == *last;
  if (seq != 0 && seq <= *last && !again) {
    auth->c.replayed++;
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "loco auth: a %s of round %" PRIu64 " by %s, number %" PRIu64
                      " (not above %" PRIu64 ", the last accepted): a replay, "
                      "refused",
                      what, round, hex, seq, *last);
  }
  if (seq != 0)
    *last = seq;
  *newest = round;
  auth->c.accepted++;
  return PULSE_OK;
}

pulse_status pulse_loco_auth_admit_sign(const pulse_loco_auth *auth,
                                        uint64_t round,
                                        const uint8_t newcomer[32],
                                        uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]) {
  if (auth == NULL || newcomer == NULL || sig == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco auth: admit: NULL argument");
  char text[300];
  int len = admit_text(round, auth->own, newcomer, text);
  return pulse_sign(auth->key, text, (size_t)len, sig);
}

static pulse_status admit(pulse_loco_auth *auth, uint64_t round,
                          const uint8_t newcomer[32], const uint8_t sponsor[32],
                          const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES],
                          int check_round) {
  if (auth == NULL || newcomer == NULL || sponsor == NULL || sig == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco auth: admit: NULL argument");
  char hex[65];
  store_hex(sponsor, PULSE_KEY_BYTES, hex);
  if (find(auth, sponsor) == NULL) {
    auth->c.foreign++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco auth: an admission by %s, which is not a member: "
                      "refused",
                      hex);
  }
  char text[300];
  int len = admit_text(round, sponsor, newcomer, text);
  if (pulse_sign_verify(sponsor, text, (size_t)len, sig) != PULSE_OK) {
    auth->c.forged++;
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco auth: an admission whose signature by %s does not "
                      "verify: refused",
                      hex);
  }
  if (check_round && round < auth->round) {
    auth->c.replayed++;
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "loco auth: an admission of round %" PRIu64
                      ", older than round %" PRIu64 ": a replay, refused",
                      round, auth->round);
  }
  int had = find(auth, newcomer) != NULL;
  PULSE_TRY(add(auth, newcomer));
  auth->c.admitted += !had;
  return PULSE_OK;
}

pulse_status pulse_loco_auth_admit(pulse_loco_auth *auth, uint64_t round,
                                   const uint8_t newcomer[32],
                                   const uint8_t sponsor[32],
                                   const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]) {
  return admit(auth, round, newcomer, sponsor, sig, 1);
}

pulse_status pulse_loco_auth_admit_seen(pulse_loco_auth *auth, uint64_t round,
                                        const uint8_t newcomer[32],
                                        const uint8_t sponsor[32],
                                        const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]) {
  return admit(auth, round, newcomer, sponsor, sig, 0);
}

int pulse_loco_auth_is_member(const pulse_loco_auth *auth,
                              const uint8_t pub[32]) {
  return auth != NULL && pub != NULL && find(auth, pub) != NULL;
}

void pulse_loco_auth_figures_get(const pulse_loco_auth *auth,
                                  pulse_loco_auth_figures *out) {
  if (auth != NULL && out != NULL)
    *out = auth->c;
}
