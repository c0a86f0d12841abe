/* sub_http.c - the transfer engine: every request of a subscriber runs on
 * its one curl multi handle, whose connection cache keeps connections open
 * between requests and syncs; easy handles are pooled. Bodies go to memory
 * (heads, catch-ups) or straight to a file at the right offset (objects,
 * ranges). Retries: network errors, timeouts, 5xx, 408 and 429, with
 * exponential backoff and jitter. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

void sub_xfer_init(sub_xfer *x, const char *url) {
  memset(x, 0, sizeof *x);
  x->fd = -1;
  x->range_to = UINT64_MAX;
  if (url != NULL)
    snprintf(x->url, sizeof x->url, "%s", url);
}

void sub_xfer_release(sub_xfer *x) {
  free(x->mem);
  x->mem = NULL;
  x->mem_len = x->mem_cap = 0;
}

int sub_xfer_header(const sub_xfer *x, const char *name, char *out,
                    size_t cap) {
  size_t n = strlen(name);
  const char *p = x->headers;
  while (p != NULL && *p != '\0') {
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      const char *v = p + n + 1;
      while (*v == ' ' || *v == '\t')
        v++;
      size_t len = strcspn(v, "\r\n");
      while (len > 0 && (v[len - 1] == ' ' || v[len - 1] == '\t'))
        len--;
      if (len >= cap)
        return 0; /* longer than anything we expect: treat as absent */
      memcpy(out, v, len);
      out[len] = '\0';
      return 1;
    }
    p = strchr(p, '\n');
    if (p != NULL)
      p++;
  }
  return 0;
}

int sub_xfer_ok(const sub_xfer *x) {
  int done = x->cc == CURLE_OK || (x->cc == CURLE_WRITE_ERROR && x->enough);
  int good = (x->status >= 200 && x->status < 300) ||
             (x->status == 304 && x->if_none_match[0]);
  return done && good && !x->too_long && !x->io_failed && !x->bad_range;
}

int sub_xfer_retryable(const sub_xfer *x) {
  if (x->io_failed || x->too_long)
    return 0;
  if (x->bad_range)
    return 1;
  switch (x->cc) {
  case CURLE_OK:
    return x->status >= 500 || x->status == 408 || x->status == 429;
  case CURLE_COULDNT_CONNECT:
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_PARTIAL_FILE:
  case CURLE_GOT_NOTHING:
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_HTTP2:
  case CURLE_HTTP2_STREAM:
  case CURLE_READ_ERROR:
  case CURLE_WEIRD_SERVER_REPLY:
    return 1;
  default:
    return 0;
  }
}

pulse_status sub_xfer_fail(const sub_xfer *x, const char *what) {
  const char *method = x->head_only ? "HEAD" : "GET";
  if (x->io_failed)
    return pulse_fail(PULSE_ERR_IO,
                      "%s: %s %s: writing the download failed: %s", what,
                      method, x->url, x->curl_error);
  if (x->too_long)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: %s %s: the body is longer than expected", what,
                      method, x->url);
  if (x->bad_range)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: %s %s: the answer is not the range asked for", what,
                      method, x->url);
  if (x->cc == CURLE_ABORTED_BY_CALLBACK)
    return pulse_fail(PULSE_ERR_IO, "%s: %s %s: stopped", what, method, x->url);
  if (x->cc != CURLE_OK && !(x->cc == CURLE_WRITE_ERROR && x->enough))
    return pulse_fail(PULSE_ERR_IO, "%s: %s %s: %s", what, method, x->url,
                      x->curl_error[0] ? x->curl_error
                                       : curl_easy_strerror(x->cc));
  pulse_status st =
      x->status == 404 || x->status == 410 ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO;
  return pulse_fail(st, "%s: %s %s: HTTP %ld %.*s", what, method, x->url,
                    x->status, (int)x->error_len, x->error_body);
}

/* ------------------------------------------------------------ callbacks */

static size_t on_header(char *p, size_t size, size_t n, void *ctx) {
  sub_xfer *x = ctx;
  size_t len = size * n;
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0)
    x->headers_len = 0; /* a new answer (after a redirect or a 100) */
  if (x->headers_len + len < sizeof x->headers) {
    memcpy(x->headers + x->headers_len, p, len);
    x->headers_len += len;
    x->headers[x->headers_len] = '\0';
  }
  return len;
}

/* Decides where the body goes, once the status and headers are known. */
static int decide(sub_xfer *x) {
  x->sink_decided = 1;
  curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
  if (x->status < 200 || x->status >= 300) {
    x->discard = 1;
    return 0;
  }
  x->abs = 0;
  if (x->ranged && x->status == 206) {
    char cr[128];
    uint64_t a, b, total;
    if (!sub_xfer_header(x, "Content-Range", cr, sizeof cr) ||
        sscanf(cr, "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &a, &b, &total) !=
            3 ||
        a != x->range_from ||
        (x->expect_total != 0 && total != x->expect_total)) {
      x->bad_range = 1;
      return -1;
    }
    x->abs = a;
  }
  return 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
  sub_xfer *x = ctx;
  size_t len = size * n;
  if (!x->sink_decided && decide(x) != 0)
    return 0;
  x->wire += len;
  if (x->discard) {
    size_t room = sizeof x->error_body - 1 - x->error_len;
    size_t k = len < room ? len : room;
    memcpy(x->error_body + x->error_len, p, k);
    x->error_len += k;
    for (size_t i = 0; i < x->error_len; i++)
      if (x->error_body[i] == '\n' || x->error_body[i] == '\r')
        x->error_body[i] = ' ';
    return len;
  }
  if (x->fd < 0) {
    if (x->mem_len + len > x->max_bytes) {
      x->too_long = 1;
      return 0;
    }
    if (x->mem_len + len > x->mem_cap) {
      size_t cap = x->mem_cap ? x->mem_cap : 65536;
      while (cap < x->mem_len + len)
        cap *= 2;
      uint8_t *m = realloc(x->mem, cap);
      if (m == NULL) {
        x->io_failed = 1;
        snprintf(x->curl_error, sizeof x->curl_error, "out of memory");
        return 0;
      }
      x->mem = m;
      x->mem_cap = cap;
    }
    memcpy(x->mem + x->mem_len, p, len);
    x->mem_len += len;
    x->received += len;
    if (x->on_data != NULL)
      x->on_data(x);
    return len;
  }
  /* File sink: keep the part of [abs, abs + len) inside the range asked. */
  uint64_t from = x->abs, to = x->abs + len; /* object offsets */
  x->abs = to;
  uint64_t lo = x->ranged ? x->range_from : 0;
  uint64_t hi =
      x->ranged && x->range_to != UINT64_MAX ? x->range_to + 1 : UINT64_MAX;
  if (x->expect_total != 0 && to > x->expect_total) {
    x->too_long = 1;
    return 0;
  }
  uint64_t a = from > lo ? from : lo, b = to < hi ? to : hi;
  if (x->copy != NULL && a < b && x->expect_total != 0)
    memcpy(x->copy + a, p + (a - from), (size_t)(b - a));
  while (a < b) {
    ssize_t w = pwrite(x->fd, p + (a - from), (size_t)(b - a),
                       (off_t)(a - x->fd_origin));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      x->io_failed = 1;
      snprintf(x->curl_error, sizeof x->curl_error, "%s", strerror(errno));
      return 0;
    }
    a += (uint64_t)w;
    x->received += (uint64_t)w;
  }
  if (x->on_data != NULL)
    x->on_data(x);
  if (to >= hi) { /* a whole body for a range: the range is complete */
    x->enough = 1;
    return to == hi ? len : 0;
  }
  return len;
}

/* --------------------------------------------------------------- engine */

static CURL *easy_take(pulse_sub *sub) {
  for (int i = 0; i < SUB_POOL; i++) {
    if (sub->pool_busy[i])
      continue;
    if (sub->pool[i] == NULL)
      sub->pool[i] = curl_easy_init();
    if (sub->pool[i] == NULL)
      return NULL;
    curl_easy_reset(sub->pool[i]);
    sub->pool_busy[i] = 1;
    return sub->pool[i];
  }
  return NULL;
}

static void easy_give(pulse_sub *sub, CURL *e) {
  for (int i = 0; i < SUB_POOL; i++)
    if (sub->pool[i] == e)
      sub->pool_busy[i] = 0;
}

static pulse_status setup(pulse_sub *sub, sub_xfer *x) {
  x->easy = easy_take(sub);
  if (x->easy == NULL)
    return pulse_fail(PULSE_ERR_INTERNAL, "curl: no free handle for %s",
                      x->url);
  CURL *e = x->easy;
  x->cc = CURLE_OK;
  x->status = 0;
  x->received = x->wire = 0;
  x->enough = x->too_long = x->io_failed = x->bad_range = 0;
  x->headers_len = x->error_len = 0;
  x->headers[0] = x->error_body[0] = x->curl_error[0] = '\0';
  x->sink_decided = x->discard = 0;
  x->mem_len = 0;
  x->attempt++;
  curl_easy_setopt(e, CURLOPT_URL, x->url);
  curl_easy_setopt(e, CURLOPT_PRIVATE, x);
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(e, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(e, CURLOPT_USERAGENT, "pulse-subscriber/1");
  curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(e, CURLOPT_ERRORBUFFER, x->curl_error);
  curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(e, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)sub->opts.connect_timeout_ms);
  if (x->timeout_ms)
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)x->timeout_ms);
  if (x->low_speed && sub->opts.low_speed_seconds > 0) {
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_LIMIT,
                     (long)sub->opts.low_speed_bytes);
    curl_easy_setopt(e, CURLOPT_LOW_SPEED_TIME,
                     (long)sub->opts.low_speed_seconds);
  }
  if (sub->opts.max_recv_bytes_per_s)
    curl_easy_setopt(e, CURLOPT_MAX_RECV_SPEED_LARGE,
                     (curl_off_t)sub->opts.max_recv_bytes_per_s);
  if (x->head_only)
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
  if (x->ranged) {
    char r[64];
    if (x->range_to == UINT64_MAX)
      snprintf(r, sizeof r, "%" PRIu64 "-", x->range_from);
    else
      snprintf(r, sizeof r, "%" PRIu64 "-%" PRIu64, x->range_from, x->range_to);
    curl_easy_setopt(e, CURLOPT_RANGE, r);
  }
  x->slist = NULL;
  if (x->if_none_match[0]) {
    char h[160];
    snprintf(h, sizeof h, "If-None-Match: %s", x->if_none_match);
    x->slist = curl_slist_append(NULL, h);
    if (x->slist == NULL) {
      easy_give(sub, e);
      return pulse_fail(PULSE_ERR_NOMEM, "curl headers");
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->slist);
  }
  if (curl_multi_add_handle(sub->multi, e) != CURLM_OK) {
    curl_slist_free_all(x->slist);
    x->slist = NULL;
    easy_give(sub, e);
    return pulse_fail(PULSE_ERR_INTERNAL, "curl: cannot start %s", x->url);
  }
  return PULSE_OK;
}

static void finish(pulse_sub *sub, sub_xfer *x, CURLcode cc) {
  x->cc = cc;
  if (x->status == 0 || !x->sink_decided)
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
  curl_multi_remove_handle(sub->multi, x->easy);
  curl_slist_free_all(x->slist);
  x->slist = NULL;
  easy_give(sub, x->easy);
  x->easy = NULL;
  sub_count(sub, &sub->fig.bytes_downloaded, x->wire);
  sub_count(sub, &sub->fig.requests, 1);
}

pulse_status sub_http_run(pulse_sub *sub, sub_xfer *const *x, size_t n,
                          sub_progress_fn progress) {
  size_t started = 0;
  pulse_status st = PULSE_OK;
  for (; started < n && st == PULSE_OK; started++)
    st = setup(sub, x[started]);
  if (st != PULSE_OK) {
    started--; /* the one that failed did not start */
    for (size_t i = 0; i < started; i++)
      finish(sub, x[i], CURLE_ABORTED_BY_CALLBACK);
    return st;
  }
  double t0 = sub_now(), last_progress = t0, cb0 = sub->t_cb;
  size_t left = n;
  int running = 0;
  while (left > 0) {
    if (atomic_load(&sub->stop)) {
      for (size_t i = 0; i < n; i++)
        if (x[i]->easy != NULL)
          finish(sub, x[i], CURLE_ABORTED_BY_CALLBACK);
      st = pulse_fail(PULSE_ERR_IO, "stopped");
      break;
    }
    curl_multi_perform(sub->multi, &running);
    CURLMsg *m;
    int q;
    while ((m = curl_multi_info_read(sub->multi, &q)) != NULL) {
      if (m->msg != CURLMSG_DONE)
        continue;
      sub_xfer *done = NULL;
      curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&done);
      CURLcode cc = m->data.result;
      if (done != NULL && done->easy != NULL) {
        finish(sub, done, cc);
        left--;
      }
    }
    if (left == 0)
      break;
    double now = sub_now();
    if (progress != NULL && now - last_progress >= 0.1) {
      last_progress = now;
      for (size_t i = 0; i < n; i++)
        if (x[i]->easy != NULL)
          progress(sub, x[i]);
    }
    curl_multi_poll(sub->multi, NULL, 0, 100, NULL);
  }
  /* Time in callbacks that hash or decode is counted where it belongs. */
  sub->t_transfer += sub_now() - t0 - (sub->t_cb - cb0);
  return st;
}

/* ---------------------------------------------------------------- retry */

unsigned sub_backoff_ms(pulse_sub *sub, unsigned attempt) {
  double d = (double)sub->opts.backoff_ms;
  for (unsigned i = 0; i < attempt && d < (double)sub->opts.backoff_max_ms; i++)
    d *= 2;
  if (d > (double)sub->opts.backoff_max_ms)
    d = (double)sub->opts.backoff_max_ms;
  /* xorshift64*: jitter only, not secrets */
  sub->rng ^= sub->rng >> 12;
  sub->rng ^= sub->rng << 25;
  sub->rng ^= sub->rng >> 27;
  double u = (double)((sub->rng * 0x2545F4914F6CDD1Dull) >> 11) * 0x1p-53;
  return (unsigned)(d * (0.5 + 0.5 * u));
}

int sub_sleep_ms(pulse_sub *sub, unsigned ms) {
  double end = sub_now() + ms / 1000.0;
  while (!atomic_load(&sub->stop)) {
    double left = end - sub_now();
    if (left <= 0)
      return 0;
    /* The multi handle's poll wakes up early on pulse_sub_stop. */
    int wait = left > 0.1 ? 100 : (int)(left * 1000) + 1;
    curl_multi_poll(sub->multi, NULL, 0, wait, NULL);
  }
  return -1;
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
                           sub_xfer *x, const char *what) {
  sub_url(sub, url, rel, x->url, sizeof x->url);
  for (unsigned attempt = 0;; attempt++) {
    sub_xfer *one = x;
    pulse_status st = sub_http_run(sub, &one, 1, NULL);
    if (st != PULSE_OK)
      return st;
    if (sub_xfer_ok(x))
      return PULSE_OK;
    st = sub_xfer_fail(x, what);
    if (!sub_xfer_retryable(x) || attempt >= sub->opts.retries)
      return st;
    pulse_sub_event ev = {0};
    ev.type = PULSE_SUB_EV_RETRY;
    ev.attempt = attempt + 1;
    ev.delay_ms = sub_backoff_ms(sub, attempt);
    ev.status = st;
    ev.detail = pulse_error_detail();
    ev.object = rel;
    sub_count(sub, &sub->fig.retries, 1);
    PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s; retry %u in %u ms", ev.detail,
                 ev.attempt, ev.delay_ms);
    sub_emit(sub, &ev);
    if (sub_sleep_ms(sub, ev.delay_ms) != 0)
      return pulse_fail(PULSE_ERR_IO, "%s: stopped", what);
  }
}
