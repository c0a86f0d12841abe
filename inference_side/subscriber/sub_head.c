/* sub_head.c - fetching heads and deciding whether to trust them: the
 * head must parse and check (pulse_store_head_parse verifies the Ed25519
 * signature over its canonical form), be signed by the pinned key (or the
 * key trusted on first use, only when asked for), be of the run the worker holds, never be
 * older than the newest step the worker knows (a relay replaying an old
 * signed head cannot move a worker back, even one whose cache is gone),
 * and not older than the maximum age. Every source is asked and the newest
 * valid head wins; sources that serve older heads are reported. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

/* The newest step the worker knows of its run: the cache's head, the head
 * it follows, and the step its targets hold (a file target's claim counts
 * before it is checked: a worker whose cache is gone must not go back to
 * an older head a stale source still serves). */
static uint64_t newest_seen(const pulse_sub *sub, const char **what) {
  uint64_t s = sub->cache_head_step;
  *what = "seen before";
  if (sub->head != NULL) {
    uint64_t h = pulse_store_head_step(sub->head);
    if (s == PULSE_SUB_NO_STEP || h > s)
      s = h;
  }
  if (sub->step != PULSE_SUB_NO_STEP && (s == PULSE_SUB_NO_STEP || sub->step > s)) {
    s = sub->step;
    *what = "that the targets hold";
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

pulse_status sub_head_key_check(const pulse_sub *sub,
                                const pulse_store_head *h) {
  uint8_t pub[32], from[32];
  const char *kind = sub->key_pinned ? "pinned" : "trusted";
  if (!pulse_store_head_signer(h, pub))
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "head refused: it is not signed, and a publisher key is %s", kind);
  if (memcmp(pub, sub->key, 32) == 0)
    return PULSE_OK;
  uint64_t at = 0;
  int rotates = pulse_store_head_rotation(h, from, &at);
  if (rotates && memcmp(from, sub->key, 32) == 0)
    return PULSE_OK; /* the trusted key named its successor */
  char got[65], want[65], was[65];
  store_hex(pub, 32, got);
  store_hex(sub->key, 32, want);
  if (!rotates)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head refused: signed by %s, not by the %s key %s", got,
                      kind, want);
  store_hex(from, 32, was);
  return pulse_fail(PULSE_ERR_CORRUPT,
                    "head refused: signed by %s, not by the %s key %s, and "
                    "its key rotation (step %" PRIu64
                    ") is signed by %s, not by the %s key",
                    got, kind, want, at, was, kind);
}

void sub_head_follow_key(pulse_sub *sub, const pulse_store_head *h) {
  uint8_t pub[32];
  if (!sub->have_key || !pulse_store_head_signer(h, pub) ||
      memcmp(pub, sub->key, 32) == 0)
    return;
  char from[65], to[65], msg[600];
  store_hex(sub->key, 32, from);
  store_hex(pub, 32, to);
  uint64_t at = 0;
  pulse_store_head_rotation(h, NULL, &at);
  memcpy(sub->key, pub, 32);
  int n = snprintf(msg, sizeof msg,
                   "the publisher rotated its key at step %" PRIu64
                   ": %s -> %s; heads signed by the old key are refused "
                   "from now on",
                   at, from, to);
  if (!sub->key_pinned) { /* trusted on first use: the trust moves on */
    char path[4096], line[80];
    snprintf(path, sizeof path, "%s/trusted-key", sub->cache_dir);
    int len = snprintf(line, sizeof line, "%s\n", to);
    if (pulse_file_write_atomic(path, line, (size_t)len) != PULSE_OK &&
        n > 0 && (size_t)n < sizeof msg)
      snprintf(msg + n, sizeof msg - (size_t)n, " (%.200s not updated: %.200s)", path,
               pulse_error_detail());
  }
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
}

/* Is it the publisher's head at all: parsed, checked, signed by the key
 * (or by its successor, named by a rotation the key signed; or unsigned
 * where allowed)? On success *out is the head. */
static pulse_status head_trust(pulse_sub *sub, const uint8_t *bytes, size_t n,
                               pulse_store_head **out) {
  *out = NULL;
  double t0 = sub_now();
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_parse(bytes, n, &h);
  sub->t_verify += sub_now() - t0;
  if (st != PULSE_OK)
    return pulse_fail(st == PULSE_ERR_NOMEM ? st : PULSE_ERR_CORRUPT,
                      "head refused: %s", pulse_error_detail());
  int is_signed = pulse_store_head_signer(h, NULL);
  if (sub->have_key) {
    if ((st = sub_head_key_check(sub, h)) != PULSE_OK) {
      pulse_store_head_free(h);
      return st;
    }
  } else if (!is_signed && !sub->opts.allow_unsigned) {
    pulse_store_head_free(h);
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "head refused: it is not signed (unsigned heads are not allowed)");
  }
  *out = h;
  return PULSE_OK;
}

static void run_hex(const uint8_t *run, int have, char *out) {
  if (have)
    store_hex(run, PULSE_STORE_RUN_BYTES, out);
  else
    snprintf(out, 2 * PULSE_STORE_RUN_BYTES + 1, "(none: a pulse-head/1 head)");
}

/* Is a trusted head one to follow: of the worker's run, not older than
 * what it knows, and not older than the maximum age (docs/protocols/sync.md, "What a
 * subscriber refuses")? */
static pulse_status head_fresh(const pulse_sub *sub,
                               const pulse_store_head *h) {
  uint64_t step = pulse_store_head_step(h);
  uint8_t run[PULSE_STORE_RUN_BYTES];
  int has_run = pulse_store_head_run(h, run);
  int same_run = !sub->have_run ||
                 (has_run && memcmp(run, sub->run, sizeof run) == 0);
  if (!same_run && !sub->opts.switch_run) {
    char got[64], held[64];
    run_hex(run, has_run, got);
    run_hex(sub->run, 1, held);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "head refused: step %" PRIu64
                      " is of another run (%s) than the worker's (%s): a "
                      "different store under the same key (switch runs only "
                      "on purpose: switch_run, pulse-pull --switch-run)",
                      step, got, held);
  }
  /* Steps of two runs do not compare: a switch starts from the new run's
   * anchor. */
  const char *what;
  uint64_t seen = newest_seen(sub, &what);
  if (same_run && !sub->opts.allow_rollback && seen != PULSE_SUB_NO_STEP &&
      step < seen)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "head refused: step %" PRIu64
                      " is older than step %" PRIu64
                      " %s (a stale or replayed head; go back only on "
                      "purpose: allow_rollback, pulse-pull --allow-rollback)",
                      step, seen, what);
  uint32_t max_age = sub->opts.max_head_age_s;
  if (max_age > 0) {
    uint64_t published = pulse_store_head_published(h);
    if (published == 0)
      return pulse_fail(PULSE_ERR_STALE,
                        "head refused: step %" PRIu64
                        " does not say when it was published (a "
                        "pulse-head/1 head) and a maximum age of %" PRIu32
                        " s is set",
                        step, max_age);
    uint64_t now = (uint64_t)time(NULL);
    /* A head from the future would pass any age limit for as long as
     * its date lies ahead: past the clocks' allowed skew it is refused. */
    if (published > now && published - now > PULSE_SUB_CLOCK_SKEW_S)
      return pulse_fail(PULSE_ERR_STALE,
                        "head refused: step %" PRIu64
                        " says it was published %" PRIu64
                        " s in the future (at %" PRIu64
                        " Unix time), beyond the %u s of clock skew allowed "
                        "under a maximum age of %" PRIu32
                        " s: a forged or misdated head, or a clock to fix",
                        step, published - now, published,
                        (unsigned)PULSE_SUB_CLOCK_SKEW_S, max_age);
    uint64_t age = now > published ? now - published : 0;
    if (age > max_age)
      return pulse_fail(PULSE_ERR_STALE,
                        "head refused: step %" PRIu64
                        " was published %" PRIu64
                        " s ago, more than the maximum age of %" PRIu32 " s",
                        step, age, max_age);
  }
  return PULSE_OK;
}

pulse_status sub_head_verify(pulse_sub *sub, const uint8_t *bytes, size_t n,
                             pulse_store_head **out) {
  pulse_store_head *h = NULL;
  PULSE_TRY(head_trust(sub, bytes, n, &h));
  pulse_status st = head_fresh(sub, h);
  uint8_t pub[32];
  if (st == PULSE_OK && pulse_store_head_signer(h, pub) && !sub->have_key &&
      sub->opts.trust_first_use)
    st = trust_first_key(sub, pub);
  if (st != PULSE_OK) {
    pulse_store_head_free(h);
    return st;
  }
  *out = h;
  return PULSE_OK;
}

void sub_head_hold_run(pulse_sub *sub, const pulse_store_head *h) {
  uint8_t run[PULSE_STORE_RUN_BYTES];
  int has = pulse_store_head_run(h, run);
  if (has && sub->have_run && memcmp(run, sub->run, sizeof run) != 0) {
    char from[64], to[64], msg[256];
    run_hex(sub->run, 1, from);
    run_hex(run, 1, to);
    snprintf(msg, sizeof msg,
             "switching from run %s to run %s: from its anchor", from, to);
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
    sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
    /* A step number of another run says nothing about these targets. */
    if (sub->step != PULSE_SUB_NO_STEP)
      sub_forget_step(sub);
  }
  if (has)
    memcpy(sub->run, run, sizeof run);
  sub->have_run = has;
}

/* Makes a verified head (from source `url`) the current one. */
static void take(pulse_sub *sub, pulse_store_head *h, size_t url, int *moved) {
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
  sub_head_hold_run(sub, h);
  sub_head_follow_key(sub, h);
  pulse_store_head_free(sub->head);
  sub->head = h;
  sub->head_url = url;
  pthread_mutex_lock(&sub->fig_lock);
  sub->fig.head_step = pulse_store_head_step(h);
  pthread_mutex_unlock(&sub->fig_lock);
  if (!same) {
    /* A new head: refusals before it were a passing fault. The same head
     * again (a source alternating a good head with bad ones) is not. */
    sub->head_rejects = 0;
    pulse_sub_event ev = {0};
    ev.type = PULSE_SUB_EV_HEAD;
    ev.from_step = old;
    sub_emit(sub, &ev);
  }
}

/* A source that keeps serving a bad head (a foreign key, a replay) would
 * fill the log: the same refusal is logged once per SUB_WARN_REPEAT_S, the
 * repeats counted in the next line. */
#define SUB_WARN_REPEAT_S 30.0

static void log_refusal(pulse_sub *sub, const char *what, const char *detail) {
  char line[sizeof sub->warned];
  int n = snprintf(line, sizeof line, "%.200s: ", what);
  if (n > 0 && (size_t)n < sizeof line)
    snprintf(line + n, sizeof line - (size_t)n, "%s", detail);
  double now = sub_now();
  if (strcmp(line, sub->warned) == 0 &&
      now - sub->warned_at < SUB_WARN_REPEAT_S) {
    sub->warned_more++;
    return;
  }
  if (sub->warned_more > 0 && strcmp(line, sub->warned) == 0)
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s: %s (%u more times in %.0f s)",
                 what, detail, sub->warned_more, now - sub->warned_at);
  else
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s: %s", what, detail);
  snprintf(sub->warned, sizeof sub->warned, "%s", line);
  sub->warned_at = now;
  sub->warned_more = 0;
}

/* Where source `u` keeps its head: a pulse server's route, or a static
 * copy's file. */
static const char *head_rel(const pulse_sub *sub, size_t u) {
  return sub->url_static[u] ? "head.json" : "v1/head";
}

static void reject_head(pulse_sub *sub, size_t url, pulse_status st,
                        const char *detail) {
  sub_count(sub, &sub->fig.rejected, 1);
  sub->head_rejects++;
  char what[2100];
  sub_url(sub, url, head_rel(sub, url), what, sizeof what);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_REJECTED;
  ev.object = what;
  ev.status = st;
  ev.detail = detail;
  log_refusal(sub, what, detail);
  sub_emit(sub, &ev);
}

/* Source `url` serves step `step`, older than the newest head: said once
 * per step it lags at (a stale mirror is not reported on every check). */
static void report_lag(pulse_sub *sub, size_t url, uint64_t step,
                       uint64_t newest) {
  if (sub->lag_step[url] == step)
    return;
  sub->lag_step[url] = step;
  char msg[2300];
  snprintf(msg, sizeof msg,
           "source %s lags: it serves step %" PRIu64 ", %" PRIu64
           " behind the newest head (step %" PRIu64 ")",
           sub->urls[url], step, newest - step, newest);
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_LAGGING;
  ev.object = sub->urls[url];
  ev.from_step = step;
  ev.detail = msg;
  sub_emit(sub, &ev);
}

/* What one source answered when every source was asked. */
typedef struct {
  pulse_fetch_xfer x;
  pulse_store_head *h; /* trusted (signed by the key), or NULL */
  pulse_status st;     /* PULSE_OK: a head to follow */
  int stage;           /* where it failed: 1 fetch, 2 trust, 3 freshness */
  char detail[1024];
} source_answer;

static void on_head_retry(void *ctx, const pulse_fetch_xfer *x,
                          unsigned attempt, unsigned delay_ms,
                          pulse_status st) {
  pulse_sub *sub = ctx;
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_RETRY;
  ev.attempt = attempt + 1;
  ev.delay_ms = delay_ms;
  ev.status = st;
  ev.detail = pulse_error_detail();
  ev.object = x->url;
  sub_count(sub, &sub->fig.retries, 1);
  sub_emit(sub, &ev);
}

/* GETs every source's head at once, each retried on its own as the
 * options say (one source that is down delays the answer by its retries,
 * as a primary that is down did before the others were tried). */
static pulse_status fetch_all(pulse_sub *sub, source_answer *a, size_t n) {
  pulse_fetch_xfer **xs = calloc(n, sizeof *xs);
  if (xs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "head");
  for (size_t u = 0; u < n; u++) {
    pulse_fetch_xfer_init(&a[u].x, NULL);
    sub_url(sub, u, head_rel(sub, u), a[u].x.url, sizeof a[u].x.url);
    a[u].x.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
    a[u].x.timeout_ms = sub->opts.request_timeout_ms;
    xs[u] = &a[u].x;
  }
  pulse_fetch_retry policy = {0};
  policy.retries = sub->opts.retries;
  policy.on_retry = on_head_retry;
  policy.ctx = sub;
  pulse_fetch_metrics m0, m1;
  pulse_fetch_metrics_get(sub->http, &m0);
  double t0 = sub_now();
  pulse_status st = pulse_fetch_gather(sub->http, xs, n, &policy);
  pulse_fetch_metrics_get(sub->http, &m1);
  sub_count(sub, &sub->fig.bytes_downloaded, m1.wire_bytes - m0.wire_bytes);
  sub_count(sub, &sub->fig.requests, m1.requests - m0.requests);
  sub->t_transfer += sub_now() - t0;
  free(xs);
  if (st != PULSE_OK)
    return st;
  for (size_t u = 0; u < n; u++) {
    a[u].stage = 1;
    a[u].st = pulse_fetch_xfer_ok(&a[u].x)
                  ? PULSE_OK
                  : pulse_fetch_xfer_fail(&a[u].x, "head");
    if (a[u].st == PULSE_OK && a[u].x.status != 200)
      a[u].st = pulse_fail(PULSE_ERR_IO, "head: GET %s: HTTP %ld", a[u].x.url,
                           a[u].x.status);
    if (a[u].st != PULSE_OK)
      snprintf(a[u].detail, sizeof a[u].detail, "%s", pulse_error_detail());
  }
  return PULSE_OK;
}

/* A source without v1/head may be a static copy of a store (a bucket, a
 * CDN, a file server): its head is then head.json, and it stays one. */
static void try_static(pulse_sub *sub, size_t u, source_answer *a) {
  long s = a->x.status;
  if (sub->url_static[u] || !pulse_fetch_xfer_answered(&a->x) ||
      !(s == 400 || s == 403 || s == 404 || s == 405))
    return;
  pulse_fetch_xfer y;
  pulse_fetch_xfer_init(&y, NULL);
  y.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
  y.timeout_ms = sub->opts.request_timeout_ms;
  if (sub_fetch_mem(sub, u, "head.json", &y, "head") == PULSE_OK &&
      y.status == 200) {
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "subscriber: %s is a static copy of a store (head.json)",
                 sub->urls[u]);
    sub->url_static[u] = 1;
    pulse_fetch_xfer_release(&a->x);
    a->x = y;
    a->st = PULSE_OK;
    return;
  }
  pulse_fetch_xfer_release(&y);
}

/* Asks every source for its head, verifies each, and follows the newest
 * valid one: a stale mirror listed first must not hold a worker back from
 * a trainer listed after it. */
pulse_status sub_head_fetch(pulse_sub *sub, int *moved) {
  size_t n = sub->nurls;
  source_answer *a = calloc(n, sizeof *a);
  if (a == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "head");
  pulse_status st;
  if (n == 1) { /* one source: its retries report what they fetch */
    pulse_fetch_xfer_init(&a[0].x, NULL);
    a[0].x.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
    a[0].x.timeout_ms = sub->opts.request_timeout_ms;
    a[0].stage = 1;
    a[0].st = sub_fetch_mem(sub, 0, head_rel(sub, 0), &a[0].x, "head");
    try_static(sub, 0, &a[0]);
    if (a[0].st == PULSE_OK && a[0].x.status != 200)
      a[0].st = pulse_fail(PULSE_ERR_IO, "head: GET %s: HTTP %ld", a[0].x.url,
                           a[0].x.status);
    if (a[0].st != PULSE_OK)
      snprintf(a[0].detail, sizeof a[0].detail, "%s", pulse_error_detail());
    st = PULSE_OK;
  } else {
    st = fetch_all(sub, a, n);
    for (size_t u = 0; st == PULSE_OK && u < n; u++)
      try_static(sub, u, &a[u]);
  }
  size_t best = n;
  for (size_t u = 0; st == PULSE_OK && u < n; u++) {
    if (a[u].st != PULSE_OK)
      continue;
    a[u].stage = 2;
    a[u].st = head_trust(sub, a[u].x.mem.data, a[u].x.mem.size, &a[u].h);
    if (a[u].st == PULSE_OK) {
      a[u].stage = 3;
      a[u].st = head_fresh(sub, a[u].h);
    }
    if (a[u].st != PULSE_OK) {
      snprintf(a[u].detail, sizeof a[u].detail, "%s", pulse_error_detail());
      continue;
    }
    uint64_t s = pulse_store_head_step(a[u].h);
    if (best == n || s > pulse_store_head_step(a[best].h) ||
        (s == pulse_store_head_step(a[best].h) &&
         pulse_store_head_published(a[u].h) >
             pulse_store_head_published(a[best].h)))
      best = u;
  }
  /* Trust on first use: the key of the head taken. */
  uint8_t pub[32];
  if (best < n && pulse_store_head_signer(a[best].h, pub) && !sub->have_key &&
      sub->opts.trust_first_use && (st = trust_first_key(sub, pub)) != PULSE_OK)
    best = n;
  uint64_t newest = PULSE_SUB_NO_STEP;
  if (best < n) {
    newest = pulse_store_head_step(a[best].h);
    take(sub, a[best].h, best, moved);
    a[best].h = NULL;
  } else if (st == PULSE_OK) {
    const char *what;
    newest = newest_seen(sub, &what);
  }
  /* Refusals are reported, except an older head when a newer one was
   * found: that source only lags. */
  uint64_t lagging = 0;
  pulse_status err = PULSE_OK;
  const char *err_detail = "";
  int err_stage = 0;
  for (size_t u = 0; st == PULSE_OK && u < n; u++) {
    if (u == best)
      continue;
    uint64_t s = a[u].h ? pulse_store_head_step(a[u].h) : PULSE_SUB_NO_STEP;
    int lags = s != PULSE_SUB_NO_STEP && newest != PULSE_SUB_NO_STEP &&
               s < newest;
    if (lags && n > 1) {
      lagging++;
      report_lag(sub, u, s, newest);
    } else {
      sub->lag_step[u] = PULSE_SUB_NO_STEP;
    }
    if (a[u].st == PULSE_OK)
      continue;
    if (a[u].stage >= 2 &&
        !(best < n && lags && a[u].st == PULSE_ERR_BASE_STEP))
      reject_head(sub, u, a[u].st, a[u].detail);
    if (a[u].stage > err_stage) { /* the most telling failure */
      err = a[u].st;
      err_detail = a[u].detail;
      err_stage = a[u].stage;
    }
  }
  if (st == PULSE_OK) {
    pthread_mutex_lock(&sub->fig_lock);
    sub->fig.lagging_sources = lagging;
    pthread_mutex_unlock(&sub->fig_lock);
    sub->sources_asked = sub_now();
    if (best == n)
      st = pulse_fail(err, "%s", err_detail);
  }
  for (size_t u = 0; u < n; u++) {
    pulse_store_head_free(a[u].h);
    pulse_fetch_xfer_release(&a[u].x);
  }
  free(a);
  return st;
}

/* One long-poll of source `url`, at most wait_ms long. */
static pulse_status long_poll(pulse_sub *sub, size_t url, uint64_t after,
                              uint32_t wait_ms, int *got) {
  char rel[128];
  int is_static = sub->url_static[url];
  if (is_static) /* no long-polls there: the head, if it changed */
    snprintf(rel, sizeof rel, "head.json");
  else
    snprintf(rel, sizeof rel, "v1/head?after=%" PRIu64 "&timeout_ms=%" PRIu32,
             after, wait_ms);
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, NULL);
  sub_url(sub, url, rel, x.url, sizeof x.url);
  x.max_bytes = PULSE_STORE_MAX_HEAD_BYTES;
  x.timeout_ms = (is_static ? 0 : wait_ms) + sub->opts.request_timeout_ms;
  if (sub->head != NULL)
    snprintf(x.if_none_match, sizeof x.if_none_match, "%s", sub->head_etag);
  pulse_fetch_xfer *one = &x;
  double t0 = sub_now();
  pulse_status st = sub_http_run(sub, &one, 1, NULL);
  sub->t_transfer -= sub_now() - t0; /* waiting for a step is not transfer */
  sub->poll_retry_after_ms = pulse_fetch_xfer_retry_after_ms(&x);
  if (st == PULSE_OK && pulse_fetch_xfer_answered(&x) &&
      (x.status == 304 || x.status == 404)) {
    pulse_fetch_xfer_release(&x);
    /* Nothing newer (or no head yet). A source that answers at once, e.g.
     * a static copy that does not long-poll, is not asked again at once; a
     * static copy is polled every 2 s at most (or each poll timeout). */
    double pace = is_static ? (wait_ms < 2000 ? wait_ms : 2000) / 1000.0 : 0.1;
    double left = pace - (sub_now() - t0);
    if (left > 0)
      sub_sleep_ms(sub, (unsigned)(left * 1000.0) + 1);
    return PULSE_OK;
  }
  if (st == PULSE_OK && !pulse_fetch_xfer_ok(&x))
    st = pulse_fetch_xfer_fail(&x, "long-poll");
  pulse_store_head *h = NULL;
  if (st == PULSE_OK) {
    st = sub_head_verify(sub, x.mem.data, x.mem.size, &h);
    if (st != PULSE_OK && st != PULSE_ERR_BASE_STEP)
      reject_head(sub, url, st, pulse_error_detail());
  }
  pulse_fetch_xfer_release(&x);
  if (st == PULSE_OK)
    take(sub, h, url, got);
  if (st == PULSE_OK && !*got) {
    /* The same head again at once (a source that does not long-poll and
     * ignores If-None-Match): not asked again at once either. */
    double left = 0.1 - (sub_now() - t0);
    if (left > 0)
      sub_sleep_ms(sub, (unsigned)(left * 1000.0) + 1);
  }
  return st;
}

/* With several sources, the one whose head the worker follows is
 * long-polled (one waiting connection per worker, not one per source: a
 * server caps its long-polls), and once per poll interval every source is
 * asked again with a plain GET: a source that went stale is left, and one
 * that got ahead is followed, within an interval. */
pulse_status sub_head_poll(pulse_sub *sub, uint64_t after, int *got) {
  *got = 0;
  uint32_t wait_ms = sub->opts.poll_timeout_ms;
  if (sub->nurls > 1) {
    double due = sub->sources_asked + wait_ms / 1000.0, now = sub_now();
    if (sub->head == NULL || now >= due)
      return sub_head_fetch(sub, got);
    wait_ms = (uint32_t)((due - now) * 1000.0) + 1;
  }
  pulse_status st = long_poll(sub, sub->head_url, after, wait_ms, got);
  if (st != PULSE_OK && sub->nurls > 1 && !atomic_load(&sub->stop))
    return sub_head_fetch(sub, got); /* the others may serve */
  return st;
}
