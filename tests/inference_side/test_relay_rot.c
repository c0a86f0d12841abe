/* A relay that does not follow (issue "Reliability and security", finding
 * 11): it synced once and serves its cache; an object whose bytes then
 * changed on disk was served for ever, as if valid (only the subscriber's
 * own syncs hashed the cache again). Now the server hashes again, before
 * serving it, any object file that changed (inode, size, mtime, ctime)
 * since it first saw it, and answers 500 (logged, counted) when its bytes
 * no longer match its name; the relay's next sync replaces it and it is
 * served again. Requests are raw HTTP/1.1 on 127.0.0.1. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "inf_testutil.h"
#include "metrics_testutil.h"
#include "store_impl.h"

typedef struct {
  unsigned status;
  uint8_t *body;
  size_t size;
} rot_reply;

/* GET path from 127.0.0.1:port (Connection: close), within 10 s. */
static rot_reply rot_get(uint16_t port, const char *path) {
  rot_reply r = {0, NULL, 0};
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  char req[512];
  int n = snprintf(req, sizeof req,
                   "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                   path);
  cr_assert_eq(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
  size_t cap = 1 << 16, got = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0)
      break;
    if (got == cap)
      buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + got, cap - got, 0);
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  const char *end = memmem(buf, got, "\r\n\r\n", 4);
  if (got > 12 && end != NULL) {
    r.status = (unsigned)atoi((const char *)buf + 9);
    size_t head = (size_t)((const uint8_t *)end - buf) + 4;
    r.size = got - head;
    r.body = malloc(r.size + 1);
    memcpy(r.body, buf + head, r.size);
  }
  free(buf);
  return r;
}

/* 200 and bytes that hash to the object's name. */
static void served_whole(uint16_t port, const pulse_store_object *o) {
  char path[PULSE_STORE_PATH_MAX + 8];
  snprintf(path, sizeof path, "/v1/%s", o->path);
  rot_reply r = rot_get(port, path);
  cr_assert_eq(r.status, 200, "%s: %u", path, r.status);
  uint8_t sha[32];
  store_sha256(r.body, r.size, sha);
  cr_assert_eq(memcmp(sha, o->sha256, 32), 0, "%s: served bytes that are not its own",
               path);
  free(r.body);
}

/* Anything but 200: never the rotten bytes as if valid. */
static unsigned refused(uint16_t port, const pulse_store_object *o) {
  char path[PULSE_STORE_PATH_MAX + 8];
  snprintf(path, sizeof path, "/v1/%s", o->path);
  rot_reply r = rot_get(port, path);
  cr_expect_neq(r.status, 200, "%s: a rotten object was served (%zu bytes)", path,
                r.size);
  free(r.body);
  return r.status;
}

Test(inference_side, a_relay_that_does_not_follow_never_serves_a_rotted_object,
     .timeout = 60) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 6, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.mirror = 1;
  pulse_sub *relay;
  cr_assert_eq(pulse_sub_create(&o, &relay), PULSE_OK);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = cache;
  so.threads = 2;
  so.watch = 1;
  pulse_server *srv;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK);
  uint16_t port = pulse_server_port(srv);
  cr_assert_eq(pulse_sub_sync(relay), PULSE_OK, "%s", pulse_sub_error(relay));
  pulse_server_notify(srv, -1);

  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(cache, &h), PULSE_OK);
  cr_assert_geq(pulse_store_head_patch_count(h), 1);
  pulse_store_object anchor =
      *pulse_store_head_anchor(h, pulse_store_head_anchor_count(h) - 1);
  pulse_store_object patch =
      *pulse_store_head_patch(h, pulse_store_head_patch_count(h) - 1);
  pulse_store_head_free(h);
  char apath[4096], ppath[4096];
  snprintf(apath, sizeof apath, "%s/%s", cache, anchor.path);
  snprintf(ppath, sizeof ppath, "%s/%s", cache, patch.path);

  /* Served whole, then rotted in place: refused from then on. */
  served_whole(port, &anchor);
  cr_assert_eq(tu_flip(apath, 100), 0);
  cr_expect_eq(refused(port, &anchor), 500);
  cr_expect_eq(refused(port, &anchor), 500, "and again (not re-hashed: same file)");
  /* Rotted before anybody asked, with its mtime put back (its ctime still
   * moves): refused too. */
  struct stat before;
  cr_assert_eq(stat(ppath, &before), 0);
  cr_assert_eq(tu_flip(ppath, 10), 0);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  cr_assert_eq(utimensat(AT_FDCWD, ppath, times, 0), 0);
  cr_expect_eq(refused(port, &patch), 500);
  cr_expect_eq(tu_server_metric(srv, "pulse_objects_corrupt_total"), 2);
  cr_expect_eq(tu_server_metric(srv, "pulse_objects_rehashed_total"), 2);

  /* The relay's next sync finds both, fetches them again: served again. */
  cr_assert_eq(pulse_sub_sync(relay), PULSE_OK, "%s", pulse_sub_error(relay));
  served_whole(port, &anchor);
  served_whole(port, &patch);

  /* A file that changed but still holds its bytes (rewritten as it was) is
   * hashed again and served. */
  cr_assert_eq(tu_flip(apath, 100), 0);
  cr_assert_eq(tu_flip(apath, 100), 0);
  served_whole(port, &anchor);
  cr_expect_eq(tu_server_metric(srv, "pulse_objects_corrupt_total"), 2);

  pulse_server_free(srv);
  pulse_sub_free(relay);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}
