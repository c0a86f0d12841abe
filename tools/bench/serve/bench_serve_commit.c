/* bench_serve_commit.c - benchmark 3 of `pulse-bench serve`: commit time
 * against the bare encoder (detection + patch encoding with the same
 * threads and the same cached digests) on a synthetic AdamW trajectory,
 * the two in alternating order, the publisher's background work finished
 * before the bare encoder runs. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_serve_impl.h"
#include "cli_time.h"
#include "pulse_publisher.h"
#include "pulse_sign.h"
#include "sim_synth.h"

/* The bare encoder's step k (timed: detection against its own snapshot and
 * pulse_patch_encode), then, untimed, its snapshot and digests moved on.
 * Returns the timed seconds; counts failures in *errors. */
static double bare_step(const serve_args *a, pulse_synth *s, uint64_t k,
                        const pulse_tensor_info *info, uint16_t *bare,
                        pulse_tensor_digest *dig, pulse_changes *ch,
                        pulse_encode_tensor *enc, int *errors) {
  size_t n = pulse_synth_tensor_count(s);
  double t0 = pulse_cli_now();
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    ch[i].count = 0;
    pulse_detect_fast(pulse_synth_master(s) + t->offset, PULSE_DTYPE_F32,
                      bare + t->offset, t->numel, 0, a->commit_threads, &ch[i]);
    enc[i].info = info[i];
    enc[i].base = bare + t->offset;
    enc[i].changes = &ch[i];
    enc[i].base_digest = &dig[i];
  }
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = k;
  eo.base_step = k - 1;
  eo.threads = a->commit_threads;
  pulse_buffer patch = {NULL, 0};
  if (pulse_patch_encode(&eo, enc, n, &patch) != PULSE_OK)
    (*errors)++;
  double b = pulse_cli_now() - t0;
  pulse_buffer_free(&patch);
  for (size_t i = 0; i < n; i++) { /* untimed: move the bare snapshot on */
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    dig[i] = pulse_digest_apply_changes(dig[i], &ch[i]);
    for (uint64_t c = 0; c < ch[i].count; c++)
      bare[t->offset + ch[i].pos[c]] = ch[i].new_bits[c];
  }
  return b;
}

static commit_result bench_commit(const serve_args *a, const char *work) {
  commit_result r;
  memset(&r, 0, sizeof r);
  pulse_synth_opts so;
  pulse_synth_opts_init(&so);
  so.params = a->params;
  pulse_synth *s = NULL;
  if (pulse_synth_create(&so, &s) != PULSE_OK) {
    r.errors = 1;
    return r;
  }
  size_t n = pulse_synth_tensor_count(s);
  uint64_t total = pulse_synth_param_count(s);
  r.params = total;
  pulse_tensor_info *info = calloc(n, sizeof *info);
  pulse_changes *ch = calloc(n, sizeof *ch);
  pulse_encode_tensor *enc = calloc(n, sizeof *enc);
  pulse_tensor_digest *dig = calloc(n, sizeof *dig);
  pulse_pub_tensor *pt = calloc(n, sizeof *pt);
  uint16_t *bare = malloc(total * 2);
  int steps = (int)a->steps;
  double *bare_s = calloc((size_t)steps + 1, sizeof(double));
  double *commit_s = calloc((size_t)steps + 1, sizeof(double));
  double *ratio = calloc((size_t)steps + 1, sizeof(double));
  double *write_s = calloc((size_t)steps + 1, sizeof(double));
  double *changed = calloc((size_t)steps + 1, sizeof(double));
  double *bytes = calloc((size_t)steps + 1, sizeof(double));
  memcpy(bare, pulse_synth_bf16(s), total * 2);
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    info[i] = t->info;
    dig[i] = pulse_digest_bf16(bare + t->offset, t->numel);
  }
  char store[4096];
  snprintf(store, sizeof store, "%s/commit-store", work);
  pulse_sign_key *key = NULL;
  pulse_sign_key_generate(&key);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.tensors = info;
  po.tensor_count = n;
  po.key = key;
  po.anchor_every = a->anchor_every;
  po.threads = a->commit_threads;
  pulse_pub *pub = NULL;
  if (pulse_pub_create(store, &po, &pub) != PULSE_OK) {
    r.errors = 1;
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    const pulse_synth_tensor *t = pulse_synth_tensor_get(s, i);
    pt[i].data = pulse_synth_master(s) + t->offset;
    pt[i].dtype = PULSE_DTYPE_F32;
    pt[i].memory = PULSE_PUB_HOST;
  }
  if (pulse_pub_commit(pub, 0, pt, n, NULL) != PULSE_OK) {
    r.errors = 1;
    goto done;
  }
  double anchor_max = 0;
  for (int k = 1; k <= steps; k++) {
    pulse_synth_step(s);
    pulse_pub_figures f;
    memset(&f, 0, sizeof f);
    double b = 0, c = 0;
    for (int order = 0; order < 2; order++) {
      int bare_now =
          (order == 0) == (k % 2 == 1); /* alternate which goes first */
      if (!bare_now) {
        double t0 = pulse_cli_now(); /* the whole call, housekeeping included */
        if (pulse_pub_commit(pub, (uint64_t)k, pt, n, &f) != PULSE_OK)
          r.errors++;
        c = pulse_cli_now() - t0;
        /* Untimed: once the head has moved, the publisher moves its
         * snapshot to the step, removes dropped objects and writes anchors
         * in the background (while a trainer computes its next step); let
         * that finish so that it never runs beside the bare encoder. */
        pulse_pub_wait(pub);
        continue;
      }
      b = bare_step(a, s, (uint64_t)k, info, bare, dig, ch, enc, &r.errors);
    }
    bare_s[k - 1] = b;
    commit_s[k - 1] = c;
    ratio[k - 1] = c / b;
    write_s[k - 1] = f.write_seconds;
    changed[k - 1] = (double)f.changed;
    bytes[k - 1] = (double)f.patch_bytes;
    if ((f.anchor_started || f.anchor_bytes) && ratio[k - 1] > anchor_max)
      anchor_max = ratio[k - 1];
    if (!a->json)
      printf("  commit step %d: bare encoder %.1f ms, commit %.1f ms (detect "
             "%.1f, encode %.1f, "
             "write %.1f)%s, x%.3f\n",
             k, b * 1e3, c * 1e3, f.detect_seconds * 1e3,
             f.encode_seconds * 1e3, f.write_seconds * 1e3,
             f.anchor_started ? ", anchor started" : "", ratio[k - 1]);
  }
  r.steps = steps;
  r.ratio_max = 0;
  for (int k = 0; k < steps; k++)
    if (ratio[k] > r.ratio_max)
      r.ratio_max = ratio[k];
  r.anchor_steps_ratio_max = anchor_max;
  r.bare_median_s = pulse_cli_median(bare_s, (size_t)steps);
  r.commit_median_s = pulse_cli_median(commit_s, (size_t)steps);
  r.ratio_median = pulse_cli_median(ratio, (size_t)steps);
  r.write_median_s = pulse_cli_median(write_s, (size_t)steps);
  r.changed_median = (uint64_t)pulse_cli_median(changed, (size_t)steps);
  r.patch_median = (uint64_t)pulse_cli_median(bytes, (size_t)steps);
done:
  pulse_pub_free(pub);
  pulse_sign_key_free(key);
  for (size_t i = 0; i < n; i++)
    pulse_changes_free(&ch[i]);
  free(info), free(ch), free(enc), free(dig), free(pt), free(bare);
  free(bare_s), free(commit_s), free(ratio), free(write_s), free(changed),
      free(bytes);
  pulse_synth_free(s);
  return r;
}

/* 3. Commit vs bare encoder. 0 or 1. */
int bench_serve_commit(const serve_args *a, const char *work,
                       serve_results *res) {
  if (!a->json)
    printf("commit vs bare encoder (%" PRIu64
           " parameters requested, anchors every %" PRIu64
           " in the background):\n",
           a->params, a->anchor_every);
  commit_result cr = res->cr = bench_commit(a, work);
  if (!a->json)
    printf("  median: bare %.1f ms, commit %.1f ms (write %.1f ms): medians "
           "x%.3f, per-step commit/bare median x%.3f (max x%.3f, anchor "
           "steps max x%.3f); %" PRIu64 " changed, patch %" PRIu64 " bytes\n",
           cr.bare_median_s * 1e3, cr.commit_median_s * 1e3,
           cr.write_median_s * 1e3,
           cr.bare_median_s > 0 ? cr.commit_median_s / cr.bare_median_s : 0,
           cr.ratio_median, cr.ratio_max, cr.anchor_steps_ratio_max,
           cr.changed_median, cr.patch_median);
  return cr.errors ? 1 : 0;
}
