/* upload_key.c - small objects of a bucket prefix by key (pulse_upload.h,
 * "Small objects by key"): put, get, delete and list, for the ranks of a
 * sharded trainer that exchange a step's files through the bucket
 * (pulse_pub_shard_step with a bucket), and a store folder taken from the
 * bucket's head (pulse_upload_fetch_store). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "pulse_codec.h"
#include "pulse_file.h"
#include "pulse_store.h"
#include "status_impl.h"
#include "upload_impl.h"

static int ok_status(long s) {
  return s >= 200 && s < 300;
}

/* ------------------------------------------------ requests of several calls */

pulse_status upload_run_checked(pulse_upload *up, upload_req *r,
                                const char *what) {
  upload_req *one = r;
  pulse_status st = upload_run(up, &one, 1);
  if (st == PULSE_OK && !ok_status(r->status))
    st = upload_req_fail(r, what);
  return st;
}

pulse_status upload_run_object(pulse_upload *up, upload_req *r,
                               const char *what) {
  upload_req *one = r;
  pulse_status st = upload_run(up, &one, 1);
  if (st == PULSE_OK && r->status == 404)
    st = pulse_fail(PULSE_ERR_NOT_FOUND, "upload: s3://%s/%s: no such object",
                    up->bucket, r->key);
  else if (st == PULSE_OK && !ok_status(r->status))
    st = upload_req_fail(r, what);
  return st;
}

pulse_status upload_list_page(pulse_upload *up, const char *prefix, char *token,
                              size_t token_cap, upload_req *r, const char *what,
                              int *more) {
  char penc[3700], tenc[3400];
  upload_uri_encode(prefix, 0, penc, sizeof penc);
  upload_uri_encode(token, 0, tenc, sizeof tenc);
  upload_req_init(r, "GET");
  if (token[0])
    snprintf(r->query, sizeof r->query,
             "continuation-token=%s&list-type=2&prefix=%s", tenc, penc);
  else
    snprintf(r->query, sizeof r->query, "list-type=2&prefix=%s", penc);
  pulse_status st = upload_run_checked(up, r, what);
  const char *xml = (const char *)r->reply.data;
  char truncated[16] = "";
  size_t at = 0;
  upload_xml_tag(xml, r->reply.size, &at, "IsTruncated", truncated,
                 sizeof truncated);
  at = 0;
  *more = strcmp(truncated, "true") == 0 &&
          upload_xml_tag(xml, r->reply.size, &at, "NextContinuationToken",
                         token, token_cap);
  return st;
}

/* ------------------------------------------------------------- public API */

pulse_status pulse_upload_key_put(pulse_upload *up, const char *rel,
                                  const void *data, size_t len) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "putting an object", key));
  if (data == NULL && len > 0)
    return pulse_fail(PULSE_ERR_ARG, "upload: putting %s: NULL data", key);
  upload_req r;
  upload_req_init(&r, "PUT");
  snprintf(r.key, sizeof r.key, "%s", key);
  r.body = data;
  r.body_len = len;
  r.cache_control = "no-cache"; /* the step's files change between attempts */
  r.content_type = "application/octet-stream";
  pulse_status st = upload_run_checked(up, &r, "putting an object");
  upload_req_release(&r);
  return st;
}

pulse_status pulse_upload_key_get(pulse_upload *up, const char *rel,
                                  pulse_buffer *out) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "getting an object", key));
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: getting %s: NULL out", key);
  PULSE_TRY(pulse_upload_key_get_many(up, &rel, 1, out));
  if (out->data == NULL)
    return pulse_fail(PULSE_ERR_NOT_FOUND, "upload: s3://%s/%s: no such object",
                      up->bucket, key);
  return PULSE_OK;
}

pulse_status pulse_upload_key_delete(pulse_upload *up, const char *rel) {
  return pulse_upload_key_delete_many(up, &rel, 1);
}

/* The many-object calls run this many requests a batch: each holds a few
 * KiB. */
#define KEY_BATCH 64u

pulse_status pulse_upload_key_delete_many(pulse_upload *up,
                                          const char *const *rels, size_t n) {
  if (up == NULL || (rels == NULL && n > 0))
    return pulse_fail(PULSE_ERR_ARG, "upload: deleting objects: NULL argument");
  upload_req *reqs = calloc(n < KEY_BATCH ? n + 1 : KEY_BATCH, sizeof *reqs);
  upload_req *ptrs[KEY_BATCH];
  if (reqs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "upload: deleting objects");
  pulse_status first = PULSE_OK;
  char why[512] = "";
  for (size_t at = 0; at < n; at += KEY_BATCH) {
    size_t m = n - at < KEY_BATCH ? n - at : KEY_BATCH, ready = 0;
    for (size_t i = 0; i < m; i++) {
      char key[1200];
      pulse_status bad =
          upload_key_for(up, rels[at + i], "deleting an object", key);
      if (bad != PULSE_OK) { /* the rest still go */
        if (first == PULSE_OK)
          first = bad, snprintf(why, sizeof why, "%s", pulse_error_detail());
        continue;
      }
      upload_req_init(&reqs[ready], "DELETE");
      snprintf(reqs[ready].key, sizeof reqs[ready].key, "%s", key);
      ptrs[ready] = &reqs[ready];
      ready++;
    }
    pulse_status st = upload_run(up, ptrs, ready);
    for (size_t i = 0; i < ready; i++) {
      if (st == PULSE_OK && !ok_status(reqs[i].status) && reqs[i].status != 404)
        st = upload_req_fail(&reqs[i], "deleting an object");
      upload_req_release(&reqs[i]);
    }
    if (first == PULSE_OK && st != PULSE_OK)
      first = st, snprintf(why, sizeof why, "%s", pulse_error_detail());
  }
  free(reqs);
  return first == PULSE_OK ? PULSE_OK : pulse_fail(first, "%s", why);
}

pulse_status pulse_upload_key_get_many(pulse_upload *up,
                                       const char *const *rels, size_t n,
                                       pulse_buffer *outs) {
  if (up == NULL || ((rels == NULL || outs == NULL) && n > 0))
    return pulse_fail(PULSE_ERR_ARG, "upload: getting objects: NULL argument");
  for (size_t i = 0; i < n; i++)
    outs[i].data = NULL, outs[i].size = 0;
  upload_req *reqs = calloc(n < KEY_BATCH ? n + 1 : KEY_BATCH, sizeof *reqs);
  upload_req *ptrs[KEY_BATCH];
  if (reqs == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "upload: getting objects");
  pulse_status st = PULSE_OK;
  for (size_t at = 0; at < n && st == PULSE_OK; at += KEY_BATCH) {
    size_t m = n - at < KEY_BATCH ? n - at : KEY_BATCH, ready = 0;
    for (size_t i = 0; i < m && st == PULSE_OK; i++) {
      char key[1200];
      st = upload_key_for(up, rels[at + i], "getting an object", key);
      if (st != PULSE_OK)
        break;
      upload_req_init(&reqs[ready], "GET");
      snprintf(reqs[ready].key, sizeof reqs[ready].key, "%s", key);
      ptrs[ready] = &reqs[ready];
      ready++;
    }
    if (st == PULSE_OK)
      st = upload_run(up, ptrs, ready);
    for (size_t i = 0; i < ready; i++) {
      upload_req *r = &reqs[i];
      pulse_buffer *out = &outs[at + i];
      if (st == PULSE_OK && ok_status(r->status)) {
        out->data = malloc(r->reply.size ? r->reply.size : 1);
        if (out->data == NULL)
          st = pulse_fail(PULSE_ERR_NOMEM, "upload: getting %s", r->key);
        else if (r->reply.size > 0)
          memcpy(out->data, r->reply.data, r->reply.size);
        out->size = out->data != NULL ? r->reply.size : 0;
      } else if (st == PULSE_OK && r->status != 404) {
        st = upload_req_fail(r, "getting an object");
      }
      upload_req_release(r);
    }
  }
  free(reqs);
  if (st != PULSE_OK)
    for (size_t i = 0; i < n; i++)
      pulse_buffer_free(&outs[i]);
  return st;
}

pulse_status pulse_upload_key_list(pulse_upload *up, const char *rel_prefix,
                                   pulse_buffer *names, size_t *count) {
  char prefix[1200];
  PULSE_TRY(upload_key_for(up, rel_prefix, "listing objects", prefix));
  if (names == NULL || count == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: listing %s: NULL out", prefix);
  names->data = NULL;
  names->size = 0;
  *count = 0;
  pulse_bytebuf all = PULSE_BYTEBUF_INIT;
  size_t n = 0, skip = strlen(up->prefix);
  char token[1100] = "";
  pulse_status st = PULSE_OK;
  for (int page = 0; st == PULSE_OK && page < 100000; page++) {
    upload_req r;
    int more = 0;
    st = upload_list_page(up, prefix, token, sizeof token, &r,
                          "listing objects", &more);
    const char *xml = (const char *)r.reply.data;
    size_t len = r.reply.size, at = 0;
    char block[4096], key[1200];
    while (st == PULSE_OK &&
           upload_xml_tag(xml, len, &at, "Contents", block, sizeof block)) {
      size_t b = 0;
      if (!upload_xml_tag(block, strlen(block), &b, "Key", key, sizeof key) ||
          strncmp(key, up->prefix, skip) != 0)
        continue;
      pulse_bytebuf_put(&all, key + skip, strlen(key + skip) + 1);
      n++;
    }
    upload_req_release(&r);
    if (!more)
      break;
  }
  if (st == PULSE_OK && all.failed)
    st = pulse_fail(PULSE_ERR_NOMEM, "upload: listing %s", prefix);
  if (st != PULSE_OK) {
    pulse_bytebuf_free(&all);
    return st;
  }
  names->data = all.data;
  names->size = all.size;
  *count = n;
  return PULSE_OK;
}

pulse_status pulse_upload_fetch_store(pulse_upload *up, const char *store_dir,
                                      size_t *fetched) {
  if (up == NULL || store_dir == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: fetch store: NULL argument");
  if (fetched != NULL)
    *fetched = 0;
  pulse_buffer head = {0};
  pulse_status st = PULSE_OK;
  /* The bucket's bytes are checked as any head before they are written.
   * One caught mid-write (a service that writes objects in place, as
   * s3rver does, answers with what it has so far; S3 does not) is read
   * again, a few times, as the bucket exchange reads its head. */
  for (int tries = 0; tries < 20; tries++) {
    pulse_buffer_free(&head);
    PULSE_TRY(pulse_upload_key_get(up, "head.json", &head));
    pulse_store_head *h = NULL;
    st = pulse_store_head_parse(head.data, head.size, &h);
    pulse_store_head_free(h);
    if (st != PULSE_ERR_CORRUPT && st != PULSE_ERR_JSON)
      break;
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  char path[4096];
  pulse_atomic_file *f = NULL;
  if (st == PULSE_OK && (size_t)snprintf(path, sizeof path, "%s/head.json",
                                         store_dir) >= sizeof path)
    st = pulse_fail(PULSE_ERR_ARG, "upload: fetch store: %s: path too long",
                    store_dir);
  if (st == PULSE_OK && mkdir(store_dir, 0755) != 0 && errno != EEXIST)
    st = pulse_fail(PULSE_ERR_IO, "upload: fetch store: %s: %s", store_dir,
                    strerror(errno));
  if (st == PULSE_OK)
    st = pulse_atomic_file_create(path, &f);
  if (st == PULSE_OK)
    st = pulse_atomic_file_write(f, head.data, head.size);
  if (st == PULSE_OK) {
    st = pulse_atomic_file_commit(f);
    f = NULL;
  }
  pulse_atomic_file_abort(f);
  pulse_buffer_free(&head);
  if (st == PULSE_OK)
    st = pulse_upload_fetch_missing(up, store_dir, fetched);
  return st;
}
