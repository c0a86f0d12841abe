/* endian_impl.h - little-endian loads and stores of 16, 32 and 64 bits at
 * any alignment: the byte order of every format of the project (patches,
 * safetensors, payloads, messages). memcpy makes them single moves on the
 * usual little-endian host; a big-endian one swaps. */
#ifndef PULSE_ENDIAN_IMPL_H
#define PULSE_ENDIAN_IMPL_H

#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#define PULSE_BIG_ENDIAN_HOST 1
#else
#define PULSE_BIG_ENDIAN_HOST 0
#endif

static inline uint16_t pulse_load_le16(const uint8_t *p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return PULSE_BIG_ENDIAN_HOST ? __builtin_bswap16(v) : v;
}

static inline uint32_t pulse_load_le32(const uint8_t *p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return PULSE_BIG_ENDIAN_HOST ? __builtin_bswap32(v) : v;
}

static inline uint64_t pulse_load_le64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return PULSE_BIG_ENDIAN_HOST ? __builtin_bswap64(v) : v;
}

static inline void pulse_store_le16(uint8_t *p, uint16_t v) {
  v = PULSE_BIG_ENDIAN_HOST ? __builtin_bswap16(v) : v;
  memcpy(p, &v, 2);
}

static inline void pulse_store_le32(uint8_t *p, uint32_t v) {
  v = PULSE_BIG_ENDIAN_HOST ? __builtin_bswap32(v) : v;
  memcpy(p, &v, 4);
}

static inline void pulse_store_le64(uint8_t *p, uint64_t v) {
  v = PULSE_BIG_ENDIAN_HOST ? __builtin_bswap64(v) : v;
  memcpy(p, &v, 8);
}

#endif /* PULSE_ENDIAN_IMPL_H */
