/* http_serve_reply.c - answers of the HTTP serving layer
 * (http_serve_impl.h): JSON errors, bodies from memory, and entities (files
 * and blobs) with conditional requests and Range. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http_serve_core_impl.h"
#include "http_serve_parse_impl.h"
#include "json_impl.h"

int serve_queue(pulse_serve_request *rq, unsigned status,
                struct MHD_Response *resp, uint64_t body) {
  if (resp == NULL)
    return PULSE_SERVE_CLOSE;
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  rq->status = status;
  rq->body = rq->head_method ? 0 : body;
  enum MHD_Result r = MHD_queue_response(rq->conn, status, resp);
  MHD_destroy_response(resp);
  return r == MHD_YES ? PULSE_SERVE_OK : PULSE_SERVE_CLOSE;
}

int pulse_serve_reply_error(pulse_serve_request *rq, unsigned status,
                            const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pulse_bytebuf body = PULSE_BYTEBUF_INIT;
  pulse_json_writer w;
  pulse_json_write_init(&w, &body);
  pulse_json_write_object(&w);
  pulse_json_write_key(&w, "error");
  pulse_json_write_string(&w, msg);
  pulse_json_write_end(&w);
  pulse_json_write_newline(&w, 0);
  struct MHD_Response *resp =
      pulse_json_write_finish(&w) != PULSE_OK
          ? NULL
          : MHD_create_response_from_buffer(body.size, body.data,
                                            MHD_RESPMEM_MUST_COPY);
  uint64_t len = body.size;
  pulse_bytebuf_free(&body);
  if (resp == NULL)
    return PULSE_SERVE_CLOSE;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                          PULSE_SERVE_NO_STORE);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(
        resp, MHD_HTTP_HEADER_ALLOW,
        serve_allow_text(rq->allow ? rq->allow : rq->srv->all_methods));
  if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  return serve_queue(rq, status, resp, len);
}

/* ETag, Cache-Control and the extra headers of a body or its 304. */
static void add_meta(struct MHD_Response *resp, const pulse_serve_meta *m) {
  if (m->etag != NULL)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, m->etag);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL,
                          m->cache ? m->cache : PULSE_SERVE_NO_STORE);
}

static void add_extra(struct MHD_Response *resp, const pulse_serve_meta *m) {
  for (size_t i = 0; m->extra != NULL && m->extra[i] != NULL; i += 2)
    MHD_add_response_header(resp, m->extra[i], m->extra[i + 1]);
}

static int not_modified(pulse_serve_request *rq, const pulse_serve_meta *m,
                        int ranges) {
  struct MHD_Response *resp =
      MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  if (resp == NULL)
    return PULSE_SERVE_CLOSE;
  add_meta(resp, m);
  if (ranges)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
  add_extra(resp, m);
  return serve_queue(rq, MHD_HTTP_NOT_MODIFIED, resp, 0);
}

static int reply_memory(pulse_serve_request *rq, const pulse_serve_meta *m,
                        void *data, size_t size,
                        enum MHD_ResponseMemoryMode mode) {
  if (m->etag != NULL &&
      serve_etag_listed(pulse_serve_header(rq, MHD_HTTP_HEADER_IF_NONE_MATCH),
                        m->etag)) {
    if (mode == MHD_RESPMEM_MUST_FREE)
      free(data);
    return not_modified(rq, m, 0);
  }
  struct MHD_Response *resp = MHD_create_response_from_buffer(size, data, mode);
  if (resp == NULL) {
    if (mode == MHD_RESPMEM_MUST_FREE)
      free(data);
    return PULSE_SERVE_CLOSE;
  }
  if (m->type != NULL)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, m->type);
  add_meta(resp, m);
  add_extra(resp, m);
  return serve_queue(rq, m->status ? m->status : MHD_HTTP_OK, resp, size);
}

int pulse_serve_reply_bytes(pulse_serve_request *rq, const pulse_serve_meta *m,
                            const void *data, size_t size) {
  return reply_memory(rq, m, (void *)data, size, MHD_RESPMEM_MUST_COPY);
}

int pulse_serve_reply_take(pulse_serve_request *rq, const pulse_serve_meta *m,
                           void *data, size_t size) {
  return reply_memory(rq, m, data, size, MHD_RESPMEM_MUST_FREE);
}

/* ------------------------------------------------------------- entities */

/* What an entity's bytes come from: a file or a blob (exactly one). */
typedef struct {
  int fd;
  pulse_serve_blob *blob;
  const uint8_t *bytes; /* the blob's */
} source;

static void source_drop(source *src) {
  if (src->fd >= 0)
    close(src->fd);
  pulse_serve_blob_release(src->blob);
}

static void blob_done(void *cls) {
  pulse_serve_blob_release(cls);
}

/* Serves bytes [first, first + len) of the source; takes it. */
static struct MHD_Response *body_of(source *src, uint64_t first, uint64_t len) {
  struct MHD_Response *resp;
  if (src->blob != NULL) {
    resp = MHD_create_response_from_buffer_with_free_callback_cls(
        (size_t)len, (void *)(src->bytes + first), blob_done, src->blob);
  } else {
    /* MHD sends it with sendfile(): the bytes never enter user space. It
     * closes fd when the response is destroyed. */
    resp = MHD_create_response_from_fd_at_offset64(len, src->fd, first);
  }
  if (resp == NULL)
    source_drop(src);
  return resp;
}

static int reply_entity(pulse_serve_request *rq, const pulse_serve_meta *m,
                        source *src, uint64_t size) {
  if (serve_etag_listed(pulse_serve_header(rq, MHD_HTTP_HEADER_IF_NONE_MATCH),
                        m->etag)) {
    source_drop(src);
    return not_modified(rq, m, 1);
  }
  const char *range = pulse_serve_header(rq, MHD_HTTP_HEADER_RANGE);
  const char *if_range = pulse_serve_header(rq, MHD_HTTP_HEADER_IF_RANGE);
  if (if_range != NULL && (m->etag == NULL || strcmp(if_range, m->etag) != 0))
    range = NULL; /* the client's partial copy is of other bytes */
  uint64_t first = 0, last = size ? size - 1 : 0;
  serve_range rk = serve_parse_range(range, size, &first, &last);
  char crange[96];
  if (rk == SERVE_RANGE_UNSATISFIABLE) {
    source_drop(src);
    snprintf(crange, sizeof crange, "bytes */%" PRIu64, size);
    static const char msg[] = "{\"error\":\"range not satisfiable\"}\n";
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    if (resp != NULL) {
      MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
      MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                              "application/json");
    }
    return serve_queue(rq, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp,
                       sizeof msg - 1);
  }
  unsigned status = MHD_HTTP_OK;
  uint64_t len = size;
  if (rk == SERVE_RANGE_OK) {
    snprintf(crange, sizeof crange, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
             first, last, size);
    len = last - first + 1;
    status = MHD_HTTP_PARTIAL_CONTENT;
  } else {
    first = 0;
  }
  struct MHD_Response *resp = body_of(src, first, len);
  if (resp == NULL)
    return PULSE_SERVE_CLOSE;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          m->type ? m->type : "application/octet-stream");
  if (rk == SERVE_RANGE_OK)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
  add_meta(resp, m);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
  add_extra(resp, m);
  return serve_queue(rq, status, resp, len);
}

int pulse_serve_reply_fd(pulse_serve_request *rq, const pulse_serve_meta *m,
                         int fd, uint64_t size) {
  source src = {fd, NULL, NULL};
  if (m->etag == NULL) {
    source_drop(&src);
    return pulse_serve_reply_error(rq, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                   "no ETag for a file");
  }
  return reply_entity(rq, m, &src, size);
}

int pulse_serve_reply_blob(pulse_serve_request *rq, const pulse_serve_meta *m,
                           pulse_serve_blob *b) {
  source src = {-1, b, serve_blob_bytes(b)};
  pulse_serve_meta own = *m;
  if (own.etag == NULL)
    own.etag = pulse_serve_blob_etag(b);
  return reply_entity(rq, &own, &src, pulse_serve_blob_size(b));
}
