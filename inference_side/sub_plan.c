/* sub_plan.c - the route from the targets' step to the head that downloads
 * the fewest bytes: (a) the retained patches from the targets' step, (b)
 * one squashed catch-up patch from the server (its size from a HEAD
 * request; only when the server signs it with the publisher's key, unless
 * unsigned catch-ups are allowed), or (c) an anchor and the patches after
 * it. Bytes already in the cache (whole objects, or partial downloads that
 * will resume) are not counted, so a restarted worker finishes the download
 * it had started. Without a known step only (c) is possible. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

/* Bytes of head patches first..end still to download. */
static uint64_t patches_cost(const pulse_sub *sub, size_t first) {
  uint64_t bytes = 0;
  size_t np = pulse_store_head_patch_count(sub->head);
  for (size_t i = first; i < np; i++) {
    const pulse_store_object *o = pulse_store_head_patch(sub->head, i);
    bytes += o->size - sub_object_have(sub, o);
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

/* Size of the catch-up from `from`, or 0 when it cannot be used. */
static uint64_t probe_catchup(pulse_sub *sub, uint64_t from) {
  char rel[64];
  snprintf(rel, sizeof rel, "v1/catchup/%" PRIu64, from);
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, NULL);
  x.method = PULSE_FETCH_HEAD;
  x.max_bytes = 1;
  x.timeout_ms = sub->opts.request_timeout_ms;
  pulse_status st = sub_fetch_mem(sub, 0, rel, &x, "catch-up probe");
  uint64_t size = 0;
  char v[256];
  if (st == PULSE_OK && x.status == 200 &&
      pulse_fetch_xfer_header(&x, "Content-Length", v, sizeof v))
    size = strtoull(v, NULL, 10);
  int is_signed = pulse_fetch_xfer_header(&x, "X-Pulse-Signature", v, sizeof v);
  if (size > 0 && !is_signed && !sub->opts.allow_unsigned_catchup) {
    PULSE_LOG_AT(
        PULSE_LOG_INFO,
        "subscriber: the server does not sign catch-ups: using patches");
    size = 0;
  }
  if (pulse_fetch_xfer_header(&x, "X-Pulse-To-Step", v, sizeof v) &&
      strtoull(v, NULL, 10) != pulse_store_head_step(sub->head))
    size = 0; /* the head moved meanwhile */
  pulse_fetch_xfer_release(&x);
  return size;
}

pulse_status sub_plan_make(pulse_sub *sub, sub_plan *out) {
  memset(out, 0, sizeof *out);
  const pulse_store_head *h = sub->head;
  uint64_t head = pulse_store_head_step(h), from = sub->step;
  out->from = from;
  out->route = PULSE_SUB_ROUTE_NONE;
  if (from != PULSE_SUB_NO_STEP && from >= head)
    return PULSE_OK;
  uint64_t best = UINT64_MAX;
  size_t np = pulse_store_head_patch_count(h);
  long first = from != PULSE_SUB_NO_STEP && pulse_store_head_has_step(h, from)
                   ? patch_after(h, from)
                   : -1;
  if (first >= 0) {
    best = patches_cost(sub, (size_t)first);
    out->route = PULSE_SUB_ROUTE_CHAIN;
    out->first_patch = (size_t)first;
    out->patch_count = np - (size_t)first;
    out->bytes = best;
    /* A catch-up only pays off over two patches or more (over one, the
     * server sends that very patch). */
    if (sub->opts.use_catchup && out->patch_count >= 2 && best > 0) {
      uint64_t size = probe_catchup(sub, from);
      if (size > 0 && size < best) {
        best = size;
        out->route = PULSE_SUB_ROUTE_CATCHUP;
        out->catchup_size = size;
        out->bytes = size;
      }
    }
  }
  for (size_t a = 0; a < pulse_store_head_anchor_count(h); a++) {
    const pulse_store_object *o = pulse_store_head_anchor(h, a);
    long after = patch_after(h, o->step);
    if (after < 0 || o->step > head)
      continue;
    uint64_t cost =
        (o->size - sub_object_have(sub, o)) + patches_cost(sub, (size_t)after);
    if (cost < best || (cost == best && out->route == PULSE_SUB_ROUTE_ANCHOR)) {
      best = cost;
      out->route = PULSE_SUB_ROUTE_ANCHOR;
      out->anchor = o;
      out->first_patch = (size_t)after;
      out->patch_count = np - (size_t)after;
      out->bytes = cost;
    }
  }
  if (best == UINT64_MAX)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "no route from step %" PRIu64 " to the head (%" PRIu64
                      "): the head names no usable anchor",
                      from, head);
  return PULSE_OK;
}
