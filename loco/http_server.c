/* http_server.c - the blob server of the trainer exchange (http_impl.h):
 * libmicrohttpd with its own polling thread, bound to 127.0.0.1, serving
 * byte strings published by path. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http_impl.h"
#include "status_impl.h"

typedef struct {
  char *path;
  uint8_t *data;
  size_t size;
} blob;

struct loco_server {
  struct MHD_Daemon *daemon;
  uint16_t port;
  pthread_mutex_t lock;
  blob *blobs;
  size_t count, cap;
  uint64_t served;
  loco_post_fn on_post;
  void *user;
};

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const void *data, size_t size, const char *type) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      size, (void *)data, MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)version, (void)upload;
  loco_server *s = cls;
  static int first_call_marker, body_marker;
  if (*state == NULL) { /* headers only: come back for the body */
    *state = &first_call_marker;
    return MHD_YES;
  }
  if (*upload_size != 0) { /* no endpoint takes a body: swallow, refuse */
    *upload_size = 0;
    *state = &body_marker;
    return MHD_YES;
  }
  if (*state == &body_marker)
    return reply(c, MHD_HTTP_BAD_REQUEST, "no body expected\n", 17,
                 "text/plain");
  if (strcmp(method, "POST") == 0) {
    char text[512] = "";
    const char *id =
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
    const char *u =
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "url");
    unsigned status =
        s->on_post ? s->on_post(s->user, url, id, u, text, sizeof text) : 404u;
    return reply(c, status, text, strlen(text), "application/json");
  }
  if (strcmp(method, "GET") != 0)
    return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, "GET or POST\n", 12,
                 "text/plain");
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->count; i++)
    if (strcmp(s->blobs[i].path, url) == 0) {
      /* MUST_COPY: the response owns its copy, so the lock covers the copy. */
      enum MHD_Result ok = reply(c, MHD_HTTP_OK, s->blobs[i].data,
                                 s->blobs[i].size, "application/octet-stream");
      s->served += s->blobs[i].size;
      pthread_mutex_unlock(&s->lock);
      return ok;
    }
  pthread_mutex_unlock(&s->lock);
  return reply(c, MHD_HTTP_NOT_FOUND, "not (yet) here\n", 15, "text/plain");
}

pulse_status loco_server_start(loco_post_fn on_post, void *user,
                               loco_server **out) {
  *out = NULL;
  loco_server *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco server");
  pthread_mutex_init(&s->lock, NULL);
  s->on_post = on_post;
  s->user = user;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, handle, s,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
  if (s->daemon == NULL) {
    loco_server_stop(s);
    return pulse_fail(PULSE_ERR_IO, "loco server: cannot listen on 127.0.0.1");
  }
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
  s->port = info ? info->port : 0;
  if (s->port == 0) {
    loco_server_stop(s);
    return pulse_fail(PULSE_ERR_IO, "loco server: no port");
  }
  *out = s;
  return PULSE_OK;
}

void loco_server_stop(loco_server *s) {
  if (s == NULL)
    return;
  if (s->daemon)
    MHD_stop_daemon(s->daemon);
  for (size_t i = 0; i < s->count; i++)
    free(s->blobs[i].path), free(s->blobs[i].data);
  free(s->blobs);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

uint16_t loco_server_port(const loco_server *s) {
  return s->port;
}

uint64_t loco_server_bytes_served(const loco_server *s) {
  loco_server *m = (loco_server *)s;
  pthread_mutex_lock(&m->lock);
  uint64_t v = m->served;
  pthread_mutex_unlock(&m->lock);
  return v;
}

pulse_status loco_server_put(loco_server *s, const char *path, const void *data,
                             size_t size) {
  uint8_t *copy = malloc(size ? size : 1);
  char *p = strdup(path);
  if (copy == NULL || p == NULL) {
    free(copy), free(p);
    return pulse_fail(PULSE_ERR_NOMEM, "loco server: %zu bytes for %s", size,
                      path);
  }
  if (size)
    memcpy(copy, data, size);
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->count; i++)
    if (strcmp(s->blobs[i].path, path) == 0) {
      free(s->blobs[i].data);
      free(p);
      s->blobs[i].data = copy;
      s->blobs[i].size = size;
      pthread_mutex_unlock(&s->lock);
      return PULSE_OK;
    }
  if (s->count == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    blob *b = realloc(s->blobs, cap * sizeof *b);
    if (b == NULL) {
      pthread_mutex_unlock(&s->lock);
      free(copy), free(p);
      return pulse_fail(PULSE_ERR_NOMEM, "loco server: blob table");
    }
    s->blobs = b;
    s->cap = cap;
  }
  s->blobs[s->count++] = (blob){p, copy, size};
  pthread_mutex_unlock(&s->lock);
  return PULSE_OK;
}

void loco_server_drop(loco_server *s, const char *prefix, uint64_t below) {
  size_t n = strlen(prefix);
  pthread_mutex_lock(&s->lock);
  for (size_t i = 0; i < s->count;) {
    const char *p = s->blobs[i].path;
    int gone;
    if (below == 0) {
      gone = strcmp(p, prefix) == 0;
    } else {
      char *end;
      gone = strncmp(p, prefix, n) == 0 && p[n] >= '0' && p[n] <= '9' &&
             strtoull(p + n, &end, 10) < below;
    }
    if (gone) {
      free(s->blobs[i].path), free(s->blobs[i].data);
      s->blobs[i] = s->blobs[--s->count];
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&s->lock);
}
