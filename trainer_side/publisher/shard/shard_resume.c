/* shard_resume.c - a shard's snapshot from the store's head, one tensor at
 * a time (pulse_pub_shard_resume).
 *
 * A whole rebuild (pulse_store_state_rebuild) holds every tensor: on a node
 * of 8 ranks restarting a 7B job, 8 x 14 GB. Here a rank reads the anchor
 * one tensor at a time (the mapping's pages dropped after each), brings a
 * tensor it has blocks in forward through every patch after the anchor
 * (mapped once, decoded per tensor), copies its block runs and frees it.
 * Of the tensors it does not hold it keeps only digests: the anchor's,
 * checked against each patch's base digest, then the patch's target
 * digest. The checks are the rebuild's: the objects' sizes and SHA-256,
 * the anchor's state digest, each patch's steps, table, per-tensor and
 * state digests, the head's state digest; an error is the one the rebuild
 * would give first (a tensor's error is kept until the anchor is checked
 * and the steps before it are). A patch's sections of tensors the rank
 * does not hold are not decoded: their bytes are covered by the head's
 * SHA-256. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fail_impl.h"
#include "shard_impl.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_state_impl.h"

/* A retained patch after the anchor, mapped and opened. */
typedef struct {
  const pulse_store_object *obj;
  store_patch_mapping map;
  pulse_patch *patch;
  size_t *entry; /* per anchor tensor: its table entry; SIZE_MAX: none */
} resume_patch;

/* The first error of the tensor pass, by patch (the rebuild applies the
 * patches in order: an error of an earlier patch is the one it gives). */
typedef struct {
  size_t patch;   /* SIZE_MAX: none */
  int after_base; /* a decode or target error: after the patch's base
                   * checks (its base state digest among them) */
  pulse_status status;
  char detail[1024];
} resume_error;

typedef struct {
  pulse_pub_shard *s;
  const char *dir;
  pulse_store_head *head;
  const pulse_store_object *anchor;
  pulse_st_file *file;
  pulse_state_digest named; /* the anchor's metadata's */
  size_t n;                 /* tensors */
  pulse_tensor_info *info;  /* names borrow from the anchor */
  int same_table;
  resume_patch *patches;
  size_t npatches, nmapped;
  pulse_status map_status; /* of patch nmapped (or of the steps' end) */
  char map_detail[1024];
  pulse_tensor_digest *digest; /* (npatches + 1) x n: before patch j */
  resume_error err;
} resume_ctx;

static void keep_detail(char *to, size_t size) {
  snprintf(to, size, "%s", pulse_error_detail());
}

static void pass_fail(resume_ctx *c, size_t j, pulse_status st) {
  int after_base = st != PULSE_ERR_BASE_DIGEST;
  if (j > c->err.patch ||
      (j == c->err.patch && after_base >= c->err.after_base))
    return;
  c->err.patch = j, c->err.after_base = after_base, c->err.status = st;
  keep_detail(c->err.detail, sizeof c->err.detail);
}

static pulse_tensor_digest *digest_at(resume_ctx *c, size_t j, size_t i) {
  return &c->digest[j * c->n + i];
}

static int same_digest(pulse_tensor_digest x, pulse_tensor_digest y) {
  return x.a == y.a && x.b == y.b;
}

/* The anchor's table (every tensor BF16), and whether it is the shard's. */
static pulse_status read_table(resume_ctx *c) {
  c->n = pulse_st_tensor_count(c->file);
  if ((c->info = calloc(c->n + 1, sizeof *c->info)) == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: resume");
  for (size_t i = 0; i < c->n; i++) {
    pulse_st_tensor t;
    PULSE_TRY(store_anchor_tensor(c->file, c->anchor, i, &t));
    c->info[i].name = t.name;
    c->info[i].dtype = PULSE_DTYPE_BF16;
    c->info[i].ndim = t.ndim;
    memcpy(c->info[i].shape, t.shape, sizeof t.shape);
  }
  uint8_t id[32];
  PULSE_TRY(shard_table_id(c->info, c->n, id));
  c->same_table = c->n == c->s->count && memcmp(id, c->s->table_id, 32) == 0;
  return PULSE_OK;
}

/* Matches patch p's table to the anchor's, as a whole apply matches its
 * targets: every tensor of the patch is one of the state's, of its size. */
static pulse_status match_table(resume_ctx *c, resume_patch *p) {
  if ((p->entry = malloc((c->n + 1) * sizeof *p->entry)) == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: resume");
  for (size_t i = 0; i < c->n; i++)
    p->entry[i] = SIZE_MAX;
  size_t count = pulse_patch_tensor_count(p->patch);
  for (size_t k = 0; k < count; k++) {
    pulse_patch_tensor pt;
    PULSE_TRY(pulse_patch_tensor_get(p->patch, k, &pt));
    size_t i = shard_find(c->info, c->n, pt.info.name);
    if (i == (size_t)-1)
      return pulse_fail(
          PULSE_ERR_NOT_FOUND,
          "apply: the patch's tensor '%s' is not among the targets",
          pt.info.name);
    pulse_st_tensor t;
    PULSE_TRY(pulse_st_tensor_get(c->file, i, &t));
    if (t.numel != pt.numel)
      return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                        "apply: tensor '%s' has %" PRIu64
                        " elements in the patch, %" PRIu64 " in the target",
                        pt.info.name, pt.numel, t.numel);
    p->entry[i] = k;
  }
  return PULSE_OK;
}

/* Maps, opens and checks every retained patch after the anchor, in order,
 * up to the first that fails (its error is kept: the tensor pass still
 * checks the ones before it, as the rebuild applies them first). */
static pulse_status map_patches(resume_ctx *c) {
  const pulse_store_head *h = c->head;
  if ((c->patches = calloc(h->npatches + 1, sizeof *c->patches)) == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: resume");
  uint64_t at = c->anchor->step;
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < h->npatches && st == PULSE_OK && at < h->step; i++) {
    const pulse_store_object *o = &h->patches[i];
    if (o->base_step < c->anchor->step)
      continue;
    resume_patch *p = &c->patches[c->npatches++];
    p->obj = o;
    st = store_patch_map(c->dir, o, &p->map);
    if (st == PULSE_OK && (st = pulse_patch_open(p->map.data, p->map.size,
                                                 &p->patch)) != PULSE_OK)
      st = pulse_fail_context(st, "store: patch %s", o->path);
    if (st == PULSE_OK)
      st = store_patch_steps_check(o, p->patch, at);
    if (st == PULSE_OK && (st = match_table(c, p)) != PULSE_OK)
      st = pulse_fail_context(st, "store: applying %s (step %" PRIu64 ")",
                              o->path, o->step);
    if (st == PULSE_OK)
      c->nmapped++, at = o->step;
  }
  /* The steps must reach the head; its digest is checked at the end. */
  if (st == PULSE_OK && at != h->step)
    st = store_replay_end_check(h, h->step, at, &h->digest);
  c->map_status = st;
  if (st != PULSE_OK)
    keep_detail(c->map_detail, sizeof c->map_detail);
  c->digest = calloc((c->nmapped + 1) * c->n + 1, sizeof *c->digest);
  return c->digest != NULL ? PULSE_OK
                           : pulse_fail(PULSE_ERR_NOMEM, "shard: resume");
}

/* Drops the anchor mapping's pages of [p, p + size) from this process (the
 * page cache keeps them): a read of every tensor then holds one at a time. */
static void drop_pages(const void *p, size_t size) {
  long page = sysconf(_SC_PAGESIZE);
  if (size == 0 || page <= 0)
    return;
  uintptr_t lo = (uintptr_t)p & ~((uintptr_t)page - 1);
  uintptr_t hi =
      ((uintptr_t)p + size + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
  (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static int holds_tensor(const pulse_pub_shard *s, size_t i) {
  for (size_t b = 0; b < s->nblocks; b++)
    if (s->geom[b].tensor == i)
      return 1;
  return 0;
}

/* Brings tensor i (its anchor digest in digest_at(c, 0, i)) through the
 * patches before `upto`, checking each patch's base digest. A tensor the
 * rank holds (bits) is decoded and applied, and its target digest checked;
 * of one it does not hold (bits NULL) the table's target digest is taken. */
static pulse_status forward_tensor(resume_ctx *c, size_t i, uint16_t *bits,
                                   uint64_t numel, size_t upto,
                                   size_t *failed) {
  pulse_changes ch = PULSE_CHANGES_INIT;
  for (size_t j = 0; j < upto; j++) {
    const resume_patch *p = &c->patches[j];
    pulse_tensor_digest d = *digest_at(c, j, i);
    size_t k = p->entry[i];
    if (k != SIZE_MAX) {
      pulse_patch_tensor pt;
      pulse_status st = pulse_patch_tensor_get(p->patch, k, &pt);
      if (st == PULSE_OK && !same_digest(d, pt.base_digest))
        st = pulse_fail(
            PULSE_ERR_BASE_DIGEST,
            "apply: tensor '%s' is not the patch's base (step %" PRIu64 ")",
            c->info[i].name, pulse_patch_base_step(p->patch));
      if (st == PULSE_OK && bits == NULL)
        d = pt.target_digest;
      if (st == PULSE_OK && bits != NULL && pt.changed > 0)
        st = pulse_patch_decode_tensor(p->patch, k, bits, numel, &ch);
      if (st == PULSE_OK && bits != NULL && pt.changed > 0) {
        for (uint64_t e = 0; e < ch.count; e++)
          bits[ch.pos[e]] = ch.new_bits[e];
        d = pulse_digest_apply_changes(d, &ch);
      }
      if (st == PULSE_OK && bits != NULL && !same_digest(d, pt.target_digest))
        st = pulse_fail(
            PULSE_ERR_TARGET_DIGEST,
            "apply: tensor '%s' would not match the target of step %" PRIu64,
            c->info[i].name, pulse_patch_step(p->patch));
      if (st != PULSE_OK) {
        pulse_changes_free(&ch);
        *failed = j;
        return pulse_fail_context(st, "store: applying %s (step %" PRIu64 ")",
                                  p->obj->path, p->obj->step);
      }
    }
    *digest_at(c, j + 1, i) = d;
  }
  pulse_changes_free(&ch);
  return PULSE_OK;
}

static void copy_blocks(pulse_pub_shard *s, size_t i, const uint16_t *bits) {
  for (size_t b = 0; b < s->nblocks; b++) {
    const shard_geom *g = &s->geom[b];
    if (g->tensor != i)
      continue;
    for (uint64_t r = 0; r < g->runs; r++)
      memcpy(s->snap[b] + r * g->run_len, bits + shard_run_pos(g, r),
             g->run_len * 2);
  }
}

/* Every tensor once, in table order: its anchor digest, then its digests
 * (and bits, where held) through the patches. Only out of memory stops it;
 * a check's error is kept in c->err. */
static pulse_status tensor_pass(resume_ctx *c) {
  for (size_t i = 0; i < c->n; i++) {
    pulse_st_tensor t;
    PULSE_TRY(pulse_st_tensor_get(c->file, i, &t));
    int held = c->same_table && holds_tensor(c->s, i);
    uint16_t *copy = NULL;
    const uint16_t *bits = t.data;
    if (held || ((uintptr_t)t.data & 1u) != 0) {
      if ((copy = malloc(t.nbytes + 2)) == NULL)
        return pulse_fail(PULSE_ERR_NOMEM, "store: anchor %s: tensor '%s'",
                          c->anchor->path, t.name);
      if (t.nbytes > 0)
        memcpy(copy, t.data, t.nbytes);
      drop_pages(t.data, t.nbytes);
      bits = copy;
    }
    *digest_at(c, 0, i) = pulse_digest_bf16(bits, t.numel);
    if (copy == NULL)
      drop_pages(t.data, t.nbytes);
    /* Past a patch with an error nothing counts; at it, only an earlier
     * check (a base digest after a decode error). */
    size_t upto = c->nmapped;
    if (c->err.patch != SIZE_MAX && c->err.patch + c->err.after_base < upto)
      upto = c->err.patch + c->err.after_base;
    size_t failed = 0;
    pulse_status st =
        forward_tensor(c, i, held ? copy : NULL, t.numel, upto, &failed);
    if (st != PULSE_OK)
      pass_fail(c, failed, st);
    else if (held)
      copy_blocks(c->s, i, copy);
    free(copy);
  }
  return PULSE_OK;
}

/* The state digest over patch p's table of the digests before patch j
 * (j + 1: after it). */
static pulse_status patch_state_digest(resume_ctx *c, const resume_patch *p,
                                       size_t j, pulse_state_digest *out) {
  size_t count = pulse_patch_tensor_count(p->patch);
  pulse_tensor_info *info = calloc(count + 1, sizeof *info);
  pulse_tensor_digest *d = calloc(count + 1, sizeof *d);
  pulse_status st =
      info && d ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "shard: resume");
  for (size_t i = 0; i < c->n && st == PULSE_OK; i++) {
    size_t k = p->entry[i];
    pulse_patch_tensor pt;
    if (k == SIZE_MAX ||
        (st = pulse_patch_tensor_get(p->patch, k, &pt)) != PULSE_OK)
      continue;
    info[k] = pt.info, d[k] = *digest_at(c, j, i);
  }
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(info, d, count, out);
  free(info), free(d);
  return st;
}

/* What the rebuild would have said, in its order: the anchor's state
 * digest, then per patch its steps and table, tensor digests, state
 * digests; the head's state digest; then the shard's table. */
static pulse_status resume_verdict(resume_ctx *c) {
  pulse_state_digest sd;
  PULSE_TRY(pulse_state_digest_compute(c->info, c->digest, c->n, &sd));
  PULSE_TRY(store_anchor_digest_check(c->anchor, &sd, &c->named));
  for (size_t j = 0; j < c->nmapped; j++) {
    const resume_patch *p = &c->patches[j];
    if (c->err.patch == j && !c->err.after_base)
      return pulse_fail(c->err.status, "%s", c->err.detail);
    pulse_state_digest base, target;
    PULSE_TRY(patch_state_digest(c, p, j, &base));
    if (memcmp(&base, pulse_patch_base_digest(p->patch), sizeof base) != 0)
      return pulse_fail(
          PULSE_ERR_BASE_DIGEST,
          "store: applying %s (step %" PRIu64
          "): apply: the base state is not the patch's base (step %" PRIu64 ")",
          p->obj->path, p->obj->step, pulse_patch_base_step(p->patch));
    if (c->err.patch == j)
      return pulse_fail(c->err.status, "%s", c->err.detail);
    PULSE_TRY(patch_state_digest(c, p, j + 1, &target));
    if (memcmp(&target, pulse_patch_target_digest(p->patch), sizeof target) !=
        0)
      return pulse_fail(PULSE_ERR_TARGET_DIGEST,
                        "store: applying %s (step %" PRIu64
                        "): apply: the result would not match the target state "
                        "of step %" PRIu64,
                        p->obj->path, p->obj->step, pulse_patch_step(p->patch));
  }
  if (c->map_status != PULSE_OK)
    return pulse_fail(c->map_status, "%s", c->map_detail);
  const pulse_state_digest *head_state =
      c->nmapped > 0
          ? pulse_patch_target_digest(c->patches[c->nmapped - 1].patch)
          : &sd;
  PULSE_TRY(store_replay_end_check(c->head, c->head->step, c->head->step,
                                   head_state));
  if (!c->same_table)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH, "shard: %s holds another table",
                      c->dir);
  return PULSE_OK;
}

static pulse_status alloc_snapshots(pulse_pub_shard *s) {
  for (size_t b = 0; b < s->nblocks; b++) {
    const shard_geom *g = &s->geom[b];
    uint16_t *snap = realloc(s->snap[b], (g->elems ? g->elems : 1) * 2);
    if (snap == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "shard: snapshot");
    s->snap[b] = snap;
  }
  return PULSE_OK;
}

static void resume_free(resume_ctx *c) {
  for (size_t j = 0; c->patches != NULL && j < c->npatches; j++) {
    pulse_patch_free(c->patches[j].patch);
    store_patch_unmap(&c->patches[j].map);
    free(c->patches[j].entry);
  }
  free(c->patches), free(c->digest), free(c->info);
  pulse_st_close(c->file);
  pulse_store_head_free(c->head);
}

pulse_status pulse_pub_shard_resume(pulse_pub_shard *s, const char *dir) {
  if (s == NULL || dir == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  resume_ctx c;
  memset(&c, 0, sizeof c);
  c.s = s, c.dir = dir, c.err.patch = SIZE_MAX;
  PULSE_TRY(pulse_store_head_load(dir, &c.head));
  uint64_t at = pulse_store_head_step(c.head);
  size_t anchor = 0;
  pulse_status st = store_replay_anchor(c.head, at, &anchor);
  if (st == PULSE_OK) {
    c.anchor = &c.head->anchors[anchor];
    st = store_anchor_open(dir, c.anchor, &c.file, &c.named);
  }
  if (st == PULSE_OK)
    st = read_table(&c);
  pulse_pub_shard_abort(s);
  if (st == PULSE_OK)
    st = map_patches(&c);
  if (st == PULSE_OK && c.same_table)
    st = alloc_snapshots(s);
  if (st == PULSE_OK)
    st = tensor_pass(&c);
  if (st == PULSE_OK)
    st = resume_verdict(&c);
  for (size_t b = 0; st == PULSE_OK && b < s->nblocks; b++)
    s->digest[b] = s->target[b] = shard_block_digest(&s->geom[b], s->snap[b]);
  s->have_snapshot = st == PULSE_OK;
  s->snap_step = at;
  resume_free(&c);
  return st;
}
