/* test_loco_http.c - the exchange's fetches (loco/transport/peer_http_impl.h) on the
 * project's fetching layer: waits that pick up a blob published later,
 * with backoff and counted retries; deadlines; answers that are no use
 * given up at once; gathers; POSTs. Against loco's own blob server. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "peer_http_impl.h"

static unsigned on_post(void *user, const char *path, const char *id,
                        const char *url, char *reply, size_t cap) {
  (void)user, (void)url;
  snprintf(reply, cap, "{\"path\":\"%s\",\"id\":\"%s\"}", path, id ? id : "");
  return 202;
}

static loco_server *start(char *base, size_t cap) {
  loco_server *s = NULL;
  cr_assert_eq(loco_server_start(on_post, NULL, &s), PULSE_OK, "%s",
               pulse_error_detail());
  snprintf(base, cap, "http://127.0.0.1:%u", (unsigned)loco_server_port(s));
  return s;
}

typedef struct {
  loco_server *s;
  unsigned after_ms;
} late_put;

static void *put_later(void *arg) {
  late_put *p = arg;
  usleep(p->after_ms * 1000u);
  loco_server_put(p->s, "/v1/loco/late", "at last", 7);
  return NULL;
}

Test(loco_http, a_wait_picks_up_a_blob_published_later_with_backoff) {
  char base[64], url[128];
  loco_server *s = start(base, sizeof base);
  snprintf(url, sizeof url, "%s/v1/loco/late", base);
  pulse_fetch_metrics m0, m1;
  loco_http_metrics(&m0);
  late_put p = {s, 150};
  pthread_t t;
  pthread_create(&t, NULL, put_later, &p);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_wait(url, 5000, 100, &b), PULSE_OK, "%s",
               pulse_error_detail());
  pthread_join(t, NULL);
  cr_assert_eq(b.size, 7);
  cr_assert(memcmp(b.data, "at last", 7) == 0);
  loco_http_metrics(&m1);
  uint64_t requests = m1.requests - m0.requests;
  uint64_t retries = m1.retries - m0.retries;
  /* 150 ms of 404s: retried, but with backoff (waits of up to 25 ms), not
   * the 50 tries a fixed 3 ms poll makes. */
  cr_assert_geq(retries, 3);
  cr_assert_leq(requests, 30, "%llu tries", (unsigned long long)requests);
  cr_assert_eq(requests, retries + 1);
  cr_assert_eq(m1.failures - m0.failures, retries);
  cr_assert_geq(m1.wire_bytes - m0.wire_bytes, 7);
  pulse_bytebuf_free(&b);
  loco_server_stop(s);
}

Test(loco_http, a_wait_ends_at_its_timeout_with_io) {
  char base[64], url[128];
  loco_server *s = start(base, sizeof base);
  snprintf(url, sizeof url, "%s/v1/loco/never", base);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  uint64_t t0 = loco_now_ms();
  cr_assert_eq(loco_http_wait(url, 150, 100, &b), PULSE_ERR_IO);
  uint64_t took = loco_now_ms() - t0;
  cr_assert_geq(took, 140);
  cr_assert_lt(took, 2000);
  cr_assert(strstr(pulse_error_detail(), url) != NULL, "%s",
            pulse_error_detail());
  pulse_bytebuf_free(&b);
  loco_server_stop(s);
}

Test(loco_http, a_blob_over_its_limit_is_given_up_at_once) {
  char base[64], url[128];
  loco_server *s = start(base, sizeof base);
  static uint8_t big[5000];
  cr_assert_eq(loco_server_put(s, "/v1/loco/big", big, sizeof big), PULSE_OK);
  snprintf(url, sizeof url, "%s/v1/loco/big", base);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  uint64_t t0 = loco_now_ms();
  cr_assert_eq(loco_http_wait(url, 5000, 100, &b), PULSE_ERR_IO);
  cr_assert_lt(loco_now_ms() - t0, 2000);
  cr_assert(strstr(pulse_error_detail(), "longer than expected") != NULL, "%s",
            pulse_error_detail());
  pulse_bytebuf_free(&b);
  loco_server_stop(s);
}

Test(loco_http, a_gather_says_which_arrived_by_the_deadline) {
  char base[64];
  loco_server *s = start(base, sizeof base);
  loco_server_put(s, "/v1/loco/a", "alpha", 5);
  loco_server_put(s, "/v1/loco/b", "bravo!", 6);
  char urls[3][128];
  loco_fetch t[3];
  memset(t, 0, sizeof t);
  const char *names[3] = {"a", "missing", "b"};
  for (int i = 0; i < 3; i++) {
    snprintf(urls[i], sizeof urls[i], "%s/v1/loco/%s", base, names[i]);
    t[i].url = urls[i];
    t[i].max_bytes = 100;
    t[i].body = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  uint64_t t0 = loco_now_ms();
  cr_assert_eq(loco_http_gather(t, 3, t0 + 200), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_geq(loco_now_ms() - t0, 190, "the missing one is waited for");
  cr_assert(t[0].done && t[0].body.size == 5);
  cr_assert(memcmp(t[0].body.data, "alpha", 5) == 0);
  cr_assert(!t[1].done);
  cr_assert(t[2].done && t[2].body.size == 6);
  cr_assert(memcmp(t[2].body.data, "bravo!", 6) == 0);
  for (int i = 0; i < 3; i++)
    pulse_bytebuf_free(&t[i].body);
  loco_server_stop(s);
}

/* What a peer serves, it can read back without fetching it (the
 * all-to-all writer's relays): a copy, the latest put, empty blobs too. */
Test(loco_http, a_served_blob_is_copied_back_and_a_missing_one_is_not) {
  char base[64];
  loco_server *s = start(base, sizeof base);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_server_copy(s, "/v1/loco/a", &b), 0);
  cr_assert_null(b.data);
  loco_server_put(s, "/v1/loco/a", "alpha", 5);
  loco_server_put(s, "/v1/loco/a", "again!", 6);
  loco_server_put(s, "/v1/loco/empty", "", 0);
  cr_assert_eq(loco_server_copy(s, "/v1/loco/a", &b), 1);
  cr_assert(b.size == 6 && memcmp(b.data, "again!", 6) == 0);
  cr_assert_eq(loco_server_copy(s, "/v1/loco/empty", &b), 1);
  cr_assert(b.size == 0 && b.data != NULL);
  cr_assert_eq(loco_server_copy(s, "/v1/loco/a/more", &b), 0);
  cr_assert_eq(b.size, 0, "a miss leaves out as it was");
  loco_server_drop(s, "/v1/loco/a", 0);
  cr_assert_eq(loco_server_copy(s, "/v1/loco/a", &b), 0);
  pulse_bytebuf_free(&b);
  loco_server_stop(s);
}

Test(loco_http, a_post_gives_the_status_and_a_dead_peer_gives_0) {
  char base[64], url[128];
  loco_server *s = start(base, sizeof base);
  snprintf(url, sizeof url, "%s/v1/loco/join?id=7", base);
  long status = -1;
  cr_assert_eq(loco_http_post(url, 2000, &status), PULSE_OK);
  cr_assert_eq(status, 202);
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_http_get(url, 2000, 100, &b, &status), PULSE_OK);
  cr_assert_eq(status, 404, "a GET of a POST path finds no blob");
  pulse_bytebuf_free(&b);
  loco_server_stop(s);
  cr_assert_eq(loco_http_post(url, 500, &status), PULSE_OK);
  cr_assert_eq(status, 0);
}
