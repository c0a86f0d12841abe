/* chunk_v3_bytes.c - the v3 prototype (codec/coding/chunk_v3_impl.h) against
 * format version 2 and the entropy bound, per step of a trajectory of BF16
 * safetensors snapshots (same tensors in the same order):
 *
 *   chunk_v3_bytes [--chunk-log2 N] [--reps R] step0.safetensors step1...
 *
 * Per step: changes; the real version 2 patch (pulse_patch_encode, class
 * model) and its parts (tensor table and header, chunk streams); the v3
 * chunk streams and the patch's v3 value model, with the same table
 * (chunk entries and section sizes resized); the bound
 * H(position | tensor, old exponent class) + H(value | old exponent class),
 * both empirical order-0 (tools/bench/bench_entropy.c); v3's bytes by
 * field; decode CPU time of every chunk to the rank form, v2 and v3
 * alternating, median of R. Every v3 chunk is decoded and checked against
 * v2's decode before anything is printed. Not a test: a measuring tool. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bytebuf_impl.h"
#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "patch_impl.h"
#include "pulse_codec.h"
#include "pulse_elem.h"
#include "pulse_safetensors.h"

#define DIE(...) (fprintf(stderr, __VA_ARGS__), fputc('\n', stderr), exit(1))

static double cpu_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static unsigned varint_len(uint64_t v) {
  unsigned n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static double h2_bits(uint64_t n, uint64_t k) {
  if (k == 0 || k >= n)
    return 0.0;
  double p = (double)k / (double)n;
  return -(double)k * log2(p) - (double)(n - k) * log2(1.0 - p);
}

/* One chunk with changes, in rank form. */
typedef struct {
  uint32_t n, k;
  uint8_t *cls;
  uint32_t *rank;
  uint16_t *delta;
  pulse_bytebuf v2, v3;
} chunk;

/* Where a patch's table goes (bytes), field by field as version 2 sends
 * them: what table savings for small steps could take back. */
typedef struct {
  uint64_t names, shapes, counts, digests, chunk_entries, single_chunk_entries,
      model, unchanged, unchanged_target_digests;
} table_parts;

static table_parts table_parts_of(const pulse_patch *p) {
  table_parts t = {0};
  t.model = p->values_size;
  for (size_t i = 0; i < p->count; i++) {
    const patch_tensor *e = &p->tensors[i];
    size_t len = strlen(e->info.name);
    t.names += varint_len(len) + len;
    t.shapes += 2; /* dtype, ndim */
    for (uint32_t d = 0; d < e->info.ndim; d++)
      t.shapes += varint_len(e->info.shape[d]);
    t.counts += varint_len(e->changed) + varint_len(e->section_size);
    t.digests += 32;
    if (e->changed == 0) {
      t.unchanged++;
      t.unchanged_target_digests += 16;
      continue;
    }
    uint64_t bytes = 0;
    for (uint64_t c = 0; c < e->chunk_count; c++)
      bytes += varint_len(p->chunk_changed[e->chunk_first + c]) +
               varint_len(p->chunk_size[e->chunk_first + c]);
    t.chunk_entries += bytes;
    if (e->chunk_count == 1) /* the entry repeats changed and section size */
      t.single_chunk_entries += bytes;
  }
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  unsigned chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT, reps = 5;
  int a = 1;
  for (; a < argc && strncmp(argv[a], "--", 2) == 0; a += 2) {
    if (a + 1 >= argc)
      DIE("%s needs a value", argv[a]);
    if (strcmp(argv[a], "--chunk-log2") == 0)
      chunk_log2 = (unsigned)atoi(argv[a + 1]);
    else if (strcmp(argv[a], "--reps") == 0)
      reps = (unsigned)atoi(argv[a + 1]);
    else
      DIE("unknown option %s", argv[a]);
  }
  if (argc - a < 2)
    DIE("usage: chunk_v3_bytes [--chunk-log2 N] [--reps R] step0.safetensors "
        "step1...");
  printf("step changed | v2 patch (table+hdr, streams) | v3 patch (model, "
         "streams) | bound "
         "(pos|class, val|class) | v2/bound v3/bound v3 streams+model/bound | "
         "v3 fields B/chg: "
         "class count M gaps values raw pad+frame | decode Mchg/cpu-s v2 v3 | "
         "v1 streams, v1 with v2's table / bound | the real v3 patch "
         "(format_version 3), / bound | table fields as version 2 sends "
         "them (version 3 leaves out single-chunk entries, and the target "
         "digest and section size of unchanged tensors): names shapes "
         "counts digests chunk-entries (of single-chunk tensors) model, "
         "unchanged tensors\n");
  pulse_st_file *prev = NULL;
  if (pulse_st_open(argv[a], &prev) != PULSE_OK)
    DIE("cannot open %s", argv[a]);
  for (int f = a + 1; f < argc; f++) {
    pulse_st_file *cur;
    if (pulse_st_open(argv[f], &cur) != PULSE_OK)
      DIE("cannot open %s", argv[f]);
    size_t nt = pulse_st_tensor_count(cur);
    if (nt != pulse_st_tensor_count(prev))
      DIE("tensor counts differ");
    pulse_encode_tensor *et = calloc(nt, sizeof *et);
    pulse_changes *ch = calloc(nt, sizeof *ch);
    chunk *chunks = NULL;
    size_t nchunks = 0, cap = 0;
    pulse_v3_counts *counts = calloc(1, sizeof *counts);
    double pos_bits = 0;
    uint64_t v1_streams = 0, changed = 0,
             *val_class =
                 calloc((size_t)PULSE_CLASS_COUNT << 17, sizeof *val_class);
    uint64_t class_total[PULSE_CLASS_COUNT] = {0};
    /* the chunk-entry and section-size varints v3 changes */
    int64_t table_delta = 0;
    for (size_t i = 0; i < nt; i++) {
      pulse_st_tensor to, tn;
      pulse_st_tensor_get(prev, i, &to);
      pulse_st_tensor_get(cur, i, &tn);
      if (to.dtype != PULSE_DTYPE_BF16 || tn.numel != to.numel)
        DIE("tensor %zu: not BF16 or shapes differ", i);
      const uint16_t *o = to.data, *nw = tn.data;
      pulse_changes *c = &ch[i];
      c->pos = malloc(tn.numel * sizeof *c->pos + 1);
      c->old_bits = malloc(tn.numel * 2 + 1);
      c->new_bits = malloc(tn.numel * 2 + 1);
      for (uint64_t j = 0; j < tn.numel; j++)
        if (o[j] != nw[j]) {
          c->pos[c->count] = j;
          c->old_bits[c->count] = o[j];
          c->new_bits[c->count++] = nw[j];
        }
      c->capacity = c->count;
      changed += c->count;
      et[i].info.name = to.name;
      et[i].info.dtype = PULSE_DTYPE_BF16;
      et[i].info.ndim = to.ndim;
      memcpy(et[i].info.shape, to.shape, sizeof to.shape);
      et[i].base = o;
      et[i].changes = c;
      /* the bound's position part, per (tensor, class) */
      uint64_t nc[PULSE_CLASS_COUNT] = {0}, kc[PULSE_CLASS_COUNT] = {0};
      for (uint64_t j = 0; j < tn.numel; j++)
        nc[pulse_bf16_class(o[j])]++;
      for (uint64_t j = 0; j < c->count; j++) {
        unsigned cl = pulse_bf16_class(c->old_bits[j]);
        kc[cl]++;
        class_total[cl]++;
        val_class[(size_t)cl << 17 | pulse_zigzag16(pulse_bf16_delta(
                                         c->old_bits[j], c->new_bits[j]))]++;
      }
      for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
        pos_bits += h2_bits(nc[cl], kc[cl]);
      /* chunks */
      uint64_t csize = 1ull << chunk_log2, j = 0;
      uint64_t sec_v2 = 0;
      for (uint64_t first = 0; first < tn.numel; first += csize) {
        uint32_t n =
            (uint32_t)(tn.numel - first < csize ? tn.numel - first : csize);
        uint64_t j0 = j;
        while (j < c->count && c->pos[j] < first + n)
          j++;
        uint32_t k = (uint32_t)(j - j0);
        if (k == 0)
          continue;
        if (nchunks == cap) {
          cap = cap ? 2 * cap : 64;
          chunks = realloc(chunks, cap * sizeof *chunks);
        }
        chunk *q = &chunks[nchunks++];
        memset(q, 0, sizeof *q);
        q->n = n, q->k = k;
        q->cls = malloc(k), q->rank = malloc(4u * k), q->delta = malloc(2u * k);
        uint32_t *cpos = malloc(4u * k), hist[PULSE_CLASS_COUNT];
        for (uint32_t t = 0; t < k; t++) {
          cpos[t] = (uint32_t)(c->pos[j0 + t] - first);
          q->delta[t] =
              pulse_bf16_delta(c->old_bits[j0 + t], c->new_bits[j0 + t]);
        }
        pulse_chunk_classify(o + first, n, cpos, k, hist, q->rank, q->cls);
        free(cpos);
        pulse_v3_count(counts, q->cls, q->delta, k);
        if (pulse_chunk2_encode_ranks(PULSE_POS_CLASS, k, q->cls, q->rank,
                                      q->delta, &q->v2) != PULSE_OK)
          DIE("v2 encode failed");
        sec_v2 += q->v2.size;
        pulse_bytebuf v1 = {0};
        if (pulse_chunk_encode_ranks(1, NULL, PULSE_POS_CLASS, hist, n, k,
                                     q->cls, q->rank, q->delta,
                                     &v1) != PULSE_OK)
          DIE("v1 encode failed");
        v1_streams += v1.size;
        pulse_bytebuf_free(&v1);
      }
      (void)sec_v2;
    }
    /* the real v2 patch */
    pulse_encode_opts opts;
    pulse_encode_opts_init(&opts);
    opts.pos_model = PULSE_POS_CLASS;
    opts.chunk_log2 = chunk_log2;
    opts.format_version = 2;
    opts.step = 1;
    pulse_buffer patch = {0};
    if (pulse_patch_encode(&opts, et, nt, &patch) != PULSE_OK)
      DIE("patch encode failed");
    uint64_t v2_streams = 0;
    for (size_t q = 0; q < nchunks; q++)
      v2_streams += chunks[q].v2.size;
    uint64_t table = patch.size - v2_streams;
    /* v3 */
    pulse_v3_model *model;
    if (pulse_v3_model_build(counts, &model) != PULSE_OK)
      DIE("model build failed");
    pulse_bytebuf mb = {0};
    pulse_v3_model_write(model, &mb);
    size_t used;
    pulse_v3_model *model2;
    if (pulse_v3_model_read(mb.data, mb.size, &used, &model2) != PULSE_OK ||
        used != mb.size)
      DIE("model read back failed");
    pulse_v3_stats stats = {0};
    uint64_t v3_streams = 0;
    uint32_t *start = malloc((PULSE_CLASS_COUNT + 1) * sizeof *start);
    uint32_t *rk = NULL, *rk2 = NULL;
    uint16_t *dl = NULL, *dl2 = NULL;
    size_t kmax = 0;
    for (size_t q = 0; q < nchunks; q++)
      kmax = chunks[q].k > kmax ? chunks[q].k : kmax;
    rk = malloc(4 * kmax + 4), rk2 = malloc(4 * kmax + 4);
    dl = malloc(2 * kmax + 2), dl2 = malloc(2 * kmax + 2);
    uint32_t start2[PULSE_CLASS_COUNT + 1];
    for (size_t q = 0; q < nchunks; q++) {
      chunk *c = &chunks[q];
      if (pulse_chunk3_encode_ranks(model, c->k, c->cls, c->rank, c->delta,
                                    &c->v3, &stats) != PULSE_OK)
        DIE("v3 encode failed");
      v3_streams += c->v3.size;
      table_delta +=
          (int64_t)varint_len(c->v3.size) - (int64_t)varint_len(c->v2.size);
      if (pulse_chunk2_decode_ranks(PULSE_POS_CLASS, NULL, c->n, c->v2.data,
                                    c->v2.size, c->k, start, rk,
                                    dl) != PULSE_OK ||
          pulse_chunk3_decode_ranks(model2, NULL, c->n, c->v3.data, c->v3.size,
                                    c->k, start2, rk2, dl2) != PULSE_OK)
        DIE("decode failed");
      if (memcmp(start, start2, sizeof start2) || memcmp(rk, rk2, 4u * c->k) ||
          memcmp(dl, dl2, 2u * c->k))
        DIE("v3 decode differs from v2's");
    }
    /* The real version 3 patch (format_version 3), which must hold these
     * very streams and model: its size is the estimate's but for the
     * section sizes' varints. */
    opts.format_version = 3;
    pulse_buffer patch3 = {0};
    if (pulse_patch_encode(&opts, et, nt, &patch3) != PULSE_OK)
      DIE("v3 patch encode failed: %s", pulse_error_detail());
    pulse_patch *p3 = NULL;
    if (pulse_patch_open(patch3.data, patch3.size, &p3) != PULSE_OK)
      DIE("v3 patch open failed: %s", pulse_error_detail());
    table_parts tp = table_parts_of(p3);
    pulse_patch_free(p3);
    /* section sizes: approximate per chunk (one chunk per tensor here) */
    uint64_t v3_total =
        (uint64_t)((int64_t)table + table_delta) + mb.size + v3_streams;
    /* the bound's value part */
    double val_bits = 0;
    for (size_t x = 0; x < ((size_t)PULSE_CLASS_COUNT << 17); x++)
      if (val_class[x])
        val_bits -= (double)val_class[x] *
                    log2((double)val_class[x] / (double)class_total[x >> 17]);
    double bound = (pos_bits + val_bits) / 8.0;
    /* decode speed, alternating */
    double *t2 = malloc(reps * sizeof *t2), *t3 = malloc(reps * sizeof *t3);
    for (unsigned r = 0; r < reps; r++) {
      double s = cpu_now();
      for (size_t q = 0; q < nchunks; q++)
        pulse_chunk2_decode_ranks(PULSE_POS_CLASS, NULL, chunks[q].n,
                                  chunks[q].v2.data, chunks[q].v2.size,
                                  chunks[q].k, start, rk, dl);
      double m = cpu_now();
      for (size_t q = 0; q < nchunks; q++)
        pulse_chunk3_decode_ranks(model2, NULL, chunks[q].n, chunks[q].v3.data,
                                  chunks[q].v3.size, chunks[q].k, start2, rk2,
                                  dl2);
      t2[r] = m - s;
      t3[r] = cpu_now() - m;
    }
    qsort(t2, reps, sizeof *t2, cmp_double);
    qsort(t3, reps, sizeof *t3, cmp_double);
    double N = (double)changed;
    printf(
        "%d %llu | %llu (%llu, %llu) | %llu (%zu, %llu) | %.0f (%.0f, %.0f) "
        "| %.3f %.3f %.3f | "
        "%.4f %.4f %.4f %.4f %.4f %.4f %.4f | %.1f %.1f | %llu %.3f | "
        "%zu %.3f | %llu %llu %llu %llu %llu (%llu) %llu, %llu\n",
        f - a, (unsigned long long)changed, (unsigned long long)patch.size,
        (unsigned long long)table, (unsigned long long)v2_streams,
        (unsigned long long)v3_total, mb.size, (unsigned long long)v3_streams,
        bound, pos_bits / 8, val_bits / 8, (double)patch.size / bound,
        (double)v3_total / bound, (double)(v3_streams + mb.size) / bound,
        stats.class_bits / 8.0 / N, stats.count_bits / 8.0 / N,
        stats.m_bits / 8.0 / N, stats.gap_bits / 8.0 / N,
        (double)stats.value_bytes / N, stats.raw_bits / 8.0 / N,
        (stats.pad_bits / 8.0 + (double)stats.frame_bytes) / N,
        N / t2[reps / 2] / 1e6, N / t3[reps / 2] / 1e6,
        (unsigned long long)v1_streams, (double)(table + v1_streams) / bound,
        patch3.size, (double)patch3.size / bound, (unsigned long long)tp.names,
        (unsigned long long)tp.shapes, (unsigned long long)tp.counts,
        (unsigned long long)tp.digests, (unsigned long long)tp.chunk_entries,
        (unsigned long long)tp.single_chunk_entries,
        (unsigned long long)tp.model, (unsigned long long)tp.unchanged);
    fflush(stdout);
    free(t2), free(t3), free(start), free(rk), free(rk2), free(dl), free(dl2);
    for (size_t q = 0; q < nchunks; q++) {
      free(chunks[q].cls), free(chunks[q].rank), free(chunks[q].delta);
      pulse_bytebuf_free(&chunks[q].v2), pulse_bytebuf_free(&chunks[q].v3);
    }
    free(chunks);
    pulse_bytebuf_free(&mb);
    pulse_v3_model_free(model), pulse_v3_model_free(model2);
    pulse_buffer_free(&patch);
    pulse_buffer_free(&patch3);
    for (size_t i = 0; i < nt; i++)
      free(ch[i].pos), free(ch[i].old_bits), free(ch[i].new_bits);
    free(ch), free(et), free(counts), free(val_class);
    pulse_st_close(prev);
    prev = cur;
  }
  pulse_st_close(prev);
  return 0;
}
