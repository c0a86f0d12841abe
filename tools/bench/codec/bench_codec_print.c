/* bench_codec_print.c - what `pulse-bench codec` prints of one step: the
 * sizes of every coding against the bound and the baselines, the
 * throughputs, as text or as one JSON object; the bound and its allowance
 * the summary uses too. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bench_codec_impl.h"

double bench_codec_bound_bytes(const bench_entropy_bits *e) {
  return (e->positions_class_bits + e->values_bits) / 8.0;
}

/* The size target: within 5% of the bound plus 96 bytes per tensor. */
double bench_codec_allowance_bytes(const step_result *r) {
  return 1.05 * bench_codec_bound_bytes(&r->ent) + 96.0 * (double)r->tensors;
}

typedef struct {
  const char *label;
  double bytes;
} row;

/* The baselines' rows, in output order: each encoding raw (where it has a
 * raw row), then through zstd at every level. */
static size_t baseline_rows(const bench_baseline_bytes *b, row *rows,
                            char (*labels)[96]) {
  size_t n = 0;
  for (int k = 0; k < BENCH_ZKINDS; k++) {
    if (k == BENCH_DENSE_Z)
      rows[n++] = (row){"dense BF16", (double)b->dense};
    if (k == BENCH_INT32_Z)
      rows[n++] = (row){"int32 index + BF16 value", (double)b->int32_bf16};
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
      bench_baseline_label(k, l, labels[n], sizeof labels[n]);
      if (k == BENCH_DENSE_Z && l == 2 && b->dense_z19_read < b->dense)
        strcat(labels[n], " (sampled)");
      rows[n] = (row){labels[n], (double)b->zstd[k][l]};
      n++;
    }
  }
  return n;
}

void bench_codec_print_rows(const step_result *r, double divide) {
  row rows[10 + 2 + BENCH_ZKINDS * BENCH_ZSTD_LEVELS] = {
      {bench_codec_codings[0].label, (double)r->bytes[0]},
      {bench_codec_codings[1].label, (double)r->bytes[1]},
      {bench_codec_codings[2].label, (double)r->bytes[2]},
      {bench_codec_codings[3].label, (double)r->bytes[3]},
      {bench_codec_codings[4].label, (double)r->bytes[4]},
      {"entropy bound (positions|class + values)",
       bench_codec_bound_bytes(&r->ent)},
      {"  positions | tensor, old exponent class",
       r->ent.positions_class_bits / 8.0},
      {"  positions | tensor only", r->ent.positions_tensor_bits / 8.0},
      {"  values (zig-zag delta)", r->ent.values_bits / 8.0},
      {"  values | old exponent class", r->ent.values_class_bits / 8.0},
  };
  char labels[sizeof rows / sizeof rows[0]][96];
  size_t n = 10 + baseline_rows(&r->base, rows + 10, labels + 10);
  printf("  %-44s %14s %10s\n", "encoding", "bytes", "B/changed");
  for (size_t i = 0; i < n; i++) {
    char b[32];
    printf("  %-44s %14s %10.3f\n", rows[i].label,
           bench_codec_fmt_u64((uint64_t)(rows[i].bytes / divide + 0.5), b),
           bench_codec_per(rows[i].bytes, (double)r->changed));
  }
  int kind, li;
  char best[96], b[32];
  uint64_t bb = bench_baseline_best(&r->base, &kind, &li);
  bench_baseline_label(kind, li, best, sizeof best);
  printf("  the baseline (the smallest zstd row measured whole): %s, %s bytes; "
         "v2 is %.2fx smaller\n",
         best, bench_codec_fmt_u64((uint64_t)((double)bb / divide + 0.5), b),
         bench_codec_per((double)bb, (double)r->bytes[0]));
}

static void print_speeds(const step_result *r) {
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  printf("  detect   %.1f MB (weights + snapshot) in %.2f ms = %.2f GB/s; "
         "memcpy %.2f GB/s\n",
         moved / 1e6, r->detect_s * 1e3,
         bench_codec_per(moved, r->detect_s) / 1e9,
         bench_codec_per(moved, r->memcpy_s) / 1e9);
  printf("  %-36s %10s %10s %12s %14s %14s\n", "coding", "encode ms",
         "apply ms", "M changed/s", "indexed M/s (+)", "decode M/s (*)");
  for (int k = 0; k < CODINGS; k++) {
    char dec[32] = "-", ix[32] = "-";
    if (r->decode_s[k] > 0)
      snprintf(dec, sizeof dec, "%.1f",
               bench_codec_per((double)r->changed, r->decode_s[k]) / 1e6);
    if (r->apply_indexed_s[k] > 0)
      snprintf(ix, sizeof ix, "%.1f",
               bench_codec_per((double)r->changed, r->apply_indexed_s[k]) /
                   1e6);
    printf("  %-36s %10.2f %10.2f %12.1f %14s %14s\n",
           bench_codec_codings[k].label, r->encode_s[k] * 1e3,
           r->apply_s[k] * 1e3,
           bench_codec_per((double)r->changed, r->apply_s[k]) / 1e6, ix, dec);
  }
  printf("  (+) through a receiver's class index (%.2f B/param, built in %.1f "
         "ms), its upkeep "
         "included\n",
         bench_codec_per((double)r->index_bytes, (double)r->params),
         r->index_build_s * 1e3);
  printf("  (*) streams alone, without the base: the host's share of a GPU "
         "apply\n");
  printf("  default coding in CPU time (every thread's): %.1f M changed/s "
         "plain, %.1f through the index\n",
         bench_codec_per((double)r->changed, r->apply_cpu_s) / 1e6,
         bench_codec_per((double)r->changed, r->apply_indexed_cpu_s) / 1e6);
}

void bench_codec_print_step_text(const step_result *r) {
  char b1[32], b2[32];
  printf("\nstep %" PRIu64 " (base %" PRIu64 "): %s of %s changed (%.3f%%), "
         "verify OK",
         r->step, r->base_step, bench_codec_fmt_u64(r->changed, b1),
         bench_codec_fmt_u64(r->params, b2),
         100.0 * bench_codec_per((double)r->changed, (double)r->params));
  if (r->generate_s > 0)
    printf(" (generated in %.2f s)", r->generate_s);
  printf("\n");
  bench_codec_print_rows(r, 1.0);
  print_speeds(r);
}

/* The baselines' sizes ("bytes_<key>"), or with `per_changed` their bytes
 * per changed parameter ("<key>_per_changed"), and the baseline named. */
void bench_codec_print_baselines_json(const bench_baseline_bytes *b,
                                      const double *per_changed) {
  char key[64];
  double c = per_changed ? *per_changed : 0;
  if (per_changed)
    printf(",\"dense_per_changed\":%.6g,\"int32_bf16_per_changed\":%.6g",
           bench_codec_per((double)b->dense, c),
           bench_codec_per((double)b->int32_bf16, c));
  else
    printf(",\"bytes_dense\":%" PRIu64 ",\"bytes_int32_bf16\":%" PRIu64,
           b->dense, b->int32_bf16);
  for (int k = 0; k < BENCH_ZKINDS; k++)
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++) {
      bench_baseline_key(k, l, key, sizeof key);
      if (per_changed)
        printf(",\"%s_per_changed\":%.6g", key,
               bench_codec_per((double)b->zstd[k][l], c));
      else
        printf(",\"bytes_%s\":%" PRIu64, key, b->zstd[k][l]);
    }
  int kind, li;
  uint64_t best = bench_baseline_best(b, &kind, &li);
  char label[96];
  bench_baseline_key(kind, li, key, sizeof key);
  bench_baseline_label(kind, li, label, sizeof label);
  printf(",\"dense_zstd19_read_bytes\":%" PRIu64 ",\"baseline\":\"%s\""
         ",\"baseline_name\":\"%s\"",
         b->dense_z19_read, key, label);
  if (per_changed)
    printf(",\"baseline_per_changed\":%.6g", bench_codec_per((double)best, c));
  else
    printf(",\"bytes_baseline\":%" PRIu64, best);
}

void bench_codec_print_step_json(const step_result *r) {
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  printf("{\"step\":%" PRIu64 ",\"base_step\":%" PRIu64 ",\"params\":%" PRIu64
         ",\"changed\":%" PRIu64 ",\"density\":%.6g",
         r->step, r->base_step, r->params, r->changed,
         bench_codec_per((double)r->changed, (double)r->params));
  for (int k = 0; k < CODINGS; k++)
    printf(",\"bytes_%s\":%" PRIu64, bench_codec_codings[k].key, r->bytes[k]);
  bench_codec_print_baselines_json(&r->base, NULL);
  printf(",\"tensors\":%" PRIu64 ",\"bound_allowance_bytes\":%.1f", r->tensors,
         bench_codec_allowance_bytes(r));
  printf(",\"bound_bytes\":%.1f,\"bound_positions_bytes\":%.1f"
         ",\"bound_positions_tensor_bytes\":%.1f,\"bound_values_bytes\":%.1f"
         ",\"bound_values_class_bytes\":%.1f",
         bench_codec_bound_bytes(&r->ent), r->ent.positions_class_bits / 8.0,
         r->ent.positions_tensor_bits / 8.0, r->ent.values_bits / 8.0,
         r->ent.values_class_bits / 8.0);
  printf(",\"weight_bytes\":%" PRIu64 ",\"snapshot_bytes\":%" PRIu64
         ",\"detect_s\":%.6g,\"encode_bytes_per_s\":%.6g"
         ",\"memcpy_bytes_per_s\":%.6g",
         r->weight_bytes, r->snapshot_bytes, r->detect_s,
         bench_codec_per(moved, r->detect_s),
         bench_codec_per(moved, r->memcpy_s));
  for (int k = 0; k < CODINGS; k++)
    printf(",\"patch_encode_%s_s\":%.6g,\"apply_%s_s\":%.6g"
           ",\"apply_%s_changed_per_s\":%.6g,\"decode_%s_changed_per_s\":%.6g",
           bench_codec_codings[k].key, r->encode_s[k],
           bench_codec_codings[k].key, r->apply_s[k],
           bench_codec_codings[k].key,
           bench_codec_per((double)r->changed, r->apply_s[k]),
           bench_codec_codings[k].key,
           bench_codec_per((double)r->changed, r->decode_s[k]));
  for (int k = 0; k < CODINGS; k++)
    if (bench_codec_codings[k].model == PULSE_POS_CLASS)
      printf(",\"apply_%s_indexed_changed_per_s\":%.6g",
             bench_codec_codings[k].key,
             bench_codec_per((double)r->changed, r->apply_indexed_s[k]));
  printf(",\"class_index_bytes\":%" PRIu64 ",\"class_index_build_s\":%.6g",
         r->index_bytes, r->index_build_s);
  printf(",\"apply_mchanges_per_s\":%.6g,\"apply_noindex_mchanges_per_s\":%.6g",
         bench_codec_per((double)r->changed, r->apply_indexed_s[0]) / 1e6,
         bench_codec_per((double)r->changed, r->apply_s[0]) / 1e6);
  printf(",\"apply_cpu_s\":%.6g,\"apply_indexed_cpu_s\":%.6g"
         ",\"apply_cpu_mchanges_per_s\":%.6g"
         ",\"apply_noindex_cpu_mchanges_per_s\":%.6g",
         r->apply_cpu_s, r->apply_indexed_cpu_s,
         bench_codec_per((double)r->changed, r->apply_indexed_cpu_s) / 1e6,
         bench_codec_per((double)r->changed, r->apply_cpu_s) / 1e6);
  /* The default coding under the plain names. */
  printf(
      ",\"patch_encode_s\":%.6g,\"apply_s\":%.6g,\"apply_changed_per_s\":%.6g"
      ",\"apply_plain_changed_per_s\":%.6g,\"verify\":\"ok\"}\n",
      r->encode_s[0], r->apply_s[0],
      bench_codec_per((double)r->changed, r->apply_s[0]),
      bench_codec_per((double)r->changed, r->apply_s[1]));
}
