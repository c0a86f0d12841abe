/* upload_impl.h - inside the S3 uploader (upload*.c, pulse_upload.h): the
 * handle, and S3 requests run with libcurl (signed by its SigV4, retried,
 * several at once). */
#ifndef PULSE_UPLOAD_IMPL_H
#define PULSE_UPLOAD_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "bytebuf_impl.h"
#include "pulse_upload.h"

struct pulse_upload {
  pulse_upload_opts opts; /* strings point at the copies below */
  char *bucket, *prefix;  /* prefix: "" or "a/b/" (ends with '/') */
  char *endpoint;         /* without a trailing '/' */
  char *region, *access_key, *secret_key, *session_token, *cacert;
  char sigv4[160];  /* "aws:amz:<region>:s3" */
  char userpwd[512];
  pulse_upload_figures fig; /* of the call running */
  /* Stale multipart uploads (upload_stale.c): looked for by the first
   * call and by the call after a failed one; aborted so far. */
  int stale_due;
  uint64_t stale_aborted;
  /* The prefix's head as the writer check saw it, for the head's
   * conditional write: its ETag, or absent (upload.c). */
  char head_etag[256];
  int head_absent;
  /* The requests' multi handle (a CURLM), kept between calls so that its
   * connections are used again: a poll of the bucket or a step's small
   * file then costs one round trip, not a TCP and TLS handshake too. Made
   * by the first request in this process (multi_pid): a child of fork
   * makes its own, and leaves the parent's connections alone. */
  void *multi;
  long multi_pid;
};

/** Lists the incomplete multipart uploads under the prefix and aborts each
 * (they are left by an upload killed mid-part: this handle has none
 * running between calls, and a store has one writer). A service that does
 * not implement the listing (501, 405) is logged and skipped.
 * @return PULSE_OK; PULSE_ERR_IO (a request that failed after its retries);
 * PULSE_ERR_NOMEM. */
pulse_status upload_abort_stale(pulse_upload *up);

/* One S3 request. The body is memory (body, body_len) or a file's range
 * (fd >= 0: body_len bytes from offset); payload_sha256 is its SHA-256 in
 * hex ("" : computed here from memory, or from the file). */
typedef struct {
  const char *method; /* "GET", "HEAD", "PUT", "POST", "DELETE" */
  char key[1200];     /* object key, or "" for the bucket */
  char query[8192];   /* canonical: sorted, encoded ("uploads=", ...) */
  const uint8_t *body;
  uint64_t body_len;
  int fd;
  uint64_t offset;
  char payload_sha256[65];
  const char *cache_control; /* NULL: none */
  const char *content_type;  /* NULL: none */
  /* A conditional write (S3's If-Match / If-None-Match on PutObject): the
   * ETag the object must still have, or "*" for an object that must not
   * exist; NULL: none. */
  const char *if_match, *if_none_match;
  /* A GET whose 2xx body is streamed here instead of into reply (an object
   * never held in memory): restart is called before each try (a retry
   * starts the body over), sink with each piece; a non-zero return from
   * either stops the request for good (no retry). NULL: into reply. */
  int (*sink_restart)(void *ctx);
  int (*sink)(void *ctx, const void *data, size_t n);
  void *sink_ctx;
  int sink_refused; /* the sink stopped the request */
  /* ---- answer */
  long status;
  pulse_bytebuf reply; /* the body of the answer */
  char etag[256];      /* ETag header, as sent */
  uint64_t length;     /* Content-Length of a HEAD */
  char error[256];     /* libcurl's error */
  unsigned tries;
} upload_req;

/** Prepares a request (body and answer empty, fd -1). */
void upload_req_init(upload_req *r, const char *method);

/** Frees an answer's body. */
void upload_req_release(upload_req *r);

/** Runs n requests, up to opts.parallel at once, each retried (network
 * errors, 5xx, 429, with backoff) up to opts.retries times. Every answer's
 * status is in its request. @return PULSE_OK when each got an answer
 * (whatever its status), PULSE_ERR_IO for one that never did (detail:
 * method, key, cause), PULSE_ERR_NOMEM. */
pulse_status upload_run(pulse_upload *up, upload_req **reqs, size_t n);

/** pulse_fail(PULSE_ERR_IO) naming the request, its status and the
 * store's <Code>/<Message>; returns PULSE_ERR_IO. */
pulse_status upload_req_fail(const upload_req *r, const char *what);

/* ---- requests that several calls run the same way (upload_key.c); the
 * caller releases r after each. */

/** Runs r alone; an answer other than 2xx is upload_req_fail(r, what).
 * @return PULSE_OK; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status upload_run_checked(pulse_upload *up, upload_req *r,
                                const char *what);

/** As upload_run_checked, for a request on one object (GET, HEAD): a 404
 * is PULSE_ERR_NOT_FOUND ("upload: s3://<bucket>/<key>: no such object"). */
pulse_status upload_run_object(pulse_upload *up, upload_req *r,
                               const char *what);

/** Prepares and runs r as one page of ListObjectsV2 of the keys under
 * prefix (a whole key prefix, the handle's included), checked as
 * upload_run_checked. token: in, the page's continuation token ("" for
 * the first); out, the next page's where *more is set (the answer says it
 * is truncated and names one), token_cap bytes at most. */
pulse_status upload_list_page(pulse_upload *up, const char *prefix, char *token,
                              size_t token_cap, upload_req *r, const char *what,
                              int *more);

/* ---- multipart uploads (upload_parts.c), shared by put_multipart and the
 * part API of pulse_upload.h. key: the whole object key (prefix included);
 * id: the UploadId as the service gave it (encoded here). */

/** CreateMultipartUpload of key (Cache-Control immutable, octet-stream):
 * its UploadId in id. @return PULSE_OK; PULSE_ERR_IO; PULSE_ERR_CORRUPT
 * (no UploadId in the answer, or one over cap); PULSE_ERR_NOMEM. */
pulse_status upload_mp_create(pulse_upload *up, const char *key, char *id,
                              size_t cap);

/** Prepares r as UploadPart `number` of upload id (the body is the
 * caller's to set). */
void upload_mp_part_req(upload_req *r, const char *key, const char *id,
                        uint32_t number);

/** CompleteMultipartUpload with parts 1..n of the ETags given (as the
 * service sent them); an error inside a 200 answer is a failure too.
 * @return PULSE_OK; PULSE_ERR_ARG (an ETag that is not plain text);
 * PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status upload_mp_complete(pulse_upload *up, const char *key,
                                const char *id, const char *const *etags,
                                size_t n);

/** AbortMultipartUpload. @return PULSE_OK; PULSE_ERR_NOT_FOUND (the
 * service knows no such upload: completed, aborted, or never begun);
 * PULSE_ERR_IO. */
pulse_status upload_mp_abort(pulse_upload *up, const char *key, const char *id);

/** The key of rel under the prefix, after checking rel: a relative path
 * of the store (printable, no spaces, no leading '/', no ".."); `what`
 * names the call in the error. @return PULSE_OK; PULSE_ERR_ARG. */
pulse_status upload_key_for(const pulse_upload *up, const char *rel,
                            const char *what, char key[1200]);

/** S3 URI encoding (RFC 3986 unreserved kept; '/' kept when keep_slash). */
void upload_uri_encode(const char *s, int keep_slash, char *out, size_t cap);

/** The text of the first <tag>...</tag> in xml at or after *from (the
 * position after it goes back in *from), entities decoded, into out.
 * @return 1 when found and it fits, else 0. */
int upload_xml_tag(const char *xml, size_t len, size_t *from, const char *tag,
                   char *out, size_t cap);

#endif /* PULSE_UPLOAD_IMPL_H */
