/* The trainer exchange's blob server (loco/transport/peer_server.c) on the serving
 * layer (trainer_side/serve/http_serve_impl.h), driven with libcurl on 127.0.0.1
 * port 0: what the layer gives it beyond the old server (strong ETags, 304,
 * Range and If-Range, HEAD, refusals with JSON errors, 405 with Allow,
 * /metrics and /healthz), its POST with query arguments and no body, and
 * uploads (a POST body under LOCO_HOSTED_PREFIX, bounded). */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "peer_http_impl.h"
#include "http_testutil.h"

typedef ht_reply reply;

/* One request; path taken as is; `body` (may be NULL) is sent with POST.
 * The transfer itself must succeed. */
static reply ask(uint16_t port, const char *method, const char *path,
                 const char *const *hdrs, const char *body) {
  if (strcmp(method, "POST") == 0 && body == NULL)
    body = "";
  reply r = ht_request(port, method, path, hdrs, body);
  cr_assert_eq(r.rc, CURLE_OK, "%s %s: %s", method, path,
               curl_easy_strerror(r.rc));
  return r;
}

static void etag_of(const void *data, size_t size, char out[67]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  cr_assert_eq(EVP_Digest(data, size, md, &len, EVP_sha256(), NULL), 1);
  out[0] = '"';
  for (unsigned i = 0; i < 32; i++)
    snprintf(out + 1 + 2 * i, 3, "%02x", md[i]);
  out[65] = '"';
  out[66] = 0;
}

/* A server with one 1000-byte blob at /v1/loco/round/1. */
static loco_server *server_with_blob(uint8_t blob[1000]) {
  for (int i = 0; i < 1000; i++)
    blob[i] = (uint8_t)(i * 7 + 3);
  loco_server *s = NULL;
  cr_assert_eq(loco_server_start(NULL, NULL, &s), PULSE_OK);
  cr_assert_gt(loco_server_port(s), 0);
  cr_assert_eq(loco_server_put(s, "/v1/loco/round/1", blob, 1000), PULSE_OK);
  return s;
}

Test(loco_serve, blobs_have_strong_etags_304_and_ranges) {
  uint8_t blob[1000];
  loco_server *s = server_with_blob(blob);
  uint16_t port = loco_server_port(s);
  char want[67], v[128], inm[120], ir[120];
  etag_of(blob, sizeof blob, want);

  reply r = ask(port, "GET", "/v1/loco/round/1", NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, 1000);
  cr_assert_eq(memcmp(r.body, blob, 1000), 0);
  cr_assert_str_eq(ht_header(&r, "ETag", v, sizeof v), want);
  cr_assert_str_eq(ht_header(&r, "Accept-Ranges", v, sizeof v), "bytes");
  free(r.body);

  snprintf(inm, sizeof inm, "If-None-Match: %s", want);
  const char *cond[] = {inm, NULL};
  r = ask(port, "GET", "/v1/loco/round/1", cond, NULL);
  cr_assert_eq(r.status, 304);
  cr_assert_eq(r.size, 0);
  free(r.body);

  const char *range[] = {"Range: bytes=10-19", NULL};
  r = ask(port, "GET", "/v1/loco/round/1", range, NULL);
  cr_assert_eq(r.status, 206);
  cr_assert_eq(r.size, 10);
  cr_assert_eq(memcmp(r.body, blob + 10, 10), 0);
  cr_assert_str_eq(ht_header(&r, "Content-Range", v, sizeof v),
                   "bytes 10-19/1000");
  free(r.body);

  const char *suffix[] = {"Range: bytes=-5", NULL};
  r = ask(port, "GET", "/v1/loco/round/1", suffix, NULL);
  cr_assert_eq(r.status, 206);
  cr_assert_eq(memcmp(r.body, blob + 995, 5), 0);
  free(r.body);

  const char *past[] = {"Range: bytes=1000-", NULL};
  r = ask(port, "GET", "/v1/loco/round/1", past, NULL);
  cr_assert_eq(r.status, 416);
  cr_assert_str_eq(ht_header(&r, "Content-Range", v, sizeof v), "bytes */1000");
  free(r.body);

  /* A resume of a copy of other bytes gets the whole body. */
  snprintf(ir, sizeof ir, "If-Range: \"%064d\"", 0);
  const char *stale[] = {"Range: bytes=10-19", ir, NULL};
  r = ask(port, "GET", "/v1/loco/round/1", stale, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, 1000);
  free(r.body);
  snprintf(ir, sizeof ir, "If-Range: %s", want);
  const char *fresh[] = {"Range: bytes=10-19", ir, NULL};
  r = ask(port, "GET", "/v1/loco/round/1", fresh, NULL);
  cr_assert_eq(r.status, 206);
  free(r.body);

  r = ask(port, "HEAD", "/v1/loco/round/1", NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, 0);
  free(r.body);
  /* 1000 + 10 + 5 + 1000 + 10: bodies sent, not HEAD, 304 or 416. */
  cr_assert_eq(loco_server_bytes_served(s), 2025);
  loco_server_stop(s);
}

Test(loco_serve, a_replaced_blob_has_a_new_etag_and_a_dropped_one_is_gone) {
  uint8_t blob[1000];
  loco_server *s = server_with_blob(blob);
  uint16_t port = loco_server_port(s);
  char old[67], now[67], v[128], inm[120];
  etag_of(blob, sizeof blob, old);
  blob[500] ^= 1;
  etag_of(blob, sizeof blob, now);
  cr_assert_eq(loco_server_put(s, "/v1/loco/round/1", blob, 1000), PULSE_OK);
  snprintf(inm, sizeof inm, "If-None-Match: %s", old);
  const char *cond[] = {inm, NULL};
  reply r = ask(port, "GET", "/v1/loco/round/1", cond, NULL);
  cr_assert_eq(r.status, 200, "the old tag no longer matches");
  cr_assert_eq(memcmp(r.body, blob, 1000), 0);
  cr_assert_str_eq(ht_header(&r, "ETag", v, sizeof v), now);
  free(r.body);
  loco_server_drop(s, "/v1/loco/round/", 2);
  r = ask(port, "GET", "/v1/loco/round/1", NULL, NULL);
  cr_assert_eq(r.status, 404);
  cr_assert(strstr(r.body, "{\"error\":") == r.body);
  free(r.body);
  loco_server_stop(s);
}

Test(loco_serve, paths_that_name_nothing_and_other_methods_are_refused) {
  uint8_t blob[1000];
  loco_server *s = server_with_blob(blob);
  uint16_t port = loco_server_port(s);
  static const struct {
    const char *method, *path;
    long status;
  } cases[] = {
      {"GET", "/v1/loco/../round/1", 400},
      {"GET", "/v1/loco/%2e%2e/round/1", 400},
      {"GET", "/v1/loco/round/1%00x", 400},
      {"GET", "/v1/loco/round\\1", 400},
      {"GET", "//v1/loco/round/1", 400},
      {"GET", "/v1/loco/round/2", 404},
      {"GET", "/v1/loco/round/1/", 404},
      {"POST", "/v1/loco/../join?id=1", 400},
      {"POST", "/v1/loco/join?id=1", 404}, /* no POST callback here */
      {"PUT", "/v1/loco/round/1", 405},
      {"DELETE", "/v1/loco/round/1", 405},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    reply r = ask(port, cases[i].method, cases[i].path, NULL, NULL);
    cr_assert_eq(r.status, cases[i].status, "%s %s: %ld", cases[i].method,
                 cases[i].path, r.status);
    cr_assert(r.body != NULL && strstr(r.body, "{\"error\":") == r.body,
              "%s %s: JSON error", cases[i].method, cases[i].path);
    if (cases[i].status == 405) {
      char v[64];
      cr_assert_str_eq(ht_header(&r, "Allow", v, sizeof v), "GET, HEAD, POST");
    }
    free(r.body);
  }
  loco_server_stop(s);
}

typedef struct {
  char path[128], id[32], url[128];
  int calls;
} posted;

static unsigned on_post(void *user, const char *path, const char *id,
                        const char *url, char *text, size_t cap) {
  posted *p = user;
  p->calls++;
  snprintf(p->path, sizeof p->path, "%s", path);
  snprintf(p->id, sizeof p->id, "%s", id ? id : "(none)");
  snprintf(p->url, sizeof p->url, "%s", url ? url : "(none)");
  snprintf(text, cap, "{\"pending\":true}");
  return 202;
}

Test(loco_serve, posts_reach_the_callback_with_their_query_and_no_body) {
  posted p;
  memset(&p, 0, sizeof p);
  loco_server *s = NULL;
  cr_assert_eq(loco_server_start(on_post, &p, &s), PULSE_OK);
  uint16_t port = loco_server_port(s);
  reply r =
      ask(port, "POST", "/v1/loco/join?id=7&url=http%3A%2F%2F127.0.0.1%3A9%2F",
          NULL, NULL);
  cr_assert_eq(r.status, 202);
  cr_assert_str_eq(r.body, "{\"pending\":true}");
  cr_assert_eq(p.calls, 1);
  cr_assert_str_eq(p.path, "/v1/loco/join");
  cr_assert_str_eq(p.id, "7");
  cr_assert_str_eq(p.url, "http://127.0.0.1:9/");
  free(r.body);
  r = ask(port, "POST", "/v1/loco/leave", NULL, NULL);
  cr_assert_eq(r.status, 202);
  cr_assert_str_eq(p.id, "(none)");
  free(r.body);
  /* A body is refused before the callback sees the request. */
  r = ask(port, "POST", "/v1/loco/leave?id=3", NULL, "payload");
  cr_assert_eq(r.status, 400);
  cr_assert(strstr(r.body, "{\"error\":") == r.body);
  cr_assert_eq(p.calls, 2);
  free(r.body);
  loco_server_stop(s);
}

Test(loco_serve, metrics_and_healthz_come_with_the_layer) {
  uint8_t blob[1000];
  loco_server *s = server_with_blob(blob);
  uint16_t port = loco_server_port(s);
  reply r = ask(port, "GET", "/v1/loco/round/1", NULL, NULL);
  free(r.body);
  const char *range[] = {"Range: bytes=0-99", NULL};
  r = ask(port, "GET", "/v1/loco/round/1", range, NULL);
  free(r.body);
  r = ask(port, "GET", "/v1/loco/nothing", NULL, NULL);
  free(r.body);
  r = ask(port, "GET", "/v1/../x", NULL, NULL);
  free(r.body);
  r = ask(port, "GET", "/healthz", NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_str_eq(r.body, "{\"status\":\"ok\"}\n");
  free(r.body);
  /* One fetch through the exchange's own client: its counters are on the
   * same page (process-wide, so other tests' fetches may add to them). */
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/loco/round/1",
           (unsigned)port);
  pulse_bytebuf body = PULSE_BYTEBUF_INIT;
  long status = 0;
  cr_assert_eq(loco_http_get(url, 5000, 4096, &body, &status), PULSE_OK);
  cr_assert_eq(status, 200);
  cr_assert_eq(body.size, 1000);
  pulse_bytebuf_free(&body);
  static const char *const want[] = {
      "pulse_http_requests_total{route=\"blob\",code=\"200\"} 2\n",
      "pulse_http_requests_total{route=\"blob\",code=\"206\"} 1\n",
      "pulse_http_requests_total{route=\"blob\",code=\"404\"} 1\n",
      "pulse_http_requests_total{route=\"other\",code=\"400\"} 1\n",
      "pulse_http_requests_total{route=\"healthz\",code=\"200\"} 1\n",
      "pulse_http_response_bytes_total{route=\"blob\"} ",
      "pulse_http_request_duration_seconds_count{route=\"blob\"} 4\n",
      "# TYPE pulse_http_request_duration_seconds histogram\n",
  };
  /* Counted once a request completes, just after its client has it. */
  int ok = 0;
  r.body = NULL;
  for (int tries = 0; tries < 200 && !ok; tries++) {
    if (tries > 0)
      usleep(5000);
    free(r.body);
    r = ask(port, "GET", "/metrics", NULL, NULL);
    cr_assert_eq(r.status, 200);
    ok = 1;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
      ok &= strstr(r.body, want[i]) != NULL;
  }
  cr_assert(ok, "metrics:\n%s", r.body);
  /* Bytes: 1000 + 100 of blob bodies, then the 404's JSON error. */
  const char *b =
      strstr(r.body, "pulse_http_response_bytes_total{route=\"blob\"} ");
  unsigned long long bytes = strtoull(strchr(b, '}') + 2, NULL, 10);
  cr_assert_gt(bytes, 2100); /* and the fetch's 1000 */
  cr_assert_lt(bytes, 2200);
  static const char fetches[] = "\npulse_loco_fetch_requests_total ";
  static const char wire[] = "\npulse_loco_fetch_wire_bytes_total ";
  const char *f = strstr(r.body, fetches), *w = strstr(r.body, wire);
  cr_assert(f != NULL && w != NULL, "metrics:\n%s", r.body);
  cr_assert_geq(strtoull(f + strlen(fetches), NULL, 10), 1);
  cr_assert_geq(strtoull(w + strlen(wire), NULL, 10), 1000);
  cr_assert(strstr(r.body, "# TYPE pulse_loco_fetch_retries_total counter\n") !=
            NULL);
  free(r.body);
  loco_server_stop(s);
}

/* What the upload callback saw. */
typedef struct {
  int calls;
  char path[128], id[16];
  size_t size;
  uint8_t *body;
} uploaded;

static unsigned on_upload(void *user, const char *path, const char *id,
                          const uint8_t *body, size_t size, char *reply,
                          size_t cap) {
  uploaded *u = user;
  u->calls++;
  snprintf(u->path, sizeof u->path, "%s", path);
  snprintf(u->id, sizeof u->id, "%s", id ? id : "(none)");
  free(u->body);
  u->body = size ? malloc(size) : NULL;
  if (size)
    memcpy(u->body, body, size);
  u->size = size;
  snprintf(reply, cap, "{\"stored\":%zu}", size);
  return 200;
}

Test(loco_serve, uploads_reach_their_callback_whole_and_bounded) {
  /* A body of many pieces arrives whole; one byte over the limit is 413
   * and never reaches the callback; a body elsewhere is still 400; a
   * server without uploads refuses one as before; a table-only server
   * listens nowhere but keeps what is put. */
  const size_t limit = 300000;
  uploaded u;
  memset(&u, 0, sizeof u);
  loco_server *s = NULL;
  cr_assert_eq(loco_server_start_uploads("127.0.0.1", NULL, on_upload, &u,
                                         limit, &s),
               PULSE_OK);
  char base[64];
  snprintf(base, sizeof base, "http://127.0.0.1:%u", loco_server_port(s));
  uint8_t *big = malloc(limit + 1);
  for (size_t i = 0; i <= limit; i++)
    big[i] = (uint8_t)(i * 131u + (i >> 9));
  char url[160];
  snprintf(url, sizeof url, "%s/v1/hosted/7/v1/loco/round/2?id=7", base);
  long status = 0;
  pulse_bytebuf answer = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_post_body(url, 5000, big, limit, &answer, &status),
               PULSE_OK);
  cr_assert_eq(status, 200);
  cr_assert_eq(u.calls, 1);
  cr_assert_str_eq(u.path, "/v1/hosted/7/v1/loco/round/2");
  cr_assert_str_eq(u.id, "7");
  cr_assert_eq(u.size, limit);
  cr_assert_eq(memcmp(u.body, big, limit), 0, "the body arrived changed");
  pulse_bytebuf_free(&answer);
  cr_assert_eq(loco_http_post_body(url, 5000, big, limit + 1, NULL, &status),
               PULSE_OK);
  cr_assert_eq(status, 413);
  cr_assert_eq(u.calls, 1, "an oversized body reached the callback");
  cr_assert_eq(loco_http_post_body(url, 5000, NULL, 0, NULL, &status),
               PULSE_OK);
  cr_assert_eq(status, 200);
  cr_assert_eq(u.size, 0);
  snprintf(url, sizeof url, "%s/v1/loco/join?id=7", base);
  cr_assert_eq(loco_http_post_body(url, 5000, big, 10, NULL, &status),
               PULSE_OK);
  cr_assert_eq(status, 400, "a body outside the upload prefix");
  cr_assert_eq(u.calls, 2);
  loco_server_stop(s);

  cr_assert_eq(loco_server_start(NULL, NULL, &s), PULSE_OK);
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/hosted/7/x?id=7",
           loco_server_port(s));
  cr_assert_eq(loco_http_post_body(url, 5000, big, 10, NULL, &status),
               PULSE_OK);
  cr_assert_eq(status, 400, "a server without uploads took a body");
  loco_server_stop(s);

  cr_assert_eq(loco_server_start_uploads(NULL, NULL, NULL, NULL, 0, &s),
               PULSE_OK);
  cr_assert_eq(loco_server_port(s), 0);
  cr_assert_eq(loco_server_put(s, "/a", big, 10), PULSE_OK);
  loco_server_stop(s);
  free(big);
  free(u.body);
}
