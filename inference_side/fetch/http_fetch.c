/* http_fetch.c - the fetching layer's engine: transfers run on one libcurl
 * multi handle, whose connection cache keeps connections open between
 * requests; idle easy handles are pooled. A run tries each transfer once;
 * a retried run (pulse_fetch_get, pulse_fetch_gather) starts each failed
 * transfer again on its own after its backoff, until it succeeds or the
 * policy gives up, while the others go on. A stop flag aborts it all. */
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "http_fetch_xfer_impl.h"
#include "rng_impl.h"
#include "status_impl.h"

#define FETCH_POOL 16 /* idle easy handles kept for reuse */
#define TICK_MS 100u  /* tick callbacks, and the longest wait between polls */

/* An origin a redirect may go to (pulse_fetch_opts.redirect_origins). */
typedef struct {
  char scheme[8]; /* "" when the entry named none */
  char host[256];
  long port; /* 0 when the entry named none */
} redirect_origin;

struct pulse_fetch {
  pulse_fetch_opts opts; /* user_agent, cacert point at the copies below */
  char *user_agent, *cacert;
  redirect_origin *origins; /* opts.redirect_origins, parsed */
  size_t norigins;
  CURLM *multi;
  CURL *idle[FETCH_POOL];
  size_t nidle;
  atomic_int own_stop;
  atomic_int *stop; /* opts.stop or &own_stop */
  uint64_t rng;     /* jitter only, not secrets */
  pulse_fetch_counters counters;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_result = CURLE_OK;

static void curl_init(void) {
  curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT);
}

uint64_t pulse_fetch_now_ms(void) {
  return pulse_fetch_now_us() / 1000u;
}

uint64_t pulse_fetch_now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000u + (uint64_t)t.tv_nsec / 1000u;
}

/* ------------------------------------------------------------- metrics */

void pulse_fetch_counters_get(const pulse_fetch_counters *c,
                              pulse_fetch_metrics *out) {
  out->requests = atomic_load(&c->requests);
  out->wire_bytes = atomic_load(&c->wire_bytes);
  out->retries = atomic_load(&c->retries);
  out->failures = atomic_load(&c->failures);
}

void pulse_fetch_metrics_get(const pulse_fetch *f, pulse_fetch_metrics *out) {
  pulse_fetch_counters_get(&f->counters, out);
}

/* Adds to the engine's counters and to the shared ones. */
static void count(pulse_fetch *f, uint64_t requests, uint64_t wire,
                  uint64_t retries, uint64_t failures) {
  pulse_fetch_counters *sets[2] = {&f->counters, f->opts.shared};
  for (int i = 0; i < 2; i++) {
    if (sets[i] == NULL)
      continue;
    atomic_fetch_add(&sets[i]->requests, requests);
    atomic_fetch_add(&sets[i]->wire_bytes, wire);
    atomic_fetch_add(&sets[i]->retries, retries);
    atomic_fetch_add(&sets[i]->failures, failures);
  }
}

void pulse_fetch_count_retry(pulse_fetch *f) {
  count(f, 0, 0, 1, 0);
}

/* ----------------------------------------------------------- redirects */

static long default_port(const char *scheme) {
  return strcmp(scheme, "https") == 0 ? 443 : 80;
}

/* Scheme, host and port of an absolute http(s) URL. 0 when it is not one. */
static int url_origin(const char *url, redirect_origin *o, int *named_port) {
  memset(o, 0, sizeof *o);
  CURLU *u = curl_url();
  char *scheme = NULL, *host = NULL, *port = NULL;
  int ok = u != NULL && curl_url_set(u, CURLUPART_URL, url, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
           (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0) &&
           strlen(host) < sizeof o->host;
  if (ok) {
    snprintf(o->scheme, sizeof o->scheme, "%s", scheme);
    snprintf(o->host, sizeof o->host, "%s", host);
    int has = curl_url_get(u, CURLUPART_PORT, &port, 0) == CURLUE_OK;
    o->port = has ? strtol(port, NULL, 10) : default_port(scheme);
    if (named_port != NULL)
      *named_port = has;
  }
  curl_free(scheme), curl_free(host), curl_free(port);
  curl_url_cleanup(u);
  return ok;
}

/* Parses "HOST[:PORT]" or "SCHEME://HOST[:PORT]". */
static int origin_parse(const char *entry, redirect_origin *o) {
  char url[600];
  int has_scheme = strstr(entry, "://") != NULL;
  if (strlen(entry) > 500 || (strchr(entry, '/') != NULL && !has_scheme))
    return 0;
  snprintf(url, sizeof url, "%s%s", has_scheme ? "" : "http://", entry);
  int named_port = 0;
  if (!url_origin(url, o, &named_port))
    return 0;
  if (!has_scheme)
    o->scheme[0] = '\0';
  if (!named_port)
    o->port = 0;
  return 1;
}

int pulse_fetch_redirect_allowed(const pulse_fetch *f, const char *from,
                                 const char *to) {
  redirect_origin a, b;
  if (!url_origin(from, &a, NULL) || !url_origin(to, &b, NULL))
    return 0;
  if (strcmp(a.scheme, b.scheme) == 0 && strcasecmp(a.host, b.host) == 0 &&
      a.port == b.port)
    return 1;
  for (size_t i = 0; f != NULL && i < f->norigins; i++) {
    const redirect_origin *o = &f->origins[i];
    long port = o->port != 0 ? o->port : default_port(b.scheme);
    /* No scheme named: the one asked, or an upgrade to https. */
    int scheme = o->scheme[0] ? strcmp(o->scheme, b.scheme) == 0
                              : strcmp(b.scheme, "https") == 0 ||
                                    strcmp(a.scheme, "http") == 0;
    if (scheme && strcasecmp(o->host, b.host) == 0 && port == b.port)
      return 1;
  }
  return 0;
}

/* -------------------------------------------------------------- engine */

pulse_status pulse_fetch_create(const pulse_fetch_opts *opts,
                                pulse_fetch **out) {
  if (out == NULL || opts == NULL || opts->backoff_max_ms < opts->backoff_ms)
    return pulse_fail(PULSE_ERR_ARG,
                      "fetch: NULL options, or backoff_max_ms < backoff_ms");
  *out = NULL;
  pthread_once(&curl_once, curl_init);
  if (curl_init_result != CURLE_OK)
    return pulse_fail(PULSE_ERR_INTERNAL, "curl_global_init: %s",
                      curl_easy_strerror(curl_init_result));
  pulse_fetch *f = calloc(1, sizeof *f);
  if (f == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "fetch engine");
  f->opts = *opts;
  atomic_init(&f->own_stop, 0);
  f->stop = opts->stop != NULL ? opts->stop : &f->own_stop;
  f->rng = opts->seed != 0 ? opts->seed
                           : (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ull ^
                                 (uint64_t)getpid() ^ (uintptr_t)f;
  if (opts->user_agent != NULL)
    f->user_agent = strdup(opts->user_agent);
  f->opts.user_agent = f->user_agent;
  if (opts->cacert != NULL)
    f->cacert = strdup(opts->cacert);
  f->opts.cacert = f->cacert;
  f->opts.redirect_origins = NULL; /* parsed into f->origins */
  f->opts.redirect_origin_count = 0;
  if (opts->redirect_origin_count > 0) {
    if (opts->redirect_origins == NULL) {
      pulse_fetch_free(f);
      return pulse_fail(PULSE_ERR_ARG, "fetch: NULL redirect origins");
    }
    f->origins = calloc(opts->redirect_origin_count, sizeof *f->origins);
    if (f->origins == NULL) {
      pulse_fetch_free(f);
      return pulse_fail(PULSE_ERR_NOMEM, "fetch engine");
    }
    for (size_t i = 0; i < opts->redirect_origin_count; i++) {
      const char *e = opts->redirect_origins[i];
      if (e == NULL || !origin_parse(e, &f->origins[f->norigins++])) {
        pulse_fetch_free(f);
        return pulse_fail(PULSE_ERR_ARG,
                          "fetch: redirect origin '%s' is not HOST[:PORT] or "
                          "http(s)://HOST[:PORT]",
                          e ? e : "(null)");
      }
    }
  }
  f->multi = curl_multi_init();
  if (f->multi == NULL || (opts->user_agent != NULL && f->user_agent == NULL) ||
      (opts->cacert != NULL && f->cacert == NULL)) {
    pulse_fetch_free(f);
    return pulse_fail(PULSE_ERR_NOMEM, "fetch engine: curl_multi_init");
  }
  *out = f;
  return PULSE_OK;
}

void pulse_fetch_free(pulse_fetch *f) {
  if (f == NULL)
    return;
  for (size_t i = 0; i < f->nidle; i++)
    curl_easy_cleanup(f->idle[i]);
  if (f->multi != NULL)
    curl_multi_cleanup(f->multi);
  free(f->user_agent);
  free(f->cacert);
  free(f->origins);
  free(f);
}

void pulse_fetch_stop(pulse_fetch *f) {
  if (f == NULL)
    return;
  atomic_store(f->stop, 1);
  curl_multi_wakeup(f->multi); /* a poll in progress returns at once */
}

void pulse_fetch_restart(pulse_fetch *f) {
  atomic_store(f->stop, 0);
}

int pulse_fetch_stopped(const pulse_fetch *f) {
  return atomic_load(f->stop) != 0;
}

unsigned pulse_fetch_backoff_ms(pulse_fetch *f, unsigned attempt) {
  double d = (double)f->opts.backoff_ms;
  double cap = (double)f->opts.backoff_max_ms;
  for (unsigned i = 0; i < attempt && d < cap; i++)
    d *= 2;
  if (d > cap)
    d = cap;
  return (unsigned)(d * (0.5 + 0.5 * pulse_rng_uniform(&f->rng)));
}

int pulse_fetch_sleep_ms(pulse_fetch *f, unsigned ms) {
  uint64_t end = pulse_fetch_now_ms() + ms;
  while (!pulse_fetch_stopped(f)) {
    uint64_t now = pulse_fetch_now_ms();
    if (now >= end)
      return 0;
    /* The multi handle's poll wakes up early on pulse_fetch_stop. */
    uint64_t wait = end - now < TICK_MS ? end - now : TICK_MS;
    curl_multi_poll(f->multi, NULL, 0, (int)wait, NULL);
  }
  return -1;
}

/* ------------------------------------------------------------ one try */

static CURL *easy_take(pulse_fetch *f) {
  if (f->nidle == 0)
    return curl_easy_init();
  CURL *e = f->idle[--f->nidle];
  curl_easy_reset(e);
  return e;
}

static void easy_give(pulse_fetch *f, CURL *e) {
  if (f->nidle < FETCH_POOL)
    f->idle[f->nidle++] = e;
  else
    curl_easy_cleanup(e);
}

/* Clears the answer of the previous try; a resumable memory body keeps
 * what it holds when the validator to ask for the rest is known. */
static void reset_answer(pulse_fetch_xfer *x) {
  x->cc = CURLE_OK;
  x->status = 0;
  x->received = x->wire = 0;
  x->body_us = x->end_us = 0;
  x->enough = x->too_long = x->io_failed = x->bad_range = x->changed = 0;
  x->redirect_refused = x->cut_at_end = 0;
  x->hdr_status = 0;
  x->redirect_to[0] = x->write_error[0] = '\0';
  x->headers_len = x->error_len = 0;
  x->headers[0] = x->error_body[0] = x->curl_error[0] = '\0';
  x->sink_decided = x->discard = 0;
  int resumable = x->resume && x->fd < 0 && !x->ranged &&
                  x->method == PULSE_FETCH_GET && x->etag[0] != '\0';
  x->resume_from = resumable ? x->mem.size : 0;
  if (!resumable)
    x->mem.size = 0;
}

/* The Range and conditional headers of a try. */
static pulse_status set_conditions(CURL *e, pulse_fetch_xfer *x) {
  char r[64];
  if (x->ranged && x->range_to == UINT64_MAX)
    snprintf(r, sizeof r, "%" PRIu64 "-", x->range_from);
  else if (x->ranged)
    snprintf(r, sizeof r, "%" PRIu64 "-%" PRIu64, x->range_from, x->range_to);
  else if (x->resume_from > 0)
    snprintf(r, sizeof r, "%" PRIu64 "-", x->resume_from);
  if (x->ranged || x->resume_from > 0)
    curl_easy_setopt(e, CURLOPT_RANGE, r);
  struct curl_slist *list = NULL;
  char h[160];
  if (x->if_none_match[0]) {
    snprintf(h, sizeof h, "If-None-Match: %s", x->if_none_match);
    if ((list = curl_slist_append(list, h)) == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "curl headers");
  }
  const char *validator = x->resume_from > 0           ? x->etag
                          : x->ranged && x->if_range[0] ? x->if_range
                                                        : NULL;
  if (validator != NULL) {
    snprintf(h, sizeof h, "If-Range: %s", validator);
    struct curl_slist *more = curl_slist_append(list, h);
    if (more == NULL) {
      curl_slist_free_all(list);
      return pulse_fail(PULSE_ERR_NOMEM, "curl headers");
    }
    list = more;
  }
  if (x->method == PULSE_FETCH_POST && x->post_size > 0) {
    /* Raw bytes, not a form: the server reads them as they are. The body
     * waits for the server's 100 Continue (whatever its size), so that a
     * server refusing it at its headers (413) is heard, not cut off. */
    static const char *const post_headers[] = {
        "Content-Type: application/octet-stream", "Expect: 100-continue"};
    for (int i = 0; i < 2; i++) {
      struct curl_slist *more = curl_slist_append(list, post_headers[i]);
      if (more == NULL) {
        curl_slist_free_all(list);
        return pulse_fail(PULSE_ERR_NOMEM, "curl headers");
      }
      list = more;
    }
  }
  x->slist = list;
  if (list != NULL)
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, list);
  return PULSE_OK;
}

/* The options of a try that come from the engine. */
static void set_engine_opts(pulse_fetch *f, CURL *e, pulse_fetch_xfer *x) {
  const pulse_fetch_opts *o = &f->opts;
  const char *protocols = o->https ? "http,https" : "http";
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, protocols);
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, protocols);
  if (o->max_redirects > 0) {
    curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(e, CURLOPT_MAXREDIRS, (long)o->max_redirects);
  }
  if (o->no_proxy)
    curl_easy_setopt(e, CURLOPT_NOPROXY, "*");
  if (o->user_agent != NULL)
    curl_easy_setopt(e, CURLOPT_USERAGENT, o->user_agent);
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 1L); /* never off */
  curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 2L);
  if (o->cacert != NULL)
    curl_easy_setopt(e, CURLOPT_CAINFO, o->cacert);
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  if (o->connect_timeout_ms)
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)o->connect_timeout_ms);
  uint64_t rate = o->max_recv_bytes_per_s, low = o->low_speed_bytes;
  if (rate != 0) {
    /* Our own limiter (see http_fetch_impl.h): reads of an eighth of a
     * second at the rate keep its pauses short, and the low-speed limit
     * stays below half the rate so that a limited transfer never looks
     * stalled. */
    uint64_t buf = rate / 8;
    buf = buf < 1024 ? 1024 : buf > CURL_MAX_WRITE_SIZE ? CURL_MAX_WRITE_SIZE
                                                         : buf;
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, (long)buf);
    if (low > rate / 2)
      low = rate / 2;
  }
  if (x->low_speed && o->low_speed_seconds > 0 && low > 0) {
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT, (long)low);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME, (long)o->low_speed_seconds);
  }
}

/* Starts a try of x on the multi handle; deadline_ms (0: none) cuts its
 * timeout. */
static pulse_status setup(pulse_fetch *f, pulse_fetch_xfer *x,
                          uint64_t deadline_ms) {
  CURL *e = easy_take(f);
  if (e == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "curl: no handle for %s", x->url);
  x->easy = e;
  x->engine = f;
  reset_answer(x);
  x->attempt++;
  x->rate = f->opts.max_recv_bytes_per_s;
  x->rate_tokens = 0;
  x->rate_last_us = pulse_fetch_now_us();
  x->paused = 0;
  curl_easy_setopt(e, CURLOPT_URL, x->url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, x);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->curl_error);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, pulse_fetch_on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, pulse_fetch_on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  set_engine_opts(f, e, x);
  uint64_t timeout = x->timeout_ms;
  if (deadline_ms != 0) {
    uint64_t now = pulse_fetch_now_ms();
    uint64_t left = deadline_ms > now ? deadline_ms - now : 1;
    timeout = timeout == 0 || left < timeout ? left : timeout;
  }
  if (timeout)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout);
  if (x->method == PULSE_FETCH_HEAD)
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  if (x->method == PULSE_FETCH_POST) {
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    /* The body is the caller's (not copied): it outlives the transfer. */
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE,
                     (curl_off_t)(x->post_data ? x->post_size : 0));
    curl_easy_setopt(e, CURLOPT_POSTFIELDS,
                     x->post_data ? (const char *)x->post_data : "");
  }
  pulse_status st = set_conditions(e, x);
  if (st == PULSE_OK && curl_multi_add_handle(f->multi, e) != CURLM_OK)
    st = pulse_fail(PULSE_ERR_INTERNAL, "curl: cannot start %s", x->url);
  if (st != PULSE_OK) {
    curl_slist_free_all(x->slist);
    x->slist = NULL;
    x->easy = NULL;
    easy_give(f, e);
  }
  return st;
}

/* Ends a try: its result, its handle back to the pool, the metrics. */
static void finish(pulse_fetch *f, pulse_fetch_xfer *x, CURLcode cc) {
  x->cc = cc;
  if (x->status == 0 || !x->sink_decided)
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
  curl_off_t total = 0, first = 0;
  if (curl_easy_getinfo(x->easy, CURLINFO_TOTAL_TIME_T, &total) != CURLE_OK ||
      curl_easy_getinfo(x->easy, CURLINFO_STARTTRANSFER_TIME_T, &first) !=
          CURLE_OK)
    total = first = 0;
  x->body_us = total > first && first >= 0 ? (uint64_t)(total - first) : 0;
  x->end_us = pulse_fetch_now_us();
  curl_multi_remove_handle(f->multi, x->easy);
  curl_slist_free_all(x->slist);
  x->slist = NULL;
  easy_give(f, x->easy);
  x->easy = NULL;
  count(f, 1, x->wire, 0, !pulse_fetch_xfer_ok(x));
}

static void abort_all(pulse_fetch *f, pulse_fetch_xfer *const *x, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (x[i]->easy != NULL)
      finish(f, x[i], CURLE_ABORTED_BY_CALLBACK);
    x[i]->settled = 1;
  }
}

/* ---------------------------------------------------------------- runs */

long pulse_fetch_retry_delay(pulse_fetch *f, const pulse_fetch_xfer *x,
                             const pulse_fetch_retry *r, unsigned attempt) {
  int missing = x->cc == CURLE_OK && (x->status == 404 || x->status == 410);
  if (r == NULL ||
      !(pulse_fetch_xfer_retryable(x) || (r->retry_missing && missing)))
    return -1;
  unsigned asked = pulse_fetch_xfer_retry_after_ms(x);
  if (r->deadline_ms == 0) {
    if (attempt >= r->retries)
      return -1;
    unsigned d = pulse_fetch_backoff_ms(f, attempt);
    return (long)(d > asked ? d : asked);
  }
  /* Until the deadline: the wait is cut so that a last try starts before
   * it. */
  uint64_t now = pulse_fetch_now_ms();
  if (now + 1 >= r->deadline_ms)
    return -1;
  uint64_t d = pulse_fetch_backoff_ms(f, attempt);
  if (d < asked)
    d = asked;
  uint64_t left = r->deadline_ms - now - 1;
  return (long)(d < left ? d : left);
}

/* After a try of x ended: 1 when x is settled (it succeeded, or r gives
 * up), else 0 with its next try scheduled. */
static int settle(pulse_fetch *f, pulse_fetch_xfer *x,
                  const pulse_fetch_retry *r, const char *what) {
  long d = pulse_fetch_xfer_ok(x)
               ? -1
               : pulse_fetch_retry_delay(f, x, r, x->retried);
  if (d < 0) {
    x->settled = 1;
    return 1;
  }
  pulse_status st = pulse_fetch_xfer_fail(x, what ? what : "fetch");
  pulse_fetch_count_retry(f);
  x->retried++;
  if (r->on_retry != NULL)
    r->on_retry(r->ctx, x, x->retried, (unsigned)d, st);
  x->retry_at = pulse_fetch_now_ms() + (uint64_t)d;
  return 0;
}

/* Takes every finished try off the multi handle; returns how many
 * transfers settled. */
static size_t reap(pulse_fetch *f, const pulse_fetch_retry *r,
                   const char *what) {
  size_t settled = 0;
  CURLMsg *m;
  int queued;
  while ((m = curl_multi_info_read(f->multi, &queued)) != NULL) {
    if (m->msg != CURLMSG_DONE)
      continue;
    pulse_fetch_xfer *done = NULL;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&done);
    CURLcode cc = m->data.result;
    if (done != NULL && done->easy != NULL) {
      finish(f, done, cc);
      settled += settle(f, done, r, what);
    }
  }
  return settled;
}

/* Starts the tries that are due; returns the milliseconds until the next
 * one is (TICK_MS at most). */
static pulse_status start_due(pulse_fetch *f, pulse_fetch_xfer *const *x,
                              size_t n, uint64_t deadline_ms, uint64_t *wait) {
  uint64_t now = pulse_fetch_now_ms();
  *wait = TICK_MS;
  for (size_t i = 0; i < n; i++) {
    if (x[i]->settled || x[i]->easy != NULL)
      continue;
    if (now >= x[i]->retry_at)
      PULSE_TRY(setup(f, x[i], deadline_ms));
    else if (x[i]->retry_at - now < *wait)
      *wait = x[i]->retry_at - now;
  }
  return PULSE_OK;
}

/* Resumes the transfers the rate limit paused whose time came (taking the
 * piece libcurl held may pause them again); lowers *wait to the time of
 * the next one that stays paused. */
static void unpause_due(pulse_fetch_xfer *const *x, size_t n, uint64_t *wait) {
  uint64_t now = pulse_fetch_now_ms();
  for (size_t i = 0; i < n; i++) {
    if (x[i]->easy == NULL || !x[i]->paused)
      continue;
    if (now >= x[i]->resume_at_ms) {
      x[i]->paused = 0;
      /* A piece the sink refuses sets its flag, which fails the try. */
      (void)curl_easy_pause(x[i]->easy, CURLPAUSE_CONT);
    }
    if (x[i]->paused) {
      uint64_t d = x[i]->resume_at_ms > now ? x[i]->resume_at_ms - now : 1;
      if (d < *wait)
        *wait = d;
    }
  }
}

/* Runs n transfers to their end: once each (r NULL) or retried under r. */
static pulse_status drive(pulse_fetch *f, pulse_fetch_xfer *const *x, size_t n,
                          pulse_fetch_tick_fn tick, void *tick_ctx,
                          const pulse_fetch_retry *r, const char *what) {
  uint64_t deadline = r != NULL ? r->deadline_ms : 0;
  for (size_t i = 0; i < n; i++) {
    x[i]->settled = 0;
    x[i]->retried = 0;
    x[i]->retry_at = 0;
  }
  uint64_t wait = 0, last_tick = pulse_fetch_now_ms();
  pulse_status st = start_due(f, x, n, deadline, &wait);
  size_t open = n;
  while (st == PULSE_OK && open > 0) {
    if (pulse_fetch_stopped(f)) {
      abort_all(f, x, n);
      return what ? pulse_fail(PULSE_ERR_IO, "%s: stopped", what)
                  : pulse_fail(PULSE_ERR_IO, "stopped");
    }
    unpause_due(x, n, &wait);
    int running = 0;
    curl_multi_perform(f->multi, &running);
    open -= reap(f, r, what);
    if (open == 0)
      break;
    st = start_due(f, x, n, deadline, &wait);
    unpause_due(x, n, &wait);
    uint64_t now = pulse_fetch_now_ms();
    if (tick != NULL && now - last_tick >= TICK_MS) {
      last_tick = now;
      for (size_t i = 0; i < n; i++)
        if (x[i]->easy != NULL)
          tick(tick_ctx, x[i]);
    }
    if (st == PULSE_OK)
      curl_multi_poll(f->multi, NULL, 0, (int)wait, NULL);
  }
  if (st != PULSE_OK)
    abort_all(f, x, n);
  return st;
}

pulse_status pulse_fetch_run(pulse_fetch *f, pulse_fetch_xfer *const *x,
                             size_t n, pulse_fetch_tick_fn tick,
                             void *tick_ctx) {
  return drive(f, x, n, tick, tick_ctx, NULL, NULL);
}

pulse_status pulse_fetch_get(pulse_fetch *f, pulse_fetch_xfer *x,
                             const pulse_fetch_retry *r, const char *what) {
  pulse_fetch_xfer *one = x;
  PULSE_TRY(drive(f, &one, 1, NULL, NULL, r, what));
  return pulse_fetch_xfer_ok(x) ? PULSE_OK : pulse_fetch_xfer_fail(x, what);
}

pulse_status pulse_fetch_gather(pulse_fetch *f, pulse_fetch_xfer *const *x,
                                size_t n, const pulse_fetch_retry *r) {
  return drive(f, x, n, NULL, NULL, r, NULL);
}
