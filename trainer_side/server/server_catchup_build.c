/* server_catchup_build.c - making one catch-up patch ready to serve, on a
 * builder thread (server_catchup_queue.c): squashed from the stored patches
 * (the state at the step is rebuilt from an anchor, since class-model
 * patches squash against their first base) and kept in catchup/
 * (content-addressed objects and a <from>-<to>.ref index) or, on a
 * read-only store, in memory; or, when another process or an earlier run
 * cached it, taken from catchup/ once its bytes match its name. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_state_impl.h"

/* The state at `from`: the chain's anchor and its patches up to `from`. */
static pulse_status state_at(pulse_server *srv, const srv_chain *c,
                             pulse_store_state *s) {
  PULSE_TRY(store_anchor_load(srv->dir, &c->anchor, 1, s));
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < c->first && st == PULSE_OK; i++) {
    pulse_buffer bytes = {NULL, 0};
    st = store_patch_read(srv->dir, &c->patches[i], &bytes);
    if (st == PULSE_OK)
      st = store_state_apply_patch(s, &c->patches[i], bytes.data, bytes.size,
                                   srv->opts.catchup_threads);
    pulse_buffer_free(&bytes);
  }
  return st;
}

/* Builds the squashed patch from `from` to the head's step, over the
 * head's objects or, for a step it no longer retains, those of earlier
 * heads still in the store (server_history.c). */
static pulse_status build(pulse_server *srv, const pulse_store_head *head,
                          uint64_t from, pulse_buffer *out) {
  srv_chain chain;
  PULSE_TRY(srv_chain_find(srv, head, from, &chain));
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  size_t count = chain.npatches - chain.first;
  pulse_buffer *bytes = calloc(count + 1, sizeof *bytes);
  pulse_patch **patches = calloc(count + 1, sizeof *patches);
  pulse_status st = bytes && patches ? state_at(srv, &chain, &s)
                                     : pulse_fail(PULSE_ERR_NOMEM, "catch-up");
  const uint16_t **base =
      st == PULSE_OK ? calloc(s.count + 1, sizeof *base) : NULL;
  if (st == PULSE_OK && base == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "catch-up");
  for (size_t i = 0; i < count && st == PULSE_OK; i++) {
    const pulse_store_object *o = &chain.patches[chain.first + i];
    st = store_patch_read(srv->dir, o, &bytes[i]);
    if (st == PULSE_OK)
      st = pulse_patch_open(bytes[i].data, bytes[i].size, &patches[i]);
  }
  /* Bases in the first patch's table order, matched by name. */
  for (size_t i = 0; st == PULSE_OK && i < pulse_patch_tensor_count(patches[0]);
       i++) {
    pulse_patch_tensor pt;
    st = pulse_patch_tensor_get(patches[0], i, &pt);
    size_t k = 0;
    while (st == PULSE_OK && k < s.count &&
           strcmp(s.info[k].name, pt.info.name) != 0)
      k++;
    if (st == PULSE_OK && k == s.count)
      st =
          pulse_fail(PULSE_ERR_CORRUPT,
                     "catch-up: tensor '%s' is not in the state", pt.info.name);
    if (st == PULSE_OK)
      base[i] = s.bits[k];
  }
  if (st == PULSE_OK) {
    pulse_encode_opts eo;
    pulse_encode_opts_init(&eo);
    /* As the store's newest patch: its model, chunks and format version (a
     * worker that reads the store's patches reads its catch-ups). */
    eo.pos_model = pulse_patch_pos_model(patches[count - 1]);
    eo.chunk_log2 = pulse_patch_chunk_log2(patches[count - 1]);
    eo.format_version = pulse_patch_format_version(patches[count - 1]);
    eo.threads = srv->opts.catchup_threads;
    st = pulse_patch_squash((const pulse_patch *const *)patches, count, base,
                            &eo, out);
  }
  if (st == PULSE_OK &&
      (out->size < 96 ||
       memcmp(out->data + 64, pulse_store_head_state_digest(head)->bytes, 32) !=
           0)) {
    pulse_buffer_free(out);
    st = pulse_fail(PULSE_ERR_INTERNAL,
                    "catch-up: the squashed patch does not end at the head");
  }
  for (size_t i = 0; i < count; i++) {
    if (patches)
      pulse_patch_free(patches[i]);
    if (bytes)
      pulse_buffer_free(&bytes[i]);
  }
  free(bytes), free(patches), free(base);
  pulse_store_state_free(&s);
  srv_chain_free(&chain);
  return st;
}

int srv_catchup_path(char *buf, size_t cap, const char *dir,
                     const char *name) {
  int n = snprintf(buf, cap, "%s/" PULSE_STORE_CATCHUP_DIR "/%s", dir, name);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Keeps a built patch: on disk when the store is writable, else in memory. */
static pulse_status keep(pulse_server *srv, uint64_t from, uint64_t to,
                         const pulse_buffer *b, srv_catchup *c) {
  memset(c, 0, sizeof *c);
  c->from = from;
  c->to = to;
  memcpy(c->target, b->data + 64, 32); /* build() checked it is the head's */
  c->size = b->size;
  c->memfd = -1;
  store_sha256(b->data, b->size, c->sha256);
  char hex[65], name[128], path[4096], folder[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%s.pulse", hex);
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_CATCHUP_DIR, srv->dir);
  mkdir(folder, 0755);
  /* The cleaning must not see the object before its ref. */
  pthread_mutex_lock(&srv->catchup_files_lock);
  pulse_status st = srv_catchup_path(path, sizeof path, srv->dir, name) == 0
                        ? pulse_file_write_atomic(path, b->data, b->size)
                        : PULSE_ERR_ARG;
  if (st == PULSE_OK) {
    char ref[100];
    int len = snprintf(ref, sizeof ref, "%s %" PRIu64 "\n", hex, b->size);
    snprintf(name, sizeof name, "%" PRIu64 "-%" PRIu64 ".ref", from, to);
    st = srv_catchup_path(path, sizeof path, srv->dir, name) == 0
             ? pulse_file_write_atomic(path, ref, (size_t)len)
             : PULSE_ERR_ARG;
  }
  pthread_mutex_unlock(&srv->catchup_files_lock);
  if (st == PULSE_OK)
    return PULSE_OK;
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "server: catch-up %" PRIu64 "-%" PRIu64 " kept in memory: %s",
               from, to, pulse_error_detail());
  int fd = memfd_create("pulse-catchup", MFD_CLOEXEC);
  if (fd < 0)
    return pulse_fail(PULSE_ERR_IO, "server: memfd_create: %s",
                      strerror(errno));
  size_t done = 0;
  while (done < b->size) {
    ssize_t w = write(fd, b->data + done, b->size - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      close(fd);
      return pulse_fail(PULSE_ERR_IO, "server: memfd: %s", strerror(errno));
    }
    done += (size_t)w;
  }
  c->memfd = fd;
  return PULSE_OK;
}

/* A catch-up of this range another process (or an earlier run) cached. */
int srv_catchup_find_ref(pulse_server *srv, uint64_t from, uint64_t to,
                         srv_catchup *c) {
  char name[64], path[4096];
  snprintf(name, sizeof name, "%" PRIu64 "-%" PRIu64 ".ref", from, to);
  if (srv_catchup_path(path, sizeof path, srv->dir, name) != 0)
    return 0;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  char hex[65];
  uint64_t size;
  int ok = fscanf(f, "%64s %" SCNu64, hex, &size) == 2;
  fclose(f);
  memset(c, 0, sizeof *c);
  c->from = from;
  c->to = to;
  c->size = size;
  c->memfd = -1;
  return ok && store_unhex(hex, strlen(hex), c->sha256, 32) == 0;
}


/* Records the identity of the file behind fd: while it stays the same,
 * the bytes checked (or written) are the bytes served. */
static int note_identity(int fd, srv_catchup *c) {
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
      (uint64_t)sb.st_size != c->size)
    return -1;
  c->dev = sb.st_dev;
  c->ino = sb.st_ino;
  c->ctime = sb.st_ctim;
  return 0;
}

/* 1 when the file behind fd holds exactly the bytes c names (size and
 * SHA-256) and leads to c->target (a patch's target state digest is at
 * bytes 64..96, docs/formats/patch.md): a catch-up of this range cached
 * before a rollback or by another timeline is another step's. */
static int bytes_match(int fd, const srv_catchup *c) {
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
      (uint64_t)sb.st_size != c->size || c->size == 0 ||
      c->size > (uint64_t)SIZE_MAX)
    return 0;
  void *map = mmap(NULL, (size_t)c->size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (map == MAP_FAILED)
    return 0;
  uint8_t sha[32];
  store_sha256(map, (size_t)c->size, sha);
  int ok = memcmp(sha, c->sha256, 32) == 0 && c->size >= 96 &&
           memcmp((const uint8_t *)map + 64, c->target, 32) == 0;
  munmap(map, (size_t)c->size);
  return ok;
}

/* Removes a cached catch-up whose bytes do not match its name: its ref and
 * its object (a rebuild writes them again). */
static void drop_cached(pulse_server *srv, const srv_catchup *c) {
  char hex[65], name[128], path[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%" PRIu64 "-%" PRIu64 ".ref", c->from, c->to);
  if (srv_catchup_path(path, sizeof path, srv->dir, name) == 0)
    unlink(path);
  snprintf(name, sizeof name, "%s.pulse", hex);
  if (srv_catchup_path(path, sizeof path, srv->dir, name) == 0)
    unlink(path);
}

/* The cached catch-up of this range, checked against its hash: its fd, or
 * -1 (none, or a bad one, which is dropped). */
static int cached_checked(pulse_server *srv, const srv_head *h,
                          uint64_t from, srv_catchup *c) {
  if (!srv_catchup_find_ref(srv, from, h->step, c))
    return -1;
  memcpy(c->target, pulse_store_head_state_digest(h->head)->bytes, 32);
  uint64_t to = h->step;
  char hex[65], name[80], path[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%s.pulse", hex);
  if (srv_catchup_path(path, sizeof path, srv->dir, name) != 0)
    return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return -1;
  if (bytes_match(fd, c) && note_identity(fd, c) == 0)
    return fd;
  close(fd);
  atomic_fetch_add(&srv->metrics.catchup_corrupt, 1);
  PULSE_LOG_AT(PULSE_LOG_WARN,
               "server: cached catch-up %" PRIu64 "-%" PRIu64
               " (%s) does not match its SHA-256 or does not lead to the "
               "head's state: dropped, rebuilding",
               from, to, name);
  drop_cached(srv, c);
  return -1;
}

pulse_status srv_catchup_produce(pulse_server *srv, const srv_head *h,
                                 uint64_t from, srv_catchup *c, int *fd) {
  *fd = cached_checked(srv, h, from, c);
  if (*fd >= 0) {
    atomic_fetch_add(&srv->metrics.catchup_cache_hits, 1);
    return PULSE_OK;
  }
  double t0 = pulse_serve_now();
  pulse_buffer b = {NULL, 0};
  pulse_status st = build(srv, h->head, from, &b);
  if (st == PULSE_OK)
    st = keep(srv, from, h->step, &b, c);
  pulse_buffer_free(&b);
  if (st != PULSE_OK)
    return st;
  atomic_fetch_add(&srv->metrics.catchup_builds, 1);
  atomic_fetch_add(&srv->metrics.catchup_build_us,
                   (unsigned long long)((pulse_serve_now() - t0) * 1e6));
  if (c->memfd >= 0) {
    *fd = fcntl(c->memfd, F_DUPFD_CLOEXEC, 0);
  } else {
    char hex[65], name[80], path[4096];
    store_hex(c->sha256, 32, hex);
    snprintf(name, sizeof name, "%s.pulse", hex);
    if (srv_catchup_path(path, sizeof path, srv->dir, name) == 0)
      *fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (*fd >= 0 && note_identity(*fd, c) != 0) {
      close(*fd);
      *fd = -1;
    }
  }
  if (*fd < 0) {
    if (c->memfd >= 0)
      close(c->memfd);
    c->memfd = -1;
    return pulse_fail(PULSE_ERR_IO,
                      "server: the catch-up just written cannot be opened");
  }
  return PULSE_OK;
}
