/* toolkit_dense.c - the dense baseline messages (toolkit_dense.h). */
#include <math.h>
#include <string.h>

#include "pulse_elem.h"
#include "status_impl.h"
#include "toolkit_dense.h"

static const uint8_t MAGIC[4] = {'P', 'L', 'D', 'V'};
#define VERSION 1u

static void put_le(uint8_t *p, uint64_t v, unsigned bytes) {
  for (unsigned i = 0; i < bytes; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, unsigned bytes) {
  uint64_t v = 0;
  for (unsigned i = 0; i < bytes; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

/* The values' little-endian loads and stores: DDP moves a whole gradient
 * through them every inner step, so they are plain copies on the usual
 * little-endian host. */
static inline uint32_t load_le32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  return v;
}

static inline uint16_t load_le16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap16(v);
#endif
  return v;
}

static inline void store_le32(uint8_t *p, uint32_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap32(v);
#endif
  memcpy(p, &v, 4);
}

static inline void store_le16(uint8_t *p, uint16_t v) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  v = __builtin_bswap16(v);
#endif
  memcpy(p, &v, 2);
}

static inline uint32_t bits_of(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float float_of(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* Infinities and NaNs: every exponent bit set. */
static inline int f32_bits_finite(uint32_t u) {
  return (u & 0x7F800000u) != 0x7F800000u;
}

static unsigned width_of(pulse_tk_dense_values values) {
  return values == PULSE_TK_DENSE_FP32   ? 4u
         : values == PULSE_TK_DENSE_BF16 ? 2u
                                         : 0u;
}

size_t pulse_tk_dense_size(pulse_tk_dense_values values, uint64_t count) {
  unsigned w = width_of(values);
  if (w == 0 || count == 0 || count > PULSE_TK_DENSE_MAX_COUNT ||
      count > (SIZE_MAX - PULSE_TK_DENSE_HEADER) / w)
    return 0;
  return PULSE_TK_DENSE_HEADER + (size_t)count * w;
}

pulse_status pulse_tk_dense_encode(const pulse_tk_dense_header *h,
                                   const float *x, uint8_t *out) {
  if (h == NULL || x == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "dense message: NULL argument");
  if (pulse_tk_dense_size(h->values, h->count) == 0 || h->samples == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "dense message: bad kind, count or samples");
  for (uint64_t i = 0; i < h->count; i++)
    if (!isfinite(x[i]) || (h->values == PULSE_TK_DENSE_BF16 &&
                            !f32_bits_finite(pulse_f32_bits_from_bf16(
                                pulse_bf16_from_f32_bits(bits_of(x[i]))))))
      return pulse_fail(PULSE_ERR_ARG,
                        "dense message: value %llu of sender %u is not "
                        "finite in its kind (the run diverged)",
                        (unsigned long long)i, h->sender);
  memset(out, 0, PULSE_TK_DENSE_HEADER);
  memcpy(out, MAGIC, 4);
  out[4] = VERSION;
  out[5] = (uint8_t)h->values;
  put_le(out + 8, h->sender, 4);
  put_le(out + 16, h->step, 8);
  put_le(out + 24, h->samples, 8);
  put_le(out + 32, h->count, 8);
  uint8_t *v = out + PULSE_TK_DENSE_HEADER;
  if (h->values == PULSE_TK_DENSE_FP32)
    for (uint64_t i = 0; i < h->count; i++)
      store_le32(v + 4 * i, bits_of(x[i]));
  else
    for (uint64_t i = 0; i < h->count; i++)
      store_le16(v + 2 * i, pulse_bf16_from_f32_bits(bits_of(x[i])));
  return PULSE_OK;
}

pulse_status pulse_tk_dense_decode(const uint8_t *data, size_t size,
                                   const pulse_tk_dense_header *want,
                                   pulse_tk_dense_header *got, float *x) {
  if ((data == NULL && size > 0) || want == NULL || x == NULL)
    return pulse_fail(PULSE_ERR_ARG, "dense message: NULL argument");
  if (size < PULSE_TK_DENSE_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "dense message: %zu bytes, the header alone is %u", size,
                      PULSE_TK_DENSE_HEADER);
  if (memcmp(data, MAGIC, 4) != 0)
    return pulse_fail(PULSE_ERR_MAGIC, "dense message: no PLDV magic");
  if (data[4] != VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "dense message: version %u", data[4]);
  pulse_tk_dense_header h;
  h.values = (pulse_tk_dense_values)data[5];
  h.sender = (uint32_t)get_le(data + 8, 4);
  h.step = get_le(data + 16, 8);
  h.samples = get_le(data + 24, 8);
  h.count = get_le(data + 32, 8);
  if (get_le(data + 6, 2) != 0 || get_le(data + 12, 4) != 0 ||
      width_of(h.values) == 0 || h.samples == 0 || h.count == 0 ||
      h.count > PULSE_TK_DENSE_MAX_COUNT)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "dense message: bad kind, reserved field, samples or "
                      "count");
  if (h.values != want->values)
    return pulse_fail(PULSE_ERR_DTYPE,
                      "dense message of sender %u: values of kind %u, %u "
                      "expected",
                      h.sender, (unsigned)h.values, (unsigned)want->values);
  if (h.step != want->step)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "dense message of sender %u: step %llu, %llu expected",
                      h.sender, (unsigned long long)h.step,
                      (unsigned long long)want->step);
  if (h.count != want->count)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "dense message of sender %u: %llu values, %llu expected",
                      h.sender, (unsigned long long)h.count,
                      (unsigned long long)want->count);
  size_t need = pulse_tk_dense_size(h.values, h.count);
  if (need == 0 || size < need)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "dense message of sender %u: %zu bytes, %zu expected",
                      h.sender, size, need);
  if (size > need)
    return pulse_fail(PULSE_ERR_TRAILING,
                      "dense message of sender %u: %zu bytes, %zu expected",
                      h.sender, size, need);
  const uint8_t *v = data + PULSE_TK_DENSE_HEADER;
  uint64_t bad = h.count;
  if (h.values == PULSE_TK_DENSE_FP32) {
    for (uint64_t i = 0; i < h.count; i++) {
      uint32_t u = load_le32(v + 4 * i);
      bad = f32_bits_finite(u) ? bad : i;
      x[i] = float_of(u);
    }
  } else {
    for (uint64_t i = 0; i < h.count; i++) {
      uint32_t u = pulse_f32_bits_from_bf16(load_le16(v + 2 * i));
      bad = f32_bits_finite(u) ? bad : i;
      x[i] = float_of(u);
    }
  }
  if (bad != h.count)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "dense message of sender %u: value %llu is not "
                      "finite",
                      h.sender, (unsigned long long)bad);
  if (got)
    *got = h;
  return PULSE_OK;
}
