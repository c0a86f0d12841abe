/* The HTTP server, bound to 127.0.0.1 port 0 and driven with libcurl: the
 * head, objects with ETags, 304 and Range, refusals, long-polls woken by an
 * in-process commit or by a publisher elsewhere, catch-ups, limits, metrics,
 * and many clients at once. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "http_testutil.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "store_impl.h"
#include "trainer_testutil.h"

typedef ht_reply reply;

/* GET (or another method) with extra request headers; path taken as is;
 * status 0 when no answer came. */
static reply get(uint16_t port, const char *path, const char *const *hdrs,
                 const char *method) {
  return ht_request(port, method, path, hdrs, NULL);
}

/* A store with steps 0..steps, a publisher (kept open) and a server. */
typedef struct {
  char *dir;
  tu_model m;
  pulse_sign_key *key;
  pulse_pub *pub;
  pulse_server *srv;
  uint16_t port;
} fixture;

static void fixture_up(fixture *f, int steps, int wired, int watch) {
  memset(f, 0, sizeof *f);
  f->dir = tu_make_dir();
  tu_model_init(&f->m, 21, 2);
  cr_assert_eq(pulse_sign_key_generate(&f->key), PULSE_OK);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = f->dir;
  so.threads = 2;
  so.watch = watch;
  so.key = f->key;
  so.catchup_threads = 1;
  cr_assert_eq(pulse_server_create(&so, &f->srv), PULSE_OK, "%s",
               pulse_error_detail());
  f->port = pulse_server_port(f->srv);
  cr_assert_gt(f->port, 0);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = f->m.info;
  o.tensor_count = TU_TENSORS;
  o.key = f->key;
  o.anchor_every = 3;
  o.anchor_sync = 1;
  o.threads = 1;
  if (wired) {
    o.on_head = pulse_server_on_head;
    o.on_head_ctx = f->srv;
  }
  cr_assert_eq(pulse_pub_create(f->dir, &o, &f->pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&f->m, t);
  for (int s = 0; s <= steps; s++) {
    if (s)
      tu_model_step(&f->m, 0.02);
    cr_assert_eq(pulse_pub_commit(f->pub, (uint64_t)s, t, TU_TENSORS, NULL),
                 PULSE_OK);
  }
  if (!wired)
    pulse_server_notify(f->srv, -1);
}

static void fixture_down(fixture *f) {
  pulse_server_free(f->srv);
  pulse_pub_free(f->pub);
  pulse_sign_key_free(f->key);
  tu_model_free(&f->m);
  tu_rm_rf(f->dir);
}

static void commit_next(fixture *f, uint64_t step) {
  tu_model_step(&f->m, 0.02);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&f->m, t);
  cr_assert_eq(pulse_pub_commit(f->pub, step, t, TU_TENSORS, NULL), PULSE_OK,
               "%s", pulse_error_detail());
}

static void free_reply(reply *r) {
  ht_reply_free(r);
}

Test(server, head_is_json_with_an_etag_and_answers_304_when_unchanged) {
  fixture f;
  fixture_up(&f, 2, 1, 0);
  reply r = get(f.port, "/v1/head", NULL, NULL);
  cr_assert_eq(r.status, 200);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_parse((uint8_t *)r.body, r.size, &h), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(pulse_store_head_step(h), 2);
  cr_assert(strstr(r.body, "\"url\":\"/v1/objects/") != NULL);
  pulse_store_head_free(h);
  char etag[128], inm[160], v[128];
  cr_assert_not_null(ht_header(&r, "ETag", etag, sizeof etag));
  cr_assert_eq(etag[0], '"', "a strong ETag");
  cr_assert_str_eq(ht_header(&r, "Cache-Control", v, sizeof v), "no-cache");
  cr_assert_str_eq(ht_header(&r, "Content-Type", v, sizeof v),
                   "application/json");
  snprintf(inm, sizeof inm, "If-None-Match: %s", etag);
  const char *hdrs[] = {inm, NULL};
  reply r2 = get(f.port, "/v1/head", hdrs, NULL);
  cr_assert_eq(r2.status, 304);
  cr_assert_eq(r2.size, 0);
  commit_next(&f, 3);
  reply r3 = get(f.port, "/v1/head", hdrs, NULL);
  cr_assert_eq(r3.status, 200, "a new head is a new ETag");
  reply hd = get(f.port, "/v1/head", NULL, "HEAD");
  cr_assert_eq(hd.status, 200);
  cr_assert_eq(hd.size, 0);
  free_reply(&r), free_reply(&r2), free_reply(&r3), free_reply(&hd);
  fixture_down(&f);
}

Test(server, objects_are_immutable_with_ranges_and_conditionals) {
  fixture f;
  fixture_up(&f, 2, 1, 0);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  const pulse_store_object *o = pulse_store_head_anchor(h, 0);
  char url[200], file[600], v[256], etag[80];
  snprintf(url, sizeof url, "/v1/%s", o->path);
  tt_path(file, sizeof file, f.dir, o->path);
  size_t n = 0;
  uint8_t *want = tu_read(file, &n);
  reply r = get(f.port, url, NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, n);
  cr_assert_eq(memcmp(r.body, want, n), 0);
  char hex[65];
  store_hex(o->sha256, 32, hex);
  snprintf(etag, sizeof etag, "\"%s\"", hex);
  cr_assert_str_eq(ht_header(&r, "ETag", v, sizeof v), etag);
  cr_assert_str_eq(ht_header(&r, "Cache-Control", v, sizeof v),
                   "public, max-age=31536000, immutable");
  cr_assert_str_eq(ht_header(&r, "Accept-Ranges", v, sizeof v), "bytes");

  const char *range1[] = {"Range: bytes=10-19", NULL};
  reply a = get(f.port, url, range1, NULL);
  cr_assert_eq(a.status, 206);
  cr_assert_eq(a.size, 10);
  cr_assert_eq(memcmp(a.body, want + 10, 10), 0);
  char cr[96];
  snprintf(cr, sizeof cr, "bytes 10-19/%zu", n);
  cr_assert_str_eq(ht_header(&a, "Content-Range", v, sizeof v), cr);
  const char *suffix[] = {"Range: bytes=-7", NULL};
  reply b = get(f.port, url, suffix, NULL);
  cr_assert_eq(b.status, 206);
  cr_assert_eq(b.size, 7);
  cr_assert_eq(memcmp(b.body, want + n - 7, 7), 0);
  const char *open_end[] = {"Range: bytes=100-", NULL};
  reply c = get(f.port, url, open_end, NULL);
  cr_assert_eq(c.status, 206);
  cr_assert_eq(c.size, n - 100);
  const char *past[] = {"Range: bytes=99999999-", NULL};
  reply d = get(f.port, url, past, NULL);
  cr_assert_eq(d.status, 416);
  snprintf(cr, sizeof cr, "bytes */%zu", n);
  cr_assert_str_eq(ht_header(&d, "Content-Range", v, sizeof v), cr);
  const char *multi[] = {"Range: bytes=0-1,5-6", NULL};
  reply e = get(f.port, url, multi, NULL);
  cr_assert_eq(e.status, 200, "several ranges: the whole object");
  cr_assert_eq(e.size, n);
  char ifr[120];
  snprintf(ifr, sizeof ifr, "If-Range: \"%064d\"", 0);
  const char *stale[] = {"Range: bytes=0-3", ifr, NULL};
  reply g = get(f.port, url, stale, NULL);
  cr_assert_eq(g.status, 200, "If-Range of other bytes: the whole object");
  char inm[120];
  snprintf(inm, sizeof inm, "If-None-Match: \"x\", %s", etag);
  const char *cond[] = {inm, NULL};
  reply i = get(f.port, url, cond, NULL);
  cr_assert_eq(i.status, 304);
  cr_assert_str_eq(ht_header(&i, "ETag", v, sizeof v), etag);
  reply missing = get(
      f.port,
      "/v1/objects/"
      "0000000000000000000000000000000000000000000000000000000000000000.pulse",
      NULL, NULL);
  cr_assert_eq(missing.status, 404);
  cr_assert(strstr(missing.body, "\"error\"") != NULL);
  free(want);
  free_reply(&r), free_reply(&a), free_reply(&b), free_reply(&c),
      free_reply(&d), free_reply(&e);
  free_reply(&g), free_reply(&i), free_reply(&missing);
  pulse_store_head_free(h);
  fixture_down(&f);
}

Test(server, no_request_can_leave_the_store) {
  fixture f;
  fixture_up(&f, 1, 1, 0);
  char secret[600];
  tt_path(secret, sizeof secret, f.dir, "signing-key.pem");
  cr_assert_eq(tu_write(secret, "secret", 6), 0);
  static const struct {
    const char *path;
    long status;
  } cases[] = {
      {"/v1/../head.json", 400},
      {"/v1/objects/../../etc/passwd", 400},
      {"/v1/objects/%2e%2e/signing-key.pem", 400},
      {"/v1/objects/%2E%2E%2Fsigning-key.pem", 400},
      {"/v1/objects/..%5csigning-key.pem", 400},
      {"/v1/objects\\..\\head.json", 400},
      {"/v1/head%00.json", 400},
      {"/v1/objects/%252e%252e/x", 400},
      {"//etc/passwd", 400},
      {"/signing-key.pem", 404},
      {"/head.json", 404},
      {"/v1/objects/signing-key.pem", 404},
      {"/v1/objects/", 404},
      {"/v1/objects/ABCDEF.pulse", 404},
      {"/v1/catchup/abc", 404},
      {"/v1/catchup/01", 404},
      {"/v1/catchup/99999999999999999999999", 404},
      {"/etc/passwd", 404},
      {"/", 404},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    reply r = get(f.port, cases[i].path, NULL, NULL);
    cr_assert_eq(r.status, cases[i].status, "%s: %ld", cases[i].path, r.status);
    cr_assert(r.body != NULL && strstr(r.body, "{\"error\":") == r.body,
              "%s: JSON error", cases[i].path);
    cr_assert(strstr(r.body, "secret") == NULL);
    free_reply(&r);
  }
  reply post = get(f.port, "/v1/head", NULL, "POST");
  cr_assert_eq(post.status, 405);
  char v[64];
  cr_assert_str_eq(ht_header(&post, "Allow", v, sizeof v), "GET, HEAD");
  free_reply(&post);
  reply del = get(f.port, "/v1/head", NULL, "DELETE");
  cr_assert_eq(del.status, 405);
  free_reply(&del);
  /* A symbolic link planted in objects/ under an object's name. */
  char link[700];
  snprintf(link, sizeof link, "%s/objects/%064d.pulse", f.dir, 5);
  cr_assert_eq(symlink(secret, link), 0);
  char url[120];
  snprintf(url, sizeof url, "/v1/objects/%064d.pulse", 5);
  reply l = get(f.port, url, NULL, NULL);
  cr_assert_eq(l.status, 404, "links are not followed");
  free_reply(&l);
  fixture_down(&f);
}

typedef struct {
  uint16_t port;
  char path[128];
  reply r;
  double done;
} poll_job;

static void *poll_main(void *arg) {
  poll_job *j = arg;
  j->r = get(j->port, j->path, NULL, NULL);
  j->done = tu_now_s();
  return NULL;
}

static void wait_waiters(pulse_server *srv, size_t n) {
  for (int i = 0; i < 2000 && pulse_server_waiters(srv) < n; i++)
    usleep(1000);
  cr_assert_eq(pulse_server_waiters(srv), n);
}

Test(server, a_long_poll_wakes_within_milliseconds_of_an_in_process_commit) {
  fixture f;
  fixture_up(&f, 1, 1, 0);
  double worst = 0;
  for (uint64_t step = 2; step <= 6; step++) {
    poll_job j = {f.port, "", {0}, 0};
    snprintf(j.path, sizeof j.path,
             "/v1/head?after=%" PRIu64 "&timeout_ms=20000", step - 1);
    pthread_t th;
    pthread_create(&th, NULL, poll_main, &j);
    wait_waiters(f.srv, 1);
    commit_next(&f, step);
    double moved = tu_now_s();
    pthread_join(th, NULL);
    cr_assert_eq(j.r.status, 200);
    pulse_store_head *h = NULL;
    cr_assert_eq(pulse_store_head_parse((uint8_t *)j.r.body, j.r.size, &h),
                 PULSE_OK);
    cr_assert_eq(pulse_store_head_step(h), step);
    pulse_store_head_free(h);
    if (j.done - moved > worst)
      worst = j.done - moved;
    free_reply(&j.r);
  }
  cr_assert_lt(worst, 0.5, "woken %.3f s after the commit returned", worst);
  /* Already above: no wait at all. */
  reply r = get(f.port, "/v1/head?after=0&timeout_ms=20000", NULL, NULL);
  cr_assert_eq(r.status, 200);
  free_reply(&r);
  pulse_buffer m = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(f.srv, &m), PULSE_OK);
  cr_assert(strstr((char *)m.data, "pulse_longpoll_wakeup_seconds_count 5") !=
                NULL,
            "%s", m.data);
  cr_assert(strstr((char *)m.data, "pulse_commit_duration_seconds_count") !=
            NULL);
  cr_assert(strstr((char *)m.data, "pulse_head_step 6") != NULL);
  pulse_buffer_free(&m);
  fixture_down(&f);
}

Test(server, a_long_poll_follows_a_publisher_it_is_not_wired_to) {
  fixture f;
  fixture_up(&f, 1, 0, 1); /* the server watches head.json */
  poll_job j = {f.port, "/v1/head?after=1&timeout_ms=20000", {0}, 0};
  pthread_t th;
  pthread_create(&th, NULL, poll_main, &j);
  wait_waiters(f.srv, 1);
  commit_next(&f, 2);
  double moved = tu_now_s();
  pthread_join(th, NULL);
  cr_assert_eq(j.r.status, 200);
  cr_assert(strstr(j.r.body, "\"step\":2,") != NULL);
  cr_assert_lt(j.done - moved, 1.0, "inotify or the 250 ms stat: %.3f s",
               j.done - moved);
  free_reply(&j.r);
  fixture_down(&f);
}

Test(server, a_long_poll_times_out_with_the_current_head_and_limits_hold) {
  fixture f;
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  fixture_up(&f, 1, 1, 0);
  double t0 = tu_now_s();
  reply r = get(f.port, "/v1/head?after=1&timeout_ms=300", NULL, NULL);
  double took = tu_now_s() - t0;
  cr_assert_eq(r.status, 200);
  cr_assert(strstr(r.body, "\"step\":1,") != NULL);
  cr_assert_geq(took, 0.29);
  cr_assert_lt(took, 2.0);
  free_reply(&r);
  reply bad = get(f.port, "/v1/head?after=x", NULL, NULL);
  cr_assert_eq(bad.status, 400);
  free_reply(&bad);
  reply bad2 = get(f.port, "/v1/head?timeout_ms=5", NULL, NULL);
  cr_assert_eq(bad2.status, 400);
  free_reply(&bad2);
  /* A server that takes one waiter at a time. */
  pulse_server *small = NULL;
  so.store_dir = f.dir;
  so.max_waiters = 1;
  so.threads = 2;
  cr_assert_eq(pulse_server_create(&so, &small), PULSE_OK);
  poll_job j = {
      pulse_server_port(small), "/v1/head?after=1&timeout_ms=800", {0}, 0};
  pthread_t th;
  pthread_create(&th, NULL, poll_main, &j);
  wait_waiters(small, 1);
  reply busy = get(j.port, "/v1/head?after=1&timeout_ms=800", NULL, NULL);
  cr_assert_eq(busy.status, 503);
  char v[16];
  cr_assert_str_eq(ht_header(&busy, "Retry-After", v, sizeof v), "1");
  free_reply(&busy);
  /* Stopping answers the waiter at once. */
  double stop0 = tu_now_s();
  pulse_server_free(small);
  pthread_join(th, NULL);
  cr_assert_eq(j.r.status, 200);
  cr_assert_lt(j.done - stop0, 0.7);
  free_reply(&j.r);
  fixture_down(&f);
}

/* Applies a downloaded catch-up to the state at `from` rebuilt from the
 * store, and checks it gives the head. */
static void check_catchup(fixture *f, uint64_t from) {
  char path[64];
  snprintf(path, sizeof path, "/v1/catchup/%" PRIu64, from);
  reply r = get(f->port, path, NULL, NULL);
  cr_assert_eq(r.status, 200, "from %" PRIu64 ": %s", from,
               r.body ? r.body : "");
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f->dir, &h), PULSE_OK);
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  cr_assert_eq(pulse_store_state_rebuild(f->dir, h, from, 1, &s), PULSE_OK);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open((uint8_t *)r.body, r.size, &p), PULSE_OK);
  cr_assert_eq(pulse_patch_base_step(p), from);
  cr_assert_eq(pulse_patch_step(p), pulse_store_head_step(h));
  pulse_host_tensor t[TU_TENSORS];
  for (size_t i = 0; i < s.count; i++) {
    t[i].name = s.info[i].name;
    t[i].data = s.bits[i];
    t[i].numel = s.numel[i];
    t[i].digest = NULL;
  }
  cr_assert_eq(pulse_patch_apply(p, t, s.count, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(memcmp(pulse_patch_target_digest(p),
                      pulse_store_head_state_digest(h), 32),
               0);
  /* Signed by the store's key. */
  char sig[200], pub[100], size_s[32], etag[80], digest[80];
  cr_assert_not_null(ht_header(&r, "X-Pulse-Signature", sig, sizeof sig));
  cr_assert_not_null(ht_header(&r, "X-Pulse-Public-Key", pub, sizeof pub));
  cr_assert_not_null(ht_header(&r, "ETag", etag, sizeof etag));
  cr_assert_not_null(
      ht_header(&r, "X-Pulse-State-Digest", digest, sizeof digest));
  snprintf(size_s, sizeof size_s, "%zu", r.size);
  char canon[600], run[2 * PULSE_STORE_RUN_BYTES + 1];
  uint8_t runb[PULSE_STORE_RUN_BYTES];
  cr_assert_eq(pulse_store_head_run(h, runb), 1);
  store_hex(runb, sizeof runb, run);
  int len = snprintf(canon, sizeof canon,
                     "pulse-catchup-signature/2\nrun %s\nfrom %" PRIu64
                     "\nto %" PRIu64
                     "\nstate_digest %s\nsha256 %.64s\nsize %s\n",
                     run, from, pulse_store_head_step(h), digest, etag + 1,
                     size_s);
  uint8_t sigb[64], pubb[32], want[32];
  cr_assert_eq(store_unhex(sig, strlen(sig), sigb, 64), 0);
  cr_assert_eq(store_unhex(pub, strlen(pub), pubb, 32), 0);
  pulse_sign_key_public(f->key, want);
  cr_assert_eq(memcmp(pubb, want, 32), 0);
  cr_assert_eq(pulse_sign_verify(pubb, canon, (size_t)len, sigb), PULSE_OK);
  pulse_patch_free(p);
  pulse_store_state_free(&s);
  pulse_store_head_free(h);
  free_reply(&r);
}

Test(server, catchups_from_every_retained_step_reach_the_head_bit_for_bit) {
  fixture f;
  fixture_up(&f, 7, 1, 0);
  for (uint64_t from = 0; from < 7; from++)
    check_catchup(&f, from);
  check_catchup(&f, 2); /* cached now */
  pulse_buffer m = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(f.srv, &m), PULSE_OK);
  cr_assert(strstr((char *)m.data, "pulse_catchup_builds_total 6") != NULL,
            "%s", m.data);
  cr_assert(strstr((char *)m.data, "pulse_catchup_cache_hits_total 1") != NULL);
  pulse_buffer_free(&m);
  reply head = get(f.port, "/v1/catchup/7", NULL, NULL);
  cr_assert_eq(head.status, 404);
  reply future = get(f.port, "/v1/catchup/9", NULL, NULL);
  cr_assert_eq(future.status, 404);
  free_reply(&head), free_reply(&future);
  /* A new head: the old catch-ups go stale and are rebuilt for it. */
  commit_next(&f, 8);
  check_catchup(&f, 2);
  fixture_down(&f);
}

Test(server, an_empty_store_serves_404_until_its_first_head) {
  char *dir = tu_make_dir();
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK);
  uint16_t port = pulse_server_port(srv);
  reply r = get(port, "/v1/head", NULL, NULL);
  cr_assert_eq(r.status, 404);
  free_reply(&r);
  reply hz = get(port, "/healthz", NULL, NULL);
  cr_assert_eq(hz.status, 200);
  cr_assert(strstr(hz.body, "\"step\":null") != NULL);
  free_reply(&hz);
  poll_job j = {port, "/v1/head?after=0&timeout_ms=20000", {0}, 0};
  pthread_t th;
  pthread_create(&th, NULL, poll_main, &j);
  wait_waiters(srv, 1);
  tu_model m;
  tu_model_init(&m, 1, 1);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.on_head = pulse_server_on_head;
  o.on_head_ctx = srv;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK);
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_OK);
  tu_model_step(&m, 0.02);
  cr_assert_eq(pulse_pub_commit(pub, 1, t, TU_TENSORS, NULL), PULSE_OK);
  pthread_join(th, NULL);
  cr_assert_eq(j.r.status, 200);
  free_reply(&j.r);
  pulse_server_free(srv);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(server, a_damaged_head_file_is_not_served_and_the_last_good_one_stays) {
  fixture f;
  fixture_up(&f, 2, 0, 1);
  char head[600];
  tt_path(head, sizeof head, f.dir, "head.json");
  size_t n = 0;
  uint8_t *good = tu_read(head, &n);
  cr_assert_eq(tu_write(head, good, n / 2), 0);
  pulse_server_notify(f.srv, -1);
  reply r = get(f.port, "/v1/head", NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, n);
  cr_assert_eq(memcmp(r.body, good, n), 0);
  free_reply(&r);
  /* A request is counted when the server finishes it, which can be just
   * after the client has its reply: look again for a moment. */
  static const char counted[] =
      "pulse_http_requests_total{route=\"head\",code=\"200\"} 1";
  reply m = get(f.port, "/metrics", NULL, NULL);
  for (int tries = 0;
       tries < 200 && m.status == 200 && strstr(m.body, counted) == NULL;
       tries++) {
    free_reply(&m);
    usleep(10000);
    m = get(f.port, "/metrics", NULL, NULL);
  }
  cr_assert_eq(m.status, 200);
  /* At least one reload saw the damaged file. The notify and the watcher
   * (inotify on the truncating write, and again on the write) may each read
   * it, so the count is not exactly one. */
  static const char sample[] = "\npulse_head_errors_total ";
  const char *errors = strstr(m.body, sample);
  cr_assert(errors != NULL, "%s", m.body);
  unsigned long long nerrors = strtoull(errors + strlen(sample), NULL, 10);
  cr_assert(nerrors >= 1 && nerrors <= 3, "%llu head errors\n%s", nerrors,
            m.body);
  cr_assert(strstr(m.body, counted) != NULL, "%s", m.body);
  cr_assert(
      strstr(m.body, "# TYPE pulse_http_request_duration_seconds histogram") !=
      NULL);
  free_reply(&m);
  free(good);
  fixture_down(&f);
}

typedef struct {
  uint16_t port;
  char url[200];
  size_t want;
  int ok;
} many_job;

static void *many_main(void *arg) {
  many_job *j = arg;
  for (int k = 0; k < 3; k++) {
    reply r = get(j->port, j->url, NULL, NULL);
    j->ok += r.status == 200 && r.size == j->want;
    free_reply(&r);
  }
  return NULL;
}

Test(server, fifty_clients_at_once_all_get_whole_objects) {
  fixture f;
  fixture_up(&f, 1, 1, 0);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  many_job jobs[50];
  pthread_t th[50];
  for (int i = 0; i < 50; i++) {
    const pulse_store_object *o =
        i % 2 ? pulse_store_head_patch(h, 0) : pulse_store_head_anchor(h, 0);
    jobs[i].port = f.port;
    snprintf(jobs[i].url, sizeof jobs[i].url, "/v1/%s", o->path);
    jobs[i].want = o->size;
    jobs[i].ok = 0;
    pthread_create(&th[i], NULL, many_main, &jobs[i]);
  }
  int ok = 0;
  for (int i = 0; i < 50; i++) {
    pthread_join(th[i], NULL);
    ok += jobs[i].ok;
  }
  cr_assert_eq(ok, 150);
  pulse_store_head_free(h);
  fixture_down(&f);
}

Test(server, bad_options_and_listen_specs_are_refused) {
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_ERR_ARG);
  so.store_dir = "/nonexistent/pulse";
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_ERR_NOT_FOUND);
  char host[64];
  uint16_t port;
  cr_assert_eq(
      pulse_server_parse_listen("127.0.0.1:8080", host, sizeof host, &port),
      PULSE_OK);
  cr_assert_str_eq(host, "127.0.0.1");
  cr_assert_eq(port, 8080);
  cr_assert_eq(pulse_server_parse_listen("[::1]:0", host, sizeof host, &port),
               PULSE_OK);
  cr_assert_str_eq(host, "[::1]");
  cr_assert_eq(pulse_server_parse_listen(":9", host, sizeof host, &port),
               PULSE_OK);
  cr_assert_str_eq(host, "");
  cr_assert_eq(pulse_server_parse_listen("::1:80", host, sizeof host, &port),
               PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_server_parse_listen("host:65536", host, sizeof host, &port),
      PULSE_ERR_ARG);
  cr_assert_eq(pulse_server_parse_listen("host:", host, sizeof host, &port),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_server_parse_listen("host", host, sizeof host, &port),
               PULSE_ERR_ARG);
  /* Two servers cannot share a port. */
  char *dir = tu_make_dir();
  so.store_dir = dir;
  pulse_server *a = NULL, *b = NULL;
  cr_assert_eq(pulse_server_create(&so, &a), PULSE_OK);
  so.port = pulse_server_port(a);
  cr_assert_eq(pulse_server_create(&so, &b), PULSE_ERR_IO);
  pulse_server_free(a);
  pulse_server_free(NULL);
  tu_rm_rf(dir);
}

Test(server, catchups_of_a_store_it_cannot_write_are_kept_in_memory) {
  fixture f;
  fixture_up(&f, 4, 1, 0);
  char cache[600];
  tt_path(cache, sizeof cache, f.dir, "catchup");
  tu_rm_rf(strdup(cache));
  cr_assert_eq(tu_write(cache, "not a folder", 12),
               0); /* every cache write fails */
  check_catchup(&f, 1);
  check_catchup(&f, 1);
  pulse_buffer m = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(f.srv, &m), PULSE_OK);
  cr_assert(strstr((char *)m.data, "pulse_catchup_builds_total 1") != NULL,
            "%s", m.data);
  cr_assert(strstr((char *)m.data, "pulse_catchup_cache_hits_total 1") != NULL);
  pulse_buffer_free(&m);
  unlink(cache);
  fixture_down(&f);
}
