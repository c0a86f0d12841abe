/* http_fetch_xfer_impl.h - private to the fetching layer: the libcurl
 * callbacks of one transfer (http_fetch_xfer.c), which the engine
 * (http_fetch.c) installs on each try's easy handle. */
#ifndef PULSE_HTTP_FETCH_XFER_IMPL_H
#define PULSE_HTTP_FETCH_XFER_IMPL_H

#include <stddef.h>

#include "http_fetch_impl.h"

/** CURLOPT_HEADERFUNCTION: keeps the final answer's header lines. */
size_t pulse_fetch_on_header(char *p, size_t size, size_t n, void *ctx);

/** CURLOPT_WRITEFUNCTION: decides the sink at the first body byte (status,
 * Content-Range, ETag), then stores the body (memory or file) or keeps the
 * start of an error body. Returns less than size * n to end the try (body
 * too long, wrong range, a failed write, or a range complete). */
size_t pulse_fetch_on_body(char *p, size_t size, size_t n, void *ctx);

/** The absolute URL a redirect's Location (absolute or relative) names
 * from `base`, into out (cap bytes). @return 1 when it resolves and fits;
 * else 0 with out holding the Location as it came (cut to cap). */
int pulse_fetch_redirect_target(const char *base, const char *location,
                                char *out, size_t cap);

/** 1 when the engine may follow a redirect of a try of `from` to `to`
 * (absolute URLs): same origin, or an origin its options allow (see
 * pulse_fetch_opts.redirect_origins). */
int pulse_fetch_redirect_allowed(const pulse_fetch *f, const char *from,
                                 const char *to);

#endif /* PULSE_HTTP_FETCH_XFER_IMPL_H */
