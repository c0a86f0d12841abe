/* server_http.c - the store server's routes (docs/protocols/sync.md) on the serving
 * layer: objects, catch-up paths and /healthz. The head and its long-polls
 * are server_poll.c's, catch-ups server_catchup.c's; refusals, Range,
 * conditionals and /metrics are the layer's. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http_serve_parse_impl.h"
#include "server_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"

/* A patch's section index, served like an object: it is not named by its
 * own hash (workers check its signature and the hashes it names), and its
 * bytes do not change once written, so it is immutable under a strong ETag
 * of its patch's name. Stores from before it answer 404: workers then
 * fetch the patch whole. */
static int sections_request(void *user, pulse_serve_request *rq,
                            const char *path) {
  pulse_server *srv = user;
  const char *name = path + strlen("/v1/" STORE_SECTIONS_DIR "/");
  uint8_t sha[32];
  char file[4096];
  /* 64 hex digits: it cannot leave sections/; O_NOFOLLOW refuses a
   * planted link. */
  if (!store_sections_parse_name(name, sha) ||
      snprintf(file, sizeof file, "%s/" STORE_SECTIONS_DIR "/%s", srv->dir, name) >=
          (int)sizeof file)
    return pulse_serve_reply_error(rq, 404, "no such section index");
  int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return pulse_serve_reply_error(rq, 404, "no such section index");
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_serve_reply_error(rq, 404, "no such section index");
  }
  char hex[65], etag[80];
  store_hex(sha, 32, hex);
  snprintf(etag, sizeof etag, "\"%s-sections\"", hex);
  pulse_serve_meta m = {0, NULL, PULSE_SERVE_IMMUTABLE, etag, NULL};
  return pulse_serve_reply_fd(rq, &m, fd, (uint64_t)sb.st_size);
}

static int object_request(void *user, pulse_serve_request *rq,
                          const char *path) {
  pulse_server *srv = user;
  const char *name = path + strlen("/v1/objects/");
  pulse_store_kind kind;
  uint8_t sha[32];
  if (!store_parse_object_name(name, &kind, sha))
    return pulse_serve_reply_error(rq, 404, "no such object");
  srv_objects_dir(srv);
  /* The name was checked to be 64 hex digits and an extension: openat
   * cannot leave objects/, and O_NOFOLLOW refuses a planted link. */
  int fd = srv->objects_fd >= 0 ? openat(srv->objects_fd, name,
                                         O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                                : -1;
  if (fd < 0)
    return pulse_serve_reply_error(rq, 404, "no such object");
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_serve_reply_error(rq, 404, "no such object");
  }
  /* A file that changed since it was seen is hashed again first. */
  if (!srv_object_check(srv, fd, sha, &sb)) {
    close(fd);
    return pulse_serve_reply_error(
        rq, 500, "the object's file no longer matches its name (SHA-256)");
  }
  char hex[65], etag[67];
  store_hex(sha, 32, hex);
  snprintf(etag, sizeof etag, "\"%s\"", hex);
  pulse_serve_meta m = {0, NULL, PULSE_SERVE_IMMUTABLE, etag, NULL};
  return pulse_serve_reply_fd(rq, &m, fd, (uint64_t)sb.st_size);
}

/* A step as the catch-up route spells it: decimal, no leading zero. */
static int parse_step(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  if (n > 1 && s[0] == '0')
    return -1;
  return serve_parse_digits(s, n, out);
}

/* /v1/catchup/<from>, to the head; /v1/catchup/<from>?to=<step>, pinned
 * to that step (server_catchup.c). Servers from before ?to= ignore the
 * query (the path alone is routed) and answer to the head, which the
 * X-Pulse-To-Step header tells. */
static int catchup_route(void *user, pulse_serve_request *rq,
                         const char *path) {
  uint64_t from, to = 0;
  if (parse_step(path + strlen("/v1/catchup/"), &from) != 0)
    return pulse_serve_reply_error(rq, 404,
                                   "catch-up paths are /v1/catchup/<step>");
  const char *pin = pulse_serve_query(rq, "to");
  if (pin != NULL && parse_step(pin, &to) != 0)
    return pulse_serve_reply_error(
        rq, 400, "?to= takes a step (decimal digits, no leading zero)");
  return srv_catchup_request(user, rq, from, pin != NULL, to);
}

void srv_healthz(void *user, char *body, size_t cap) {
  srv_head *h = srv_head_get(user);
  if (h != NULL)
    snprintf(body, cap, "{\"status\":\"ok\",\"step\":%" PRIu64 "}\n", h->step);
  else
    snprintf(body, cap, "{\"status\":\"ok\",\"step\":null}\n");
  srv_head_release(h);
}

const pulse_serve_route srv_routes[] = {
    {"/v1/head", 0, PULSE_SERVE_READ, "head", srv_head_request, 0},
    {"/v1/objects/", 1, PULSE_SERVE_READ, "object", object_request, 0},
    {"/v1/" STORE_SECTIONS_DIR "/", 1, PULSE_SERVE_READ, "sections", sections_request, 0},
    {"/v1/catchup/", 1, PULSE_SERVE_READ, "catchup", catchup_route, 0},
};
const size_t srv_route_count = sizeof srv_routes / sizeof srv_routes[0];

/* The order /metrics lists routes in (docs/protocols/sync.md). */
const char *const srv_labels[] = {"head",    "head_poll", "object", "catchup",
                                  "metrics", "healthz",   "other"};
const size_t srv_label_count = sizeof srv_labels / sizeof srv_labels[0];
