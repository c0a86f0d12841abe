/* sub_catchup.c - what a server says about its catch-up from a step to the
 * head (/v1/catchup/<from>?to=<head step>, docs/protocols/sync.md),
 * checked before a byte of it is fetched: a HEAD request gives its size,
 * the steps and the state it goes between, its SHA-256 (its strong ETag)
 * and the publisher's signature over all of them. A catch-up that passes
 * is then an object like any patch: downloaded into the cache under its SHA-256
 * (objects/.<sha256>.part while partial), so a cut, a retry, a failed sync
 * or a restart resumes it with a Range request (If-Range: its ETag, so the
 * bytes of a newer catch-up never continue an older one), and checked
 * against the signed SHA-256 before anything is committed.
 *
 * The catch-up is pinned to the step of the head the plan was made
 * against (?to=): its bytes stay the same while the trainer steps on, so a
 * download that outlasts the next head still resumes (finding 9 of issue
 * 35). A server from before ?to= ignores the query and answers with the
 * catch-up to its own head: when that is another step, the probe's
 * X-Pulse-To-Step says so and the catch-up is not used (the unpinned URL
 * would give the same one, so there is nothing to fall back to). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "pulse_sign.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"

/* A header holding a decimal number (nothing else). */
static int header_u64(const pulse_fetch_xfer *x, const char *name,
                      uint64_t *out) {
  char v[32];
  if (!pulse_fetch_xfer_header(x, name, v, sizeof v) || v[0] < '0' ||
      v[0] > '9')
    return 0;
  char *end = NULL;
  *out = strtoull(v, &end, 10);
  return end != NULL && *end == '\0';
}

/* The publisher's signature over what the probe said (docs/protocols/sync.md). */
static pulse_status check_signature(pulse_sub *sub, const pulse_fetch_xfer *x,
                                    uint64_t from, uint64_t to,
                                    const char *digest, const char *sha_hex,
                                    uint64_t size) {
  uint8_t sig[64], pub[32];
  char pub_hex[80] = "", sig_hex[200] = "";
  int has_sig =
      pulse_fetch_xfer_header(x, "X-Pulse-Signature", sig_hex,
                              sizeof sig_hex) &&
      pulse_fetch_xfer_header(x, "X-Pulse-Public-Key", pub_hex,
                              sizeof pub_hex) &&
      sub_unhex(sig_hex, strlen(sig_hex), sig, 64) == 0 &&
      sub_unhex(pub_hex, strlen(pub_hex), pub, 32) == 0;
  if (has_sig && sub->have_key) {
    char canon[600];
    int len = store_catchup_canon(sub->head, from, to, digest, sha_hex, size,
                                  canon, sizeof canon);
    if (memcmp(pub, sub->key, 32) != 0)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "catch-up from %" PRIu64 ": signed by another key",
                        from);
    if (len < 0 || pulse_sign_verify(pub, canon, (size_t)len, sig) != PULSE_OK)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "catch-up from %" PRIu64
                        ": the signature does not verify",
                        from);
    return PULSE_OK;
  }
  if (sub->opts.allow_unsigned_catchup)
    return PULSE_OK;
  return pulse_fail(PULSE_ERR_NOT_FOUND,
                    "catch-up from %" PRIu64 ": not signed by the publisher",
                    from);
}

/* Checks a probe's answer against the head; fills o and src. */
static pulse_status describe(pulse_sub *sub, const pulse_fetch_xfer *x,
                             uint64_t from, pulse_store_object *o,
                             sub_source *src) {
  uint64_t head = pulse_store_head_step(sub->head), size = 0, f = 0, t = 0;
  const pulse_state_digest *state = pulse_store_head_state_digest(sub->head);
  char digest[65], d[80] = "", etag[100] = "", sha_hex[65];
  pulse_state_digest_hex(state, digest);
  if (!header_u64(x, "Content-Length", &size) || size == 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND, "catch-up from %" PRIu64
                      ": no size", from);
  if (!header_u64(x, "X-Pulse-From-Step", &f) ||
      !header_u64(x, "X-Pulse-To-Step", &t) ||
      !pulse_fetch_xfer_header(x, "X-Pulse-State-Digest", d, sizeof d) ||
      f != from || t != head || strcmp(d, digest) != 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "catch-up from %" PRIu64 ": it says %" PRIu64
                      " -> %" PRIu64 " (state %s), the head is %" PRIu64
                      " (state %s)",
                      from, f, t, d, head, digest);
  /* Its strong ETag is the SHA-256 of its bytes (docs/protocols/sync.md). */
  if (!pulse_fetch_xfer_header(x, "ETag", etag, sizeof etag) ||
      strlen(etag) != 66 || etag[0] != '"' || etag[65] != '"' ||
      sub_unhex(etag + 1, 64, o->sha256, 32) != 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "catch-up from %" PRIu64 ": no SHA-256 ETag", from);
  store_hex(o->sha256, 32, sha_hex);
  PULSE_TRY(check_signature(sub, x, from, head, digest, sha_hex, size));
  o->kind = PULSE_STORE_PATCH;
  o->step = head;
  o->base_step = from;
  o->size = size;
  snprintf(o->path, sizeof o->path, PULSE_STORE_OBJECTS_DIR "/%s.pulse",
           sha_hex);
  src->url = sub->head_url; /* the server asked, which knows that head */
  snprintf(src->rel, sizeof src->rel, "v1/catchup/%" PRIu64 "?to=%" PRIu64,
           from, head);
  snprintf(src->etag, sizeof src->etag, "%s", etag);
  src->target = *state;
  return PULSE_OK;
}

int sub_catchup_probe(pulse_sub *sub, uint64_t from, pulse_store_object *o,
                      sub_source *src) {
  memset(o, 0, sizeof *o);
  memset(src, 0, sizeof *src);
  if (sub->url_static[sub->head_url])
    return 0; /* a static copy builds nothing: the patches */
  char rel[sizeof src->rel];
  snprintf(rel, sizeof rel, "v1/catchup/%" PRIu64 "?to=%" PRIu64, from,
           pulse_store_head_step(sub->head));
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, NULL);
  x.method = PULSE_FETCH_HEAD;
  x.max_bytes = 1;
  x.timeout_ms = sub->opts.request_timeout_ms;
  pulse_status st = sub_fetch_mem(sub, sub->head_url, rel, &x, "catch-up probe");
  if (st == PULSE_OK && x.status != 200)
    st = pulse_fail(PULSE_ERR_NOT_FOUND, "catch-up probe: HTTP %ld",
                    x.status);
  if (st == PULSE_OK)
    st = describe(sub, &x, from, o, src);
  pulse_fetch_xfer_release(&x);
  if (st == PULSE_ERR_CORRUPT) {
    sub_count(sub, &sub->fig.rejected, 1);
    pulse_sub_event ev = {0};
    ev.type = PULSE_SUB_EV_REJECTED;
    ev.object = rel + 3;
    ev.status = st;
    ev.detail = pulse_error_detail();
    sub_emit(sub, &ev);
  }
  if (st != PULSE_OK)
    PULSE_LOG_AT(st == PULSE_ERR_CORRUPT ? PULSE_LOG_WARN : PULSE_LOG_INFO,
                 "subscriber: %s: using patches", pulse_error_detail());
  return st == PULSE_OK;
}
