/* http_serve_blob.c - immutable, reference-counted byte strings for the
 * HTTP serving layer (http_serve_impl.h), with a strong ETag from their
 * SHA-256: responses keep a reference while they send, so the publisher
 * may replace or drop a blob at any time without copying under a lock. */
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http_serve_core_impl.h"
#include "status_impl.h"

struct pulse_serve_blob {
  atomic_size_t refs;
  size_t size;
  char etag[67]; /* "\"<sha256 hex>\"" */
  uint8_t data[];
};

pulse_status pulse_serve_blob_create(const void *data, size_t size,
                                     pulse_serve_blob **out) {
  *out = NULL;
  if (size > SIZE_MAX - sizeof(pulse_serve_blob))
    return pulse_fail(PULSE_ERR_NOMEM, "blob of %zu bytes", size);
  pulse_serve_blob *b = malloc(sizeof *b + size);
  if (b == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "blob of %zu bytes", size);
  atomic_init(&b->refs, 1);
  b->size = size;
  if (size)
    memcpy(b->data, data, size);
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned mdlen = 0;
  if (EVP_Digest(b->data, size, md, &mdlen, EVP_sha256(), NULL) != 1 ||
      mdlen != 32) {
    free(b);
    return pulse_fail(PULSE_ERR_INTERNAL, "blob: SHA-256 failed");
  }
  static const char hex[] = "0123456789abcdef";
  b->etag[0] = '"';
  for (unsigned i = 0; i < 32; i++) {
    b->etag[1 + 2 * i] = hex[md[i] >> 4];
    b->etag[2 + 2 * i] = hex[md[i] & 15];
  }
  b->etag[65] = '"';
  b->etag[66] = '\0';
  *out = b;
  return PULSE_OK;
}

pulse_serve_blob *pulse_serve_blob_ref(pulse_serve_blob *b) {
  atomic_fetch_add(&b->refs, 1);
  return b;
}

void pulse_serve_blob_release(pulse_serve_blob *b) {
  if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1)
    free(b);
}

size_t pulse_serve_blob_size(const pulse_serve_blob *b) {
  return b->size;
}

const uint8_t *pulse_serve_blob_data(const pulse_serve_blob *b) {
  return b->data;
}

const char *pulse_serve_blob_etag(const pulse_serve_blob *b) {
  return b->etag;
}

const uint8_t *serve_blob_bytes(const pulse_serve_blob *b) {
  return b->data;
}
