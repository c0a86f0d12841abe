/* patch_check.c - decoding every chunk stream of a patch without the base
 * (pulse_patch_check_streams): a validity check for tools that hold no
 * weights, and the measure of the coder alone (the work a receiver's host
 * does when a GPU turns class ranks into positions). */
#include <stdio.h>
#include <stdlib.h>

#include "chunk_impl.h"
#include "parallel_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

typedef struct {
  const pulse_patch *p;
  uint64_t (*items)[2]; /* (tensor, chunk) */
  pulse_status *status;
  char (*detail)[200];
} check_job;

static void check_one(void *ctx, size_t i) {
  check_job *job = ctx;
  const pulse_patch *p = job->p;
  const patch_tensor *t = &p->tensors[job->items[i][0]];
  uint64_t j = job->items[i][1], c = t->chunk_first + j;
  uint32_t k = p->chunk_changed[c];
  uint32_t start[PULSE_CLASS_COUNT + 1];
  uint32_t *rank = malloc((size_t)k * sizeof *rank);
  uint16_t *delta = malloc((size_t)k * sizeof *delta);
  pulse_status st;
  if (rank == NULL || delta == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "check: chunk of %u changes", k);
  else
    st = pulse_chunk_decode_ranks(
        p->version, p->values, p->model, NULL, patch_chunk_elems(p, t, j),
        p->bytes + p->chunk_offset[c], (size_t)p->chunk_size[c], k, start, rank,
        delta);
  if (st != PULSE_OK && st != PULSE_ERR_NOMEM)
    st = pulse_fail(st, "tensor '%s' chunk %llu: %s", t->info.name, (unsigned long long)j,
                    pulse_error_detail());
  job->status[i] = st;
  if (st != PULSE_OK)
    snprintf(job->detail[i], sizeof job->detail[i], "%s", pulse_error_detail());
  free(rank), free(delta);
}

pulse_status pulse_patch_check_streams(const pulse_patch *p, int threads) {
  if (p == NULL)
    return pulse_fail(PULSE_ERR_ARG, "check: NULL patch");
  if (p->version == 1 && p->model == PULSE_POS_CLASS)
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "check: version 1 class-model streams decode only against the base");
  uint64_t(*items)[2] = calloc(p->chunks + 1, sizeof *items);
  pulse_status *status = calloc(p->chunks + 1, sizeof *status);
  char(*detail)[200] = calloc(p->chunks + 1, sizeof *detail);
  pulse_status st = PULSE_OK;
  if (items == NULL || status == NULL || detail == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "check: %llu chunks", (unsigned long long)p->chunks);
    goto done;
  }
  size_t count = 0;
  for (size_t i = 0; i < p->count; i++)
    for (uint64_t j = 0; p->tensors[i].changed > 0 && j < p->tensors[i].chunk_count; j++)
      if (p->chunk_changed[p->tensors[i].chunk_first + j] != 0) {
        items[count][0] = i;
        items[count][1] = j;
        count++;
      }
  check_job job = {p, items, status, detail};
  pulse_parallel_for(threads, count, check_one, &job);
  for (size_t i = 0; i < count && st == PULSE_OK; i++)
    if (status[i] != PULSE_OK)
      st = pulse_fail(status[i], "check: %s", detail[i]);
done:
  free(items), free(status), free(detail);
  return st;
}
