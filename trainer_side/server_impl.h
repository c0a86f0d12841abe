/* server_impl.h - private to the HTTP server: its state, one request's
 * context, and the pieces shared by server*.c. The only files that include
 * microhttpd.h are the server's. */
#ifndef PULSE_SERVER_IMPL_H
#define PULSE_SERVER_IMPL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "pulse_server.h"
#include "pulse_store.h"

/* ---------------------------------------------------------------- metrics */

typedef enum {
  SRV_ROUTE_HEAD = 0,
  SRV_ROUTE_POLL,
  SRV_ROUTE_OBJECT,
  SRV_ROUTE_CATCHUP,
  SRV_ROUTE_METRICS,
  SRV_ROUTE_HEALTHZ,
  SRV_ROUTE_OTHER, /* refused or unknown */
  SRV_ROUTES
} srv_route;

#define SRV_CODES 10   /* 200 206 304 400 404 405 416 500 503 other */
#define SRV_BUCKETS 17 /* latency buckets, +Inf included */

typedef struct {
  atomic_ullong count, sum_us; /* sum in microseconds */
  atomic_ullong bucket[SRV_BUCKETS];
} srv_histogram;

typedef struct {
  atomic_ullong requests[SRV_ROUTES][SRV_CODES];
  atomic_ullong bytes[SRV_ROUTES];
  srv_histogram duration[SRV_ROUTES];
  srv_histogram wakeup; /* head learned -> long-poll resumed */
  srv_histogram commit; /* commit_seconds given to pulse_server_notify */
  atomic_ullong head_reloads, head_errors;
  atomic_ullong catchup_builds, catchup_build_us, catchup_cache_hits;
} srv_metrics;

void srv_histogram_add(srv_histogram *h, double seconds);
void srv_metrics_count(srv_metrics *m, srv_route route, unsigned status,
                       uint64_t bytes, double seconds);

/* ------------------------------------------------------------------- head */

/* One head as the server sees it, shared by reference. */
typedef struct {
  atomic_int refs;
  pulse_store_head *head; /* parsed; never NULL */
  uint64_t step;
  char etag[67]; /* "\"<sha256 of the bytes>\"" */
} srv_head;

void srv_head_release(srv_head *h);

/* ----------------------------------------------------------------- server */

typedef struct srv_request srv_request;

/* A catch-up patch ready to serve. */
typedef struct {
  uint64_t from, to;
  uint8_t sha256[32];
  uint64_t size;
  int memfd; /* >= 0 when held in memory only (read-only store) */
} srv_catchup;

#define SRV_CATCHUP_MEMORY 4

struct pulse_server {
  pulse_server_opts opts;
  char *dir;
  int objects_fd; /* the objects/ folder, for openat */
  struct MHD_Daemon *daemon;
  uint16_t port;
  srv_metrics metrics;

  pthread_mutex_t lock; /* head, head_id, waiters, stopping */
  srv_head *head;       /* NULL while the store has no head */
  dev_t head_dev;
  ino_t head_ino;
  struct timespec head_mtime;
  off_t head_size;
  double head_learned;  /* when the current head was loaded */
  srv_request *waiters; /* doubly linked */
  size_t nwaiters;
  size_t resumed; /* woken long-polls not yet completed */
  int stopping;
  pthread_mutex_t reload_lock; /* one reload at a time */

  pthread_t watcher;
  int watcher_started;
  int wake_fd;    /* eventfd: wakes the watcher */
  int inotify_fd; /* -1 without inotify */

  pthread_mutex_t catchup_lock; /* one build at a time, and the cache */
  srv_catchup catchups[SRV_CATCHUP_MEMORY];
  size_t ncatchups;
  uint64_t catchup_clean_step; /* the head step the cache was cleaned for */
};

/* One request, from the URI callback to the completion callback. */
struct srv_request {
  pulse_server *srv;
  double start;
  srv_route route;
  unsigned status;
  uint64_t body_bytes;
  int bad_raw_uri;  /* the undecoded URI holds an encoded NUL */
  int head_method;  /* HEAD: no body is sent */
  int headers_seen; /* the access handler ran once */
  /* long-poll */
  int waiting; /* suspended, in the waiters list */
  int woken;
  uint64_t after;
  double deadline;
  struct MHD_Connection *conn;
  srv_request *prev, *next;
};

double srv_now(void);

/* server_http.c */
enum MHD_Result srv_access(void *cls, struct MHD_Connection *conn,
                           const char *url, const char *method,
                           const char *version, const char *upload_data,
                           size_t *upload_data_size, void **con_cls);
void *srv_uri_log(void *cls, const char *uri, struct MHD_Connection *conn);
void srv_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                   enum MHD_RequestTerminationCode toe);
enum MHD_Result srv_queue(srv_request *rq, struct MHD_Connection *conn,
                          unsigned status, struct MHD_Response *resp,
                          uint64_t body_bytes);
enum MHD_Result srv_error(srv_request *rq, struct MHD_Connection *conn,
                          unsigned status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;
/* Serves an open file (takes fd): conditional requests, Range, zero-copy. */
enum MHD_Result srv_serve_fd(srv_request *rq, struct MHD_Connection *conn,
                             int fd, uint64_t size, const char *etag,
                             int immutable, const char *const *extra_headers);

/* server_poll.c */
srv_head *srv_head_get(pulse_server *srv); /* a reference, or NULL */
void srv_reload(pulse_server *srv, int force);
enum MHD_Result srv_head_request(srv_request *rq, struct MHD_Connection *conn);
pulse_status srv_watcher_start(pulse_server *srv);
void srv_watcher_stop(pulse_server *srv);
void srv_wake_all(pulse_server *srv);

/* server_catchup.c */
enum MHD_Result srv_catchup_request(srv_request *rq,
                                    struct MHD_Connection *conn, uint64_t from);
void srv_catchup_clean(pulse_server *srv);
void srv_catchup_free(pulse_server *srv);

/* server_metrics.c */
pulse_status srv_metrics_text(pulse_server *srv, pulse_buffer *out);

#endif /* PULSE_SERVER_IMPL_H */
