/* shard_step.c - one collective step of a sharded trainer through the store
 * folder (pulse_pub_shard_step, pulse_pub_shard.h; docs/protocols/sync.md "Sharded
 * trainers"). Files of step S in STORE/shard/: "S.go" (rank 0: nonce, base,
 * anchor due), "S.N.part-R" and "S.N.count-R" (rank R, attempt N), each
 * written under a temporary name and renamed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "publisher_impl.h"
#include "shard_impl.h"
#include "status_impl.h"

void pulse_pub_shard_step_opts_init(pulse_pub_shard_step_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_PUB_SHARD_STEP_OPTS_VERSION;
  o->world = 1;
  o->timeout_ms = 60000;
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(void) {
  struct timespec ts = {0, 2 * 1000 * 1000};
  nanosleep(&ts, NULL);
}

static pulse_status file_put(const char *folder, const char *name, const void *data, size_t n) {
  char tmp[4352], final[4352];
  snprintf(tmp, sizeof tmp, "%s/.%s.tmp-%ld", folder, name, (long)getpid());
  snprintf(final, sizeof final, "%s/%s", folder, name);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  pulse_status st = PULSE_OK;
  if (fd < 0)
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
  const uint8_t *p = data;
  while (n > 0 && st == PULSE_OK) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
    else
      p += w, n -= (size_t)w;
  }
  if (st == PULSE_OK && fdatasync(fd) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", tmp, strerror(errno));
  close(fd);
  if (st == PULSE_OK && rename(tmp, final) != 0)
    st = pulse_fail(PULSE_ERR_IO, "shard: %s: %s", final, strerror(errno));
  if (st != PULSE_OK)
    unlink(tmp);
  return st;
}

/* 1 and the bytes when the file is there, 0 when not (yet). */
static int file_get(const char *folder, const char *name, pulse_buffer *out) {
  char path[4352];
  snprintf(path, sizeof path, "%s/%s", folder, name);
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  struct stat sb;
  int ok = fstat(fileno(f), &sb) == 0;
  size_t n = ok ? (size_t)sb.st_size : 0;
  out->data = malloc(n ? n : 1);
  out->size = n;
  ok = ok && out->data != NULL && fread(out->data, 1, n, f) == n;
  fclose(f);
  if (!ok)
    pulse_buffer_free(out);
  return ok;
}

/* Removes every file of step `step` (all ranks' when rank < 0). */
static void files_drop(const char *folder, uint64_t step, int rank, int keep_fail) {
  DIR *d = opendir(folder);
  if (d == NULL)
    return;
  char prefix[64], mine[32];
  snprintf(prefix, sizeof prefix, "%" PRIu64 ".", step);
  snprintf(mine, sizeof mine, "-%d", rank);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name), m = strlen(mine);
    if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 ||
        (rank >= 0 && (n < m || strcmp(e->d_name + n - m, mine) != 0)))
      continue;
    if ((rank >= 0 && strstr(e->d_name, ".go") != NULL) ||
        (keep_fail && strstr(e->d_name, ".fail-") != NULL))
      continue;
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", folder, e->d_name);
    unlink(path);
  }
  closedir(d);
}

/* The head's step (0 and *has 0 when there is none) and digest. */
static pulse_status head_now(const char *dir, int *has, uint64_t *step,
                             pulse_state_digest *digest) {
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(dir, &h);
  *has = st == PULSE_OK;
  *step = 0;
  if (st == PULSE_ERR_NOT_FOUND)
    return PULSE_OK;
  if (st != PULSE_OK)
    return st;
  *step = pulse_store_head_step(h);
  if (digest != NULL)
    *digest = *pulse_store_head_state_digest(h);
  pulse_store_head_free(h);
  return PULSE_OK;
}

typedef struct {
  uint64_t nonce;
  int has_base;
  uint64_t base;
  int due;
} step_go;

static int go_parse(const pulse_buffer *b, step_go *g) {
  char text[128];
  size_t n = b->size < sizeof text - 1 ? b->size : sizeof text - 1;
  memcpy(text, b->data, n);
  text[n] = '\0';
  char base[32];
  if (sscanf(text, "%" SCNx64 " %31s %d", &g->nonce, base, &g->due) != 3)
    return 0;
  g->has_base = strcmp(base, "none") != 0;
  g->base = g->has_base ? strtoull(base, NULL, 10) : 0;
  return 1;
}

/* Waits for every rank's file "S.N.KIND-R"; all[r] filled. */
/* The rank that gave attempt N of step S up ("S.N.fail-R", holding its
 * reason), or -1; its reason in why. */
static int failed_rank(const char *folder, uint64_t step, uint64_t nonce, int world, char *why,
                       size_t cap) {
  for (int r = 0; r < world; r++) {
    char name[128];
    snprintf(name, sizeof name, "%" PRIu64 ".%016" PRIx64 ".fail-%d", step, nonce, r);
    pulse_buffer b = {0};
    if (file_get(folder, name, &b)) {
      size_t n = b.size < cap - 1 ? b.size : cap - 1;
      memcpy(why, b.data, n);
      why[n] = '\0';
      pulse_buffer_free(&b);
      return r;
    }
  }
  return -1;
}

/* 1 while rank 0's go of step S still names attempt N. */
static int go_open(const char *folder, uint64_t step, uint64_t nonce) {
  char name[64], text[64];
  snprintf(name, sizeof name, "%" PRIu64 ".go", step);
  pulse_buffer b = {0};
  if (!file_get(folder, name, &b))
    return 0;
  size_t n = b.size < sizeof text - 1 ? b.size : sizeof text - 1;
  memcpy(text, b.data, n);
  text[n] = '\0';
  pulse_buffer_free(&b);
  uint64_t got = 0;
  return sscanf(text, "%" SCNx64, &got) == 1 && got == nonce;
}

static pulse_status wait_all(const char *folder, uint64_t step, uint64_t nonce, const char *kind,
                             int world, int rank, double deadline, pulse_buffer *all) {
  for (int r = 0; r < world; r++) {
    char name[128];
    snprintf(name, sizeof name, "%" PRIu64 ".%016" PRIx64 ".%s-%d", step, nonce, kind, r);
    while (!file_get(folder, name, &all[r])) {
      char why[512];
      int failed = failed_rank(folder, step, nonce, world, why, sizeof why);
      if (failed >= 0)
        return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": rank %d gave it up: %s", step,
                          failed, why);
      /* Rank 0 removes (or replaces) its go when it gives the attempt up. */
      if (rank != 0 && !go_open(folder, step, nonce)) {
        failed = failed_rank(folder, step, nonce, world, why, sizeof why);
        return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": rank %d gave it up: %s", step,
                          failed >= 0 ? failed : 0, failed >= 0 ? why : "(no reason left)");
      }
      if (mono() > deadline)
        return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": rank %d's %s did not come",
                          step, r, kind);
      nap();
    }
  }
  return PULSE_OK;
}

/* The file's bytes, mapped read-only (munmap when done). */
static pulse_status map_file(const char *path, size_t size, pulse_buffer *out) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  void *p = fd >= 0 ? mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  int err = errno;
  if (fd >= 0)
    close(fd);
  if (p == MAP_FAILED)
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", path, strerror(err));
  out->data = p;
  out->size = size;
  return PULSE_OK;
}

/* Drops the snapshot, for a first step that is tried again. */
static void snapshot_reset(pulse_pub_shard *s) {
  for (size_t b = 0; b < s->nblocks; b++)
    free(s->snap[b]), s->snap[b] = NULL;
  s->have_snapshot = 0;
}

pulse_status pulse_pub_shard_step(pulse_pub_shard *s, const char *dir,
                                  const pulse_pub_shard_step_opts *o, uint64_t step,
                                  const pulse_pub_tensor *data, size_t count,
                                  pulse_pub_figures *figures) {
  if (s == NULL || dir == NULL || o == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  PULSE_TRY(PULSE_OPTS_CHECK("shard step", o, PULSE_PUB_SHARD_STEP_OPTS_VERSION));
  if (o->world < 1 || o->rank < 0 || o->rank >= o->world || (o->rank == 0) != (o->committer != NULL) ||
      o->timeout_ms < 0 ||
      (o->committer != NULL && (!o->committer->committer ||
                                o->committer->opts.chunk_log2 != s->chunk_log2)))
    return pulse_fail(PULSE_ERR_ARG, "shard: step: rank 0 and only rank 0 gives its committer "
                                     "(pulse_pub_create_committer, the shards' chunk_log2)");
  char folder[4096];
  snprintf(folder, sizeof folder, "%s/shard", dir);
  /* A rank may come before rank 0 has made the store. */
  if ((mkdir(dir, 0755) != 0 && errno != EEXIST) || (mkdir(folder, 0755) != 0 && errno != EEXIST))
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", folder, strerror(errno));
  double deadline = mono() + o->timeout_ms / 1000.0;
  int world = o->world, rank = o->rank;
  char go_name[64];
  snprintf(go_name, sizeof go_name, "%" PRIu64 ".go", step);
  step_go go;
  memset(&go, 0, sizeof go);
  pulse_status st = PULSE_OK;
  int has = 0;
  uint64_t head = 0;
  PULSE_TRY(head_now(dir, &has, &head, NULL));
  if (has && step <= head)
    return pulse_fail(PULSE_ERR_BASE_STEP, "shard: step %" PRIu64 " is not above the head's %" PRIu64,
                      step, head);
  if (rank == 0) {
    files_drop(folder, step, -1, 0);
    uint64_t nonce = 0;
    FILE *u = fopen("/dev/urandom", "rb");
    if (u == NULL || fread(&nonce, sizeof nonce, 1, u) != 1)
      nonce = (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(mono() * 1e9);
    if (u != NULL)
      fclose(u);
    go = (step_go){nonce, has, head, pulse_pub_anchor_due(o->committer, step)};
    char text[128];
    int n = has ? snprintf(text, sizeof text, "%016" PRIx64 " %" PRIu64 " %d\n", nonce, head, go.due)
                : snprintf(text, sizeof text, "%016" PRIx64 " none %d\n", nonce, go.due);
    PULSE_TRY(file_put(folder, go_name, text, (size_t)n));
  } else {
    /* A go of another base (left by a crashed attempt) is not this one's. */
    for (;;) {
      pulse_buffer b = {0};
      if (file_get(folder, go_name, &b)) {
        int ok = go_parse(&b, &go) && go.has_base == has && (!has || go.base == head) &&
                 !(s->failed_step == step && s->failed_nonce == go.nonce);
        pulse_buffer_free(&b);
        if (ok)
          break;
      }
      if (mono() > deadline)
        return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": rank 0 did not open it", step);
      nap();
    }
  }
  if (!go.has_base && s->have_snapshot)
    snapshot_reset(s); /* a first step tried again */
  pulse_buffer *parts = calloc((size_t)world, sizeof *parts);
  pulse_buffer *counts = calloc((size_t)world, sizeof *counts);
  pulse_buffer mine = {0}, patch = {0};
  char name[128], staged[4352] = "", made[4352] = "";
  pulse_state_digest target;
  if (parts == NULL || counts == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: step");
  if (st == PULSE_OK)
    st = pulse_pub_shard_detect(s, data, count, &mine);
  if (st == PULSE_OK) {
    snprintf(name, sizeof name, "%" PRIu64 ".%016" PRIx64 ".part-%d", step, go.nonce, rank);
    st = file_put(folder, name, mine.data, mine.size);
  }
  if (st == PULSE_OK)
    st = wait_all(folder, step, go.nonce, "part", world, rank, deadline, parts);
  /* Every rank checks the blocks of every rank before anything is written:
   * they must tile the table (the first step of a job checks what
   * pulse_pub_shard_create could not see alone). */
  if (st == PULSE_OK)
    st = pulse_pub_shard_state_digest(s->info, s->count, s->chunk_log2, parts, (size_t)world, 1,
                                      &target);
  if (st == PULSE_OK)
    st = shard_parts_check(s->info, s->count, parts, (size_t)world);
  if (st == PULSE_OK && go.due) {
    snprintf(staged, sizeof staged, "%s/" PULSE_STORE_OBJECTS_DIR "/.anchor-%" PRIu64 "-%016" PRIx64 ".tmp-shard",
             dir, step, go.nonce);
    st = pulse_pub_shard_anchor_write(s, staged, step, &target, go.has_base);
  }
  if (st == PULSE_OK)
    st = pulse_pub_shard_count(s, parts, (size_t)world, &counts[rank]);
  if (st == PULSE_OK) {
    snprintf(name, sizeof name, "%" PRIu64 ".%016" PRIx64 ".count-%d", step, go.nonce, rank);
    st = file_put(folder, name, counts[rank].data, counts[rank].size);
    pulse_buffer_free(&counts[rank]);
  }
  pulse_pub_figures f;
  memset(&f, 0, sizeof f);
  if (st == PULSE_OK && rank == 0) {
    st = wait_all(folder, step, go.nonce, "count", world, rank, deadline, counts);
    if (st == PULSE_OK && go.has_base) {
      pulse_encode_opts eo;
      pulse_encode_opts_init(&eo);
      eo.step = step;
      eo.base_step = go.base;
      eo.pos_model = o->committer->opts.pos_model;
      eo.chunk_log2 = s->chunk_log2;
      eo.threads = o->committer->opts.threads;
      /* The patch goes to a file while the ranks' streams are held, and
       * is mapped once they are freed: never both in memory. */
      snprintf(made, sizeof made, "%s/" PULSE_STORE_OBJECTS_DIR "/.patch-%" PRIu64
               "-%016" PRIx64 ".tmp-shard", dir, step, go.nonce);
      uint64_t size = 0;
      st = pulse_pub_shard_encode_file(s->info, s->count, &eo, parts, (size_t)world, counts,
                                       (size_t)world, made, &size);
      for (int r = 0; r < world; r++)
        pulse_buffer_free(&parts[r]), pulse_buffer_free(&counts[r]);
      if (st == PULSE_OK)
        st = map_file(made, (size_t)size, &patch);
    }
    if (st == PULSE_OK)
      st = pulse_pub_commit_made(o->committer, step, go.has_base ? &patch : NULL,
                                 go.due ? staged : NULL, &target, &f);
    if (st == PULSE_OK)
      files_drop(folder, step, -1, 0);
  } else if (st == PULSE_OK) {
    /* The head of this step, or rank 0 gave up (its go is gone). */
    for (;;) {
      int h = 0;
      uint64_t hs = 0;
      pulse_state_digest hd;
      st = head_now(dir, &h, &hs, &hd);
      if (st == PULSE_OK && h && hs >= step) {
        if (hs != step || memcmp(&hd, &target, 32) != 0)
          st = pulse_fail(PULSE_ERR_BASE_DIGEST,
                          "shard: the head moved to step %" PRIu64 ", not this one's", hs);
        break;
      }
      int open = st == PULSE_OK && go_open(folder, step, go.nonce);
      if (st == PULSE_OK && !open) {
        /* Rank 0 removes the go after its commit too: the head says which. */
        st = head_now(dir, &h, &hs, &hd);
        if (st == PULSE_OK && h && hs == step && memcmp(&hd, &target, 32) == 0)
          break;
      }
      if (st == PULSE_OK && !open) {
        char why[512];
        int failed = failed_rank(folder, step, go.nonce, world, why, sizeof why);
        st = pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": rank %d gave it up: %s", step,
                        failed >= 0 ? failed : 0, failed >= 0 ? why : "(no reason left)");
      } else if (st == PULSE_OK && mono() > deadline) {
        st = pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": no head within the timeout",
                        step);
      }
      if (st != PULSE_OK)
        break;
      nap();
    }
    f.step = step;
    pulse_state_digest_hex(&target, f.state_digest);
  }
  if (st == PULSE_OK) {
    if (go.has_base)
      pulse_pub_shard_advance(s);
  } else {
    /* Rank 0 opens the retry with another nonce: this one's go, if still
     * there, is stale. */
    s->failed_step = step;
    s->failed_nonce = go.nonce;
    pulse_pub_shard_abort(s);
    if (!go.has_base)
      snapshot_reset(s);
    /* The others stop waiting for this rank, and learn why: rank 0 then
     * gives the attempt up by removing its go (after its reason is there). */
    char fail_name[128], why[512];
    snprintf(fail_name, sizeof fail_name, "%" PRIu64 ".%016" PRIx64 ".fail-%d", step, go.nonce,
             rank);
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    files_drop(folder, step, rank, 0);
    (void)file_put(folder, fail_name, why, strlen(why));
    if (rank == 0) {
      files_drop(folder, step, -1, 1);
      if (staged[0] != '\0')
        unlink(staged);
    }
    pulse_fail(st, "%s", why); /* the detail stays this rank's reason */
  }
  if (st == PULSE_OK && figures != NULL)
    *figures = f;
  for (int r = 0; parts && r < world; r++)
    pulse_buffer_free(&parts[r]);
  for (int r = 0; counts && r < world; r++)
    pulse_buffer_free(&counts[r]);
  free(parts), free(counts);
  pulse_buffer_free(&mine);
  if (patch.data != NULL)
    munmap(patch.data, patch.size);
  if (made[0] != '\0')
    unlink(made);
  return st;
}
