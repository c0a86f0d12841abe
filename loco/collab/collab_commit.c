/* collab_commit.c - the commit step of a collaboration round
 * (docs/protocols/loco-collaboration.md "Commit"): Paxos with the writer
 * ranks as ballots, one instance per round, the serving members of the
 * round (fixed by the manifest that committed the round before) as the
 * acceptors.
 *
 *   propose   W(r, k) serves its manifest at /v1/loco/round/R/proposal/K
 *             (signed by the writer it names: its own, or the one it
 *             re-proposes with that writer's signature)
 *   accept    a serving member that promised no rank above k (it sent no
 *             message at a higher rank) stores it, serves it at
 *             /v1/loco/round/R/accepted (below) and says
 *             POST W/v1/collab/accept/R/K?id=ID (signed as a claim)
 *   commit    with more than half of the serving members accepted (itself
 *             included), the writer serves /v1/loco/round/R/manifest: the
 *             round's manifest, which every member acts on
 *   take over W(r, k'), once more than half of the serving members sent
 *             it a message at rank k' (each promised k' first), reads what
 *             each accepted and proposes the highest-ranked one (else its
 *             own)
 *
 * Two majorities share a member, so a manifest committed at rank k is
 * what every later rank proposes, and a writer cut off from more than
 * half of the members commits nothing.
 *
 * /v1/loco/round/R/accepted is a member's promise, signed by it (kind
 * "promise", round R): "pulse-promise/1 R P none\n", or
 * "pulse-promise/1 R P K S\n" then, when S is 1, the 64-byte signature
 * and 32-byte key of the accepted manifest's writer, then the manifest's
 * bytes. P is the highest rank the member promised: it is served again
 * with every higher promise, before the message that makes it. A writer
 * taking over at rank k' takes only a statement with P >= k' (one served
 * before the promise, replayed by a hostile path, could hide an
 * acceptance); since the member accepts nothing below P, such a
 * statement is final for every rank below k'. */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "collab_impl.h"
#include "pulse_log.h"
#include <sys/socket.h>
#include <unistd.h>

#define MANIFEST_CAP ((size_t)LOCO_MAX_MEMBERS * 256u + 4096u)

int collab_found_dead(const pulse_loco_collab *c, uint64_t r, uint32_t id) {
  for (size_t i = 0; c->px_round == r && i < c->px_ndead; i++)
    if (c->px_dead[i] == id)
      return 1;
  return 0;
}

size_t collab_acceptors(const pulse_loco_collab *c, uint64_t r) {
  size_t n = 0;
  for (size_t i = 0; i < c->nmembers; i++)
    n += collab_serves(c->members[i].url) &&
         !collab_found_dead(c, r, c->members[i].id);
  return n;
}

/* Serves this peer's statement of round px_round (the file's comment):
 * what it accepted and the rank it promised, signed. 0: not served (no
 * memory; the statement served before stays, with its lower promise). */
static int serve_accepted(pulse_loco_collab *c) {
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  char head[96];
  int n;
  if (c->px_accepted) {
    int s = c->px_wsig.present != 0;
    n = snprintf(head, sizeof head, "pulse-promise/1 %" PRIu64 " %u %u %d\n",
                 c->px_round, c->px_promised, c->px_rank, s);
    pulse_bytebuf_put(&b, head, (size_t)n);
    if (s) {
      pulse_bytebuf_put(&b, c->px_wsig.sig, sizeof c->px_wsig.sig);
      pulse_bytebuf_put(&b, c->px_wsig.key, sizeof c->px_wsig.key);
    }
    pulse_bytebuf_put(&b, c->px_raw.data, c->px_raw.size);
  } else {
    n = snprintf(head, sizeof head, "pulse-promise/1 %" PRIu64 " %u none\n",
                 c->px_round, c->px_promised);
    pulse_bytebuf_put(&b, head, (size_t)n);
  }
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/accepted",
           c->px_round);
  int ok =
      !b.failed && collab_auth_put(c, path, PULSE_LOCO_AUTH_PROMISE,
                                   c->px_round, b.data, b.size) == PULSE_OK;
  pulse_bytebuf_free(&b);
  return ok;
}

void collab_promise(pulse_loco_collab *c, uint64_t r, uint32_t k) {
  int changed = 0;
  if (c->px_round != r) {
    c->px_round = r;
    c->px_promised = 0;
    c->px_accepted = 0;
    c->px_rank = 0;
    c->px_ndead = 0;
    pulse_bytebuf_free(&c->px_raw);
    c->px_raw = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    changed = 1;
  }
  if (k > c->px_promised)
    c->px_promised = k, changed = 1;
  if (changed)
    serve_accepted(c);
}

/* A TCP connection to url's host and port ("http://A.B.C.D:PORT..."),
 * started non-blocking into *fd: 1 started (or refused at once: *refused),
 * 0 not an address this can probe. */
static int probe_start(const char *url, int *fd, int *refused) {
  *fd = -1;
  *refused = 0;
  const char *h = strncmp(url, "http://", 7) == 0 ? url + 7 : NULL;
  const char *colon = h ? strchr(h, ':') : NULL;
  char host[64];
  if (colon == NULL || (size_t)(colon - h) >= sizeof host)
    return 0;
  memcpy(host, h, (size_t)(colon - h));
  host[colon - h] = '\0';
  const char *p = colon + 1;
  uint64_t port = 0;
  while (*p >= '0' && *p <= '9' && port < 65536u)
    port = port * 10u + (uint64_t)(*p++ - '0');
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  if (port == 0 || port > 65535u || inet_pton(AF_INET, host, &a.sin_addr) != 1)
    return 0;
  *fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (*fd < 0)
    return 0;
  if (connect(*fd, (struct sockaddr *)&a, sizeof a) == 0)
    return 1;
  if (errno == ECONNREFUSED)
    *refused = 1;
  else if (errno != EINPROGRESS) {
    close(*fd);
    *fd = -1;
    return 0;
  }
  return 1;
}

void collab_probe_dead(pulse_loco_collab *c, uint64_t r, const uint32_t *skip,
                       size_t nskip) {
  collab_promise(c, r, 0);
  size_t M = c->nmembers;
  struct pollfd *pf = calloc(M ? M : 1, sizeof *pf);
  uint32_t *who = calloc(M ? M : 1, sizeof *who);
  size_t n = 0;
  for (size_t i = 0; pf && who && i < M; i++) {
    const pulse_loco_member *m = &c->members[i];
    int skipped = m->id == c->id || !collab_serves(m->url) ||
                  collab_found_dead(c, r, m->id);
    for (size_t j = 0; j < nskip && !skipped; j++)
      skipped = skip[j] == m->id;
    int fd, refused;
    if (skipped || !probe_start(m->url, &fd, &refused))
      continue;
    if (refused) {
      close(fd);
      fd = -1;
      if (c->px_ndead < LOCO_PX_DEAD_MAX)
        c->px_dead[c->px_ndead++] = m->id;
      continue;
    }
    pf[n] = (struct pollfd){fd, POLLOUT, 0};
    who[n++] = m->id;
  }
  /* A live member accepts at once; a partitioned one never answers (its
   * packets are dropped): only a refusal is a death. */
  uint64_t end = loco_now_ms() + 250u;
  size_t open_n = n;
  while (open_n > 0) {
    uint64_t now = loco_now_ms();
    if (now >= end || poll(pf, n, (int)(end - now)) <= 0)
      break;
    for (size_t i = 0; i < n; i++) {
      if (pf[i].fd < 0 || pf[i].revents == 0)
        continue;
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(pf[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == ECONNREFUSED && c->px_ndead < LOCO_PX_DEAD_MAX) {
        c->px_dead[c->px_ndead++] = who[i];
        PULSE_LOG_AT(PULSE_LOG_INFO,
                     "loco collab round %" PRIu64 ": member %u refuses "
                     "connections: dead, not counted",
                     r, who[i]);
      }
      close(pf[i].fd);
      pf[i].fd = -1;
      open_n--;
    }
  }
  for (size_t i = 0; i < n; i++)
    if (pf[i].fd >= 0)
      close(pf[i].fd);
  free(pf), free(who);
}

/* Accepts manifest bytes (raw, signed sig) of round r proposed at rank k
 * unless a higher rank was promised: served at /v1/loco/round/R/accepted.
 * 1 when accepted. */
static int accept_proposal(pulse_loco_collab *c, uint64_t r, uint32_t k,
                           const void *raw, size_t size, const loco_sig *sig) {
  collab_promise(c, r, 0);
  if (c->px_promised > k)
    return 0;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_put(&b, raw, size);
  if (b.failed || b.data == NULL) {
    pulse_bytebuf_free(&b);
    return 0;
  }
  pulse_bytebuf_free(&c->px_raw);
  c->px_raw = b;
  c->px_wsig = *sig;
  c->px_promised = k;
  c->px_accepted = 1;
  c->px_rank = k;
  /* Unserved, the acceptance is not told: a takeover that cannot read it
   * must not have been counted on for it. */
  return serve_accepted(c);
}

/* A manifest's bytes checked for round r: parsed into *man, signed by the
 * writer it names (auth hook), of round r with contributors. */
static pulse_status check_manifest(pulse_loco_collab *c, uint64_t r,
                                   const void *data, size_t size,
                                   const loco_sig *sig, loco_manifest *man) {
  PULSE_TRY(loco_manifest_parse(data, size, man));
  if (!collab_auth_accept_by(c, PULSE_LOCO_AUTH_MANIFEST, r, man->coordinator,
                             sig, data, size)) {
    loco_manifest_free(man);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco collab: the manifest proposed for round %" PRIu64
                      " is refused",
                      r);
  }
  if (man->round != r || !man->has_contributors || man->ncontrib == 0) {
    loco_manifest_free(man);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "loco collab: manifest of round %" PRIu64
                      " does not fit",
                      r);
  }
  return PULSE_OK;
}

/* Tells W(r, k) at wurl this peer accepted its proposal: 1 when it said
 * so (signed answer). */
static int tell_accepted(pulse_loco_collab *c, uint64_t r, uint32_t k,
                         const char *wurl) {
  uint32_t w = pulse_loco_collab_writer(c->members, c->nmembers, r, k);
  char text[160], query[300], url[640];
  snprintf(text, sizeof text, "/v1/collab/accept/%" PRIu64 "/%u?id=%u", r, k,
           c->id);
  uint64_t seq =
      collab_auth_query(c, PULSE_LOCO_AUTH_CLAIM, r, text, query, sizeof query);
  snprintf(url, sizeof url, "%s%s%s", wurl, text, query);
  long status = 0;
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  loco_http_post_signed(url, c->opts.claim_timeout_ms, &status, &sig);
  return status == 200 &&
         collab_auth_grant_ok(c, r, w, text, seq, (unsigned)status, &sig);
}

pulse_status collab_follow_proposal(pulse_loco_collab *c, uint64_t r,
                                    uint32_t k, const char *wurl, int *told) {
  if (*told)
    return PULSE_OK;
  collab_promise(c, r, k);
  if (c->px_promised > k)
    return PULSE_OK; /* a higher rank is followed: not this one */
  if (!(c->px_accepted && c->px_rank == k)) {
    char url[160];
    snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/proposal/%u",
             wurl, r, k);
    pulse_bytebuf b = PULSE_BYTEBUF_INIT;
    long status = 0;
    loco_sig sig;
    memset(&sig, 0, sizeof sig);
    pulse_status st = loco_http_get_signed(url, c->opts.claim_timeout_ms,
                                           MANIFEST_CAP, &b, &status, &sig);
    if (st != PULSE_OK || status != 200) {
      pulse_bytebuf_free(&b);
      return st;
    }
    c->fetched += b.size;
    loco_manifest man;
    st = check_manifest(c, r, b.data, b.size, &sig, &man);
    if (st == PULSE_OK) {
      loco_manifest_free(&man);
      accept_proposal(c, r, k, b.data, b.size, &sig);
    }
    pulse_bytebuf_free(&b);
    if (st != PULSE_OK)
      return st;
  }
  if (c->px_accepted && c->px_rank == k)
    *told = tell_accepted(c, r, k, wurl);
  return PULSE_OK;
}

/* What member id at base accepted last in round r, as of a promise of
 * rank k or above: 1 answered (*have: a manifest, accepted below k, into
 * man, raw and sig, its rank into *rank), 0 no answer, or one that does
 * not check (unsigned, another signer, promised below k, malformed). */
static int read_one(pulse_loco_collab *c, uint64_t r, uint32_t k, uint32_t id,
                    const char *base, int *have, uint32_t *rank,
                    loco_manifest *man, pulse_bytebuf *raw, loco_sig *sig) {
  char url[160];
  snprintf(url, sizeof url, "%s/v1/loco/round/%" PRIu64 "/accepted", base, r);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  long status = 0;
  loco_sig outer;
  *have = 0;
  if (loco_http_get_signed(url, c->opts.claim_timeout_ms, MANIFEST_CAP + 256u,
                           &b, &status, &outer) != PULSE_OK ||
      status != 200 ||
      !collab_auth_accept_by(c, PULSE_LOCO_AUTH_PROMISE, r, id, &outer, b.data,
                             b.size)) {
    pulse_bytebuf_free(&b);
    return 0;
  }
  c->fetched += b.size;
  /* "pulse-promise/1 R P none\n" or "pulse-promise/1 R P K S\n"... */
  static const char magic[] = "pulse-promise/1 ";
  const uint8_t *nl =
      b.size ? memchr(b.data, '\n', b.size < 96 ? b.size : 96) : NULL;
  const char *p = (const char *)b.data;
  uint64_t rr = 0, promised = 0, k_at = 0, s = 0;
  int ok = nl != NULL && b.size > sizeof magic - 1 &&
           memcmp(p, magic, sizeof magic - 1) == 0;
  p += ok ? sizeof magic - 1 : 0;
  /* The digits end before nl: loco_take_decimal stays inside the body. */
  ok = ok && loco_take_decimal(&p, 20, ' ', &rr) && rr == r &&
       loco_take_decimal(&p, 10, ' ', &promised) && promised >= k;
  if (ok && (const uint8_t *)p + 4 == nl && memcmp(p, "none", 4) == 0) {
    pulse_bytebuf_free(&b);
    return 1; /* nothing accepted below its promise */
  }
  ok = ok && loco_take_decimal(&p, 10, ' ', &k_at) && k_at < k &&
       loco_take_decimal(&p, 1, '\n', &s) && s <= 1 &&
       (const uint8_t *)p == nl + 1;
  size_t off = ok ? (size_t)(nl + 1 - b.data) : 0;
  size_t need = s ? sizeof sig->sig + sizeof sig->key : 0;
  ok = ok && b.size - off >= need;
  memset(sig, 0, sizeof *sig);
  if (ok && s) {
    sig->present = 1;
    sig->round = r;
    memcpy(sig->sig, b.data + off, sizeof sig->sig);
    memcpy(sig->key, b.data + off + sizeof sig->sig, sizeof sig->key);
  }
  off += need;
  if (ok && check_manifest(c, r, b.data + off, b.size - off, sig, man) ==
                PULSE_OK) {
    *have = 1;
    *rank = (uint32_t)k_at;
    pulse_bytebuf_free(raw);
    *raw = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
    pulse_bytebuf_put(raw, b.data + off, b.size - off);
    if (raw->failed) {
      loco_manifest_free(man);
      *have = 0;
      ok = 0;
    }
  } else {
    ok = 0;
  }
  pulse_bytebuf_free(&b);
  return ok;
}

/* read_one of member id at base, kept in man, raw and sig when it is the
 * highest-ranked manifest found so far (*found, *best); @return 1 when it
 * answered. */
static size_t take_one(pulse_loco_collab *c, uint64_t r, uint32_t k,
                       uint32_t id, const char *base, loco_manifest *man,
                       pulse_bytebuf *raw, loco_sig *sig, int *found,
                       uint32_t *best) {
  int have = 0;
  uint32_t rank = 0;
  loco_manifest x;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  loco_sig s;
  size_t answered =
      (size_t)read_one(c, r, k, id, base, &have, &rank, &x, &b, &s);
  if (have && (!*found || rank > *best)) {
    if (*found) {
      loco_manifest_free(man);
      pulse_bytebuf_free(raw);
    }
    *man = x, *raw = b, *sig = s, *found = 1, *best = rank;
  } else {
    if (have)
      loco_manifest_free(&x);
    pulse_bytebuf_free(&b);
  }
  return answered;
}

size_t collab_read_accepted(pulse_loco_collab *c, uint64_t r, uint32_t k,
                            const collab_record *rec, size_t n,
                            loco_manifest *man, pulse_bytebuf *raw,
                            loco_sig *sig, int *found) {
  *found = 0;
  uint32_t best = 0;
  size_t answered = 0;
  /* This peer's own, as any member's (it promised k before it wrote). */
  collab_promise(c, r, k);
  if (c->px_accepted && c->px_rank < k)
    answered += take_one(c, r, k, c->id, c->url, man, raw, sig, found, &best);
  else
    answered++;
  for (size_t i = 0; i < c->nmembers; i++) {
    const pulse_loco_member *m = &c->members[i];
    int promised = 0;
    for (size_t j = 0; j < n; j++)
      promised |= rec[j].id == m->id && rec[j].contacted;
    if (m->id == c->id || !promised || !collab_serves(m->url))
      continue;
    answered += take_one(c, r, k, m->id, m->url, man, raw, sig, found, &best);
  }
  if (*found)
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "loco collab round %" PRIu64 ": rank %u proposes %u's "
                 "manifest, accepted at rank %u",
                 r, k, man->coordinator, best);
  return answered;
}

/* Acceptances of the proposal of round r at rank k in this peer's table
 * (itself included when it accepted). */
static size_t accepted_count(pulse_loco_collab *c, uint64_t r, uint32_t k) {
  size_t n = c->px_round == r && c->px_accepted && c->px_rank == k;
  pthread_mutex_lock(&c->lock);
  for (size_t i = 0; c->table_round == r && i < c->nrec; i++)
    n += c->rec[i].id != c->id && c->rec[i].accepted_k1 == k + 1u &&
         collab_serves(collab_url_of(c, c->rec[i].id)) &&
         !collab_found_dead(c, r, c->rec[i].id);
  pthread_mutex_unlock(&c->lock);
  return n;
}

pulse_status collab_commit(pulse_loco_collab *c, uint64_t r, uint32_t k,
                           loco_manifest *man, pulse_bytebuf *raw,
                           loco_sig *sig, char *src, size_t src_cap) {
  char path[96];
  snprintf(path, sizeof path, "/v1/loco/round/%" PRIu64 "/proposal/%u", r, k);
  pulse_bytebuf own = PULSE_BYTEBUF_INIT;
  loco_sig own_sig;
  memset(&own_sig, 0, sizeof own_sig);
  pulse_status st = PULSE_OK;
  if (raw->size > 0) {
    st = loco_server_put_signed(c->srv, path, raw->data, raw->size, sig);
    if (st == PULSE_OK)
      accept_proposal(c, r, k, raw->data, raw->size, sig);
  } else {
    /* Its own: signed (and served) as its manifest will be. */
    st = loco_manifest_write(man, &own);
    if (st == PULSE_OK)
      st = collab_auth_put(c, path, PULSE_LOCO_AUTH_MANIFEST, r, own.data,
                           own.size);
    if (st == PULSE_OK) {
      collab_auth_sign(c, PULSE_LOCO_AUTH_MANIFEST, r, own.data, own.size,
                       &own_sig);
      accept_proposal(c, r, k, own.data, own.size, &own_sig);
    }
  }
  pulse_bytebuf_free(&own);
  if (st != PULSE_OK)
    return st;
  uint64_t t0 = loco_now_ms(), look = t0 + c->opts.claim_timeout_ms;
  uint64_t probe = t0 + 100u;
  size_t S = collab_acceptors(c, r);
  uint64_t end = t0 + 2u * c->opts.round_timeout_ms +
                 4u * c->opts.claim_timeout_ms;
  size_t got = 0;
  for (;;) {
    got = accepted_count(c, r, k);
    S = collab_acceptors(c, r);
    if (2u * got > S)
      return PULSE_OK;
    uint64_t now = loco_now_ms();
    if (now >= probe) {
      /* The members that did not accept yet: a dead one is not counted. */
      uint32_t *acc = calloc(c->nmembers + 1u, sizeof *acc);
      size_t na = 0;
      pthread_mutex_lock(&c->lock);
      for (size_t i = 0; acc && c->table_round == r && i < c->nrec; i++)
        if (c->rec[i].accepted_k1 == k + 1u)
          acc[na++] = c->rec[i].id;
      pthread_mutex_unlock(&c->lock);
      if (acc)
        collab_probe_dead(c, r, acc, na);
      free(acc);
      probe = loco_now_ms() + 300u;
      continue;
    }
    if (now >= end)
      break;
    if (now >= look) {
      /* A majority elsewhere committed another rank's manifest: it is the
       * round's (this one never will be). */
      loco_manifest x;
      pulse_bytebuf xb = PULSE_BYTEBUF_INIT;
      loco_sig xs;
      if (collab_adopt_manifest(c, r, 0, &x, src, src_cap, &xb, &xs)) {
        PULSE_LOG_AT(PULSE_LOG_WARN,
                     "loco collab round %" PRIu64 ": its manifest at rank %u "
                     "was accepted by %zu of %zu members; the round was "
                     "committed by others",
                     r, k, got, S);
        loco_manifest_free(man);
        *man = x;
        pulse_bytebuf_free(raw);
        *raw = xb;
        *sig = xs;
        return PULSE_OK;
      }
      look = loco_now_ms() + 200u;
    }
    loco_sleep_ms(1);
  }
  return pulse_fail(PULSE_ERR_IO,
                    "loco collab: round %" PRIu64 ": its manifest was accepted "
                    "by %zu of %zu members (more than half needed) and no "
                    "member it reaches serves a committed one: cut off from "
                    "most of the collaboration (a partition)",
                    r, got, S);
}
