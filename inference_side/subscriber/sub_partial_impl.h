/* sub_partial_impl.h - private to pulse_inference: the partial route of a
 * patch (sub_partial.c). */
#ifndef PULSE_SUB_PARTIAL_IMPL_H
#define PULSE_SUB_PARTIAL_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "sub_impl.h"

/* A patch's bytes as the partial route holds them: an anonymous mapping of
 * the patch's size with its header, table and the needed sections, each
 * verified; the rest never touched. */
typedef struct {
  uint8_t *map;
  size_t size;
  int sections; /* fetched by its sections (not sent whole by a server
                   that ignored the Range) */
} sub_partial;

/** Whether patch o may take the partial route: host or region targets,
 * not a relay, nothing of it cached, not tiny, and no recent patch of
 * which the targets needed most (count_down: this patch counts as one of
 * those).
 * Asks nothing of the network. */
int sub_partial_wanted(pulse_sub *sub, const pulse_store_object *o, int count_down);

/** Tries the partial route for patch o. @return 1 with *p opened over
 * part->map (free both: pulse_patch_free, sub_partial_free; the targets'
 * sections are verified, the others are zeros), or 0 when it was not
 * taken or failed (logged; nothing kept): the caller fetches the patch
 * whole. */
int sub_partial_open(pulse_sub *sub, const pulse_store_object *o, sub_partial *part,
                     pulse_patch **p);

void sub_partial_free(sub_partial *part); /* an empty one is fine */

/** A relay (opts.mirror) keeps the section index of patch o beside it in
 * its cache (sections/<sha256>, checked as the partial route checks it),
 * so that the workers it serves take the partial route too. A source
 * without one (404) or a bad one leaves none: workers then fetch whole. */
void sub_partial_mirror(pulse_sub *sub, const pulse_store_object *o);

#endif /* PULSE_SUB_PARTIAL_IMPL_H */
