/* auth_key.c - admissions on the wire (auth_impl.h), one text for both
 * parts of the trainer exchange: a member's key blob (GET /v1/loco/key,
 * with its admission when it has one) and the admission a joiner sends
 * with its signed join ("&sponsor=HEX&until=R&asig=HEX"), written and read
 * here for the coordinator exchange and the collaboration alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth_impl.h"
#include "store_impl.h"

static int unhex_exact(const char *s, uint8_t *out, size_t n) {
  return s != NULL && strlen(s) == 2 * n && store_unhex(s, 2 * n, out, n) == 0;
}

int loco_auth_key_blob_write(char *dst, size_t cap, uint32_t id,
                             const uint8_t key[32],
                             const pulse_loco_admission *adm) {
  char k[65], sponsor[65], sig[129];
  store_hex(key, 32, k);
  int len;
  if (adm != NULL) {
    store_hex(adm->sponsor, 32, sponsor);
    store_hex(adm->sig, 64, sig);
    len = snprintf(dst, cap,
                   "{\"id\":%u,\"key\":\"%s\",\"sponsor\":\"%s\",\"until\":%llu,"
                   "\"sig\":\"%s\"}",
                   id, k, sponsor, (unsigned long long)adm->round, sig);
  } else {
    len = snprintf(dst, cap, "{\"id\":%u,\"key\":\"%s\"}", id, k);
  }
  return len < 0 || (size_t)len >= cap ? -1 : len;
}

int loco_auth_key_blob_parse(const uint8_t *data, size_t size, uint32_t *id,
                             uint8_t key[32], int *admitted,
                             pulse_loco_admission *adm) {
  char text[LOCO_AUTH_KEY_BLOB_MAX], k[65], s[65], g[129];
  if (data == NULL || size == 0 || size >= sizeof text ||
      memchr(data, '\0', size) != NULL)
    return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  unsigned long long idv, until;
  int used = 0, more = 0;
  if (sscanf(text, "{\"id\":%llu,\"key\":\"%64[0-9a-f]\"%n", &idv, k, &used) !=
          2 ||
      used == 0 || idv > UINT32_MAX || !unhex_exact(k, key, 32))
    return 0;
  *id = (uint32_t)idv;
  const char *rest = text + used;
  *admitted = 0;
  if (strcmp(rest, "}") == 0)
    return 1;
  if (sscanf(rest,
             ",\"sponsor\":\"%64[0-9a-f]\",\"until\":%llu,\"sig\":\"%128[0-9a-f]"
             "\"}%n",
             s, &until, g, &more) != 3 ||
      more == 0 || rest[more] != '\0' || !unhex_exact(s, adm->sponsor, 32) ||
      !unhex_exact(g, adm->sig, 64))
    return 0;
  memcpy(adm->key, key, 32);
  adm->round = until;
  *admitted = 1;
  return 1;
}

void loco_auth_admission_query(const pulse_loco_admission *adm, char *dst,
                               size_t cap) {
  if (cap == 0)
    return;
  dst[0] = '\0';
  if (adm == NULL)
    return;
  char sponsor[65], asig[129];
  store_hex(adm->sponsor, 32, sponsor);
  store_hex(adm->sig, 64, asig);
  int len = snprintf(dst, cap, "&sponsor=%s&until=%llu&asig=%s", sponsor,
                     (unsigned long long)adm->round, asig);
  if (len < 0 || (size_t)len >= cap)
    dst[0] = '\0'; /* sent without: refused as a join without one */
}

int loco_auth_admission_read(const char *(*query)(void *rq, const char *key),
                             void *rq, const uint8_t key[32],
                             pulse_loco_admission *adm) {
  const char *until = query(rq, "until");
  if (until == NULL || until[0] < '0' || until[0] > '9')
    return 0;
  char *end = NULL;
  unsigned long long u = strtoull(until, &end, 10);
  if (*end != '\0' || !unhex_exact(query(rq, "sponsor"), adm->sponsor, 32) ||
      !unhex_exact(query(rq, "asig"), adm->sig, 64))
    return 0;
  adm->round = u;
  memcpy(adm->key, key, 32);
  return 1;
}
