/* test_payload.c - the payload format (docs/formats/loco-payload.md): round trips over
 * sizes, densities, position models and value codings, and hostile bytes:
 * truncation, bad magic and version, out-of-range positions, counts that
 * overflow, flipped bits. A bad payload is an error, never a crash. */
#include "loco_testutil.h"
#include "pulse_loco_elem.h"

#define LOCO_TEST_HDR 56

typedef struct {
  uint64_t P;
  float *theta;
  uint64_t k;
  uint64_t *pos;
  float *val;
} fixture;

/* Entries at density `density` that pass the gate (gated) or are arbitrary
 * finite values (ungated). */
static fixture make_fixture(uint64_t P, double density, int gated,
                            uint64_t seed) {
  fixture f = {P, malloc(P * sizeof(float)), 0,
               malloc(P * sizeof(uint64_t) + 8), malloc(P * sizeof(float) + 4)};
  lt_fill_weights(f.theta, P, seed, 0.3f);
  uint64_t s = seed * 77 + 1;
  for (uint64_t i = 0; i < P; i++) {
    if (pulse_rng_uniform(&s) >= density)
      continue;
    float v = lt_normal(&s) * fabsf(f.theta[i]) * 0x1p-7f;
    if (gated) {
      int tries = 0;
      while (!pulse_loco_gate(f.theta[i], v) && tries++ < 8)
        v *= 2.0f;
      if (!pulse_loco_gate(f.theta[i], v) || !isfinite(v))
        continue;
    } else if (pulse_rng_next(&s) % 10 == 0) {
      /* any finite bits */
      v = lt_float((uint32_t)pulse_rng_next(&s) & 0xFF7FFFFFu);
    }
    f.pos[f.k] = i;
    f.val[f.k++] = v;
  }
  return f;
}

static void free_fixture(fixture *f) {
  free(f->theta), free(f->pos), free(f->val);
}

static pulse_loco_payload_header header(uint32_t flags, uint32_t model,
                                        uint32_t values, uint32_t log2) {
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.flags = flags;
  h.pos_model = model;
  h.values = values;
  h.chunk_log2 = log2;
  h.sender = 3;
  h.round = 17;
  h.samples = 64;
  h.base_digest = 0x1234;
  return h;
}

static pulse_buffer encode(const fixture *f,
                           const pulse_loco_payload_header *h) {
  pulse_buffer out = {NULL, 0};
  cr_assert_eq(pulse_loco_payload_encode(h, f->theta, NULL, f->P, f->pos,
                                         f->val, f->k, &out),
               PULSE_OK, "%s", pulse_error_detail());
  return out;
}

static void check_same(const fixture *f, const pulse_loco_entries *e) {
  cr_assert_eq(e->count, f->k);
  for (uint64_t j = 0; j < f->k; j++) {
    cr_assert_eq(e->pos[j], f->pos[j], "entry %llu", (unsigned long long)j);
    cr_assert_eq(lt_bits(e->val[j]), lt_bits(f->val[j]), "entry %llu value",
                 (unsigned long long)j);
  }
}

Test(loco, payload_round_trips_every_model_coding_and_density) {
  const uint64_t sizes[] = {1, 1000, 5000, 70000};
  const double densities[] = {0.0, 0.001, 0.05, 0.5, 1.0};
  for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
    for (size_t di = 0; di < sizeof densities / sizeof densities[0]; di++)
      for (int gated = 0; gated < 2; gated++) {
        fixture f = make_fixture(sizes[si], densities[di], gated, si * 10 + di);
        const uint32_t models[] = {PULSE_POS_PLAIN, PULSE_POS_CLASS,
                                   PULSE_POS_AUTO};
        for (int m = 0; m < 3; m++)
          for (uint32_t values = 0; values < 2; values++)
            for (uint32_t log2 = 10; log2 <= 20; log2 += 10) {
              pulse_loco_payload_header h =
                  header(gated ? PULSE_LOCO_PAYLOAD_GATED : 0, models[m],
                         values, log2);
              pulse_buffer b = encode(&f, &h);
              pulse_loco_payload_header got;
              pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
              uint16_t *tb = malloc(f.P * 2);
              pulse_bf16_cast_f32(f.theta, tb, f.P);
              /* With and without the receiver's BF16 bits given. */
              for (int given = 0; given < 2; given++) {
                cr_assert_eq(
                    pulse_loco_payload_decode(b.data, b.size, f.theta,
                                              given ? tb : NULL, f.P, &got, &e),
                    PULSE_OK,
                    "P %llu density %g gated %d model %d values %u: %s",
                    (unsigned long long)f.P, densities[di], gated, m, values,
                    pulse_error_detail());
                check_same(&f, &e);
                cr_assert_eq(got.sender, 3u);
                cr_assert_eq(got.round, 17u);
                cr_assert_eq(got.samples, 64u);
                cr_assert_eq(got.base_digest, 0x1234u);
                cr_assert_eq(got.param_count, f.P);
                cr_assert(m == 2 || got.pos_model == models[m]);
              }
              free(tb);
              pulse_loco_entries_free(&e);
              pulse_buffer_free(&b);
            }
        free_fixture(&f);
      }
}

Test(loco, modeled_values_beat_raw_fp32) {
  fixture f = make_fixture(200000, 0.05, 1, 99);
  pulse_loco_payload_header h =
      header(PULSE_LOCO_PAYLOAD_GATED, PULSE_POS_AUTO,
             PULSE_LOCO_VALUES_MODELED, 20);
  pulse_buffer modeled = encode(&f, &h);
  h.values = PULSE_LOCO_VALUES_RAW;
  pulse_buffer raw = encode(&f, &h);
  double per_modeled = (double)modeled.size / (double)f.k;
  cr_assert(modeled.size < raw.size, "modeled %zu vs raw %zu", modeled.size,
            raw.size);
  /* Int32 index + FP32 value is 8 bytes; a gated value and its position must
   * take well under 4.5. */
  cr_assert(per_modeled < 4.5, "%.2f bytes per entry", per_modeled);
  cr_log_info("gated 5%%: %.3f bytes/entry modeled, %.3f raw values",
              per_modeled, (double)raw.size / (double)f.k);
  pulse_buffer_free(&modeled);
  pulse_buffer_free(&raw);
  free_fixture(&f);
}

Test(loco, encoder_refuses_broken_preconditions) {
  fixture f = make_fixture(4000, 0.1, 1, 5);
  cr_assert(f.k > 2);
  pulse_loco_payload_header h =
      header(PULSE_LOCO_PAYLOAD_GATED, PULSE_POS_PLAIN, 1, 10);
  pulse_buffer b = {NULL, 0};
  uint64_t keep = f.pos[1];
  f.pos[1] = f.pos[0]; /* not increasing */
  cr_assert_eq(
      pulse_loco_payload_encode(&h, f.theta, NULL, f.P, f.pos, f.val, f.k, &b),
      PULSE_ERR_ARG);
  f.pos[1] = keep;
  float v = f.val[0];
  f.val[0] = 0.0f; /* fails the gate */
  cr_assert_eq(
      pulse_loco_payload_encode(&h, f.theta, NULL, f.P, f.pos, f.val, f.k, &b),
      PULSE_ERR_ARG);
  f.val[0] = INFINITY;
  h.flags = 0;
  cr_assert_eq(
      pulse_loco_payload_encode(&h, f.theta, NULL, f.P, f.pos, f.val, f.k, &b),
      PULSE_ERR_ARG);
  f.val[0] = v;
  h.samples = 0;
  cr_assert_eq(
      pulse_loco_payload_encode(&h, f.theta, NULL, f.P, f.pos, f.val, f.k, &b),
      PULSE_ERR_ARG);
  cr_assert_null(b.data);
  free_fixture(&f);
}

/* Decodes hostile bytes; returns the status. On success the entries must
 * still keep every promise. */
static pulse_status decode_hostile(const uint8_t *d, size_t n,
                                   const fixture *f) {
  pulse_loco_payload_header h;
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  pulse_status st =
      pulse_loco_payload_decode(d, n, f->theta, NULL, f->P, &h, &e);
  if (st == PULSE_OK) {
    for (uint64_t j = 0; j < e.count; j++) {
      cr_assert(e.pos[j] < f->P && (j == 0 || e.pos[j] > e.pos[j - 1]));
      cr_assert(isfinite(e.val[j]));
    }
  } else {
    cr_assert_eq(e.count, 0u);
    cr_assert_null(e.pos);
  }
  pulse_loco_entries_free(&e);
  return st;
}

Test(loco, payload_truncated_anywhere_is_refused) {
  fixture f = make_fixture(3000, 0.05, 1, 8);
  for (uint32_t values = 0; values < 2; values++) {
    pulse_loco_payload_header h =
        header(PULSE_LOCO_PAYLOAD_GATED, PULSE_POS_CLASS, values, 10);
    pulse_buffer b = encode(&f, &h);
    for (size_t n = 0; n < b.size; n++) {
      uint8_t *cut = malloc(n + 1);
      memcpy(cut, b.data, n);
      pulse_status st = decode_hostile(cut, n, &f);
      cr_assert_neq(st, PULSE_OK, "a payload cut to %zu of %zu bytes decoded",
                    n, b.size);
      free(cut);
    }
    /* One byte more is trailing data. */
    uint8_t *longer = malloc(b.size + 1);
    memcpy(longer, b.data, b.size);
    longer[b.size] = 0;
    cr_assert_eq(decode_hostile(longer, b.size + 1, &f), PULSE_ERR_TRAILING);
    free(longer);
    pulse_buffer_free(&b);
  }
  free_fixture(&f);
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

Test(loco, payload_header_fields_are_checked) {
  fixture f = make_fixture(5000, 0.05, 1, 9);
  pulse_loco_payload_header h =
      header(PULSE_LOCO_PAYLOAD_GATED, PULSE_POS_PLAIN, 1, 10);
  pulse_buffer b = encode(&f, &h);
  uint8_t *d = malloc(b.size);
  struct {
    size_t at;
    uint8_t value;
    pulse_status want;
  } cases[] = {
      {0, 'X', PULSE_ERR_MAGIC}, {4, 2, PULSE_ERR_VERSION},
      {4, 0, PULSE_ERR_VERSION}, {5, 0x80, PULSE_ERR_CORRUPT},
      {6, 2, PULSE_ERR_CORRUPT}, {7, 2, PULSE_ERR_CORRUPT},
      {8, 9, PULSE_ERR_CORRUPT}, {8, 31, PULSE_ERR_CORRUPT},
      {9, 1, PULSE_ERR_CORRUPT}, {11, 1, PULSE_ERR_CORRUPT},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    memcpy(d, b.data, b.size);
    d[cases[c].at] = cases[c].value;
    cr_assert_eq(decode_hostile(d, b.size, &f), cases[c].want,
                 "byte %zu = %u: %s", cases[c].at, cases[c].value,
                 pulse_error_detail());
  }
  /* samples 0; P other than the receiver's; P beyond the limit; count > P. */
  memcpy(d, b.data, b.size);
  put_u64(d + 24, 0);
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_CORRUPT);
  memcpy(d, b.data, b.size);
  put_u64(d + 32, f.P + 1);
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_SIZE_MISMATCH);
  memcpy(d, b.data, b.size);
  put_u64(d + 32, UINT64_MAX);
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_OVERFLOW);
  memcpy(d, b.data, b.size);
  put_u64(d + 48, f.P + 1);
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_OVERFLOW);
  memcpy(d, b.data, b.size);
  put_u64(d + 48, f.k + 1); /* the chunks hold fewer */
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_CORRUPT);
  memcpy(d, b.data, b.size);
  put_u64(d + 48, UINT64_MAX);
  cr_assert_eq(decode_hostile(d, b.size, &f), PULSE_ERR_OVERFLOW);
  free(d);
  pulse_buffer_free(&b);
  free_fixture(&f);
}

/* A chunk table entry claiming more entries than its chunk has elements:
 * positions that would fall outside the chunk. Built by hand. */
Test(loco, chunk_claiming_more_entries_than_elements_is_refused) {
  float theta[1024];
  for (int i = 0; i < 1024; i++)
    theta[i] = 1.0f;
  uint8_t d[LOCO_TEST_HDR + 16];
  memset(d, 0, sizeof d);
  d[0] = 'P', d[1] = 'L', d[2] = 'C', d[3] = 'O';
  d[4] = 1, d[5] = 0, d[6] = 0, d[7] = 0, d[8] = 10;
  put_u64(d + 24, 1);    /* samples */
  put_u64(d + 32, 1024); /* P */
  put_u64(d + 48, 1024); /* count */
  /* chunk 0: 1025 entries as a varint */
  d[56] = 0x81, d[57] = 0x08, d[58] = 0, d[59] = 0;
  fixture f = {1024, theta, 0, NULL, NULL};
  cr_assert_eq(decode_hostile(d, 60, &f), PULSE_ERR_CORRUPT);
  /* 1024 entries with empty streams: the position coder must refuse. */
  d[56] = 0x80, d[57] = 0x08, d[58] = 0, d[59] = 0;
  cr_assert_neq(decode_hostile(d, 60, &f), PULSE_OK);
  /* A non-minimal varint is refused too. */
  d[56] = 0x80, d[57] = 0x00;
  cr_assert_neq(decode_hostile(d, 60, &f), PULSE_OK);
}

Test(loco, flipped_bits_never_crash) {
  fixture f = make_fixture(6000, 0.05, 1, 21);
  for (uint32_t model = 0; model < 2; model++) {
    pulse_loco_payload_header h =
        header(PULSE_LOCO_PAYLOAD_GATED, model, 1, 10);
    pulse_buffer b = encode(&f, &h);
    uint8_t *d = malloc(b.size);
    size_t refused = 0, tried = 0;
    for (size_t at = 0; at < b.size; at++)
      for (int bit = 0; bit < 8; bit += 3) {
        memcpy(d, b.data, b.size);
        d[at] ^= (uint8_t)(1u << bit);
        refused += decode_hostile(d, b.size, &f) != PULSE_OK;
        tried++;
      }
    /* The gate check and exact stream ends catch nearly every flip. */
    cr_assert(refused * 10 > tried * 9, "only %zu of %zu flips refused",
              refused, tried);
    free(d);
    pulse_buffer_free(&b);
  }
  free_fixture(&f);
}

Test(loco, values_that_fail_the_gate_are_refused) {
  /* An ungated payload relabelled as gated: its deltas are placeholders. */
  fixture f = make_fixture(3000, 0.05, 0, 31);
  pulse_loco_payload_header h = header(0, PULSE_POS_PLAIN, 1, 10);
  pulse_buffer b = encode(&f, &h);
  b.data[5] = PULSE_LOCO_PAYLOAD_GATED;
  cr_assert_eq(decode_hostile(b.data, b.size, &f), PULSE_ERR_CORRUPT);
  pulse_buffer_free(&b);
  free_fixture(&f);
}
