/* http_fetch.c - the trainer exchange's fetches (peer_http_impl.h) on the
 * project's fetching layer (inference_side/fetch/http_fetch_impl.h): each thread
 * that fetches gets its own engine (kept for the thread's life, so its
 * connections to the peers are reused; never those of a parent process),
 * whose counters add up in one set for the process. Loopback and peer URLs
 * only: http:// alone, and proxies from the environment are ignored.
 *
 * Waits and gathers retry until their deadline: a blob that is not there
 * yet (404), a peer that is not up (no connection), 5xx, 408, 429 and
 * timeouts, after a short backoff (RETRY_MS doubled, up to RETRY_MAX_MS,
 * with jitter); a body cut short is resumed where it stopped when its
 * server gave a strong ETag and honours Range. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http_fetch_impl.h"
#include "peer_http_impl.h"
#include "status_impl.h"
#include "store_impl.h"

#define RETRY_MS 3u      /* the first retry's delay */
#define RETRY_MAX_MS 25u /* the longest: a blob is picked up this late */

static pulse_fetch_counters counters; /* every loco engine of the process */
static pthread_key_t engine_key;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;
static int engine_key_ok;
static _Thread_local pid_t engine_pid; /* the process that made it */

static void engine_free(void *f) {
  pulse_fetch_free(f);
}

static void engine_key_make(void) {
  engine_key_ok = pthread_key_create(&engine_key, engine_free) == 0;
}

/* The calling thread's engine (made on first use, freed when the thread
 * ends). */
static pulse_status engine(pulse_fetch **out) {
  pthread_once(&engine_once, engine_key_make);
  if (!engine_key_ok)
    return pulse_fail(PULSE_ERR_INTERNAL, "loco http: no thread key");
  pulse_fetch *f = pthread_getspecific(engine_key);
  if (f != NULL && engine_pid != getpid()) {
    /* A child forked by this thread holds a copy of its parent's engine,
     * whose kept connections are sockets the parent still uses: a request
     * on one of them can read the answer to the parent's (a collaboration
     * member took its parent's signed outcome for a grant). Those copies
     * are closed here (plain HTTP: nothing is sent, the parent's stay
     * open) and the child makes its own. */
    pthread_setspecific(engine_key, NULL);
    pulse_fetch_free(f);
    f = NULL;
  }
  if (f == NULL) {
    pulse_fetch_opts o;
    memset(&o, 0, sizeof o);
    o.backoff_ms = RETRY_MS;
    o.backoff_max_ms = RETRY_MAX_MS;
    o.no_proxy = 1;
    o.shared = &counters;
    PULSE_TRY(pulse_fetch_create(&o, &f));
    if (pthread_setspecific(engine_key, f) != 0) {
      pulse_fetch_free(f);
      return pulse_fail(PULSE_ERR_NOMEM, "loco http: thread engine");
    }
    engine_pid = getpid();
  }
  *out = f;
  return PULSE_OK;
}

uint64_t loco_now_ms(void) {
  return pulse_fetch_now_ms();
}

void loco_sleep_ms(unsigned ms) {
  struct timespec t = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
  nanosleep(&t, NULL);
}

/* The rate's sums (peer_http_impl.h): this thread's, as each collaboration
 * peer or trainer runs its exchange on its own thread. */
static _Thread_local uint64_t rate_bytes, rate_us;

void loco_http_rate_take(uint64_t *bytes, uint64_t *us) {
  *bytes = rate_bytes;
  *us = rate_us;
  rate_bytes = rate_us = 0;
}

/* Adds the large bodies among n ended transfers: their bytes, and the
 * length of the union of their body intervals [end - body, end]. */
static void rate_add(pulse_fetch_xfer *const *x, size_t n) {
  uint64_t lo = 0, hi = 0; /* the interval being merged */
  int open = 0;
  for (;;) {
    /* The next interval by start, among those not merged yet (n is a
     * round's peers: a selection each time is enough). */
    size_t best = n;
    for (size_t i = 0; i < n; i++)
      if (x[i]->wire >= LOCO_RATE_MIN_BYTES && x[i]->body_us > 0 &&
          x[i]->end_us >= x[i]->body_us && pulse_fetch_xfer_ok(x[i]) &&
          (best == n || x[i]->end_us - x[i]->body_us <
                            x[best]->end_us - x[best]->body_us))
        best = i;
    if (best == n)
      break;
    uint64_t a = x[best]->end_us - x[best]->body_us, b = x[best]->end_us;
    rate_bytes += x[best]->wire;
    x[best]->body_us = 0; /* merged */
    if (open && a <= hi) {
      hi = b > hi ? b : hi;
      continue;
    }
    if (open)
      rate_us += hi - lo;
    lo = a, hi = b, open = 1;
  }
  if (open)
    rate_us += hi - lo;
}

void loco_http_metrics(pulse_fetch_metrics *out) {
  pulse_fetch_counters_get(&counters, out);
}

/* A transfer into `body`'s memory (which it takes over until given back
 * by give_body). */
static void xfer_for(pulse_fetch_xfer *x, const char *url, size_t max_bytes,
                     pulse_bytebuf *body) {
  pulse_fetch_xfer_init(x, url);
  x->max_bytes = max_bytes;
  if (body != NULL) { /* its storage is reused, its content dropped */
    pulse_bytebuf_adopt(&x->mem, body->data, body->capacity);
    *body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
}

static void give_body(pulse_fetch_xfer *x, pulse_bytebuf *body) {
  if (body == NULL) {
    pulse_fetch_xfer_release(x);
    return;
  }
  *body = x->mem;
  x->mem = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
}

/* One try (a POST with `post` bytes of body when post_size > 0); *status
 * as loco_http_get says. */
static pulse_status request_signed(const char *url, unsigned timeout_ms,
                                   size_t max, pulse_fetch_method method,
                                   const void *post, size_t post_size,
                                   pulse_bytebuf *body, long *status,
                                   loco_sig *sig) {
  *status = 0;
  pulse_fetch *f;
  PULSE_TRY(engine(&f));
  pulse_fetch_xfer x;
  xfer_for(&x, url, max, body);
  x.method = method;
  x.post_data = post;
  x.post_size = post_size;
  x.timeout_ms = timeout_ms ? timeout_ms : 1u;
  pulse_fetch_xfer *one = &x;
  pulse_status st = pulse_fetch_run(f, &one, 1, NULL, NULL);
  rate_add(&one, 1);
  int oom = x.io_failed;
  if (pulse_fetch_xfer_answered(&x))
    *status = x.status;
  if (sig != NULL)
    loco_sig_from_answer(&x, sig);
  give_body(&x, body);
  if (st == PULSE_OK && oom)
    st = pulse_fail(PULSE_ERR_NOMEM, "loco http: response of %s", url);
  return st;
}

static pulse_status request(const char *url, unsigned timeout_ms, size_t max,
                            pulse_fetch_method method, const void *post,
                            size_t post_size, pulse_bytebuf *body,
                            long *status) {
  return request_signed(url, timeout_ms, max, method, post, post_size, body,
                        status, NULL);
}

pulse_status loco_http_post_signed(const char *url, unsigned timeout_ms,
                                   long *status, loco_sig *sig) {
  return request_signed(url, timeout_ms, 4096, PULSE_FETCH_POST, NULL, 0,
                        NULL, status, sig);
}

pulse_status loco_http_get_signed(const char *url, unsigned timeout_ms,
                                  size_t max_bytes, pulse_bytebuf *body,
                                  long *status, loco_sig *sig) {
  return request_signed(url, timeout_ms, max_bytes, PULSE_FETCH_GET, NULL, 0,
                        body, status, sig);
}

pulse_status loco_http_get(const char *url, unsigned timeout_ms,
                           size_t max_bytes, pulse_bytebuf *body,
                           long *status) {
  return request(url, timeout_ms, max_bytes, PULSE_FETCH_GET, NULL, 0, body,
                 status);
}

pulse_status loco_http_post(const char *url, unsigned timeout_ms,
                            long *status) {
  return request(url, timeout_ms, 4096, PULSE_FETCH_POST, NULL, 0, NULL,
                 status);
}

pulse_status loco_http_post_body(const char *url, unsigned timeout_ms,
                                 const void *data, size_t size,
                                 pulse_bytebuf *reply, long *status) {
  if (data == NULL && size > 0)
    return pulse_fail(PULSE_ERR_ARG, "loco http: POST %s: no body", url);
  return request(url, timeout_ms, 4096, PULSE_FETCH_POST, data, size, reply,
                 status);
}

void loco_sig_from_answer(const pulse_fetch_xfer *x, loco_sig *out) {
  char round[32], key[80], sig[160];
  memset(out, 0, sizeof *out);
  if (!pulse_fetch_xfer_header(x, "X-Pulse-Loco-Round", round, sizeof round) ||
      !pulse_fetch_xfer_header(x, "X-Pulse-Loco-Key", key, sizeof key) ||
      !pulse_fetch_xfer_header(x, "X-Pulse-Loco-Signature", sig, sizeof sig))
    return;
  /* A plain decimal round (no sign, no leading zeros), lower-case hex. */
  char *end;
  errno = 0;
  unsigned long long r = strtoull(round, &end, 10);
  if (round[0] < '0' || round[0] > '9' || (round[0] == '0' && round[1]) ||
      *end != '\0' || errno != 0 || strlen(key) != 64 || strlen(sig) != 128 ||
      store_unhex(key, 64, out->key, 32) != 0 ||
      store_unhex(sig, 128, out->sig, 64) != 0) {
    memset(out, 0, sizeof *out);
    return;
  }
  out->round = r;
  out->present = 1;
}

pulse_status loco_http_wait(const char *url, unsigned timeout_ms,
                            size_t max_bytes, pulse_bytebuf *body) {
  return loco_http_wait_signed(url, timeout_ms, max_bytes, body, NULL);
}

pulse_status loco_http_wait_signed(const char *url, unsigned timeout_ms,
                                   size_t max_bytes, pulse_bytebuf *body,
                                   loco_sig *sig) {
  pulse_fetch *f;
  PULSE_TRY(engine(&f));
  pulse_fetch_retry r;
  memset(&r, 0, sizeof r);
  r.deadline_ms = pulse_fetch_now_ms() + timeout_ms;
  r.retry_missing = 1;
  pulse_fetch_xfer x;
  xfer_for(&x, url, max_bytes, body);
  x.resume = 1;
  pulse_status st = pulse_fetch_get(f, &x, &r, "loco http");
  pulse_fetch_xfer *one = &x;
  rate_add(&one, 1);
  int oom = x.io_failed;
  if (st == PULSE_OK && x.status != 200)
    st = pulse_fail(PULSE_ERR_IO, "loco http: GET %s: HTTP %ld", url, x.status);
  if (sig != NULL)
    loco_sig_from_answer(&x, sig);
  give_body(&x, body);
  if (oom)
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: response of %s", url);
  if (st != PULSE_OK) /* the cause is in the detail */
    return pulse_fail(PULSE_ERR_IO, "%s (waited up to %u ms)",
                      pulse_error_detail(), timeout_ms);
  return PULSE_OK;
}

pulse_status loco_http_get_range(const char *url, uint64_t from, uint64_t len,
                                 unsigned timeout_ms, pulse_bytebuf *body) {
  if (len == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco http: empty range");
  pulse_fetch *f;
  PULSE_TRY(engine(&f));
  pulse_fetch_retry r;
  memset(&r, 0, sizeof r);
  r.deadline_ms = pulse_fetch_now_ms() + timeout_ms;
  r.retry_missing = 1;
  pulse_fetch_xfer x;
  xfer_for(&x, url, (size_t)len, body);
  x.ranged = 1;
  x.range_from = from;
  x.range_to = from + len - 1;
  pulse_status st = pulse_fetch_get(f, &x, &r, "loco http");
  int oom = x.io_failed;
  if (st == PULSE_OK && (x.status != 206 || x.mem.size != len))
    st = pulse_fail(PULSE_ERR_IO, "loco http: GET %s bytes %llu+%llu: HTTP %ld, "
                    "%zu bytes", url, (unsigned long long)from,
                    (unsigned long long)len, x.status, x.mem.size);
  give_body(&x, body);
  if (oom)
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: response of %s", url);
  if (st != PULSE_OK)
    return pulse_fail(PULSE_ERR_IO, "%s (waited up to %u ms)",
                      pulse_error_detail(), timeout_ms);
  return PULSE_OK;
}

/* A head fetch's answer: a 206 of exactly `head` bytes from 0 of an object
 * of known size ("Content-Range: bytes 0-(head-1)/TOTAL"); the strong ETag
 * as a SHA-256 when it is one. */
static int head_answer(const pulse_fetch_xfer *x, size_t head, loco_fetch *t) {
  char cr[96], tag[100];
  t->total = 0;
  t->has_sha256 = 0;
  if (!pulse_fetch_xfer_ok(x) || x->status != 206 || x->mem.size != head ||
      !pulse_fetch_xfer_header(x, "Content-Range", cr, sizeof cr))
    return 0;
  unsigned long long a, b, total;
  char tail;
  if (sscanf(cr, "bytes %llu-%llu/%llu%c", &a, &b, &total, &tail) != 3 ||
      a != 0 || b + 1 != head || total < head)
    return 0;
  t->total = total;
  if (pulse_fetch_xfer_header(x, "ETag", tag, sizeof tag) &&
      strlen(tag) == 66 && tag[0] == '"' && tag[65] == '"' &&
      store_unhex(tag + 1, 64, t->sha256, 32) == 0)
    t->has_sha256 = 1;
  return 1;
}

pulse_status loco_http_gather(loco_fetch *t, size_t count,
                              uint64_t deadline_ms) {
  for (size_t i = 0; i < count; i++)
    t[i].done = 0;
  if (count == 0 || pulse_fetch_now_ms() >= deadline_ms)
    return PULSE_OK;
  pulse_fetch *f;
  PULSE_TRY(engine(&f));
  pulse_fetch_xfer *x = calloc(count, sizeof *x);
  pulse_fetch_xfer **run = calloc(count, sizeof *run);
  if (x == NULL || run == NULL) {
    free(x), free(run);
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: gather of %zu", count);
  }
  for (size_t i = 0; i < count; i++) {
    xfer_for(&x[i], t[i].url, t[i].head ? t[i].head : t[i].max_bytes,
             &t[i].body);
    x[i].resume = t[i].head == 0;
    if (t[i].head) {
      x[i].ranged = 1;
      x[i].range_from = 0;
      x[i].range_to = t[i].head - 1;
    }
    run[i] = &x[i];
  }
  pulse_fetch_retry r;
  memset(&r, 0, sizeof r);
  r.deadline_ms = deadline_ms;
  r.retry_missing = 1;
  pulse_status st = pulse_fetch_gather(f, run, count, &r);
  rate_add(run, count);
  for (size_t i = 0; i < count; i++) {
    t[i].done = pulse_fetch_xfer_ok(&x[i]) && x[i].status == 200;
    if (t[i].head)
      t[i].done = head_answer(&x[i], t[i].head, &t[i]);
    loco_sig_from_answer(&x[i], &t[i].sig);
    give_body(&x[i], &t[i].body);
  }
  free(x), free(run);
  return st;
}
