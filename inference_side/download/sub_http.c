/* sub_http.c - the subscriber over the fetching layer (http_fetch.c): its
 * engine's options, its figures and transfer clock around each run, its
 * retry events, and GETs into memory retried as its options say. */
#include <stdio.h>
#include <string.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

pulse_fetch_opts sub_http_opts(const pulse_sub_opts *o, atomic_int *stop) {
  pulse_fetch_opts f;
  memset(&f, 0, sizeof f);
  f.connect_timeout_ms = o->connect_timeout_ms;
  f.low_speed_bytes = o->low_speed_bytes;
  f.low_speed_seconds = o->low_speed_seconds;
  f.max_recv_bytes_per_s = o->max_recv_bytes_per_s;
  f.backoff_ms = o->backoff_ms;
  f.backoff_max_ms = o->backoff_max_ms;
  f.user_agent = "pulse-subscriber/1";
  f.max_redirects = 5; /* within the source's origin, or those allowed */
  f.redirect_origins = o->redirect_origins;
  f.redirect_origin_count = o->redirect_origin_count;
  f.https = 1;
  f.stop = stop;
  f.cacert = o->cacert;
  return f;
}

typedef struct {
  pulse_sub *sub;
  sub_progress_fn fn;
} tick_ctx;

static void on_tick(void *ctx, pulse_fetch_xfer *x) {
  tick_ctx *t = ctx;
  t->fn(t->sub, x);
}

pulse_status sub_http_run(pulse_sub *sub, pulse_fetch_xfer *const *x, size_t n,
                          sub_progress_fn progress) {
  pulse_fetch_metrics m0, m1;
  pulse_fetch_metrics_get(sub->http, &m0);
  double t0 = sub_now(), cb0 = sub->t_cb;
  tick_ctx t = {sub, progress};
  pulse_status st =
      pulse_fetch_run(sub->http, x, n, progress ? on_tick : NULL, &t);
  pulse_fetch_metrics_get(sub->http, &m1);
  sub_count(sub, &sub->fig.bytes_downloaded, m1.wire_bytes - m0.wire_bytes);
  sub_count(sub, &sub->fig.requests, m1.requests - m0.requests);
  /* Time in callbacks that hash or decode is counted where it belongs. */
  sub->t_transfer += sub_now() - t0 - (sub->t_cb - cb0);
  return st;
}

void sub_http_retry(pulse_sub *sub, const char *object, unsigned attempt,
                    unsigned delay_ms, pulse_status st) {
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_RETRY;
  ev.attempt = attempt + 1;
  ev.delay_ms = delay_ms;
  ev.status = st;
  ev.detail = pulse_error_detail();
  ev.object = object;
  sub_count(sub, &sub->fig.retries, 1);
  pulse_fetch_count_retry(sub->http);
  PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s; retry %u in %u ms", ev.detail,
               ev.attempt, ev.delay_ms);
  sub_emit(sub, &ev);
}

unsigned sub_backoff_ms(pulse_sub *sub, unsigned attempt) {
  return pulse_fetch_backoff_ms(sub->http, attempt);
}

int sub_sleep_ms(pulse_sub *sub, unsigned ms) {
  return pulse_fetch_sleep_ms(sub->http, ms);
}

void sub_url(const pulse_sub *sub, size_t url, const char *rel, char *out,
             size_t cap) {
  const char *base = sub->urls[url];
  size_t n = strlen(base);
  while (n > 0 && base[n - 1] == '/')
    n--;
  snprintf(out, cap, "%.*s/%s", (int)n, base, rel);
}

pulse_status sub_fetch_mem(pulse_sub *sub, size_t url, const char *rel,
                           pulse_fetch_xfer *x, const char *what) {
  sub_url(sub, url, rel, x->url, sizeof x->url);
  pulse_fetch_retry policy = {0};
  policy.retries = sub->opts.retries;
  for (unsigned attempt = 0;; attempt++) {
    pulse_fetch_xfer *one = x;
    PULSE_TRY(sub_http_run(sub, &one, 1, NULL));
    if (pulse_fetch_xfer_ok(x))
      return PULSE_OK;
    pulse_status st = pulse_fetch_xfer_fail(x, what);
    long delay = pulse_fetch_retry_delay(sub->http, x, &policy, attempt);
    if (delay < 0)
      return st;
    sub_http_retry(sub, rel, attempt, (unsigned)delay, st);
    if (sub_sleep_ms(sub, (unsigned)delay) != 0)
      return pulse_fail(PULSE_ERR_IO, "%s: stopped", what);
  }
}
