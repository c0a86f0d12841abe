/* bitio_impl.h - little-endian bit packing for the version 2 chunk streams
 * (docs/formats/patch.md, "Version 2 chunk streams"): bits fill each byte from its least
 * significant bit up, fields are written least significant bit first.
 *
 * The reader keeps 56..63 bits in a 64-bit buffer and refills with one
 * unaligned 8-byte load while 8 bytes remain (the branch-light refill of
 * F. Giesen's "Reading bits in far too many ways", variant 4). Past the end
 * it reads zeros and counts them, so a caller rejects a stream that consumed
 * any (pulse_br_finished_exactly); nothing is ever read out of bounds. */
#ifndef PULSE_BITIO_IMPL_H
#define PULSE_BITIO_IMPL_H

#include <stdint.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "endian_impl.h"

/* ------------------------------------------------------------- writing */

typedef struct {
  uint64_t acc;   /* pending bits, the oldest in bit 0 */
  unsigned count; /* pending bits, < 32 between calls */
  pulse_bytebuf *out;
} pulse_bitwriter;

static inline void pulse_bw_init(pulse_bitwriter *w, pulse_bytebuf *out) {
  w->acc = 0;
  w->count = 0;
  w->out = out;
}

/* Appends the low `nbits` (<= 32) bits of v. Whole 32-bit words go out at
 * once, little-endian: the same bytes as one at a time, a quarter of the
 * appends (the encoder spent a fifth of its time appending bytes). */
static inline void pulse_bw_put(pulse_bitwriter *w, uint64_t v,
                                unsigned nbits) {
  if (nbits == 0)
    return;
  w->acc |= (v & ((1ull << nbits) - 1u)) << w->count;
  w->count += nbits;
  if (w->count >= 32) {
    pulse_bytebuf *b = w->out;
    if (b->capacity - b->size >= 4 && !b->failed) {
      pulse_store_le32(b->data + b->size, (uint32_t)w->acc);
      b->size += 4;
    } else {
      uint8_t x[4];
      pulse_store_le32(x, (uint32_t)w->acc);
      pulse_bytebuf_put(b, x, 4);
    }
    w->acc >>= 32;
    w->count -= 32;
  }
}

/* `n` (<= 64) one bits. */
static inline void pulse_bw_ones(pulse_bitwriter *w, unsigned n) {
  while (n > 32) {
    pulse_bw_put(w, 0xFFFFFFFFu, 32);
    n -= 32;
  }
  pulse_bw_put(w, 0xFFFFFFFFu, n);
}

/* The pending bits, then zero bits up to the next byte boundary. */
static inline void pulse_bw_flush(pulse_bitwriter *w) {
  while (w->count > 0) {
    pulse_bytebuf_byte(w->out, (uint8_t)w->acc);
    w->acc >>= 8;
    w->count = w->count > 8 ? w->count - 8 : 0;
  }
  w->acc = 0;
}

/* ------------------------------------------------------------- reading */

typedef struct {
  const uint8_t *start, *p, *end;
  uint64_t buf; /* the next `bits` bits in its low end (more above may be
                   bytes not yet counted, which the next refill ORs
                   again with the same values) */
  unsigned bits;
  uint64_t overrun; /* bytes read past the end, as zeros */
} pulse_bitreader;

static inline void pulse_br_init(pulse_bitreader *r, const uint8_t *p,
                                 size_t n) {
  r->start = p;
  r->p = p;
  r->end = p + n;
  r->buf = 0;
  r->bits = 0;
  r->overrun = 0;
}

/* Afterwards at least 56 bits are buffered. */
static inline void pulse_br_refill(pulse_bitreader *r) {
  if (r->end - r->p >= 8) {
    r->buf |= pulse_load_le64(r->p) << r->bits;
    r->p += (63u - r->bits) >> 3;
    r->bits |= 56u;
  } else {
    while (r->bits <= 56u) {
      uint64_t byte = 0;
      if (r->p < r->end)
        byte = *r->p++;
      else
        r->overrun++;
      r->buf |= byte << r->bits;
      r->bits += 8u;
    }
  }
}

/* The next n (< 64, <= bits buffered) bits, not consumed. */
static inline uint64_t pulse_br_peek(const pulse_bitreader *r, unsigned n) {
  return r->buf & ((1ull << n) - 1u);
}

static inline void pulse_br_skip(pulse_bitreader *r, unsigned n) {
  r->buf >>= n;
  r->bits -= n;
}

/* Bits consumed so far, counting zeros read past the end. */
static inline uint64_t pulse_br_consumed(const pulse_bitreader *r) {
  return 8u * ((uint64_t)(r->p - r->start) + r->overrun) - r->bits;
}

/* A whole, valid stream: nothing needed past its end, no whole byte left
 * over, and the padding bits of its last byte are zero. */
static inline int pulse_br_finished_exactly(const pulse_bitreader *r) {
  uint64_t used = pulse_br_consumed(r);
  uint64_t size = (uint64_t)(r->end - r->start);
  /* Zeros read ahead past the end are fine; consuming any of them is not. */
  if (used > 8u * size || used + 8u <= 8u * size)
    return 0;
  unsigned pad = (unsigned)(8u * size - used);
  return pad == 0 || (r->buf & ((1ull << pad) - 1u)) == 0;
}

#endif
