/* store_sections.c - the section index of a patch (store_sections_impl.h):
 * built by the publisher, parsed and checked by workers and by store
 * verification. Everything read here is untrusted. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "status_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"

static void put_le(uint8_t *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

size_t store_sections_size(uint64_t count) {
  uint64_t max = (SIZE_MAX - STORE_SECTIONS_FIXED - STORE_SECTIONS_TAIL) / 32;
  if (count > max)
    return 0;
  return STORE_SECTIONS_FIXED + (size_t)count * 32 + STORE_SECTIONS_TAIL;
}

int store_sections_wanted(const pulse_patch *p) {
  size_t with = 0;
  for (size_t i = 0; i < pulse_patch_tensor_count(p) && with < 2; i++) {
    pulse_patch_tensor t;
    if (pulse_patch_tensor_get(p, i, &t) == PULSE_OK && t.section_size > 0)
      with++;
  }
  return with > 1;
}

pulse_status store_sections_offsets(const pulse_patch *p, uint64_t prefix,
                                    uint64_t *off) {
  size_t n = pulse_patch_tensor_count(p);
  uint64_t at = prefix;
  for (size_t i = 0; i < n; i++) {
    pulse_patch_tensor t;
    PULSE_TRY(pulse_patch_tensor_get(p, i, &t));
    off[i] = at;
    if (t.section_size > UINT64_MAX - at)
      return pulse_fail(PULSE_ERR_OVERFLOW, "sections: offsets overflow");
    at += t.section_size;
  }
  off[n] = at;
  return PULSE_OK;
}

/* Bytes of header and table, from the fixed header. */
static pulse_status prefix_of(const uint8_t *bytes, size_t size,
                              uint64_t *prefix) {
  if (size < STORE_SECTIONS_PATCH_HEADER)
    return pulse_fail(PULSE_ERR_TRUNCATED, "sections: patch shorter than its header");
  *prefix = STORE_SECTIONS_PATCH_HEADER + get_le(bytes + 12, 4);
  return PULSE_OK;
}

pulse_status store_sections_build(const uint8_t *bytes, size_t size,
                                  const uint8_t sha256[32],
                                  const pulse_sign_key *key, pulse_buffer *out) {
  out->data = NULL;
  out->size = 0;
  pulse_patch *p = NULL;
  PULSE_TRY(pulse_patch_open(bytes, size, &p));
  uint64_t prefix = 0;
  size_t count = pulse_patch_tensor_count(p);
  size_t n = store_sections_size(count);
  uint64_t *off = malloc((count + 1) * sizeof *off);
  uint8_t *b = n != 0 ? calloc(1, n) : NULL;
  pulse_status st = PULSE_OK;
  if (off == NULL || b == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "sections: %zu tensors", count);
  if (st == PULSE_OK)
    st = prefix_of(bytes, size, &prefix);
  if (st == PULSE_OK)
    st = store_sections_offsets(p, prefix, off);
  if (st == PULSE_OK && off[count] != size)
    st = pulse_fail(PULSE_ERR_INTERNAL, "sections: sections do not end the patch");
  if (st == PULSE_OK) {
    memcpy(b, STORE_SECTIONS_MAGIC, 8);
    put_le(b + 8, STORE_SECTIONS_VERSION, 2);
    put_le(b + 10, key != NULL ? 1 : 0, 2);
    memcpy(b + 16, sha256, 32);
    put_le(b + 48, size, 8);
    put_le(b + 56, prefix, 8);
    store_sha256(bytes, (size_t)prefix, b + 64);
    put_le(b + 96, count, 8);
    for (size_t i = 0; i < count; i++)
      store_sha256(bytes + off[i], (size_t)(off[i + 1] - off[i]),
                   b + STORE_SECTIONS_FIXED + 32 * i);
  }
  if (st == PULSE_OK && key != NULL) {
    size_t body = n - PULSE_SIGN_SIGNATURE_BYTES;
    size_t dl = strlen(STORE_SECTIONS_DOMAIN);
    pulse_sign_key_public(key, b + body - PULSE_KEY_BYTES);
    uint8_t *msg = malloc(dl + body);
    if (msg == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "sections: signature");
    } else {
      memcpy(msg, STORE_SECTIONS_DOMAIN, dl);
      memcpy(msg + dl, b, body);
      st = pulse_sign(key, msg, dl + body, b + body);
      free(msg);
    }
  }
  pulse_patch_free(p);
  free(off);
  if (st != PULSE_OK) {
    free(b);
    return st;
  }
  out->data = b;
  out->size = n;
  return PULSE_OK;
}

static const uint8_t zeros[PULSE_SIGN_SIGNATURE_BYTES];

pulse_status store_sections_parse(const uint8_t *b, size_t n,
                                  store_sections *out) {
  memset(out, 0, sizeof *out);
  if (b == NULL || n < STORE_SECTIONS_FIXED + STORE_SECTIONS_TAIL)
    return pulse_fail(PULSE_ERR_TRUNCATED,
                      "sections: %zu bytes, shorter than an empty index", n);
  if (memcmp(b, STORE_SECTIONS_MAGIC, 8) != 0)
    return pulse_fail(PULSE_ERR_MAGIC, "sections: bad magic (not a section index)");
  uint64_t version = get_le(b + 8, 2), flags = get_le(b + 10, 2);
  if (version != STORE_SECTIONS_VERSION)
    return pulse_fail(PULSE_ERR_VERSION, "sections: version %u, this reader knows %u",
                      (unsigned)version, STORE_SECTIONS_VERSION);
  if ((flags & ~1u) != 0 || get_le(b + 12, 4) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: unknown flags");
  uint64_t count = get_le(b + 96, 8);
  size_t want = store_sections_size(count);
  if (want == 0 || want != n)
    return pulse_fail(want == 0 || want > n ? PULSE_ERR_TRUNCATED : PULSE_ERR_TRAILING,
                      "sections: %zu bytes for %llu tensors", n, (unsigned long long)count);
  out->patch_size = get_le(b + 48, 8);
  out->prefix = get_le(b + 56, 8);
  if (out->prefix < STORE_SECTIONS_PATCH_HEADER || out->prefix > out->patch_size)
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: header and table of %llu bytes "
                      "in a patch of %llu",
                      (unsigned long long)out->prefix, (unsigned long long)out->patch_size);
  size_t body = n - PULSE_SIGN_SIGNATURE_BYTES;
  const uint8_t *pub = b + body - PULSE_KEY_BYTES, *sig = b + body;
  out->is_signed = (int)(flags & 1u);
  if (out->is_signed) {
    size_t dl = strlen(STORE_SECTIONS_DOMAIN);
    uint8_t *msg = malloc(dl + body);
    if (msg == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "sections: signature");
    memcpy(msg, STORE_SECTIONS_DOMAIN, dl);
    memcpy(msg + dl, b, body);
    pulse_status st = pulse_sign_verify(pub, msg, dl + body, sig);
    free(msg);
    if (st != PULSE_OK)
      return pulse_fail(PULSE_ERR_CORRUPT, "sections: the signature does not verify");
    memcpy(out->pub, pub, PULSE_KEY_BYTES);
  } else if (memcmp(pub, zeros, PULSE_KEY_BYTES) != 0 ||
             memcmp(sig, zeros, PULSE_SIGN_SIGNATURE_BYTES) != 0) {
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: unsigned, but a key or signature follows");
  }
  out->section_sha256 = malloc((size_t)count * 32 + 1);
  if (out->section_sha256 == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "sections: %llu tensors", (unsigned long long)count);
  memcpy(out->section_sha256, b + STORE_SECTIONS_FIXED, (size_t)count * 32);
  memcpy(out->patch_sha256, b + 16, 32);
  memcpy(out->prefix_sha256, b + 64, 32);
  out->count = count;
  return PULSE_OK;
}

void store_sections_free(store_sections *s) {
  if (s == NULL)
    return;
  free(s->section_sha256);
  s->section_sha256 = NULL;
}

pulse_status store_sections_check_patch(const store_sections *s,
                                        const uint8_t *bytes, size_t size) {
  uint8_t sha[32];
  store_sha256(bytes, size, sha);
  if (memcmp(sha, s->patch_sha256, 32) != 0 || size != s->patch_size)
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: names another patch");
  uint64_t prefix = 0;
  PULSE_TRY(prefix_of(bytes, size, &prefix));
  if (prefix != s->prefix)
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: the table's size is not the patch's");
  store_sha256(bytes, (size_t)prefix, sha);
  if (memcmp(sha, s->prefix_sha256, 32) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT, "sections: the header and table hash differs");
  pulse_patch *p = NULL;
  PULSE_TRY(pulse_patch_open(bytes, size, &p));
  size_t count = pulse_patch_tensor_count(p);
  uint64_t *off = malloc((count + 1) * sizeof *off);
  pulse_status st = off == NULL ? pulse_fail(PULSE_ERR_NOMEM, "sections: offsets") : PULSE_OK;
  if (st == PULSE_OK && count != s->count)
    st = pulse_fail(PULSE_ERR_CORRUPT, "sections: %llu tensors, the patch has %zu",
                    (unsigned long long)s->count, count);
  if (st == PULSE_OK)
    st = store_sections_offsets(p, prefix, off);
  for (size_t i = 0; i < count && st == PULSE_OK; i++) {
    store_sha256(bytes + off[i], (size_t)(off[i + 1] - off[i]), sha);
    if (memcmp(sha, s->section_sha256[i], 32) != 0)
      st = pulse_fail(PULSE_ERR_CORRUPT, "sections: tensor %zu's section hash differs", i);
  }
  free(off);
  pulse_patch_free(p);
  return st;
}

void store_sections_path(const uint8_t patch_sha256[32], char *out, size_t cap) {
  char hex[65];
  store_hex(patch_sha256, 32, hex);
  snprintf(out, cap, STORE_SECTIONS_DIR "/%s", hex);
}

int store_sections_parse_name(const char *name, uint8_t patch_sha256[32]) {
  return strlen(name) == 64 && store_unhex(name, 64, patch_sha256, 32) == 0;
}
