/* patch_stream.c - staging a patch while its bytes arrive
 * (pulse_codec_stream.h).
 *
 * The same transaction as pulse_patch_stage (patch_decode.c), cut where the
 * bytes arrive: begin checks the base, decode threads take the chunks in
 * body order and wait until feed says a chunk's last byte is there, and
 * finish checks the target digests. Each decode thread also folds its
 * chunk's changes into a per-chunk digest difference (the tensor digest is
 * additive), so finish only adds them up. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk_feed_impl.h"
#include "chunk_impl.h"
#include "class_index_impl.h"
#include "digest_impl.h"
#include "hugepage_impl.h"
#include "parallel_impl.h"
#include "patch_changes_impl.h"
#include "patch_impl.h"
#include "pulse_codec_stream.h"
#include "pulse_elem.h"
#include "slab_cache_impl.h"
#include "status_impl.h"

typedef struct {
  size_t tensor;
  uint64_t chunk;
} stream_item;

typedef struct {
  pulse_tensor_digest delta; /* digest change of the chunk's changes */
  pulse_status st;
  int decoded; /* decode_item ran */
  double seconds;
  char detail[200];
} item_result;

struct pulse_patch_stream {
  const pulse_patch *p;
  int partial_table;
  pulse_host_tensor **target; /* per patch tensor, NULL when absent */
  pulse_changes *staged;      /* per patch tensor: slices of `slab` */
  uint32_t *rank;             /* per patch tensor: decode scratch in `slab` */
  uint16_t *cdelta;           /* (chunk slices as in `staged`) */
  size_t *scratch_at;         /* per patch tensor: its scratch's first slot */
  void *slab;                 /* the staging of every tensor, one block */
  size_t slab_bytes;          /* its size, to give it back (slab_cache.c) */
  pulse_class_index **index;  /* per patch tensor: its target's index when
                                 that describes the base, else NULL */
  pulse_tensor_digest
      *digest;        /* per patch tensor: the base's, then the result's */
  stream_item *items; /* chunks with changes of targeted tensors, body order */
  uint64_t *end;      /* per item: offset just past its bytes */
  item_result *result;
  uintptr_t *decoder; /* per item, in commit order (the reverse of the
                         items': item_of): the thread that decoded it,
                         whose caches hold its lines for the commit
                         (parallel_impl.h) */
  size_t nitems;
  pulse_chunk_feed *feed; /* the decode threads */
  double t_begin;
  int failed; /* finish failed: the stream can only be freed */
  int threads;  /* asked for (0: one per core), also for commit */
  int finished; /* 1: finish returned PULSE_OK, 2: data committed */
  int indexes_done; /* the class indexes follow the commit */
  pulse_patch_stream_figures times;
};

/* The item that comes i-th in the commit: the items in the reverse of the
 * order the decode threads took them, so the chunks decoded last, whose
 * target lines and staging are still in cache, are written first (the
 * decode read every line the commit writes; in decode order, the commit
 * found the lines of the first chunks evicted by the later ones, and then
 * the later ones' by its own). Its own inverse: item i comes
 * item_of(s, i)-th. */
static size_t item_of(const pulse_patch_stream *s, size_t i) { return s->nitems - 1 - i; }

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

pulse_status pulse_patch_stream_need(const uint8_t *bytes, size_t avail,
                                     size_t *need) {
  if (need == NULL || (bytes == NULL && avail > 0))
    return pulse_fail(PULSE_ERR_ARG, "patch stream: NULL argument");
  size_t magic = avail < 8 ? avail : 8;
  if (memcmp(bytes, PULSE_PATCH_MAGIC, magic) != 0)
    return pulse_fail(PULSE_ERR_MAGIC, "patch: bad magic (not a pulse patch)");
  if (avail >= 10) {
    unsigned version = (unsigned)bytes[8] | (unsigned)bytes[9] << 8;
    if (version > PULSE_PATCH_VERSION_MAX)
      return pulse_fail(
          PULSE_ERR_VERSION,
          "patch: format version %u is newer than this decoder (%u..%u)",
          version, (unsigned)PULSE_PATCH_VERSION_MIN,
          (unsigned)PULSE_PATCH_VERSION_MAX);
    if (version < PULSE_PATCH_VERSION_MIN)
      return pulse_fail(PULSE_ERR_VERSION,
                        "patch: format version %u, this decoder knows %u..%u",
                        version, (unsigned)PULSE_PATCH_VERSION_MIN,
                        (unsigned)PULSE_PATCH_VERSION_MAX);
  }
  if (avail < PULSE_PATCH_FIXED_HEADER) {
    *need = PULSE_PATCH_FIXED_HEADER;
    return PULSE_OK;
  }
  uint64_t table = (uint64_t)bytes[12] | (uint64_t)bytes[13] << 8 |
                   (uint64_t)bytes[14] << 16 | (uint64_t)bytes[15] << 24;
  *need = (size_t)(PULSE_PATCH_FIXED_HEADER + table);
  return PULSE_OK;
}

/* Decodes item i into staging; its changes' digest difference on the side. */
static int decode_item(void *ctx, size_t i) {
  pulse_patch_stream *s = ctx;
  double t0 = now_s();
  const pulse_patch *p = s->p;
  const stream_item *it = &s->items[i];
  item_result *r = &s->result[i];
  const patch_tensor *t = &p->tensors[it->tensor];
  uint64_t c = t->chunk_first + it->chunk;
  uint64_t at = p->chunk_before[c], k = p->chunk_changed[c];
  pulse_changes *ch = &s->staged[it->tensor];
  const uint16_t *base = s->target[it->tensor]->data;
  size_t sat = s->scratch_at[it->tensor] + at;
  /* Through a class index the decode reads the old bits itself. The index
   * goes to the decode only when it is used, so the decode cannot take the
   * other path than the one whose old bits are resolved below. */
  int indexed = s->index[it->tensor] != NULL && patch_can_use_index(p);
  pulse_chunk_scratch scratch = {s->rank + sat, s->cdelta + sat,
                                 indexed ? ch->old_bits + at : NULL};
  r->st = patch_decode_chunk_in(p, it->tensor, it->chunk, base,
                                indexed ? s->index[it->tensor] : NULL, ch->pos + at,
                                ch->new_bits + at, &scratch);
  if (r->st != PULSE_OK)
    strncpy(r->detail, pulse_error_detail(), sizeof r->detail - 1);
  else if (indexed)
    r->delta = pulse_digest_change_sum(ch->pos + at, ch->old_bits + at, ch->new_bits + at, k);
  else
    r->delta = patch_resolve_chunk(base, ch, at, at + k);
  r->seconds = now_s() - t0;
  s->decoder[item_of(s, i)] = pulse_parallel_self();
  r->decoded = 1;
  return r->st == PULSE_OK;
}

/* The staging of every targeted tensor in one block of 18 bytes per
 * change, sliced per tensor: positions, the decoder's ranks, then old bits,
 * new bits and the decoder's class-major deltas. One block, on huge pages
 * (a fault per 2 MiB, not per 4 KiB: per tensor, the arrays of a 1 M-change
 * step cost more in page faults than its decode), and the last apply's
 * block again when it is large enough (slab_cache.c: no faults at all). */
static pulse_status stage_alloc(pulse_patch_stream *s) {
  const pulse_patch *p = s->p;
  uint64_t total = 0;
  for (size_t i = 0; i < p->count; i++)
    if (s->target[i] != NULL)
      total += p->tensors[i].changed; /* <= the table's total: no overflow */
  if (total > SIZE_MAX / 32)
    return pulse_fail(PULSE_ERR_OVERFLOW, "apply: %llu changes", (unsigned long long)total);
  s->slab = pulse_slab_take((size_t)total * 18 + 8, &s->slab_bytes); /* + 8: never 0 bytes */
  if (s->slab == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "apply: staging for %llu changes",
                      (unsigned long long)total);
  uint64_t *pos = s->slab;
  s->rank = (uint32_t *)(pos + total);
  uint16_t *old_bits = (uint16_t *)(s->rank + total), *new_bits = old_bits + total;
  s->cdelta = new_bits + total;
  size_t at = 0;
  for (size_t i = 0; i < p->count; i++) {
    uint64_t k = p->tensors[i].changed;
    if (s->target[i] == NULL || k == 0)
      continue;
    s->staged[i] = (pulse_changes){0, k, pos + at, old_bits + at, new_bits + at};
    s->scratch_at[i] = at;
    at += (size_t)k;
  }
  return PULSE_OK;
}

void pulse_patch_stream_free(pulse_patch_stream *s) {
  if (s == NULL)
    return;
  pulse_chunk_feed_free(s->feed);
  pulse_slab_give(s->slab, s->slab_bytes); /* the staged changes' arrays */
  free(s->scratch_at), free(s->target), free(s->staged), free(s->index), free(s->digest),
      free(s->items), free(s->end), free(s->result), free(s->decoder);
  free(s);
}

static void digest_one(void *ctx, size_t i) {
  pulse_patch_stream *s = ctx;
  pulse_host_tensor *tg = s->target[i];
  if (tg != NULL)
    s->digest[i] =
        tg->digest ? *tg->digest : pulse_digest_bf16(tg->data, tg->numel);
}

/* Matches the targets to the table and checks that they are the patch's
 * base, as pulse_patch_stage does. */
static pulse_status check_base(pulse_patch_stream *s,
                               pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts) {
  const pulse_patch *p = s->p;
  for (size_t i = 0; i < p->count; i++) {
    const patch_tensor *t = &p->tensors[i];
    for (size_t j = 0; j < count; j++)
      if (targets[j].name != NULL &&
          strcmp(targets[j].name, t->info.name) == 0) {
        s->target[i] = &targets[j];
        break;
      }
    if (s->target[i] == NULL) {
      if (!opts->partial_table)
        return pulse_fail(PULSE_ERR_NOT_FOUND,
                          "apply: the patch changes tensor '%s', which is not "
                          "among the targets",
                          t->info.name);
      continue;
    }
    if (s->target[i]->numel != t->numel ||
        (s->target[i]->data == NULL && t->numel > 0))
      return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                        "apply: tensor '%s' has %llu elements in the patch, "
                        "%llu in the target",
                        t->info.name, (unsigned long long)t->numel,
                        (unsigned long long)s->target[i]->numel);
  }
  /* Digests the targets that come without one (a pass over each), on the
   * threads; a receiver's come with theirs, and waking threads to copy
   * them cost more than the copies (0.06 ms an apply on two threads). */
  size_t uncached = 0;
  for (size_t i = 0; i < p->count; i++)
    uncached += s->target[i] != NULL && s->target[i]->digest == NULL;
  pulse_parallel_for(uncached > 0 ? opts->threads : 1, p->count, digest_one, s);
  for (size_t i = 0; i < p->count; i++) {
    if (s->target[i] == NULL)
      continue;
    if (s->digest[i].a != p->tensors[i].base_digest.a ||
        s->digest[i].b != p->tensors[i].base_digest.b)
      return pulse_fail(
          PULSE_ERR_BASE_DIGEST,
          "apply: tensor '%s' is not the patch's base (step %llu)",
          p->tensors[i].info.name, (unsigned long long)p->base_step);
  }
  if (!opts->partial_table) {
    pulse_state_digest sd;
    PULSE_TRY(patch_state_digest_of(p, s->digest, &sd));
    if (memcmp(sd.bytes, p->base_digest.bytes, 32) != 0)
      return pulse_fail(
          PULSE_ERR_BASE_DIGEST,
          "apply: the base state is not the patch's base (step %llu)",
          (unsigned long long)p->base_step);
  }
  for (size_t i = 0; i < p->count; i++) {
    if (s->target[i] == NULL)
      continue;
    pulse_class_index *ix =
        pulse_apply_opts_index(opts, (size_t)(s->target[i] - targets));
    if (pulse_class_index_matches(ix, s->target[i]->numel, s->digest[i]))
      s->index[i] = ix;
  }
  return PULSE_OK;
}

typedef struct {
  uint64_t changes;
  size_t body; /* the item's place in body order */
} item_key;

static int by_changes_descending(const void *a, const void *b) {
  const item_key *x = a, *y = b;
  if (x->changes != y->changes)
    return x->changes > y->changes ? -1 : 1;
  return x->body < y->body ? -1 : x->body > y->body; /* total: body order */
}

/* With every byte there, the threads take the largest chunks first: in body
 * order the last chunks (often the output head's, the largest) started
 * when the others were nearly done, and one thread finished them alone.
 * Streamed bytes keep body order, the order they arrive in. Without memory
 * for the keys the order stays as it is. */
static void order_largest_first(pulse_patch_stream *s) {
  item_key *key = malloc((s->nitems + 1) * sizeof *key);
  stream_item *sorted = malloc((s->nitems + 1) * sizeof *sorted);
  if (key != NULL && sorted != NULL) {
    for (size_t i = 0; i < s->nitems; i++) {
      const stream_item *it = &s->items[i];
      key[i].changes = s->p->chunk_changed[s->p->tensors[it->tensor].chunk_first + it->chunk];
      key[i].body = i;
    }
    qsort(key, s->nitems, sizeof *key, by_changes_descending);
    for (size_t i = 0; i < s->nitems; i++)
      sorted[i] = s->items[key[i].body];
    memcpy(s->items, sorted, s->nitems * sizeof *sorted);
    for (size_t i = 0; i < s->nitems; i++)
      s->end[i] = s->p->size; /* all there */
  }
  free(key), free(sorted);
}

pulse_status pulse_patch_stream_begin(const pulse_patch *p,
                                      pulse_host_tensor *targets, size_t count,
                                      const pulse_apply_opts *opts,
                                      pulse_patch_stream **out) {
  return patch_stream_begin(p, targets, count, opts, 0, out);
}

pulse_status patch_stream_begin(const pulse_patch *p,
                                pulse_host_tensor *targets, size_t count,
                                const pulse_apply_opts *opts, int whole,
                                pulse_patch_stream **out) {
  pulse_apply_opts defaults;
  pulse_apply_opts_init(&defaults);
  if (opts == NULL)
    opts = &defaults;
  if (out == NULL || p == NULL || (targets == NULL && count > 0))
    return pulse_fail(PULSE_ERR_ARG, "patch stream: NULL patch or targets");
  PULSE_TRY(PULSE_OPTS_CHECK("patch stream", opts, PULSE_APPLY_OPTS_VERSION));
  *out = NULL;
  size_t n = p->count;
  pulse_patch_stream *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "patch stream");
  s->p = p;
  s->partial_table = opts->partial_table;
  s->threads = opts->threads;
  s->t_begin = now_s();
  s->target = calloc(n + 1, sizeof *s->target);
  s->staged = calloc(n + 1, sizeof *s->staged);
  s->scratch_at = calloc(n + 1, sizeof *s->scratch_at);
  s->index = calloc(n + 1, sizeof *s->index);
  s->digest = calloc(n + 1, sizeof *s->digest);
  s->items = calloc(p->chunks + 1, sizeof *s->items);
  s->end = calloc(p->chunks + 1, sizeof *s->end);
  s->result = calloc(p->chunks + 1, sizeof *s->result);
  s->decoder = calloc(p->chunks + 1, sizeof *s->decoder);
  pulse_status st = PULSE_OK;
  if (!s->target || !s->staged || !s->scratch_at || !s->index || !s->digest || !s->items ||
      !s->end || !s->result || !s->decoder)
    st =
        pulse_fail(PULSE_ERR_NOMEM, "patch stream: staging for %zu tensors", n);
  if (st == PULSE_OK)
    st = check_base(s, targets, count, opts);
  s->times.verify_seconds = now_s() - s->t_begin;

  /* Staging, and the chunks to decode in body order (the table's order). */
  if (st == PULSE_OK)
    st = stage_alloc(s);
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    const patch_tensor *t = &p->tensors[i];
    if (s->target[i] == NULL || t->changed == 0)
      continue;
    for (uint64_t j = 0; j < t->chunk_count && st == PULSE_OK; j++) {
      uint64_t c = t->chunk_first + j;
      if (p->chunk_changed[c] == 0)
        continue;
      s->items[s->nitems].tensor = i;
      s->items[s->nitems].chunk = j;
      s->end[s->nitems++] = p->chunk_offset[c] + p->chunk_size[c];
    }
  }
  if (st == PULSE_OK && whole)
    order_largest_first(s);
  if (st == PULSE_OK)
    st = pulse_chunk_feed_start(s->nitems, s->end, p->size, opts->threads, whole,
                                decode_item, s, &s->feed);
  if (st != PULSE_OK) {
    pulse_patch_stream_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

void pulse_patch_stream_feed(pulse_patch_stream *s, size_t avail) {
  if (s != NULL)
    pulse_chunk_feed_bytes(s->feed, avail);
}

static int body_before(const stream_item *a, const stream_item *b) {
  return a->tensor < b->tensor || (a->tensor == b->tensor && a->chunk < b->chunk);
}

/* The failed item first in body order, or s->nitems. */
static size_t first_failed(const pulse_patch_stream *s) {
  size_t first = s->nitems;
  for (size_t i = 0; i < s->nitems; i++)
    if (s->result[i].decoded && s->result[i].st != PULSE_OK &&
        (first == s->nitems || body_before(&s->items[i], &s->items[first])))
      first = i;
  return first;
}

pulse_status pulse_patch_stream_finish(pulse_patch_stream *s) {
  if (s == NULL || s->finished || s->failed)
    return pulse_fail(PULSE_ERR_ARG, "patch stream: NULL, already finished or failed");
  const pulse_patch *p = s->p;
  uint64_t avail = pulse_chunk_feed_fed(s->feed);
  if (avail < p->size)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "patch stream: %llu of %zu bytes arrived",
                      (unsigned long long)avail, p->size);
  int all = pulse_chunk_feed_wait(s->feed);
  double t0 = now_s();
  for (size_t i = 0; i < s->nitems; i++)
    s->times.decode_seconds += s->result[i].seconds;
  /* After a failure the items not yet taken stay undecoded. The first
   * failing chunk in body order is reported, whatever the threads and the
   * order they took chunks in: the chunks before the first failure seen
   * that no thread took are decoded now (a hostile patch pays for it). */
  if (!all) {
    size_t first = first_failed(s);
    for (size_t i = 0; first < s->nitems && i < s->nitems; i++)
      if (!s->result[i].decoded && body_before(&s->items[i], &s->items[first]))
        decode_item(s, i);
    first = first_failed(s);
    s->failed = 1;
    if (first < s->nitems)
      return pulse_fail(s->result[first].st, "apply: %s", s->result[first].detail);
    return pulse_fail(PULSE_ERR_INTERNAL, "apply: a chunk was not decoded");
  }
  pulse_chunk_feed_times ft = pulse_chunk_feed_times_get(s->feed);
  s->times.decode_wall_seconds = ft.done - s->t_begin;
  s->times.tail_seconds = ft.done > ft.last_byte ? ft.done - ft.last_byte : 0;

  /* The result must be the patch's target, before anything is written. */
  for (size_t i = 0; i < s->nitems; i++) {
    pulse_tensor_digest *d = &s->digest[s->items[i].tensor];
    d->a += s->result[i].delta.a;
    d->b += s->result[i].delta.b;
  }
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < p->count && st == PULSE_OK; i++) {
    if (s->target[i] == NULL)
      continue;
    s->staged[i].count = p->tensors[i].changed;
    if (s->digest[i].a != p->tensors[i].target_digest.a ||
        s->digest[i].b != p->tensors[i].target_digest.b)
      st = pulse_fail(
          PULSE_ERR_TARGET_DIGEST,
          "apply: tensor '%s' would not match the target of step %llu",
          p->tensors[i].info.name, (unsigned long long)p->step);
  }
  if (st == PULSE_OK && !s->partial_table) {
    pulse_state_digest sd;
    st = patch_state_digest_of(p, s->digest, &sd);
    if (st == PULSE_OK && memcmp(sd.bytes, p->target_digest.bytes, 32) != 0)
      st = pulse_fail(
          PULSE_ERR_TARGET_DIGEST,
          "apply: the result would not match the target state of step %llu",
          (unsigned long long)p->step);
  }
  s->times.verify_seconds += now_s() - t0;
  if (st != PULSE_OK) {
    s->failed = 1;
    return st;
  }
  s->finished = 1;
  return PULSE_OK;
}

#define COMMIT_FAR 128u

/* Writes the changes of the i-th item in commit order (one chunk). */
static void commit_item(void *ctx, size_t i) {
  pulse_patch_stream *s = ctx;
  const stream_item *it = &s->items[item_of(s, i)];
  const patch_tensor *t = &s->p->tensors[it->tensor];
  uint64_t c = t->chunk_first + it->chunk;
  uint64_t at = s->p->chunk_before[c], k = s->p->chunk_changed[c];
  uint16_t *data = s->target[it->tensor]->data;
  const pulse_changes *ch = &s->staged[it->tensor];
  /* The lines written are mostly out of cache: each store waits for its
   * line, and a full store buffer stalls the loop. They are asked for
   * COMMIT_FAR stores early, into L2 and to read (prefetcht2): a line only
   * this thread holds arrives writable, and L2 keeps many more misses in
   * flight than L1's few buffers that a write prefetch (prefetchw, 32
   * ahead before) holds (5e7 synthetic, one thread: about 2 ms less of a
   * 20 ms apply). */
  uint64_t end = at + k, j = at;
  for (uint64_t f = at; f < end && f < at + COMMIT_FAR; f++)
    __builtin_prefetch(data + ch->pos[f], 0, 1);
  for (; j + COMMIT_FAR < end; j++) {
    __builtin_prefetch(data + ch->pos[j + COMMIT_FAR], 0, 1);
    data[ch->pos[j]] = ch->new_bits[j];
  }
  for (; j < end; j++)
    data[ch->pos[j]] = ch->new_bits[j];
}

/* Moves the changes of the i-th item in commit order (one chunk) in its
 * tensor's class index. */
static void index_item(void *ctx, size_t i) {
  pulse_patch_stream *s = ctx;
  const stream_item *it = &s->items[item_of(s, i)];
  pulse_class_index *ix = s->index[it->tensor];
  if (ix == NULL)
    return;
  const patch_tensor *t = &s->p->tensors[it->tensor];
  uint64_t c = t->chunk_first + it->chunk;
  uint64_t at = s->p->chunk_before[c], k = s->p->chunk_changed[c];
  const pulse_changes *ch = &s->staged[it->tensor];
  pulse_class_index_move(ix, ch->pos + at, ch->old_bits + at,
                         ch->new_bits + at, k);
}

/* The indexes describe the committed data from now on. */
static void indexes_follow(pulse_patch_stream *s) {
  for (size_t i = 0; i < s->p->count; i++)
    if (s->index[i] != NULL)
      s->index[i]->digest = s->p->tensors[i].target_digest;
}

void pulse_patch_stream_commit_data(pulse_patch_stream *s) {
  if (s == NULL || !s->finished)
    return;
  /* Callers hold readers off while this runs: chunks are written in
   * parallel (disjoint positions) when there are enough changes. */
  int threads = s->p->total_changed >= ((uint64_t)1 << 16) ? s->threads : 1;
  pulse_parallel_for_affine(threads, s->nitems, s->decoder, commit_item, s);
  s->finished = 2; /* committed: a second commit writes the same bits */
}

void pulse_patch_stream_commit_indexes(pulse_patch_stream *s) {
  if (s == NULL || s->finished != 2 || s->indexes_done)
    return; /* after the data; the moves, unlike the writes, happen once */
  s->indexes_done = 1;
  int threads = s->p->total_changed >= ((uint64_t)1 << 16) ? s->threads : 1;
  /* An index is updated per block: chunks smaller than a block share one. */
  if (s->p->chunk_log2 < PULSE_CLASS_BLOCK_LOG2)
    threads = 1;
  pulse_parallel_for_affine(threads, s->nitems, s->decoder, index_item, s);
  indexes_follow(s);
}

/* Writes item i's changes and moves them in its index at once: the moves
 * read the chunk's staging while the writes have just brought it into
 * cache (as two passes, the moves read every change's bits back from
 * memory to find the few whose class changes). */
static void commit_and_index_item(void *ctx, size_t i) {
  commit_item(ctx, i);
  index_item(ctx, i);
}

void pulse_patch_stream_commit(pulse_patch_stream *s) {
  if (s == NULL || s->finished != 1 || s->p->chunk_log2 < PULSE_CLASS_BLOCK_LOG2) {
    /* Committed already, or chunks that share an index block: in turn. */
    pulse_patch_stream_commit_data(s);
    pulse_patch_stream_commit_indexes(s);
    return;
  }
  int threads = s->p->total_changed >= ((uint64_t)1 << 16) ? s->threads : 1;
  pulse_parallel_for_affine(threads, s->nitems, s->decoder, commit_and_index_item, s);
  s->finished = 2;
  s->indexes_done = 1;
  indexes_follow(s);
}

pulse_patch_stream_figures
pulse_patch_stream_figures_get(const pulse_patch_stream *s) {
  pulse_patch_stream_figures none = {0, 0, 0, 0};
  return s != NULL ? s->times : none;
}

const pulse_changes *patch_stream_changes(const pulse_patch_stream *s, size_t i) {
  if (s == NULL || !s->finished || i >= s->p->count || s->target[i] == NULL)
    return NULL;
  return &s->staged[i];
}
