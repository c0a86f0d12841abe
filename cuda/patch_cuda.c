/* patch_cuda.c - patches from device tensors: the host side of
 * pulse_cuda_patch_encode (detect on the device, code on the host; the
 * apply is in patch_cuda_apply.c). Only change lists, their rank form and
 * class counts cross the bus, never the weights. */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "cuda_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define CHECK(expr)                                                            \
  do {                                                                         \
    st = (expr);                                                               \
    if (st != PULSE_OK)                                                        \
      goto cleanup;                                                            \
  } while (0)

pulse_status pulse_cuda_ws_slot_(pulse_cuda_workspace *ws, unsigned which,
                                 uint64_t n, size_t size, void **out_d) {
  if (n > (SIZE_MAX - 256) / size)
    return pulse_fail(PULSE_ERR_OVERFLOW, "staging of %llu entries",
                      (unsigned long long)n);
  return pulse_cuda_ws_get_(ws, which, (size_t)n * size, out_d);
}

/* ================================================================ encode */

pulse_status pulse_cuda_patch_encode(pulse_cuda_workspace *ws,
                                     const pulse_encode_opts *opts,
                                     const pulse_cuda_encode_tensor *tensors,
                                     size_t count, int update_snapshot,
                                     void *stream, pulse_buffer *out,
                                     pulse_tensor_digest *target_digests) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda encode: NULL output");
  out->data = NULL;
  out->size = 0;
  if (opts == NULL || opts->struct_version != PULSE_ENCODE_OPTS_VERSION)
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda encode: options missing or of another version");
  if (opts->pos_model != PULSE_POS_PLAIN && opts->pos_model != PULSE_POS_CLASS)
    return pulse_fail(PULSE_ERR_ARG, "cuda encode: unknown position model %d",
                      (int)opts->pos_model);
  if (opts->chunk_log2 < PULSE_CHUNK_LOG2_MIN ||
      opts->chunk_log2 > PULSE_CHUNK_LOG2_MAX)
    return pulse_fail(
        PULSE_ERR_ARG, "cuda encode: chunk_log2 %u outside %u..%u",
        opts->chunk_log2, PULSE_CHUNK_LOG2_MIN, PULSE_CHUNK_LOG2_MAX);
  if (count > 0 && tensors == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda encode: NULL tensors");

  pulse_status st = PULSE_OK;
  const int ranks = opts->pos_model == PULSE_POS_CLASS;
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_detect_tensor *table = calloc(count + 1, sizeof *table);
  pulse_cuda_bf16_tensor *sub = calloc(count + 1, sizeof *sub);
  size_t *sub_of = calloc(count + 1, sizeof *sub_of);
  uint64_t *tensor_changes = calloc(count + 1, sizeof *tensor_changes);
  uint64_t *first = calloc(count + 1, sizeof *first);
  uint64_t *chunk_first = calloc(count + 1, sizeof *chunk_first);
  pulse_tensor_digest *digest = calloc(count + 1, sizeof *digest);
  pulse_tensor_digest *sub_digest = calloc(count + 1, sizeof *sub_digest);
  pulse_changes *changes = calloc(count + 1, sizeof *changes);
  pulse_encode_tensor *enc = calloc(count + 1, sizeof *enc);
  uint64_t *pos = NULL;
  uint16_t *old_bits = NULL, *new_bits = NULL;
  uint8_t *cls = NULL;
  uint32_t *rank = NULL, *hist = NULL;
  void *pos_d = NULL, *old_d = NULL, *new_d = NULL, *cls_d = NULL,
       *rank_d = NULL, *hist_d = NULL;
  uint64_t total = 0, chunks = 0;
  size_t subs = 0;
  if (!table || !sub || !sub_of || !tensor_changes || !first || !chunk_first ||
      !digest || !sub_digest || !changes || !enc) {
    st =
        pulse_fail(PULSE_ERR_NOMEM, "cuda encode: table of %zu tensors", count);
    goto cleanup;
  }
  for (size_t t = 0; t < count; t++) {
    const pulse_cuda_encode_tensor *x = &tensors[t];
    if (x->info.ndim > PULSE_MAX_DIMS) {
      st = pulse_fail(PULSE_ERR_ARG, "cuda encode: tensor %zu: %u dimensions",
                      t, x->info.ndim);
      goto cleanup;
    }
    if (x->info.dtype != PULSE_DTYPE_BF16) {
      st = pulse_fail(
          PULSE_ERR_DTYPE,
          "cuda encode: tensor %zu: patches carry BF16 state, not %s", t,
          pulse_dtype_name(x->info.dtype));
      goto cleanup;
    }
    CHECK(pulse_shape_numel(x->info.shape, x->info.ndim, &table[t].numel));
    table[t].cur_d = x->cur_d;
    table[t].cur_dtype = x->cur_dtype;
    table[t].snapshot_d = x->snapshot_d;
  }
  CHECK(pulse_cuda_detect_check_(table, count, opts->chunk_log2));
  CHECK(pulse_cuda_require_("cuda encode"));
  if (ws == NULL) {
    CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }

  /* Detect: count, size the staging, write (the snapshot stays the base). */
  CHECK(pulse_cuda_chunk_count(table, count, opts->chunk_log2, &chunks));
  if (ranks)
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_HIST, chunks * PULSE_CLASS_COUNT,
               sizeof(uint32_t), &hist_d));
  CHECK(pulse_cuda_detect_count_(ws, table, count, opts->chunk_log2, ranks,
                                 hist_d, tensor_changes, &total, stream));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_POS, total, sizeof(uint64_t), &pos_d));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_OLD, total, sizeof(uint16_t), &old_d));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_NEW, total, sizeof(uint16_t), &new_d));
  if (ranks) {
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_CLASS, total, sizeof(uint8_t), &cls_d));
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_RANK, total, sizeof(uint32_t), &rank_d));
  }
  pulse_cuda_changes dev = {total, pos_d,  old_d,  new_d,
                            cls_d, rank_d, hist_d, chunks};
  CHECK(pulse_cuda_detect_write_(ws, table, count, opts->chunk_log2, ranks,
                                 &dev, 0, stream));

  /* Base digests: given, or one device pass over the snapshots lacking one. */
  for (size_t t = 0; t < count; t++) {
    if (tensors[t].base_digest != NULL) {
      digest[t] = *tensors[t].base_digest;
    } else {
      sub[subs].data_d = tensors[t].snapshot_d;
      sub[subs].numel = table[t].numel;
      sub_of[subs++] = t;
    }
  }
  if (subs > 0)
    CHECK(pulse_cuda_digest(ws, sub, subs, sub_digest, stream));
  for (size_t k = 0; k < subs; k++)
    digest[sub_of[k]] = sub_digest[k];

  /* The change lists and rank form to the host (never the weights). */
  pos = malloc((size_t)total * sizeof *pos + 8);
  old_bits = malloc((size_t)total * sizeof *old_bits + 8);
  new_bits = malloc((size_t)total * sizeof *new_bits + 8);
  cls = malloc(ranks ? (size_t)total * sizeof *cls + 8 : 8);
  rank = malloc(ranks ? (size_t)total * sizeof *rank + 8 : 8);
  hist =
      malloc(ranks ? (size_t)chunks * PULSE_CLASS_COUNT * sizeof *hist + 8 : 8);
  if (!pos || !old_bits || !new_bits || !cls || !rank || !hist) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda encode: %llu changes",
                    (unsigned long long)total);
    goto cleanup;
  }
  CHECK(pulse_cuda_download(pos, pos_d, (size_t)total * sizeof *pos, stream));
  CHECK(pulse_cuda_download(old_bits, old_d, (size_t)total * sizeof *old_bits,
                            stream));
  CHECK(pulse_cuda_download(new_bits, new_d, (size_t)total * sizeof *new_bits,
                            stream));
  if (ranks) {
    CHECK(pulse_cuda_download(cls, cls_d, (size_t)total * sizeof *cls, stream));
    CHECK(pulse_cuda_download(rank, rank_d, (size_t)total * sizeof *rank,
                              stream));
    CHECK(pulse_cuda_download(hist, hist_d,
                              (size_t)chunks * PULSE_CLASS_COUNT * sizeof *hist,
                              stream));
  }

  /* Code them: pulse_patch_encode from the rank form, base NULL. */
  for (size_t t = 0; t < count; t++) {
    uint64_t at = first[t], n = table[t].numel;
    first[t + 1] = at + tensor_changes[t];
    chunk_first[t + 1] =
        chunk_first[t] + (n ? ((n - 1) >> opts->chunk_log2) + 1 : 0);
    changes[t].count = changes[t].capacity = tensor_changes[t];
    changes[t].pos = pos + at;
    changes[t].old_bits = old_bits + at;
    changes[t].new_bits = new_bits + at;
    enc[t].info = tensors[t].info;
    enc[t].base = NULL;
    enc[t].changes = &changes[t];
    enc[t].base_digest = &digest[t];
    if (ranks) {
      enc[t].chunk_hist = hist + chunk_first[t] * PULSE_CLASS_COUNT;
      enc[t].change_class = cls + at;
      enc[t].change_rank = rank + at;
    }
  }
  CHECK(pulse_patch_encode(opts, enc, count, out));
  for (size_t t = 0; target_digests != NULL && t < count; t++)
    target_digests[t] = pulse_digest_apply_changes(digest[t], &changes[t]);

  /* The patch exists: only now does each snapshot become the target. */
  if (update_snapshot) {
    for (size_t t = 0; t < count; t++) {
      sub[t].data_d = tensors[t].snapshot_d;
      sub[t].numel = table[t].numel;
    }
    CHECK(pulse_cuda_scatter(ws, sub, count, first, pos_d, new_d, stream));
  }

cleanup:
  if (st != PULSE_OK)
    pulse_buffer_free(out);
  pulse_cuda_workspace_free(temp);
  free(table), free(sub), free(sub_of), free(tensor_changes), free(first),
      free(chunk_first);
  free(digest), free(sub_digest), free(changes), free(enc);
  free(pos), free(old_bits), free(new_bits), free(cls), free(rank), free(hist);
  return st;
}
