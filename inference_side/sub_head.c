/* sub_head.c - fetching heads and deciding whether to trust them: the
 * head must parse and check (pulse_store_head_parse verifies the Ed25519
 * signature over its canonical form), be signed by the pinned key (or the
 * key trusted on first use), and never be older than the newest head seen
 * (a relay replaying an old signed head cannot move a worker back). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

static uint64_t newest_seen(const pulse_sub *sub) {
  uint64_t s = sub->cache_head_step;
  if (sub->head != NULL) {
    uint64_t h = pulse_store_head_step(sub->head);
    if (s == PULSE_SUB_NO_STEP || h > s)
      s = h;
  }
  return s;
}

static pulse_status trust_first_key(pulse_sub *sub, const uint8_t pub[32]) {
  char hex[65], path[4096], line[80];
  store_hex(pub, 32, hex);
  snprintf(path, sizeof path, "%s/trusted-key", sub->cache_dir);
  int n = snprintf(line, sizeof line, "%s\n", hex);
  PULSE_TRY(pulse_file_write_atomic(path, line, (size_t)n));
  memcpy(sub->key, pub, 32);
  sub->have_key = 1;
  char msg[4400];
  snprintf(msg, sizeof msg,
           "no publisher key pinned: trusting %s on first use (kept in %s; pin "
           "it with the "
           "public key option)",
           hex, path);
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
  return PULSE_OK;
}

pulse_status sub_head_verify(pulse_sub *sub, const uint8_t *bytes, size_t n,
                             pulse_store_head **out) {
  *out = NULL;
  double t0 = sub_now();
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_parse(bytes, n, &h);
  sub->t_verify += sub_now() - t0;
  if (st != PULSE_OK)
    return pulse_fail(st == PULSE_ERR_NOMEM ? st : PULSE_ERR_CORRUPT,
                      "head refused: %s", pulse_error_detail());
  uint8_t pub[32];
  int is_signed = pulse_store_head_signer(h, pub);
  if (sub->have_key) {
    if (!is_signed) {
      pulse_store_head_free(h);
      return pulse_fail(
          PULSE_ERR_CORRUPT,
          "head refused: it is not signed, and a publisher key is %s",
          sub->key_pinned ? "pinned" : "trusted");
    }
    if (memcmp(pub, sub->key, 32) != 0) {
      char got[65], want[65];
      store_hex(pub, 32, got);
      store_hex(sub->key, 32, want);
      pulse_store_head_free(h);
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "head refused: signed by %s, not by the %s key %s", got,
                        sub->key_pinned ? "pinned" : "trusted", want);
    }
  } else if (!is_signed && !sub->opts.allow_unsigned) {
    pulse_store_head_free(h);
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "head refused: it is not signed (unsigned heads are not allowed)");
  }
  uint64_t seen = newest_seen(sub);
  if (seen != PULSE_SUB_NO_STEP && pulse_store_head_step(h) < seen) {
    uint64_t step = pulse_store_head_step(h);
    pulse_store_head_free(h);
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "head refused: step %" PRIu64
                      " is older than step %" PRIu64
                      " seen before (a stale or replayed head)",
                      step, seen);
  }
  if (is_signed && !sub->have_key) {
    st = trust_first_key(sub, pub);
    if (st != PULSE_OK) {
      pulse_store_head_free(h);
      return st;
    }
  }
  *out = h;
  return PULSE_OK;
}

/* Makes a verified head the current one. */
static void take(pulse_sub *sub, pulse_store_head *h, int *moved) {
  uint64_t old =
      sub->head ? pulse_store_head_step(sub->head) : PULSE_SUB_NO_STEP;
  size_t n;
  const uint8_t *b = pulse_store_head_bytes(h, &n);
  size_t on = 0;
  const uint8_t *ob = sub->head ? pulse_store_head_bytes(sub->head, &on) : NULL;
  int same = ob != NULL && on == n && memcmp(ob, b, n) == 0;
  if (moved != NULL)
    *moved = !same;
  uint8_t sha[32];
  char hex[65];
  store_sha256(b, n, sha);
  store_hex(sha, 32, hex);
  snprintf(sub->head_etag, sizeof sub->head_etag, "\"%s\"", hex);
  pulse_store_head_free(sub->head);
  sub->head = h;
  pthread_mutex_lock(&sub->fig_lock);
  sub->fig.head_step = pulse_store_head_step(h);
  pthread_mutex_unlock(&sub->fig_lock);
  if (!same) {
    pulse_sub_event ev = {0};
    ev.type = PULSE_SUB_EV_HEAD;
    ev.from_step = old;
    sub_emit(sub, &ev);
  }
}

static void reject_head(pulse_sub *sub, size_t url, pulse_status st) {
  sub_count(sub, &sub->fig.rejected, 1);
  char what[2100];
  sub_url(sub, url, "v1/head", what, sizeof what);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_REJECTED;
  ev.object = what;
  ev.status = st;
  ev.detail = pulse_error_detail();
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s: %s", what, ev.detail);
  sub_emit(sub, &ev);
}

pulse_status sub_head_fetch(pulse_sub *sub, int *moved) {
  pulse_status st = PULSE_ERR_NOT_FOUND;
  char detail[1024] = "";
  for (size_t u = 0; u < sub->nurls; u++) {
    pulse_fetch_xfer x;
    pulse_fetch_xfer_init(&x, NULL);
    x.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
    x.timeout_ms = sub->opts.request_timeout_ms;
    st = sub_fetch_mem(sub, u, "v1/head", &x, "head");
    if (st == PULSE_OK && x.status != 200)
      st = pulse_fail(PULSE_ERR_IO, "head: GET %s: HTTP %ld", x.url, x.status);
    pulse_store_head *h = NULL;
    if (st == PULSE_OK) {
      st = sub_head_verify(sub, x.mem.data, x.mem.size, &h);
      if (st != PULSE_OK)
        reject_head(sub, u, st);
    }
    pulse_fetch_xfer_release(&x);
    if (st == PULSE_OK) {
      take(sub, h, moved);
      return PULSE_OK;
    }
    snprintf(detail, sizeof detail, "%s", pulse_error_detail());
    if (atomic_load(&sub->stop))
      break;
  }
  return pulse_fail(st, "%s", detail);
}

pulse_status sub_head_poll(pulse_sub *sub, uint64_t after, int *got) {
  *got = 0;
  char rel[128];
  snprintf(rel, sizeof rel, "v1/head?after=%" PRIu64 "&timeout_ms=%" PRIu32,
           after, sub->opts.poll_timeout_ms);
  pulse_status st = PULSE_ERR_IO;
  for (size_t u = 0; u < sub->nurls; u++) {
    pulse_fetch_xfer x;
    pulse_fetch_xfer_init(&x, NULL);
    sub_url(sub, u, rel, x.url, sizeof x.url);
    x.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
    x.timeout_ms = sub->opts.poll_timeout_ms + sub->opts.request_timeout_ms;
    if (sub->head != NULL)
      snprintf(x.if_none_match, sizeof x.if_none_match, "%s", sub->head_etag);
    pulse_fetch_xfer *one = &x;
    double t0 = sub_now();
    st = sub_http_run(sub, &one, 1, NULL);
    sub->t_transfer -= sub_now() - t0; /* waiting for a step is not transfer */
    if (st == PULSE_OK) {
      if (pulse_fetch_xfer_answered(&x) &&
          (x.status == 304 || x.status == 404)) {
        pulse_fetch_xfer_release(&x);
        return PULSE_OK; /* nothing newer (or no head yet) */
      }
      if (!pulse_fetch_xfer_ok(&x))
        st = pulse_fetch_xfer_fail(&x, "long-poll");
    }
    pulse_store_head *h = NULL;
    if (st == PULSE_OK) {
      st = sub_head_verify(sub, x.mem.data, x.mem.size, &h);
      if (st != PULSE_OK && st != PULSE_ERR_BASE_STEP)
        reject_head(sub, u, st);
    }
    pulse_fetch_xfer_release(&x);
    if (st == PULSE_OK) {
      take(sub, h, got);
      return PULSE_OK;
    }
    if (atomic_load(&sub->stop))
      break;
  }
  return st;
}
