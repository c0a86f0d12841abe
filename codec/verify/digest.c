/* digest.c - the additive tensor digest and the SHA-256 state digest. */
#include "detect_impl.h"
#include "digest_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "status_impl.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>

pulse_tensor_digest pulse_digest_bf16_scalar_at(const uint16_t *bits, uint64_t n,
                                                uint64_t first) {
  /* Four accumulators per lane let the multiplies overlap. */
  uint64_t a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; j++) {
      uint64_t x = pulse_digest_key(first + i + (uint64_t)j, bits[i + (uint64_t)j]);
      a[j] += pulse_digest_lane_a(x);
      b[j] += pulse_digest_lane_b(x);
    }
  }
  for (; i < n; i++) {
    uint64_t x = pulse_digest_key(first + i, bits[i]);
    a[0] += pulse_digest_lane_a(x);
    b[0] += pulse_digest_lane_b(x);
  }
  pulse_tensor_digest d = {a[0] + a[1] + a[2] + a[3], b[0] + b[1] + b[2] + b[3]};
  return d;
}

pulse_tensor_digest pulse_digest_bf16_scalar(const uint16_t *bits, uint64_t n) {
  return pulse_digest_bf16_scalar_at(bits, n, 0);
}

pulse_tensor_digest pulse_digest_change_sum_scalar(const uint64_t *pos, const uint16_t *old_bits,
                                                   const uint16_t *new_bits, uint64_t n) {
  uint64_t da = 0, db = 0;
  for (uint64_t j = 0; j < n; j++) {
    uint64_t xo = pulse_digest_key(pos[j], old_bits[j]);
    uint64_t xn = pulse_digest_key(pos[j], new_bits[j]);
    da += pulse_digest_lane_a(xn) - pulse_digest_lane_a(xo);
    db += pulse_digest_lane_b(xn) - pulse_digest_lane_b(xo);
  }
  return (pulse_tensor_digest){da, db};
}

#if PULSE_HAVE_X86_DISPATCH
#define DIGEST_AVX512 __attribute__((target("avx512f,avx512dq")))

/* pulse_digest_lane_a / _b on 8 keys (pulse_elem.h is the reference). */
DIGEST_AVX512 static inline __m512i lane_a8(__m512i x) {
  x = _mm512_add_epi64(x, _mm512_set1_epi64((long long)0x9E3779B97F4A7C15ull));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
                         _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ull));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
                         _mm512_set1_epi64((long long)0x94D049BB133111EBull));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

DIGEST_AVX512 static inline __m512i lane_b8(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_set1_epi64((long long)0xD6E8FEB86659FD93ull));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 33)),
                         _mm512_set1_epi64((long long)0xFF51AFD7ED558CCDull));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 33)),
                         _mm512_set1_epi64((long long)0xC4CEB9FE1A85EC53ull));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 33));
}

/* Lane sum modulo 2^64 (GCC's _mm512_reduce_add_epi64 adds as signed long
 * long, which overflows: undefined behaviour, and UBSan says so). */
DIGEST_AVX512 static inline uint64_t sum8(__m512i v) {
  uint64_t lane[8], sum = 0;
  _mm512_storeu_si512((void *)lane, v);
  for (int i = 0; i < 8; i++)
    sum += lane[i];
  return sum;
}

DIGEST_AVX512 static inline __m512i keys8(__m512i index, const uint16_t *bits) {
  __m512i v = _mm512_cvtepu16_epi64(_mm_loadu_si128((const __m128i *)(const void *)bits));
  return _mm512_or_si512(_mm512_slli_epi64(index, 16), v);
}

DIGEST_AVX512 static pulse_tensor_digest digest_bf16_avx512(const uint16_t *bits, uint64_t n,
                                                           uint64_t first) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, b0 = a0, b1 = a0;
  __m512i idx = _mm512_add_epi64(_mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
                                 _mm512_set1_epi64((long long)first));
  __m512i eight = _mm512_set1_epi64(8);
  uint64_t i = 0;
  for (; i + 16 <= n; i += 16) { /* two vectors in flight */
    __m512i x0 = keys8(idx, bits + i), x1 = keys8(_mm512_add_epi64(idx, eight), bits + i + 8);
    a0 = _mm512_add_epi64(a0, lane_a8(x0));
    b0 = _mm512_add_epi64(b0, lane_b8(x0));
    a1 = _mm512_add_epi64(a1, lane_a8(x1));
    b1 = _mm512_add_epi64(b1, lane_b8(x1));
    idx = _mm512_add_epi64(idx, _mm512_set1_epi64(16));
  }
  pulse_tensor_digest rest = {0, 0}; /* the tail, at its true indices */
  for (; i < n; i++) {
    uint64_t x = pulse_digest_key(first + i, bits[i]);
    rest.a += pulse_digest_lane_a(x);
    rest.b += pulse_digest_lane_b(x);
  }
  return (pulse_tensor_digest){
      sum8(_mm512_add_epi64(a0, a1)) + rest.a, sum8(_mm512_add_epi64(b0, b1)) + rest.b};
}

DIGEST_AVX512 static pulse_tensor_digest change_sum_avx512(const uint64_t *pos,
                                                           const uint16_t *old_bits,
                                                           const uint16_t *new_bits, uint64_t n) {
  __m512i a = _mm512_setzero_si512(), b = a;
  uint64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    __m512i p = _mm512_loadu_si512((const void *)(pos + j));
    __m512i xo = keys8(p, old_bits + j), xn = keys8(p, new_bits + j);
    a = _mm512_add_epi64(a, _mm512_sub_epi64(lane_a8(xn), lane_a8(xo)));
    b = _mm512_add_epi64(b, _mm512_sub_epi64(lane_b8(xn), lane_b8(xo)));
  }
  pulse_tensor_digest rest = pulse_digest_change_sum_scalar(pos + j, old_bits + j, new_bits + j,
                                                            n - j);
  return (pulse_tensor_digest){sum8(a) + rest.a, sum8(b) + rest.b};
}

static int have_avx512(void) {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
}
#endif

pulse_tensor_digest pulse_digest_bf16_at(const uint16_t *bits, uint64_t n, uint64_t first) {
#if PULSE_HAVE_X86_DISPATCH
  if (have_avx512())
    return digest_bf16_avx512(bits, n, first);
#endif
  return pulse_digest_bf16_scalar_at(bits, n, first);
}

pulse_tensor_digest pulse_digest_bf16(const uint16_t *bits, uint64_t n) {
  return pulse_digest_bf16_at(bits, n, 0);
}

pulse_tensor_digest pulse_digest_change_sum(const uint64_t *pos, const uint16_t *old_bits,
                                            const uint16_t *new_bits, uint64_t n) {
#if PULSE_HAVE_X86_DISPATCH
  if (have_avx512())
    return change_sum_avx512(pos, old_bits, new_bits, n);
#endif
  return pulse_digest_change_sum_scalar(pos, old_bits, new_bits, n);
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
  pulse_tensor_digest d =
      pulse_digest_change_sum(changes->pos, changes->old_bits, changes->new_bits, changes->count);
  return (pulse_tensor_digest){base.a + d.a, base.b + d.b};
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
