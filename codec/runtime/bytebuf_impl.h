/* bytebuf_impl.h - the one growable buffer of pulse's library code, for
 * binary encoders (patches, payloads) and text alike (the head, canonical
 * forms, safetensors headers, metrics: pulse_bytebuf_printf and the JSON
 * writer of json_impl.h), and a bounds-checked reader. Internal
 * (pulse_codec_internal); pulse_buffer (pulse_codec.h) is the public type
 * results leave the library in, see pulse_bytebuf_take. */
#ifndef PULSE_BYTEBUF_IMPL_H
#define PULSE_BYTEBUF_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "endian_impl.h"
#include "pulse_codec.h"
#include "pulse_status.h"
#include "status_impl.h"

typedef struct {
  uint8_t *data;
  size_t size;
  size_t capacity;
  int failed; /* sticky: an allocation failed, the content is incomplete */
} pulse_bytebuf;

#define PULSE_BYTEBUF_INIT                                                     \
  { NULL, 0, 0, 0 }

/** Makes room for `extra` more bytes (not written: the size stays). When
 * they do not fit, the capacity doubles, starting from `first_capacity`
 * when b has no storage yet (0: 256), until they do; storage they already
 * fit in is kept where it is (so an adopted buffer, see
 * pulse_bytebuf_adopt, does not move while the content fits in it).
 * @return 1, or 0 when b had failed before or an allocation fails now
 * (then failed is set; the content so far is kept). */
static inline int pulse_bytebuf_reserve(pulse_bytebuf *b, size_t extra,
                                        size_t first_capacity) {
  if (b->failed)
    return 0;
  if (extra > SIZE_MAX - b->size) {
    b->failed = 1;
    return 0;
  }
  size_t need = b->size + extra;
  if (need <= b->capacity)
    return 1;
  size_t cap = b->capacity;
  if (cap == 0)
    cap = first_capacity ? first_capacity : 256;
  while (cap < need)
    cap = cap > SIZE_MAX / 2 ? need : cap * 2;
  uint8_t *p = realloc(b->data, cap);
  if (p == NULL) {
    b->failed = 1;
    return 0;
  }
  b->data = p;
  b->capacity = cap;
  return 1;
}

static inline int pulse_bytebuf_grow_(pulse_bytebuf *b, size_t extra) {
  return pulse_bytebuf_reserve(b, extra, 0);
}

/** Makes `data`, a malloc'ed buffer of `capacity` bytes, b's storage, with
 * nothing in it yet (size 0, not failed); whatever b held before is
 * dropped, not freed (b is normally empty). Bytes put while they fit in
 * `capacity` go into `data` in place: it does not move until more is put
 * than it holds (then it is realloc'ed as any storage). From then on b
 * owns it: pulse_bytebuf_free frees it, pulse_bytebuf_take hands it on.
 * data NULL with capacity 0 makes b empty. */
static inline void pulse_bytebuf_adopt(pulse_bytebuf *b, uint8_t *data,
                                       size_t capacity) {
  b->data = data;
  b->size = 0;
  b->capacity = data != NULL ? capacity : 0;
  b->failed = 0;
}

static inline void pulse_bytebuf_put(pulse_bytebuf *b, const void *src,
                                     size_t n) {
  if (n == 0 || !pulse_bytebuf_grow_(b, n))
    return;
  memcpy(b->data + b->size, src, n);
  b->size += n;
}

static inline void pulse_bytebuf_byte(pulse_bytebuf *b, uint8_t v) {
  if (b->size < b->capacity && !b->failed) {
    b->data[b->size++] = v;
    return;
  }
  pulse_bytebuf_put(b, &v, 1);
}

static inline void pulse_bytebuf_u16(pulse_bytebuf *b, uint16_t v) {
  uint8_t x[2];
  pulse_store_le16(x, v);
  pulse_bytebuf_put(b, x, 2);
}

static inline void pulse_bytebuf_u32(pulse_bytebuf *b, uint32_t v) {
  uint8_t x[4];
  pulse_store_le32(x, v);
  pulse_bytebuf_put(b, x, 4);
}

static inline void pulse_bytebuf_u64(pulse_bytebuf *b, uint64_t v) {
  uint8_t x[8];
  pulse_store_le64(x, v);
  pulse_bytebuf_put(b, x, 8);
}

/* LEB128, 1..10 bytes. */
static inline void pulse_bytebuf_varint(pulse_bytebuf *b, uint64_t v) {
  uint8_t x[10];
  size_t n = 0;
  do {
    uint8_t byte = (uint8_t)(v & 0x7F);
    v >>= 7;
    x[n++] = (uint8_t)(byte | (v ? 0x80 : 0));
  } while (v);
  pulse_bytebuf_put(b, x, n);
}

static inline void pulse_bytebuf_free(pulse_bytebuf *b) {
  free(b->data);
  *b = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
}

/* ------------------------------------------------------------------- text */

/** Appends the bytes of the C string s (not its NUL). */
static inline void pulse_bytebuf_str(pulse_bytebuf *b, const char *s) {
  pulse_bytebuf_put(b, s, strlen(s));
}

/** Appends printf-formatted text (no NUL is counted); a formatting error
 * sets failed like an allocation failure. */
void pulse_bytebuf_printf(pulse_bytebuf *b, const char *fmt, ...)
    PULSE_PRINTF_(2, 3);

/** Hands the content over as a pulse_buffer (free it with
 * pulse_buffer_free) and resets b. The text calls never count a NUL: use
 * out->size.
 * @return PULSE_OK; PULSE_ERR_NOMEM (no detail: the caller knows what it was
 * writing) when an allocation failed at any point, then out is empty and b
 * is freed. */
pulse_status pulse_bytebuf_take(pulse_bytebuf *b, pulse_buffer *out);

/* Bounds-checked reader over untrusted bytes. Every read checks the remaining
 * length first; a failed read leaves `ok` cleared and returns 0. */
typedef struct {
  const uint8_t *p;
  size_t left;
  int ok;
} pulse_reader;

static inline pulse_reader pulse_reader_make(const uint8_t *p, size_t n) {
  pulse_reader r = {p, n, 1};
  return r;
}

static inline int pulse_reader_take(pulse_reader *r, void *dst, size_t n) {
  if (!r->ok || n > r->left) {
    r->ok = 0;
    return 0;
  }
  if (n)
    memcpy(dst, r->p, n);
  r->p += n;
  r->left -= n;
  return 1;
}

static inline const uint8_t *pulse_reader_span(pulse_reader *r, size_t n) {
  if (!r->ok || n > r->left) {
    r->ok = 0;
    return NULL;
  }
  const uint8_t *s = r->p;
  r->p += n;
  r->left -= n;
  return s;
}

static inline uint8_t pulse_reader_u8(pulse_reader *r) {
  uint8_t v = 0;
  pulse_reader_take(r, &v, 1);
  return v;
}

static inline uint64_t pulse_reader_le(pulse_reader *r, int bytes) {
  uint8_t x[8] = {0};
  if (!pulse_reader_take(r, x, (size_t)bytes))
    return 0;
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; i--)
    v = (v << 8) | x[i];
  return v;
}

/* LEB128; rejects more than 10 bytes, bits beyond 64, and non-minimal forms
 * (so one value has one encoding and fuzzers cannot find aliases). */
static inline uint64_t pulse_reader_varint(pulse_reader *r) {
  uint64_t v = 0;
  for (int i = 0; i < 10; i++) {
    uint8_t byte;
    if (!pulse_reader_take(r, &byte, 1))
      return 0;
    uint64_t part = (uint64_t)(byte & 0x7F);
    if (i == 9 && part > 1) {
      r->ok = 0;
      return 0;
    }
    v |= part << (7 * i);
    if (!(byte & 0x80)) {
      if (i > 0 && part == 0) {
        r->ok = 0; /* non-minimal */
        return 0;
      }
      return v;
    }
  }
  r->ok = 0;
  return 0;
}

#endif
