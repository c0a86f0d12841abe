/* http_fetch_impl.h - private to the project's libraries: the HTTP fetching
 * layer (libcurl) that the subscriber and the trainer exchange (loco/)
 * stand on. One engine runs transfers on one libcurl multi handle (so its
 * connections are kept and reused across requests), takes easy handles
 * from a small pool, and applies one retry policy and one error vocabulary:
 *
 *   retried:  network errors, timeouts, 5xx, 408, 429 (and 404/410 when a
 *             caller waits for a blob to appear), after backoff_ms * 2^n
 *             capped at backoff_max_ms, times a random factor in [0.5, 1];
 *   errors:   PULSE_ERR_NOT_FOUND for 404/410 and for a resource that
 *             changed under a resumed download, PULSE_ERR_CORRUPT for a
 *             body that broke its range or length, PULSE_ERR_IO otherwise
 *             (a redirect to another origin, not retried, included), each
 *             with a message naming the method, the URL and the cause (a
 *             failed write: the system's reason).
 *   redirects: followed within the origin asked, or to origins allowed
 *             (pulse_fetch_opts.redirect_origins).
 *
 * Rate limit (max_recv_bytes_per_s): done here, not by libcurl, whose
 * limiter reads whatever the socket holds (up to 100 reads of its buffer,
 * megabytes on a fast link) and then sleeps it off in one pause that can
 * outlast the low-speed window, so a limited transfer failed as stalled and
 * started over. Here each piece of body is taken only when a token bucket
 * of the rate allows it, else the transfer is paused (libcurl keeps the
 * piece) and resumed when it does: pauses last one small read buffer's
 * worth (libcurl's buffer is cut to an eighth of a second at the rate), a
 * paused transfer is not speed-checked by libcurl, and the low-speed limit
 * is held below half the rate, so rate limiting never trips the stall
 * detector while a link that really stalls still does.
 *
 * Module map:
 *   http_fetch.c        the engine: create/free, stop, metrics, backoff,
 *                       running transfers (once, or retried to a deadline)
 *   http_fetch_xfer.c   one transfer: its sinks (memory, file at an object
 *                       offset), Range and Content-Range checks, headers,
 *                       success / retry / error verdicts (its libcurl
 *                       callbacks: http_fetch_xfer_impl.h)
 *
 * No libcurl type appears here: callers need not include curl.h.
 *
 * Threads: an engine runs transfers on one thread at a time;
 * pulse_fetch_stop and pulse_fetch_metrics_get may be called from any. */
#ifndef PULSE_HTTP_FETCH_IMPL_H
#define PULSE_HTTP_FETCH_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_status.h"

typedef struct pulse_fetch pulse_fetch;

/* ---------------------------------------------------------------- metrics */

/** What an engine did; read with pulse_fetch_metrics_get. */
typedef struct {
  uint64_t requests;   /* tries started and ended (aborted ones included) */
  uint64_t wire_bytes; /* body bytes that arrived, kept or not */
  uint64_t retries;    /* tries decided after a failed one */
  uint64_t failures;   /* tries that did not end with a good answer */
} pulse_fetch_metrics;

/** Counters several engines can add to (e.g. every engine of a process's
 * trainer exchange); zero-initialized storage is a valid empty set. */
typedef struct {
  _Atomic uint64_t requests, wire_bytes, retries, failures;
} pulse_fetch_counters;

/** Reads a set of counters (any thread). */
void pulse_fetch_counters_get(const pulse_fetch_counters *c,
                              pulse_fetch_metrics *out);

/* ----------------------------------------------------------------- engine */

typedef struct {
  uint32_t connect_timeout_ms;   /* 0: the try's own timeout (or curl's) */
  uint32_t low_speed_bytes;      /* transfers with low_speed set fail when */
  uint32_t low_speed_seconds;    /* slower than this for this long; 0: off */
  uint64_t max_recv_bytes_per_s; /* per transfer (see above); 0: no limit */
  uint32_t backoff_ms;           /* first retry delay, doubled per retry ... */
  uint32_t backoff_max_ms;       /* ... up to this */
  const char *user_agent;        /* NULL: no User-Agent header; copied */
  /* Redirects (at most max_redirects of them; 0: none is followed) are
   * followed within the origin (scheme, host and port) of the URL asked
   * only; one to another origin, an https -> http downgrade included, ends
   * the try with an error naming its target (not retried), unless its
   * origin is listed in redirect_origins: "HOST[:PORT]" (the target's
   * scheme may be the one asked or https; no PORT: the scheme's default
   * port) or "SCHEME://HOST[:PORT]" (that scheme only: how a downgrade is
   * allowed). Mirrors are named as sources, not reached by redirect.
   * Copied. */
  int max_redirects;
  const char *const *redirect_origins;
  size_t redirect_origin_count;
  int https;                     /* https:// allowed besides http:// */
  int no_proxy;                  /* ignore proxies from the environment */
  atomic_int *stop;              /* a stop flag the caller owns and watches too
                                    (NULL: the engine's own); must outlive it */
  pulse_fetch_counters *shared;  /* also counted here (NULL: none); must
                                    outlive the engine */
  uint64_t seed; /* jitter PRNG seed; 0: from the clock, pid and address */
  /* PEM file of the CAs that HTTPS servers' certificates must chain to
   * (NULL: the system's); copied. Verification is always on. */
  const char *cacert;
} pulse_fetch_opts;

/** Creates an engine (libcurl's global init is done once per process here).
 * The options are copied. @return PULSE_OK, PULSE_ERR_ARG (NULL opts or
 * out, backoff_max_ms < backoff_ms), PULSE_ERR_NOMEM, PULSE_ERR_INTERNAL
 * (libcurl cannot start). Free with pulse_fetch_free. */
pulse_status pulse_fetch_create(const pulse_fetch_opts *opts,
                                pulse_fetch **out);

/** Frees an engine and closes its connections. NULL is fine. */
void pulse_fetch_free(pulse_fetch *f);

/** Sets the stop flag and wakes a running transfer or sleep at once: runs
 * abort their transfers, sleeps end. Any thread; NULL is fine. */
void pulse_fetch_stop(pulse_fetch *f);

/** Clears the stop flag (the engine runs again). */
void pulse_fetch_restart(pulse_fetch *f);

/** 1 when the stop flag is set. */
int pulse_fetch_stopped(const pulse_fetch *f);

/** This engine's own metrics (any thread). */
void pulse_fetch_metrics_get(const pulse_fetch *f, pulse_fetch_metrics *out);

/** Delay before retry `attempt` (0-based): backoff_ms * 2^attempt, capped
 * at backoff_max_ms, times a random factor in [0.5, 1]. Counts nothing. */
unsigned pulse_fetch_backoff_ms(pulse_fetch *f, unsigned attempt);

/** Counts a retry in the metrics (for callers running their own loop). */
void pulse_fetch_count_retry(pulse_fetch *f);

/** Sleeps ms milliseconds unless stopped. @return 0, or -1 when stopped. */
int pulse_fetch_sleep_ms(pulse_fetch *f, unsigned ms);

/** Monotonic milliseconds (the clock of retry deadlines). */
uint64_t pulse_fetch_now_ms(void);

/** The same clock in microseconds. */
uint64_t pulse_fetch_now_us(void);

/* --------------------------------------------------------------- transfer */

typedef enum {
  PULSE_FETCH_GET = 0,
  PULSE_FETCH_HEAD,
  PULSE_FETCH_POST /* with post_data's body (none: empty) */
} pulse_fetch_method;

/* One HTTP transfer: what to ask, where the body goes, what came back.
 * pulse_fetch_xfer_init sets the request to a GET into memory; the caller
 * then sets the request fields it needs. The answer fields are reset at the
 * start of every try. */
typedef struct pulse_fetch_xfer {
  /* ---- request */
  char url[2048];
  pulse_fetch_method method;
  int ranged; /* ask bytes range_from..range_to (inclusive) */
  uint64_t range_from;
  uint64_t range_to;       /* UINT64_MAX: to the end */
  char if_none_match[100]; /* "" for none; a 304 is then a good answer */
  uint32_t timeout_ms;     /* whole try; 0: none */
  int low_speed;           /* apply the engine's low-speed limit */
  /* Memory sink only: a try after a cut asks for the rest of the body
   * (Range from what is held, If-Range with the first answer's strong
   * ETag); a server that cannot send just the rest sends it whole. */
  int resume;
  /* Validator of a resource whose content can change (a catch-up): ranged
   * tries carry If-Range with it, and an answer under another ETag (or a
   * whole body for a ranged try without one) is refused as `changed`:
   * its bytes are another version's. "": none. */
  char if_range[100];
  /* POST: the body (the caller's, unchanged until the transfer ends; sent
   * as application/octet-stream); NULL: an empty body. */
  const void *post_data;
  uint64_t post_size;
  /* ---- sink: a file (fd >= 0) or memory */
  int fd;
  uint64_t fd_origin;    /* object offset of the file's byte 0 */
  uint64_t expect_total; /* object size when known (checks Content-Range
                            and refuses longer bodies); 0: unknown */
  uint64_t max_bytes;    /* memory sink: refuse longer bodies */
  /* Memory sink: the body (mem.size bytes). A buffer the caller gives it
   * with pulse_bytebuf_adopt is kept (not moved) while the body fits in
   * it, else realloc'ed; pulse_fetch_xfer_release frees it. */
  pulse_bytebuf mem;
  /* File sink only: every body byte kept is also copied to
   * copy[object offset] (a buffer of expect_total bytes). */
  uint8_t *copy;
  /* Called after each piece of the body is kept, file or memory sink
   * (optional); a change of `attempt` tells a new try whose body starts
   * over at mem.size. */
  void (*on_data)(struct pulse_fetch_xfer *x);
  void *on_data_ctx;
  void *progress_ctx; /* for the caller's tick callback */
  unsigned attempt;   /* tries of this transfer so far */
  /* ---- answer */
  int cc;             /* libcurl's CURLcode of the last try (0: complete) */
  long status;        /* HTTP status, 0 when none came */
  uint64_t received;  /* body bytes kept by this try (written or stored) */
  uint64_t wire;      /* body bytes of this try that arrived, kept or not */
  /* The try's body time: from its first answer byte to its end
   * (libcurl's total time less its time to the first byte), and when it
   * ended (pulse_fetch_now_us); a transfer's download rate is wire over
   * body_us, free of the connection's and the server's latency. */
  uint64_t body_us;
  uint64_t end_us;
  int enough;         /* stopped on purpose: the range is complete */
  int too_long;       /* body over max_bytes, expect_total or the range */
  int io_failed;      /* a write (or an allocation) failed */
  int bad_range;      /* a 206 for another range or object size */
  int changed;        /* the resource changed (if_range): not retried */
  int redirect_refused; /* a redirect to another origin: not followed */
  char redirect_to[512]; /* ... its target */
  /* A write that failed: the system's reason (libcurl overwrites
   * curl_error with its own generic text). */
  char write_error[160];
  char headers[4096]; /* the final answer's header lines */
  size_t headers_len;
  char error_body[256]; /* start of a non-2xx body */
  size_t error_len;
  char curl_error[256]; /* libcurl's detail (CURL_ERROR_SIZE) */
  /* ---- engine */
  void *easy; /* the easy handle while the try runs, else NULL */
  struct pulse_fetch *engine; /* the engine running it */
  long hdr_status;      /* status of the answer whose headers arrive */
  /* The answer announced more body than the bytes the range (or the
   * known object size) holds: the try ends once those arrived. */
  int cut_at_end;
  void *slist;
  uint64_t abs; /* object offset of the next body byte */
  int sink_decided;
  int discard;          /* body of a non-2xx answer: not kept */
  char etag[100];       /* resume: strong ETag of the body held */
  uint64_t resume_from; /* resume: body bytes asked to be skipped */
  uint64_t retry_at;    /* retried runs: when the next try may start */
  unsigned retried;     /* retried runs: retries made so far */
  int settled;          /* retried runs: no further try */
  uint64_t rate;        /* rate limit of this try (bytes/s), 0: none */
  double rate_tokens;   /* bytes the bucket allows now (may be < 0) */
  uint64_t rate_last_us; /* when rate_tokens was last filled */
  int paused;           /* paused by the rate limit ... */
  uint64_t resume_at_ms; /* ... until then */
} pulse_fetch_xfer;

/** Resets a transfer to a GET of `url` (NULL: empty) into memory. Does not
 * free a memory body (see pulse_fetch_xfer_release). */
void pulse_fetch_xfer_init(pulse_fetch_xfer *x, const char *url);

/** Frees a memory body; x stays usable. */
void pulse_fetch_xfer_release(pulse_fetch_xfer *x);

/** Value of response header `name` (case-insensitive) into out (cap bytes,
 * trimmed). @return 1 when present and shorter than cap, else 0. */
int pulse_fetch_xfer_header(const pulse_fetch_xfer *x, const char *name,
                            char *out, size_t cap);

/* The longest Retry-After honoured: a server (or a relay in the way) may
 * slow a worker down, not park it. */
#define PULSE_FETCH_RETRY_AFTER_MAX_MS 60000u

/** What the answer's Retry-After asks, in milliseconds, for a 429 or a 5xx:
 * delta-seconds only (an HTTP date, which needs synchronized clocks, is
 * ignored), at most PULSE_FETCH_RETRY_AFTER_MAX_MS. 0 when absent,
 * malformed or another status. */
unsigned pulse_fetch_xfer_retry_after_ms(const pulse_fetch_xfer *x);

/** 1 when the try ended with a complete 2xx answer (or a 304 when
 * if_none_match was set). */
int pulse_fetch_xfer_ok(const pulse_fetch_xfer *x);

/** 1 when the try got a whole answer (whatever its status). */
int pulse_fetch_xfer_answered(const pulse_fetch_xfer *x);

/** 1 while a try of x runs. */
int pulse_fetch_xfer_running(const pulse_fetch_xfer *x);

/** 1 when a failed try is worth retrying: a network error, a timeout, a
 * 5xx, 408 or 429, or a 206 for the wrong range (not a changed resource). */
int pulse_fetch_xfer_retryable(const pulse_fetch_xfer *x);

/** Raises a pulse_fail for a failed try ("WHAT: METHOD URL: cause") and
 * returns its status: PULSE_ERR_NOT_FOUND for 404/410 and a changed
 * resource (if_range), PULSE_ERR_CORRUPT
 * for a body that broke its range or length, PULSE_ERR_IO otherwise. */
pulse_status pulse_fetch_xfer_fail(const pulse_fetch_xfer *x, const char *what);

/* ------------------------------------------------------------------ runs */

/* Called about every 100 ms while transfers run, once per running one. */
typedef void (*pulse_fetch_tick_fn)(void *ctx, pulse_fetch_xfer *x);

/** One try of each of n transfers at once; returns when all ended (each
 * one's answer fields say how), or when stopped (the rest are aborted).
 * @return PULSE_OK whatever each transfer's result, PULSE_ERR_IO when
 * stopped, PULSE_ERR_NOMEM or PULSE_ERR_INTERNAL when libcurl cannot start
 * one (then none runs on). tick may be NULL. */
pulse_status pulse_fetch_run(pulse_fetch *f, pulse_fetch_xfer *const *x,
                             size_t n, pulse_fetch_tick_fn tick,
                             void *tick_ctx);

/* When to try again. */
typedef struct {
  unsigned retries;     /* retries after the first try (deadline 0 only) */
  uint64_t deadline_ms; /* pulse_fetch_now_ms() value: retry until then,
                           each try's timeout cut to it; 0: none */
  int retry_missing;    /* 404 and 410 are retried too (a blob that is
                           not there yet) */
  /* Optional: told of each retry before its wait (st: the failed try's
   * status, whose detail is pulse_error_detail()). */
  void (*on_retry)(void *ctx, const pulse_fetch_xfer *x, unsigned attempt,
                   unsigned delay_ms, pulse_status st);
  void *ctx;
} pulse_fetch_retry;

/** Whether a failed try is retried under r: `attempt` retries were made
 * so far. The delay is the backoff, or the answer's Retry-After when it
 * asks longer (pulse_fetch_xfer_retry_after_ms; a deadline still cuts it).
 * @return the delay before the next try, or -1 when it is not
 * retried (not retryable, out of retries, or past the deadline). Counts
 * nothing. */
long pulse_fetch_retry_delay(pulse_fetch *f, const pulse_fetch_xfer *x,
                             const pulse_fetch_retry *r, unsigned attempt);

/** A transfer tried until it succeeds or r gives up (retries counted,
 * each announced to r->on_retry, waits cut short by a stop); r NULL: one
 * try. @return PULSE_OK when x ended with a good answer, else the last
 * try's failure (pulse_fetch_xfer_fail with `what`: at a deadline, that of
 * the last try), PULSE_ERR_IO when stopped. */
pulse_status pulse_fetch_get(pulse_fetch *f, pulse_fetch_xfer *x,
                             const pulse_fetch_retry *r, const char *what);

/** n transfers at once, each retried on its own under r until it succeeds
 * or r gives up; returns when every one is settled. Each x[i] then holds
 * its last try's answer (pulse_fetch_xfer_ok says which arrived).
 * @return PULSE_OK whatever each transfer's result, PULSE_ERR_IO when
 * stopped, PULSE_ERR_NOMEM or PULSE_ERR_INTERNAL for local failures. */
pulse_status pulse_fetch_gather(pulse_fetch *f, pulse_fetch_xfer *const *x,
                                size_t n, const pulse_fetch_retry *r);

#endif /* PULSE_HTTP_FETCH_IMPL_H */
