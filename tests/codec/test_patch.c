/* test_patch.c - the patch format on valid input: encode -> open ->
 * decode_tensor / apply is bit-exact over seeds, densities, sizes around
 * chunk boundaries, shapes, both position models, thread counts and edge
 * values; the encoder is deterministic and checks its input; apply is
 * transactional. Also the digests (suite "digest"). Hostile input is in
 * test_patch_hostile.c, squash in test_squash.c. */
#include "patch_testutil.h"

#include <criterion/criterion.h>

static const double densities[] = {0.0, 0.001, 0.01, 0.1, 0.5, 1.0};
static const uint64_t sizes[] = {0,   1, 2, 7, 1023, 1024, 1025, 3 * 1024 + 7,
                                 5000};
static const pulse_pos_model models[] = {PULSE_POS_PLAIN, PULSE_POS_CLASS};
static const char *const model_names[] = {"plain", "class"};

/* The round trips run over every coding: both position models in every
 * format version. */
enum { CODINGS = 6 };
static const char *const coding_names[CODINGS] = {
    "plain", "class", "plain v1", "class v1", "plain v3", "class v3"};

static pulse_encode_opts coding_opts(int coding, uint32_t chunk_log2, int threads) {
  static const uint32_t versions[CODINGS / 2] = {PULSE_PATCH_VERSION, 1, 3};
  pulse_encode_opts o = pt_opts(models[coding % 2], chunk_log2, threads);
  o.format_version = versions[coding / 2];
  return o;
}

/* Everything a valid patch promises, checked against the tensors it was
 * encoded from: header, table, state digests, decode_tensor (exactly the
 * change list) and apply (exactly the targets). Returns the patch bytes. */
static pulse_buffer check_roundtrip(const pulse_encode_opts *o,
                                    const pt_tensor *ts, size_t n,
                                    const char *label) {
  pulse_buffer buf = {NULL, 0};
  pulse_status st = pt_encode(o, ts, n, &buf);
  cr_assert_eq(st, PULSE_OK, "%s: encode: %s (%s)", label,
               pulse_status_name(st), pulse_error_detail());
  pulse_patch *p = NULL;
  st = pulse_patch_open(buf.data, buf.size, &p);
  cr_assert_eq(st, PULSE_OK, "%s: open: %s (%s)", label, pulse_status_name(st),
               pulse_error_detail());
  /* Every stream decodes without the base, but version 1 class streams. */
  st = pulse_patch_check_streams(p, o->threads);
  if (pulse_patch_format_version(p) == 1 && o->pos_model == PULSE_POS_CLASS)
    cr_assert_eq(st, PULSE_ERR_UNSUPPORTED, "%s: check streams", label);
  else
    cr_assert_eq(st, PULSE_OK, "%s: check streams: %s", label, pulse_error_detail());
  cr_assert_eq(pulse_patch_step(p), o->step, "%s: step", label);
  cr_assert_eq(pulse_patch_base_step(p), o->base_step, "%s: base step", label);
  cr_assert_eq(pulse_patch_pos_model(p), o->pos_model, "%s: model", label);
  cr_assert_eq(pulse_patch_chunk_log2(p), o->chunk_log2, "%s: chunk", label);
  cr_assert_eq(pulse_patch_tensor_count(p), n, "%s: tensor count", label);

  pulse_tensor_info *infos = pt_alloc((n + 1) * sizeof *infos);
  pulse_tensor_digest *bd = pt_alloc((n + 1) * sizeof *bd);
  pulse_tensor_digest *td = pt_alloc((n + 1) * sizeof *td);
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const pt_tensor *t = &ts[i];
    infos[i] = pt_info(t);
    bd[i] = pulse_digest_bf16(t->base, t->numel);
    td[i] = pulse_digest_bf16(t->target, t->numel);
    total += t->changes.count;
    pulse_patch_tensor e;
    cr_assert_eq(pulse_patch_tensor_get(p, i, &e), PULSE_OK, "%s", label);
    cr_assert_str_eq(e.info.name, t->name, "%s: name %zu", label, i);
    cr_assert_eq(e.info.dtype, PULSE_DTYPE_BF16, "%s: dtype", label);
    cr_assert_eq(e.info.ndim, t->ndim, "%s: '%s' ndim", label, t->name);
    for (uint32_t d = 0; d < t->ndim; d++)
      cr_assert_eq(e.info.shape[d], t->shape[d], "%s: '%s' dim %u", label,
                   t->name, d);
    cr_assert_eq(e.numel, t->numel, "%s: '%s' numel", label, t->name);
    cr_assert_eq(e.changed, t->changes.count, "%s: '%s' changed", label,
                 t->name);
    uint64_t chunks =
        t->changes.count ? ((t->numel - 1) >> o->chunk_log2) + 1 : 0;
    cr_assert_eq(e.chunk_count, chunks, "%s: '%s' chunks", label, t->name);
    cr_assert(e.base_digest.a == bd[i].a && e.base_digest.b == bd[i].b,
              "%s: '%s' base digest", label, t->name);
    cr_assert(e.target_digest.a == td[i].a && e.target_digest.b == td[i].b,
              "%s: '%s' target digest", label, t->name);
    size_t idx = SIZE_MAX;
    cr_assert_eq(pulse_patch_tensor_find(p, t->name, &idx), PULSE_OK, "%s",
                 label);
    cr_assert_eq(idx, i, "%s: find '%s'", label, t->name);

    pulse_changes got = PULSE_CHANGES_INIT;
    st = pulse_patch_decode_tensor(p, i, t->base, t->numel, &got);
    cr_assert_eq(st, PULSE_OK, "%s: decode '%s': %s (%s)", label, t->name,
                 pulse_status_name(st), pulse_error_detail());
    uint64_t bad = pt_changes_diff(&t->changes, &got);
    cr_assert_eq(bad, PT_NONE,
                 "%s: decode '%s': change %llu differs (%llu changes, want "
                 "%llu)",
                 label, t->name, (unsigned long long)bad,
                 (unsigned long long)got.count,
                 (unsigned long long)t->changes.count);
    pulse_changes_free(&got);
  }
  cr_assert_eq(pulse_patch_total_changed(p), total, "%s: total", label);
  pulse_state_digest want;
  cr_assert_eq(pulse_state_digest_compute(infos, bd, n, &want), PULSE_OK);
  cr_assert_arr_eq(pulse_patch_base_digest(p)->bytes, want.bytes, 32,
                   "%s: base state digest", label);
  cr_assert_eq(pulse_state_digest_compute(infos, td, n, &want), PULSE_OK);
  cr_assert_arr_eq(pulse_patch_target_digest(p)->bytes, want.bytes, 32,
                   "%s: target state digest", label);

  pulse_host_tensor *h = pt_hosts(ts, n);
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = o->threads;
  st = pulse_patch_apply(p, h, n, &ao);
  cr_assert_eq(st, PULSE_OK, "%s: apply: %s (%s)", label, pulse_status_name(st),
               pulse_error_detail());
  for (size_t i = 0; i < n; i++) {
    uint64_t bad = pt_first_diff(ts[i].target, h[i].data, ts[i].numel);
    cr_assert_eq(bad, PT_NONE, "%s: apply '%s': element %llu", label,
                 ts[i].name, (unsigned long long)bad);
  }
  pt_hosts_free(h, n);
  free(infos), free(bd), free(td);
  pulse_patch_free(p);
  return buf;
}

static void roundtrip_free(const pulse_encode_opts *o, const pt_tensor *ts,
                           size_t n, const char *label) {
  pulse_buffer b = check_roundtrip(o, ts, n, label);
  pulse_buffer_free(&b);
}

/* ------------------------------------------------------------ round trip */

Test(patch, roundtrip_is_bit_exact_over_seeds_densities_and_sizes) {
  enum { N = PT_COUNT_OF(sizes) };
  for (uint64_t seed = 0; seed < 20; seed++)
    for (size_t di = 0; di < PT_COUNT_OF(densities); di++) {
      pt_tensor ts[N];
      for (size_t k = 0; k < N; k++) {
        char name[32];
        snprintf(name, sizeof name, "layer.%zu.weight", k);
        pt_weights kind = seed % 4 == 3 ? PT_WEIGHTS_ANY : PT_WEIGHTS_NORMAL;
        pt_tensor_make1(&ts[k], name, sizes[k], kind, densities[di], 0,
                        seed * 131 + di * 17 + k);
      }
      for (int m = 0; m < CODINGS; m++)
        for (int threads = 1; threads <= 3; threads += 2) {
          char label[128];
          snprintf(label, sizeof label, "seed %llu density %g %s threads %d",
                   (unsigned long long)seed, densities[di], coding_names[m],
                   threads);
          pulse_encode_opts o = coding_opts(m, 10, threads);
          roundtrip_free(&o, ts, N, label);
        }
      pt_tensors_free(ts, N);
    }
}

Test(patch, roundtrip_single_tensor_around_chunk_boundaries) {
  for (size_t k = 0; k < PT_COUNT_OF(sizes); k++)
    for (size_t di = 0; di < PT_COUNT_OF(densities); di++)
      for (uint64_t seed = 0; seed < 3; seed++) {
        pt_tensor t;
        pt_tensor_make1(&t, "w", sizes[k], PT_WEIGHTS_NORMAL, densities[di], 1,
                        seed + 1000 * k);
        for (int m = 0; m < CODINGS; m++) {
          char label[128];
          snprintf(label, sizeof label, "size %llu density %g seed %llu %s",
                   (unsigned long long)sizes[k], densities[di],
                   (unsigned long long)seed, coding_names[m]);
          pulse_encode_opts o = coding_opts(m, 10, 1);
          roundtrip_free(&o, &t, 1, label);
        }
        pt_tensor_free(&t);
      }
}

/* Changes only at the first and last element of every chunk, and only in
 * the last (short) chunk. */
Test(patch, roundtrip_changes_at_chunk_edges) {
  const uint64_t n = 3 * 1024 + 7;
  for (int variant = 0; variant < 3; variant++) {
    pt_tensor t;
    pt_tensor_make1(&t, "edges", n, PT_WEIGHTS_NORMAL, 0.0, 0, 5);
    uint64_t s = 99;
    for (uint64_t i = 0; i < n; i++) {
      int chunk_edge = (i % 1024 == 0) || (i % 1024 == 1023) || i == n - 1;
      int want = variant == 0 ? chunk_edge : i >= 3 * 1024;
      if (variant == 2)
        want = i == n - 1;
      if (want)
        pt_push(&t.changes, i, t.base[i], pt_new_bits(&s, t.base[i], 1));
    }
    pt_apply_changes(t.target, &t.changes);
    for (int m = 0; m < CODINGS; m++) {
      char label[64];
      snprintf(label, sizeof label, "variant %d %s", variant, coding_names[m]);
      pulse_encode_opts o = coding_opts(m, 10, 3);
      roundtrip_free(&o, &t, 1, label);
    }
    pt_tensor_free(&t);
  }
}

Test(patch, roundtrip_two_hundred_small_tensors) {
  enum { N = 200 };
  pt_tensor ts[N];
  uint64_t s = 4242;
  for (size_t k = 0; k < N; k++) {
    char name[32];
    snprintf(name, sizeof name, "blocks.%zu.attn", k);
    uint64_t numel = pulse_rng_below(&s, 60);
    double density = densities[pulse_rng_below(&s, PT_COUNT_OF(densities))];
    pt_tensor_make1(&ts[k], name, numel, PT_WEIGHTS_EDGE, density, 1, k);
  }
  for (int m = 0; m < CODINGS; m++)
    for (int threads = 1; threads <= 3; threads += 2) {
      char label[64];
      snprintf(label, sizeof label, "%s threads %d", coding_names[m], threads);
      pulse_encode_opts o = coding_opts(m, 10, threads);
      roundtrip_free(&o, ts, N, label);
    }
  pt_tensors_free(ts, N);
}

Test(patch, roundtrip_multidimensional_shapes) {
  static const struct {
    uint32_t ndim;
    uint64_t shape[PULSE_MAX_DIMS];
  } shapes[] = {{0, {0}},
                {1, {0}},
                {3, {3, 0, 5}},
                {2, {1, 1}},
                {3, {2, 3, 4}},
                {3, {7, 11, 13}},
                {2, {33, 31}},
                {2, {1025, 3}},
                {8, {1, 1, 1, 1, 1, 1, 1, 1025}},
                {8, {2, 2, 2, 2, 2, 2, 2, 3}}};
  enum { N = PT_COUNT_OF(shapes) };
  for (uint64_t seed = 0; seed < 4; seed++) {
    pt_tensor ts[N];
    for (size_t k = 0; k < N; k++) {
      char name[32];
      snprintf(name, sizeof name, "shape%zu", k);
      pt_tensor_make(&ts[k], name, shapes[k].ndim, shapes[k].shape,
                     PT_WEIGHTS_NORMAL, 0.2, 1, seed * 7 + k);
    }
    for (int m = 0; m < CODINGS; m++) {
      char label[64];
      snprintf(label, sizeof label, "seed %llu %s", (unsigned long long)seed,
               coding_names[m]);
      pulse_encode_opts o = coding_opts(m, 10, 3);
      roundtrip_free(&o, ts, N, label);
    }
    pt_tensors_free(ts, N);
  }
}

/* Every ordered pair of edge values as (old, new), and every one of the
 * 65535 non-zero deltas, 0x8000 (a sign flip) included. */
Test(patch, roundtrip_edge_values_and_every_delta) {
  const size_t e = PT_COUNT_OF(pt_edge_bits);
  pt_tensor pairs;
  pt_tensor_make1(&pairs, "edge_pairs", e * e, PT_WEIGHTS_CONST, 0.0, 0, 1);
  for (size_t a = 0; a < e; a++)
    for (size_t b = 0; b < e; b++) {
      pairs.base[a * e + b] = pt_edge_bits[a];
      if (a != b)
        pt_push(&pairs.changes, a * e + b, pt_edge_bits[a], pt_edge_bits[b]);
    }
  free(pairs.target);
  pairs.target = pt_copy(pairs.base, pairs.numel);
  pt_apply_changes(pairs.target, &pairs.changes);

  pt_tensor deltas;
  pt_tensor_make1(&deltas, "every_delta", 65535 + 17, PT_WEIGHTS_ANY, 0.0, 0,
                  2);
  for (uint64_t i = 0; i < 65535; i++) {
    uint64_t at = i + (i > 40000 ? 17 : 0); /* an unchanged run too */
    uint16_t old = deltas.base[at];
    pt_push(&deltas.changes, at, old,
            pulse_bf16_undelta(old, (uint16_t)(i + 1)));
  }
  pt_apply_changes(deltas.target, &deltas.changes);

  pt_tensor both[2] = {pairs, deltas};
  for (int m = 0; m < CODINGS; m++)
    for (uint32_t log2 = 10; log2 <= 16; log2 += 6) {
      char label[64];
      snprintf(label, sizeof label, "%s chunk 2^%u", coding_names[m], log2);
      pulse_encode_opts o = coding_opts(m, log2, 3);
      roundtrip_free(&o, both, 2, label);
    }
  pt_tensors_free(both, 2);
}

Test(patch, roundtrip_realistic_weights_use_many_classes) {
  pt_tensor t;
  pt_tensor_make1(&t, "mlp.up_proj.weight", 100000, PT_WEIGHTS_NORMAL, 0.01, 0,
                  77);
  int seen[256] = {0}, classes = 0;
  for (uint64_t j = 0; j < t.changes.count; j++)
    if (!seen[pulse_bf16_class(t.changes.old_bits[j])]++)
      classes++;
  cr_assert_geq(classes, 12, "normal*0.02 weights: only %d classes changed",
                classes);
  for (int m = 0; m < CODINGS; m++)
    for (uint32_t log2 = 10; log2 <= 30; log2 += 10) {
      char label[64];
      snprintf(label, sizeof label, "%s chunk 2^%u", coding_names[m], log2);
      pulse_encode_opts o = coding_opts(m, log2, 3);
      roundtrip_free(&o, &t, 1, label);
    }
  pt_tensor_free(&t);
}

Test(patch, roundtrip_default_chunk_size_over_two_chunks) {
  pt_tensor t;
  pt_tensor_make1(&t, "big", (1u << 20) + 3, PT_WEIGHTS_NORMAL, 0.01, 1, 3);
  pt_push(&t.changes, (1u << 20) + 2, t.base[(1u << 20) + 2], 0x7FC1);
  t.target[(1u << 20) + 2] = 0x7FC1;
  for (int m = 0; m < CODINGS; m++) {
    pulse_encode_opts o = coding_opts(m, PULSE_CHUNK_LOG2_DEFAULT, 3);
    roundtrip_free(&o, &t, 1, coding_names[m]);
  }
  pt_tensor_free(&t);
}

/* ------------------------------------------------------------- decoding */

Test(patch, decode_tensor_returns_exactly_the_given_changes) {
  pt_tensor t;
  pt_tensor_make1(&t, "w", 2100, PT_WEIGHTS_NORMAL, 0.0, 0, 8);
  const uint64_t at[] = {0, 1, 1023, 1024, 1025, 2047, 2048, 2099};
  const uint16_t news[] = {0x7FC1, 0xFFC0, 0x7F80, 0xFF80,
                           0x8000, 0x0001, 0x7F7F, 0x0000};
  for (size_t j = 0; j < PT_COUNT_OF(at); j++) {
    if (t.base[at[j]] == news[j])
      t.base[at[j]] ^= 1;
    pt_push(&t.changes, at[j], t.base[at[j]], news[j]);
  }
  free(t.target);
  t.target = pt_copy(t.base, t.numel);
  pt_apply_changes(t.target, &t.changes);
  for (int m = 0; m < CODINGS; m++) {
    pulse_encode_opts o = coding_opts(m, 10, 1);
    pulse_buffer b = check_roundtrip(&o, &t, 1, coding_names[m]);
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(b.data, b.size, &p), PULSE_OK);
    pulse_changes got = PULSE_CHANGES_INIT;
    for (int k = 0; k < 5; k++) /* stale content that must be cleared */
      pt_push(&got, 9000u + (uint64_t)k, 1, 2);
    cr_assert_eq(pulse_patch_decode_tensor(p, 0, t.base, t.numel, &got),
                 PULSE_OK);
    cr_assert_eq(got.count, PT_COUNT_OF(at));
    for (size_t j = 0; j < PT_COUNT_OF(at); j++) {
      cr_assert_eq(got.pos[j], at[j], "%s: position %zu", coding_names[m], j);
      cr_assert_eq(got.old_bits[j], t.base[at[j]], "%s: old %zu",
                   coding_names[m], j);
      cr_assert_eq(got.new_bits[j], news[j], "%s: new %zu", coding_names[m], j);
    }
    cr_assert_eq(pulse_patch_decode_tensor(p, 0, t.base, t.numel - 1, &got),
                 PULSE_ERR_SIZE_MISMATCH);
    cr_assert_eq(pulse_patch_decode_tensor(p, 0, NULL, t.numel, &got),
                 PULSE_ERR_ARG);
    cr_assert_eq(pulse_patch_decode_tensor(p, 1, t.base, t.numel, &got),
                 PULSE_ERR_ARG);
    size_t idx;
    cr_assert_eq(pulse_patch_tensor_find(p, "nope", &idx), PULSE_ERR_NOT_FOUND);
    pulse_patch_tensor e;
    cr_assert_eq(pulse_patch_tensor_get(p, 1, &e), PULSE_ERR_ARG);
    pulse_changes_free(&got);
    pulse_patch_free(p);
    pulse_buffer_free(&b);
  }
  pt_tensor_free(&t);
}

Test(patch, empty_table_roundtrips) {
  for (int m = 0; m < CODINGS; m++) {
    pulse_encode_opts o = coding_opts(m, 10, 1);
    pulse_buffer b = {NULL, 0};
    cr_assert_eq(pulse_patch_encode(&o, NULL, 0, &b), PULSE_OK);
    cr_assert_eq(b.size, PT_HEADER_SIZE, "no table, no body");
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open(b.data, b.size, &p), PULSE_OK);
    cr_assert_eq(pulse_patch_tensor_count(p), 0);
    cr_assert_eq(pulse_patch_apply(p, NULL, 0, NULL), PULSE_OK);
    pulse_patch_free(p);
    pulse_buffer_free(&b);
  }
}

static uint64_t pt_varint_len(uint64_t v) {
  uint64_t n = 1;
  while (v >= 0x80)
    v >>= 7, n++;
  return n;
}

/* Version 3's table leaves out what a decoder derives: the target digest
 * and section size of a tensor without changes, the chunk entry of a
 * tensor of one chunk (its counts are the tensor's), the section size of
 * one of several chunks (the entries' sum); the value model closes it. */
Test(patch, version_3_table_leaves_out_what_the_decoder_derives) {
  pt_tensor ts[3];
  pt_tensor_make1(&ts[0], "one", 1000, PT_WEIGHTS_NORMAL, 0.05, 1,
                  1); /* 1 chunk */
  pt_tensor_make1(&ts[1], "none", 40, PT_WEIGHTS_NORMAL, 0.0, 0,
                  2); /* no change */
  pt_tensor_make1(&ts[2], "three", 3000, PT_WEIGHTS_NORMAL, 0.05, 1,
                  3);                          /* 3 chunks */
  pulse_encode_opts o = coding_opts(5, 10, 1); /* class v3 */
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(pt_encode(&o, ts, 3, &b), PULSE_OK);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(b.data, b.size, &p), PULSE_OK, "%s",
               pulse_error_detail());
  pt_raw_patch raw;
  cr_assert(pt_raw_parse(b.data, b.size, &raw));
  uint64_t want = pulse_patch_value_model_size(p);
  cr_assert_gt(want, 0);
  for (size_t i = 0; i < 3; i++) {
    pulse_patch_tensor e;
    cr_assert_eq(pulse_patch_tensor_get(p, i, &e), PULSE_OK);
    uint64_t head = 1 + strlen(e.info.name) + 2 +
                    pt_varint_len(e.info.shape[0]) + pt_varint_len(e.changed) +
                    16; /* name, dtype, ndim, shape, base digest */
    if (i == 0)
      want += head + pt_varint_len(e.section_size) + 16;
    else if (i == 1)
      want += head;
    else
      for (size_t c = 0; c < raw.tensors[2].chunk_count; c++)
        want += pt_varint_len(raw.tensors[2].chunks[c].changed) +
                pt_varint_len(raw.tensors[2].chunks[c].bytes);
    if (i == 2)
      want += head + 16;
  }
  cr_assert_eq(raw.tensors[2].chunk_count, 3);
  pt_raw_free(&raw);
  uint64_t table = 0;
  for (int k = 0; k < 4; k++)
    table |= (uint64_t)b.data[PT_OFF_TABLE_SIZE + k] << (8 * k);
  cr_assert_eq(table, want);
  pulse_patch_free(p);
  pulse_buffer_free(&b);
  pt_tensors_free(ts, 3);
}

/* ---------------------------------------------------------- determinism */

Test(patch, encoder_is_deterministic_for_any_thread_count) {
  pt_tensor ts[3];
  pt_tensor_make1(&ts[0], "a", 50000, PT_WEIGHTS_NORMAL, 0.05, 1, 1);
  pt_tensor_make1(&ts[1], "b", 3 * 1024 + 7, PT_WEIGHTS_EDGE, 0.5, 1, 2);
  pt_tensor_make1(&ts[2], "c", 1, PT_WEIGHTS_ANY, 1.0, 1, 3);
  for (int m = 0; m < CODINGS; m++) {
    pulse_encode_opts o = coding_opts(m, 10, 1);
    pulse_buffer ref = check_roundtrip(&o, ts, 3, coding_names[m]);
    static const int threads[] = {1, 2, 3, 4, 0, 1};
    for (size_t k = 0; k < PT_COUNT_OF(threads); k++) {
      o.threads = threads[k];
      pulse_buffer b = {NULL, 0};
      cr_assert_eq(pt_encode(&o, ts, 3, &b), PULSE_OK);
      cr_assert_eq(b.size, ref.size, "%s threads %d: size", coding_names[m],
                   threads[k]);
      cr_assert_arr_eq(b.data, ref.data, ref.size, "%s threads %d: bytes",
                       coding_names[m], threads[k]);
      pulse_buffer_free(&b);
    }
    pulse_buffer_free(&ref);
  }
  pt_tensors_free(ts, 3);
}

/* The plain model reads no weights: a base digest instead of the base gives
 * the same bytes. */
Test(patch, plain_encoder_needs_only_the_base_digest) {
  pt_tensor t;
  pt_tensor_make1(&t, "w", 5000, PT_WEIGHTS_NORMAL, 0.1, 1, 12);
  pulse_encode_opts o = pt_opts(PULSE_POS_PLAIN, 10, 2);
  pulse_buffer ref = check_roundtrip(&o, &t, 1, "with base");
  pulse_tensor_digest d = pulse_digest_bf16(t.base, t.numel);
  pulse_encode_tensor e;
  pt_encode_table(&t, 1, &e);
  e.base = NULL;
  e.base_digest = &d;
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_OK);
  cr_assert_eq(b.size, ref.size);
  cr_assert_arr_eq(b.data, ref.data, ref.size);
  pulse_buffer_free(&b);
  o.pos_model = PULSE_POS_CLASS;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_ARG,
               "the class model needs the base");
  cr_assert_null(b.data);
  pulse_buffer_free(&ref);
  pt_tensor_free(&t);
}

/* --------------------------------------------------------- encoder input */

static pulse_status encode_one(pt_tensor *t, pulse_encode_opts *o) {
  pulse_buffer b = {(uint8_t *)1, 1};
  pulse_status st = pt_encode(o, t, 1, &b);
  if (st != PULSE_OK)
    cr_assert(b.data == NULL && b.size == 0, "failed encode leaves no output");
  pulse_buffer_free(&b);
  return st;
}

/* Change j of t at pos, from the base's bits by delta (0: none). */
static void set_change(pt_tensor *t, uint64_t j, uint64_t pos, uint16_t delta) {
  t->changes.pos[j] = pos;
  t->changes.old_bits[j] = pos < t->numel ? t->base[pos] : 0;
  t->changes.new_bits[j] = (uint16_t)(t->changes.old_bits[j] + delta);
}

Test(patch, encoder_rejects_inconsistent_input) {
  pt_tensor t;
  pt_tensor_make1(&t, "w", 3000, PT_WEIGHTS_NORMAL, 0.0, 0, 4);
  pulse_encode_opts o = pt_opts(PULSE_POS_CLASS, 10, 1);
  pt_push(&t.changes, 5, t.base[5], (uint16_t)(t.base[5] + 1));
  pt_push(&t.changes, 1500, t.base[1500], (uint16_t)(t.base[1500] + 1));
  cr_assert_eq(encode_one(&t, &o), PULSE_OK);

  t.changes.old_bits[1] ^= 0x10;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_BASE_DIGEST, "old != base");
  set_change(&t, 1, 1500, 0);
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_ARG, "old == new");
  set_change(&t, 1, 5, 2);
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_POSITION, "repeated position");
  set_change(&t, 1, 3000, 1);
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_POSITION, "position == numel");
  set_change(&t, 0, 7, 1);
  set_change(&t, 1, 6, 1);
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_POSITION, "decreasing");
  set_change(&t, 0, 6, 1);
  set_change(&t, 1, 7, 1);
  cr_assert_eq(encode_one(&t, &o), PULSE_OK, "increasing again");
  t.changes.count = 0;

  o.chunk_log2 = 9;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_ARG, "chunk 2^9");
  o.chunk_log2 = 31;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_ARG, "chunk 2^31");
  o.chunk_log2 = 10;
  o.pos_model = (pulse_pos_model)2;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_ARG, "model 2");
  o.pos_model = PULSE_POS_CLASS;
  o.struct_version = PULSE_ENCODE_OPTS_VERSION - 1;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_VERSION, "opts version");
  o.struct_version = PULSE_ENCODE_OPTS_VERSION;
  o.format_version = PULSE_PATCH_VERSION_MAX + 1;
  cr_assert_eq(encode_one(&t, &o), PULSE_ERR_ARG, "format version");
  o.format_version = 0;
  o.struct_version = PULSE_ENCODE_OPTS_VERSION;
  cr_assert_eq(pt_encode(&o, &t, 1, NULL), PULSE_ERR_ARG, "NULL out");

  pulse_encode_tensor e;
  pt_encode_table(&t, 1, &e);
  pulse_buffer b = {NULL, 0};
  e.info.dtype = PULSE_DTYPE_F32;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_DTYPE);
  e.info.dtype = PULSE_DTYPE_BF16;
  e.info.ndim = PULSE_MAX_DIMS + 1;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_ARG, "9 dims");
  e.info.ndim = 1;
  e.info.name = "";
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_ARG, "no name");
  char name[PULSE_MAX_NAME + 2];
  memset(name, 'n', sizeof name);
  name[PULSE_MAX_NAME + 1] = '\0';
  e.info.name = name;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_ARG, "1025 bytes");
  name[PULSE_MAX_NAME] = '\0'; /* 1024 bytes: the longest allowed */
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_OK, "1024 bytes");
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(b.data, b.size, &p), PULSE_OK);
  pulse_patch_tensor pe;
  cr_assert_eq(pulse_patch_tensor_get(p, 0, &pe), PULSE_OK);
  cr_assert_str_eq(pe.info.name, name);
  pulse_patch_free(p);
  pulse_buffer_free(&b);
  pulse_encode_tensor two[2] = {e, e};
  cr_assert_eq(pulse_patch_encode(&o, two, 2, &b), PULSE_ERR_DUPLICATE);
  e.base = NULL;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b), PULSE_ERR_ARG, "no base");
  pt_tensor_free(&t);
}

/* ---------------------------------------------------------------- apply */

typedef struct {
  pt_tensor ts[3];
  pulse_buffer buf;
  pulse_patch *p;
  pulse_host_tensor *h;
  uint16_t *before[3]; /* what each target held before apply */
} apply_fixture;

static void fixture_make(apply_fixture *f, pulse_pos_model model) {
  memset(f, 0, sizeof *f);
  pt_tensor_make1(&f->ts[0], "a", 2000, PT_WEIGHTS_NORMAL, 0.05, 1, 21);
  pt_tensor_make1(&f->ts[1], "b", 1025, PT_WEIGHTS_EDGE, 0.3, 1, 22);
  pt_tensor_make1(&f->ts[2], "c", 77, PT_WEIGHTS_NORMAL, 1.0, 1, 23);
  pulse_encode_opts o = pt_opts(model, 10, 2);
  cr_assert_eq(pt_encode(&o, f->ts, 3, &f->buf), PULSE_OK);
  cr_assert_eq(pulse_patch_open(f->buf.data, f->buf.size, &f->p), PULSE_OK);
  f->h = pt_hosts(f->ts, 3);
}

static void fixture_snapshot(apply_fixture *f) {
  for (int i = 0; i < 3; i++) {
    free(f->before[i]);
    f->before[i] = pt_copy(f->h[i].data, f->h[i].numel);
  }
}

static void fixture_assert_untouched(const apply_fixture *f, const char *what) {
  for (int i = 0; i < 3; i++)
    cr_assert_eq(pt_first_diff(f->before[i], f->h[i].data, f->ts[i].numel),
                 PT_NONE, "%s: target '%s' was modified", what, f->ts[i].name);
}

static void fixture_free(apply_fixture *f) {
  for (int i = 0; i < 3; i++)
    free(f->before[i]);
  pt_hosts_free(f->h, 3);
  pulse_patch_free(f->p);
  pulse_buffer_free(&f->buf);
  pt_tensors_free(f->ts, 3);
}

Test(patch, apply_wrong_base_fails_and_writes_nothing) {
  for (int m = 0; m < 2; m++)
    for (int partial = 0; partial < 2; partial++)
      for (int which = 0; which < 3; which++) {
        apply_fixture f;
        fixture_make(&f, models[m]);
        f.h[which].data[f.ts[which].numel / 2] ^= 0x0001;
        fixture_snapshot(&f);
        pulse_apply_opts ao;
        pulse_apply_opts_init(&ao);
        ao.partial_table = partial;
        ao.threads = 3;
        cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_ERR_BASE_DIGEST,
                     "%s partial %d tensor %d", model_names[m], partial, which);
        fixture_assert_untouched(&f, "wrong base");
        fixture_free(&f);
      }
}

Test(patch, apply_missing_or_misshapen_target_fails_and_writes_nothing) {
  for (int m = 0; m < 2; m++) {
    apply_fixture f;
    fixture_make(&f, models[m]);
    fixture_snapshot(&f);
    pulse_apply_opts ao;
    pulse_apply_opts_init(&ao);
    pulse_host_tensor two[2] = {f.h[0], f.h[2]};
    cr_assert_eq(pulse_patch_apply(f.p, two, 2, &ao), PULSE_ERR_NOT_FOUND);
    fixture_assert_untouched(&f, "missing target");
    f.h[1].name = "B";
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_ERR_NOT_FOUND);
    f.h[1].name = "b";
    f.h[1].numel--;
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_ERR_SIZE_MISMATCH);
    ao.partial_table = 1;
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_ERR_SIZE_MISMATCH);
    f.h[1].numel++;
    fixture_assert_untouched(&f, "wrong numel");
    ao.struct_version = 99;
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_ERR_VERSION);
    cr_assert_eq(pulse_patch_apply(NULL, f.h, 3, NULL), PULSE_ERR_ARG);
    fixture_assert_untouched(&f, "bad arguments");
    fixture_free(&f);
  }
}

Test(patch, apply_partial_table_updates_only_the_given_targets) {
  for (int m = 0; m < 2; m++) {
    apply_fixture f;
    fixture_make(&f, models[m]);
    uint16_t other_bits[5] = {1, 2, 3, 4, 5};
    pulse_host_tensor sub[2] = {f.h[2], {"not.in.patch", other_bits, 5, NULL}};
    pulse_apply_opts ao;
    pulse_apply_opts_init(&ao);
    ao.partial_table = 1;
    cr_assert_eq(pulse_patch_apply(f.p, sub, 2, &ao), PULSE_OK, "%s: %s",
                 model_names[m], pulse_error_detail());
    cr_assert_eq(pt_first_diff(f.ts[2].target, f.h[2].data, f.ts[2].numel),
                 PT_NONE, "subset target reached");
    cr_assert_eq(pt_first_diff(f.ts[0].base, f.h[0].data, f.ts[0].numel),
                 PT_NONE, "absent target untouched");
    cr_assert_eq(other_bits[4], 5, "unnamed target untouched");
    cr_assert_eq(pulse_patch_apply(f.p, NULL, 0, &ao), PULSE_OK, "no target");
    /* The full table too, with a stranger among the targets. */
    pulse_host_tensor all[4] = {f.h[0],
                                f.h[1],
                                {"x", other_bits, 5, NULL},
                                {"c", f.ts[2].target, f.ts[2].numel, NULL}};
    all[3].data = pt_copy(f.ts[2].base, f.ts[2].numel);
    ao.partial_table = 0;
    cr_assert_eq(pulse_patch_apply(f.p, all, 4, &ao), PULSE_OK, "%s",
                 pulse_error_detail());
    for (int i = 0; i < 2; i++)
      cr_assert_eq(pt_first_diff(f.ts[i].target, f.h[i].data, f.ts[i].numel),
                   PT_NONE);
    cr_assert_eq(other_bits[0], 1);
    free(all[3].data);
    fixture_free(&f);
  }
}

Test(patch, apply_with_a_provided_digest) {
  for (int m = 0; m < 2; m++) {
    apply_fixture f;
    fixture_make(&f, models[m]);
    pulse_tensor_digest d[3];
    for (int i = 0; i < 3; i++) {
      d[i] = pulse_digest_bf16(f.ts[i].base, f.ts[i].numel);
      f.h[i].digest = &d[i];
    }
    d[1].b ^= 1; /* a wrong digest is believed: the base does not match */
    fixture_snapshot(&f);
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, NULL), PULSE_ERR_BASE_DIGEST);
    fixture_assert_untouched(&f, "wrong provided digest");
    d[1].b ^= 1;
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, NULL), PULSE_OK, "%s",
                 pulse_error_detail());
    for (int i = 0; i < 3; i++)
      cr_assert_eq(pt_first_diff(f.ts[i].target, f.h[i].data, f.ts[i].numel),
                   PT_NONE, "'%s'", f.ts[i].name);
    /* Applying again: the targets are no longer the base. */
    for (int i = 0; i < 3; i++)
      f.h[i].digest = NULL;
    fixture_snapshot(&f);
    cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, NULL), PULSE_ERR_BASE_DIGEST);
    fixture_assert_untouched(&f, "second apply");
    fixture_free(&f);
  }
}

/* A patch whose state digests (header) are wrong while every tensor digest
 * is right: the full table checks them, a shard holder cannot. */
Test(patch, apply_checks_state_digests_only_for_the_full_table) {
  for (int m = 0; m < 2; m++)
    for (int which = 0; which < 2; which++) {
      apply_fixture f;
      fixture_make(&f, models[m]);
      f.buf.data[(which ? PT_OFF_TARGET_STATE : PT_OFF_BASE_STATE) + 5] ^= 1;
      pulse_patch_free(f.p);
      cr_assert_eq(pulse_patch_open(f.buf.data, f.buf.size, &f.p), PULSE_OK);
      fixture_snapshot(&f);
      cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, NULL),
                   which ? PULSE_ERR_TARGET_DIGEST : PULSE_ERR_BASE_DIGEST);
      fixture_assert_untouched(&f, "state digest");
      pulse_apply_opts ao;
      pulse_apply_opts_init(&ao);
      ao.partial_table = 1;
      cr_assert_eq(pulse_patch_apply(f.p, f.h, 3, &ao), PULSE_OK);
      fixture_free(&f);
    }
}

/* ---------------------------------------------------------------- digest */

Test(digest, replace_matches_recomputing) {
  uint64_t s = 1;
  for (int round = 0; round < 50; round++) {
    uint64_t n = 1 + pulse_rng_below(&s, 3000);
    uint16_t *x = pt_alloc((size_t)n * 2);
    for (uint64_t i = 0; i < n; i++)
      x[i] = (uint16_t)pulse_rng_next(&s);
    pulse_tensor_digest d = pulse_digest_bf16(x, n);
    pulse_changes ch = PULSE_CHANGES_INIT;
    pulse_tensor_digest base = d;
    for (int k = 0; k < 20; k++) {
      uint64_t i = pulse_rng_below(&s, n);
      uint16_t nb = (uint16_t)pulse_rng_next(&s);
      pulse_digest_replace(&d, i, x[i], nb);
      pt_push(&ch, i, x[i], nb);
      x[i] = nb;
      pulse_tensor_digest full = pulse_digest_bf16(x, n);
      cr_assert(d.a == full.a && d.b == full.b, "round %d step %d", round, k);
    }
    pulse_tensor_digest via = pulse_digest_apply_changes(base, &ch);
    cr_assert(via.a == d.a && via.b == d.b, "apply_changes, round %d", round);
    cr_assert(pulse_digest_apply_changes(base, NULL).a == base.a);
    pulse_changes_free(&ch);
    free(x);
  }
}

Test(digest, additive_digest_is_order_independent_and_positional) {
  uint64_t s = 2;
  const uint64_t n = 1001;
  uint16_t *x = pt_alloc(n * 2);
  for (uint64_t i = 0; i < n; i++)
    x[i] = (uint16_t)pulse_rng_next(&s);
  pulse_tensor_digest d = pulse_digest_bf16(x, n);
  /* The element hashes summed backwards, and in two halves. */
  uint64_t a = 0, b = 0;
  for (uint64_t i = n; i-- > 0;) {
    a += pulse_digest_lane_a(pulse_digest_key(i, x[i]));
    b += pulse_digest_lane_b(pulse_digest_key(i, x[i]));
  }
  cr_assert(a == d.a && b == d.b, "sum in reverse order");
  pulse_tensor_digest lo = pulse_digest_bf16(x, 500), hi = {0, 0};
  for (uint64_t i = 500; i < n; i++) {
    hi.a += pulse_digest_lane_a(pulse_digest_key(i, x[i]));
    hi.b += pulse_digest_lane_b(pulse_digest_key(i, x[i]));
  }
  cr_assert(lo.a + hi.a == d.a && lo.b + hi.b == d.b, "halves combine");
  pulse_tensor_digest zero = pulse_digest_bf16(NULL, 0);
  cr_assert(zero.a == 0 && zero.b == 0, "empty tensor");
  /* Swapping two different values changes the digest (index is hashed). */
  x[0] = 0x1111, x[1] = 0x2222;
  pulse_tensor_digest before = pulse_digest_bf16(x, n);
  x[0] = 0x2222, x[1] = 0x1111;
  pulse_tensor_digest after = pulse_digest_bf16(x, n);
  cr_assert(before.a != after.a && before.b != after.b, "positional");
  free(x);
}

Test(digest, state_digest_covers_name_shape_dtype_and_order) {
  pulse_tensor_info info[2];
  memset(info, 0, sizeof info);
  info[0] = (pulse_tensor_info){"ab", PULSE_DTYPE_BF16, 2, {2, 3}};
  info[1] = (pulse_tensor_info){"c", PULSE_DTYPE_BF16, 1, {6}};
  pulse_tensor_digest dg[2] = {{1, 2}, {3, 4}};
  pulse_state_digest ref, d;
  cr_assert_eq(pulse_state_digest_compute(info, dg, 2, &ref), PULSE_OK);
  cr_assert_eq(pulse_state_digest_compute(info, dg, 2, &d), PULSE_OK);
  cr_assert_arr_eq(d.bytes, ref.bytes, 32, "deterministic");
  char hex[65];
  pulse_state_digest_hex(&ref, hex);
  cr_assert_eq(strlen(hex), 64);
  cr_assert_eq(strspn(hex, "0123456789abcdef"), 64, "lower-case hex");

  pulse_tensor_info v[2];
  pulse_tensor_digest vd[2];
  for (int k = 0; k < 9; k++) {
    memcpy(v, info, sizeof v);
    memcpy(vd, dg, sizeof vd);
    size_t count = 2;
    switch (k) {
    case 0:
      v[0].name = "ax";
      break;
    case 1:
      v[0].shape[0] = 3, v[0].shape[1] = 2;
      break;
    case 2:
      v[1].ndim = 2, v[1].shape[1] = 1;
      break;
    case 3:
      v[1].dtype = PULSE_DTYPE_F32;
      break;
    case 4:
      vd[1].b ^= 1;
      break;
    case 5:
      v[0] = info[1], v[1] = info[0], vd[0] = dg[1], vd[1] = dg[0];
      break;
    case 6:
      v[0].name = "a", v[1].name = "bc";
      break; /* same bytes, new split */
    case 7:
      count = 1;
      break;
    default:
      vd[0].a ^= 1ull << 63;
      break;
    }
    cr_assert_eq(pulse_state_digest_compute(v, vd, count, &d), PULSE_OK);
    cr_assert(memcmp(d.bytes, ref.bytes, 32) != 0, "variant %d collides", k);
  }
}
