/* shard_step_bucket.c - what the collective step through the bucket does
 * when the bucket's head and a rank disagree (shard_step_impl.h): rank 0's
 * store ahead of the bucket (an upload that failed after its commit) is
 * uploaded before a step opens; a rank whose snapshot is below the
 * bucket's head (it saw a step fail that rank 0 had committed) takes it
 * again from a copy of the bucket's store. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <errno.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail_impl.h"
#include "pulse_log.h"
#include "shard_impl.h"
#include "shard_step_impl.h"
#include "status_impl.h"

pulse_status shard_bucket_catch_up(shard_medium *m, const char *dir,
                                   int *behind) {
  *behind = 0;
  pulse_store_head *h = NULL;
  pulse_status st = pulse_store_head_load(dir, &h);
  if (st == PULSE_ERR_NOT_FOUND)
    return PULSE_OK; /* nothing committed yet */
  if (st != PULSE_OK)
    return st;
  uint64_t local = pulse_store_head_step(h);
  pulse_store_head_free(h);
  int has = 0;
  uint64_t there = 0;
  PULSE_TRY(m->head(m, &has, &there, NULL));
  if (has && there >= local)
    return PULSE_OK;
  *behind = 1;
  PULSE_LOG_AT(PULSE_LOG_WARN,
               "shard: the bucket's head (%s%" PRIu64 ") is behind rank 0's "
               "store (step %" PRIu64 "): uploading what it lacks",
               has ? "step " : "none, ", there, local);
  st = pulse_upload_store(m->bucket, dir, NULL);
  if (st != PULSE_OK)
    return pulse_fail_context(st,
                              "shard: rank 0's store holds step %" PRIu64
                              " and the bucket's head is %s%" PRIu64
                              ": uploading it failed (nothing else changed; "
                              "the next publish tries again)",
                              local, has ? "step " : "none, ", there);
  return PULSE_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int flag,
                        struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

pulse_status shard_bucket_snapshot(pulse_pub_shard *s, pulse_upload *bucket,
                                   const char *dir, uint64_t head) {
  PULSE_LOG_AT(PULSE_LOG_WARN,
               "shard: this rank's snapshot (%s%" PRIu64
               ") is below the bucket's head (step %" PRIu64
               "): taking it again from the bucket",
               s->have_snapshot ? "step " : "none, ",
               s->have_snapshot ? s->snap_step : 0, head);
  char scratch[4352];
  if ((size_t)snprintf(scratch, sizeof scratch, "%s/.resume-XXXXXX", dir) >=
      sizeof scratch)
    return pulse_fail(PULSE_ERR_ARG, "shard: %s: path too long", dir);
  if ((mkdir(dir, 0755) != 0 && errno != EEXIST) || mkdtemp(scratch) == NULL)
    return pulse_fail(PULSE_ERR_IO, "shard: %s: %s", scratch, strerror(errno));
  /* The copy holds the whole state for the time of the resume only. */
  pulse_status st = pulse_upload_fetch_store(bucket, scratch, NULL);
  if (st == PULSE_OK)
    st = pulse_pub_shard_resume(s, scratch);
  if (st != PULSE_OK)
    st = pulse_fail_context(st,
                            "shard: taking the snapshot of the bucket's head "
                            "(step %" PRIu64 ") again",
                            head);
  nftw(scratch, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
  return st;
  return PULSE_OK;
}
