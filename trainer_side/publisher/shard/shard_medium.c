/* shard_medium.c - the two media of the collective step (shard_step_impl.h):
 * a store folder every rank shares (STORE/shard/, files written under a
 * temporary name and renamed, the store's head.json), and the store's
 * bucket (<prefix>/shard/ objects through each rank's own pulse_upload
 * handle, the bucket's head.json, which rank 0 uploads after its commit). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bytebuf_impl.h"
#include "pulse_sha256.h"
#include "shard_step_impl.h"
#include "status_impl.h"

#define SHARD_SUB "shard/"

int shard_file_dropped(const char *name, uint64_t step, int rank,
                       int keep_fail) {
  char prefix[64], mine[32];
  snprintf(prefix, sizeof prefix, "%" PRIu64 ".", step);
  snprintf(mine, sizeof mine, "-%d", rank);
  size_t n = strlen(name), m = strlen(mine);
  if (strncmp(name, prefix, strlen(prefix)) != 0 || name[0] == '.' ||
      (rank >= 0 && (n < m || strcmp(name + n - m, mine) != 0)))
    return 0;
  if ((rank >= 0 && strstr(name, ".go") != NULL) ||
      (keep_fail && strstr(name, ".fail-") != NULL))
    return 0;
  return 1;
}

/* ----------------------------------------------------------------- folder */

static pulse_status folder_put(shard_medium *md, const char *name,
                               const void *data, size_t n) {
  char tmp[4352], final[4352];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld", md->folder, name, (long)getpid());
  snprintf(final, sizeof final, "%s/%s", md->folder, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  pulse_status st = PULSE_OK;
  if (fd < 0)
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
  const uint8_t *p = data;
  while (n > 0 && st == PULSE_OK) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
    else
      p += w, n -= (size_t)w;
  }
  if (st == PULSE_OK && fdatasync(fd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
  close(fd);
  if (st == PULSE_OK && rename(tmp, final) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", final, strerror(errno));
  if (st != PULSE_OK)
    unlink(tmp);
  return st;
}

static int folder_get(shard_medium *md, const char *name, pulse_buffer *out) {
  char path[4352];
  snprintf(path, sizeof path, "%s/%s", md->folder, name);
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  struct stat sb;
  int ok = fstat(fileno(f), &sb) == 0;
  size_t n = ok ? (size_t)sb.st_size : 0;
  out->data = malloc(n ? n : 1);
  out->size = n;
  ok = ok && out->data != NULL && fread(out->data, 1, n, f) == n;
  fclose(f);
  if (!ok)
    pulse_buffer_free(out);
  return ok;
}

static int folder_get_many(shard_medium *md, const char *const *names,
                           size_t n, pulse_buffer *outs) {
  for (size_t i = 0; i < n; i++) {
    outs[i].data = NULL, outs[i].size = 0;
    (void)folder_get(md, names[i], &outs[i]); /* empty when not there */
  }
  return 0;
}

static int folder_list(shard_medium *md, const char *prefix,
                       pulse_buffer *names, size_t *count) {
  *count = 0;
  names->data = NULL, names->size = 0;
  DIR *d = opendir(md->folder);
  if (d == NULL)
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", md->folder,
                      strerror(errno)),
           -1;
  pulse_bytebuf all = PULSE_BYTEBUF_INIT;
  struct dirent *e;
  size_t pl = strlen(prefix);
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.' && strncmp(e->d_name, prefix, pl) == 0) {
      pulse_bytebuf_put(&all, e->d_name, strlen(e->d_name) + 1);
      (*count)++;
    }
  closedir(d);
  if (all.failed) {
    pulse_bytebuf_free(&all);
    *count = 0;
    return pulse_fail(PULSE_ERR_NOMEM, "shard: listing %s", md->folder), -1;
  }
  names->data = all.data, names->size = all.size;
  return *count > 0;
}

static void folder_drop(shard_medium *md, uint64_t step, int rank,
                        int keep_fail) {
  DIR *d = opendir(md->folder);
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!shard_file_dropped(e->d_name, step, rank, keep_fail))
      continue;
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", md->folder, e->d_name);
    unlink(path);
  }
  closedir(d);
}

static pulse_status head_of(pulse_store_head *h, pulse_status st, int *has,
                            uint64_t *step, pulse_state_digest *digest) {
  *has = st == PULSE_OK;
  *step = 0;
  if (st == PULSE_ERR_NOT_FOUND)
    return PULSE_OK;
  if (st != PULSE_OK)
    return st;
  *step = pulse_store_head_step(h);
  if (digest != NULL)
    *digest = *pulse_store_head_state_digest(h);
  pulse_store_head_free(h);
  return PULSE_OK;
}

static pulse_status folder_head(shard_medium *md, int *has, uint64_t *step,
                                pulse_state_digest *digest) {
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(md->store_dir, &h);
  return head_of(h, st, has, step, digest);
}

pulse_status shard_medium_folder(shard_medium *md, const char *store_dir) {
  memset(md, 0, sizeof *md);
  md->put = folder_put;
  md->get = folder_get;
  md->get_many = folder_get_many;
  md->list = folder_list;
  md->drop = folder_drop;
  md->head = folder_head;
  md->nap_first_s = md->nap_most_s = 0.002; /* a local rename is cheap */
  md->store_dir = store_dir;
  if ((size_t)snprintf(md->folder, sizeof md->folder, "%s/shard", store_dir) >=
      sizeof md->folder)
    return pulse_fail(PULSE_ERR_ARG, "shard: %s: path too long", store_dir);
  /* A rank may come before rank 0 has made the store. */
  if ((mkdir(store_dir, 0755) != 0 && errno != EEXIST) ||
      (mkdir(md->folder, 0755) != 0 && errno != EEXIST))
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", md->folder,
                      strerror(errno));
  return PULSE_OK;
}

/* ----------------------------------------------------------------- bucket */

/* A bucket file is its bytes and their SHA-256: a reader takes only a
 * whole one (a service that writes objects in place, as s3rver does, can
 * answer a GET with what it has written so far; S3 itself does not). */
static pulse_status bucket_put(shard_medium *md, const char *name,
                               const void *data, size_t n) {
  char rel[256];
  snprintf(rel, sizeof rel, SHARD_SUB "%s", name);
  uint8_t *whole = malloc(n + PULSE_SHA256_BYTES);
  if (whole == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "shard: %s", name);
  if (n > 0)
    memcpy(whole, data, n);
  pulse_sha256_state sha;
  pulse_sha256_begin(&sha);
  pulse_status st = pulse_sha256_add(&sha, data, n);
  if (st == PULSE_OK)
    st = pulse_sha256_end(&sha, whole + n);
  if (st == PULSE_OK)
    st = pulse_upload_key_put(md->bucket, rel, whole, n + PULSE_SHA256_BYTES);
  free(whole);
  return st;
}

/* 1 when out, as got, is a whole file (its SHA-256 then taken off);
 * else 0 and out freed: not (yet) whole, looked at again. */
static int bucket_whole(pulse_buffer *out) {
  uint8_t sum[PULSE_SHA256_BYTES];
  pulse_sha256_state sha;
  pulse_sha256_begin(&sha);
  size_t n =
      out->size >= PULSE_SHA256_BYTES ? out->size - PULSE_SHA256_BYTES : 0;
  int whole = out->size >= PULSE_SHA256_BYTES &&
              pulse_sha256_add(&sha, out->data, n) == PULSE_OK &&
              pulse_sha256_end(&sha, sum) == PULSE_OK &&
              memcmp(sum, out->data + n, sizeof sum) == 0;
  if (!whole) {
    pulse_buffer_free(out);
    return 0;
  }
  out->size = n;
  return 1;
}

static int bucket_get(shard_medium *md, const char *name, pulse_buffer *out) {
  char rel[256];
  snprintf(rel, sizeof rel, SHARD_SUB "%s", name);
  pulse_status st = pulse_upload_key_get(md->bucket, rel, out);
  if (st != PULSE_OK)
    return st == PULSE_ERR_NOT_FOUND ? 0 : -1;
  return bucket_whole(out);
}

/* The files at once (one round trip for a few, not one each). */
static int bucket_get_many(shard_medium *md, const char *const *names,
                           size_t n, pulse_buffer *outs) {
  char(*rels)[256] = calloc(n + 1, sizeof *rels);
  const char **ptrs = calloc(n + 1, sizeof *ptrs);
  int rc = rels != NULL && ptrs != NULL ? 0 : -1;
  if (rc != 0)
    pulse_fail(PULSE_ERR_NOMEM, "shard: getting %zu files", n);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    snprintf(rels[i], sizeof rels[i], SHARD_SUB "%s", names[i]);
    ptrs[i] = rels[i];
  }
  if (rc == 0 && pulse_upload_key_get_many(md->bucket, ptrs, n, outs) != PULSE_OK)
    rc = -1;
  for (size_t i = 0; rc == 0 && i < n; i++)
    if (outs[i].data != NULL)
      (void)bucket_whole(&outs[i]);
  free(rels), free(ptrs);
  return rc;
}

static int bucket_list(shard_medium *md, const char *prefix,
                       pulse_buffer *names, size_t *count) {
  char rel[256];
  snprintf(rel, sizeof rel, SHARD_SUB "%s", prefix);
  if (pulse_upload_key_list(md->bucket, rel, names, count) != PULSE_OK)
    return -1;
  /* The names as the folder's: without shard/ (each listed name has it). */
  size_t cut = strlen(SHARD_SUB), out = 0;
  const char *in = (const char *)names->data;
  for (size_t i = 0; i < *count; i++) {
    size_t len = strlen(in) + 1;
    memmove(names->data + out, in + cut, len - cut);
    out += len - cut, in += len;
  }
  names->size = out;
  return *count > 0;
}

static void bucket_drop(shard_medium *md, uint64_t step, int rank,
                        int keep_fail) {
  char prefix[96];
  snprintf(prefix, sizeof prefix, SHARD_SUB "%" PRIu64 ".", step);
  pulse_buffer names = {0};
  size_t n = 0;
  if (pulse_upload_key_list(md->bucket, prefix, &names, &n) != PULSE_OK)
    return; /* what stays is dropped by the step's next attempt */
  /* At once, not one request after another: an anchor's step leaves a
   * few files per part, and rank 0's next step waits for these. */
  const char **gone = calloc(n + 1, sizeof *gone);
  size_t ngone = 0;
  const char *rel = (const char *)names.data;
  for (size_t i = 0; gone != NULL && i < n; rel += strlen(rel) + 1, i++)
    if (shard_file_dropped(rel + strlen(SHARD_SUB), step, rank, keep_fail))
      gone[ngone++] = rel;
  if (gone != NULL)
    (void)pulse_upload_key_delete_many(md->bucket, gone, ngone);
  free(gone);
  pulse_buffer_free(&names);
}

static pulse_status bucket_head(shard_medium *md, int *has, uint64_t *step,
                                pulse_state_digest *digest) {
  pulse_store_head *h = NULL;
  pulse_status st = PULSE_OK;
  /* A head caught mid-write (see bucket_put) is read again, a few times. */
  for (int tries = 0; tries < 20; tries++) {
    pulse_buffer b = {0};
    st = pulse_upload_key_get(md->bucket, "head.json", &b);
    if (st == PULSE_OK)
      st = pulse_store_head_parse(b.data, b.size, &h);
    pulse_buffer_free(&b);
    if (st != PULSE_ERR_CORRUPT && st != PULSE_ERR_JSON)
      break;
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return head_of(h, st, has, step, digest);
}

void shard_medium_bucket(shard_medium *md, pulse_upload *bucket) {
  memset(md, 0, sizeof *md);
  md->put = bucket_put;
  md->get = bucket_get;
  md->get_many = bucket_get_many;
  md->list = bucket_list;
  md->drop = bucket_drop;
  md->head = bucket_head;
  /* Each look is a request: back off from 5 ms to 200 ms. */
  md->nap_first_s = 0.005;
  md->nap_most_s = 0.2;
  md->bucket = bucket;
}
