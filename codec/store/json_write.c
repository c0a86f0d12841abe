/* json_write.c - the JSON writer (json_impl.h): the one place pulse library
 * code writes JSON (the store's head, safetensors headers, the PULSELoCo
 * manifest, server replies). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json_impl.h"
#include "status_impl.h"

void pulse_json_write_init(pulse_json_writer *w, pulse_bytebuf *out) {
  memset(w, 0, sizeof *w);
  w->out = out;
}

static void misuse(pulse_json_writer *w, const char *what) {
  if (w->misuse == NULL)
    w->misuse = what;
}

static void flush_space(pulse_json_writer *w) {
  if (!w->newline)
    return;
  pulse_bytebuf_byte(w->out, '\n');
  for (unsigned i = 0; i < w->indent; i++)
    pulse_bytebuf_byte(w->out, ' ');
  w->newline = 0;
}

/* Before any value: the comma that separates it from the previous item,
 * then the whitespace asked for. 0 when a value may not come here. */
static int before_value(pulse_json_writer *w) {
  if (w->misuse != NULL)
    return 0;
  if (w->depth == 0) {
    if (w->done) {
      misuse(w, "a second value after the document");
      return 0;
    }
  } else if (w->kind[w->depth - 1] == '{' && !w->after_key) {
    misuse(w, "a value in an object without its key");
    return 0;
  } else if (!w->after_key && w->items[w->depth - 1]) {
    pulse_bytebuf_byte(w->out, ',');
  }
  if (!w->after_key)
    flush_space(w);
  w->after_key = 0;
  if (w->depth == 0)
    w->done = 1;
  else
    w->items[w->depth - 1] = 1;
  return 1;
}

void pulse_json_write_key(pulse_json_writer *w, const char *key) {
  if (w->misuse != NULL)
    return;
  if (w->depth == 0 || w->kind[w->depth - 1] != '{' || w->after_key) {
    misuse(w, "a key outside an object, or two keys in a row");
    return;
  }
  if (w->items[w->depth - 1])
    pulse_bytebuf_byte(w->out, ',');
  flush_space(w);
  size_t n = strlen(key);
  pulse_bytebuf_byte(w->out, '"');
  pulse_json_write_escaped(w->out, key, n);
  pulse_bytebuf_put(w->out, "\":", 2);
  w->after_key = 1;
}

static void open_container(pulse_json_writer *w, char kind) {
  if (w->depth == PULSE_JSON_WRITE_MAX_DEPTH) {
    misuse(w, "nesting deeper than PULSE_JSON_WRITE_MAX_DEPTH");
    return;
  }
  if (!before_value(w))
    return;
  pulse_bytebuf_byte(w->out, (uint8_t)kind);
  w->kind[w->depth] = (uint8_t)kind;
  w->items[w->depth] = 0;
  w->depth++;
}

void pulse_json_write_object(pulse_json_writer *w) {
  open_container(w, '{');
}

void pulse_json_write_array(pulse_json_writer *w) {
  open_container(w, '[');
}

void pulse_json_write_end(pulse_json_writer *w) {
  if (w->misuse != NULL)
    return;
  if (w->depth == 0 || w->after_key) {
    misuse(w, "closing what is not open, or an object after a key");
    return;
  }
  flush_space(w);
  w->depth--;
  pulse_bytebuf_byte(w->out, w->kind[w->depth] == '{' ? '}' : ']');
}

void pulse_json_write_escaped(pulse_bytebuf *out, const char *s, size_t len) {
  size_t need = pulse_json_escape(NULL, s, len);
  if (!pulse_bytebuf_grow_(out, need))
    return;
  out->size += pulse_json_escape((char *)out->data + out->size, s, len);
}

void pulse_json_write_string_n(pulse_json_writer *w, const char *s,
                               size_t len) {
  if (!before_value(w))
    return;
  pulse_bytebuf_byte(w->out, '"');
  pulse_json_write_escaped(w->out, s, len);
  pulse_bytebuf_byte(w->out, '"');
}

void pulse_json_write_string(pulse_json_writer *w, const char *s) {
  pulse_json_write_string_n(w, s, strlen(s));
}

void pulse_json_write_u64(pulse_json_writer *w, uint64_t v) {
  if (before_value(w))
    pulse_bytebuf_printf(w->out, "%" PRIu64, v);
}

void pulse_json_write_i64(pulse_json_writer *w, int64_t v) {
  if (before_value(w))
    pulse_bytebuf_printf(w->out, "%" PRId64, v);
}

void pulse_json_write_double(pulse_json_writer *w, double v) {
  if (!isfinite(v)) {
    misuse(w, "a number that is not finite");
    return;
  }
  if (before_value(w))
    pulse_bytebuf_printf(w->out, "%.17g", v);
}

void pulse_json_write_bool(pulse_json_writer *w, int v) {
  if (before_value(w))
    pulse_bytebuf_str(w->out, v ? "true" : "false");
}

void pulse_json_write_null(pulse_json_writer *w) {
  if (before_value(w))
    pulse_bytebuf_str(w->out, "null");
}

void pulse_json_write_newline(pulse_json_writer *w, unsigned indent) {
  w->newline = 1;
  w->indent = indent;
}

pulse_status pulse_json_write_finish(pulse_json_writer *w) {
  if (w->misuse == NULL && (w->depth != 0 || !w->done))
    misuse(w, "the document is not complete");
  if (w->misuse != NULL)
    return pulse_fail(PULSE_ERR_INTERNAL, "json writer: %s", w->misuse);
  flush_space(w);
  if (w->out->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "json writer: out of memory");
  return PULSE_OK;
}
