/* fuzz_loco_chunk.c - libFuzzer target for the PULSELoCo chunk decoder and
 * the inbox a trainer feeds with every datagram it receives (docs/formats/loco-payload.md
 * "Chunks"). The input is a sequence of datagrams, each a 2-byte
 * little-endian length then its bytes, offered to the inbox of a prepared
 * round of P_FUZZ parameters (members 1, 2, 3; this trainer 0, round 0).
 *
 * Besides memory errors (ASan/UBSan) it traps on broken promises: a chunk
 * that decodes with positions outside its range or not increasing, a
 * non-finite value, a gated entry that fails the gate; an inbox whose
 * counters do not add up to the datagrams offered; a finish that fails or
 * leaves a non-finite weight.
 *
 * Seeds: build this file alone with -DLOCO_FUZZ_MAKE_SEEDS and run it with
 * the corpus folder as argument (see the end of the file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_loco.h"
#include "pulse_loco_elem.h"
#include "rng_impl.h"

#define P_FUZZ 1000u
#define MAX_ENTRIES (64u * PULSE_LOCO_CHUNK_CELL)

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_loco_chunk: %s failed at line %d\n", #cond,        \
              __LINE__);                                                       \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

/* theta_g of the round (the seed writer uses the same). */
static void make_theta(float *theta) {
  uint64_t rng = 3;
  for (uint32_t i = 0; i < P_FUZZ; i++) {
    uint64_t z = pulse_rng_next(&rng);
    theta[i] = (z & 15u) == 0 ? 0.0f : ((float)(z >> 40) * 0x1p-23f - 1.0f);
  }
}

static pulse_loco *make_round(const float *theta) {
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = P_FUZZ;
  o.trainer_id = 0;
  pulse_loco *ctx = NULL;
  CHECK(pulse_loco_create(&o, theta, &ctx) == PULSE_OK);
  float local[P_FUZZ];
  for (uint32_t i = 0; i < P_FUZZ; i++)
    local[i] = theta[i] * 0.99f;
  CHECK(pulse_loco_prepare(ctx, local, 10, 0, NULL, NULL, NULL) == PULSE_OK);
  return ctx;
}

static void check_decode(const float *theta, const uint8_t *d, size_t n) {
  static uint64_t pos[MAX_ENTRIES];
  static float val[MAX_ENTRIES];
  pulse_loco_chunk_header h;
  if (pulse_loco_chunk_decode(d, n, theta, P_FUZZ, &h, pos, val) != PULSE_OK)
    return;
  CHECK(h.length > 0 && h.start + h.length <= P_FUZZ && h.count <= h.length);
  for (uint32_t j = 0; j < h.count; j++) {
    CHECK(pos[j] >= h.start && pos[j] < h.start + h.length);
    CHECK(j == 0 || pos[j] > pos[j - 1]);
    CHECK(isfinite(val[j]));
    if (h.flags & PULSE_LOCO_PAYLOAD_GATED)
      CHECK(pulse_loco_gate(theta[pos[j]], val[j]));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static float theta[P_FUZZ];
  static int ready;
  if (!ready)
    make_theta(theta), ready = 1;
  pulse_loco *ctx = make_round(theta);
  static const uint32_t members[] = {0, 1, 2, 3};
  pulse_loco_inbox *in = NULL;
  CHECK(pulse_loco_inbox_create(ctx, members, 4, &in) == PULSE_OK);
  uint64_t offered = 0;
  while (size >= 2) {
    size_t n = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2, size -= 2;
    if (n > size)
      n = size;
    check_decode(theta, data, n);
    pulse_loco_inbox_add(in, data, n);
    offered++;
    data += n, size -= n;
  }
  pulse_loco_inbox_figures st;
  pulse_loco_inbox_figures_get(in, &st);
  CHECK(st.accepted + st.truncated + st.bad_checksum + st.malformed +
            st.unknown_sender + st.other_round + st.other_base +
            st.duplicate ==
        offered);
  CHECK(pulse_loco_finish_inbox(ctx, in, NULL, NULL) == PULSE_OK);
  const float *g = pulse_loco_global(ctx);
  for (uint32_t i = 0; i < P_FUZZ; i++)
    CHECK(isfinite(g[i]));
  pulse_loco_inbox_free(in);
  pulse_loco_free(ctx);
  return 0;
}

#ifdef LOCO_FUZZ_MAKE_SEEDS
/* cc -DLOCO_FUZZ_MAKE_SEEDS -Iloco -Icodec tests/fuzz/fuzz_loco_chunk.c \
 *    build/loco/libpulse_loco.a build/inference_side/libpulse_inference.a \
 *    build/trainer_side/libpulse_trainer.a build/cuda/libpulse_cuda.a \
 *    build/codec/libpulse_codec.a ... && ./a.out tests/fuzz/corpus/loco_chunk
 * (or: any test binary that links pulse_loco; the seeds are the chunks of
 * one member's round, framed as the fuzzer reads them). */
int main(int argc, char **argv) {
  if (argc != 2)
    return 2;
  float theta[P_FUZZ];
  make_theta(theta);
  pulse_loco *ctx = make_round(theta);
  uint64_t pos[P_FUZZ], k = 0;
  float val[P_FUZZ];
  for (uint32_t i = 0; i < P_FUZZ; i += 3) {
    float v = theta[i] * 0x1p-6f + 0x1p-20f;
    if (!pulse_loco_gate(theta[i], v))
      continue;
    pos[k] = i, val[k++] = v;
  }
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.flags = PULSE_LOCO_PAYLOAD_GATED;
  h.sender = 2;
  h.samples = 10;
  h.base_digest = pulse_loco_global_digest(ctx);
  pulse_buffer b;
  CHECK(pulse_loco_chunks_encode(&h, P_FUZZ, pos, val, k, 1200, &b, NULL) ==
        PULSE_OK);
  char path[1024];
  snprintf(path, sizeof path, "%s/member_round", argv[1]);
  FILE *f = fopen(path, "wb");
  CHECK(f != NULL);
  size_t at = 0;
  while (at < b.size) {
    size_t cs;
    CHECK(pulse_loco_chunk_size(b.data + at, b.size - at, &cs) == PULSE_OK);
    uint8_t len[2] = {(uint8_t)cs, (uint8_t)(cs >> 8)};
    fwrite(len, 1, 2, f);
    fwrite(b.data + at, 1, cs, f);
    at += cs;
  }
  fclose(f);
  pulse_buffer_free(&b);
  pulse_loco_free(ctx);
  return 0;
}
#endif
