/* http_serve_impl.h - the project's one HTTP serving layer (libmicrohttpd),
 * private to pulse_trainer and to the libraries above it (loco/). Both the
 * store server (server*.c, docs/protocols/sync.md) and PULSELoCo's blob server
 * (loco/transport/peer_server.c) are route tables on it.
 *
 * What it does, so that its users do not:
 *  - the daemon: listen address, a pool of epoll threads, connection,
 *    per-address and idle limits, 64 KiB of request headers, port 0, and a
 *    clean stop (suspended requests are resumed first; never
 *    MHD_quiesce_daemon, which races the epoll workers);
 *  - the request: MHD's two calls (an answer only once the request is
 *    read, so keep-alive holds), bodies ignored on GET/HEAD, refused on
 *    POST to a route that takes none (400) and kept in memory up to a
 *    route's max_body (413 beyond: at once when Content-Length says so,
 *    else once the rest was read and dropped), the methods each route
 *    allows (405 with Allow), paths that can never name anything (400:
 *    "..", "//", a backslash, "%" after decoding, control or non-ASCII
 *    bytes, "%00" in the raw path), then the route table (404);
 *  - answers: one error vocabulary (JSON {"error": "..."}, Allow on 405,
 *    Retry-After on 503), bodies from memory, shared immutable blobs and
 *    files (zero-copy), strong ETags, If-None-Match -> 304, Range and
 *    If-Range -> 206/416;
 *  - suspension of a request (long-polls) and its resumption;
 *  - Prometheus metrics per route label (requests by status, body bytes,
 *    latency histograms) at GET /metrics, with a hook for the user's own,
 *    and GET /healthz.
 *
 * No libmicrohttpd type appears here: users see handles and functions.
 * Thread-safety: handlers run on the daemon's threads, several at once;
 * every function here may be called from any thread, except that a
 * request's functions belong to the handler that holds it. */
#ifndef PULSE_HTTP_SERVE_IMPL_H
#define PULSE_HTTP_SERVE_IMPL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_codec.h"
#include "pulse_status.h"

typedef struct pulse_serve pulse_serve;
typedef struct pulse_serve_request pulse_serve_request;

/* What a handler (and every reply function) returns: PULSE_SERVE_OK when
 * the request was answered or suspended, PULSE_SERVE_CLOSE when nothing
 * could be queued (out of memory): the connection is closed. */
#define PULSE_SERVE_OK 1
#define PULSE_SERVE_CLOSE 0

/* Methods, as bits of a route's `methods`. */
#define PULSE_SERVE_GET 1u
#define PULSE_SERVE_HEAD 2u
#define PULSE_SERVE_POST 4u
#define PULSE_SERVE_READ (PULSE_SERVE_GET | PULSE_SERVE_HEAD)

/* Cache-Control values. */
#define PULSE_SERVE_IMMUTABLE "public, max-age=31536000, immutable"
#define PULSE_SERVE_NO_CACHE "no-cache" /* cacheable, revalidate (ETag) */
#define PULSE_SERVE_NO_STORE "no-store"

/* Handles one request of its route. `path` is the decoded path (checked,
 * never NULL); the route's prefix, if any, is still at its start. Must
 * answer (a pulse_serve_reply_* call) or suspend, and return what that
 * returned. */
typedef int (*pulse_serve_handler)(void *user, pulse_serve_request *rq,
                                   const char *path);

typedef struct {
  const char *path; /* an exact path, or a prefix when `prefix` is set */
  int prefix;
  unsigned methods;  /* PULSE_SERVE_* bits */
  const char *label; /* the metrics' route label; NULL: "other" */
  pulse_serve_handler handler;
  /* POST: the largest request body the route takes (the handler reads it
   * with pulse_serve_request_body); 0: none (a body is refused, 400). A
   * larger body is refused with 413 and never reaches the handler. */
  size_t max_body;
} pulse_serve_route;

/* Latency buckets (seconds) of every histogram, +Inf included. */
#define PULSE_SERVE_BUCKETS 17

typedef struct {
  /* sum in nanoseconds: a long-poll's wake-up takes well under a
   * microsecond, which a sum in microseconds rounded to 0 */
  atomic_ullong count, sum_ns;
  atomic_ullong bucket[PULSE_SERVE_BUCKETS];
} pulse_serve_histogram;

/** Counts one observation (negative and NaN count as 0). Lock-free. */
void pulse_serve_histogram_add(pulse_serve_histogram *h, double seconds);

/** Appends a histogram in the Prometheus text format: NAME_bucket{LABELS,
 * le=...}, NAME_sum, NAME_count (labels: "" or 'route="x"'). */
void pulse_serve_histogram_text(pulse_bytebuf *b, const char *name,
                                const char *labels,
                                const pulse_serve_histogram *h);

/* Server options; start from pulse_serve_opts_init. */
typedef struct {
  const char *name; /* prefix of log lines and error details ("server") */
  const char *host; /* NULL: 127.0.0.1; "": every address; "[::1]" too */
  uint16_t port;    /* 0: a free one (pulse_serve_port) */
  unsigned threads; /* 0: one per CPU, at least 2 */
  /* At once, suspended ones included (> 0); past it a new connection
   * evicts the one that has waited longest with no request running, or is
   * closed when every other one runs a request (http_serve_deadline.c):
   * one still receiving a request's headers or body runs none yet. */
  unsigned max_connections;
  unsigned max_per_ip;             /* 0: no limit */
  unsigned idle_timeout_s;         /* 0: none */
  const pulse_serve_route *routes; /* borrowed: must outlive the server */
  size_t route_count;
  /* Metric route labels, in the order /metrics lists them (borrowed).
   * Labels a route names that are missing here are added after them, and
   * so are "metrics", "healthz" and "other" (refused and unknown paths). */
  const char *const *labels;
  size_t label_count;
  void *user; /* given to every callback */
  /* Writes the /healthz JSON body (at most cap - 1 bytes, NUL included);
   * NULL: {"status":"ok"}. */
  void (*healthz)(void *user, char *body, size_t cap);
  /* Appends the user's metrics after the layer's own (NULL: none). */
  void (*metrics)(void *user, pulse_bytebuf *text);
  /* While the server stops, called (from the stopping thread, repeatedly
   * for up to a second) until no suspended request is left: must resume
   * them, so that they answer and complete. NULL when nothing suspends. */
  void (*wake_all)(void *user);
  /* A connection whose request headers are not complete this many seconds
   * after it opened (or after its request line, on a kept-alive
   * connection) is closed, however slowly it keeps sending (slowloris).
   * So is one whose request body, after this grace from the end of the
   * headers, averages under 16 KiB/s (a body dripped a byte at a time;
   * http_serve_deadline.c). 0: neither deadline (the idle timeout only). */
  unsigned header_timeout_s;
} pulse_serve_opts;

/* Sets every field of *opts to its default. */
void pulse_serve_opts_init(pulse_serve_opts *opts);

/** Starts listening and serving. The options (and the routes, labels and
 * user they point to) are borrowed and must outlive the server.
 * @return PULSE_OK and *out (pulse_serve_free); PULSE_ERR_ARG (bad options,
 * a host that does not resolve, too many labels); PULSE_ERR_IO (cannot
 * listen: the port is taken or not permitted); PULSE_ERR_NOMEM. */
pulse_status pulse_serve_create(const pulse_serve_opts *opts,
                                pulse_serve **out);

/** Stops: marks the server stopping (pulse_serve_stopping), has wake_all
 * resume the suspended requests and waits (up to a second) for them to
 * complete, then stops the daemon and frees. NULL is fine. Must not race
 * with other calls on the server. */
void pulse_serve_free(pulse_serve *s);

/** The TCP port (the one chosen when opts.port was 0). */
uint16_t pulse_serve_port(const pulse_serve *s);

/** 1 once pulse_serve_free has begun: handlers answer at once then. */
int pulse_serve_stopping(const pulse_serve *s);

/** Splits "HOST:PORT" ("127.0.0.1:8080", "[::1]:0", ":8080" for every
 * address) into host (cap bytes, "" for every address) and port.
 * @return PULSE_OK or PULSE_ERR_ARG. */
pulse_status pulse_serve_parse_listen(const char *spec, char *host, size_t cap,
                                      uint16_t *port);

/** The /metrics text: the layer's families, then opts.metrics's, into a new
 * buffer (pulse_buffer_free). @return PULSE_OK or PULSE_ERR_NOMEM. */
pulse_status pulse_serve_metrics_text(pulse_serve *s, pulse_buffer *out);

/** Body bytes of the responses completed so far, every route but /metrics
 * (pulse_http_response_bytes_total summed, route "metrics" left out): what
 * the server sent, a monitor's scrapes aside. Lock-free. */
uint64_t pulse_serve_response_bytes(const pulse_serve *s);

/** Monotonic seconds. */
double pulse_serve_now(void);

/* ----------------------------------------------------------- the request */

/** A query argument (decoded), or NULL. Valid during the request. */
const char *pulse_serve_query(pulse_serve_request *rq, const char *key);

/** A request header, or NULL. Valid during the request. */
const char *pulse_serve_header(pulse_serve_request *rq, const char *name);

/** The request's body (a POST to a route with max_body): *size bytes, all
 * of them (a body cut short never reaches the handler); NULL and 0 when
 * none came. Valid during the request. */
const uint8_t *pulse_serve_request_body(const pulse_serve_request *rq,
                                        size_t *size);

/** 1 for a HEAD request (the answer's body is not sent). */
int pulse_serve_is_head(const pulse_serve_request *rq);

/** Body bytes of the answer queued for the request (0 before one is, for
 * HEAD and for 304). */
uint64_t pulse_serve_body_bytes(const pulse_serve_request *rq);

/** The answer's status (0 before one is queued). */
unsigned pulse_serve_status(const pulse_serve_request *rq);

/** Counts the request under another route label (e.g. a long-poll under
 * "head_poll"); an unknown label counts as "other". */
void pulse_serve_relabel(pulse_serve_request *rq, const char *label);

/** Attaches the handler's own state to the request; `done` (may be NULL)
 * is called with it once the request completes (or is dropped), on a
 * daemon thread. One attachment per request. */
void pulse_serve_attach(pulse_serve_request *rq, void *data,
                        void (*done)(void *data));

/** What pulse_serve_attach attached, or NULL. */
void *pulse_serve_attached(const pulse_serve_request *rq);

/** Suspends the request after its handler returns (no thread waits); the
 * handler then returns PULSE_SERVE_OK without answering. Resumed by
 * pulse_serve_resume, the route's handler is called again with
 * pulse_serve_resumed true and must answer. */
void pulse_serve_suspend(pulse_serve_request *rq);

/** Resumes a suspended request, from any thread. The caller must make sure
 * the request is suspended (it has not completed): in practice, suspend and
 * resume under the same lock, and take the request off the list that lock
 * guards before resuming it. */
void pulse_serve_resume(pulse_serve_request *rq);

/** 1 when the handler is called again after pulse_serve_resume. */
int pulse_serve_resumed(const pulse_serve_request *rq);

/* ------------------------------------------------------------ the answer */

/* What goes with a body. */
typedef struct {
  unsigned status;          /* 0: 200 */
  const char *type;         /* Content-Type; NULL: none */
  const char *cache;        /* Cache-Control; NULL: PULSE_SERVE_NO_STORE */
  const char *etag;         /* a strong ETag with its quotes, or NULL */
  const char *const *extra; /* more headers: name, value, ..., NULL */
} pulse_serve_meta;

/** An error: `{"error":"<message>"}` (JSON-escaped), no-store, Allow on 405
 * (the methods of the path's routes), Retry-After: 1 on 503. */
int pulse_serve_reply_error(pulse_serve_request *rq, unsigned status,
                            const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/** A body from memory (copied). With meta->etag, If-None-Match naming it
 * gives 304 with the same headers and no body. */
int pulse_serve_reply_bytes(pulse_serve_request *rq,
                            const pulse_serve_meta *meta, const void *data,
                            size_t size);

/** The same, taking a malloc'd body (freed by the layer, also on error). */
int pulse_serve_reply_take(pulse_serve_request *rq,
                           const pulse_serve_meta *meta, void *data,
                           size_t size);

/** A file's first `size` bytes, zero-copy (sendfile); takes fd (closed by
 * the layer, also on error). meta->etag is required: If-None-Match -> 304,
 * Range (one range) -> 206 or 416, If-Range with another tag -> the whole
 * body; Accept-Ranges: bytes. Type: application/octet-stream when NULL. */
int pulse_serve_reply_fd(pulse_serve_request *rq, const pulse_serve_meta *meta,
                         int fd, uint64_t size);

/* An immutable byte string shared between the responses sending it and
 * whoever published it (reference counted), with a strong ETag from its
 * SHA-256. */
typedef struct pulse_serve_blob pulse_serve_blob;

/** A blob holding a copy of data. @return PULSE_OK or PULSE_ERR_NOMEM. */
pulse_status pulse_serve_blob_create(const void *data, size_t size,
                                     pulse_serve_blob **out);
/** Another reference (returns b). */
pulse_serve_blob *pulse_serve_blob_ref(pulse_serve_blob *b);
/** Drops a reference; the last one frees. NULL is fine. */
void pulse_serve_blob_release(pulse_serve_blob *b);
size_t pulse_serve_blob_size(const pulse_serve_blob *b);
/** Its bytes (pulse_serve_blob_size of them), fixed for its life. */
const uint8_t *pulse_serve_blob_data(const pulse_serve_blob *b);
/** "\"<sha256 hex>\"" */
const char *pulse_serve_blob_etag(const pulse_serve_blob *b);

/** A blob, as pulse_serve_reply_fd serves a file (the ETag is the blob's
 * when meta->etag is NULL); takes one reference to b (released by the
 * layer once sent, also on error). */
int pulse_serve_reply_blob(pulse_serve_request *rq,
                           const pulse_serve_meta *meta, pulse_serve_blob *b);

#endif /* PULSE_HTTP_SERVE_IMPL_H */
