/* publisher_made.c - a committer commits what the ranks of a sharded step
 * made: their patch and, when due, the anchor they wrote together into
 * the store (pulse_pub_commit_made) or uploaded part by part into the
 * bucket the store is the staging copy of (pulse_pub_commit_made_uploaded,
 * pulse_publisher.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "publisher_impl.h"
#include "publisher_sections_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"

static double made_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The patch's steps and digests against the head and the given state. */
static pulse_status check_patch(const pulse_pub *pub, uint64_t step, const pulse_buffer *patch,
                                const pulse_state_digest *state, uint64_t *changed) {
  pulse_patch *pp = NULL;
  PULSE_TRY(pulse_patch_open(patch->data, patch->size, &pp));
  pulse_status st = PULSE_OK;
  if (pulse_patch_step(pp) != step ||
      pulse_patch_base_step(pp) != pulse_store_head_step(pub->head) ||
      pulse_patch_tensor_count(pp) != pub->count ||
      memcmp(pulse_patch_base_digest(pp), &pub->state_digest, 32) != 0 ||
      memcmp(pulse_patch_target_digest(pp), state, 32) != 0)
    st = pulse_fail(PULSE_ERR_BASE_DIGEST,
                    "publisher: the patch of step %" PRIu64
                    " is not from the head's state to the given one",
                    step);
  *changed = pulse_patch_total_changed(pp);
  pulse_patch_free(pp);
  return st;
}

/* The anchor a made step names: a file the ranks wrote into objects/
 * (hashed and renamed here), or one already in the bucket, named by its
 * SHA-256 and size; NULL when the step has none. */
typedef struct {
  const char *staged;
  const uint8_t *sha256;
  uint64_t size;
} made_anchor;

static pulse_status anchor_object(const pulse_pub *pub, uint64_t step,
                                  const made_anchor *m,
                                  pulse_store_object *out) {
  if (m->staged != NULL)
    return pub_anchor_name(pub->dir, m->staged, step, out);
  memset(out, 0, sizeof *out);
  out->kind = PULSE_STORE_ANCHOR;
  out->step = out->base_step = step;
  out->size = m->size;
  memcpy(out->sha256, m->sha256, 32);
  store_object_set_path(out);
  return PULSE_OK;
}

static pulse_status commit_made(pulse_pub *pub, uint64_t step,
                                const pulse_buffer *patch,
                                const made_anchor *made,
                                const pulse_state_digest *state,
                                pulse_pub_figures *figures) {
  double t0 = made_now();
  if (pub == NULL || !pub->committer || state == NULL ||
      (pub->head == NULL && (patch != NULL || made == NULL)) ||
      (pub->head != NULL && (patch == NULL || patch->data == NULL)))
    return pulse_fail(PULSE_ERR_ARG,
                      "publisher: commit_made needs a committer, the state, and "
                      "an anchor alone for the first step, a patch after it");
  uint64_t head;
  if (pulse_pub_head_step(pub, &head) && step <= head)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "publisher: step %" PRIu64 " is not above the head's %" PRIu64,
                      step, head);
  pulse_pub_figures f;
  memset(&f, 0, sizeof f);
  f.step = step;
  f.params = pub->params;
  f.base_step = pub->head ? head : step;
  pub_anchor_join(pub); /* the last step's removals */
  pulse_status st = PULSE_OK;
  if (patch != NULL)
    st = check_patch(pub, step, patch, state, &f.changed);
  pulse_store_object obj, anchor;
  memset(&obj, 0, sizeof obj);
  pub_staged staged;
  memset(&staged, 0, sizeof staged);
  if (st == PULSE_OK && patch != NULL) {
    char objects[4096], path[4096];
    obj.kind = PULSE_STORE_PATCH;
    obj.step = step;
    obj.base_step = head;
    obj.size = patch->size;
    store_sha256(patch->data, patch->size, obj.sha256);
    store_object_set_path(&obj);
    int renamed = 0;
    if (store_join(objects, sizeof objects, pub->dir, PULSE_STORE_OBJECTS_DIR) != 0 ||
        store_join(path, sizeof path, pub->dir, obj.path) != 0)
      st = pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
    if (st == PULSE_OK)
      st = pub_staged_write(objects, "patch", patch->data, patch->size, &staged);
    if (st == PULSE_OK)
      st = pub_staged_publish(&staged, path, &renamed);
    /* Its section index, durable before the head names the patch, as a
     * single publisher writes it (workers that hold some tensors fetch
     * only theirs). */
    if (st == PULSE_OK)
      st = pub_sections_write(pub, patch, &obj);
  }
  int with_anchor = 0;
  if (st == PULSE_OK && made != NULL) {
    st = anchor_object(pub, step, made, &anchor);
    with_anchor = st == PULSE_OK;
  }
  size_t np = pub->head ? pulse_store_head_patch_count(pub->head) : 0,
         na = pub->head ? pulse_store_head_anchor_count(pub->head) : 0;
  pulse_store_object *p = malloc((np + 1) * sizeof *p), *a = malloc((na + 1) * sizeof *a);
  if (st == PULSE_OK && (p == NULL || a == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "publisher: head lists");
  if (st == PULSE_OK) {
    for (size_t i = 0; i < np; i++)
      p[i] = *pulse_store_head_patch(pub->head, i);
    for (size_t i = 0; i < na; i++)
      a[i] = *pulse_store_head_anchor(pub->head, i);
    if (patch != NULL)
      p[np++] = obj;
    if (with_anchor)
      a[na++] = anchor;
    st = pub_head_write(pub, step, state, p, np, a, na);
  }
  free(p), free(a);
  if (st != PULSE_OK) {
    /* What was written is unnamed: the objects wait for retention like any
     * a crash leaves (the patch is the same bytes when the step is
     * retried). */
    if (with_anchor && made->staged != NULL)
      pub_garbage_add(pub, &anchor);
    return st;
  }
  pub->state_digest = *state;
  if (with_anchor) {
    pub->last_anchor_step = step;
    f.anchor_bytes = anchor.size;
  }
  f.patch_bytes = patch ? patch->size : 0;
  f.total_seconds = f.write_seconds = made_now() - t0;
  pulse_state_digest_hex(state, f.state_digest);
  if (figures != NULL)
    *figures = f;
  if (pub->opts.on_head != NULL)
    pub->opts.on_head(pub->opts.on_head_ctx, &f);
  if (pub_anchor_start(pub, step, 0, 0) != PULSE_OK)
    PULSE_LOG_AT(PULSE_LOG_WARN, "publisher: removals after step %" PRIu64 ": %s", step,
                 pulse_error_detail());
  return PULSE_OK;
}

pulse_status pulse_pub_commit_made(pulse_pub *pub, uint64_t step,
                                   const pulse_buffer *patch,
                                   const char *anchor_staged,
                                   const pulse_state_digest *state,
                                   pulse_pub_figures *figures) {
  made_anchor made = {anchor_staged, NULL, 0};
  return commit_made(pub, step, patch, anchor_staged != NULL ? &made : NULL,
                     state, figures);
}

pulse_status pulse_pub_commit_made_uploaded(pulse_pub *pub, uint64_t step,
                                            const pulse_buffer *patch,
                                            const uint8_t anchor_sha256[32],
                                            uint64_t anchor_size,
                                            const pulse_state_digest *state,
                                            pulse_pub_figures *figures) {
  if (anchor_sha256 == NULL || anchor_size == 0)
    return pulse_fail(
        PULSE_ERR_ARG,
        "publisher: commit_made_uploaded needs the anchor's SHA-256 and its "
        "size (not 0)");
  made_anchor made = {NULL, anchor_sha256, anchor_size};
  return commit_made(pub, step, patch, &made, state, figures);
}

int pulse_pub_anchor_due(const pulse_pub *pub, uint64_t step) {
  if (pub == NULL || pub->head == NULL)
    return 1;
  return pub->opts.anchor_every > 0 && step - pub->last_anchor_step >= pub->opts.anchor_every;
}
