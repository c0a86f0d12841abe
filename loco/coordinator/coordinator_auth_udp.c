/* coordinator_auth_udp.c - authenticated PULSELoCo over datagrams
 * (coordinator_auth_impl.h, docs/protocols/loco-exchange.md "Authentication", Datagrams): each
 * sender's signed list of the SHA-256 of its chunks and its end marker,
 * fetched once a round per sender; a datagram admitted only when its
 * digest is in its sender's list; the datagram faults of the tests. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator_auth_impl.h"
#include "coordinator_auth_state.h"
#include "coordinator_impl.h"
#include "endian_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

void loco_auth_lists_clear(loco_node_auth *a) {
  for (size_t i = 0; i < a->nlists; i++)
    free(a->lists[i].digests);
  free(a->lists);
  a->lists = NULL;
  a->nlists = 0;
}

/* ------------------------------------------------------------ datagrams */

static int digest_cmp(const void *x, const void *y) {
  return memcmp(x, y, 32);
}

pulse_status loco_auth_udp_publish(pulse_loco_coord *n, uint64_t r,
                                   const pulse_buffer *chunks, uint64_t nchunks,
                                   const uint8_t *end, size_t end_size) {
  if (n->auth == NULL)
    return PULSE_OK;
  uint8_t *list = malloc(((size_t)nchunks + 1u) * 32u);
  if (list == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco auth: chunk list");
  const uint8_t *p = chunks->data;
  size_t left = chunks->size;
  pulse_status st = PULSE_OK;
  for (uint64_t k = 0; k < nchunks && st == PULSE_OK; k++) {
    size_t cs;
    st = pulse_loco_chunk_size(p, left, &cs);
    if (st == PULSE_OK)
      loco_sha256(p, cs, list + 32u * k);
    p += cs, left -= cs;
  }
  loco_sha256(end, end_size, list + 32u * nchunks);
  char path[64];
  snprintf(path, sizeof path, "/v1/loco/round/%llu/chunks",
           (unsigned long long)r);
  if (st == PULSE_OK)
    st = loco_auth_put(n, path, PULSE_LOCO_AUTH_PAYLOAD, r, list,
                       ((size_t)nchunks + 1u) * 32u);
  free(list);
  return st;
}

/* Sender `id`'s chunk list of round r (fetched once a round: refused or
 * missing, its chunks are all refused this round). */
static const chunk_list *list_of(pulse_loco_coord *n, uint64_t r, int m) {
  loco_node_auth *a = n->auth;
  uint32_t id = n->members[m].id;
  if (a->list_round != r) {
    loco_auth_lists_clear(a);
    a->list_round = r;
  }
  for (size_t i = 0; i < a->nlists; i++)
    if (a->lists[i].id == id)
      return &a->lists[i];
  chunk_list *grown = realloc(a->lists, (a->nlists + 1) * sizeof *grown);
  if (grown == NULL)
    return NULL;
  a->lists = grown;
  chunk_list *l = &a->lists[a->nlists++];
  memset(l, 0, sizeof *l);
  l->id = id;
  uint64_t P = n->ctx->n;
  uint64_t cells = (P + PULSE_LOCO_CHUNK_CELL - 1) / PULSE_LOCO_CHUNK_CELL;
  size_t cap = (size_t)(32u * (cells + P / 64u + 16u));
  char url[160];
  loco_node_url_fmt(url, sizeof url, n->members[m].url,
                    "/v1/loco/round/%llu/chunks", (unsigned long long)r);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  loco_sig sig;
  if (loco_http_wait_signed(url, n->opts.deadline_ms, cap, &b, &sig) ==
      PULSE_OK) {
    n->fetched += b.size;
    loco_auth_count_bytes(n, b.size); /* the list exists for the checks */
    if (b.size % 32u == 0 && loco_auth_accept(n, PULSE_LOCO_AUTH_PAYLOAD, r, id,
                                              &sig, b.data, b.size)) {
      l->digests = malloc(b.size ? b.size : 1u);
      if (l->digests != NULL) {
        memcpy(l->digests, b.data, b.size);
        l->count = b.size / 32u;
        qsort(l->digests, l->count, 32u, digest_cmp);
        l->ok = 1;
      }
    }
  } else {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "loco udp round %llu: no chunk list from trainer %u: %s",
                 (unsigned long long)r, id, pulse_error_detail());
  }
  pulse_bytebuf_free(&b);
  return l;
}

int loco_auth_udp_admit(pulse_loco_coord *n, uint64_t r,
                        const loco_datagram *d) {
  loco_node_auth *a = n->auth;
  int end =
      d->size == LOCO_END_SIZE && pulse_load_le32(d->data) == LOCO_END_MAGIC;
  if (a == NULL || ((d->size < PULSE_LOCO_CHUNK_HEADER ||
                     pulse_load_le32(d->data) != 0x4B434C50u /* "PLCK" */) &&
                    !end))
    return 1; /* neither a chunk nor an end marker: the inbox counts it */
  uint32_t sender = pulse_load_le32(d->data + 8);
  uint64_t round = pulse_load_le64(d->data + 12);
  int m = loco_member_find(n->members, n->nmembers, sender);
  if (round > r || m < 0 || sender == n->id)
    return 1; /* checked in its round; the inbox counts strangers */
  /* The last round's end markers come late whenever a receiver had every
   * chunk before them: they say nothing (the caller ignores them), and
   * are not counted as replays. */
  if (end && round + 1 == r)
    return 1;
  int ok = 0;
  if (round == r) {
    const chunk_list *l = list_of(n, r, m);
    uint8_t sha[32];
    loco_sha256(d->data, d->size, sha);
    ok = l != NULL && l->ok &&
         bsearch(sha, l->digests, l->count, 32u, digest_cmp) != NULL;
  }
  if (!ok) {
    pthread_mutex_lock(&a->lock);
    a->datagrams_refused++;
    a->datagrams_replayed += round < r;
    pthread_mutex_unlock(&a->lock);
  }
  return ok;
}

/* ------------------------------------------------------ fault injection */

unsigned loco_auth_tamper_end(const pulse_loco_coord *n) {
  const loco_node_auth *a = n->auth;
  return a != NULL && (a->tamper.kinds & LOCO_AUTH_TAMPER_END) ? a->tamper.mode
                                                              : 0;
}

const pulse_buffer *loco_auth_udp_outgoing(pulse_loco_coord *n,
                                           const pulse_buffer *chunks,
                                           uint64_t *nchunks) {
  loco_node_auth *a = n->auth;
  if (a == NULL || loco_tamper_mode(&a->tamper, PULSE_LOCO_AUTH_PAYLOAD) !=
                       LOCO_AUTH_TAMPER_REPLAYED)
    return chunks;
  pulse_buffer_free(&a->chunks_prev);
  a->chunks_prev = a->chunks_cur;
  a->nchunks_prev = a->nchunks_cur;
  a->chunks_cur.data = malloc(chunks->size ? chunks->size : 1u);
  a->chunks_cur.size = 0;
  a->nchunks_cur = 0;
  if (a->chunks_cur.data != NULL) {
    memcpy(a->chunks_cur.data, chunks->data, chunks->size);
    a->chunks_cur.size = chunks->size;
    a->nchunks_cur = *nchunks;
  }
  if (a->chunks_prev.data == NULL)
    return chunks; /* the first round: nothing older to replay */
  *nchunks = a->nchunks_prev;
  return &a->chunks_prev;
}
