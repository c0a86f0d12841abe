/* sub_stream.c - applying a patch while it downloads.
 *
 * The object is assembled in memory as it arrives (sub_object_fetch_sink);
 * once its header and tensor table are there the patch is opened, the
 * targets are matched and their base digests checked, and the codec's
 * stream (pulse_codec_stream.h) decodes each chunk on its own threads as
 * soon as the chunk's bytes are there, into staging. Nothing is committed
 * before the whole object has arrived and its SHA-256 matched the signed
 * head, and the staged changes lead to the patch's target digests; then the
 * targets are written under the writers' lock, as for a staged patch.
 * Bytes decoded early are untrusted: the decoder checks every bound and
 * writes only staging, and an object that does not verify is dropped with
 * whatever was made of it (on_restart) before it is fetched again. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_impl.h"

typedef struct {
  sub_sink sink; /* first: the callbacks get it */
  pulse_sub *sub;
  const pulse_store_object *o;
  const sub_source *src; /* NULL: a store object */
  size_t need;     /* bytes before the patch can be opened (0: not known) */
  int opened;      /* tried */
  pulse_status st; /* of opening and beginning */
  char detail[512];
  pulse_patch *p;
  pulse_patch_stream *s;        /* host targets */
  pulse_cuda_patch_stream *cs;  /* device targets */
  sub_target **tg;
  pulse_host_tensor *ht;
  pulse_cuda_target *ct;
  int full;
  int finished;     /* finish ran (and commit, when it passed) */
  pulse_status fst; /* of finishing */
} patch_sink;

static void ps_reset(patch_sink *ps) {
  pulse_patch_stream_free(ps->s);
  pulse_cuda_patch_stream_free(ps->cs);
  pulse_patch_free(ps->p);
  ps->s = NULL;
  ps->cs = NULL;
  ps->p = NULL;
  ps->need = 0;
  ps->opened = 0;
  ps->finished = 0;
  ps->st = ps->fst = PULSE_OK;
  ps->detail[0] = '\0';
}

static void ps_on_restart(sub_sink *k) {
  ps_reset((patch_sink *)k);
}

/* Device targets: the CUDA stream over them (base digests checked against
 * the kept ones, class counts taken on the device). */
static pulse_status ps_open_device(patch_sink *ps, size_t n) {
  pulse_sub *sub = ps->sub;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (ps->tg[i] != NULL)
      ps->ct[k++] = (pulse_cuda_target){ps->tg[i]->name, ps->tg[i]->data_d,
                                        ps->tg[i]->numel, &ps->tg[i]->digest};
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = sub->opts.threads;
  ao.partial_table = !ps->full;
  double t0 = sub_now();
  pulse_status st = pulse_cuda_patch_stream_begin(
      sub->ws, ps->p, ps->ct, k, &ao, sub->opts.cuda_stream, &ps->cs);
  sub->t_verify += sub_now() - t0;
  return st;
}

/* Opens the patch from its first bytes and starts the stream. */
static pulse_status ps_open(patch_sink *ps) {
  pulse_sub *sub = ps->sub;
  const pulse_store_object *o = ps->o;
  double t0 = sub_now();
  pulse_status st = pulse_patch_open(ps->sink.buf, (size_t)o->size, &ps->p);
  sub->t_decode += sub_now() - t0;
  if (st != PULSE_OK)
    return st;
  if (pulse_patch_step(ps->p) != o->step ||
      pulse_patch_base_step(ps->p) != o->base_step)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: the patch goes %" PRIu64 " -> %" PRIu64
                      ", the head says %" PRIu64 " -> %" PRIu64,
                      o->path, pulse_patch_base_step(ps->p),
                      pulse_patch_step(ps->p), o->base_step, o->step);
  if (ps->src != NULL && memcmp(pulse_patch_target_digest(ps->p)->bytes,
                                ps->src->target.bytes, 32) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: the patch does not lead to the head's state",
                      o->path);
  if (sub->step != PULSE_SUB_NO_STEP &&
      pulse_patch_base_step(ps->p) != sub->step)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "the patch to step %" PRIu64 " applies to step %" PRIu64
                      ", the targets hold step %" PRIu64,
                      pulse_patch_step(ps->p), pulse_patch_base_step(ps->p),
                      sub->step);
  size_t n = pulse_patch_tensor_count(ps->p);
  free(ps->tg), free(ps->ht), free(ps->ct);
  ps->tg = calloc(n + 1, sizeof *ps->tg);
  ps->ht = calloc(n + 1, sizeof *ps->ht);
  ps->ct = calloc(n + 1, sizeof *ps->ct);
  if (ps->tg == NULL || ps->ht == NULL || ps->ct == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "streaming a patch of %zu tensors", n);
  PULSE_TRY(sub_apply_match(sub, ps->p, ps->tg, &ps->full));
  if (sub->mem == SUB_MEM_DEVICE)
    return ps_open_device(ps, n);
  sub_targets_index(sub, ps->p);
  pulse_class_index **ix = calloc(n + 1, sizeof *ix); /* read by begin only */
  if (ix == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "streaming a patch of %zu tensors", n);
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (ps->tg[i] != NULL) {
      ix[k] = ps->tg[i]->index;
      ps->ht[k++] = (pulse_host_tensor){ps->tg[i]->name, ps->tg[i]->data,
                                        ps->tg[i]->numel, &ps->tg[i]->digest};
    }
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = sub->opts.threads;
  ao.partial_table = !ps->full;
  ao.class_index = ix;
  /* Mostly the base digest checks (the rest starts the decode threads). */
  t0 = sub_now();
  st = pulse_patch_stream_begin(ps->p, ps->ht, k, &ao, &ps->s);
  sub->t_verify += sub_now() - t0;
  free(ix);
  return st;
}

static void ps_on_prefix(sub_sink *k, uint64_t prefix) {
  patch_sink *ps = (patch_sink *)k;
  double t0 = sub_now();
  if (!ps->opened && ps->st == PULSE_OK) {
    pulse_status st =
        pulse_patch_stream_need(ps->sink.buf, (size_t)prefix, &ps->need);
    if (st == PULSE_OK && prefix < ps->need && prefix < ps->o->size) {
      ps->sub->t_cb += sub_now() - t0;
      return;
    }
    ps->opened = 1;
    if (st == PULSE_OK)
      st = ps_open(ps);
    if (st != PULSE_OK) {
      /* Kept until the object verified: bytes that do not verify are
       * fetched again, and only a verified patch's error is reported. */
      ps->st = st;
      snprintf(ps->detail, sizeof ps->detail, "%s", pulse_error_detail());
      pulse_patch_stream_free(ps->s);
      pulse_cuda_patch_stream_free(ps->cs);
      ps->s = NULL;
      ps->cs = NULL;
    }
  }
  pulse_patch_stream_feed(ps->s, (size_t)prefix);
  pulse_cuda_patch_stream_feed(ps->cs, (size_t)prefix);
  ps->sub->t_cb += sub_now() - t0;
}

/* Every byte is there and verified: waits for the last decodes, checks the
 * target digests and commits. */
static void ps_finish(patch_sink *ps) {
  pulse_sub *sub = ps->sub;
  ps->finished = 1;
  double t0 = sub_now();
  if (ps->cs != NULL) {
    /* Device targets: the decodes' tail and the device checks. */
    pulse_status st = pulse_cuda_patch_stream_finish(ps->cs);
    sub->t_decode += sub_now() - t0;
    if (st == PULSE_OK)
      st = sub_apply_commit_device(sub, ps->p, ps->tg, ps->full, ps->cs);
    if (st != PULSE_OK) {
      ps->fst = pulse_fail(st, "patch to step %" PRIu64 ": %s", ps->o->step,
                           pulse_error_detail());
      snprintf(ps->detail, sizeof ps->detail, "%s", pulse_error_detail());
    }
    return;
  }
  double v0 = pulse_patch_stream_figures_get(ps->s).verify_seconds;
  pulse_status st = pulse_patch_stream_finish(ps->s);
  pulse_patch_stream_figures t = pulse_patch_stream_figures_get(ps->s);
  double verify = t.verify_seconds - v0, wall = sub_now() - t0;
  sub->t_verify += verify;
  sub->t_decode += wall > verify ? wall - verify : 0;
  double overlap = t.decode_wall_seconds - t.tail_seconds;
  sub->t_decode_overlap += overlap > 0 ? overlap : 0;
  PULSE_LOG_AT(PULSE_LOG_DEBUG,
               "subscriber: %s streamed: decode %.4f s of work, %.4f s from "
               "begin to the "
               "last chunk, %.4f s after the last byte; finish waited %.4f s",
               ps->o->path, t.decode_seconds, t.decode_wall_seconds,
               t.tail_seconds, wall);
  if (st == PULSE_OK) /* the FP8 targets' half of the step */
    st = sub_fp8_stage_patch(sub, ps->p, ps->tg, NULL, ps->s);
  if (st != PULSE_OK) {
    ps->fst = pulse_fail(st, "patch to step %" PRIu64 ": %s: nothing applied",
                         ps->o->step, pulse_error_detail());
    snprintf(ps->detail, sizeof ps->detail, "%s", pulse_error_detail());
    return;
  }
  sub_apply_commit(sub, ps->p, ps->tg, ps->full, NULL, ps->s);
}

/* The object verified in memory: commit now, while its cache copy is
 * being made durable. */
static void ps_on_verified(sub_sink *k) {
  patch_sink *ps = (patch_sink *)k;
  if (ps->st == PULSE_OK && (ps->s != NULL || ps->cs != NULL) &&
      !ps->finished)
    ps_finish(ps);
}

/* Every byte of the object is there and verified: opens it when that did
 * not happen yet, reports a verified patch's own error, or waits for the
 * last decodes and commits. */
static pulse_status ps_apply_verified(patch_sink *ps) {
  if (!ps->opened)
    ps_on_prefix(&ps->sink, ps->o->size); /* it came whole (the cache) */
  if (ps->st != PULSE_OK) /* the object verified: its own error */
    return pulse_fail(ps->st, "patch to step %" PRIu64 ": %s: nothing applied", ps->o->step,
                      ps->detail);
  if (!ps->finished)
    ps_finish(ps);
  if (ps->fst != PULSE_OK)
    return pulse_fail(ps->fst, "%s", ps->detail);
  return PULSE_OK;
}

pulse_status sub_apply_patch_streamed(pulse_sub *sub,
                                      const pulse_store_object *o,
                                      const sub_source *src) {
  sub_index_wait(sub); /* not in a download callback */
  patch_sink ps;
  memset(&ps, 0, sizeof ps);
  ps.sub = sub;
  ps.o = o;
  ps.src = src;
  ps.sink.on_prefix = ps_on_prefix;
  ps.sink.on_restart = ps_on_restart;
  ps.sink.on_verified = ps_on_verified;
  /* Address space, not memory: a page takes memory when the bytes for it
   * arrive, so a head naming a huge object costs nothing before its bytes
   * do (and one over the limit is refused first). */
  PULSE_TRY(sub_object_size_check(sub, o));
  size_t reserved = o->size ? (size_t)o->size : 1;
  void *buf = mmap(NULL, reserved, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (buf == MAP_FAILED)
    return pulse_fail(PULSE_ERR_NOMEM,
                      "%s: %" PRIu64 " bytes of address space: %s", o->path,
                      o->size, strerror(errno));
  ps.sink.buf = buf;
  pulse_status st = sub_object_fetch_sink(sub, o, src, &ps.sink);
  if (ps.finished && ps.fst == PULSE_OK && st != PULSE_OK) {
    /* Applied from verified bytes; only the cache copy failed. */
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "subscriber: %s applied, but not kept in the cache: %s",
                 o->path, pulse_error_detail());
    st = PULSE_OK;
  }
  if (st == PULSE_OK)
    st = ps_apply_verified(&ps);
  ps_reset(&ps);
  free(ps.tg), free(ps.ht), free(ps.ct);
  munmap(ps.sink.buf, reserved);
  return st;
}
