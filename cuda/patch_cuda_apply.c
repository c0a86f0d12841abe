/* patch_cuda_apply.c - applying a patch to device tensors, whole
 * (pulse_cuda_patch_apply) or while its bytes arrive (pulse_cuda_patch_stream_*):
 * the host decodes each chunk's streams as soon as its bytes are there (on
 * the chunk feed's threads) into the workspace's pinned staging and queues
 * the copy of that chunk's entries to the device at once, so the bus works
 * while the rest downloads; then the device finds positions, gathers old
 * bits, derives the target digests and, once they match, scatters the new
 * bits. Only change lists, their rank form and class counts cross the bus,
 * never the weights. Everything runs on the targets' device and the
 * caller's stream (pulse_cuda_enter_); a steady state (same workspace,
 * steps of similar size) allocates nothing on the device or in pinned
 * memory. */
#include <stdlib.h>
#include <string.h>

#include "chunk_feed_impl.h"
#include "chunk_impl.h"
#include "class_index_impl.h"
#include "cuda_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

#define CHECK(expr)                                                            \
  do {                                                                         \
    st = (expr);                                                               \
    if (st != PULSE_OK)                                                        \
      goto cleanup;                                                            \
  } while (0)

static int same_digest(pulse_tensor_digest x, pulse_tensor_digest y) {
  return x.a == y.a && x.b == y.b;
}

/* One chunk with changes, decoded on a host thread. */
typedef struct {
  size_t tensor;    /* patch table index */
  uint64_t chunk;   /* within the tensor */
  uint64_t at;      /* its first entry in the staged arrays */
  uint64_t hist_at; /* its class counts: index chunk (class model) */
} apply_item;

enum { STREAM_BEGUN = 0, STREAM_FINISHED, STREAM_COMMITTED, STREAM_FAILED };

struct pulse_cuda_patch_stream {
  pulse_cuda_workspace *ws, *temp;
  const pulse_patch *p;
  const pulse_cuda_target *targets;
  size_t count;
  int partial_table;
  void *cuda_stream; /* resolved: never the NULL stream */
  int device;        /* the targets' */
  int state;

  size_t *target;              /* per patch tensor: target index + 1, 0: none */
  pulse_tensor_digest *digest; /* per patch tensor: the base's, then the result's */
  pulse_tensor_digest *other;  /* per target: its digest when known */
  unsigned char *known;        /* per target: `other` holds it */
  pulse_cuda_bf16_tensor *sub; /* the m changed tensors, then scratch */
  size_t *sub_of;
  pulse_tensor_digest *sub_digest;
  size_t *changed;       /* patch indices of the changed tensors */
  uint64_t *entry_first; /* their first entries, m + 1 */
  size_t m;
  uint64_t K; /* changes in all */

  apply_item *items; /* chunks with changes, body order */
  uint64_t *end;     /* per item: offset just past its bytes */
  size_t item_count;
  pulse_status *item_st;
  char (*detail)[200];
  uint64_t *chunk_first; /* per index chunk: its first entry */
  uint64_t *pos;         /* plain model: positions (pinned staging) */
  uint64_t *keys;        /* class model: class << 32 | rank (pinned) */
  uint8_t *cls;          /* class model: class of each entry */
  uint32_t *rank;        /* class model: rank of each entry */
  uint16_t *delta;       /* pinned staging */
  pulse_cuda_class_index *idx; /* class model: counts taken on the device */
  const uint32_t *hist;
  void *pos_d, *keys_d, *chunk_first_d, *delta_d, *old_d, *new_d;
  int staged; /* copies were queued from the pinned staging */
  pulse_chunk_feed *feed;
};

/* Queues the copy of entries [at, at + k) of a decoded chunk: positions or
 * keys, and deltas (on a decode thread; the copies overlap the download). */
static pulse_status upload_entries(pulse_cuda_patch_stream *s, uint64_t at, uint64_t k) {
  if (k == 0)
    return PULSE_OK;
  if (s->p->model == PULSE_POS_PLAIN)
    PULSE_TRY(pulse_cuda_h2d_(s->device, (uint64_t *)s->pos_d + at, s->pos + at,
                              (size_t)k * sizeof *s->pos, s->cuda_stream));
  else
    PULSE_TRY(pulse_cuda_h2d_(s->device, (uint64_t *)s->keys_d + at, s->keys + at,
                              (size_t)k * sizeof *s->keys, s->cuda_stream));
  return pulse_cuda_h2d_(s->device, (uint16_t *)s->delta_d + at, s->delta + at,
                         (size_t)k * sizeof *s->delta, s->cuda_stream);
}

static int decode_one(void *ctx, size_t i) {
  pulse_cuda_patch_stream *s = ctx;
  const apply_item *it = &s->items[i];
  const patch_tensor *tt = &s->p->tensors[it->tensor];
  const uint64_t c = tt->chunk_first + it->chunk;
  const uint32_t k = s->p->chunk_changed[c];
  pulse_status st;
  if (s->p->model == PULSE_POS_PLAIN) {
    st = patch_decode_chunk(s->p, it->tensor, it->chunk, NULL, NULL, s->pos + it->at,
                            s->delta + it->at);
  } else {
    uint32_t start[PULSE_CLASS_COUNT + 1];
    st = pulse_chunk_decode_ranks(s->p->version, s->p->values, PULSE_POS_CLASS,
                                  s->hist + it->hist_at * PULSE_CLASS_COUNT,
                                  patch_chunk_elems(s->p, tt, it->chunk),
                                  s->p->bytes + s->p->chunk_offset[c],
                                  (size_t)s->p->chunk_size[c], k, start,
                                  s->rank + it->at, s->delta + it->at);
    if (st == PULSE_OK) {
      for (unsigned cl = 0; cl < PULSE_CLASS_COUNT; cl++)
        for (uint32_t e = start[cl]; e < start[cl + 1]; e++)
          s->cls[it->at + e] = (uint8_t)cl;
      st = pulse_cuda_locate_keys_(s->idx, it->hist_at, it->hist_at + 1, s->chunk_first,
                                   s->cls, s->rank, s->keys);
    }
    if (st != PULSE_OK) {
      st = pulse_fail(st, "tensor '%s' chunk %llu: %s", tt->info.name,
                      (unsigned long long)it->chunk, pulse_error_detail());
    }
  }
  if (st == PULSE_OK)
    st = upload_entries(s, it->at, k);
  s->item_st[i] = st;
  if (st != PULSE_OK)
    strncpy(s->detail[i], pulse_error_detail(), sizeof s->detail[i] - 1);
  return st == PULSE_OK;
}

static pulse_status check_state(const pulse_patch *p, const pulse_tensor_digest *digest,
                                const pulse_state_digest *want, pulse_status mismatch,
                                const char *which) {
  pulse_state_digest sd;
  pulse_status st = patch_state_digest_of(p, digest, &sd);
  if (st == PULSE_OK && memcmp(sd.bytes, want->bytes, 32) != 0)
    st = pulse_fail(mismatch, "cuda apply: the %s state is not the patch's (step %llu)", which,
                    (unsigned long long)(mismatch == PULSE_ERR_BASE_DIGEST ? p->base_step
                                                                           : p->step));
  return st;
}

/* Digests of the targets `want` marks that are not known yet: one device
 * pass over them. */
static pulse_status fill_digests(pulse_cuda_patch_stream *s, const unsigned char *want) {
  size_t subs = 0;
  for (size_t j = 0; j < s->count; j++) {
    if (s->known[j] || !want[j])
      continue;
    if (s->targets[j].numel > 0 &&
        (s->targets[j].data_d == NULL || (uintptr_t)s->targets[j].data_d % 2))
      return pulse_fail(PULSE_ERR_ARG, "cuda apply: target %zu: NULL or misaligned data", j);
    s->sub[subs].data_d = s->targets[j].data_d;
    s->sub[subs].numel = s->targets[j].numel;
    s->sub_of[subs++] = j;
  }
  if (subs > 0)
    PULSE_TRY(pulse_cuda_digest_in_(s->ws, s->sub, subs, s->sub_digest, s->cuda_stream));
  for (size_t k = 0; k < subs; k++) {
    s->other[s->sub_of[k]] = s->sub_digest[k];
    s->known[s->sub_of[k]] = 1;
  }
  return PULSE_OK;
}

/* Matches the targets to the table by name, as pulse_patch_apply does, and
 * checks that they are the patch's base. */
static pulse_status check_base(pulse_cuda_patch_stream *s) {
  const pulse_patch *p = s->p;
  unsigned char *targeted = calloc(s->count + 1, 1);
  if (targeted == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda apply");
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < p->count; i++) {
    const patch_tensor *t = &p->tensors[i];
    for (size_t j = 0; j < s->count; j++)
      if (s->targets[j].name != NULL && strcmp(s->targets[j].name, t->info.name) == 0) {
        s->target[i] = j + 1;
        break;
      }
    if (s->target[i] == 0) {
      if (!s->partial_table) {
        st = pulse_fail(PULSE_ERR_NOT_FOUND,
                        "cuda apply: the patch changes tensor '%s', which is not among the targets",
                        t->info.name);
        goto cleanup;
      }
      continue;
    }
    const pulse_cuda_target *tg = &s->targets[s->target[i] - 1];
    if (tg->numel != t->numel || (tg->data_d == NULL && t->numel > 0)) {
      st = pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "cuda apply: tensor '%s' has %llu elements in the patch, %llu in the target",
                      t->info.name, (unsigned long long)t->numel, (unsigned long long)tg->numel);
      goto cleanup;
    }
    if ((uintptr_t)tg->data_d % 2 != 0) {
      st = pulse_fail(PULSE_ERR_ARG, "cuda apply: tensor '%s': misaligned data", t->info.name);
      goto cleanup;
    }
    if (t->numel > 0)
      CHECK(pulse_cuda_check_ptr_(tg->data_d, s->device, "cuda apply"));
    targeted[s->target[i] - 1] = 1;
  }
  if (s->ws == NULL) {
    CHECK(pulse_cuda_workspace_create(&s->temp));
    s->ws = s->temp;
  }
  for (size_t j = 0; j < s->count; j++)
    if (s->targets[j].digest != NULL) {
      s->other[j] = *s->targets[j].digest;
      s->known[j] = 1;
    }
  CHECK(fill_digests(s, targeted));
  for (size_t i = 0; i < p->count; i++) {
    if (s->target[i] == 0)
      continue;
    s->digest[i] = s->other[s->target[i] - 1];
    if (!same_digest(s->digest[i], p->tensors[i].base_digest)) {
      st = pulse_fail(PULSE_ERR_BASE_DIGEST,
                      "cuda apply: tensor '%s' is not the patch's base (step %llu)",
                      p->tensors[i].info.name, (unsigned long long)p->base_step);
      goto cleanup;
    }
  }
  if (!s->partial_table)
    CHECK(check_state(p, s->digest, &p->base_digest, PULSE_ERR_BASE_DIGEST, "base"));
cleanup:
  free(targeted);
  return st;
}

/* The changed tensors, their entries, their chunks with changes, and host
 * staging for the decode. */
static pulse_status plan(pulse_cuda_patch_stream *s) {
  const pulse_patch *p = s->p;
  uint64_t items_total = 0;
  for (size_t i = 0; i < p->count; i++) {
    if (s->target[i] == 0 || p->tensors[i].changed == 0)
      continue;
    const patch_tensor *t = &p->tensors[i];
    s->sub[s->m].data_d = s->targets[s->target[i] - 1].data_d;
    s->sub[s->m].numel = t->numel;
    s->changed[s->m] = i;
    s->entry_first[s->m + 1] = s->entry_first[s->m] + t->changed;
    items_total += t->chunk_count;
    s->m++;
  }
  s->K = s->entry_first[s->m];
  if (s->K == 0)
    return PULSE_OK;
  uint64_t K = s->K;
  s->items = calloc(items_total + 1, sizeof *s->items);
  s->end = calloc(items_total + 1, sizeof *s->end);
  s->item_st = calloc(items_total + 1, sizeof *s->item_st);
  s->detail = calloc(items_total + 1, sizeof *s->detail);
  s->chunk_first = calloc(items_total + 1, sizeof *s->chunk_first);
  s->cls = malloc((size_t)K * sizeof *s->cls);
  s->rank = malloc((size_t)K * sizeof *s->rank);
  if (!s->items || !s->end || !s->item_st || !s->detail || !s->chunk_first || !s->cls ||
      !s->rank)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda apply: staging of %llu changes",
                      (unsigned long long)K);
  /* Sized from the patch's table before any byte decodes: the decode
   * threads fill pinned staging and queue copies into these slots. */
  int plain = p->model == PULSE_POS_PLAIN;
  PULSE_TRY(pulse_cuda_pin_get_(s->ws, plain ? PULSE_PIN_POS : PULSE_PIN_KEYS,
                                (size_t)K * sizeof(uint64_t),
                                plain ? (void **)&s->pos : (void **)&s->keys));
  PULSE_TRY(pulse_cuda_pin_get_(s->ws, PULSE_PIN_DELTA, (size_t)K * sizeof *s->delta,
                                (void **)&s->delta));
  s->staged = 1;
  PULSE_TRY(pulse_cuda_ws_slot_(s->ws, PULSE_WS_X_POS, K, sizeof(uint64_t), &s->pos_d));
  PULSE_TRY(pulse_cuda_ws_slot_(s->ws, PULSE_WS_X_DELTA, K, sizeof(uint16_t), &s->delta_d));
  PULSE_TRY(pulse_cuda_ws_slot_(s->ws, PULSE_WS_X_OLD, K, sizeof(uint16_t), &s->old_d));
  PULSE_TRY(pulse_cuda_ws_slot_(s->ws, PULSE_WS_X_NEW, K, sizeof(uint16_t), &s->new_d));
  if (!plain)
    PULSE_TRY(pulse_cuda_ws_slot_(s->ws, PULSE_WS_X_KEYS, K, sizeof(uint64_t), &s->keys_d));
  /* Index chunks: every chunk of the changed tensors, in order (the class
   * index numbers them the same way). */
  uint64_t g = 0;
  for (size_t l = 0; l < s->m; l++) {
    const patch_tensor *t = &p->tensors[s->changed[l]];
    for (uint64_t j = 0; j < t->chunk_count; j++, g++) {
      uint64_t c = t->chunk_first + j;
      uint64_t at = s->entry_first[l] + p->chunk_before[c];
      s->chunk_first[g] = at;
      if (p->chunk_changed[c] != 0) {
        s->items[s->item_count] = (apply_item){s->changed[l], j, at, g};
        s->end[s->item_count++] = p->chunk_offset[c] + p->chunk_size[c];
      }
    }
  }
  s->chunk_first[g] = K;
  if (p->model == PULSE_POS_CLASS) {
    /* The class counts come from the base on the device, before any chunk
     * decodes (version 1 codes with them; both check ranks against them),
     * in the workspace's index slots. */
    uint64_t chunks = 0, *first_h = NULL;
    PULSE_TRY(pulse_cuda_class_index_build_in_(s->ws, s->sub, s->m, p->chunk_log2,
                                               s->cuda_stream, &s->idx));
    s->hist = pulse_cuda_class_index_hist(s->idx, &chunks);
    if (chunks != items_total)
      return pulse_fail(PULSE_ERR_INTERNAL, "cuda apply: %llu index chunks, %llu in the patch",
                        (unsigned long long)chunks, (unsigned long long)items_total);
    size_t bytes = (size_t)(chunks + 1) * sizeof(uint64_t);
    PULSE_TRY(pulse_cuda_pin_get_(s->ws, PULSE_PIN_CHUNKS, bytes, (void **)&first_h));
    memcpy(first_h, s->chunk_first, bytes);
    PULSE_TRY(pulse_cuda_ws_get_(s->ws, PULSE_WS_X_CHUNK_FIRST, bytes, &s->chunk_first_d));
    PULSE_TRY(pulse_cuda_h2d_(s->device, s->chunk_first_d, first_h, bytes, s->cuda_stream));
    PULSE_TRY(pulse_cuda_pin_queued_(s->ws, PULSE_PIN_CHUNKS, s->cuda_stream));
  }
  return PULSE_OK;
}

pulse_status pulse_cuda_patch_stream_begin(pulse_cuda_workspace *ws, const pulse_patch *p,
                                           const pulse_cuda_target *targets, size_t count,
                                           const pulse_apply_opts *opts, void *stream,
                                           pulse_cuda_patch_stream **out) {
  pulse_apply_opts defaults;
  pulse_apply_opts_init(&defaults);
  if (opts == NULL)
    opts = &defaults;
  if (out != NULL)
    *out = NULL;
  if (out == NULL || p == NULL || (targets == NULL && count > 0))
    return pulse_fail(PULSE_ERR_ARG, "cuda apply: NULL patch, targets or output");
  /* class_index: host targets only */
  PULSE_TRY(PULSE_OPTS_CHECK("cuda apply", opts, PULSE_APPLY_OPTS_VERSION));
  const size_t n = p->count, wide = (n > count ? n : count) + 1;
  pulse_cuda_patch_stream *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "cuda apply");
  s->ws = ws;
  s->p = p;
  s->targets = targets;
  s->count = count;
  s->partial_table = opts->partial_table;
  s->device = -1;
  s->target = calloc(n + 1, sizeof *s->target);
  s->digest = calloc(n + 1, sizeof *s->digest);
  s->other = calloc(count + 1, sizeof *s->other);
  s->known = calloc(count + 1, 1);
  s->sub = calloc(wide, sizeof *s->sub);
  s->sub_of = calloc(wide, sizeof *s->sub_of);
  s->sub_digest = calloc(wide, sizeof *s->sub_digest);
  s->changed = calloc(n + 1, sizeof *s->changed);
  s->entry_first = calloc(n + 1, sizeof *s->entry_first);
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  const void *first_d = NULL;
  at.previous = -1;
  if (!s->target || !s->digest || !s->other || !s->known || !s->sub || !s->sub_of ||
      !s->sub_digest || !s->changed || !s->entry_first) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda apply: staging for %zu tensors", n);
    goto cleanup;
  }
  for (size_t j = 0; j < count && first_d == NULL; j++)
    if (targets[j].numel > 0)
      first_d = targets[j].data_d;
  /* The targets' device and the resolved stream, for every later step. */
  CHECK(pulse_cuda_enter_(ws, first_d, stream, "cuda apply", &at));
  s->device = at.device;
  s->cuda_stream = at.stream;
  CHECK(check_base(s));
  CHECK(plan(s));
  CHECK(pulse_chunk_feed_start(s->item_count, s->end, p->size, opts->threads, 0, decode_one,
                               s, &s->feed));
cleanup:
  pulse_cuda_leave_(&at);
  if (st != PULSE_OK) {
    pulse_cuda_patch_stream_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

void pulse_cuda_patch_stream_feed(pulse_cuda_patch_stream *s, size_t avail) {
  if (s != NULL)
    pulse_chunk_feed_bytes(s->feed, avail);
}

/* The decode threads are done queueing copies from the pinned staging: the
 * next call that takes it waits for those copies (an event), not for the
 * device. */
static pulse_status release_staging(pulse_cuda_patch_stream *s) {
  if (!s->staged)
    return PULSE_OK;
  s->staged = 0;
  PULSE_TRY(pulse_cuda_pin_queued_(s->ws, PULSE_PIN_POS, s->cuda_stream));
  PULSE_TRY(pulse_cuda_pin_queued_(s->ws, PULSE_PIN_KEYS, s->cuda_stream));
  return pulse_cuda_pin_queued_(s->ws, PULSE_PIN_DELTA, s->cuda_stream);
}

/* Positions on the device, then old bits, new bits and digest moves; the
 * result must be the patch's target. */
static pulse_status finish_on_device(pulse_cuda_patch_stream *s) {
  const pulse_patch *p = s->p;
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  at.previous = -1;
  CHECK(pulse_cuda_reenter_(s->device, s->cuda_stream, &at));
  if (s->K > 0) {
    /* Every chunk's entries were queued by the decode threads. */
    CHECK(release_staging(s));
    if (p->model == PULSE_POS_CLASS)
      CHECK(pulse_cuda_locate_in_(s->idx, s->chunk_first_d, s->keys_d, s->K, s->pos_d,
                                  s->cuda_stream));
    CHECK(pulse_cuda_gather_(s->ws, s->sub, s->m, s->entry_first, s->pos_d, s->delta_d,
                             s->old_d, s->new_d, s->cuda_stream));
    CHECK(pulse_cuda_changes_digest_in_(s->ws, s->entry_first, s->m, s->pos_d, s->old_d,
                                        s->new_d, s->sub_digest, s->cuda_stream));
    for (size_t l = 0; l < s->m; l++) {
      s->digest[s->changed[l]].a += s->sub_digest[l].a;
      s->digest[s->changed[l]].b += s->sub_digest[l].b;
    }
  }
  for (size_t i = 0; i < p->count; i++)
    if (s->target[i] != 0 && !same_digest(s->digest[i], p->tensors[i].target_digest)) {
      st = pulse_fail(PULSE_ERR_TARGET_DIGEST,
                      "cuda apply: tensor '%s' would not match the target of step %llu",
                      p->tensors[i].info.name, (unsigned long long)p->step);
      goto cleanup;
    }
  if (!s->partial_table)
    CHECK(check_state(p, s->digest, &p->target_digest, PULSE_ERR_TARGET_DIGEST, "resulting"));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

pulse_status pulse_cuda_patch_stream_finish(pulse_cuda_patch_stream *s) {
  if (s == NULL || s->state != STREAM_BEGUN)
    return pulse_fail(PULSE_ERR_ARG, "cuda apply: NULL stream, or finished or failed already");
  uint64_t avail = pulse_chunk_feed_fed(s->feed);
  if (avail < s->p->size)
    return pulse_fail(PULSE_ERR_TRUNCATED, "cuda apply: %llu of %zu bytes arrived",
                      (unsigned long long)avail, s->p->size);
  s->state = STREAM_FAILED;
  if (!pulse_chunk_feed_wait(s->feed)) {
    /* The first failed chunk in body order; the later ones stay undecoded. */
    for (size_t i = 0; i < s->item_count; i++)
      if (s->item_st[i] != PULSE_OK)
        return pulse_fail(s->item_st[i], "cuda apply: %s", s->detail[i]);
    return pulse_fail(PULSE_ERR_INTERNAL, "cuda apply: a chunk was not decoded");
  }
  PULSE_TRY(finish_on_device(s));
  s->state = STREAM_FINISHED;
  return PULSE_OK;
}

pulse_status pulse_cuda_patch_stream_commit(pulse_cuda_patch_stream *s,
                                            pulse_tensor_digest *digests) {
  if (s == NULL || s->state != STREAM_FINISHED)
    return pulse_fail(PULSE_ERR_ARG, "cuda apply: commit before a successful finish");
  pulse_cuda_at at;
  PULSE_TRY(pulse_cuda_reenter_(s->device, s->cuda_stream, &at));
  /* One scatter for every changed tensor. */
  if (s->K > 0) {
    pulse_status st = pulse_cuda_scatter_in_(s->ws, s->sub, s->m, s->entry_first, s->pos_d,
                                             s->new_d, s->cuda_stream);
    if (st != PULSE_OK) {
      s->state = STREAM_FAILED;
      pulse_cuda_leave_(&at);
      return st;
    }
  }
  s->state = STREAM_COMMITTED;
  if (digests == NULL) {
    pulse_cuda_leave_(&at);
    return PULSE_OK;
  }
  /* Untouched targets' digests, when not known, cost one more pass. */
  unsigned char *all = malloc(s->count + 1);
  pulse_status st = PULSE_OK;
  if (all == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "cuda apply: digests");
  } else {
    memset(all, 1, s->count + 1);
    st = fill_digests(s, all);
    free(all);
  }
  pulse_cuda_leave_(&at);
  if (st != PULSE_OK)
    return st;
  for (size_t j = 0; j < s->count; j++)
    digests[j] = s->other[j];
  for (size_t i = 0; i < s->p->count; i++)
    if (s->target[i] != 0)
      digests[s->target[i] - 1] = s->digest[i];
  return PULSE_OK;
}

pulse_status pulse_cuda_patch_stream_changes_(const pulse_cuda_patch_stream *s, size_t tensor,
                                              const uint64_t **pos_d, const uint16_t **new_d,
                                              uint64_t *count) {
  if (pos_d == NULL || new_d == NULL || count == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda apply: NULL output");
  *pos_d = NULL;
  *new_d = NULL;
  *count = 0;
  if (s == NULL || s->state != STREAM_FINISHED || tensor >= s->p->count)
    return pulse_fail(PULSE_ERR_ARG,
                      "cuda apply: changes asked of a stream not finished, or of no tensor");
  for (size_t l = 0; l < s->m; l++)
    if (s->changed[l] == tensor) {
      *count = s->entry_first[l + 1] - s->entry_first[l];
      if (*count > 0) {
        *pos_d = (const uint64_t *)s->pos_d + s->entry_first[l];
        *new_d = (const uint16_t *)s->new_d + s->entry_first[l];
      }
      break;
    }
  return PULSE_OK;
}

void pulse_cuda_patch_stream_free(pulse_cuda_patch_stream *s) {
  if (s == NULL)
    return;
  pulse_chunk_feed_free(s->feed); /* first: its threads use the staging */
  pulse_cuda_at at;
  at.previous = -1;
  if (s->device >= 0 && pulse_cuda_reenter_(s->device, s->cuda_stream, &at) == PULSE_OK)
    (void)release_staging(s); /* stopped early: copies may be in flight */
  pulse_cuda_class_index_free(s->idx);
  pulse_cuda_workspace_free(s->temp);
  pulse_cuda_leave_(&at);
  free(s->target), free(s->digest), free(s->other), free(s->known), free(s->sub),
      free(s->sub_of);
  free(s->sub_digest), free(s->changed), free(s->entry_first), free(s->items), free(s->end),
      free(s->item_st), free(s->detail);
  free(s->chunk_first), free(s->cls), free(s->rank);
  free(s);
}

pulse_status pulse_cuda_patch_apply(pulse_cuda_workspace *ws, const pulse_patch *p,
                                    const pulse_cuda_target *targets, size_t count,
                                    const pulse_apply_opts *opts, void *stream,
                                    pulse_tensor_digest *digests) {
  pulse_cuda_patch_stream *s = NULL;
  PULSE_TRY(pulse_cuda_patch_stream_begin(ws, p, targets, count, opts, stream, &s));
  pulse_cuda_patch_stream_feed(s, p->size);
  pulse_status st = pulse_cuda_patch_stream_finish(s);
  if (st == PULSE_OK)
    st = pulse_cuda_patch_stream_commit(s, digests);
  pulse_cuda_patch_stream_free(s);
  return st;
}
