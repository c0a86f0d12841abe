/* upload_stale.c - incomplete multipart uploads left under the prefix by an
 * upload that was killed mid-part (kill -9, a lost machine): listed with
 * ListMultipartUploads and aborted with AbortMultipartUpload, both signed
 * by libcurl's SigV4 like every other request (upload_s3.c). The bucket's
 * head never named them, so readers never saw them; aborting frees the
 * parts the service would otherwise keep and bill. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "upload_impl.h"

/* One incomplete upload. */
typedef struct {
  char key[1100];
  char id[1024];
} stale_upload;

/* Adds the <Upload> entries of one listing page to *all. */
static pulse_status collect(const char *xml, size_t len, stale_upload **all,
                            size_t *n, size_t *cap) {
  size_t at = 0;
  char block[4096];
  while (upload_xml_tag(xml, len, &at, "Upload", block, sizeof block)) {
    stale_upload u;
    size_t b = 0, bl = strlen(block);
    if (!upload_xml_tag(block, bl, &b, "Key", u.key, sizeof u.key))
      continue;
    b = 0;
    if (!upload_xml_tag(block, bl, &b, "UploadId", u.id, sizeof u.id))
      continue;
    if (*n == *cap) {
      size_t c = *cap ? 2 * *cap : 16;
      stale_upload *more = realloc(*all, c * sizeof *more);
      if (more == NULL)
        return pulse_fail(PULSE_ERR_NOMEM, "upload: stale multipart uploads");
      *all = more;
      *cap = c;
    }
    (*all)[(*n)++] = u;
  }
  return PULSE_OK;
}

/* Every incomplete upload under the prefix (all pages). *listed is 0 when
 * the service does not implement the listing. */
static pulse_status list_stale(pulse_upload *up, stale_upload **all,
                               size_t *n, int *listed) {
  char penc[3700], kmark[1100] = "", imark[1024] = "", kenc[3400],
      ienc[3100];
  size_t cap = 0;
  *listed = 1;
  upload_uri_encode(up->prefix, 0, penc, sizeof penc);
  pulse_status st = PULSE_OK;
  for (int page = 0; st == PULSE_OK && page < 100000; page++) {
    upload_req r;
    upload_req_init(&r, "GET");
    upload_uri_encode(kmark, 0, kenc, sizeof kenc);
    upload_uri_encode(imark, 0, ienc, sizeof ienc);
    /* Canonical query: parameters sorted by name. */
    int qn = kmark[0] ? snprintf(r.query, sizeof r.query,
                                 "key-marker=%s&prefix=%s&upload-id-marker=%s"
                                 "&uploads=",
                                 kenc, penc, ienc)
                      : snprintf(r.query, sizeof r.query,
                                 "prefix=%s&uploads=", penc);
    if (qn < 0 || (size_t)qn >= sizeof r.query)
      return pulse_fail(PULSE_ERR_IO,
                        "upload: listing multipart uploads: the markers do "
                        "not fit in a request");
    upload_req *one = &r;
    st = upload_run(up, &one, 1);
    if (st == PULSE_OK && (r.status == 501 || r.status == 405)) {
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "upload: %s does not list multipart uploads (HTTP %ld): "
                   "stale ones under s3://%s/%s are not aborted",
                   up->endpoint, r.status, up->bucket, up->prefix);
      *listed = 0;
      upload_req_release(&r);
      return PULSE_OK;
    }
    if (st == PULSE_OK && (r.status < 200 || r.status >= 300))
      st = upload_req_fail(&r, "listing multipart uploads");
    const char *xml = (const char *)r.reply.data;
    size_t len = r.reply.size, at = 0;
    if (st == PULSE_OK)
      st = collect(xml, len, all, n, &cap);
    char truncated[16] = "";
    upload_xml_tag(xml, len, &at, "IsTruncated", truncated, sizeof truncated);
    at = 0;
    int more = st == PULSE_OK && strcmp(truncated, "true") == 0 &&
               upload_xml_tag(xml, len, &at, "NextKeyMarker", kmark,
                              sizeof kmark);
    at = 0;
    if (more &&
        !upload_xml_tag(xml, len, &at, "NextUploadIdMarker", imark,
                        sizeof imark))
      imark[0] = '\0';
    upload_req_release(&r);
    if (!more)
      break;
  }
  return st;
}

pulse_status upload_abort_stale(pulse_upload *up) {
  stale_upload *all = NULL;
  size_t n = 0;
  int listed = 0;
  pulse_status st = list_stale(up, &all, &n, &listed);
  upload_req *reqs = NULL, **ptrs = NULL;
  if (st == PULSE_OK && n > 0) {
    reqs = calloc(n, sizeof *reqs);
    ptrs = calloc(n, sizeof *ptrs);
    if (reqs == NULL || ptrs == NULL)
      st = pulse_fail(PULSE_ERR_NOMEM, "upload: stale multipart uploads");
  }
  for (size_t i = 0; st == PULSE_OK && i < n; i++) {
    upload_req_init(&reqs[i], "DELETE");
    snprintf(reqs[i].key, sizeof reqs[i].key, "%s", all[i].key);
    char idq[3100];
    upload_uri_encode(all[i].id, 0, idq, sizeof idq);
    snprintf(reqs[i].query, sizeof reqs[i].query, "uploadId=%s", idq);
    ptrs[i] = &reqs[i];
  }
  if (st == PULSE_OK && n > 0)
    st = upload_run(up, ptrs, n);
  uint64_t aborted = 0;
  for (size_t i = 0; reqs != NULL && i < n; i++) {
    /* 404 NoSuchUpload: completed or aborted meanwhile, gone all the same. */
    long s = reqs[i].status;
    if (st == PULSE_OK && (s < 200 || s >= 300) && s != 404)
      st = upload_req_fail(&reqs[i], "aborting a stale multipart upload");
    if (s >= 200 && s < 300)
      aborted++;
    upload_req_release(&reqs[i]);
  }
  if (aborted > 0)
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "upload: aborted %llu stale multipart upload%s under "
                 "s3://%s/%s (left by an upload that was stopped)",
                 (unsigned long long)aborted, aborted == 1 ? "" : "s",
                 up->bucket, up->prefix);
  up->stale_aborted += aborted;
  if (st == PULSE_OK)
    up->stale_due = 0;
  free(reqs), free(ptrs), free(all);
  return st;
}
