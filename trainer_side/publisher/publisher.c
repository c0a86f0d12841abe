/* publisher.c - opening a store for publishing, resuming from its head, and
 * the publisher's accessors (pulse_publisher.h). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "publisher_impl.h"
#include "pulse_log.h"
#include "pulse_store_writer.h"
#include "status_impl.h"
#include "store_impl.h"
#include "writer_lock_impl.h"

static pulse_status copy_table(pulse_pub *pub, const pulse_tensor_info *t,
                               size_t n) {
  pub->count = n;
  pub->info = calloc(n + 1, sizeof *pub->info);
  pub->numel = calloc(n + 1, sizeof *pub->numel);
  pub->digests = calloc(n + 1, sizeof *pub->digests);
  pub->scratch_digests = calloc(n + 1, sizeof *pub->scratch_digests);
  pub->changes = calloc(n + 1, sizeof *pub->changes);
  pub->enc = calloc(n + 1, sizeof *pub->enc);
  if (!pub->info || !pub->numel || !pub->digests || !pub->scratch_digests ||
      !pub->changes || !pub->enc)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: table of %zu tensors", n);
  for (size_t i = 0; i < n; i++) {
    if (t[i].name == NULL || t[i].name[0] == '\0' ||
        strlen(t[i].name) > PULSE_MAX_NAME || t[i].ndim > PULSE_MAX_DIMS)
      return pulse_fail(PULSE_ERR_ARG,
                        "publisher: tensor %zu: bad name or ndim", i);
    for (size_t j = 0; j < i; j++)
      if (strcmp(t[i].name, t[j].name) == 0)
        return pulse_fail(PULSE_ERR_DUPLICATE,
                          "publisher: tensor '%s' listed twice", t[i].name);
    pub->info[i] = t[i];
    pub->info[i].dtype = PULSE_DTYPE_BF16;
    for (uint32_t d = t[i].ndim; d < PULSE_MAX_DIMS; d++)
      pub->info[i].shape[d] = 0;
    if ((pub->info[i].name = strdup(t[i].name)) == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "publisher: tensor names");
    PULSE_TRY(pulse_shape_numel(t[i].shape, t[i].ndim, &pub->numel[i]));
    if (pub->numel[i] > UINT64_MAX - pub->params)
      return pulse_fail(PULSE_ERR_OVERFLOW, "publisher: parameter count");
    pub->params += pub->numel[i];
  }
  pub->opts.tensors = pub->info;
  pub->opts.tensor_count = n;
  return PULSE_OK;
}

static pulse_status same_table(const pulse_tensor_info *want, size_t nwant,
                               const pulse_store_state *s) {
  if (nwant != s->count)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "publisher: the table has %zu tensors, the store %zu",
                      nwant, s->count);
  for (size_t i = 0; i < nwant; i++)
    if (strcmp(want[i].name, s->info[i].name) != 0 ||
        want[i].ndim != s->info[i].ndim ||
        memcmp(want[i].shape, s->info[i].shape,
               want[i].ndim * sizeof want[i].shape[0]) != 0)
      return pulse_fail(
          PULSE_ERR_SIZE_MISMATCH,
          "publisher: tensor %zu ('%s') differs from the store's ('%s')", i,
          want[i].name, s->info[i].name);
  return PULSE_OK;
}

/* Takes the head's state as the snapshot. */
static pulse_status resume(pulse_pub *pub) {
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  PULSE_TRY(pulse_store_state_rebuild(pub->dir, pub->head,
                                      pulse_store_head_step(pub->head),
                                      pub->opts.threads, &s));
  pulse_status st = PULSE_OK;
  if (pub->opts.tensors != NULL)
    st = same_table(pub->opts.tensors, pub->opts.tensor_count, &s);
  if (st == PULSE_OK)
    st = copy_table(pub, s.info, s.count);
  if (st == PULSE_OK) {
    pub->snap = s.bits; /* take the arrays over */
    s.bits = NULL;
    pub->host_current = 1; /* the device copy is made at a device commit */
  }
  if (st == PULSE_OK) {
    memcpy(pub->digests, s.digests, s.count * sizeof *s.digests);
    pub->state_digest = s.state_digest;
    size_t na = pulse_store_head_anchor_count(pub->head);
    pub->last_anchor_step = pulse_store_head_anchor(pub->head, na - 1)->step;
  }
  pulse_store_state_free(&s);
  return st;
}

void pulse_pub_opts_init(pulse_pub_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_PUB_OPTS_VERSION;
  o->anchor_every = 16;
  o->keep_patches = 32;
  o->keep_anchors = 3;
  o->pos_model = PULSE_POS_CLASS;
  o->chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
  o->grace_seconds = 600.0;
}

/* A committer's resume: the head's digest and anchor step, no state. */
static pulse_status resume_committer(pulse_pub *pub) {
  if (pub->opts.tensors == NULL || pub->opts.tensor_count == 0)
    return pulse_fail(PULSE_ERR_ARG, "publisher: a committer needs the table");
  PULSE_TRY(copy_table(pub, pub->opts.tensors, pub->opts.tensor_count));
  pub->state_digest = *pulse_store_head_state_digest(pub->head);
  size_t na = pulse_store_head_anchor_count(pub->head);
  pub->last_anchor_step = pulse_store_head_anchor(pub->head, na - 1)->step;
  return PULSE_OK;
}

static pulse_status pub_open(const char *dir, const pulse_pub_opts *opts, int committer,
                             pulse_pub **out);

pulse_status pulse_pub_create(const char *dir, const pulse_pub_opts *opts,
                              pulse_pub **out) {
  return pub_open(dir, opts, 0, out);
}

pulse_status pulse_pub_create_committer(const char *dir, const pulse_pub_opts *opts,
                                        pulse_pub **out) {
  return pub_open(dir, opts, 1, out);
}

static pulse_status pub_open(const char *dir, const pulse_pub_opts *opts, int committer,
                             pulse_pub **out) {
  if (dir == NULL || dir[0] == '\0' || opts == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "publisher: NULL argument");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("publisher", opts, PULSE_PUB_OPTS_VERSION));
  if (opts->keep_patches < 1 || opts->keep_anchors < 2 ||
      (opts->pos_model != PULSE_POS_PLAIN &&
       opts->pos_model != PULSE_POS_CLASS) ||
      opts->chunk_log2 < 10 || opts->chunk_log2 > 30 ||
      (opts->tensors == NULL && opts->tensor_count > 0) ||
      !(opts->grace_seconds >= 0) ||
      opts->format_version > PULSE_PATCH_VERSION_MAX ||
      (opts->format_version != 0 &&
       opts->format_version < PULSE_PATCH_VERSION_MIN))
    return pulse_fail(
        PULSE_ERR_ARG,
        "publisher: keep_patches must be >= 1, keep_anchors >= 2, "
        "chunk_log2 in 10..30, a known position model, grace_seconds >= 0, "
        "a patch format version this library writes");
  pulse_pub *pub = calloc(1, sizeof *pub);
  if (pub == NULL || (pub->dir = strdup(dir)) == NULL) {
    free(pub);
    return pulse_fail(PULSE_ERR_NOMEM, "publisher");
  }
  pub->lock_fd = -1;
  pthread_mutex_init(&pub->moved_mu, NULL);
  pthread_cond_init(&pub->moved_cv, NULL);
  pub->opts = *opts;
  /* The key the head rotated away from is refused whoever holds the store
   * (reading the head writes nothing); then one writer per store, refused
   * before anything is written. */
  pulse_status st = pub_store_dirs(dir);
  if (st == PULSE_OK) {
    st = pulse_store_head_load(dir, &pub->head);
    if (st == PULSE_OK)
      st = pub_key_check(pub);
    pulse_store_head_free(pub->head);
    pub->head = NULL;
    if (st == PULSE_ERR_NOT_FOUND)
      st = PULSE_OK;
  }
  if (st == PULSE_OK)
    st = pub_writer_lock(dir, &pub->lock_fd);
  if (st == PULSE_OK)
    st = pub_store_recover_held(dir, opts->grace_seconds, NULL);
  if (st == PULSE_OK) {
    st = pulse_store_head_load(dir, &pub->head);
    if (st == PULSE_OK)
      st = pub_key_check(pub);
    pub->committer = committer;
    if (st == PULSE_OK)
      st = committer ? resume_committer(pub) : resume(pub);
    if (st == PULSE_OK)
      st = pub_gc_open(pub);
    else if (st == PULSE_ERR_NOT_FOUND)
      st = opts->tensors == NULL || opts->tensor_count == 0
               ? pulse_fail(
                     PULSE_ERR_ARG,
                     "publisher: %s is a new store: give the tensor table", dir)
               : copy_table(pub, opts->tensors, opts->tensor_count);
  }
  if (st != PULSE_OK) {
    pulse_pub_free(pub);
    return st;
  }
  if (pub->head != NULL)
    PULSE_LOG_AT(PULSE_LOG_INFO, "publisher: %s: resumed at step %" PRIu64, dir,
                 pulse_store_head_step(pub->head));
  *out = pub;
  return PULSE_OK;
}

void pulse_pub_free(pulse_pub *pub) {
  if (pub == NULL)
    return;
  if (pub->head != NULL && pulse_pub_flush(pub, NULL) != PULSE_OK)
    PULSE_LOG_AT(PULSE_LOG_WARN, "publisher: %s: final anchor not named: %s",
                 pub->dir, pulse_error_detail());
  pub_anchor_join(pub);
  pub_device_free(pub);
  pub_detect_free(pub);
  for (size_t i = 0; i < pub->count; i++) {
    if (pub->info)
      free((char *)pub->info[i].name);
    if (pub->snap)
      free(pub->snap[i]);
    if (pub->changes)
      pulse_changes_free(&pub->changes[i]);
  }
  free(pub->info), free(pub->numel), free(pub->snap), free(pub->digests);
  free(pub->scratch_digests), free(pub->changes), free(pub->enc);
  pub_remove_garbage(pub);
  free(pub->garbage);
  pub_gc_free(pub);
  pulse_store_head_free(pub->head);
  pthread_mutex_destroy(&pub->moved_mu);
  pthread_cond_destroy(&pub->moved_cv);
  pub_writer_unlock(pub->lock_fd); /* last: the store is left as it is */
  free(pub->dir);
  free(pub);
}

void pulse_pub_wait(pulse_pub *pub) {
  if (pub != NULL)
    pub_anchor_join(pub);
}

int pulse_pub_head_step(const pulse_pub *pub, uint64_t *step) {
  if (pub == NULL || pub->head == NULL)
    return 0;
  if (step != NULL)
    *step = pulse_store_head_step(pub->head);
  return 1;
}

const pulse_state_digest *pulse_pub_state_digest(const pulse_pub *pub) {
  return pub != NULL && pub->head != NULL ? &pub->state_digest : NULL;
}

size_t pulse_pub_tensor_count(const pulse_pub *pub) {
  return pub ? pub->count : 0;
}

const pulse_tensor_info *pulse_pub_tensor_info(const pulse_pub *pub, size_t i) {
  return pub != NULL && i < pub->count ? &pub->info[i] : NULL;
}

const uint16_t *pulse_pub_snapshot(const pulse_pub *pub, size_t i) {
  if (pub == NULL || pub->snap == NULL || i >= pub->count)
    return NULL;
  /* The host copy catches up here (the background move of the last host
   * commit, a download after device commits): the publisher is not const
   * underneath, and one thread drives it. */
  if (pub_host_current((pulse_pub *)pub) != PULSE_OK)
    return NULL;
  return pub->snap[i];
}

const char *pulse_pub_dir(const pulse_pub *pub) {
  return pub ? pub->dir : NULL;
}
