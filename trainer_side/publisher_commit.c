/* publisher_commit.c - one step: detect, encode, write the patch (and an
 * anchor when due), move the head (pulse_publisher.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel_impl.h"
#include "publisher_impl.h"
#include "pulse_cuda.h"
#include "pulse_file.h"
#include "status_impl.h"
#include "store_impl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pulse_status check_inputs(const pulse_pub *pub,
                                 const pulse_pub_tensor *t, size_t count) {
  if (t == NULL || count != pub->count)
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: commit of %zu tensors, the table has %zu",
                      count, pub->count);
  for (size_t i = 0; i < count; i++) {
    if (t[i].memory == PULSE_PUB_DEVICE) {
#ifdef PULSE_HAVE_CUDA
      return pulse_fail(PULSE_ERR_UNSUPPORTED,
                        "publisher: tensor '%s': device tensors need the "
                        "CUDA encoder, not available yet: copy to the host",
                        pub->info[i].name);
#else
      return pulse_fail(PULSE_ERR_NOT_BUILT,
                        "publisher: tensor '%s' is on the device, and pulse "
                        "is built without CUDA",
                        pub->info[i].name);
#endif
    }
    if (t[i].memory != PULSE_PUB_HOST)
      return pulse_fail(PULSE_ERR_ARG,
                        "publisher: tensor '%s': unknown memory kind",
                        pub->info[i].name);
    if (t[i].dtype != PULSE_DTYPE_F32 && t[i].dtype != PULSE_DTYPE_BF16)
      return pulse_fail(PULSE_ERR_DTYPE,
                        "publisher: tensor '%s' is %s: give F32 or BF16",
                        pub->info[i].name, pulse_dtype_name(t[i].dtype));
    size_t esize = pulse_dtype_size(t[i].dtype);
    if ((t[i].data == NULL && pub->numel[i] > 0) ||
        ((uintptr_t)t[i].data % esize) != 0)
      return pulse_fail(PULSE_ERR_ARG,
                        "publisher: tensor '%s': NULL or misaligned data",
                        pub->info[i].name);
  }
  return PULSE_OK;
}

static void figures_init(const pulse_pub *pub, uint64_t step,
                         pulse_pub_figures *f) {
  memset(f, 0, sizeof *f);
  f->step = step;
  f->params = pub->params;
}

/* The first state of a store: the snapshot, and an anchor as its only
 * object. */
static pulse_status commit_first(pulse_pub *pub, uint64_t step,
                                 const pulse_pub_tensor *t,
                                 pulse_pub_figures *f, double t0) {
  f->base_step = step;
  pub->snap = calloc(pub->count + 1, sizeof *pub->snap);
  if (pub->snap == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: snapshot");
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++) {
    uint64_t n = pub->numel[i];
    if ((pub->snap[i] = malloc(n * 2 + 2)) == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "publisher: snapshot of '%s'",
                      pub->info[i].name);
      break;
    }
    if (t[i].dtype == PULSE_DTYPE_BF16 && n > 0)
      memcpy(pub->snap[i], t[i].data, n * 2);
    else
      pulse_bf16_cast_f32(t[i].data, pub->snap[i], n);
    pub->digests[i] = pulse_digest_bf16(pub->snap[i], n);
  }
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(pub->info, pub->digests, pub->count,
                                    &pub->state_digest);
  f->detect_seconds = now_s() - t0;
  double t1 = now_s();
  pulse_store_object anchor;
  if (st == PULSE_OK)
    st = pub_anchor_write(pub->dir, pub->info, pub->count, pub->snap, step,
                          &pub->state_digest, &anchor);
  if (st == PULSE_OK)
    st = pub_head_write(pub, step, &pub->state_digest, NULL, 0, &anchor, 1);
  if (st != PULSE_OK) {
    for (size_t i = 0; i < pub->count; i++)
      free(pub->snap[i]);
    free(pub->snap);
    pub->snap = NULL;
    return st;
  }
  pub->last_anchor_step = step;
  f->anchor_bytes = anchor.size;
  f->write_seconds = now_s() - t1;
  return PULSE_OK;
}

/* Writes every change's new (or old) bits into the snapshot, in blocks of
 * changes over the publisher's threads. */
#define MOVE_BLOCK ((uint64_t)1 << 16)

typedef struct {
  pulse_pub *pub;
  int old;
  size_t *first_block; /* per tensor: index of its first block */
} move_ctx;

static void move_block(void *vctx, size_t b) {
  move_ctx *m = vctx;
  size_t i = 0;
  while (i + 1 < m->pub->count && m->first_block[i + 1] <= b)
    i++;
  const pulse_changes *c = &m->pub->changes[i];
  uint64_t from = (uint64_t)(b - m->first_block[i]) * MOVE_BLOCK;
  uint64_t to = from + MOVE_BLOCK < c->count ? from + MOVE_BLOCK : c->count;
  const uint16_t *bits = m->old ? c->old_bits : c->new_bits;
  uint16_t *snap = m->pub->snap[i];
  for (uint64_t k = from; k < to; k++)
    snap[c->pos[k]] = bits[k];
}

static void move_snapshot(pulse_pub *pub, int old) {
  size_t *first = malloc((pub->count + 1) * sizeof *first);
  size_t blocks = 0;
  for (size_t i = 0; first != NULL && i < pub->count; i++) {
    first[i] = blocks;
    blocks += (size_t)((pub->changes[i].count + MOVE_BLOCK - 1) / MOVE_BLOCK);
  }
  if (first == NULL ||
      blocks < 4) { /* small: no threads (and no memory needed) */
    for (size_t i = 0; i < pub->count; i++) {
      const pulse_changes *c = &pub->changes[i];
      const uint16_t *bits = old ? c->old_bits : c->new_bits;
      for (uint64_t k = 0; k < c->count; k++)
        pub->snap[i][c->pos[k]] = bits[k];
    }
    free(first);
    return;
  }
  move_ctx m = {pub, old, first};
  pulse_parallel_for(pub->opts.threads, blocks, move_block, &m);
  free(first);
}

/* Puts the old bits back (a commit that failed after touching the snapshot). */
static void rollback(pulse_pub *pub) {
  move_snapshot(pub, 1);
}

static pulse_status commit_next(pulse_pub *pub, uint64_t step,
                                const pulse_pub_tensor *t, pulse_pub_figures *f,
                                double t0) {
  const pulse_store_head *h = pub->head;
  uint64_t base_step = pulse_store_head_step(h);
  f->base_step = base_step;
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++) {
    pub->changes[i].count = 0;
    /* update_snapshot 0: the snapshot moves only once the head has. */
    st = pulse_detect_fast(t[i].data, t[i].dtype, pub->snap[i], pub->numel[i],
                           0, pub->opts.threads, &pub->changes[i]);
    f->changed += pub->changes[i].count;
    pub->enc[i].info = pub->info[i];
    pub->enc[i].base = pub->snap[i];
    pub->enc[i].changes = &pub->changes[i];
    pub->enc[i].base_digest = &pub->digests[i];
  }
  if (st != PULSE_OK)
    return st;
  double t1 = now_s();
  f->detect_seconds = t1 - t0;
  pulse_encode_opts eo = PULSE_ENCODE_OPTS_INIT;
  eo.step = step;
  eo.base_step = base_step;
  eo.pos_model = pub->opts.pos_model;
  eo.chunk_log2 = pub->opts.chunk_log2;
  eo.threads = pub->opts.threads;
  pulse_buffer patch = {NULL, 0};
  PULSE_TRY(pulse_patch_encode(&eo, pub->enc, pub->count, &patch));
  double t2 = now_s();
  f->encode_seconds = t2 - t1;

  /* The encoder derived the target digests from the cached base digests
   * and the changes: take them from the patch's table (a second pass over
   * millions of changes would cost as much as the rest of the write). */
  pulse_patch *pp = NULL;
  pulse_state_digest next;
  st = pulse_patch_open(patch.data, patch.size, &pp);
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++) {
    pulse_patch_tensor pt;
    st = pulse_patch_tensor_get(pp, i, &pt);
    if (st == PULSE_OK && (strcmp(pt.info.name, pub->info[i].name) != 0 ||
                           pt.changed != pub->changes[i].count))
      st = pulse_fail(PULSE_ERR_INTERNAL,
                      "publisher: the patch's table is not the publisher's");
    if (st == PULSE_OK)
      pub->scratch_digests[i] = pt.target_digest;
  }
  if (st == PULSE_OK)
    next = *pulse_patch_target_digest(pp);
  pulse_patch_free(pp);

  pulse_store_object obj;
  memset(&obj, 0, sizeof obj);
  obj.kind = PULSE_STORE_PATCH;
  obj.step = step;
  obj.base_step = base_step;
  obj.size = patch.size;
  char path[4096];
  if (st == PULSE_OK) {
    store_sha256(patch.data, patch.size, obj.sha256);
    store_object_set_path(&obj);
    if (store_join(path, sizeof path, pub->dir, obj.path) != 0)
      st = pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  }
  if (st == PULSE_OK)
    st = pulse_file_write_atomic(path, patch.data, patch.size);
  pulse_buffer_free(&patch);
  if (st != PULSE_OK)
    return st;
  f->patch_bytes = obj.size;

  /* The snapshot moves to the new step; a failure below puts it back. */
  pub_anchor_join(pub);
  move_snapshot(pub, 0);
  pulse_state_digest prev = pub->state_digest;
  pub->state_digest = next;

  int named_pending = 0;
  int due = pub->opts.anchor_every > 0 &&
            step - pub->last_anchor_step >= pub->opts.anchor_every;
  size_t np = pulse_store_head_patch_count(h),
         na = pulse_store_head_anchor_count(h);
  pulse_store_object *p = malloc((np + 1) * sizeof *p);
  pulse_store_object *a = malloc((na + 2) * sizeof *a);
  if (p == NULL || a == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "publisher: head lists");
  if (st == PULSE_OK) {
    for (size_t i = 0; i < np; i++)
      p[i] = *pulse_store_head_patch(h, i);
    p[np++] = obj;
    for (size_t i = 0; i < na; i++)
      a[i] = *pulse_store_head_anchor(h, i);
    if (pub->pending_ready && pulse_store_head_has_step(h, pub->pending.step) &&
        pub->pending.step > a[na - 1].step) {
      a[na++] = pub->pending;
      named_pending = 1;
    }
  }
  pulse_store_object anchor;
  if (st == PULSE_OK && due && pub->opts.anchor_sync) {
    st = pub_anchor_write(pub->dir, pub->info, pub->count, pub->snap, step,
                          &next, &anchor);
    if (st == PULSE_OK) {
      a[na++] = anchor;
      f->anchor_bytes = anchor.size;
    }
  }
  if (st == PULSE_OK)
    st = pub_head_write(pub, step, &next, p, np, a, na);
  free(p), free(a);
  if (st != PULSE_OK) {
    rollback(pub);
    pub->state_digest = prev;
    return st;
  }
  /* The head has moved: the new digests are the state's. */
  memcpy(pub->digests, pub->scratch_digests, pub->count * sizeof *pub->digests);
  if (named_pending) {
    f->anchor_bytes += pub->pending.size;
    pub->pending_ready = 0;
  } else if (pub->pending_ready) {
    /* Retention has moved past it before it could be named. */
    if (store_join(path, sizeof path, pub->dir, pub->pending.path) == 0)
      unlink(path);
    pub->pending_ready = 0;
  }
  if (due) {
    pub->last_anchor_step = step;
    if (!pub->opts.anchor_sync) {
      if (pub_anchor_start(pub, step) == PULSE_OK)
        f->anchor_started = 1;
      else
        pub->last_anchor_step = 0; /* try again at the next step */
    }
  }
  f->write_seconds = now_s() - t2;
  return PULSE_OK;
}

pulse_status pulse_pub_commit(pulse_pub *pub, uint64_t step,
                              const pulse_pub_tensor *tensors, size_t count,
                              pulse_pub_figures *figures) {
  double t0 = now_s();
  if (pub == NULL)
    return pulse_fail(PULSE_ERR_ARG, "publisher: NULL");
  PULSE_TRY(check_inputs(pub, tensors, count));
  uint64_t head;
  if (pulse_pub_head_step(pub, &head) && step <= head)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "publisher: step %" PRIu64
                      " is not above the head's %" PRIu64,
                      step, head);
  pulse_pub_figures f;
  figures_init(pub, step, &f);
  pulse_status st = pub->head == NULL ? commit_first(pub, step, tensors, &f, t0)
                                      : commit_next(pub, step, tensors, &f, t0);
  if (st != PULSE_OK)
    return st;
  f.total_seconds = now_s() - t0;
  pulse_state_digest_hex(&pub->state_digest, f.state_digest);
  if (figures != NULL)
    *figures = f;
  if (pub->opts.on_head != NULL)
    pub->opts.on_head(pub->opts.on_head_ctx, &f);
  pub_remove_garbage(pub);
  return PULSE_OK;
}
