/* sub_apply.c - moving the targets one step, transactionally.
 *
 * A patch (host targets): the targets' kept digests are compared with the
 * patch's base digests (and the base state digest when the targets hold the
 * whole table), every changed tensor is decoded into staging while readers
 * may still read, the digests the staged changes lead to are compared with
 * the patch's target digests, and only then, under the writers' lock, are
 * the new bits written: a reader holding the read lock sees step k or k+1.
 * Device targets go through pulse_cuda_patch_apply, which runs the same
 * transaction on the device. An anchor is opened, every tensor's digest and
 * the state digest are computed and compared with its metadata (and with the
 * head's when it is the head's step) before anything is copied
 * (sub_anchor_verify, which region targets use too).
 *
 * The targets' digests are kept current in O(changes) per step, so checking
 * a base never reads the whole model again. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hugepage_impl.h"
#include "parallel_impl.h"
#include "pulse_log.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "sub_impl.h"

static int same_digest(pulse_tensor_digest a, pulse_tensor_digest b) {
  return a.a == b.a && a.b == b.b;
}

static int same_shape(const sub_target *t, const pulse_tensor_info *info) {
  if (t->ndim != info->ndim)
    return 0;
  for (uint32_t d = 0; d < t->ndim; d++)
    if (t->shape[d] != info->shape[d])
      return 0;
  return 1;
}

static void shape_text(uint32_t ndim, const uint64_t *shape, char *out,
                       size_t cap) {
  size_t at = (size_t)snprintf(out, cap, "[");
  for (uint32_t d = 0; d < ndim && at < cap; d++)
    at += (size_t)snprintf(out + at, cap - at, d ? ", %" PRIu64 : "%" PRIu64,
                           shape[d]);
  if (at < cap)
    snprintf(out + at, cap - at, "]");
}

static pulse_status shape_mismatch(const sub_target *t,
                                   const pulse_tensor_info *info) {
  char mine[200], theirs[200];
  shape_text(t->ndim, t->shape, mine, sizeof mine);
  shape_text(info->ndim, info->shape, theirs, sizeof theirs);
  return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                    "target '%s' has shape %s, the publisher's %s", t->name,
                    mine, theirs);
}

/* --------------------------------------------------------------- patches */

pulse_status sub_apply_match(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                             int *full) {
  size_t n = pulse_patch_tensor_count(p), matched = 0;
  for (size_t k = 0; k < sub->ntargets; k++) {
    sub_target *t = &sub->targets[k];
    size_t i;
    if (pulse_patch_tensor_find(p, t->name, &i) != PULSE_OK)
      return pulse_fail(PULSE_ERR_NOT_FOUND,
                        "target '%s' is not in the publisher's table", t->name);
    pulse_patch_tensor pt;
    PULSE_TRY(pulse_patch_tensor_get(p, i, &pt));
    if (pt.numel != t->numel || !same_shape(t, &pt.info))
      return shape_mismatch(t, &pt.info);
    if (tg[i] == NULL)
      matched++;
    tg[i] = t;
  }
  *full = matched == n;
  return PULSE_OK;
}

static pulse_status apply_device(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                 int full) {
  /* Same transaction as the host path, by the CUDA stream fed the whole
   * object at once: base digests, decode and device checks while readers
   * may still read, then the scatter under the writers' lock. */
  size_t n = pulse_patch_tensor_count(p), k = 0;
  pulse_cuda_target *ct = calloc(n + 1, sizeof *ct);
  if (ct == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "device apply");
  for (size_t i = 0; i < n; i++)
    if (tg[i] != NULL)
      ct[k++] = (pulse_cuda_target){tg[i]->name, tg[i]->data_d, tg[i]->numel, &tg[i]->digest};
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = sub->opts.threads;
  ao.partial_table = !full;
  double t0 = sub_now();
  pulse_cuda_patch_stream *cs = NULL;
  pulse_status st =
      pulse_cuda_patch_stream_begin(sub->ws, p, ct, k, &ao, sub->opts.cuda_stream, &cs);
  if (st == PULSE_OK) {
    pulse_cuda_patch_stream_feed(cs, SIZE_MAX); /* the whole object is there */
    st = pulse_cuda_patch_stream_finish(cs);
  }
  sub->t_decode += sub_now() - t0;
  if (st == PULSE_OK)
    st = sub_apply_commit_device(sub, p, tg, full, cs);
  pulse_cuda_patch_stream_free(cs);
  free(ct);
  return st;
}

/* The targets hold the patch's target now (under the writers' lock): their
 * digests and the step. */
static void now_at_target(pulse_sub *sub, const pulse_patch *p, sub_target **tg, int full) {
  for (size_t i = 0; i < pulse_patch_tensor_count(p); i++) {
    pulse_patch_tensor pt;
    if (tg[i] == NULL)
      continue;
    pulse_patch_tensor_get(p, i, &pt);
    tg[i]->digest = pt.target_digest;
  }
  sub_set_step(sub, pulse_patch_step(p), full ? pulse_patch_target_digest(p) : NULL);
}

pulse_status sub_apply_commit_device(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                     int full, pulse_cuda_patch_stream *cs) {
  /* The FP8 targets' stage reads the shadows' old bits, so it precedes
   * the scatter; a refusal (a NaN) leaves everything as it was. */
  pulse_status st = sub_fp8_stage_device(sub, p, tg, cs);
  if (st != PULSE_OK)
    return st;
  double t0 = sub_now();
  pthread_rwlock_wrlock(&sub->rw);
  st = pulse_cuda_patch_stream_commit(cs, NULL);
  if (st == PULSE_OK)
    st = sub_fp8_commit_device(sub); /* queued after the scatter */
  else
    sub_fp8_drop(sub);
  if (st == PULSE_OK)
    now_at_target(sub, p, tg, full);
  else
    sub_set_step(sub, PULSE_SUB_NO_STEP, NULL); /* contents unknown */
  pthread_rwlock_unlock(&sub->rw);
  sub->t_apply += sub_now() - t0;
  return st;
}

void sub_apply_commit(pulse_sub *sub, const pulse_patch *p, sub_target **tg, int full,
                      pulse_patch_staged *staged, pulse_patch_stream *stream) {
  /* Second half, under the writers' lock: nothing can fail from here. */
  double t0 = sub_now();
  pthread_rwlock_wrlock(&sub->rw);
  if (staged != NULL)
    pulse_patch_staged_commit_data(staged);
  else
    pulse_patch_stream_commit_data(stream);
  sub_fp8_commit(sub); /* the FP8 targets' half, staged with the patch */
  now_at_target(sub, p, tg, full);
  pthread_rwlock_unlock(&sub->rw);
  /* The class indexes follow with readers back in: only the next patch
   * reads them, and it is applied on this thread. */
  if (staged != NULL)
    pulse_patch_staged_commit_indexes(staged);
  else
    pulse_patch_stream_commit_indexes(stream);
  sub->t_apply += sub_now() - t0;
  if (sub->mem == SUB_MEM_FILE) /* the file follows at the save */
    sub_file_note_patch(sub, p, tg, staged, stream);
  sub_index_start(sub); /* the indexes this patch lacked, until the next */
}

pulse_status sub_apply_patch(pulse_sub *sub, const pulse_patch *p) {
  if (sub->mem == SUB_MEM_REGION)
    return sub_region_apply_patch(sub, p);
  if (sub->step != PULSE_SUB_NO_STEP && pulse_patch_base_step(p) != sub->step)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "the patch to step %" PRIu64 " applies to step %" PRIu64
                      ", the targets hold step %" PRIu64,
                      pulse_patch_step(p), pulse_patch_base_step(p), sub->step);
  size_t n = pulse_patch_tensor_count(p);
  sub_target **tg = calloc(n + 1, sizeof *tg);
  pulse_host_tensor *ht = calloc(n + 1, sizeof *ht);
  pulse_class_index **ix = calloc(n + 1, sizeof *ix);
  pulse_status st = PULSE_OK;
  int full = 0;
  if (tg == NULL || ht == NULL || ix == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "staging a patch of %zu tensors", n);
    goto done;
  }
  if ((st = sub_apply_match(sub, p, tg, &full)) != PULSE_OK)
    goto done;

  if (sub->mem == SUB_MEM_DEVICE) {
    /* The base digests first, so a wrong base is never sent to the device. */
    double t0 = sub_now();
    for (size_t i = 0; i < n && st == PULSE_OK; i++) {
      pulse_patch_tensor pt;
      if (tg[i] == NULL)
        continue;
      pulse_patch_tensor_get(p, i, &pt);
      if (!same_digest(tg[i]->digest, pt.base_digest))
        st = pulse_fail(PULSE_ERR_BASE_DIGEST,
                        "target '%s' is not the base of the patch to step %" PRIu64
                        " (step %" PRIu64 ")",
                        tg[i]->name, pulse_patch_step(p), pulse_patch_base_step(p));
    }
    sub->t_verify += sub_now() - t0;
    if (st == PULSE_OK)
      st = apply_device(sub, p, tg, full);
    goto committed;
  }

  /* Check and decode into staging while readers may still read the
   * targets (the codec's transaction, first half); the targets' digests are
   * kept current, so no tensor is hashed again. */
  sub_targets_index(sub, p);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (tg[i] != NULL) {
      ix[k] = tg[i]->index;
      ht[k++] = (pulse_host_tensor){tg[i]->name, tg[i]->data, tg[i]->numel, &tg[i]->digest};
    }
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = sub->opts.threads;
  ao.partial_table = !full;
  ao.class_index = ix;
  pulse_patch_staged *staged = NULL;
  st = pulse_patch_stage(p, ht, k, &ao, &staged);
  if (st != PULSE_OK) {
    st = pulse_fail(st, "patch to step %" PRIu64 ": %s: nothing applied", pulse_patch_step(p),
                    pulse_error_detail());
    goto done;
  }
  pulse_patch_stage_figures times = pulse_patch_staged_figures_get(staged);
  sub->t_verify += times.verify_seconds;
  sub->t_decode += times.decode_seconds;
  if ((st = sub_fp8_stage_patch(sub, p, tg, staged, NULL)) != PULSE_OK) {
    pulse_patch_staged_free(staged);
    st = pulse_fail(st, "patch to step %" PRIu64 ": %s: nothing applied", pulse_patch_step(p),
                    pulse_error_detail());
    goto done;
  }

  sub_apply_commit(sub, p, tg, full, staged, NULL);
  pulse_patch_staged_free(staged);

committed:
done:
  free(tg), free(ht), free(ix);
  return st;
}

/* --------------------------------------------------------------- anchors */

typedef struct {
  pulse_st_tensor *t;
  pulse_tensor_digest *d;
} anchor_job;

static void anchor_digest_one(void *ctx, size_t i) {
  anchor_job *j = ctx;
  j->d[i] = pulse_digest_bf16(j->t[i].data, j->t[i].numel);
}

pulse_status sub_anchor_verify(pulse_sub *sub, const pulse_store_object *o,
                               const pulse_st_file *f, size_t n, pulse_st_tensor *t,
                               pulse_tensor_info *info, pulse_tensor_digest *d,
                               pulse_state_digest *sd, double *t_read, double *t_digest) {
  double t0 = sub_now();
  const char *meta_step = pulse_st_metadata_get(f, "step");
  const char *meta_digest = pulse_st_metadata_get(f, "state_digest");
  pulse_status st = PULSE_OK;
  if (meta_step == NULL || strtoull(meta_step, NULL, 10) != o->step || meta_digest == NULL)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "anchor %s: its metadata does not name step %" PRIu64 " and a state digest",
                    o->path, o->step);
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    st = pulse_st_tensor_get(f, i, &t[i]);
    if (st == PULSE_OK && t[i].dtype != PULSE_DTYPE_BF16)
      st = pulse_fail(PULSE_ERR_DTYPE, "anchor %s: tensor '%s' is %s, not BF16", o->path,
                      t[i].name, pulse_dtype_name(t[i].dtype));
    if (st == PULSE_OK && (uintptr_t)t[i].data % 2 != 0)
      st = pulse_fail(PULSE_ERR_UNSUPPORTED, "anchor %s: tensor '%s' is not aligned", o->path,
                      t[i].name);
    if (st == PULSE_OK) {
      memset(&info[i], 0, sizeof info[i]);
      info[i].name = t[i].name;
      info[i].dtype = PULSE_DTYPE_BF16;
      info[i].ndim = t[i].ndim;
      memcpy(info[i].shape, t[i].shape, sizeof info[i].shape);
    }
  }
  *t_read += sub_now() - t0;
  if (st != PULSE_OK)
    return st;

  /* Its state digest, from its bytes, must be the one it names (which its
   * signed hash vouches for) and, at the head's step, the head's. */
  t0 = sub_now();
  anchor_job job = {t, d};
  pulse_parallel_for(sub->opts.threads, n, anchor_digest_one, &job);
  char have[65];
  st = pulse_state_digest_compute(info, d, n, sd);
  pulse_state_digest_hex(sd, have);
  if (st == PULSE_OK && strcmp(have, meta_digest) != 0)
    st = pulse_fail(PULSE_ERR_CORRUPT, "anchor %s: its tensors have state digest %s, it names %s",
                    o->path, have, meta_digest);
  if (st == PULSE_OK && sub->head != NULL && o->step == pulse_store_head_step(sub->head) &&
      memcmp(sd->bytes, pulse_store_head_state_digest(sub->head)->bytes, 32) != 0)
    st = pulse_fail(PULSE_ERR_CORRUPT, "anchor %s is not the head's state", o->path);
  *t_digest += sub_now() - t0;
  return st;
}

/* The file target takes the anchor's table: reuses its buffers when the
 * table is the same, else makes new ones (swapped in by the caller). */
static pulse_status file_table(pulse_sub *sub, const pulse_st_tensor *t,
                               size_t n, sub_target **out, int *fresh) {
  int same = sub->ntargets == n;
  for (size_t i = 0; same && i < n; i++) {
    pulse_tensor_info info = {t[i].name, PULSE_DTYPE_BF16, t[i].ndim, {0}};
    memcpy(info.shape, t[i].shape, sizeof info.shape);
    same = strcmp(sub->targets[i].name, t[i].name) == 0 &&
           same_shape(&sub->targets[i], &info);
  }
  *fresh = !same;
  if (same) {
    *out = sub->targets;
    return PULSE_OK;
  }
  sub_target *nt = calloc(n + 1, sizeof *nt);
  if (nt == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file target of %zu tensors", n);
  for (size_t i = 0; i < n; i++) {
    nt[i].name = strdup(t[i].name);
    nt[i].ndim = t[i].ndim;
    memcpy(nt[i].shape, t[i].shape, sizeof nt[i].shape);
    nt[i].numel = t[i].numel;
    /* On huge pages, as the file target's own reads: the steps write here
     * at random, and a fault per 4 KiB page cost more than the writes. */
    nt[i].data = pulse_hugepage_alloc(t[i].nbytes ? t[i].nbytes : 2);
    if (nt[i].name == NULL || nt[i].data == NULL) {
      for (size_t k = 0; k <= i; k++)
        free(nt[k].name), free(nt[k].data);
      free(nt);
      return pulse_fail(PULSE_ERR_NOMEM,
                        "file target: %" PRIu64 " bytes for '%s'", t[i].nbytes,
                        t[i].name);
    }
  }
  *out = nt;
  return PULSE_OK;
}

pulse_status sub_apply_anchor(pulse_sub *sub, const pulse_store_object *o) {
  if (sub->mem == SUB_MEM_REGION)
    return sub_region_apply_anchor(sub, o);
  sub_index_stop(sub); /* the weights, maybe the table, are replaced */
  char path[4096];
  sub_object_path(sub, o, path, sizeof path);
  double t0 = sub_now();
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open(path, &f);
  if (st != PULSE_OK)
    return pulse_fail(st, "anchor %s: %s", o->path, pulse_error_detail());
  size_t n = pulse_st_tensor_count(f);
  pulse_st_tensor *t = calloc(n + 1, sizeof *t);
  pulse_tensor_digest *d = calloc(n + 1, sizeof *d);
  pulse_tensor_info *info = calloc(n + 1, sizeof *info);
  size_t *from = calloc(sub->ntargets + n + 1, sizeof *from);
  sub_target *table = NULL;
  int fresh = 0;
  if (t == NULL || d == NULL || info == NULL || from == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "anchor of %zu tensors", n);
    goto done;
  }
  sub->t_decode += sub_now() - t0;
  pulse_state_digest sd;
  st = sub_anchor_verify(sub, o, f, n, t, info, d, &sd, &sub->t_decode, &sub->t_verify);
  if (st != PULSE_OK)
    goto done;

  /* Which anchor tensor each target takes, all checked before any copy. */
  if (sub->mem == SUB_MEM_FILE) {
    st = file_table(sub, t, n, &table, &fresh);
    for (size_t i = 0; i < n; i++)
      from[i] = i;
  } else {
    table = sub->targets;
    for (size_t k = 0; k < sub->ntargets && st == PULSE_OK; k++) {
      size_t i = 0;
      while (i < n && strcmp(t[i].name, table[k].name) != 0)
        i++;
      if (i == n)
        st = pulse_fail(PULSE_ERR_NOT_FOUND,
                        "target '%s' is not in the publisher's table",
                        table[k].name);
      else if (t[i].numel != table[k].numel || !same_shape(&table[k], &info[i]))
        st = shape_mismatch(&table[k], &info[i]);
      from[k] = i;
    }
  }
  if (st != PULSE_OK)
    goto done;
  size_t count = sub->mem == SUB_MEM_FILE ? n : sub->ntargets;
  int full = sub->mem == SUB_MEM_FILE || count == n;
  /* What goes into FP8 targets' shadows must quantize: checked first. */
  for (size_t k = 0; k < count && st == PULSE_OK && sub->mem != SUB_MEM_FILE; k++)
    st = sub_fp8_anchor_check(sub, &sub->targets[k], t[from[k]].data, 1, sub->targets[k].numel,
                              sub->targets[k].numel);
  if (st != PULSE_OK)
    goto done;

  t0 = sub_now();
  pthread_rwlock_wrlock(&sub->rw);
  if (fresh) { /* the file target takes the anchor's table */
    for (size_t k = 0; k < sub->ntargets; k++)
      free(sub->targets[k].name), free(sub->targets[k].data),
          pulse_class_index_free(sub->targets[k].index);
    free(sub->targets);
    sub->targets = table;
    sub->ntargets = sub->cap = n;
    pthread_mutex_lock(&sub->fig_lock);
    sub->fig.class_index_bytes = 0; /* the new table has none yet */
    pthread_mutex_unlock(&sub->fig_lock);
  }
  for (size_t k = 0; k < count && st == PULSE_OK; k++) {
    sub_target *tt = &sub->targets[k];
    const pulse_st_tensor *src = &t[from[k]];
    if (sub->mem == SUB_MEM_DEVICE)
      st = pulse_cuda_upload(tt->data_d, src->data, (size_t)src->nbytes,
                             sub->opts.cuda_stream);
    else
      memcpy(tt->data, src->data, (size_t)src->nbytes);
    tt->digest = d[from[k]];
  }
  if (st == PULSE_OK && sub->mem != SUB_MEM_FILE)
    st = sub_fp8_requantize(sub); /* host or device shadows */
  /* A device copy that failed halfway leaves no known step. */
  sub_set_step(sub, st == PULSE_OK ? o->step : PULSE_SUB_NO_STEP,
               st == PULSE_OK && full ? &sd : NULL);
  pthread_rwlock_unlock(&sub->rw);
  sub->t_apply += sub_now() - t0;
  if (st != PULSE_OK)
    goto done;
  sub->file_dirty = sub->mem == SUB_MEM_FILE;
  fresh = 0;
  sub_index_start(sub); /* the replaced weights' indexes */

done:
  if (fresh && table != NULL) {
    for (size_t k = 0; k < n; k++)
      free(table[k].name), free(table[k].data);
    free(table);
  }
  pulse_st_close(f);
  free(t), free(d), free(info), free(from);
  return st;
}
