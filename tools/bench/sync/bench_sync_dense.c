/* bench_sync_dense.c - the dense figure of `pulse-bench sync`: the whole
 * BF16 checkpoint (the publisher's anchor object) downloaded over the same
 * link as the pulse steps, transfer only (no verify, no load), whole or a
 * prefix scaled linearly (said in the output). */
#include <curl/curl.h>
#include <inttypes.h>
#include <stdio.h>

#include "bench_sync_impl.h"
#include "cli_time.h"

static size_t bs_discard(char *p, size_t sz, size_t n, void *ctx) {
  (void)p;
  *(uint64_t *)ctx += sz * n;
  return sz * n;
}

/* Seconds to GET `bytes` (a prefix, or the whole object) of url, the
 * connection's setup left out; -1 on failure. */
static double bs_dense_get(const char *url, uint64_t bytes) {
  CURL *c = curl_easy_init();
  if (c == NULL)
    return -1;
  char range[64];
  snprintf(range, sizeof range, "0-%" PRIu64, bytes - 1);
  uint64_t got = 0;
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_RANGE, range);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, bs_discard);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &got);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  double t0 = pulse_cli_now();
  CURLcode rc = curl_easy_perform(c);
  double t = pulse_cli_since(t0);
  double connect = 0;
  curl_easy_getinfo(c, CURLINFO_CONNECT_TIME, &connect);
  curl_easy_cleanup(c);
  return rc == CURLE_OK && got == bytes ? t - connect : -1;
}

/* The dense figure of a link: the checkpoint (the anchor object) over it,
 * whole or a prefix scaled linearly (bs_dense_bytes). */
void bs_dense(const bs_run *r, const bs_link *lk, const char *base,
              bs_figures *f) {
  char durl[256];
  snprintf(durl, sizeof durl, "%s/%s", base, r->anchor_path);
  f->anchor_size = r->anchor_size;
  f->dense_timed_bytes = bs_dense_bytes(r->a, lk, r->anchor_size);
  f->dense_measured_s = bs_dense_get(durl, f->dense_timed_bytes);
  f->dense_s = f->dense_measured_s >= 0
                   ? f->dense_measured_s * (double)r->anchor_size /
                         (double)f->dense_timed_bytes
                   : -1;
}
