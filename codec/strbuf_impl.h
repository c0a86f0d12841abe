/* strbuf_impl.h - a growing text buffer for the JSON, canonical forms and
 * metrics pulse writes. Internal (pulse_codec_internal). */
#ifndef PULSE_STRBUF_IMPL_H
#define PULSE_STRBUF_IMPL_H

#include <stddef.h>

#include "pulse_status.h"

typedef struct {
  char *data; /* NUL-terminated while ok */
  size_t len;
  size_t cap;
  int failed; /* an allocation failed: the text is incomplete */
} pulse_strbuf;

#define PULSE_STRBUF_INIT                                                      \
  { NULL, 0, 0, 0 }

/** Appends printf-formatted text; on allocation failure sets failed. */
void pulse_strbuf_printf(pulse_strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/** Appends n bytes. */
void pulse_strbuf_append(pulse_strbuf *b, const char *s, size_t n);

/** Frees the text and resets the buffer. NULL is fine. */
void pulse_strbuf_free(pulse_strbuf *b);

#endif /* PULSE_STRBUF_IMPL_H */
