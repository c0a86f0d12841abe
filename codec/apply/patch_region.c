/* patch_region.c - a patch applied into blocks of tensors (pulse_region.h):
 * stage (checks, decode of the chunks that meet each block and its span,
 * class-model chunks from base bits gathered from block and halo, digests
 * moved by the changes), then commit. One region is one job of the parallel loop; each keeps its own
 * staged changes, so jobs never share memory they write. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chunk_impl.h"
#include "digest_impl.h"
#include "parallel_impl.h"
#include "patch_changes_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "pulse_region.h"
#include "status_impl.h"

/* What one region stages. */
typedef struct {
  pulse_region *r;
  size_t t;                /* its tensor in the patch table */
  uint64_t full_cols;      /* the tensor's 2-D view */
  uint64_t blo, bhi;       /* positions from the block's first to after its last */
  uint64_t klo, khi;       /* positions whose base bits block and halo hold */
  uint64_t hfirst;         /* block elements before klo (for halo indexes) */
  uint64_t count;          /* staged changes of the block */
  uint64_t *at;            /* where each goes: an index into r->data */
  uint16_t *new_bits;
  uint64_t hcount;         /* staged changes of the halo */
  uint64_t *hat;           /* indexes into r->halo */
  uint16_t *hnew;
  pulse_tensor_digest target, htarget; /* block and halo after commit */
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

static pulse_tensor_digest digest_add(pulse_tensor_digest a, pulse_tensor_digest b) {
  return (pulse_tensor_digest){a.a + b.a, a.b + b.b};
}

/* Block elements before row `row`, column `col` of the 2-D view. */
static uint64_t block_before_at(const pulse_region *r, uint64_t row, uint64_t col) {
  if (row < r->row0)
    return 0;
  if (row - r->row0 >= r->rows)
    return r->rows * r->cols;
  uint64_t in = col <= r->col0 ? 0 : col - r->col0 < r->cols ? col - r->col0 : r->cols;
  return (row - r->row0) * r->cols + in;
}

/* Block elements at positions below p (C: the tensor's columns). */
static uint64_t block_before(const pulse_region *r, uint64_t C, uint64_t p) {
  return block_before_at(r, p / C, p % C);
}

/* Checked: the block inside a rows x C view of numel elements. */
static void span_of(const pulse_region *r, uint64_t numel, uint64_t C, uint32_t log2,
                    uint64_t *blo, uint64_t *bhi, uint64_t *lo, uint64_t *hi) {
  *blo = r->row0 * C + r->col0;
  *bhi = (r->row0 + r->rows - 1) * C + r->col0 + r->cols;
  uint64_t mask = (1ull << log2) - 1;
  *lo = *blo & ~mask;
  *hi = *bhi > UINT64_MAX - mask ? numel : ((*bhi + mask) & ~mask);
  if (*hi > numel)
    *hi = numel;
}

pulse_status pulse_region_span(const pulse_region *r, uint64_t numel, uint64_t full_cols,
                               uint32_t log2, uint64_t *lo, uint64_t *hi, uint64_t *halo) {
  if (r == NULL || lo == NULL || hi == NULL || halo == NULL || log2 < 10 || log2 > 30)
    return pulse_fail(PULSE_ERR_ARG, "region span: NULL argument or alignment 2^%u", log2);
  *lo = *hi = *halo = 0;
  if (r->rows == 0 || r->cols == 0)
    return PULSE_OK;
  uint64_t rows = full_cols ? numel / full_cols : 0;
  if (full_cols == 0 || r->row0 > rows || r->rows > rows - r->row0 || r->col0 > full_cols ||
      r->cols > full_cols - r->col0)
    return pulse_fail(PULSE_ERR_ARG, "region span: the block is outside its tensor");
  uint64_t blo, bhi;
  span_of(r, numel, full_cols, log2, &blo, &bhi, lo, hi);
  *halo = *hi - *lo - r->rows * r->cols;
  return PULSE_OK;
}

/* Calls piece(ctx, a, b, from_block) for the runs of positions [lo, hi)
 * that lie all in the block or all outside it, in order. */
static void walk(const pulse_region *r, uint64_t C, uint64_t lo, uint64_t hi,
                 void (*piece)(void *ctx, uint64_t a, uint64_t b, int from_block), void *ctx) {
  uint64_t p = lo;
  while (p < hi) {
    uint64_t row = p / C, col = p % C, start = p - col;
    uint64_t end = hi - start < C ? hi : start + C; /* this row's part */
    uint64_t b0 = end, b1 = end;
    if (row >= r->row0 && row - r->row0 < r->rows && r->cols > 0)
      b0 = start + r->col0, b1 = b0 + r->cols;
    uint64_t cut[3] = {b0, b1, end};
    int blk[3] = {0, 1, 0};
    for (int i = 0; i < 3 && p < end; i++) {
      uint64_t q = cut[i] < end ? cut[i] : end;
      if (q > p)
        piece(ctx, p, q, blk[i]);
      p = q > p ? q : p;
    }
    p = end;
  }
}

/* Index in r->halo of position p (outside the block, inside the span). */
static uint64_t halo_index(const region_job *j, uint64_t p) {
  return p - j->klo - (block_before(j->r, j->full_cols, p) - j->hfirst);
}

typedef struct {
  const region_job *j;
  uint64_t first;
  uint16_t *buf;
} gather_ctx;

static void gather_piece(void *vctx, uint64_t a, uint64_t b, int from_block) {
  gather_ctx *g = vctx;
  const pulse_region *r = g->j->r;
  uint64_t C = g->j->full_cols;
  const uint16_t *src = from_block
                            ? r->data + (a / C - r->row0) * r->stride + (a % C - r->col0)
                            : r->halo + halo_index(g->j, a);
  memcpy(g->buf + (a - g->first), src, (size_t)(b - a) * 2);
}

typedef struct {
  pulse_region *r;
  uint64_t C, first, klo;
  const uint16_t *tensor;
  pulse_tensor_digest d;
} take_ctx;

static void take_piece(void *vctx, uint64_t a, uint64_t b, int from_block) {
  take_ctx *c = vctx;
  if (from_block)
    return;
  uint64_t at = a - c->klo - (block_before(c->r, c->C, a) - c->first);
  memcpy(c->r->halo + at, c->tensor + a, (size_t)(b - a) * 2);
  c->d = digest_add(c->d, pulse_digest_bf16_at(c->tensor + a, b - a, a));
}

pulse_status pulse_region_halo_take(pulse_region *r, const uint16_t *tensor, uint64_t numel,
                                    uint64_t full_cols) {
  if (r == NULL || (tensor == NULL && numel > 0) || r->halo_log2 == 0)
    return pulse_fail(PULSE_ERR_ARG, "region halo: NULL argument or no halo");
  uint64_t lo, hi, count;
  PULSE_TRY(pulse_region_span(r, numel, full_cols, r->halo_log2, &lo, &hi, &count));
  if (count > 0 && r->halo == NULL)
    return pulse_fail(PULSE_ERR_ARG, "region halo of '%s': no room for %" PRIu64 " elements",
                      r->name ? r->name : "?", count);
  take_ctx c = {r, full_cols, 0, lo, tensor, {0, 0}};
  if (hi > lo) {
    c.first = block_before(r, full_cols, lo);
    walk(r, full_cols, lo, hi, take_piece, &c);
  }
  r->halo_digest = c.d;
  return PULSE_OK;
}

static pulse_status job_fail(region_job *j, pulse_status st, const char *detail) {
  j->st = st;
  snprintf(j->detail, sizeof j->detail, "%s", detail);
  return st;
}

/* The block's own memory when positions [first, first + n) lie in it one
 * after the other (whole rows at the tensor's stride, or one row): the
 * decoder reads the base there, with no copy. Else NULL. */
static const uint16_t *contiguous_base(const region_job *j, uint64_t first, uint32_t n) {
  const pulse_region *r = j->r;
  uint64_t C = j->full_cols;
  if (first < j->blo || first + n > j->bhi)
    return NULL;
  uint64_t row = first / C, col = first % C;
  int rows_whole = r->cols == C && r->stride == C;
  if (!rows_whole && (col < r->col0 || col - r->col0 + n > r->cols))
    return NULL; /* not inside one row of a column block */
  return r->data + (row - r->row0) * r->stride + (col - r->col0);
}

/* Decodes chunk c (tensor position first, n elements, k changes) into
 * pos/delta, a class-model chunk from its base bits gathered into buf. */
static pulse_status decode_chunk(const pulse_patch *p, const region_job *j, uint64_t c,
                                 uint32_t k, uint16_t *buf, uint64_t *pos, uint16_t *delta) {
  const patch_tensor *t = &p->tensors[j->t];
  uint64_t first = c << p->chunk_log2;
  uint32_t n = patch_chunk_elems(p, t, c);
  const uint16_t *base = NULL;
  if (p->model == PULSE_POS_CLASS) {
    base = contiguous_base(j, first, n);
    if (base == NULL) {
      gather_ctx g = {j, first, buf};
      walk(j->r, j->full_cols, first, first + n, gather_piece, &g);
      base = buf;
    }
  }
  uint64_t at = t->chunk_first + c;
  pulse_status st = pulse_chunk_decode_in(
      p->version, p->values, p->model, base, n, p->bytes + p->chunk_offset[at],
      (size_t)p->chunk_size[at], k, first, pos, delta, NULL);
  if (st != PULSE_OK)
    return pulse_fail(st, "tensor '%s' chunk %" PRIu64 ": %s", t->info.name, c,
                      pulse_error_detail());
  return PULSE_OK;
}

/* Decodes the chunks of tensor j->t that meet the block (and its span) and
 * keeps the changes that fall in block or halo. */
static pulse_status stage_changes(const pulse_patch *p, region_job *j) {
  const patch_tensor *t = &p->tensors[j->t];
  const pulse_region *r = j->r;
  uint64_t C = j->full_cols;
  if (t->changed == 0 || r->rows == 0 || r->cols == 0)
    return PULSE_OK;
  /* With a halo every change in the span is kept (the span holds the
   * block); without one, those in the block. */
  uint64_t lo = r->halo_log2 ? j->klo : j->blo, hi = r->halo_log2 ? j->khi : j->bhi;
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
  j->hat = malloc((size_t)total * sizeof *j->hat);
  j->hnew = malloc((size_t)total * sizeof *j->hnew);
  uint16_t *old_bits = malloc((size_t)total * sizeof *old_bits);
  uint16_t *hold = malloc((size_t)total * sizeof *hold);
  uint64_t *tpos = malloc((size_t)total * sizeof *tpos);
  uint64_t *hpos = malloc((size_t)total * sizeof *hpos);
  size_t chunk = (size_t)1 << p->chunk_log2;
  uint16_t *buf = p->model == PULSE_POS_CLASS
                      ? malloc((t->numel < chunk ? (size_t)t->numel : chunk) * sizeof *buf)
                      : NULL;
  pulse_status st = PULSE_OK;
  if (pos == NULL || delta == NULL || j->at == NULL || j->new_bits == NULL || j->hat == NULL ||
      j->hnew == NULL || old_bits == NULL || hold == NULL || tpos == NULL || hpos == NULL ||
      (p->model == PULSE_POS_CLASS && buf == NULL)) {
    st = pulse_fail(PULSE_ERR_NOMEM, "region of '%s': %" PRIu64 " changes", t->info.name,
                    total);
    goto done;
  }
  for (uint64_t c = j0; c <= j1 && st == PULSE_OK; c++) {
    uint32_t k = p->chunk_changed[t->chunk_first + c];
    if (k == 0)
      continue;
    uint64_t first = c << p->chunk_log2, end = first + patch_chunk_elems(p, t, c);
    if (p->model == PULSE_POS_CLASS && (first < j->klo || end > j->khi)) {
      st = pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "tensor '%s': the patch to step %" PRIu64
                      " codes positions by class in chunks of 2^%u elements; a holder of "
                      "rows [%" PRIu64 ", %" PRIu64 ") columns [%" PRIu64 ", %" PRIu64
                      ") keeps the base bits of positions [%" PRIu64 ", %" PRIu64
                      ") only, not chunk [%" PRIu64 ", %" PRIu64 ") (keep a halo of "
                      "2^%u or more, or publish plain positions)",
                      t->info.name, p->step, p->chunk_log2, r->row0, r->row0 + r->rows, r->col0,
                      r->col0 + r->cols, j->klo, j->khi, first, end, p->chunk_log2);
      break;
    }
    st = decode_chunk(p, j, c, k, buf, pos, delta);
    for (uint32_t e = 0; e < k && st == PULSE_OK; e++) {
      if (pos[e] >= t->numel) {
        st = pulse_fail(PULSE_ERR_POSITION, "tensor '%s': a change at %" PRIu64
                        " past its %" PRIu64 " elements", t->info.name, pos[e], t->numel);
        break;
      }
      /* One division per change: a patch brings millions of them. */
      uint64_t row = pos[e] / C, col = pos[e] - row * C;
      if (row >= r->row0 && row - r->row0 < r->rows && col >= r->col0 &&
          col - r->col0 < r->cols) {
        uint64_t at = (row - r->row0) * r->stride + (col - r->col0);
        uint16_t old = r->data[at];
        j->at[j->count] = at;
        tpos[j->count] = pos[e];
        old_bits[j->count] = old;
        j->new_bits[j->count] = pulse_bf16_undelta(old, delta[e]);
        j->count++;
      } else if (r->halo_log2 != 0 && pos[e] >= j->klo && pos[e] < j->khi) {
        uint64_t at = pos[e] - j->klo - (block_before_at(r, row, col) - j->hfirst);
        uint16_t old = r->halo[at];
        j->hat[j->hcount] = at;
        hpos[j->hcount] = pos[e];
        hold[j->hcount] = old;
        j->hnew[j->hcount] = pulse_bf16_undelta(old, delta[e]);
        j->hcount++;
      }
    }
  }
  if (st == PULSE_OK) {
    j->target = digest_add(j->target,
                           pulse_digest_change_sum(tpos, old_bits, j->new_bits, j->count));
    j->htarget = digest_add(j->htarget,
                            pulse_digest_change_sum(hpos, hold, j->hnew, j->hcount));
  }
done:
  free(pos), free(delta), free(old_bits), free(hold), free(tpos), free(hpos), free(buf);
  return st;
}

static void stage_one(void *vctx, size_t i) {
  stage_ctx *ctx = vctx;
  const pulse_patch *p = ctx->p;
  region_job *j = &ctx->jobs[i];
  const patch_tensor *t = &p->tensors[j->t];
  const pulse_region *r = j->r;
  /* Block and halo are the whole tensor: the patch's own digests check
   * them, before and after (kept digests: nothing is read here). */
  int whole = j->klo == 0 && j->khi == t->numel && t->numel > 0;
  pulse_tensor_digest have = r->halo_log2 ? digest_add(r->digest, r->halo_digest) : r->digest;
  if (whole && !same_digest(have, t->base_digest)) {
    char d[256];
    snprintf(d, sizeof d, "tensor '%s': the target is not the base of the patch",
             t->info.name);
    job_fail(j, PULSE_ERR_BASE_DIGEST, d);
    return;
  }
  j->target = r->digest;
  j->htarget = r->halo_log2 ? r->halo_digest : (pulse_tensor_digest){0, 0};
  pulse_status st = stage_changes(p, j);
  if (st != PULSE_OK) {
    job_fail(j, st, pulse_error_detail());
    return;
  }
  if (whole && !same_digest(digest_add(j->target, j->htarget), t->target_digest)) {
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
  if (r->rows == 0 || r->cols == 0)
    return PULSE_OK;
  /* What base bits the region holds: its span with a halo; without one
   * the block's positions when they are contiguous; else none. */
  if (r->halo_log2 != 0) {
    uint64_t count;
    PULSE_TRY(pulse_region_span(r, pt->numel, cols, r->halo_log2, &j->klo, &j->khi, &count));
    if (count > 0 && r->halo == NULL)
      return pulse_fail(PULSE_ERR_ARG, "region of '%s': a halo of %" PRIu64
                        " elements is missing", r->name, count);
    j->hfirst = block_before(r, cols, j->klo);
  }
  j->blo = r->row0 * cols + r->col0;
  j->bhi = (r->row0 + r->rows - 1) * cols + r->col0 + r->cols;
  if (r->halo_log2 == 0 && (r->cols == cols || r->rows == 1))
    j->klo = j->blo, j->khi = j->bhi;
  return PULSE_OK;
}

void pulse_region_staged_free(pulse_region_staged *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->count; i++)
    free(s->jobs[i].at), free(s->jobs[i].new_bits), free(s->jobs[i].hat), free(s->jobs[i].hnew);
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
    s->changes += jobs[i].count + jobs[i].hcount;
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
    for (uint64_t e = 0; e < j->hcount; e++)
      j->r->halo[j->hat[e]] = j->hnew[e];
    j->r->digest = j->target;
    if (j->r->halo_log2 != 0)
      j->r->halo_digest = j->htarget;
  }
}

uint64_t pulse_region_staged_changes(const pulse_region_staged *s) {
  return s != NULL ? s->changes : 0;
}

void patch_region_staged_block(const pulse_region_staged *s, size_t k, uint64_t *count,
                               const uint64_t **at, const uint16_t **new_bits) {
  *count = 0;
  *at = NULL;
  *new_bits = NULL;
  if (s == NULL || k >= s->count)
    return;
  *count = s->jobs[k].count;
  *at = s->jobs[k].at;
  *new_bits = s->jobs[k].new_bits;
}
