/* sub_fp8.c - FP8 targets (pulse_sub_bind_fp8): an FP8 tensor of the
 * engine kept equal to the reference block quantizer (pulse_fp8.h) of a
 * BF16 shadow that ordinary targets keep current.
 *
 * The shadow is attached like any BF16 target (a host target, or region
 * blocks that tile it: fused and tensor-parallel layouts work unchanged),
 * so the patch machinery does not know about FP8 at all. What this file
 * adds is a second half to each step's transaction: once a patch is
 * staged (decoded and checked against its digests), the changes that fall
 * in a shadow are handed to its pulse_fp8_track, which stages the FP8
 * bytes and scales of only the blocks they touch; a NaN or infinity fails
 * the step there, before anything is written. The commit then writes the
 * BF16 changes, the FP8 bytes and the scales under one writers' lock. An
 * anchor checks every value that goes into a shadow before its copy, and
 * requantizes the shadows whole after it.
 *
 * Memory: the shadow (2 bytes per element, the caller's), 2 bytes per
 * scale block (the kept amax), and per step the staged FP8 bytes
 * (O(changes), plus the blocks whose scale moved). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "patch_changes_impl.h"
#include "pulse_fp8.h"
#include "status_impl.h"
#include "sub_impl.h"

typedef struct {
  uint16_t *shadow;
  uint64_t numel;
  pulse_fp8_tensor fp8;
  pulse_fp8_track *track;
  pulse_fp8_staged *staged; /* the running step's, until commit or drop */
  /* the running step's changes in the shadow, gathered from the targets */
  uint64_t *off;
  uint16_t *bits;
  uint64_t count, cap;
} sub_fp8_binding;

struct sub_fp8 {
  sub_fp8_binding *b;
  size_t n;
};

/* The memory a target writes: [lo, hi) in bytes. */
static void target_span(const sub_target *t, int region, uintptr_t *lo, uintptr_t *hi) {
  *lo = (uintptr_t)t->data;
  if (!region)
    *hi = *lo + (uintptr_t)(t->numel * 2);
  else
    *hi = t->rows && t->cols ? (uintptr_t)(t->data + (t->rows - 1) * t->stride + t->cols) : *lo;
}

/* The binding whose shadow holds target t's memory, or NULL. */
static sub_fp8_binding *binding_of(pulse_sub *sub, const sub_target *t) {
  if (sub->fp8 == NULL || t->data == NULL)
    return NULL;
  for (size_t i = 0; i < sub->fp8->n; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    if (t->data >= b->shadow && t->data < b->shadow + b->numel)
      return b;
  }
  return NULL;
}

/* The shadow must be exactly the memory of the targets inside it: every
 * element of it is brought to each step by them, so its quantization is
 * the quantization of the trainer's weights in the engine's layout. */
static pulse_status check_cover(pulse_sub *sub, const uint16_t *shadow, uint64_t numel) {
  uintptr_t slo = (uintptr_t)shadow, shi = slo + (uintptr_t)(numel * 2);
  uint64_t covered = 0;
  int region = sub->mem == SUB_MEM_REGION;
  for (size_t k = 0; k < sub->ntargets; k++) {
    const sub_target *t = &sub->targets[k];
    uintptr_t lo, hi;
    target_span(t, region, &lo, &hi);
    if (lo >= hi || hi <= slo || lo >= shi)
      continue;
    if (lo < slo || hi > shi)
      return pulse_fail(PULSE_ERR_ARG,
                        "bind fp8: target '%s' lies partly outside the shadow", t->name);
    covered += region ? t->rows * t->cols : t->numel;
  }
  if (covered != numel)
    return pulse_fail(PULSE_ERR_ARG,
                      "bind fp8: the attached targets cover %" PRIu64 " of the shadow's %" PRIu64
                      " elements (attach its tensors or blocks first)",
                      covered, numel);
  return PULSE_OK;
}

pulse_status pulse_sub_bind_fp8(pulse_sub *sub, uint16_t *shadow, const pulse_fp8_tensor *fp8) {
  if (sub == NULL || shadow == NULL || fp8 == NULL || fp8->q == NULL || fp8->scale_inv == NULL)
    return pulse_fail(PULSE_ERR_ARG, "bind fp8: NULL argument");
  if (sub->mem != SUB_MEM_HOST && sub->mem != SUB_MEM_REGION)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_ARG,
                                          "bind fp8: the shadow must be host or region targets "
                                          "(attach them first)"));
  if ((uintptr_t)shadow % 2 != 0 || fp8->rows == 0 || fp8->cols == 0 ||
      fp8->rows > UINT64_MAX / 2 / fp8->cols)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_ARG,
                                          "bind fp8: unaligned shadow or bad shape %" PRIu64
                                          " x %" PRIu64, fp8->rows, fp8->cols));
  uint64_t numel = fp8->rows * fp8->cols;
  if (sub->fp8 != NULL)
    for (size_t i = 0; i < sub->fp8->n; i++) {
      const sub_fp8_binding *o = &sub->fp8->b[i];
      if (shadow < o->shadow + o->numel && o->shadow < shadow + numel)
        return sub_keep_error(sub, pulse_fail(PULSE_ERR_ARG,
                                              "bind fp8: the shadow overlaps another's"));
    }
  pulse_status st = check_cover(sub, shadow, numel);
  if (st != PULSE_OK)
    return sub_keep_error(sub, st);
  if (sub->fp8 == NULL && (sub->fp8 = calloc(1, sizeof *sub->fp8)) == NULL)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_NOMEM, "bind fp8"));
  sub_fp8_binding *grown = realloc(sub->fp8->b, (sub->fp8->n + 1) * sizeof *grown);
  if (grown == NULL)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_NOMEM, "bind fp8"));
  sub->fp8->b = grown;
  sub_fp8_binding nb = {0};
  nb.shadow = shadow;
  nb.numel = numel;
  nb.fp8 = *fp8;
  /* Quantizes what the shadow holds now: from here on the FP8 tensor is
   * always the quantization of the shadow. */
  st = pulse_fp8_track_create(shadow, fp8, sub->opts.threads, &nb.track);
  if (st != PULSE_OK)
    return sub_keep_error(sub, pulse_fail(st, "bind fp8: %s", pulse_error_detail()));
  sub->fp8->b[sub->fp8->n++] = nb;
  return PULSE_OK;
}

void sub_fp8_drop(pulse_sub *sub) {
  if (sub->fp8 == NULL)
    return;
  for (size_t i = 0; i < sub->fp8->n; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    pulse_fp8_staged_free(b->staged);
    b->staged = NULL;
    b->count = 0;
  }
}

void sub_fp8_free(pulse_sub *sub) {
  if (sub->fp8 == NULL)
    return;
  sub_fp8_drop(sub);
  for (size_t i = 0; i < sub->fp8->n; i++) {
    pulse_fp8_track_free(sub->fp8->b[i].track);
    free(sub->fp8->b[i].off), free(sub->fp8->b[i].bits);
  }
  free(sub->fp8->b);
  free(sub->fp8);
  sub->fp8 = NULL;
}

/* Adds target t's staged changes (indexes into t->data) to its shadow's. */
static pulse_status gather(pulse_sub *sub, const sub_target *t, uint64_t count,
                           const uint64_t *at, const uint16_t *new_bits) {
  sub_fp8_binding *b = binding_of(sub, t);
  if (b == NULL || count == 0)
    return PULSE_OK;
  if (count > b->cap - b->count) {
    uint64_t cap = b->count + count;
    cap += cap / 4;
    if (cap > SIZE_MAX / 8)
      return pulse_fail(PULSE_ERR_OVERFLOW, "fp8 stage: %" PRIu64 " changes", cap);
    uint64_t *off = realloc(b->off, (size_t)cap * sizeof *off);
    if (off != NULL)
      b->off = off;
    uint16_t *bits = realloc(b->bits, (size_t)cap * sizeof *bits);
    if (bits != NULL)
      b->bits = bits;
    if (off == NULL || bits == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "fp8 stage: %" PRIu64 " changes", cap);
    b->cap = cap;
  }
  uint64_t base = (uint64_t)(t->data - b->shadow);
  for (uint64_t i = 0; i < count; i++) {
    b->off[b->count + i] = base + at[i];
    b->bits[b->count + i] = new_bits[i];
  }
  b->count += count;
  return PULSE_OK;
}

/* Stages every binding's gathered changes; on an error none stays. */
static pulse_status stage_gathered(pulse_sub *sub) {
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < sub->fp8->n && st == PULSE_OK; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    st = pulse_fp8_track_stage(b->track, b->off, b->bits, b->count, &b->staged);
    if (st != PULSE_OK) {
      st = pulse_fail(st, "FP8 target of %" PRIu64 " x %" PRIu64 ": %s", b->fp8.rows,
                      b->fp8.cols, pulse_error_detail());
    }
    b->count = 0;
  }
  if (st != PULSE_OK)
    sub_fp8_drop(sub);
  return st;
}

pulse_status sub_fp8_stage_patch(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                 const pulse_patch_staged *staged,
                                 const pulse_patch_stream *stream) {
  if (sub->fp8 == NULL || sub->fp8->n == 0)
    return PULSE_OK;
  double t0 = sub_now();
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < pulse_patch_tensor_count(p) && st == PULSE_OK; i++) {
    if (tg[i] == NULL)
      continue;
    const pulse_changes *ch =
        staged != NULL ? patch_staged_changes(staged, i) : patch_stream_changes(stream, i);
    if (ch != NULL)
      st = gather(sub, tg[i], ch->count, ch->pos, ch->new_bits);
  }
  if (st == PULSE_OK)
    st = stage_gathered(sub);
  else
    sub_fp8_drop(sub);
  sub->t_decode += sub_now() - t0;
  return st;
}

pulse_status sub_fp8_stage_regions(pulse_sub *sub, const pulse_region_staged *staged) {
  if (sub->fp8 == NULL || sub->fp8->n == 0)
    return PULSE_OK;
  double t0 = sub_now();
  pulse_status st = PULSE_OK;
  for (size_t k = 0; k < sub->ntargets && st == PULSE_OK; k++) {
    uint64_t count;
    const uint64_t *at;
    const uint16_t *bits;
    patch_region_staged_block(staged, k, &count, &at, &bits);
    st = gather(sub, &sub->targets[k], count, at, bits);
  }
  if (st == PULSE_OK)
    st = stage_gathered(sub);
  else
    sub_fp8_drop(sub);
  sub->t_decode += sub_now() - t0;
  return st;
}

void sub_fp8_commit(pulse_sub *sub) {
  if (sub->fp8 == NULL)
    return;
  for (size_t i = 0; i < sub->fp8->n; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    pulse_fp8_staged_commit(b->staged);
    pulse_fp8_staged_free(b->staged);
    b->staged = NULL;
  }
}

pulse_status sub_fp8_anchor_check(pulse_sub *sub, const sub_target *t, const uint16_t *src,
                                  uint64_t rows, uint64_t cols, uint64_t stride) {
  if (binding_of(sub, t) == NULL)
    return PULSE_OK;
  pulse_status st = pulse_fp8_check_finite(src, rows, cols, stride, t->name);
  if (st != PULSE_OK)
    return pulse_fail(st, "anchor into the FP8 target's shadow: %s; nothing applied",
                      pulse_error_detail());
  return PULSE_OK;
}

pulse_status sub_fp8_requantize(pulse_sub *sub) {
  pulse_status st = PULSE_OK;
  /* Every value was checked before the copy: only memory for the pass (a
   * few bytes per row band) can fail here, and the caller then holds no
   * known step (the next sync takes the anchor again). */
  for (size_t i = 0; sub->fp8 != NULL && i < sub->fp8->n; i++)
    if (st == PULSE_OK)
      st = pulse_fp8_track_requantize(sub->fp8->b[i].track, sub->opts.threads);
  return st;
}
