/* Hostile networks and failures (issue "Reliability and security: what
 * hostile networks and failures still break"):
 *   - a source's redirect to another origin is not followed unless the
 *     worker allowed that origin (it once was, to any host);
 *   - a signed head naming a huge object is refused before any byte or
 *     any memory is spent on it (it once allocated its size up front:
 *     2^63 bytes aborted under ASan);
 *   - a head dated in the future does not pass a maximum age;
 *   - a source that served an object's bytes wrong is not asked for it
 *     again until the head changes (it once was, ~40 times a minute);
 *   - an answer whose Content-Length is longer than the signed object ends
 *     when the object's bytes arrived (it once waited for the stall
 *     timeout);
 *   - a write that fails says why (the errno's text, once dropped).
 * The servers are scripted (libmicrohttpd, a thread per connection, on
 * 127.0.0.x port 0). */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include "http_fetch_impl.h"
#include "forge_testutil.h"
#include "http_fetch_xfer_impl.h"
#include "inf_testutil.h"
#include "script_server.h"
#include "store_impl.h"

typedef enum {
  SERVE = 1,   /* the head, and the object's bytes */
  REDIRECT,    /* 302 to `target` + the path, for every request */
  BAD_OBJECT,  /* the head, and wrong bytes of the object's size */
  LONG_LENGTH  /* the head, and the object under a longer Content-Length,
                  then nothing */
} mode;

#define OBJ_SIZE 50000u

typedef struct {
  struct MHD_Daemon *daemon;
  char url[64];
  mode mode;
  char target[64]; /* REDIRECT: where to */
  pulse_buffer head;
  uint8_t obj[OBJ_SIZE];
  atomic_int requests, objects;
  atomic_int closing;
} server;

/* A head of step `step` naming one anchor of `size` bytes whose SHA-256 is
 * `sha`, published at `published`, signed by key. */
static pulse_buffer make_head(const pulse_sign_key *key, uint64_t step,
                              uint64_t size, const uint8_t sha[32],
                              uint64_t published) {
  pulse_store_object a;
  memset(&a, 0, sizeof a);
  a.kind = PULSE_STORE_ANCHOR;
  a.step = step;
  a.size = size;
  memcpy(a.sha256, sha, 32);
  store_object_set_path(&a);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = step;
  f.anchors = &a;
  f.nanchors = 1;
  f.version = 2;
  f.run[0] = 9;
  f.published = published;
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, key, &b), PULSE_OK, "%s",
               pulse_error_detail());
  return b;
}

static enum MHD_Result answer(struct MHD_Connection *c, unsigned status,
                              const void *body, size_t n) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      n, (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

/* LONG_LENGTH: the object's bytes, then silence until the server closes
 * (at most 20 s). */
static ssize_t long_body(void *cls, uint64_t pos, char *buf, size_t max) {
  server *s = cls;
  if (pos < OBJ_SIZE) {
    size_t n = OBJ_SIZE - pos < max ? (size_t)(OBJ_SIZE - pos) : max;
    memcpy(buf, s->obj + pos, n);
    return (ssize_t)n;
  }
  for (int i = 0; i < 200 && !atomic_load(&s->closing); i++)
    usleep(100000);
  return MHD_CONTENT_READER_END_WITH_ERROR;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)method, (void)version, (void)upload, (void)upload_size;
  server *s = cls;
  if (*state == NULL) {
    *state = s;
    return MHD_YES;
  }
  atomic_fetch_add(&s->requests, 1);
  if (s->mode == REDIRECT) {
    char to[256];
    snprintf(to, sizeof to, "%s%s", s->target, url);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Location", to);
    enum MHD_Result ok = MHD_queue_response(c, 302, r);
    MHD_destroy_response(r);
    return ok;
  }
  if (strncmp(url, "/v1/objects/", 12) == 0) {
    atomic_fetch_add(&s->objects, 1);
    if (s->mode == BAD_OBJECT) {
      uint8_t wrong[OBJ_SIZE];
      memset(wrong, 0x5a, sizeof wrong);
      return answer(c, 200, wrong, sizeof wrong);
    }
    if (s->mode == LONG_LENGTH) {
      struct MHD_Response *r = MHD_create_response_from_callback(
          OBJ_SIZE + 1000, 4096, long_body, s, NULL);
      enum MHD_Result ok = MHD_queue_response(c, 200, r);
      MHD_destroy_response(r);
      return ok;
    }
    return answer(c, 200, s->obj, OBJ_SIZE);
  }
  if (strncmp(url, "/v1/head", 8) == 0 && s->head.data != NULL)
    return answer(c, 200, s->head.data, s->head.size);
  return answer(c, 404, "{}", 2);
}

/* Starts a server on `ip` (e.g. "127.0.0.2"), port 0. */
static void server_up(server *s, const char *ip, mode m) {
  memset(s, 0, sizeof *s);
  s->mode = m;
  for (size_t i = 0; i < OBJ_SIZE; i++)
    s->obj[i] = (uint8_t)(i * 7 + 3);
  struct sockaddr_in addr = {0};
  addr.sin_family = AF_INET;
  cr_assert_eq(inet_pton(AF_INET, ip, &addr.sin_addr), 1);
  s->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_AUTO,
      0, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_END);
  cr_assert_not_null(s->daemon, "cannot listen on %s", ip);
  unsigned port =
      MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT)->port;
  snprintf(s->url, sizeof s->url, "http://%s:%u", ip, port);
}

/* Gives the server a head naming its object, signed by key. */
static void server_head(server *s, const pulse_sign_key *key, uint64_t step,
                        uint64_t published) {
  uint8_t sha[32];
  store_sha256(s->obj, OBJ_SIZE, sha);
  pulse_buffer_free(&s->head);
  s->head = make_head(key, step, OBJ_SIZE, sha, published);
}

static void server_down(server *s) {
  atomic_store(&s->closing, 1);
  MHD_stop_daemon(s->daemon);
  pulse_buffer_free(&s->head);
}

static pulse_sub_opts opts_for(const char **urls, const char *cache,
                               const uint8_t *key) {
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.public_key = key;
  o.retries = 1;
  o.backoff_ms = 20;
  o.backoff_max_ms = 100;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 5000;
  o.poll_timeout_ms = 500;
  o.threads = 1;
  return o;
}

/* ------------------------------------------------------------ redirects */

/* A source on 127.0.0.1 redirecting to one on 127.0.0.2 (another origin):
 * the other address gets no request unless its origin was allowed. */
Test(hostile_net, a_redirect_to_another_origin_is_not_followed_unless_allowed) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(key, pub);
  server other, redir;
  server_up(&other, "127.0.0.2", SERVE);
  server_head(&other, key, 3, (uint64_t)time(NULL));
  server_up(&redir, "127.0.0.1", REDIRECT);
  snprintf(redir.target, sizeof redir.target, "%s", other.url);
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[] = {redir.url};

  pulse_sub_opts o = opts_for(urls, cache, pub);
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  pulse_status st = pulse_sub_sync(sub);
  cr_expect_neq(st, PULSE_OK, "the redirect was followed");
  cr_expect_eq(atomic_load(&other.requests), 0,
               "%d requests reached the other origin by default",
               atomic_load(&other.requests));
  char want[128];
  snprintf(want, sizeof want, "redirected to %s/v1/head", other.url);
  cr_expect(strstr(pulse_sub_error(sub), want) != NULL, "%s",
            pulse_sub_error(sub));
  cr_expect_geq(atomic_load(&redir.requests), 1);
  pulse_sub_free(sub);

  /* Asked for: the origin is followed, and only that one. */
  const char *allowed[] = {other.url + strlen("http://")};
  o.redirect_origins = allowed;
  o.redirect_origin_count = 1;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s",
               pulse_error_detail());
  cr_expect_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_expect_geq(atomic_load(&other.requests), 1);
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  cr_expect_eq(f.head_step, 3);
  pulse_sub_free(sub);

  /* A malformed origin is refused at create. */
  const char *junk[] = {"127.0.0.2/path"};
  o.redirect_origins = junk;
  cr_expect_eq(pulse_sub_create(&o, &sub), PULSE_ERR_ARG);

  server_down(&redir);
  server_down(&other);
  tu_rm_rf(work);
  pulse_sign_key_free(key);
}

Test(hostile_net, the_redirect_rule_names_origins_and_refuses_downgrades) {
  pulse_fetch_opts fo;
  memset(&fo, 0, sizeof fo);
  const char *allowed[] = {"mirror.example:8443", "https://cdn.example",
                           "http://plain.example:81"};
  fo.redirect_origins = allowed;
  fo.redirect_origin_count = 3;
  fo.max_redirects = 5;
  pulse_fetch *f;
  cr_assert_eq(pulse_fetch_create(&fo, &f), PULSE_OK, "%s",
               pulse_error_detail());
  struct {
    const char *from, *to;
    int ok;
  } cases[] = {
      {"https://t.example/v1/head", "https://t.example/v1/other", 1},
      {"https://t.example/v1/head", "https://T.EXAMPLE:443/x", 1},
      {"https://t.example/v1/head", "http://t.example/v1/head", 0}, /* down */
      {"http://t.example/v1/head", "https://t.example/v1/head", 0}, /* other */
      {"http://t.example:8080/a", "http://t.example:8081/a", 0},
      {"http://t.example/a", "http://evil.example/a", 0},
      {"https://t.example/a", "https://mirror.example:8443/a", 1},
      {"http://t.example/a", "http://mirror.example:8443/a", 1},
      {"https://t.example/a", "http://mirror.example:8443/a", 0}, /* down */
      {"https://t.example/a", "https://mirror.example/a", 0},     /* port */
      {"http://t.example/a", "https://cdn.example/a", 1},
      {"http://t.example/a", "http://cdn.example/a", 0},
      {"https://t.example/a", "http://plain.example:81/a", 1}, /* asked */
      {"https://t.example/a", "ftp://t.example/a", 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    cr_expect_eq(pulse_fetch_redirect_allowed(f, cases[i].from, cases[i].to),
                 cases[i].ok, "%s -> %s", cases[i].from, cases[i].to);
  pulse_fetch_free(f);
}

/* ---------------------------------------------------------- huge objects */


typedef struct {
  int nomem;
} event_log;

static void note_event(void *ctx, const pulse_sub_event *ev) {
  event_log *l = ctx;
  if (ev->status == PULSE_ERR_NOMEM)
    l->nomem++;
}

/* Partial files in cache/objects (downloads begun). */
static int part_files(const char *cache) {
  char dir[4200];
  snprintf(dir, sizeof dir, "%s/objects", cache);
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
    n += strstr(e->d_name, ".part") != NULL;
  if (d != NULL)
    closedir(d);
  return n;
}

Test(hostile_net, a_head_naming_a_huge_object_is_refused_before_any_memory) {
  it_trainer t;
  it_trainer_up(&t, 4, 4, 1);
  it_trainer_run(&t, 0, 2, 0.01);
  /* 2^63, 1 TiB + 1 (over the default limit), and 2 MiB under a limit of
   * 1 MiB. Every route (the chain from step 0, the anchor) names one. */
  const uint64_t sizes[] = {(uint64_t)1 << 63, ((uint64_t)1 << 40) + 1,
                            (uint64_t)2 << 20};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    forge_object_sizes(t.dir, t.key, 1, sizes[s]);
    pulse_server_notify(t.srv, 0);
    char *work = tu_make_dir(), cache[4096];
    snprintf(cache, sizeof cache, "%s/cache", work);
    const char *urls[1];
    pulse_sub_opts o = it_sub_opts(&t, cache, urls);
    o.use_catchup = 0;
    if (s == 2)
      o.max_object_bytes = (uint64_t)1 << 20;
    event_log log = {0};
    o.on_event = note_event;
    o.on_event_ctx = &log;
    pulse_sub *sub;
    cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
    it_targets tg;
    it_targets_attach(&tg, &t, sub);
    for (int i = 0; i < TU_TENSORS; i++)
      memcpy(tg.data[i], t.bits[0][i], t.m.numel[i] * 2);
    cr_assert_eq(pulse_sub_assume_step(sub, 0), PULSE_OK);
    double t0 = tu_now_s();
    pulse_status st = pulse_sub_sync(sub);
    double dt = tu_now_s() - t0;
    cr_expect_neq(st, PULSE_OK, "size %" PRIu64 " was taken", sizes[s]);
    cr_expect_eq(log.nomem, 0, "size %" PRIu64 ": memory was asked for it",
                 sizes[s]);
    const char *want = s == 0 ? "larger than any file"
                              : "more than the largest object allowed";
    cr_expect(strstr(pulse_sub_error(sub), want) != NULL,
              "size %" PRIu64 ": %s", sizes[s], pulse_sub_error(sub));
    cr_expect_eq(part_files(cache), 0, "size %" PRIu64 ": a download began",
                 sizes[s]);
    cr_expect_lt(dt, 5.0);
    cr_expect_eq(pulse_sub_step(sub), 0, "the targets keep their step");
    pulse_sub_free(sub);
    it_targets_free(&tg);
    tu_rm_rf(work);
  }
  it_trainer_down(&t);
}

/* ------------------------------------------------------ heads from ahead */

Test(hostile_net, a_head_from_the_future_does_not_pass_a_maximum_age) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(key, pub);
  server s;
  server_up(&s, "127.0.0.1", SERVE);
  server_head(&s, key, 3, 4102444800u); /* 2100-01-01 */
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[] = {s.url};
  pulse_sub_opts o = opts_for(urls, cache, pub);
  o.max_head_age_s = 600;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  cr_expect_eq(pulse_sub_sync(sub), PULSE_ERR_STALE, "%s",
               pulse_sub_error(sub));
  cr_expect(strstr(pulse_sub_error(sub), "in the future") != NULL, "%s",
            pulse_sub_error(sub));
  pulse_sub_free(sub);
  /* Within the clocks' skew it is taken. */
  server_head(&s, key, 4, (uint64_t)time(NULL) + PULSE_SUB_CLOCK_SKEW_S / 2);
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  cr_expect_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  server_down(&s);
  tu_rm_rf(work);
  pulse_sign_key_free(key);
}

/* ------------------------------------------------------------ bad bytes */

static void *follow_thread(void *arg) {
  pulse_sub_follow(arg);
  return NULL;
}

Test(hostile_net, a_source_that_served_a_bad_object_is_not_asked_again) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(key, pub);
  server s;
  server_up(&s, "127.0.0.1", BAD_OBJECT);
  server_head(&s, key, 3, (uint64_t)time(NULL));
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[] = {s.url};
  pulse_sub_opts o = opts_for(urls, cache, pub);
  o.mirror = 1; /* every object the head names */
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  pthread_t th;
  pthread_create(&th, NULL, follow_thread, sub);
  sleep(3);
  int during = atomic_load(&s.objects);
  /* A new head: the object is asked for again (once more per head). */
  server_head(&s, key, 4, (uint64_t)time(NULL));
  sleep(2);
  pulse_sub_stop(sub);
  pthread_join(th, NULL);
  int after = atomic_load(&s.objects);
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  pulse_sub_free(sub);
  /* Fetched, refused, fetched once more (a passing fault), refused: then
   * not again from that source under that head. */
  cr_expect_leq(during, 2, "the bad object was requested %d times in 3 s",
                during);
  cr_expect_geq(during, 1);
  cr_expect_gt(after, during, "a new head did not lift the back-off");
  cr_expect_leq(after, during + 2);
  cr_expect_geq(f.rejected, 2);
  server_down(&s);
  tu_rm_rf(work);
  pulse_sign_key_free(key);
}

/* The object's bytes under a Content-Length 1000 bytes longer, then
 * nothing: the transfer ends when the signed size arrived. */
Test(hostile_net, a_long_content_length_ends_when_the_signed_bytes_arrived) {
  pulse_sign_key *key;
  cr_assert_eq(pulse_sign_key_generate(&key), PULSE_OK);
  uint8_t pub[32];
  pulse_sign_key_public(key, pub);
  server s;
  server_up(&s, "127.0.0.1", LONG_LENGTH);
  server_head(&s, key, 3, (uint64_t)time(NULL));
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[] = {s.url};
  pulse_sub_opts o = opts_for(urls, cache, pub);
  o.mirror = 1;
  o.low_speed_seconds = 8;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  double t0 = tu_now_s();
  pulse_status st = pulse_sub_sync(sub);
  double dt = tu_now_s() - t0;
  cr_expect_eq(st, PULSE_OK, "%s", pulse_sub_error(sub));
  cr_expect_lt(dt, 3.0, "the pull took %.1f s for %u bytes", dt, OBJ_SIZE);
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  cr_expect_eq(f.objects_fetched, 1);
  pulse_sub_free(sub);
  server_down(&s);
  tu_rm_rf(work);
  pulse_sign_key_free(key);
}

/* ------------------------------------------------------- write failures */

/* A file that cannot grow (RLIMIT_FSIZE, as a full disk would): the error
 * says why, with the system's words. In a child: the limit is its own. */
Test(hostile_net, a_failed_write_says_why) {
  script_server *ss = ss_start();
  cr_assert_not_null(ss);
  char *work = tu_make_dir(), path[4096], url[128], err[1024] = "";
  snprintf(path, sizeof path, "%s/blob", work);
  snprintf(url, sizeof url, "http://127.0.0.1:%u/blob", (unsigned)ss_port(ss));
  int pipefd[2];
  cr_assert_eq(pipe(pipefd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    close(pipefd[0]);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {65536, 65536};
    setrlimit(RLIMIT_FSIZE, &rl);
    pulse_fetch_opts fo;
    memset(&fo, 0, sizeof fo);
    pulse_fetch *f;
    if (pulse_fetch_create(&fo, &f) != PULSE_OK)
      _exit(2);
    pulse_fetch_xfer x;
    pulse_fetch_xfer_init(&x, url);
    x.fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    x.expect_total = SS_BLOB_SIZE;
    pulse_status st = pulse_fetch_get(f, &x, NULL, "blob");
    const char *d = pulse_error_detail();
    ssize_t w = write(pipefd[1], d, strlen(d));
    (void)w;
    _exit(st == PULSE_ERR_IO ? 0 : 1);
  }
  close(pipefd[1]);
  ssize_t n = read(pipefd[0], err, sizeof err - 1);
  err[n > 0 ? n : 0] = '\0';
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s", err);
  cr_expect(strstr(err, strerror(EFBIG)) != NULL,
            "the error does not say why: %s", err);
  ss_stop(ss);
  tu_rm_rf(work);
}
