/* auth_post.c - signed POSTs of the trainer exchange (auth_impl.h): the
 * sequence number that makes each one a message its sender sends once,
 * the signed text and the query values, written by the sender and read by
 * the gate of both parts (coordinator_auth.c, collab_auth.c) the same
 * way. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth_impl.h"
#include "store_impl.h"

static _Atomic uint64_t seq_last;
static pthread_once_t seq_once = PTHREAD_ONCE_INIT;

/* From the wall clock: a restarted trainer (same key) still sends numbers
 * above those its earlier run sent, which its peers remember. */
static void seq_start(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  atomic_store(&seq_last,
               (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u);
}

uint64_t loco_auth_seq_next(void) {
  pthread_once(&seq_once, seq_start);
  return atomic_fetch_add(&seq_last, 1) + 1;
}

int loco_auth_post_text(char *dst, size_t cap, const char *text, uint64_t seq) {
  int len = snprintf(dst, cap, "%s&seq=%llu", text, (unsigned long long)seq);
  return len < 0 || (size_t)len >= cap ? -1 : len;
}

void loco_auth_post_query(const loco_sig *sig, char *dst, size_t cap) {
  if (cap == 0)
    return;
  dst[0] = '\0';
  if (!sig->present)
    return;
  char key[65], sh[129];
  store_hex(sig->key, 32, key);
  store_hex(sig->sig, 64, sh);
  snprintf(dst, cap, "&round=%llu&key=%s&sig=%s",
           (unsigned long long)sig->round, key, sh);
}

/* A decimal number that is all of s. */
static int number(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9')
    return 0;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  *out = v;
  return *end == '\0';
}

static int unhex_exact(const char *s, uint8_t *out, size_t n) {
  return s != NULL && strlen(s) == 2 * n && store_unhex(s, 2 * n, out, n) == 0;
}

int loco_auth_post_read(const char *path,
                        const char *(*query)(void *rq, const char *key),
                        void *rq, char *text, size_t cap, loco_sig *sig) {
  memset(sig, 0, sizeof *sig);
  const char *id = query(rq, "id");
  if (id == NULL)
    return -1;
  int has_seq = number(query(rq, "seq"), &sig->seq) && sig->seq != 0;
  if (!has_seq)
    sig->seq = 0;
  /* A join's URL is signed too: where its sender is to be reached. */
  const char *url = query(rq, "url");
  int len = snprintf(text, cap, "%s?id=%s%s%s", path, id,
                     url != NULL ? "&url=" : "", url != NULL ? url : "");
  if (len >= 0 && (size_t)len < cap && has_seq)
    len += snprintf(text + len, cap - (size_t)len, "&seq=%llu",
                    (unsigned long long)sig->seq);
  if (len < 0 || (size_t)len >= cap)
    return -1;
  sig->present = has_seq && number(query(rq, "round"), &sig->round) &&
                 unhex_exact(query(rq, "key"), sig->key, 32) &&
                 unhex_exact(query(rq, "sig"), sig->sig, 64);
  return len;
}
