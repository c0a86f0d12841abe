/* server_history.c - the objects earlier heads named, so that a catch-up can
 * start at a step the head no longer retains while its objects are still in
 * the store (the publisher's grace period, docs/protocols/sync.md).
 *
 * Why: a follower whose link takes longer to bring an anchor than the
 * publisher keeps that anchor's step (issue "Reliability and security: what
 * hostile networks and failures still break", finding 9, the continuous
 * case) ends its download at a step the head has dropped. With the head's
 * objects alone its only route is the newest anchor, which it again
 * finishes too late: it stays an anchor behind for ever. The server has
 * seen every head (it is told of each commit, or watches the store), so it
 * can name the chain from that step and squash it into one catch-up.
 *
 * The history is the objects of the heads seen since the server started,
 * within one run and while steps only move forward (a new run or a step
 * back starts it again), at most SRV_HISTORY_MAX of them, oldest dropped
 * first. A chain is used only when every object it needs is still a file
 * of objects/; each object is checked against its SHA-256 as it is read,
 * and the squashed result against the head's state digest, as for any
 * catch-up.
 *
 * The heads themselves are remembered too (the newest SRV_HISTORY_HEADS,
 * as parsed copies), so that a catch-up can end at one of them
 * (/v1/catchup/<from>?to=<step>): its bytes then never change, whatever
 * the head does, and a worker whose download outlasts the next head
 * resumes it instead of starting over (finding 9, the trainer that never
 * pauses). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_impl.h"
#include "status_impl.h"
#include "store_impl.h"

static int has_path(const pulse_store_object *list, size_t n,
                    const pulse_store_object *o) {
  for (size_t i = 0; i < n; i++)
    if (memcmp(list[i].sha256, o->sha256, 32) == 0 &&
        strcmp(list[i].path, o->path) == 0)
      return 1;
  return 0;
}

static void drop_heads(pulse_server *srv) {
  for (size_t i = 0; i < srv->nhistory_heads; i++)
    srv_head_release(srv->history_heads[i]);
  srv->nhistory_heads = 0;
}

/* A copy of head of its own, or NULL (then not remembered: a catch-up
 * pinned to it is refused). */
static srv_head *copy_head(const pulse_store_head *head) {
  size_t n;
  const uint8_t *bytes = pulse_store_head_bytes(head, &n);
  srv_head *h = calloc(1, sizeof *h);
  if (h == NULL || pulse_store_head_parse(bytes, n, &h->head) != PULSE_OK) {
    free(h);
    return NULL;
  }
  atomic_init(&h->refs, 1);
  h->step = pulse_store_head_step(head);
  return h;
}

/* Remembers h (its step replaces an earlier head of the same step: an
 * anchor added). history_lock held. */
static void add_head(pulse_server *srv, srv_head *h) {
  if (srv->nhistory_heads > 0 &&
      srv->history_heads[srv->nhistory_heads - 1]->step == h->step)
    srv_head_release(srv->history_heads[--srv->nhistory_heads]);
  if (srv->nhistory_heads == SRV_HISTORY_HEADS) {
    srv_head_release(srv->history_heads[0]);
    memmove(srv->history_heads, srv->history_heads + 1,
            (SRV_HISTORY_HEADS - 1) * sizeof *srv->history_heads);
    srv->nhistory_heads--;
  }
  srv->history_heads[srv->nhistory_heads++] = h;
}

srv_head *srv_history_head(pulse_server *srv, uint64_t step,
                           uint64_t *oldest) {
  srv_head *found = NULL;
  pthread_mutex_lock(&srv->history_lock);
  *oldest = srv->nhistory_heads > 0 ? srv->history_heads[0]->step : UINT64_MAX;
  for (size_t i = srv->nhistory_heads; i-- > 0 && found == NULL;)
    if (srv->history_heads[i]->step == step) {
      found = srv->history_heads[i];
      atomic_fetch_add(&found->refs, 1);
    }
  pthread_mutex_unlock(&srv->history_lock);
  return found;
}

static void add(pulse_server *srv, const pulse_store_object *o) {
  if (has_path(srv->history, srv->nhistory, o))
    return;
  if (srv->nhistory == SRV_HISTORY_MAX) {
    memmove(srv->history, srv->history + 1,
            (srv->nhistory - 1) * sizeof *srv->history);
    srv->nhistory--;
  }
  srv->history[srv->nhistory++] = *o;
}

void srv_history_note(pulse_server *srv, const pulse_store_head *head) {
  uint8_t run[PULSE_STORE_RUN_BYTES] = {0};
  int has_run = pulse_store_head_run(head, run);
  uint64_t step = pulse_store_head_step(head);
  srv_head *copy = copy_head(head); /* parsed (and verified) unlocked */
  pthread_mutex_lock(&srv->history_lock);
  if (srv->history == NULL)
    srv->history = calloc(SRV_HISTORY_MAX, sizeof *srv->history);
  /* Another run, or a step back (a rollback, a restart from an older
   * state): the old objects are another timeline's. */
  if (srv->history == NULL || has_run != srv->history_has_run ||
      memcmp(run, srv->history_run, sizeof run) != 0 ||
      step < srv->history_step) {
    srv->nhistory = 0;
    drop_heads(srv);
  }
  memcpy(srv->history_run, run, sizeof run);
  srv->history_has_run = has_run;
  srv->history_step = step;
  if (srv->history != NULL && copy != NULL) {
    add_head(srv, copy);
    copy = NULL;
  }
  if (srv->history != NULL) {
    for (size_t i = 0; i < pulse_store_head_anchor_count(head); i++)
      add(srv, pulse_store_head_anchor(head, i));
    for (size_t i = 0; i < pulse_store_head_patch_count(head); i++)
      add(srv, pulse_store_head_patch(head, i));
  }
  pthread_mutex_unlock(&srv->history_lock);
  srv_head_release(copy);
}

void srv_history_free(pulse_server *srv) {
  drop_heads(srv);
  free(srv->history);
  srv->history = NULL;
  srv->nhistory = 0;
}

/* The patch that applies to `base`: the head's own first, then the newest
 * of the history. NULL when none. */
static const pulse_store_object *patch_from(const pulse_server *srv,
                                            const pulse_store_head *head,
                                            uint64_t base) {
  for (size_t i = 0; i < pulse_store_head_patch_count(head); i++)
    if (pulse_store_head_patch(head, i)->base_step == base)
      return pulse_store_head_patch(head, i);
  for (size_t i = srv->nhistory; i-- > 0;)
    if (srv->history[i].kind == PULSE_STORE_PATCH &&
        srv->history[i].base_step == base && srv->history[i].step > base)
      return &srv->history[i];
  return NULL;
}

/* Appends the patches from `from` to `to` to c; 0 when a step has none. */
static int walk(const pulse_server *srv, const pulse_store_head *head,
                uint64_t from, uint64_t to, srv_chain *c, size_t cap) {
  for (uint64_t s = from; s != to;) {
    const pulse_store_object *p = patch_from(srv, head, s);
    if (p == NULL || p->step > to || c->npatches == cap)
      return 0;
    c->patches[c->npatches++] = *p;
    s = p->step;
  }
  return 1;
}

static int file_present(const pulse_server *srv, const pulse_store_object *o) {
  char path[4096];
  struct stat sb;
  return store_join(path, sizeof path, srv->dir, o->path) == 0 &&
         stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
         (uint64_t)sb.st_size == o->size;
}

/* Tries the anchor a: its chain to `from`, then on to the head. */
static int chain_via(const pulse_server *srv, const pulse_store_head *head,
                     const pulse_store_object *a, uint64_t from,
                     srv_chain *c, size_t cap) {
  c->npatches = 0;
  c->anchor = *a;
  if (!walk(srv, head, a->step, from, c, cap))
    return 0;
  c->first = c->npatches;
  if (!walk(srv, head, from, pulse_store_head_step(head), c, cap) ||
      !file_present(srv, a))
    return 0;
  for (size_t i = 0; i < c->npatches; i++)
    if (!file_present(srv, &c->patches[i]))
      return 0;
  return 1;
}

pulse_status srv_chain_find(pulse_server *srv, const pulse_store_head *head,
                            uint64_t from, srv_chain *out) {
  memset(out, 0, sizeof *out);
  uint64_t to = pulse_store_head_step(head);
  size_t na = pulse_store_head_anchor_count(head);
  pthread_mutex_lock(&srv->history_lock);
  size_t cap = srv->nhistory + pulse_store_head_patch_count(head) + 1;
  out->patches = calloc(cap, sizeof *out->patches);
  int found = 0;
  /* The newest anchor at or below `from` whose chain is whole: the head's
   * anchors, then the history's, each newest first. */
  for (size_t i = na; out->patches != NULL && !found && i-- > 0;) {
    const pulse_store_object *a = pulse_store_head_anchor(head, i);
    found = a->step <= from && chain_via(srv, head, a, from, out, cap);
  }
  for (size_t i = srv->nhistory; out->patches != NULL && !found && i-- > 0;) {
    const pulse_store_object *a = &srv->history[i];
    found = a->kind == PULSE_STORE_ANCHOR && a->step <= from &&
            chain_via(srv, head, a, from, out, cap);
  }
  pthread_mutex_unlock(&srv->history_lock);
  if (out->patches == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "server: catch-up chain");
  if (found && out->first < out->npatches)
    return PULSE_OK;
  srv_chain_free(out);
  return pulse_fail(PULSE_ERR_NOT_FOUND,
                    "step %" PRIu64 " is not retained (oldest %" PRIu64
                    ", head %" PRIu64
                    ") and the objects that led from it are gone: start from "
                    "an anchor",
                    from, pulse_store_head_oldest_step(head), to);
}

void srv_chain_free(srv_chain *c) {
  free(c->patches);
  c->patches = NULL;
  c->npatches = c->first = 0;
}
