/* sub_plan.c - the route from the targets' step to the head that downloads
 * the fewest bytes: (a) the retained patches from the targets' step, (b)
 * one squashed catch-up patch from the server (its size and SHA-256 from a
 * HEAD request, sub_catchup.c; only when the server signs it with the
 * publisher's key, unless unsigned catch-ups are allowed; also from a step
 * the head no longer retains; pinned to the head's step, so that the
 * trainer stepping on during its download does not change it: the next
 * sync plans again from the step it reached), or (c) an anchor
 * and the patches after it. Bytes already in the cache (whole objects, or
 * partial downloads that will resume, catch-ups included) are not counted,
 * so a restarted worker finishes the download it had started. Without a
 * known step only (c) is possible. Routes that failed during a sync are
 * left out when it plans again, and so are routes through a step the
 * targets refused (sub_impl.h), in every sync. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "status_impl.h"
#include "sub_impl.h"
#include "sub_segments_impl.h"

/* Bytes of head patches first..end still to download. */
static uint64_t patches_cost(const pulse_sub *sub, size_t first) {
  uint64_t bytes = 0;
  size_t np = pulse_store_head_patch_count(sub->head);
  for (size_t i = first; i < np; i++) {
    const pulse_store_object *o = pulse_store_head_patch(sub->head, i);
    bytes = sub_add_sat(bytes, o->size - sub_object_have(sub, o));
  }
  return bytes;
}

/* Index of the head patch that applies to `step` (np when step is the
 * head), or -1 when no retained patch does. */
static long patch_after(const pulse_store_head *h, uint64_t step) {
  size_t np = pulse_store_head_patch_count(h);
  if (step == pulse_store_head_step(h))
    return (long)np;
  for (size_t i = 0; i < np; i++)
    if (pulse_store_head_patch(h, i)->base_step == step)
      return (long)i;
  return -1;
}

int sub_plan_refused(const pulse_sub *sub, uint64_t lo, uint64_t hi) {
  if (!sub->have_refused || sub->refused_have_run != sub->have_run ||
      (sub->have_run && memcmp(sub->refused_run, sub->run, sizeof sub->run) != 0))
    return 0; /* none, or refused in another run */
  return sub->refused_step >= lo && sub->refused_step <= hi;
}

pulse_status sub_plan_make(pulse_sub *sub, unsigned avoid, sub_plan *out) {
  memset(out, 0, sizeof *out);
  const pulse_store_head *h = sub->head;
  uint64_t head = pulse_store_head_step(h), from = sub->step;
  out->from = from;
  out->route = PULSE_SUB_ROUTE_NONE;
  if (from != PULSE_SUB_NO_STEP && from >= head)
    return PULSE_OK;
  /* Sizes are the head's (from the network): a worker cannot hold an
   * object larger than a file can be, and sums of them saturate. */
  for (size_t i = 0; i < pulse_store_head_patch_count(h) +
                             pulse_store_head_anchor_count(h);
       i++) {
    size_t np0 = pulse_store_head_patch_count(h);
    const pulse_store_object *o = i < np0
                                      ? pulse_store_head_patch(h, i)
                                      : pulse_store_head_anchor(h, i - np0);
    if (o->size > SUB_OBJECT_MAX_BYTES)
      return pulse_fail(PULSE_ERR_OVERFLOW,
                        "the head names %s of %" PRIu64
                        " bytes, larger than any file: refused",
                        o->path, o->size);
  }
  uint64_t best = UINT64_MAX;
  size_t np = pulse_store_head_patch_count(h);
  /* Routes through a step the targets refused end there again (sub_impl.h):
   * only those past it are planned. */
  int refused = 0;
  long first = from != PULSE_SUB_NO_STEP && pulse_store_head_has_step(h, from)
                   ? patch_after(h, from)
                   : -1;
  if (first >= 0 && sub_plan_refused(sub, from + 1, head)) {
    refused = 1;
    first = -1;
  }
  if (first >= 0 && !(avoid & SUB_AVOID(PULSE_SUB_ROUTE_CHAIN))) {
    best = patches_cost(sub, (size_t)first);
    out->route = PULSE_SUB_ROUTE_CHAIN;
    out->first_patch = (size_t)first;
    out->patch_count = np - (size_t)first;
    out->bytes = best;
  }
  /* A catch-up only pays off over two patches or more (over one, the
   * server sends that very patch). From a step the head no longer retains
   * it is the one route short of an anchor: a server may still reach that
   * step through objects earlier heads named (a worker whose download
   * outlasted the retention, docs/protocols/sync.md). */
  int catchup_worth =
      first >= 0 ? np - (size_t)first >= 2 && patches_cost(sub, (size_t)first) > 0
                 : from != PULSE_SUB_NO_STEP && from < head;
  if (catchup_worth && sub_plan_refused(sub, head, head))
    refused = 1, catchup_worth = 0;
  if (catchup_worth && sub->opts.use_catchup &&
      !(avoid & SUB_AVOID(PULSE_SUB_ROUTE_CATCHUP)) &&
      sub_catchup_probe(sub, from, &out->catchup, &out->catchup_src)) {
    /* Bytes of it already in the cache (a partial download) are not
     * counted: an interrupted catch-up is finished. */
    uint64_t cost = out->catchup.size - sub_object_have(sub, &out->catchup);
    if (cost < best) {
      best = cost;
      out->route = PULSE_SUB_ROUTE_CATCHUP;
      out->bytes = cost;
    }
  }
  for (size_t a = 0; a < pulse_store_head_anchor_count(h) &&
                     !(avoid & SUB_AVOID(PULSE_SUB_ROUTE_ANCHOR));
       a++) {
    const pulse_store_object *o = pulse_store_head_anchor(h, a);
    long after = patch_after(h, o->step);
    if (after < 0 || o->step > head)
      continue;
    if (sub_plan_refused(sub, o->step, head)) {
      refused = 1;
      continue;
    }
    uint64_t cost = sub_add_sat(o->size - sub_object_have(sub, o),
                                patches_cost(sub, (size_t)after));
    if (cost < best || (cost == best && out->route == PULSE_SUB_ROUTE_ANCHOR)) {
      best = cost;
      out->route = PULSE_SUB_ROUTE_ANCHOR;
      out->anchor = o;
      out->first_patch = (size_t)after;
      out->patch_count = np - (size_t)after;
      out->bytes = cost;
    }
  }
  if (best == UINT64_MAX && refused)
    return pulse_fail(sub->refused_status,
                      "step %" PRIu64 " was refused (%s): no route to the head (step %" PRIu64
                      ") passes it; the targets stay at their step until a newer head gives one",
                      sub->refused_step, sub->refused_detail, head);
  if (best == UINT64_MAX)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "no route from step %" PRIu64 " to the head (%" PRIu64
                      "): %s",
                      from, head,
                      avoid ? "every route failed"
                            : "the head names no usable anchor");
  return PULSE_OK;
}
