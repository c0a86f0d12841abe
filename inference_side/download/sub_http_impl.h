/* sub_http_impl.h - private to pulse_inference: the subscriber's use of the
 * fetching layer (http_fetch_impl.h). Every request of a subscriber runs on
 * its one engine (sub->http), so connections are reused across requests
 * and syncs; these helpers add what is the subscriber's own: its URLs, its
 * figures and clocks, and its retry events. */
#ifndef PULSE_SUB_HTTP_IMPL_H
#define PULSE_SUB_HTTP_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "http_fetch_impl.h"
#include "pulse_status.h"
#include "pulse_subscriber.h"

/** The subscriber's engine options: its timeouts, speed limits and
 * backoff, redirects and https allowed, stop flag `stop`. */
pulse_fetch_opts sub_http_opts(const pulse_sub_opts *o, atomic_int *stop);

/* Called about every 100 ms while transfers run, for each running one. */
typedef void (*sub_progress_fn)(pulse_sub *sub, pulse_fetch_xfer *x);

/** Runs one try of n transfers at once on the subscriber's engine (see
 * pulse_fetch_run), counting requests and bytes in the figures and the
 * time (less the time spent in callbacks) as transfer time.
 * @return PULSE_OK (whatever each transfer's result), PULSE_ERR_IO when
 * stopped, PULSE_ERR_NOMEM or PULSE_ERR_INTERNAL when curl cannot start. */
pulse_status sub_http_run(pulse_sub *sub, pulse_fetch_xfer *const *x, size_t n,
                          sub_progress_fn progress);

/** A retry is decided after failure st of `object` (retry number
 * attempt + 1, after delay_ms): counts it, logs it, sends the RETRY event
 * (its detail: pulse_error_detail()). */
void sub_http_retry(pulse_sub *sub, const char *object, unsigned attempt,
                    unsigned delay_ms, pulse_status st);

/** Delay before retry `attempt` (0-based): the engine's backoff. */
unsigned sub_backoff_ms(pulse_sub *sub, unsigned attempt);

/** Sleeps ms milliseconds unless stopped. @return 0, or -1 when stopped. */
int sub_sleep_ms(pulse_sub *sub, unsigned ms);

/** Builds "BASE/REL" for URL number `url` (REL without a leading '/'). */
void sub_url(const pulse_sub *sub, size_t url, const char *rel, char *out,
             size_t cap);

/** A GET (or HEAD) of `rel` into memory from URL number `url`, retried on
 * retryable failures as the options say (each retry is reported).
 * x must be pulse_fetch_xfer_init'ed by the caller for the request fields;
 * its url is set here. @return PULSE_OK when x ended with a 2xx/304, else
 * the failure's status (see pulse_fetch_xfer_fail). */
pulse_status sub_fetch_mem(pulse_sub *sub, size_t url, const char *rel,
                           pulse_fetch_xfer *x, const char *what);

#endif /* PULSE_SUB_HTTP_IMPL_H */
