/* bench_codec_summary.c - the run's summary of `pulse-bench codec`: sizes
 * summed over the steps, throughputs averaged per step, printed as text or
 * as one JSON object. */
#include <inttypes.h>
#include <stdio.h>

#include "bench_codec_impl.h"

void bench_codec_summary_add(summary *s, const step_result *r) {
  step_result *t = &s->sum;
  double moved = (double)(r->weight_bytes + r->snapshot_bytes);
  t->params += r->params;
  t->changed += r->changed;
  for (int k = 0; k < CODINGS; k++) {
    t->bytes[k] += r->bytes[k];
    t->encode_s[k] += r->encode_s[k];
    s->apply_cps[k] += bench_codec_per((double)r->changed, r->apply_s[k]);
    s->decode_cps[k] += bench_codec_per((double)r->changed, r->decode_s[k]);
    s->indexed_cps[k] +=
        bench_codec_per((double)r->changed, r->apply_indexed_s[k]);
    s->within[k] += (double)r->bytes[k] <= bench_codec_allowance_bytes(r);
  }
  s->cpu_cps += bench_codec_per((double)r->changed, r->apply_cpu_s);
  s->indexed_cpu_cps +=
      bench_codec_per((double)r->changed, r->apply_indexed_cpu_s);
  t->base.dense += r->base.dense;
  t->base.int32_bf16 += r->base.int32_bf16;
  t->base.dense_z19_read += r->base.dense_z19_read;
  for (int k = 0; k < BENCH_ZKINDS; k++)
    for (int l = 0; l < BENCH_ZSTD_LEVELS; l++)
      t->base.zstd[k][l] += r->base.zstd[k][l];
  t->ent.positions_class_bits += r->ent.positions_class_bits;
  t->ent.positions_tensor_bits += r->ent.positions_tensor_bits;
  t->ent.values_bits += r->ent.values_bits;
  t->ent.values_class_bits += r->ent.values_class_bits;
  s->encode_bps += bench_codec_per(moved, r->detect_s);
  s->memcpy_bps += bench_codec_per(moved, r->memcpy_s);
  s->steps++;
}

void bench_codec_print_summary_text(const summary *s) {
  const step_result *t = &s->sum;
  double n = (double)(s->steps ? s->steps : 1);
  char b1[32];
  printf("\nsummary over %" PRIu64 " steps: %.3f%% changed on average; "
         "bytes are per step, B/changed is total bytes / total changed\n",
         s->steps,
         100.0 * bench_codec_per((double)t->changed, (double)t->params));
  bench_codec_print_rows(t, n);
  double def = (double)t->bytes[0], bound = bench_codec_bound_bytes(&t->ent);
  int bk, bl;
  char best[96];
  double bb = (double)bench_baseline_best(&t->base, &bk, &bl);
  bench_baseline_label(bk, bl, best, sizeof best);
  printf("  v2 / the baseline (%s) = %.3f   v2 / int32+BF16+zstd-1 = %.3f   "
         "v2 / gap+abs+zstd-1 (prod.) = %.3f\n",
         best, bench_codec_per(def, bb),
         bench_codec_per(def, (double)t->base.zstd[BENCH_INT32_Z][0]),
         bench_codec_per(def, (double)t->base.zstd[BENCH_GAP_ABS_Z][0]));
  printf("  to the bound: v2 %.3f, v2 plain %.3f, v1 %.3f, v1 plain %.3f, v3 "
         "%.3f\n",
         bench_codec_per(def, bound),
         bench_codec_per((double)t->bytes[1], bound),
         bench_codec_per((double)t->bytes[2], bound),
         bench_codec_per((double)t->bytes[3], bound),
         bench_codec_per((double)t->bytes[4], bound));
  printf("  steps within 5%% + 96 B/tensor of the bound: v2 %" PRIu64
         "/%" PRIu64 ", v2 plain %" PRIu64 ", v1 %" PRIu64 ", v1 plain %" PRIu64
         ", v3 %" PRIu64 "\n",
         s->within[0], s->steps, s->within[1], s->within[2], s->within[3],
         s->within[4]);
  printf("  mean per step: detect %.2f GB/s, memcpy %.2f GB/s\n",
         s->encode_bps / n / 1e9, s->memcpy_bps / n / 1e9);
  for (int k = 0; k < CODINGS; k++) {
    printf("  %-36s encode %8.2f ms, apply %7.1f M changed/s",
           bench_codec_codings[k].label, t->encode_s[k] / n * 1e3,
           s->apply_cps[k] / n / 1e6);
    if (s->indexed_cps[k] > 0)
      printf(", indexed %7.1f M/s", s->indexed_cps[k] / n / 1e6);
    if (s->decode_cps[k] > 0)
      printf(", decode alone %7.1f M/s", s->decode_cps[k] / n / 1e6);
    printf("\n");
  }
  printf("  %-36s apply in CPU time (every thread's): %.1f M changed/s "
         "plain, %.1f indexed\n",
         bench_codec_codings[0].label, s->cpu_cps / n / 1e6,
         s->indexed_cpu_cps / n / 1e6);
  printf("  verify OK: %s changes over %" PRIu64 " steps rebuilt bit for bit\n",
         bench_codec_fmt_u64(t->changed, b1), s->steps);
  double dense_z = (double)t->base.zstd[BENCH_DENSE_Z][0];
  for (int l = 1; l < BENCH_ZSTD_LEVELS; l++)
    if ((double)t->base.zstd[BENCH_DENSE_Z][l] < dense_z)
      dense_z = (double)t->base.zstd[BENCH_DENSE_Z][l];
  printf("  bandwidth: a v2 patch is %.1fx smaller than dense BF16, %.1fx "
         "smaller than "
         "dense BF16 through zstd (its best level), %.2fx smaller than the "
         "baseline\n",
         bench_codec_per((double)t->base.dense, def),
         bench_codec_per(dense_z, def), bench_codec_per(bb, def));
}

void bench_codec_print_summary_json(const summary *s, const char *source,
                                    int apply_threads) {
  const step_result *t = &s->sum;
  double n = (double)(s->steps ? s->steps : 1);
  double c = (double)t->changed;
  printf("{\"summary\":true,\"source\":\"%s\",\"bound_model\":\"%s\""
         ",\"steps\":%" PRIu64 ",\"params_total\":%" PRIu64
         ",\"changed_total\":%" PRIu64 ",\"density\":%.6g",
         source, BENCH_BOUND_MODEL, s->steps, t->params, t->changed,
         bench_codec_per(c, (double)t->params));
  double bound = bench_codec_bound_bytes(&t->ent);
  int bk, bl;
  uint64_t best = bench_baseline_best(&t->base, &bk, &bl);
  for (int k = 0; k < CODINGS; k++)
    printf(",\"%s_per_changed\":%.6g,\"ratio_%s_bound\":%.6g"
           ",\"ratio_%s_int32_bf16_zstd\":%.6g,\"ratio_%s_delta_abs_zstd\":%.6g"
           ",\"ratio_%s_baseline\":%.6g"
           ",\"patch_encode_%s_s\":%.6g,\"apply_%s_changed_per_s\":%.6g"
           ",\"decode_%s_changed_per_s\":%.6g",
           bench_codec_codings[k].key, bench_codec_per((double)t->bytes[k], c),
           bench_codec_codings[k].key,
           bench_codec_per((double)t->bytes[k], bound),
           bench_codec_codings[k].key,
           bench_codec_per((double)t->bytes[k],
                           (double)t->base.zstd[BENCH_INT32_Z][0]),
           bench_codec_codings[k].key,
           bench_codec_per((double)t->bytes[k],
                           (double)t->base.zstd[BENCH_GAP_ABS_Z][0]),
           bench_codec_codings[k].key,
           bench_codec_per((double)t->bytes[k], (double)best),
           bench_codec_codings[k].key, t->encode_s[k] / n,
           bench_codec_codings[k].key, s->apply_cps[k] / n,
           bench_codec_codings[k].key, s->decode_cps[k] / n);
  for (int k = 0; k < CODINGS; k++)
    printf(",\"steps_within_bound_allowance_%s\":%" PRIu64,
           bench_codec_codings[k].key, s->within[k]);
  for (int k = 0; k < CODINGS; k++)
    if (bench_codec_codings[k].model == PULSE_POS_CLASS)
      printf(",\"apply_%s_indexed_changed_per_s\":%.6g",
             bench_codec_codings[k].key, s->indexed_cps[k] / n);
  printf(",\"apply_threads\":%d,\"apply_mchanges_per_s\":%.6g"
         ",\"apply_noindex_mchanges_per_s\":%.6g"
         ",\"apply_cpu_mchanges_per_s\":%.6g"
         ",\"apply_noindex_cpu_mchanges_per_s\":%.6g",
         apply_threads, s->indexed_cps[0] / n / 1e6, s->apply_cps[0] / n / 1e6,
         s->indexed_cpu_cps / n / 1e6, s->cpu_cps / n / 1e6);
  printf(",\"bound_per_changed\":%.6g", bench_codec_per(bound, c));
  bench_codec_print_baselines_json(&t->base, &c);
  printf(",\"encode_bytes_per_s\":%.6g,\"memcpy_bytes_per_s\":%.6g"
         ",\"patch_encode_s\":%.6g,\"apply_changed_per_s\":%.6g"
         ",\"apply_plain_changed_per_s\":%.6g,\"verify\":\"ok\"}\n",
         s->encode_bps / n, s->memcpy_bps / n, t->encode_s[0] / n,
         s->apply_cps[0] / n, s->apply_cps[1] / n);
}
