/* store_check.c - loading the head from a folder, the layout checks both
 * sides make (named objects present, strays found) and read-only
 * verification of a store (pulse_store.h). Crash recovery, which removes the
 * strays, belongs to the store's single writer: trainer_side/publisher/store_recover.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"
#include "store_state_impl.h"

pulse_status pulse_store_head_load(const char *dir, pulse_store_head **out) {
  if (dir == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "store: NULL argument");
  *out = NULL;
  char path[4096];
  if (store_join(path, sizeof path, dir, PULSE_STORE_HEAD_FILE) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "store: %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "store: %s: not a regular file", path);
  }
  if ((uint64_t)sb.st_size > PULSE_STORE_MAX_HEAD_BYTES) {
    close(fd);
    return pulse_fail(PULSE_ERR_OVERFLOW, "store: %s: %lld bytes (at most %zu)",
                      path, (long long)sb.st_size, PULSE_STORE_MAX_HEAD_BYTES);
  }
  size_t size = (size_t)sb.st_size, got = 0;
  uint8_t *buf = malloc(size + 1);
  if (buf == NULL) {
    close(fd);
    return pulse_fail(PULSE_ERR_NOMEM, "store: %s", path);
  }
  while (got < size) {
    ssize_t n = read(fd, buf + got, size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += (size_t)n;
  }
  close(fd);
  pulse_status st =
      got == size ? pulse_store_head_parse(buf, size, out)
                  : pulse_fail(PULSE_ERR_IO, "store: %s: short read", path);
  free(buf);
  return st;
}

pulse_status store_check_named(const char *dir, const pulse_store_object *o) {
  char path[4096];
  if (store_join(path, sizeof path, dir, o->path) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  struct stat sb;
  if (lstat(path, &sb) != 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "store: %s named by the head (step %" PRIu64 "): %s",
                      o->path, o->step, strerror(errno));
  if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size != o->size)
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "store: %s named by the head has %lld bytes, the head says %" PRIu64,
        o->path, (long long)sb.st_size, o->size);
  return PULSE_OK;
}

static int head_names(const pulse_store_head *h, pulse_store_kind kind,
                      const uint8_t sha[32]) {
  if (h == NULL)
    return 0;
  const pulse_store_object *list =
      kind == PULSE_STORE_PATCH ? h->patches : h->anchors;
  size_t n = kind == PULSE_STORE_PATCH ? h->npatches : h->nanchors;
  for (size_t i = 0; i < n; i++)
    if (memcmp(list[i].sha256, sha, 32) == 0)
      return 1;
  return 0;
}

/* Calls fn for every entry of DIR/sub but "." and "..". */
static pulse_status scan(const char *dir, const char *sub,
                         pulse_status (*fn)(void *ctx, const char *folder,
                                            const char *name),
                         void *ctx) {
  char folder[4096];
  if (store_join(folder, sizeof folder, dir, sub) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  DIR *d = opendir(folder);
  if (d == NULL)
    return errno == ENOENT ? PULSE_OK
                           : pulse_fail(PULSE_ERR_IO, "store: %s: %s", folder,
                                        strerror(errno));
  pulse_status st = PULSE_OK;
  for (struct dirent *e; st == PULSE_OK && (e = readdir(d)) != NULL;) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    st = fn(ctx, folder, e->d_name);
  }
  closedir(d);
  return st;
}

typedef struct {
  const pulse_store_head *head;
  store_stray_fn fn;
  void *ctx;
} stray_walk;

static pulse_status walk_root(void *vctx, const char *folder,
                              const char *name) {
  stray_walk *w = vctx;
  if (!store_is_temp_name(name))
    return PULSE_OK;
  return w->fn(w->ctx, folder, name, STORE_STRAY_TEMPORARY);
}

static pulse_status walk_objects(void *vctx, const char *folder,
                                 const char *name) {
  stray_walk *w = vctx;
  pulse_store_kind kind;
  uint8_t sha[32];
  if (store_is_temp_name(name))
    return w->fn(w->ctx, folder, name, STORE_STRAY_TEMPORARY);
  if (!store_parse_object_name(name, &kind, sha)) {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "store: %s/%s is not an object name; left alone", folder,
                 name);
    return PULSE_OK;
  }
  if (head_names(w->head, kind, sha))
    return PULSE_OK;
  return w->fn(w->ctx, folder, name, STORE_STRAY_ORPHAN);
}

/* A patch's section index is kept while its patch is named. */
static pulse_status walk_sections(void *vctx, const char *folder,
                                  const char *name) {
  stray_walk *w = vctx;
  uint8_t sha[32];
  if (store_is_temp_name(name))
    return w->fn(w->ctx, folder, name, STORE_STRAY_TEMPORARY);
  if (!store_sections_parse_name(name, sha)) {
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "store: %s/%s is not a section index name; left alone",
                 folder, name);
    return PULSE_OK;
  }
  if (head_names(w->head, PULSE_STORE_PATCH, sha))
    return PULSE_OK;
  return w->fn(w->ctx, folder, name, STORE_STRAY_ORPHAN);
}

static pulse_status walk_catchup(void *vctx, const char *folder,
                                 const char *name) {
  stray_walk *w = vctx;
  return w->fn(w->ctx, folder, name, STORE_STRAY_CATCHUP);
}

pulse_status store_strays(const char *dir, const pulse_store_head *head,
                          int catchups, store_stray_fn fn, void *ctx) {
  stray_walk w = {head, fn, ctx};
  pulse_status st = scan(dir, ".", walk_root, &w);
  if (st == PULSE_OK)
    st = scan(dir, PULSE_STORE_OBJECTS_DIR, walk_objects, &w);
  if (st == PULSE_OK)
    st = scan(dir, STORE_SECTIONS_DIR, walk_sections, &w);
  if (st == PULSE_OK && catchups)
    st = scan(dir, PULSE_STORE_CATCHUP_DIR, walk_catchup, &w);
  return st;
}

static pulse_status check_hash(const char *dir, const pulse_store_object *o) {
  char path[4096];
  uint8_t sha[32];
  uint64_t size = 0;
  if (store_join(path, sizeof path, dir, o->path) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  PULSE_TRY(pulse_store_file_sha256(path, sha, &size));
  if (memcmp(sha, o->sha256, 32) != 0 || size != o->size)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "store: %s: content does not match its SHA-256 name",
                      o->path);
  return PULSE_OK;
}

/* A patch's section index, when there is one: signed by the head's key
 * (or the key the head rotated from), naming the patch, and every hash
 * right. *checked counts those found. */
static pulse_status check_sections(const char *dir, const pulse_store_head *h,
                                   const pulse_store_object *o, size_t *checked) {
  char rel[PULSE_STORE_PATH_MAX + 16], path[4096];
  store_sections_path(o->sha256, rel, sizeof rel);
  if (store_join(path, sizeof path, dir, rel) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return PULSE_OK; /* optional: workers fetch the patch whole */
  /* A table entry takes more than 32 bytes: no index is larger than this. */
  size_t cap = store_sections_size(o->size / 32 + 1);
  uint8_t *b = cap != 0 ? malloc(cap + 1) : NULL, *pb = NULL;
  size_t n = b != NULL ? fread(b, 1, cap + 1, f) : 0;
  fclose(f);
  store_sections s;
  memset(&s, 0, sizeof s);
  pulse_status st = b == NULL ? pulse_fail(PULSE_ERR_NOMEM, "store: %s", rel)
                              : store_sections_parse(b, n, &s);
  if (st == PULSE_OK && h->is_signed && !s.is_signed)
    st = pulse_fail(PULSE_ERR_CORRUPT, "unsigned in a signed store");
  /* Signed by a key the head does not name (two rotations ago): workers
   * refuse it and fetch the patch whole, which is not a fault. */
  if (st == PULSE_OK && h->is_signed &&
      memcmp(s.pub, h->pub, PULSE_KEY_BYTES) != 0 &&
      !(h->rotation.present &&
        memcmp(s.pub, h->rotation.from, PULSE_KEY_BYTES) == 0))
    PULSE_LOG_AT(PULSE_LOG_WARN,
                 "store: %s is signed by a key the head does not name: "
                 "workers fetch its patch whole",
                 rel);
  if (st == PULSE_OK && (memcmp(s.patch_sha256, o->sha256, 32) != 0 ||
                         s.patch_size != o->size))
    st = pulse_fail(PULSE_ERR_CORRUPT, "it names another patch");
  if (st == PULSE_OK && (uint64_t)o->size > SIZE_MAX)
    st = pulse_fail(PULSE_ERR_OVERFLOW, "patch too large");
  if (st == PULSE_OK && (pb = malloc((size_t)o->size + 1)) == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "store: %s", o->path);
  if (st == PULSE_OK) {
    char ppath[4096];
    FILE *pf = store_join(ppath, sizeof ppath, dir, o->path) == 0 ? fopen(ppath, "rb") : NULL;
    size_t got = pf != NULL ? fread(pb, 1, (size_t)o->size + 1, pf) : 0;
    if (pf != NULL)
      fclose(pf);
    st = got == o->size ? store_sections_check_patch(&s, pb, got)
                        : pulse_fail(PULSE_ERR_IO, "cannot read %s", o->path);
  }
  free(pb);
  free(b);
  store_sections_free(&s);
  if (st != PULSE_OK) {
    char why[512];
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    return pulse_fail(PULSE_ERR_CORRUPT, "store: %s: %s", rel, why);
  }
  ++*checked;
  return PULSE_OK;
}

static pulse_status count_stray(void *ctx, const char *folder, const char *name,
                                store_stray_kind kind) {
  (void)folder, (void)name, (void)kind;
  ++*(size_t *)ctx;
  return PULSE_OK;
}

typedef struct {
  const char *dir;
  const pulse_store_head *head;
} anchor_check;

static pulse_status check_anchor_hook(void *vctx, const pulse_store_state *s) {
  anchor_check *c = vctx;
  for (size_t i = 1; i < c->head->nanchors; i++) {
    if (c->head->anchors[i].step != s->step)
      continue;
    pulse_store_state a = PULSE_STORE_STATE_INIT;
    PULSE_TRY(store_anchor_load(c->dir, &c->head->anchors[i], 0, &a));
    int same =
        memcmp(&a.state_digest, &s->state_digest, sizeof a.state_digest) == 0;
    pulse_store_state_free(&a);
    if (!same)
      return pulse_fail(PULSE_ERR_CORRUPT,
                        "store: anchor at step %" PRIu64
                        " does not hold the state its patches give",
                        s->step);
  }
  return PULSE_OK;
}

pulse_status pulse_store_verify(const char *dir, unsigned flags,
                                const uint8_t *pinned,
                                pulse_store_verify_figures *out) {
  if (dir == NULL)
    return pulse_fail(PULSE_ERR_ARG, "store: NULL folder");
  pulse_store_head *head = NULL;
  PULSE_TRY(pulse_store_head_load(dir, &head));
  pulse_store_verify_figures r;
  memset(&r, 0, sizeof r);
  r.head_step = head->step;
  r.oldest_step = pulse_store_head_oldest_step(head);
  r.patches = head->npatches;
  r.anchors = head->nanchors;
  r.head_signed = head->is_signed;
  store_hex(head->digest.bytes, 32, r.state_digest_hex);
  pulse_status st = PULSE_OK;
  if (pinned != NULL &&
      (!head->is_signed ||
       memcmp(pinned, head->pub, PULSE_KEY_BYTES) != 0))
    st = pulse_fail(PULSE_ERR_CORRUPT, "store: the head is %s",
                    head->is_signed ? "signed by another key" : "not signed");
  size_t nsections = 0; /* section indexes checked */
  const pulse_store_object *lists[2] = {head->patches, head->anchors};
  size_t counts[2] = {head->npatches, head->nanchors};
  for (int l = 0; l < 2; l++)
    for (size_t i = 0; i < counts[l] && st == PULSE_OK; i++) {
      st = store_check_named(dir, &lists[l][i]);
      if (st == PULSE_OK && (flags & PULSE_STORE_VERIFY_HASHES))
        st = check_hash(dir, &lists[l][i]);
      if (st == PULSE_OK && l == 0 && (flags & PULSE_STORE_VERIFY_HASHES))
        st = check_sections(dir, head, &lists[l][i], &nsections);
      r.object_bytes += lists[l][i].size;
    }
  if (st == PULSE_OK && (flags & PULSE_STORE_VERIFY_STATE)) {
    /* Replay every patch from the oldest anchor; every later anchor must
     * hold the state the patches give at its step. */
    anchor_check ac = {dir, head};
    pulse_store_state s = PULSE_STORE_STATE_INIT;
    st = store_state_replay(dir, head, 0, head->step, 0, check_anchor_hook, &ac,
                            &s);
    pulse_store_state_free(&s);
  }
  if (st == PULSE_OK)
    st = store_strays(dir, head, 0, count_stray, &r.strays);
  if (st == PULSE_OK && (flags & PULSE_STORE_VERIFY_HASHES))
    PULSE_LOG_AT(PULSE_LOG_INFO, "store: %zu section indexes checked", nsections);
  pulse_store_head_free(head);
  if (out != NULL)
    *out = r;
  return st;
}
