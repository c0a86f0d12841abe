/* The store server's catch-ups under load and distrust (issue 20, findings
 * 6 and 7): builds off the HTTP threads while health and head answer, no
 * catch-ups from a server without the head's key, and a cached catch-up
 * whose bytes went bad is never served. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "http_testutil.h"
#include "metrics_testutil.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "store_impl.h"
#include "trainer_testutil.h"

/* A store of steps 0..steps (one anchor, at 0) written by a publisher
 * signing with `key`, closed again. */
static char *make_store(int steps, uint64_t scale, const pulse_sign_key *key) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 33, scale);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.key = key;
  o.anchor_every = 0;
  o.keep_patches = 64;
  o.threads = 2;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  for (int s = 0; s <= steps; s++) {
    if (s)
      tu_model_step(&m, 0.01);
    cr_assert_eq(pulse_pub_commit(pub, (uint64_t)s, t, TU_TENSORS, NULL),
                 PULSE_OK, "%s", pulse_error_detail());
  }
  pulse_pub_free(pub);
  tu_model_free(&m);
  return dir;
}

static pulse_server *serve(const char *dir, const pulse_sign_key *key) {
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  so.key = key;
  so.catchup_threads = 1;
  /* Every request waits for its build, however slow (sanitizers, a busy
   * machine): these tests check answers, not the wait's bound. */
  so.catchup_wait_ms = 120000;
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  return srv;
}

typedef struct {
  uint16_t port;
  uint64_t from;
  ht_reply r;
} catchup_call;

static void *catchup_main(void *arg) {
  catchup_call *c = arg;
  char path[64];
  snprintf(path, sizeof path, "/v1/catchup/%" PRIu64, c->from);
  c->r = ht_request(c->port, NULL, path, NULL, NULL);
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

Test(server_catchup, health_and_head_answer_within_100_ms_while_ten_build) {
  pulse_sign_key *key = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  /* About 5.5 M parameters: one build (a state rebuilt from the anchor, a
   * squash) takes about 0.1 s on one thread (several times that under the
   * sanitizers), so ten outlast the measurements below; before, the HTTP
   * threads were busy building for seconds. (At 1.4 M parameters the
   * vectorized class-rank locate made the ten builds end within 0.3 s.) */
  char *dir = make_store(12, 800, key);
  pulse_server *srv = serve(dir, key);
  uint16_t port = pulse_server_port(srv);
  catchup_call calls[10];
  pthread_t tid[10];
  for (int i = 0; i < 10; i++) {
    calls[i] = (catchup_call){port, (uint64_t)i, {0}};
    cr_assert_eq(pthread_create(&tid[i], NULL, catchup_main, &calls[i]), 0);
  }
  /* Until the builds are under way. */
  double t0 = tu_now_s();
  while (tu_server_metric(srv, "pulse_catchup_builds_pending") < 5 &&
         tu_now_s() - t0 < 5)
    usleep(2000);
  double worst = 0, took_all[20];
  int taken = 0;
  for (int k = 0; k < 10; k++) {
    const char *paths[2] = {"/healthz", "/v1/head"};
    for (int p = 0; p < 2; p++) {
      double t = tu_now_s();
      ht_reply r = ht_request(port, NULL, paths[p], NULL, NULL);
      double took = tu_now_s() - t;
      cr_assert_eq(r.status, 200, "%s: %ld", paths[p], r.status);
      ht_reply_free(&r);
      took_all[taken++] = took;
      if (took > worst)
        worst = took;
    }
    usleep(20000);
  }
  /* The measurements were taken while builds were still waiting. */
  long long pending = tu_server_metric(srv, "pulse_catchup_builds_pending");
  for (int i = 0; i < 10; i++)
    pthread_join(tid[i], NULL);
  cr_assert_gt(pending, 0, "the builds ended before the measurements did");
  /* The median is the claim (under 100 ms while builds wait); the worst
   * gets room for a shared CI machine that deschedules this process. Before,
   * the HTTP threads were busy building and requests took seconds. */
  qsort(took_all, (size_t)taken, sizeof took_all[0], cmp_double);
  double median = took_all[taken / 2];
  cr_assert_lt(median, 0.100, "the median health or head request took %.0f ms",
               median * 1e3);
  cr_assert_lt(worst, 1.0, "a health or head request took %.0f ms", worst * 1e3);
  /* Every catch-up was built and answered (the queue holds 16). */
  for (int i = 0; i < 10; i++) {
    cr_assert_eq(calls[i].r.status, 200, "from %d: %ld %s", i,
                 calls[i].r.status, calls[i].r.body ? calls[i].r.body : "");
    pulse_patch *p = NULL;
    cr_assert_eq(pulse_patch_open((uint8_t *)calls[i].r.body,
                                  calls[i].r.size, &p),
                 PULSE_OK);
    cr_assert_eq(pulse_patch_base_step(p), (uint64_t)i);
    cr_assert_eq(pulse_patch_step(p), 12);
    pulse_patch_free(p);
    ht_reply_free(&calls[i].r);
  }
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_builds_total"), 10);
  pulse_server_free(srv);
  pulse_sign_key_free(key);
  tu_rm_rf(dir);
}

Test(server_catchup, a_full_queue_answers_503_with_retry_after) {
  pulse_sign_key *key = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  char *dir = make_store(6, 2, key);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.key = key;
  so.catchup_wait_ms = 0; /* queue and answer at once */
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK);
  uint16_t port = pulse_server_port(srv);
  ht_reply r = ht_request(port, NULL, "/v1/catchup/1", NULL, NULL);
  cr_assert_eq(r.status, 503);
  char v[64];
  cr_assert_not_null(ht_header(&r, "Retry-After", v, sizeof v));
  ht_reply_free(&r);
  /* The build went on: a retry finds it. */
  double t0 = tu_now_s();
  do {
    usleep(10000);
    r = ht_request(port, NULL, "/v1/catchup/1", NULL, NULL);
    if (r.status != 200)
      ht_reply_free(&r);
  } while (r.status != 200 && tu_now_s() - t0 < 10);
  cr_assert_eq(r.status, 200);
  ht_reply_free(&r);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_builds_total"), 1);
  pulse_server_free(srv);
  pulse_sign_key_free(key);
  tu_rm_rf(dir);
}

Test(server_catchup, a_server_without_the_heads_key_builds_no_catchups) {
  pulse_sign_key *key = NULL, *other = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&other), PULSE_OK);
  char *dir = make_store(5, 2, key);
  const pulse_sign_key *keys[2] = {NULL, other};
  for (int k = 0; k < 2; k++) {
    pulse_server *srv = serve(dir, keys[k]);
    ht_reply r =
        ht_request(pulse_server_port(srv), NULL, "/v1/catchup/1", NULL, NULL);
    cr_assert_eq(r.status, 404, "%s key: %ld", k ? "another" : "no", r.status);
    cr_assert(r.body != NULL && strstr(r.body, "key") != NULL, "%s", r.body);
    ht_reply_free(&r);
    cr_assert_eq(tu_server_metric(srv, "pulse_catchup_builds_total"), 0);
    pulse_server_free(srv);
  }
  /* With the head's key it builds; an unsigned store needs none. */
  pulse_server *srv = serve(dir, key);
  ht_reply r =
      ht_request(pulse_server_port(srv), NULL, "/v1/catchup/1", NULL, NULL);
  cr_assert_eq(r.status, 200);
  ht_reply_free(&r);
  pulse_server_free(srv);
  char *plain = make_store(3, 1, NULL);
  srv = serve(plain, NULL);
  r = ht_request(pulse_server_port(srv), NULL, "/v1/catchup/1", NULL, NULL);
  cr_assert_eq(r.status, 200);
  ht_reply_free(&r);
  pulse_server_free(srv);
  pulse_sign_key_free(key);
  pulse_sign_key_free(other);
  tu_rm_rf(dir);
  tu_rm_rf(plain);
}

/* GET /v1/catchup/1: the body must be the patch its ETag names. */
static void get_good_catchup(uint16_t port, uint8_t sha[32], size_t *size) {
  ht_reply r = ht_request(port, NULL, "/v1/catchup/1", NULL, NULL);
  cr_assert_eq(r.status, 200, "%ld %s", r.status, r.body ? r.body : "");
  char etag[80];
  cr_assert_not_null(ht_header(&r, "ETag", etag, sizeof etag));
  uint8_t named[32];
  cr_assert_eq(store_unhex(etag + 1, 64, named, 32), 0);
  store_sha256(r.body, r.size, sha);
  cr_assert_eq(memcmp(sha, named, 32), 0,
               "a catch-up whose bytes are not its ETag's was served");
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open((uint8_t *)r.body, r.size, &p), PULSE_OK);
  pulse_patch_free(p);
  *size = r.size;
  ht_reply_free(&r);
}

/* Flips bytes in the middle of catchup/<sha>.pulse, keeping its size. */
static void corrupt_cached(const char *dir, const uint8_t sha[32]) {
  char hex[65], rel[128], path[600];
  store_hex(sha, 32, hex);
  snprintf(rel, sizeof rel, "catchup/%s.pulse", hex);
  tt_path(path, sizeof path, dir, rel);
  struct stat sb;
  cr_assert_eq(stat(path, &sb), 0, "no cached catch-up at %s", path);
  usleep(20000); /* a later ctime than the write's, at any clock grain */
  for (long at = 100; at < 110 && at < sb.st_size; at++)
    cr_assert_eq(tu_flip(path, at), 0);
  struct stat after;
  cr_assert_eq(stat(path, &after), 0);
  cr_assert_eq(after.st_size, sb.st_size);
}

Test(server_catchup, a_corrupted_cache_entry_is_never_served) {
  pulse_sign_key *key = NULL;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  char *dir = make_store(6, 2, key);
  pulse_server *srv = serve(dir, key);
  uint16_t port = pulse_server_port(srv);
  uint8_t first[32], sha[32];
  size_t size, again;
  get_good_catchup(port, first, &size);
  /* Bad bytes under the same name and size, while the server runs. */
  corrupt_cached(dir, first);
  get_good_catchup(port, sha, &again);
  cr_assert_eq(memcmp(sha, first, 32), 0);
  cr_assert_eq(again, size);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_corrupt_total"), 1);
  get_good_catchup(port, sha, &again);
  pulse_server_free(srv);
  /* ... and before a restart: the new server checks the file first. */
  corrupt_cached(dir, first);
  srv = serve(dir, key);
  port = pulse_server_port(srv);
  get_good_catchup(port, sha, &again);
  cr_assert_eq(memcmp(sha, first, 32), 0);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_corrupt_total"), 1);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_builds_total"), 1);
  /* A good cached file is taken as it is. */
  pulse_server_free(srv);
  srv = serve(dir, key);
  get_good_catchup(pulse_server_port(srv), sha, &again);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_builds_total"), 0);
  cr_assert_eq(tu_server_metric(srv, "pulse_catchup_cache_hits_total"), 1);
  pulse_server_free(srv);
  pulse_sign_key_free(key);
  tu_rm_rf(dir);
}

/* ----------------------------------------------------------------- pinned */

/* A live trainer: a publisher committing into a store its server follows
 * in-process, so the server sees every head. */
typedef struct {
  char *dir;
  tu_model m;
  pulse_sign_key *key;
  pulse_server *srv;
  pulse_pub *pub;
  uint16_t port;
  int step;
  char digest[64][65]; /* the state digest of each step */
} live_store;

static void live_step(live_store *ls) {
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&ls->m, t);
  int s = ++ls->step;
  if (s)
    tu_model_step(&ls->m, 0.01);
  pulse_pub_figures fig;
  cr_assert_eq(pulse_pub_commit(ls->pub, (uint64_t)s, t, TU_TENSORS, &fig),
               PULSE_OK, "%s", pulse_error_detail());
  cr_assert_lt(s, 64);
  snprintf(ls->digest[s], sizeof ls->digest[s], "%s", fig.state_digest);
}

static void live_up(live_store *ls, int steps) {
  memset(ls, 0, sizeof *ls);
  ls->dir = tu_make_dir();
  tu_model_init(&ls->m, 33, 2);
  cr_assert_eq(pulse_sign_key_generate(&ls->key), PULSE_OK);
  ls->srv = serve(ls->dir, ls->key);
  ls->port = pulse_server_port(ls->srv);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = ls->m.info;
  o.tensor_count = TU_TENSORS;
  o.key = ls->key;
  o.anchor_every = 0;
  o.keep_patches = 4; /* the earlier heads' patches leave the head */
  o.threads = 2;
  o.on_head = pulse_server_on_head;
  o.on_head_ctx = ls->srv;
  cr_assert_eq(pulse_pub_create(ls->dir, &o, &ls->pub), PULSE_OK, "%s",
               pulse_error_detail());
  ls->step = -1;
  while (ls->step < steps)
    live_step(ls);
}

static void live_down(live_store *ls) {
  pulse_server_free(ls->srv);
  pulse_pub_free(ls->pub);
  pulse_sign_key_free(ls->key);
  tu_model_free(&ls->m);
  tu_rm_rf(ls->dir);
}

static ht_reply catchup_get(uint16_t port, const char *method,
                            const char *path, const char *const *hdrs) {
  return ht_request(port, method, path, hdrs, NULL);
}

/* The answer's X-Pulse-Signature verifies over from, to, the state digest of
 * step `to`, the body's SHA-256 and size. */
static void check_signed(const live_store *ls, const ht_reply *r, uint64_t from,
                         uint64_t to) {
  char sig_hex[200], digest[80], canon[600];
  cr_assert_not_null(
      ht_header(r, "X-Pulse-Signature", sig_hex, sizeof sig_hex));
  cr_assert_not_null(
      ht_header(r, "X-Pulse-State-Digest", digest, sizeof digest));
  cr_assert_str_eq(digest, ls->digest[to]);
  uint8_t sha[32], sig[64], pub[32];
  char sha_hex[65];
  store_sha256(r->body, r->size, sha);
  store_hex(sha, 32, sha_hex);
  cr_assert_eq(store_unhex(sig_hex, strlen(sig_hex), sig, 64), 0);
  pulse_store_head *head = NULL; /* for the run: every head of the store's */
  cr_assert_eq(pulse_store_head_load(ls->dir, &head), PULSE_OK);
  int len = store_catchup_canon(head, from, to, ls->digest[to], sha_hex,
                                r->size, canon, sizeof canon);
  pulse_store_head_free(head);
  cr_assert_gt(len, 0);
  pulse_sign_key_public(ls->key, pub);
  cr_assert_eq(pulse_sign_verify(pub, canon, (size_t)len, sig), PULSE_OK,
               "the pinned catch-up's signature does not verify with to=%"
               PRIu64, to);
}

Test(server_catchup, a_pinned_catchup_keeps_its_bytes_while_the_head_moves) {
  live_store ls;
  live_up(&ls, 6);
  /* From 2 to the head (6), as an unpinned client had it then. */
  ht_reply then = catchup_get(ls.port, NULL, "/v1/catchup/2", NULL);
  cr_assert_eq(then.status, 200, "%ld %s", then.status, then.body);
  char etag[80], again[80], v[128];
  cr_assert_not_null(ht_header(&then, "ETag", etag, sizeof etag));
  /* The trainer steps on: step 6 leaves the head's retention (keep 4). */
  for (int i = 0; i < 5; i++)
    live_step(&ls);
  ht_reply r = catchup_get(ls.port, NULL, "/v1/catchup/2?to=6", NULL);
  cr_assert_eq(r.status, 200, "%ld %s", r.status, r.body);
  cr_assert_eq(r.size, then.size);
  cr_assert_eq(memcmp(r.body, then.body, r.size), 0,
               "the pinned catch-up is not the bytes served at step 6");
  cr_assert_not_null(ht_header(&r, "ETag", again, sizeof again));
  cr_assert_str_eq(again, etag);
  cr_assert_not_null(ht_header(&r, "X-Pulse-To-Step", v, sizeof v));
  cr_assert_str_eq(v, "6");
  cr_assert_not_null(ht_header(&r, "Cache-Control", v, sizeof v));
  cr_assert(strstr(v, "immutable") != NULL, "Cache-Control: %s", v);
  check_signed(&ls, &r, 2, 6);
  /* The unpinned URL follows the head, as before. */
  ht_reply head = catchup_get(ls.port, NULL, "/v1/catchup/2", NULL);
  cr_assert_eq(head.status, 200);
  cr_assert_not_null(ht_header(&head, "X-Pulse-To-Step", v, sizeof v));
  cr_assert_str_eq(v, "11");
  cr_assert_not_null(ht_header(&head, "Cache-Control", v, sizeof v));
  cr_assert_str_eq(v, "no-cache");
  ht_reply_free(&head);

  /* A download resumed after another head: the ETag and the bytes hold. */
  const char *first_half[] = {"Range: bytes=0-99", NULL};
  ht_reply a = catchup_get(ls.port, NULL, "/v1/catchup/2?to=6", first_half);
  cr_assert_eq(a.status, 206);
  live_step(&ls);
  char if_range[120], *rest[] = {"Range: bytes=100-", if_range, NULL};
  snprintf(if_range, sizeof if_range, "If-Range: %s", etag);
  ht_reply b = catchup_get(ls.port, NULL, "/v1/catchup/2?to=6",
                           (const char *const *)rest);
  cr_assert_eq(b.status, 206, "a resumed range got %ld", b.status);
  cr_assert_eq(a.size + b.size, then.size);
  cr_assert_eq(memcmp(a.body, then.body, a.size), 0);
  cr_assert_eq(memcmp(b.body, then.body + a.size, b.size), 0);
  cr_assert_not_null(ht_header(&b, "ETag", again, sizeof again));
  cr_assert_str_eq(again, etag);
  ht_reply_free(&a);
  ht_reply_free(&b);

  /* Pinned to an earlier head from a step that head does not retain (0,
   * through the history), and to the head itself. */
  ht_reply_free(&r);
  r = catchup_get(ls.port, "HEAD", "/v1/catchup/0?to=8", NULL);
  cr_assert_eq(r.status, 200, "%ld", r.status);
  ht_reply_free(&r);
  char path[64];
  snprintf(path, sizeof path, "/v1/catchup/9?to=%d", ls.step);
  r = catchup_get(ls.port, NULL, path, NULL);
  cr_assert_eq(r.status, 200, "%ld %s", r.status, r.body);
  check_signed(&ls, &r, 9, (uint64_t)ls.step);
  ht_reply_free(&r);
  cr_assert_geq(tu_server_metric(ls.srv, "pulse_catchup_pinned_total"), 5);
  ht_reply_free(&then);
  live_down(&ls);
}

Test(server_catchup, bad_pinned_targets_are_refused_with_a_reason) {
  live_store ls;
  live_up(&ls, 8);
  struct {
    const char *path;
    long status;
    const char *says; /* in the body */
  } bad[] = {
      {"/v1/catchup/2?to=9", 404, "above the head"},
      {"/v1/catchup/2?to=2", 404, "forward"},
      {"/v1/catchup/5?to=3", 404, "forward"},
      {"/v1/catchup/2?to=", 400, "?to="},
      {"/v1/catchup/2?to=x", 400, "?to="},
      {"/v1/catchup/2?to=07", 400, "?to="},
      {"/v1/catchup/2?to=-1", 400, "?to="},
      {"/v1/catchup/2?to=99999999999999999999999", 400, "?to="},
      {"/v1/catchup/2?to=18446744073709551615", 400, "?to="},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ht_reply r = catchup_get(ls.port, NULL, bad[i].path, NULL);
    cr_assert_eq(r.status, bad[i].status, "%s: %ld %s", bad[i].path, r.status,
                 r.body);
    cr_assert(r.body != NULL && strstr(r.body, bad[i].says) != NULL,
              "%s: %s", bad[i].path, r.body);
    ht_reply_free(&r);
  }
  /* A step this server never saw as a head: a new server on the store
   * remembers only the head it found. */
  pulse_server *fresh = serve(ls.dir, ls.key);
  ht_reply r =
      catchup_get(pulse_server_port(fresh), NULL, "/v1/catchup/2?to=6", NULL);
  cr_assert_eq(r.status, 404, "%ld", r.status);
  cr_assert(strstr(r.body, "not a head this server remembers") != NULL, "%s",
            r.body);
  ht_reply_free(&r);
  pulse_server_free(fresh);
  /* An earlier head whose objects are gone (the grace period over): the
   * patch 4 -> 5 deleted. */
  pulse_store_head *head = NULL;
  cr_assert_eq(pulse_store_head_load(ls.dir, &head), PULSE_OK);
  char gone[600];
  for (size_t i = 0; i < pulse_store_head_patch_count(head); i++)
    if (pulse_store_head_patch(head, i)->step == 5) {
      tt_path(gone, sizeof gone, ls.dir, pulse_store_head_patch(head, i)->path);
      cr_assert_eq(unlink(gone), 0, "%s", gone);
    }
  pulse_store_head_free(head);
  r = catchup_get(ls.port, NULL, "/v1/catchup/3?to=6", NULL);
  cr_assert_eq(r.status, 404, "%ld %s", r.status, r.body);
  cr_assert(strstr(r.body, "gone") != NULL, "%s", r.body);
  ht_reply_free(&r);
  /* The server still answers. */
  r = catchup_get(ls.port, NULL, "/healthz", NULL);
  cr_assert_eq(r.status, 200);
  ht_reply_free(&r);
  cr_assert_eq(tu_server_metric(ls.srv, "pulse_catchup_pinned_total"), 0);
  live_down(&ls);
}
