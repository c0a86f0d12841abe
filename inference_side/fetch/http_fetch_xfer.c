/* http_fetch_xfer.c - one transfer of the fetching layer: where its body
 * goes (memory up to a limit, or a file at the right object offset), the
 * checks on a 206 (its Content-Range must be the range asked, of the
 * object size expected), the answer's headers, and the verdicts: good,
 * worth retrying, or which error. */
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http_fetch_xfer_impl.h"
#include "status_impl.h"

void pulse_fetch_xfer_init(pulse_fetch_xfer *x, const char *url) {
  memset(x, 0, sizeof *x);
  x->fd = -1;
  x->range_to = UINT64_MAX;
  if (url != NULL)
    snprintf(x->url, sizeof x->url, "%s", url);
}

void pulse_fetch_xfer_release(pulse_fetch_xfer *x) {
  pulse_bytebuf_free(&x->mem);
}

int pulse_fetch_xfer_header(const pulse_fetch_xfer *x, const char *name,
                            char *out, size_t cap) {
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

unsigned pulse_fetch_xfer_retry_after_ms(const pulse_fetch_xfer *x) {
  char v[32];
  if (x->cc != 0 || !(x->status == 429 || (x->status >= 500 && x->status < 600)) ||
      !pulse_fetch_xfer_header(x, "Retry-After", v, sizeof v) || v[0] == '\0')
    return 0;
  uint64_t s = 0;
  for (const char *p = v; *p; p++) {
    if (*p < '0' || *p > '9')
      return 0;
    if (s < PULSE_FETCH_RETRY_AFTER_MAX_MS) /* no wrap on long digit runs */
      s = s * 10 + (uint64_t)(*p - '0');
  }
  uint64_t ms = s * 1000;
  return ms < PULSE_FETCH_RETRY_AFTER_MAX_MS ? (unsigned)ms
                                             : PULSE_FETCH_RETRY_AFTER_MAX_MS;
}

int pulse_fetch_xfer_answered(const pulse_fetch_xfer *x) {
  return x->cc == CURLE_OK;
}

int pulse_fetch_xfer_running(const pulse_fetch_xfer *x) {
  return x->easy != NULL;
}

int pulse_fetch_xfer_ok(const pulse_fetch_xfer *x) {
  int done = x->cc == CURLE_OK || (x->cc == CURLE_WRITE_ERROR && x->enough);
  int good = (x->status >= 200 && x->status < 300) ||
             (x->status == 304 && x->if_none_match[0]);
  return done && good && !x->too_long && !x->io_failed && !x->bad_range &&
         !x->changed && !x->redirect_refused;
}

int pulse_fetch_xfer_retryable(const pulse_fetch_xfer *x) {
  if (x->io_failed || x->too_long || x->changed || x->redirect_refused)
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

static const char *method_name(pulse_fetch_method m) {
  return m == PULSE_FETCH_HEAD   ? "HEAD"
         : m == PULSE_FETCH_POST ? "POST"
                                 : "GET";
}

pulse_status pulse_fetch_xfer_fail(const pulse_fetch_xfer *x,
                                   const char *what) {
  const char *method = method_name(x->method);
  if (x->redirect_refused)
    return pulse_fail(PULSE_ERR_IO,
                      "%s: %s %s: redirected to %s, another origin (or an "
                      "https -> http downgrade): not followed (mirrors are "
                      "named as sources; to follow it, allow its origin: "
                      "pulse-pull --follow-redirects-to HOST[:PORT], "
                      "pulse_sub_opts.redirect_origins)",
                      what, method, x->url, x->redirect_to);
  if (x->io_failed)
    return pulse_fail(PULSE_ERR_IO,
                      "%s: %s %s: writing the download failed: %s", what,
                      method, x->url,
                      x->write_error[0] ? x->write_error : x->curl_error);
  if (x->too_long)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: %s %s: the body is longer than expected", what,
                      method, x->url);
  if (x->bad_range)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: %s %s: the answer is not the range asked for", what,
                      method, x->url);
  if (x->changed)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "%s: %s %s: the content changed (it is no longer %s)",
                      what, method, x->url, x->if_range);
  if (x->cc == CURLE_ABORTED_BY_CALLBACK)
    return pulse_fail(PULSE_ERR_IO, "%s: %s %s: stopped", what, method, x->url);
  if (x->cc != CURLE_OK && !(x->cc == CURLE_WRITE_ERROR && x->enough))
    return pulse_fail(PULSE_ERR_IO, "%s: %s %s: %s", what, method, x->url,
                      x->curl_error[0] ? x->curl_error
                                       : curl_easy_strerror((CURLcode)x->cc));
  pulse_status st =
      x->status == 404 || x->status == 410 ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO;
  return pulse_fail(st, "%s: %s %s: HTTP %ld %.*s", what, method, x->url,
                    x->status, (int)x->error_len, x->error_body);
}

/* ------------------------------------------------------------ callbacks */

int pulse_fetch_redirect_target(const char *base, const char *location,
                                char *out, size_t cap) {
  CURLU *u = curl_url();
  char *abs = NULL;
  int ok = u != NULL && curl_url_set(u, CURLUPART_URL, base, 0) == CURLUE_OK &&
           curl_url_set(u, CURLUPART_URL, location, 0) == CURLUE_OK &&
           curl_url_get(u, CURLUPART_URL, &abs, 0) == CURLUE_OK &&
           strlen(abs) < cap;
  if (cap > 0)
    snprintf(out, cap, "%s", ok ? abs : location);
  curl_free(abs);
  curl_url_cleanup(u);
  return ok;
}

/* At the end of a 3xx answer's headers: 1 when its Location may be
 * followed (pulse_fetch_redirect_allowed), else 0 with the target kept. */
static int redirect_ok(pulse_fetch_xfer *x) {
  char loc[sizeof x->redirect_to];
  if (!pulse_fetch_xfer_header(x, "Location", loc, sizeof loc) || loc[0] == 0)
    return 1; /* nothing to follow: the 3xx is the answer */
  /* Relative to the URL this answer came from. */
  const char *base = NULL;
  curl_easy_getinfo(x->easy, CURLINFO_EFFECTIVE_URL, &base);
  int ok = pulse_fetch_redirect_target(base ? base : x->url, loc,
                                       x->redirect_to, sizeof x->redirect_to);
  return ok && pulse_fetch_redirect_allowed(x->engine, x->url, x->redirect_to);
}

size_t pulse_fetch_on_header(char *p, size_t size, size_t n, void *ctx) {
  pulse_fetch_xfer *x = ctx;
  size_t len = size * n;
  if (len >= 5 && memcmp(p, "HTTP/", 5) == 0) {
    x->headers_len = 0; /* a new answer (after a redirect or a 100) */
    const char *sp = memchr(p, ' ', len);
    x->hdr_status = sp != NULL ? strtol(sp + 1, NULL, 10) : 0;
  }
  if (x->headers_len + len < sizeof x->headers) {
    memcpy(x->headers + x->headers_len, p, len);
    x->headers_len += len;
    x->headers[x->headers_len] = '\0';
  }
  /* The blank line ending a redirect's headers: libcurl follows it next,
   * unless it is refused here (another origin, a downgrade). */
  int blank = (len == 2 && p[0] == '\r' && p[1] == '\n') ||
              (len == 1 && p[0] == '\n');
  if (blank && x->hdr_status >= 300 && x->hdr_status < 400 &&
      !redirect_ok(x)) {
    x->redirect_refused = 1;
    return 0;
  }
  return len;
}

/* Checks a 206 that answers a resumed memory body: it must continue
 * exactly where the held bytes end. */
static int resumed_range_ok(const pulse_fetch_xfer *x, const char *cr) {
  uint64_t a, b, total;
  return cr != NULL &&
         sscanf(cr, "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &a, &b, &total) ==
             3 &&
         a == x->resume_from && a == x->mem.size;
}

/* Decides where the body goes, once the status and headers are known. */
static int decide(pulse_fetch_xfer *x) {
  x->sink_decided = 1;
  curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &x->status);
  if (x->status < 200 || x->status >= 300) {
    x->discard = 1;
    return 0;
  }
  char cr[128], etag[sizeof x->etag];
  int have_cr = pulse_fetch_xfer_header(x, "Content-Range", cr, sizeof cr);
  if (x->if_range[0]) {
    /* Bytes of another version of the resource do not continue ours: a
     * whole body for a range (the If-Range failed), or another ETag. */
    int have_etag = pulse_fetch_xfer_header(x, "ETag", etag, sizeof etag);
    if ((have_etag && strcmp(etag, x->if_range) != 0) ||
        (!have_etag && x->ranged && x->status == 200)) {
      x->changed = 1;
      return -1;
    }
  }
  if (x->resume_from > 0) {
    if (x->status == 206) {
      x->bad_range = !resumed_range_ok(x, have_cr ? cr : NULL);
      return x->bad_range ? -1 : 0;
    }
    x->mem.size = 0; /* the whole body again: what was held is dropped */
    x->resume_from = 0;
  }
  if (x->resume && x->fd < 0) {
    x->etag[0] = '\0';
    if (x->status == 200 &&
        pulse_fetch_xfer_header(x, "ETag", etag, sizeof etag) &&
        etag[0] == '"') /* strong validators only (a weak one starts W/) */
      memcpy(x->etag, etag, sizeof etag);
  }
  x->abs = 0;
  if (x->ranged && x->status == 206) {
    uint64_t a, b, total;
    if (!have_cr ||
        sscanf(cr, "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &a, &b, &total) !=
            3 ||
        a != x->range_from ||
        (x->expect_total != 0 && total != x->expect_total)) {
      x->bad_range = 1;
      return -1;
    }
    x->abs = a;
  }
  /* A file sink knows where its body ends (the range, or the object's
   * signed size): an answer announcing more than that is ended once those
   * bytes arrived, not waited on for bytes that are not the object. */
  uint64_t end = x->ranged && x->range_to != UINT64_MAX ? x->range_to + 1
                                                        : x->expect_total;
  curl_off_t cl = -1;
  if (x->fd >= 0 && end != 0 && end >= x->abs &&
      curl_easy_getinfo(x->easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl) ==
          CURLE_OK &&
      cl >= 0 && (uint64_t)cl > end - x->abs)
    x->cut_at_end = 1;
  return 0;
}

/* The start of a non-2xx body, on one line, for the error message. */
static void keep_error_body(pulse_fetch_xfer *x, const char *p, size_t len) {
  size_t room = sizeof x->error_body - 1 - x->error_len;
  size_t k = len < room ? len : room;
  memcpy(x->error_body + x->error_len, p, k);
  x->error_len += k;
  for (size_t i = 0; i < x->error_len; i++)
    if (x->error_body[i] == '\n' || x->error_body[i] == '\r')
      x->error_body[i] = ' ';
}

static size_t to_memory(pulse_fetch_xfer *x, const char *p, size_t len) {
  if (len > x->max_bytes || x->mem.size > x->max_bytes - len) {
    x->too_long = 1;
    return 0;
  }
  /* Doubling from 64 KiB; a buffer the body still fits in stays put. */
  if (!pulse_bytebuf_reserve(&x->mem, len, 65536)) {
    x->io_failed = 1;
    snprintf(x->write_error, sizeof x->write_error, "out of memory");
    return 0;
  }
  pulse_bytebuf_put(&x->mem, p, len);
  x->received += len;
  if (x->on_data != NULL)
    x->on_data(x);
  return len;
}

/* File sink: keeps the part of [abs, abs + len) inside the range asked. */
static size_t to_file(pulse_fetch_xfer *x, const char *p, size_t len) {
  uint64_t from = x->abs, to = x->abs + len; /* object offsets */
  x->abs = to;
  uint64_t lo = x->ranged ? x->range_from : 0;
  uint64_t hi = x->ranged && x->range_to != UINT64_MAX ? x->range_to + 1
                : x->expect_total != 0              ? x->expect_total
                                                    : UINT64_MAX;
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
      int e = w < 0 ? errno : ENOSPC; /* a write of 0 bytes: no room */
      x->io_failed = 1;
      snprintf(x->write_error, sizeof x->write_error,
               "%s (errno %d) at byte %" PRIu64 " of the file", strerror(e),
               e, a - x->fd_origin);
      return 0;
    }
    a += (uint64_t)w;
    x->received += (uint64_t)w;
  }
  if (x->on_data != NULL)
    x->on_data(x);
  if (to >= hi) { /* a whole body for a range: the range is complete */
    x->enough = 1;
    return to == hi && !x->cut_at_end ? len : 0;
  }
  return len;
}

/* The rate limit's token bucket (see http_fetch_impl.h): 1 when a piece
 * of len bytes may be taken now; else 0, with the transfer marked paused
 * until the bucket allows it (a piece is taken whenever the bucket is not
 * in debt, so the average is the rate whatever the piece sizes). */
static int rate_allows(pulse_fetch_xfer *x, size_t len) {
  uint64_t now = pulse_fetch_now_us();
  double rate = (double)x->rate;
  x->rate_tokens += (double)(now - x->rate_last_us) * 1e-6 * rate;
  x->rate_last_us = now;
  if (x->rate_tokens > rate / 8) /* bursts of an eighth of a second */
    x->rate_tokens = rate / 8;
  if (x->rate_tokens < 0) {
    double wait_us = -x->rate_tokens / rate * 1e6;
    x->paused = 1;
    x->resume_at_ms = (now + (uint64_t)wait_us) / 1000u + 1;
    return 0;
  }
  x->rate_tokens -= (double)len;
  return 1;
}

size_t pulse_fetch_on_body(char *p, size_t size, size_t n, void *ctx) {
  pulse_fetch_xfer *x = ctx;
  size_t len = size * n;
  if (!x->sink_decided && decide(x) != 0)
    return 0;
  /* Refused once (a piece held over a pause comes back): refused again. */
  if (x->too_long || x->io_failed || x->bad_range || x->changed)
    return 0;
  if (x->rate != 0 && !rate_allows(x, len))
    return CURL_WRITEFUNC_PAUSE;
  x->wire += len;
  if (x->discard) {
    keep_error_body(x, p, len);
    return len;
  }
  return x->fd < 0 ? to_memory(x, p, len) : to_file(x, p, len);
}
