/* publisher_commit.c - one step: detect, encode, write the patch (and an
 * anchor when due), move the head (pulse_publisher.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "parallel_impl.h"
#include "publisher_impl.h"
#include "publisher_sections_impl.h"
#include "pulse_cuda.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static pulse_status check_inputs(const pulse_pub *pub,
                                 const pulse_pub_tensor *t, size_t count,
                                 int *on_device) {
  *on_device = 0;
  if (t == NULL || count != pub->count)
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: commit of %zu tensors, the table has %zu",
                      count, pub->count);
  for (size_t i = 0; i < count; i++) {
    if (t[i].memory != PULSE_PUB_HOST && t[i].memory != PULSE_PUB_DEVICE)
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
    if (t[i].memory == PULSE_PUB_DEVICE)
      *on_device = 1;
  }
  if (!*on_device)
    return PULSE_OK;
  size_t i = 0;
  while (t[i].memory != PULSE_PUB_DEVICE)
    i++;
#ifdef PULSE_HAVE_CUDA
  if (!pulse_cuda_available())
    return pulse_fail(PULSE_ERR_CUDA,
                      "publisher: tensor '%s' is in device memory, but no "
                      "CUDA device is usable (%s)",
                      pub->info[i].name, pulse_cuda_unavailable_reason());
  return PULSE_OK;
#else
  return pulse_fail(PULSE_ERR_NOT_BUILT,
                    "publisher: tensor '%s' is in device memory, and pulse "
                    "is built without CUDA (configure with PULSE_CUDA=ON)",
                    pub->info[i].name);
#endif
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
    const void *src = t[i].data;
    void *fetched = NULL;
    if (t[i].memory == PULSE_PUB_DEVICE && n > 0) {
      /* The first state is an anchor, written from the host: fetch it. */
      fetched = malloc(n * pulse_dtype_size(t[i].dtype));
      if (fetched == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "publisher: copy of '%s'",
                        pub->info[i].name);
        break;
      }
      st = pub_device_fetch(pub, i, &t[i], fetched);
      src = fetched;
    }
    if (st == PULSE_OK && t[i].dtype == PULSE_DTYPE_BF16 && n > 0)
      memcpy(pub->snap[i], src, n * 2);
    else if (st == PULSE_OK)
      pulse_bf16_cast_f32(src, pub->snap[i], n);
    free(fetched);
    if (st == PULSE_OK)
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
  pub->host_current = 1;
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

void pub_snapshot_move(pulse_pub *pub, int old) {
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

/* Takes the target digests from the patch's table: the encoder derived
 * them from the cached base digests and the changes (a second pass over
 * millions of changes would cost as much as the rest of the write). With
 * `changes` (host commits) each tensor's count is checked against them. */
static pulse_status patch_digests(pulse_pub *pub, const pulse_buffer *patch,
                                  const pulse_changes *changes,
                                  pulse_state_digest *next, uint64_t *changed) {
  pulse_patch *pp = NULL;
  pulse_status st = pulse_patch_open(patch->data, patch->size, &pp);
  *changed = 0;
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++) {
    pulse_patch_tensor pt;
    st = pulse_patch_tensor_get(pp, i, &pt);
    if (st == PULSE_OK && (strcmp(pt.info.name, pub->info[i].name) != 0 ||
                           (changes != NULL && pt.changed != changes[i].count)))
      st = pulse_fail(PULSE_ERR_INTERNAL,
                      "publisher: the patch's table is not the publisher's");
    if (st == PULSE_OK && changes != NULL)
      pub->scratch_digests[i] = pt.target_digest;
    else if (st == PULSE_OK &&
             (pt.target_digest.a != pub->scratch_digests[i].a ||
              pt.target_digest.b != pub->scratch_digests[i].b))
      st = pulse_fail(PULSE_ERR_INTERNAL,
                      "publisher: tensor '%s': the device encoder's digest "
                      "is not the patch's",
                      pub->info[i].name);
    if (st == PULSE_OK)
      *changed += pt.changed;
  }
  if (st == PULSE_OK)
    *next = *pulse_patch_target_digest(pp);
  pulse_patch_free(pp);
  return st;
}

/* Writes the patch of `step` and the head naming it, durably and in that
 * order (docs/protocols/sync.md). The patch's bytes go to a temporary file on a
 * thread of their own, which, once they are durable, renames the file to
 * the name this thread meanwhile found by hashing them and fsyncs objects/;
 * the head is built, staged the same way on another thread and checked
 * meanwhile; only once the patch is durable under its name is the head
 * renamed over head.json and the store folder fsynced. The host
 * snapshot moves to the step afterwards, on the background thread (that of
 * anchors), while the trainer computes its next step: the next commit or a
 * reader of the snapshot waits for it (pub_snapshot_wait). A device commit's
 * encoder has moved the device snapshot already. On failure the snapshots,
 * the digests and the head are as before, and nothing but temporary files or
 * an unnamed object (which recovery removes) is left. */
static pulse_status commit_write(pulse_pub *pub, uint64_t step,
                                 const pulse_buffer *patch,
                                 const pulse_state_digest *next, int on_device,
                                 pulse_pub_figures *f) {
  const pulse_store_head *h = pub->head;
  char objects[4096], path[4096];
  pulse_status st = PULSE_OK;
  if (store_join(objects, sizeof objects, pub->dir, PULSE_STORE_OBJECTS_DIR) !=
      0)
    return pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  pub_stage_job job;
  memset(&job, 0, sizeof job);
  job.folder = objects;
  job.hint = "patch";
  job.data = patch->data;
  job.size = patch->size;
  pub_stage_start(&job, 1);

  pulse_store_object obj;
  memset(&obj, 0, sizeof obj);
  obj.kind = PULSE_STORE_PATCH;
  obj.step = step;
  obj.base_step = f->base_step;
  obj.size = patch->size;
  double t0 = now_s();
  store_sha256(patch->data, patch->size, obj.sha256);
  pub->split.hash = now_s() - t0;
  store_object_set_path(&obj);
  if (store_join(path, sizeof path, pub->dir, obj.path) != 0)
    st = pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  else /* renamed by the job once its data is durable */
    pub_stage_name(&job, path);

  /* The previous step's background work is done (its anchor, if finished,
   * is named by this head). */
  pub_anchor_join(pub);
  int named_pending = 0, moved = 0, downloaded = 0;
  int due = pub->opts.anchor_every > 0 &&
            step - pub->last_anchor_step >= pub->opts.anchor_every;
  size_t np = pulse_store_head_patch_count(h),
         na = pulse_store_head_anchor_count(h);
  pulse_store_object *p = malloc((np + 1) * sizeof *p);
  pulse_store_object *a = malloc((na + 2) * sizeof *a);
  if (st == PULSE_OK && (p == NULL || a == NULL))
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
  /* An anchor written in the commit is of the new state: the snapshot moves
   * first (and moves back on failure). */
  pulse_store_object anchor;
  if (st == PULSE_OK && due && pub->opts.anchor_sync) {
    if (on_device) {
      st = pub_device_download(pub);
      downloaded = 1;
    } else {
      pub_snapshot_move(pub, 0);
      moved = 1;
    }
    if (st == PULSE_OK)
      st = pub_anchor_write(pub->dir, pub->info, pub->count, pub->snap, step,
                            next, &anchor);
    if (st == PULSE_OK) {
      a[na++] = anchor;
      f->anchor_bytes = anchor.size;
    }
  }
  pub_head_txn txn;
  memset(&txn, 0, sizeof txn);
  double t1 = now_s();
  if (st == PULSE_OK)
    st = pub_head_prepare(pub, step, next, p, np, a, na, &txn);
  double t2 = now_s();
  /* Its section index too (while the patch's bytes are written). */
  if (st == PULSE_OK)
    st = pub_sections_write(pub, patch, &obj);
  /* The patch durable under its name before the head that names it. */
  if (st == PULSE_OK)
    st = pub_stage_finish(&job);
  else
    pub_stage_cancel(&job);
  double t3 = now_s();
  if (st == PULSE_OK)
    st = pub_head_publish(pub, &txn, p, np, a, na);
  else
    pub_head_abort(&txn);
  pub->split.head = t2 - t1;
  pub->split.durable = t3 - t2;
  pub->split.publish = now_s() - t3;
  free(p), free(a);
  if (st != PULSE_OK) {
    if (moved)
      pub_snapshot_move(pub, 1);
    if (on_device)
      pub->device_current = 0; /* the host copy or the store has the base */
    if (downloaded)
      pub->host_current = 0;
    return st;
  }
  f->patch_bytes = obj.size;
  /* The head has moved: the new digests are the state's. */
  memcpy(pub->digests, pub->scratch_digests, pub->count * sizeof *pub->digests);
  pub->state_digest = *next;
  if (on_device) {
    pub->host_current = downloaded;
    pub->device_current = 1;
  } else {
    pub->device_current = 0;
  }
  if (named_pending) {
    f->anchor_bytes += pub->pending.size;
    pub->pending_ready = 0;
  } else if (pub->pending_ready) {
    /* Retention has moved past it before it could be named. */
    pub_garbage_add(pub, &pub->pending);
    pub->pending_ready = 0;
  }
  /* What the background job does once the head's hook has run
   * (pulse_pub_commit). */
  pub->next_move = !on_device && !moved;
  pub->next_anchor = due && !pub->opts.anchor_sync;
  if (due)
    pub->last_anchor_step = step;
  if (pub->next_anchor && on_device && !pub->host_current) {
    /* The anchor thread writes from the host copy of the snapshot. */
    if (pub_device_download(pub) == PULSE_OK)
      pub->host_current = 1;
    else
      pub->next_anchor = 0;
  }
  if (due && !pub->opts.anchor_sync && !pub->next_anchor)
    pub->last_anchor_step = 0; /* try again at the next step */
  f->anchor_started = pub->next_anchor;
  return PULSE_OK;
}

static pulse_status commit_next(pulse_pub *pub, uint64_t step,
                                const pulse_pub_tensor *t, int on_device,
                                pulse_pub_figures *f, double t0) {
  f->base_step = pulse_store_head_step(pub->head);
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = step;
  eo.base_step = f->base_step;
  eo.pos_model = pub->opts.pos_model;
  eo.chunk_log2 = pub->opts.chunk_log2;
  eo.threads = pub->opts.threads;
  eo.format_version = pub->opts.format_version;
  pulse_buffer patch = {NULL, 0};
  pulse_status st = PULSE_OK;
  double t1 = t0;
  if (on_device) {
    /* Detection and encoding are one call on the device. */
    st = pub_device_encode(pub, t, &eo, &patch);
  } else {
    /* After device commits, the host copy catches up first. */
    PULSE_TRY(pub_host_current(pub));
    /* The snapshot moves only once the patch exists. */
    st = pub_detect(pub, t);
    t1 = now_s();
    f->detect_seconds = t1 - t0;
    pub->split.detect = f->detect_seconds;
    if (st == PULSE_OK)
      st = pulse_patch_encode(&eo, pub->enc, pub->count, &patch);
  }
  if (st != PULSE_OK)
    return st;
  double t2 = now_s();
  f->encode_seconds = t2 - t1;
  pub->split.encode = f->encode_seconds;
  pulse_state_digest next;
  st = patch_digests(pub, &patch, on_device ? NULL : pub->changes, &next,
                     &f->changed);
  pub->split.digests = now_s() - t2;
  if (st == PULSE_OK)
    st = commit_write(pub, step, &patch, &next, on_device, f);
  else if (on_device)
    pub->device_current = 0;
  pulse_buffer_free(&patch);
  f->write_seconds = now_s() - t2;
  return st;
}

pulse_status pulse_pub_commit(pulse_pub *pub, uint64_t step,
                              const pulse_pub_tensor *tensors, size_t count,
                              pulse_pub_figures *figures) {
  double t0 = now_s();
  if (pub == NULL || pub->committer)
    return pulse_fail(PULSE_ERR_ARG, "publisher: NULL, or a committer "
                                     "(pulse_pub_commit_made)");
  int on_device = 0;
  PULSE_TRY(check_inputs(pub, tensors, count, &on_device));
  uint64_t head;
  if (pulse_pub_head_step(pub, &head) && step <= head)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "publisher: step %" PRIu64
                      " is not above the head's %" PRIu64,
                      step, head);
  pulse_pub_figures f;
  figures_init(pub, step, &f);
  memset(&pub->split, 0, sizeof pub->split);
  pulse_status st = pub->head == NULL
                        ? commit_first(pub, step, tensors, &f, t0)
                        : commit_next(pub, step, tensors, on_device, &f, t0);
  if (st != PULSE_OK)
    return st;
  f.total_seconds = now_s() - t0;
  pulse_state_digest_hex(&pub->state_digest, f.state_digest);
  if (figures != NULL)
    *figures = f;
  if (pub->opts.on_head != NULL)
    pub->opts.on_head(pub->opts.on_head_ctx, &f);
  /* Waking readers comes first; the rest (snapshot move, removals, anchor)
   * runs while the trainer computes its next step. */
  if (pub_anchor_start(pub, step, pub->next_move, pub->next_anchor) !=
          PULSE_OK &&
      pub->next_anchor) {
    /* Done in line but the anchor, which the hook was told had started. */
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "publisher: anchor of step %" PRIu64 " not started: %s", step,
                 pulse_error_detail());
    pub->last_anchor_step = 0;
    if (figures != NULL)
      figures->anchor_started = 0;
  }
  pub->next_move = pub->next_anchor = 0;
  return PULSE_OK;
}
