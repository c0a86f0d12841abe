/* sub_util.c - key hex, SHA-256 of files, clocks and folders (hex and
 * SHA-256 of buffers: codec's store_hex and store_sha256). */
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "hex_impl.h"
#include "status_impl.h"
#include "sub_impl.h"

int sub_unhex(const char *s, size_t len, uint8_t *out, size_t n) {
  return pulse_hex_decode(s, len, out, n, 1); /* keys and ETags: either case */
}

pulse_status pulse_sub_key_from_hex(const char *hex,
                                    uint8_t key[PULSE_KEY_BYTES]) {
  if (hex == NULL || key == NULL ||
      sub_unhex(hex, strlen(hex), key, PULSE_KEY_BYTES) != 0)
    return pulse_fail(PULSE_ERR_ARG, "a public key is 64 hex digits");
  return PULSE_OK;
}

pulse_status sub_sha256_file(const char *path, uint8_t out[32],
                             uint64_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "%s: %s", path, strerror(errno));
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  size_t cap = (size_t)4 << 20;
  uint8_t *buf = malloc(cap);
  pulse_status st = PULSE_OK;
  uint64_t total = 0;
  if (ctx == NULL || buf == NULL ||
      EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1) {
    st = pulse_fail(PULSE_ERR_NOMEM, "sha256 of %s", path);
  } else {
    for (;;) {
      ssize_t r = read(fd, buf, cap);
      if (r < 0 && errno == EINTR)
        continue;
      if (r < 0) {
        st = pulse_fail(PULSE_ERR_IO, "%s: %s", path, strerror(errno));
        break;
      }
      if (r == 0)
        break;
      EVP_DigestUpdate(ctx, buf, (size_t)r);
      total += (uint64_t)r;
    }
    unsigned len = 32;
    if (st == PULSE_OK)
      EVP_DigestFinal_ex(ctx, out, &len);
  }
  if (size != NULL)
    *size = total;
  free(buf);
  EVP_MD_CTX_free(ctx);
  close(fd);
  return st;
}

double sub_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

pulse_status sub_mkdir(const char *path) {
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return pulse_fail(PULSE_ERR_IO, "cannot make %s: %s", path,
                      strerror(errno));
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode))
    return pulse_fail(PULSE_ERR_IO, "%s is not a folder", path);
  return PULSE_OK;
}

void sub_fsync_dir(const char *path) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}
