/* http_serve_parse.c - the serving layer's parsers of request text
 * (If-None-Match lists, Range headers, paths): pure functions, apart from
 * libmicrohttpd, so that a fuzzer can reach them
 * (tests/fuzz/fuzz_http_headers.c). */
#include <stdint.h>
#include <string.h>

#include "http_serve_parse_impl.h"

/* 1 when an If-None-Match list holds `etag` (or is "*"). Weak comparison, as
 * RFC 9110 asks for If-None-Match. */
int serve_etag_listed(const char *list, const char *etag) {
  if (list == NULL || etag == NULL)
    return 0;
  size_t el = strlen(etag);
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',')
      p++;
    if (*p == '*')
      return 1;
    if (p[0] == 'W' && p[1] == '/')
      p += 2;
    if (strncmp(p, etag, el) == 0 &&
        (p[el] == '\0' || p[el] == ',' || p[el] == ' ' || p[el] == '\t'))
      return 1;
    while (*p && *p != ',')
      p++;
  }
  return 0;
}

int serve_parse_digits(const char *s, size_t n, uint64_t *out) {
  if (n == 0 || n > 19)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  *out = v;
  return 0;
}

/* One "bytes=a-b", "bytes=a-" or "bytes=-n" range. Anything else (several
 * ranges, other units, bad syntax) is ignored: the whole body is sent, as
 * RFC 9110 allows. */
serve_range serve_parse_range(const char *h, uint64_t size, uint64_t *first,
                              uint64_t *last) {
  if (h == NULL || strncmp(h, "bytes=", 6) != 0)
    return SERVE_RANGE_NONE;
  const char *s = h + 6;
  if (strchr(s, ',') != NULL)
    return SERVE_RANGE_NONE;
  const char *dash = strchr(s, '-');
  if (dash == NULL)
    return SERVE_RANGE_NONE;
  const char *end = s + strlen(s);
  uint64_t a, b;
  if (dash == s) { /* suffix */
    if (serve_parse_digits(dash + 1, (size_t)(end - dash - 1), &b) != 0)
      return SERVE_RANGE_NONE;
    if (b == 0 || size == 0)
      return SERVE_RANGE_UNSATISFIABLE;
    *first = b >= size ? 0 : size - b;
    *last = size - 1;
    return SERVE_RANGE_OK;
  }
  if (serve_parse_digits(s, (size_t)(dash - s), &a) != 0)
    return SERVE_RANGE_NONE;
  if (dash + 1 == end)
    b = UINT64_MAX;
  else if (serve_parse_digits(dash + 1, (size_t)(end - dash - 1), &b) != 0 ||
           b < a)
    return SERVE_RANGE_NONE;
  if (a >= size)
    return SERVE_RANGE_UNSATISFIABLE;
  *first = a;
  *last = b >= size ? size - 1 : b;
  return SERVE_RANGE_OK;
}

/* Paths that can never name anything: refused before routing. */
const char *serve_path_refusal(const char *url) {
  size_t n = strlen(url);
  if (n == 0 || url[0] != '/')
    return "the path must be absolute";
  if (n > 512)
    return "the path is too long";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)url[i];
    if (c < 0x20 || c >= 0x7f)
      return "control or non-ASCII bytes in the path";
    if (c == '\\')
      return "backslash in the path";
    if (c == '%')
      return "a %-escape in the decoded path (double encoding)";
  }
  if (strstr(url, "..") != NULL)
    return "\"..\" in the path";
  if (strstr(url, "//") != NULL)
    return "empty path segment";
  return NULL;
}
