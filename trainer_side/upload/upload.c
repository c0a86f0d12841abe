/* upload.c - publishing a store folder to an S3-compatible bucket
 * (pulse_upload.h): the objects its head names that the bucket lacks (one
 * PUT each, or a multipart upload in parallel parts), then the head, then
 * retention. */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pulse_log.h"
#include "pulse_store.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"
#include "upload_impl.h"

#define IMMUTABLE "public, max-age=31536000, immutable"
#define MAX_PARTS 10000u

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void key_of(const pulse_upload *up, const char *rel, char *out,
                   size_t cap) {
  snprintf(out, cap, "%s%s", up->prefix, rel);
}

static int ok_status(long s) {
  return s >= 200 && s < 300;
}

/* ------------------------------------------------------------ multipart */

/* Uploads one large object as a multipart upload: create, the parts in
 * parallel (each retried), complete; aborted when a part fails for good. */
static pulse_status put_multipart(pulse_upload *up, const pulse_store_object *o,
                                  int fd, const char *key) {
  uint64_t part = up->opts.part_bytes;
  if ((o->size + part - 1) / part > MAX_PARTS) { /* S3 allows 10,000 parts */
    part = (o->size + MAX_PARTS - 1) / MAX_PARTS;
    part = (part + ((uint64_t)1 << 20) - 1) & ~(((uint64_t)1 << 20) - 1);
  }
  size_t nparts = (size_t)((o->size + part - 1) / part);
  char id[1024];
  PULSE_TRY(upload_mp_create(up, key, id, sizeof id));
  upload_req *parts = calloc(nparts, sizeof *parts);
  upload_req **ptrs = calloc(nparts, sizeof *ptrs);
  const char **etags = calloc(nparts, sizeof *etags);
  pulse_status st = PULSE_OK;
  if (parts == NULL || ptrs == NULL || etags == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "upload: %s", key);
  for (size_t i = 0; st == PULSE_OK && i < nparts; i++) {
    upload_req *r = &parts[i];
    upload_mp_part_req(r, key, id, (uint32_t)(i + 1));
    r->fd = fd;
    r->offset = (uint64_t)i * part;
    r->body_len = o->size - r->offset < part ? o->size - r->offset : part;
    ptrs[i] = r;
  }
  if (st == PULSE_OK)
    st = upload_run(up, ptrs, nparts);
  for (size_t i = 0; st == PULSE_OK && i < nparts; i++) {
    if (!ok_status(parts[i].status) || parts[i].etag[0] == '\0')
      st = upload_req_fail(&parts[i], "a part");
    etags[i] = parts[i].etag;
  }
  if (parts != NULL)
    up->fig.parts += nparts;
  if (st == PULSE_OK)
    st = upload_mp_complete(up, key, id, etags, nparts);
  else { /* what the service keeps of the parts is billed until aborted */
    char why[1024];
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    if (upload_mp_abort(up, key, id) != PULSE_OK)
      pulse_fail(st, "%s", why); /* the part's failure is the one to say */
  }
  for (size_t i = 0; parts != NULL && i < nparts; i++)
    upload_req_release(&parts[i]);
  free(parts), free(ptrs), free((void *)etags);
  return st;
}

/* -------------------------------------------------------------- objects */

/* Uploads what the bucket lacks of the head's objects. */
static pulse_status put_objects(pulse_upload *up, const char *dir,
                                const pulse_store_head *h) {
  size_t np = pulse_store_head_patch_count(h);
  size_t n = np + pulse_store_head_anchor_count(h);
  upload_req *reqs = calloc(n + 1, sizeof *reqs);
  upload_req **ptrs = calloc(n + 1, sizeof *ptrs);
  int *fds = calloc(n + 1, sizeof *fds);
  if (reqs == NULL || ptrs == NULL || fds == NULL) {
    free(reqs), free(ptrs), free(fds);
    return pulse_fail(PULSE_ERR_NOMEM, "upload");
  }
  const pulse_store_object **objs = calloc(n + 1, sizeof *objs);
  for (size_t i = 0; objs != NULL && i < n; i++) {
    objs[i] = i < np ? pulse_store_head_patch(h, i)
                     : pulse_store_head_anchor(h, i - np);
    fds[i] = -1;
  }
  /* Which are there already (content-addressed: with their size, done)? */
  pulse_status st = objs ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "upload");
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    upload_req_init(&reqs[i], "HEAD");
    key_of(up, objs[i]->path, reqs[i].key, sizeof reqs[i].key);
    ptrs[i] = &reqs[i];
  }
  if (st == PULSE_OK)
    st = upload_run(up, ptrs, n);
  size_t nput = 0;
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    upload_req *r = &reqs[i];
    if (r->status == 200 && r->length == objs[i]->size) {
      up->fig.objects_present++;
      continue;
    }
    if (r->status != 404 && r->status != 200)
      st = upload_req_fail(r, "checking an object");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, objs[i]->path);
    fds[i] = open(path, O_RDONLY | O_CLOEXEC);
    if (st == PULSE_OK && fds[i] < 0)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "upload: %s: missing from the store",
                      path);
    if (st != PULSE_OK || objs[i]->size >= up->opts.multipart_bytes)
      continue;
    upload_req_release(r);
    upload_req_init(r, "PUT");
    key_of(up, objs[i]->path, r->key, sizeof r->key);
    r->fd = fds[i];
    r->body_len = objs[i]->size;
    store_hex(objs[i]->sha256, 32, r->payload_sha256); /* its name */
    r->cache_control = IMMUTABLE;
    r->content_type = "application/octet-stream";
    ptrs[nput++] = r;
  }
  if (st == PULSE_OK)
    st = upload_run(up, ptrs, nput);
  for (size_t i = 0; st == PULSE_OK && i < nput; i++)
    if (!ok_status(ptrs[i]->status))
      st = upload_req_fail(ptrs[i], "putting an object");
  up->fig.objects_uploaded += st == PULSE_OK ? nput : 0;
  /* Large objects, one at a time, each in parallel parts. */
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    if (fds[i] < 0 || objs[i]->size < up->opts.multipart_bytes)
      continue;
    char key[1200];
    key_of(up, objs[i]->path, key, sizeof key);
    st = put_multipart(up, objs[i], fds[i], key);
    up->fig.objects_uploaded += st == PULSE_OK;
  }
  for (size_t i = 0; i < n; i++) {
    upload_req_release(&reqs[i]);
    if (fds[i] >= 0)
      close(fds[i]);
  }
  free(reqs), free(ptrs), free(fds), free(objs);
  return st;
}

/* Uploads the section indexes of the head's patches (sections/<sha256>,
 * store_sections_impl.h) that the store has and the bucket lacks, after
 * the patches and before the head. A store without them uploads none:
 * workers then fetch patches whole. */
static pulse_status put_sections(pulse_upload *up, const char *dir,
                                 const pulse_store_head *h) {
  size_t np = pulse_store_head_patch_count(h);
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < np && st == PULSE_OK; i++) {
    char rel[PULSE_STORE_PATH_MAX + 16], path[4096];
    store_sections_path(pulse_store_head_patch(h, i)->sha256, rel, sizeof rel);
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    size_t n = 0;
    uint8_t *bytes = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
      continue;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && sb.st_size > 0 &&
        (bytes = malloc((size_t)sb.st_size)) != NULL)
      n = fread(bytes, 1, (size_t)sb.st_size, f);
    fclose(f);
    if (bytes == NULL || n != (size_t)sb.st_size) {
      free(bytes);
      continue; /* optional: a worker falls back */
    }
    upload_req r;
    upload_req *one = &r;
    upload_req_init(&r, "HEAD");
    key_of(up, rel, r.key, sizeof r.key);
    st = upload_run(up, &one, 1);
    int present = st == PULSE_OK && r.status == 200 && r.length == n;
    if (st == PULSE_OK && r.status != 404 && r.status != 200)
      st = upload_req_fail(&r, "checking a section index");
    upload_req_release(&r);
    if (st == PULSE_OK && !present) {
      upload_req_init(&r, "PUT");
      key_of(up, rel, r.key, sizeof r.key);
      r.body = bytes;
      r.body_len = n;
      r.cache_control = IMMUTABLE;
      r.content_type = "application/octet-stream";
      st = upload_run(up, &one, 1);
      if (st == PULSE_OK && !ok_status(r.status))
        st = upload_req_fail(&r, "putting a section index");
      upload_req_release(&r);
    }
    free(bytes);
  }
  return st;
}

/* ------------------------------------------------------------ retention */

typedef struct {
  char key[1100];
  char modified[40]; /* ISO 8601, sorts as text */
  int anchor;
  int keep;
} listed;

static int newer_first(const void *a, const void *b) {
  return strcmp(((const listed *)b)->modified, ((const listed *)a)->modified);
}

/* Seconds since an ISO 8601 UTC time ("2026-12-02T03:04:05.000Z"); a time
 * that does not parse counts as new (kept). */
static double age_of(const char *iso) {
  struct tm tm;
  memset(&tm, 0, sizeof tm);
  if (sscanf(iso, "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return difftime(time(NULL), timegm(&tm));
}

static int named_by(const pulse_upload *up, const pulse_store_head *h,
                    const char *key) {
  size_t np = pulse_store_head_patch_count(h);
  size_t n = np + pulse_store_head_anchor_count(h);
  char k[1200];
  for (size_t i = 0; i < n; i++) {
    const pulse_store_object *o = i < np ? pulse_store_head_patch(h, i)
                                         : pulse_store_head_anchor(h, i - np);
    key_of(up, o->path, k, sizeof k);
    if (strcmp(k, key) == 0)
      return 1;
    if (i < np) { /* and its section index */
      char rel[PULSE_STORE_PATH_MAX + 16];
      store_sections_path(o->sha256, rel, sizeof rel);
      key_of(up, rel, k, sizeof k);
      if (strcmp(k, key) == 0)
        return 1;
    }
  }
  return 0;
}

/* Deletes what the head does not name under the folder `sub`
 * (objects/ or sections/), past the grace period. */
static pulse_status retain_under(pulse_upload *up, const pulse_store_head *h,
                                 const char *sub) {
  listed *all = NULL;
  size_t n = 0, cap = 0;
  char prefix[1200], token[1100] = "";
  key_of(up, sub, prefix, sizeof prefix);
  pulse_status st = PULSE_OK;
  for (int page = 0; st == PULSE_OK && page < 100000; page++) {
    upload_req r;
    int more = 0;
    st = upload_list_page(up, prefix, token, sizeof token, &r,
                          "listing the objects", &more);
    const char *xml = (const char *)r.reply.data;
    size_t len = r.reply.size, at = 0;
    char block[4096];
    while (st == PULSE_OK &&
           upload_xml_tag(xml, len, &at, "Contents", block, sizeof block)) {
      if (n == cap) {
        cap = cap ? 2 * cap : 256;
        listed *more = realloc(all, cap * sizeof *more);
        if (more == NULL) {
          st = pulse_fail(PULSE_ERR_NOMEM, "upload: listing");
          break;
        }
        all = more;
      }
      listed *e = &all[n];
      memset(e, 0, sizeof *e);
      size_t b = 0, bl = strlen(block);
      if (!upload_xml_tag(block, bl, &b, "Key", e->key, sizeof e->key))
        continue;
      b = 0;
      upload_xml_tag(block, bl, &b, "LastModified", e->modified,
                     sizeof e->modified);
      size_t kl = strlen(e->key);
      e->anchor = kl > 12 && strcmp(e->key + kl - 12, ".safetensors") == 0;
      n++;
    }
    upload_req_release(&r);
    if (!more)
      break;
  }
  if (st == PULSE_OK && n > 0) { /* qsort takes no NULL, even for 0 */
    qsort(all, n, sizeof *all, newer_first);
    unsigned anchors = 0;
    for (size_t i = 0; i < n; i++) {
      listed *e = &all[i];
      e->keep = named_by(up, h, e->key) ||
                age_of(e->modified) < (double)up->opts.grace_seconds ||
                (e->anchor && anchors < up->opts.keep_anchors);
      anchors += e->anchor;
    }
  }
  size_t ndel = 0;
  upload_req *dels = calloc(n + 1, sizeof *dels);
  upload_req **ptrs = calloc(n + 1, sizeof *ptrs);
  if (st == PULSE_OK && (dels == NULL || ptrs == NULL))
    st = pulse_fail(PULSE_ERR_NOMEM, "upload: retention");
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    if (all[i].keep)
      continue;
    upload_req_init(&dels[ndel], "DELETE");
    snprintf(dels[ndel].key, sizeof dels[ndel].key, "%s", all[i].key);
    ptrs[ndel] = &dels[ndel];
    ndel++;
  }
  if (st == PULSE_OK)
    st = upload_run(up, ptrs, ndel);
  for (size_t i = 0; i < ndel; i++) {
    if (st == PULSE_OK && !ok_status(dels[i].status) && dels[i].status != 404)
      st = upload_req_fail(&dels[i], "retention");
    upload_req_release(&dels[i]);
  }
  up->fig.deleted += st == PULSE_OK ? ndel : 0;
  free(dels), free(ptrs), free(all);
  return st;
}

static pulse_status retain(pulse_upload *up, const pulse_store_head *h) {
  PULSE_TRY(retain_under(up, h, PULSE_STORE_OBJECTS_DIR "/"));
  return retain_under(up, h, STORE_SECTIONS_DIR "/");
}

/* ----------------------------------------------------------------- store */

/* GETs the prefix's head.json into r (release it); PULSE_OK when an
 * answer came, whatever its status. */
static pulse_status get_head(pulse_upload *up, upload_req *r) {
  upload_req_init(r, "GET");
  key_of(up, "head.json", r->key, sizeof r->key);
  upload_req *one = r;
  return upload_run(up, &one, 1);
}

/* One writer per bucket prefix: the bucket's head, when there is one, must
 * be of this store's run and not ahead of it. A second publisher (another
 * store, another host) uploading to the prefix is refused before anything
 * is put. What was seen (the head's ETag, or no head) makes the head's
 * own write conditional (put_head), so two writers that both passed this
 * check cannot both move the head. */
static pulse_status check_writer(pulse_upload *up, const pulse_store_head *h) {
  upload_req r;
  pulse_status st = get_head(up, &r);
  up->head_absent = st == PULSE_OK && r.status == 404;
  snprintf(up->head_etag, sizeof up->head_etag, "%s",
           st == PULSE_OK && ok_status(r.status) ? r.etag : "");
  if (up->head_absent) {
    upload_req_release(&r);
    return PULSE_OK;
  }
  if (st == PULSE_OK && !ok_status(r.status))
    st = upload_req_fail(&r, "reading the bucket's head");
  pulse_store_head *theirs = NULL;
  if (st == PULSE_OK && pulse_store_head_parse(r.reply.data, r.reply.size, &theirs) != PULSE_OK)
    st = pulse_fail(PULSE_ERR_IO,
                    "upload: s3://%s/%shead.json is not a pulse head: one writer per bucket "
                    "prefix; refused before uploading anything",
                    up->bucket, up->prefix);
  upload_req_release(&r);
  if (st != PULSE_OK)
    return st;
  uint8_t mine[PULSE_STORE_RUN_BYTES], other[PULSE_STORE_RUN_BYTES];
  int have_mine = pulse_store_head_run(h, mine), have_other = pulse_store_head_run(theirs, other);
  uint64_t step = pulse_store_head_step(theirs);
  pulse_store_head_free(theirs);
  if (have_mine && (!have_other || memcmp(mine, other, sizeof mine) != 0))
    return pulse_fail(PULSE_ERR_IO,
                      "upload: s3://%s/%s already holds the head of another run (step %" PRIu64
                      "): one writer per bucket prefix; refused before uploading anything "
                      "(remove the prefix's head.json to start a new run there)",
                      up->bucket, up->prefix, step);
  if (step > pulse_store_head_step(h))
    return pulse_fail(PULSE_ERR_IO,
                      "upload: s3://%s/%s holds step %" PRIu64 " of this run, ahead of this "
                      "store's %" PRIu64 ": another writer; refused before uploading anything",
                      up->bucket, up->prefix, step, pulse_store_head_step(h));
  return PULSE_OK;
}

/* 1 when the prefix's head now holds exactly h's bytes. */
static int head_is(pulse_upload *up, const pulse_store_head *h) {
  upload_req r;
  size_t len = 0;
  const uint8_t *mine = pulse_store_head_bytes(h, &len);
  int same = get_head(up, &r) == PULSE_OK && ok_status(r.status) &&
             r.reply.size == len && memcmp(r.reply.data, mine, len) == 0;
  upload_req_release(&r);
  return same;
}

/* Puts the head, on the condition that the prefix's head is still what
 * check_writer saw (If-Match its ETag, or If-None-Match: * when there was
 * none): S3 answers 412 when another writer moved it in between, and the
 * step is refused. A service that ignores the condition gives the check's
 * protection alone. A 412 for a retry of our own write that had landed
 * (its answer lost) is told apart by the bytes. */
static pulse_status put_head(pulse_upload *up, const pulse_store_head *h) {
  upload_req r;
  upload_req_init(&r, "PUT");
  key_of(up, "head.json", r.key, sizeof r.key);
  size_t len = 0;
  r.body = pulse_store_head_bytes(h, &len);
  r.body_len = len;
  r.cache_control = "no-cache";
  r.content_type = "application/json";
  if (up->head_absent)
    r.if_none_match = "*";
  else if (up->head_etag[0] != '\0')
    r.if_match = up->head_etag;
  upload_req *one = &r;
  pulse_status st = upload_run(up, &one, 1);
  if (st == PULSE_OK && r.status == 412 && !head_is(up, h))
    st = pulse_fail(PULSE_ERR_IO,
                    "upload: another writer put s3://%s/%shead.json between this "
                    "publisher's check and its write (%s): one writer per bucket prefix; "
                    "step %" PRIu64 " refused, its objects left unnamed",
                    up->bucket, up->prefix,
                    up->head_absent ? "the prefix had no head" : "its ETag changed",
                    pulse_store_head_step(h));
  else if (st == PULSE_OK && r.status != 412 && !ok_status(r.status))
    st = upload_req_fail(&r, "putting the head");
  upload_req_release(&r);
  return st;
}

pulse_status pulse_upload_store(pulse_upload *up, const char *store_dir,
                                pulse_upload_figures *figures) {
  if (up == NULL || store_dir == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: NULL argument");
  double t0 = now_s();
  memset(&up->fig, 0, sizeof up->fig);
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(store_dir, &h);
  if (st != PULSE_OK)
    return st;
  /* Stale uploads cost money, not correctness: a service or a policy that
   * refuses the listing does not stop publishing. */
  if (up->stale_due && (st = upload_abort_stale(up)) != PULSE_OK &&
      st != PULSE_ERR_NOMEM) {
    PULSE_LOG_AT(PULSE_LOG_WARN, "upload: %s", pulse_error_detail());
    st = PULSE_OK;
  }
  if (st == PULSE_OK)
    st = check_writer(up, h);
  if (st == PULSE_OK)
    st = put_objects(up, store_dir, h);
  if (st == PULSE_OK)
    st = put_sections(up, store_dir, h);
  if (st == PULSE_OK) /* the head last: everything it names is there */
    st = put_head(up, h);
  if (st == PULSE_OK && !up->opts.no_retention)
    st = retain(up, h);
  /* After a failure (a part killed, a network cut), the next call looks
   * for what it may have left. */
  up->stale_due = st != PULSE_OK;
  up->fig.head_step = pulse_store_head_step(h);
  up->fig.seconds = now_s() - t0;
  pulse_store_head_free(h);
  if (figures != NULL)
    *figures = up->fig;
  return st;
}

uint64_t pulse_upload_stale_aborted(const pulse_upload *up) {
  return up != NULL ? up->stale_aborted : 0;
}
