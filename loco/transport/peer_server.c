/* peer_server.c - the blob server of the trainer exchange (peer_http_impl.h):
 * two routes on the project's HTTP serving layer (trainer_side's
 * http_serve_impl.h), bound to 127.0.0.1. GET and HEAD serve the byte
 * strings published by path (strong ETag from their SHA-256, 304, Range);
 * POST (query arguments, no body) goes to the node's callback, and a POST
 * with a body under LOCO_HOSTED_PREFIX to the upload callback (a
 * collaboration peer hosting a client-mode peer's payload). The layer
 * adds the refusals, JSON errors, /metrics and /healthz. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "peer_http_impl.h"
#include "http_serve_impl.h"
#include "status_impl.h"
#include "store_impl.h"

typedef struct {
  char *path;
  pulse_serve_blob *blob;
  /* The signature headers' values, when has_sig. */
  int has_sig;
  char round[24], key[65], sig[129];
} entry;

struct loco_server {
  pulse_serve *http;
  pthread_mutex_t lock; /* the table; blobs are shared by reference */
  entry *blobs;
  size_t count, cap;
  atomic_ullong served;
  loco_post_fn on_post;
  loco_upload_fn on_upload;
  void *user;
  pulse_serve_route routes[3]; /* the table this server's layer uses */
  loco_post_gate_fn gate;
  void *gate_user;
  loco_reply_sign_fn reply_sign;
  void *reply_sign_user;
  void (*more_metrics)(void *user, pulse_bytebuf *text);
  void *metrics_user;
};

/* The table's entry for path, NULL when none; the caller holds s->lock. */
static entry *entry_at(loco_server *s, const char *path) {
  for (size_t i = 0; i < s->count; i++)
    if (strcmp(s->blobs[i].path, path) == 0)
      return &s->blobs[i];
  return NULL;
}

static int get_blob(void *user, pulse_serve_request *rq, const char *path) {
  loco_server *s = user;
  pulse_serve_blob *b = NULL;
  char round[24], key[65], sig[129];
  int is_signed = 0;
  pthread_mutex_lock(&s->lock);
  entry *e = entry_at(s, path);
  if (e != NULL) {
    b = pulse_serve_blob_ref(e->blob);
    if ((is_signed = e->has_sig)) {
      memcpy(round, e->round, sizeof round);
      memcpy(key, e->key, sizeof key);
      memcpy(sig, e->sig, sizeof sig);
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (b == NULL)
    return pulse_serve_reply_error(rq, 404, "not (yet) here");
  const char *hdr[] = {"X-Pulse-Loco-Round", round, "X-Pulse-Loco-Key", key,
                       "X-Pulse-Loco-Signature", sig, NULL};
  /* The path's bytes may be replaced (the member list): revalidate. */
  pulse_serve_meta m = {0, NULL, PULSE_SERVE_NO_CACHE, NULL,
                        is_signed ? hdr : NULL};
  int r = pulse_serve_reply_blob(rq, &m, b);
  unsigned status = pulse_serve_status(rq);
  if (status == 200 || status == 206)
    atomic_fetch_add(&s->served, pulse_serve_body_bytes(rq));
  return r;
}

static const char *query_of(void *rq, const char *key) {
  return pulse_serve_query(rq, key);
}

static int post(void *user, pulse_serve_request *rq, const char *path) {
  loco_server *s = user;
  if (s->on_post == NULL)
    return pulse_serve_reply_error(rq, 404, "no such route");
  char text[512] = "";
  if (s->gate != NULL) {
    unsigned refused = s->gate(s->gate_user, path, query_of, rq, text,
                               sizeof text);
    if (refused != 0) {
      pulse_serve_meta m = {refused, "application/json", NULL, NULL, NULL};
      return pulse_serve_reply_bytes(rq, &m, text, strnlen(text, sizeof text));
    }
  }
  unsigned status = s->on_post(s->user, path, pulse_serve_query(rq, "id"),
                               pulse_serve_query(rq, "url"), text, sizeof text);
  /* The answer signed in its headers (whatever its status: an error
   * answer's body may not reach the asker). */
  loco_sig sig;
  memset(&sig, 0, sizeof sig);
  if (s->reply_sign != NULL) {
    /* The request's number goes with its id: an answer signed for one
     * request does not pass as the answer to another. */
    const char *id = pulse_serve_query(rq, "id"),
               *seq = pulse_serve_query(rq, "seq");
    char id_seq[96];
    if (id != NULL && seq != NULL &&
        (size_t)snprintf(id_seq, sizeof id_seq, "%s&seq=%s", id, seq) <
            sizeof id_seq)
      id = id_seq;
    s->reply_sign(s->reply_sign_user, path, id, status, &sig);
  }
  char round[24], key[65], sh[129];
  const char *hdr[] = {"X-Pulse-Loco-Round", round, "X-Pulse-Loco-Key", key,
                       "X-Pulse-Loco-Signature", sh, NULL};
  if (sig.present) {
    snprintf(round, sizeof round, "%llu", (unsigned long long)sig.round);
    store_hex(sig.key, sizeof sig.key, key);
    store_hex(sig.sig, sizeof sig.sig, sh);
  }
  pulse_serve_meta m = {status, "application/json", NULL, NULL,
                        sig.present ? hdr : NULL};
  return pulse_serve_reply_bytes(rq, &m, text, strnlen(text, sizeof text));
}

/* A POST with a body under LOCO_HOSTED_PREFIX (the layer kept it, within
 * the route's limit) goes to the upload callback. */
static int upload(void *user, pulse_serve_request *rq, const char *path) {
  loco_server *s = user;
  size_t size = 0;
  const uint8_t *body = pulse_serve_request_body(rq, &size);
  char text[512] = "";
  unsigned status = s->on_upload(s->user, path, pulse_serve_query(rq, "id"),
                                 body, size, text, sizeof text);
  pulse_serve_meta m = {status, "application/json", NULL, NULL, NULL};
  return pulse_serve_reply_bytes(rq, &m, text, strnlen(text, sizeof text));
}

/* The process's fetches of the exchange (loco_http_metrics) beside the
 * layer's serving metrics: one /metrics shows both directions. */
static void fetch_metrics(void *user, pulse_bytebuf *text) {
  loco_server *s = user;
  pulse_fetch_metrics m;
  loco_http_metrics(&m);
  static const char *const what[4][2] = {
      {"requests", "HTTP tries of this process's exchange fetches and posts"},
      {"wire_bytes", "Body bytes those tries received, kept or not"},
      {"retries", "Tries made after a failed one"},
      {"failures", "Tries that did not end with a good answer"},
  };
  const uint64_t value[4] = {m.requests, m.wire_bytes, m.retries, m.failures};
  for (int i = 0; i < 4; i++)
    pulse_bytebuf_printf(text,
                         "# HELP pulse_loco_fetch_%s_total %s.\n"
                         "# TYPE pulse_loco_fetch_%s_total counter\n"
                         "pulse_loco_fetch_%s_total %llu\n",
                         what[i][0], what[i][1], what[i][0], what[i][0],
                         (unsigned long long)value[i]);
  if (s->more_metrics != NULL)
    s->more_metrics(s->metrics_user, text);
}

void loco_server_set_reply_signer(loco_server *s, loco_reply_sign_fn fn,
                                  void *user) {
  s->reply_sign_user = user;
  s->reply_sign = fn;
}

void loco_server_set_gate(loco_server *s, loco_post_gate_fn gate, void *user) {
  s->gate_user = user;
  s->gate = gate;
}

void loco_server_set_metrics(loco_server *s,
                             void (*fn)(void *user, pulse_bytebuf *text),
                             void *user) {
  s->metrics_user = user;
  s->more_metrics = fn;
}

pulse_status loco_server_start(loco_post_fn on_post, void *user,
                               loco_server **out) {
  return loco_server_start_on("127.0.0.1", on_post, user, out);
}

pulse_status loco_server_start_on(const char *host, loco_post_fn on_post,
                                  void *user, loco_server **out) {
  if (host == NULL)
    host = "127.0.0.1";
  return loco_server_start_uploads(host, on_post, NULL, user, 0, out);
}

pulse_status loco_server_start_uploads(const char *host, loco_post_fn on_post,
                                       loco_upload_fn on_upload, void *user,
                                       size_t max_bytes, loco_server **out) {
  return loco_server_start_port(host, 0, on_post, on_upload, user, max_bytes,
                                out);
}

pulse_status loco_server_start_port(const char *host, uint16_t port,
                                    loco_post_fn on_post,
                                    loco_upload_fn on_upload, void *user,
                                    size_t max_bytes, loco_server **out) {
  *out = NULL;
  if (on_upload != NULL && max_bytes == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco server: uploads of 0 bytes");
  loco_server *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco server");
  pthread_mutex_init(&s->lock, NULL);
  s->on_post = on_post;
  s->on_upload = on_upload;
  s->user = user;
  if (host == NULL) { /* a table only: nothing listens */
    *out = s;
    return PULSE_OK;
  }
  /* Uploads first: the layer routes a POST to the first route that takes
   * it. */
  size_t nroutes = 0;
  if (on_upload != NULL)
    s->routes[nroutes++] = (pulse_serve_route){
        LOCO_HOSTED_PREFIX, 1, PULSE_SERVE_POST, "upload", upload, max_bytes};
  s->routes[nroutes++] =
      (pulse_serve_route){"/", 1, PULSE_SERVE_READ, "blob", get_blob, 0};
  s->routes[nroutes++] =
      (pulse_serve_route){"/", 1, PULSE_SERVE_POST, "post", post, 0};
  pulse_serve_opts o;
  pulse_serve_opts_init(&o);
  o.name = "loco server";
  o.host = host;
  o.port = port;
  o.threads = 2;
  o.max_connections = 256;
  o.idle_timeout_s = 30;
  o.routes = s->routes;
  o.route_count = nroutes;
  o.user = s;
  o.metrics = fetch_metrics;
  pulse_status st = pulse_serve_create(&o, &s->http);
  if (st != PULSE_OK) {
    loco_server_stop(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

void loco_server_stop(loco_server *s) {
  if (s == NULL)
    return;
  pulse_serve_free(s->http);
  for (size_t i = 0; i < s->count; i++) {
    free(s->blobs[i].path);
    pulse_serve_blob_release(s->blobs[i].blob);
  }
  free(s->blobs);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

uint16_t loco_server_port(const loco_server *s) {
  return s->http != NULL ? pulse_serve_port(s->http) : 0;
}

uint64_t loco_server_bytes_served(const loco_server *s) {
  return atomic_load(&((loco_server *)s)->served);
}

uint64_t loco_server_bytes_sent(const loco_server *s) {
  return s->http != NULL ? pulse_serve_response_bytes(s->http) : 0;
}

int loco_server_copy(loco_server *s, const char *path, pulse_bytebuf *out) {
  pthread_mutex_lock(&s->lock);
  entry *e = entry_at(s, path);
  pulse_serve_blob *b = e ? pulse_serve_blob_ref(e->blob) : NULL;
  pthread_mutex_unlock(&s->lock);
  if (b == NULL)
    return 0;
  size_t n = pulse_serve_blob_size(b);
  uint8_t *copy = malloc(n ? n : 1);
  if (copy != NULL)
    memcpy(copy, pulse_serve_blob_data(b), n);
  pulse_serve_blob_release(b);
  if (copy == NULL)
    return 0;
  pulse_bytebuf_free(out);
  pulse_bytebuf_adopt(out, copy, n ? n : 1);
  out->size = n;
  return 1;
}

pulse_status loco_server_put(loco_server *s, const char *path, const void *data,
                             size_t size) {
  return loco_server_put_signed(s, path, data, size, NULL);
}

/* The headers' values of a signature (none: has_sig 0). */
static void entry_sign(entry *e, const loco_sig *sig) {
  e->has_sig = sig != NULL && sig->present;
  if (!e->has_sig)
    return;
  snprintf(e->round, sizeof e->round, "%llu", (unsigned long long)sig->round);
  store_hex(sig->key, sizeof sig->key, e->key);
  store_hex(sig->sig, sizeof sig->sig, e->sig);
}

pulse_status loco_server_put_signed(loco_server *s, const char *path,
                                    const void *data, size_t size,
                                    const loco_sig *sig) {
  pulse_serve_blob *b = NULL;
  char *p = strdup(path);
  if (p == NULL || pulse_serve_blob_create(data, size, &b) != PULSE_OK) {
    free(p);
    return pulse_fail(PULSE_ERR_NOMEM, "loco server: %zu bytes for %s", size,
                      path);
  }
  pthread_mutex_lock(&s->lock);
  entry *at = entry_at(s, path);
  if (at != NULL) {
    pulse_serve_blob *old = at->blob;
    at->blob = b;
    entry_sign(at, sig);
    pthread_mutex_unlock(&s->lock);
    pulse_serve_blob_release(old); /* responses sending it keep theirs */
    free(p);
    return PULSE_OK;
  }
  if (s->count == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 16;
    entry *e = realloc(s->blobs, cap * sizeof *e);
    if (e == NULL) {
      pthread_mutex_unlock(&s->lock);
      free(p);
      pulse_serve_blob_release(b);
      return pulse_fail(PULSE_ERR_NOMEM, "loco server: blob table");
    }
    s->blobs = e;
    s->cap = cap;
  }
  entry *e = &s->blobs[s->count++];
  e->path = p;
  e->blob = b;
  entry_sign(e, sig);
  pthread_mutex_unlock(&s->lock);
  return PULSE_OK;
}

void loco_server_drop(loco_server *s, const char *prefix, uint64_t below) {
  loco_server_drop_except(s, prefix, below, NULL);
}

static int ends_with(const char *p, const char *suffix) {
  size_t a = strlen(p), b = strlen(suffix);
  return a >= b && strcmp(p + a - b, suffix) == 0;
}

void loco_server_drop_except(loco_server *s, const char *prefix, uint64_t below,
                             const char *keep_suffix) {
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
      if (gone && keep_suffix != NULL && ends_with(p, keep_suffix))
        gone = 0;
    }
    if (gone) {
      free(s->blobs[i].path);
      pulse_serve_blob_release(s->blobs[i].blob);
      s->blobs[i] = s->blobs[--s->count];
    } else {
      i++;
    }
  }
  pthread_mutex_unlock(&s->lock);
}
