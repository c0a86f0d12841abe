/* sub_sync.c - one sync (head, route, downloads, transactional steps) and
 * following a publisher with long-polls. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"
#include "sub_partial_impl.h"

static void rejected(pulse_sub *sub, const char *object, pulse_status st) {
  sub_count(sub, &sub->fig.rejected, 1);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_REJECTED;
  ev.object = object;
  ev.status = st;
  ev.detail = pulse_error_detail();
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", ev.detail);
  sub_emit(sub, &ev);
}

static int is_wrong_base(pulse_status st) {
  return st == PULSE_ERR_BASE_DIGEST || st == PULSE_ERR_BASE_STEP;
}

/* Opens a verified patch object; its header must say what the head says. */
static pulse_status open_patch(pulse_sub *sub, const pulse_store_object *o,
                               pulse_buffer *b, pulse_patch **p) {
  *p = NULL;
  PULSE_TRY(sub_object_read(sub, o, b));
  double t0 = sub_now();
  pulse_status st = pulse_patch_open(b->data, b->size, p);
  sub->t_decode += sub_now() - t0;
  if (st == PULSE_OK && (pulse_patch_step(*p) != o->step ||
                         pulse_patch_base_step(*p) != o->base_step)) {
    uint64_t from = pulse_patch_base_step(*p), to = pulse_patch_step(*p);
    pulse_patch_free(*p);
    *p = NULL;
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "%s: the patch goes %" PRIu64 " -> %" PRIu64
                    ", the head says %" PRIu64 " -> %" PRIu64,
                    o->path, from, to, o->base_step, o->step);
  }
  if (st != PULSE_OK)
    pulse_buffer_free(b);
  return st;
}

static void applied(pulse_sub *sub, pulse_sub_route route, uint64_t *counter) {
  sub_count(sub, counter, 1);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_APPLIED;
  ev.route = route;
  sub_emit(sub, &ev);
}

/* Patches are decoded while they download (sub_stream.c) unless turned
 * off: on the host for host targets, and for device targets the host
 * decodes the streams while the device finds, checks and writes. */
static int streaming(const pulse_sub *sub) {
  /* Region targets stage whole patches (pulse_region.h). */
  return !sub->opts.no_streaming && sub->mem != SUB_MEM_REGION;
}

/* Applies the head's patches from `first` on, in order. When streaming,
 * each one not yet in the cache is downloaded and decoded at once;
 * otherwise every one was fetched before. */
static pulse_status apply_patches(pulse_sub *sub, size_t first) {
  size_t np = pulse_store_head_patch_count(sub->head);
  for (size_t i = first; i < np; i++) {
    const pulse_store_object *o = pulse_store_head_patch(sub->head, i);
    sub->applying_step = o->step;
    sub_partial part;
    pulse_patch *pp = NULL;
    if (sub_partial_wanted(sub, o, 1) && sub_partial_open(sub, o, &part, &pp)) {
      pulse_status st = sub_apply_patch(sub, pp);
      pulse_patch_free(pp);
      sub_partial_free(&part);
      if (st != PULSE_OK)
        return st;
      applied(sub, PULSE_SUB_ROUTE_CHAIN, &sub->fig.patches_applied);
      continue;
    }
    if (streaming(sub) && sub_object_have(sub, o) < o->size) {
      PULSE_TRY(sub_apply_patch_streamed(sub, o, NULL));
      applied(sub, PULSE_SUB_ROUTE_CHAIN, &sub->fig.patches_applied);
      continue;
    }
    pulse_buffer b = {NULL, 0};
    pulse_patch *p = NULL;
    /* Fetched by run_route unless it was left to the partial route. */
    PULSE_TRY(sub_object_fetch(sub, o));
    PULSE_TRY(open_patch(sub, o, &b, &p));
    pulse_status st = sub_apply_patch(sub, p);
    pulse_patch_free(p);
    pulse_buffer_free(&b);
    if (st != PULSE_OK)
      return st;
    applied(sub, PULSE_SUB_ROUTE_CHAIN, &sub->fig.patches_applied);
  }
  return PULSE_OK;
}

/* The catch-up route: the squashed patch the probe described (its signed
 * SHA-256 and size, sub_catchup.c), fetched into the cache like a patch
 * object, so that it resumes after a cut, a failed sync or a restart;
 * decoded while it downloads unless streaming is off; it must lead to the
 * head's state. */
static pulse_status run_catchup(pulse_sub *sub, const sub_plan *plan) {
  const pulse_store_object *o = &plan->catchup;
  const sub_source *src = &plan->catchup_src;
  pulse_status st;
  sub->applying_step = o->step;
  if (streaming(sub)) {
    st = sub_apply_patch_streamed(sub, o, src);
  } else {
    pulse_buffer b = {NULL, 0};
    pulse_patch *p = NULL;
    st = sub_object_fetch_from(sub, o, src);
    if (st == PULSE_OK)
      st = open_patch(sub, o, &b, &p);
    if (st == PULSE_OK && memcmp(pulse_patch_target_digest(p)->bytes,
                                 src->target.bytes, 32) != 0)
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: the catch-up does not lead to the head's state",
                      o->path);
    if (st == PULSE_OK)
      st = sub_apply_patch(sub, p);
    pulse_patch_free(p);
    pulse_buffer_free(&b);
  }
  if (st == PULSE_OK)
    applied(sub, PULSE_SUB_ROUTE_CATCHUP, &sub->fig.catchups_applied);
  return st;
}

/* A step the targets were said to hold (a file's metadata, or
 * pulse_sub_assume_step) is checked before anything relies on it. At the
 * head's step it is checked here; below it, by the base digests of the
 * first patch applied; above it (a rollback asked for), it is dropped. */
static pulse_status check_claim(pulse_sub *sub) {
  uint64_t head = pulse_store_head_step(sub->head);
  if (sub->step != PULSE_SUB_NO_STEP && sub->step > head) {
    /* The targets' step counts as seen (sub_head.c): only a rollback asked
     * for gets here (a switch of runs forgets the step). */
    if (!sub->opts.allow_rollback)
      return pulse_fail(PULSE_ERR_BASE_STEP,
                        "the targets hold step %" PRIu64
                        ", newer than the head (step %" PRIu64
                        "): refused without allow_rollback",
                        sub->step, head);
    char msg[256];
    snprintf(msg, sizeof msg,
             "the targets hold step %" PRIu64 ", the head is step %" PRIu64
             ": rolling back (allowed), from an anchor",
             sub->step, head);
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
    sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
    sub_forget_step(sub);
    return PULSE_OK;
  }
  if (!sub->step_claimed || sub->step < head)
    return PULSE_OK;
  int ok = 0, full = sub->have_state;
  if (sub->step == head && sub->have_state) {
    ok = memcmp(sub->state.bytes,
                pulse_store_head_state_digest(sub->head)->bytes, 32) == 0;
  } else if (sub->step == head && pulse_store_head_patch_count(sub->head) > 0) {
    /* The per-tensor digests of the head's patch. */
    const pulse_store_object *o = pulse_store_head_patch(
        sub->head, pulse_store_head_patch_count(sub->head) - 1);
    pulse_buffer b = {NULL, 0};
    pulse_patch *p = NULL;
    PULSE_TRY(sub_object_fetch(sub, o));
    PULSE_TRY(open_patch(sub, o, &b, &p));
    ok = 1;
    for (size_t k = 0; k < sub->ntargets && ok; k++) {
      size_t i;
      pulse_patch_tensor pt;
      ok = pulse_patch_tensor_find(p, sub->targets[k].name, &i) == PULSE_OK &&
           pulse_patch_tensor_get(p, i, &pt) == PULSE_OK &&
           pt.target_digest.a == sub->targets[k].digest.a &&
           pt.target_digest.b == sub->targets[k].digest.b;
    }
    full = sub->ntargets == pulse_patch_tensor_count(p);
    pulse_patch_free(p);
    pulse_buffer_free(&b);
  }
  if (ok) {
    pthread_rwlock_wrlock(&sub->rw);
    sub_set_step(sub, head,
                 full ? pulse_store_head_state_digest(sub->head) : NULL);
    pthread_rwlock_unlock(&sub->rw);
    return PULSE_OK;
  }
  pulse_fail(PULSE_ERR_BASE_DIGEST,
             "the targets do not hold step %" PRIu64
             " as the publisher has it (wrong base): taking an anchor",
             sub->step);
  rejected(sub, "targets", PULSE_ERR_BASE_DIGEST);
  sub_forget_step(sub);
  return PULSE_OK;
}

static pulse_status mirror_all(pulse_sub *sub) {
  for (size_t i = 0; i < pulse_store_head_anchor_count(sub->head); i++)
    PULSE_TRY(sub_object_fetch(sub, pulse_store_head_anchor(sub->head, i)));
  for (size_t i = 0; i < pulse_store_head_patch_count(sub->head); i++) {
    const pulse_store_object *o = pulse_store_head_patch(sub->head, i);
    int missing = sub_object_have(sub, o) < o->size;
    PULSE_TRY(sub_object_fetch(sub, o));
    if (missing) /* asked once, with its patch */
      sub_partial_mirror(sub, o);
  }
  return PULSE_OK;
}

/* Downloads what a route needs, then applies it. */
static pulse_status run_route(pulse_sub *sub, const sub_plan *plan) {
  size_t np = pulse_store_head_patch_count(sub->head);
  if (plan->route == PULSE_SUB_ROUTE_NONE)
    return PULSE_OK;
  if (plan->route == PULSE_SUB_ROUTE_CATCHUP)
    return run_catchup(sub, plan);
  if (plan->route == PULSE_SUB_ROUTE_ANCHOR)
    PULSE_TRY(sub_object_fetch(sub, plan->anchor));
  /* Patches the partial route may take are fetched when applied. */
  for (size_t i = plan->first_patch; i < np && !streaming(sub); i++)
    if (!sub_partial_wanted(sub, pulse_store_head_patch(sub->head, i), 0))
      PULSE_TRY(sub_object_fetch(sub, pulse_store_head_patch(sub->head, i)));
  if (plan->route == PULSE_SUB_ROUTE_ANCHOR) {
    sub->applying_step = plan->anchor->step;
    PULSE_TRY(sub_apply_anchor(sub, plan->anchor));
    applied(sub, PULSE_SUB_ROUTE_ANCHOR, &sub->fig.anchors_applied);
  }
  return apply_patches(sub, plan->first_patch);
}

static void emit_plan(pulse_sub *sub, const sub_plan *plan) {
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_PLAN;
  ev.route = plan->route;
  ev.from_step = plan->from;
  ev.bytes = plan->bytes;
  if (plan->route == PULSE_SUB_ROUTE_ANCHOR)
    ev.object = plan->anchor->path;
  sub_emit(sub, &ev);
}

/* A route that failed with st: worth planning another (a failure of what
 * was downloaded or of the link), not a local failure or a stop. */
static int route_failure(pulse_sub *sub, pulse_status st) {
  return !atomic_load(&sub->stop) && st != PULSE_ERR_ARG &&
         st != PULSE_ERR_NOMEM && st != PULSE_ERR_INTERNAL &&
         st != PULSE_ERR_CUDA && st != PULSE_ERR_NOT_BUILT;
}

/* An object the route needed is gone (404): the publisher may have moved
 * on and collected it. Fetches the head again; *moved: it is newer, so
 * the sync plans again from what the targets and the cache hold now. */
static pulse_status head_moved_on(pulse_sub *sub, int *moved) {
  uint64_t before = pulse_store_head_step(sub->head);
  *moved = 0;
  PULSE_TRY(sub_head_fetch(sub, NULL));
  *moved = pulse_store_head_step(sub->head) > before;
  return PULSE_OK;
}

/* Tells that a route failed and another is planned. */
static void fall_back(pulse_sub *sub, const sub_plan *plan, pulse_status st,
                      const char *detail) {
  char msg[1200];
  snprintf(msg, sizeof msg, "the %s route failed (%s): planning another",
           pulse_sub_route_name(plan->route), detail);
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, st, msg);
}

/* The route was refused a step's weights (sub_impl.h): any route through
 * that step ends the same way, so none is taken again. The targets keep
 * the step before it (every apply is all or nothing); the refusal is
 * reported here once, and later syncs to the same head end at the plan
 * with its status, with nothing fetched. */
static pulse_status refuse_step(pulse_sub *sub, pulse_status st, const char *detail) {
  sub->have_refused = 1;
  sub->refused_step = sub->applying_step;
  sub->refused_status = st;
  sub->refused_have_run = sub->have_run;
  memcpy(sub->refused_run, sub->run, sizeof sub->run);
  snprintf(sub->refused_detail, sizeof sub->refused_detail, "%s", detail);
  char at[64] = "no known step";
  if (sub->step != PULSE_SUB_NO_STEP)
    snprintf(at, sizeof at, "step %" PRIu64, sub->step);
  pulse_fail(st,
             "step %" PRIu64 " refused: %s; the targets stay at %s, and no route through "
             "step %" PRIu64 " is taken again",
             sub->refused_step, detail, at, sub->refused_step);
  rejected(sub, "step", st);
  return st;
}

/* Plans and runs routes until the targets reach the head. A route that
 * fails is not taken again in this sync (catch-up, then the chain, then an
 * anchor), except when an object it needed was collected while the head
 * moved on: then the sync plans again against the new head, keeping
 * whatever it applied and downloaded (partial files resume). */
static pulse_status reach_head(pulse_sub *sub, sub_plan *plan) {
  unsigned avoid = 0;
  pulse_status st = PULSE_OK;
  char detail[1024] = "";
  for (;;) {
    pulse_status pst = sub_plan_make(sub, avoid, plan);
    if (pst != PULSE_OK)
      return avoid == 0 ? pst : pulse_fail(st, "%s", detail);
    emit_plan(sub, plan);
    sub->refusing = 0;
    st = run_route(sub, plan);
    if (st == PULSE_OK && sub_plan_refused(sub, 0, sub->step))
      sub->have_refused = 0; /* past it (a catch-up or a later anchor) */
    if (st == PULSE_OK || !route_failure(sub, st))
      return st;
    snprintf(detail, sizeof detail, "%s", pulse_error_detail());
    if (sub->refusing)
      return refuse_step(sub, st, detail);
    if (is_wrong_base(st) && plan->route != PULSE_SUB_ROUTE_ANCHOR) {
      /* Never applied: the targets are not what the publisher had at their
       * step. Start again from an anchor. */
      pulse_fail(st,
                 "the targets are not step %" PRIu64
                 " as the publisher has it (wrong base: %s): "
                 "taking an anchor",
                 plan->from, detail);
      rejected(sub, "targets", st);
      sub_forget_step(sub);
      continue;
    }
    if (st == PULSE_ERR_NOT_FOUND) {
      int moved = 0;
      PULSE_TRY(head_moved_on(sub, &moved));
      /* A catch-up chases the head: one that moved on is not chased. */
      if (moved && plan->route != PULSE_SUB_ROUTE_CATCHUP) {
        PULSE_LOG_AT(PULSE_LOG_INFO,
                     "subscriber: %s; the head moved on to %" PRIu64
                     ": planning again",
                     detail, pulse_store_head_step(sub->head));
        continue;
      }
    }
    avoid |= SUB_AVOID(plan->route);
    fall_back(sub, plan, st, detail);
  }
}

static pulse_status sync_once(pulse_sub *sub, int head_ready, sub_plan *plan) {
  memset(plan, 0, sizeof *plan);
  plan->from = sub->step;
  if (!head_ready || sub->head == NULL)
    PULSE_TRY(sub_head_fetch(sub, NULL));
  if (sub->opts.mirror) {
    PULSE_TRY(mirror_all(sub));
    PULSE_TRY(sub_cache_save_head(sub));
  }
  if (sub->ntargets == 0 && sub->mem != SUB_MEM_FILE)
    return sub_cache_save_head(sub);
  PULSE_TRY(check_claim(sub));
  PULSE_TRY(reach_head(sub, plan));
  if (sub->step != pulse_store_head_step(sub->head))
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "the targets hold step %" PRIu64
                      ", newer than the head (%" PRIu64 "): a stale server",
                      sub->step, pulse_store_head_step(sub->head));
  return sub_cache_save_head(sub);
}

static pulse_status sync_run(pulse_sub *sub, int head_ready) {
  sub->t_transfer = sub->t_verify = sub->t_decode = sub->t_apply = 0;
  sub->t_write = 0;
  sub->t_decode_overlap = sub->t_cb = 0;
  double t0 = sub_now();
  pulse_sub_figures before;
  pulse_sub_figures_get(sub, &before);
  sub_plan plan;
  pulse_status st = PULSE_ERR_NOT_FOUND;
  for (int tries = 0; tries < 3; tries++) {
    st = sync_once(sub, head_ready && tries == 0, &plan);
    /* An object that vanished: the head moved on, fetch it again. */
    if (st != PULSE_ERR_NOT_FOUND || atomic_load(&sub->stop))
      break;
  }
  char detail[1024];
  snprintf(detail, sizeof detail, "%s", pulse_error_detail());
  pulse_status fst =
      sub_file_save(sub); /* also after a failure: a consistent step */
  if (st == PULSE_OK && fst != PULSE_OK) {
    st = fst;
    snprintf(detail, sizeof detail, "%s", pulse_error_detail());
  }
  pthread_mutex_lock(&sub->fig_lock);
  if (st == PULSE_OK)
    sub->fig.syncs++;
  else
    sub->fig.sync_failures++;
  sub->fig.last_route = plan.route;
  sub->fig.last_status = st;
  sub->fig.last_from_step = plan.from;
  sub->fig.last_bytes = sub->fig.bytes_downloaded - before.bytes_downloaded;
  sub->fig.last_transfer_s = sub->t_transfer;
  sub->fig.last_verify_s = sub->t_verify;
  sub->fig.last_decode_s = sub->t_decode;
  sub->fig.last_decode_overlap_s = sub->t_decode_overlap;
  sub->fig.last_apply_s = sub->t_apply;
  sub->fig.last_write_s = sub->t_write;
  sub->fig.last_total_s = sub_now() - t0;
  /* A synced event says what the class index rule chose (sub_index.c). */
  char why[sizeof sub->fig.class_index_why];
  snprintf(why, sizeof why, "%s", sub->fig.class_index_why);
  pthread_mutex_unlock(&sub->fig_lock);
  pulse_sub_event ev = {0};
  ev.type = st == PULSE_OK ? PULSE_SUB_EV_SYNCED : PULSE_SUB_EV_ERROR;
  ev.status = st;
  ev.route = plan.route;
  ev.from_step = plan.from;
  ev.detail = st == PULSE_OK ? why : detail;
  sub_emit(sub, &ev);
  if (st != PULSE_OK)
    pulse_fail(st, "%s", detail);
  return sub_keep_error(sub, st);
}

pulse_status pulse_sub_sync(pulse_sub *sub) {
  if (sub == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sync: NULL subscriber");
  pulse_status st = sync_run(sub, 0);
  atomic_store(&sub->stop, 0);
  return st;
}

/* The follower's pause after a failure: the backoff of the failures in a
 * row or of the heads refused since the last new head, whichever is
 * longer (a source alternating a good head with bad ones resets the
 * first, never the second), and at least what the server's Retry-After
 * asked. */
static void follow_pause(pulse_sub *sub, unsigned failures) {
  unsigned n = failures > sub->head_rejects ? failures : sub->head_rejects;
  unsigned ms = sub_backoff_ms(sub, n < 16 ? n : 16);
  if (sub->poll_retry_after_ms > ms)
    ms = sub->poll_retry_after_ms;
  sub->poll_retry_after_ms = 0;
  sub_sleep_ms(sub, ms);
}

/* The head is at or past a step the targets refused: waiting for a newer
 * one is all a follower can do. */
static int refusal_stands(const pulse_sub *sub) {
  return sub->head != NULL &&
         sub_plan_refused(sub, 0, pulse_store_head_step(sub->head));
}

pulse_status pulse_sub_follow(pulse_sub *sub) {
  if (sub == NULL)
    return pulse_fail(PULSE_ERR_ARG, "follow: NULL subscriber");
  int need_sync = 1, head_ready = 0;
  unsigned failures = 0;
  pulse_status st = PULSE_OK;
  while (!atomic_load(&sub->stop)) {
    if (need_sync) {
      st = sync_run(sub, head_ready);
      head_ready = 0;
      if (st == PULSE_ERR_ARG || st == PULSE_ERR_NOMEM)
        break;
      if (st != PULSE_OK && !refusal_stands(sub)) {
        follow_pause(sub, failures);
        failures++;
        continue;
      }
      /* Synced, or as far as the targets take: a refused step is not
       * fetched again until the head moves on. */
      failures = 0;
      need_sync = 0;
    }
    int got = 0;
    uint64_t after = sub->head != NULL ? pulse_store_head_step(sub->head) : 0;
    st = sub_head_poll(sub, after, &got);
    if (st != PULSE_OK) {
      if (atomic_load(&sub->stop))
        break;
      sub_keep_error(sub, st);
      sub_emit_simple(sub, PULSE_SUB_EV_ERROR, st, pulse_error_detail());
      follow_pause(sub, failures);
      failures++;
      need_sync = 1; /* the head may have moved while the server was away */
      continue;
    }
    if (got) {
      need_sync = 1;
      head_ready = 1;
    } else if (sub->opts.mirror && (st = mirror_all(sub)) != PULSE_OK &&
               !atomic_load(&sub->stop)) {
      /* A relay serves its cache to others, so it is checked at every
       * long-poll's end too: what changed since it was hashed is hashed
       * again, and fetched again when it went bad. */
      sub_keep_error(sub, st);
      sub_emit_simple(sub, PULSE_SUB_EV_ERROR, st, pulse_error_detail());
      need_sync = 1;
    }
  }
  atomic_store(&sub->stop, 0);
  return st == PULSE_ERR_ARG || st == PULSE_ERR_NOMEM ? st : PULSE_OK;
}
