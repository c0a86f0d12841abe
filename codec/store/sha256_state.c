/* sha256_state.c - a SHA-256 whose state travels between processes
 * (pulse_sha256.h): OpenSSL's SHA256_CTX copied into plain bytes, followed
 * by a tag that says the bytes are a running state of this layout.
 *
 * SHA256_Init/Update/Final are deprecated in OpenSSL 3 (EVP contexts are
 * opaque, so they cannot be sent) but still exported; silenced here only. */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <assert.h>
#include <openssl/sha.h>
#include <string.h>

#include "pulse_sha256.h"
#include "status_impl.h"

/* The tag at the end of a running state; an ended state has it cleared. */
static const uint8_t RUNNING_TAG[8] = {'p', 'u', 'l', 's', 'e', 'S', 'H', '2'};
#define TAG_AT (PULSE_SHA256_STATE_BYTES - sizeof RUNNING_TAG)

static_assert(sizeof(SHA256_CTX) <= TAG_AT,
              "OpenSSL's SHA256_CTX does not fit pulse_sha256_state");

/* The context held in *state, checked: a state from elsewhere must not
 * send OpenSSL past its buffer (num indexes the 64-byte block). */
static pulse_status load(const pulse_sha256_state *state, SHA256_CTX *ctx,
                         const char *what) {
  if (state == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sha256 %s: NULL state", what);
  memcpy(ctx, state->bytes, sizeof *ctx);
  if (memcmp(state->bytes + TAG_AT, RUNNING_TAG, sizeof RUNNING_TAG) != 0 ||
      ctx->num >= SHA256_CBLOCK || ctx->md_len != SHA256_DIGEST_LENGTH)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "sha256 %s: not a running SHA-256 state of this library "
                      "(never begun, already ended, or damaged)",
                      what);
  return PULSE_OK;
}

static void store(pulse_sha256_state *state, const SHA256_CTX *ctx) {
  memcpy(state->bytes, ctx, sizeof *ctx);
}

void pulse_sha256_begin(pulse_sha256_state *state) {
  if (state == NULL)
    return;
  SHA256_CTX ctx;
  SHA256_Init(&ctx);
  memset(state->bytes, 0, sizeof state->bytes);
  store(state, &ctx);
  memcpy(state->bytes + TAG_AT, RUNNING_TAG, sizeof RUNNING_TAG);
}

pulse_status pulse_sha256_add(pulse_sha256_state *state, const void *data,
                              size_t len) {
  SHA256_CTX ctx;
  PULSE_TRY(load(state, &ctx, "add"));
  if (data == NULL && len > 0)
    return pulse_fail(PULSE_ERR_ARG, "sha256 add: NULL data of %zu bytes", len);
  if (len > 0 && SHA256_Update(&ctx, data, len) != 1)
    return pulse_fail(PULSE_ERR_INTERNAL, "sha256 add: OpenSSL failed");
  store(state, &ctx);
  return PULSE_OK;
}

pulse_status pulse_sha256_end(pulse_sha256_state *state,
                              uint8_t out[PULSE_SHA256_BYTES]) {
  SHA256_CTX ctx;
  PULSE_TRY(load(state, &ctx, "end"));
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sha256 end: NULL output");
  if (SHA256_Final(out, &ctx) != 1)
    return pulse_fail(PULSE_ERR_INTERNAL, "sha256 end: OpenSSL failed");
  memset(state->bytes, 0, sizeof state->bytes); /* ended: tag cleared */
  return PULSE_OK;
}
