/* test_cuda_apply.c - the apply primitives against the CPU: tensor digests
 * (pulse_digest_bf16), digest moves of change lists
 * (pulse_digest_apply_changes), scatter, the class counts of a device base
 * (pulse_chunk_classify) and locate (pulse_chunk_locate), on single tensors
 * and tables, with edge values and sizes around warp and tile edges. */
#include "chunk_impl.h"
#include "cuda_testutil.h"

/* A table of BF16 tensors on host and device. */
typedef struct {
  size_t count;
  uint64_t *numel;
  uint16_t **host;
  pulse_cuda_bf16_tensor *dev;
} bt_table;

static bt_table bt_make(uint64_t seed, const uint64_t *numel, size_t count,
                        tu_values kind) {
  bt_table b = {count, tu_alloc((count + 1) * 8),
                tu_alloc((count + 1) * sizeof(uint16_t *)),
                tu_alloc((count + 1) * sizeof(pulse_cuda_bf16_tensor))};
  for (size_t t = 0; t < count; t++) {
    b.numel[t] = numel[t];
    b.host[t] = tu_alloc((size_t)numel[t] * 2);
    for (uint64_t i = 0; i < numel[t]; i++) {
      uint64_t r = pulse_rng_at(seed + t, i);
      b.host[t][i] = kind == TU_EDGE && r % 4 == 0
                         ? tu_bf16_edges[(r >> 8) % COUNT_OF(tu_bf16_edges)]
                         : pulse_bf16_from_f32_bits(tu_f32(r, kind));
    }
    b.dev[t].data_d = dev_upload(b.host[t], (size_t)numel[t] * 2);
    b.dev[t].numel = numel[t];
  }
  return b;
}

static void bt_free(bt_table *b) {
  for (size_t t = 0; t < b->count; t++) {
    free(b->host[t]);
    pulse_cuda_free(b->dev[t].data_d);
  }
  free(b->numel), free(b->host), free(b->dev);
}

/* Random strictly increasing positions at a density, per tensor, with new
 * bits != old; flattened with ranges first[count + 1]. */
typedef struct {
  pulse_changes *ch; /* per tensor */
  uint64_t *first;
  uint64_t *pos;
  uint16_t *old_bits, *new_bits;
} changes_set;

static changes_set changes_make(const bt_table *b, uint64_t seed,
                                double density) {
  changes_set c = {tu_alloc((b->count + 1) * sizeof(pulse_changes)),
                   tu_alloc((b->count + 1) * 8), NULL, NULL, NULL};
  for (size_t t = 0; t < b->count; t++) {
    c.ch[t] = (pulse_changes)PULSE_CHANGES_INIT;
    for (uint64_t i = 0; i < b->numel[t]; i++) {
      uint64_t r = pulse_rng_at(seed + 31 * t, i);
      if (tu_chance(r, density))
        OK(pulse_changes_push(&c.ch[t], i, b->host[t][i],
                              tu_other_bf16(b->host[t][i], r)));
    }
    c.first[t + 1] = c.first[t] + c.ch[t].count;
  }
  uint64_t k = c.first[b->count];
  c.pos = tu_alloc((size_t)k * 8);
  c.old_bits = tu_alloc((size_t)k * 2);
  c.new_bits = tu_alloc((size_t)k * 2);
  for (size_t t = 0; t < b->count; t++) {
    if (c.ch[t].count == 0)
      continue;
    memcpy(c.pos + c.first[t], c.ch[t].pos, (size_t)c.ch[t].count * 8);
    memcpy(c.old_bits + c.first[t], c.ch[t].old_bits,
           (size_t)c.ch[t].count * 2);
    memcpy(c.new_bits + c.first[t], c.ch[t].new_bits,
           (size_t)c.ch[t].count * 2);
  }
  return c;
}

static void changes_free(changes_set *c, size_t count) {
  for (size_t t = 0; t < count; t++)
    pulse_changes_free(&c->ch[t]);
  free(c->ch), free(c->first), free(c->pos), free(c->old_bits),
      free(c->new_bits);
}

static const uint64_t sizes_a[] = {0,    1,    2,    31,   32,   33,   1023,
                                   1024, 1025, 8191, 8192, 8193, 50001};

Test(cuda_apply, digests_match_pulse_digest_bf16) {
  GPU_TEST_START();
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (int kind = 0; kind < 4; kind++) {
    bt_table b =
        bt_make(100 + kind, sizes_a, COUNT_OF(sizes_a), (tu_values)kind);
    pulse_tensor_digest *d = tu_alloc(COUNT_OF(sizes_a) * sizeof *d);
    OK(pulse_cuda_digest(ws, b.dev, b.count, d, NULL));
    for (size_t t = 0; t < b.count; t++) {
      pulse_tensor_digest want = pulse_digest_bf16(b.host[t], b.numel[t]);
      cr_assert(d[t].a == want.a && d[t].b == want.b,
                "kind %d tensor %zu (%llu elements)", kind, t,
                (unsigned long long)b.numel[t]);
    }
    /* Tensor by tensor, without a workspace, gives the same. */
    for (size_t t = 0; t < b.count; t += 5) {
      pulse_tensor_digest one;
      OK(pulse_cuda_digest(NULL, &b.dev[t], 1, &one, NULL));
      cr_assert(one.a == d[t].a && one.b == d[t].b);
    }
    free(d);
    bt_free(&b);
  }
  OK(pulse_cuda_digest(ws, NULL, 0, NULL, NULL));
  pulse_cuda_workspace_free(ws);
}

Test(cuda_apply, digest_moves_and_scatter_match_the_cpu) {
  GPU_TEST_START();
  static const double densities[] = {0.0, 0.003, 0.1, 1.0};
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (size_t di = 0; di < COUNT_OF(densities); di++) {
    bt_table b = bt_make(200 + di, sizes_a, COUNT_OF(sizes_a), TU_EDGE);
    changes_set c = changes_make(&b, 300 + di, densities[di]);
    uint64_t k = c.first[b.count];
    void *pos_d = dev_upload(c.pos, (size_t)k * 8),
         *old_d = dev_upload(c.old_bits, (size_t)k * 2),
         *new_d = dev_upload(c.new_bits, (size_t)k * 2);
    pulse_tensor_digest *moves = tu_alloc(b.count * sizeof *moves);
    OK(pulse_cuda_changes_digest(ws, c.first, b.count, pos_d, old_d, new_d,
                                 moves, NULL));
    for (size_t t = 0; t < b.count; t++) {
      pulse_tensor_digest base = pulse_digest_bf16(b.host[t], b.numel[t]);
      pulse_tensor_digest want = pulse_digest_apply_changes(base, &c.ch[t]);
      cr_assert(base.a + moves[t].a == want.a && base.b + moves[t].b == want.b,
                "density %g tensor %zu", densities[di], t);
    }
    OK(pulse_cuda_scatter(ws, b.dev, b.count, c.first, pos_d, new_d, NULL));
    for (size_t t = 0; t < b.count; t++) {
      for (uint64_t j = 0; j < c.ch[t].count; j++)
        b.host[t][c.ch[t].pos[j]] = c.ch[t].new_bits[j];
      uint16_t *got = dev_download(b.dev[t].data_d, (size_t)b.numel[t] * 2);
      cr_assert_eq(tu_memdiff(got, b.host[t], (size_t)b.numel[t] * 2), -1,
                   "density %g tensor %zu", densities[di], t);
      free(got);
    }
    free(moves);
    pulse_cuda_free(pos_d), pulse_cuda_free(old_d), pulse_cuda_free(new_d);
    changes_free(&c, b.count);
    bt_free(&b);
  }
  pulse_cuda_workspace_free(ws);
}

Test(cuda_apply, scatter_refuses_positions_past_the_tensor) {
  GPU_TEST_START();
  uint64_t numel[2] = {100, 50};
  bt_table b = bt_make(9, numel, 2, TU_NORMAL);
  uint64_t first[3] = {0, 1, 3}, pos[3] = {5, 7, 50};
  uint16_t nb[3] = {1, 2, 3};
  void *pos_d = dev_upload(pos, sizeof pos), *new_d = dev_upload(nb, sizeof nb);
  cr_assert_eq(pulse_cuda_scatter(NULL, b.dev, 2, first, pos_d, new_d, NULL),
               PULSE_ERR_POSITION);
  uint16_t *got = dev_download(b.dev[1].data_d, 100);
  cr_assert_eq(got[7], 2, "the entries in range are written");
  free(got);
  pulse_cuda_free(pos_d), pulse_cuda_free(new_d);
  bt_free(&b);
}

/* The class-rank entries of a chunk's changes, class-major (what
 * pulse_chunk_decode_ranks gives), with the position each one must map to. */
typedef struct {
  uint64_t *chunk_first; /* index chunks + 1 */
  uint8_t *cls;
  uint32_t *rank;
  uint64_t *want_pos;
  uint64_t entries;
} locate_case;

static locate_case locate_make(const bt_table *b, const changes_set *c,
                               uint32_t chunk_log2, const uint32_t *index_hist,
                               uint64_t chunks) {
  locate_case lc = {tu_alloc((size_t)(chunks + 1) * 8), NULL, NULL, NULL,
                    c->first[b->count]};
  lc.cls = tu_alloc((size_t)lc.entries + 1);
  lc.rank = tu_alloc((size_t)lc.entries * 4 + 4);
  lc.want_pos = tu_alloc((size_t)lc.entries * 8 + 8);
  uint64_t g = 0, at = 0;
  for (size_t t = 0; t < b->count; t++) {
    const pulse_changes *ch = &c->ch[t];
    uint64_t n = b->numel[t], tchunks = n ? ((n - 1) >> chunk_log2) + 1 : 0,
             j = 0;
    for (uint64_t cc = 0; cc < tchunks; cc++, g++) {
      uint64_t first = cc << chunk_log2, left = n - first,
               full = 1ull << chunk_log2;
      uint32_t m = (uint32_t)(left < full ? left : full);
      uint64_t j0 = j;
      while (j < ch->count && (ch->pos[j] >> chunk_log2) == cc)
        j++;
      uint32_t k = (uint32_t)(j - j0);
      lc.chunk_first[g] = at;
      uint32_t hist[PULSE_CLASS_COUNT];
      uint32_t *pos = tu_alloc((size_t)k * 4 + 4),
               *rank = tu_alloc((size_t)k * 4 + 4);
      uint8_t *cls = tu_alloc((size_t)k + 1);
      for (uint32_t e = 0; e < k; e++)
        pos[e] = (uint32_t)(ch->pos[j0 + e] - first);
      pulse_chunk_classify(b->host[t] + first, m, pos, k, hist, rank, cls);
      cr_assert_eq(
          memcmp(hist, index_hist + g * PULSE_CLASS_COUNT, sizeof hist), 0,
          "tensor %zu chunk %llu: class counts", t, (unsigned long long)cc);
      /* Class-major: a stable pass per class keeps ranks increasing. */
      uint32_t start[PULSE_CLASS_COUNT + 1];
      start[0] = 0;
      for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++) {
        uint32_t kc = 0;
        for (uint32_t e = 0; e < k; e++)
          if (cls[e] == cl) {
            lc.cls[at] = (uint8_t)cl;
            lc.rank[at] = rank[e];
            lc.want_pos[at] = first + pos[e];
            at++;
            kc++;
          }
        start[cl + 1] = start[cl] + kc;
      }
      /* pulse_chunk_locate (the CPU) finds the same positions, in storage
       * order: tag each entry with its index as the delta. */
      if (k > 0 && k < 65536) {
        uint16_t *tag = tu_alloc((size_t)k * 2),
                 *tag_out = tu_alloc((size_t)k * 2);
        uint64_t *cpu_pos = tu_alloc((size_t)k * 8);
        for (uint32_t e = 0; e < k; e++)
          tag[e] = (uint16_t)e;
        pulse_chunk_locate(b->host[t] + first, m, k, start, lc.rank + (at - k),
                           tag, first, cpu_pos, tag_out);
        for (uint32_t e = 0; e < k; e++)
          cr_assert_eq(cpu_pos[e], lc.want_pos[at - k + tag_out[e]]);
        free(tag), free(tag_out), free(cpu_pos);
      }
      free(pos), free(rank), free(cls);
    }
  }
  lc.chunk_first[g] = at;
  cr_assert_eq(g, chunks);
  return lc;
}

static void locate_free(locate_case *lc) {
  free(lc->chunk_first), free(lc->cls), free(lc->rank), free(lc->want_pos);
}

Test(cuda_apply, class_counts_and_locate_match_the_cpu) {
  GPU_TEST_START();
  static const double densities[] = {0.0, 0.001, 0.02, 0.5, 1.0};
  static const uint32_t chunk_log2s[] = {10, 13, 14, 16, 20};
  static const uint64_t sizes[] = {0,    1,     33,    1024,  5000,
                                   8192, 16385, 70000, 130001};
  for (size_t di = 0; di < COUNT_OF(densities); di++)
    for (int kind = 0; kind < 4; kind++) {
      uint32_t chunk_log2 =
          chunk_log2s[(di + (size_t)kind) % COUNT_OF(chunk_log2s)];
      bt_table b = bt_make(400 + di * 4 + (size_t)kind, sizes, COUNT_OF(sizes),
                           (tu_values)kind);
      changes_set c = changes_make(&b, 500 + di, densities[di]);
      pulse_cuda_class_index *idx = NULL;
      OK(pulse_cuda_class_index_build(b.dev, b.count, chunk_log2, NULL, &idx));
      uint64_t chunks = 0;
      const uint32_t *hist = pulse_cuda_class_index_hist(idx, &chunks);
      locate_case lc = locate_make(&b, &c, chunk_log2, hist, chunks);
      void *pos_d = dev_alloc((size_t)lc.entries * 8 + 8);
      OK(pulse_cuda_locate(idx, lc.chunk_first, lc.cls, lc.rank, pos_d, NULL));
      uint64_t *got = dev_download(pos_d, (size_t)lc.entries * 8);
      cr_assert_eq(tu_memdiff(got, lc.want_pos, (size_t)lc.entries * 8), -1,
                   "density %g kind %d chunk 2^%u: positions", densities[di],
                   kind, chunk_log2);
      free(got);
      /* Refused: a rank past its class, entries out of order. */
      if (lc.entries >= 2) {
        uint32_t saved = lc.rank[0];
        uint64_t g0 = 0; /* the chunk of entry 0 */
        while (lc.chunk_first[g0 + 1] == 0)
          g0++;
        lc.rank[0] = hist[g0 * PULSE_CLASS_COUNT + lc.cls[0]];
        cr_assert_eq(pulse_cuda_locate(idx, lc.chunk_first, lc.cls, lc.rank,
                                       pos_d, NULL),
                     PULSE_ERR_POSITION);
        lc.rank[0] = saved;
        if (lc.chunk_first[g0 + 1] >= 2) {
          uint32_t r0 = lc.rank[0];
          uint8_t c0 = lc.cls[0];
          lc.rank[0] = lc.rank[1], lc.cls[0] = lc.cls[1];
          cr_assert_eq(pulse_cuda_locate(idx, lc.chunk_first, lc.cls, lc.rank,
                                         pos_d, NULL),
                       PULSE_ERR_POSITION);
          lc.rank[0] = r0, lc.cls[0] = c0;
        }
      }
      pulse_cuda_free(pos_d);
      locate_free(&lc);
      pulse_cuda_class_index_free(idx);
      changes_free(&c, b.count);
      bt_free(&b);
    }
}
