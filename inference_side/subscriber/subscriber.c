/* subscriber.c - creating and freeing a subscriber, its options, figures,
 * events and the readers' lock. */
#include <inttypes.h>
#include <stddef.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

const char *pulse_sub_route_name(pulse_sub_route route) {
  switch (route) {
  case PULSE_SUB_ROUTE_NONE:
    return "none";
  case PULSE_SUB_ROUTE_CHAIN:
    return "chain";
  case PULSE_SUB_ROUTE_CATCHUP:
    return "catchup";
  case PULSE_SUB_ROUTE_ANCHOR:
    return "anchor";
  }
  return "?";
}

static int url_ok(const char *u) {
  return u != NULL &&
         (strncmp(u, "http://", 7) == 0 || strncmp(u, "https://", 8) == 0) &&
         strlen(u) > 8 && strlen(u) < 1800;
}

static pulse_status check_opts(const pulse_sub_opts *o) {
  PULSE_TRY(PULSE_OPTS_CHECK("subscriber", o, PULSE_SUB_OPTS_VERSION));
  if (o->urls == NULL || o->url_count == 0 || o->url_count > 64)
    return pulse_fail(PULSE_ERR_ARG,
                      "subscriber: 1 to 64 publisher URLs needed");
  for (size_t i = 0; i < o->url_count; i++)
    if (!url_ok(o->urls[i]))
      return pulse_fail(PULSE_ERR_ARG,
                        "subscriber: '%s' is not an http:// or https:// URL",
                        o->urls[i] ? o->urls[i] : "(null)");
  if (o->cache_dir == NULL || o->cache_dir[0] == '\0')
    return pulse_fail(PULSE_ERR_ARG, "subscriber: a cache folder is needed");
  if (o->public_key != NULL && o->allow_unsigned)
    return pulse_fail(
        PULSE_ERR_ARG,
        "subscriber: a pinned key and unsigned heads exclude each other");
  /* Trust on first use is never a default: without a key, a subscriber
   * is refused unless it asks for it. */
  int tofu = o->trust_first_use;
  if (o->public_key != NULL && tofu)
    return pulse_fail(PULSE_ERR_ARG,
                      "subscriber: a pinned key and trust on first use "
                      "exclude each other");
  if (o->public_key == NULL && !tofu && !o->allow_unsigned)
    return pulse_fail(
        PULSE_ERR_ARG,
        "subscriber: no publisher key: pin the publisher's public key "
        "(public_key; pulse-pull --key HEX, the head's \"public_key\"), or "
        "trust the first head's key explicitly (trust_first_use; pulse-pull "
        "--trust-first-use)");
  if (o->redirect_origin_count > 0 && o->redirect_origins == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "subscriber: redirect_origin_count without origins");
  if (o->class_index != PULSE_SUB_CLASS_INDEX_AUTO && o->class_index != PULSE_SUB_CLASS_INDEX_OFF &&
      o->class_index != PULSE_SUB_CLASS_INDEX_ON)
    return pulse_fail(PULSE_ERR_ARG,
                      "subscriber: class_index %d is not PULSE_SUB_CLASS_INDEX_AUTO, _OFF or _ON",
                      (int)o->class_index);
  if (o->max_object_bytes == 0 || o->max_object_bytes > (uint64_t)INT64_MAX)
    return pulse_fail(PULSE_ERR_ARG,
                      "subscriber: max_object_bytes must be 1..2^63-1");
  if (o->parallel > 16 || o->retries > 1000 || o->poll_timeout_ms == 0 ||
      o->poll_timeout_ms > 3600000 || o->backoff_max_ms < o->backoff_ms)
    return pulse_fail(
        PULSE_ERR_ARG,
        "subscriber: parallel 0..16, retries 0..1000, poll timeout "
        "1 ms..1 h, backoff_max_ms >= backoff_ms");
  return PULSE_OK;
}

void pulse_sub_opts_init(pulse_sub_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_SUB_OPTS_VERSION;
  o->connect_timeout_ms = 10000;
  o->request_timeout_ms = 30000;
  o->low_speed_bytes = 1024;
  o->low_speed_seconds = 30;
  o->retries = 6;
  o->backoff_ms = 200;
  o->backoff_max_ms = 5000;
  o->parallel = 4;
  o->parallel_min_bytes = (uint64_t)32 << 20;
  o->use_catchup = 1;
  o->poll_timeout_ms = 30000;
  o->min_bytes_per_s = 262144;
  o->download_grace_ms = 30000;
  o->max_object_bytes = (uint64_t)1 << 40;
}

pulse_status pulse_sub_create(const pulse_sub_opts *opts, pulse_sub **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "subscriber: NULL out");
  *out = NULL;
  PULSE_TRY(check_opts(opts));
  pulse_sub *sub = calloc(1, sizeof *sub);
  if (sub == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "subscriber");
  sub->opts = *opts;
  if (sub->opts.parallel == 0)
    sub->opts.parallel = 1;
  sub->urls = calloc(opts->url_count, sizeof *sub->urls);
  sub->cache_dir = strdup(opts->cache_dir);
  pulse_status st = sub->urls && sub->cache_dir
                        ? PULSE_OK
                        : pulse_fail(PULSE_ERR_NOMEM, "subscriber");
  for (size_t i = 0; st == PULSE_OK && i < opts->url_count; i++) {
    sub->urls[i] = strdup(opts->urls[i]);
    if (sub->urls[i] == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "subscriber");
    sub->nurls = i + 1;
  }
  sub->opts.urls = (const char *const *)sub->urls;
  sub->opts.cache_dir = sub->cache_dir;
  if (opts->public_key != NULL) {
    memcpy(sub->key, opts->public_key, 32);
    sub->have_key = sub->key_pinned = 1;
  }
  sub->opts.public_key = NULL; /* the copy is sub->key */
  sub->step = PULSE_SUB_NO_STEP;
  sub->fig.step = sub->fig.head_step = PULSE_SUB_NO_STEP;
  sub->fig.last_from_step = PULSE_SUB_NO_STEP;
  sub->lag_step = calloc(opts->url_count, sizeof *sub->lag_step);
  sub->url_static = calloc(opts->url_count, sizeof *sub->url_static);
  for (size_t i = 0; sub->lag_step != NULL && i < opts->url_count; i++)
    sub->lag_step[i] = PULSE_SUB_NO_STEP;
  if ((sub->lag_step == NULL || sub->url_static == NULL) && st == PULSE_OK)
    st = pulse_fail(PULSE_ERR_NOMEM, "subscriber");
  atomic_init(&sub->stop, 0);
  atomic_init(&sub->indexer_stop, 0);
  pthread_rwlockattr_t ra;
  pthread_rwlockattr_init(&ra);
  /* Writers first: a stream of readers must not hold off a new step. */
  pthread_rwlockattr_setkind_np(&ra,
                                PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
  pthread_rwlock_init(&sub->rw, &ra);
  pthread_rwlockattr_destroy(&ra);
  pthread_mutex_init(&sub->fig_lock, NULL);
  if (st == PULSE_OK) {
    pulse_fetch_opts fo = sub_http_opts(&sub->opts, &sub->stop);
    st = pulse_fetch_create(&fo, &sub->http);
    sub->opts.cacert = NULL; /* the engine keeps its copies */
    sub->opts.redirect_origins = NULL;
    sub->opts.redirect_origin_count = 0;
  }
  if (st == PULSE_OK)
    st = sub_cache_open(sub);
  if (st != PULSE_OK) {
    pulse_sub_free(sub);
    return st;
  }
  *out = sub;
  return PULSE_OK;
}

void pulse_sub_free(pulse_sub *sub) {
  if (sub == NULL)
    return;
  sub_index_stop(sub);
  sub_fp8_free(sub);
  pulse_fetch_free(sub->http);
  sub_file_free(sub);
  for (size_t i = 0; i < sub->ntargets; i++) {
    free(sub->targets[i].name);
    free(sub->targets[i].halo); /* region targets' own */
    pulse_class_index_free(sub->targets[i].index);
    if (sub->mem == SUB_MEM_FILE)
      free(sub->targets[i].data);
  }
  free(sub->targets);
  sub_region_index_free(sub->region_index);
  pulse_cuda_workspace_free(sub->ws);
  pulse_store_head_free(sub->head);
  for (size_t i = 0; i < sub->nurls; i++)
    free(sub->urls[i]);
  free(sub->urls);
  free(sub->cache_dir);
  free(sub->file_path);
  free(sub->verified);
  free(sub->lag_step);
  free(sub->url_static);
  pthread_rwlock_destroy(&sub->rw);
  pthread_mutex_destroy(&sub->fig_lock);
  free(sub);
}

void pulse_sub_stop(pulse_sub *sub) {
  if (sub == NULL)
    return;
  atomic_store(&sub->stop, 1);
  pulse_fetch_stop(sub->http); /* wakes a transfer or a wait at once */
}

uint64_t pulse_sub_step(const pulse_sub *sub) {
  if (sub == NULL)
    return PULSE_SUB_NO_STEP;
  pthread_mutex_lock((pthread_mutex_t *)&sub->fig_lock);
  uint64_t s = sub->fig.step;
  pthread_mutex_unlock((pthread_mutex_t *)&sub->fig_lock);
  return s;
}

void pulse_sub_figures_get(const pulse_sub *sub, pulse_sub_figures *out) {
  if (sub == NULL || out == NULL)
    return;
  pthread_mutex_lock((pthread_mutex_t *)&sub->fig_lock);
  *out = sub->fig;
  pthread_mutex_unlock((pthread_mutex_t *)&sub->fig_lock);
}

const char *pulse_sub_error(const pulse_sub *sub) {
  return sub != NULL ? sub->err : "";
}

void pulse_sub_read_lock(pulse_sub *sub, uint64_t *step) {
  pthread_rwlock_rdlock(&sub->rw);
  if (step != NULL)
    *step = sub->step;
}

void pulse_sub_read_unlock(pulse_sub *sub) {
  pthread_rwlock_unlock(&sub->rw);
}

/* ---------------------------------------------------------------- private */

void sub_emit(pulse_sub *sub, pulse_sub_event *ev) {
  if (sub->opts.on_event == NULL)
    return;
  pthread_mutex_lock(&sub->fig_lock);
  ev->step = sub->fig.step;
  ev->head_step = sub->fig.head_step;
  pthread_mutex_unlock(&sub->fig_lock);
  sub->opts.on_event(sub->opts.on_event_ctx, ev);
}

void sub_emit_simple(pulse_sub *sub, pulse_sub_event_type type, pulse_status st,
                     const char *detail) {
  pulse_sub_event ev = {0};
  ev.type = type;
  ev.status = st;
  ev.detail = detail;
  sub_emit(sub, &ev);
}

void sub_set_step(pulse_sub *sub, uint64_t step,
                  const pulse_state_digest *state) {
  sub->step = step;
  sub->step_claimed = 0;
  sub->have_state = state != NULL;
  if (state != NULL)
    sub->state = *state;
  pthread_mutex_lock(&sub->fig_lock);
  sub->fig.step = step;
  if (state != NULL)
    pulse_state_digest_hex(state, sub->fig.state_digest);
  else
    sub->fig.state_digest[0] = '\0';
  pthread_mutex_unlock(&sub->fig_lock);
}

void sub_forget_step(pulse_sub *sub) {
  pthread_rwlock_wrlock(&sub->rw);
  sub_set_step(sub, PULSE_SUB_NO_STEP, NULL);
  pthread_rwlock_unlock(&sub->rw);
}

void sub_count(pulse_sub *sub, uint64_t *field, uint64_t n) {
  pthread_mutex_lock(&sub->fig_lock);
  *field += n;
  pthread_mutex_unlock(&sub->fig_lock);
}

pulse_status sub_keep_error(pulse_sub *sub, pulse_status st) {
  if (st != PULSE_OK)
    snprintf(sub->err, sizeof sub->err, "%s", pulse_error_detail());
  return st;
}
