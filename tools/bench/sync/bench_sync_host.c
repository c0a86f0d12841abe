/* bench_sync_host.c - the in-process worker of `pulse-bench sync`: a
 * subscriber in the bench's own process with host targets (or GPU targets,
 * --device), first synced over loopback, then synced once per step over the
 * link under test, with its own split of the time. */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "bench_sync_impl.h"
#include "pulse_cuda.h"

/* The inference side: host targets, first synced over loopback (the
 * anchor); with --device, their state copied into GPU memory. */
int bs_host_first_sync(bs_run *r) {
  const bs_args *a = r->a;
  bs_model *m = &r->m;
  pulse_status st;
  r->urls[0] = r->url0;
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = r->urls;
  o.url_count = 1;
  o.cache_dir = r->cache;
  o.allow_unsigned = 1; /* the bench publisher does not sign */
  o.use_catchup = 0;
  o.threads = a->threads;
  o.parallel = 4;
  o.no_streaming = a->no_stream;
  o.class_index = a->index;
  o.memory_budget_bytes = a->memory_budget;
  r->o = o;
  r->targets = calloc(m->count, sizeof *r->targets);
  for (size_t i = 0; r->targets && i < m->count; i++)
    r->targets[i] = calloc(m->numel[i], 2);
  st = r->targets ? pulse_sub_create(&r->o, &r->sub) : PULSE_ERR_NOMEM;
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++)
    st = r->targets[i] ? pulse_sub_attach_host(r->sub, m->info[i].name, 2,
                                               m->info[i].shape, r->targets[i])
                       : PULSE_ERR_NOMEM;
  atomic_store(&bs_current, r->sub);
  if (st == PULSE_OK)
    st = pulse_sub_sync(r->sub);
  atomic_store(&bs_current, NULL);
  pulse_sub_free(r->sub);
  r->sub = NULL;
  if (st != PULSE_OK)
    return bs_fail("first sync", st);
  r->host_step = r->step;
  if (!a->device)
    return 0;
  r->dtargets = calloc(m->count, sizeof *r->dtargets);
  st = r->dtargets ? PULSE_OK : PULSE_ERR_NOMEM;
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++) {
    st = pulse_cuda_alloc((void **)&r->dtargets[i], m->numel[i] * 2 + 2);
    if (st == PULSE_OK)
      st = pulse_cuda_upload(r->dtargets[i], r->targets[i], m->numel[i] * 2,
                             NULL);
  }
  if (st == PULSE_OK)
    st = pulse_cuda_sync(NULL);
  return st == PULSE_OK ? 0 : bs_fail("device targets", st);
}

/* `steps` steps on a link: the model moves, the publisher commits, the
 * subscriber (from the step the targets hold) syncs over `base`. */
int bs_host_steps(bs_run *r, const bs_link *lk, const char *base, bs_sample *s,
                  size_t *ns) {
  const bs_args *a = r->a;
  bs_model *m = &r->m;
  r->urls[0] = base;
  pulse_status st = pulse_sub_create(&r->o, &r->sub);
  for (size_t i = 0; st == PULSE_OK && i < m->count; i++)
    st = a->device ? pulse_sub_attach_device(r->sub, m->info[i].name, 2,
                                             m->info[i].shape, r->dtargets[i])
                   : pulse_sub_attach_host(r->sub, m->info[i].name, 2,
                                           m->info[i].shape, r->targets[i]);
  if (st == PULSE_OK)
    st = pulse_sub_assume_step(r->sub, r->host_step);
  atomic_store(&bs_current, r->sub);
  /* Checks the claim, warms the connection, and catches up with the steps
   * other workers synced meanwhile (untimed). */
  if (st == PULSE_OK)
    st = pulse_sub_sync(r->sub);
  if (st == PULSE_OK)
    r->host_step = r->step;
  *ns = 0;
  for (uint64_t k = 0; k < a->steps && st == PULSE_OK && !atomic_load(&bs_stop);
       k++) {
    pulse_pub_figures pf;
    st = bs_commit_next(r, &pf);
    if (st != PULSE_OK)
      break;
    /* Its memory during the sync: the rise of this process's peak over
     * what it held before (the publisher is idle), plus the class indexes
     * the subscriber held then (resident since their build). */
    pulse_sub_figures f0;
    pulse_sub_figures_get(r->sub, &f0);
    int mem_ok = bs_mem_reset_peak(0) == 0;
    uint64_t rss0 = bs_mem_kib(0, "VmRSS");
    st = pulse_sub_sync(r->sub);
    if (st != PULSE_OK)
      break;
    uint64_t hwm = bs_mem_kib(0, "VmHWM");
    pulse_sub_figures f;
    pulse_sub_figures_get(r->sub, &f);
    r->host_step = r->step;
    bs_sample *x = &s[(*ns)++];
    memset(x, 0, sizeof *x);
    x->commit = pf.total_seconds;
    x->seconds = x->seen = x->worker_sync = f.last_total_s;
    x->end_to_end = x->commit + x->seconds;
    x->transfer = f.last_transfer_s;
    x->verify = f.last_verify_s;
    x->decode = f.last_decode_s;
    x->apply = f.last_apply_s;
    x->overlap = f.last_decode_overlap_s;
    x->write = -1; /* no file */
    x->bytes = f.last_bytes;
    x->patch_bytes = pf.patch_bytes;
    x->changed = pf.changed;
    if (mem_ok && hwm >= rss0 && !a->device)
      x->peak_extra = (hwm - rss0) * 1024 + (f0.class_index_bytes > f.class_index_bytes
                                                  ? f0.class_index_bytes
                                                  : f.class_index_bytes);
    x->class_index = f.class_index_kept;
  }
  atomic_store(&bs_current, NULL);
  pulse_sub_free(r->sub);
  r->sub = NULL;
  return st == PULSE_OK ? 0 : bs_fail(lk->name, st);
}
