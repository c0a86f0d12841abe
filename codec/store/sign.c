/* sign.c - Ed25519 keys, signatures and their PEM files (pulse_sign.h). */
#include "pulse_sign.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "status_impl.h"

struct pulse_sign_key {
  EVP_PKEY *pkey;
  uint8_t pub[PULSE_KEY_BYTES];
};

/* The first queued OpenSSL error as text (and the queue cleared), so a
 * detail names what OpenSSL objected to. */
static const char *ossl_reason(char *buf, size_t cap) {
  unsigned long e = ERR_get_error();
  if (e == 0)
    snprintf(buf, cap, "no detail");
  else
    ERR_error_string_n(e, buf, cap);
  ERR_clear_error();
  return buf;
}

static pulse_status wrap(EVP_PKEY *pkey, pulse_sign_key **out) {
  pulse_sign_key *k = calloc(1, sizeof *k);
  if (k == NULL) {
    EVP_PKEY_free(pkey);
    return pulse_fail(PULSE_ERR_NOMEM, "sign: key");
  }
  size_t len = sizeof k->pub;
  if (EVP_PKEY_get_raw_public_key(pkey, k->pub, &len) != 1 ||
      len != sizeof k->pub) {
    char why[160];
    EVP_PKEY_free(pkey);
    free(k);
    return pulse_fail(PULSE_ERR_INTERNAL, "sign: public key: %s",
                      ossl_reason(why, sizeof why));
  }
  k->pkey = pkey;
  *out = k;
  return PULSE_OK;
}

pulse_status pulse_sign_key_generate(pulse_sign_key **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sign: NULL output");
  *out = NULL;
  EVP_PKEY *pkey = NULL;
  EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, NULL);
  int ok = ctx != NULL && EVP_PKEY_keygen_init(ctx) == 1 &&
           EVP_PKEY_keygen(ctx, &pkey) == 1;
  EVP_PKEY_CTX_free(ctx);
  if (!ok) {
    char why[160];
    EVP_PKEY_free(pkey);
    return pulse_fail(PULSE_ERR_INTERNAL, "sign: key generation: %s",
                      ossl_reason(why, sizeof why));
  }
  return wrap(pkey, out);
}

pulse_status pulse_sign_key_load(const char *path, pulse_sign_key **out) {
  if (path == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sign: NULL argument");
  *out = NULL;
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "sign: %s: %s", path, strerror(errno));
  /* A PEM key is a few hundred bytes; refuse to parse anything huge. */
  char buf[16384];
  size_t n = fread(buf, 1, sizeof buf, f);
  int big = !feof(f);
  fclose(f);
  if (big)
    return pulse_fail(PULSE_ERR_CORRUPT, "sign: %s: larger than any PEM key",
                      path);
  BIO *bio = BIO_new_mem_buf(buf, (int)n);
  if (bio == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "sign: %s", path);
  EVP_PKEY *pkey = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
  BIO_free(bio);
  OPENSSL_cleanse(buf, sizeof buf);
  if (pkey == NULL) {
    char why[160];
    return pulse_fail(PULSE_ERR_CORRUPT, "sign: %s: not a PEM private key (%s)",
                      path, ossl_reason(why, sizeof why));
  }
  if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(pkey);
    return pulse_fail(PULSE_ERR_UNSUPPORTED, "sign: %s: not an Ed25519 key",
                      path);
  }
  return wrap(pkey, out);
}

pulse_status pulse_sign_key_save(const pulse_sign_key *key, const char *path) {
  if (key == NULL || path == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sign: NULL argument");
  BIO *bio = BIO_new(BIO_s_mem());
  if (bio == NULL || PEM_write_bio_PrivateKey(bio, key->pkey, NULL, NULL, 0,
                                              NULL, NULL) != 1) {
    char why[160];
    BIO_free(bio);
    return pulse_fail(PULSE_ERR_INTERNAL, "sign: PEM encoding: %s",
                      ossl_reason(why, sizeof why));
  }
  char *pem = NULL;
  long len = BIO_get_mem_data(bio, &pem);
  /* O_EXCL with mode 0600: a secret must never be readable by others, not
   * even for the moment between a rename and a chmod (pulse_file.h has no
   * mode option), and an existing key is never replaced. */
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    pulse_status st =
        pulse_fail(PULSE_ERR_IO, "sign: %s: %s%s", path, strerror(errno),
                   errno == EEXIST ? " (a key is never replaced)" : "");
    BIO_free(bio);
    return st;
  }
  const char *p = pem;
  long left = len;
  int err = 0;
  while (left > 0 && !err) {
    ssize_t w = write(fd, p, (size_t)left);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      err = w < 0 ? errno : EIO;
    else
      p += w, left -= w;
  }
  if (!err && fsync(fd) != 0)
    err = errno;
  close(fd);
  BIO_free(bio);
  if (err) {
    unlink(path);
    return pulse_fail(PULSE_ERR_IO, "sign: %s: %s", path, strerror(err));
  }
  /* Make the new name durable too. */
  char dir[4096];
  const char *slash = strrchr(path, '/');
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path),
             path);
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return PULSE_OK;
}

void pulse_sign_key_public(const pulse_sign_key *key,
                           uint8_t pub[PULSE_KEY_BYTES]) {
  memcpy(pub, key->pub, PULSE_KEY_BYTES);
}

void pulse_sign_key_free(pulse_sign_key *key) {
  if (key == NULL)
    return;
  EVP_PKEY_free(key->pkey);
  free(key);
}

pulse_status pulse_sign(const pulse_sign_key *key, const void *msg, size_t len,
                        uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]) {
  if (key == NULL || (msg == NULL && len > 0) || sig == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sign: NULL argument");
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  size_t siglen = PULSE_SIGN_SIGNATURE_BYTES;
  int ok = md != NULL &&
           EVP_DigestSignInit(md, NULL, NULL, NULL, key->pkey) == 1 &&
           EVP_DigestSign(md, sig, &siglen, msg, len) == 1 &&
           siglen == PULSE_SIGN_SIGNATURE_BYTES;
  EVP_MD_CTX_free(md);
  if (!ok) {
    char why[160];
    return pulse_fail(PULSE_ERR_INTERNAL, "sign: %s",
                      ossl_reason(why, sizeof why));
  }
  return PULSE_OK;
}

pulse_status pulse_sign_verify(const uint8_t pub[PULSE_KEY_BYTES],
                               const void *msg, size_t len,
                               const uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES]) {
  if (pub == NULL || (msg == NULL && len > 0) || sig == NULL)
    return pulse_fail(PULSE_ERR_ARG, "sign: NULL argument");
  EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub,
                                               PULSE_KEY_BYTES);
  if (pkey == NULL) {
    ERR_clear_error();
    return pulse_fail(PULSE_ERR_CORRUPT, "sign: not an Ed25519 public key");
  }
  EVP_MD_CTX *md = EVP_MD_CTX_new();
  if (md == NULL || EVP_DigestVerifyInit(md, NULL, NULL, NULL, pkey) != 1) {
    char why[160];
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pkey);
    return pulse_fail(PULSE_ERR_INTERNAL, "sign: %s",
                      ossl_reason(why, sizeof why));
  }
  int r = EVP_DigestVerify(md, sig, PULSE_SIGN_SIGNATURE_BYTES, msg, len);
  EVP_MD_CTX_free(md);
  EVP_PKEY_free(pkey);
  ERR_clear_error();
  if (r != 1)
    return pulse_fail(PULSE_ERR_CORRUPT, "sign: the signature does not verify");
  return PULSE_OK;
}
