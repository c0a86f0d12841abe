/* shard_step_impl.h - private to the collective step (pulse_pub_shard_step):
 * the medium its ranks exchange the step's files through (a shared store
 * folder, or the store's bucket), and what the step's parts share. */
#ifndef PULSE_SHARD_STEP_IMPL_H
#define PULSE_SHARD_STEP_IMPL_H

#include "pulse_pub_shard.h"
#include "pulse_store.h"
#include "pulse_upload.h"

/* Where the step's small files live: STORE/shard/ of a folder every rank
 * shares, or <prefix>/shard/ of the bucket (each rank its own handle). The
 * protocol (shard_step.c) is the same over both. */
typedef struct shard_medium shard_medium;
struct shard_medium {
  /* Puts the file `name` whole (readers never see part of it). */
  pulse_status (*put)(shard_medium *m, const char *name, const void *data,
                      size_t n);
  /* 1 and its bytes when the file is there, 0 when not (yet), -1 on an
   * error (the detail says it). */
  int (*get)(shard_medium *m, const char *name, pulse_buffer *out);
  /* The n files names[i] as get finds them, at once: outs[i] holds one
   * that is there (whole), its data NULL for one that is not (yet). 0, or
   * -1 on an error (the detail says it; every out then empty). */
  int (*get_many)(shard_medium *m, const char *const *names, size_t n,
                  pulse_buffer *outs);
  /* 1 and the names of the files that start with `prefix` (each ended by
   * a NUL, *count of them; free names), 0 when there is none, -1 on an
   * error (the detail says it). One look, whatever their number. */
  int (*list)(shard_medium *m, const char *prefix, pulse_buffer *names,
              size_t *count);
  /* Removes the files of `step`: rank R's own but its go (rank >= 0), or
   * every rank's (rank < 0); keep_fail keeps the ranks' reasons. */
  void (*drop)(shard_medium *m, uint64_t step, int rank, int keep_fail);
  /* The head the ranks follow: its step (0 and *has 0 when none) and
   * digest (may be NULL). */
  pulse_status (*head)(shard_medium *m, int *has, uint64_t *step,
                       pulse_state_digest *digest);
  double nap_first_s, nap_most_s; /* polling: backoff between these */
  char folder[4096];              /* the folder medium's STORE/shard */
  const char *store_dir;          /* the folder medium's STORE */
  pulse_upload *bucket;           /* the bucket medium's handle */
};

/** The folder medium over STORE/shard (made when missing). */
pulse_status shard_medium_folder(shard_medium *m, const char *store_dir);

/** The bucket medium over <prefix>/shard/ of `bucket`. */
void shard_medium_bucket(shard_medium *m, pulse_upload *bucket);

/** 1 when the file `name` belongs to step `step` and to what drop removes
 * (see shard_medium.drop). */
int shard_file_dropped(const char *name, uint64_t step, int rank,
                       int keep_fail);

/** Rank 0 of the bucket exchange, before a step opens: when the bucket's
 * head is behind the store in `dir` (an upload that failed after a
 * commit), uploads what the bucket lacks (pulse_upload_store, the head
 * last); *behind says it was. A failure says so, and nothing else
 * changed. */
pulse_status shard_bucket_catch_up(shard_medium *m, const char *dir,
                                   int *behind);

/** A rank other than 0 of the bucket exchange whose snapshot is below the
 * bucket's head `head`: takes it again from a copy of the bucket's store
 * made under `dir` and removed after (logged, a warning). */
pulse_status shard_bucket_snapshot(pulse_pub_shard *s, pulse_upload *bucket,
                                   const char *dir, uint64_t head);

/* One attempt of a step as every waiter sees it. */
typedef struct {
  shard_medium *m;
  uint64_t step, nonce;
  int world, rank;
  double deadline; /* CLOCK_MONOTONIC seconds */
} shard_attempt;

/** Waits for the file `name` of the attempt; fails at once, with the
 * reason, when a rank gave the attempt up (its fail file, or rank 0's go
 * gone), or at the deadline. */
pulse_status shard_attempt_wait(const shard_attempt *a, const char *name,
                                pulse_buffer *out);

/** Names the attempt's file "S.N.<what>" in out. */
void shard_attempt_name(const shard_attempt *a, char *out, size_t cap,
                        const char *what);

/* The bucket's anchor of a step, made in parts (shard_step_anchor.c). */
typedef struct {
  char rel[128]; /* objects/<sha256>.safetensors */
  char id[1024]; /* the multipart upload's, "" before it begins */
  uint8_t sha256[32];
  uint64_t size;
} shard_bucket_anchor;

/** Every rank: the anchor of the attempt's step (its target digest, the
 * snapshot or the pending values), cut in parts of part_bytes in file
 * order, each assembled by the rank owning most of its bytes from the
 * others' bytes (step files "bytes-K-R"), hashed as a SHA-256 chain in
 * file order (the state after part K in "sha-K-R"), then put by its rank
 * into one multipart upload rank 0 begins ("upload-0"); each rank's ETags
 * ("etags-R"). On rank 0, when every rank's parts are in: completed, its
 * size checked, and *out says what the head names. `parts` are every
 * rank's parts of the step (their blocks). A failure leaves out->id set
 * on rank 0 when the upload began: abort it. */
pulse_status shard_bucket_anchor_make(const shard_attempt *a,
                                      const pulse_pub_shard *s,
                                      pulse_upload *bucket, uint64_t part_bytes,
                                      const pulse_buffer *parts,
                                      const pulse_state_digest *target,
                                      int pending, shard_bucket_anchor *out);

#endif
