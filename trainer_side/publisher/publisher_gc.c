/* publisher_gc.c - removing what the head stopped naming, after a grace
 * period (issue 20, finding 5). A worker plans from the head it fetched;
 * when the publisher is fast and retention small, the objects of that plan
 * may leave the head while the worker downloads them. They stay in
 * objects/ (servers keep serving them: an object is served by name, not by
 * the head) for opts.grace_seconds after they left the head.
 *
 * The time an object left the head is the modification time of its file,
 * stamped when it leaves (its bytes never change): it outlives the
 * publisher, so that a restarted publisher's recovery keeps the objects
 * still in their grace (pulse_store_recover_grace) and this file takes them
 * back on its list (pub_gc_open). Servers and readers see nothing but
 * objects no head names, which they never needed to tell apart. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "publisher_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"

static double wall_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Removes an object file. A reader that has it open keeps reading; a crash
 * before this point leaves an unnamed object that a later recovery removes
 * once its grace is over. */
/* The path of the section index of the patch at rel (objects/...) into
 * path; 0 when rel is not a patch. */
static int index_of(const char *dir, const char *rel, char *path, size_t cap) {
  pulse_store_kind kind;
  uint8_t sha[32];
  const char *name = strrchr(rel, '/');
  char srel[PULSE_STORE_PATH_MAX + 16];
  if (name == NULL || !store_parse_object_name(name + 1, &kind, sha) ||
      kind != PULSE_STORE_PATCH)
    return 0;
  store_sections_path(sha, srel, sizeof srel);
  return store_join(path, cap, dir, srel) == 0;
}

static void remove_object(const char *dir, const char *rel) {
  char path[4096];
  if (store_join(path, sizeof path, dir, rel) != 0)
    return;
  if (unlink(path) != 0 && errno != ENOENT)
    PULSE_LOG_AT(PULSE_LOG_WARN, "publisher: removing %s: %s", path,
                 strerror(errno));
  /* A patch's section index goes with it. */
  if (index_of(dir, rel, path, sizeof path) && unlink(path) != 0 &&
      errno != ENOENT)
    PULSE_LOG_AT(PULSE_LOG_WARN, "publisher: removing %s: %s", path,
                 strerror(errno));
}

static int list_add(pulse_pub *pub, const char *rel, double since) {
  if (pub->nretired == pub->retired_cap) {
    size_t cap = pub->retired_cap ? 2 * pub->retired_cap : 64;
    pub_retired *r = realloc(pub->retired, cap * sizeof *r);
    if (r == NULL)
      return -1;
    pub->retired = r;
    pub->retired_cap = cap;
  }
  pub_retired *r = &pub->retired[pub->nretired++];
  snprintf(r->path, sizeof r->path, "%s", rel);
  r->since = since;
  return 0;
}

void pub_gc_sweep(pulse_pub *pub) {
  double now = wall_now();
  size_t k = 0;
  for (size_t i = 0; i < pub->nretired; i++) {
    if (pub->retired[i].since + pub->opts.grace_seconds <= now)
      remove_object(pub->dir, pub->retired[i].path);
    else
      pub->retired[k++] = pub->retired[i];
  }
  pub->nretired = k;
}

int pub_gc_due(const pulse_pub *pub) {
  double now = wall_now();
  for (size_t i = 0; i < pub->nretired; i++)
    if (pub->retired[i].since + pub->opts.grace_seconds <= now)
      return 1;
  return 0;
}

void pub_gc_retire(pulse_pub *pub, const pulse_store_object *list, size_t n) {
  double now = wall_now();
  for (size_t i = 0; i < n; i++) {
    if (!(pub->opts.grace_seconds > 0)) {
      remove_object(pub->dir, list[i].path);
      continue;
    }
    char path[4096];
    if (store_join(path, sizeof path, pub->dir, list[i].path) != 0)
      continue;
    /* The mtime says when it left the head (the atime is left alone); its
     * section index's too, so that after a restart the index is kept as
     * long as its patch (a later recovery goes by the files' mtimes). */
    struct timespec times[2] = {{0, UTIME_OMIT}, {0, UTIME_NOW}};
    if (utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT)
        PULSE_LOG_AT(PULSE_LOG_WARN, "publisher: retiring %s: %s", path,
                     strerror(errno));
      continue;
    }
    if (index_of(pub->dir, list[i].path, path, sizeof path))
      (void)utimensat(AT_FDCWD, path, times, AT_SYMLINK_NOFOLLOW);
    if (list_add(pub, list[i].path, now) != 0)
      PULSE_LOG_AT(PULSE_LOG_WARN,
                   "publisher: out of memory: %s stays until the next "
                   "recovery after its grace period",
                   path);
  }
  pub_gc_sweep(pub);
}

static pulse_status add_kept(void *ctx, const char *folder, const char *name,
                             store_stray_kind kind) {
  pulse_pub *pub = ctx;
  if (kind != STORE_STRAY_ORPHAN)
    return PULSE_OK;
  char path[4096], rel[PULSE_STORE_PATH_MAX];
  struct stat sb;
  if (store_join(path, sizeof path, folder, name) != 0 ||
      lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
    return PULSE_OK;
  /* objects/ or sections/ (an index whose patch left before a restart) */
  const char *sub = strrchr(folder, '/');
  snprintf(rel, sizeof rel, "%s/%s", sub != NULL ? sub + 1 : folder, name);
  double since = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
  if (list_add(pub, rel, since) != 0)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: retired objects");
  return PULSE_OK;
}

pulse_status pub_gc_open(pulse_pub *pub) {
  if (!(pub->opts.grace_seconds > 0))
    return PULSE_OK; /* recovery removed them all */
  return store_strays(pub->dir, pub->head, 0, add_kept, pub);
}

void pub_gc_free(pulse_pub *pub) {
  free(pub->retired);
  pub->retired = NULL;
  pub->nretired = pub->retired_cap = 0;
}
