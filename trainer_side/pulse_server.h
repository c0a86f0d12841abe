/* pulse_server.h - the HTTP server of a pulse store (libmicrohttpd, a pool
 * of epoll threads). It serves any store folder (pulse_store.h), with or
 * without a publisher in the same process, read-only but for its catch-up
 * cache. The protocol is in docs/protocols/sync.md:
 *
 *   GET /v1/head                       the head (JSON), ETag, no-cache
 *   GET /v1/head?after=S&timeout_ms=T  long-poll: answers as soon as the
 *                                      head's step is above S (or at T)
 *   GET /v1/objects/<sha256>.pulse     patches  } immutable, strong ETag,
 *   GET /v1/objects/<sha256>.safetensors anchors} Range, zero-copy
 *   GET /v1/catchup/<step>             one squashed patch from a retained
 *                                      step (or one earlier heads' objects
 *                                      still reach) to the head, built (off
 *                                      the HTTP threads, bounded) and cached
 *   GET /v1/catchup/<step>?to=<s>      the same, pinned to end at step s
 *                                      (the head or an earlier head it
 *                                      remembers): immutable
 *   GET /metrics                       Prometheus text
 *   GET /healthz                       liveness
 *
 * Every request is untrusted: only the routes above map to files, any path
 * with "..", a backslash, an encoded NUL or other oddities is refused (400),
 * and errors come back as JSON {"error": "..."}.
 *
 * Long-polls suspend their connection (MHD_suspend_connection) and are
 * resumed by whoever learns of a new head first: pulse_server_notify (an
 * in-process publisher, on its committing thread: no delay at all), or the
 * server's watcher thread, which follows head.json with inotify and a cheap
 * stat every 250 ms (a publisher in another process).
 *
 * Thread-safety: every function may be called from any thread; free must
 * not race with the others. MHD's threads ignore SIGPIPE by themselves. */
#ifndef PULSE_SERVER_H
#define PULSE_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_publisher.h"
#include "pulse_sign.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Server options; start from pulse_server_opts_init. */
typedef struct {
  uint32_t struct_version;  /* PULSE_SERVER_OPTS_VERSION */
  const char *store_dir;    /* required; must exist (it may have no head yet) */
  const char *host;         /* address or name to listen on; NULL: 127.0.0.1;
                               "": every address */
  uint16_t port;            /* 0: any free port (see pulse_server_port) */
  int threads; /* HTTP worker threads; 0 = one per core (never fewer than 2:
                  a slow client must not hold the only one) */
  unsigned max_connections; /* at once, long-polls included; past it a new
                               connection evicts the one that has waited
                               longest with no request running (headers
                               still coming, or idle), or is closed when
                               every other one runs a request. Lowered
                               (logged) when RLIMIT_NOFILE allows fewer
                               than about twice as many descriptors */
  unsigned max_per_ip;      /* connections from one address; 0: no limit */
  unsigned idle_timeout_s;  /* closes idle connections */
  unsigned max_waiters;     /* long-polls at once; more get 503 */
  uint32_t max_poll_ms;     /* cap on a long-poll's timeout_ms */
  int watch;                /* follow head.json written by another process */
  /* Signs catch-up patches (docs/protocols/sync.md) when not NULL; borrowed, must
   * outlive the server. A server serving a signed head builds catch-ups
   * only with the head's own key (nobody could verify others: a relay
   * without the key answers 404 and clients fetch the signed patches); for
   * an unsigned head a catch-up is trusted through its digests only, as its
   * response headers say. */
  const pulse_sign_key *key;
  int catchup_threads; /* threads for rebuilding and squashing; 0 = one per
                          core */
  /* Catch-ups are built on threads of their own, never on the HTTP ones:
   * at most catchup_builds at once (0: 1), catchup_queue more waiting (0:
   * 16; beyond, 503 + Retry-After). A request waits (suspended, no thread
   * held) for the build it needs up to catchup_wait_ms, then gets 503 +
   * Retry-After while the build goes on (0: answer 503 at once). */
  unsigned catchup_builds;
  unsigned catchup_queue;
  uint32_t catchup_wait_ms;
  /* Version 2: a connection whose request headers take longer than this
   * (from its start, or from the request line on a kept-alive one) is
   * closed, however slowly it keeps sending; so is one whose POST body
   * then arrives slower than 16 KiB/s on average after this many seconds
   * of grace (pulse_http_body_timeouts_total); 0: neither deadline.
   * Options of version 1 get 10. */
  unsigned header_timeout_s;
} pulse_server_opts;

/* Version 2 added header_timeout_s (and max_per_ip defaults to 128 now, so
 * that one address cannot hold every connection). */
#define PULSE_SERVER_OPTS_VERSION 2u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_server_opts_init(pulse_server_opts *opts);

typedef struct pulse_server pulse_server;

/** Starts serving. The store folder must exist; without a head yet, /v1/head
 * answers 404 and long-polls wait for the first one.
 * @return PULSE_OK and *out (stop with pulse_server_free); PULSE_ERR_ARG (bad
 * options, a host that does not resolve); PULSE_ERR_NOT_FOUND (no such
 * folder); PULSE_ERR_IO (cannot listen, e.g. the port is taken);
 * PULSE_ERR_NOMEM. */
pulse_status pulse_server_create(const pulse_server_opts *opts,
                                 pulse_server **out);

/** Answers every waiting long-poll with the current head, stops accepting,
 * and frees the server. NULL is fine. */
void pulse_server_free(pulse_server *server);

/** The TCP port the server listens on (the chosen one when opts.port is 0). */
uint16_t pulse_server_port(const pulse_server *server);

/** Tells the server the head has moved: it re-reads head.json and wakes the
 * long-polls that wait for a step below it, on the calling thread.
 * `commit_seconds` (negative: none) feeds the commit latency metric. */
void pulse_server_notify(pulse_server *server, double commit_seconds);

/** A pulse_pub_head_fn that calls pulse_server_notify: set opts.on_head to
 * it and opts.on_head_ctx to the server to wire a publisher to a server. */
void pulse_server_on_head(void *server, const pulse_pub_figures *figures);

/** Splits "HOST:PORT" ("127.0.0.1:8080", "[::1]:0", ":8080" for every
 * address, "localhost:9000") into host (written to `host`, cap bytes, ""
 * for every address) and port (0..65535; 0 picks a free one).
 * @return PULSE_OK or PULSE_ERR_ARG. */
pulse_status pulse_server_parse_listen(const char *spec, char *host, size_t cap,
                                       uint16_t *port);

/** Long-polls waiting now. */
size_t pulse_server_waiters(const pulse_server *server);

/** The /metrics text (Prometheus exposition format 0.0.4) into a new
 * buffer (pulse_buffer_free). @return PULSE_OK or PULSE_ERR_NOMEM. */
pulse_status pulse_server_metrics(pulse_server *server, pulse_buffer *out);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SERVER_H */
