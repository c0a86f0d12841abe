/* digest.c - the additive tensor digest and the SHA-256 state digest. */
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "status_impl.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

pulse_tensor_digest pulse_digest_bf16(const uint16_t *bits, uint64_t n) {
  /* Four accumulators per lane let the multiplies overlap. */
  uint64_t a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; j++) {
      uint64_t x = pulse_digest_key(i + (uint64_t)j, bits[i + (uint64_t)j]);
      a[j] += pulse_digest_lane_a(x);
      b[j] += pulse_digest_lane_b(x);
    }
  }
  for (; i < n; i++) {
    uint64_t x = pulse_digest_key(i, bits[i]);
    a[0] += pulse_digest_lane_a(x);
    b[0] += pulse_digest_lane_b(x);
  }
  pulse_tensor_digest d = {a[0] + a[1] + a[2] + a[3], b[0] + b[1] + b[2] + b[3]};
  return d;
}

void pulse_digest_replace(pulse_tensor_digest *d, uint64_t index,
                          uint16_t old_bits, uint16_t new_bits) {
  uint64_t xo = pulse_digest_key(index, old_bits);
  uint64_t xn = pulse_digest_key(index, new_bits);
  d->a += pulse_digest_lane_a(xn) - pulse_digest_lane_a(xo);
  d->b += pulse_digest_lane_b(xn) - pulse_digest_lane_b(xo);
}

pulse_tensor_digest pulse_digest_apply_changes(pulse_tensor_digest base,
                                               const pulse_changes *changes) {
  if (changes == NULL)
    return base;
  for (uint64_t i = 0; i < changes->count; i++)
    pulse_digest_replace(&base, changes->pos[i], changes->old_bits[i],
                         changes->new_bits[i]);
  return base;
}

static void put_u64(EVP_MD_CTX *ctx, uint64_t v) {
  uint8_t b[8];
  for (int i = 0; i < 8; i++)
    b[i] = (uint8_t)(v >> (8 * i));
  EVP_DigestUpdate(ctx, b, 8);
}

pulse_status pulse_state_digest_compute(const pulse_tensor_info *infos,
                                        const pulse_tensor_digest *digests,
                                        size_t count, pulse_state_digest *out) {
  if ((count > 0 && (infos == NULL || digests == NULL)) || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "state digest: NULL argument");
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "state digest: no hash context");
  static const char domain[] = "PULSE-STATE-1";
  int ok = EVP_DigestInit_ex(ctx, EVP_sha256(), NULL);
  ok = ok && EVP_DigestUpdate(ctx, domain, sizeof domain - 1);
  put_u64(ctx, (uint64_t)count);
  for (size_t i = 0; ok && i < count; i++) {
    size_t len = infos[i].name ? strlen(infos[i].name) : 0;
    put_u64(ctx, (uint64_t)len);
    EVP_DigestUpdate(ctx, infos[i].name, len);
    put_u64(ctx, (uint64_t)infos[i].dtype);
    put_u64(ctx, (uint64_t)infos[i].ndim);
    for (uint32_t d = 0; d < infos[i].ndim && d < PULSE_MAX_DIMS; d++)
      put_u64(ctx, infos[i].shape[d]);
    put_u64(ctx, digests[i].a);
    put_u64(ctx, digests[i].b);
  }
  unsigned int len = 0;
  ok = ok && EVP_DigestFinal_ex(ctx, out->bytes, &len) && len == 32;
  EVP_MD_CTX_free(ctx);
  return ok ? PULSE_OK : pulse_fail(PULSE_ERR_INTERNAL, "state digest: SHA-256 failed");
}

void pulse_state_digest_hex(const pulse_state_digest *d, char hex[65]) {
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", d->bytes[i]);
}
