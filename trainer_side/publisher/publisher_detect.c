/* publisher_detect.c - a host commit's change detection (publisher_impl.h).
 *
 * Every chunk of every tensor is one item on the publisher's threads, so
 * both cores work whatever the tensors' sizes, and each item also finds its
 * changes' class ranks (detect_ranked_impl.h): the encoder then takes the
 * rank form instead of counting classes over the whole snapshot a second
 * time. The items' findings are kept from commit to commit (no page faults
 * once they have grown) and copied into each tensor's arrays, which the
 * encoder and the snapshot's move read. */
#include <stdlib.h>
#include <string.h>

#include "detect_ranked_impl.h"
#include "parallel_impl.h"
#include "publisher_impl.h"
#include "status_impl.h"

typedef struct pub_detect_item {
  size_t tensor;
  uint64_t chunk;
  uint64_t at; /* index of its first change in the tensor's arrays */
  pulse_status status;
  char detail[200];
  pulse_detect_chunk found;
} pub_detect_item;

typedef struct {
  pulse_pub *pub;
  const pulse_pub_tensor *t;
} detect_job;

static uint32_t chunk_elems(const pulse_pub *pub, const pub_detect_item *it) {
  uint64_t first = it->chunk << pub->opts.chunk_log2;
  uint64_t left = pub->numel[it->tensor] - first;
  uint64_t size = (uint64_t)1 << pub->opts.chunk_log2;
  return (uint32_t)(left < size ? left : size);
}

static void detect_item(void *ctx, size_t k) {
  detect_job *job = ctx;
  pulse_pub *pub = job->pub;
  pub_detect_item *it = &pub->det[k];
  const pulse_pub_tensor *t = &job->t[it->tensor];
  it->status = pulse_detect_chunk_ranked(t->data, t->dtype, pub->snap[it->tensor],
                                         it->chunk << pub->opts.chunk_log2,
                                         chunk_elems(pub, it), PULSE_ISA_AUTO, &it->found);
  if (it->status != PULSE_OK)
    strncpy(it->detail, pulse_error_detail(), sizeof it->detail - 1);
}

static void copy_item(void *ctx, size_t k) {
  pulse_pub *pub = ctx;
  const pub_detect_item *it = &pub->det[k];
  size_t i = it->tensor;
  const pulse_changes *from = &it->found.changes;
  pulse_changes *to = &pub->changes[i];
  uint64_t n = from->count, at = it->at;
  memcpy(pub->det_hist[i] + it->chunk * PULSE_CLASS_COUNT, it->found.hist,
         sizeof it->found.hist);
  if (n == 0)
    return;
  memcpy(to->pos + at, from->pos, n * sizeof *to->pos);
  memcpy(to->old_bits + at, from->old_bits, n * sizeof *to->old_bits);
  memcpy(to->new_bits + at, from->new_bits, n * sizeof *to->new_bits);
  memcpy(pub->det_cls[i] + at, it->found.cls, n);
  memcpy(pub->det_rank[i] + at, it->found.rank, n * sizeof *pub->det_rank[i]);
}

/* The items (one per chunk) and the per-tensor class counts, once. */
static pulse_status plan_items(pulse_pub *pub) {
  size_t items = 0;
  for (size_t i = 0; i < pub->count; i++)
    items += (size_t)((pub->numel[i] + ((uint64_t)1 << pub->opts.chunk_log2) - 1) >>
                      pub->opts.chunk_log2);
  pub->det = calloc(items + 1, sizeof *pub->det);
  pub->det_hist = calloc(pub->count + 1, sizeof *pub->det_hist);
  pub->det_cls = calloc(pub->count + 1, sizeof *pub->det_cls);
  pub->det_rank = calloc(pub->count + 1, sizeof *pub->det_rank);
  pub->det_cap = calloc(pub->count + 1, sizeof *pub->det_cap);
  if (!pub->det || !pub->det_hist || !pub->det_cls || !pub->det_rank || !pub->det_cap)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: detection of %zu chunks", items);
  pub->det_items = items;
  size_t k = 0;
  for (size_t i = 0; i < pub->count; i++) {
    uint64_t chunks =
        (pub->numel[i] + ((uint64_t)1 << pub->opts.chunk_log2) - 1) >> pub->opts.chunk_log2;
    pub->det_hist[i] = malloc((size_t)(chunks * PULSE_CLASS_COUNT + 1) * sizeof(uint32_t));
    if (pub->det_hist[i] == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "publisher: class counts of '%s'",
                        pub->info[i].name);
    for (uint64_t c = 0; c < chunks; c++, k++) {
      pub->det[k].tensor = i;
      pub->det[k].chunk = c;
    }
  }
  return PULSE_OK;
}

/* Room for n changes in tensor i's arrays, with an eighth more: counts
 * wander from step to step, and each regrowth is a copy and fresh pages. */
static pulse_status tensor_room(pulse_pub *pub, size_t i, uint64_t n) {
  if (pub->changes[i].capacity < n)
    PULSE_TRY(pulse_changes_reserve(&pub->changes[i], n + n / 8));
  /* A tensor without changes still needs its (empty) rank form: the
   * encoder takes a NULL array for "no rank form". */
  if (pub->det_cap[i] >= n && pub->det_cls[i] != NULL && pub->det_rank[i] != NULL)
    return PULSE_OK;
  n += n / 8;
  uint8_t *cls = realloc(pub->det_cls[i], (size_t)n + 1);
  if (cls != NULL)
    pub->det_cls[i] = cls;
  uint32_t *rank = realloc(pub->det_rank[i], ((size_t)n + 1) * sizeof *rank);
  if (rank != NULL)
    pub->det_rank[i] = rank;
  if (cls == NULL || rank == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: %llu changes of '%s'",
                      (unsigned long long)n, pub->info[i].name);
  pub->det_cap[i] = n;
  return PULSE_OK;
}

pulse_status pub_detect(pulse_pub *pub, const pulse_pub_tensor *t) {
  if (pub->det == NULL) {
    pulse_status st = plan_items(pub);
    if (st != PULSE_OK) {
      pub_detect_free(pub);
      return st;
    }
  }
  detect_job job = {pub, t};
  pulse_parallel_for(pub->opts.threads, pub->det_items, detect_item, &job);
  for (size_t k = 0; k < pub->det_items; k++)
    if (pub->det[k].status != PULSE_OK)
      return pulse_fail(pub->det[k].status, "%s", pub->det[k].detail);
  /* Each item's place in its tensor's arrays, then the copies. */
  for (size_t i = 0; i < pub->count; i++)
    pub->changes[i].count = 0;
  for (size_t k = 0; k < pub->det_items; k++) {
    pulse_changes *c = &pub->changes[pub->det[k].tensor];
    pub->det[k].at = c->count;
    c->count += pub->det[k].found.changes.count;
  }
  for (size_t i = 0; i < pub->count; i++) {
    uint64_t n = pub->changes[i].count;
    pub->changes[i].count = 0; /* until the arrays hold them */
    PULSE_TRY(tensor_room(pub, i, n));
    pub->changes[i].count = n;
  }
  pulse_parallel_for(pub->opts.threads, pub->det_items, copy_item, pub);
  for (size_t i = 0; i < pub->count; i++) {
    pub->enc[i].info = pub->info[i];
    pub->enc[i].base = NULL; /* the rank form instead */
    pub->enc[i].changes = &pub->changes[i];
    pub->enc[i].base_digest = &pub->digests[i];
    pub->enc[i].chunk_hist = pub->det_hist[i];
    pub->enc[i].change_class = pub->det_cls[i];
    pub->enc[i].change_rank = pub->det_rank[i];
  }
  return PULSE_OK;
}

void pub_detect_free(pulse_pub *pub) {
  for (size_t k = 0; pub->det != NULL && k < pub->det_items; k++)
    pulse_detect_chunk_free(&pub->det[k].found);
  for (size_t i = 0; i < pub->count; i++) {
    if (pub->det_hist)
      free(pub->det_hist[i]);
    if (pub->det_cls)
      free(pub->det_cls[i]);
    if (pub->det_rank)
      free(pub->det_rank[i]);
  }
  free(pub->det), free(pub->det_hist), free(pub->det_cls), free(pub->det_rank);
  free(pub->det_cap);
  pub->det = NULL;
  pub->det_hist = NULL;
  pub->det_cls = NULL;
  pub->det_rank = NULL;
  pub->det_cap = NULL;
  pub->det_items = 0;
}
