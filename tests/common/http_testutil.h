/* http_testutil.h - a plain libcurl client for the server tests (the store
 * server's and the exchange's): one request to 127.0.0.1, path sent as is,
 * with extra request headers, the whole answer kept. Header-only, for the
 * Criterion suites that link libcurl. */
#ifndef PULSE_HTTP_TESTUTIL_H
#define PULSE_HTTP_TESTUTIL_H

#include <curl/curl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
  CURLcode rc; /* the transfer's result */
  long status; /* 0 when no answer came */
  char *body;  /* NUL-terminated; free with ht_reply_free */
  size_t size;
  char headers[8192];
  size_t hlen;
} ht_reply;

static size_t ht_on_body(char *p, size_t sz, size_t n, void *ctx) {
  ht_reply *r = ctx;
  r->body = realloc(r->body, r->size + sz * n + 1);
  memcpy(r->body + r->size, p, sz * n);
  r->size += sz * n;
  r->body[r->size] = 0;
  return sz * n;
}

static size_t ht_on_header(char *p, size_t sz, size_t n, void *ctx) {
  ht_reply *r = ctx;
  size_t len = sz * n;
  if (r->hlen + len < sizeof r->headers) {
    memcpy(r->headers + r->hlen, p, len);
    r->hlen += len;
    r->headers[r->hlen] = 0;
  }
  return len;
}

/* One request. method: NULL or "GET", "HEAD", "POST" (with `body` when it is
 * not NULL) or any other, sent as a custom request; hdrs: "Name: value"
 * lines, NULL-terminated (may be NULL). */
static inline ht_reply ht_request(uint16_t port, const char *method,
                                  const char *path, const char *const *hdrs,
                                  const char *body) {
  ht_reply r;
  memset(&r, 0, sizeof r);
  char url[1024];
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)port, path);
  CURL *c = curl_easy_init();
  struct curl_slist *list = NULL;
  for (size_t i = 0; hdrs && hdrs[i]; i++)
    list = curl_slist_append(list, hdrs[i]);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, ht_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, ht_on_header);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 20L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (method != NULL && strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (method != NULL && strcmp(method, "POST") == 0 && body != NULL) {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
  } else if (method != NULL && strcmp(method, "GET") != 0) {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  }
  r.rc = curl_easy_perform(c);
  if (r.rc == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(list);
  curl_easy_cleanup(c);
  return r;
}

/* The value of response header `name` (case-insensitive) into out (cut to
 * cap - 1 bytes): out, or NULL when absent. */
static inline const char *ht_header(const ht_reply *r, const char *name,
                                    char *out, size_t cap) {
  size_t n = strlen(name);
  for (const char *p = r->headers; p && *p;
       p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      const char *v = p + n + 1;
      while (*v == ' ')
        v++;
      size_t len = strcspn(v, "\r\n");
      if (len >= cap)
        len = cap - 1;
      memcpy(out, v, len);
      out[len] = 0;
      return out;
    }
  return NULL;
}

static inline void ht_reply_free(ht_reply *r) {
  free(r->body);
  r->body = NULL;
}

#endif /* PULSE_HTTP_TESTUTIL_H */
