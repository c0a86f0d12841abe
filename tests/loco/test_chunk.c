/* test_chunk.c - PULSELoCo payloads as datagram-sized chunks (docs/formats/loco-payload.md
 * "Chunks"): they round-trip and cover every cell once; with every chunk
 * arriving the round ends with the same bits as the whole-payload round;
 * a lost chunk takes out exactly its sender's range (per-cell means over
 * who arrived); truncated, duplicated, unknown-sender, other-round,
 * other-base and bit-flipped chunks are refused, counted, and change
 * nothing; reordered chunks give the same result; between re-syncs the
 * gate is skipped exactly where a side flags its range drifted, and the
 * base checked is the reference's. */
#include "loco_testutil.h"

#define NT 4
#define CP 3000   /* parameters: 24 cells, the last one short */
#define DGRAM 1200 /* bytes: at most 141 entries a chunk */
#define MAXE (64 * 128)

typedef struct {
  pulse_loco *ctx[NT];
  float *local[NT];
  pulse_buffer chunks[NT]; /* each trainer's round, chunked */
  uint64_t nchunks[NT];
  uint8_t *payload[NT];
  size_t psize[NT];
} round_fixture;

static void fixture(round_fixture *f, uint64_t seed) {
  memset(f, 0, sizeof *f);
  float theta[CP];
  lt_fill_weights(theta, CP, seed, 0.5f);
  uint64_t s = seed * 77u + 1u;
  for (uint32_t i = 0; i < NT; i++) {
    f->ctx[i] = lt_ctx(CP, 10u * i + 3u, theta);
    f->local[i] = malloc(CP * sizeof(float));
    for (uint64_t j = 0; j < CP; j++) /* about a third pass the gate */
      f->local[i][j] = theta[j] - lt_normal(&s) * fabsf(theta[j]) * 0x1p-9f;
    const uint8_t *d;
    pulse_loco_prepare_figures pi;
    cr_assert_eq(pulse_loco_prepare(f->ctx[i], f->local[i], 100u + i, 0, &d,
                                    &f->psize[i], &pi),
                 PULSE_OK);
    f->payload[i] = malloc(f->psize[i]);
    memcpy(f->payload[i], d, f->psize[i]);
    pulse_loco_payload_header h;
    pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
    cr_assert_eq(
        pulse_loco_payload_decode(d, f->psize[i], theta, NULL, CP, &h, &e),
        PULSE_OK);
    cr_assert_eq(pulse_loco_chunks_encode(&h, CP, e.pos, e.val, e.count, DGRAM,
                                          &f->chunks[i], &f->nchunks[i]),
                 PULSE_OK, "%s", pulse_error_detail());
    pulse_loco_entries_free(&e);
  }
}

static void fixture_free(round_fixture *f) {
  for (uint32_t i = 0; i < NT; i++) {
    pulse_loco_free(f->ctx[i]);
    free(f->local[i]), free(f->payload[i]);
    pulse_buffer_free(&f->chunks[i]);
  }
}

/* The k-th chunk of trainer i: its bytes and size. */
static const uint8_t *chunk_at(const round_fixture *f, uint32_t i, uint64_t k,
                               size_t *size) {
  const uint8_t *p = f->chunks[i].data;
  size_t left = f->chunks[i].size;
  for (uint64_t n = 0;; n++) {
    size_t cs;
    cr_assert_eq(pulse_loco_chunk_size(p, left, &cs), PULSE_OK);
    if (n == k) {
      *size = cs;
      return p;
    }
    p += cs, left -= cs;
  }
}

static uint32_t ids[NT] = {3, 13, 23, 33};

Test(loco, chunks_round_trip_fit_a_datagram_and_cover_every_cell_once) {
  round_fixture f;
  fixture(&f, 5);
  static uint64_t pos[MAXE];
  static float val[MAXE];
  for (uint32_t i = 0; i < NT; i++) {
    pulse_loco_payload_header h;
    pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
    cr_assert_eq(pulse_loco_payload_decode(f.payload[i], f.psize[i],
                                           pulse_loco_global(f.ctx[i]), NULL,
                                           CP, &h, &e),
                 PULSE_OK);
    cr_assert(f.nchunks[i] > 2, "trainer %u: %llu chunks", i,
              (unsigned long long)f.nchunks[i]);
    uint64_t next = 0, got = 0;
    for (uint64_t k = 0; k < f.nchunks[i]; k++) {
      size_t cs;
      const uint8_t *c = chunk_at(&f, i, k, &cs);
      cr_assert(cs <= DGRAM, "chunk of %zu bytes", cs);
      pulse_loco_chunk_header ch;
      cr_assert_eq(pulse_loco_chunk_decode(c, cs, pulse_loco_global(f.ctx[i]),
                                           CP, &ch, pos, val),
                   PULSE_OK, "%s", pulse_error_detail());
      cr_assert_eq(ch.start, next, "cells skipped or covered twice");
      next = ch.start + ch.length;
      cr_assert_eq(ch.sender, ids[i]);
      for (uint32_t j = 0; j < ch.count; j++, got++) {
        cr_assert_eq(pos[j], e.pos[got]);
        cr_assert_eq(lt_bits(val[j]), lt_bits(e.val[got]));
      }
    }
    cr_assert_eq(next, (uint64_t)CP);
    cr_assert_eq(got, e.count);
    pulse_loco_entries_free(&e);
  }
  fixture_free(&f);
}

/* Finishes trainer `me`'s round from the other trainers' chunks, all but
 * those `lost` says (bit k of lost[i]: chunk k of trainer i), in reverse
 * order when `reverse`. */
static void finish_from_chunks(round_fixture *f, uint32_t me,
                               const uint64_t *lost, int reverse) {
  pulse_loco_inbox *in = NULL;
  cr_assert_eq(pulse_loco_inbox_create(f->ctx[me], ids, NT, &in), PULSE_OK);
  for (uint32_t o = 0; o < NT; o++) {
    uint32_t i = reverse ? NT - 1 - o : o;
    if (i == me)
      continue;
    for (uint64_t q = 0; q < f->nchunks[i]; q++) {
      uint64_t k = reverse ? f->nchunks[i] - 1 - q : q;
      if (lost && k < 64 && (lost[i] >> k & 1u))
        continue;
      size_t cs;
      const uint8_t *c = chunk_at(f, i, k, &cs);
      cr_assert_eq(pulse_loco_inbox_add(in, c, cs), PULSE_OK, "%s",
                   pulse_error_detail());
    }
  }
  cr_assert_eq(pulse_loco_finish_inbox(f->ctx[me], in, NULL, NULL), PULSE_OK,
               "%s", pulse_error_detail());
  pulse_loco_inbox_free(in);
}

Test(loco, all_chunks_arriving_give_the_whole_payload_round_bit_for_bit) {
  round_fixture a, b;
  fixture(&a, 9);
  fixture(&b, 9);
  pulse_loco_contribution set[NT];
  for (uint32_t i = 0; i < NT; i++)
    set[i] = (pulse_loco_contribution){a.payload[i], a.psize[i]};
  for (uint32_t me = 0; me < NT; me++) {
    cr_assert_eq(pulse_loco_finish(a.ctx[me], set, NT, NULL, NULL), PULSE_OK);
    finish_from_chunks(&b, me, NULL, me % 2); /* order does not matter */
    cr_assert_eq(memcmp(pulse_loco_global(a.ctx[me]),
                        pulse_loco_global(b.ctx[me]), CP * sizeof(float)),
                 0, "trainer %u: chunked round differs", me);
    cr_assert_eq(memcmp(pulse_loco_momentum(a.ctx[me]),
                        pulse_loco_momentum(b.ctx[me]), CP * sizeof(float)),
                 0);
    cr_assert_eq(memcmp(pulse_loco_residual(a.ctx[me]),
                        pulse_loco_residual(b.ctx[me]), CP * sizeof(float)),
                 0);
  }
  fixture_free(&a);
  fixture_free(&b);
}

Test(loco, a_lost_chunk_takes_out_only_its_senders_range) {
  round_fixture f;
  fixture(&f, 13);
  /* Trainer 0 loses trainer 2's second chunk: b (mu = 0.9, b = 0 before:
   * b = avg) in that chunk's cells is the mean over trainers 0, 1 and 3;
   * elsewhere over all four. */
  static uint64_t pos[NT][MAXE];
  static float val[NT][MAXE];
  double acc_all[CP] = {0}, acc_wo[CP] = {0};
  for (uint32_t i = 0; i < NT; i++) {
    pulse_loco_payload_header h;
    pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
    cr_assert_eq(pulse_loco_payload_decode(f.payload[i], f.psize[i],
                                           pulse_loco_global(f.ctx[i]), NULL,
                                           CP, &h, &e),
                 PULSE_OK);
    for (uint64_t j = 0; j < e.count; j++) {
      acc_all[e.pos[j]] += (100.0 + i) * e.val[j];
      if (i != 2)
        acc_wo[e.pos[j]] += (100.0 + i) * e.val[j];
    }
    pulse_loco_entries_free(&e);
  }
  (void)pos, (void)val;
  size_t cs;
  pulse_loco_chunk_header ch;
  static uint64_t p1[MAXE];
  static float v1[MAXE];
  const uint8_t *c = chunk_at(&f, 2, 1, &cs);
  cr_assert_eq(pulse_loco_chunk_decode(c, cs, NULL, CP, &ch, p1, v1), PULSE_OK);
  uint64_t lost[NT] = {0, 0, 2u, 0};
  finish_from_chunks(&f, 0, lost, 0);
  const float *b = pulse_loco_momentum(f.ctx[0]);
  for (uint64_t k = 0; k < CP; k++) {
    int out = k >= ch.start && k < ch.start + ch.length;
    double want = out ? acc_wo[k] / (100.0 + 101.0 + 103.0)
                      : acc_all[k] / (100.0 + 101.0 + 102.0 + 103.0);
    cr_assert_eq(lt_bits(b[k]), lt_bits((float)want), "element %llu (%s)",
                 (unsigned long long)k, out ? "lost range" : "elsewhere");
  }
  fixture_free(&f);
}

Test(loco, bad_chunks_are_refused_counted_and_change_nothing) {
  round_fixture a, b;
  fixture(&a, 21);
  fixture(&b, 21);
  finish_from_chunks(&a, 1, NULL, 0); /* the clean result */
  pulse_loco_inbox *in = NULL;
  cr_assert_eq(pulse_loco_inbox_create(b.ctx[1], ids, NT, &in), PULSE_OK);
  size_t cs;
  const uint8_t *c = chunk_at(&b, 0, 1, &cs);
  uint8_t bad[DGRAM + 16];
  /* truncated, and one byte too many */
  cr_assert_neq(pulse_loco_inbox_add(in, c, cs - 1), PULSE_OK);
  memcpy(bad, c, cs);
  bad[cs] = 0;
  cr_assert_neq(pulse_loco_inbox_add(in, bad, cs + 1), PULSE_OK);
  /* a flipped bit anywhere: the checksum (or, in the count or magic, the
   * size or the format) */
  uint64_t flips = 0;
  for (size_t at = 0; at < cs; at += 7, flips++) {
    memcpy(bad, c, cs);
    bad[at] ^= 0x10;
    cr_assert_neq(pulse_loco_inbox_add(in, bad, cs), PULSE_OK, "bit at %zu",
                  at);
  }
  /* a sender that is not a member: a fresh context under another id */
  pulse_loco *stranger = lt_ctx(CP, 99, pulse_loco_global(b.ctx[0]));
  const uint8_t *d;
  size_t ds;
  cr_assert_eq(pulse_loco_prepare(stranger, b.local[0], 100, 0, &d, &ds, NULL),
               PULSE_OK);
  pulse_loco_payload_header h;
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  cr_assert_eq(pulse_loco_payload_decode(d, ds, pulse_loco_global(stranger),
                                         NULL, CP, &h, &e),
               PULSE_OK);
  pulse_buffer sc;
  cr_assert_eq(
      pulse_loco_chunks_encode(&h, CP, e.pos, e.val, e.count, DGRAM, &sc, NULL),
      PULSE_OK);
  size_t scs;
  cr_assert_eq(pulse_loco_chunk_size(sc.data, sc.size, &scs), PULSE_OK);
  cr_assert_neq(pulse_loco_inbox_add(in, sc.data, scs), PULSE_OK);
  /* a chunk of trainer 0 for another round, and on another base */
  pulse_loco_payload_header h2 = h;
  h2.sender = ids[0];
  h2.round = 7;
  pulse_buffer oc;
  cr_assert_eq(pulse_loco_chunks_encode(&h2, CP, e.pos, e.val, e.count, DGRAM,
                                        &oc, NULL),
               PULSE_OK);
  size_t ocs;
  cr_assert_eq(pulse_loco_chunk_size(oc.data, oc.size, &ocs), PULSE_OK);
  cr_assert_neq(pulse_loco_inbox_add(in, oc.data, ocs), PULSE_OK);
  pulse_buffer_free(&oc);
  h2.round = 0;
  h2.base_digest ^= 1;
  cr_assert_eq(pulse_loco_chunks_encode(&h2, CP, e.pos, e.val, e.count, DGRAM,
                                        &oc, NULL),
               PULSE_OK);
  cr_assert_eq(pulse_loco_chunk_size(oc.data, oc.size, &ocs), PULSE_OK);
  cr_assert_neq(pulse_loco_inbox_add(in, oc.data, ocs), PULSE_OK);
  pulse_buffer_free(&oc);
  pulse_loco_entries_free(&e);
  pulse_buffer_free(&sc);
  pulse_loco_free(stranger);
  /* every good chunk, each twice (the second a duplicate), reordered */
  for (uint32_t i = NT; i-- > 0;) {
    if (i == 1)
      continue;
    for (uint64_t k = b.nchunks[i]; k-- > 0;) {
      const uint8_t *g = chunk_at(&b, i, k, &cs);
      cr_assert_eq(pulse_loco_inbox_add(in, g, cs), PULSE_OK);
      cr_assert_neq(pulse_loco_inbox_add(in, g, cs), PULSE_OK);
    }
  }
  pulse_loco_inbox_figures st;
  pulse_loco_inbox_figures_get(in, &st);
  cr_assert(st.truncated >= 2u);
  cr_assert(st.bad_checksum >= 1 &&
                st.bad_checksum + st.malformed + st.truncated == flips + 2,
            "flipped bits: %llu checksum, %llu malformed",
            (unsigned long long)st.bad_checksum,
            (unsigned long long)st.malformed);
  cr_assert_eq(st.unknown_sender, 1u);
  cr_assert_eq(st.other_round, 1u);
  cr_assert_eq(st.other_base, 1u);
  cr_assert_eq(st.duplicate, st.accepted);
  cr_assert_eq(pulse_loco_finish_inbox(b.ctx[1], in, NULL, NULL), PULSE_OK);
  pulse_loco_inbox_free(in);
  cr_assert_eq(memcmp(pulse_loco_global(a.ctx[1]), pulse_loco_global(b.ctx[1]),
                      CP * sizeof(float)),
               0, "a refused chunk changed the weights");
  fixture_free(&a);
  fixture_free(&b);
}

Test(loco, chunked_rounds_need_the_drop_rule) {
  float theta[256] = {0};
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = 256;
  o.rule = PULSE_LOCO_RULE_KEEP;
  pulse_loco *ctx;
  cr_assert_eq(pulse_loco_create(&o, theta, &ctx), PULSE_OK);
  float local[256];
  for (int i = 0; i < 256; i++)
    local[i] = 0.01f * (float)i;
  cr_assert_eq(pulse_loco_prepare(ctx, local, 1, 0, NULL, NULL, NULL),
               PULSE_OK);
  pulse_loco_inbox *in;
  cr_assert_eq(pulse_loco_inbox_create(ctx, NULL, 0, &in), PULSE_OK);
  cr_assert_eq(pulse_loco_finish_inbox(ctx, in, NULL, NULL),
               PULSE_ERR_UNSUPPORTED);
  pulse_loco_inbox_free(in);
  pulse_loco_free(ctx);
}

/* Between re-syncs (docs/formats/loco-chunks.md "Drift", "Between re-syncs"): a GATED chunk
 * whose entry does not pass the gate on the receiver's theta_g (as one
 * built on a drifted base may not) is refused from a sender and a receiver
 * that both hold the reference's bits, taken when the sender flags the
 * range DRIFTED or the receiver's own range there drifted; a drifted
 * receiver takes the chunks that name the reference's base, not its own. */
Test(loco, drifted_ranges_skip_only_their_gate_and_name_the_reference_base) {
  round_fixture f;
  fixture(&f, 31);
  pulse_loco *me = f.ctx[1];
  pulse_loco_payload_header h;
  cr_assert_eq(pulse_loco_payload_peek(f.payload[0], f.psize[0], &h), PULSE_OK);
  cr_assert(h.flags & PULSE_LOCO_PAYLOAD_GATED);
  /* Every position, values that move no BF16 weight (never pass the
   * gate): a cell a chunk at this datagram size; the first is [0, 128). */
  uint64_t *pos = malloc(CP * sizeof *pos);
  float *val = calloc(CP, sizeof *val);
  for (uint64_t j = 0; j < CP; j++)
    pos[j] = j;
  uint8_t drifted[3] = {1, 0, 0}, elsewhere[3] = {0, 0, 1}; /* 1024 each */
  pulse_buffer clean = {NULL, 0}, flagged = {NULL, 0}, other = {NULL, 0};
  uint64_t n;
  cr_assert_eq(pulse_loco_chunks_encode(&h, CP, pos, val, CP, DGRAM, &clean,
                                        &n),
               PULSE_OK);
  cr_assert_eq(pulse_loco_chunks_encode(&h, CP, pos, val, CP, DGRAM, &flagged,
                                        &n),
               PULSE_OK);
  /* A mask that does not touch the first chunk's range leaves it as is. */
  cr_assert_eq(pulse_loco_chunks_mark_drifted(&flagged, n, CP, elsewhere, 1024),
               PULSE_OK);
  size_t cs;
  cr_assert_eq(pulse_loco_chunk_size(clean.data, clean.size, &cs), PULSE_OK);
  cr_assert_eq(memcmp(flagged.data, clean.data, cs), 0);
  cr_assert_eq(pulse_loco_chunks_mark_drifted(&flagged, n, CP, drifted, 1024),
               PULSE_OK);
  cr_assert_neq(memcmp(flagged.data, clean.data, cs), 0);
  pulse_loco_chunk_header ch;
  uint64_t ps[MAXE];
  float vs[MAXE];
  cr_assert_eq(pulse_loco_chunk_decode(flagged.data, cs, NULL, CP, &ch, ps, vs),
               PULSE_OK);
  cr_assert(ch.flags & PULSE_LOCO_CHUNK_DRIFTED);
  cr_assert_eq(ch.start, 0);
  cr_assert_eq(ch.length, 128);

  /* Both on the reference's bits: the gate is checked and refuses. */
  pulse_loco_inbox *in;
  pulse_loco_inbox_figures st;
  cr_assert_eq(pulse_loco_inbox_create(me, ids, NT, &in), PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_add(in, clean.data, cs), PULSE_ERR_CORRUPT);
  pulse_loco_inbox_figures_get(in, &st);
  cr_assert_eq(st.malformed, 1);
  /* The sender flags the range: taken. */
  cr_assert_eq(pulse_loco_inbox_add(in, flagged.data, cs), PULSE_OK);
  pulse_loco_inbox_free(in);

  /* The receiver drifted there: the unflagged chunk is taken. */
  uint64_t base = pulse_loco_global_digest(me);
  cr_assert_eq(pulse_loco_inbox_create(me, ids, NT, &in), PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_set_drift(in, base, drifted, 1024), PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_add(in, clean.data, cs), PULSE_OK);
  pulse_loco_inbox_free(in);
  /* ... but not elsewhere: its own range 0 is the reference's. */
  cr_assert_eq(pulse_loco_inbox_create(me, ids, NT, &in), PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_set_drift(in, base, elsewhere, 1024),
               PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_add(in, clean.data, cs), PULSE_ERR_CORRUPT);
  pulse_loco_inbox_free(in);

  /* A drifted receiver's base is the reference's: chunks naming its own
   * digest are of another base; those naming the reference's are taken. */
  pulse_loco_payload_header hr = h;
  hr.base_digest = base ^ 0x5A5Au;
  cr_assert_eq(pulse_loco_chunks_encode(&hr, CP, pos, val, CP, DGRAM, &other,
                                        &n),
               PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_create(me, ids, NT, &in), PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_set_drift(in, hr.base_digest, drifted, 1024),
               PULSE_OK);
  cr_assert_eq(pulse_loco_inbox_add(in, clean.data, cs), PULSE_ERR_BASE_DIGEST);
  pulse_loco_inbox_figures_get(in, &st);
  cr_assert_eq(st.other_base, 1);
  cr_assert_eq(pulse_loco_inbox_add(in, other.data, cs), PULSE_OK);
  pulse_loco_inbox_free(in);

  pulse_buffer_free(&clean), pulse_buffer_free(&flagged);
  pulse_buffer_free(&other);
  free(pos), free(val);
  fixture_free(&f);
}
