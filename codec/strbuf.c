/* strbuf.c - growing text buffer (strbuf_impl.h). */
#include "strbuf_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int reserve(pulse_strbuf *b, size_t extra) {
  if (b->failed)
    return -1;
  if (b->len + extra + 1 <= b->cap)
    return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra + 1) {
    if (cap > ((size_t)-1) / 2) {
      b->failed = 1;
      return -1;
    }
    cap *= 2;
  }
  char *d = realloc(b->data, cap);
  if (d == NULL) {
    b->failed = 1;
    return -1;
  }
  b->data = d;
  b->cap = cap;
  return 0;
}

void pulse_strbuf_append(pulse_strbuf *b, const char *s, size_t n) {
  if (reserve(b, n) != 0)
    return;
  memcpy(b->data + b->len, s, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void pulse_strbuf_printf(pulse_strbuf *b, const char *fmt, ...) {
  char small[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = 1;
    return;
  }
  if ((size_t)n < sizeof small) {
    pulse_strbuf_append(b, small, (size_t)n);
    return;
  }
  if (reserve(b, (size_t)n) != 0)
    return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void pulse_strbuf_free(pulse_strbuf *b) {
  if (b == NULL)
    return;
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = 0;
}
