/* rangecoder_impl.h - adaptive binary range coder (the LZMA construction:
 * 32-bit range, 11-bit probabilities, carry propagation through a cached
 * byte). Integer only, so any platform decodes the same bits.
 *
 * The decoder reads untrusted bytes: past the end it reads zeros and counts
 * them, and the caller rejects a stream that needed any (pulse_rc_dec_ok). */
#ifndef PULSE_RANGECODER_IMPL_H
#define PULSE_RANGECODER_IMPL_H

#include <stdint.h>

#include "bytebuf_impl.h"

#define PULSE_RC_PROB_BITS 11
#define PULSE_RC_PROB_ONE (1u << PULSE_RC_PROB_BITS)
#define PULSE_RC_PROB_INIT (PULSE_RC_PROB_ONE / 2)
#define PULSE_RC_ADAPT 5
#define PULSE_RC_TOP (1u << 24)

typedef uint16_t pulse_prob;

typedef struct {
  uint64_t low;
  uint32_t range;
  uint8_t cache;
  uint64_t cache_size;
  pulse_bytebuf *out;
} pulse_rc_enc;

static inline void pulse_rc_enc_init(pulse_rc_enc *e, pulse_bytebuf *out) {
  e->low = 0;
  e->range = 0xFFFFFFFFu;
  e->cache = 0;
  e->cache_size = 1;
  e->out = out;
}

static inline void pulse_rc_enc_shift_low(pulse_rc_enc *e) {
  if ((uint32_t)e->low < 0xFF000000u || (e->low >> 32) != 0) {
    uint8_t carry = (uint8_t)(e->low >> 32);
    uint8_t temp = e->cache;
    do {
      pulse_bytebuf_byte(e->out, (uint8_t)(temp + carry));
      temp = 0xFF;
    } while (--e->cache_size != 0);
    e->cache = (uint8_t)(e->low >> 24);
  }
  e->cache_size++;
  e->low = (e->low & 0x00FFFFFFu) << 8;
}

static inline void pulse_rc_enc_bit(pulse_rc_enc *e, pulse_prob *p, unsigned bit) {
  uint32_t bound = (e->range >> PULSE_RC_PROB_BITS) * (uint32_t)*p;
  if (!bit) {
    e->range = bound;
    *p = (pulse_prob)(*p + ((PULSE_RC_PROB_ONE - *p) >> PULSE_RC_ADAPT));
  } else {
    e->low += bound;
    e->range -= bound;
    *p = (pulse_prob)(*p - (*p >> PULSE_RC_ADAPT));
  }
  while (e->range < PULSE_RC_TOP) {
    e->range <<= 8;
    pulse_rc_enc_shift_low(e);
  }
}

/* Equiprobable bits, most significant first. */
static inline void pulse_rc_enc_direct(pulse_rc_enc *e, uint64_t value, unsigned nbits) {
  while (nbits-- > 0) {
    e->range >>= 1;
    if ((value >> nbits) & 1u)
      e->low += e->range;
    while (e->range < PULSE_RC_TOP) {
      e->range <<= 8;
      pulse_rc_enc_shift_low(e);
    }
  }
}

static inline void pulse_rc_enc_flush(pulse_rc_enc *e) {
  for (int i = 0; i < 5; i++)
    pulse_rc_enc_shift_low(e);
}

typedef struct {
  uint32_t range;
  uint32_t code;
  const uint8_t *p;
  const uint8_t *end;
  uint64_t overrun; /* bytes read past the end (as zeros) */
} pulse_rc_dec;

static inline uint8_t pulse_rc_dec_byte_(pulse_rc_dec *d) {
  if (d->p < d->end)
    return *d->p++;
  d->overrun++;
  return 0;
}

/* Returns 0 when the stream cannot be a range-coder stream (first byte of an
 * encoder's output is always 0). */
static inline int pulse_rc_dec_init(pulse_rc_dec *d, const uint8_t *p, size_t n) {
  d->range = 0xFFFFFFFFu;
  d->code = 0;
  d->p = p;
  d->end = p + n;
  d->overrun = 0;
  if (pulse_rc_dec_byte_(d) != 0)
    return 0;
  for (int i = 0; i < 4; i++)
    d->code = (d->code << 8) | pulse_rc_dec_byte_(d);
  return d->code != 0xFFFFFFFFu;
}

static inline unsigned pulse_rc_dec_bit(pulse_rc_dec *d, pulse_prob *p) {
  uint32_t bound = (d->range >> PULSE_RC_PROB_BITS) * (uint32_t)*p;
  unsigned bit;
  if (d->code < bound) {
    d->range = bound;
    *p = (pulse_prob)(*p + ((PULSE_RC_PROB_ONE - *p) >> PULSE_RC_ADAPT));
    bit = 0;
  } else {
    d->code -= bound;
    d->range -= bound;
    *p = (pulse_prob)(*p - (*p >> PULSE_RC_ADAPT));
    bit = 1;
  }
  if (d->range < PULSE_RC_TOP) {
    d->range <<= 8;
    d->code = (d->code << 8) | pulse_rc_dec_byte_(d);
  }
  return bit;
}

static inline uint64_t pulse_rc_dec_direct(pulse_rc_dec *d, unsigned nbits) {
  uint64_t v = 0;
  while (nbits-- > 0) {
    d->range >>= 1;
    unsigned bit = d->code >= d->range;
    if (bit)
      d->code -= d->range;
    v = (v << 1) | bit;
    if (d->range < PULSE_RC_TOP) {
      d->range <<= 8;
      d->code = (d->code << 8) | pulse_rc_dec_byte_(d);
    }
  }
  return v;
}

/* A whole, valid stream is consumed exactly: nothing read past its end and
 * no bytes left over. */
static inline int pulse_rc_dec_finished_exactly(const pulse_rc_dec *d) {
  return d->overrun == 0 && d->p == d->end;
}

#endif
