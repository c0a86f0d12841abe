/* patch_cuda.c - patches from and to device tensors: the host side of
 * pulse_cuda_patch_encode (detect on the device, code on the host) and
 * pulse_cuda_patch_apply (decode on the host, find positions, check and
 * scatter on the device). Only change lists, their rank form and class
 * counts cross the bus, never the weights. */
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "class_index_impl.h"
#include "cuda_impl.h"
#include "parallel_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define CHECK(expr)                                                            \
  do {                                                                         \
    st = (expr);                                                               \
    if (st != PULSE_OK)                                                        \
      goto cleanup;                                                            \
  } while (0)

static int same_digest(pulse_tensor_digest x, pulse_tensor_digest y) {
  return x.a == y.a && x.b == y.b;
}

/* Slot `slot` of ws as a device array of n elements of `size` bytes. */
static pulse_status slot(pulse_cuda_workspace *ws, unsigned which, uint64_t n,
                         size_t size, void **out_d) {
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
    CHECK(slot(ws, PULSE_WS_X_HIST, chunks * PULSE_CLASS_COUNT,
               sizeof(uint32_t), &hist_d));
  CHECK(pulse_cuda_detect_count_(ws, table, count, opts->chunk_log2, ranks,
                                 hist_d, tensor_changes, &total, stream));
  CHECK(slot(ws, PULSE_WS_X_POS, total, sizeof(uint64_t), &pos_d));
  CHECK(slot(ws, PULSE_WS_X_OLD, total, sizeof(uint16_t), &old_d));
  CHECK(slot(ws, PULSE_WS_X_NEW, total, sizeof(uint16_t), &new_d));
  if (ranks) {
    CHECK(slot(ws, PULSE_WS_X_CLASS, total, sizeof(uint8_t), &cls_d));
    CHECK(slot(ws, PULSE_WS_X_RANK, total, sizeof(uint32_t), &rank_d));
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

/* ================================================================= apply */

/* One chunk with changes, decoded on a host thread. */
typedef struct {
  size_t tensor;    /* patch table index */
  uint64_t chunk;   /* within the tensor */
  uint64_t at;      /* its first entry in the staged arrays */
  uint64_t hist_at; /* its class counts: index chunk (class model) */
} apply_item;

typedef struct {
  const pulse_patch *p;
  const apply_item *items;
  const uint32_t *hist; /* class index counts (class model) */
  uint64_t *pos;        /* plain model: positions */
  uint8_t *cls;         /* class model: class of each entry */
  uint32_t *rank;       /* class model: rank of each entry */
  uint16_t *delta;
  pulse_status *status;
  char (*detail)[200];
} decode_job;

static void decode_one(void *ctx, size_t i) {
  decode_job *job = ctx;
  const apply_item *it = &job->items[i];
  const patch_tensor *tt = &job->p->tensors[it->tensor];
  const uint64_t c = tt->chunk_first + it->chunk;
  const uint32_t k = job->p->chunk_changed[c];
  pulse_status st;
  if (job->p->model == PULSE_POS_PLAIN) {
    st = patch_decode_chunk(job->p, it->tensor, it->chunk, NULL, NULL,
                            job->pos + it->at, job->delta + it->at);
  } else {
    uint32_t start[PULSE_CLASS_COUNT + 1];
    st = pulse_chunk_decode_ranks(
        job->p->version, PULSE_POS_CLASS, job->hist + it->hist_at * PULSE_CLASS_COUNT,
        patch_chunk_elems(job->p, tt, it->chunk),
        job->p->bytes + job->p->chunk_offset[c], (size_t)job->p->chunk_size[c],
        k, start, job->rank + it->at, job->delta + it->at);
    if (st == PULSE_OK) {
      for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
        for (uint32_t e = start[cl]; e < start[cl + 1]; e++)
          job->cls[it->at + e] = (uint8_t)cl;
    } else {
      st = pulse_fail(st, "tensor '%s' chunk %llu: %s", tt->info.name,
                      (unsigned long long)it->chunk, pulse_error_detail());
    }
  }
  job->status[i] = st;
  if (st != PULSE_OK)
    strncpy(job->detail[i], pulse_error_detail(), sizeof job->detail[i] - 1);
}

static pulse_status check_state(const pulse_patch *p,
                                const pulse_tensor_digest *digest,
                                const pulse_state_digest *want,
                                pulse_status mismatch, const char *which) {
  pulse_tensor_info *infos = calloc(p->count + 1, sizeof *infos);
  pulse_state_digest sd;
  if (infos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda apply: state digest");
  for (size_t i = 0; i < p->count; i++)
    infos[i] = p->tensors[i].info;
  pulse_status st = pulse_state_digest_compute(infos, digest, p->count, &sd);
  free(infos);
  if (st == PULSE_OK && memcmp(sd.bytes, want->bytes, 32) != 0)
    st = pulse_fail(
        mismatch, "cuda apply: the %s state is not the patch's (step %llu)",
        which,
        (unsigned long long)(mismatch == PULSE_ERR_BASE_DIGEST ? p->base_step
                                                               : p->step));
  return st;
}

pulse_status pulse_cuda_patch_apply(pulse_cuda_workspace *ws,
                                    const pulse_patch *p,
                                    const pulse_cuda_target *targets,
                                    size_t count, const pulse_apply_opts *opts,
                                    void *stream,
                                    pulse_tensor_digest *digests) {
  pulse_apply_opts defaults = PULSE_APPLY_OPTS_INIT;
  if (opts == NULL)
    opts = &defaults;
  if (p == NULL || (targets == NULL && count > 0) ||
      !pulse_apply_opts_known(opts)) /* class_index: host targets only */
    return pulse_fail(
        PULSE_ERR_ARG,
        "cuda apply: NULL patch or targets, or options of another version");
  pulse_status st = PULSE_OK;
  const size_t n = p->count;
  pulse_cuda_workspace *temp = NULL;
  pulse_cuda_class_index *idx = NULL;
  size_t *target =
      calloc(n + 1, sizeof *target); /* target index + 1, 0: none */
  unsigned char *targeted = calloc(count + 1, 1);
  pulse_tensor_digest *digest = calloc(n + 1, sizeof *digest);
  pulse_tensor_digest *other =
      calloc(count + 1, sizeof *other); /* targets' own digests */
  pulse_cuda_bf16_tensor *sub =
      calloc((n > count ? n : count) + 1, sizeof *sub);
  size_t *sub_of = calloc((n > count ? n : count) + 1, sizeof *sub_of);
  pulse_tensor_digest *sub_digest =
      calloc((n > count ? n : count) + 1, sizeof *sub_digest);
  size_t *changed =
      calloc(n + 1, sizeof *changed); /* patch indices with changes */
  uint64_t *entry_first = calloc(n + 1, sizeof *entry_first);
  apply_item *items = NULL;
  pulse_status *item_st = NULL;
  char(*detail)[200] = NULL;
  uint64_t *pos = NULL, *chunk_first = NULL;
  uint8_t *cls = NULL;
  uint32_t *rank = NULL;
  uint16_t *delta = NULL;
  void *pos_d = NULL, *delta_d = NULL, *old_d = NULL, *new_d = NULL;
  size_t subs = 0, m = 0, item_count = 0;
  uint64_t K = 0, items_total = 0;
  if (!target || !targeted || !digest || !other || !sub || !sub_of ||
      !sub_digest || !changed || !entry_first) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda apply: staging for %zu tensors", n);
    goto cleanup;
  }

  /* Match targets to the table by name, as pulse_patch_apply does. */
  for (size_t i = 0; i < n; i++) {
    const patch_tensor *t = &p->tensors[i];
    for (size_t j = 0; j < count; j++)
      if (targets[j].name != NULL &&
          strcmp(targets[j].name, t->info.name) == 0) {
        target[i] = j + 1;
        break;
      }
    if (target[i] == 0) {
      if (!opts->partial_table) {
        st = pulse_fail(PULSE_ERR_NOT_FOUND,
                        "cuda apply: the patch changes tensor '%s', which is "
                        "not among the targets",
                        t->info.name);
        goto cleanup;
      }
      continue;
    }
    const pulse_cuda_target *tg = &targets[target[i] - 1];
    if (tg->numel != t->numel || (tg->data_d == NULL && t->numel > 0)) {
      st = pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "cuda apply: tensor '%s' has %llu elements in the patch, "
                      "%llu in the target",
                      t->info.name, (unsigned long long)t->numel,
                      (unsigned long long)tg->numel);
      goto cleanup;
    }
    if ((uintptr_t)tg->data_d % 2 != 0) {
      st = pulse_fail(PULSE_ERR_ARG, "cuda apply: tensor '%s': misaligned data",
                      t->info.name);
      goto cleanup;
    }
    targeted[target[i] - 1] = 1;
  }
  CHECK(pulse_cuda_require_("cuda apply"));
  if (ws == NULL) {
    CHECK(pulse_cuda_workspace_create(&temp));
    ws = temp;
  }

  /* Current digests: given, or one device pass over those lacking one (and
   * over untouched targets only when the caller wants their digests). */
  for (size_t j = 0; j < count; j++) {
    if (targets[j].digest != NULL) {
      other[j] = *targets[j].digest;
    } else if (targeted[j] || digests != NULL) {
      if (targets[j].numel > 0 &&
          (targets[j].data_d == NULL || (uintptr_t)targets[j].data_d % 2)) {
        st = pulse_fail(PULSE_ERR_ARG,
                        "cuda apply: target %zu: NULL or misaligned data", j);
        goto cleanup;
      }
      sub[subs].data_d = targets[j].data_d;
      sub[subs].numel = targets[j].numel;
      sub_of[subs++] = j;
    }
  }
  if (subs > 0)
    CHECK(pulse_cuda_digest(ws, sub, subs, sub_digest, stream));
  for (size_t k = 0; k < subs; k++)
    other[sub_of[k]] = sub_digest[k];

  /* The base must be the patch's base. */
  for (size_t i = 0; i < n; i++) {
    if (target[i] == 0)
      continue;
    digest[i] = other[target[i] - 1];
    if (!same_digest(digest[i], p->tensors[i].base_digest)) {
      st = pulse_fail(
          PULSE_ERR_BASE_DIGEST,
          "cuda apply: tensor '%s' is not the patch's base (step %llu)",
          p->tensors[i].info.name, (unsigned long long)p->base_step);
      goto cleanup;
    }
  }
  if (!opts->partial_table)
    CHECK(
        check_state(p, digest, &p->base_digest, PULSE_ERR_BASE_DIGEST, "base"));

  /* The tensors to change, their entries and their chunks with changes. */
  for (size_t i = 0; i < n; i++) {
    if (target[i] == 0 || p->tensors[i].changed == 0)
      continue;
    const patch_tensor *t = &p->tensors[i];
    sub[m].data_d = targets[target[i] - 1].data_d;
    sub[m].numel = t->numel;
    changed[m] = i;
    entry_first[m + 1] = entry_first[m] + t->changed;
    items_total += t->chunk_count;
    m++;
  }
  K = entry_first[m];
  if (K > 0) {
    items = calloc(items_total + 1, sizeof *items);
    item_st = calloc(items_total + 1, sizeof *item_st);
    detail = calloc(items_total + 1, sizeof *detail);
    chunk_first = calloc(items_total + 1, sizeof *chunk_first);
    delta = malloc((size_t)K * sizeof *delta);
    pos = malloc((size_t)K * sizeof *pos);
    cls = malloc((size_t)K * sizeof *cls);
    rank = malloc((size_t)K * sizeof *rank);
    if (!items || !item_st || !detail || !chunk_first || !delta || !pos ||
        !cls || !rank) {
      st = pulse_fail(PULSE_ERR_NOMEM, "cuda apply: staging of %llu changes",
                      (unsigned long long)K);
      goto cleanup;
    }
    /* Index chunks: every chunk of the changed tensors, in order (the class
     * index numbers them the same way). */
    uint64_t g = 0;
    for (size_t l = 0; l < m; l++) {
      const patch_tensor *t = &p->tensors[changed[l]];
      for (uint64_t j = 0; j < t->chunk_count; j++, g++) {
        uint64_t at = entry_first[l] + p->chunk_before[t->chunk_first + j];
        chunk_first[g] = at;
        if (p->chunk_changed[t->chunk_first + j] != 0)
          items[item_count++] = (apply_item){changed[l], j, at, g};
      }
    }
    chunk_first[g] = K;

    decode_job job = {p, items, NULL, pos, cls, rank, delta, item_st, detail};
    if (p->model == PULSE_POS_CLASS) {
      uint64_t chunks = 0;
      CHECK(pulse_cuda_class_index_build(sub, m, p->chunk_log2, stream, &idx));
      job.hist = pulse_cuda_class_index_hist(idx, &chunks);
      if (chunks != items_total) {
        st = pulse_fail(PULSE_ERR_INTERNAL,
                        "cuda apply: %llu index chunks, %llu in the patch",
                        (unsigned long long)chunks,
                        (unsigned long long)items_total);
        goto cleanup;
      }
    }
    pulse_parallel_for(opts->threads, item_count, decode_one, &job);
    for (size_t i = 0; i < item_count; i++)
      if (item_st[i] != PULSE_OK) {
        st = pulse_fail(item_st[i], "cuda apply: %s", detail[i]);
        goto cleanup;
      }

    /* Positions on the device, then old bits, new bits and digest moves. */
    CHECK(slot(ws, PULSE_WS_X_POS, K, sizeof(uint64_t), &pos_d));
    CHECK(slot(ws, PULSE_WS_X_DELTA, K, sizeof(uint16_t), &delta_d));
    CHECK(slot(ws, PULSE_WS_X_OLD, K, sizeof(uint16_t), &old_d));
    CHECK(slot(ws, PULSE_WS_X_NEW, K, sizeof(uint16_t), &new_d));
    if (p->model == PULSE_POS_CLASS)
      CHECK(pulse_cuda_locate(idx, chunk_first, cls, rank, pos_d, stream));
    else
      CHECK(pulse_cuda_upload(pos_d, pos, (size_t)K * sizeof *pos, stream));
    CHECK(pulse_cuda_upload(delta_d, delta, (size_t)K * sizeof *delta, stream));
    CHECK(pulse_cuda_gather_(ws, sub, m, entry_first, pos_d, delta_d, old_d,
                             new_d, stream));
    CHECK(pulse_cuda_changes_digest(ws, entry_first, m, pos_d, old_d, new_d,
                                    sub_digest, stream));
    for (size_t l = 0; l < m; l++) {
      digest[changed[l]].a += sub_digest[l].a;
      digest[changed[l]].b += sub_digest[l].b;
    }
  }

  /* The result must be the patch's target, before anything is written. */
  for (size_t i = 0; i < n; i++) {
    if (target[i] != 0 &&
        !same_digest(digest[i], p->tensors[i].target_digest)) {
      st = pulse_fail(
          PULSE_ERR_TARGET_DIGEST,
          "cuda apply: tensor '%s' would not match the target of step %llu",
          p->tensors[i].info.name, (unsigned long long)p->step);
      goto cleanup;
    }
  }
  if (!opts->partial_table)
    CHECK(check_state(p, digest, &p->target_digest, PULSE_ERR_TARGET_DIGEST,
                      "resulting"));

  /* Commit: one scatter for every changed tensor. */
  if (K > 0)
    CHECK(pulse_cuda_scatter(ws, sub, m, entry_first, pos_d, new_d, stream));
  for (size_t j = 0; digests != NULL && j < count; j++)
    digests[j] = other[j];
  for (size_t i = 0; digests != NULL && i < n; i++)
    if (target[i] != 0)
      digests[target[i] - 1] = digest[i];

cleanup:
  pulse_cuda_class_index_free(idx);
  pulse_cuda_workspace_free(temp);
  free(target), free(targeted), free(digest), free(other), free(sub),
      free(sub_of);
  free(sub_digest), free(changed), free(entry_first), free(items),
      free(item_st), free(detail);
  free(pos), free(chunk_first), free(cls), free(rank), free(delta);
  return st;
}
