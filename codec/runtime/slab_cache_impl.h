/* slab_cache_impl.h - the staging memory of one apply, kept for the next
 * (slab_cache.c). */
#ifndef PULSE_SLAB_CACHE_IMPL_H
#define PULSE_SLAB_CACHE_IMPL_H

#include <stddef.h>

/* A block of at least `bytes` (pulse_hugepage_alloc's, so on huge pages
 * where the kernel allows), the kept one when it is large enough; *got is
 * its real size, to give back. NULL when out of memory. Its contents are
 * whatever the last user left. */
void *pulse_slab_take(size_t bytes, size_t *got);

/* Gives a block of pulse_slab_take back: kept for the next take when it is
 * the larger of it and the kept one, the other freed. NULL is fine. */
void pulse_slab_give(void *slab, size_t bytes);

#endif
