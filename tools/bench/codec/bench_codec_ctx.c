/* bench_codec_ctx.c - the buffers the steps of `pulse-bench codec` share
 * (codec_ctx): allocated once the tensor table is known, freed at the end. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_codec_impl.h"
#include "hugepage_impl.h"

void bench_codec_ctx_free(codec_ctx *c) {
  free(c->old_bf16);
  free(c->work);
  free(c->copy_dst);
  if (c->changes != NULL)
    for (size_t i = 0; i < c->table.count; i++)
      pulse_changes_free(&c->changes[i]);
  free(c->changes);
  free(c->digests);
  free(c->enc);
  free(c->targets);
  free(c->index);
  free(c->cur);
  free(c->cur_dtype);
}

/* Allocates the per-tensor and per-state buffers once the table is known. */
int bench_codec_ctx_alloc(codec_ctx *c) {
  size_t n = c->table.count;
  uint64_t total = c->table.total;
  c->old_bf16 = malloc((size_t)total * 2 + 1);
  /* The apply's target lives where a receiver's do: pulse_sub allocates
   * each tensor on huge pages (hugepage_impl.h), where the random accesses
   * of an apply do not miss the TLB (with 4 KiB pages an indexed apply of
   * the default trajectory ran at 0.7x). */
  c->work = pulse_hugepage_alloc((size_t)total * 2 + 1);
  c->changes = calloc(n, sizeof *c->changes);
  c->digests = calloc(n, sizeof *c->digests);
  c->enc = calloc(n, sizeof *c->enc);
  c->targets = calloc(n, sizeof *c->targets);
  c->index = calloc(n + 1, sizeof *c->index);
  c->cur = calloc(n, sizeof *c->cur);
  c->cur_dtype = calloc(n, sizeof *c->cur_dtype);
  /* memcpy destination: the F32 weights plus the BF16 snapshot, written
   * round a buffer of at most BENCH_COPY_CAP (far past the caches, so the
   * writes cost what they would into a buffer of the whole size, which at
   * 1e9 parameters would be 6 GB the bench cannot spare). */
  c->copy_cap = (size_t)total * 6 + 1;
  if (c->copy_cap > BENCH_COPY_CAP)
    c->copy_cap = BENCH_COPY_CAP;
  c->copy_dst = malloc(c->copy_cap);
  if (c->old_bf16 == NULL || c->work == NULL || c->changes == NULL ||
      c->digests == NULL || c->enc == NULL || c->targets == NULL ||
      c->index == NULL || c->cur == NULL || c->cur_dtype == NULL ||
      c->copy_dst == NULL) {
    fprintf(stderr, PROG ": out of memory for %" PRIu64 " parameters\n", total);
    return 1;
  }
  /* Touch the pages now so the first timing does not pay for faults. */
  memset(c->copy_dst, 0, c->copy_cap);
  memset(c->work, 0, (size_t)total * 2);
  for (size_t i = 0; i < n; i++)
    c->changes[i] = (pulse_changes)PULSE_CHANGES_INIT;
  return 0;
}
