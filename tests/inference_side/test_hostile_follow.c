/* Hostile sources against a worker (issue 15, "Hostile networks"): a server
 * that alternates a good head with one signed by a foreign key once made a
 * follower poll 14 times a second and log every refusal; it now backs off
 * on every refused head and logs a repeated refusal once. A server's
 * Retry-After is honoured (within bounds); an object that drips in slower
 * than the minimum rate is given up at its deadline, on every URL, with a
 * clear error. The servers here are scripted (libmicrohttpd, a thread per
 * connection, 127.0.0.1). */
#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "http_fetch_impl.h"
#include "pulse_log.h"
#include "inf_testutil.h"
#include "store_impl.h"

typedef enum { ALTERNATE = 1, RETRY_AFTER, DRIP } script;

typedef struct {
  struct MHD_Daemon *daemon;
  uint16_t port;
  char url[64];
  script mode;
  pulse_buffer good, foreign; /* heads */
  char good_etag[80];
  atomic_int heads, objects; /* requests */
} hostile;

/* A head of step `step` naming one anchor of `size` bytes, signed by key. */
static pulse_buffer make_head(const pulse_sign_key *key, uint64_t step,
                              uint64_t size) {
  pulse_store_object a;
  memset(&a, 0, sizeof a);
  a.kind = PULSE_STORE_ANCHOR;
  a.step = step;
  a.size = size;
  a.sha256[0] = (uint8_t)step;
  store_object_set_path(&a);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = step;
  f.anchors = &a;
  f.nanchors = 1;
  f.version = 2;
  f.run[0] = 9;
  f.published = (uint64_t)time(NULL);
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, key, &b), PULSE_OK, "%s",
               pulse_error_detail());
  return b;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status,
                              const void *body, size_t n, const char *etag) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      n, (void *)body, MHD_RESPMEM_MUST_COPY);
  if (etag != NULL)
    MHD_add_response_header(r, "ETag", etag);
  if (status == 503)
    MHD_add_response_header(r, "Retry-After", "1");
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

/* 2 KiB a second: 205 bytes every 100 ms. */
static ssize_t drip(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)cls;
  if (pos >= 100000)
    return MHD_CONTENT_READER_END_OF_STREAM;
  usleep(100000);
  size_t n = max < 205 ? max : 205;
  memset(buf, 'x', n);
  return (ssize_t)n;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)method, (void)version, (void)upload, (void)upload_size;
  hostile *h = cls;
  if (*state == NULL) { /* headers in: answer at the second call */
    *state = h;
    return MHD_YES;
  }
  if (strncmp(url, "/v1/objects/", 12) == 0) {
    atomic_fetch_add(&h->objects, 1);
    struct MHD_Response *r =
        MHD_create_response_from_callback(100000, 4096, drip, NULL, NULL);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
  }
  if (strcmp(url, "/v1/head") != 0)
    return answer(c, 404, "{}", 2, NULL);
  int n = atomic_fetch_add(&h->heads, 1);
  if (h->mode == RETRY_AFTER && n == 0)
    return answer(c, 503, "{}", 2, NULL);
  if (h->mode == ALTERNATE && n % 2 == 1)
    return answer(c, 200, h->foreign.data, h->foreign.size, NULL);
  const char *inm =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-None-Match");
  if (inm != NULL && strcmp(inm, h->good_etag) == 0)
    return answer(c, 304, "", 0, h->good_etag);
  return answer(c, 200, h->good.data, h->good.size, h->good_etag);
}

static void hostile_up(hostile *h, script mode, const pulse_sign_key *good,
                       const pulse_sign_key *foreign) {
  memset(h, 0, sizeof *h);
  h->mode = mode;
  h->good = make_head(good, 5, 100000);
  h->foreign = make_head(foreign, 6, 100000);
  uint8_t sha[32];
  char hex[65];
  store_sha256(h->good.data, h->good.size, sha);
  store_hex(sha, 32, hex);
  snprintf(h->good_etag, sizeof h->good_etag, "\"%s\"", hex);
  struct sockaddr_in addr = {0};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  h->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_AUTO,
      0, NULL, NULL, handle, h, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_END);
  cr_assert_not_null(h->daemon);
  h->port = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT)->port;
  snprintf(h->url, sizeof h->url, "http://127.0.0.1:%u", (unsigned)h->port);
}

static void hostile_down(hostile *h) {
  MHD_stop_daemon(h->daemon);
  pulse_buffer_free(&h->good);
  pulse_buffer_free(&h->foreign);
}

static pulse_sub_opts opts_for(const char **urls, size_t n, const char *cache,
                               const uint8_t *key) {
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = n;
  o.cache_dir = cache;
  o.public_key = key;
  o.retries = 2;
  o.backoff_ms = 50;
  o.backoff_max_ms = 800;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 5000;
  o.poll_timeout_ms = 2000;
  o.threads = 1;
  return o;
}

static void *follow_thread(void *arg) {
  pulse_sub_follow(arg);
  return NULL;
}

/* Lines of file `path` that contain `needle`. */
static int count_lines(const char *path, const char *needle) {
  size_t n = 0;
  char *text = (char *)tu_read(path, &n);
  int lines = 0;
  for (char *p = text; p != NULL && (p = strstr(p, needle)) != NULL; p++)
    lines++;
  free(text);
  return lines;
}

Test(hostile_follow, a_source_alternating_a_foreign_head_is_backed_off) {
  pulse_sign_key *good, *foreign;
  cr_assert_eq(pulse_sign_key_generate(&good), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&foreign), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(good, pub);
  hostile h;
  hostile_up(&h, ALTERNATE, good, foreign);
  char *work = tu_make_dir(), cache[4096], log[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  snprintf(log, sizeof log, "%s/stderr", work);
  const char *urls[] = {h.url};
  pulse_sub_opts o = opts_for(urls, 1, cache, pub);
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  /* The library's log goes to stderr: count its lines. */
  fflush(stderr);
  int saved = dup(2), fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  cr_assert(saved >= 0 && fd >= 0);
  dup2(fd, 2);
  pulse_log_level_set(PULSE_LOG_WARN);
  pthread_t th;
  double t0 = tu_now_s();
  pthread_create(&th, NULL, follow_thread, sub);
  sleep(4);
  pulse_sub_stop(sub);
  pthread_join(th, NULL);
  double dt = tu_now_s() - t0;
  fflush(stderr);
  dup2(saved, 2);
  close(fd), close(saved);
  int heads = atomic_load(&h.heads);
  int lines = count_lines(log, "head refused");
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  pulse_sub_free(sub);
  /* Unbounded, it asked dozens of times a second; backed off (50 ms
   * doubling to 800 ms) it asks a few times a second at first, then about
   * twice per 800 ms. */
  cr_expect_lt(heads, 30, "%d head requests in %.1f s", heads, dt);
  cr_expect_geq(fig.rejected, 2, "the foreign heads were refused");
  cr_expect_leq(lines, 2, "%d log lines of refused heads in %.1f s", lines,
                dt);
  hostile_down(&h);
  tu_rm_rf(work);
  pulse_sign_key_free(good);
  pulse_sign_key_free(foreign);
}

Test(hostile_follow, retry_after_is_honoured) {
  pulse_sign_key *good;
  cr_assert_eq(pulse_sign_key_generate(&good), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(good, pub);
  hostile h;
  hostile_up(&h, RETRY_AFTER, good, good);
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[] = {h.url};
  pulse_sub_opts o = opts_for(urls, 1, cache, pub);
  o.backoff_ms = 10;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  double t0 = tu_now_s();
  cr_expect_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  double dt = tu_now_s() - t0;
  cr_expect_geq(dt, 0.9, "retried after %.3f s, not after Retry-After: 1", dt);
  cr_expect_lt(dt, 5.0);
  pulse_sub_free(sub);
  hostile_down(&h);
  tu_rm_rf(work);
  pulse_sign_key_free(good);
}

Test(hostile_follow, retry_after_is_bounded) {
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, "http://127.0.0.1:1/");
  x.status = 503;
  const char *cases[][2] = {{"Retry-After: 2\r\n", "2000"},
                            {"Retry-After: 99999999999999999999\r\n", "60000"},
                            {"Retry-After: 86400\r\n", "60000"},
                            {"Retry-After: Wed, 21 Oct 2015 07:28:00 GMT\r\n",
                             "0"},
                            {"Retry-After: -5\r\n", "0"},
                            {"Retry-After:\r\n", "0"},
                            {"X: y\r\n", "0"}};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    snprintf(x.headers, sizeof x.headers, "%s", cases[i][0]);
    x.headers_len = strlen(x.headers);
    cr_expect_eq(pulse_fetch_xfer_retry_after_ms(&x),
                 (unsigned)strtoul(cases[i][1], NULL, 10), "%s", cases[i][0]);
  }
  x.status = 404;
  snprintf(x.headers, sizeof x.headers, "Retry-After: 2\r\n");
  cr_expect_eq(pulse_fetch_xfer_retry_after_ms(&x), 0, "only for 429 and 5xx");
}

Test(hostile_follow, a_dripping_object_is_given_up_at_its_deadline) {
  pulse_sign_key *good;
  cr_assert_eq(pulse_sign_key_generate(&good), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(good, pub);
  hostile a, b;
  hostile_up(&a, DRIP, good, good);
  hostile_up(&b, DRIP, good, good);
  char *work = tu_make_dir(), cache[4096], out[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  snprintf(out, sizeof out, "%s/model.safetensors", work);
  const char *urls[] = {a.url, b.url};
  pulse_sub_opts o = opts_for(urls, 2, cache, pub);
  o.min_bytes_per_s = 100000; /* 100,000 bytes: 1 s, plus 0.5 s */
  o.download_grace_ms = 500;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  cr_assert_eq(pulse_sub_attach_file(sub, out), PULSE_OK);
  double t0 = tu_now_s();
  pulse_status st = pulse_sub_sync(sub);
  double dt = tu_now_s() - t0;
  cr_expect_neq(st, PULSE_OK);
  cr_expect(strstr(pulse_sub_error(sub), "deadline") != NULL, "%s",
            pulse_sub_error(sub));
  /* 1.5 s on each URL, and each was tried. */
  cr_expect(dt > 2.5 && dt < 8, "gave up after %.1f s", dt);
  cr_expect_geq(atomic_load(&a.objects), 1);
  cr_expect_geq(atomic_load(&b.objects), 1);
  pulse_sub_free(sub);
  hostile_down(&a);
  hostile_down(&b);
  tu_rm_rf(work);
  pulse_sign_key_free(good);
}
