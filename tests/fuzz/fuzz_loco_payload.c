/* fuzz_loco_payload.c - libFuzzer target for what a PULSELoCo trainer reads
 * from its peers (docs/formats/loco-payload.md), chosen by the input's first bytes:
 *   "PLCO..."  a round payload, decoded against a deterministic theta_g of
 *              the header's parameter count (at most MAX_P)
 *   "PLCS..."  a global state, imported into a context of its size
 *   "{..."     a round manifest or membership view (JSON)
 *
 * Besides memory errors (ASan/UBSan) it traps on broken promises: a decoded
 * payload whose positions are out of range or not increasing, a non-finite
 * value, a gated entry that fails the gate, a decode that does not survive
 * re-encoding, a failed import that changed the context, a manifest that
 * does not read back the same.
 *
 * Seeds: build this file alone with -DLOCO_FUZZ_MAKE_SEEDS and run it with
 * the corpus folder as argument (see the end of the file). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../loco/transport/manifest_impl.h"
#include "pulse_loco.h"
#include "pulse_loco_elem.h"
#include "rng_impl.h"

#define MAX_P (1u << 18)

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "fuzz_loco_payload: %s failed at line %d\n", #cond,      \
              __LINE__);                                                       \
      __builtin_trap();                                                        \
    }                                                                          \
  } while (0)

/* The receiver's theta_g for P parameters: weights of a few scales, some
 * exact zeros; the same in the seed writer and the fuzzer. */
static void make_theta(float *theta, uint64_t P) {
  uint64_t rng = 0;
  for (uint64_t i = 0; i < P; i++) {
    uint64_t z = pulse_rng_next(&rng);
    float u = (float)(z >> 40) * 0x1p-23f - 1.0f;
    theta[i] = (z & 15u) == 0 ? 0.0f : u * ((z & 16u) ? 0.05f : 1.5f);
  }
}

static uint64_t le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

static void fuzz_payload(const uint8_t *data, size_t size) {
  pulse_loco_payload_header h;
  if (pulse_loco_payload_peek(data, size, &h) != PULSE_OK ||
      h.param_count > MAX_P)
    return;
  uint64_t P = h.param_count;
  float *theta = malloc(P * sizeof *theta);
  CHECK(theta != NULL);
  make_theta(theta, P);
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  pulse_loco_payload_header got;
  pulse_status st =
      pulse_loco_payload_decode(data, size, theta, NULL, P, &got, &e);
  if (st != PULSE_OK) {
    CHECK(e.count == 0 && e.pos == NULL && e.val == NULL);
    free(theta);
    return;
  }
  CHECK(got.count == e.count && got.param_count == P);
  int gated = (got.flags & PULSE_LOCO_PAYLOAD_GATED) != 0;
  for (uint64_t j = 0; j < e.count; j++) {
    CHECK(e.pos[j] < P && (j == 0 || e.pos[j] > e.pos[j - 1]));
    CHECK(isfinite(e.val[j]));
    CHECK(!gated || pulse_loco_gate(theta[e.pos[j]], e.val[j]));
  }
  /* What decodes, encodes again, and decodes to the same entries. */
  pulse_buffer again = {NULL, 0};
  CHECK(pulse_loco_payload_encode(&got, theta, NULL, P, e.pos, e.val, e.count,
                                  &again) == PULSE_OK);
  pulse_loco_entries e2 = PULSE_LOCO_ENTRIES_INIT;
  pulse_loco_payload_header h2;
  CHECK(pulse_loco_payload_decode(again.data, again.size, theta, NULL, P, &h2,
                                  &e2) == PULSE_OK);
  CHECK(e2.count == e.count);
  CHECK(e.count == 0 || memcmp(e2.pos, e.pos, e.count * sizeof *e.pos) == 0);
  CHECK(e.count == 0 || memcmp(e2.val, e.val, e.count * sizeof *e.val) == 0);
  pulse_loco_entries_free(&e2);
  pulse_buffer_free(&again);
  pulse_loco_entries_free(&e);
  free(theta);
}

static void fuzz_state(const uint8_t *data, size_t size) {
  if (size < 24)
    return;
  uint64_t P = le64(data + 16);
  if (P == 0 || P > MAX_P)
    return;
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = P;
  pulse_loco *ctx = NULL;
  CHECK(pulse_loco_create(&o, NULL, &ctx) == PULSE_OK);
  uint64_t before = pulse_loco_global_digest(ctx);
  if (pulse_loco_state_import(ctx, data, size, NULL) != PULSE_OK) {
    CHECK(pulse_loco_global_digest(ctx) == before &&
          pulse_loco_round(ctx) == 0);
  } else {
    /* An imported state exports to the same bytes. */
    pulse_buffer out = {NULL, 0};
    CHECK(pulse_loco_state_export(ctx, &out) == PULSE_OK);
    CHECK(out.size == size && memcmp(out.data, data, size) == 0);
    pulse_buffer_free(&out);
  }
  pulse_loco_free(ctx);
}

static void fuzz_manifest(const uint8_t *data, size_t size) {
  loco_manifest m;
  if (loco_manifest_parse(data, size, &m) != PULSE_OK)
    return;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  CHECK(loco_manifest_write(&m, &b) == PULSE_OK);
  loco_manifest m2;
  CHECK(loco_manifest_parse(b.data, b.size, &m2) == PULSE_OK);
  CHECK(m2.round == m.round && m2.coordinator == m.coordinator);
  CHECK(m2.nmembers == m.nmembers && m2.ncontrib == m.ncontrib);
  CHECK(m.nmembers == 0 ||
        memcmp(m2.members, m.members, m.nmembers * sizeof *m.members) == 0);
  CHECK(m.ncontrib == 0 ||
        memcmp(m2.contrib, m.contrib, m.ncontrib * sizeof *m.contrib) == 0);
  /* A member's URL is a plain one or, for a client, hosted under its own
   * id (loco_member_url_valid). */
  for (size_t i = 0; i < m.nmembers; i++)
    CHECK(loco_member_url_valid(m.members[i].url, m.members[i].id));
  loco_manifest_free(&m2);
  loco_manifest_free(&m);
  pulse_bytebuf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size >= 4 && memcmp(data, "PLCS", 4) == 0)
    fuzz_state(data, size);
  else if (size >= 1 && data[0] == '{')
    fuzz_manifest(data, size);
  else
    fuzz_payload(data, size);
  return 0;
}

#ifdef LOCO_FUZZ_MAKE_SEEDS
/* cc -DLOCO_FUZZ_MAKE_SEEDS -Iloco -Icodec tests/fuzz/fuzz_loco_payload.c \
 *    build/loco/libpulse_loco.a build/codec/libpulse_codec.a -lzstd -lcrypto
 * -lm -lpthread \
 *    && ./a.out tests/fuzz/corpus/loco_payload */
static void write_seed(const char *dir, const char *name, const void *data,
                       size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL || fwrite(data, 1, size, f) != size)
    exit(1);
  fclose(f);
}

static void payload_seed(const char *dir, const char *name, uint64_t P,
                         int gated, uint32_t model, uint32_t values,
                         uint32_t log2, unsigned every) {
  float *theta = malloc(P * sizeof *theta), *val = malloc(P * sizeof *val);
  uint64_t *pos = malloc(P * sizeof *pos), k = 0;
  make_theta(theta, P);
  for (uint64_t i = 0; i < P; i += every) {
    float v = theta[i] * 0x1p-6f + 0x1p-20f;
    if (gated && !pulse_loco_gate(theta[i], v))
      continue;
    pos[k] = i;
    val[k++] = v;
  }
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.flags = gated ? PULSE_LOCO_PAYLOAD_GATED : 0;
  h.pos_model = model;
  h.values = values;
  h.chunk_log2 = log2;
  h.sender = 2;
  h.round = 5;
  h.samples = 640;
  h.base_digest = pulse_loco_digest_f32(theta, P);
  pulse_buffer b = {NULL, 0};
  if (pulse_loco_payload_encode(&h, theta, NULL, P, pos, val, k, &b) !=
      PULSE_OK)
    exit(1);
  write_seed(dir, name, b.data, b.size);
  pulse_buffer_free(&b);
  free(theta), free(val), free(pos);
}

int main(int argc, char **argv) {
  const char *dir = argc > 1 ? argv[1] : ".";
  payload_seed(dir, "gated_class_modeled", 3000, 1, PULSE_POS_CLASS, 1, 10, 7);
  payload_seed(dir, "gated_plain_modeled", 3000, 1, PULSE_POS_PLAIN, 1, 10, 13);
  payload_seed(dir, "gated_class_raw", 2500, 1, PULSE_POS_CLASS, 0, 10, 5);
  payload_seed(dir, "ungated_dense_raw", 1500, 0, PULSE_POS_PLAIN, 0, 10, 1);
  payload_seed(dir, "ungated_modeled_chunks", 5000, 0, PULSE_POS_CLASS, 1, 10,
               3);
  payload_seed(dir, "empty", 1200, 1, PULSE_POS_PLAIN, 1, 20, 100000);
  float theta[100];
  make_theta(theta, 100);
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = 100;
  pulse_loco *ctx = NULL;
  pulse_buffer st = {NULL, 0};
  if (pulse_loco_create(&o, theta, &ctx) != PULSE_OK ||
      pulse_loco_state_export(ctx, &st) != PULSE_OK)
    return 1;
  write_seed(dir, "state_100", st.data, st.size);
  const char *man =
      "{\"round\":7,\"coordinator\":1,\"contributors\":[{\"id\":1,\"bytes\":"
      "120,\"sha256\":"
      "\"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\"},{"
      "\"id\":4,"
      "\"bytes\":99,\"sha256\":"
      "\"ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"
      "\"}],\"members\":[{\"id\":1,\"url\":\"http://"
      "127.0.0.1:4000\"},{\"id\":4,\"url\":"
      "\"http://127.0.0.1:4001\"}]}";
  write_seed(dir, "manifest", man, strlen(man));
  const char *view =
      "{\"round\":3,\"coordinator\":0,\"members\":[{\"id\":0,\"url\":"
      "\"http://127.0.0.1:80\"}]}";
  write_seed(dir, "view", view, strlen(view));
  pulse_buffer_free(&st);
  pulse_loco_free(ctx);
  return 0;
}
#endif
