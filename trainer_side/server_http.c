/* server_http.c - requests: routing, refusals, conditional requests, Range,
 * zero-copy file bodies, JSON errors. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "json_impl.h"
#include "server_impl.h"
#include "store_impl.h"

static unsigned code_index(unsigned status) {
  static const unsigned codes[SRV_CODES - 1] = {200, 206, 304, 400, 404,
                                                405, 416, 500, 503};
  for (unsigned i = 0; i < SRV_CODES - 1; i++)
    if (codes[i] == status)
      return i;
  return SRV_CODES - 1;
}

void *srv_uri_log(void *cls, const char *uri, struct MHD_Connection *conn) {
  (void)conn;
  srv_request *rq = calloc(1, sizeof *rq);
  if (rq == NULL)
    return NULL;
  rq->srv = cls;
  rq->start = srv_now();
  rq->route = SRV_ROUTE_OTHER;
  /* MHD decodes %XX before routing; an encoded NUL would cut the path short
   * ("/v1/head%00.json" -> "/v1/head"), so refuse it from the raw form. */
  for (const char *p = uri; p != NULL && *p; p++)
    if (p[0] == '%' && p[1] == '0' && p[2] == '0')
      rq->bad_raw_uri = 1;
  return rq;
}

void srv_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                   enum MHD_RequestTerminationCode toe) {
  (void)conn;
  pulse_server *srv = cls;
  srv_request *rq = *con_cls;
  if (rq == NULL)
    return;
  if (rq->waiting && !rq->woken) { /* never resumed: take it off the list */
    pthread_mutex_lock(&srv->lock);
    if (rq->prev)
      rq->prev->next = rq->next;
    else if (srv->waiters == rq)
      srv->waiters = rq->next;
    if (rq->next)
      rq->next->prev = rq->prev;
    srv->nwaiters--;
    pthread_mutex_unlock(&srv->lock);
  } else if (rq->woken) {
    pthread_mutex_lock(&srv->lock);
    srv->resumed--;
    pthread_mutex_unlock(&srv->lock);
  }
  if (rq->status != 0)
    srv_metrics_count(
        &srv->metrics, rq->route, rq->status,
        toe == MHD_REQUEST_TERMINATED_COMPLETED_OK ? rq->body_bytes : 0,
        srv_now() - rq->start);
  free(rq);
  *con_cls = NULL;
}

void srv_metrics_count(srv_metrics *m, srv_route route, unsigned status,
                       uint64_t bytes, double seconds) {
  atomic_fetch_add(&m->requests[route][code_index(status)], 1);
  atomic_fetch_add(&m->bytes[route], bytes);
  srv_histogram_add(&m->duration[route], seconds);
}

enum MHD_Result srv_queue(srv_request *rq, struct MHD_Connection *conn,
                          unsigned status, struct MHD_Response *resp,
                          uint64_t body_bytes) {
  if (resp == NULL)
    return MHD_NO;
  MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
  rq->status = status;
  rq->body_bytes = rq->head_method ? 0 : body_bytes;
  enum MHD_Result r = MHD_queue_response(conn, status, resp);
  MHD_destroy_response(resp);
  return r;
}

enum MHD_Result srv_error(srv_request *rq, struct MHD_Connection *conn,
                          unsigned status, const char *fmt, ...) {
  char msg[400], esc[2400 + 1];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t n = pulse_json_escape(esc, msg, strlen(msg));
  esc[n] = '\0';
  char body[2600];
  int len = snprintf(body, sizeof body, "{\"error\":\"%s\"}\n", esc);
  struct MHD_Response *resp =
      MHD_create_response_from_buffer((size_t)len, body, MHD_RESPMEM_MUST_COPY);
  if (resp == NULL)
    return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "application/json");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
  return srv_queue(rq, conn, status, resp, (uint64_t)len);
}

/* ------------------------------------------------------ conditionals, Range */

/* 1 when an If-None-Match list holds `etag` (or is "*"). Weak comparison, as
 * RFC 9110 asks for If-None-Match. */
static int etag_listed(const char *list, const char *etag) {
  if (list == NULL)
    return 0;
  size_t el = strlen(etag);
  for (const char *p = list; *p;) {
    while (*p == ' ' || *p == '\t' || *p == ',')
      p++;
    if (*p == '*')
      return 1;
    if (p[0] == 'W' && p[1] == '/')
      p += 2;
    if (strncmp(p, etag, el) == 0 &&
        (p[el] == '\0' || p[el] == ',' || p[el] == ' ' || p[el] == '\t'))
      return 1;
    while (*p && *p != ',')
      p++;
  }
  return 0;
}

typedef enum { RANGE_NONE, RANGE_OK, RANGE_UNSATISFIABLE } range_kind;

static int digits_u64(const char *s, size_t n, uint64_t *out) {
  if (n == 0 || n > 19)
    return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  *out = v;
  return 0;
}

/* One "bytes=a-b", "bytes=a-" or "bytes=-n" range. Anything else (several
 * ranges, other units, bad syntax) is ignored: the whole body is sent, as
 * RFC 9110 allows. */
static range_kind parse_range(const char *h, uint64_t size, uint64_t *first,
                              uint64_t *last) {
  if (h == NULL || strncmp(h, "bytes=", 6) != 0)
    return RANGE_NONE;
  const char *s = h + 6;
  if (strchr(s, ',') != NULL)
    return RANGE_NONE;
  const char *dash = strchr(s, '-');
  if (dash == NULL)
    return RANGE_NONE;
  const char *end = s + strlen(s);
  uint64_t a, b;
  if (dash == s) { /* suffix */
    if (digits_u64(dash + 1, (size_t)(end - dash - 1), &b) != 0)
      return RANGE_NONE;
    if (b == 0 || size == 0)
      return RANGE_UNSATISFIABLE;
    *first = b >= size ? 0 : size - b;
    *last = size - 1;
    return RANGE_OK;
  }
  if (digits_u64(s, (size_t)(dash - s), &a) != 0)
    return RANGE_NONE;
  if (dash + 1 == end)
    b = UINT64_MAX;
  else if (digits_u64(dash + 1, (size_t)(end - dash - 1), &b) != 0 || b < a)
    return RANGE_NONE;
  if (a >= size)
    return RANGE_UNSATISFIABLE;
  *first = a;
  *last = b >= size ? size - 1 : b;
  return RANGE_OK;
}

enum MHD_Result srv_serve_fd(srv_request *rq, struct MHD_Connection *conn,
                             int fd, uint64_t size, const char *etag,
                             int immutable, const char *const *extra) {
  const char *cache =
      immutable ? "public, max-age=31536000, immutable" : "no-cache";
  const char *inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                MHD_HTTP_HEADER_IF_NONE_MATCH);
  struct MHD_Response *resp;
  unsigned status;
  uint64_t body = 0;
  char crange[96];
  crange[0] = '\0';
  if (etag_listed(inm, etag)) {
    close(fd);
    resp = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    status = MHD_HTTP_NOT_MODIFIED;
  } else {
    const char *range = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_RANGE);
    const char *if_range = MHD_lookup_connection_value(
        conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_RANGE);
    if (if_range != NULL && strcmp(if_range, etag) != 0)
      range = NULL; /* the client's partial copy is of other bytes */
    uint64_t first = 0, last = size ? size - 1 : 0;
    range_kind rk = parse_range(range, size, &first, &last);
    if (rk == RANGE_UNSATISFIABLE) {
      close(fd);
      snprintf(crange, sizeof crange, "bytes */%" PRIu64, size);
      char body_s[] = "{\"error\":\"range not satisfiable\"}\n";
      resp = MHD_create_response_from_buffer(sizeof body_s - 1, body_s,
                                             MHD_RESPMEM_MUST_COPY);
      if (resp != NULL) {
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                "application/json");
      }
      return srv_queue(rq, conn, MHD_HTTP_RANGE_NOT_SATISFIABLE, resp,
                       sizeof body_s - 1);
    }
    if (rk == RANGE_OK) {
      snprintf(crange, sizeof crange, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64,
               first, last, size);
      body = last - first + 1;
      status = MHD_HTTP_PARTIAL_CONTENT;
    } else {
      first = 0;
      body = size;
      status = MHD_HTTP_OK;
    }
    /* MHD sends it with sendfile(): the bytes never enter user space. It
     * closes fd when the response is destroyed. */
    resp = MHD_create_response_from_fd_at_offset64(body, fd, first);
    if (resp == NULL)
      close(fd);
    else
      MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                              "application/octet-stream");
  }
  if (resp == NULL)
    return MHD_NO;
  if (crange[0])
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_RANGE, crange);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ETAG, etag);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, cache);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
  for (size_t i = 0; extra != NULL && extra[i] != NULL; i += 2)
    MHD_add_response_header(resp, extra[i], extra[i + 1]);
  return srv_queue(rq, conn, status, resp, body);
}

/* ---------------------------------------------------------------- routing */

/* Paths that can never name anything: refused before routing. */
static const char *path_refusal(const char *url) {
  size_t n = strlen(url);
  if (n == 0 || url[0] != '/')
    return "the path must be absolute";
  if (n > 512)
    return "the path is too long";
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)url[i];
    if (c < 0x20 || c >= 0x7f)
      return "control or non-ASCII bytes in the path";
    if (c == '\\')
      return "backslash in the path";
    if (c == '%')
      return "a %-escape in the decoded path (double encoding)";
  }
  if (strstr(url, "..") != NULL)
    return "\"..\" in the path";
  if (strstr(url, "//") != NULL)
    return "empty path segment";
  return NULL;
}

static enum MHD_Result
object_request(srv_request *rq, struct MHD_Connection *conn, const char *name) {
  pulse_server *srv = rq->srv;
  pulse_store_kind kind;
  uint8_t sha[32];
  if (!store_parse_object_name(name, &kind, sha))
    return srv_error(rq, conn, MHD_HTTP_NOT_FOUND, "no such object");
  if (srv->objects_fd < 0) {
    char objs[4096];
    snprintf(objs, sizeof objs, "%s/" PULSE_STORE_OBJECTS_DIR, srv->dir);
    int fd = open(objs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      int expected = -1;
      /* Another thread may have opened it meanwhile: keep one. */
      if (!__atomic_compare_exchange_n(&srv->objects_fd, &expected, fd, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        close(fd);
    }
  }
  /* The name was checked to be 64 hex digits and an extension: openat
   * cannot leave objects/, and O_NOFOLLOW refuses a planted link. */
  int fd = srv->objects_fd >= 0 ? openat(srv->objects_fd, name,
                                         O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                                : -1;
  if (fd < 0)
    return srv_error(rq, conn, MHD_HTTP_NOT_FOUND, "no such object");
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return srv_error(rq, conn, MHD_HTTP_NOT_FOUND, "no such object");
  }
  char hex[65], etag[67];
  store_hex(sha, 32, hex);
  snprintf(etag, sizeof etag, "\"%s\"", hex);
  return srv_serve_fd(rq, conn, fd, (uint64_t)sb.st_size, etag, 1, NULL);
}

static enum MHD_Result simple_text(srv_request *rq, struct MHD_Connection *conn,
                                   const char *type, char *text, size_t len,
                                   int must_free) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      len, text, must_free ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_MUST_COPY);
  if (resp == NULL) {
    if (must_free)
      free(text);
    return MHD_NO;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  return srv_queue(rq, conn, MHD_HTTP_OK, resp, len);
}

static int parse_step(const char *s, uint64_t *out) {
  size_t n = strlen(s);
  return digits_u64(s, n, out) == 0 && !(n > 1 && s[0] == '0') ? 0 : -1;
}

enum MHD_Result srv_access(void *cls, struct MHD_Connection *conn,
                           const char *url, const char *method,
                           const char *version, const char *upload_data,
                           size_t *upload_data_size, void **con_cls) {
  (void)version, (void)upload_data;
  pulse_server *srv = cls;
  srv_request *rq = *con_cls;
  if (rq == NULL)
    return MHD_NO; /* the URI callback could not allocate */
  if (rq->waiting)
    return srv_head_request(rq, conn);
  if (*upload_data_size != 0) {
    *upload_data_size = 0; /* a body on a GET: ignored, the answer follows */
    return MHD_YES;
  }
  /* MHD calls once when the headers are in and again when the request is
   * complete: answering at the first call would close the connection
   * (the request would count as not fully read), so keep-alive needs the
   * answer at the second. */
  if (!rq->headers_seen) {
    rq->headers_seen = 1;
    return MHD_YES;
  }
  if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
    return srv_error(rq, conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                     "only GET and HEAD");
  rq->head_method = strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  const char *why =
      rq->bad_raw_uri ? "an encoded NUL in the path" : path_refusal(url);
  if (why != NULL)
    return srv_error(rq, conn, MHD_HTTP_BAD_REQUEST, "%s", why);
  if (strcmp(url, "/v1/head") == 0) {
    rq->route = SRV_ROUTE_HEAD;
    return srv_head_request(rq, conn);
  }
  if (strncmp(url, "/v1/objects/", 12) == 0) {
    rq->route = SRV_ROUTE_OBJECT;
    return object_request(rq, conn, url + 12);
  }
  if (strncmp(url, "/v1/catchup/", 12) == 0) {
    rq->route = SRV_ROUTE_CATCHUP;
    uint64_t from;
    if (parse_step(url + 12, &from) != 0)
      return srv_error(rq, conn, MHD_HTTP_NOT_FOUND,
                       "catch-up paths are /v1/catchup/<step>");
    return srv_catchup_request(rq, conn, from);
  }
  if (strcmp(url, "/metrics") == 0) {
    rq->route = SRV_ROUTE_METRICS;
    pulse_buffer text = {NULL, 0};
    if (srv_metrics_text(srv, &text) != PULSE_OK)
      return srv_error(rq, conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                       "out of memory");
    return simple_text(rq, conn, "text/plain; version=0.0.4; charset=utf-8",
                       (char *)text.data, text.size, 1);
  }
  if (strcmp(url, "/healthz") == 0) {
    rq->route = SRV_ROUTE_HEALTHZ;
    srv_head *h = srv_head_get(srv);
    char body[128];
    int len =
        h ? snprintf(body, sizeof body,
                     "{\"status\":\"ok\",\"step\":%" PRIu64 "}\n", h->step)
          : snprintf(body, sizeof body, "{\"status\":\"ok\",\"step\":null}\n");
    srv_head_release(h);
    return simple_text(rq, conn, "application/json", body, (size_t)len, 0);
  }
  return srv_error(rq, conn, MHD_HTTP_NOT_FOUND, "no such route");
}
