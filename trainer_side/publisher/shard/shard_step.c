/* shard_step.c - one collective step of a sharded trainer through a medium
 * every rank reaches (pulse_pub_shard_step, pulse_pub_shard.h;
 * docs/protocols/sync.md "Sharded trainers"): the store folder they share,
 * or the store's bucket (shard_medium.c). Files of step S: "S.go" (rank 0:
 * nonce, base, anchor due), "S.N.part-R" and "S.N.count-R" (rank R,
 * attempt N), "S.N.fail-R" (why rank R gave attempt N up), and with a
 * bucket the anchor's ("bytes-K-R", "sha-K-R", "upload-0", "etags-R":
 * shard_step_anchor.c). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "publisher_impl.h"
#include "shard_impl.h"
#include "shard_step_impl.h"
#include "status_impl.h"

void pulse_pub_shard_step_opts_init(pulse_pub_shard_step_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_PUB_SHARD_STEP_OPTS_VERSION;
  o->world = 1;
  o->timeout_ms = 60000;
  o->part_bytes = PULSE_PUB_SHARD_PART_BYTES_DEFAULT;
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Sleeps *cur seconds, then doubles it up to the medium's most. */
static void nap(const shard_medium *m, double *cur) {
  if (*cur < m->nap_first_s)
    *cur = m->nap_first_s;
  struct timespec ts = {(time_t)*cur,
                        (long)((*cur - (double)(time_t)*cur) * 1e9)};
  nanosleep(&ts, NULL);
  *cur = *cur * 2 < m->nap_most_s ? *cur * 2 : m->nap_most_s;
}

typedef struct {
  uint64_t nonce;
  int has_base;
  uint64_t base;
  int due;
  /* The step is the bucket's head already (committed by an attempt whose
   * upload failed, uploaded since): every rank returns it as it is. */
  int done;
} step_go;

static int go_parse(const pulse_buffer *b, step_go *g) {
  char text[128];
  size_t n = b->size < sizeof text - 1 ? b->size : sizeof text - 1;
  memcpy(text, b->data, n);
  text[n] = '\0';
  char base[32], done[8] = "";
  int got =
      sscanf(text, "%" SCNx64 " %31s %d %7s", &g->nonce, base, &g->due, done);
  if (got < 3)
    return 0;
  g->done = got == 4 && strcmp(done, "done") == 0;
  g->has_base = strcmp(base, "none") != 0;
  g->base = g->has_base ? strtoull(base, NULL, 10) : 0;
  return 1;
}

/* The rank that gave attempt N of step S up ("S.N.fail-R", holding its
 * reason), the lowest where several did, or -1; its reason in why. Of
 * `world` ranks: one look at the medium (with the bucket a listing, not a
 * request per rank), then the reason's file. */
static int failed_rank(shard_medium *m, uint64_t step, uint64_t nonce,
                       int world, char *why, size_t cap) {
  char prefix[96];
  size_t pl = (size_t)snprintf(prefix, sizeof prefix,
                               "%" PRIu64 ".%016" PRIx64 ".fail-", step, nonce);
  int lowest = -1;
  pulse_buffer names = {0};
  size_t n = 0;
  if (world == 1) { /* rank 0's alone: no listing */
    lowest = 0;
  } else if (m->list(m, prefix, &names, &n) == 1) {
    const char *at = (const char *)names.data;
    for (size_t i = 0; i < n; at += strlen(at) + 1, i++) {
      char *end = NULL;
      long r = strtol(at + pl, &end, 10);
      if (end != at + pl && *end == '\0' && r >= 0 && r < world &&
          (lowest < 0 || r < lowest))
        lowest = (int)r;
    }
  }
  pulse_buffer_free(&names);
  if (lowest < 0)
    return -1;
  char name[128];
  snprintf(name, sizeof name, "%s%d", prefix, lowest);
  pulse_buffer b = {0};
  if (m->get(m, name, &b) != 1)
    return world == 1 ? -1 : (snprintf(why, cap, "(no reason left)"), lowest);
  size_t len = b.size < cap - 1 ? b.size : cap - 1;
  memcpy(why, b.data, len);
  why[len] = '\0';
  pulse_buffer_free(&b);
  return lowest;
}

/* 1 while rank 0's go of step S still names attempt N. */
static int go_open(shard_medium *m, uint64_t step, uint64_t nonce) {
  char name[64], text[64];
  snprintf(name, sizeof name, "%" PRIu64 ".go", step);
  pulse_buffer b = {0};
  if (m->get(m, name, &b) != 1)
    return 0;
  size_t n = b.size < sizeof text - 1 ? b.size : sizeof text - 1;
  memcpy(text, b.data, n);
  text[n] = '\0';
  pulse_buffer_free(&b);
  uint64_t got = 0;
  return sscanf(text, "%" SCNx64, &got) == 1 && got == nonce;
}

static pulse_status given_up(const shard_attempt *a) {
  char why[512];
  int failed = failed_rank(a->m, a->step, a->nonce, a->world, why, sizeof why);
  return pulse_fail(
      PULSE_ERR_IO, "shard: step %" PRIu64 ": rank %d gave it up: %s", a->step,
      failed >= 0 ? failed : 0, failed >= 0 ? why : "(no reason left)");
}

void shard_attempt_name(const shard_attempt *a, char *out, size_t cap,
                        const char *what) {
  snprintf(out, cap, "%" PRIu64 ".%016" PRIx64 ".%s", a->step, a->nonce, what);
}

/* A look that found nothing of what it waits for (`name`, the first of
 * it): fails with the reason of a rank that gave the attempt up (its fail
 * file, or rank 0's go gone), or at the deadline; else naps, PULSE_OK. */
static pulse_status attempt_nap(const shard_attempt *a, const char *name,
                                double *pause) {
  char why[512];
  int failed = failed_rank(a->m, a->step, a->nonce, a->world, why, sizeof why);
  if (failed >= 0)
    return pulse_fail(PULSE_ERR_IO,
                      "shard: step %" PRIu64 ": rank %d gave it up: %s",
                      a->step, failed, why);
  /* Rank 0 removes (or replaces) its go when it gives the attempt up. */
  if (a->rank != 0 && !go_open(a->m, a->step, a->nonce))
    return given_up(a);
  if (mono() > a->deadline)
    return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": %s did not come",
                      a->step, name);
  nap(a->m, pause);
  return PULSE_OK;
}

pulse_status shard_attempt_wait(const shard_attempt *a, const char *name,
                                pulse_buffer *out) {
  double pause = 0;
  for (;;) {
    int got = a->m->get(a->m, name, out);
    if (got == 1)
      return PULSE_OK;
    if (got < 0)
      return pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": reading %s: %s",
                        a->step, name, pulse_error_detail());
    PULSE_TRY(attempt_nap(a, name, &pause));
  }
}

/* Waits for every rank's file "S.N.KIND-R"; all[r] filled (the caller
 * frees them, on a failure too). Each look asks for every file still
 * missing at once; one that found nothing new is attempt_nap's, as in
 * shard_attempt_wait. */
static pulse_status wait_all(const shard_attempt *a, const char *kind,
                             pulse_buffer *all) {
  size_t world = (size_t)a->world;
  char(*names)[128] = calloc(world, sizeof *names);
  const char **want = calloc(world, sizeof *want);
  size_t *rank_of = calloc(world, sizeof *rank_of);
  pulse_buffer *got = calloc(world, sizeof *got);
  pulse_status st = PULSE_OK;
  if (names == NULL || want == NULL || rank_of == NULL || got == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: step %" PRIu64, a->step);
  for (size_t r = 0; st == PULSE_OK && r < world; r++) {
    char what[64];
    snprintf(what, sizeof what, "%s-%zu", kind, r);
    shard_attempt_name(a, names[r], sizeof names[r], what);
    all[r].data = NULL, all[r].size = 0;
  }
  double pause = 0;
  while (st == PULSE_OK) {
    size_t k = 0, came = 0;
    for (size_t r = 0; r < world; r++)
      if (all[r].data == NULL)
        want[k] = names[r], rank_of[k++] = r;
    if (k == 0)
      break;
    if (a->m->get_many(a->m, want, k, got) != 0) {
      st = pulse_fail(PULSE_ERR_IO, "shard: step %" PRIu64 ": reading %s: %s",
                      a->step, want[0], pulse_error_detail());
      break;
    }
    for (size_t i = 0; i < k; i++)
      if (got[i].data != NULL)
        all[rank_of[i]] = got[i], came++;
    if (came == k)
      break;
    if (came > 0) { /* the others may be on their way: look again soon */
      pause = 0;
      continue;
    }
    st = attempt_nap(a, want[0], &pause);
  }
  free(names), free(want), free(rank_of), free(got);
  return st;
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

/* The options as version 2: a version 1 caller's struct (a prefix of
 * this one) without a bucket. */
static pulse_status opts_read(const pulse_pub_shard_step_opts *o,
                              pulse_pub_shard_step_opts *v) {
  if (o != NULL && o->struct_version == 1u) {
    pulse_pub_shard_step_opts_init(v);
    v->rank = o->rank;
    v->world = o->world;
    v->committer = o->committer;
    v->timeout_ms = o->timeout_ms;
    return PULSE_OK;
  }
  PULSE_TRY(
      PULSE_OPTS_CHECK("shard step", o, PULSE_PUB_SHARD_STEP_OPTS_VERSION));
  *v = *o;
  return PULSE_OK;
}

/* A rank that fails the attempt before its part: says why ("S.N.fail-R"),
 * so that rank 0 stops waiting for it; the detail stays its reason. */
static pulse_status give_up_early(const shard_attempt *a) {
  pulse_status st = PULSE_ERR_IO;
  char why[512], what[32], name[128];
  snprintf(why, sizeof why, "%s", pulse_error_detail());
  snprintf(what, sizeof what, "fail-%d", a->rank);
  shard_attempt_name(a, name, sizeof name, what);
  (void)a->m->put(a->m, name, why, strlen(why));
  return pulse_fail(st, "%s", why);
}

/* A call of the bucket's head step that retries it rather than repeats
 * it. Rank 0 knows: it committed the step in an attempt whose upload
 * failed (it failed here, or the bucket was behind its store). Another
 * rank cannot tell: it saw the step fail, or resumed before rank 0
 * brought the bucket up (its snapshot below the head), or after (its
 * snapshot the head's, though the step is new to its job); it follows
 * rank 0's go, which says "done" for a retry, and a repeat costs it the
 * timeout (rank 0 refuses at once). */
static int committed_retry(const pulse_pub_shard *s, int rank, int behind,
                           uint64_t step) {
  int failed = s->failed_nonce != 0 && s->failed_step == step;
  return rank != 0 || behind || failed;
}

/* Rank 0: opens attempt N of the step (removing what earlier attempts
 * left) with a fresh nonce (done: the step is the head already); the
 * others wait for a go of the medium's head, read again while the go
 * names another (rank 0 may have brought the bucket up since). */
static pulse_status go_begin(pulse_pub_shard *s, const shard_attempt *a,
                             pulse_pub *committer, int *has, uint64_t *head,
                             int done, step_go *go) {
  shard_medium *m = a->m;
  char go_name[64];
  snprintf(go_name, sizeof go_name, "%" PRIu64 ".go", a->step);
  if (a->rank == 0) {
    /* Earlier attempts' reasons stay until the step is committed: a rank
     * still in one learns why it ended. */
    m->drop(m, a->step, -1, 1);
    uint64_t nonce = 0;
    FILE *u = fopen("/dev/urandom", "rb");
    if (u == NULL || fread(&nonce, sizeof nonce, 1, u) != 1)
      nonce =
          (uint64_t)getpid() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(mono() * 1e9);
    if (u != NULL)
      fclose(u);
    *go = (step_go){nonce, *has, *head,
                    done ? 0 : pulse_pub_anchor_due(committer, a->step), done};
    char text[128];
    const char *tail = done ? " done" : "";
    int n =
        *has ? snprintf(text, sizeof text, "%016" PRIx64 " %" PRIu64 " %d%s\n",
                        nonce, *head, go->due, tail)
             : snprintf(text, sizeof text, "%016" PRIx64 " none %d%s\n", nonce,
                        go->due, tail);
    return m->put(m, go_name, text, (size_t)n);
  }
  /* A go of another base (left by a crashed attempt) is not this one's. */
  double pause = 0;
  for (;;) {
    pulse_buffer b = {0};
    if (m->get(m, go_name, &b) == 1) {
      int parsed = go_parse(&b, go) &&
                   !(s->failed_step == a->step && s->failed_nonce == go->nonce);
      pulse_buffer_free(&b);
      if (parsed && go->has_base == *has && (!*has || go->base == *head))
        return PULSE_OK;
      if (parsed && m->bucket != NULL)
        PULSE_TRY(m->head(m, has, head, NULL));
    }
    if (mono() > a->deadline && done)
      return pulse_fail(PULSE_ERR_IO,
                        "shard: step %" PRIu64 ": rank 0 did not open it "
                        "(the step is the bucket's head: rank 0 returns it "
                        "again only when its store committed it in an "
                        "attempt whose upload failed; else publish step "
                        "%" PRIu64 ")",
                        a->step, a->step + 1);
    if (mono() > a->deadline)
      return pulse_fail(PULSE_ERR_IO,
                        "shard: step %" PRIu64 ": rank 0 did not open it",
                        a->step);
    nap(m, &pause);
  }
}

/* A rank other than 0: waits for the head of this step (the medium's),
 * or for rank 0 to give the attempt up (its go gone). */
static pulse_status head_wait(const shard_attempt *a,
                              const pulse_state_digest *target) {
  double pause = 0;
  for (;;) {
    int h = 0;
    uint64_t hs = 0;
    pulse_state_digest hd;
    PULSE_TRY(a->m->head(a->m, &h, &hs, &hd));
    if (h && hs >= a->step) {
      if (hs != a->step || memcmp(&hd, target, 32) != 0)
        return pulse_fail(
            PULSE_ERR_BASE_DIGEST,
            "shard: the head moved to step %" PRIu64 ", not this one's", hs);
      /* Rank 0 failed this attempt after its commit (its upload) and a
       * later publish uploaded it: the attempt stays failed here as on
       * rank 0, and this rank's retry returns the step. */
      char why[512];
      if (failed_rank(a->m, a->step, a->nonce, 1, why, sizeof why) == 0)
        return given_up(a);
      return PULSE_OK;
    }
    if (!go_open(a->m, a->step, a->nonce)) {
      /* Rank 0 removes the go after its commit too: the head says which. */
      PULSE_TRY(a->m->head(a->m, &h, &hs, &hd));
      char why[512];
      if (h && hs == a->step && memcmp(&hd, target, 32) == 0 &&
          failed_rank(a->m, a->step, a->nonce, 1, why, sizeof why) != 0)
        return PULSE_OK;
      return given_up(a);
    }
    if (mono() > a->deadline)
      return pulse_fail(PULSE_ERR_IO,
                        "shard: step %" PRIu64 ": no head within the timeout",
                        a->step);
    nap(a->m, &pause);
  }
}

/* Rank 0 after its commit of the step: uploads the store (the head
 * last). A failure whose head went up all the same (an answer lost after
 * the write) is the step published; any other says the step is committed
 * in rank 0's store and that the next publish uploads it. */
static pulse_status upload_committed(shard_medium *m, pulse_upload *bucket,
                                     const char *dir, uint64_t step,
                                     const pulse_state_digest *target) {
  pulse_status st = pulse_upload_store(bucket, dir, NULL);
  if (st == PULSE_OK)
    return PULSE_OK;
  char why[512];
  snprintf(why, sizeof why, "%s", pulse_error_detail());
  int has = 0;
  uint64_t there = 0;
  pulse_state_digest d;
  if (m->head(m, &has, &there, &d) == PULSE_OK && has && there == step &&
      memcmp(&d, target, 32) == 0)
    return PULSE_OK;
  return pulse_fail(st,
                    "shard: step %" PRIu64 " is committed in rank 0's store "
                    "but its upload to the bucket failed (%s): the bucket "
                    "keeps the previous head; the next publish uploads it "
                    "first (publishing step %" PRIu64 " again returns it on "
                    "every rank, or publish step %" PRIu64 ")",
                    step, why, step, step + 1);
}

/* Rank 0: the patch of every rank's parts and counts, into a file of the
 * store folder (made) mapped into *patch; the ranks' streams are freed
 * first, so the two are never both in memory. */
static pulse_status patch_make(pulse_pub_shard *s, const char *dir,
                               const shard_attempt *a, const step_go *go,
                               pulse_pub *committer, pulse_buffer *parts,
                               pulse_buffer *counts, char *made, size_t cap,
                               pulse_buffer *patch) {
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.step = a->step;
  eo.base_step = go->base;
  eo.pos_model = committer->opts.pos_model;
  eo.chunk_log2 = s->chunk_log2;
  eo.threads = committer->opts.threads;
  snprintf(made, cap,
           "%s/" PULSE_STORE_OBJECTS_DIR "/.patch-%" PRIu64 "-%016" PRIx64
           ".tmp-shard",
           dir, a->step, go->nonce);
  uint64_t size = 0;
  pulse_status st = pulse_pub_shard_encode_file(s->info, s->count, &eo, parts,
                                                (size_t)a->world, counts,
                                                (size_t)a->world, made, &size);
  for (int r = 0; r < a->world; r++)
    pulse_buffer_free(&parts[r]), pulse_buffer_free(&counts[r]);
  if (st == PULSE_OK)
    st = map_file(made, (size_t)size, patch);
  return st;
}

pulse_status pulse_pub_shard_step(pulse_pub_shard *s, const char *dir,
                                  const pulse_pub_shard_step_opts *opts,
                                  uint64_t step, const pulse_pub_tensor *data,
                                  size_t count, pulse_pub_figures *figures) {
  if (s == NULL || dir == NULL || opts == NULL)
    return pulse_fail(PULSE_ERR_ARG, "shard: NULL argument");
  pulse_pub_shard_step_opts ov;
  PULSE_TRY(opts_read(opts, &ov));
  const pulse_pub_shard_step_opts *o = &ov;
  if (o->world < 1 || o->rank < 0 || o->rank >= o->world || (o->rank == 0) != (o->committer != NULL) ||
      o->timeout_ms < 0 ||
      (o->committer != NULL && (!o->committer->committer ||
                                o->committer->opts.chunk_log2 != s->chunk_log2)))
    return pulse_fail(PULSE_ERR_ARG, "shard: step: rank 0 and only rank 0 gives its committer "
                                     "(pulse_pub_create_committer, the shards' chunk_log2)");
  shard_medium medium;
  if (o->bucket != NULL)
    shard_medium_bucket(&medium, o->bucket);
  else
    PULSE_TRY(shard_medium_folder(&medium, dir));
  shard_attempt at = {&medium,  step,    0,
                      o->world, o->rank, mono() + o->timeout_ms / 1000.0};
  const shard_attempt *a = &at;
  int world = o->world, rank = o->rank;
  step_go go;
  memset(&go, 0, sizeof go);
  pulse_status st = PULSE_OK;
  int has = 0, behind = 0;
  uint64_t head = 0;
  /* Rank 0 first brings the bucket up to its store: the others follow the
   * bucket's head. A failure fails the attempt it opens on every rank. */
  pulse_status caught = PULSE_OK;
  char caught_why[512] = "";
  if (o->bucket != NULL && rank == 0) {
    caught = shard_bucket_catch_up(&medium, dir, &behind);
    snprintf(caught_why, sizeof caught_why, "%s",
             caught != PULSE_OK ? pulse_error_detail() : "");
  }
  pulse_state_digest head_digest;
  memset(&head_digest, 0, sizeof head_digest);
  PULSE_TRY(medium.head(&medium, &has, &head, &head_digest));
  int done = has && step == head && o->bucket != NULL &&
             committed_retry(s, rank, behind, step);
  if (has && step <= head && !done && caught == PULSE_OK)
    return pulse_fail(PULSE_ERR_BASE_STEP, "shard: step %" PRIu64 " is not above the head's %" PRIu64,
                      step, head);
  PULSE_TRY(go_begin(s, a, o->committer, &has, &head, done, &go));
  char name_done[128];
  at.nonce = go.nonce;
  if (caught != PULSE_OK) {
    /* As any attempt rank 0 gives up: its reason, then its go removed (a
     * go left would be read as open by a restarted job's ranks). A rank
     * that has not read the go yet joins the next attempt. */
    char fail_name[128];
    shard_attempt_name(a, fail_name, sizeof fail_name, "fail-0");
    (void)medium.put(&medium, fail_name, caught_why, strlen(caught_why));
    medium.drop(&medium, step, -1, 1);
    return pulse_fail(caught, "%s", caught_why);
  }
  if (rank != 0) {
    char why[512];
    if (failed_rank(&medium, step, go.nonce, 1, why, sizeof why) == 0) {
      /* Its go, if still there, is stale for this rank's retry. */
      s->failed_step = step;
      s->failed_nonce = go.nonce;
      return pulse_fail(PULSE_ERR_IO,
                        "shard: step %" PRIu64 ": rank 0 gave it up: %s", step,
                        why);
    }
  }
  /* The base is the head on every rank: one that saw a step fail which
   * rank 0 had committed (and has uploaded since) takes it again. */
  if (rank != 0 && o->bucket != NULL && go.has_base &&
      (!s->have_snapshot || s->snap_step < go.base) &&
      shard_bucket_snapshot(s, o->bucket, dir, go.base) != PULSE_OK)
    return give_up_early(a);
  if (go.done) {
    /* Committed and uploaded by an earlier attempt: nothing to detect.
     * Each rank says it is done; rank 0 then removes the step's files
     * (the failed attempt's reasons too). */
    char what[32];
    snprintf(what, sizeof what, "done-%d", rank);
    shard_attempt_name(a, name_done, sizeof name_done, what);
    if (rank != 0 && medium.put(&medium, name_done, "", 0) != PULSE_OK)
      return give_up_early(a);
    pulse_buffer *dones =
        rank == 0 ? calloc((size_t)world, sizeof *dones) : NULL;
    if (rank == 0 && dones == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "shard: step");
    for (int r = 1; rank == 0 && r < world && st == PULSE_OK; r++) {
      snprintf(what, sizeof what, "done-%d", r);
      shard_attempt_name(a, name_done, sizeof name_done, what);
      st = shard_attempt_wait(a, name_done, &dones[r]);
      pulse_buffer_free(&dones[r]);
    }
    free(dones);
    if (st != PULSE_OK)
      return st;
    if (rank == 0)
      medium.drop(&medium, step, -1, 0);
    if (figures != NULL) {
      memset(figures, 0, sizeof *figures);
      figures->step = step;
      pulse_state_digest_hex(&head_digest, figures->state_digest);
    }
    return PULSE_OK;
  }
  if (!go.has_base && s->have_snapshot)
    snapshot_reset(s); /* a first step tried again */
  pulse_buffer *parts = calloc((size_t)world, sizeof *parts);
  pulse_buffer *counts = calloc((size_t)world, sizeof *counts);
  pulse_buffer mine = {0}, patch = {0};
  char name[128], staged[4352] = "", made[4352] = "";
  shard_bucket_anchor anchor;
  memset(&anchor, 0, sizeof anchor);
  pulse_state_digest target;
  if (parts == NULL || counts == NULL)
    st = pulse_fail(PULSE_ERR_NOMEM, "shard: step");
  if (st == PULSE_OK)
    st = pulse_pub_shard_detect(s, data, count, &mine);
  if (st == PULSE_OK) {
    char what[32];
    snprintf(what, sizeof what, "part-%d", rank);
    shard_attempt_name(a, name, sizeof name, what);
    st = medium.put(&medium, name, mine.data, mine.size);
  }
  if (st == PULSE_OK)
    st = wait_all(a, "part", parts);
  /* Every rank checks the blocks of every rank before anything is written:
   * they must tile the table (the first step of a job checks what
   * pulse_pub_shard_create could not see alone). */
  if (st == PULSE_OK)
    st = pulse_pub_shard_state_digest(s->info, s->count, s->chunk_log2, parts, (size_t)world, 1,
                                      &target);
  if (st == PULSE_OK)
    st = shard_parts_check(s->info, s->count, parts, (size_t)world);
  if (st == PULSE_OK && go.due && o->bucket != NULL) {
    /* No rank holds the file: its parts go into the bucket from their ranks. */
    st = shard_bucket_anchor_make(a, s, o->bucket, o->part_bytes, parts,
                                  &target, go.has_base, &anchor);
  } else if (st == PULSE_OK && go.due) {
    snprintf(staged, sizeof staged, "%s/" PULSE_STORE_OBJECTS_DIR "/.anchor-%" PRIu64 "-%016" PRIx64 ".tmp-shard",
             dir, step, go.nonce);
    st = pulse_pub_shard_anchor_write(s, staged, step, &target, go.has_base);
  }
  if (st == PULSE_OK)
    st = pulse_pub_shard_count(s, parts, (size_t)world, &counts[rank]);
  if (st == PULSE_OK) {
    char what[32];
    snprintf(what, sizeof what, "count-%d", rank);
    shard_attempt_name(a, name, sizeof name, what);
    st = medium.put(&medium, name, counts[rank].data, counts[rank].size);
    pulse_buffer_free(&counts[rank]);
  }
  pulse_pub_figures f;
  memset(&f, 0, sizeof f);
  int committed = 0; /* rank 0: the step is its store's head */
  if (st == PULSE_OK && rank == 0) {
    st = wait_all(a, "count", counts);
    if (st == PULSE_OK && go.has_base)
      st = patch_make(s, dir, a, &go, o->committer, parts, counts, made,
                      sizeof made, &patch);
    const pulse_buffer *p = go.has_base ? &patch : NULL;
    if (st == PULSE_OK && go.due && o->bucket != NULL)
      st = pulse_pub_commit_made_uploaded(o->committer, step, p, anchor.sha256,
                                          anchor.size, &target, &f);
    else if (st == PULSE_OK)
      st = pulse_pub_commit_made(o->committer, step, p, go.due ? staged : NULL,
                                 &target, &f);
    committed = st == PULSE_OK;
    /* The others follow the bucket's head: it moves once the store's
     * objects are there (pulse_upload_store puts the head last). */
    if (st == PULSE_OK && o->bucket != NULL)
      st = upload_committed(&medium, o->bucket, dir, step, &target);
    if (st == PULSE_OK)
      medium.drop(&medium, step, -1, 0);
    /* An earlier step that failed here (its reasons, left for a rank
     * still in it): every rank has come past it now. */
    if (st == PULSE_OK && s->failed_nonce != 0 && s->failed_step < step) {
      medium.drop(&medium, s->failed_step, -1, 0);
      s->failed_step = s->failed_nonce = 0;
    }
  } else if (st == PULSE_OK) {
    st = head_wait(a, &target);
    f.step = step;
    pulse_state_digest_hex(&target, f.state_digest);
  }
  if (st == PULSE_OK) {
    if (go.has_base)
      pulse_pub_shard_advance(s);
    s->snap_step = step;
  } else if (committed) {
    /* Rank 0's store holds the step: its snapshot moves with it, and the
     * next publish uploads it before anything else (shard_bucket_catch_up);
     * the others fail the attempt with this reason. */
    if (go.has_base)
      pulse_pub_shard_advance(s);
    s->snap_step = step;
    s->failed_step = step;
    s->failed_nonce = go.nonce;
    char fail_name[128], why[512];
    shard_attempt_name(a, fail_name, sizeof fail_name, "fail-0");
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    medium.drop(&medium, step, 0, 0);
    (void)medium.put(&medium, fail_name, why, strlen(why));
    medium.drop(&medium, step, -1, 1);
    pulse_fail(st, "%s", why);
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
    char fail_name[128], why[512], what[32];
    snprintf(what, sizeof what, "fail-%d", rank);
    shard_attempt_name(a, fail_name, sizeof fail_name, what);
    snprintf(why, sizeof why, "%s", pulse_error_detail());
    medium.drop(&medium, step, rank, 0);
    (void)medium.put(&medium, fail_name, why, strlen(why));
    if (rank == 0) {
      medium.drop(&medium, step, -1, 1);
      if (staged[0] != '\0')
        unlink(staged);
      if (anchor.id[0] != '\0') /* the bucket keeps its head, and no part */
        (void)pulse_upload_part_abort(o->bucket, anchor.rel, anchor.id);
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
