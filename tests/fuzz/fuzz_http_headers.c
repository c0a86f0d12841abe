/* fuzz_http_headers.c - libFuzzer target for the serving layer's parsers of
 * untrusted request text (trainer_side/serve/http_serve_parse.c): Range headers,
 * If-None-Match lists and request paths.
 *
 * Input: 8 bytes of body size (little-endian; the high bits are folded so
 * that small sizes, where the edge cases are, come up often), then three
 * NUL-separated strings: the Range header, the If-None-Match list, the path.
 * Checked:
 *   - a range is either refused (whole body), unsatisfiable, or a non-empty
 *     interval inside the body, and agrees with a plain reference reading of
 *     the one form the layer honours;
 *   - a list always matches "*" at its head and an ETag equal to the list;
 *   - a path that is not refused is absolute, short, printable, and holds no
 *     backslash, '%', ".." or empty segment (what lets it reach openat).
 * Corpus: tests/fuzz/corpus/http_headers. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_serve_parse_impl.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

/* The reference: "bytes=" then digits-digits, digits- or -digits, each
 * number at most 19 digits, nothing else. */
static int ref_number(const char *s, size_t n, uint64_t *v) {
  if (n == 0 || n > 19)
    return 0;
  *v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return 0;
    *v = *v * 10 + (uint64_t)(s[i] - '0');
  }
  return 1;
}

static serve_range ref_range(const char *h, uint64_t size, uint64_t *first,
                             uint64_t *last) {
  if (strncmp(h, "bytes=", 6) != 0)
    return SERVE_RANGE_NONE;
  const char *s = h + 6, *dash = strchr(s, '-');
  if (dash == NULL || strchr(s, ',') != NULL)
    return SERVE_RANGE_NONE;
  size_t left = (size_t)(dash - s), right = strlen(dash + 1);
  uint64_t a = 0, b = 0;
  if (left == 0) {
    if (!ref_number(dash + 1, right, &b))
      return SERVE_RANGE_NONE;
    if (b == 0 || size == 0)
      return SERVE_RANGE_UNSATISFIABLE;
    *first = b >= size ? 0 : size - b;
    *last = size - 1;
    return SERVE_RANGE_OK;
  }
  if (!ref_number(s, left, &a))
    return SERVE_RANGE_NONE;
  if (right == 0)
    b = UINT64_MAX;
  else if (!ref_number(dash + 1, right, &b) || b < a)
    return SERVE_RANGE_NONE;
  if (a >= size)
    return SERVE_RANGE_UNSATISFIABLE;
  *first = a;
  *last = b < size ? b : size - 1;
  return SERVE_RANGE_OK;
}

static void check_range(const char *h, uint64_t size) {
  uint64_t first = 7, last = 7, rf = 0, rl = 0;
  serve_range k = serve_parse_range(h, size, &first, &last);
  CHECK(k == ref_range(h, size, &rf, &rl));
  if (k == SERVE_RANGE_OK) {
    CHECK(size > 0 && first <= last && last < size);
    CHECK(first == rf && last == rl);
  } else {
    CHECK(first == 7 && last == 7); /* untouched */
  }
  CHECK(serve_parse_range(NULL, size, &first, &last) == SERVE_RANGE_NONE);
}

static void check_etags(const char *list) {
  CHECK(serve_etag_listed(list, NULL) == 0);
  CHECK(serve_etag_listed(NULL, list) == 0);
  size_t n = strlen(list);
  /* An ETag equal to the whole list, when the list is one plain entry. */
  if (n > 0 && strcspn(list, ", \t") == n && list[0] != '*' &&
      strncmp(list, "W/", 2) != 0)
    CHECK(serve_etag_listed(list, list) == 1);
  char star[600];
  snprintf(star, sizeof star, "*, %.500s", list);
  CHECK(serve_etag_listed(star, "\"anything\"") == 1);
}

static void check_path(const char *url) {
  const char *why = serve_path_refusal(url);
  if (why != NULL)
    return;
  size_t n = strlen(url);
  CHECK(n > 0 && n <= 512 && url[0] == '/');
  for (size_t i = 0; i < n; i++)
    CHECK(url[i] >= 0x20 && url[i] < 0x7f && url[i] != '\\' && url[i] != '%');
  CHECK(strstr(url, "..") == NULL && strstr(url, "//") == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 8)
    return 0;
  uint64_t body = 0;
  for (int i = 0; i < 8; i++)
    body |= (uint64_t)data[i] << (8 * i);
  if (body >> 63) /* half the inputs: a small body */
    body &= 0xFFFF;
  char *text = malloc(size - 8 + 3);
  CHECK(text != NULL);
  memcpy(text, data + 8, size - 8);
  /* Three NULs: whatever the input holds, each of the three strings ends
   * inside the copy (missing ones are empty). */
  text[size - 8] = text[size - 7] = text[size - 6] = '\0';
  const char *range = text;
  const char *list = range + strlen(range) + 1;
  const char *path = list + strlen(list) + 1;
  check_range(range, body);
  check_etags(list);
  check_path(path);
  free(text);
  return 0;
}
