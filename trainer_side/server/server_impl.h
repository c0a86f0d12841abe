/* server_impl.h - private to the store's HTTP server: its state, a
 * long-poll's, and the pieces shared by server*.c. The server is a route
 * table and hooks on the serving layer (http_serve_impl.h), which alone
 * includes microhttpd.h. */
#ifndef PULSE_SERVER_IMPL_H
#define PULSE_SERVER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

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
  atomic_ullong catchup_refused;  /* 503: queue full, or waited too long */
  atomic_ullong catchup_corrupt;  /* cached files that failed their hash */
  atomic_ullong catchup_history;  /* from steps only the history reaches */
  atomic_ullong catchup_pinned;   /* ?to= requests answered with one */
  atomic_ullong objects_rehashed; /* object files hashed again (changed) */
  atomic_ullong objects_corrupt;  /* of them, no longer their name's bytes */
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
typedef struct srv_object_seen srv_object_seen; /* server_objects.c */

/* A catch-up patch ready to serve: in memory (memfd), or a file of
 * catchup/ whose bytes were checked against its name (sha256) while it had
 * this identity; a file whose identity changed since (rewritten, replaced)
 * is checked again before it is served (finding 7 of issue 20). */
typedef struct {
  uint64_t from, to;
  uint8_t target[32]; /* the state digest at `to` it was built for */
  uint8_t sha256[32];
  uint64_t size;
  int memfd; /* >= 0 when held in memory only (read-only store) */
  dev_t dev; /* the file's identity when it was checked */
  ino_t ino;
  struct timespec ctime;
} srv_catchup;

#define SRV_CATCHUP_MEMORY 16

/* Objects of earlier heads kept for catch-ups (server_history.c). */
#define SRV_HISTORY_MAX 1024
/* Earlier heads remembered, so that a catch-up can be pinned to their
 * step (GET /v1/catchup/<from>?to=<step>). */
#define SRV_HISTORY_HEADS 256

/* Pinned catch-ups (from, to) asked for lately: their cached files outlive
 * the head's moves for SRV_PIN_KEEP_S after the last request, so that a
 * worker's resumed ranges find them (server_catchup.c). */
#define SRV_PINS_MAX 64
#define SRV_PIN_KEEP_S 600.0
typedef struct {
  uint64_t from, to;
  double asked; /* pulse_serve_now() of the last request */
} srv_pin;

/* The objects a catch-up from `from` is built of: an anchor, the patches
 * from it to `from` (patches[0..first)) and on to the head. */
typedef struct {
  pulse_store_object anchor;
  pulse_store_object *patches;
  size_t npatches, first;
} srv_chain;

/* One catch-up being built (or checked, when another process or an earlier
 * run cached it) on a builder thread, and the requests waiting for it. */
typedef struct srv_build srv_build;
typedef struct srv_build_waiter srv_build_waiter;

struct srv_build {
  uint64_t from;
  srv_head *head; /* the head it ends at (a reference) */
  int running, done;
  pulse_status status; /* once done */
  char detail[256];
  srv_catchup result; /* once done and PULSE_OK */
  int fd;             /* of the result, for the waiters to dup; or -1 */
  srv_build_waiter *waiters;
  unsigned refs; /* the queue's (until done) and one per waiter */
  srv_build *next;
};

/* Why a waiting catch-up request was resumed. */
enum { SRV_WAIT_DONE = 1, SRV_WAIT_TIMEOUT, SRV_WAIT_STOPPING };

struct srv_build_waiter {
  pulse_server *srv;
  pulse_serve_request *rq;
  srv_build *build; /* a reference */
  int pinned;       /* asked with ?to= (answered immutable) */
  double deadline;
  int woken; /* SRV_WAIT_*: taken off the build's list and resumed */
  srv_build_waiter *prev, *next;
};

struct pulse_server {
  pulse_server_opts opts;
  char *dir;
  int objects_fd; /* the objects/ folder, for openat */
  pulse_serve *http;
  srv_metrics metrics;

  /* The identity of each object file when first seen or last checked
   * (server_objects.c): an open-addressing table, under objects_lock. */
  pthread_mutex_t objects_lock;
  srv_object_seen *objects;
  size_t objects_cap, nobjects;

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

  /* Catch-ups: the cache, the builds and their waiters, under
   * catchup_lock, which is never held while building or hashing (it may be
   * taken before `lock`, never while holding it). */
  pthread_mutex_t catchup_lock;
  pthread_cond_t build_cv; /* a build queued, or the builders stop */
  /* A builder writing a catch-up's files (object, then ref) holds it; the
   * cleaning, which removes objects no ref names, skips a round then. */
  pthread_mutex_t catchup_files_lock;
  srv_catchup catchups[SRV_CATCHUP_MEMORY];
  size_t ncatchups;
  uint64_t catchup_clean_step; /* the head step the cache was cleaned for */
  srv_pin pins[SRV_PINS_MAX];  /* under catchup_lock */
  size_t npins;
  srv_build *builds;           /* queued and running, oldest first */
  /* The objects of earlier heads of this run (server_history.c), under
   * history_lock (never held with another lock). */
  pthread_mutex_t history_lock;
  pulse_store_object *history; /* oldest first */
  size_t nhistory;
  uint8_t history_run[PULSE_STORE_RUN_BYTES];
  int history_has_run;
  uint64_t history_step;
  srv_head *history_heads[SRV_HISTORY_HEADS]; /* references, oldest first */
  size_t nhistory_heads;
  size_t builds_queued;
  int builders_stop;
  pthread_t *builders;
  unsigned nbuilders;
};

/* A long-poll waiting for a head above `after`: on the server's list from
 * its suspension until it is woken (or its connection dies). */
struct srv_waiter {
  pulse_server *srv;
  pulse_serve_request *rq;
  uint64_t after;
  double deadline;
  int woken; /* taken off the list and resumed */
  double learned; /* woken by a new head: when the server learned it */
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

/* server_catchup.c: the route and the cache. pinned: the request named
 * its target step `to` (?to=); else the catch-up ends at the head. */
int srv_catchup_request(pulse_server *srv, pulse_serve_request *rq,
                        uint64_t from, int pinned, uint64_t to);
void srv_catchup_clean(pulse_server *srv);
void srv_catchup_free(pulse_server *srv);
/* An fd of a remembered catch-up (caller closes), or -1 when its file is
 * gone or is no longer the one that was checked. catchup_lock held. */
int srv_catchup_open(pulse_server *srv, const srv_catchup *c);
/* Adds a checked catch-up to the in-memory list. catchup_lock held. */
void srv_catchup_remember(pulse_server *srv, const srv_catchup *c);

/* server_catchup_build.c: building, keeping and checking one catch-up, on a
 * builder thread (no lock held). On PULSE_OK *c is filled and *fd (>= 0)
 * reads it. */
pulse_status srv_catchup_produce(pulse_server *srv, const srv_head *h,
                                 uint64_t from, srv_catchup *c, int *fd);
/* "DIR/catchup/NAME" into buf. @return 0, or -1 when it does not fit. */
int srv_catchup_path(char *buf, size_t cap, const char *dir, const char *name);
/* Reads catchup/<from>-<to>.ref (what it names is not checked here).
 * @return 1 and *c, or 0. */
int srv_catchup_find_ref(pulse_server *srv, uint64_t from, uint64_t to,
                         srv_catchup *c);

/* server_history.c: the objects of earlier heads, for catch-ups from steps
 * the head no longer retains. */
void srv_history_note(pulse_server *srv, const pulse_store_head *head);
void srv_history_free(pulse_server *srv);
/* A reference to the remembered head of `step` (release it), or NULL;
 * *oldest: the oldest step remembered (UINT64_MAX when none). */
srv_head *srv_history_head(pulse_server *srv, uint64_t step, uint64_t *oldest);
/* The chain from the newest usable anchor through `from` to head's step,
 * from head's objects and the history, every file present.
 * @return PULSE_OK and *out (free with srv_chain_free); PULSE_ERR_NOT_FOUND
 * (with the reason) when no whole chain is left; PULSE_ERR_NOMEM. */
pulse_status srv_chain_find(pulse_server *srv, const pulse_store_head *head,
                            uint64_t from, srv_chain *out);
void srv_chain_free(srv_chain *c);

/* server_catchup_queue.c: the builder threads, the bounded queue and the
 * requests waiting on it. */
pulse_status srv_builders_start(pulse_server *srv);
void srv_builders_stop(pulse_server *srv);
/* Queues (or joins) the build of the catch-up from `from` to h's step and
 * suspends rq until it is done or rq's wait is over; answers 503 when the
 * queue is full. catchup_lock held; it is released on return. */
int srv_build_wait(pulse_server *srv, pulse_serve_request *rq, srv_head *h,
                   uint64_t from, int pinned);
/* Resumes the waiters whose wait is over (all of them with `all`); returns
 * the earliest deadline of those left (INFINITY when none). */
double srv_build_expire(pulse_server *srv, double now, int all);
/* Builds queued and running now. */
size_t srv_build_count(pulse_server *srv);

/* server_objects.c: checking the object files served. */
/* Opens srv->objects_fd once objects/ exists (it stays -1 until then). */
void srv_objects_dir(pulse_server *srv);
/* Takes the identity of every object h names that has none yet. */
void srv_objects_note_head(pulse_server *srv, const pulse_store_head *h);
/* Records sb as the identity of object sha256 unless it has one. */
void srv_objects_note(pulse_server *srv, const uint8_t sha256[32],
                      const struct stat *sb);
/* 1 when the object file behind fd (its fstat in sb) may be served: the
 * identity it had when first seen, or its bytes hash to sha256 again; 0
 * (logged once per identity) when they do not. */
int srv_object_check(pulse_server *srv, int fd, const uint8_t sha256[32],
                     const struct stat *sb);
void srv_objects_free(pulse_server *srv);

/* server_metrics.c: the serving layer's hooks. */
void srv_metrics_text(void *srv, pulse_bytebuf *text);
void srv_healthz(void *srv, char *body, size_t cap);

#endif /* PULSE_SERVER_IMPL_H */
