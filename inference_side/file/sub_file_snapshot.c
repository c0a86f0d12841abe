/* sub_file_snapshot.c - the file target's optional consistent copy
 * (pulse_sub_file_snapshot): every K steps, PATH.snapshot is replaced
 * atomically by a thread of its own from a copy of the state taken under
 * the readers' lock, so the syncing thread never waits for the disk. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "sub_file_impl.h"

/* What the thread writes: its own copy of one step. */
typedef struct {
  pulse_sub *sub;
  pulse_st_write_tensor *w;
  size_t n;
  char step[32], hex[65];
  int have_state;
} snapshot_job;

static void job_free(snapshot_job *j) {
  if (j == NULL)
    return;
  for (size_t i = 0; j->w != NULL && i < j->n; i++)
    free((void *)j->w[i].name), free((void *)j->w[i].data);
  free(j->w);
  free(j);
}

/* The copy, under the readers' lock: one whole step. */
static pulse_status job_make(pulse_sub *sub, snapshot_job **out) {
  snapshot_job *j = calloc(1, sizeof *j);
  if (j == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "snapshot of %s", sub->file_path);
  j->sub = sub;
  pthread_rwlock_rdlock(&sub->rw);
  j->n = sub->ntargets;
  j->w = calloc(j->n + 1, sizeof *j->w);
  pulse_status st = j->w != NULL ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "snapshot");
  for (size_t i = 0; i < j->n && st == PULSE_OK; i++) {
    const sub_target *t = &sub->targets[i];
    void *copy = malloc(t->numel ? (size_t)t->numel * 2 : 2);
    char *name = strdup(t->name);
    j->w[i] = (pulse_st_write_tensor){name, PULSE_DTYPE_BF16, t->ndim, {0}, copy};
    if (copy == NULL || name == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "snapshot of %s: %" PRIu64 " bytes for '%s'",
                      sub->file_path, t->numel * 2, t->name);
      break;
    }
    memcpy(copy, t->data, (size_t)t->numel * 2);
    memcpy(j->w[i].shape, t->shape, sizeof j->w[i].shape);
  }
  snprintf(j->step, sizeof j->step, "%" PRIu64, sub->step);
  j->have_state = sub->have_state;
  if (sub->have_state)
    pulse_state_digest_hex(&sub->state, j->hex);
  pthread_rwlock_unlock(&sub->rw);
  if (st != PULSE_OK) {
    job_free(j);
    return st;
  }
  *out = j;
  return PULSE_OK;
}

static void *snapshot_run(void *arg) {
  snapshot_job *j = arg;
  struct sub_file *f = j->sub->file;
  pulse_st_kv meta[2] = {{"step", j->step}, {"state_digest", j->hex}};
  f->snapshot_status = pulse_st_write(f->snapshot_path, j->w, j->n, meta, j->have_state ? 2 : 1);
  if (f->snapshot_status != PULSE_OK)
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: snapshot %s: %s", f->snapshot_path,
                 pulse_error_detail());
  job_free(j);
  atomic_store(&f->snapshot_done, 1);
  return NULL;
}

void sub_file_snapshot_wait(pulse_sub *sub) {
  struct sub_file *f = sub->file;
  if (f == NULL || !f->snapshot_running)
    return;
  pthread_join(f->snapshot_thread, NULL);
  f->snapshot_running = 0;
  if (f->snapshot_status != PULSE_OK) {
    char msg[600];
    snprintf(msg, sizeof msg, "snapshot %s failed (%s): tried again at the next due step",
             f->snapshot_path, pulse_status_name(f->snapshot_status));
    sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
    f->snapshot_step = PULSE_SUB_NO_STEP; /* due again */
  }
}

void sub_file_snapshot_maybe(pulse_sub *sub) {
  struct sub_file *f = sub->file;
  if (f == NULL || f->snapshot_every == 0 || sub->step == PULSE_SUB_NO_STEP)
    return;
  if (f->snapshot_running) {
    if (!atomic_load(&f->snapshot_done))
      return; /* still writing: this step is skipped */
    sub_file_snapshot_wait(sub);
  }
  if (f->snapshot_step != PULSE_SUB_NO_STEP && sub->step >= f->snapshot_step &&
      sub->step - f->snapshot_step < f->snapshot_every)
    return;
  snapshot_job *j = NULL;
  if (job_make(sub, &j) != PULSE_OK) {
    sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, pulse_error_detail());
    return;
  }
  atomic_store(&f->snapshot_done, 0);
  f->snapshot_status = PULSE_OK;
  if (pthread_create(&f->snapshot_thread, NULL, snapshot_run, j) != 0) {
    job_free(j);
    return;
  }
  f->snapshot_running = 1;
  f->snapshot_step = sub->step;
}

pulse_status pulse_sub_file_snapshot(pulse_sub *sub, uint64_t every) {
  if (sub == NULL || sub->mem != SUB_MEM_FILE || sub->file == NULL)
    return pulse_fail(PULSE_ERR_ARG, "snapshot: no file target attached");
  sub->file->snapshot_every = every;
  sub->file->snapshot_step = PULSE_SUB_NO_STEP;
  return PULSE_OK;
}
