/* slab_cache.c - the staging memory of one apply, kept for the next.
 *
 * A receiver applies patch after patch of about the same size, each staged
 * in one block of 18 bytes per change (patch_stream.c). Fresh memory costs a
 * page fault per page and the kernel zeroes every page it hands out: for
 * the 260 k changes of a 10 M-weight step that was 4 MiB of huge pages
 * zeroed per apply, 7% of the apply on one thread and 14% on two (perf,
 * clear_page_erms under the decode's first writes). So the block of the
 * last apply is kept, one per process (the largest given back), and taken
 * again when it is large enough. The memory held between applies is the
 * staging of the largest recent patch, which the next apply would allocate
 * anyway; pulse_apply_cache_free hands it back. */
#include <pthread.h>
#include <stdlib.h>

#include "hugepage_impl.h"
#include "pulse_codec.h"
#include "slab_cache_impl.h"

static pthread_mutex_t slab_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t slab_once = PTHREAD_ONCE_INIT;
static void *kept;
static size_t kept_bytes;

/* fork: the lock is held across it, so a child never inherits it locked
 * by a thread it does not have (it keeps the parent's block, a copy). */
static void slab_prepare(void) { pthread_mutex_lock(&slab_mu); }
static void slab_parent(void) { pthread_mutex_unlock(&slab_mu); }
static void slab_child(void) { pthread_mutex_init(&slab_mu, NULL); }
static void slab_register(void) { pthread_atfork(slab_prepare, slab_parent, slab_child); }

void *pulse_slab_take(size_t bytes, size_t *got) {
  pthread_once(&slab_once, slab_register);
  pthread_mutex_lock(&slab_mu);
  void *p = NULL;
  if (kept != NULL && kept_bytes >= bytes) {
    p = kept;
    *got = kept_bytes;
    kept = NULL;
    kept_bytes = 0;
  }
  pthread_mutex_unlock(&slab_mu);
  if (p != NULL)
    return p;
  if (bytes >= PULSE_HUGEPAGE / 2) /* whole huge pages: it is kept */
    bytes = (bytes + PULSE_HUGEPAGE - 1) & ~(PULSE_HUGEPAGE - 1);
  p = pulse_hugepage_alloc(bytes);
  *got = p != NULL ? bytes : 0;
  return p;
}

void pulse_slab_give(void *slab, size_t bytes) {
  if (slab == NULL)
    return;
  pthread_mutex_lock(&slab_mu);
  if (bytes > kept_bytes) { /* keep the larger; free the other */
    void *old = kept;
    kept = slab;
    kept_bytes = bytes;
    slab = old;
  }
  pthread_mutex_unlock(&slab_mu);
  free(slab);
}

void pulse_apply_cache_free(void) {
  pthread_mutex_lock(&slab_mu);
  void *p = kept;
  kept = NULL;
  kept_bytes = 0;
  pthread_mutex_unlock(&slab_mu);
  free(p);
}
