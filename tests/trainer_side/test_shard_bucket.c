/* test_shard_bucket.c - the collective step with the bucket as its medium
 * (pulse_pub_shard_step with opts.bucket; pulse_pub_shard.h), against
 * s3rver with S3's multipart answers (tests/cli/lib/s3rver_multipart.js),
 * started per test on 127.0.0.1 port 0. Four forked ranks, each with its
 * own private folder and its own pulse_upload handle (no folder shared),
 * publish a mix tiling whose anchors (anchor_every 2) are uploaded in 1 KiB
 * parts assembled on several ranks: after each step the bucket's head and
 * every object it names are byte for byte a single publisher's of the
 * gathered weights, rank 0's folder holds none of the anchors, and no file
 * of the step is left under shard/. A rank that fails a step fails it on
 * every rank, the bucket keeps its head, the retry publishes; a restarted
 * job (new shards, rank 0 fetching back its anchors, the others resuming
 * from a copy of the bucket's store, before or after rank 0 brought the
 * bucket up to its store) goes on; a step published is refused again on
 * every rank. Skipped where node or s3rver is missing. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_pub_shard.h"
#include "pulse_publisher.h"
#include "pulse_store.h"
#include "pulse_upload.h"
#include "s3rver_testutil.h"
#include "shard_testutil.h"
#include "trainer_testutil.h"

#define TARGET "s3://bkt/runs/shard"
#define RANKS 4
#define NT 4
#define LOG2 10u
#define PART_BYTES 1024u /* s3rver takes parts under S3's 5 MiB */

/* ---------------------------------------------------------------- server */

static s3rver_tu s3;

/* Starts the stand-in (skips the test where it cannot run) and points the
 * uploaders' environment at it; the head's upload fails while its head-fault
 * file exists. */
static void s3_start(void) {
  s3rver_tu_start(&s3, "head-fault");
}

static void s3_stop(void) {
  s3rver_tu_stop(&s3);
}

static pulse_upload *handle(void) {
  pulse_upload_opts o;
  pulse_upload_opts_init(&o);
  o.target = TARGET;
  o.retries = 2;
  o.grace_seconds = 0;
  pulse_upload *up = NULL;
  if (pulse_upload_create(&o, &up) != PULSE_OK)
    return NULL;
  return up;
}

/* ----------------------------------------------------------------- model */

static const char *names[NT] = {"attn.w", "embed", "mlp.w3", "norm"};
static const uint32_t ndims[NT] = {2, 1, 3, 1};
static const uint64_t shapes[NT][3] = {{96, 40}, {5000}, {24, 30, 7}, {64}};

static const double spreads[NT] = {0.08, 0.08, 0.08, 2.0};
static const sm_spec spec = {NT, names, ndims, shapes, spreads, 0};

static void model_step(sm_model *m) {
  sm_model_step(m, 0.3, 2e-3);
}

/* A mix: a 2x2 grid, flat ranges, a whole tensor on rank 2, dim-0 rows;
 * the anchor's 1 KiB parts are then assembled on every rank. */
static void blocks_of(sm_blocks *rb) {
  memset(rb, 0, sizeof(sm_blocks) * RANKS);
  for (int r = 0; r < RANKS; r++) {
    uint64_t st[2] = {(uint64_t)(r / 2) * 50, (uint64_t)(r % 2) * 20};
    uint64_t ex[2] = {r / 2 ? 46 : 50, 20};
    sm_blocks_rect(&rb[r], &spec, 0, st, ex);
    sm_blocks_flat(&rb[r], &spec, 1, 1250 * (uint64_t)r, 1250);
    uint64_t rs[1] = {16 * (uint64_t)r}, re[1] = {16};
    sm_blocks_rect(&rb[r], &spec, 3, rs, re);
  }
  uint64_t z[3] = {0}, e[3] = {24, 30, 7};
  sm_blocks_rect(&rb[2], &spec, 2, z, e);
}

static void pub_opts(pulse_pub_opts *o, const sm_model *m) {
  pulse_pub_opts_init(o);
  o->tensors = m->info;
  o->tensor_count = NT;
  o->chunk_log2 = LOG2;
  o->anchor_every = 2;
  o->keep_patches = 3;
  o->keep_anchors = 2;
  o->anchor_sync = 1;
  o->threads = 1;
  o->grace_seconds = 0;
}

/* ------------------------------------------------------------------ ranks */

#define FAIL(code, ...)                                                        \
  do {                                                                         \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, "\n");                                                     \
    return (code);                                                             \
  } while (0)

/* Rank 0's checks after step `step`: the bucket's head is the single
 * publisher's (`single`, published in lockstep) and every object it names
 * is the single publisher's bytes; rank 0's folder holds none of the
 * anchors of this job (from `first`; a restarted job fetched the older);
 * nothing of the step is left under shard/. 0 when all hold. */
static int check_step(pulse_upload *up, const char *single, const char *mine,
                      uint64_t first, uint64_t step) {
  pulse_buffer hb = {0};
  pulse_store_head *b = NULL, *s = NULL;
  if (pulse_upload_key_get(up, "head.json", &hb) != PULSE_OK ||
      pulse_store_head_parse(hb.data, hb.size, &b) != PULSE_OK)
    FAIL(40, "step %llu: the bucket's head: %s", (unsigned long long)step,
         pulse_error_detail());
  pulse_buffer_free(&hb);
  if (pulse_store_head_load(single, &s) != PULSE_OK)
    FAIL(41, "the single head: %s", pulse_error_detail());
  int rc = 0;
  if (pulse_store_head_step(b) != step ||
      memcmp(pulse_store_head_state_digest(b), pulse_store_head_state_digest(s),
             32) != 0 ||
      pulse_store_head_patch_count(b) != pulse_store_head_patch_count(s) ||
      pulse_store_head_anchor_count(b) != pulse_store_head_anchor_count(s)) {
    fprintf(stderr,
            "step %llu: the bucket's head (step %llu, %zu patches, %zu "
            "anchors) is not "
            "the single's (%zu, %zu)\n",
            (unsigned long long)step,
            (unsigned long long)pulse_store_head_step(b),
            pulse_store_head_patch_count(b), pulse_store_head_anchor_count(b),
            pulse_store_head_patch_count(s), pulse_store_head_anchor_count(s));
    rc = 42;
  }
  size_t np = pulse_store_head_patch_count(s),
         n = np + pulse_store_head_anchor_count(s);
  for (size_t i = 0; rc == 0 && i < n; i++) {
    const pulse_store_object *o = i < np ? pulse_store_head_patch(s, i)
                                         : pulse_store_head_anchor(s, i - np);
    const pulse_store_object *x = i < np ? pulse_store_head_patch(b, i)
                                         : pulse_store_head_anchor(b, i - np);
    char path[4352];
    snprintf(path, sizeof path, "%s/%s", single, o->path);
    size_t len = 0;
    uint8_t *want = tu_read(path, &len);
    pulse_buffer got = {0};
    if (strcmp(o->path, x->path) != 0 || want == NULL ||
        pulse_upload_key_get(up, o->path, &got) != PULSE_OK ||
        got.size != len || memcmp(got.data, want, len) != 0)
      rc = 43;
    if (rc == 43)
      fprintf(stderr, "step %llu: %s is not the single publisher's\n",
              (unsigned long long)step, o->path);
    free(want);
    pulse_buffer_free(&got);
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", mine, o->path);
    if (rc == 0 && i >= np && o->step >= first && stat(path, &sb) == 0)
      FAIL(44, "step %llu: rank 0's folder holds the anchor %s",
           (unsigned long long)step, o->path);
  }
  pulse_store_head_free(b), pulse_store_head_free(s);
  if (rc != 0)
    FAIL(rc, "step %llu: the bucket is not the single publisher's store",
         (unsigned long long)step);
  pulse_buffer names_left = {0};
  size_t left = 0;
  if (pulse_upload_key_list(up, "shard/", &names_left, &left) != PULSE_OK)
    FAIL(45, "listing shard/: %s", pulse_error_detail());
  if (left != 0)
    fprintf(stderr, "step %llu: %s is left under shard/\n",
            (unsigned long long)step, (const char *)names_left.data);
  pulse_buffer_free(&names_left);
  return left == 0 ? 0 : 46;
}

/* Rank 0 after a failed step: the bucket's head is still the previous
 * step's, and the anchor the step was making (the single publisher's, in
 * `single`) is not in the bucket: its upload was aborted, not left open. */
static int check_given_up(pulse_upload *up, const char *single, uint64_t step) {
  pulse_buffer hb = {0};
  pulse_store_head *b = NULL, *s = NULL;
  int rc = 0;
  if (pulse_upload_key_get(up, "head.json", &hb) != PULSE_OK ||
      pulse_store_head_parse(hb.data, hb.size, &b) != PULSE_OK ||
      pulse_store_head_step(b) != step - 1)
    rc = 50, fprintf(stderr, "step %llu: the bucket's head moved\n",
                     (unsigned long long)step);
  pulse_buffer_free(&hb);
  if (rc == 0 && pulse_store_head_load(single, &s) != PULSE_OK)
    rc = 51;
  size_t na = s != NULL ? pulse_store_head_anchor_count(s) : 0;
  for (size_t i = 0; rc == 0 && i < na; i++) {
    uint64_t size = 0;
    const pulse_store_object *o = pulse_store_head_anchor(s, i);
    if (o->step == step &&
        pulse_upload_object_size(up, o->path, &size) != PULSE_ERR_NOT_FOUND)
      rc = 52, fprintf(stderr, "step %llu: the bucket holds its anchor\n",
                       (unsigned long long)step);
  }
  pulse_store_head_free(b), pulse_store_head_free(s);
  /* Aborted, not left open: s3rver keeps an open upload's parts in a
   * folder of its own until it is completed or aborted (S3 bills them). */
  char uploads[1200];
  snprintf(uploads, sizeof uploads, "%s/s3/bkt/._S3rver_uploads", s3.dir);
  if (rc == 0 && access(uploads, F_OK) == 0 && tt_count(uploads) != 0)
    rc = 53, fprintf(stderr, "step %llu: the anchor's upload is still open\n",
                     (unsigned long long)step);
  return rc;
}

/* Faults of a job (a step that is none: (uint64_t)-1). */
typedef struct {
  /* rank 2 fails that step once (an error in its trainer, a tensor
   * missing: before the anchor) and every rank retries it */
  uint64_t err_step;
  /* rank 2 fails its first part of that step's anchor once the upload has
   * begun, and every rank retries it */
  uint64_t part_step;
  /* the upload of that step's head fails after rank 0's commit; every
   * rank then retries the step, or (head_then_stop) the job ends there */
  uint64_t head_step;
  int head_then_stop;
  /* the single publisher commits from this step on (a restarted job's
   * first step may be one it committed already) */
  uint64_t single_from;
  /* this rank (not 0) reaches err_step 1.5 s late: rank 0 has given the
   * attempt up by then, and the rank joins its retry (0: none) */
  int err_late_rank;
  /* this rank (not 0) of a restarted job resumes only once rank 0 has
   * brought the bucket up to its store (the bucket's head at the job's
   * first step): its snapshot is then that step's (0: none) */
  int resume_late_rank;
  /* after the last step, every rank calls it again: rank 0 refuses at
   * once, the others after a short timeout, saying what to do */
  int repeat_last;
} faults;

static const faults no_faults = {(uint64_t)-1, (uint64_t)-1, (uint64_t)-1, 0,
                                 0, 0, 0, 0};

/* Waits (up to 20 s) for the bucket's head to reach `step`. */
static int head_reaches(pulse_upload *up, uint64_t step) {
  for (int i = 0; i < 2000; i++) {
    pulse_buffer hb = {0};
    pulse_store_head *h = NULL;
    int there = pulse_upload_key_get(up, "head.json", &hb) == PULSE_OK &&
                pulse_store_head_parse(hb.data, hb.size, &h) == PULSE_OK &&
                pulse_store_head_step(h) >= step;
    pulse_store_head_free(h);
    pulse_buffer_free(&hb);
    if (there)
      return 1;
    usleep(10000);
  }
  return 0;
}

/* A step whose head upload fails after rank 0's commit: every rank's
 * error says the step is committed and its upload failed, and the bucket
 * keeps the previous head (until rank 0's next publish). 0 when all
 * hold. */
static int head_upload_fails(pulse_pub_shard *sh, const char *dir,
                             const pulse_pub_shard_step_opts *po,
                             pulse_upload *up, int rank, uint64_t step,
                             const pulse_pub_tensor *t, size_t n) {
  char fault[1100];
  snprintf(fault, sizeof fault, "%s/head-fault", s3.dir);
  if (rank == 0)
    tu_write(fault, "", 0);
  int rc = 0;
  if (pulse_pub_shard_step(sh, dir, po, step, t, n, NULL) == PULSE_OK)
    rc = 60, fprintf(stderr, "rank %d: step %llu went through\n", rank,
                     (unsigned long long)step);
  else if (strstr(pulse_error_detail(), "is committed in rank 0's store") ==
               NULL ||
           (rank != 0 &&
            strstr(pulse_error_detail(), "rank 0 gave it up") == NULL))
    rc = 61, fprintf(stderr, "rank %d: %s\n", rank, pulse_error_detail());
  if (rank == 0)
    unlink(fault);
  pulse_buffer hb = {0};
  pulse_store_head *h = NULL;
  /* Rank 0 looks (the others may look after its retry uploaded it). */
  if (rc == 0 && rank == 0 &&
      (pulse_upload_key_get(up, "head.json", &hb) != PULSE_OK ||
       pulse_store_head_parse(hb.data, hb.size, &h) != PULSE_OK ||
       pulse_store_head_step(h) != step - 1))
    rc = 62, fprintf(stderr, "rank %d: the bucket's head moved\n", rank);
  pulse_store_head_free(h);
  pulse_buffer_free(&hb);
  return rc;
}

/* Rank `rank` of a job, steps first..last, its own folder root/rank-R and
 * its own bucket handle, with the faults `fx`. */
static int run_rank(const char *root, uint64_t seed, int rank, uint64_t first,
                    uint64_t last, const faults *fx) {
  uint64_t err_step = fx->err_step, part_step = fx->part_step;
  char dir[4096], scratch[4200], single[4096];
  snprintf(dir, sizeof dir, "%s/rank-%d", root, rank);
  snprintf(scratch, sizeof scratch, "%s/scratch", dir);
  /* Reopened by a restarted job too, as rank 0's committer is. */
  snprintf(single, sizeof single, "%s/single", root);
  mkdir(dir, 0755);
  pulse_upload *up = handle();
  if (up == NULL)
    FAIL(10, "rank %d: upload: %s", rank, pulse_error_detail());
  sm_model m;
  sm_model_init(&m, &spec, seed);
  sm_blocks rb[RANKS];
  blocks_of(rb);
  pulse_pub_shard_opts so;
  pulse_pub_shard_opts_init(&so);
  so.tensors = m.info, so.tensor_count = NT;
  so.blocks = rb[rank].b, so.block_count = rb[rank].n;
  so.chunk_log2 = LOG2;
  pulse_pub_shard *sh = NULL;
  if (pulse_pub_shard_create(&so, &sh) != PULSE_OK)
    FAIL(11, "rank %d: shard: %s", rank, pulse_error_detail());
  pulse_pub *committer = NULL, *lockstep = NULL;
  pulse_pub_opts o;
  pub_opts(&o, &m);
  if (rank == 0) {
    /* The staging folder's anchors are only in the bucket. */
    if (first > 0 && pulse_upload_fetch_missing(up, dir, NULL) != PULSE_OK)
      FAIL(12, "rank 0: fetch_missing: %s", pulse_error_detail());
    if (pulse_pub_create_committer(dir, &o, &committer) != PULSE_OK)
      FAIL(13, "rank 0: committer: %s", pulse_error_detail());
    if (pulse_pub_create(single, &o, &lockstep) != PULSE_OK)
      FAIL(14, "rank 0: single: %s", pulse_error_detail());
  }
  if (first > 0) {
    const char *from = dir;
    if (rank != 0) { /* no store folder: a copy of the bucket's, for the call */
      if (rank == fx->resume_late_rank && !head_reaches(up, first))
        FAIL(18, "rank %d: the bucket's head did not reach step %llu", rank,
             (unsigned long long)first);
      if (pulse_upload_fetch_store(up, scratch, NULL) != PULSE_OK)
        FAIL(15, "rank %d: fetch_store: %s", rank, pulse_error_detail());
      from = scratch;
    }
    if (pulse_pub_shard_resume(sh, from) != PULSE_OK)
      FAIL(16, "rank %d: resume: %s", rank, pulse_error_detail());
    if (rank != 0)
      tu_rm_rf(strdup(scratch)); /* the copy goes: it held the whole state */
  }
  pulse_pub_shard_step_opts po;
  pulse_pub_shard_step_opts_init(&po);
  po.rank = rank, po.world = RANKS, po.committer = committer,
  po.timeout_ms = 20000;
  po.bucket = up;
  po.part_bytes = PART_BYTES;
  int rc = 0;
  for (uint64_t step = 0; step <= last && rc == 0; step++) {
    if (step > 0)
      model_step(&m);
    if (lockstep != NULL && step >= first &&
        step >= fx->single_from) { /* the single publisher of the gathered
                                      weights */
      pulse_pub_tensor all[NT];
      for (int t = 0; t < NT; t++)
        all[t] = (pulse_pub_tensor){m.w[t], PULSE_DTYPE_F32, PULSE_PUB_HOST};
      if (pulse_pub_commit(lockstep, step, all, NT, NULL) != PULSE_OK)
        FAIL(17, "single step %llu: %s", (unsigned long long)step,
             pulse_error_detail());
    }
    if (step < first)
      continue;
    pulse_pub_tensor t[3 * NT];
    float *d[3 * NT];
    for (size_t b = 0; b < rb[rank].n; b++) {
      d[b] = sm_block_data(&m, &rb[rank].b[b], NULL);
      t[b] = (pulse_pub_tensor){d[b], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    }
    int joined_retry = 0;
    if (step == err_step) {
      /* Rank 2 gives one tensor too few: every rank in the attempt fails
       * it with its reason, and the bucket keeps the previous head. A rank
       * that reaches the step after rank 0 has given the attempt up joins
       * rank 0's retry instead (shard_step.c), where every rank gives its
       * whole part: its call returns the step, committed. Ranks 0 (it
       * opens the attempt) and 2 never do. */
      size_t given = rb[rank].n - (rank == 2);
      if (fx->err_late_rank != 0 && rank == fx->err_late_rank)
        usleep(1500000);
      if (pulse_pub_shard_step(sh, dir, &po, step, t, given, NULL) == PULSE_OK)
        joined_retry = 1;
      else if (rank != 2 && strstr(pulse_error_detail(), "rank 2") == NULL)
        rc = 21, fprintf(stderr, "rank %d: %s\n", rank, pulse_error_detail());
      if (joined_retry && (rank == 0 || rank == 2))
        rc = 20;
      pulse_buffer hb = {0};
      pulse_store_head *h = NULL;
      if (rc == 0 &&
          (pulse_upload_key_get(up, "head.json", &hb) != PULSE_OK ||
           pulse_store_head_parse(hb.data, hb.size, &h) != PULSE_OK ||
           pulse_store_head_step(h) != step - (uint64_t)!joined_retry))
        rc = 22, fprintf(stderr, "rank %d: the bucket's head moved\n", rank);
      pulse_store_head_free(h);
      pulse_buffer_free(&hb);
    }
    if (step == part_step) {
      if (rank == 2)
        setenv("PULSE_TEST_SHARD_PART_FAIL", "1", 1);
      if (pulse_pub_shard_step(sh, dir, &po, step, t, rb[rank].n, NULL) ==
          PULSE_OK)
        rc = 23;
      else if (strstr(pulse_error_detail(), "on purpose") == NULL)
        rc = 24, fprintf(stderr, "rank %d: %s\n", rank, pulse_error_detail());
      unsetenv("PULSE_TEST_SHARD_PART_FAIL");
      if (rc == 0 && rank == 0)
        rc = check_given_up(up, single, step);
    }
    if (rc == 0 && step == fx->head_step) {
      rc = head_upload_fails(sh, dir, &po, up, rank, step, t, rb[rank].n);
    }
    if (rc == 0 && step == fx->head_step && fx->head_then_stop) {
      /* The job ends right after the failed upload. */
      for (size_t b = 0; b < rb[rank].n; b++)
        free(d[b]);
      break;
    }
    if (rc == 0 && !joined_retry &&
        pulse_pub_shard_step(sh, dir, &po, step, t, rb[rank].n, NULL) != PULSE_OK)
      rc = 3, fprintf(stderr, "rank %d step %llu: %s\n", rank,
                      (unsigned long long)step, pulse_error_detail());
    if (rc == 0 && rank == 0)
      rc = check_step(up, single, dir, first, step);
    for (size_t b = 0; b < rb[rank].n; b++)
      free(d[b]);
  }
  if (rc == 0 && fx->repeat_last) {
    pulse_pub_tensor t[3 * NT];
    float *d[3 * NT];
    for (size_t b = 0; b < rb[rank].n; b++) {
      d[b] = sm_block_data(&m, &rb[rank].b[b], NULL);
      t[b] = (pulse_pub_tensor){d[b], PULSE_DTYPE_F32, PULSE_PUB_HOST};
    }
    po.timeout_ms = 1500;
    const char *want = rank == 0 ? "is not above the head's"
                                 : "the step is the bucket's head";
    if (pulse_pub_shard_step(sh, dir, &po, last, t, rb[rank].n, NULL) ==
        PULSE_OK)
      rc = 25, fprintf(stderr, "rank %d: step %llu again went through\n",
                       rank, (unsigned long long)last);
    else if (strstr(pulse_error_detail(), want) == NULL)
      rc = 26, fprintf(stderr, "rank %d: %s\n", rank, pulse_error_detail());
    for (size_t b = 0; b < rb[rank].n; b++)
      free(d[b]);
  }
  pulse_pub_free(committer);
  pulse_pub_free(lockstep);
  pulse_pub_shard_free(sh);
  pulse_upload_free(up);
  sm_model_free(&m);
  return rc;
}

static void run_job(const char *root, uint64_t seed, uint64_t first,
                    uint64_t last, const faults *fx) {
  pid_t pid[RANKS];
  for (int r = 0; r < RANKS; r++) {
    pid[r] = fork();
    cr_assert(pid[r] >= 0);
    if (pid[r] == 0)
      _exit(run_rank(root, seed, r, first, last, fx));
  }
  for (int r = 0; r < RANKS; r++) {
    int status = 0;
    cr_assert_eq(waitpid(pid[r], &status, 0), pid[r]);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "rank %d exited %d", r,
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
}

Test(shard_bucket, four_ranks_without_a_shared_folder_publish_as_one_publisher,
     .init = s3_start, .fini = s3_stop, .timeout = 240) {
  char *root = tu_make_dir();
  faults fx = no_faults;
  fx.repeat_last = 1; /* a step published is not published again */
  run_job(root, 91, 0, 4, &fx);
  tu_rm_rf(root);
}

Test(
    shard_bucket,
    a_failing_rank_or_part_fails_the_step_everywhere_and_a_restarted_job_goes_on,
    .init = s3_start, .fini = s3_stop, .timeout = 240) {
  char *root = tu_make_dir();
  /* Steps 2 and 4 are anchors' (anchor_every 2): rank 2 fails a part of
   * step 2's once the upload has begun, and step 4 before its anchor. */
  faults fx = no_faults;
  fx.err_step = 4, fx.part_step = 2, fx.err_late_rank = 3;
  run_job(root, 92, 0, 4, &fx);
  /* New shards, a new process per rank: from the bucket. */
  run_job(root, 92, 5, 6, &no_faults);
  tu_rm_rf(root);
}

Test(shard_bucket,
     a_head_upload_failing_after_the_commit_is_retried_and_goes_on,
     .init = s3_start, .fini = s3_stop, .timeout = 240) {
  char *root = tu_make_dir();
  /* Step 2 is an anchor's, made in the bucket before the commit; step 3 a
   * patch's. Each fails at its head's upload, and every rank retries it:
   * the retry returns it on every rank, the bucket then holds it, and the
   * next steps are the single publisher's. */
  faults fx = no_faults;
  fx.head_step = 2;
  run_job(root, 93, 0, 3, &fx);
  fx.head_step = 5;
  fx.single_from = 4;
  run_job(root, 93, 4, 6, &fx);
  tu_rm_rf(root);
}

Test(shard_bucket, a_job_restarted_after_a_failed_head_upload_goes_on,
     .init = s3_start, .fini = s3_stop, .timeout = 240) {
  char *root = tu_make_dir();
  /* The job ends right after step 3's failed head upload: rank 0's store
   * holds step 3, the bucket (which the others resume from) step 2. */
  faults fx = no_faults;
  fx.head_step = 3, fx.head_then_stop = 1;
  run_job(root, 94, 0, 3, &fx);
  /* The restarted job publishes the bucket's next step, 3 (committed by
   * the old job, uploaded now: the same on every rank), then 4 and 5.
   * Rank 3 resumes after rank 0 has uploaded step 3 (its snapshot is step
   * 3's, the others' step 2's): its call of step 3 returns it too. */
  fx = no_faults;
  fx.single_from = 4;
  fx.resume_late_rank = 3;
  run_job(root, 94, 3, 5, &fx);
  tu_rm_rf(root);
}
