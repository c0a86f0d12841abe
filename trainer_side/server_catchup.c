/* server_catchup.c - GET /v1/catchup/<step>: one patch from a retained step
 * to the head, squashed from the stored patches (the state at the step is
 * rebuilt from an anchor, since class-model patches squash against their
 * first base), cached in catchup/ (content-addressed objects and a
 * <from>-<to>.ref index) or, on a read-only store, in memory. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_file.h"
#include "pulse_log.h"
#include "server_impl.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_state_impl.h"

/* Builds the squashed patch from `from` to the head's step. */
static pulse_status build(pulse_server *srv, const pulse_store_head *head,
                          uint64_t from, pulse_buffer *out) {
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  PULSE_TRY(pulse_store_state_rebuild(srv->dir, head, from,
                                      srv->opts.catchup_threads, &s));
  size_t np = pulse_store_head_patch_count(head), first = np;
  for (size_t i = 0; i < np; i++)
    if (pulse_store_head_patch(head, i)->base_step == from) {
      first = i;
      break;
    }
  size_t count = np - first;
  pulse_buffer *bytes = calloc(count + 1, sizeof *bytes);
  pulse_patch **patches = calloc(count + 1, sizeof *patches);
  const uint16_t **base = calloc(s.count + 1, sizeof *base);
  pulse_status st = bytes && patches && base
                        ? PULSE_OK
                        : pulse_fail(PULSE_ERR_NOMEM, "catch-up");
  for (size_t i = 0; i < count && st == PULSE_OK; i++) {
    const pulse_store_object *o = pulse_store_head_patch(head, first + i);
    st = store_patch_read(srv->dir, o, &bytes[i]);
    if (st == PULSE_OK)
      st = pulse_patch_open(bytes[i].data, bytes[i].size, &patches[i]);
  }
  /* Bases in the first patch's table order, matched by name. */
  for (size_t i = 0; st == PULSE_OK && i < pulse_patch_tensor_count(patches[0]);
       i++) {
    pulse_patch_tensor pt;
    st = pulse_patch_tensor_get(patches[0], i, &pt);
    size_t k = 0;
    while (st == PULSE_OK && k < s.count &&
           strcmp(s.info[k].name, pt.info.name) != 0)
      k++;
    if (st == PULSE_OK && k == s.count)
      st =
          pulse_fail(PULSE_ERR_CORRUPT,
                     "catch-up: tensor '%s' is not in the state", pt.info.name);
    if (st == PULSE_OK)
      base[i] = s.bits[k];
  }
  if (st == PULSE_OK) {
    pulse_encode_opts eo = PULSE_ENCODE_OPTS_INIT;
    eo.pos_model = pulse_patch_pos_model(patches[count - 1]);
    eo.chunk_log2 = pulse_patch_chunk_log2(patches[count - 1]);
    eo.threads = srv->opts.catchup_threads;
    st = pulse_patch_squash((const pulse_patch *const *)patches, count, base,
                            &eo, out);
  }
  if (st == PULSE_OK &&
      (out->size < 96 ||
       memcmp(out->data + 64, pulse_store_head_state_digest(head)->bytes, 32) !=
           0)) {
    pulse_buffer_free(out);
    st = pulse_fail(PULSE_ERR_INTERNAL,
                    "catch-up: the squashed patch does not end at the head");
  }
  for (size_t i = 0; i < count; i++) {
    if (patches)
      pulse_patch_free(patches[i]);
    if (bytes)
      pulse_buffer_free(&bytes[i]);
  }
  free(bytes), free(patches), free(base);
  pulse_store_state_free(&s);
  return st;
}

static int catchup_path(char *buf, size_t cap, const char *dir,
                        const char *name) {
  int n = snprintf(buf, cap, "%s/" PULSE_STORE_CATCHUP_DIR "/%s", dir, name);
  return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Keeps a built patch: on disk when the store is writable, else in memory. */
static pulse_status keep(pulse_server *srv, uint64_t from, uint64_t to,
                         const pulse_buffer *b, srv_catchup *c) {
  memset(c, 0, sizeof *c);
  c->from = from;
  c->to = to;
  c->size = b->size;
  c->memfd = -1;
  store_sha256(b->data, b->size, c->sha256);
  char hex[65], name[128], path[4096], folder[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%s.pulse", hex);
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_CATCHUP_DIR, srv->dir);
  mkdir(folder, 0755);
  pulse_status st = catchup_path(path, sizeof path, srv->dir, name) == 0
                        ? pulse_file_write_atomic(path, b->data, b->size)
                        : PULSE_ERR_ARG;
  if (st == PULSE_OK) {
    char ref[100];
    int len = snprintf(ref, sizeof ref, "%s %" PRIu64 "\n", hex, b->size);
    snprintf(name, sizeof name, "%" PRIu64 "-%" PRIu64 ".ref", from, to);
    st = catchup_path(path, sizeof path, srv->dir, name) == 0
             ? pulse_file_write_atomic(path, ref, (size_t)len)
             : PULSE_ERR_ARG;
  }
  if (st == PULSE_OK)
    return PULSE_OK;
  PULSE_LOG_AT(PULSE_LOG_INFO,
               "server: catch-up %" PRIu64 "-%" PRIu64 " kept in memory: %s",
               from, to, pulse_error_detail());
  int fd = memfd_create("pulse-catchup", MFD_CLOEXEC);
  if (fd < 0)
    return pulse_fail(PULSE_ERR_IO, "server: memfd_create: %s",
                      strerror(errno));
  size_t done = 0;
  while (done < b->size) {
    ssize_t w = write(fd, b->data + done, b->size - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0) {
      close(fd);
      return pulse_fail(PULSE_ERR_IO, "server: memfd: %s", strerror(errno));
    }
    done += (size_t)w;
  }
  c->memfd = fd;
  return PULSE_OK;
}

/* An fd to read a cached catch-up from (caller closes), or -1. */
static int open_cached(pulse_server *srv, const srv_catchup *c) {
  if (c->memfd >= 0)
    return fcntl(c->memfd, F_DUPFD_CLOEXEC, 0);
  char hex[65], name[80], path[4096];
  store_hex(c->sha256, 32, hex);
  snprintf(name, sizeof name, "%s.pulse", hex);
  if (catchup_path(path, sizeof path, srv->dir, name) != 0)
    return -1;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  struct stat sb;
  if (fd >= 0 && (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) ||
                  (uint64_t)sb.st_size != c->size)) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void remember(pulse_server *srv, const srv_catchup *c) {
  if (srv->ncatchups == SRV_CATCHUP_MEMORY) {
    if (srv->catchups[0].memfd >= 0)
      close(srv->catchups[0].memfd);
    memmove(srv->catchups, srv->catchups + 1,
            (SRV_CATCHUP_MEMORY - 1) * sizeof *srv->catchups);
    srv->ncatchups--;
  }
  srv->catchups[srv->ncatchups++] = *c;
}

/* A catch-up of this range another process (or an earlier run) cached. */
static int find_on_disk(pulse_server *srv, uint64_t from, uint64_t to,
                        srv_catchup *c) {
  char name[64], path[4096];
  snprintf(name, sizeof name, "%" PRIu64 "-%" PRIu64 ".ref", from, to);
  if (catchup_path(path, sizeof path, srv->dir, name) != 0)
    return 0;
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  char hex[65];
  uint64_t size;
  int ok = fscanf(f, "%64s %" SCNu64, hex, &size) == 2;
  fclose(f);
  memset(c, 0, sizeof *c);
  c->from = from;
  c->to = to;
  c->size = size;
  c->memfd = -1;
  return ok && store_unhex(hex, strlen(hex), c->sha256, 32) == 0;
}

/* The fd of the catch-up from `from` to the head, built when needed. */
static pulse_status get_catchup(pulse_server *srv, const srv_head *h,
                                uint64_t from, int *fd, srv_catchup *out) {
  pthread_mutex_lock(&srv->catchup_lock);
  *fd = -1;
  for (size_t i = 0; i < srv->ncatchups && *fd < 0; i++)
    if (srv->catchups[i].from == from && srv->catchups[i].to == h->step) {
      *out = srv->catchups[i];
      *fd = open_cached(srv, out);
    }
  srv_catchup c;
  if (*fd < 0 && find_on_disk(srv, from, h->step, &c) &&
      (*fd = open_cached(srv, &c)) >= 0) {
    remember(srv, &c);
    *out = c;
  }
  if (*fd >= 0) {
    atomic_fetch_add(&srv->metrics.catchup_cache_hits, 1);
    pthread_mutex_unlock(&srv->catchup_lock);
    return PULSE_OK;
  }
  double t0 = pulse_serve_now();
  pulse_buffer b = {NULL, 0};
  pulse_status st = build(srv, h->head, from, &b);
  if (st == PULSE_OK)
    st = keep(srv, from, h->step, &b, &c);
  pulse_buffer_free(&b);
  if (st == PULSE_OK) {
    atomic_fetch_add(&srv->metrics.catchup_builds, 1);
    atomic_fetch_add(&srv->metrics.catchup_build_us,
                     (unsigned long long)((pulse_serve_now() - t0) * 1e6));
    remember(srv, &c);
    *out = c;
    *fd = open_cached(srv, &c);
    if (*fd < 0)
      st = pulse_fail(PULSE_ERR_IO,
                      "server: the catch-up just written cannot be opened");
  }
  pthread_mutex_unlock(&srv->catchup_lock);
  return st;
}

int srv_catchup_request(pulse_server *srv, pulse_serve_request *rq,
                        uint64_t from) {
  srv_head *h = srv_head_get(srv);
  if (h == NULL)
    return pulse_serve_reply_error(rq, 404, "the store has no head yet");
  if (from >= h->step || !pulse_store_head_has_step(h->head, from)) {
    uint64_t oldest = pulse_store_head_oldest_step(h->head), to = h->step;
    srv_head_release(h);
    if (from == to)
      return pulse_serve_reply_error(rq, 404, "step %" PRIu64 " is the head",
                                     from);
    return pulse_serve_reply_error(rq, 404,
                                   "step %" PRIu64
                                   " is not retained (oldest %" PRIu64
                                   ", head %" PRIu64 "): start from an anchor",
                                   from, oldest, to);
  }
  srv_catchup c;
  int fd = -1;
  pulse_status st = PULSE_OK;
  size_t np = pulse_store_head_patch_count(h->head);
  const pulse_store_object *last = pulse_store_head_patch(h->head, np - 1);
  if (last->base_step == from) {
    /* One step behind: the head's own patch is the catch-up. */
    memset(&c, 0, sizeof c);
    c.from = from;
    c.to = h->step;
    c.size = last->size;
    c.memfd = -1;
    memcpy(c.sha256, last->sha256, 32);
    char path[4096];
    if (store_join(path, sizeof path, srv->dir, last->path) == 0)
      fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
      st = pulse_fail(PULSE_ERR_NOT_FOUND, "server: %s is missing", last->path);
  } else {
    st = get_catchup(srv, h, from, &fd, &c);
  }
  if (st != PULSE_OK) {
    srv_head_release(h);
    return pulse_serve_reply_error(rq, st == PULSE_ERR_NOT_FOUND ? 404 : 500,
                                   "catch-up from step %" PRIu64 ": %s", from,
                                   pulse_error_detail());
  }
  char from_s[24], to_s[24], hex[65], etag[67], digest[65], sig_hex[129],
      pub_hex[65];
  snprintf(from_s, sizeof from_s, "%" PRIu64, from);
  snprintf(to_s, sizeof to_s, "%" PRIu64, h->step);
  store_hex(c.sha256, 32, hex);
  snprintf(etag, sizeof etag, "\"%s\"", hex);
  store_hex(pulse_store_head_state_digest(h->head)->bytes, 32, digest);
  const char *extra[16] = {"X-Pulse-From-Step",
                           from_s,
                           "X-Pulse-To-Step",
                           to_s,
                           "X-Pulse-State-Digest",
                           digest,
                           NULL};
  if (srv->opts.key != NULL) {
    char canon[512];
    int len = snprintf(canon, sizeof canon,
                       "pulse-catchup-signature/1\nfrom %s\nto "
                       "%s\nstate_digest %s\nsha256 %s\n"
                       "size %" PRIu64 "\n",
                       from_s, to_s, digest, hex, c.size);
    uint8_t sig[PULSE_SIGN_SIGNATURE_BYTES], pub[PULSE_SIGN_PUBLIC_BYTES];
    if (pulse_sign(srv->opts.key, canon, (size_t)len, sig) == PULSE_OK) {
      pulse_sign_key_public(srv->opts.key, pub);
      store_hex(sig, sizeof sig, sig_hex);
      store_hex(pub, sizeof pub, pub_hex);
      extra[6] = "X-Pulse-Signature";
      extra[7] = sig_hex;
      extra[8] = "X-Pulse-Public-Key";
      extra[9] = pub_hex;
      extra[10] = NULL;
    }
  }
  srv_head_release(h);
  pulse_serve_meta m = {0, NULL, PULSE_SERVE_NO_CACHE, etag, extra};
  return pulse_serve_reply_fd(rq, &m, fd, c.size);
}

/* Drops cached catch-ups that do not end at the current head. */
void srv_catchup_clean(pulse_server *srv) {
  srv_head *h = srv_head_get(srv);
  if (h == NULL)
    return;
  uint64_t step = h->step;
  srv_head_release(h);
  if (step == srv->catchup_clean_step)
    return;
  /* Never wait behind a build: try again on the next round. */
  if (pthread_mutex_trylock(&srv->catchup_lock) != 0)
    return;
  size_t k = 0;
  for (size_t i = 0; i < srv->ncatchups; i++) {
    if (srv->catchups[i].to == step)
      srv->catchups[k++] = srv->catchups[i];
    else if (srv->catchups[i].memfd >= 0)
      close(srv->catchups[i].memfd);
  }
  srv->ncatchups = k;
  char folder[4096];
  snprintf(folder, sizeof folder, "%s/" PULSE_STORE_CATCHUP_DIR, srv->dir);
  DIR *d = opendir(folder);
  if (d != NULL) {
    /* Refs that do not end at the head go, then every object no remaining
     * ref names. */
    char keep_hex[SRV_CATCHUP_MEMORY * 8][65];
    size_t nkeep = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      uint64_t from, to;
      char tail[8];
      if (sscanf(e->d_name, "%" SCNu64 "-%" SCNu64 ".%4s", &from, &to, tail) !=
              3 ||
          strcmp(tail, "ref") != 0)
        continue;
      srv_catchup c;
      if (to == step && nkeep < sizeof keep_hex / sizeof keep_hex[0] &&
          find_on_disk(srv, from, to, &c)) {
        store_hex(c.sha256, 32, keep_hex[nkeep++]);
        continue;
      }
      unlinkat(dirfd(d), e->d_name, 0);
    }
    rewinddir(d);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
      pulse_store_kind kind;
      uint8_t sha[32];
      if (!store_parse_object_name(e->d_name, &kind, sha) &&
          !store_is_temp_name(e->d_name))
        continue;
      int kept = 0;
      for (size_t i = 0; i < nkeep && !kept; i++)
        kept = strncmp(e->d_name, keep_hex[i], 64) == 0;
      /* Temporaries of a build in progress elsewhere are left for it. */
      if (!kept && !store_is_temp_name(e->d_name))
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
  }
  srv->catchup_clean_step = step;
  pthread_mutex_unlock(&srv->catchup_lock);
}

void srv_catchup_free(pulse_server *srv) {
  for (size_t i = 0; i < srv->ncatchups; i++)
    if (srv->catchups[i].memfd >= 0)
      close(srv->catchups[i].memfd);
  srv->ncatchups = 0;
}
