/* fuzz_sections.c - libFuzzer target for a patch's section index
 * (codec/store/store_sections.c): the index a worker fetches to take only
 * its tensors' sections of a patch is untrusted bytes.
 *
 * Input: one byte that picks the case, then the bytes.
 *   0: the bytes as an index: parsed (no crash; a parsed index has the
 *      size its count says).
 *   1: the bytes as a patch: when it opens, its unsigned index is built,
 *      must parse, must check against the patch, and its sections' offsets
 *      increase from the header and table to the patch's end; the same
 *      index must refuse the patch with one byte changed.
 * Corpus: tests/fuzz/corpus/sections (patches from make_patch_corpus, case
 * 1). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "store_impl.h"
#include "store_sections_impl.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void as_index(const uint8_t *data, size_t size) {
  store_sections s;
  if (store_sections_parse(data, size, &s) == PULSE_OK)
    CHECK(store_sections_size(s.count) == size);
  store_sections_free(&s);
}

static void as_patch(const uint8_t *data, size_t size) {
  pulse_patch *p = NULL;
  if (size > ((size_t)1 << 22) || pulse_patch_open(data, size, &p) != PULSE_OK)
    return;
  uint8_t sha[32];
  store_sha256(data, size, sha);
  pulse_buffer idx = {NULL, 0};
  if (store_sections_build(data, size, sha, NULL, &idx) == PULSE_OK) {
    store_sections s;
    CHECK(store_sections_parse(idx.data, idx.size, &s) == PULSE_OK);
    CHECK(!s.is_signed && s.patch_size == size);
    CHECK(store_sections_check_patch(&s, data, size) == PULSE_OK);
    uint64_t *off = malloc(((size_t)s.count + 1) * sizeof *off);
    CHECK(off != NULL);
    if (store_sections_offsets(p, s.prefix, off) == PULSE_OK) {
      CHECK(off[0] == s.prefix && off[s.count] == size);
      for (uint64_t i = 0; i < s.count; i++)
        CHECK(off[i] <= off[i + 1]);
    }
    free(off);
    /* One byte changed: the index refuses the patch (its SHA-256 alone
     * differs, and a prefix or section hash with it). */
    uint8_t *bad = malloc(size);
    CHECK(bad != NULL);
    memcpy(bad, data, size);
    bad[size / 2] ^= 0x5a;
    CHECK(store_sections_check_patch(&s, bad, size) != PULSE_OK);
    free(bad);
    store_sections_free(&s);
    pulse_buffer_free(&idx);
  }
  pulse_patch_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  if (data[0] & 1)
    as_patch(data + 1, size - 1);
  else
    as_index(data + 1, size - 1);
  return 0;
}
