/* publisher_write.c - durable writes in two halves (publisher_impl.h): the
 * bytes go to a temporary file whose data is made durable first, the rename
 * and the folder's fsync come later, so that a commit can stage its patch
 * and its head at the same time and still make the patch durable under its
 * name before the head that names it. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "publisher_impl.h"
#include "status_impl.h"
#include "store_impl.h"

static pulse_status fsync_folder_of(const char *path) {
  char folder[sizeof((pub_staged *)0)->tmp];
  const char *slash = strrchr(path, '/');
  size_t n = slash == NULL ? 0 : (size_t)(slash - path);
  if (n >= sizeof folder)
    return pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  if (n == 0)
    snprintf(folder, sizeof folder, "%s", slash == path ? "/" : ".");
  else
    snprintf(folder, sizeof folder, "%.*s", (int)n, path);
  int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL)) {
    pulse_status st =
        pulse_fail(PULSE_ERR_IO, "publisher: %s: fsync after a rename: %s",
                   folder, strerror(errno));
    if (fd >= 0)
      close(fd);
    return st;
  }
  close(fd);
  return PULSE_OK;
}

pulse_status pub_staged_write(const char *folder, const char *hint,
                              const void *data, size_t n, pub_staged *out) {
  static atomic_uint counter;
  out->tmp[0] = '\0';
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
    /* ".NAME.tmp-*": what recovery removes (store_is_temp_name). */
    int len = snprintf(out->tmp, sizeof out->tmp, "%s/.%s.tmp-%ld-%u", folder,
                       hint, (long)getpid(), atomic_fetch_add(&counter, 1u));
    if (len < 0 || (size_t)len >= sizeof out->tmp) {
      out->tmp[0] = '\0';
      return pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
    }
    fd = open(out->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) {
      pulse_status st = pulse_fail(PULSE_ERR_IO, "publisher: %s: %s", out->tmp,
                                   strerror(errno));
      out->tmp[0] = '\0';
      return st;
    }
  }
  if (fd < 0) {
    out->tmp[0] = '\0';
    return pulse_fail(PULSE_ERR_IO, "publisher: %s: no free temporary name",
                      folder);
  }
  const char *what = NULL;
  int e = 0;
  for (const uint8_t *p = data; n > 0 && what == NULL;) {
    size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
    ssize_t w = write(fd, p, chunk);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      what = "write";
      e = w < 0 ? errno : EIO;
      break;
    }
    p += w;
    n -= (size_t)w;
  }
  /* The data and what is needed to read it back (the size); the name is
   * made durable by the folder's fsync after the rename. */
  if (what == NULL && fdatasync(fd) != 0) {
    what = "fdatasync";
    e = errno;
  }
  if (close(fd) != 0 && what == NULL) {
    what = "close";
    e = errno;
  }
  if (what != NULL) {
    pulse_status st = pulse_fail(PULSE_ERR_IO, "publisher: %s: %s: %s",
                                 out->tmp, what, strerror(e));
    pub_staged_drop(out);
    return st;
  }
  return PULSE_OK;
}

pulse_status pub_staged_publish(pub_staged *s, const char *final,
                                int *renamed) {
  *renamed = 0;
  if (rename(s->tmp, final) != 0) {
    pulse_status st = pulse_fail(PULSE_ERR_IO, "publisher: rename to %s: %s",
                                 final, strerror(errno));
    pub_staged_drop(s);
    return st;
  }
  s->tmp[0] = '\0';
  *renamed = 1;
  return fsync_folder_of(final);
}

void pub_staged_drop(pub_staged *s) {
  if (s != NULL && s->tmp[0] != '\0')
    unlink(s->tmp);
  if (s != NULL)
    s->tmp[0] = '\0';
}

static void *stage_main(void *arg) {
  pub_stage_job *job = arg;
  job->status = pub_staged_write(job->folder, job->hint, job->data, job->size,
                                 &job->staged);
  if (job->rename && job->threaded) {
    /* The name is the hash of the bytes, which the committing thread
     * computes meanwhile. */
    pthread_mutex_lock(&job->mu);
    while (job->named == 0)
      pthread_cond_wait(&job->cv, &job->mu);
    int go = job->named > 0;
    pthread_mutex_unlock(&job->mu);
    int renamed = 0;
    if (job->status == PULSE_OK && go)
      job->status = pub_staged_publish(&job->staged, job->final, &renamed);
    pub_staged_drop(&job->staged); /* not named, or the rename failed */
  }
  if (job->status != PULSE_OK)
    snprintf(job->detail, sizeof job->detail, "%s", pulse_error_detail());
  return NULL;
}

void pub_stage_start(pub_stage_job *job, int rename) {
  job->rename = rename;
  job->named = 0;
  job->staged.tmp[0] = '\0';
  pthread_mutex_init(&job->mu, NULL);
  pthread_cond_init(&job->cv, NULL);
  job->threaded = 1; /* read by the thread: set before it starts */
  if (pthread_create(&job->thread, NULL, stage_main, job) != 0) {
    job->threaded = 0;
    stage_main(job); /* no thread: the same work, in line */
  }
}

/* Hands the thread its final name (named 1) or tells it to drop the file
 * (named -1). Without a thread, does the same in line. */
static void stage_decide(pub_stage_job *job, const char *final) {
  if (!job->rename || job->named != 0)
    return;
  if (!job->threaded) {
    int renamed = 0;
    if (final != NULL && job->status == PULSE_OK) {
      job->status = pub_staged_publish(&job->staged, final, &renamed);
      if (job->status != PULSE_OK)
        snprintf(job->detail, sizeof job->detail, "%s", pulse_error_detail());
    }
    pub_staged_drop(&job->staged);
    job->named = final != NULL ? 1 : -1;
    return;
  }
  pthread_mutex_lock(&job->mu);
  if (final != NULL)
    snprintf(job->final, sizeof job->final, "%s", final);
  job->named = final != NULL ? 1 : -1;
  pthread_cond_signal(&job->cv);
  pthread_mutex_unlock(&job->mu);
}

void pub_stage_name(pub_stage_job *job, const char *final) {
  stage_decide(job, final);
}

/* Waits for the job; its error detail stays in job->detail. */
static pulse_status stage_wait(pub_stage_job *job) {
  stage_decide(job, NULL); /* never named: dropped */
  if (job->threaded)
    pthread_join(job->thread, NULL);
  job->threaded = 0;
  pthread_mutex_destroy(&job->mu);
  pthread_cond_destroy(&job->cv);
  return job->status;
}

pulse_status pub_stage_finish(pub_stage_job *job) {
  if (stage_wait(job) != PULSE_OK)
    return pulse_fail(job->status, "%s", job->detail);
  return PULSE_OK;
}

void pub_stage_cancel(pub_stage_job *job) {
  (void)stage_wait(job);
  pub_staged_drop(&job->staged);
}
