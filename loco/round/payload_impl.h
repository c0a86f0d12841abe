/* payload_impl.h - private to loco/: the payload layout (docs/formats/loco-payload.md) and the
 * FP32 value model, shared by the encoder and the decoder so that both
 * read the same contexts in the same order. */
#ifndef PULSE_LOCO_PAYLOAD_IMPL_H
#define PULSE_LOCO_PAYLOAD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_elem.h"
#include "pulse_loco.h"
#include "rangecoder_impl.h"

#define LOCO_PAYLOAD_MAGIC 0x4F434C50u /* "PLCO" little-endian */
#define LOCO_STATE_MAGIC 0x53434C50u   /* "PLCS" */
#define LOCO_HEADER_SIZE 56u
#define LOCO_CHUNK_LOG2_MIN 10u
#define LOCO_CHUNK_LOG2_MAX 30u
#define LOCO_FLAGS_KNOWN (PULSE_LOCO_PAYLOAD_GATED | PULSE_LOCO_PAYLOAD_LEAVING)

/* The largest payload of n parameters can be (the header, a chunk table
 * entry per smallest chunk, 16 bytes an entry at worst, slack): the bound
 * on what is fetched or uploaded as one. */
static inline size_t loco_payload_cap(uint64_t n) {
  uint64_t chunks = (n >> LOCO_CHUNK_LOG2_MIN) + 1u;
  return (size_t)(LOCO_HEADER_SIZE + 32u * chunks + 16u * n + 1024u);
}

/* The largest state (PLCS) of n parameters: a header and two FP32 vectors
 * (docs/formats/loco-state.md "State"). */
static inline size_t loco_state_cap(uint64_t n) {
  return (size_t)(64u + 8u * n);
}

/* The value model (docs/formats/loco-payload.md, "Values"). A pseudo-gradient entry is
 * s = e + (theta_g - theta_r): a difference of two nearby floats of
 * theta_g's magnitude, so s lies on theta_g's FP32 grid and its low
 * mantissa bits are zero, about (exponent of theta_g - exponent of s) of
 * them. The coder sends the sign, the exponent relative to theta_g's, one
 * flag saying whether the predicted low bits are all zero, then only the
 * mantissa bits above them (the top few with adaptive contexts, the rest
 * equiprobable). Any bit pattern codes: off-grid values just cost more. */
#define LOCO_MAN_MODELED 3u
#define LOCO_MAN_CTX 16u

/* Adaptive probabilities of one chunk's value stream; reset per chunk. */
typedef struct {
  pulse_prob sign[8];
  pulse_prob exp[8][256];                               /* binary tree */
  pulse_prob grid[24];                                  /* on-grid flag */
  pulse_prob man[LOCO_MAN_CTX][1u << LOCO_MAN_MODELED]; /* binary tree */
} loco_value_models;

static inline void loco_value_models_reset(loco_value_models *m) {
  pulse_prob *p = (pulse_prob *)m;
  for (size_t i = 0; i < sizeof *m / sizeof *p; i++)
    p[i] = PULSE_RC_PROB_INIT;
}

/* What both sides know of an entry before its value: t, the BF16 bits of
 * theta_g at its position, and d, the position coder's delta (gated: the
 * BF16 move bf16(theta_g - s) - t, so its sign gives s's sign and its size
 * s's exponent relative to t's; ungated: the placeholder 1). */
static inline unsigned loco_d_bucket(uint16_t d, int gated) {
  if (!gated)
    return 0;
  int32_t v = (int16_t)d;
  uint32_t a = (uint32_t)(v < 0 ? -v : v);
  return a == 1 ? 1u : a == 2 ? 2u : 3u;
}

static inline unsigned loco_sign_ctx(uint16_t t, uint16_t d, int gated) {
  return (unsigned)(t >> 15) | (((int16_t)d > 0) ? 2u : 0u) | (gated ? 4u : 0u);
}

static inline unsigned loco_exp_ctx(uint16_t t, uint16_t d, int gated) {
  return loco_d_bucket(d, gated) | (pulse_bf16_class(t) == 0 ? 4u : 0u);
}

/* Exponent of s relative to t's, modulo 256: about -8 for a gated entry. */
static inline unsigned loco_man_ctx(unsigned xd) {
  unsigned c = (xd + 12u) & 0xFFu;
  return c < LOCO_MAN_CTX ? c : LOCO_MAN_CTX - 1u;
}

/* Mantissa bits of s predicted zero: theta_g's exponent minus s's. */
static inline unsigned loco_grid(unsigned et, unsigned es) {
  int d = (int)et - (int)es;
  return d <= 0 ? 0u : d >= 23 ? 23u : (unsigned)d;
}

static inline void loco_value_put(pulse_rc_enc *e, loco_value_models *m,
                                  uint16_t t, uint16_t d, int gated,
                                  uint32_t bits) {
  unsigned sign = bits >> 31, ex = (bits >> 23) & 0xFFu,
           et = pulse_bf16_class(t);
  pulse_rc_enc_bit(e, &m->sign[loco_sign_ctx(t, d, gated)], sign);
  unsigned xd = (ex - et) & 0xFFu;
  pulse_prob *tree = m->exp[loco_exp_ctx(t, d, gated)];
  unsigned node = 1;
  for (int i = 7; i >= 0; i--) {
    unsigned bit = (xd >> i) & 1u;
    pulse_rc_enc_bit(e, &tree[node], bit);
    node = (node << 1) | bit;
  }
  uint32_t man = bits & 0x7FFFFFu;
  unsigned g = loco_grid(et, ex), low = 0;
  if (g > 0) {
    unsigned on = (man & ((1u << g) - 1u)) == 0;
    pulse_rc_enc_bit(e, &m->grid[g], on);
    low = on ? g : 0u;
  }
  unsigned nb = 23u - low, nm = nb < LOCO_MAN_MODELED ? nb : LOCO_MAN_MODELED;
  uint32_t v = man >> low;
  pulse_prob *mt = m->man[loco_man_ctx(xd)];
  node = 1;
  for (unsigned i = 0; i < nm; i++) {
    unsigned bit = (v >> (nb - 1u - i)) & 1u;
    pulse_rc_enc_bit(e, &mt[node], bit);
    node = (node << 1) | bit;
  }
  pulse_rc_enc_direct(e, v, nb - nm);
}

static inline uint32_t loco_value_get(pulse_rc_dec *dd, loco_value_models *m,
                                      uint16_t t, uint16_t d, int gated) {
  unsigned et = pulse_bf16_class(t);
  unsigned sign = pulse_rc_dec_bit(dd, &m->sign[loco_sign_ctx(t, d, gated)]);
  pulse_prob *tree = m->exp[loco_exp_ctx(t, d, gated)];
  unsigned node = 1;
  for (int i = 0; i < 8; i++)
    node = (node << 1) | pulse_rc_dec_bit(dd, &tree[node]);
  unsigned xd = node & 0xFFu;
  unsigned ex = (xd + et) & 0xFFu;
  unsigned g = loco_grid(et, ex), low = 0;
  if (g > 0 && pulse_rc_dec_bit(dd, &m->grid[g]))
    low = g;
  unsigned nb = 23u - low, nm = nb < LOCO_MAN_MODELED ? nb : LOCO_MAN_MODELED;
  pulse_prob *mt = m->man[loco_man_ctx(xd)];
  node = 1;
  for (unsigned i = 0; i < nm; i++)
    node = (node << 1) | pulse_rc_dec_bit(dd, &mt[node]);
  uint32_t v = (uint32_t)(node & ((1u << nm) - 1u));
  v = (v << (nb - nm)) | (uint32_t)pulse_rc_dec_direct(dd, nb - nm);
  uint32_t man = (v << low) & 0x7FFFFFu;
  return (uint32_t)sign << 31 | (uint32_t)ex << 23 | man;
}

/* Elements of chunk c of a vector of P, chunks of 2^log2. */
static inline uint64_t loco_chunk_len(uint64_t P, unsigned log2, uint64_t c) {
  uint64_t first = c << log2, size = 1ull << log2;
  return P - first < size ? P - first : size;
}

#endif
