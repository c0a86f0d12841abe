/* upload_fetch.c - the other direction: the objects a store folder's head
 * names that only the bucket holds, fetched into the folder (pulse_upload.h,
 * pulse_upload_fetch_missing). Each is streamed into a temporary file,
 * hashed on the way, and renamed into objects/ only when its bytes are its
 * name and its size the head's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "pulse_file.h"
#include "pulse_sha256.h"
#include "pulse_store.h"
#include "status_impl.h"
#include "store_impl.h"
#include "upload_impl.h"

/* One object on its way into the store: the sink of its GET. */
typedef struct {
  const char *dest; /* store_dir/objects/<sha>.<ext> */
  const char *url;  /* s3://bucket/key, for messages */
  uint64_t want;    /* the head's size */
  uint64_t got;
  pulse_atomic_file *file;
  pulse_sha256_state sha;
  pulse_status st; /* why the sink stopped the request, with why */
  char why[768];
} incoming;

/* Before each try: a new temporary file and hash (a retry starts over). */
static int incoming_restart(void *ctx) {
  incoming *in = ctx;
  pulse_atomic_file_abort(in->file);
  in->file = NULL;
  in->got = 0;
  pulse_sha256_begin(&in->sha);
  in->st = pulse_atomic_file_create(in->dest, &in->file);
  if (in->st != PULSE_OK)
    snprintf(in->why, sizeof in->why, "%s", pulse_error_detail());
  return in->st != PULSE_OK;
}

static int incoming_write(void *ctx, const void *data, size_t n) {
  incoming *in = ctx;
  if (n > in->want - in->got) {
    in->st = PULSE_ERR_CORRUPT;
    snprintf(in->why, sizeof in->why,
             "upload: %s has more bytes than the head's %" PRIu64
             "; not fetched",
             in->url, in->want);
    return 1;
  }
  in->st = pulse_atomic_file_write(in->file, data, n);
  if (in->st == PULSE_OK)
    in->st = pulse_sha256_add(&in->sha, data, n);
  if (in->st != PULSE_OK) {
    snprintf(in->why, sizeof in->why, "%s", pulse_error_detail());
    return 1;
  }
  in->got += n;
  return 0;
}

/* GETs object o into store_dir (dest its path there). */
static pulse_status fetch_one(pulse_upload *up, const pulse_store_object *o,
                              const char *dest) {
  incoming in;
  memset(&in, 0, sizeof in);
  in.dest = dest;
  in.want = o->size;
  upload_req r;
  upload_req_init(&r, "GET");
  snprintf(r.key, sizeof r.key, "%s%s", up->prefix, o->path);
  char url[1400];
  snprintf(url, sizeof url, "s3://%s/%s", up->bucket, r.key);
  in.url = url;
  r.sink_restart = incoming_restart;
  r.sink = incoming_write;
  r.sink_ctx = &in;
  upload_req *one = &r;
  pulse_status st = upload_run(up, &one, 1);
  uint8_t sha[32];
  if (in.st != PULSE_OK) /* the sink's own reason comes first */
    st = pulse_fail(in.st, "%s", in.why);
  else if (st == PULSE_OK && r.status == 404)
    st = pulse_fail(PULSE_ERR_NOT_FOUND,
                    "upload: %s is missing from the store and s3://%s/%s "
                    "has no such object either",
                    dest, up->bucket, r.key);
  else if (st == PULSE_OK && (r.status < 200 || r.status >= 300))
    st = upload_req_fail(&r, "fetching an object");
  else if (st == PULSE_OK && in.got != in.want)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "upload: s3://%s/%s has %" PRIu64 " bytes, the head "
                    "names it with %" PRIu64 "; not fetched",
                    up->bucket, r.key, in.got, in.want);
  else if (st == PULSE_OK &&
           ((st = pulse_sha256_end(&in.sha, sha)) == PULSE_OK) &&
           memcmp(sha, o->sha256, 32) != 0)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "upload: s3://%s/%s: its bytes do not hash to its name "
                    "(SHA-256 mismatch); not fetched",
                    up->bucket, r.key);
  upload_req_release(&r);
  if (st != PULSE_OK) {
    pulse_atomic_file_abort(in.file);
    return st;
  }
  return pulse_atomic_file_commit(in.file);
}

pulse_status pulse_upload_fetch_missing(pulse_upload *up, const char *store_dir,
                                        size_t *fetched) {
  if (up == NULL || store_dir == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: fetch: NULL argument");
  if (fetched != NULL)
    *fetched = 0;
  pulse_store_head *h = NULL;
  PULSE_TRY(pulse_store_head_load(store_dir, &h));
  char objects[4096];
  pulse_status st = PULSE_OK;
  if (store_join(objects, sizeof objects, store_dir, PULSE_STORE_OBJECTS_DIR))
    st = pulse_fail(PULSE_ERR_ARG, "upload: fetch: %s: path too long",
                    store_dir);
  size_t np = pulse_store_head_patch_count(h);
  size_t n = np + pulse_store_head_anchor_count(h);
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    const pulse_store_object *o = i < np ? pulse_store_head_patch(h, i)
                                         : pulse_store_head_anchor(h, i - np);
    char path[4096];
    struct stat sb;
    if (store_join(path, sizeof path, store_dir, o->path) != 0) {
      st = pulse_fail(PULSE_ERR_ARG, "upload: fetch: %s: path too long",
                      store_dir);
      break;
    }
    if (stat(path, &sb) == 0)
      continue; /* there: the store's own checks judge it */
    if (errno != ENOENT) {
      st = pulse_fail(PULSE_ERR_IO, "upload: fetch: %s: %s", path,
                      strerror(errno));
      break;
    }
    if (mkdir(objects, 0777) != 0 && errno != EEXIST) {
      st = pulse_fail(PULSE_ERR_IO, "upload: fetch: %s: %s", objects,
                      strerror(errno));
      break;
    }
    st = fetch_one(up, o, path);
    if (st == PULSE_OK && fetched != NULL)
      (*fetched)++;
  }
  pulse_store_head_free(h);
  return st;
}
