/* sub_file.c - the safetensors file target: the subscriber holds the whole
 * BF16 state in memory and applies each step there; the file follows at the
 * end of each sync, in place through the journal (sub_journal.c), or whole
 * and atomically (temporary file, fsync, rename) after an anchor, with the
 * tensors in table order and metadata {"step", "state_digest"}, the layout
 * of an anchor, and a header padded so the claim can grow in place. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hugepage_impl.h"
#include "parallel_impl.h"
#include "pulse_file.h"
#include "pulse_log.h"
#include "pulse_safetensors.h"
#include "safetensors_impl.h"
#include "status_impl.h"
#include "sub_file_impl.h"

/* Room left in a header written whole, so that a longer step number (or
 * another metadata field) still fits when it is rewritten in place. */
#define HEADER_SLACK 256u

/* ------------------------------------------------------------ test hook */

static int64_t kill_budget = -1;
static pthread_once_t kill_once = PTHREAD_ONCE_INIT;

static void kill_read(void) {
  const char *v = getenv("PULSE_TEST_KILL_AFTER_BYTES");
  char *end = NULL;
  if (v != NULL && v[0] != '\0') {
    long long n = strtoll(v, &end, 10);
    if (end != NULL && *end == '\0' && n >= 0)
      kill_budget = n;
  }
}

int64_t sub_file_kill_budget(void) {
  pthread_once(&kill_once, kill_read);
  return kill_budget;
}

static void kill_take(uint64_t n) {
  if (sub_file_kill_budget() < 0)
    return;
  if ((uint64_t)kill_budget < n) {
    kill_budget = -1;
    raise(SIGKILL);
  }
  kill_budget -= (int64_t)n;
}

void sub_file_kill_point(void) { kill_take(1); }

void sub_file_wrote(pulse_sub *sub, uint64_t n) {
  sub_count(sub, &sub->fig.file_bytes_written, n);
  kill_take(n);
}

pulse_status sub_file_pwrite(pulse_sub *sub, int fd, const void *data, uint64_t n,
                             uint64_t offset, const char *what) {
  const uint8_t *p = data;
  int64_t budget = sub_file_kill_budget();
  if (budget >= 0 && (uint64_t)budget < n) {
    /* the test hook: the part up to the budget, then the end */
    if (pwrite(fd, p, (size_t)budget, (off_t)offset) < 0)
      return pulse_fail(PULSE_ERR_IO, "%s: write: %s", what, strerror(errno));
    sub_file_wrote(sub, n);
  }
  for (uint64_t at = 0; at < n;) {
    size_t chunk = n - at > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)(n - at);
    ssize_t w = pwrite(fd, p + at, chunk, (off_t)(offset + at));
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return pulse_fail(PULSE_ERR_IO, "%s: write: %s", what,
                        w < 0 ? strerror(errno) : "no progress");
    at += (uint64_t)w;
  }
  sub_file_wrote(sub, n);
  return PULSE_OK;
}

/* ----------------------------------------------------------------- load */

static void warn(pulse_sub *sub, const char *fmt, const char *a,
                 const char *b) {
  char msg[1024];
  snprintf(msg, sizeof msg, fmt, a, b);
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
}

/* Reads n bytes at offset of fd into p. */
static int read_at(int fd, void *p, uint64_t n, uint64_t offset) {
  for (uint64_t at = 0; at < n;) {
    size_t chunk = n - at > ((uint64_t)1 << 30) ? (size_t)1 << 30 : (size_t)(n - at);
    ssize_t r = pread(fd, (uint8_t *)p + at, chunk, (off_t)(offset + at));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    at += (uint64_t)r;
  }
  return 0;
}

/* Reading the targets' data (into huge pages: the steps write at random
 * there) and their digests, one tensor per task. */
typedef struct {
  sub_target *t;
  const uint64_t *offset;
  int fd;
  atomic_int failed;
} load_job;

static void read_one(void *ctx, size_t i) {
  load_job *j = ctx;
  if (read_at(j->fd, j->t[i].data, j->t[i].numel * 2, j->offset[i]) != 0)
    atomic_store(&j->failed, 1);
}

static void digest_one(void *ctx, size_t i) {
  load_job *j = ctx;
  j->t[i].digest = pulse_digest_bf16(j->t[i].data, j->t[i].numel);
}

/* The file target's writer and the names next to the file. */
static pulse_status file_state_make(pulse_sub *sub) {
  struct sub_file *f = calloc(1, sizeof *f);
  if (f == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file target %s", sub->file_path);
  f->fd = f->jfd = -1;
  sub->file = f;
  const char *path = sub->file_path, *slash = strrchr(path, '/');
  size_t dir_len = slash == NULL ? 0 : (size_t)(slash - path) + 1, cap = strlen(path) + 32;
  f->journal_path = malloc(cap);
  f->snapshot_path = malloc(cap);
  if (f->journal_path == NULL || f->snapshot_path == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file target %s", path);
  snprintf(f->journal_path, cap, "%.*s.%s.journal", (int)dir_len, path, path + dir_len);
  snprintf(f->snapshot_path, cap, "%s.snapshot", path);
  return PULSE_OK;
}

/* Drops the mapping (a loaded file needs it no more). */
static void file_drop_map(struct sub_file *f) {
  if (f->map != NULL)
    munmap(f->map, (size_t)f->size);
  f->map = NULL;
}

/* Drops the mapping and the descriptor: the file is written whole next. */
static void file_unmap(struct sub_file *f) {
  file_drop_map(f);
  if (f->fd >= 0)
    close(f->fd);
  f->fd = -1;
  f->size = 0;
}

/* Opens the file read-write (read-only when it is not writable: no
 * in-place writes then); `map`: also maps it read-only, for its header
 * (the data is read with pread: a mapping's pages would each cost a page
 * fault). *missing: there is no file. */
static pulse_status file_open(pulse_sub *sub, int map, int *missing, int *writable) {
  struct sub_file *f = sub->file;
  *missing = 0;
  *writable = 1;
  int fd = open(sub->file_path, O_RDWR | O_CLOEXEC);
  if (fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM)) {
    *writable = 0;
    fd = open(sub->file_path, O_RDONLY | O_CLOEXEC);
  }
  if (fd < 0) {
    *missing = errno == ENOENT;
    return pulse_fail(PULSE_ERR_IO, "%s: %s", sub->file_path, strerror(errno));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 8) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "%s: not a regular file of at least 8 bytes",
                      sub->file_path);
  }
  void *m = map ? mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0) : NULL;
  if (m == MAP_FAILED) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "%s: mmap: %s", sub->file_path, strerror(errno));
  }
  f->fd = fd;
  f->map = m;
  f->size = (uint64_t)sb.st_size;
  return PULSE_OK;
}

/* Where each target's data lies in the file, from the opened tensors
 * (storage order, which is the targets' order). */
static pulse_status file_offsets(pulse_sub *sub, const pulse_st_file *sf) {
  struct sub_file *f = sub->file;
  size_t n = pulse_st_tensor_count(sf);
  free(f->offset);
  f->noffset = 0;
  f->offset = calloc(n + 1, sizeof *f->offset);
  if (f->offset == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "file target %s", sub->file_path);
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor x;
    pulse_st_tensor_get(sf, i, &x);
    f->offset[i] = x.nbytes > 0 ? (uint64_t)((const uint8_t *)x.data - f->map) : f->size;
  }
  f->noffset = n;
  f->header_size = 8 + pulse_load_le64(f->map);
  return PULSE_OK;
}

static pulse_status load_from(pulse_sub *sub, int in_memory);

pulse_status sub_file_load(pulse_sub *sub) {
  PULSE_TRY(file_state_make(sub));
  struct sub_file *f = sub->file;
  unsigned removed = 0, removed_snap = 0;
  pulse_atomic_file_clean(sub->file_path, &removed);
  pulse_atomic_file_clean(f->snapshot_path, &removed_snap);
  if (removed + removed_snap > 0)
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "subscriber: removed %u temporary file(s) that killed writers of %s left",
                 removed + removed_snap, sub->file_path);
  return load_from(sub, 1);
}

/* Reads the file into the targets. `in_memory`: a journal the last run
 * left is replayed into the targets once they are read (one read of the
 * file); when that cannot be (a step it stopped in the middle of, a
 * layout the journal does not fit), or without in_memory, it is replayed
 * into the file first (sub_journal_recover), which is then read. */
static pulse_status load_from(pulse_sub *sub, int in_memory) {
  struct sub_file *f = sub->file;
  uint64_t replayed = 0;
  if (!in_memory)
    PULSE_TRY(sub_journal_recover(sub, &replayed));

  int missing = 0, writable = 1;
  pulse_st_file *sf = NULL;
  pulse_status st = file_open(sub, 1, &missing, &writable);
  if (st == PULSE_OK)
    st = pulse_st_open_memory(f->map, (size_t)f->size, &sf);
  if (st != PULSE_OK && !missing && in_memory &&
      access(f->journal_path, F_OK) == 0) {
    /* A step stopped in the middle leaves the header closed (sub_journal.c:
     * a loader must not read the mix): the journal completes it. */
    file_unmap(f);
    return load_from(sub, 0);
  }
  if (st != PULSE_OK) {
    if (!missing) /* missing: made from the first anchor */
      warn(sub, "%s cannot be read (%s): it will be replaced from an anchor",
           sub->file_path, pulse_error_detail());
    file_unmap(f);
    return PULSE_OK;
  }
  size_t n = pulse_st_tensor_count(sf);
  sub_target *t = calloc(n + 1, sizeof *t);
  pulse_tensor_info *info = calloc(n + 1, sizeof *info);
  pulse_tensor_digest *d = calloc(n + 1, sizeof *d);
  if (t == NULL || info == NULL || d == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "loading %s", sub->file_path);
  size_t made = 0;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_st_tensor x;
    pulse_st_tensor_get(sf, i, &x);
    if (x.dtype != PULSE_DTYPE_BF16) {
      warn(sub,
           "%s holds a tensor that is not BF16 (%s): it will be replaced from "
           "an anchor",
           sub->file_path, x.name);
      break;
    }
    t[i].name = strdup(x.name);
    t[i].ndim = x.ndim;
    memcpy(t[i].shape, x.shape, sizeof t[i].shape);
    t[i].numel = x.numel;
    t[i].data = pulse_hugepage_alloc(x.nbytes ? x.nbytes : 2); /* also realigns */
    made = i + 1;
    if (t[i].name == NULL || t[i].data == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "loading %s", sub->file_path);
      break;
    }
    info[i].name = t[i].name;
    info[i].dtype = PULSE_DTYPE_BF16;
    info[i].ndim = t[i].ndim;
    memcpy(info[i].shape, t[i].shape, sizeof info[i].shape);
  }
  const char *meta_step = pulse_st_metadata_get(sf, "step");
  const char *meta_digest = pulse_st_metadata_get(sf, "state_digest");
  const char *meta_run = pulse_st_metadata_get(sf, "run"); /* sub_head.c */
  uint8_t run[PULSE_STORE_RUN_BYTES];
  int has_run = meta_run != NULL &&
                sub_unhex(meta_run, strlen(meta_run), run, sizeof run) == 0;
  char step_s[32], digest_s[80];
  snprintf(step_s, sizeof step_s, "%s", meta_step ? meta_step : "");
  snprintf(digest_s, sizeof digest_s, "%s", meta_digest ? meta_digest : "");
  if (st == PULSE_OK && made == n)
    st = file_offsets(sub, sf);
  pulse_st_close(sf);
  load_job job = {t, f->offset, f->fd, 0};
  if (st == PULSE_OK && made == n) {
    pulse_parallel_for(sub->opts.threads, n, read_one, &job);
    if (atomic_load(&job.failed))
      st = pulse_fail(PULSE_ERR_IO, "%s: reading its tensors failed", sub->file_path);
  }
  int replay = 1; /* no journal, or replayed into the targets */
  if (st == PULSE_OK && made == n && in_memory)
    st = sub_journal_replay_loaded(sub, t, n, writable, &replay);
  file_drop_map(f);
  if (st != PULSE_OK || made < n || !writable || replay == 0)
    file_unmap(f); /* written whole from now on (or read again) */
  if (st != PULSE_OK || made < n || replay == 0) {
    for (size_t i = 0; i < made; i++)
      free(t[i].name), free(t[i].data);
    free(t), free(info), free(d);
    if (st == PULSE_OK && made == n && replay == 0)
      return load_from(sub, 0); /* replayed into the file, then read */
    return st;
  }
  pulse_parallel_for(sub->opts.threads, n, digest_one, &job);
  for (size_t i = 0; i < n; i++)
    d[i] = t[i].digest;
  pulse_state_digest sd;
  char hex[65];
  st = pulse_state_digest_compute(info, d, n, &sd);
  pulse_state_digest_hex(&sd, hex);
  free(info), free(d);
  sub->targets = t;
  sub->ntargets = sub->cap = n;
  if (st != PULSE_OK)
    return st;
  char *end = NULL;
  uint64_t step = strtoull(step_s, &end, 10);
  if (step_s[0] == '\0' || end == NULL || *end != '\0') {
    warn(sub, "%s names no step%s: it will be replaced from an anchor",
         sub->file_path, "");
    return PULSE_OK;
  }
  if (digest_s[0] != '\0' && strcmp(digest_s, hex) != 0) {
    warn(sub,
         "%s does not match its own state digest (%s): it will be replaced "
         "from an anchor",
         sub->file_path, digest_s);
    return PULSE_OK;
  }
  /* A step to resume from, checked against the publisher before use. */
  pthread_rwlock_wrlock(&sub->rw);
  sub_set_step(sub, step, &sd);
  sub->step_claimed = 1;
  pthread_rwlock_unlock(&sub->rw);
  if (has_run) { /* the run of the step it holds, kept over a lost cache */
    memcpy(sub->run, run, sizeof run);
    sub->have_run = 1;
  }
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "subscriber: %s holds step %" PRIu64 " (state %s)",
               sub->file_path, step, hex);
  return PULSE_OK;
}

/* ----------------------------------------------------------------- save */

/* The file's tensors and metadata as the writer takes them. */
typedef struct {
  pulse_st_write_tensor *w;
  pulse_st_kv meta[3];
  size_t nmeta;
  char step[32], hex[65], run[2 * PULSE_STORE_RUN_BYTES + 1];
} file_layout;

static pulse_status layout_make(pulse_sub *sub, file_layout *l) {
  l->w = calloc(sub->ntargets + 1, sizeof *l->w);
  if (l->w == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "writing %s", sub->file_path);
  for (size_t i = 0; i < sub->ntargets; i++) {
    l->w[i].name = sub->targets[i].name;
    l->w[i].dtype = PULSE_DTYPE_BF16;
    l->w[i].ndim = sub->targets[i].ndim;
    memcpy(l->w[i].shape, sub->targets[i].shape, sizeof l->w[i].shape);
    l->w[i].data = sub->targets[i].data;
  }
  snprintf(l->step, sizeof l->step, "%" PRIu64, sub->step);
  l->meta[0] = (pulse_st_kv){"step", l->step};
  l->meta[1] = (pulse_st_kv){"state_digest", l->hex};
  l->nmeta = 1;
  if (sub->have_state) {
    pulse_state_digest_hex(&sub->state, l->hex);
    l->nmeta = 2;
  }
  if (sub->have_run) { /* the run of the step (sub_head.c) */
    store_hex(sub->run, PULSE_STORE_RUN_BYTES, l->run);
    l->meta[l->nmeta++] = (pulse_st_kv){"run", l->run};
  }
  return PULSE_OK;
}

/* Writes the whole file atomically (after an anchor, or when it cannot be
 * patched in place), then maps the new file for the next steps. */
static pulse_status write_whole(pulse_sub *sub, const file_layout *l) {
  struct sub_file *f = sub->file;
  /* The journal describes the old file: the old file's pages synced and the
   * journal emptied first, so no replay ever writes into the new one. */
  PULSE_TRY(sub_journal_checkpoint(sub, 1));
  file_unmap(f);
  pulse_bytebuf head = PULSE_BYTEBUF_INIT;
  uint64_t data_size = 0;
  pulse_status st = st_header_build(l->w, sub->ntargets, l->meta, l->nmeta, 0, &head, &data_size);
  if (st == PULSE_OK) {
    uint64_t min = head.size + HEADER_SLACK;
    pulse_bytebuf_free(&head);
    st = st_header_build(l->w, sub->ntargets, l->meta, l->nmeta, min, &head, &data_size);
  }
  pulse_atomic_file *af = NULL;
  if (st == PULSE_OK)
    st = pulse_atomic_file_create(sub->file_path, &af);
  int hook = sub_file_kill_budget() >= 0;
  for (size_t i = 0; st == PULSE_OK && i <= sub->ntargets; i++) {
    const void *p = i == 0 ? (const void *)head.data : (const void *)sub->targets[i - 1].data;
    uint64_t n = i == 0 ? head.size : sub->targets[i - 1].numel * 2;
    if (hook && (uint64_t)sub_file_kill_budget() < n)
      pulse_atomic_file_write(af, p, (uint64_t)sub_file_kill_budget());
    if (hook)
      sub_file_wrote(sub, n); /* may end the process here */
    st = pulse_atomic_file_write(af, p, n);
    if (!hook)
      sub_file_wrote(sub, n);
  }
  uint64_t header_size = head.size;
  pulse_bytebuf_free(&head);
  if (st != PULSE_OK) {
    pulse_atomic_file_abort(af);
    return st;
  }
  sub_file_kill_point(); /* the test hook: written, not yet renamed */
  PULSE_TRY(pulse_atomic_file_commit(af));

  /* In place from now on: the offsets are the layout just written. */
  int missing, writable;
  if (file_open(sub, 0, &missing, &writable) != PULSE_OK || !writable ||
      f->size != header_size + data_size) {
    file_unmap(f);
    return PULSE_OK; /* whole again next time */
  }
  free(f->offset);
  f->noffset = 0;
  f->offset = calloc(sub->ntargets + 1, sizeof *f->offset);
  if (f->offset == NULL) {
    file_unmap(f);
    return PULSE_OK;
  }
  uint64_t at = header_size;
  for (size_t i = 0; i < sub->ntargets; i++) {
    f->offset[i] = at;
    at += sub->targets[i].numel * 2;
  }
  f->noffset = sub->ntargets;
  f->header_size = header_size;
  return PULSE_OK;
}

pulse_status sub_file_save(pulse_sub *sub) {
  struct sub_file *f = sub->file;
  if (sub->mem != SUB_MEM_FILE || f == NULL || sub->step == PULSE_SUB_NO_STEP ||
      (!sub->file_dirty && f->pending_steps == 0))
    return PULSE_OK;
  double t0 = sub_now();
  file_layout l;
  PULSE_TRY(layout_make(sub, &l));
  pulse_status st = PULSE_OK;
  int whole = sub->file_dirty || f->fd < 0 || f->noffset != sub->ntargets;
  if (!whole) {
    /* The new claim, in the room the old header had. */
    pulse_bytebuf head = PULSE_BYTEBUF_INIT;
    uint64_t data_size = 0;
    st = st_header_build(l.w, sub->ntargets, l.meta, l.nmeta, f->header_size, &head, &data_size);
    if (st == PULSE_OK && head.size == f->header_size &&
        head.size + data_size == f->size)
      st = sub_journal_commit(sub, head.data);
    else if (st == PULSE_OK)
      whole = 1; /* it outgrew its room, or another layout */
    pulse_bytebuf_free(&head);
  }
  if (st == PULSE_OK && whole)
    st = write_whole(sub, &l);
  free(l.w);
  sub->t_write += sub_now() - t0;
  if (st != PULSE_OK)
    return st; /* the pending changes stay for the next save */
  sub->file_dirty = 0;
  f->pending.size = 0; /* its memory kept: no page faults for the next step's */
  free(f->dirty); /* sized for the file, which a whole rewrite may resize */
  f->dirty = NULL;
  f->pending_changes = f->pending_steps = 0;
  sub_file_snapshot_maybe(sub);
  return PULSE_OK;
}

void sub_file_free(pulse_sub *sub) {
  struct sub_file *f = sub->file;
  if (f == NULL)
    return;
  sub_file_snapshot_wait(sub);
  if (f->jfd >= 0 && f->journal_size > 0) {
    /* The steps are durable in the journal; waiting here for the file's
     * pages would cost a one-shot pull the model's size in disk time. The
     * kernel writes them back, and the next attach replays the journal
     * (which then changes nothing), syncs the file and removes the journal. */
  } else if (sub_journal_checkpoint(sub, 1) != PULSE_OK) {
    PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s: %s", sub->file_path, pulse_error_detail());
  }
  file_unmap(f);
  if (f->jfd >= 0)
    close(f->jfd);
  pulse_bytebuf_free(&f->pending);
  free(f->dirty);
  free(f->offset);
  free(f->journal_path);
  free(f->snapshot_path);
  free(f);
  sub->file = NULL;
}
