/* store_util.c - hex, SHA-256 and name helpers of the store (store_impl.h). */
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "hex_impl.h"
#include "status_impl.h"
#include "store_impl.h"

void store_hex(const uint8_t *bytes, size_t n, char *out) {
  static const char digits[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digits[bytes[i] >> 4];
    out[2 * i + 1] = digits[bytes[i] & 15];
  }
  out[2 * n] = '\0';
}

int store_unhex(const char *s, size_t len, uint8_t *out, size_t n) {
  return pulse_hex_decode(s, len, out, n, 0); /* names have one spelling */
}

void store_sha256(const void *data, size_t n, uint8_t out[32]) {
  unsigned len = 32;
  EVP_Digest(data, n, out, &len, EVP_sha256(), NULL);
}

int store_join(char *buf, size_t cap, const char *dir, const char *rel) {
  int n = snprintf(buf, cap, "%s/%s", dir, rel);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int store_is_temp_name(const char *name) {
  return name[0] == '.' && strstr(name, ".tmp-") != NULL;
}

int store_parse_object_name(const char *name, pulse_store_kind *kind,
                            uint8_t sha256[32]) {
  size_t len = strlen(name);
  if (len < 64 || store_unhex(name, 64, sha256, 32) != 0)
    return 0;
  if (strcmp(name + 64, ".pulse") == 0)
    *kind = PULSE_STORE_PATCH;
  else if (strcmp(name + 64, ".safetensors") == 0)
    *kind = PULSE_STORE_ANCHOR;
  else
    return 0;
  return 1;
}

pulse_status pulse_store_file_sha256(const char *path, uint8_t sha256[32],
                                     uint64_t *size) {
  if (path == NULL || sha256 == NULL)
    return pulse_fail(PULSE_ERR_ARG, "store: NULL argument");
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "store: %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "store: %s: not a regular file", path);
  }
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (md == NULL || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(md);
    close(fd);
    return pulse_fail(PULSE_ERR_INTERNAL, "store: SHA-256 context");
  }
  /* 128 KiB: as fast as larger reads, and a sharded rank that hashes its
   * anchor holds 0.9 MiB less than with 1 MiB (python/bench_shard.py). */
  static const size_t chunk = (size_t)128 << 10;
  uint8_t *buf = malloc(chunk);
  pulse_status st =
      buf ? PULSE_OK : pulse_fail(PULSE_ERR_NOMEM, "store: read buffer");
  uint64_t total = 0;
  while (st == PULSE_OK) {
    ssize_t n = read(fd, buf, chunk);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      st = pulse_fail(PULSE_ERR_IO, "store: %s: read: %s", path,
                      strerror(errno));
    else if (n == 0)
      break;
    else {
      EVP_DigestUpdate(md, buf, (size_t)n);
      total += (uint64_t)n;
    }
  }
  unsigned len = 32;
  if (st == PULSE_OK)
    EVP_DigestFinal_ex(md, sha256, &len);
  EVP_MD_CTX_free(md);
  free(buf);
  close(fd);
  if (st == PULSE_OK && size != NULL)
    *size = total;
  return st;
}

int store_catchup_canon(const pulse_store_head *head, uint64_t from,
                        uint64_t to, const char *state_digest_hex,
                        const char *sha256_hex, uint64_t size, char *out,
                        size_t cap) {
  char run[2 * PULSE_STORE_RUN_BYTES + 8] = "";
  uint8_t rb[PULSE_STORE_RUN_BYTES];
  int v2 = pulse_store_head_run(head, rb);
  if (v2) {
    memcpy(run, "run ", 4);
    store_hex(rb, sizeof rb, run + 4);
    strcat(run, "\n");
  }
  int len = snprintf(out, cap,
                     "pulse-catchup-signature/%d\n%sfrom %" PRIu64
                     "\nto %" PRIu64 "\nstate_digest %s\nsha256 %s\nsize "
                     "%" PRIu64 "\n",
                     v2 ? 2 : 1, run, from, to, state_digest_hex, sha256_hex,
                     size);
  return len < 0 || (size_t)len >= cap ? -1 : len;
}
