/* store_recover.c - bringing a store folder into a clean state after a
 * crash (pulse_store_writer.h). Only the store's single writer removes
 * files, so this lives with the publisher; what a stray is, is the layout
 * check of codec/store/store_check.c that readers share. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pulse_log.h"
#include "pulse_store_writer.h"
#include "status_impl.h"
#include "store_impl.h"
#include "writer_lock_impl.h"

static pulse_status ensure_dir(const char *path) {
  if (mkdir(path, 0755) == 0 || errno == EEXIST) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
      return PULSE_OK;
    return pulse_fail(PULSE_ERR_IO, "store: %s exists and is not a folder",
                      path);
  }
  return pulse_fail(PULSE_ERR_IO, "store: %s: %s", path, strerror(errno));
}

typedef struct {
  pulse_store_recovery rec;
  double grace, now; /* wall-clock seconds */
} recovery_walk;

/* 1 when an unnamed object left the head less than the grace ago. */
static int in_grace(const recovery_walk *w, const char *path) {
  struct stat sb;
  if (w->grace <= 0 || lstat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
    return 0;
  double mtime = (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec;
  return mtime + w->grace > w->now;
}

static pulse_status remove_stray(void *ctx, const char *folder,
                                 const char *name, store_stray_kind kind) {
  recovery_walk *w = ctx;
  pulse_store_recovery *rec = &w->rec;
  char path[4096];
  if (store_join(path, sizeof path, folder, name) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: name too long");
  if (kind == STORE_STRAY_ORPHAN && in_grace(w, path)) {
    rec->retiring++;
    return PULSE_OK;
  }
  if (kind == STORE_STRAY_TEMPORARY)
    rec->temporaries++;
  else if (kind == STORE_STRAY_ORPHAN)
    rec->orphans++;
  else
    rec->catchups++;
  if (unlink(path) != 0 && errno != ENOENT)
    return pulse_fail(PULSE_ERR_IO, "store: removing %s: %s", path,
                      strerror(errno));
  PULSE_LOG_AT(PULSE_LOG_INFO, "store: removed %s", path);
  return PULSE_OK;
}

pulse_status pulse_store_recover(const char *dir, pulse_store_recovery *out) {
  return pulse_store_recover_grace(dir, 0, out);
}

pulse_status pub_store_dirs(const char *dir) {
  char path[4096];
  PULSE_TRY(ensure_dir(dir));
  if (store_join(path, sizeof path, dir, PULSE_STORE_OBJECTS_DIR) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  PULSE_TRY(ensure_dir(path));
  if (store_join(path, sizeof path, dir, PULSE_STORE_CATCHUP_DIR) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  return ensure_dir(path);
}

pulse_status pulse_store_recover_grace(const char *dir, double grace_seconds,
                                       pulse_store_recovery *out) {
  if (dir == NULL || !(grace_seconds >= 0))
    return pulse_fail(PULSE_ERR_ARG,
                      "store: NULL folder or negative grace period");
  PULSE_TRY(pub_store_dirs(dir));
  /* A live publisher's temporaries are not a crash's: refused while one
   * holds the store. */
  int lock = -1;
  PULSE_TRY(pub_writer_lock(dir, &lock));
  pulse_status st = pub_store_recover_held(dir, grace_seconds, out);
  pub_writer_unlock(lock);
  return st;
}

pulse_status pub_store_recover_held(const char *dir, double grace_seconds,
                                    pulse_store_recovery *out) {
  PULSE_TRY(pub_store_dirs(dir));

  pulse_store_head *head = NULL;
  pulse_status st = pulse_store_head_load(dir, &head);
  if (st != PULSE_OK && st != PULSE_ERR_NOT_FOUND)
    return st;
  /* Check before removing anything: a head naming a missing object means the
   * store was damaged from outside, and deleting more would not help. */
  for (size_t i = 0; head && i < head->npatches && st == PULSE_OK; i++)
    st = store_check_named(dir, &head->patches[i]);
  for (size_t i = 0; head && i < head->nanchors && st == PULSE_OK; i++)
    st = store_check_named(dir, &head->anchors[i]);
  if (st == PULSE_ERR_NOT_FOUND && head != NULL)
    st = PULSE_ERR_CORRUPT; /* same detail: a named object is missing */
  if (st != PULSE_OK && st != PULSE_ERR_NOT_FOUND) {
    pulse_store_head_free(head);
    return st;
  }
  recovery_walk w;
  memset(&w, 0, sizeof w);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  w.grace = grace_seconds;
  w.now = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  st = store_strays(dir, head, 1, remove_stray, &w);
  pulse_store_head_free(head);
  pulse_store_recovery rec = w.rec;
  if (out != NULL)
    *out = rec;
  if (st == PULSE_OK && (rec.temporaries || rec.orphans))
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "store: %s: recovered (%zu temporary files, %zu unnamed "
                 "objects removed)",
                 dir, rec.temporaries, rec.orphans);
  return st;
}
