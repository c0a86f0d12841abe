/* server_catchup.c - GET /v1/catchup/<step>: one patch from a retained step
 * (or from one whose objects earlier heads named and the store still holds,
 * server_history.c) to the head; with ?to=<step>, to that step instead (the
 * head, or an earlier head the server remembers): a pinned catch-up, whose
 * bytes never change, served immutable. This file is the route (checks,
 * the cache lookup, the answer and its signature) and the cache's upkeep; the patch
 * is built, kept and checked by server_catchup_build.c on the builder
 * threads of server_catchup_queue.c, never on an HTTP thread. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"
#include "store_impl.h"

int srv_catchup_open(pulse_server *srv, const srv_catchup *c) {
  if (c->memfd >= 0)
    return fcntl(c->memfd, F_DUPFD_CLOEXEC, 0);
  char hex[65], name[80], path[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%s.pulse", hex);
  if (srv_catchup_path(path, sizeof path, srv->dir, name) != 0)
    return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat sb;
  /* Any write to the file since it was checked changes its ctime (and a
   * replaced file its inode): checked again on a builder thread then. */
  if (fd >= 0 &&
      (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
       (uint64_t)sb.st_size != c->size || sb.st_dev != c->dev ||
       sb.st_ino != c->ino || sb.st_ctim.tv_sec != c->ctime.tv_sec ||
       sb.st_ctim.tv_nsec != c->ctime.tv_nsec)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void forget(pulse_server *srv, size_t i) {
  if (srv->catchups[i].memfd >= 0)
    close(srv->catchups[i].memfd);
  memmove(srv->catchups + i, srv->catchups + i + 1,
          (srv->ncatchups - i - 1) * sizeof *srv->catchups);
  srv->ncatchups--;
}

void srv_catchup_remember(pulse_server *srv, const srv_catchup *c) {
  for (size_t i = 0; i < srv->ncatchups; i++)
    if (srv->catchups[i].from == c->from && srv->catchups[i].to == c->to) {
      forget(srv, i);
      break;
    }
  if (srv->ncatchups == SRV_CATCHUP_MEMORY)
    forget(srv, 0);
  srv->catchups[srv->ncatchups++] = *c;
}

/* 1 when this server may build catch-ups of head h: it signs them with the
 * head's own key, or the head is unsigned (then nobody verifies anything
 * beyond digests anyway). A relay without the key would build patches no
 * client can verify: clients fetch the signed chain instead. */
static int may_build(const pulse_server *srv, const srv_head *h,
                     const char **why) {
  uint8_t signer[PULSE_KEY_BYTES], ours[PULSE_KEY_BYTES];
  if (!pulse_store_head_signer(h->head, signer))
    return 1;
  if (srv->opts.key == NULL) {
    *why = "this server does not hold the publisher's signing key, so no "
           "client could verify a catch-up it built: fetch the patches";
    return 0;
  }
  pulse_sign_key_public(srv->opts.key, ours);
  if (memcmp(signer, ours, sizeof ours) != 0) {
    *why = "this server's signing key is not the one that signed the head, "
           "so no client could verify a catch-up it built: fetch the patches";
    return 0;
  }
  return 1;
}

/* Answers with a catch-up of head h (takes fd). A pinned one (?to=) is the
 * same bytes for ever: immutable; one that follows the head: no-cache. */
static int reply_catchup(pulse_server *srv, pulse_serve_request *rq,
                         const srv_head *h, uint64_t from,
                         const srv_catchup *cu, int fd, int pinned) {
  srv_catchup c = *cu;
  if (pinned)
    atomic_fetch_add(&srv->metrics.catchup_pinned, 1);
  char from_s[24], to_s[24], hex[65], etag[67], digest[65], sig_hex[129],
      pub_hex[65];
  snprintf(from_s, sizeof from_s, "%" PRIu64, from);
  snprintf(to_s, sizeof to_s, "%" PRIu64, h->step);
  store_hex(c.sha256, 32, hex);
  snprintf(etag, sizeof etag, "\"%s\"", hex);
  store_hex(pulse_store_head_state_digest(h->head)->bytes, 32, digest);
  const char *extra[16] = {"X-Pulse-From-Step",
                           from_s,
                           "X-Pulse-To-Step",
                           to_s,
                           "X-Pulse-State-Digest",
                           digest,
                           NULL};
  if (srv->opts.key != NULL) {
    char canon[600];
    int len = store_catchup_canon(h->head, from, h->step, digest, hex, c.size,
                                  canon, sizeof canon);
    uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES], pub[PULSE_KEY_BYTES];
    if (len >= 0 && pulse_sign(srv->opts.key, canon, (size_t)len, sig) == PULSE_OK) {
      pulse_sign_key_public(srv->opts.key, pub);
      store_hex(sig, sizeof sig, sig_hex);
      store_hex(pub, sizeof pub, pub_hex);
      extra[6] = "X-Pulse-Signature";
      extra[7] = sig_hex;
      extra[8] = "X-Pulse-Public-Key";
      extra[9] = pub_hex;
      extra[10] = NULL;
    }
  }
  pulse_serve_meta m = {0, NULL,
                        pinned ? PULSE_SERVE_IMMUTABLE : PULSE_SERVE_NO_CACHE,
                        etag, extra};
  return pulse_serve_reply_fd(rq, &m, fd, c.size);
}

/* A request resumed by its build's end, its wait's end, or the stop. */
static int answer_waiter(pulse_server *srv, pulse_serve_request *rq) {
  srv_build_waiter *w = pulse_serve_attached(rq);
  srv_build *b = w->build;
  /* The build is done and no longer changes once its waiters are woken. */
  if (w->woken == SRV_WAIT_DONE && b->status == PULSE_OK) {
    int fd = fcntl(b->fd, F_DUPFD_CLOEXEC, 0);
    if (fd >= 0)
      return reply_catchup(srv, rq, b->head, b->from, &b->result, fd,
                           w->pinned);
    return pulse_serve_reply_error(rq, 500, "catch-up from step %" PRIu64
                                   ": out of file descriptors", b->from);
  }
  if (w->woken == SRV_WAIT_DONE)
    return pulse_serve_reply_error(
        rq, b->status == PULSE_ERR_NOT_FOUND ? 404 : 500,
        "catch-up from step %" PRIu64 ": %s", b->from, b->detail);
  atomic_fetch_add(&srv->metrics.catchup_refused, 1);
  if (w->woken == SRV_WAIT_TIMEOUT)
    return pulse_serve_reply_error(rq, 503,
                                   "the catch-up from step %" PRIu64
                                   " is still being built: retry later, or "
                                   "fetch the patches",
                                   b->from);
  return pulse_serve_reply_error(rq, 503, "the server is stopping");
}

/* Notes a pinned request for (from, to): its cached files outlive the
 * head's moves for SRV_PIN_KEEP_S (the least recently asked gives way).
 * catchup_lock held. */
static void note_pin(pulse_server *srv, uint64_t from, uint64_t to) {
  size_t k = 0;
  while (k < srv->npins &&
         !(srv->pins[k].from == from && srv->pins[k].to == to))
    k++;
  if (k == SRV_PINS_MAX) {
    k = 0;
    for (size_t i = 1; i < srv->npins; i++)
      if (srv->pins[i].asked < srv->pins[k].asked)
        k = i;
  } else if (k == srv->npins) {
    srv->npins++;
  }
  srv->pins[k] = (srv_pin){from, to, pulse_serve_now()};
}

/* 1 when (from, to) was asked for pinned within SRV_PIN_KEEP_S of now.
 * catchup_lock held. */
static int pinned_lately(const pulse_server *srv, uint64_t from, uint64_t to,
                         double now) {
  for (size_t i = 0; i < srv->npins; i++)
    if (srv->pins[i].from == from && srv->pins[i].to == to)
      return now - srv->pins[i].asked < SRV_PIN_KEEP_S;
  return 0;
}

/* The head a catch-up ends at: the current one, or for ?to= an earlier one
 * the server remembers (a reference in *out). Answers 404 itself (returned
 * through *reply, *out NULL) when there is none. */
static int target_head(pulse_server *srv, pulse_serve_request *rq,
                       uint64_t from, int pinned, uint64_t to, srv_head **out,
                       int *reply) {
  srv_head *h = srv_head_get(srv);
  *out = NULL;
  if (h == NULL) {
    *reply = pulse_serve_reply_error(rq, 404, "the store has no head yet");
    return 0;
  }
  uint64_t head = h->step, oldest = UINT64_MAX;
  if (pinned && to != head) {
    srv_head_release(h);
    h = to < head ? srv_history_head(srv, to, &oldest) : NULL;
  }
  if (h == NULL) {
    if (to > head)
      *reply = pulse_serve_reply_error(
          rq, 404, "step %" PRIu64 " is above the head (%" PRIu64 ")", to,
          head);
    else if (oldest == UINT64_MAX)
      *reply = pulse_serve_reply_error(
          rq, 404,
          "step %" PRIu64 " is not a head this server remembers (the head is "
          "%" PRIu64 "): ask for the head's catch-up",
          to, head);
    else
      *reply = pulse_serve_reply_error(
          rq, 404,
          "step %" PRIu64 " is not a head this server remembers (the head is "
          "%" PRIu64 "; it remembers the heads of this run it saw, from step "
          "%" PRIu64 " on): ask for the head's catch-up",
          to, head, oldest);
    return 0;
  }
  to = h->step;
  if (from >= to) {
    srv_head_release(h);
    if (!pinned && from == to)
      *reply = pulse_serve_reply_error(rq, 404, "step %" PRIu64 " is the head",
                                       from);
    else if (!pinned)
      *reply = pulse_serve_reply_error(
          rq, 404, "step %" PRIu64 " is above the head (%" PRIu64 ")", from,
          to);
    else
      *reply = pulse_serve_reply_error(
          rq, 404,
          "a catch-up goes forward: from step %" PRIu64 " to step %" PRIu64
          " is none",
          from, to);
    return 0;
  }
  *out = h;
  return 1;
}

int srv_catchup_request(pulse_server *srv, pulse_serve_request *rq,
                        uint64_t from, int pinned, uint64_t to) {
  if (pulse_serve_resumed(rq))
    return answer_waiter(srv, rq);
  srv_head *h = NULL;
  int reply = 0;
  if (!target_head(srv, rq, from, pinned, to, &h, &reply))
    return reply;
  srv_head *now = srv_head_get(srv);
  int earlier = now != h; /* pinned to an earlier head */
  srv_head_release(now);
  srv_catchup c;
  int retained = pulse_store_head_has_step(h->head, from);
  /* Dropped by the head, but maybe not yet from the store: a follower
   * whose download outlasted the retention (server_history.c). An earlier
   * head's objects may be gone too. A catch-up cached on disk needs none
   * of them (a builder checks it against its name). */
  if ((!retained || earlier) && !srv_catchup_find_ref(srv, from, h->step, &c)) {
    srv_chain chain;
    if (srv_chain_find(srv, h->head, from, &chain) != PULSE_OK) {
      srv_head_release(h);
      return pulse_serve_reply_error(rq, 404, "%s", pulse_error_detail());
    }
    srv_chain_free(&chain);
  }
  if (!retained)
    atomic_fetch_add(&srv->metrics.catchup_history, 1);
  const char *why = NULL;
  if (!may_build(srv, h, &why)) {
    srv_head_release(h);
    return pulse_serve_reply_error(rq, 404, "%s", why);
  }
  int fd = -1;
  size_t np = pulse_store_head_patch_count(h->head);
  const pulse_store_object *last =
      np > 0 ? pulse_store_head_patch(h->head, np - 1) : NULL;
  if (last != NULL && last->base_step == from) {
    /* One step behind: the head's own patch is the catch-up. */
    memset(&c, 0, sizeof c);
    c.from = from;
    c.to = h->step;
    c.size = last->size;
    c.memfd = -1;
    memcpy(c.sha256, last->sha256, 32);
    char path[4096];
    if (store_join(path, sizeof path, srv->dir, last->path) == 0)
      fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    int r = fd >= 0 ? reply_catchup(srv, rq, h, from, &c, fd, pinned)
                    : pulse_serve_reply_error(rq, 404,
                                              "catch-up from step %" PRIu64
                                              ": %s is missing",
                                              from, last->path);
    srv_head_release(h);
    return r;
  }
  /* Cached and unchanged since it was checked: answered on this thread.
   * Anything else (a build, a first check of a file cached by an earlier
   * run) is a builder's. */
  const uint8_t *target = pulse_store_head_state_digest(h->head)->bytes;
  pthread_mutex_lock(&srv->catchup_lock);
  if (pinned)
    note_pin(srv, from, h->step);
  for (size_t i = 0; i < srv->ncatchups && fd < 0; i++)
    if (srv->catchups[i].from == from && srv->catchups[i].to == h->step &&
        memcmp(srv->catchups[i].target, target, 32) == 0) {
      c = srv->catchups[i];
      if ((fd = srv_catchup_open(srv, &c)) < 0) {
        forget(srv, i); /* gone or changed: a builder checks it again */
        break;
      }
    }
  if (fd >= 0) {
    pthread_mutex_unlock(&srv->catchup_lock);
    atomic_fetch_add(&srv->metrics.catchup_cache_hits, 1);
    int r = reply_catchup(srv, rq, h, from, &c, fd, pinned);
    srv_head_release(h);
    return r;
  }
  int r = srv_build_wait(srv, rq, h, from, pinned); /* releases the lock */
  srv_head_release(h);
  return r;
}

/* Drops cached catch-ups that do not end at the current head, except the
 * pinned ones asked for lately (a worker may still resume them). */
void srv_catchup_clean(pulse_server *srv) {
  srv_head *h = srv_head_get(srv);
  if (h == NULL)
    return;
  uint64_t step = h->step;
  srv_head_release(h);
  if (step == srv->catchup_clean_step)
    return;
  /* Never wait for the locks here (a builder may be writing a large
   * catch-up): try again on the next round. */
  if (pthread_mutex_trylock(&srv->catchup_files_lock) != 0)
    return;
  if (pthread_mutex_trylock(&srv->catchup_lock) != 0) {
    pthread_mutex_unlock(&srv->catchup_files_lock);
    return;
  }
  double now = pulse_serve_now();
  size_t k = 0;
  for (size_t i = 0; i < srv->npins; i++)
    if (now - srv->pins[i].asked < SRV_PIN_KEEP_S)
      srv->pins[k++] = srv->pins[i];
  srv->npins = k;
  k = 0;
  for (size_t i = 0; i < srv->ncatchups; i++) {
    if (srv->catchups[i].to == step ||
        pinned_lately(srv, srv->catchups[i].from, srv->catchups[i].to, now))
      srv->catchups[k++] = srv->catchups[i];
    else if (srv->catchups[i].memfd >= 0)
      close(srv->catchups[i].memfd);
  }
  srv->ncatchups = k;
  char folder[4096];
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_CATCHUP_DIR, srv->dir);
  DIR *d = opendir(folder);
  if (d != NULL) {
    /* Refs that do not end at the head (nor were pinned lately) go, then
     * every object no remaining ref names. */
    char keep_hex[SRV_CATCHUP_MEMORY * 8][65];
    size_t nkeep = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      uint64_t from, to;
      char tail[8];
      if (sscanf(e->d_name, "%" SCNu64 "-%" SCNu64 ".%4s", &from, &to, tail) !=
              3 ||
          strcmp(tail, "ref") != 0)
        continue;
      srv_catchup c;
      if ((to == step || pinned_lately(srv, from, to, now)) &&
          nkeep < sizeof keep_hex / sizeof keep_hex[0] &&
          srv_catchup_find_ref(srv, from, to, &c)) {
        store_hex(c.sha256, 32, keep_hex[nkeep++]);
        continue;
      }
      unlinkat(dirfd(d), e->d_name, 0);
    }
    rewinddir(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      pulse_store_kind kind;
      uint8_t sha[32];
      if (!store_parse_object_name(e->d_name, &kind, sha) &&
          !store_is_temp_name(e->d_name))
        continue;
      int kept = 0;
      for (size_t i = 0; i < nkeep && !kept; i++)
        kept = strncmp(e->d_name, keep_hex[i], 64) == 0;
      /* Temporaries of a build in progress elsewhere are left for it. */
      if (!kept && !store_is_temp_name(e->d_name))
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
  }
  srv->catchup_clean_step = step;
  pthread_mutex_unlock(&srv->catchup_lock);
  pthread_mutex_unlock(&srv->catchup_files_lock);
}

void srv_catchup_free(pulse_server *srv) {
  for (size_t i = 0; i < srv->ncatchups; i++)
    if (srv->catchups[i].memfd >= 0)
      close(srv->catchups[i].memfd);
  srv->ncatchups = 0;
}
