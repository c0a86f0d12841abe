/* patch_squash.c - merges a chain of patches into one.
 *
 * Deltas compose exactly: after patches with deltas d1..dn at a position the
 * bits are old + d1 + ... + dn (mod 2^16), and a position whose sum is 0 is
 * no longer a change. So the merge works on (position, delta) lists and never
 * needs the weights, except that the class position model decodes each patch
 * against the exponents of its own base: then one tensor at a time is copied
 * and moved forward through the chain. */
#include <stdlib.h>
#include <string.h>

#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

typedef struct {
  uint64_t *pos;
  uint16_t *delta;
  uint64_t count;
} delta_list;

static void delta_list_free(delta_list *l) {
  free(l->pos);
  free(l->delta);
  l->pos = NULL;
  l->delta = NULL;
  l->count = 0;
}

/* acc = acc + next, summing deltas at shared positions, dropping zeros. */
static pulse_status merge(delta_list *acc, const delta_list *next) {
  uint64_t cap = acc->count + next->count;
  delta_list m = {malloc((cap + 1) * sizeof(uint64_t)), malloc((cap + 1) * sizeof(uint16_t)), 0};
  if (m.pos == NULL || m.delta == NULL) {
    delta_list_free(&m);
    return pulse_fail(PULSE_ERR_NOMEM, "squash: %llu changes", (unsigned long long)cap);
  }
  uint64_t i = 0, j = 0;
  while (i < acc->count || j < next->count) {
    uint64_t p;
    uint16_t d;
    if (j == next->count || (i < acc->count && acc->pos[i] < next->pos[j])) {
      p = acc->pos[i];
      d = acc->delta[i++];
    } else if (i == acc->count || next->pos[j] < acc->pos[i]) {
      p = next->pos[j];
      d = next->delta[j++];
    } else {
      p = acc->pos[i];
      d = (uint16_t)(acc->delta[i++] + next->delta[j++]);
    }
    if (d != 0) {
      m.pos[m.count] = p;
      m.delta[m.count++] = d;
    }
  }
  delta_list_free(acc);
  *acc = m;
  return PULSE_OK;
}

static pulse_status decode_deltas(const pulse_patch *p, size_t t, const uint16_t *base,
                                  delta_list *out) {
  const patch_tensor *tt = &p->tensors[t];
  out->count = 0;
  out->pos = malloc((tt->changed + 1) * sizeof(uint64_t));
  out->delta = malloc((tt->changed + 1) * sizeof(uint16_t));
  if (out->pos == NULL || out->delta == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "squash: tensor '%s'", tt->info.name);
  for (uint64_t j = 0; j < tt->chunk_count && tt->changed > 0; j++) {
    uint64_t at = p->chunk_before[tt->chunk_first + j];
    PULSE_TRY(patch_decode_chunk(p, t, j, base, NULL, out->pos + at, out->delta + at));
  }
  out->count = tt->changed;
  return PULSE_OK;
}

static int same_digest(pulse_tensor_digest x, pulse_tensor_digest y) {
  return x.a == y.a && x.b == y.b;
}

/* All patches share the first one's table and follow each other. */
static pulse_status check_chain(const pulse_patch *const *patches, size_t count) {
  const pulse_patch *first = patches[0];
  for (size_t k = 1; k < count; k++) {
    const pulse_patch *prev = patches[k - 1], *p = patches[k];
    if (p->base_step != prev->step)
      return pulse_fail(PULSE_ERR_BASE_STEP, "squash: patch %zu starts at step %llu, the previous ends at %llu",
                        k, (unsigned long long)p->base_step, (unsigned long long)prev->step);
    if (memcmp(p->base_digest.bytes, prev->target_digest.bytes, 32) != 0)
      return pulse_fail(PULSE_ERR_BASE_DIGEST, "squash: patch %zu does not start where patch %zu ends", k, k - 1);
    if (p->count != first->count)
      return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "squash: patch %zu has %zu tensors, the first %zu", k,
                        p->count, first->count);
    for (size_t t = 0; t < p->count; t++) {
      const patch_tensor *a = &first->tensors[t], *b = &p->tensors[t];
      if (strcmp(a->info.name, b->info.name) != 0 || a->info.ndim != b->info.ndim ||
          memcmp(a->info.shape, b->info.shape, a->info.ndim * sizeof a->info.shape[0]) != 0)
        return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "squash: patch %zu tensor %zu differs from the first table", k, t);
      if (!same_digest(b->base_digest, prev->tensors[t].target_digest))
        return pulse_fail(PULSE_ERR_BASE_DIGEST, "squash: tensor '%s' of patch %zu does not start where patch %zu ends",
                          b->info.name, k, k - 1);
    }
  }
  return PULSE_OK;
}

pulse_status pulse_patch_squash(const pulse_patch *const *patches, size_t count,
                                const uint16_t *const *base, const pulse_encode_opts *opts,
                                pulse_buffer *out) {
  if (out == NULL || patches == NULL || count == 0 || opts == NULL)
    return pulse_fail(PULSE_ERR_ARG, "squash: nothing to squash");
  out->data = NULL;
  out->size = 0;
  for (size_t k = 0; k < count; k++)
    if (patches[k] == NULL)
      return pulse_fail(PULSE_ERR_ARG, "squash: patch %zu is NULL", k);
  PULSE_TRY(check_chain(patches, count));
  const pulse_patch *first = patches[0], *last = patches[count - 1];
  int need_base = opts->pos_model == PULSE_POS_CLASS;
  for (size_t k = 0; k < count; k++)
    need_base |= patches[k]->model == PULSE_POS_CLASS;
  if (need_base && base == NULL)
    return pulse_fail(PULSE_ERR_ARG, "squash: class-model patches need the first base's weights");

  size_t n = first->count;
  pulse_encode_tensor *enc = calloc(n + 1, sizeof *enc);
  pulse_changes *changes = calloc(n + 1, sizeof *changes);
  pulse_tensor_digest *target_d = calloc(n + 1, sizeof *target_d);
  pulse_status st = PULSE_OK;
  if (!enc || !changes || !target_d) {
    st = pulse_fail(PULSE_ERR_NOMEM, "squash: table of %zu tensors", n);
    goto done;
  }
  for (size_t t = 0; t < n && st == PULSE_OK; t++) {
    const patch_tensor *ft = &first->tensors[t];
    const uint16_t *tb = base ? base[t] : NULL;
    if (need_base && tb == NULL && ft->numel > 0) {
      st = pulse_fail(PULSE_ERR_ARG, "squash: no base for tensor '%s'", ft->info.name);
      break;
    }
    if (tb != NULL && !same_digest(pulse_digest_bf16(tb, ft->numel), ft->base_digest)) {
      st = pulse_fail(PULSE_ERR_BASE_DIGEST, "squash: the base of tensor '%s' is not the first patch's base",
                      ft->info.name);
      break;
    }
    /* The class model decodes each patch against its own base: scratch
     * moves through the chain one tensor at a time. */
    uint16_t *scratch = NULL;
    if (need_base && ft->numel > 0) {
      scratch = malloc(ft->numel * sizeof *scratch);
      if (scratch == NULL) {
        st = pulse_fail(PULSE_ERR_NOMEM, "squash: tensor '%s'", ft->info.name);
        break;
      }
      memcpy(scratch, tb, ft->numel * sizeof *scratch);
    }
    delta_list acc = {NULL, NULL, 0};
    for (size_t k = 0; k < count && st == PULSE_OK; k++) {
      delta_list step = {NULL, NULL, 0};
      st = decode_deltas(patches[k], t, scratch, &step);
      if (st == PULSE_OK && scratch != NULL)
        for (uint64_t j = 0; j < step.count; j++)
          scratch[step.pos[j]] = pulse_bf16_undelta(scratch[step.pos[j]], step.delta[j]);
      if (st == PULSE_OK)
        st = merge(&acc, &step);
      delta_list_free(&step);
    }
    free(scratch);
    if (st == PULSE_OK)
      st = pulse_changes_reserve(&changes[t], acc.count + 1);
    if (st == PULSE_OK) {
      /* Without weights the old bits are unknown: old 0 and new = delta
       * carry the same delta to the encoder. */
      for (uint64_t j = 0; j < acc.count; j++) {
        uint16_t old = tb ? tb[acc.pos[j]] : 0;
        changes[t].pos[j] = acc.pos[j];
        changes[t].old_bits[j] = old;
        changes[t].new_bits[j] = pulse_bf16_undelta(old, acc.delta[j]);
      }
      changes[t].count = acc.count;
      target_d[t] = last->tensors[t].target_digest;
      if (tb != NULL &&
          !same_digest(pulse_digest_apply_changes(ft->base_digest, &changes[t]), target_d[t]))
        st = pulse_fail(PULSE_ERR_TARGET_DIGEST, "squash: tensor '%s' does not reach the last patch's target",
                        ft->info.name);
    }
    delta_list_free(&acc);
    enc[t].info = ft->info;
    enc[t].base = tb;
    enc[t].changes = &changes[t];
    enc[t].base_digest = &ft->base_digest;
  }
  if (st == PULSE_OK) {
    pulse_encode_opts o = *opts;
    o.step = last->step;
    o.base_step = first->base_step;
    st = patch_encode_digests(&o, enc, n, target_d, out);
  }
  if (st == PULSE_OK) {
    /* The table's state digests must be the chain's ends. */
    pulse_patch *check = NULL;
    st = pulse_patch_open(out->data, out->size, &check);
    if (st == PULSE_OK && (memcmp(check->base_digest.bytes, first->base_digest.bytes, 32) != 0 ||
                           memcmp(check->target_digest.bytes, last->target_digest.bytes, 32) != 0))
      st = pulse_fail(PULSE_ERR_CORRUPT, "squash: the chain's state digests disagree with its tensor digests");
    pulse_patch_free(check);
    if (st != PULSE_OK)
      pulse_buffer_free(out);
  }
done:
  for (size_t t = 0; changes && t < n; t++)
    pulse_changes_free(&changes[t]);
  free(enc), free(changes), free(target_d);
  return st;
}
