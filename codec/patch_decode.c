/* patch_decode.c - decoding sections and the transactional host apply. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk_impl.h"
#include "class_index_impl.h"
#include "digest_impl.h"
#include "parallel_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

int patch_can_use_index(const pulse_patch *p) {
  return p->model == PULSE_POS_CLASS && p->chunk_log2 >= PULSE_CLASS_BLOCK_LOG2;
}

pulse_status patch_decode_chunk(const pulse_patch *p, size_t t, uint64_t j,
                                const uint16_t *base, const pulse_class_index *ix,
                                uint64_t *pos, uint16_t *delta) {
  const patch_tensor *tt = &p->tensors[t];
  uint64_t c = tt->chunk_first + j;
  uint32_t k = p->chunk_changed[c];
  if (k == 0)
    return PULSE_OK;
  uint64_t first = j << p->chunk_log2;
  const uint8_t *stream = p->bytes + p->chunk_offset[c];
  size_t size = (size_t)p->chunk_size[c];
  uint32_t n = patch_chunk_elems(p, tt, j);
  pulse_status st =
      ix != NULL && patch_can_use_index(p)
          ? pulse_chunk_decode_indexed(p->version, ix, base, first, n, stream, size, k, pos,
                                       delta)
          : pulse_chunk_decode(p->version, p->model, base ? base + first : NULL, n, stream, size,
                               k, first, pos, delta);
  if (st != PULSE_OK)
    return pulse_fail(st, "tensor '%s' chunk %llu: %s", tt->info.name, (unsigned long long)j,
                      pulse_error_detail());
  return PULSE_OK;
}

/* Fills old and new bits from the base and the deltas (in place: the delta
 * array becomes new_bits). */
static void resolve_bits(const uint16_t *base, pulse_changes *c, uint64_t from, uint64_t to) {
  for (uint64_t i = from; i < to; i++) {
    uint16_t old = base[c->pos[i]];
    c->old_bits[i] = old;
    c->new_bits[i] = pulse_bf16_undelta(old, c->new_bits[i]);
  }
}

pulse_tensor_digest patch_resolve_chunk(const uint16_t *base, pulse_changes *c, uint64_t from,
                                        uint64_t to) {
  /* Old and new bits first: a loop of loads alone, so many cache misses on
   * the base are in flight at once (fused with the digest's arithmetic it
   * ran at half the speed). Then the digest change, the staging in cache. */
  resolve_bits(base, c, from, to);
  return pulse_digest_change_sum(c->pos + from, c->old_bits + from, c->new_bits + from, to - from);
}

pulse_status pulse_patch_decode_tensor(const pulse_patch *p, size_t i, const uint16_t *base,
                                       uint64_t numel, pulse_changes *out) {
  if (p == NULL || out == NULL || i >= p->count)
    return pulse_fail(PULSE_ERR_ARG, "decode: no tensor %zu", i);
  const patch_tensor *t = &p->tensors[i];
  if (numel != t->numel)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "decode: tensor '%s' has %llu elements, base %llu",
                      t->info.name, (unsigned long long)t->numel, (unsigned long long)numel);
  if (base == NULL && numel > 0)
    return pulse_fail(PULSE_ERR_ARG, "decode: tensor '%s': NULL base", t->info.name);
  out->count = 0;
  if (t->changed == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_changes_reserve(out, t->changed));
  for (uint64_t j = 0; j < t->chunk_count; j++) {
    uint64_t at = p->chunk_before[t->chunk_first + j];
    PULSE_TRY(patch_decode_chunk(p, i, j, base, NULL, out->pos + at, out->new_bits + at));
  }
  out->count = t->changed;
  resolve_bits(base, out, 0, out->count);
  return PULSE_OK;
}

/* ---------------------------------------------------------------- apply */

typedef struct {
  const pulse_patch *p;
  pulse_host_tensor *const *target; /* per patch tensor, NULL when absent */
  pulse_changes *staged;            /* per patch tensor */
  pulse_tensor_digest *digest;      /* per patch tensor: actual base digest */
  pulse_class_index **index;        /* per patch tensor: a valid index or NULL */
  uint64_t (*items)[2];             /* (tensor, chunk) */
  pulse_tensor_digest *item_delta;  /* per item: digest change of its changes */
  pulse_status *status;
  char (*detail)[200];
} apply_job;

static void record(apply_job *job, size_t i, pulse_status st) {
  job->status[i] = st;
  if (st != PULSE_OK)
    strncpy(job->detail[i], pulse_error_detail(), sizeof job->detail[i] - 1);
}

static void digest_one(void *ctx, size_t i) {
  apply_job *job = ctx;
  pulse_host_tensor *tg = job->target[i];
  if (tg == NULL)
    return;
  job->digest[i] = tg->digest ? *tg->digest : pulse_digest_bf16(tg->data, tg->numel);
}

static void decode_one(void *ctx, size_t i) {
  apply_job *job = ctx;
  size_t t = (size_t)job->items[i][0];
  uint64_t j = job->items[i][1];
  const patch_tensor *tt = &job->p->tensors[t];
  uint64_t at = job->p->chunk_before[tt->chunk_first + j];
  uint64_t k = job->p->chunk_changed[tt->chunk_first + j];
  pulse_changes *c = &job->staged[t];
  const uint16_t *base = job->target[t]->data;
  pulse_status st =
      patch_decode_chunk(job->p, t, j, base, job->index[t], c->pos + at, c->new_bits + at);
  if (st == PULSE_OK)
    job->item_delta[i] = patch_resolve_chunk(base, c, at, at + k);
  record(job, i, st);
}

struct pulse_patch_staged {
  const pulse_patch *p;
  pulse_host_tensor **target; /* per patch tensor, NULL when absent */
  pulse_changes *staged;      /* per patch tensor */
  pulse_class_index **index;  /* per patch tensor: its target's index when
                                 that describes the base, else NULL */
  int indexes_done;           /* the indexes follow the commit */
  pulse_patch_stage_times times;
};

void pulse_patch_staged_free(pulse_patch_staged *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; s->staged && i < s->p->count; i++)
    pulse_changes_free(&s->staged[i]);
  free(s->target), free(s->staged), free(s->index), free(s);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The table's infos, for state digests. */
pulse_status patch_state_digest_of(const pulse_patch *p, const pulse_tensor_digest *d,
                                   pulse_state_digest *out) {
  pulse_tensor_info *infos = calloc(p->count + 1, sizeof *infos);
  if (infos == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "apply: state digest");
  for (size_t i = 0; i < p->count; i++)
    infos[i] = p->tensors[i].info;
  pulse_status st = pulse_state_digest_compute(infos, d, p->count, out);
  free(infos);
  return st;
}

pulse_status pulse_patch_stage(const pulse_patch *p, pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts, pulse_patch_staged **out) {
  pulse_apply_opts defaults = PULSE_APPLY_OPTS_INIT;
  if (opts == NULL)
    opts = &defaults;
  if (out == NULL || p == NULL || (targets == NULL && count > 0) ||
      !pulse_apply_opts_known(opts))
    return pulse_fail(PULSE_ERR_ARG, "apply: NULL patch or targets, or options of another version");
  *out = NULL;
  size_t n = p->count;
  pulse_patch_staged *s = calloc(1, sizeof *s);
  pulse_tensor_digest *digest = calloc(n + 1, sizeof *digest);
  uint64_t(*items)[2] = calloc(p->chunks + 1, sizeof *items);
  pulse_tensor_digest *item_delta = calloc(p->chunks + 1, sizeof *item_delta);
  pulse_status *item_st = calloc(p->chunks + 1, sizeof *item_st);
  char(*detail)[200] = calloc(p->chunks + 1, sizeof *detail);
  pulse_status st = PULSE_OK;
  if (s != NULL) {
    s->p = p;
    s->target = calloc(n + 1, sizeof *s->target);
    s->staged = calloc(n + 1, sizeof *s->staged);
    s->index = calloc(n + 1, sizeof *s->index);
  }
  if (!s || !s->target || !s->staged || !s->index || !digest || !items || !item_delta || !item_st || !detail) {
    st = pulse_fail(PULSE_ERR_NOMEM, "apply: staging for %zu tensors", n);
    goto done;
  }
  pulse_host_tensor **target = s->target;
  double t0 = now_s();

  /* Match targets to the table. */
  for (size_t i = 0; i < n; i++) {
    const patch_tensor *t = &p->tensors[i];
    for (size_t j = 0; j < count; j++)
      if (targets[j].name != NULL && strcmp(targets[j].name, t->info.name) == 0) {
        target[i] = &targets[j];
        break;
      }
    if (target[i] == NULL) {
      if (!opts->partial_table) {
        st = pulse_fail(PULSE_ERR_NOT_FOUND, "apply: the patch changes tensor '%s', which is not among the targets",
                        t->info.name);
        goto done;
      }
      continue;
    }
    if (target[i]->numel != t->numel || (target[i]->data == NULL && t->numel > 0)) {
      st = pulse_fail(PULSE_ERR_SIZE_MISMATCH, "apply: tensor '%s' has %llu elements in the patch, %llu in the target",
                      t->info.name, (unsigned long long)t->numel, (unsigned long long)target[i]->numel);
      goto done;
    }
  }

  /* The base must be the patch's base. */
  apply_job job = {p, target, s->staged, digest, s->index, items, item_delta, item_st, detail};
  pulse_parallel_for(opts->threads, n, digest_one, &job);
  for (size_t i = 0; i < n; i++) {
    if (target[i] == NULL)
      continue;
    if (digest[i].a != p->tensors[i].base_digest.a || digest[i].b != p->tensors[i].base_digest.b) {
      st = pulse_fail(PULSE_ERR_BASE_DIGEST, "apply: tensor '%s' is not the patch's base (step %llu)",
                      p->tensors[i].info.name, (unsigned long long)p->base_step);
      goto done;
    }
  }
  if (!opts->partial_table) {
    pulse_state_digest sd;
    st = patch_state_digest_of(p, digest, &sd);
    if (st == PULSE_OK && memcmp(sd.bytes, p->base_digest.bytes, 32) != 0)
      st = pulse_fail(PULSE_ERR_BASE_DIGEST, "apply: the base state is not the patch's base (step %llu)",
                      (unsigned long long)p->base_step);
    if (st != PULSE_OK)
      goto done;
  }
  for (size_t i = 0; i < n; i++) {
    pulse_class_index *ix = target[i] ? pulse_apply_opts_index(opts, (size_t)(target[i] - targets)) : NULL;
    if (pulse_class_index_matches(ix, target[i] ? target[i]->numel : 0, digest[i]))
      s->index[i] = ix;
  }
  s->times.verify_seconds = now_s() - t0;

  /* Decode everything into staging, in parallel over chunks. */
  t0 = now_s();
  size_t item_count = 0;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    const patch_tensor *t = &p->tensors[i];
    if (target[i] == NULL || t->changed == 0)
      continue;
    st = pulse_changes_reserve(&s->staged[i], t->changed);
    for (uint64_t j = 0; j < t->chunk_count; j++)
      if (p->chunk_changed[t->chunk_first + j] != 0) {
        items[item_count][0] = i;
        items[item_count][1] = j;
        item_count++;
      }
  }
  if (st == PULSE_OK) {
    pulse_parallel_for(opts->threads, item_count, decode_one, &job);
    for (size_t i = 0; i < item_count && st == PULSE_OK; i++)
      if (item_st[i] != PULSE_OK)
        st = pulse_fail(item_st[i], "apply: %s", detail[i]);
  }
  s->times.decode_seconds = now_s() - t0;
  if (st != PULSE_OK)
    goto done;

  /* The result must be the patch's target, before anything is written. */
  t0 = now_s();
  for (size_t i = 0; i < item_count; i++) {
    pulse_tensor_digest *d = &digest[items[i][0]];
    d->a += item_delta[i].a;
    d->b += item_delta[i].b;
  }
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    if (target[i] == NULL)
      continue;
    s->staged[i].count = p->tensors[i].changed;
    if (digest[i].a != p->tensors[i].target_digest.a || digest[i].b != p->tensors[i].target_digest.b)
      st = pulse_fail(PULSE_ERR_TARGET_DIGEST, "apply: tensor '%s' would not match the target of step %llu",
                      p->tensors[i].info.name, (unsigned long long)p->step);
  }
  if (st == PULSE_OK && !opts->partial_table) {
    pulse_state_digest sd;
    st = patch_state_digest_of(p, digest, &sd);
    if (st == PULSE_OK && memcmp(sd.bytes, p->target_digest.bytes, 32) != 0)
      st = pulse_fail(PULSE_ERR_TARGET_DIGEST, "apply: the result would not match the target state of step %llu",
                      (unsigned long long)p->step);
  }
  s->times.verify_seconds += now_s() - t0;

done:
  free(digest), free(items), free(item_delta), free(item_st), free(detail);
  if (st != PULSE_OK) {
    pulse_patch_staged_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

void pulse_patch_staged_commit_data(pulse_patch_staged *s) {
  for (size_t i = 0; i < s->p->count; i++) {
    if (s->target[i] == NULL)
      continue;
    uint16_t *data = s->target[i]->data;
    const pulse_changes *c = &s->staged[i];
    for (uint64_t j = 0; j < c->count; j++)
      data[c->pos[j]] = c->new_bits[j];
  }
}

void pulse_patch_staged_commit_indexes(pulse_patch_staged *s) {
  if (s->indexes_done)
    return; /* the index moves, unlike the writes, must happen once */
  s->indexes_done = 1;
  for (size_t i = 0; i < s->p->count; i++) {
    if (s->index[i] == NULL)
      continue;
    const pulse_changes *c = &s->staged[i];
    pulse_class_index_move(s->index[i], c->pos, c->old_bits, c->new_bits, c->count);
    s->index[i]->digest = s->p->tensors[i].target_digest;
  }
}

void pulse_patch_staged_commit(pulse_patch_staged *s) {
  pulse_patch_staged_commit_data(s);
  pulse_patch_staged_commit_indexes(s);
}

pulse_patch_stage_times pulse_patch_staged_times(const pulse_patch_staged *s) { return s->times; }

pulse_status pulse_patch_apply(const pulse_patch *p, pulse_host_tensor *targets, size_t count,
                               const pulse_apply_opts *opts) {
  pulse_patch_staged *s = NULL;
  PULSE_TRY(pulse_patch_stage(p, targets, count, opts, &s));
  pulse_patch_staged_commit(s);
  pulse_patch_staged_free(s);
  return PULSE_OK;
}
