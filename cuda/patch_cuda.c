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

/* What one pulse_cuda_patch_encode call holds: the host tables, the change
 * lists on the device (workspace slots) and their copies on the host. */
typedef struct {
  const pulse_encode_opts *opts;
  const pulse_cuda_encode_tensor *tensors;
  size_t count;
  int ranks; /* class position model: the rank form crosses the bus too */
  pulse_cuda_detect_tensor *table;
  pulse_cuda_bf16_tensor *sub;
  size_t *sub_of;
  uint64_t *tensor_changes, *first, *chunk_first;
  pulse_tensor_digest *digest, *sub_digest;
  pulse_changes *changes;
  pulse_encode_tensor *enc;
  uint64_t *pos;
  uint16_t *old_bits, *new_bits;
  uint8_t *cls;
  uint32_t *rank, *hist;
  void *pos_d, *old_d, *new_d, *cls_d, *rank_d, *hist_d;
  uint64_t total, chunks;
} cuda_encode;

static pulse_status cuda_encode_check_opts(const pulse_encode_opts *opts,
                                           const pulse_cuda_encode_tensor *tensors,
                                           size_t count) {
  PULSE_TRY(PULSE_OPTS_CHECK("cuda encode", opts, PULSE_ENCODE_OPTS_VERSION));
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
  return PULSE_OK;
}

static void cuda_encode_free(cuda_encode *e) {
  free(e->table), free(e->sub), free(e->sub_of), free(e->tensor_changes),
      free(e->first), free(e->chunk_first);
  free(e->digest), free(e->sub_digest), free(e->changes), free(e->enc);
  free(e->pos), free(e->old_bits), free(e->new_bits), free(e->cls),
      free(e->rank), free(e->hist);
}

/* The host tables, and the detection table checked. */
static pulse_status cuda_encode_tables(cuda_encode *e) {
  pulse_status st = PULSE_OK;
  size_t count = e->count;
  e->table = calloc(count + 1, sizeof *e->table);
  e->sub = calloc(count + 1, sizeof *e->sub);
  e->sub_of = calloc(count + 1, sizeof *e->sub_of);
  e->tensor_changes = calloc(count + 1, sizeof *e->tensor_changes);
  e->first = calloc(count + 1, sizeof *e->first);
  e->chunk_first = calloc(count + 1, sizeof *e->chunk_first);
  e->digest = calloc(count + 1, sizeof *e->digest);
  e->sub_digest = calloc(count + 1, sizeof *e->sub_digest);
  e->changes = calloc(count + 1, sizeof *e->changes);
  e->enc = calloc(count + 1, sizeof *e->enc);
  if (!e->table || !e->sub || !e->sub_of || !e->tensor_changes || !e->first ||
      !e->chunk_first || !e->digest || !e->sub_digest || !e->changes || !e->enc)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda encode: table of %zu tensors",
                      count);
  for (size_t t = 0; t < count; t++) {
    const pulse_cuda_encode_tensor *x = &e->tensors[t];
    if (x->info.ndim > PULSE_MAX_DIMS)
      return pulse_fail(PULSE_ERR_ARG, "cuda encode: tensor %zu: %u dimensions",
                        t, x->info.ndim);
    if (x->info.dtype != PULSE_DTYPE_BF16)
      return pulse_fail(
          PULSE_ERR_DTYPE,
          "cuda encode: tensor %zu: patches carry BF16 state, not %s", t,
          pulse_dtype_name(x->info.dtype));
    CHECK(pulse_shape_numel(x->info.shape, x->info.ndim, &e->table[t].numel));
    e->table[t].cur_d = x->cur_d;
    e->table[t].cur_dtype = x->cur_dtype;
    e->table[t].snapshot_d = x->snapshot_d;
  }
  CHECK(pulse_cuda_detect_check_(e->table, count, e->opts->chunk_log2));
cleanup:
  return st;
}

/* Detect: count, size the staging, write (the snapshot stays the base). */
static pulse_status cuda_encode_detect(cuda_encode *e, pulse_cuda_workspace *ws,
                                       void *stream) {
  pulse_status st = PULSE_OK;
  uint32_t log2 = e->opts->chunk_log2;
  CHECK(pulse_cuda_chunk_count(e->table, e->count, log2, &e->chunks));
  if (e->ranks)
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_HIST, e->chunks * PULSE_CLASS_COUNT,
                              sizeof(uint32_t), &e->hist_d));
  CHECK(pulse_cuda_detect_count_(ws, e->table, e->count, log2, e->ranks,
                                 e->hist_d, e->tensor_changes, &e->total,
                                 stream));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_POS, e->total, sizeof(uint64_t),
                            &e->pos_d));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_OLD, e->total, sizeof(uint16_t),
                            &e->old_d));
  CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_NEW, e->total, sizeof(uint16_t),
                            &e->new_d));
  if (e->ranks) {
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_CLASS, e->total, sizeof(uint8_t),
                              &e->cls_d));
    CHECK(pulse_cuda_ws_slot_(ws, PULSE_WS_X_RANK, e->total, sizeof(uint32_t),
                              &e->rank_d));
  }
  pulse_cuda_changes dev = {e->total, e->pos_d,  e->old_d,  e->new_d,
                            e->cls_d, e->rank_d, e->hist_d, e->chunks};
  CHECK(pulse_cuda_detect_write_(ws, e->table, e->count, log2, e->ranks, &dev,
                                 0, stream));
cleanup:
  return st;
}

/* Base digests: given, or one device pass over the snapshots lacking one. */
static pulse_status cuda_encode_base_digests(cuda_encode *e,
                                             pulse_cuda_workspace *ws,
                                             void *stream) {
  size_t subs = 0;
  for (size_t t = 0; t < e->count; t++) {
    if (e->tensors[t].base_digest != NULL) {
      e->digest[t] = *e->tensors[t].base_digest;
    } else {
      e->sub[subs].data_d = e->tensors[t].snapshot_d;
      e->sub[subs].numel = e->table[t].numel;
      e->sub_of[subs++] = t;
    }
  }
  if (subs > 0)
    PULSE_TRY(pulse_cuda_digest_in_(ws, e->sub, subs, e->sub_digest, stream));
  for (size_t k = 0; k < subs; k++)
    e->digest[e->sub_of[k]] = e->sub_digest[k];
  return PULSE_OK;
}

/* The change lists and rank form to the host (never the weights). */
static pulse_status cuda_encode_download(cuda_encode *e, void *stream) {
  pulse_status st = PULSE_OK;
  uint64_t total = e->total, hist_n = e->chunks * PULSE_CLASS_COUNT;
  e->pos = malloc((size_t)total * sizeof *e->pos + 8);
  e->old_bits = malloc((size_t)total * sizeof *e->old_bits + 8);
  e->new_bits = malloc((size_t)total * sizeof *e->new_bits + 8);
  e->cls = malloc(e->ranks ? (size_t)total * sizeof *e->cls + 8 : 8);
  e->rank = malloc(e->ranks ? (size_t)total * sizeof *e->rank + 8 : 8);
  e->hist = malloc(e->ranks ? (size_t)hist_n * sizeof *e->hist + 8 : 8);
  if (!e->pos || !e->old_bits || !e->new_bits || !e->cls || !e->rank ||
      !e->hist)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda encode: %llu changes",
                      (unsigned long long)total);
  CHECK(pulse_cuda_download(e->pos, e->pos_d, (size_t)total * sizeof *e->pos,
                            stream));
  CHECK(pulse_cuda_download(e->old_bits, e->old_d,
                            (size_t)total * sizeof *e->old_bits, stream));
  CHECK(pulse_cuda_download(e->new_bits, e->new_d,
                            (size_t)total * sizeof *e->new_bits, stream));
  if (e->ranks) {
    CHECK(pulse_cuda_download(e->cls, e->cls_d,
                              (size_t)total * sizeof *e->cls, stream));
    CHECK(pulse_cuda_download(e->rank, e->rank_d,
                              (size_t)total * sizeof *e->rank, stream));
    CHECK(pulse_cuda_download(e->hist, e->hist_d,
                              (size_t)hist_n * sizeof *e->hist, stream));
  }
cleanup:
  return st;
}

/* Code them: pulse_patch_encode from the rank form, base NULL. */
static pulse_status cuda_encode_code(cuda_encode *e, pulse_buffer *out,
                                     pulse_tensor_digest *target_digests) {
  for (size_t t = 0; t < e->count; t++) {
    uint64_t at = e->first[t], n = e->table[t].numel;
    e->first[t + 1] = at + e->tensor_changes[t];
    e->chunk_first[t + 1] =
        e->chunk_first[t] + (n ? ((n - 1) >> e->opts->chunk_log2) + 1 : 0);
    pulse_changes *ch = &e->changes[t];
    ch->count = ch->capacity = e->tensor_changes[t];
    ch->pos = e->pos + at;
    ch->old_bits = e->old_bits + at;
    ch->new_bits = e->new_bits + at;
    e->enc[t].info = e->tensors[t].info;
    e->enc[t].base = NULL;
    e->enc[t].changes = ch;
    e->enc[t].base_digest = &e->digest[t];
    if (e->ranks) {
      e->enc[t].chunk_hist = e->hist + e->chunk_first[t] * PULSE_CLASS_COUNT;
      e->enc[t].change_class = e->cls + at;
      e->enc[t].change_rank = e->rank + at;
    }
  }
  PULSE_TRY(pulse_patch_encode(e->opts, e->enc, e->count, out));
  for (size_t t = 0; target_digests != NULL && t < e->count; t++)
    target_digests[t] = pulse_digest_apply_changes(e->digest[t], &e->changes[t]);
  return PULSE_OK;
}

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
  PULSE_TRY(cuda_encode_check_opts(opts, tensors, count));

  pulse_status st = PULSE_OK;
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_at at;
  const void *first_d = NULL;
  cuda_encode e;
  memset(&e, 0, sizeof e);
  at.previous = -1;
  e.opts = opts;
  e.tensors = tensors;
  e.count = count;
  e.ranks = opts->pos_model == PULSE_POS_CLASS;
  CHECK(cuda_encode_tables(&e));
  for (size_t t = 0; t < count && first_d == NULL; t++)
    if (e.table[t].numel > 0)
      first_d = e.table[t].cur_d;
  /* On the tensors' device and the resolved stream from here on. */
  CHECK(pulse_cuda_enter_(ws, first_d, stream, "cuda encode", &at));
  stream = at.stream;
  CHECK(pulse_cuda_detect_check_device_(e.table, count, at.device));
  if (ws == NULL) {
    CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }
  CHECK(cuda_encode_detect(&e, ws, stream));
  CHECK(cuda_encode_base_digests(&e, ws, stream));
  CHECK(cuda_encode_download(&e, stream));
  CHECK(cuda_encode_code(&e, out, target_digests));

  /* The patch exists: only now does each snapshot become the target. */
  if (update_snapshot) {
    for (size_t t = 0; t < count; t++) {
      e.sub[t].data_d = tensors[t].snapshot_d;
      e.sub[t].numel = e.table[t].numel;
    }
    CHECK(pulse_cuda_scatter_in_(ws, e.sub, count, e.first, e.pos_d, e.new_d,
                                 stream));
  }

cleanup:
  if (st != PULSE_OK)
    pulse_buffer_free(out);
  pulse_cuda_workspace_free(temp);
  pulse_cuda_leave_(&at);
  cuda_encode_free(&e);
  return st;
}
