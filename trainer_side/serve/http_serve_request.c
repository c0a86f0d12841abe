/* http_serve_request.c - one request's life in the HTTP serving layer
 * (http_serve_impl.h): from the raw URI to the route's handler, the
 * refusals on the way, suspension, and completion. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_serve_core_impl.h"
#include "http_serve_parse_impl.h"

void *serve_uri_log(void *cls, const char *uri, struct MHD_Connection *conn) {
  serve_conn_request_line(cls, conn);
  pulse_serve_request *rq = calloc(1, sizeof *rq);
  if (rq == NULL)
    return NULL;
  rq->srv = cls;
  rq->start = pulse_serve_now();
  rq->label = rq->srv->label_other;
  /* MHD decodes %XX before routing; an encoded NUL would cut the path short
   * ("/v1/head%00.json" -> "/v1/head"), so refuse it from the raw form. */
  for (const char *p = uri; p != NULL && *p; p++)
    if (p[0] == '%' && p[1] == '0' && p[2] == '0')
      rq->bad_raw_uri = 1;
  return rq;
}

void serve_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                     enum MHD_RequestTerminationCode toe) {
  pulse_serve *s = cls;
  pulse_serve_request *rq = *con_cls;
  serve_conn_request_done(s, conn);
  if (rq == NULL)
    return;
  if (rq->done != NULL)
    rq->done(rq->data);
  if (rq->was_suspended)
    atomic_fetch_sub(&s->suspended, 1);
  pulse_bytebuf_free(&rq->upload); /* also a body cut short */
  if (rq->status != 0)
    serve_metrics_count(s, rq->label, rq->status,
                        toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? rq->body
                                                                   : 0,
                        pulse_serve_now() - rq->start);
  free(rq);
  *con_cls = NULL;
}

const char *serve_allow_text(unsigned m) {
  static const char *const text[8] = {
      "",     "GET",       "HEAD",       "GET, HEAD",
      "POST", "GET, POST", "HEAD, POST", "GET, HEAD, POST"};
  return text[m & 7u];
}

static unsigned method_bit(const char *method) {
  if (strcmp(method, MHD_HTTP_METHOD_GET) == 0)
    return PULSE_SERVE_GET;
  if (strcmp(method, MHD_HTTP_METHOD_HEAD) == 0)
    return PULSE_SERVE_HEAD;
  if (strcmp(method, MHD_HTTP_METHOD_POST) == 0)
    return PULSE_SERVE_POST;
  return 0;
}

static int route_matches(const pulse_serve_route *r, const char *url) {
  return r->prefix ? strncmp(url, r->path, strlen(r->path)) == 0
                   : strcmp(url, r->path) == 0;
}

static int builtin(pulse_serve_request *rq, const char *url) {
  pulse_serve *s = rq->srv;
  if (strcmp(url, "/metrics") == 0) {
    rq->label = s->label_metrics;
    pulse_buffer text = {NULL, 0};
    if (pulse_serve_metrics_text(s, &text) != PULSE_OK)
      return pulse_serve_reply_error(rq, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                     "out of memory");
    pulse_serve_meta m = {0, "text/plain; version=0.0.4; charset=utf-8", NULL,
                          NULL, NULL};
    return pulse_serve_reply_take(rq, &m, text.data, text.size);
  }
  rq->label = s->label_healthz;
  char body[256] = "{\"status\":\"ok\"}\n";
  if (s->opts.healthz != NULL)
    s->opts.healthz(s->opts.user, body, sizeof body);
  pulse_serve_meta m = {0, "application/json", NULL, NULL, NULL};
  return pulse_serve_reply_bytes(rq, &m, body, strnlen(body, sizeof body));
}

/* Routes a complete request: method, path refusals, route table. */
static int dispatch(pulse_serve_request *rq, const char *url,
                    const char *method) {
  pulse_serve *s = rq->srv;
  unsigned bit = method_bit(method);
  rq->allow = s->all_methods;
  if ((bit & s->all_methods) == 0)
    return pulse_serve_reply_error(rq, MHD_HTTP_METHOD_NOT_ALLOWED, "only %s",
                                   serve_allow_text(s->all_methods));
  rq->head_method = bit == PULSE_SERVE_HEAD;
  const char *why =
      rq->bad_raw_uri ? "an encoded NUL in the path" : serve_path_refusal(url);
  if (why != NULL)
    return pulse_serve_reply_error(rq, MHD_HTTP_BAD_REQUEST, "%s", why);
  if ((bit & PULSE_SERVE_READ) &&
      (strcmp(url, "/metrics") == 0 || strcmp(url, "/healthz") == 0))
    return builtin(rq, url);
  unsigned allowed = 0;
  for (size_t i = 0; i < s->opts.route_count; i++) {
    const pulse_serve_route *r = &s->opts.routes[i];
    if (!route_matches(r, url))
      continue;
    if ((r->methods & bit) == 0) {
      allowed |= r->methods;
      continue;
    }
    rq->route = r;
    rq->label = s->route_label[i];
    if (rq->body_seen && (bit != PULSE_SERVE_POST || r->max_body == 0))
      return pulse_serve_reply_error(rq, MHD_HTTP_BAD_REQUEST,
                                     "no body expected");
    if (rq->body_too_large)
      return pulse_serve_reply_error(rq, MHD_HTTP_CONTENT_TOO_LARGE,
                                     "body over %zu bytes", r->max_body);
    if (rq->upload.failed)
      return pulse_serve_reply_error(rq, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                     "out of memory for the body");
    return r->handler(s->opts.user, rq, url);
  }
  if (allowed != 0) {
    rq->allow = allowed;
    return pulse_serve_reply_error(rq, MHD_HTTP_METHOD_NOT_ALLOWED, "only %s",
                                   serve_allow_text(allowed));
  }
  return pulse_serve_reply_error(rq, MHD_HTTP_NOT_FOUND, "no such route");
}

/* The body limit of the route a POST to url goes to (the first that
 * matches and takes POST, as dispatch picks it); 0: it takes no body. */
static size_t body_limit(const pulse_serve *s, const char *url) {
  for (size_t i = 0; i < s->opts.route_count; i++) {
    const pulse_serve_route *r = &s->opts.routes[i];
    if (route_matches(r, url) && (r->methods & PULSE_SERVE_POST))
      return r->max_body;
  }
  return 0;
}

/* At the headers of a POST to a route that takes a body: a declared length
 * over the limit is refused at once (MHD then drops the rest and closes;
 * the peer is not kept waiting for a body that would be thrown away). */
static int refuse_declared_length(pulse_serve_request *rq,
                                  struct MHD_Connection *conn) {
  const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                               MHD_HTTP_HEADER_CONTENT_LENGTH);
  if (cl == NULL)
    return 0; /* chunked: counted as it comes */
  char *end;
  unsigned long long n = strtoull(cl, &end, 10);
  if (end == cl || *end != '\0' || n <= rq->body_limit)
    return 0; /* MHD itself refuses a malformed length */
  rq->body_too_large = 1;
  return 1;
}

/* One piece of a POST body: kept while the total fits the route's limit,
 * else all of it is dropped (the answer is 413 once the request is read:
 * MHD takes no answer while it hands over body data). */
static void take_body(pulse_serve_request *rq, const char *data, size_t n) {
  if (rq->body_limit == 0) {
    rq->body_seen = 1;
    return;
  }
  rq->body_seen = 1;
  if (rq->body_too_large)
    return;
  if (n > rq->body_limit - rq->upload.size) {
    rq->body_too_large = 1;
    pulse_bytebuf_free(&rq->upload);
    return;
  }
  /* First piece: room for what was declared (bounded by the limit). */
  pulse_bytebuf_reserve(&rq->upload, n, 64u * 1024u);
  pulse_bytebuf_put(&rq->upload, data, n);
}

enum MHD_Result serve_access(void *cls, struct MHD_Connection *conn,
                             const char *url, const char *method,
                             const char *version, const char *upload_data,
                             size_t *upload_data_size, void **con_cls) {
  (void)cls, (void)version;
  pulse_serve_request *rq = *con_cls;
  if (rq == NULL)
    return MHD_NO; /* the URI callback could not allocate */
  rq->conn = conn;
  if (rq->suspended) { /* resumed: the same handler answers now */
    rq->suspended = 0;
    rq->resumed = 1;
    return rq->route->handler(rq->srv->opts.user, rq, url) ? MHD_YES : MHD_NO;
  }
  if (*upload_data_size != 0) {
    /* On GET and HEAD a body is ignored and the answer follows; a POST's
     * is kept for a route that takes one, else refused once it is read. */
    serve_conn_body_data(rq->srv, conn, *upload_data_size);
    if (method_bit(method) == PULSE_SERVE_POST)
      take_body(rq, upload_data, *upload_data_size);
    *upload_data_size = 0;
    return MHD_YES;
  }
  /* MHD calls once when the headers are in and again when the request is
   * complete: answering at the first call would close the connection
   * (the request would count as not fully read), so keep-alive needs the
   * answer at the second. */
  if (!rq->headers_seen) {
    rq->headers_seen = 1;
    serve_conn_headers_done(rq->srv, conn);
    if (method_bit(method) == PULSE_SERVE_POST &&
        (rq->body_limit = body_limit(rq->srv, url)) != 0 &&
        refuse_declared_length(rq, conn))
      return dispatch(rq, url, method) ? MHD_YES : MHD_NO;
    return MHD_YES;
  }
  /* The request is in whole: from here it runs (is answered, or waits on
   * the server's own event), with no deadline and never evicted. */
  serve_conn_request_read(rq->srv, conn);
  return dispatch(rq, url, method) ? MHD_YES : MHD_NO;
}

/* ------------------------------------------------------------ accessors */

const char *pulse_serve_query(pulse_serve_request *rq, const char *key) {
  return MHD_lookup_connection_value(rq->conn, MHD_GET_ARGUMENT_KIND, key);
}

const char *pulse_serve_header(pulse_serve_request *rq, const char *name) {
  return MHD_lookup_connection_value(rq->conn, MHD_HEADER_KIND, name);
}

const uint8_t *pulse_serve_request_body(const pulse_serve_request *rq,
                                        size_t *size) {
  *size = rq->upload.size;
  return rq->upload.size ? rq->upload.data : NULL;
}

int pulse_serve_is_head(const pulse_serve_request *rq) {
  return rq->head_method;
}

uint64_t pulse_serve_body_bytes(const pulse_serve_request *rq) {
  return rq->body;
}

unsigned pulse_serve_status(const pulse_serve_request *rq) {
  return rq->status;
}

void pulse_serve_relabel(pulse_serve_request *rq, const char *label) {
  rq->label = serve_label_index(rq->srv, label);
}

void pulse_serve_attach(pulse_serve_request *rq, void *data,
                        void (*done)(void *data)) {
  rq->data = data;
  rq->done = done;
}

void *pulse_serve_attached(const pulse_serve_request *rq) {
  return rq->data;
}

void pulse_serve_suspend(pulse_serve_request *rq) {
  rq->suspended = 1;
  if (!rq->was_suspended) {
    rq->was_suspended = 1;
    atomic_fetch_add(&rq->srv->suspended, 1);
  }
  MHD_suspend_connection(rq->conn);
}

void pulse_serve_resume(pulse_serve_request *rq) {
  MHD_resume_connection(rq->conn);
}

int pulse_serve_resumed(const pulse_serve_request *rq) {
  return rq->resumed;
}
