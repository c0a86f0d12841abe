/* peer_http_impl.h - private to loco/: the small HTTP pieces of the trainer
 * exchange. A blob server (127.0.0.1 only) that serves byte strings by
 * path and hands POSTs to a callback, on trainer_side's HTTP serving
 * layer, and fetches (one URL, or many at once with a deadline) on
 * inference_side's fetching layer. */
#ifndef PULSE_LOCO_HTTP_IMPL_H
#define PULSE_LOCO_HTTP_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "http_fetch_impl.h"
#include "pulse_status.h"

/* A body's signature as it travels next to it (pulse_loco_auth.h):
 * X-Pulse-Loco-Round, X-Pulse-Loco-Key and X-Pulse-Loco-Signature. */
typedef struct {
  int present; /* all three headers there and well-formed */
  uint64_t round;
  uint8_t key[32];
  uint8_t sig[64];
  uint64_t seq; /* a signed POST's sequence number (0: none; auth_impl.h) */
} loco_sig;

/* Reads the three headers of a fetched answer (present 0 when any is
 * missing or malformed). */
void loco_sig_from_answer(const pulse_fetch_xfer *x, loco_sig *out);

/* ----------------------------------------------------------------- server */

/* Routes on the project's HTTP serving layer (trainer_side's
 * http_serve_impl.h): GET/HEAD of a published path (strong ETag from the
 * bytes' SHA-256, If-None-Match -> 304, Range -> 206/416), POST to the
 * callback, and the layer's refusals (400/405, JSON errors), /metrics
 * (routes "blob" and "post") and /healthz. */
typedef struct loco_server loco_server;

/* Called on the server thread for each POST (empty body) with its path and
 * its "id" and "url" query values (NULL when absent). Writes up to cap - 1
 * bytes of reply text; returns the HTTP status. */
typedef unsigned (*loco_post_fn)(void *user, const char *path, const char *id,
                                 const char *url, char *reply, size_t cap);

/* Called on the server thread for each POST with a body under
 * LOCO_HOSTED_PREFIX (a client-mode collaboration peer's upload, docs/formats/loco-payload.md
 * "Collaboration"): the path, its "id" query value (NULL when absent) and
 * the whole body (size bytes, at most the server's max_body; a body cut
 * short or too large never gets here). Reply and status as loco_post_fn. */
typedef unsigned (*loco_upload_fn)(void *user, const char *path,
                                   const char *id, const uint8_t *body,
                                   size_t size, char *reply, size_t cap);
#define LOCO_HOSTED_PREFIX "/v1/hosted/"

/* Starts a server on 127.0.0.1 with a kernel-chosen port. */
pulse_status loco_server_start(loco_post_fn on_post, void *user,
                               loco_server **out);
/* The same on another IPv4 address of this machine (an interface's, for
 * trainers on other hosts or network namespaces). */
pulse_status loco_server_start_on(const char *host, loco_post_fn on_post,
                                  void *user, loco_server **out);
/* loco_server_start_on that also takes uploads (on_upload, bodies of at
 * most max_bytes; a larger one is refused with 413); host NULL: a table
 * that does not listen (a client-mode peer's: puts are kept, nobody can
 * fetch them; port 0), on_post and on_upload unused. */
pulse_status loco_server_start_uploads(const char *host, loco_post_fn on_post,
                                       loco_upload_fn on_upload, void *user,
                                       size_t max_bytes, loco_server **out);
/* loco_server_start_uploads on a given TCP port (0: the kernel picks);
 * PULSE_ERR_IO when it cannot listen there (the port is taken). */
pulse_status loco_server_start_port(const char *host, uint16_t port,
                                    loco_post_fn on_post,
                                    loco_upload_fn on_upload, void *user,
                                    size_t max_bytes, loco_server **out);
void loco_server_stop(loco_server *s); /* NULL is fine */
uint16_t loco_server_port(const loco_server *s);

/* Publishes (a copy of) bytes under path, replacing what was there. */
pulse_status loco_server_put(loco_server *s, const char *path, const void *data,
                             size_t size);

/* loco_server_put with the body's signature headers (sig NULL or not
 * present: none); a relay passes on the original signer's. */
pulse_status loco_server_put_signed(loco_server *s, const char *path,
                                    const void *data, size_t size,
                                    const loco_sig *sig);

/* A check of POSTs before the callback (the node's authentication): gets
 * the path, and a way to read the request's query values; returns 0 to let
 * the POST through, else the HTTP status to refuse it with (the reply text
 * written as for loco_post_fn). Called on the server thread. */
typedef unsigned (*loco_post_gate_fn)(void *user, const char *path,
                                      const char *(*query)(void *rq,
                                                           const char *key),
                                      void *rq, char *reply, size_t cap);
void loco_server_set_gate(loco_server *s, loco_post_gate_fn gate, void *user);

/* Signs the answer to a POST (the node's authentication): called on the
 * server thread after the callback with the path, the "id" query value
 * (followed by "&seq=N" when the request carries a number: a signed
 * POST's, auth_impl.h) and the answer's status; fills *sig (left not present: the answer goes
 * unsigned), sent as the answer's X-Pulse-Loco-* headers. */
typedef void (*loco_reply_sign_fn)(void *user, const char *path,
                                   const char *id, unsigned status,
                                   loco_sig *sig);
void loco_server_set_reply_signer(loco_server *s, loco_reply_sign_fn fn,
                                  void *user);

/* More Prometheus text after the server's own at /metrics (the node's
 * authentication counters); called on a server thread. */
void loco_server_set_metrics(loco_server *s,
                             void (*fn)(void *user, pulse_bytebuf *text),
                             void *user);

/* Removes every blob whose path starts with prefix and whose number right
 * after the prefix is below `below` ("/v1/loco/round/" and 7 drops rounds
 * 0..6), and the exact path when below is 0. */
void loco_server_drop(loco_server *s, const char *prefix, uint64_t below);

/* loco_server_drop, keeping the paths that end with keep_suffix (round
 * manifests outlive their payloads). */
void loco_server_drop_except(loco_server *s, const char *prefix, uint64_t below,
                             const char *keep_suffix);

/* A copy of what path holds into *out (replacing its bytes): 1, or 0 when
 * nothing is there (out untouched) or the copy's memory is missing. */
int loco_server_copy(loco_server *s, const char *path, pulse_bytebuf *out);

/* Body bytes of the blobs answered so far (200 and 206; not HEAD or 304). */
uint64_t loco_server_bytes_served(const loco_server *s);

/* Body bytes of every answer completed so far, whatever its route and
 * status (blobs, POST answers, the 404s of polls, uploads' answers), but
 * /metrics: what this server put on the wire (0 for a table that does not
 * listen). */
uint64_t loco_server_bytes_sent(const loco_server *s);

/* ---------------------------------------------------------------- fetches */
/* On the project's fetching layer (inference_side/fetch/http_fetch_impl.h): one
 * engine per calling thread, connections kept; waits and gathers retry
 * with a short backoff until their deadline and resume cut bodies. */

/* Monotonic milliseconds. */
uint64_t loco_now_ms(void);
void loco_sleep_ms(unsigned ms);

/* One GET (or POST with an empty body) of at most max_bytes; *status gets
 * the HTTP status (0 when no response came). Fails only for local errors
 * (NOMEM); transport errors give status 0. */
pulse_status loco_http_get(const char *url, unsigned timeout_ms,
                           size_t max_bytes, pulse_bytebuf *body, long *status);
pulse_status loco_http_post(const char *url, unsigned timeout_ms, long *status);
/* loco_http_post keeping the answer's signature headers in *sig. */
pulse_status loco_http_post_signed(const char *url, unsigned timeout_ms,
                                   long *status, loco_sig *sig);
/* loco_http_get keeping the answer's signature headers in *sig. */
pulse_status loco_http_get_signed(const char *url, unsigned timeout_ms,
                                  size_t max_bytes, pulse_bytebuf *body,
                                  long *status, loco_sig *sig);
/* One POST of size bytes of body (data, the caller's); the answer's body
 * (at most 4 KiB) into *reply when reply is not NULL. *status as above. */
pulse_status loco_http_post_body(const char *url, unsigned timeout_ms,
                                 const void *data, size_t size,
                                 pulse_bytebuf *reply, long *status);

/* GETs url until it answers 200 or timeout_ms passes (retrying 404s,
 * transport errors, 5xx, 408 and 429 after a short backoff, resuming a cut
 * body). @return PULSE_OK; PULSE_ERR_IO on timeout or an answer that is no
 * use (its cause in the detail); PULSE_ERR_NOMEM. */
pulse_status loco_http_wait(const char *url, unsigned timeout_ms,
                            size_t max_bytes, pulse_bytebuf *body);

/* loco_http_wait keeping the answer's signature headers in *sig. */
pulse_status loco_http_wait_signed(const char *url, unsigned timeout_ms,
                                   size_t max_bytes, pulse_bytebuf *body,
                                   loco_sig *sig);

/* loco_http_wait for bytes [from, from + len) of url (a 206 of exactly
 * len bytes; retried as loco_http_wait retries). */
pulse_status loco_http_get_range(const char *url, uint64_t from, uint64_t len,
                                 unsigned timeout_ms, pulse_bytebuf *body);

/* Many GETs at once (one multi handle): each target is retried as
 * loco_http_wait retries until it answers 200, its answer is no use (a
 * body over max_bytes, a 4xx other than 404/410), or the deadline
 * (loco_now_ms() value) passes. On return done says which arrived; body
 * holds them. */
typedef struct {
  const char *url;
  size_t max_bytes;
  pulse_bytebuf body;
  int done;
  loco_sig sig; /* the answer's signature headers */
  /* A head fetch: only the first `head` bytes (a Range request; done means
   * a 206 of exactly them); 0: the whole body. Its answer also gives the
   * whole body's size (Content-Range) and, when the server sent a strong
   * ETag of 64 hex digits (a loco server's: the SHA-256 of the bytes), that
   * digest: what a writer lists for a payload it did not download. */
  size_t head;
  uint64_t total;
  int has_sha256;
  uint8_t sha256[32];
} loco_fetch;

pulse_status loco_http_gather(loco_fetch *targets, size_t count,
                              uint64_t deadline_ms);

/* The calling thread's download rate, measured per transfer (docs/formats/loco-payload.md
 * "Collaboration", bandwidth): the transfers that brought at least
 * LOCO_RATE_MIN_BYTES of body (smaller ones are latency-bound), over
 * their body time (first answer byte to end, no waiting for a blob to
 * appear), overlapping ones counted once (a gather's bodies share the
 * link). Since the last call: *bytes of body in *us microseconds during
 * which at least one such body was arriving; both then start over. */
#define LOCO_RATE_MIN_BYTES 16384u
void loco_http_rate_take(uint64_t *bytes, uint64_t *us);

/* What every fetch of this process's exchange did so far (requests, bytes,
 * retries, failed tries), all threads together. */
void loco_http_metrics(pulse_fetch_metrics *out);

#endif
