/* sub_http_impl.h - private to pulse_inference: the transfer engine over
 * one libcurl multi handle (connections are kept and reused across
 * requests and syncs), the request/answer of one transfer, and the retry
 * policy (network errors and 5xx, exponential backoff with jitter). */
#ifndef PULSE_SUB_HTTP_IMPL_H
#define PULSE_SUB_HTTP_IMPL_H

#include <curl/curl.h>
#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"
#include "pulse_subscriber.h"

/* One HTTP transfer: what to ask, where the body goes, what came back. */
typedef struct sub_xfer {
  /* ---- request (set by the caller, sub_xfer_init zeroes the rest) */
  char url[2048];
  int head_only; /* HEAD instead of GET */
  int ranged;    /* ask bytes range_from..range_to (inclusive) */
  uint64_t range_from;
  uint64_t range_to;       /* UINT64_MAX: to the end */
  char if_none_match[100]; /* "" for none */
  uint32_t timeout_ms;     /* whole transfer; 0: none (objects) */
  int low_speed;           /* apply the low-speed limit */
  /* ---- sink: a file (fd >= 0) or memory */
  int fd;
  uint64_t fd_origin;    /* object offset of the file's byte 0 */
  uint64_t expect_total; /* object size when known (checks Content-Range);
                            0: unknown */
  uint64_t max_bytes;    /* memory sink: refuse longer bodies */
  uint8_t *mem;          /* a caller's buffer of mem_cap bytes is kept (not
                            moved) while the body fits; sub_xfer_release
                            frees it */
  size_t mem_len, mem_cap;
  /* File sink only: every body byte kept is also copied to
   * copy[object offset] (a buffer of expect_total bytes). */
  uint8_t *copy;
  /* Called after each piece of the body is kept, file or memory sink
   * (optional); attempt tells a new try (its body starts over). */
  void (*on_data)(struct sub_xfer *x);
  void *on_data_ctx;
  unsigned attempt; /* runs of this transfer so far */
  /* ---- answer */
  CURLcode cc;
  long status;
  uint64_t received;  /* body bytes kept (written or stored) */
  uint64_t wire;      /* body bytes that arrived, kept or not */
  int enough;         /* stopped on purpose: the range is complete */
  int too_long;       /* body over max_bytes or past the range */
  int io_failed;      /* a write to the file failed */
  int bad_range;      /* a 206 for another range or object size */
  char headers[4096]; /* the final answer's header lines */
  size_t headers_len;
  char error_body[256]; /* start of a non-2xx body */
  size_t error_len;
  char curl_error[CURL_ERROR_SIZE];
  /* ---- engine */
  CURL *easy;
  struct curl_slist *slist;
  uint64_t abs; /* object offset of the next body byte */
  int sink_decided;
  int discard;        /* body of a non-2xx answer: not kept */
  void *progress_ctx; /* sub_http_run's progress callback argument */
} sub_xfer;

/** Resets a transfer to a GET of `url` into memory. */
void sub_xfer_init(sub_xfer *x, const char *url);

/** Releases a memory body. */
void sub_xfer_release(sub_xfer *x);

/** Value of response header `name` (case-insensitive) into out (cap bytes,
 * trimmed). @return 1 when present, else 0. */
int sub_xfer_header(const sub_xfer *x, const char *name, char *out, size_t cap);

/** 1 when the transfer ended with a complete 2xx answer (or a 304 when
 * if_none_match was set). */
int sub_xfer_ok(const sub_xfer *x);

/** 1 when a failed transfer is worth retrying: a network error, a timeout,
 * a 5xx, 408 or 429. */
int sub_xfer_retryable(const sub_xfer *x);

/** Raises a pulse_fail for a failed transfer (what went wrong, with the URL)
 * and returns its status: PULSE_ERR_NOT_FOUND for 404/410, PULSE_ERR_CORRUPT
 * for a body that broke its range or length, PULSE_ERR_IO otherwise. */
pulse_status sub_xfer_fail(const sub_xfer *x, const char *what);

/* Called about every 100 ms while transfers run: ctx is each running
 * transfer's progress_ctx. */
typedef void (*sub_progress_fn)(pulse_sub *sub, sub_xfer *x);

/** Runs n transfers at once on the subscriber's multi handle and returns
 * when all are done (each one's cc/status say how), or when pulse_sub_stop
 * was called (the rest are aborted with CURLE_ABORTED_BY_CALLBACK).
 * @return PULSE_OK (whatever each transfer's result), PULSE_ERR_IO when
 * stopped, PULSE_ERR_NOMEM or PULSE_ERR_INTERNAL when curl cannot start. */
pulse_status sub_http_run(pulse_sub *sub, sub_xfer *const *x, size_t n,
                          sub_progress_fn progress);

/** Delay before retry `attempt` (0-based): backoff_ms * 2^attempt, capped
 * at backoff_max_ms, times a random factor in [0.5, 1]. */
unsigned sub_backoff_ms(pulse_sub *sub, unsigned attempt);

/** Sleeps ms milliseconds unless stopped. @return 0, or -1 when stopped. */
int sub_sleep_ms(pulse_sub *sub, unsigned ms);

/** Builds "BASE/REL" for URL number `url` (REL without a leading '/'). */
void sub_url(const pulse_sub *sub, size_t url, const char *rel, char *out,
             size_t cap);

/** A GET (or HEAD) of `rel` into memory from URL number `url`, retried on
 * retryable failures as the options say (each retry is reported).
 * x must be sub_xfer_init'ed by the caller for the request fields; its url
 * is set here. @return PULSE_OK when x ended with a 2xx/304, else the
 * failure's status (see sub_xfer_fail). */
pulse_status sub_fetch_mem(pulse_sub *sub, size_t url, const char *rel,
                           sub_xfer *x, const char *what);

#endif /* PULSE_SUB_HTTP_IMPL_H */
