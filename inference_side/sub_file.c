/* sub_file.c - the safetensors file target: the subscriber holds the whole
 * BF16 state in memory, applies each step there, and replaces the file
 * atomically (pulse_st_write: temporary file, fsync, rename) with the
 * tensors in table order and metadata {"step", "state_digest"}, the layout
 * of an anchor. A reader of the file sees one whole step or the previous. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel_impl.h"
#include "pulse_log.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "sub_impl.h"

static void warn(pulse_sub *sub, const char *fmt, const char *a,
                 const char *b) {
  char msg[1024];
  snprintf(msg, sizeof msg, fmt, a, b);
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
}

typedef struct {
  sub_target *t;
} digest_job;

static void digest_one(void *ctx, size_t i) {
  digest_job *j = ctx;
  j->t[i].digest = pulse_digest_bf16(j->t[i].data, j->t[i].numel);
}

pulse_status sub_file_load(pulse_sub *sub) {
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open(sub->file_path, &f);
  if (st == PULSE_ERR_NOT_FOUND)
    return PULSE_OK; /* made from the first anchor */
  if (st != PULSE_OK) {
    warn(sub, "%s cannot be read (%s): it will be replaced from an anchor",
         sub->file_path, pulse_error_detail());
    return PULSE_OK;
  }
  size_t n = pulse_st_tensor_count(f);
  sub_target *t = calloc(n + 1, sizeof *t);
  pulse_tensor_info *info = calloc(n + 1, sizeof *info);
  pulse_tensor_digest *d = calloc(n + 1, sizeof *d);
  if (t == NULL || info == NULL || d == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "loading %s", sub->file_path);
  size_t made = 0;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_st_tensor x;
    pulse_st_tensor_get(f, i, &x);
    if (x.dtype != PULSE_DTYPE_BF16) {
      warn(sub,
           "%s holds a tensor that is not BF16 (%s): it will be replaced from "
           "an anchor",
           sub->file_path, x.name);
      break;
    }
    t[i].name = strdup(x.name);
    t[i].ndim = x.ndim;
    memcpy(t[i].shape, x.shape, sizeof t[i].shape);
    t[i].numel = x.numel;
    t[i].data = malloc(x.nbytes ? x.nbytes : 2);
    made = i + 1;
    if (t[i].name == NULL || t[i].data == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "loading %s", sub->file_path);
      break;
    }
    memcpy(t[i].data, x.data, x.nbytes); /* also realigns */
    info[i].name = t[i].name;
    info[i].dtype = PULSE_DTYPE_BF16;
    info[i].ndim = t[i].ndim;
    memcpy(info[i].shape, t[i].shape, sizeof info[i].shape);
  }
  const char *meta_step = pulse_st_metadata_get(f, "step");
  const char *meta_digest = pulse_st_metadata_get(f, "state_digest");
  char step_s[32], digest_s[80];
  snprintf(step_s, sizeof step_s, "%s", meta_step ? meta_step : "");
  snprintf(digest_s, sizeof digest_s, "%s", meta_digest ? meta_digest : "");
  pulse_st_close(f);
  if (st != PULSE_OK || made < n) {
    for (size_t i = 0; i < made; i++)
      free(t[i].name), free(t[i].data);
    free(t), free(info), free(d);
    return st;
  }
  digest_job job = {t};
  pulse_parallel_for(sub->opts.threads, n, digest_one, &job);
  for (size_t i = 0; i < n; i++)
    d[i] = t[i].digest;
  pulse_state_digest sd;
  char hex[65];
  st = pulse_state_digest_compute(info, d, n, &sd);
  pulse_state_digest_hex(&sd, hex);
  free(info), free(d);
  sub->targets = t;
  sub->ntargets = sub->cap = n;
  if (st != PULSE_OK)
    return st;
  char *end = NULL;
  uint64_t step = strtoull(step_s, &end, 10);
  if (step_s[0] == '\0' || end == NULL || *end != '\0') {
    warn(sub, "%s names no step%s: it will be replaced from an anchor",
         sub->file_path, "");
    return PULSE_OK;
  }
  if (digest_s[0] != '\0' && strcmp(digest_s, hex) != 0) {
    warn(sub,
         "%s does not match its own state digest (%s): it will be replaced "
         "from an anchor",
         sub->file_path, digest_s);
    return PULSE_OK;
  }
  /* A step to resume from, checked against the publisher before use. */
  pthread_rwlock_wrlock(&sub->rw);
  sub_set_step(sub, step, &sd);
  sub->step_claimed = 1;
  pthread_rwlock_unlock(&sub->rw);
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "subscriber: %s holds step %" PRIu64 " (state %s)",
               sub->file_path, step, hex);
  return PULSE_OK;
}

pulse_status sub_file_save(pulse_sub *sub) {
  if (sub->mem != SUB_MEM_FILE || !sub->file_dirty ||
      sub->step == PULSE_SUB_NO_STEP)
    return PULSE_OK;
  double t0 = sub_now();
  pulse_st_write_tensor *w = calloc(sub->ntargets + 1, sizeof *w);
  if (w == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "writing %s", sub->file_path);
  for (size_t i = 0; i < sub->ntargets; i++) {
    w[i].name = sub->targets[i].name;
    w[i].dtype = PULSE_DTYPE_BF16;
    w[i].ndim = sub->targets[i].ndim;
    memcpy(w[i].shape, sub->targets[i].shape, sizeof w[i].shape);
    w[i].data = sub->targets[i].data;
  }
  char step[32], hex[65];
  snprintf(step, sizeof step, "%" PRIu64, sub->step);
  pulse_st_kv meta[2] = {{"step", step}, {"state_digest", hex}};
  size_t nmeta = 1;
  if (sub->have_state) {
    pulse_state_digest_hex(&sub->state, hex);
    nmeta = 2;
  }
  pulse_status st =
      pulse_st_write(sub->file_path, w, sub->ntargets, meta, nmeta);
  free(w);
  sub->t_apply += sub_now() - t0;
  if (st == PULSE_OK)
    sub->file_dirty = 0;
  return st;
}
