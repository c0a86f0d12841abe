/* bytebuf.c - the out-of-line parts of the growable buffer (bytebuf_impl.h):
 * formatted text, and handing the bytes over as a pulse_buffer. */
#include <stdarg.h>
#include <stdio.h>

#include "bytebuf_impl.h"
#include "status_impl.h"

void pulse_bytebuf_printf(pulse_bytebuf *b, const char *fmt, ...) {
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
    pulse_bytebuf_put(b, small, (size_t)n);
    return;
  }
  /* Longer text: format straight into the buffer (room for vsnprintf's NUL,
   * which the size does not count). */
  if (!pulse_bytebuf_grow_(b, (size_t)n + 1))
    return;
  va_start(ap, fmt);
  vsnprintf((char *)b->data + b->size, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->size += (size_t)n;
}

pulse_status pulse_bytebuf_take(pulse_bytebuf *b, pulse_buffer *out) {
  out->data = NULL;
  out->size = 0;
  if (b->failed) {
    pulse_bytebuf_free(b);
    return PULSE_ERR_NOMEM;
  }
  out->data = b->data;
  out->size = b->size;
  *b = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  return PULSE_OK;
}
