/* server_objects.c - the server checks the object files it serves: an
 * object whose file changed on disk since the server first saw it (another
 * inode, size, mtime or ctime: rewritten, replaced, corrupted in place) is
 * hashed again before it is served, and one whose bytes no longer match
 * its name (SHA-256) is refused with 500 and logged, never served as if
 * valid (finding 11 of "Reliability and security": a relay that did not
 * follow served a rotted cache object for ever; the subscriber re-hashes
 * only at its own syncs).
 *
 * What "first saw" means: the identity each object named by a head has
 * when the server loads that head (a stat per object, no read), or, for an
 * object no loaded head named, when it is first requested. Whoever wrote
 * the object checked its bytes then (the publisher made them, the relay's
 * subscriber verified them). Rot that leaves the inode, size, mtime and
 * ctime alone (a disk's silent bit flip) is not seen here; receivers still
 * verify every object against its name.
 *
 * The table is bounded (SRV_OBJECTS_MAX entries; past it, it starts again
 * empty, and identities are taken again as objects are seen). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "endian_impl.h"
#include "pulse_log.h"
#include "server_impl.h"
#include "store_impl.h"

#define SRV_OBJECTS_MAX 65536u

struct srv_object_seen {
  uint8_t sha256[32]; /* all zero: a free slot */
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
  int bad; /* its bytes did not match its name with this identity */
  int used;
};

static int same_identity(const srv_object_seen *e, const struct stat *sb) {
  return e->dev == sb->st_dev && e->ino == sb->st_ino &&
         e->size == sb->st_size && e->mtime.tv_sec == sb->st_mtim.tv_sec &&
         e->mtime.tv_nsec == sb->st_mtim.tv_nsec &&
         e->ctime.tv_sec == sb->st_ctim.tv_sec &&
         e->ctime.tv_nsec == sb->st_ctim.tv_nsec;
}

static void set_identity(srv_object_seen *e, const struct stat *sb) {
  e->dev = sb->st_dev;
  e->ino = sb->st_ino;
  e->size = sb->st_size;
  e->mtime = sb->st_mtim;
  e->ctime = sb->st_ctim;
}

/* The slot of sha256 (used, or the free one where it would go); NULL when
 * the table cannot hold it. objects_lock held. */
static srv_object_seen *slot(pulse_server *srv, const uint8_t sha256[32],
                             int insert) {
  if (insert && (srv->objects_cap == 0 ||
                 2 * (srv->nobjects + 1) > srv->objects_cap)) {
    size_t cap = srv->objects_cap ? 2 * srv->objects_cap : 256;
    if (srv->nobjects + 1 > SRV_OBJECTS_MAX) { /* start again, empty */
      memset(srv->objects, 0, srv->objects_cap * sizeof *srv->objects);
      srv->nobjects = 0;
    } else {
      srv_object_seen *t = calloc(cap, sizeof *t);
      if (t == NULL)
        return NULL;
      for (size_t i = 0; i < srv->objects_cap; i++) {
        if (!srv->objects[i].used)
          continue;
        size_t j = (size_t)pulse_load_le64(srv->objects[i].sha256) & (cap - 1);
        while (t[j].used)
          j = (j + 1) & (cap - 1);
        t[j] = srv->objects[i];
      }
      free(srv->objects);
      srv->objects = t;
      srv->objects_cap = cap;
    }
  }
  if (srv->objects_cap == 0)
    return NULL;
  size_t j = (size_t)pulse_load_le64(sha256) & (srv->objects_cap - 1);
  while (srv->objects[j].used && memcmp(srv->objects[j].sha256, sha256, 32))
    j = (j + 1) & (srv->objects_cap - 1);
  return &srv->objects[j];
}

void srv_objects_note(pulse_server *srv, const uint8_t sha256[32],
                      const struct stat *sb) {
  pthread_mutex_lock(&srv->objects_lock);
  srv_object_seen *e = slot(srv, sha256, 1);
  if (e != NULL && !e->used) {
    memset(e, 0, sizeof *e);
    memcpy(e->sha256, sha256, 32);
    e->used = 1;
    set_identity(e, sb);
    srv->nobjects++;
  }
  pthread_mutex_unlock(&srv->objects_lock);
}

/* Opens objects/ once it exists (an empty store has none yet). */
void srv_objects_dir(pulse_server *srv) {
  if (srv->objects_fd < 0) {
    char objs[4096];
    snprintf(objs, sizeof objs, "%s/" PULSE_STORE_OBJECTS_DIR, srv->dir);
    int fd = open(objs, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      int expected = -1;
      /* Another thread may have opened it meanwhile: keep one. */
      if (!__atomic_compare_exchange_n(&srv->objects_fd, &expected, fd, 0,
                                       __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        close(fd);
    }
  }
}

void srv_objects_note_head(pulse_server *srv, const pulse_store_head *h) {
  srv_objects_dir(srv);
  size_t np = pulse_store_head_patch_count(h);
  size_t n = np + pulse_store_head_anchor_count(h);
  for (size_t i = 0; i < n; i++) {
    const pulse_store_object *o = i < np ? pulse_store_head_patch(h, i)
                                         : pulse_store_head_anchor(h, i - np);
    const char *name = strrchr(o->path, '/');
    struct stat sb;
    if (srv->objects_fd >= 0 && name != NULL &&
        fstatat(srv->objects_fd, name + 1, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISREG(sb.st_mode))
      srv_objects_note(srv, o->sha256, &sb);
  }
}

/* 1 when the file behind fd (sb->st_size bytes) hashes to sha256. */
static int bytes_match(int fd, const struct stat *sb,
                       const uint8_t sha256[32]) {
  uint8_t got[32];
  if (sb->st_size == 0) {
    store_sha256(NULL, 0, got);
  } else {
    if ((uint64_t)sb->st_size > (uint64_t)SIZE_MAX)
      return 0;
    void *map = mmap(NULL, (size_t)sb->st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
      return 0;
    store_sha256(map, (size_t)sb->st_size, got);
    munmap(map, (size_t)sb->st_size);
  }
  return memcmp(got, sha256, 32) == 0;
}

int srv_object_check(pulse_server *srv, int fd, const uint8_t sha256[32],
                     const struct stat *sb) {
  pthread_mutex_lock(&srv->objects_lock);
  srv_object_seen *e = slot(srv, sha256, 1);
  int known = e != NULL && e->used, same = known && same_identity(e, sb);
  int bad = same && e->bad;
  if (e != NULL && !known) { /* first seen: as its writer left it */
    memset(e, 0, sizeof *e);
    memcpy(e->sha256, sha256, 32);
    e->used = 1;
    set_identity(e, sb);
    srv->nobjects++;
  }
  pthread_mutex_unlock(&srv->objects_lock);
  if (!known || same)
    return !bad;
  /* Changed since: hashed again (off the lock; two requests may both). */
  int ok = bytes_match(fd, sb, sha256);
  pthread_mutex_lock(&srv->objects_lock);
  e = slot(srv, sha256, 1);
  if (e != NULL) {
    if (!e->used) {
      memset(e, 0, sizeof *e);
      memcpy(e->sha256, sha256, 32);
      e->used = 1;
      srv->nobjects++;
    }
    set_identity(e, sb);
    e->bad = !ok;
  }
  pthread_mutex_unlock(&srv->objects_lock);
  atomic_fetch_add(&srv->metrics.objects_rehashed, 1);
  if (!ok) {
    char hex[65];
    store_hex(sha256, 32, hex);
    atomic_fetch_add(&srv->metrics.objects_corrupt, 1);
    PULSE_LOG_AT(PULSE_LOG_ERROR,
                 "server: objects/%s changed on disk and no longer matches "
                 "its name (SHA-256): not served (500) until it is "
                 "replaced",
                 hex);
  }
  return ok;
}

void srv_objects_free(pulse_server *srv) {
  free(srv->objects);
  srv->objects = NULL;
  srv->objects_cap = srv->nobjects = 0;
}
