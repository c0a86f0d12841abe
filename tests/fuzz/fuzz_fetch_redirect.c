/* fuzz_fetch_redirect.c - libFuzzer target for the fetching layer's
 * redirect rule (inference_side/fetch): a redirect's Location comes from
 * whoever answers, and the allowed origins from a command line.
 *
 * Input: NUL-separated strings: the URL asked, the Location, then up to 4
 * allowed origins ("HOST[:PORT]" or "SCHEME://HOST[:PORT]"). Checked:
 *   - resolving never overruns its buffer and gives a NUL-terminated URL;
 *   - the verdict is the same asked twice;
 *   - what the URL's own origin allows, an engine with allowed origins
 *     allows too (the list only adds);
 *   - origins that do not parse are refused at create (PULSE_ERR_ARG),
 *     nothing else fails.
 * Corpus: tests/fuzz/corpus/fetch_redirect. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http_fetch_impl.h"
#include "http_fetch_xfer_impl.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 4096)
    return 0;
  char *text = malloc(size + 1);
  if (text == NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  const char *parts[6] = {"", "", NULL, NULL, NULL, NULL};
  size_t n = 0;
  for (char *p = text; n < 6;) {
    parts[n++] = p;
    char *end = memchr(p, '\0', (size_t)(text + size - p) + 1);
    if (end == NULL || end >= text + size)
      break;
    p = end + 1;
  }
  const char *from = parts[0], *loc = n > 1 ? parts[1] : "";
  pulse_fetch_opts fo;
  memset(&fo, 0, sizeof fo);
  fo.redirect_origins = n > 2 ? &parts[2] : NULL;
  fo.redirect_origin_count = n > 2 ? n - 2 : 0;
  pulse_fetch *f = NULL;
  pulse_status st = pulse_fetch_create(&fo, &f);
  CHECK(st == PULSE_OK || st == PULSE_ERR_ARG);
  char to[64];
  memset(to, 'x', sizeof to);
  int resolved = pulse_fetch_redirect_target(from, loc, to, sizeof to);
  CHECK(memchr(to, '\0', sizeof to) != NULL);
  if (resolved) {
    int a = pulse_fetch_redirect_allowed(f, from, to);
    CHECK(a == pulse_fetch_redirect_allowed(f, from, to));
    int b = pulse_fetch_redirect_allowed(NULL, from, to);
    CHECK(!b || a); /* what the same origin allows, the list does too */
    CHECK(pulse_fetch_redirect_allowed(NULL, to, to) ==
          pulse_fetch_redirect_allowed(NULL, to, to));
  }
  pulse_fetch_free(f);
  free(text);
  return 0;
}
