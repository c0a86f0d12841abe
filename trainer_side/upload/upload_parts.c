/* upload_parts.c - S3 multipart uploads in pieces: the requests
 * put_multipart (upload.c) runs for one large object, and the part API of
 * pulse_upload.h, with which several handles (the ranks of a sharded
 * trainer, on several hosts) each put their parts of one object. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"
#include "upload_impl.h"

#define IMMUTABLE "public, max-age=31536000, immutable"
#define MAX_PARTS 10000u
#define ID_MAX 1024 /* S3's UploadIds are far shorter */

static int ok_status(long s) {
  return s >= 200 && s < 300;
}

/* 1 when s is non-empty printable ASCII of under cap bytes, without the
 * characters in `bad`. */
static int plain_text(const char *s, size_t cap, const char *bad) {
  size_t n = 0;
  for (; s[n] != '\0'; n++)
    if ((unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e ||
        strchr(bad, s[n]) != NULL)
      return 0;
  return n > 0 && n < cap;
}

/* --------------------------------------------------------------- requests */

pulse_status upload_mp_create(pulse_upload *up, const char *key, char *id,
                              size_t cap) {
  upload_req c;
  upload_req_init(&c, "POST");
  snprintf(c.key, sizeof c.key, "%s", key);
  snprintf(c.query, sizeof c.query, "uploads=");
  c.cache_control = IMMUTABLE;
  c.content_type = "application/octet-stream";
  pulse_status st = upload_run_checked(up, &c, "starting a multipart upload");
  size_t at = 0;
  if (st == PULSE_OK && !upload_xml_tag((const char *)c.reply.data,
                                        c.reply.size, &at, "UploadId", id, cap))
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "upload: %s: no UploadId (of under %zu bytes) in the "
                    "answer to starting a multipart upload",
                    key, cap);
  upload_req_release(&c);
  return st;
}

/* Prepares r as a request on upload id of key ("?uploadId=..."). */
static void upload_id_req(upload_req *r, const char *method, const char *key,
                          const char *id) {
  char idq[3 * ID_MAX + 4];
  upload_uri_encode(id, 0, idq, sizeof idq);
  upload_req_init(r, method);
  snprintf(r->key, sizeof r->key, "%s", key);
  snprintf(r->query, sizeof r->query, "uploadId=%s", idq);
}

void upload_mp_part_req(upload_req *r, const char *key, const char *id,
                        uint32_t number) {
  char idq[3 * ID_MAX + 4];
  upload_uri_encode(id, 0, idq, sizeof idq);
  upload_req_init(r, "PUT");
  snprintf(r->key, sizeof r->key, "%s", key);
  snprintf(r->query, sizeof r->query, "partNumber=%" PRIu32 "&uploadId=%s",
           number, idq);
}

pulse_status upload_mp_complete(pulse_upload *up, const char *key,
                                const char *id, const char *const *etags,
                                size_t n) {
  for (size_t i = 0; i < n; i++)
    if (etags[i] == NULL || !plain_text(etags[i], 256, "<>&"))
      return pulse_fail(PULSE_ERR_ARG,
                        "upload: completing %s: the ETag of part %zu is not "
                        "an ETag (printable text under 256 bytes, no <>&)",
                        key, i + 1);
  pulse_bytebuf xml = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_str(&xml, "<CompleteMultipartUpload>");
  for (size_t i = 0; i < n; i++)
    pulse_bytebuf_printf(&xml,
                         "<Part><PartNumber>%zu</PartNumber><ETag>%s</ETag>"
                         "</Part>",
                         i + 1, etags[i]);
  pulse_bytebuf_str(&xml, "</CompleteMultipartUpload>");
  if (xml.failed) {
    pulse_bytebuf_free(&xml);
    return pulse_fail(PULSE_ERR_NOMEM, "upload: completing %s", key);
  }
  upload_req done;
  upload_id_req(&done, "POST", key, id);
  done.body = xml.data;
  done.body_len = xml.size;
  done.content_type = "application/xml";
  upload_req *one = &done;
  pulse_status st = upload_run(up, &one, 1);
  /* A completion can fail inside a 200 answer (S3 says so in its body). */
  if (st == PULSE_OK &&
      (!ok_status(done.status) ||
       (done.reply.size >= 7 &&
        memmem(done.reply.data, done.reply.size, "<Error>", 7) != NULL)))
    st = upload_req_fail(&done, "completing a multipart upload");
  upload_req_release(&done);
  pulse_bytebuf_free(&xml);
  return st;
}

pulse_status upload_mp_abort(pulse_upload *up, const char *key,
                             const char *id) {
  upload_req r;
  upload_id_req(&r, "DELETE", key, id);
  upload_req *one = &r;
  pulse_status st = upload_run(up, &one, 1);
  if (st == PULSE_OK && r.status == 404)
    st = pulse_fail(PULSE_ERR_NOT_FOUND,
                    "upload: aborting %s: the service knows no upload %s "
                    "(completed, aborted, or never begun)",
                    key, id);
  else if (st == PULSE_OK && !ok_status(r.status))
    st = upload_req_fail(&r, "aborting a multipart upload");
  upload_req_release(&r);
  return st;
}

/* ------------------------------------------------------------- public API */

/* The key of rel under the prefix, after checking rel: a relative path of
 * the store ("objects/<sha>.safetensors"), no "..", nothing odd. */
pulse_status upload_key_for(const pulse_upload *up, const char *rel,
                            const char *what, char key[1200]) {
  if (up == NULL || rel == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: %s: NULL argument", what);
  int dots = strcmp(rel, "..") == 0 || strncmp(rel, "../", 3) == 0 ||
             strstr(rel, "/../") != NULL ||
             (strlen(rel) >= 3 && strcmp(rel + strlen(rel) - 3, "/..") == 0);
  if (!plain_text(rel, 1000, " \\") || rel[0] == '/' || dots ||
      strlen(up->prefix) + strlen(rel) >= 1200)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: %s: '%s' is not a relative path of the store "
                      "(printable, no spaces, no leading '/', no '..')",
                      what, rel);
  size_t pl = strlen(up->prefix), rl = strlen(rel); /* fits: checked */
  memcpy(key, up->prefix, pl);
  memcpy(key + pl, rel, rl + 1);
  return PULSE_OK;
}

static pulse_status check_id(const char *id, const char *what) {
  if (id == NULL || !plain_text(id, ID_MAX, ""))
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: %s: the upload id is not printable text of "
                      "1..%d bytes",
                      what, ID_MAX - 1);
  return PULSE_OK;
}

pulse_status pulse_upload_part_begin(pulse_upload *up, const char *rel,
                                     char *upload_id, size_t cap) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "beginning a multipart upload", key));
  if (upload_id == NULL || cap == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: beginning %s: no room for the "
                      "upload id",
                      key);
  upload_id[0] = '\0';
  char id[ID_MAX];
  PULSE_TRY(upload_mp_create(up, key, id, sizeof id));
  if (strlen(id) >= cap)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: beginning %s: the upload id (%zu bytes) does "
                      "not fit the %zu given; the upload is left to "
                      "pulse_upload_store's clean-up of stale uploads",
                      key, strlen(id), cap);
  snprintf(upload_id, cap, "%s", id);
  return PULSE_OK;
}

pulse_status pulse_upload_part_put(pulse_upload *up, const char *rel,
                                   const char *upload_id, uint32_t number,
                                   const void *data, size_t len, char *etag,
                                   size_t cap) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "putting a part", key));
  PULSE_TRY(check_id(upload_id, "putting a part"));
  if (number < 1 || number > MAX_PARTS || (data == NULL && len > 0) ||
      etag == NULL || cap == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: putting part %" PRIu32 " of %s: parts are "
                      "numbered 1..%u, data and etag must be given",
                      number, key, MAX_PARTS);
  etag[0] = '\0';
  upload_req r;
  upload_mp_part_req(&r, key, upload_id, number);
  r.body = data;
  r.body_len = len;
  upload_req *one = &r;
  pulse_status st = upload_run(up, &one, 1);
  if (st == PULSE_OK && (!ok_status(r.status) || r.etag[0] == '\0'))
    st = upload_req_fail(&r, "putting a part");
  if (st == PULSE_OK && strlen(r.etag) >= cap)
    st = pulse_fail(PULSE_ERR_ARG,
                    "upload: part %" PRIu32 " of %s: its ETag (%zu bytes) "
                    "does not fit the %zu given",
                    number, key, strlen(r.etag), cap);
  if (st == PULSE_OK)
    snprintf(etag, cap, "%s", r.etag);
  upload_req_release(&r);
  return st;
}

pulse_status pulse_upload_part_finish(pulse_upload *up, const char *rel,
                                      const char *upload_id,
                                      const char *const *etags, size_t n) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "completing a multipart upload", key));
  PULSE_TRY(check_id(upload_id, "completing a multipart upload"));
  if (n == 0 || n > MAX_PARTS || etags == NULL)
    return pulse_fail(PULSE_ERR_ARG,
                      "upload: completing %s: 1..%u parts, their ETags given",
                      key, MAX_PARTS);
  return upload_mp_complete(up, key, upload_id, etags, n);
}

pulse_status pulse_upload_part_abort(pulse_upload *up, const char *rel,
                                     const char *upload_id) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "aborting a multipart upload", key));
  PULSE_TRY(check_id(upload_id, "aborting a multipart upload"));
  return upload_mp_abort(up, key, upload_id);
}

pulse_status pulse_upload_object_size(pulse_upload *up, const char *rel,
                                      uint64_t *size) {
  char key[1200];
  PULSE_TRY(upload_key_for(up, rel, "the size of an object", key));
  if (size == NULL)
    return pulse_fail(PULSE_ERR_ARG, "upload: %s: NULL size", key);
  upload_req r;
  upload_req_init(&r, "HEAD");
  snprintf(r.key, sizeof r.key, "%s", key);
  pulse_status st = upload_run_object(up, &r, "the size of an object");
  if (st == PULSE_OK)
    *size = r.length;
  upload_req_release(&r);
  return st;
}
