/* fuzz_chunk_v3.c - libFuzzer target for the v3 chunk coding
 * (codec/coding/chunk_v3_impl.h). The first byte picks a mode:
 *
 * even: hostile bytes. Bytes 1-2 give n - 1, bytes 3-4 k - 1 (mod n), then a
 *   serialized value model (pulse_v3_model_read says where it ends), then
 *   the chunk stream. When both parse, the decoded ranks must be inside n
 *   and increasing within each class; re-encoding them against the same
 *   model must decode to the same ranks and deltas.
 * odd: a chunk built from the bytes (base bits, which elements change, by
 *   how much), its model, encode, decode: the same changes must come back.
 *
 * Besides memory errors (ASan/UBSan) it traps on a broken promise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "pulse_elem.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_chunk_v3: %s failed at line %d\n", #cond,          \
              __LINE__);                                                       \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

#define N_MAX 16384u

static uint32_t rank_[N_MAX], rank2[N_MAX], order[N_MAX],
    start[PULSE_CLASS_COUNT + 1], start2[PULSE_CLASS_COUNT + 1], pos[N_MAX],
    hist[PULSE_CLASS_COUNT];
static uint16_t delta[N_MAX], delta2[N_MAX], cdelta[N_MAX], base[N_MAX];
static uint8_t cls[N_MAX];

/* Re-encodes a class-major decode (ranks, deltas) and checks it comes back. */
static void reencode(const pulse_v3_model *m, uint32_t n, uint32_t k) {
  /* class-major is a valid change order for the encoder, which groups by
   * class and keeps rank order within each */
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    for (uint32_t t = start[c]; t < start[c + 1]; t++)
      cls[t] = (uint8_t)c;
  pulse_bytebuf s = {0};
  CHECK(pulse_chunk3_encode_ranks(m, k, cls, rank_, delta, &s, NULL) ==
        PULSE_OK);
  CHECK(pulse_chunk3_decode_ranks(m, NULL, n, s.data, s.size, k, start2, rank2,
                                  delta2) == PULSE_OK);
  CHECK(memcmp(start, start2, sizeof start) == 0);
  CHECK(memcmp(rank_, rank2, k * sizeof *rank_) == 0);
  CHECK(memcmp(delta, delta2, k * sizeof *delta) == 0);
  pulse_bytebuf_free(&s);
}

static void hostile(const uint8_t *data, size_t size) {
  if (size < 5)
    return;
  uint32_t n = 1u + (data[1] | (uint32_t)data[2] << 8);
  uint32_t k = 1u + (data[3] | (uint32_t)data[4] << 8) % n;
  pulse_v3_model *m;
  size_t used;
  if (pulse_v3_model_read(data + 5, size - 5, &used, &m) != PULSE_OK)
    return;
  CHECK(used <= size - 5);
  const uint8_t *s = data + 5 + used;
  size_t ss = size - 5 - used;
  if (pulse_chunk3_decode_ranks(m, NULL, n, s, ss, k, start, rank_, delta) ==
      PULSE_OK) {
    CHECK(start[0] == 0 && start[PULSE_CLASS_COUNT] == k);
    for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
      for (uint32_t t = start[c]; t < start[c + 1]; t++) {
        CHECK(rank_[t] < n);
        CHECK(t == start[c] || rank_[t] > rank_[t - 1]);
        CHECK(delta[t] != 0);
      }
    reencode(m, n, k);
  }
  pulse_v3_model_free(m);
}

static void built(const uint8_t *data, size_t size) {
  if (size < 4)
    return;
  uint32_t n = 1u + (data[1] | (uint32_t)data[2] << 8) % N_MAX;
  uint8_t rate = data[3];
  data += 4, size -= 4;
  uint32_t k = 0;
  for (uint32_t i = 0; i < n; i++) {
    uint8_t b = size ? data[i % size] : 0;
    uint8_t b2 = size ? data[(i * 7u + 3u) % size] : 0;
    base[i] = (uint16_t)(b << 7 ^ b2 ^ i >> 3);
    if ((uint8_t)(b2 + i) < rate) {
      pos[k] = i;
      uint16_t d = (uint16_t)(b * 257u + (b2 & 7u) - 128u * (b2 >> 7));
      delta[k++] = d ? d : 1u;
    }
  }
  if (k == 0)
    return;
  pulse_chunk_classify(base, n, pos, k, hist, rank_, cls);
  pulse_v3_counts *counts = calloc(1, sizeof *counts);
  CHECK(counts != NULL);
  pulse_v3_count(counts, cls, delta, k);
  pulse_v3_model *m;
  CHECK(pulse_v3_model_build(counts, &m) == PULSE_OK);
  free(counts);
  pulse_bytebuf s = {0};
  CHECK(pulse_chunk3_encode_ranks(m, k, cls, rank_, delta, &s, NULL) ==
        PULSE_OK);
  CHECK(pulse_chunk3_decode_ranks(m, hist, n, s.data, s.size, k, start, rank2,
                                  delta2) == PULSE_OK);
  uint32_t kc[PULSE_CLASS_COUNT] = {0};
  pulse_chunk_class_order(k, cls, kc, start2, order);
  CHECK(memcmp(start, start2, sizeof start) == 0);
  for (uint32_t t = 0; t < k; t++) {
    cdelta[t] = delta[order[t]];
    CHECK(rank2[t] == rank_[order[t]]);
  }
  CHECK(memcmp(cdelta, delta2, k * sizeof *delta2) == 0);
  pulse_bytebuf_free(&s);
  pulse_v3_model_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] & 1u)
    built(data, size);
  else
    hostile(data, size);
  return 0;
}
