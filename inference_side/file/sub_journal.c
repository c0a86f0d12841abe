/* sub_journal.c - the file target's in-place writer and its journal
 * (sub_file_impl.h says why and when).
 *
 * A transaction, little-endian, as appended to the journal:
 *   "PULSEJ1\n"   magic
 *   u64           size of the whole transaction, checksum included
 *   u64           size of the file it applies to
 *   u64           the step it brings the file to (for messages)
 *   u64           header size H (the 8-byte length and the header JSON)
 *   H bytes       the new header (its metadata claims the step)
 *   records       until the checksum, one per changed tensor:
 *                 u64 file offset of the tensor's data, u64 its elements,
 *                 u64 count, then count times (LEB128 of the zig-zag
 *                 difference to the previous position, from 0, and u16 new
 *                 bits; a class-model patch stages positions by class, so
 *                 they are not in order)
 *   32 bytes      SHA-256 of everything before
 * Values are absolute, so a transaction applied twice, or over a file that
 * took part of it already, leaves the same bytes. The journal is a file
 * like any other: every field is checked before anything is written. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "patch_changes_impl.h"
#include "pulse_log.h"
#include "status_impl.h"
#include "sub_file_impl.h"

#define TXN_MAGIC "PULSEJ1\n"
#define TXN_FIXED 40u
#define TXN_SUM 32u

/* ------------------------------------------------------------- recording */

void sub_file_note_patch(pulse_sub *sub, const pulse_patch *p, sub_target **tg,
                         const pulse_patch_staged *staged,
                         const pulse_patch_stream *stream) {
  struct sub_file *f = sub->file;
  if (sub->file_dirty || f == NULL || f->fd < 0) {
    sub->file_dirty = 1; /* written whole at the save */
    return;
  }
  pulse_bytebuf *b = &f->pending;
  uint64_t words = (f->size >> 12) / 64 + 1;
  if (f->dirty == NULL && (f->dirty = calloc((size_t)words, sizeof *f->dirty)) == NULL) {
    sub->file_dirty = 1; /* written whole at the save */
    pulse_bytebuf_free(b);
    f->pending_changes = 0;
    f->pending_steps++;
    return;
  }
  for (size_t i = 0; i < pulse_patch_tensor_count(p); i++) {
    if (tg[i] == NULL)
      continue;
    const pulse_changes *ch =
        staged != NULL ? patch_staged_changes(staged, i) : patch_stream_changes(stream, i);
    if (ch == NULL || ch->count == 0)
      continue;
    size_t k = (size_t)(tg[i] - sub->targets);
    if (k >= f->noffset || ch->count > (SIZE_MAX - 24) / 12 ||
        !pulse_bytebuf_reserve(b, 24 + (size_t)ch->count * 12, 0)) {
      sub->file_dirty = 1;
      break;
    }
    if (b->size == 0) { /* room for the transaction's fixed part and header */
      if (!pulse_bytebuf_reserve(b, TXN_FIXED + (size_t)f->header_size + 24 + (size_t)ch->count * 12, 0)) {
        sub->file_dirty = 1;
        break;
      }
      b->size = TXN_FIXED + (size_t)f->header_size;
    }
    uint8_t *o = b->data + b->size;
    pulse_store_le64(o, f->offset[k]);
    pulse_store_le64(o + 8, tg[i]->numel);
    pulse_store_le64(o + 16, ch->count);
    o += 24;
    uint64_t prev = 0, base = f->offset[k];
    for (uint64_t j = 0; j < ch->count; j++) {
      uint64_t pos = ch->pos[j], page = (base + 2 * pos) >> 12;
      f->dirty[page >> 6] |= (uint64_t)1 << (page & 63);
      uint64_t zz = pos >= prev ? (pos - prev) << 1 : ((prev - pos - 1) << 1) | 1;
      prev = pos;
      while (zz >= 0x80) {
        *o++ = (uint8_t)(zz | 0x80);
        zz >>= 7;
      }
      *o++ = (uint8_t)zz;
      pulse_store_le16(o, ch->new_bits[j]);
      o += 2;
    }
    b->size = (size_t)(o - b->data);
    f->pending_changes += ch->count;
  }
  if (sub->file_dirty) {
    pulse_bytebuf_free(b);
    f->pending_changes = 0;
  }
  f->pending_steps++;
}

/* ------------------------------------------------- checking and applying */

int sub_journal_check(const uint8_t *t, size_t n, uint64_t file_size, size_t *used) {
  if (n < TXN_FIXED + TXN_SUM || memcmp(t, TXN_MAGIC, 8) != 0)
    return 0;
  uint64_t size = pulse_load_le64(t + 8), hsize = pulse_load_le64(t + 32);
  if (size > n || size < TXN_FIXED + TXN_SUM || pulse_load_le64(t + 16) != file_size ||
      hsize < 8 || hsize > file_size || hsize > size - TXN_FIXED - TXN_SUM)
    return 0;
  uint8_t sum[32];
  store_sha256(t, (size_t)size - TXN_SUM, sum);
  if (memcmp(sum, t + size - TXN_SUM, 32) != 0)
    return 0;
  /* Whole and ours: now every record must stay inside the file's data. */
  pulse_reader r = pulse_reader_make(t + TXN_FIXED + hsize, (size_t)(size - TXN_FIXED - hsize - TXN_SUM));
  while (r.ok && r.left > 0) {
    uint64_t off = pulse_reader_le(&r, 8), numel = pulse_reader_le(&r, 8);
    uint64_t count = pulse_reader_le(&r, 8);
    if (!r.ok || off < hsize || off > file_size || numel > (file_size - off) / 2 || count > numel)
      return 0;
    uint64_t pos = 0;
    for (uint64_t j = 0; j < count && r.ok; j++) {
      uint64_t zz = pulse_reader_varint(&r), mag = zz >> 1;
      if (zz & 1) { /* back by mag + 1, not below 0 */
        if (mag >= pos)
          return 0;
        pos -= mag + 1;
      } else { /* on by mag, staying below numel */
        if (mag >= numel - pos)
          return 0;
        pos += mag;
      }
      pulse_reader_le(&r, 2);
    }
  }
  if (!r.ok)
    return 0;
  *used = (size_t)size;
  return 1;
}

/* One step of a record checked by sub_journal_check: a varint, zig-zag
 * (back by mag + 1, or on by mag), taken from *pos. Returns the byte after
 * it (the element's two bytes). */
static const uint8_t *record_step(const uint8_t *p, uint64_t *pos) {
  uint64_t zz = 0;
  for (int s = 0;; s += 7) {
    uint8_t byte = *p++;
    zz |= (uint64_t)(byte & 0x7F) << s;
    if (!(byte & 0x80))
      break;
  }
  *pos = zz & 1 ? *pos - (zz >> 1) - 1 : *pos + (zz >> 1);
  return p;
}

void sub_journal_apply_window(uint8_t *win, uint64_t at, uint64_t n, const uint8_t *t,
                              size_t size) {
  uint64_t hsize = pulse_load_le64(t + 32);
  const uint8_t *p = t + TXN_FIXED + hsize, *end = t + size - TXN_SUM;
  while (p < end) {
    uint64_t off = pulse_load_le64(p), count = pulse_load_le64(p + 16);
    p += 24;
    uint64_t pos = 0;
    for (uint64_t j = 0; j < count; j++) {
      p = record_step(p, &pos);
      uint64_t where = off + 2 * pos; /* checked: inside the file */
      if (where >= at && where + 2 <= at + n)
        memcpy(win + (where - at), p, 2);
      else if (where + 1 == at) /* an element across the window's start */
        win[0] = p[1];
      else if (where + 1 == at + n)
        win[n - 1] = p[0];
      p += 2;
    }
  }
  if (at < hsize) /* the header: the new claim */
    memcpy(win, t + TXN_FIXED + at, (size_t)(hsize - at < n ? hsize - at : n));
}

/* While the file holds pages of two steps, its first 8 bytes (the header's
 * length) are all 0xFF: a length past the end of any file, so that no
 * safetensors loader opens a mix. Written before the first page of a step
 * (or of a repair), and the real length goes back last, after the rest of
 * the header: a write stopped anywhere in those 8 bytes leaves their high
 * bytes 0xFF, still too long. The next attach repairs the file from its
 * journal (sub_journal_recover), which restores the length last too. */
static const uint8_t header_closed[8] = {0xFF, 0xFF, 0xFF, 0xFF,
                                         0xFF, 0xFF, 0xFF, 0xFF};

static pulse_status header_close(pulse_sub *sub, int fd) {
  return sub_file_pwrite(sub, fd, header_closed, 8, 0, sub->file_path);
}

/* Writes the header (n >= 8 bytes): the JSON first, its length last. */
static pulse_status header_open(pulse_sub *sub, int fd, const uint8_t *header, uint64_t n) {
  if (n > 8)
    PULSE_TRY(sub_file_pwrite(sub, fd, header + 8, n - 8, 8, sub->file_path));
  return sub_file_pwrite(sub, fd, header, 8, 0, sub->file_path);
}

/* The file's pages that hold the transaction's changes, from the targets
 * (which hold the step the transaction brings the file to; the pages'
 * other elements are what the file holds already), in coalesced runs
 * split at the tensors' ends, then the header, its length last. A crash in
 * between leaves pages of both steps, which the replay completes; the
 * caller closed the header before (header_close), so that nothing reads
 * them meanwhile. */
static pulse_status write_pages(pulse_sub *sub, const sub_target *tg, size_t ntg,
                                const uint8_t *header) {
  struct sub_file *f = sub->file;
  for (size_t k = 0; k < f->noffset && k < ntg && f->dirty != NULL; k++) {
    uint64_t from = f->offset[k], to = from + tg[k].numel * 2;
    if (to <= from)
      continue;
    const uint8_t *data = (const uint8_t *)tg[k].data;
    uint64_t page = from >> 12, last = (to - 1) >> 12;
    while (page <= last) {
      if (!(f->dirty[page >> 6] >> (page & 63) & 1)) {
        page++;
        continue;
      }
      uint64_t run = page;
      while (run <= last && (f->dirty[run >> 6] >> (run & 63) & 1))
        run++;
      uint64_t lo = page << 12 > from ? page << 12 : from;
      uint64_t hi = run << 12 < to ? run << 12 : to;
      PULSE_TRY(sub_file_pwrite(sub, f->fd, data + (lo - from), hi - lo, lo, sub->file_path));
      page = run;
    }
  }
  /* The header goes last: when it is in place already, so was the rest. */
  return header == NULL ? PULSE_OK : header_open(sub, f->fd, header, f->header_size);
}

/* ---------------------------------------------------------------- syncing */

/* Makes a name created or removed in path's folder durable. */
static void fsync_parent(const char *path) {
  const char *slash = strrchr(path, '/');
  char dir[4096];
  if (slash == NULL)
    snprintf(dir, sizeof dir, ".");
  else
    snprintf(dir, sizeof dir, "%.*s", slash == path ? 1 : (int)(slash - path), path);
  sub_fsync_dir(dir);
}

static pulse_status sync_file(pulse_sub *sub) {
  struct sub_file *f = sub->file;
  if (f->fd >= 0 && fdatasync(f->fd) != 0)
    return pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", sub->file_path, strerror(errno));
  return PULSE_OK;
}

pulse_status sub_journal_checkpoint(pulse_sub *sub, int remove) {
  struct sub_file *f = sub->file;
  if (f == NULL)
    return PULSE_OK;
  if (f->jfd < 0 && !remove)
    return PULSE_OK;
  if (f->jfd < 0 && access(f->journal_path, F_OK) != 0)
    return PULSE_OK; /* nothing written in place since the file was synced */
  PULSE_TRY(sync_file(sub));
  sub_file_kill_point(); /* the test hook: the file synced, the journal not retired */
  if (f->jfd >= 0) {
    if (ftruncate(f->jfd, 0) != 0 || fdatasync(f->jfd) != 0)
      return pulse_fail(PULSE_ERR_IO, "%s: emptying: %s", f->journal_path, strerror(errno));
    f->journal_size = 0;
  }
  if (remove) {
    if (f->jfd >= 0)
      close(f->jfd);
    f->jfd = -1;
    if (unlink(f->journal_path) == 0)
      fsync_parent(f->journal_path);
  }
  return PULSE_OK;
}

/* The journal outgrows the file: then replaying it would cost more than
 * syncing the file's pages once. */
static uint64_t journal_limit(const struct sub_file *f) {
  uint64_t floor = (uint64_t)64 << 20;
  return f->size > floor ? f->size : floor;
}

pulse_status sub_journal_commit(pulse_sub *sub, const uint8_t *header) {
  struct sub_file *f = sub->file;
  pulse_bytebuf *b = &f->pending;
  uint64_t prefix = TXN_FIXED + f->header_size;
  if (b->size == 0 && !pulse_bytebuf_reserve(b, (size_t)prefix, 0))
    return pulse_fail(PULSE_ERR_NOMEM, "%s: a journal transaction", sub->file_path);
  if (b->size == 0)
    b->size = (size_t)prefix; /* no changes: the claim alone */
  if (!pulse_bytebuf_reserve(b, TXN_SUM, 0))
    return pulse_fail(PULSE_ERR_NOMEM, "%s: a journal transaction of %zu bytes",
                      sub->file_path, b->size + TXN_SUM);
  /* The records were written after room for the fixed part and the
   * header (sub_file_note_patch): the transaction is made in place. */
  uint64_t size = b->size + TXN_SUM;
  uint8_t *t = b->data;
  memcpy(t, TXN_MAGIC, 8);
  pulse_store_le64(t + 8, size);
  pulse_store_le64(t + 16, f->size);
  pulse_store_le64(t + 24, sub->step);
  pulse_store_le64(t + 32, f->header_size);
  memcpy(t + TXN_FIXED, header, (size_t)f->header_size);
  store_sha256(t, (size_t)size - TXN_SUM, t + size - TXN_SUM);

  pulse_status st = PULSE_OK;
  if (f->jfd < 0) {
    f->jfd = open(f->journal_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (f->jfd < 0)
      st = pulse_fail(PULSE_ERR_IO, "%s: %s", f->journal_path, strerror(errno));
    else
      fsync_parent(f->journal_path); /* the journal is found after a power cut */
    f->journal_size = 0;
  }
  if (st == PULSE_OK)
    st = sub_file_pwrite(sub, f->jfd, t, size, f->journal_size, f->journal_path);
  if (st == PULSE_OK && fdatasync(f->jfd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", f->journal_path, strerror(errno));
  if (st != PULSE_OK) {
    /* A torn tail would hide every later transaction from a replay. */
    if (f->jfd >= 0 && ftruncate(f->jfd, (off_t)f->journal_size) != 0)
      sub->file_dirty = 1;
    return st;
  }
  f->journal_size += size;
  /* Durable from here: a crash in what follows is repaired by a replay. */
  sub_file_kill_point();
  st = header_close(sub, f->fd);
  if (st == PULSE_OK)
    st = write_pages(sub, sub->targets, sub->ntargets, header);
  if (st != PULSE_OK)
    return st; /* the journal has the step: the next attach finishes it */
  if (f->dirty != NULL)
    memset(f->dirty, 0, (size_t)((f->size >> 12) / 64 + 1) * sizeof *f->dirty);
  if (f->journal_size > journal_limit(f))
    st = sub_journal_checkpoint(sub, 0);
  return st;
}

/* -------------------------------------------------------------- recovery */

static void warn(pulse_sub *sub, const char *msg) {
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", msg);
  sub_emit_simple(sub, PULSE_SUB_EV_WARNING, PULSE_OK, msg);
}

/* Reads n bytes at offset of fd. */
static int read_all_at(int fd, uint8_t *p, uint64_t n, uint64_t offset) {
  for (uint64_t at = 0; at < n;) {
    ssize_t r = pread(fd, p + at, (size_t)(n - at), (off_t)(offset + at));
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    at += (uint64_t)r;
  }
  return 0;
}

/* Reads a whole file of at most `cap` bytes. */
static pulse_status read_all(int fd, uint64_t size, uint8_t **out) {
  uint8_t *b = malloc(size ? (size_t)size : 1);
  if (b == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "journal of %" PRIu64 " bytes", size);
  for (uint64_t at = 0; at < size;) {
    ssize_t r = pread(fd, b + at, (size_t)(size - at), (off_t)at);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      free(b);
      return pulse_fail(PULSE_ERR_IO, "journal: read: %s", r < 0 ? strerror(errno) : "short");
    }
    at += (uint64_t)r;
  }
  *out = b;
  return PULSE_OK;
}

/* The window of the file a replay holds in memory at a time; a test sets
 * another (PULSE_TEST_REPLAY_WINDOW=N bytes, any N >= 1: an odd one puts
 * elements across the windows' edges). */
#define REPLAY_WINDOW ((uint64_t)64 << 20)

static uint64_t replay_window(void) {
  const char *v = getenv("PULSE_TEST_REPLAY_WINDOW");
  char *end = NULL;
  unsigned long long n = v != NULL ? strtoull(v, &end, 10) : 0;
  return v != NULL && end != NULL && *end == '\0' && n >= 1 ? (uint64_t)n : REPLAY_WINDOW;
}

/* Replays the transactions in j[0, n) (checked) into the file fd of
 * `size` bytes, a window at a time from the end (the header last): each
 * window read, every transaction applied to it in order, and only the
 * pages that then differ written (a file that holds the journal's steps
 * already, as after a clean exit, is not written at all). *changed gets
 * the bytes written. */
static pulse_status replay(pulse_sub *sub, int fd, uint64_t size, const uint8_t *j, size_t n,
                           uint64_t *changed) {
  uint64_t window = replay_window(), cap = size < window ? size : window;
  uint8_t *win = malloc((size_t)cap), *orig = malloc((size_t)cap);
  pulse_status st = win != NULL && orig != NULL
                        ? PULSE_OK
                        : pulse_fail(PULSE_ERR_NOMEM, "%s: replaying its journal", sub->file_path);
  *changed = 0;
  uint64_t windows = (size + cap - 1) / cap;
  for (uint64_t w = windows; w-- > 0 && st == PULSE_OK;) {
    uint64_t from = w * cap, len = size - from < cap ? size - from : cap;
    if (read_all_at(fd, win, len, from) != 0) {
      st = pulse_fail(PULSE_ERR_IO, "%s: read: %s", sub->file_path, strerror(errno));
      break;
    }
    memcpy(orig, win, (size_t)len);
    size_t used = 0;
    for (size_t at = 0; at < n; at += used) {
      used = (size_t)pulse_load_le64(j + at + 8);
      sub_journal_apply_window(win, from, len, j + at, used);
    }
    /* The header's length goes last (header_close): the pages below keep
     * the file's own 8 bytes, whatever they are, until every other byte is
     * written. */
    uint8_t length[8];
    int length_last = from == 0 && len >= 8 && memcmp(win, orig, 8) != 0;
    if (length_last) {
      memcpy(length, win, 8);
      memcpy(win, orig, 8);
    }
    for (uint64_t pg = 0; pg < len && st == PULSE_OK;) {
      uint64_t end = pg + 4096 < len ? pg + 4096 : len;
      if (memcmp(win + pg, orig + pg, (size_t)(end - pg)) == 0) {
        pg = end;
        continue;
      }
      uint64_t run = end; /* the differing pages that follow, in one write */
      while (run < len) {
        uint64_t e = run + 4096 < len ? run + 4096 : len;
        if (memcmp(win + run, orig + run, (size_t)(e - run)) == 0)
          break;
        run = e;
      }
      st = sub_file_pwrite(sub, fd, win + pg, run - pg, from + pg, sub->file_path);
      *changed += run - pg;
      pg = run;
    }
    if (st == PULSE_OK && length_last) {
      st = sub_file_pwrite(sub, fd, length, 8, 0, sub->file_path);
      *changed += 8;
    }
  }
  free(win);
  free(orig);
  return st;
}

pulse_status sub_journal_recover(pulse_sub *sub, uint64_t *replayed) {
  struct sub_file *f = sub->file;
  *replayed = 0;
  int jfd = open(f->journal_path, O_RDONLY | O_CLOEXEC);
  if (jfd < 0)
    return errno == ENOENT ? PULSE_OK
                           : pulse_fail(PULSE_ERR_IO, "%s: %s", f->journal_path, strerror(errno));
  struct stat js, fs;
  int fd = open(sub->file_path, O_RDWR | O_CLOEXEC);
  uint8_t *j = NULL;
  pulse_status st = PULSE_OK;
  char msg[1024] = "";
  if (fstat(jfd, &js) != 0 || fd < 0 || fstat(fd, &fs) != 0 || !S_ISREG(fs.st_mode) ||
      fs.st_size < 8) {
    snprintf(msg, sizeof msg, "%s: its journal has no file to repair: dropped", sub->file_path);
  } else if ((uint64_t)js.st_size > 8 * (uint64_t)fs.st_size + ((uint64_t)1 << 20)) {
    snprintf(msg, sizeof msg, "%s: its journal is too large to be its own: dropped",
             sub->file_path);
  } else if (js.st_size > 0) {
    st = read_all(jfd, (uint64_t)js.st_size, &j);
    size_t at = 0, used = 0;
    uint64_t step = 0, changed = 0;
    while (st == PULSE_OK && sub_journal_check(j + at, (size_t)js.st_size - at, (uint64_t)fs.st_size, &used)) {
      step = pulse_load_le64(j + at + 24);
      at += used;
      ++*replayed;
    }
    if (st == PULSE_OK && *replayed > 0)
      st = replay(sub, fd, (uint64_t)fs.st_size, j, at, &changed);
    /* After a clean exit the file already holds everything (the journal
     * only waited for its pages to reach the disk): nothing to report. */
    if (st == PULSE_OK && *replayed > 0 && changed > 0)
      snprintf(msg, sizeof msg,
               "%s: the last run stopped while writing step %" PRIu64
               ": finished from its journal (%" PRIu64 " transaction(s))%s",
               sub->file_path, step, *replayed,
               at < (size_t)js.st_size ? "; a torn one after them was dropped" : "");
    else if (st == PULSE_OK && at < (size_t)js.st_size)
      snprintf(msg, sizeof msg,
               "%s: the last run stopped while journaling a step: the torn journal was "
               "dropped, the file keeps the step before it",
               sub->file_path);
    if (st == PULSE_OK && fdatasync(fd) != 0)
      st = pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", sub->file_path, strerror(errno));
  }
  free(j);
  if (fd >= 0)
    close(fd);
  close(jfd);
  if (st != PULSE_OK) /* kept for the next attempt */
    return st;
  sub_file_kill_point(); /* the test hook: replayed, not yet retired */
  if (unlink(f->journal_path) == 0)
    fsync_parent(f->journal_path);
  if (msg[0] != '\0')
    warn(sub, msg);
  return PULSE_OK;
}

/* The target whose data starts at file offset off with numel elements, or
 * n (the offsets grow with the index). */
static size_t target_at(const struct sub_file *f, const sub_target *t, size_t n, uint64_t off,
                        uint64_t numel) {
  size_t lo = 0, hi = n < f->noffset ? n : f->noffset;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (f->offset[mid] < off)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (; lo < n && lo < f->noffset && f->offset[lo] == off; lo++)
    if (t[lo].numel == numel && numel > 0)
      return lo;
  return n;
}

/* Walks the records of a checked transaction: with apply 0, whether each
 * is a whole tensor of t; with apply 1, writes its changes into t and
 * marks the file pages that change. */
static int records_walk(struct sub_file *f, sub_target *t, size_t n, const uint8_t *tx,
                        size_t size, int apply, uint64_t *changed) {
  uint64_t hsize = pulse_load_le64(tx + 32);
  const uint8_t *p = tx + TXN_FIXED + hsize, *end = tx + size - TXN_SUM;
  while (p < end) {
    uint64_t off = pulse_load_le64(p), numel = pulse_load_le64(p + 8);
    uint64_t count = pulse_load_le64(p + 16);
    p += 24;
    size_t k = target_at(f, t, n, off, numel);
    if (k == n)
      return 0;
    uint16_t *data = t[k].data;
    uint64_t pos = 0;
    for (uint64_t j = 0; j < count; j++) {
      p = record_step(p, &pos);
      uint16_t v = pulse_load_le16(p); /* checked: pos < numel */
      p += 2;
      if (apply && data[pos] != v) {
        uint64_t page = (off + 2 * pos) >> 12;
        data[pos] = v;
        f->dirty[page >> 6] |= (uint64_t)1 << (page & 63);
        ++*changed;
      }
    }
  }
  return 1;
}

pulse_status sub_journal_replay_loaded(pulse_sub *sub, sub_target *t, size_t n, int writable,
                                       int *done) {
  struct sub_file *f = sub->file;
  *done = 1;
  int jfd = open(f->journal_path, O_RDONLY | O_CLOEXEC);
  if (jfd < 0)
    return errno == ENOENT ? PULSE_OK
                           : pulse_fail(PULSE_ERR_IO, "%s: %s", f->journal_path, strerror(errno));
  *done = 0;
  struct stat js;
  uint8_t *j = NULL;
  if (!writable || fstat(jfd, &js) != 0 ||
      (uint64_t)js.st_size > 8 * f->size + ((uint64_t)1 << 20) ||
      read_all(jfd, (uint64_t)js.st_size, &j) != PULSE_OK) {
    close(jfd);
    return PULSE_OK; /* sub_journal_recover says what it does with it */
  }
  close(jfd);
  size_t at = 0, used = 0, last = 0;
  uint64_t count = 0, step = 0;
  while (sub_journal_check(j + at, (size_t)js.st_size - at, f->size, &used)) {
    last = at;
    step = pulse_load_le64(j + at + 24);
    at += used;
    count++;
  }
  int fits = 1;
  if (count > 0) /* the file holds the last claim: no step stopped halfway */
    fits = pulse_load_le64(j + last + 32) == f->header_size &&
           memcmp(j + last + TXN_FIXED, f->map, (size_t)f->header_size) == 0;
  for (size_t x = 0, u = 0; fits && x < at; x += u) {
    u = (size_t)pulse_load_le64(j + x + 8);
    fits = records_walk(f, t, n, j + x, u, 0, NULL);
  }
  uint64_t words = (f->size >> 12) / 64 + 1, changed = 0;
  if (fits && f->dirty == NULL && (f->dirty = calloc((size_t)words, sizeof *f->dirty)) == NULL)
    fits = 0;
  if (!fits) {
    free(j);
    return PULSE_OK;
  }
  for (size_t x = 0, u = 0; x < at; x += u) {
    u = (size_t)pulse_load_le64(j + x + 8);
    records_walk(f, t, n, j + x, u, 1, &changed);
  }
  /* Pages the kernel lost (a power cut after the last run wrote them), with
   * the header closed meanwhile and put back (the file's own, which the
   * last claim is) at the end. */
  pulse_status st = PULSE_OK;
  if (changed > 0) {
    st = header_close(sub, f->fd);
    if (st == PULSE_OK)
      st = write_pages(sub, t, n, j + last + TXN_FIXED);
  }
  free(j);
  memset(f->dirty, 0, (size_t)words * sizeof *f->dirty);
  if (st == PULSE_OK && fdatasync(f->fd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", sub->file_path, strerror(errno));
  if (st != PULSE_OK)
    return st; /* the journal is kept for the next attempt */
  sub_file_kill_point(); /* the test hook: replayed, not yet retired */
  if (unlink(f->journal_path) == 0)
    fsync_parent(f->journal_path);
  *done = 1;
  char msg[1024] = "";
  if (changed > 0)
    snprintf(msg, sizeof msg,
             "%s: the last run stopped while writing step %" PRIu64
             ": finished from its journal (%" PRIu64 " transaction(s))%s",
             sub->file_path, step, count,
             at < (size_t)js.st_size ? "; a torn one after them was dropped" : "");
  else if (at < (size_t)js.st_size)
    snprintf(msg, sizeof msg,
             "%s: the last run stopped while journaling a step: the torn journal was "
             "dropped, the file keeps the step before it",
             sub->file_path);
  if (msg[0] != '\0')
    warn(sub, msg);
  return PULSE_OK;
}
