/* atomic_file.c - crash-safe file replacement (pulse_file.h). */
#include "pulse_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "status_impl.h"

struct pulse_atomic_file {
  char *path;
  char *tmp;
  int fd;
};

/* Opens a new temporary file next to `path`; *tmp_out is malloc'd. */
static pulse_status create_temp(const char *path, char **tmp_out, int *fd_out) {
  static atomic_uint counter;
  const char *slash = strrchr(path, '/');
  size_t dir_len = slash == NULL ? 0 : (size_t)(slash - path) + 1;
  const char *base = path + dir_len;
  size_t cap = strlen(path) + 64;
  char *tmp = malloc(cap);
  if (tmp == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file: temporary name");
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  for (int attempt = 0; attempt < 100; attempt++) {
    unsigned c = atomic_fetch_add(&counter, 1u);
    snprintf(tmp, cap, "%.*s.%s.tmp-%ld-%u-%lx", (int)dir_len, path, base,
             (long)getpid(), c, (unsigned long)ts.tv_nsec);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      /* Held until the file is renamed or removed: a cleaner
       * (pulse_atomic_file_clean) that can take it knows the writer is gone. */
      (void)flock(fd, LOCK_EX | LOCK_NB);
      *tmp_out = tmp;
      *fd_out = fd;
      return PULSE_OK;
    }
    if (errno != EEXIST) {
      pulse_status st = pulse_fail(PULSE_ERR_IO, "file: %s: %s", tmp, strerror(errno));
      free(tmp);
      return st;
    }
  }
  free(tmp);
  return pulse_fail(PULSE_ERR_IO, "file: %s: no free temporary name", path);
}

static pulse_status fsync_dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir;
  if (slash == NULL) {
    dir = strdup(".");
  } else {
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    dir = strndup(path, n);
  }
  if (dir == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file: directory name");
  pulse_status st = PULSE_OK;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
    st = pulse_fail(PULSE_ERR_IO, "file: %s: fsync of the directory after the rename: %s", dir,
                    strerror(errno));
  if (fd >= 0)
    close(fd);
  free(dir);
  return st;
}

pulse_status pulse_atomic_file_create(const char *path, pulse_atomic_file **out) {
  if (out == NULL || path == NULL || path[0] == '\0' || path[strlen(path) - 1] == '/')
    return pulse_fail(PULSE_ERR_ARG, "file: bad output path '%s'", path == NULL ? "(null)" : path);
  *out = NULL;
  pulse_atomic_file *f = calloc(1, sizeof *f);
  if (f == NULL || (f->path = strdup(path)) == NULL) {
    free(f);
    return pulse_fail(PULSE_ERR_NOMEM, "file: %s", path);
  }
  pulse_status st = create_temp(path, &f->tmp, &f->fd);
  if (st != PULSE_OK) {
    free(f->path);
    free(f);
    return st;
  }
  *out = f;
  return PULSE_OK;
}

pulse_status pulse_atomic_file_write(pulse_atomic_file *f, const void *data, uint64_t n) {
  const uint8_t *p = data;
  while (n > 0) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : (size_t)n;
    ssize_t w = write(f->fd, p, chunk);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return pulse_fail(PULSE_ERR_IO, "file: %s: write: %s", f->path,
                        w < 0 ? strerror(errno) : "no progress");
    p += w;
    n -= (uint64_t)w;
  }
  return PULSE_OK;
}

static void handle_free(pulse_atomic_file *f) {
  free(f->path);
  free(f->tmp);
  free(f);
}

void pulse_atomic_file_abort(pulse_atomic_file *f) {
  if (f == NULL)
    return;
  unlink(f->tmp); /* before the close drops the writer's lock */
  if (f->fd >= 0)
    close(f->fd);
  handle_free(f);
}

pulse_status pulse_atomic_file_commit(pulse_atomic_file *f) {
  if (f == NULL)
    return pulse_fail(PULSE_ERR_ARG, "file: NULL handle");
  /* Renamed before it is closed: the writer's lock stays on the temporary
   * until it has its final name, so a cleaner never takes it for a dead
   * writer's. */
  const char *what = "fsync";
  int ok = fsync(f->fd) == 0;
  int e = errno;
  if (ok) {
    what = "rename";
    ok = rename(f->tmp, f->path) == 0;
    e = errno;
  }
  if (!ok) {
    pulse_status st = pulse_fail(PULSE_ERR_IO, "file: %s: %s: %s", f->path, what, strerror(e));
    pulse_atomic_file_abort(f);
    return st;
  }
  close(f->fd); /* after fsync there is nothing left for close to report */
  f->fd = -1;
  pulse_status st = fsync_dir_of(f->path);
  handle_free(f);
  return st;
}

pulse_status pulse_file_write_atomic(const char *path, const void *data, size_t size) {
  pulse_atomic_file *f = NULL;
  PULSE_TRY(pulse_atomic_file_create(path, &f));
  pulse_status st = pulse_atomic_file_write(f, data, size);
  if (st != PULSE_OK) {
    pulse_atomic_file_abort(f);
    return st;
  }
  return pulse_atomic_file_commit(f);
}

/* ------------------------------------------------------------- cleaning */

/* Whether `name` is one of create_temp's names for the destination named
 * `base`: ".BASE.tmp-PID-COUNTER-HEX"; *pid gets PID. */
static int is_our_temp(const char *name, const char *base, long *pid) {
  size_t bl = strlen(base);
  if (name[0] != '.' || strncmp(name + 1, base, bl) != 0 || strncmp(name + 1 + bl, ".tmp-", 5) != 0)
    return 0;
  const char *p = name + 1 + bl + 5;
  char *end;
  errno = 0;
  long v = strtol(p, &end, 10);
  if (end == p || *end != '-' || errno != 0 || v <= 0)
    return 0;
  p = end + 1;
  strtoul(p, &end, 10);
  if (end == p || *end != '-')
    return 0;
  p = end + 1;
  strtoul(p, &end, 16);
  if (end == p || *end != '\0')
    return 0;
  *pid = v;
  return 1;
}

/* A temporary nobody writes any more: its lock is free (the writer holds it
 * from creation to rename) and either its writer's pid is gone or it has not
 * changed for a while (the pid may be reused, or from another namespace;
 * the while covers the instant between a writer's create and lock). */
static int abandoned(const char *tmp, long pid) {
  int fd = open(tmp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return 0;
  struct stat sb;
  int free_lock = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && flock(fd, LOCK_EX | LOCK_NB) == 0;
  close(fd); /* drops the lock at once */
  if (!free_lock)
    return 0;
  int gone = kill((pid_t)pid, 0) != 0 && errno == ESRCH;
  return gone || time(NULL) - sb.st_mtime >= 2;
}

pulse_status pulse_atomic_file_clean(const char *path, unsigned *removed) {
  if (removed != NULL)
    *removed = 0;
  if (path == NULL || path[0] == '\0' || path[strlen(path) - 1] == '/')
    return pulse_fail(PULSE_ERR_ARG, "file: bad output path '%s'", path == NULL ? "(null)" : path);
  const char *slash = strrchr(path, '/');
  size_t dir_len = slash == NULL ? 0 : (size_t)(slash - path) + 1;
  const char *base = path + dir_len;
  char *dir = dir_len == 0 ? strdup(".") : strndup(path, dir_len);
  if (dir == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file: directory name");
  DIR *d = opendir(dir);
  if (d == NULL) {
    int e = errno;
    free(dir);
    if (e == ENOENT)
      return PULSE_OK; /* no directory: no temporaries */
    return pulse_fail(PULSE_ERR_IO, "file: %s: %s", path, strerror(e));
  }
  pulse_status st = PULSE_OK;
  size_t cap = strlen(path) + 300;
  char *tmp = malloc(cap);
  if (tmp == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "file: temporary name");
  struct dirent *e;
  unsigned n = 0;
  while (st == PULSE_OK && (e = readdir(d)) != NULL) {
    long pid;
    if (!is_our_temp(e->d_name, base, &pid))
      continue;
    snprintf(tmp, cap, "%.*s%s", (int)dir_len, path, e->d_name);
    if (abandoned(tmp, pid) && unlink(tmp) == 0)
      n++;
  }
  closedir(d);
  free(tmp);
  free(dir);
  if (removed != NULL)
    *removed = n;
  return st;
}
