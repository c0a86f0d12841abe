/* http_serve_core_impl.h - inside the HTTP serving layer (http_serve*.c
 * only): the server's and a request's state. The only header of the
 * project that includes microhttpd.h. */
#ifndef PULSE_HTTP_SERVE_CORE_IMPL_H
#define PULSE_HTTP_SERVE_CORE_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "http_serve_impl.h"

#define SERVE_LABELS 24 /* route labels at most, "other" included */
#define SERVE_CODES 18  /* serve_code_index: 17 statuses and "other" */

typedef struct {
  atomic_ullong requests[SERVE_LABELS][SERVE_CODES];
  atomic_ullong bytes[SERVE_LABELS];
  pulse_serve_histogram duration[SERVE_LABELS];
  atomic_ullong header_timeouts; /* connections closed for slow headers */
  atomic_ullong body_timeouts;   /* and for a request body too slow */
  atomic_ullong evictions;       /* closed to make room (near the cap) */
  atomic_ullong refused;         /* closed at once: full of busy ones */
} serve_metrics;

/* A connection the deadlines watch (http_serve_deadline.c). */
typedef struct serve_conn serve_conn;

struct pulse_serve {
  pulse_serve_opts opts;
  struct MHD_Daemon *daemon;
  uint16_t port;
  const char *labels[SERVE_LABELS];
  unsigned nlabels;
  unsigned label_other, label_metrics, label_healthz;
  unsigned route_label[64]; /* label of opts.routes[i] */
  unsigned all_methods;     /* union of every route's methods */
  atomic_int stopping;
  atomic_size_t suspended; /* requests ever suspended, not yet completed */
  serve_metrics metrics;
  /* the header deadline (http_serve_deadline.c) */
  pthread_mutex_t conns_lock;
  pthread_cond_t watch_cv;
  serve_conn *conns; /* open connections, under conns_lock */
  size_t nlive;      /* of them, not shut down yet */
  unsigned cap;      /* connections at once (opts.max_connections, or fewer
                        when the descriptors allow fewer) */
  unsigned mhd_limit; /* what microhttpd may hold: cap and room to evict */
  pthread_t watcher;
  int watcher_running, watch_stop;
};

struct pulse_serve_request {
  pulse_serve *srv;
  struct MHD_Connection *conn;
  double start;
  unsigned label;   /* index into srv->labels */
  unsigned status;  /* 0 until an answer is queued */
  uint64_t body;    /* body bytes of the answer (0 for HEAD) */
  unsigned allow;   /* methods a 405 lists */
  int bad_raw_uri;  /* the undecoded URI holds an encoded NUL */
  int head_method;  /* HEAD: no body is sent */
  int headers_seen; /* the access handler ran once */
  int body_seen;    /* a body came with a method that takes none */
  size_t body_limit; /* POST to a route with max_body: that, else 0 */
  int body_too_large; /* more than body_limit came: dropped, 413 */
  pulse_bytebuf upload; /* the body kept (up to body_limit) */
  const pulse_serve_route *route;
  int suspended; /* suspended now, or resumed and not yet called again */
  int was_suspended;
  int resumed;
  void *data;
  void (*done)(void *data);
};

/* http_serve_request.c: MHD's callbacks. */
void *serve_uri_log(void *cls, const char *uri, struct MHD_Connection *conn);
enum MHD_Result serve_access(void *cls, struct MHD_Connection *conn,
                             const char *url, const char *method,
                             const char *version, const char *upload_data,
                             size_t *upload_data_size, void **con_cls);
void serve_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                     enum MHD_RequestTerminationCode toe);
/* "GET, HEAD, POST" for a set of method bits (a static string). */
const char *serve_allow_text(unsigned methods);

/* http_serve_deadline.c: the header and body deadlines and the connection
 * cap. start: 0, or -1 when the watcher cannot start; stop after the daemon
 * stopped. The others are called by the request's callbacks, in this
 * order: the request line, the headers in, body data (n bytes, any number
 * of times), the request read whole (it runs from then on), done. */
int serve_deadline_start(pulse_serve *s);
void serve_deadline_stop(pulse_serve *s);
void serve_conn_notify(void *cls, struct MHD_Connection *conn,
                       void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
void serve_conn_request_line(pulse_serve *s, struct MHD_Connection *conn);
void serve_conn_headers_done(pulse_serve *s, struct MHD_Connection *conn);
void serve_conn_body_data(pulse_serve *s, struct MHD_Connection *conn,
                          size_t n);
void serve_conn_request_read(pulse_serve *s, struct MHD_Connection *conn);
void serve_conn_request_done(pulse_serve *s, struct MHD_Connection *conn);

/* http_serve_reply.c: queues resp (takes it; NULL: out of memory). */
int serve_queue(pulse_serve_request *rq, unsigned status,
                struct MHD_Response *resp, uint64_t body);

/* http_serve_blob.c: the blob's bytes. */
const uint8_t *serve_blob_bytes(const pulse_serve_blob *b);

/* http_serve_metrics.c */
unsigned serve_label_index(const pulse_serve *s, const char *label);
void serve_metrics_count(pulse_serve *s, unsigned label, unsigned status,
                         uint64_t bytes, double seconds);

#endif /* PULSE_HTTP_SERVE_CORE_IMPL_H */
