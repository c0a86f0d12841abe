/* test_sha256.c - a SHA-256 whose state travels (pulse_sha256.h): split at
 * any point, its state copied byte for byte into another struct (as it
 * would arrive from another process) and continued there, it gives the
 * one-shot SHA-256 of the whole; a chain over several parts too; a state
 * that is not one (never begun, ended, damaged) is refused, unchanged. */
#define OPENSSL_SUPPRESS_DEPRECATED /* SHA256_CTX's layout, as the library's   \
                                     */
#include <openssl/sha.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "pulse_sha256.h"
#include "store_impl.h"

enum { DATA_BYTES = 1000 };

static void fill(uint8_t *data, size_t n, unsigned seed) {
  srand(seed);
  for (size_t i = 0; i < n; i++)
    data[i] = (uint8_t)rand();
}

/* The SHA-256 of data hashed as data[0, split) in one state, then the
 * state's bytes copied into a fresh struct that goes on with the rest. */
static void split_hash(const uint8_t *data, size_t n, size_t split,
                       uint8_t out[32]) {
  pulse_sha256_state first, second;
  pulse_sha256_begin(&first);
  cr_assert_eq(pulse_sha256_add(&first, data, split), PULSE_OK);
  uint8_t wire[sizeof first.bytes];
  memcpy(wire, first.bytes, sizeof wire); /* what a process would send */
  memset(&first, 0xA5, sizeof first);     /* the sender's copy is gone */
  memcpy(second.bytes, wire, sizeof wire);
  cr_assert_eq(pulse_sha256_add(&second, data + split, n - split), PULSE_OK);
  cr_assert_eq(pulse_sha256_end(&second, out), PULSE_OK);
}

Test(sha256, a_state_copied_at_any_split_gives_the_one_shot_digest) {
  uint8_t data[DATA_BYTES], want[32], got[32];
  fill(data, sizeof data, 7);
  store_sha256(data, sizeof data, want);
  size_t splits[] = {0, 1, 63, 64, 65, 127, 128, DATA_BYTES - 1, DATA_BYTES};
  for (size_t i = 0; i < sizeof splits / sizeof *splits; i++) {
    split_hash(data, sizeof data, splits[i], got);
    cr_assert_arr_eq(got, want, 32, "split at %zu", splits[i]);
  }
  srand(11);
  for (int i = 0; i < 50; i++) {
    size_t split = (size_t)rand() % (DATA_BYTES + 1);
    split_hash(data, sizeof data, split, got);
    cr_assert_arr_eq(got, want, 32, "split at %zu", split);
  }
}

Test(sha256, a_chain_over_parts_gives_the_digest_of_their_concatenation) {
  uint8_t data[DATA_BYTES], want[32], got[32];
  fill(data, sizeof data, 3);
  store_sha256(data, sizeof data, want);
  /* Parts of uneven sizes, each hashed from a copy of the previous state. */
  size_t bounds[] = {0, 10, 74, 74, 200, 511, 777, DATA_BYTES};
  pulse_sha256_state s;
  pulse_sha256_begin(&s);
  for (size_t k = 0; k + 1 < sizeof bounds / sizeof *bounds; k++) {
    pulse_sha256_state next;
    memcpy(&next, &s, sizeof s);
    cr_assert_eq(
        pulse_sha256_add(&next, data + bounds[k], bounds[k + 1] - bounds[k]),
        PULSE_OK);
    s = next;
  }
  cr_assert_eq(pulse_sha256_end(&s, got), PULSE_OK);
  cr_assert_arr_eq(got, want, 32);
  /* The empty input, too. */
  uint8_t none_want[32];
  store_sha256("", 0, none_want);
  pulse_sha256_begin(&s);
  cr_assert_eq(pulse_sha256_add(&s, NULL, 0), PULSE_OK);
  cr_assert_eq(pulse_sha256_end(&s, got), PULSE_OK);
  cr_assert_arr_eq(got, none_want, 32);
}

Test(sha256, a_state_that_is_not_one_is_refused_and_left_unchanged) {
  uint8_t data[100], out[32];
  fill(data, sizeof data, 5);
  pulse_sha256_state zero;
  memset(&zero, 0, sizeof zero); /* never begun */
  cr_assert_eq(pulse_sha256_add(&zero, data, sizeof data), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_sha256_end(&zero, out), PULSE_ERR_CORRUPT);

  pulse_sha256_state s;
  pulse_sha256_begin(&s);
  cr_assert_eq(pulse_sha256_add(&s, data, 10), PULSE_OK);
  pulse_sha256_state damaged = s;
  damaged.bytes[PULSE_SHA256_STATE_BYTES - 1] ^= 1; /* the tag */
  pulse_sha256_state before = damaged;
  cr_assert_eq(pulse_sha256_add(&damaged, data, 10), PULSE_ERR_CORRUPT);
  cr_assert_arr_eq(damaged.bytes, before.bytes, sizeof before.bytes);
  /* The count of bytes waiting in the block (OpenSSL's num): an index
   * into a 64-byte buffer, so a value past it would overrun. */
  damaged = s;
  memset(damaged.bytes + offsetof(SHA256_CTX, num), 0xFF, sizeof(unsigned));
  cr_assert_eq(pulse_sha256_add(&damaged, data, 10), PULSE_ERR_CORRUPT);

  cr_assert_eq(pulse_sha256_end(&s, out), PULSE_OK);
  cr_assert_eq(pulse_sha256_add(&s, data, 10), PULSE_ERR_CORRUPT,
               "an ended state went on");
  cr_assert_eq(pulse_sha256_end(&s, out), PULSE_ERR_CORRUPT);
  cr_assert_eq(pulse_sha256_add(NULL, data, 1), PULSE_ERR_ARG);
  pulse_sha256_begin(&s);
  cr_assert_eq(pulse_sha256_add(&s, NULL, 1), PULSE_ERR_ARG);
}
