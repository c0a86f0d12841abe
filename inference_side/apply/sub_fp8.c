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
 * Device targets: the shadow is device memory that attached device
 * targets cover exactly (one tensor, or several side by side: a fused
 * weight), the FP8 tensor and its scales device memory on its device,
 * followed by a pulse_cuda_fp8_track. The device patch's transaction gets
 * the same second half on the subscriber's stream: once the patch stream
 * finished (decoded, its target digests checked), the track stages the
 * shadow's changes (checks, the touched blocks; nothing written): the
 * tensor's device change list itself when the shadow is one target, else
 * the lists of its targets shifted to their offsets in the shadow into a
 * device list of the binding's; the commit scatters the BF16 changes and
 * then queues the track's commit, so the FP8 bytes and scales follow the
 * scatter in stream order.
 *
 * Memory: the shadow (2 bytes per element, the caller's), 2 bytes per
 * scale block (the kept amax), and per step the staged FP8 bytes
 * (O(changes), plus the blocks whose scale moved). On the device: 24 bytes
 * per scale block, and for a shadow of several targets 10 bytes per change
 * of the largest step so far (a shadow of one target stages from the
 * patch's own change list). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h" /* pulse_cuda_patch_stream_changes_ */
#include "patch_changes_impl.h"
#include "pulse_fp8.h"
#include "status_impl.h"
#include "sub_impl.h"

typedef struct {
  uint16_t *shadow; /* host memory, or device memory with track_d */
  uint64_t numel;
  pulse_fp8_tensor fp8;
  pulse_fp8_track *track;        /* host shadows */
  pulse_cuda_fp8_track *track_d; /* device shadows */
  int staged_d;                  /* track_d holds the running step's stage */
  uint64_t *off_d;               /* a tiled device shadow's changes, shifted */
  uint16_t *bits_d;
  uint64_t cap_d;
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

/* The binding whose shadow holds target t's memory (host or device), or
 * NULL. */
static sub_fp8_binding *binding_of(pulse_sub *sub, const sub_target *t) {
  const uint16_t *mem = t->data != NULL ? t->data : t->data_d;
  if (sub->fp8 == NULL || mem == NULL)
    return NULL;
  for (size_t i = 0; i < sub->fp8->n; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    if (mem >= b->shadow && mem < b->shadow + b->numel)
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

/* A device shadow is covered exactly by device targets, each whole inside
 * it (one, or several side by side). */
static pulse_status check_device_shadow(pulse_sub *sub, const uint16_t *shadow, uint64_t numel) {
  uint64_t covered = 0;
  for (size_t k = 0; k < sub->ntargets; k++) {
    const sub_target *t = &sub->targets[k];
    if (t->data_d == NULL || t->numel == 0 || t->data_d + t->numel <= shadow ||
        t->data_d >= shadow + numel)
      continue;
    if (t->data_d < shadow || t->data_d + t->numel > shadow + numel)
      return pulse_fail(PULSE_ERR_ARG,
                        "bind fp8: device target '%s' lies partly outside the shadow", t->name);
    covered += t->numel;
  }
  if (covered != numel)
    return pulse_fail(PULSE_ERR_ARG,
                      "bind fp8: the attached device targets cover %" PRIu64
                      " of the shadow's %" PRIu64 " elements (attach its tensors first)",
                      covered, numel);
  return PULSE_OK;
}

/* The room for one more binding. */
static pulse_status grow(pulse_sub *sub) {
  if (sub->fp8 == NULL && (sub->fp8 = calloc(1, sizeof *sub->fp8)) == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "bind fp8");
  sub_fp8_binding *grown = realloc(sub->fp8->b, (sub->fp8->n + 1) * sizeof *grown);
  if (grown == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "bind fp8");
  sub->fp8->b = grown;
  return PULSE_OK;
}

static pulse_status bind_device(pulse_sub *sub, uint16_t *shadow, const pulse_fp8_tensor *fp8,
                                uint64_t numel) {
  PULSE_TRY(check_device_shadow(sub, shadow, numel));
  PULSE_TRY(grow(sub));
  sub_fp8_binding nb = {0};
  nb.shadow = shadow;
  nb.numel = numel;
  nb.fp8 = *fp8;
  pulse_cuda_fp8_tensor t = {fp8->rows, fp8->cols, fp8->q, fp8->scale_inv, fp8->scale};
  /* Quantizes what the shadow holds now, on the subscriber's stream. */
  pulse_status st = pulse_cuda_fp8_track_create(shadow, &t, sub->opts.cuda_stream, &nb.track_d);
  if (st != PULSE_OK)
    return pulse_fail(st, "bind fp8: %s", pulse_error_detail());
  sub->fp8->b[sub->fp8->n++] = nb;
  return PULSE_OK;
}

pulse_status pulse_sub_bind_fp8(pulse_sub *sub, uint16_t *shadow, const pulse_fp8_tensor *fp8) {
  if (sub == NULL || shadow == NULL || fp8 == NULL || fp8->q == NULL || fp8->scale_inv == NULL)
    return pulse_fail(PULSE_ERR_ARG, "bind fp8: NULL argument");
  if (sub->mem != SUB_MEM_HOST && sub->mem != SUB_MEM_REGION && sub->mem != SUB_MEM_DEVICE)
    return sub_keep_error(sub, pulse_fail(PULSE_ERR_ARG,
                                          "bind fp8: the shadow must be host, region or device "
                                          "targets (attach them first)"));
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
  sub->have_refused = 0; /* other FP8 targets: a step refused may go now */
  if (sub->mem == SUB_MEM_DEVICE)
    return sub_keep_error(sub, bind_device(sub, shadow, fp8, numel));
  pulse_status st = check_cover(sub, shadow, numel);
  if (st == PULSE_OK)
    st = grow(sub);
  if (st != PULSE_OK)
    return sub_keep_error(sub, st);
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
    pulse_cuda_fp8_track_drop(b->track_d);
    b->staged_d = 0;
  }
}

void sub_fp8_free(pulse_sub *sub) {
  if (sub->fp8 == NULL)
    return;
  sub_fp8_drop(sub);
  for (size_t i = 0; i < sub->fp8->n; i++) {
    pulse_fp8_track_free(sub->fp8->b[i].track);
    pulse_cuda_fp8_track_free(sub->fp8->b[i].track_d);
    pulse_cuda_free(sub->fp8->b[i].off_d);
    pulse_cuda_free(sub->fp8->b[i].bits_d);
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
  if (b == NULL || b->track == NULL || count == 0)
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
    if (b->track == NULL)
      continue;
    st = pulse_fp8_track_stage(b->track, b->off, b->bits, b->count, &b->staged);
    /* A value the step brings cannot be quantized: the step is refused
     * (sub_sync.c does not retry it by another route). */
    sub->refusing |= st == PULSE_ERR_UNSUPPORTED;
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
    if (b->staged == NULL)
      continue;
    pulse_fp8_staged_commit(b->staged);
    pulse_fp8_staged_free(b->staged);
    b->staged = NULL;
  }
}

/* Room for `count` shifted changes in b's device lists, allocated on the
 * shadow's device (a quarter to spare). */
static pulse_status reserve_device(sub_fp8_binding *b, uint64_t count) {
  if (count <= b->cap_d)
    return PULSE_OK;
  uint64_t cap = count + count / 4;
  if (cap > SIZE_MAX / sizeof *b->off_d)
    return pulse_fail(PULSE_ERR_OVERFLOW, "fp8 stage: %" PRIu64 " changes", cap);
  int device = -1, previous = -1;
  PULSE_TRY(pulse_cuda_device_of(b->shadow, &device));
  PULSE_TRY(pulse_cuda_get_device(&previous));
  PULSE_TRY(pulse_cuda_set_device(device));
  pulse_cuda_free(b->off_d);
  pulse_cuda_free(b->bits_d);
  b->off_d = NULL;
  b->bits_d = NULL;
  b->cap_d = 0;
  pulse_status st = pulse_cuda_alloc((void **)&b->off_d, (size_t)cap * sizeof *b->off_d);
  if (st == PULSE_OK)
    st = pulse_cuda_alloc((void **)&b->bits_d, (size_t)cap * sizeof *b->bits_d);
  if (st == PULSE_OK)
    b->cap_d = cap;
  pulse_cuda_set_device(previous);
  return st;
}

/* Stages binding b's changes of the finished patch stream: one target's
 * list as it is, several shifted into b's device lists. */
static pulse_status stage_one_device(pulse_sub *sub, sub_fp8_binding *b, const pulse_patch *p,
                                     sub_target **tg, const pulse_cuda_patch_stream *cs) {
  size_t n = pulse_patch_tensor_count(p), lists = 0, only = 0;
  uint64_t total = 0;
  const uint64_t *pos_d;
  const uint16_t *new_d;
  uint64_t count;
  for (size_t i = 0; i < n; i++) {
    if (tg[i] == NULL || binding_of(sub, tg[i]) != b)
      continue;
    PULSE_TRY(pulse_cuda_patch_stream_changes_(cs, i, &pos_d, &new_d, &count));
    if (count > 0)
      lists++, only = i, total += count;
  }
  if (total == 0)
    return PULSE_OK;
  if (lists == 1 && tg[only]->data_d == b->shadow) {
    PULSE_TRY(pulse_cuda_patch_stream_changes_(cs, only, &pos_d, &new_d, &count));
  } else {
    PULSE_TRY(reserve_device(b, total));
    uint64_t at = 0;
    for (size_t i = 0; i < n; i++) {
      if (tg[i] == NULL || binding_of(sub, tg[i]) != b)
        continue;
      PULSE_TRY(pulse_cuda_patch_stream_changes_(cs, i, &pos_d, &new_d, &count));
      PULSE_TRY(pulse_cuda_changes_shift_(pos_d, new_d, count, (uint64_t)(tg[i]->data_d - b->shadow),
                                          b->off_d + at, b->bits_d + at, sub->opts.cuda_stream));
      at += count;
    }
    pos_d = b->off_d;
    new_d = b->bits_d;
    count = total;
  }
  /* Reads the shadow's old bits: before the scatter, on its stream. */
  PULSE_TRY(pulse_cuda_fp8_track_stage(b->track_d, pos_d, new_d, count, sub->opts.cuda_stream));
  b->staged_d = 1;
  return PULSE_OK;
}

pulse_status sub_fp8_stage_device(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                                  const pulse_cuda_patch_stream *cs) {
  if (sub->fp8 == NULL || sub->fp8->n == 0)
    return PULSE_OK;
  double t0 = sub_now();
  pulse_status st = PULSE_OK;
  for (size_t k = 0; k < sub->fp8->n && st == PULSE_OK; k++) {
    sub_fp8_binding *b = &sub->fp8->b[k];
    if (b->track_d == NULL)
      continue;
    st = stage_one_device(sub, b, p, tg, cs);
    sub->refusing |= st == PULSE_ERR_UNSUPPORTED; /* a NaN or infinity */
    if (st != PULSE_OK)
      st = pulse_fail(st, "FP8 target of %" PRIu64 " x %" PRIu64 ": %s", b->fp8.rows,
                      b->fp8.cols, pulse_error_detail());
  }
  if (st != PULSE_OK)
    sub_fp8_drop(sub);
  sub->t_decode += sub_now() - t0;
  return st;
}

pulse_status sub_fp8_commit_device(pulse_sub *sub) {
  pulse_status st = PULSE_OK;
  for (size_t i = 0; sub->fp8 != NULL && i < sub->fp8->n; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    if (!b->staged_d)
      continue;
    b->staged_d = 0;
    /* Queued after the scatter on the same stream; the others still
     * commit after a failure, so that as few as can be are left unknown. */
    pulse_status one = pulse_cuda_fp8_track_commit(b->track_d, sub->opts.cuda_stream, NULL);
    if (one != PULSE_OK && st == PULSE_OK)
      st = pulse_fail(one, "FP8 target of %" PRIu64 " x %" PRIu64 ": %s", b->fp8.rows,
                      b->fp8.cols, pulse_error_detail());
  }
  return st;
}

pulse_status sub_fp8_anchor_check(pulse_sub *sub, const sub_target *t, const uint16_t *src,
                                  uint64_t rows, uint64_t cols, uint64_t stride) {
  if (binding_of(sub, t) == NULL)
    return PULSE_OK;
  pulse_status st = pulse_fp8_check_finite(src, rows, cols, stride, t->name);
  sub->refusing |= st == PULSE_ERR_UNSUPPORTED;
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
  for (size_t i = 0; sub->fp8 != NULL && i < sub->fp8->n && st == PULSE_OK; i++) {
    sub_fp8_binding *b = &sub->fp8->b[i];
    if (b->track_d != NULL)
      st = pulse_cuda_fp8_track_requantize(b->track_d, sub->opts.cuda_stream);
    else
      st = pulse_fp8_track_requantize(b->track, sub->opts.threads);
  }
  return st;
}
