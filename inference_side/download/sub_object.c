/* sub_object.c - downloading objects into the cache: resumable, in parallel
 * ranges when large, verified before they get their name.
 *
 * An object of n bytes is cut into segments (one, or opts.parallel for
 * objects of at least opts.parallel_min_bytes); segment k is downloaded into
 * objects/.<sha>.part (k = 0) or objects/.<sha>.part-<offset>, appending, so
 * a file's size is how much of its segment is held: a restart, a retry or
 * another URL continues with a Range request from there (objects are named
 * by their content, so bytes from any URL fit). When every segment is whole
 * the others are appended to the first, its size and SHA-256 are checked
 * against the signed head, and only then is it fsynced and renamed to
 * objects/<sha>.<ext>. Bytes that do not verify are deleted and fetched
 * again once, then from the next URL; a URL that served them wrong twice
 * is not asked for that object again until the head changes. Nothing is
 * fetched of an object larger than opts.max_object_bytes. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_http_impl.h"
#include "sub_impl.h"
#include "sub_segments_impl.h"

#define SEG_MAX SUB_SEG_MAX

typedef struct {
  uint64_t origin, len; /* object bytes [origin, origin + len) */
  uint64_t have;        /* bytes held in the file */
  int fd;
  char path[4096];
  pulse_fetch_xfer x;
} seg;

typedef struct {
  pulse_sub *sub;
  const pulse_store_object *o;
  const sub_source *src; /* NULL: the store's v1/<path> on every URL */
  seg segs[SEG_MAX];
  size_t n;
  double last_emit;
  /* With a sink: the object is also assembled in sink->buf and hashed as
   * its contiguous prefix grows. */
  sub_sink *sink;
  EVP_MD_CTX *md;
  uint64_t hashed; /* bytes of buf hashed so far (the prefix fed) */
  /* The download deadline from the URL being tried (opts.min_bytes_per_s,
   * opts.download_grace_ms): monotonic seconds, INFINITY for none; how it
   * may move with the rate measured (deadline_extend): the rate asked,
   * the slowest rate that still moves it, the latest it can be, and the
   * bytes this URL delivered since url_t0. */
  double deadline, allowed_s;
  double min_rate, floor_rate, hard_deadline, url_t0;
  uint64_t url_bytes;
} fetch_ctx;

static void sha_hex(const pulse_store_object *o, char hex[65]) {
  store_hex(o->sha256, 32, hex);
}

void sub_object_path(const pulse_sub *sub, const pulse_store_object *o,
                     char *out, size_t cap) {
  snprintf(out, cap, "%s/%s", sub->cache_dir, o->path);
}

static void seg_path(const pulse_sub *sub, const pulse_store_object *o,
                     uint64_t origin, char *out, size_t cap) {
  char hex[65];
  sha_hex(o, hex);
  if (origin == 0)
    snprintf(out, cap, "%s/" PULSE_STORE_OBJECTS_DIR "/.%s.part",
             sub->cache_dir, hex);
  else
    snprintf(out, cap, "%s/" PULSE_STORE_OBJECTS_DIR "/.%s.part-%" PRIu64,
             sub->cache_dir, hex, origin);
}

size_t sub_segments_plan(unsigned parallel, uint64_t parallel_min_bytes,
                         uint64_t size, uint64_t origin[SUB_SEG_MAX],
                         uint64_t len[SUB_SEG_MAX]) {
  uint64_t n = 1;
  if (parallel > 1 && size >= parallel_min_bytes && size > SUB_SEG_ALIGN)
    n = parallel < SUB_SEG_MAX ? parallel : SUB_SEG_MAX;
  /* ceil(size / n) and the alignment, without wrapping near 2^64 (a head
   * may name any size: these once wrapped and overran the arrays). */
  uint64_t step = size / n + (size % n != 0);
  if (n > 1 && step % SUB_SEG_ALIGN != 0)
    step = sub_add_sat(step, SUB_SEG_ALIGN - step % SUB_SEG_ALIGN);
  size_t k = 0;
  uint64_t at = 0;
  for (;;) {
    origin[k] = at;
    len[k] = size - at < step ? size - at : step;
    k++;
    /* at + step <= size here, so it does not wrap; n * step >= size, so
     * the bound is never what stops a valid plan. */
    if (size - at <= step || k == SUB_SEG_MAX)
      break;
    at += step;
  }
  return k;
}

/* Cuts an object into segments. */
static size_t seg_plan(const pulse_sub *sub, uint64_t size, uint64_t *origin,
                       uint64_t *len) {
  return sub_segments_plan(sub->opts.parallel, sub->opts.parallel_min_bytes,
                           size, origin, len);
}

static uint64_t file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) ? (uint64_t)sb.st_size : 0;
}

uint64_t sub_object_have(const pulse_sub *sub, const pulse_store_object *o) {
  char path[4096];
  sub_object_path(sub, o, path, sizeof path);
  if (file_size(path) == o->size)
    return o->size;
  uint64_t origin[SEG_MAX], len[SEG_MAX], have = 0;
  size_t n = seg_plan(sub, o->size, origin, len);
  for (size_t k = 0; k < n; k++) {
    seg_path(sub, o, origin[k], path, sizeof path);
    uint64_t h = file_size(path);
    have += h < len[k] ? h : len[k];
  }
  return have;
}

/* Removes every partial file of an object, also those of another plan. */
static void remove_parts(const pulse_sub *sub, const pulse_store_object *o) {
  char dir[4096], prefix[80], hex[65];
  sha_hex(o, hex);
  snprintf(prefix, sizeof prefix, ".%s.part", hex);
  snprintf(dir, sizeof dir, "%s/" PULSE_STORE_OBJECTS_DIR, sub->cache_dir);
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
      unlinkat(dirfd(d), e->d_name, 0);
  closedir(d);
}

/* Removes partial files of this object that the current plan does not use
 * (a restart with another --parallel). */
static void remove_stray_parts(const fetch_ctx *c) {
  char dir[4096], prefix[80], hex[65];
  sha_hex(c->o, hex);
  snprintf(prefix, sizeof prefix, ".%s.part-", hex);
  snprintf(dir, sizeof dir, "%s/" PULSE_STORE_OBJECTS_DIR, c->sub->cache_dir);
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
      continue;
    uint64_t at = strtoull(e->d_name + strlen(prefix), NULL, 10);
    int used = 0;
    for (size_t k = 1; k < c->n; k++)
      used |= c->segs[k].origin == at;
    if (!used)
      unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

static void close_segs(fetch_ctx *c) {
  for (size_t k = 0; k < c->n; k++)
    if (c->segs[k].fd >= 0) {
      close(c->segs[k].fd);
      c->segs[k].fd = -1;
    }
}

static pulse_status open_segs(fetch_ctx *c) {
  uint64_t origin[SEG_MAX], len[SEG_MAX];
  c->n = seg_plan(c->sub, c->o->size, origin, len);
  for (size_t k = 0; k < c->n; k++) {
    seg *s = &c->segs[k];
    s->origin = origin[k];
    s->len = len[k];
    s->fd = -1;
  }
  remove_stray_parts(c);
  for (size_t k = 0; k < c->n; k++) {
    seg *s = &c->segs[k];
    seg_path(c->sub, c->o, s->origin, s->path, sizeof s->path);
    s->fd = open(s->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->fd < 0) {
      close_segs(c);
      return pulse_fail(PULSE_ERR_IO, "%s: %s", s->path, strerror(errno));
    }
    struct stat sb;
    s->have = fstat(s->fd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    /* Longer than its segment: an interrupted assembly appended the others
     * to the first; its own prefix is still good. */
    if (s->have > s->len) {
      if (ftruncate(s->fd, (off_t)s->len) != 0) {
        close_segs(c);
        return pulse_fail(PULSE_ERR_IO, "%s: %s", s->path, strerror(errno));
      }
      s->have = s->len;
    }
  }
  return PULSE_OK;
}

static void on_progress(pulse_sub *sub, pulse_fetch_xfer *x) {
  fetch_ctx *c = x->progress_ctx;
  double now = sub_now();
  if (sub->opts.on_event == NULL || now - c->last_emit < 0.25)
    return;
  c->last_emit = now;
  uint64_t held = 0;
  for (size_t k = 0; k < c->n; k++)
    held +=
        c->segs[k].have +
        (pulse_fetch_xfer_running(&c->segs[k].x) ? c->segs[k].x.received : 0);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_PROGRESS;
  ev.object = c->o->path;
  ev.bytes = held;
  ev.total = c->o->size;
  sub_emit(sub, &ev);
}

/* ----------------------------------------------------------------- sink */

/* Bytes held from the start of the object without a gap. During a run a
 * segment holds what it had plus what its transfer kept so far. */
static uint64_t sink_prefix(const fetch_ctx *c) {
  for (size_t k = 0; k < c->n; k++) {
    const seg *s = &c->segs[k];
    uint64_t held =
        s->have + (pulse_fetch_xfer_running(&s->x) ? s->x.received : 0);
    if (held < s->len)
      return s->origin + held;
  }
  return c->o->size;
}

/* Hashes what the prefix gained and tells the sink. */
static void sink_advance(fetch_ctx *c) {
  uint64_t prefix = sink_prefix(c);
  if (prefix <= c->hashed && !(prefix == 0 && c->o->size == 0))
    return;
  double t0 = sub_now();
  EVP_DigestUpdate(c->md, c->sink->buf + c->hashed,
                   (size_t)(prefix - c->hashed));
  c->hashed = prefix;
  double dt = sub_now() - t0;
  c->sub->t_verify += dt;
  c->sub->t_cb += dt;
  c->sink->on_prefix(c->sink, prefix);
}

static void sink_on_data(pulse_fetch_xfer *x) {
  sink_advance(x->progress_ctx);
}

/* Starts the sink over: the bytes the partial files hold, hashed. */
static pulse_status sink_restart(fetch_ctx *c, int tell) {
  if (tell)
    c->sink->on_restart(c->sink);
  c->hashed = 0;
  if (EVP_DigestInit_ex(c->md, EVP_sha256(), NULL) != 1)
    return pulse_fail(PULSE_ERR_INTERNAL, "sha256 of %s", c->o->path);
  for (size_t k = 0; k < c->n; k++) {
    seg *s = &c->segs[k];
    uint64_t got = 0;
    while (got < s->have) {
      ssize_t r = pread(s->fd, c->sink->buf + s->origin + got,
                        (size_t)(s->have - got), (off_t)got);
      if (r < 0 && errno == EINTR)
        continue;
      if (r <= 0)
        break;
      got += (uint64_t)r;
    }
    s->have = got; /* a short read: fetched again from there */
  }
  sink_advance(c);
  return PULSE_OK;
}

/* Past its deadline a download goes on while the source's measured rate
 * is at least this fraction of the minimum rate: the link is slow, the
 * source is not dripping (a worker at 50 KB/s under the default 256 KB/s
 * once had every anchor cut at 38 s of its 40, and never synced). */
#define SUB_DEADLINE_FLOOR_DIV 8.0

/* Starts the download deadline for one URL: the grace plus the object's
 * size at the minimum rate (at most half the worker's own rate limit: a
 * worker that limits itself is not a slow source). */
static void deadline_start(fetch_ctx *c) {
  const pulse_sub_opts *o = &c->sub->opts;
  c->deadline = c->hard_deadline = INFINITY;
  c->url_t0 = sub_now();
  c->url_bytes = 0;
  if (o->min_bytes_per_s == 0)
    return;
  double rate = (double)o->min_bytes_per_s;
  if (o->max_recv_bytes_per_s != 0 && (double)o->max_recv_bytes_per_s / 2 < rate)
    rate = (double)o->max_recv_bytes_per_s / 2;
  if (rate < 1)
    rate = 1;
  double grace = o->download_grace_ms / 1000.0;
  c->min_rate = rate;
  c->floor_rate = rate / SUB_DEADLINE_FLOOR_DIV;
  c->allowed_s = grace + (double)c->o->size / rate;
  c->deadline = c->url_t0 + c->allowed_s;
  c->hard_deadline = c->url_t0 + grace + (double)c->o->size / c->floor_rate;
}

/* At the deadline: 1 when it moves, to when the rest would arrive at the
 * rate this URL delivered so far (plus the grace), because that rate is at
 * least floor_rate; never past hard_deadline. */
static int deadline_extend(fetch_ctx *c, uint64_t held) {
  double now = sub_now(), took = now - c->url_t0;
  double rate = took > 0 ? (double)c->url_bytes / took : 0;
  if (now >= c->hard_deadline || rate < c->floor_rate || held >= c->o->size)
    return 0;
  double next = now + c->sub->opts.download_grace_ms / 1000.0 +
                (double)(c->o->size - held) / rate;
  c->deadline = next < c->hard_deadline ? next : c->hard_deadline;
  c->allowed_s = c->deadline - c->url_t0;
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "subscriber: %s: slower than %.0f B/s (%.0f B/s measured): its "
               "deadline moves to %.0f s",
               c->o->path, c->min_rate, rate, c->allowed_s);
  return 1;
}

/* Bytes of the object held in the segments' files. */
static uint64_t held_bytes(const fetch_ctx *c) {
  uint64_t h = 0;
  for (size_t k = 0; k < c->n; k++)
    h += c->segs[k].have;
  return h;
}

static pulse_status deadline_passed(const fetch_ctx *c, const char *url) {
  double took = sub_now() - c->url_t0;
  return pulse_fail(PULSE_ERR_IO,
                    "%s: %s: not downloaded within its deadline of %.0f s "
                    "(%" PRIu64 " bytes at %.0f B/s, plus %" PRIu32
                    " ms; %.0f B/s measured, under the %.0f B/s that move it):"
                    " the source is too slow (the bytes held are kept)",
                    c->o->path, url, c->allowed_s, c->o->size, c->min_rate,
                    c->sub->opts.download_grace_ms,
                    took > 0 ? (double)c->url_bytes / took : 0.0,
                    c->floor_rate);
}

/* Downloads every missing segment byte from URL `url`, with retries, until
 * the deadline. */
static pulse_status download(fetch_ctx *c, size_t url) {
  pulse_sub *sub = c->sub;
  char objurl[2048], rel[PULSE_STORE_PATH_MAX + 8];
  if (c->src != NULL)
    snprintf(rel, sizeof rel, "%s", c->src->rel);
  else
    snprintf(rel, sizeof rel, "%s%s", sub->url_static[url] ? "" : "v1/",
             c->o->path); /* from the signed path, never `url` */
  sub_url(sub, url, rel, objurl, sizeof objurl);
  unsigned attempt = 0;
  for (;;) {
    pulse_fetch_xfer *run[SEG_MAX];
    size_t nrun = 0;
    for (size_t k = 0; k < c->n; k++) {
      seg *s = &c->segs[k];
      if (s->have >= s->len)
        continue;
      pulse_fetch_xfer_init(&s->x, objurl);
      s->x.fd = s->fd;
      s->x.fd_origin = s->origin;
      s->x.expect_total = c->o->size;
      s->x.low_speed = 1;
      s->x.progress_ctx = c;
      if (c->src != NULL)
        snprintf(s->x.if_range, sizeof s->x.if_range, "%s", c->src->etag);
      if (c->sink != NULL) {
        s->x.copy = c->sink->buf;
        s->x.on_data = sink_on_data;
      }
      if (!(c->n == 1 && s->have == 0)) {
        s->x.ranged = 1;
        s->x.range_from = s->origin + s->have;
        s->x.range_to = s->origin + s->len - 1;
      }
      run[nrun++] = &s->x;
    }
    if (nrun == 0)
      return PULSE_OK;
    double left = c->deadline - sub_now();
    if (left <= 0 && !deadline_extend(c, held_bytes(c)))
      return deadline_passed(c, objurl);
    left = c->deadline - sub_now();
    if (left < 4e6) /* each try ends at the deadline at the latest */
      for (size_t k = 0; k < nrun; k++)
        run[k]->timeout_ms = (uint32_t)(left * 1000.0) + 1;
    PULSE_TRY(sub_http_run(sub, run, nrun, on_progress));
    pulse_status st = PULSE_OK;
    int progressed = 0, retry = 1;
    for (size_t k = 0; k < c->n; k++) {
      seg *s = &c->segs[k];
      if (s->have >= s->len)
        continue;
      s->have += s->x.received;
      c->url_bytes += s->x.received;
      progressed |= s->x.received > 0;
      s->x.received = 0; /* counted in have now (sink_prefix) */
      if (pulse_fetch_xfer_ok(&s->x) && s->have >= s->len)
        continue;
      if (s->x.status == 416)
        /* The server's object ends before the head says it does. */
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "%s: range %" PRIu64
                        "- refused (416): not the object the head names",
                        objurl, s->origin + s->have);
      else if (pulse_fetch_xfer_ok(&s->x))
        st = pulse_fail(PULSE_ERR_IO, "%s: the answer ended early", objurl);
      else
        st = pulse_fetch_xfer_fail(&s->x, c->o->path);
      retry &= s->x.status != 416 && (pulse_fetch_xfer_ok(&s->x) ||
                                      pulse_fetch_xfer_retryable(&s->x));
    }
    if (c->sink != NULL)
      sink_advance(c);
    if (st == PULSE_OK)
      return PULSE_OK;
    if (sub_now() >= c->deadline && !deadline_extend(c, held_bytes(c)))
      return deadline_passed(c, objurl);
    if (progressed)
      attempt = 0; /* a flaky link that moves forward is not given up */
    if (!retry || attempt >= sub->opts.retries)
      return st;
    unsigned delay = sub_backoff_ms(sub, attempt);
    for (size_t k = 0; k < c->n; k++) { /* a server that asks for longer */
      unsigned asked = pulse_fetch_xfer_retry_after_ms(&c->segs[k].x);
      delay = asked > delay ? asked : delay;
    }
    sub_http_retry(sub, c->o->path, attempt, delay, st);
    attempt++;
    if (sub_sleep_ms(sub, delay) != 0)
      return pulse_fail(PULSE_ERR_IO, "%s: stopped", c->o->path);
  }
}

/* Appends segment k's file to the first one. */
static pulse_status append_seg(fetch_ctx *c, size_t k) {
  seg *s = &c->segs[k], *first = &c->segs[0];
  off_t in = 0, out = (off_t)s->origin;
  uint64_t left = s->len;
  while (left > 0) {
    ssize_t n = copy_file_range(s->fd, &in, first->fd, &out, (size_t)left, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    left -= (uint64_t)n;
  }
  if (left > 0) { /* no copy_file_range here: copy by hand */
    static const size_t cap = (size_t)1 << 20;
    char *buf = malloc(cap);
    if (buf == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "assembling %s", c->o->path);
    while (left > 0) {
      size_t want = left < cap ? (size_t)left : cap;
      ssize_t r = pread(s->fd, buf, want, in);
      if (r <= 0 || pwrite(first->fd, buf, (size_t)r, out) != r) {
        free(buf);
        return pulse_fail(PULSE_ERR_IO, "assembling %s: %s", c->o->path,
                          strerror(errno));
      }
      in += r, out += r, left -= (uint64_t)r;
    }
    free(buf);
  }
  return PULSE_OK;
}

/* Bytes that are not the object: every partial file is removed. */
static pulse_status refuse(fetch_ctx *c, const uint8_t sha[32], uint64_t size) {
  close_segs(c);
  remove_parts(c->sub, c->o);
  char got[65];
  store_hex(sha, 32, got);
  return pulse_fail(PULSE_ERR_CORRUPT,
                    "%s: the bytes received hash to %s (%" PRIu64
                    " bytes), not to the signed name (%" PRIu64
                    " bytes): refused",
                    c->o->path, got, size, c->o->size);
}

/* Gives checked bytes their name: segments appended to the first, fsync,
 * rename. */
static pulse_status name_object(fetch_ctx *c, int assembled) {
  pulse_sub *sub = c->sub;
  for (size_t k = 1; k < c->n && !assembled; k++)
    PULSE_TRY(append_seg(c, k));
  if (!assembled && fsync(c->segs[0].fd) != 0)
    return pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", c->segs[0].path,
                      strerror(errno));
  close_segs(c);
  char final[4096], dir[4096];
  sub_object_path(sub, c->o, final, sizeof final);
  if (rename(c->segs[0].path, final) != 0)
    return pulse_fail(PULSE_ERR_IO, "%s: %s", final, strerror(errno));
  for (size_t k = 1; k < c->n; k++)
    unlink(c->segs[k].path);
  snprintf(dir, sizeof dir, "%s/" PULSE_STORE_OBJECTS_DIR, sub->cache_dir);
  sub_fsync_dir(dir);
  return PULSE_OK;
}

/* Assembles, checks and names the object. PULSE_ERR_CORRUPT: the bytes are
 * not the object (every partial file is then removed). With a sink whose
 * buffer was hashed as it arrived (it holds exactly the bytes written to
 * the files, those found on disk having been read from them), the hash is
 * checked first and the sink told at once, before the file is assembled
 * and made durable. */
static pulse_status install(fetch_ctx *c) {
  pulse_sub *sub = c->sub;
  uint8_t sha[32];
  if (c->sink != NULL && c->hashed == c->o->size) {
    double t0 = sub_now();
    unsigned len = 32;
    int ok = EVP_DigestFinal_ex(c->md, sha, &len) == 1;
    EVP_DigestInit_ex(c->md, EVP_sha256(), NULL);
    c->hashed = 0;
    sub->t_verify += sub_now() - t0;
    if (!ok)
      return pulse_fail(PULSE_ERR_INTERNAL, "sha256 of %s", c->o->path);
    if (memcmp(sha, c->o->sha256, 32) != 0)
      return refuse(c, sha, c->o->size);
    if (c->sink->on_verified != NULL)
      c->sink->on_verified(c->sink);
    return name_object(c, 0);
  }
  for (size_t k = 1; k < c->n; k++)
    PULSE_TRY(append_seg(c, k));
  if (fsync(c->segs[0].fd) != 0)
    return pulse_fail(PULSE_ERR_IO, "%s: fsync: %s", c->segs[0].path,
                      strerror(errno));
  double t0 = sub_now();
  uint64_t size = 0;
  pulse_status st = sub_sha256_file(c->segs[0].path, sha, &size);
  sub->t_verify += sub_now() - t0;
  if (st != PULSE_OK)
    return st;
  if (size != c->o->size || memcmp(sha, c->o->sha256, 32) != 0)
    return refuse(c, sha, size);
  return name_object(c, 1);
}

static void reject(pulse_sub *sub, const char *object, pulse_status st) {
  sub_count(sub, &sub->fig.rejected, 1);
  pulse_sub_event ev = {0};
  ev.type = PULSE_SUB_EV_REJECTED;
  ev.object = object;
  ev.status = st;
  ev.detail = pulse_error_detail();
  PULSE_LOG_AT(PULSE_LOG_WARN, "subscriber: %s", ev.detail);
  sub_emit(sub, &ev);
}

/* The identity of the file at path (0: none). */
static int identity(const char *path, sub_verified *v) {
  struct stat sb;
  if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
    return 0;
  v->dev = (uint64_t)sb.st_dev;
  v->ino = (uint64_t)sb.st_ino;
  v->size = (uint64_t)sb.st_size;
  v->mtime_ns = (int64_t)sb.st_mtim.tv_sec * 1000000000 + sb.st_mtim.tv_nsec;
  v->ctime_ns = (int64_t)sb.st_ctim.tv_sec * 1000000000 + sb.st_ctim.tv_nsec;
  return 1;
}

static sub_verified *find_verified(const pulse_sub *sub, const uint8_t sha[32]) {
  for (size_t i = 0; i < sub->nverified; i++)
    if (memcmp(sub->verified[i].sha256, sha, 32) == 0)
      return &sub->verified[i];
  return NULL;
}

static void forget(pulse_sub *sub, const uint8_t sha[32]) {
  sub_verified *v = find_verified(sub, sha);
  if (v != NULL)
    *v = sub->verified[--sub->nverified];
}

/* 1 when this process hashed the cached file at path as `sha` and the file
 * is still the one it hashed (same inode, size, mtime and ctime: any write,
 * replacement or truncation since changes one of them). */
static int verified(const pulse_sub *sub, const uint8_t sha[32],
                    const char *path) {
  sub_verified *v = find_verified(sub, sha), now;
  return v != NULL && identity(path, &now) && v->dev == now.dev &&
         v->ino == now.ino && v->size == now.size &&
         v->mtime_ns == now.mtime_ns && v->ctime_ns == now.ctime_ns;
}

/* Records that the cached file at path hashed to sha. */
static void remember(pulse_sub *sub, const uint8_t sha[32], const char *path) {
  sub_verified now;
  if (!identity(path, &now))
    return;
  memcpy(now.sha256, sha, 32);
  sub_verified *v = find_verified(sub, sha);
  if (v != NULL) {
    *v = now;
    return;
  }
  if (sub->nverified == sub->verified_cap) {
    size_t cap = sub->verified_cap ? 2 * sub->verified_cap : 64;
    sub_verified *more = realloc(sub->verified, cap * sizeof *more);
    if (more == NULL)
      return; /* only costs a hash later */
    sub->verified = more;
    sub->verified_cap = cap;
  }
  sub->verified[sub->nverified++] = now;
}

static int named(const pulse_store_head *h, const uint8_t sha[32]) {
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++)
    if (memcmp(pulse_store_head_patch(h, i)->sha256, sha, 32) == 0)
      return 1;
  for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++)
    if (memcmp(pulse_store_head_anchor(h, i)->sha256, sha, 32) == 0)
      return 1;
  return 0;
}

void sub_object_forget(pulse_sub *sub) {
  size_t k = 0;
  for (size_t i = 0; i < sub->nverified; i++)
    if (sub->head != NULL && named(sub->head, sub->verified[i].sha256))
      sub->verified[k++] = sub->verified[i];
  sub->nverified = k;
}

/* A whole cached object into the sink (checked again: a cache can rot). */
static pulse_status sink_from_cache(pulse_sub *sub, const pulse_store_object *o,
                                    sub_sink *sink) {
  pulse_buffer b = {NULL, 0};
  PULSE_TRY(sub_object_read(sub, o, &b));
  if (b.size > 0)
    memcpy(sink->buf, b.data, b.size);
  pulse_buffer_free(&b);
  sink->on_prefix(sink, o->size);
  return PULSE_OK;
}

pulse_status sub_object_size_check(const pulse_sub *sub,
                                   const pulse_store_object *o) {
  if (o->size > SUB_OBJECT_MAX_BYTES)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "%s: %" PRIu64 " bytes: larger than any file, refused",
                      o->path, o->size);
  if (o->size > sub->opts.max_object_bytes)
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "%s: the head names %" PRIu64
                      " bytes, more than the largest object allowed (%" PRIu64
                      " bytes: max_object_bytes, pulse-pull --max-object-size): "
                      "refused before downloading it",
                      o->path, o->size, sub->opts.max_object_bytes);
  return PULSE_OK;
}

/* 1 when source `url` served bytes of o that did not verify under the
 * current head. */
static int served_bad(const pulse_sub *sub, const pulse_store_object *o,
                      size_t url) {
  for (size_t i = 0; i < sub->nbad; i++)
    if (sub->bad[i].url == url &&
        memcmp(sub->bad[i].sha256, o->sha256, 32) == 0 &&
        strcmp(sub->bad[i].head_etag, sub->head_etag) == 0)
      return 1;
  return 0;
}

/* Source `url` served bytes of o that did not verify, twice: it is not
 * asked for o again until the head changes (a follower once fetched such
 * an anchor 40 times a minute). */
static void note_bad(pulse_sub *sub, const pulse_store_object *o, size_t url) {
  if (served_bad(sub, o, url))
    return;
  if (sub->nbad == SUB_BAD_MAX) { /* full: the oldest goes */
    memmove(&sub->bad[0], &sub->bad[1],
            (SUB_BAD_MAX - 1) * sizeof sub->bad[0]);
    sub->nbad--;
  }
  size_t k = sub->nbad++;
  memcpy(sub->bad[k].sha256, o->sha256, 32);
  sub->bad[k].url = url;
  snprintf(sub->bad[k].head_etag, sizeof sub->bad[k].head_etag, "%s",
           sub->head_etag);
}

static pulse_status fetch(pulse_sub *sub, const pulse_store_object *o,
                          const sub_source *src, sub_sink *sink) {
  PULSE_TRY(sub_object_size_check(sub, o));
  char final[4096];
  sub_object_path(sub, o, final, sizeof final);
  if (sink != NULL && file_size(final) == o->size && access(final, R_OK) == 0) {
    pulse_status st = sink_from_cache(sub, o, sink);
    if (st == PULSE_OK) {
      remember(sub, o->sha256, final);
      return PULSE_OK;
    }
    if (st != PULSE_ERR_CORRUPT)
      return st;
    reject(sub, o->path, PULSE_ERR_CORRUPT); /* removed: fetched again */
  }
  if (file_size(final) == o->size && access(final, R_OK) == 0) {
    if (verified(sub, o->sha256, final))
      return PULSE_OK;
    /* Checked when it was named; hashed again once per process and
     * whenever the file changed since, since a cache can rot or be
     * tampered with (and a relay serves it to others). */
    uint8_t sha[32];
    uint64_t size;
    double t0 = sub_now();
    pulse_status st = sub_sha256_file(final, sha, &size);
    sub->t_verify += sub_now() - t0;
    if (st == PULSE_OK && size == o->size && memcmp(sha, o->sha256, 32) == 0) {
      remember(sub, o->sha256, final);
      return PULSE_OK;
    }
    pulse_fail(PULSE_ERR_CORRUPT,
               "%s in the cache does not match its name: fetched again", final);
    reject(sub, o->path, PULSE_ERR_CORRUPT);
    forget(sub, o->sha256);
    unlink(final);
  }
  fetch_ctx *c = calloc(1, sizeof *c);
  if (c == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "download of %s", o->path);
  c->sub = sub;
  c->o = o;
  c->src = src;
  c->sink = sink;
  pulse_status st = open_segs(c);
  if (st == PULSE_OK && sink != NULL) {
    c->md = EVP_MD_CTX_new();
    st = c->md != NULL ? sink_restart(c, 0)
                       : pulse_fail(PULSE_ERR_NOMEM, "sha256 of %s", o->path);
  }
  if (st == PULSE_OK) {
    uint64_t resumed = 0;
    for (size_t k = 0; k < c->n; k++)
      resumed += c->segs[k].have;
    sub_count(sub, &sub->fig.bytes_resumed, resumed);
    pulse_sub_event ev = {0};
    ev.type = PULSE_SUB_EV_DOWNLOAD;
    ev.object = o->path;
    ev.total = o->size;
    ev.resumed = resumed;
    sub_emit(sub, &ev);
  }
  /* A source is one URL's; a store object is on every URL. */
  size_t u0 = src != NULL ? src->url : 0;
  size_t u1 = src != NULL ? src->url + 1 : sub->nurls;
  for (size_t u = u0; u < u1 && st == PULSE_OK; u++) {
    if (served_bad(sub, o, u)) {
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "%s: %s served bytes that do not verify (twice): not "
                      "asked for it again until the head changes",
                      o->path, sub->urls[u]);
      if (u + 1 < u1)
        st = PULSE_OK;
      continue;
    }
    deadline_start(c);
    for (int again = 0; again < 2; again++) {
      st = download(c, u);
      if (st == PULSE_OK)
        st = install(c);
      if (st == PULSE_OK) {
        remember(sub, o->sha256, final);
        sub_count(sub, &sub->fig.objects_fetched, 1);
        pulse_sub_event ev = {0};
        ev.type = PULSE_SUB_EV_OBJECT;
        ev.object = o->path;
        ev.total = o->size;
        sub_emit(sub, &ev);
        close_segs(c);
        EVP_MD_CTX_free(c->md);
        free(c);
        return PULSE_OK;
      }
      if (st != PULSE_ERR_CORRUPT)
        break;
      reject(sub, o->path, st);
      if (again == 1)
        note_bad(sub, o, u);
      if (open_segs(c) != PULSE_OK)
        break;
      if (sink != NULL && sink_restart(c, 1) != PULSE_OK)
        break;
    }
    if (atomic_load(&sub->stop))
      break;
    if (u + 1 < u1) {
      PULSE_LOG_AT(PULSE_LOG_INFO, "subscriber: %s; trying %s",
                   pulse_error_detail(), sub->urls[u + 1]);
      st = PULSE_OK;
    }
  }
  close_segs(c);
  EVP_MD_CTX_free(c->md);
  free(c);
  /* Gone or replaced by a newer version: what is held is of no use. */
  if (st == PULSE_ERR_NOT_FOUND && src != NULL)
    remove_parts(sub, o);
  return st;
}

pulse_status sub_object_fetch(pulse_sub *sub, const pulse_store_object *o) {
  return fetch(sub, o, NULL, NULL);
}

pulse_status sub_object_fetch_from(pulse_sub *sub, const pulse_store_object *o,
                                   const sub_source *src) {
  return fetch(sub, o, src, NULL);
}

pulse_status sub_object_fetch_sink(pulse_sub *sub, const pulse_store_object *o,
                                   const sub_source *src, sub_sink *sink) {
  return fetch(sub, o, src, sink);
}

pulse_status sub_object_read(pulse_sub *sub, const pulse_store_object *o,
                             pulse_buffer *out) {
  char path[4096];
  sub_object_path(sub, o, path, sizeof path);
  out->data = NULL;
  out->size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND, "%s: %s", path, strerror(errno));
  uint8_t *data = malloc(o->size ? o->size : 1);
  uint64_t got = 0;
  while (data != NULL && got < o->size) {
    ssize_t r = pread(fd, data + got, (size_t)(o->size - got), (off_t)got);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    got += (uint64_t)r;
  }
  close(fd);
  if (data == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "reading %s", path);
  double t0 = sub_now();
  uint8_t sha[32];
  store_sha256(data, got, sha);
  sub->t_verify += sub_now() - t0;
  if (got != o->size || memcmp(sha, o->sha256, 32) != 0) {
    free(data);
    unlink(path);
    forget(sub, o->sha256);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "%s changed in the cache since it was checked: removed",
                      path);
  }
  out->data = data;
  out->size = o->size;
  return PULSE_OK;
}
