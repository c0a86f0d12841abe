/* test_http_fetch.c - the fetching layer itself (inference_side/
 * http_fetch_impl.h): retries with backoff, the error vocabulary, memory
 * and file sinks, Range and If-Range resume, the rate limit, POST,
 * retries to a deadline, parallel gathers, stopping, metrics. Against script_server.h's scripted
 * answers, and the store server for real objects. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http_fetch_impl.h"
#include "inf_testutil.h"
#include "script_server.h"

static script_server *srv;

static void up(void) {
  srv = ss_start();
  cr_assert_not_null(srv);
}

static void down(void) {
  ss_stop(srv);
}

static void url_of(const char *path, char *out, size_t cap) {
  snprintf(out, cap, "http://127.0.0.1:%u%s", (unsigned)ss_port(srv), path);
}

static pulse_fetch *engine(unsigned backoff_ms, unsigned backoff_max_ms) {
  pulse_fetch_opts o;
  memset(&o, 0, sizeof o);
  o.backoff_ms = backoff_ms;
  o.backoff_max_ms = backoff_max_ms;
  o.no_proxy = 1;
  o.seed = 42;
  pulse_fetch *f = NULL;
  cr_assert_eq(pulse_fetch_create(&o, &f), PULSE_OK, "%s",
               pulse_error_detail());
  return f;
}

static void xfer(pulse_fetch_xfer *x, const char *path) {
  char u[128];
  url_of(path, u, sizeof u);
  pulse_fetch_xfer_init(x, u);
  x->max_bytes = 1u << 20;
  x->timeout_ms = 10000;
}

typedef struct {
  unsigned calls;
  unsigned attempts[16];
  unsigned delays[16];
} retry_log;

static void on_retry(void *ctx, const pulse_fetch_xfer *x, unsigned attempt,
                     unsigned delay_ms, pulse_status st) {
  (void)x, (void)st;
  retry_log *l = ctx;
  if (l->calls < 16) {
    l->attempts[l->calls] = attempt;
    l->delays[l->calls] = delay_ms;
  }
  l->calls++;
}

/* ---------------------------------------------------------------- retry */

Test(http_fetch, retries_with_backoff_until_the_server_recovers, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(20, 60);
  pulse_fetch_xfer x;
  xfer(&x, "/flaky/3");
  retry_log l = {0};
  pulse_fetch_retry r = {.retries = 5, .on_retry = on_retry, .ctx = &l};
  uint64_t t0 = pulse_fetch_now_ms();
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "flaky"), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t took = pulse_fetch_now_ms() - t0;
  cr_assert_eq(x.status, 200);
  cr_assert_eq(x.mem.size, 9);
  cr_assert(memcmp(x.mem.data, "recovered", 9) == 0);
  /* Three retries, 20, 40, 60 (capped) ms times a factor in [0.5, 1]. */
  cr_assert_eq(l.calls, 3);
  unsigned full[3] = {20, 40, 60};
  for (unsigned i = 0; i < 3; i++) {
    cr_assert_eq(l.attempts[i], i + 1);
    cr_assert_geq(l.delays[i], full[i] / 2, "retry %u waited %u ms", i,
                  l.delays[i]);
    cr_assert_leq(l.delays[i], full[i]);
  }
  cr_assert_geq(took, (uint64_t)(l.delays[0] + l.delays[1] + l.delays[2]));
  pulse_fetch_metrics m;
  pulse_fetch_metrics_get(f, &m);
  cr_assert_eq(m.requests, 4);
  cr_assert_eq(m.retries, 3);
  cr_assert_eq(m.failures, 3);
  cr_assert_eq(ss_requests(srv, NULL, 0), 4);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, gives_up_after_its_retries_with_the_cause, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/flaky/100");
  pulse_fetch_retry r = {.retries = 2};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "flaky"), PULSE_ERR_IO);
  const char *d = pulse_error_detail();
  cr_assert(strstr(d, "flaky: GET http://127.0.0.1:") != NULL, "%s", d);
  cr_assert(strstr(d, "/flaky/100: HTTP 503 busy") != NULL, "%s", d);
  cr_assert_eq(ss_requests(srv, NULL, 0), 3);
  pulse_fetch_metrics m;
  pulse_fetch_metrics_get(f, &m);
  cr_assert_eq(m.retries, 2);
  cr_assert_eq(m.failures, 3);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, not_found_and_gone_are_not_found_and_not_retried, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  const char *paths[2] = {"/missing", "/gone"};
  long codes[2] = {404, 410};
  for (int i = 0; i < 2; i++) {
    pulse_fetch_xfer x;
    xfer(&x, paths[i]);
    pulse_fetch_retry r = {.retries = 5};
    cr_assert_eq(pulse_fetch_get(f, &x, &r, "object"), PULSE_ERR_NOT_FOUND);
    cr_assert_eq(x.status, codes[i]);
    cr_assert(strstr(pulse_error_detail(), paths[i]) != NULL, "%s",
              pulse_error_detail());
    pulse_fetch_xfer_release(&x);
  }
  cr_assert_eq(ss_requests(srv, NULL, 0), 2);
  pulse_fetch_free(f);
}

Test(http_fetch, a_connection_refused_is_io_and_retried) {
  pulse_fetch *f = engine(1, 2);
  script_server *gone = ss_start();
  cr_assert_not_null(gone);
  char u[128];
  snprintf(u, sizeof u, "http://127.0.0.1:%u/blob", (unsigned)ss_port(gone));
  ss_stop(gone); /* nobody listens there now */
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, u);
  x.max_bytes = 100;
  pulse_fetch_retry r = {.retries = 2};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "peer"), PULSE_ERR_IO);
  cr_assert(strstr(pulse_error_detail(), u) != NULL, "%s",
            pulse_error_detail());
  pulse_fetch_metrics m;
  pulse_fetch_metrics_get(f, &m);
  cr_assert_eq(m.requests, 3);
  cr_assert_eq(m.retries, 2);
  pulse_fetch_free(f);
}

/* ---------------------------------------------------------------- sinks */

Test(http_fetch, a_body_over_max_bytes_is_refused_not_retried, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/blob");
  x.max_bytes = SS_BLOB_SIZE - 1;
  pulse_fetch_retry r = {.retries = 3};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "blob"), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "longer than expected") != NULL, "%s",
            pulse_error_detail());
  cr_assert(x.too_long);
  cr_assert_leq(x.mem.size, SS_BLOB_SIZE - 1);
  cr_assert_eq(ss_requests(srv, NULL, 0), 1);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, the_callers_buffer_is_kept_while_the_body_fits, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/blob");
  uint8_t *mine = malloc(SS_BLOB_SIZE);
  pulse_bytebuf_adopt(&x.mem, mine, SS_BLOB_SIZE);
  x.max_bytes = SS_BLOB_SIZE;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "blob"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.mem.data, mine);
  cr_assert_eq(x.mem.size, SS_BLOB_SIZE);
  for (uint64_t i = 0; i < SS_BLOB_SIZE; i++)
    cr_assert_eq(mine[i], ss_blob_byte(i), "byte %llu", (unsigned long long)i);
  char etag[32];
  cr_assert(pulse_fetch_xfer_header(&x, "etag", etag, sizeof etag));
  cr_assert_str_eq(etag, "\"v1\"");
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, a_range_goes_to_its_place_in_a_file, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  char path[] = "/tmp/pulse_fetch_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  pulse_fetch_xfer x;
  xfer(&x, "/blob");
  x.fd = fd;
  x.fd_origin = 1000;
  x.expect_total = SS_BLOB_SIZE;
  x.ranged = 1;
  x.range_from = 1000;
  x.range_to = 50999;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "range"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.status, 206);
  cr_assert_eq(x.received, 50000);
  uint8_t *got = malloc(50001);
  cr_assert_eq(pread(fd, got, 50001, 0), 50000);
  for (uint64_t i = 0; i < 50000; i++)
    cr_assert_eq(got[i], ss_blob_byte(1000 + i));
  ss_request q;
  ss_requests(srv, &q, 1);
  cr_assert_str_eq(q.range, "bytes=1000-50999");
  free(got);
  close(fd);
  pulse_fetch_free(f);
}

Test(http_fetch, a_206_for_another_range_is_corrupt_and_retried, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  char path[] = "/tmp/pulse_fetch_XXXXXX";
  int fd = mkstemp(path);
  unlink(path);
  pulse_fetch_xfer x;
  xfer(&x, "/wrongrange");
  x.fd = fd;
  x.fd_origin = 500;
  x.ranged = 1;
  x.range_from = 500;
  pulse_fetch_retry r = {.retries = 1};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "range"), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "not the range asked for") != NULL,
            "%s", pulse_error_detail());
  cr_assert_eq(ss_requests(srv, NULL, 0), 2);
  struct stat sb;
  fstat(fd, &sb);
  cr_assert_eq(sb.st_size, 0, "nothing of a wrong range is written");
  close(fd);
  pulse_fetch_free(f);
}

/* --------------------------------------------------------------- resume */

static void check_blob(const pulse_fetch_xfer *x) {
  cr_assert_eq(x->mem.size, SS_BLOB_SIZE);
  for (uint64_t i = 0; i < SS_BLOB_SIZE; i++)
    cr_assert_eq(x->mem.data[i], ss_blob_byte(i), "byte %llu",
                 (unsigned long long)i);
}

Test(http_fetch, a_cut_memory_body_resumes_where_it_stopped, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/cut/100000");
  x.resume = 1;
  pulse_fetch_retry r = {.retries = 3};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "cut"), PULSE_OK, "%s",
               pulse_error_detail());
  check_blob(&x);
  cr_assert_eq(x.status, 206);
  ss_request q[4];
  cr_assert_eq(ss_requests(srv, q, 4), 2);
  cr_assert_str_eq(q[0].range, "");
  cr_assert_str_eq(q[1].if_range, "\"v1\"");
  unsigned long long from = 0;
  cr_assert_eq(sscanf(q[1].range, "bytes=%llu-", &from), 1, "%s", q[1].range);
  cr_assert_gt(from, 0);
  cr_assert_leq(from, 100000);
  /* Only the rest came again: every body byte arrived once. */
  pulse_fetch_metrics m;
  pulse_fetch_metrics_get(f, &m);
  cr_assert_eq(m.wire_bytes, SS_BLOB_SIZE);
  cr_assert_eq(m.retries, 1);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, a_body_that_changed_is_fetched_whole_again, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/etag2/100000");
  x.resume = 1;
  pulse_fetch_retry r = {.retries = 3};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "etag2"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.status, 200);
  check_blob(&x);
  ss_request q[4];
  cr_assert_eq(ss_requests(srv, q, 4), 2);
  cr_assert_str_eq(q[1].if_range, "\"v1\"");
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, without_resume_a_cut_body_starts_over, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/cut/100000");
  pulse_fetch_retry r = {.retries = 3};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "cut"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.status, 200);
  check_blob(&x);
  ss_request q[4];
  cr_assert_eq(ss_requests(srv, q, 4), 2);
  cr_assert_str_eq(q[1].range, "");
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

/* A file download resumed under If-Range: the same version continues, a
 * changed one is refused (its bytes would not continue ours). */
static void resume_file(const char *path, int fd, pulse_status want) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, path);
  x.fd = fd;
  x.expect_total = SS_BLOB_SIZE;
  snprintf(x.if_range, sizeof x.if_range, "\"v1\"");
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "first"), PULSE_ERR_IO);
  uint64_t held = x.received;
  cr_assert_gt(held, 0);
  cr_assert_lt(held, SS_BLOB_SIZE);
  xfer(&x, path);
  x.fd = fd;
  x.expect_total = SS_BLOB_SIZE;
  snprintf(x.if_range, sizeof x.if_range, "\"v1\"");
  x.ranged = 1;
  x.range_from = held;
  pulse_fetch_retry r = {.retries = 3};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "rest"), want, "%s",
               pulse_error_detail());
  ss_request q[8];
  cr_assert_eq(ss_requests(srv, q, 8), 2, "a changed version is not retried");
  cr_assert_str_eq(q[1].if_range, "\"v1\"");
  if (want == PULSE_OK) {
    uint8_t *got = malloc(SS_BLOB_SIZE);
    cr_assert_eq(pread(fd, got, SS_BLOB_SIZE, 0), SS_BLOB_SIZE);
    for (uint64_t i = 0; i < SS_BLOB_SIZE; i++)
      cr_assert_eq(got[i], ss_blob_byte(i));
    free(got);
  } else {
    cr_assert(x.changed);
    cr_assert(strstr(pulse_error_detail(), "changed") != NULL, "%s",
              pulse_error_detail());
  }
  pulse_fetch_free(f);
}

Test(http_fetch, a_resumed_file_download_continues_only_the_same_version,
     .init = up, .fini = down) {
  char path[] = "/tmp/pulse_fetch_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  resume_file("/cut/100000", fd, PULSE_OK);
  close(fd);
}

Test(http_fetch, a_resumed_file_download_of_a_changed_resource_is_refused,
     .init = up, .fini = down) {
  char path[] = "/tmp/pulse_fetch_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  unlink(path);
  resume_file("/etag2/100000", fd, PULSE_ERR_NOT_FOUND);
  close(fd);
}

/* ----------------------------------------------------------- rate limit */

/* libcurl's own limiter read what the socket held and then paused it off,
 * longer than the stall window on slow limits: the engine limits the rate
 * itself, and keeps the low-speed limit below it. */
Test(http_fetch, a_rate_limit_is_kept_and_never_trips_the_stall_detector,
     .init = up, .fini = down) {
  pulse_fetch_opts o;
  memset(&o, 0, sizeof o);
  o.backoff_ms = 1;
  o.backoff_max_ms = 2;
  o.no_proxy = 1;
  o.max_recv_bytes_per_s = 100000;
  o.low_speed_bytes = 400000; /* above the rate: taken down below it */
  o.low_speed_seconds = 1;
  pulse_fetch *f = NULL;
  cr_assert_eq(pulse_fetch_create(&o, &f), PULSE_OK);
  pulse_fetch_xfer x;
  xfer(&x, "/blob");
  x.ranged = 1;
  x.range_from = 0;
  x.range_to = 149999;
  x.low_speed = 1;
  uint64_t t0 = pulse_fetch_now_ms();
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "limited"), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t ms = pulse_fetch_now_ms() - t0;
  cr_assert_eq(x.mem.size, 150000);
  for (uint64_t i = 0; i < 150000; i++)
    cr_assert_eq(x.mem.data[i], ss_blob_byte(i));
  cr_assert_geq(ms, 1200, "150 kB in %llu ms at 100 kB/s",
                (unsigned long long)ms);
  cr_assert_lt(ms, 6000, "150 kB in %llu ms at 100 kB/s",
               (unsigned long long)ms);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

/* ----------------------------------------------------------------- POST */

Test(http_fetch, post_sends_an_empty_body, .init = up, .fini = down) {
  pulse_fetch *f = engine(1, 2);
  pulse_fetch_xfer x;
  xfer(&x, "/post");
  x.method = PULSE_FETCH_POST;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "post"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.status, 201);
  cr_assert_eq(x.mem.size, 6);
  cr_assert(memcmp(x.mem.data, "posted", 6) == 0);
  ss_request q;
  ss_requests(srv, &q, 1);
  cr_assert_str_eq(q.method, "POST");
  /* A GET there is refused, and the error names the method. */
  pulse_fetch_xfer_release(&x);
  xfer(&x, "/post");
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "post"), PULSE_ERR_IO);
  cr_assert(strstr(pulse_error_detail(), "GET ") != NULL);
  cr_assert(strstr(pulse_error_detail(), "HTTP 405") != NULL);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

/* ------------------------------------------------------------- deadline */

Test(http_fetch, waiting_for_a_blob_retries_404_until_it_appears, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(2, 10);
  pulse_fetch_xfer x;
  xfer(&x, "/later/5");
  pulse_fetch_retry r = {.deadline_ms = pulse_fetch_now_ms() + 10000,
                         .retry_missing = 1};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "later"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.mem.size, 8);
  cr_assert_eq(ss_requests(srv, NULL, 0), 6);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, a_deadline_ends_the_wait, .init = up, .fini = down) {
  pulse_fetch *f = engine(5, 20);
  pulse_fetch_xfer x;
  xfer(&x, "/missing");
  uint64_t t0 = pulse_fetch_now_ms();
  pulse_fetch_retry r = {.deadline_ms = t0 + 200, .retry_missing = 1};
  cr_assert_eq(pulse_fetch_get(f, &x, &r, "missing"), PULSE_ERR_NOT_FOUND);
  uint64_t took = pulse_fetch_now_ms() - t0;
  cr_assert_geq(took, 190);
  /* Bounded far above the deadline: a loaded machine may be slow to
   * answer, but the wait must not run on to the next retry schedule. */
  cr_assert_lt(took, 10000);
  /* Waits of 2.5 to 20 ms: it retried, and far fewer times than a fixed
   * 3 ms poll would (about 60). A loaded machine makes fewer tries, never
   * more, so only the upper bound is tight. */
  size_t n = ss_requests(srv, NULL, 0);
  cr_assert_geq(n, 3);
  cr_assert_leq(n, 35);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

Test(http_fetch, a_gather_settles_each_transfer_on_its_own, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(2, 10);
  const char *paths[5] = {"/blob", "/flaky/2", "/later/3", "/missing", "/post"};
  pulse_fetch_xfer x[5], *run[5];
  for (int i = 0; i < 5; i++) {
    xfer(&x[i], paths[i]);
    run[i] = &x[i];
  }
  /* /missing is retried to the deadline; /post (405) is given up at once. */
  pulse_fetch_retry r = {.deadline_ms = pulse_fetch_now_ms() + 300,
                         .retry_missing = 1};
  cr_assert_eq(pulse_fetch_gather(f, run, 5, &r), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert(pulse_fetch_xfer_ok(&x[0]));
  check_blob(&x[0]);
  cr_assert(pulse_fetch_xfer_ok(&x[1]));
  cr_assert(pulse_fetch_xfer_ok(&x[2]));
  cr_assert(!pulse_fetch_xfer_ok(&x[3]));
  cr_assert_eq(x[3].status, 404);
  cr_assert(!pulse_fetch_xfer_ok(&x[4]));
  cr_assert_eq(x[4].status, 405);
  ss_request q[SS_MAX_LOG];
  size_t n = ss_requests(srv, q, SS_MAX_LOG);
  size_t posts = 0;
  for (size_t i = 0; i < n && i < SS_MAX_LOG; i++)
    posts += strcmp(q[i].path, "/post") == 0;
  cr_assert_eq(posts, 1);
  for (int i = 0; i < 5; i++)
    pulse_fetch_xfer_release(&x[i]);
  pulse_fetch_free(f);
}

/* ----------------------------------------------------------------- stop */

static void *stop_later(void *f) {
  usleep(150000);
  pulse_fetch_stop(f);
  return NULL;
}

Test(http_fetch, stop_aborts_a_running_transfer_and_a_wait, .init = up,
     .fini = down) {
  pulse_fetch *f = engine(1000, 1000);
  pulse_fetch_xfer x;
  xfer(&x, "/slow");
  x.timeout_ms = 0;
  pthread_t t;
  pthread_create(&t, NULL, stop_later, f);
  uint64_t t0 = pulse_fetch_now_ms();
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "slow"), PULSE_ERR_IO);
  cr_assert(strstr(pulse_error_detail(), "slow: stopped") != NULL, "%s",
            pulse_error_detail());
  cr_assert_lt(pulse_fetch_now_ms() - t0, 3000);
  pthread_join(t, NULL);
  cr_assert(pulse_fetch_stopped(f));
  cr_assert_eq(pulse_fetch_sleep_ms(f, 5000), -1);
  pulse_fetch_restart(f);
  cr_assert_eq(pulse_fetch_sleep_ms(f, 1), 0);
  pulse_fetch_xfer_release(&x);
  pulse_fetch_free(f);
}

/* --------------------------------------------------------- store server */

Test(http_fetch, store_objects_come_in_ranges_checked_against_their_size) {
  it_trainer t;
  it_trainer_up(&t, 100, 10, 1);
  it_trainer_commit(&t, 0);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(t.dir, &h), PULSE_OK, "%s",
               pulse_error_detail());
  const pulse_store_object *o = pulse_store_head_anchor(h, 0);
  cr_assert_not_null(o);
  char u[512];
  snprintf(u, sizeof u, "%s/v1/%s", t.url, o->path);
  pulse_fetch *f = engine(1, 2);
  char path[] = "/tmp/pulse_fetch_XXXXXX";
  int fd = mkstemp(path);
  unlink(path);
  pulse_fetch_xfer x;
  pulse_fetch_xfer_init(&x, u);
  x.fd = fd;
  x.fd_origin = 0;
  x.expect_total = o->size;
  x.ranged = 1;
  x.range_from = 10;
  x.range_to = 99;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "anchor"), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(x.received, 90);
  /* The same range of an object said to be one byte longer is refused. */
  pulse_fetch_xfer_init(&x, u);
  x.fd = fd;
  x.expect_total = o->size + 1;
  x.ranged = 1;
  x.range_from = 10;
  x.range_to = 99;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "anchor"), PULSE_ERR_CORRUPT);
  /* An object the store does not have. */
  snprintf(u, sizeof u, "%s/v1/objects/%064d.patch", t.url, 0);
  pulse_fetch_xfer_init(&x, u);
  x.max_bytes = 1000;
  cr_assert_eq(pulse_fetch_get(f, &x, NULL, "patch"), PULSE_ERR_NOT_FOUND, "%s",
               pulse_error_detail());
  pulse_fetch_xfer_release(&x);
  close(fd);
  pulse_fetch_free(f);
  pulse_store_head_free(h);
  it_trainer_down(&t);
}
