/* publisher_head.c - anchors (in the commit or in the background), the
 * signed head, retention and removal of what it drops. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fail_impl.h"
#include "publisher_impl.h"
#include "pulse_log.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "store_impl.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fsync_folder(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

pulse_status pub_anchor_write(const char *dir, const pulse_tensor_info *info,
                              size_t count, uint16_t *const *bits,
                              uint64_t step, const pulse_state_digest *digest,
                              pulse_store_object *out) {
  pulse_st_write_tensor *t = calloc(count + 1, sizeof *t);
  if (t == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: anchor");
  for (size_t i = 0; i < count; i++) {
    t[i].name = info[i].name;
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = info[i].ndim;
    memcpy(t[i].shape, info[i].shape, sizeof t[i].shape);
    t[i].data = bits[i];
  }
  char step_s[32], digest_s[65], staged[4096], folder[4096], final[4096];
  snprintf(step_s, sizeof step_s, "%" PRIu64, step);
  pulse_state_digest_hex(digest, digest_s);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", digest_s}};
  /* The name is the hash of the bytes, known only once they are written:
   * stage under a temporary name (recovery removes it after a crash). */
  snprintf(staged, sizeof staged,
           "%s/" PULSE_STORE_OBJECTS_DIR "/.anchor-%s.tmp-staged", dir, step_s);
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_OBJECTS_DIR, dir);
  pulse_status st = pulse_st_write(staged, t, count, meta, 2);
  free(t);
  (void)folder, (void)final;
  if (st != PULSE_OK)
    return pulse_fail_context(st, "publisher: anchor of step %s", step_s);
  return pub_anchor_name(dir, staged, step, out);
}

pulse_status pub_anchor_name(const char *dir, const char *staged, uint64_t step,
                             pulse_store_object *out) {
  char folder[4096], final[4096];
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_OBJECTS_DIR, dir);
  memset(out, 0, sizeof *out);
  out->kind = PULSE_STORE_ANCHOR;
  out->step = out->base_step = step;
  pulse_status st = pulse_store_file_sha256(staged, out->sha256, &out->size);
  if (st == PULSE_OK) {
    store_object_set_path(out);
    if (store_join(final, sizeof final, dir, out->path) != 0 ||
        rename(staged, final) != 0)
      st = pulse_fail(PULSE_ERR_IO,
                      "publisher: anchor of step %" PRIu64 ": rename: %s", step,
                      strerror(errno));
  }
  if (st != PULSE_OK) {
    unlink(staged);
    return st;
  }
  fsync_folder(folder);
  return PULSE_OK;
}

static void *anchor_main(void *arg) {
  pub_anchor_job *job = arg;
  pulse_pub *pub = job->pub;
  if (job->move) {
    double t0 = now_s();
    pub_snapshot_move(pub, 0);
    job->move_seconds = now_s() - t0;
    pthread_mutex_lock(&pub->moved_mu);
    job->moved = 1;
    pthread_cond_broadcast(&pub->moved_cv);
    pthread_mutex_unlock(&pub->moved_mu);
  }
  pub_gc_retire(pub, job->garbage, job->ngarbage);
  free(job->garbage);
  job->garbage = NULL;
  job->ngarbage = 0;
  if (job->anchor) {
    double t0 = now_s();
    job->status = pub_anchor_write(pub->dir, pub->info, pub->count, pub->snap,
                                   job->step, &job->digest, &job->obj);
    job->seconds = now_s() - t0;
    snprintf(job->detail, sizeof job->detail, "%s", pulse_error_detail());
  }
  return NULL;
}

pulse_status pub_anchor_start(pulse_pub *pub, uint64_t step, int move,
                              int anchor) {
  if (!move && !anchor && pub->ngarbage == 0 && !pub_gc_due(pub))
    return PULSE_OK;
  memset(&pub->job, 0, sizeof pub->job);
  pub->job.pub = pub;
  pub->job.step = step;
  pub->job.move = move;
  pub->job.anchor = anchor;
  pub->job.moved = !move;
  pub->job.digest = pub->state_digest;
  /* The job takes the garbage list; the next head queues into a new one. */
  pub->job.garbage = pub->garbage;
  pub->job.ngarbage = pub->ngarbage;
  pub->garbage = NULL;
  pub->ngarbage = pub->garbage_cap = 0;
  if (pthread_create(&pub->anchor_thread, NULL, anchor_main, &pub->job) != 0) {
    if (move)
      pub_snapshot_move(pub, 0);
    pub->job.moved = 1;
    pub_gc_retire(pub, pub->job.garbage, pub->job.ngarbage);
    free(pub->job.garbage);
    pub->job.garbage = NULL;
    return pulse_fail(PULSE_ERR_NOMEM,
                      "publisher: cannot start the background thread");
  }
  pub->anchor_running = 1;
  return PULSE_OK;
}

void pub_snapshot_wait(pulse_pub *pub) {
  if (!pub->anchor_running)
    return;
  pthread_mutex_lock(&pub->moved_mu);
  while (!pub->job.moved)
    pthread_cond_wait(&pub->moved_cv, &pub->moved_mu);
  pthread_mutex_unlock(&pub->moved_mu);
}

void pub_anchor_join(pulse_pub *pub) {
  if (!pub->anchor_running)
    return;
  pthread_join(pub->anchor_thread, NULL);
  pub->anchor_running = 0;
  if (!pub->job.anchor)
    return;
  if (pub->job.status == PULSE_OK) {
    pub->pending = pub->job.obj;
    pub->pending_ready = 1;
  } else {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "publisher: background anchor of step %" PRIu64 " failed: %s",
                 pub->job.step, pub->job.detail);
  }
}

/* Keeps at least the newest keep_patches patches, back to the newest anchor
 * at or below the oldest one's base (the floor). Of the anchors: the floor,
 * the first one above it (the next floor: without it a floor could never
 * move on when anchors come faster than patches age), and the newest
 * keep_anchors - 2 above that. Works in place. */
static void retain(const pulse_pub_opts *o, uint64_t head_step,
                   pulse_store_object *p, size_t *np, pulse_store_object *a,
                   size_t *na) {
  if (*na == 0)
    return; /* never: a head always has an anchor */
  uint64_t base = *np ? p[0].base_step : head_step;
  if (*np > o->keep_patches)
    base = p[*np - o->keep_patches].base_step;
  size_t floor = 0;
  for (size_t i = 0; i < *na; i++)
    if (a[i].step <= base)
      floor = i;
  uint64_t floor_step = a[floor].step;
  size_t k = 0;
  for (size_t i = 0; i < *np; i++)
    if (p[i].base_step >= floor_step)
      p[k++] = p[i];
  *np = k;
  size_t n = *na;
  a[0] = a[floor];
  k = 1;
  if (floor + 1 < n) {
    a[k++] = a[floor + 1];
    size_t rest = n - floor - 2, newest = o->keep_anchors - 2;
    for (size_t i = floor + 2 + (rest > newest ? rest - newest : 0); i < n; i++)
      a[k++] = a[i];
  }
  *na = k;
}

static int names(const pulse_store_head *h, const pulse_store_object *o) {
  size_t n = o->kind == PULSE_STORE_PATCH ? pulse_store_head_patch_count(h)
                                          : pulse_store_head_anchor_count(h);
  for (size_t i = 0; i < n; i++) {
    const pulse_store_object *x = o->kind == PULSE_STORE_PATCH
                                      ? pulse_store_head_patch(h, i)
                                      : pulse_store_head_anchor(h, i);
    if (memcmp(x->sha256, o->sha256, 32) == 0)
      return 1;
  }
  return 0;
}

/* Queues the objects of `list` that `now` does not name for removal. */
static void queue_unnamed(pulse_pub *pub, const pulse_store_object *list,
                          size_t n, const pulse_store_head *now) {
  for (size_t i = 0; i < n; i++) {
    if (names(now, &list[i]))
      continue;
    if (pub->ngarbage == pub->garbage_cap) {
      size_t cap = pub->garbage_cap ? 2 * pub->garbage_cap : 16;
      pulse_store_object *g = realloc(pub->garbage, cap * sizeof *g);
      if (g == NULL)
        return; /* left for the next recovery */
      pub->garbage = g;
      pub->garbage_cap = cap;
    }
    pub->garbage[pub->ngarbage++] = list[i];
  }
}

void pub_garbage_add(pulse_pub *pub, const pulse_store_object *obj) {
  queue_unnamed(pub, obj, 1, pub->head);
}

void pub_remove_garbage(pulse_pub *pub) {
  pub_gc_retire(pub, pub->garbage, pub->ngarbage);
  pub->ngarbage = 0;
}

/* Version 2's fields of the next head: the store's run (kept from the
 * current head; a store without one, new or of format 1, starts a run
 * here), the publication time (never before the previous head's, so a
 * clock stepped back cannot make a newer head look older), and the link to
 * the head it replaces. */
static pulse_status head_identity(const pulse_pub *pub, store_head_fields *f) {
  f->version = 2;
  f->published = (uint64_t)time(NULL);
  const pulse_store_head *h = pub->head;
  if (h == NULL || !pulse_store_head_run(h, f->run)) {
    PULSE_TRY(store_run_new(f->run));
    char hex[2 * PULSE_STORE_RUN_BYTES + 1];
    store_hex(f->run, PULSE_STORE_RUN_BYTES, hex);
    PULSE_LOG_AT(PULSE_LOG_INFO, "publisher: %s: new run %s", pub->dir, hex);
  }
  PULSE_TRY(pub_rotation_fields(pub, f));
  if (h == NULL)
    return PULSE_OK;
  if (pulse_store_head_published(h) > f->published)
    f->published = pulse_store_head_published(h);
  size_t n;
  const uint8_t *bytes = pulse_store_head_bytes(h, &n);
  store_sha256(bytes, n, f->previous_sha256);
  f->previous_step = pulse_store_head_step(h);
  f->has_previous = 1;
  return PULSE_OK;
}

pulse_status pub_head_prepare(pulse_pub *pub, uint64_t step,
                              const pulse_state_digest *digest,
                              const pulse_store_object *patches,
                              size_t npatches,
                              const pulse_store_object *anchors,
                              size_t nanchors, pub_head_txn *txn) {
  memset(txn, 0, sizeof *txn);
  pulse_store_object *p = malloc((npatches + 1) * sizeof *p);
  pulse_store_object *a = malloc((nanchors + 1) * sizeof *a);
  if (p == NULL || a == NULL) {
    free(p), free(a);
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: head");
  }
  if (npatches > 0)
    memcpy(p, patches, npatches * sizeof *p);
  if (nanchors > 0)
    memcpy(a, anchors, nanchors * sizeof *a);
  size_t kp = npatches, ka = nanchors;
  retain(&pub->opts, step, p, &kp, a, &ka);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = step;
  f.digest = *digest;
  f.patches = p;
  f.npatches = kp;
  f.anchors = a;
  f.nanchors = ka;
  pulse_status st = head_identity(pub, &f);
  if (st == PULSE_OK)
    st = store_head_serialize(&f, pub->opts.key, &txn->json);
  free(p), free(a);
  if (st != PULSE_OK)
    return st;
  /* The bytes go to disk (under a temporary name) while they are checked. */
  txn->job.folder = pub->dir;
  txn->job.hint = PULSE_STORE_HEAD_FILE;
  txn->job.data = txn->json.data;
  txn->job.size = txn->json.size;
  pub_stage_start(&txn->job, 0);
  txn->started = 1;
  /* Parse what is about to be written: a head this code would refuse to
   * read must never become head.json. */
  st = pulse_store_head_parse(txn->json.data, txn->json.size, &txn->head);
  if (st != PULSE_OK) {
    st = pulse_fail_context(PULSE_ERR_INTERNAL,
                            "publisher: the new head does not check");
    pub_head_abort(txn);
  }
  return st;
}

void pub_head_abort(pub_head_txn *txn) {
  if (txn->started)
    pub_stage_cancel(&txn->job);
  txn->started = 0;
  pub_staged_drop(&txn->job.staged);
  pulse_buffer_free(&txn->json);
  pulse_store_head_free(txn->head);
  txn->head = NULL;
}

pulse_status pub_head_publish(pulse_pub *pub, pub_head_txn *txn,
                              const pulse_store_object *patches,
                              size_t npatches,
                              const pulse_store_object *anchors,
                              size_t nanchors) {
  char path[4096];
  int renamed = 0;
  pulse_status st = pub_stage_finish(&txn->job);
  txn->started = 0;
  if (st == PULSE_OK &&
      store_join(path, sizeof path, pub->dir, PULSE_STORE_HEAD_FILE) != 0)
    st = pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  if (st == PULSE_OK)
    st = pub_staged_publish(&txn->job.staged, path, &renamed);
  if (st != PULSE_OK) {
    /* After a rename whose fsync failed, the new head is on disk but may not
     * survive a crash: the publisher keeps the previous one, and a retry of
     * the step writes the same head again. */
    if (renamed)
      st = pulse_fail_context(st,
                              "publisher: the head of step %" PRIu64
                              " was renamed but may not be durable",
                              pulse_store_head_step(txn->head));
    pub_head_abort(txn);
    return st;
  }
  pulse_buffer_free(&txn->json);
  /* Everything the old head or the given lists named that retention has
   * dropped goes once the head's hook has run (pub_remove_garbage): waking
   * readers comes before housekeeping. */
  pulse_store_head *head = txn->head;
  txn->head = NULL;
  if (pub->head != NULL) {
    queue_unnamed(pub, pub->head->patches, pub->head->npatches, head);
    queue_unnamed(pub, pub->head->anchors, pub->head->nanchors, head);
  }
  queue_unnamed(pub, patches, npatches, head);
  queue_unnamed(pub, anchors, nanchors, head);
  pulse_store_head_free(pub->head);
  pub->head = head;
  return PULSE_OK;
}

pulse_status pub_head_write(pulse_pub *pub, uint64_t step,
                            const pulse_state_digest *digest,
                            const pulse_store_object *patches, size_t npatches,
                            const pulse_store_object *anchors,
                            size_t nanchors) {
  pub_head_txn txn;
  PULSE_TRY(pub_head_prepare(pub, step, digest, patches, npatches, anchors,
                             nanchors, &txn));
  return pub_head_publish(pub, &txn, patches, npatches, anchors, nanchors);
}

pulse_status pulse_pub_flush(pulse_pub *pub, pulse_pub_figures *figures) {
  if (pub == NULL)
    return pulse_fail(PULSE_ERR_ARG, "publisher: NULL");
  double t0 = now_s();
  pub_anchor_join(pub);
  if (figures != NULL)
    memset(figures, 0, sizeof *figures);
  if (!pub->pending_ready || pub->head == NULL)
    return PULSE_OK;
  const pulse_store_head *h = pub->head;
  size_t na = pulse_store_head_anchor_count(h);
  pulse_store_object *a = malloc((na + 2) * sizeof *a);
  if (a == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: flush");
  for (size_t i = 0; i < na; i++)
    a[i] = *pulse_store_head_anchor(h, i);
  a[na++] = pub->pending;
  uint64_t step = pulse_store_head_step(h);
  pulse_status st = PULSE_OK;
  int namable = pulse_store_head_has_step(h, pub->pending.step) &&
                pub->pending.step > a[na - 2].step;
  if (namable)
    st = pub_head_write(pub, step, &pub->state_digest, h->patches, h->npatches,
                        a, na);
  free(a);
  if (st != PULSE_OK)
    return st;
  if (!namable) {
    /* Retention has moved past it: nothing to name. */
    char path[4096];
    if (store_join(path, sizeof path, pub->dir, pub->pending.path) == 0)
      unlink(path);
    pub->pending_ready = 0;
    return PULSE_OK;
  }
  uint64_t bytes = pub->pending.size;
  pub->pending_ready = 0;
  pulse_pub_figures f;
  memset(&f, 0, sizeof f);
  f.step = f.base_step = step;
  f.params = pub->params;
  f.anchor_bytes = bytes;
  f.flush = 1;
  f.write_seconds = f.total_seconds = now_s() - t0;
  pulse_state_digest_hex(&pub->state_digest, f.state_digest);
  if (figures != NULL)
    *figures = f;
  if (pub->opts.on_head != NULL)
    pub->opts.on_head(pub->opts.on_head_ctx, &f);
  pub_remove_garbage(pub);
  return PULSE_OK;
}
