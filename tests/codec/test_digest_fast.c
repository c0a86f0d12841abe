/* The vectorised digest loops (AVX-512 where the CPU has it) give exactly
 * the scalar sums: full tensors of every length around the vector widths,
 * ranges at their positions (which add up to the whole), and the
 * change-list sums apply uses. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "digest_impl.h"

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
  return *s;
}

Test(digest, fast_full_digest_matches_the_scalar_loop) {
  uint64_t s = 7;
  uint16_t *bits = malloc(70000 * 2);
  cr_assert(bits);
  for (int i = 0; i < 70000; i++)
    bits[i] = (uint16_t)rng(&s);
  for (uint64_t n = 0; n < 70; n++) {
    pulse_tensor_digest f = pulse_digest_bf16(bits + n % 3, n);
    pulse_tensor_digest r = pulse_digest_bf16_scalar(bits + n % 3, n);
    cr_assert(f.a == r.a && f.b == r.b, "n %llu", (unsigned long long)n);
  }
  pulse_tensor_digest f = pulse_digest_bf16(bits, 70000), r = pulse_digest_bf16_scalar(bits, 70000);
  cr_assert(f.a == r.a && f.b == r.b);
  free(bits);
}

/* Ranges at their true positions add up to the whole tensor's digest, fast
 * and scalar alike (threads each take a range). */
Test(digest, ranges_add_up_to_the_whole_digest) {
  uint64_t s = 11;
  const uint64_t n = 50000;
  uint16_t *bits = malloc(n * 2);
  cr_assert(bits);
  for (uint64_t i = 0; i < n; i++)
    bits[i] = (uint16_t)rng(&s);
  pulse_tensor_digest whole = pulse_digest_bf16_scalar(bits, n);
  for (int trial = 0; trial < 20; trial++) {
    pulse_tensor_digest sum = {0, 0}, sum_scalar = {0, 0};
    for (uint64_t at = 0; at < n;) {
      uint64_t len = 1 + rng(&s) % 9000;
      if (len > n - at)
        len = n - at;
      pulse_tensor_digest d = pulse_digest_bf16_at(bits + at, len, at);
      pulse_tensor_digest r = pulse_digest_bf16_scalar_at(bits + at, len, at);
      cr_assert(d.a == r.a && d.b == r.b, "range at %llu", (unsigned long long)at);
      sum.a += d.a, sum.b += d.b;
      sum_scalar.a += r.a, sum_scalar.b += r.b;
      at += len;
    }
    cr_assert(sum.a == whole.a && sum.b == whole.b, "trial %d", trial);
    cr_assert(sum_scalar.a == whole.a && sum_scalar.b == whole.b, "trial %d", trial);
  }
  free(bits);
}

Test(digest, fast_change_sum_matches_the_scalar_loop) {
  uint64_t s = 11;
  enum { N = 1000 };
  uint64_t pos[N];
  uint16_t old[N], nw[N];
  for (int i = 0; i < N; i++) {
    pos[i] = rng(&s) >> 20; /* indices up to 2^44 */
    old[i] = (uint16_t)rng(&s);
    nw[i] = (uint16_t)rng(&s);
  }
  for (uint64_t n = 0; n <= N; n += n < 40 ? 1 : 97) {
    pulse_tensor_digest f = pulse_digest_change_sum(pos, old, nw, n);
    pulse_tensor_digest r = pulse_digest_change_sum_scalar(pos, old, nw, n);
    cr_assert(f.a == r.a && f.b == r.b, "n %llu", (unsigned long long)n);
  }
}
