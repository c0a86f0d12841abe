/* http_serve_parse_impl.h - inside the HTTP serving layer: the parsers of
 * untrusted request text, kept free of libmicrohttpd so that the fuzzer
 * (tests/fuzz/fuzz_http_headers.c) calls them directly. */
#ifndef PULSE_HTTP_SERVE_PARSE_IMPL_H
#define PULSE_HTTP_SERVE_PARSE_IMPL_H

#include <stddef.h>
#include <stdint.h>

/** Parses exactly n decimal digits (1..19, so no overflow) into *out.
 * @return 0, or -1 (nothing written) for anything else. */
int serve_parse_digits(const char *s, size_t n, uint64_t *out);

/** 1 when the If-None-Match list `list` holds `etag` (or is "*"), weak
 * comparison as RFC 9110 asks; 0 otherwise or when either is NULL. */
int serve_etag_listed(const char *list, const char *etag);

typedef enum {
  SERVE_RANGE_NONE,         /* no usable range: send the whole body */
  SERVE_RANGE_OK,           /* bytes *first..*last, first <= last < size */
  SERVE_RANGE_UNSATISFIABLE /* 416 */
} serve_range;

/** Parses a Range header (NULL: none) against a body of `size` bytes. Only
 * one "bytes=a-b", "bytes=a-" or "bytes=-n" range is honoured; several
 * ranges, other units or bad syntax give SERVE_RANGE_NONE. *first and
 * *last are written only for SERVE_RANGE_OK. */
serve_range serve_parse_range(const char *h, uint64_t size, uint64_t *first,
                              uint64_t *last);

/** Why a decoded request path can never name anything (absolute, at most
 * 512 printable ASCII bytes, no backslash, '%', ".." or empty segment), or
 * NULL when it may be routed. */
const char *serve_path_refusal(const char *url);

#endif /* PULSE_HTTP_SERVE_PARSE_IMPL_H */
