/* http_fetch.c - libcurl fetches of the trainer exchange (http_impl.h).
 * Loopback and peer URLs only: proxies from the environment are ignored. */
#include <curl/curl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http_impl.h"
#include "status_impl.h"

#define RETRY_MS 3u

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

uint64_t loco_now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000u + (uint64_t)t.tv_nsec / 1000000u;
}

void loco_sleep_ms(unsigned ms) {
  struct timespec t = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
  nanosleep(&t, NULL);
}

typedef struct {
  pulse_bytebuf *body;
  size_t max;
} sink;

static size_t on_data(char *p, size_t size, size_t n, void *user) {
  sink *k = user;
  size_t bytes = size * n;
  if (bytes > k->max - k->body->size)
    return 0; /* too large: abort the transfer */
  pulse_bytebuf_put(k->body, p, bytes);
  return k->body->failed ? 0 : bytes;
}

static CURL *easy_for(const char *url, unsigned timeout_ms, sink *k) {
  CURL *h = curl_easy_init();
  if (h == NULL)
    return NULL;
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_ms ? timeout_ms : 1u));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                   (long)(timeout_ms ? timeout_ms : 1u));
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http");
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, k);
  return h;
}

static pulse_status request(const char *url, unsigned timeout_ms, size_t max,
                            int post, pulse_bytebuf *body, long *status) {
  pthread_once(&curl_once, curl_init_once);
  pulse_bytebuf scratch = PULSE_BYTEBUF_INIT;
  sink k = {body ? body : &scratch, max};
  k.body->size = 0;
  *status = 0;
  CURL *h = easy_for(url, timeout_ms, &k);
  if (h == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: curl handle");
  if (post) {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
  }
  CURLcode rc = curl_easy_perform(h);
  if (rc == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
  curl_easy_cleanup(h);
  int failed = k.body->failed;
  pulse_bytebuf_free(&scratch);
  if (failed)
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: response of %s", url);
  return PULSE_OK;
}

pulse_status loco_http_get(const char *url, unsigned timeout_ms,
                           size_t max_bytes, pulse_bytebuf *body,
                           long *status) {
  return request(url, timeout_ms, max_bytes, 0, body, status);
}

pulse_status loco_http_post(const char *url, unsigned timeout_ms,
                            long *status) {
  return request(url, timeout_ms, 4096, 1, NULL, status);
}

pulse_status loco_http_wait(const char *url, unsigned timeout_ms,
                            size_t max_bytes, pulse_bytebuf *body) {
  uint64_t end = loco_now_ms() + timeout_ms;
  for (;;) {
    uint64_t now = loco_now_ms();
    if (now >= end)
      return pulse_fail(PULSE_ERR_IO,
                        "loco http: %s did not answer within %u ms", url,
                        timeout_ms);
    long status;
    PULSE_TRY(
        loco_http_get(url, (unsigned)(end - now), max_bytes, body, &status));
    if (status == 200)
      return PULSE_OK;
    loco_sleep_ms(RETRY_MS);
  }
}

pulse_status loco_http_gather(loco_fetch *t, size_t count,
                              uint64_t deadline_ms) {
  pthread_once(&curl_once, curl_init_once);
  CURLM *m = curl_multi_init();
  CURL **h = calloc(count ? count : 1, sizeof *h);
  sink *k = calloc(count ? count : 1, sizeof *k);
  uint64_t *next = calloc(count ? count : 1, sizeof *next);
  if (m == NULL || h == NULL || k == NULL || next == NULL) {
    if (m)
      curl_multi_cleanup(m);
    free(h), free(k), free(next);
    return pulse_fail(PULSE_ERR_NOMEM, "loco http: gather of %zu", count);
  }
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < count; i++) {
    t[i].done = 0;
    k[i].body = &t[i].body;
    k[i].max = t[i].max_bytes;
  }
  for (;;) {
    uint64_t now = loco_now_ms();
    size_t left = 0;
    for (size_t i = 0; i < count; i++)
      left += !t[i].done;
    if (left == 0 || now >= deadline_ms)
      break;
    for (size_t i = 0; i < count; i++)
      if (!t[i].done && h[i] == NULL && now >= next[i]) {
        t[i].body.size = 0;
        h[i] = easy_for(t[i].url, (unsigned)(deadline_ms - now), &k[i]);
        if (h[i] == NULL) {
          st = pulse_fail(PULSE_ERR_NOMEM, "loco http: curl handle");
          goto done;
        }
        curl_easy_setopt(h[i], CURLOPT_PRIVATE, (void *)&t[i]);
        curl_multi_add_handle(m, h[i]);
      }
    int running = 0;
    curl_multi_perform(m, &running);
    CURLMsg *msg;
    int queued;
    while ((msg = curl_multi_info_read(m, &queued)) != NULL) {
      if (msg->msg != CURLMSG_DONE)
        continue;
      size_t i = 0;
      while (i < count && h[i] != msg->easy_handle)
        i++;
      if (i == count)
        continue;
      long status = 0;
      if (msg->data.result == CURLE_OK)
        curl_easy_getinfo(h[i], CURLINFO_RESPONSE_CODE, &status);
      if (status == 200 && !t[i].body.failed)
        t[i].done = 1;
      else
        next[i] = loco_now_ms() + RETRY_MS;
      curl_multi_remove_handle(m, h[i]);
      curl_easy_cleanup(h[i]);
      h[i] = NULL;
    }
    now = loco_now_ms();
    if (now < deadline_ms) {
      uint64_t wait = deadline_ms - now;
      curl_multi_poll(m, NULL, 0, (int)(wait < RETRY_MS ? wait : RETRY_MS),
                      NULL);
    }
  }
done:
  for (size_t i = 0; i < count; i++)
    if (h[i]) {
      curl_multi_remove_handle(m, h[i]);
      curl_easy_cleanup(h[i]);
    }
  curl_multi_cleanup(m);
  free(h), free(k), free(next);
  return st;
}
