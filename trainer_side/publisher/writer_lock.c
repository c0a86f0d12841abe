/* writer_lock.c - the store's writer lock (writer_lock_impl.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#include "status_impl.h"
#include "store_impl.h"
#include "writer_lock_impl.h"

/* F_OFD_SETLK: the lock belongs to this open file, so a second publisher in
 * the same process is refused too (a POSIX lock would be shared by the
 * process); NFS carries it to the server like a POSIX lock. Kernels
 * without OFD locks fall back to flock. */
static int try_lock(int fd) {
#ifdef F_OFD_SETLK
  struct flock fl;
  memset(&fl, 0, sizeof fl);
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
    return 0;
  if (errno != EINVAL)
    return -1;
#endif
  return flock(fd, LOCK_EX | LOCK_NB);
}

static void holder_read(int fd, char *out, size_t cap) {
  ssize_t n = pread(fd, out, cap - 1, 0);
  if (n <= 0) {
    snprintf(out, cap, "a writer that has not named itself yet");
    return;
  }
  out[n] = '\0';
  out[strcspn(out, "\n")] = '\0';
}

pulse_status pub_writer_lock(const char *dir, int *out) {
  char path[4096];
  *out = -1;
  if (store_join(path, sizeof path, dir, PUB_WRITER_LOCK_FILE) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0)
    return pulse_fail(PULSE_ERR_IO, "store: %s: %s", path, strerror(errno));
  if (try_lock(fd) != 0) {
    int e = errno;
    char holder[256];
    holder_read(fd, holder, sizeof holder);
    close(fd);
    if (e == EWOULDBLOCK || e == EAGAIN || e == EACCES)
      return pulse_fail(PULSE_ERR_IO,
                        "store: %s already has a writer (%s): one publisher "
                        "per store; refused before writing anything",
                        dir, holder);
    return pulse_fail(PULSE_ERR_IO, "store: locking %s: %s", path,
                      strerror(e));
  }
  char host[256] = "?";
  if (gethostname(host, sizeof host - 1) != 0)
    snprintf(host, sizeof host, "?");
  host[sizeof host - 1] = '\0';
  char line[512];
  int len = snprintf(line, sizeof line, "pid %ld on host %s since %lld\n",
                     (long)getpid(), host, (long long)time(NULL));
  /* The name is for the message of a refused writer; the lock is the
   * kernel's, so a failed write here is no reason to refuse. */
  if (ftruncate(fd, 0) != 0 || pwrite(fd, line, (size_t)len, 0) != len)
    (void)0;
  *out = fd;
  return PULSE_OK;
}

void pub_writer_unlock(int fd) {
  if (fd >= 0)
    close(fd);
}
