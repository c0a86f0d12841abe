/* patch_region.c - a patch applied into blocks of tensors (pulse_region.h):
 * stage (checks, decode of the chunks that meet each block, digests), then
 * commit. One region is one job of the parallel loop; each keeps its own
 * staged changes, so jobs never share memory they write. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digest_impl.h"
#include "parallel_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "pulse_region.h"
#include "status_impl.h"

/* What one region stages. */
typedef struct {
  pulse_region *r;
  size_t t;                /* its tensor in the patch table */
  uint64_t full_cols;      /* the tensor's 2-D view */
  uint64_t count;          /* staged changes */
  uint64_t *at;            /* where each goes: an index into r->data */
  uint16_t *new_bits;
  pulse_tensor_digest target; /* the block's digest after commit */
  pulse_status st;         /* of the job */
  char detail[256];
} region_job;

struct pulse_region_staged {
  region_job *jobs;
  size_t count;
  uint64_t changes;
};

typedef struct {
  const pulse_patch *p;
  region_job *jobs;
} stage_ctx;

pulse_status pulse_region_view(const uint64_t *shape, uint32_t ndim, uint64_t *rows,
                               uint64_t *cols) {
  if (rows == NULL || cols == NULL || ndim > PULSE_MAX_DIMS || (ndim > 0 && shape == NULL))
    return pulse_fail(PULSE_ERR_ARG, "region view: bad shape");
  uint64_t numel;
  PULSE_TRY(pulse_shape_numel(shape, ndim, &numel));
  *rows = ndim > 0 ? shape[0] : 1;
  *cols = *rows > 0 ? numel / *rows : 0;
  return PULSE_OK;
}

pulse_status pulse_region_digest(const pulse_region *r, uint64_t full_cols,
                                 pulse_tensor_digest *out) {
  if (r == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "region digest: NULL argument");
  if (r->rows > 0 && r->cols > 0 && r->row0 > (UINT64_MAX - r->col0) / (full_cols ? full_cols : 1))
    return pulse_fail(PULSE_ERR_OVERFLOW, "region digest: positions overflow");
  return pulse_digest_bf16_block(r->data, r->rows, r->cols, r->stride,
                                 r->row0 * full_cols + r->col0, full_cols, out);
}

static int same_digest(pulse_tensor_digest a, pulse_tensor_digest b) {
  return a.a == b.a && a.b == b.b;
}

/* The block covers its whole tensor, contiguously. */
static int region_whole(const region_job *j, const patch_tensor *t) {
  const pulse_region *r = j->r;
  uint64_t rows = t->info.ndim > 0 ? t->info.shape[0] : 1;
  return r->row0 == 0 && r->rows == rows && r->col0 == 0 && r->cols == j->full_cols &&
         (r->stride == r->cols || r->rows <= 1);
}

static pulse_status job_fail(region_job *j, pulse_status st, const char *detail) {
  j->st = st;
  snprintf(j->detail, sizeof j->detail, "%s", detail);
  return st;
}

/* Decodes the chunks of tensor j->t that meet the block and keeps the
 * changes inside it. */
static pulse_status stage_changes(const pulse_patch *p, region_job *j, int whole) {
  const patch_tensor *t = &p->tensors[j->t];
  const pulse_region *r = j->r;
  uint64_t C = j->full_cols;
  if (t->changed == 0 || r->rows == 0 || r->cols == 0)
    return PULSE_OK;
  /* Positions lo..hi-1 hold every element of the block (and, for a column
   * block, the other columns of its rows). */
  uint64_t lo = r->row0 * C + r->col0;
  uint64_t hi = (r->row0 + r->rows - 1) * C + r->col0 + r->cols;
  uint64_t j0 = lo >> p->chunk_log2, j1 = (hi - 1) >> p->chunk_log2;
  uint32_t kmax = 0;
  uint64_t total = 0;
  for (uint64_t c = j0; c <= j1; c++) {
    uint32_t k = p->chunk_changed[t->chunk_first + c];
    kmax = k > kmax ? k : kmax;
    total += k;
  }
  if (total == 0)
    return PULSE_OK;
  uint64_t *pos = malloc(((size_t)kmax + 1) * sizeof *pos);
  uint16_t *delta = malloc(((size_t)kmax + 1) * sizeof *delta);
  j->at = malloc((size_t)total * sizeof *j->at);
  j->new_bits = malloc((size_t)total * sizeof *j->new_bits);
  uint16_t *old_bits = malloc((size_t)total * sizeof *old_bits);
  uint64_t *tpos = malloc((size_t)total * sizeof *tpos);
  pulse_status st = PULSE_OK;
  if (pos == NULL || delta == NULL || j->at == NULL || j->new_bits == NULL ||
      old_bits == NULL || tpos == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "region of '%s': %" PRIu64 " changes", t->info.name,
                    total);
    goto done;
  }
  /* A whole contiguous block is the tensor: the class model decodes
   * against it. Otherwise only plain positions (checked by the caller). */
  const uint16_t *base = whole ? r->data : NULL;
  for (uint64_t c = j0; c <= j1 && st == PULSE_OK; c++) {
    uint32_t k = p->chunk_changed[t->chunk_first + c];
    if (k == 0)
      continue;
    st = patch_decode_chunk(p, j->t, c, base, NULL, pos, delta);
    for (uint32_t e = 0; e < k && st == PULSE_OK; e++) {
      if (pos[e] >= t->numel) {
        st = pulse_fail(PULSE_ERR_POSITION, "tensor '%s': a change at %" PRIu64
                        " past its %" PRIu64 " elements", t->info.name, pos[e], t->numel);
        break;
      }
      uint64_t row = pos[e] / C, col = pos[e] % C;
      if (row < r->row0 || row - r->row0 >= r->rows || col < r->col0 ||
          col - r->col0 >= r->cols)
        continue;
      uint64_t at = (row - r->row0) * r->stride + (col - r->col0);
      uint16_t old = r->data[at];
      j->at[j->count] = at;
      tpos[j->count] = pos[e];
      old_bits[j->count] = old;
      j->new_bits[j->count] = pulse_bf16_undelta(old, delta[e]);
      j->count++;
    }
  }
  if (st == PULSE_OK) {
    pulse_tensor_digest d = pulse_digest_change_sum(tpos, old_bits, j->new_bits, j->count);
    j->target.a += d.a;
    j->target.b += d.b;
  }
done:
  free(pos), free(delta), free(old_bits), free(tpos);
  return st;
}

static void stage_one(void *vctx, size_t i) {
  stage_ctx *ctx = vctx;
  const pulse_patch *p = ctx->p;
  region_job *j = &ctx->jobs[i];
  const patch_tensor *t = &p->tensors[j->t];
  const pulse_region *r = j->r;
  int whole = region_whole(j, t);
  if (!whole && p->model == PULSE_POS_CLASS && t->changed > 0) {
    char d[256];
    snprintf(d, sizeof d,
             "tensor '%s': the patch to step %" PRIu64
             " codes positions by class, which a holder of rows [%" PRIu64 ", %" PRIu64
             ") columns [%" PRIu64 ", %" PRIu64 ") of it cannot decode (publish plain "
             "positions for tensor-parallel workers)",
             t->info.name, p->step, r->row0, r->row0 + r->rows, r->col0, r->col0 + r->cols);
    job_fail(j, PULSE_ERR_UNSUPPORTED, d);
    return;
  }
  /* The block must hold what its kept digest says before any base bit
   * is read; a whole tensor must also be the patch's base. */
  pulse_tensor_digest have;
  pulse_status st = pulse_region_digest(r, j->full_cols, &have);
  if (st != PULSE_OK) {
    job_fail(j, st, pulse_error_detail());
    return;
  }
  if (!same_digest(have, r->digest) || (whole && !same_digest(have, t->base_digest))) {
    char d[256];
    snprintf(d, sizeof d, "tensor '%s': %s", t->info.name,
             !same_digest(have, r->digest)
                 ? "the block's memory is not what its digest says (written by someone else)"
                 : "the target is not the base of the patch");
    job_fail(j, PULSE_ERR_BASE_DIGEST, d);
    return;
  }
  j->target = have;
  st = stage_changes(p, j, whole);
  if (st != PULSE_OK) {
    job_fail(j, st, pulse_error_detail());
    return;
  }
  if (whole && !same_digest(j->target, t->target_digest)) {
    char d[256];
    snprintf(d, sizeof d, "tensor '%s': the patch's changes do not lead to its target digest",
             t->info.name);
    job_fail(j, PULSE_ERR_TARGET_DIGEST, d);
  }
}

/* Start address of a block's memory span, for the overlap check. */
typedef struct {
  uintptr_t lo, hi;
  size_t i;
} span;

static int span_cmp(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Checks a region against its tensor; fills the job. */
static pulse_status check_region(const pulse_patch *p, pulse_region *r, region_job *j) {
  if (r->name == NULL)
    return pulse_fail(PULSE_ERR_ARG, "region: no tensor name");
  size_t t;
  if (pulse_patch_tensor_find(p, r->name, &t) != PULSE_OK)
    return pulse_fail(PULSE_ERR_NOT_FOUND, "region: tensor '%s' is not in the patch's table",
                      r->name);
  const patch_tensor *pt = &p->tensors[t];
  uint64_t rows, cols;
  PULSE_TRY(pulse_region_view(pt->info.shape, pt->info.ndim, &rows, &cols));
  if (r->row0 > rows || r->rows > rows - r->row0 || r->col0 > cols ||
      r->cols > cols - r->col0 || r->cols > r->stride)
    return pulse_fail(PULSE_ERR_ARG,
                      "region of '%s': rows [%" PRIu64 ", +%" PRIu64 ") columns [%" PRIu64
                      ", +%" PRIu64 ") stride %" PRIu64 " do not fit its %" PRIu64 " x %" PRIu64,
                      r->name, r->row0, r->rows, r->col0, r->cols, r->stride, rows, cols);
  if (r->rows > 0 && r->cols > 0) {
    if (r->data == NULL || (uintptr_t)r->data % 2 != 0)
      return pulse_fail(PULSE_ERR_ARG, "region of '%s': NULL or unaligned data", r->name);
    if (r->rows - 1 > (UINT64_MAX / 2 - r->cols) / r->stride)
      return pulse_fail(PULSE_ERR_OVERFLOW, "region of '%s': its span overflows", r->name);
  }
  j->r = r;
  j->t = t;
  j->full_cols = cols;
  return PULSE_OK;
}

void pulse_region_staged_free(pulse_region_staged *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->count; i++)
    free(s->jobs[i].at), free(s->jobs[i].new_bits);
  free(s->jobs);
  free(s);
}

pulse_status pulse_region_stage(const pulse_patch *p, pulse_region *regions, size_t count,
                                int threads, pulse_region_staged **out) {
  if (out == NULL || p == NULL || (count > 0 && regions == NULL))
    return pulse_fail(PULSE_ERR_ARG, "region stage: NULL argument");
  *out = NULL;
  pulse_region_staged *s = calloc(1, sizeof *s);
  region_job *jobs = calloc(count + 1, sizeof *jobs);
  span *spans = calloc(count + 1, sizeof *spans);
  size_t *seen = calloc(p->count + 1, sizeof *seen);
  pulse_status st = PULSE_OK;
  if (s == NULL || jobs == NULL || spans == NULL || seen == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "region stage: %zu regions", count);
    goto fail;
  }
  size_t nspans = 0;
  for (size_t i = 0; i < count; i++) {
    if ((st = check_region(p, &regions[i], &jobs[i])) != PULSE_OK)
      goto fail;
    if (seen[jobs[i].t]++) {
      st = pulse_fail(PULSE_ERR_ARG, "region: tensor '%s' is named twice", regions[i].name);
      goto fail;
    }
    const pulse_region *r = &regions[i];
    if (r->rows > 0 && r->cols > 0)
      spans[nspans++] = (span){(uintptr_t)r->data,
                               (uintptr_t)(r->data + (r->rows - 1) * r->stride + r->cols), i};
  }
  /* Blocks written by one commit must not share memory: a change of one
   * would move another's base under its digest. */
  qsort(spans, nspans, sizeof *spans, span_cmp);
  for (size_t i = 1; i < nspans; i++)
    if (spans[i].lo < spans[i - 1].hi) {
      st = pulse_fail(PULSE_ERR_ARG, "region: the blocks of '%s' and '%s' overlap in memory",
                      regions[spans[i - 1].i].name, regions[spans[i].i].name);
      goto fail;
    }
  stage_ctx ctx = {p, jobs};
  pulse_parallel_for(threads, count, stage_one, &ctx);
  for (size_t i = 0; i < count; i++) {
    if (jobs[i].st != PULSE_OK) {
      st = pulse_fail(jobs[i].st, "%s", jobs[i].detail);
      goto fail;
    }
    s->changes += jobs[i].count;
  }
  free(spans), free(seen);
  s->jobs = jobs;
  s->count = count;
  *out = s;
  return PULSE_OK;

fail:
  if (s != NULL) {
    s->jobs = jobs;
    s->count = jobs != NULL ? count : 0;
    pulse_region_staged_free(s);
  } else {
    free(jobs);
  }
  free(spans), free(seen);
  return st;
}

void pulse_region_staged_commit(pulse_region_staged *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->count; i++) {
    region_job *j = &s->jobs[i];
    for (uint64_t e = 0; e < j->count; e++)
      j->r->data[j->at[e]] = j->new_bits[e];
    j->r->digest = j->target;
  }
}

uint64_t pulse_region_staged_changes(const pulse_region_staged *s) {
  return s != NULL ? s->changes : 0;
}
