/* pulse_upload.h - publishing a store to an S3-compatible object store
 * (AWS S3, R2, GCS's XML API, MinIO, ...), so that workers pull it from the
 * bucket or a CDN in front of it (docs/protocols/sync.md, "Store layout":
 * a bucket holds <prefix>/head.json and <prefix>/objects/...).
 *
 *   pulse_upload_opts o; pulse_upload_opts_init(&o);
 *   o.target = "s3://bucket/runs/7";          // credentials from the env
 *   pulse_upload *up;
 *   pulse_upload_create(&o, &up);
 *   ... pulse_pub_commit(pub, ...);           // after each commit:
 *   pulse_upload_store(up, store_dir, &fig);  // objects, then the head
 *   pulse_upload_free(up);
 *
 * Order: every object the local head names that the bucket does not hold
 * with its size goes up first (Cache-Control: public, max-age=31536000,
 * immutable), then the signed head (Cache-Control: no-cache), so a reader
 * never sees a head whose objects are missing; an upload interrupted at any
 * point (kill -9 included) leaves the previous head and its objects, and the
 * next call uploads what is missing (objects are named by their content, so
 * one that is there with its size is done). Objects of at least
 * multipart_bytes go up as multipart uploads, parts in parallel, each
 * retried. Retention, after the head: the objects under <prefix>/objects/
 * that the head does not name are deleted, except the keep_anchors newest
 * anchors and objects younger than grace_seconds (by the bucket's
 * LastModified), so a worker that planned from an older head finishes.
 *
 * Configuration follows the AWS CLI: AWS_ENDPOINT_URL (then
 * AWS_ENDPOINT_URL_S3; default https://s3.<region>.amazonaws.com),
 * AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION
 * (then AWS_DEFAULT_REGION; default us-east-1); options given here win.
 * Addressing is path-style (<endpoint>/<bucket>/<key>). Requests are signed
 * with libcurl's SigV4 (CURLOPT_AWS_SIGV4), each carrying the SHA-256 of its
 * payload in x-amz-content-sha256; without credentials they go unsigned
 * (a public-write bucket). HTTPS verifies certificates (cacert for a private
 * CA).
 *
 * Thread-safety: one thread at a time per handle. Nothing here prints. */
#ifndef PULSE_UPLOAD_H
#define PULSE_UPLOAD_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Upload options; start from pulse_upload_opts_init. Strings are copied. */
typedef struct {
  uint32_t struct_version; /* PULSE_UPLOAD_OPTS_VERSION */
  const char *target;      /* "s3://BUCKET" or "s3://BUCKET/PREFIX" */
  /* NULL: from the environment (see above) */
  const char *endpoint, *region, *access_key, *secret_key, *session_token;
  const char *cacert;       /* PEM file of the CAs to trust; NULL: system's */
  uint64_t multipart_bytes; /* objects this large go multipart; default 64 MiB */
  uint64_t part_bytes;      /* part size (>= 5 MiB); default 16 MiB */
  unsigned parallel;        /* parts (and objects) at once; default 4 */
  unsigned retries;         /* per request, after the first try; default 5 */
  unsigned keep_anchors;    /* retention: newest anchors kept; default 2 */
  uint32_t grace_seconds;   /* retention: younger objects kept; default 600 */
  int no_retention;         /* 1: never delete */
} pulse_upload_opts;

#define PULSE_UPLOAD_OPTS_VERSION 1u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_upload_opts_init(pulse_upload_opts *opts);

typedef struct pulse_upload pulse_upload;

/* What one pulse_upload_store did. */
typedef struct {
  uint64_t objects_uploaded; /* objects put (single or multipart) */
  uint64_t objects_present;  /* named by the head and already in the bucket */
  uint64_t bytes_uploaded;   /* object and head bytes sent, retries included */
  uint64_t parts;            /* multipart parts put */
  uint64_t retries;          /* requests tried again */
  uint64_t deleted;          /* objects removed by retention */
  uint64_t head_step;        /* the step of the head uploaded */
  double seconds;            /* wall time of the call */
} pulse_upload_figures;

/** Checks the options and the environment. Nothing is sent yet.
 * @return PULSE_OK and *out (pulse_upload_free); PULSE_ERR_ARG (no or bad
 * target, a part size under 5 MiB or parts over 10,000 for an object,
 * a region or key that is not plain text); PULSE_ERR_NOMEM. */
pulse_status pulse_upload_create(const pulse_upload_opts *opts,
                                 pulse_upload **out);

/** Frees (NULL is fine). */
void pulse_upload_free(pulse_upload *up);

/** Uploads the store folder `store_dir` (its head.json and the objects it
 * names; see above), then applies retention. The first call of a handle,
 * and the call after one that failed, first lists the incomplete multipart
 * uploads under the prefix (ListMultipartUploads) and aborts them
 * (AbortMultipartUpload): an upload killed mid-part leaves one, whose parts
 * the service keeps (and bills) until it is aborted; a service that does
 * not list them (HTTP 501 or 405) is logged and skipped. One writer per
 * bucket prefix: before anything is put, the bucket's head.json (when
 * there is one) must be a head of this store's run at or below its step;
 * a prefix holding another run's head (another store, as on another host)
 * or a head ahead of this store is refused with PULSE_ERR_IO saying so
 * (check then write: two new runs that start at the same moment on an
 * empty prefix are not told apart). figures may be NULL.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no head, or an object the head
 * names is missing locally); PULSE_ERR_IO (a request that failed after its
 * retries, with the method, key, status and the store's error message in
 * the detail: pulse_error_detail()); PULSE_ERR_CORRUPT (an answer that
 * does not parse); PULSE_ERR_NOMEM. The bucket then holds the previous
 * head with everything it names. */
pulse_status pulse_upload_store(pulse_upload *up, const char *store_dir,
                                pulse_upload_figures *figures);

/** Incomplete multipart uploads this handle found under its prefix and
 * aborted, over all its calls (see pulse_upload_store). 0 for NULL. */
uint64_t pulse_upload_stale_aborted(const pulse_upload *up);

/* ---- One object, its parts put by several handles.
 *
 * A sharded trainer's ranks (on hosts without a shared filesystem) upload
 * the parts of one object, an anchor, as ONE S3 multipart upload: one rank
 * begins it and sends the upload id to the others, each puts its parts
 * (any handle with the same target may put parts of an upload begun by
 * another, in another process), one completes it with every part's ETag.
 * The object appears whole at completion or not at all. rel is a path of
 * the store ("objects/<sha256>.safetensors"), under the target's prefix.
 * Requests are signed and retried as pulse_upload_store's. S3 refuses, at
 * completion, parts other than the last under 5 MiB (some services do
 * not): sizes are the caller's choice, not checked here. An upload left
 * incomplete is aborted by the next pulse_upload_store of a handle that
 * looks for stale uploads (see there): begin, put and finish after that
 * call, not around it. Errors name the method, key, HTTP status and the
 * service's message (pulse_error_detail()). */

/** Begins a multipart upload of rel (CreateMultipartUpload; Cache-Control
 * and content type as pulse_upload_store's objects): its id, NUL-ended, in
 * upload_id (cap bytes; 1024 hold any).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, a rel that is not a relative
 * path, an id over cap); PULSE_ERR_IO (a request that failed after its
 * retries); PULSE_ERR_CORRUPT (no UploadId in the answer);
 * PULSE_ERR_NOMEM. */
pulse_status pulse_upload_part_begin(pulse_upload *up, const char *rel,
                                     char *upload_id, size_t cap);

/** Puts part `number` (1..10000) of upload_id, len bytes of data (borrowed
 * for the call), retried; its ETag, as the service sent it, NUL-ended, in
 * etag (cap bytes; 256 hold any). Putting a number again replaces it.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO (an unknown upload id
 * included: HTTP 404 NoSuchUpload); PULSE_ERR_NOMEM. */
pulse_status pulse_upload_part_put(pulse_upload *up, const char *rel,
                                   const char *upload_id, uint32_t number,
                                   const void *data, size_t len, char *etag,
                                   size_t cap);

/** Completes upload_id with parts 1..n, part k+1's ETag in etags[k]
 * (CompleteMultipartUpload): rel then holds the parts' bytes in order. An
 * error the service gives inside a 200 answer is a failure too.
 * @return PULSE_OK; PULSE_ERR_ARG (n of 0 or over 10,000, an ETag that is
 * not printable text); PULSE_ERR_IO (a wrong or missing part: HTTP 400
 * InvalidPart, ...); PULSE_ERR_NOMEM. After a failure the upload is still
 * open: complete it again or abort it. */
pulse_status pulse_upload_part_finish(pulse_upload *up, const char *rel,
                                      const char *upload_id,
                                      const char *const *etags, size_t n);

/** Aborts upload_id (AbortMultipartUpload): its parts are dropped, rel is
 * not written. @return PULSE_OK; PULSE_ERR_NOT_FOUND (no such upload:
 * completed, aborted, or never begun); PULSE_ERR_ARG; PULSE_ERR_IO. */
pulse_status pulse_upload_part_abort(pulse_upload *up, const char *rel,
                                     const char *upload_id);

/** The size of the bucket's object rel (HEAD) in *size.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no such object); PULSE_ERR_ARG;
 * PULSE_ERR_IO. */
pulse_status pulse_upload_object_size(pulse_upload *up, const char *rel,
                                      uint64_t *size);

/** Fetches into the store folder store_dir the objects its head.json names
 * that are missing from it (a staging store whose head names anchors only
 * the bucket holds; run before the store is opened, as its recovery refuses
 * a head naming a missing object). Each is streamed from the bucket into a
 * temporary file in objects/ (never held in memory), fsynced and renamed
 * only when its bytes hash to its name (SHA-256) and number the head's
 * size. Objects present are not checked here. fetched (may be NULL): how
 * many were fetched.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no head, or an object neither the
 * store nor the bucket holds); PULSE_ERR_CORRUPT (the bucket's bytes are
 * not the object's: refused, nothing left in the store; or a head that
 * does not parse); PULSE_ERR_IO; PULSE_ERR_NOMEM. The objects fetched
 * before a failure stay (each whole and checked). */
pulse_status pulse_upload_fetch_missing(pulse_upload *up, const char *store_dir,
                                        size_t *fetched);

/* ---- Small objects by key.
 *
 * What the ranks of a sharded trainer without a shared filesystem exchange
 * during a step (pulse_pub_shard_step with a bucket: its files under
 * <prefix>/shard/), and a store folder taken from the bucket's head. rel is
 * a relative path under the target's prefix, checked as for the part API.
 * Requests are signed and retried as pulse_upload_store's; errors name the
 * method, key, HTTP status and the service's message. */

/** Puts len bytes of data (borrowed for the call) at rel, replacing what
 * is there (Cache-Control: no-cache).
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_key_put(pulse_upload *up, const char *rel,
                                  const void *data, size_t len);

/** Gets the object rel whole into out (free with pulse_buffer_free; meant
 * for small objects: the answer is held in memory).
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no such object, out empty);
 * PULSE_ERR_ARG; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_key_get(pulse_upload *up, const char *rel,
                                  pulse_buffer *out);

/** Gets the n objects rels[0..n-1] (a step's small files) into outs[i],
 * up to opts.parallel requests at once, each retried as
 * pulse_upload_store's; outs[i].data is NULL where there is no such object
 * (free each with pulse_buffer_free). On an error every out is empty.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_key_get_many(pulse_upload *up,
                                       const char *const *rels, size_t n,
                                       pulse_buffer *outs);

/** Deletes the object rel; one that is not there is no error.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO. */
pulse_status pulse_upload_key_delete(pulse_upload *up, const char *rel);

/** Deletes the n objects rels[0..n-1] (a step's files), up to
 * opts.parallel requests at once, each retried as pulse_upload_store's;
 * one that is not there is no error. Every one is tried; the first
 * failure is returned (its detail names it).
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_key_delete_many(pulse_upload *up,
                                          const char *const *rels, size_t n);

/** The objects whose rel starts with rel_prefix (ListObjectsV2, every
 * page): *count names in `names` (free with pulse_buffer_free), each a rel
 * (the target's prefix taken off) ended by a NUL, one after the other.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_key_list(pulse_upload *up, const char *rel_prefix,
                                   pulse_buffer *names, size_t *count);

/** Makes the folder store_dir a copy of the bucket's store: its head.json
 * (parsed before it is written, atomically; one that does not parse is
 * read again for about a second, in case it was caught mid-write) and,
 * through
 * pulse_upload_fetch_missing, every object it names that the folder lacks.
 * For a rank of a sharded trainer that has no store folder and resumes
 * from the bucket (pulse_pub_shard_resume on the copy; remove it after).
 * fetched (may be NULL): the objects fetched.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (the bucket has no head, or an
 * object it names); PULSE_ERR_CORRUPT (a head that does not parse, an
 * object that is not its name's); PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status pulse_upload_fetch_store(pulse_upload *up, const char *store_dir,
                                      size_t *fetched);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_UPLOAD_H */
