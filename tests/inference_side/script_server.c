/* script_server.c - the scripted HTTP server of script_server.h
 * (libmicrohttpd, a thread per connection, 127.0.0.1 only). */
#include "script_server.h"

#include <arpa/inet.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SS_PATHS 32

struct script_server {
  struct MHD_Daemon *daemon;
  uint16_t port;
  pthread_mutex_t lock;
  ss_request log[SS_MAX_LOG];
  size_t nlog;
  char paths[SS_PATHS][64]; /* requests per path, for the scripts */
  unsigned hits[SS_PATHS];
  atomic_int closing;
};

/* A body served by a reader: bytes [from, from + len) of /blob, cut
 * after `cut` bytes (UINT64_MAX: not), or /slow's drip. */
typedef struct {
  script_server *s;
  uint64_t from, cut;
  int slow;
} body;

/* Counts a request to path; returns how many came before it. */
static unsigned hit(script_server *s, const char *path) {
  unsigned before = 0;
  for (int i = 0; i < SS_PATHS; i++) {
    if (s->paths[i][0] == '\0')
      snprintf(s->paths[i], sizeof s->paths[i], "%s", path);
    if (strcmp(s->paths[i], path) == 0) {
      before = s->hits[i]++;
      break;
    }
  }
  return before;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status,
                            const char *t) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(t), (void *)t, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static ssize_t read_body(void *cls, uint64_t pos, char *buf, size_t max) {
  body *b = cls;
  if (atomic_load(&b->s->closing) || pos >= b->cut)
    return MHD_CONTENT_READER_END_WITH_ERROR;
  if (b->slow) {
    usleep(10000);
    buf[0] = 'x';
    return 1;
  }
  size_t n = max;
  if (b->cut - pos < n)
    n = (size_t)(b->cut - pos);
  for (size_t i = 0; i < n; i++)
    buf[i] = (char)ss_blob_byte(b->from + pos + i);
  return (ssize_t)n;
}

/* Serves /blob bytes [from, to] (inclusive) as `status`, cut after `cut`
 * body bytes. */
static enum MHD_Result blob(struct MHD_Connection *c, script_server *s,
                            unsigned status, uint64_t from, uint64_t to,
                            uint64_t cut, const char *etag) {
  body *b = calloc(1, sizeof *b);
  b->s = s;
  b->from = from;
  b->cut = cut;
  struct MHD_Response *r = MHD_create_response_from_callback(
      to + 1 - from, 65536, read_body, b, free);
  MHD_add_response_header(r, "ETag", etag);
  MHD_add_response_header(r, "Accept-Ranges", "bytes");
  if (status == 206) {
    char cr[96];
    snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%u", from, to,
             SS_BLOB_SIZE);
    MHD_add_response_header(r, "Content-Range", cr);
  }
  enum MHD_Result ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

/* /blob, /cut/K and /etag2/K: Range and If-Range honoured. */
static enum MHD_Result ranged(struct MHD_Connection *c, script_server *s,
                              const ss_request *q, unsigned before,
                              uint64_t cut, int etag_moves) {
  const char *etag = etag_moves && before > 0 ? "\"v2\"" : "\"v1\"";
  uint64_t a = 0, b = SS_BLOB_SIZE - 1;
  int use_range = q->range[0] != '\0' &&
                  (q->if_range[0] == '\0' || strcmp(q->if_range, etag) == 0);
  if (use_range) {
    int n = sscanf(q->range, "bytes=%" SCNu64 "-%" SCNu64, &a, &b);
    if (n < 1 || a >= SS_BLOB_SIZE)
      return text(c, 416, "bad range\n");
    if (n < 2 || b >= SS_BLOB_SIZE)
      b = SS_BLOB_SIZE - 1;
  }
  return blob(c, s, use_range ? 206 : 200, a, b, before == 0 ? cut : UINT64_MAX,
              etag);
}

static enum MHD_Result slow(struct MHD_Connection *c, script_server *s) {
  body *b = calloc(1, sizeof *b);
  b->s = s;
  b->cut = UINT64_MAX;
  b->slow = 1;
  struct MHD_Response *r =
      MHD_create_response_from_callback(1000000, 1, read_body, b, free);
  enum MHD_Result ok = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ok;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c,
                              const char *url, const char *method,
                              const char *version, const char *upload,
                              size_t *upload_size, void **state) {
  (void)version, (void)upload;
  script_server *s = cls;
  static int marker;
  if (*state == NULL) {
    *state = &marker;
    return MHD_YES;
  }
  if (*upload_size != 0)
    return text(c, 400, "no body expected\n");
  ss_request q;
  memset(&q, 0, sizeof q);
  snprintf(q.method, sizeof q.method, "%s", method);
  snprintf(q.path, sizeof q.path, "%s", url);
  const char *v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
  snprintf(q.range, sizeof q.range, "%s", v ? v : "");
  v = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "If-Range");
  snprintf(q.if_range, sizeof q.if_range, "%s", v ? v : "");
  pthread_mutex_lock(&s->lock);
  if (s->nlog < SS_MAX_LOG)
    s->log[s->nlog++] = q;
  unsigned before = hit(s, url);
  pthread_mutex_unlock(&s->lock);
  unsigned n = 0;
  if (strcmp(url, "/post") == 0)
    return strcmp(method, "POST") == 0 ? text(c, 201, "posted")
                                       : text(c, 405, "POST only\n");
  if (sscanf(url, "/flaky/%u", &n) == 1)
    return before < n ? text(c, 503, "busy\n") : text(c, 200, "recovered");
  if (sscanf(url, "/later/%u", &n) == 1)
    return before < n ? text(c, 404, "not yet\n") : text(c, 200, "here now");
  if (strcmp(url, "/missing") == 0)
    return text(c, 404, "no such thing\n");
  if (strcmp(url, "/gone") == 0)
    return text(c, 410, "gone\n");
  if (strcmp(url, "/blob") == 0)
    return ranged(c, s, &q, before, UINT64_MAX, 0);
  if (sscanf(url, "/cut/%u", &n) == 1)
    return ranged(c, s, &q, before, n, 0);
  if (sscanf(url, "/etag2/%u", &n) == 1)
    return ranged(c, s, &q, before, n, 1);
  if (strcmp(url, "/wrongrange") == 0)
    return blob(c, s, 206, 0, 999, UINT64_MAX, "\"v1\"");
  if (strcmp(url, "/slow") == 0)
    return slow(c, s);
  return text(c, 404, "unknown script\n");
}

script_server *ss_start(void) {
  script_server *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  pthread_mutex_init(&s->lock, NULL);
  atomic_init(&s->closing, 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  s->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_AUTO,
      0, NULL, NULL, handle, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_END);
  const union MHD_DaemonInfo *info =
      s->daemon ? MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT)
                : NULL;
  s->port = info ? info->port : 0;
  if (s->port == 0) {
    ss_stop(s);
    return NULL;
  }
  return s;
}

void ss_stop(script_server *s) {
  if (s == NULL)
    return;
  atomic_store(&s->closing, 1);
  if (s->daemon)
    MHD_stop_daemon(s->daemon);
  pthread_mutex_destroy(&s->lock);
  free(s);
}

uint16_t ss_port(const script_server *s) {
  return s->port;
}

size_t ss_requests(script_server *s, ss_request *log, size_t cap) {
  pthread_mutex_lock(&s->lock);
  size_t n = s->nlog;
  for (size_t i = 0; log != NULL && i < n && i < cap; i++)
    log[i] = s->log[i];
  pthread_mutex_unlock(&s->lock);
  return n;
}
