/* hex_impl.h - decoding hex digits into bytes, for the store's names and
 * digests (lower case only: one spelling per object) and for what users and
 * servers hand a subscriber (keys, ETags: either case). */
#ifndef PULSE_HEX_IMPL_H
#define PULSE_HEX_IMPL_H

#include <stddef.h>
#include <stdint.h>

/* The value of hex digit c, or -1 (upper-case digits only when allowed). */
static inline int pulse_hex_nibble(char c, int upper_ok) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (upper_ok && c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Decodes exactly 2n hex digits s[0, len) into out[0, n).
 * @return 0, or -1 (s NULL, len not 2n, a character that is not a digit;
 * out may then hold part of the bytes). */
static inline int pulse_hex_decode(const char *s, size_t len, uint8_t *out, size_t n,
                                   int upper_ok) {
  if (s == NULL || len != 2 * n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    int hi = pulse_hex_nibble(s[2 * i], upper_ok), lo = pulse_hex_nibble(s[2 * i + 1], upper_ok);
    if (hi < 0 || lo < 0)
      return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

#endif
