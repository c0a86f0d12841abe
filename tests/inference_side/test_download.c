/* Downloads: bytes flipped in transit are refused and nothing is applied;
 * a second URL serves when the first one lies; partial downloads resume
 * with Range (also in parallel ranges); garbage in a partial file or a
 * rotten cached object is caught by the hash; a dead server fails cleanly
 * after the retries; a server restarted mid-download is resumed; a stale
 * head is refused. */
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "flip_proxy.h"
#include "inf_testutil.h"

static const pulse_store_object *head_anchor(const char *store,
                                             pulse_store_head **h) {
  cr_assert_eq(pulse_store_head_load(store, h), PULSE_OK);
  size_t n = pulse_store_head_anchor_count(*h);
  return pulse_store_head_anchor(*h, n - 1);
}

static int all_zero(const uint16_t *d, uint64_t n) {
  for (uint64_t i = 0; i < n; i++)
    if (d[i] != 0)
      return 0;
  return 1;
}

static int named_objects(const char *cache) {
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/objects", cache);
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
    n += e->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

Test(inference_side, a_byte_flipped_in_transit_is_refused_and_nothing_applied) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  flip_proxy *px = flip_proxy_start(t.port, 1);
  cr_assert_not_null(px);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  char *cache = tu_make_dir();
  const char *urls[2];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_sub_error(sub), "refused") != NULL, "%s",
            pulse_sub_error(sub));
  cr_assert_geq(flip_proxy_flips(px), 1);
  cr_assert_eq(pulse_sub_step(sub), PULSE_SUB_NO_STEP);
  for (int i = 0; i < TU_TENSORS; i++)
    cr_assert(all_zero(tg.data[i], t.m.numel[i]), "tensor %d was written", i);
  cr_assert_eq(named_objects(cache), 0,
               "a corrupt object got its name in the cache");
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_geq(fig.rejected, 2, "refused, fetched again, refused again");

  /* A worker at step 3 stays at step 3 when the next patches are corrupt. */
  urls[0] = t.url;
  pulse_sub_free(sub);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_free(&tg);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 3));
  pulse_sub_free(sub);
  it_trainer_run(&t, 4, 5, 0.01);
  urls[0] = url;
  o.use_catchup = 0;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_resume(&tg, &t, sub, 3);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT);
  cr_assert(it_targets_equal(&tg, &t, 3),
            "the targets moved on corrupt patches");
  cr_assert_eq(pulse_sub_step(sub), 3);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* A catch-up decoded while it downloads: flipped in transit, it is refused
 * (so are the patches after it) and nothing is applied; straight from the
 * server it streams and brings the worker to the head. */
Test(inference_side, a_catchup_flipped_in_transit_is_refused_and_nothing_applied) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 1, 0.02);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_free(sub);
  /* Steps that mostly revisit the same weights: the catch-up is smaller. */
  it_trainer_run(&t, 2, 9, 0.02);
  flip_proxy *px = flip_proxy_start(t.port, 2);
  cr_assert_not_null(px);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)flip_proxy_port(px));
  urls[0] = url;
  o.retries = 1;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_resume(&tg, &t, sub, 1);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT, "%s", pulse_sub_error(sub));
  cr_assert_geq(flip_proxy_flips(px), 2, "the catch-up and a patch");
  cr_assert(it_targets_equal(&tg, &t, 1), "the targets moved on a corrupt catch-up");
  cr_assert_eq(pulse_sub_step(sub), 1);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.catchups_applied, 0);
  cr_assert_geq(fig.rejected, 1);
  /* Straight from the server. */
  urls[0] = t.url;
  pulse_sub_free(sub);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_resume(&tg, &t, sub, 1);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 9));
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_eq(fig.catchups_applied, 1);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, the_next_url_serves_when_the_first_one_corrupts) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  flip_proxy *px = flip_proxy_start(t.port, 1);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  char *cache = tu_make_dir();
  const char *urls[2];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  urls[1] = t.url;
  o.url_count = 2;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 3));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_geq(fig.rejected, 1);
  cr_assert_geq(flip_proxy_flips(px), 1);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* Writes the first `n` bytes of a store object as a partial download. */
static void plant_part(const char *store, const char *cache,
                       const pulse_store_object *o, const char *suffix,
                       uint64_t from, uint64_t n, int garbage) {
  char path[4096], hex[65];
  snprintf(path, sizeof path, "%s/%s", store, o->path);
  size_t size = 0;
  uint8_t *bytes = tu_read(path, &size);
  cr_assert_not_null(bytes);
  if (garbage)
    memset(bytes + from, 0x42, n);
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", o->sha256[i]);
  snprintf(path, sizeof path, "%s/objects", cache);
  mkdir(path, 0755);
  snprintf(path, sizeof path, "%s/objects/.%s.part%s", cache, hex, suffix);
  cr_assert_eq(tu_write(path, bytes + from, n), 0);
  free(bytes);
}

Test(inference_side, a_partial_download_resumes_with_a_range_request) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 20);
  it_trainer_run(&t, 0, 1, 0.01);
  pulse_store_head *h;
  const pulse_store_object *a = head_anchor(t.dir, &h);
  char *cache = tu_make_dir();
  uint64_t half = a->size / 2;
  plant_part(t.dir, cache, a, "", 0, half, 0);
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.parallel = 1;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.bytes_resumed, half);
  cr_assert_lt(fig.bytes_downloaded, a->size,
               "%" PRIu64 " bytes downloaded for an object of %" PRIu64
               " of which %" PRIu64 " were on disk",
               fig.bytes_downloaded, a->size, half);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, garbage_in_a_partial_download_is_caught_by_the_hash) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 20);
  it_trainer_run(&t, 0, 1, 0.01);
  pulse_store_head *h;
  const pulse_store_object *a = head_anchor(t.dir, &h);
  char *cache = tu_make_dir();
  plant_part(t.dir, cache, a, "", 0, a->size / 3, 1);
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.parallel = 1;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.rejected, 1, "the bad partial file, then a clean download");
  pulse_sub_free(sub);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, large_objects_come_in_parallel_ranges_that_resume) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 200); /* 1.4 M parameters: a 2.8 MB anchor */
  it_trainer_run(&t, 0, 1, 0.01);
  pulse_store_head *h;
  const pulse_store_object *a = head_anchor(t.dir, &h);
  cr_assert_gt(a->size, (uint64_t)2 << 20);
  char *cache = tu_make_dir();
  /* Segments of 1 MiB (4 ranges asked, aligned to 1 MiB): the second
   * segment is partly on disk already. */
  plant_part(t.dir, cache, a, "-1048576", 1 << 20, 300000, 0);
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.parallel = 4;
  o.parallel_min_bytes = 1 << 20;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.bytes_resumed, 300000);
  cr_assert_geq(fig.requests, 1 + 3 + 1,
                "head, three ranges for the anchor, one patch");
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", cache, a->path);
  uint8_t sha[32];
  uint64_t size;
  cr_assert_eq(pulse_store_file_sha256(path, sha, &size), PULSE_OK);
  cr_assert(size == a->size && memcmp(sha, a->sha256, 32) == 0);
  cr_assert_eq(named_objects(cache), 2,
               "the anchor and the patch, no partial file left");
  pulse_sub_free(sub);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, a_rotten_object_in_the_cache_is_fetched_again) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 2, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  pulse_store_head *h;
  const pulse_store_object *a = head_anchor(t.dir, &h);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", cache, a->path);
  cr_assert_eq(tu_flip(path, 200), 0);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 2));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.rejected, 1);
  cr_assert_geq(fig.objects_fetched, 1);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* The servers here are reached through a proxy that can be cut and brought
 * back (a server or link that dies), since a server stopped in-process
 * closes gracefully. */
Test(inference_side, a_dead_server_fails_cleanly_after_the_retries) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 2, 0.01);
  flip_proxy *px = flip_proxy_start(t.port, 0);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK);
  flip_proxy_stop(px);
  it_trainer_run(&t, 3, 4, 0.01);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_IO);
  cr_assert_eq(pulse_sub_step(sub), 2);
  cr_assert(it_targets_equal(&tg, &t, 2));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.retries, o.retries);
  cr_assert_eq(fig.sync_failures, 1);
  cr_assert_eq(fig.last_status, PULSE_ERR_IO);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* Cuts the proxy after a while and brings it back on its port later. */
typedef struct {
  flip_proxy *px;
  uint16_t upstream, port;
  int down_ms, up_ms;
} bounce_arg;

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void *bounce(void *arg) {
  bounce_arg *b = arg;
  sleep_ms(b->down_ms);
  flip_proxy_stop(b->px);
  b->px = NULL;
  sleep_ms(b->up_ms);
  for (int i = 0;
       i < 50 && (b->px = flip_proxy_start_at(b->upstream, 0, b->port)) == NULL;
       i++)
    sleep_ms(20);
  if (b->px != NULL)
    flip_proxy_set_rate(b->px, 1 << 20);
  return NULL;
}

Test(inference_side, a_server_restarted_mid_download_is_resumed,
     .timeout = 60) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 60); /* about 0.4 M parameters: 0.8 MB anchor */
  it_trainer_run(&t, 0, 1, 0.01);
  pulse_store_head *h;
  const pulse_store_object *a = head_anchor(t.dir, &h);
  bounce_arg b = {flip_proxy_start(t.port, 0), t.port, 0, 300, 400};
  cr_assert_not_null(b.px);
  flip_proxy_set_rate(b.px, 1 << 20); /* ~0.8 s for the anchor */
  b.port = flip_proxy_port(b.px);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u", (unsigned)b.port);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  o.parallel = 1;
  o.retries = 8;
  o.backoff_ms = 100;
  o.backoff_max_ms = 400;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  pthread_t th;
  pthread_create(&th, NULL, bounce, &b);
  pulse_status st = pulse_sub_sync(sub);
  pthread_join(th, NULL);
  cr_assert_eq(st, PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 1));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_geq(fig.retries, 1, "the server was away");
  cr_assert_lt(fig.bytes_downloaded, a->size + a->size / 2,
               "%" PRIu64 " bytes for a %" PRIu64 "-byte anchor: not resumed",
               fig.bytes_downloaded, a->size);
  pulse_sub_free(sub);
  flip_proxy_stop(b.px);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, a_stale_head_never_moves_a_worker_back) {
  it_trainer t;
  it_trainer_up(&t, 100, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  /* A copy of the store at step 3, served by an old mirror. */
  char *old = tu_make_dir(), cmd[8192];
  snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", t.dir, old);
  cr_assert_eq(system(cmd), 0);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = old;
  so.threads = 2;
  pulse_server *mirror;
  cr_assert_eq(pulse_server_create(&so, &mirror), PULSE_OK);
  char murl[64];
  snprintf(murl, sizeof murl, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(mirror));
  it_trainer_run(&t, 4, 6, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK);
  cr_assert_eq(pulse_sub_step(sub), 6);
  pulse_sub_free(sub);
  urls[0] = murl;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  cr_assert_eq(pulse_sub_attach_host(sub, t.m.info[0].name, t.m.info[0].ndim,
                                     t.m.info[0].shape, tg.data[0]),
               PULSE_OK);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_BASE_STEP);
  cr_assert(strstr(pulse_sub_error(sub), "older") != NULL, "%s",
            pulse_sub_error(sub));
  cr_assert(memcmp(tg.data[0], t.bits[6][0], t.m.numel[0] * 2) == 0);
  pulse_sub_free(sub);
  pulse_server_free(mirror);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
  tu_rm_rf(old);
}

/* ------------------------------------------------------------ catch-ups */

/* A trainer of about 7000 * scale parameters whose worker (cache `cache`)
 * holds step 1 while the store went on to step 13: 12 steps behind, the
 * signed catch-up is the cheapest route. */
static void twelve_behind(it_trainer *t, char **cache, uint64_t scale) {
  it_trainer_up(t, 100, 32, scale);
  it_trainer_run(t, 0, 1, 0.02);
  *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(t, *cache, urls);
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_run(t, 2, 13, 0.02);
}

/* What a sync planned first: its route and the bytes it meant to fetch. */
typedef struct {
  int plans;
  pulse_sub_route route;
  uint64_t bytes;
} plan_log;

static void log_plan(void *ctx, const pulse_sub_event *ev) {
  plan_log *l = ctx;
  if (ev->type == PULSE_SUB_EV_PLAN && l->plans++ == 0) {
    l->route = ev->route;
    l->bytes = ev->bytes;
  }
}

/* Issue 20, finding 4: with a rate limit, libcurl's own limiter read a
 * burst and then paused longer than the stall window, so the transfer
 * failed as stalled and the in-memory catch-up started over from byte 0 on
 * every retry: the worker never got there. Now the limiter never trips
 * the stall detector, and the catch-up is fetched once, at the rate. */
Test(inference_side, a_rate_limited_worker_far_behind_converges, .timeout = 60) {
  it_trainer t;
  char *cache;
  twelve_behind(&t, &cache, 200);
  /* A server four times faster than the worker's limit (on loopback alone
   * the whole catch-up would arrive in one read). */
  flip_proxy *px = flip_proxy_start(t.port, 0);
  cr_assert_not_null(px);
  flip_proxy_set_rate(px, 200000);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  o.max_recv_bytes_per_s = 50000; /* --limit-rate 50K */
  o.low_speed_seconds = 1;        /* --timeout 1 */
  plan_log pl = {0};
  o.on_event = log_plan;
  o.on_event_ctx = &pl;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  for (int i = 0; i < TU_TENSORS; i++) {
    tg.data[i] = tu_alloc(t.m.numel[i] * 2);
    memcpy(tg.data[i], t.bits[1][i], t.m.numel[i] * 2);
  }
  it_targets_resume(&tg, &t, sub, 1);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cr_assert(it_targets_equal(&tg, &t, 13));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(pl.route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_gt(pl.bytes, 100000, "a catch-up of %" PRIu64 " bytes", pl.bytes);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_eq(fig.retries, 0, "no stall at the rate limit");
  cr_assert_lt(fig.bytes_downloaded, pl.bytes + 20000,
               "%" PRIu64 " bytes downloaded for a %" PRIu64
               "-byte catch-up",
               fig.bytes_downloaded, pl.bytes);
  double s = (double)(t1.tv_sec - t0.tv_sec) +
             1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  cr_assert_gt(s, 0.8 * (double)pl.bytes / 50000.0,
               "%.2f s for %" PRIu64 " bytes: the rate limit was not kept", s,
               pl.bytes);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* A catch-up cut in the middle (twice) is resumed with Range requests
 * from where it stopped, not fetched again from its first byte. */
Test(inference_side, a_catchup_cut_mid_body_resumes, .timeout = 60) {
  it_trainer t;
  char *cache;
  twelve_behind(&t, &cache, 100);
  flip_proxy *px = flip_proxy_start(t.port, 0);
  cr_assert_not_null(px);
  flip_proxy_cut_catchups(px, 30000, 2);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  plan_log pl = {0};
  o.on_event = log_plan;
  o.on_event_ctx = &pl;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  for (int i = 0; i < TU_TENSORS; i++) {
    tg.data[i] = tu_alloc(t.m.numel[i] * 2);
    memcpy(tg.data[i], t.bits[1][i], t.m.numel[i] * 2);
  }
  it_targets_resume(&tg, &t, sub, 1);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 13));
  cr_assert_eq(flip_proxy_cuts(px), 2);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CATCHUP);
  cr_assert_geq(fig.retries, 2);
  cr_assert_lt(fig.bytes_downloaded, pl.bytes + 20000,
               "%" PRIu64 " bytes downloaded for a %" PRIu64
               "-byte catch-up cut twice: not resumed",
               fig.bytes_downloaded, pl.bytes);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* A catch-up that keeps failing (every answer cut before its first byte)
 * is given up after the retries, and the worker takes the patch chain. */
Test(inference_side, a_catchup_that_keeps_failing_falls_back_to_the_chain,
     .timeout = 60) {
  it_trainer t;
  char *cache;
  twelve_behind(&t, &cache, 100);
  flip_proxy *px = flip_proxy_start(t.port, 0);
  cr_assert_not_null(px);
  flip_proxy_cut_catchups(px, 0, -1);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u",
           (unsigned)flip_proxy_port(px));
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = url;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  for (int i = 0; i < TU_TENSORS; i++) {
    tg.data[i] = tu_alloc(t.m.numel[i] * 2);
    memcpy(tg.data[i], t.bits[1][i], t.m.numel[i] * 2);
  }
  it_targets_resume(&tg, &t, sub, 1);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert(it_targets_equal(&tg, &t, 13));
  cr_assert_eq(flip_proxy_cuts(px), (int)o.retries + 1, "%d cuts", flip_proxy_cuts(px));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN);
  cr_assert_eq(fig.catchups_applied, 0);
  cr_assert_eq(fig.patches_applied, 12);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  flip_proxy_stop(px);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* ------------------------------------------------ objects collected early */

/* Removes the store's objects the head no longer names, as a publisher
 * without a grace period does the moment they leave it. */
static void collect_now(const char *store) {
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(store, &h), PULSE_OK);
  char dir[4096], path[8192];
  snprintf(dir, sizeof dir, "%s/objects", store);
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (e->d_name[0] == '.')
      continue;
    int named = 0;
    for (size_t i = 0; i < pulse_store_head_patch_count(h); i++)
      named |= strstr(pulse_store_head_patch(h, i)->path, e->d_name) != NULL;
    for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++)
      named |= strstr(pulse_store_head_anchor(h, i)->path, e->d_name) != NULL;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    if (!named)
      unlink(path);
  }
  closedir(d);
  pulse_store_head_free(h);
}

/* Publishes six steps each time the worker plans, the first `times` times:
 * with an anchor every 3 steps, 2 anchors and 2 patches kept, and what
 * leaves the head collected at once (no grace period), everything the plan
 * named is gone before it is fetched, as when a fast publisher outruns a
 * slow worker. */
typedef struct {
  it_trainer *t;
  int plans, times;
} outrun;

static void outrun_on_plan(void *ctx, const pulse_sub_event *ev) {
  outrun *r = ctx;
  if (ev->type != PULSE_SUB_EV_PLAN || r->plans++ >= r->times)
    return;
  it_trainer_run(r->t, r->t->step + 1, r->t->step + 6, 0.01);
  collect_now(r->t->dir);
}

/* Issue 20, finding 5 (the worker's side): a worker whose next object is
 * gone plans again from what is still there (the newer head's anchor and
 * patches) for as long as the head moves on, instead of giving up after
 * three tries; it converges once its downloads outrun the publisher. */
Test(inference_side, a_worker_whose_objects_are_collected_plans_again) {
  it_trainer t;
  it_trainer_up(&t, 3, 2, 2);
  it_trainer_run(&t, 0, 5, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  outrun r = {&t, 0, 5};
  o.on_event = outrun_on_plan;
  o.on_event_ctx = &r;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert_eq(t.step, 35);
  cr_assert_eq(r.plans, 6, "five plans outrun, then one that went through");
  cr_assert(it_targets_equal(&tg, &t, 35));
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.syncs, 1);
  cr_assert_eq(fig.sync_failures, 0);
  cr_assert_eq(fig.anchors_applied, 1, "only the anchor that arrived");
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}
