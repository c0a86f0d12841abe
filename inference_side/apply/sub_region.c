/* sub_region.c - region targets: blocks of published tensors that a
 * tensor-parallel rank holds in buffers of its own layout
 * (pulse_sub_attach_region, pulse_region.h), and the publisher's table
 * that such a rank lays its blocks out from (pulse_sub_table).
 *
 * A patch is staged by pulse_region_stage (changes decoded and kept for the
 * block and its halo, digests moved by them, checked against the patch's
 * where block and halo are the whole tensor) and committed under the
 * writers' lock. An anchor is verified whole, as for every other target
 * (sub_anchor_verify: its tensors' digests against its state digest, which
 * its signed SHA-256 vouches for, and the head's at the head's step), read
 * through its mapping, and only the blocks are copied out; each block's digest is taken
 * from the verified anchor's bytes, and so is its halo (the bits around the
 * block that class-model patches need, pulse_region.h). Memory: the halos,
 * and the staged changes of one patch; the anchor is read through the page
 * cache, never copied whole. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_impl.h"
#include "pulse_region.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "sub_impl.h"

static int shape_is(const sub_target *t, uint32_t ndim, const uint64_t *shape) {
  if (t->ndim != ndim)
    return 0;
  for (uint32_t d = 0; d < ndim; d++)
    if (t->shape[d] != shape[d])
      return 0;
  return 1;
}

/* The pulse_region of a region target. */
static pulse_region region_of(const sub_target *t) {
  return (pulse_region){t->name, t->row0, t->rows, t->col0, t->cols, t->data, t->stride,
                        t->digest, t->halo_log2, t->halo, t->halo_digest};
}

static pulse_status add_region(pulse_sub *sub, uint32_t ndim, const uint64_t *shape,
                               const pulse_region *r) {
  if (r->name == NULL || r->name[0] == '\0' || strlen(r->name) > PULSE_MAX_NAME)
    return pulse_fail(PULSE_ERR_ARG, "attach region: bad name");
  if (sub->mem != SUB_MEM_NONE && sub->mem != SUB_MEM_REGION)
    return pulse_fail(PULSE_ERR_ARG, "attach region '%s': other kinds of targets are attached",
                      r->name);
  uint64_t rows, cols, numel;
  PULSE_TRY(pulse_region_view(shape, ndim, &rows, &cols));
  PULSE_TRY(pulse_shape_numel(shape, ndim, &numel));
  if (r->row0 > rows || r->rows > rows - r->row0 || r->col0 > cols ||
      r->cols > cols - r->col0 || r->cols > r->stride)
    return pulse_fail(PULSE_ERR_ARG,
                      "attach region '%s': rows [%" PRIu64 ", +%" PRIu64 ") columns [%" PRIu64
                      ", +%" PRIu64 ") stride %" PRIu64 " do not fit %" PRIu64 " x %" PRIu64,
                      r->name, r->row0, r->rows, r->col0, r->cols, r->stride, rows, cols);
  int empty = r->rows == 0 || r->cols == 0;
  if (!empty && (r->data == NULL || (uintptr_t)r->data % 2 != 0))
    return pulse_fail(PULSE_ERR_ARG, "attach region '%s': NULL or unaligned data", r->name);
  if (!empty && r->rows - 1 > (UINT64_MAX / 2 - r->cols) / r->stride)
    return pulse_fail(PULSE_ERR_OVERFLOW, "attach region '%s': its span overflows", r->name);
  sub_target nt = {0};
  nt.row0 = r->row0, nt.rows = r->rows, nt.col0 = r->col0, nt.cols = r->cols;
  nt.stride = r->stride;
  nt.data = r->data;
  uintptr_t lo, hi;
  sub_region_block_span(&nt, &lo, &hi);
  PULSE_TRY(sub_region_index_check(sub, r->name, lo, hi));
  if (sub->ntargets == sub->cap) {
    size_t cap = sub->cap ? 2 * sub->cap : 16;
    sub_target *t = realloc(sub->targets, cap * sizeof *t);
    if (t == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "attach region '%s'", r->name);
    sub->targets = t;
    sub->cap = cap;
  }
  nt.name = strdup(r->name);
  if (nt.name == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "attach region '%s'", r->name);
  nt.ndim = ndim;
  if (ndim > 0)
    memcpy(nt.shape, shape, ndim * sizeof *shape);
  nt.numel = numel;
  pulse_region cur = *r;
  pulse_status st = pulse_region_digest(&cur, cols, &nt.digest);
  /* The halo class-model patches need (pulse_region.h), filled by the
   * anchor: chunks of up to the publisher's default size decode. */
  uint64_t span_lo, span_hi, halo = 0;
  nt.halo_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  if (st == PULSE_OK)
    st = pulse_region_span(&cur, numel, cols, nt.halo_log2, &span_lo, &span_hi, &halo);
  if (st == PULSE_OK && halo > 0 && (halo > SIZE_MAX / 2 || (nt.halo = malloc(halo * 2)) == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "attach region '%s': a halo of %" PRIu64 " elements",
                    r->name, halo);
  if (st != PULSE_OK) {
    free(nt.name), free(nt.halo);
    return st;
  }
  sub->targets[sub->ntargets++] = nt;
  sub_region_index_note(sub);
  sub->mem = SUB_MEM_REGION;
  sub_forget_step(sub); /* new contents of unknown step */
  return PULSE_OK;
}

pulse_status pulse_sub_attach_region(pulse_sub *sub, uint32_t ndim, const uint64_t *shape,
                                     const pulse_region *region) {
  if (sub == NULL || region == NULL || ndim > PULSE_MAX_DIMS || (ndim > 0 && shape == NULL))
    return pulse_fail(PULSE_ERR_ARG, "attach region: NULL subscriber, region or shape");
  return sub_keep_error(sub, add_region(sub, ndim, shape, region));
}

/* ------------------------------------------------------------- patches */

pulse_status sub_region_apply_patch(pulse_sub *sub, const pulse_patch *p) {
  if (sub->step != PULSE_SUB_NO_STEP && pulse_patch_base_step(p) != sub->step)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "the patch to step %" PRIu64 " applies to step %" PRIu64
                      ", the targets hold step %" PRIu64,
                      pulse_patch_step(p), pulse_patch_base_step(p), sub->step);
  pulse_region *rg = calloc(sub->ntargets + 1, sizeof *rg);
  if (rg == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "staging a patch into %zu regions", sub->ntargets);
  pulse_status st = PULSE_OK;
  for (size_t k = 0; k < sub->ntargets && st == PULSE_OK; k++) {
    const sub_target *t = &sub->targets[k];
    size_t i;
    pulse_patch_tensor pt;
    if (pulse_patch_tensor_find(p, t->name, &i) != PULSE_OK)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "target '%s' is not in the publisher's table",
                      t->name);
    else if (pulse_patch_tensor_get(p, i, &pt) != PULSE_OK ||
             !shape_is(t, pt.info.ndim, pt.info.shape))
      st = pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "target '%s': its shape is not the publisher's", t->name);
    rg[k] = region_of(t);
  }
  double t0 = sub_now();
  pulse_region_staged *staged = NULL;
  if (st == PULSE_OK)
    st = pulse_region_stage(p, rg, sub->ntargets, sub->opts.threads, &staged);
  sub->t_decode += sub_now() - t0;
  if (st == PULSE_OK && (st = sub_fp8_stage_regions(sub, staged)) != PULSE_OK)
    pulse_region_staged_free(staged); /* FP8 targets: a NaN, nothing staged */
  if (st != PULSE_OK) {
    st = pulse_fail(st, "patch to step %" PRIu64 ": %s: nothing applied", pulse_patch_step(p),
                    pulse_error_detail());
    free(rg);
    return st;
  }
  t0 = sub_now();
  pthread_rwlock_wrlock(&sub->rw);
  pulse_region_staged_commit(staged);
  sub_fp8_commit(sub);
  for (size_t k = 0; k < sub->ntargets; k++)
    sub->targets[k].digest = rg[k].digest, sub->targets[k].halo_digest = rg[k].halo_digest;
  sub_set_step(sub, pulse_patch_step(p), NULL);
  pthread_rwlock_unlock(&sub->rw);
  sub->t_apply += sub_now() - t0;
  pulse_region_staged_free(staged);
  free(rg);
  return PULSE_OK;
}

/* ------------------------------------------------------------- anchors */

pulse_status sub_region_apply_anchor(pulse_sub *sub, const pulse_store_object *o) {
  char path[4096];
  sub_object_path(sub, o, path, sizeof path);
  double t0 = sub_now();
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open(path, &f);
  if (st != PULSE_OK)
    return pulse_fail(st, "anchor %s: %s", o->path, pulse_error_detail());
  size_t n = pulse_st_tensor_count(f);
  pulse_st_tensor *t = calloc(n + 1, sizeof *t);
  pulse_tensor_info *info = calloc(n + 1, sizeof *info);
  pulse_tensor_digest *d = calloc(n + 1, sizeof *d);
  pulse_st_tensor *from = calloc(sub->ntargets + 1, sizeof *from);
  if (t == NULL || info == NULL || d == NULL || from == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "anchor of %zu tensors", n);
    goto done;
  }
  sub->t_verify += sub_now() - t0;
  /* Verified whole, as every anchor (sub_apply.c); all of it is verify time here. */
  pulse_state_digest sd;
  st = sub_anchor_verify(sub, o, f, n, t, info, d, &sd, &sub->t_verify, &sub->t_verify);
  /* Which anchor tensor each block comes from (the file's name index: no
   * scan of the table per block), all checked before any copy. */
  for (size_t k = 0; k < sub->ntargets && st == PULSE_OK; k++) {
    const sub_target *tg = &sub->targets[k];
    if (pulse_st_tensor_find(f, tg->name, &from[k]) != PULSE_OK)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "target '%s' is not in the publisher's table",
                      tg->name);
    else if (!shape_is(tg, from[k].ndim, from[k].shape))
      st = pulse_fail(PULSE_ERR_SIZE_MISMATCH, "target '%s': its shape is not the publisher's",
                      tg->name);
  }
  /* What goes into FP8 targets' shadows must quantize: checked first. */
  for (size_t k = 0; k < sub->ntargets && st == PULSE_OK; k++) {
    const sub_target *tg = &sub->targets[k];
    pulse_st_tensor src;
    uint64_t rows, cols;
    if (pulse_st_tensor_find(f, tg->name, &src) != PULSE_OK) /* found above */
      continue;
    pulse_region_view(src.shape, src.ndim, &rows, &cols); /* checked at attach */
    st = sub_fp8_anchor_check(sub, tg, (const uint16_t *)src.data + tg->row0 * cols + tg->col0,
                              tg->rows, tg->cols, cols);
  }
  if (st != PULSE_OK)
    goto done;
  t0 = sub_now();
  pthread_rwlock_wrlock(&sub->rw);
  for (size_t k = 0; k < sub->ntargets; k++) {
    sub_target *tg = &sub->targets[k];
    const pulse_st_tensor *src = &from[k];
    uint64_t rows, cols;
    pulse_region_view(src->shape, src->ndim, &rows, &cols); /* checked at attach */
    const uint16_t *bits = (const uint16_t *)src->data + tg->row0 * cols + tg->col0;
    for (uint64_t r = 0; r < tg->rows && tg->cols > 0; r++)
      memcpy(tg->data + r * tg->stride, bits + r * cols, (size_t)tg->cols * 2);
    /* From the verified bytes, not from the copy. */
    pulse_digest_bf16_block(bits, tg->rows, tg->cols, cols, tg->row0 * cols + tg->col0, cols,
                            &tg->digest);
    if (tg->halo_log2 != 0) { /* the halo too, from the same bytes */
      pulse_region g = region_of(tg);
      pulse_region_halo_take(&g, src->data, src->numel, cols); /* checked at attach */
      tg->halo_digest = g.halo_digest;
    }
  }
  st = sub_fp8_requantize(sub); /* the FP8 targets, from the new shadows */
  sub_set_step(sub, st == PULSE_OK ? o->step : PULSE_SUB_NO_STEP, NULL);
  pthread_rwlock_unlock(&sub->rw);
  sub->t_apply += sub_now() - t0;

done:
  pulse_st_close(f);
  free(t), free(info), free(d), free(from);
  return st;
}

/* --------------------------------------------------------------- table */

void pulse_sub_table_free(pulse_tensor_info *table) { free(table); }

pulse_status pulse_sub_table(pulse_sub *sub, pulse_tensor_info **table, size_t *count) {
  if (sub == NULL || table == NULL || count == NULL)
    return pulse_fail(PULSE_ERR_ARG, "table: NULL argument");
  *table = NULL;
  *count = 0;
  if (sub->mem != SUB_MEM_NONE)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_ARG, "table: targets are attached"));
  PULSE_TRY(pulse_sub_sync(sub)); /* no targets: the head, verified */
  size_t na = pulse_store_head_anchor_count(sub->head);
  if (na == 0)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_NOT_FOUND, "table: the head names no anchor"));
  const pulse_store_object *o = pulse_store_head_anchor(sub->head, na - 1);
  pulse_status st = sub_object_fetch(sub, o);
  if (st != PULSE_OK)
    return sub_keep_error(sub, st);
  char path[4096];
  sub_object_path(sub, o, path, sizeof path);
  pulse_st_file *f = NULL;
  if ((st = pulse_st_open(path, &f)) != PULSE_OK)
    return sub_keep_error(sub, pulse_fail(st, "table: anchor %s: %s", o->path,
                                          pulse_error_detail()));
  size_t n = pulse_st_tensor_count(f), names = 0;
  pulse_st_tensor tt;
  for (size_t i = 0; i < n && st == PULSE_OK; i++)
    if ((st = pulse_st_tensor_get(f, i, &tt)) == PULSE_OK)
      names += strlen(tt.name) + 1;
  /* One allocation: the entries, then their names. */
  pulse_tensor_info *out = st == PULSE_OK ? malloc((n + 1) * sizeof *out + names) : NULL;
  if (st == PULSE_OK && out == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "table of %zu tensors", n);
  char *at = out != NULL ? (char *)(out + n + 1) : NULL;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_st_tensor_get(f, i, &tt);
    size_t len = strlen(tt.name) + 1;
    memcpy(at, tt.name, len);
    memset(&out[i], 0, sizeof out[i]);
    out[i].name = at;
    out[i].dtype = tt.dtype;
    out[i].ndim = tt.ndim;
    memcpy(out[i].shape, tt.shape, sizeof out[i].shape);
    at += len;
  }
  pulse_st_close(f);
  if (st != PULSE_OK) {
    free(out);
    return sub_keep_error(sub, st);
  }
  *table = out;
  *count = n;
  return PULSE_OK;
}
