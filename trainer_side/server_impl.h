/* server_impl.h - private to the store's HTTP server: its state, a
 * long-poll's, and the pieces shared by server*.c. The server is a route
 * table and hooks on the serving layer (http_serve_impl.h), which alone
 * includes microhttpd.h. */
#ifndef PULSE_SERVER_IMPL_H
#define PULSE_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "http_serve_impl.h"
#include "pulse_server.h"
#include "pulse_store.h"

/* ---------------------------------------------------------------- metrics */

/* The store server's own figures; the per-route request counters,
 * bytes and latencies are the serving layer's (http_serve_impl.h). */
typedef struct {
  pulse_serve_histogram wakeup; /* head learned -> long-poll resumed */
  pulse_serve_histogram
      commit; /* commit_seconds given to pulse_server_notify */
  atomic_ullong head_reloads, head_errors;
  atomic_ullong catchup_builds, catchup_build_us, catchup_cache_hits;
} srv_metrics;

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

typedef struct srv_waiter srv_waiter;

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
  pulse_serve *http;
  srv_metrics metrics;

  pthread_mutex_t lock; /* head, head_id, waiters, stopping */
  srv_head *head;       /* NULL while the store has no head */
  dev_t head_dev;
  ino_t head_ino;
  struct timespec head_mtime;
  off_t head_size;
  double head_learned; /* when the current head was loaded */
  srv_waiter *waiters; /* doubly linked */
  size_t nwaiters;
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

/* A long-poll waiting for a head above `after`: on the server's list from
 * its suspension until it is woken (or its connection dies). */
struct srv_waiter {
  pulse_server *srv;
  pulse_serve_request *rq;
  uint64_t after;
  double deadline;
  int woken; /* taken off the list and resumed */
  srv_waiter *prev, *next;
};

/* server_http.c: the route table. */
extern const pulse_serve_route srv_routes[];
extern const size_t srv_route_count;
extern const char *const srv_labels[];
extern const size_t srv_label_count;

/* server_poll.c */
srv_head *srv_head_get(pulse_server *srv); /* a reference, or NULL */
void srv_reload(pulse_server *srv, int force);
int srv_head_request(void *srv, pulse_serve_request *rq, const char *path);
pulse_status srv_watcher_start(pulse_server *srv);
void srv_watcher_stop(pulse_server *srv);
void srv_wake_all(void *srv);

/* server_catchup.c */
int srv_catchup_request(pulse_server *srv, pulse_serve_request *rq,
                        uint64_t from);
void srv_catchup_clean(pulse_server *srv);
void srv_catchup_free(pulse_server *srv);

/* server_metrics.c: the serving layer's hooks. */
void srv_metrics_text(void *srv, pulse_bytebuf *text);
void srv_healthz(void *srv, char *body, size_t cap);

#endif /* PULSE_SERVER_IMPL_H */
