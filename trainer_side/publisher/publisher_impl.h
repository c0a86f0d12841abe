/* publisher_impl.h - private to the publisher: its state and the pieces of
 * a commit shared by publisher*.c. */
#ifndef PULSE_PUBLISHER_IMPL_H
#define PULSE_PUBLISHER_IMPL_H

#include <pthread.h>

#include "pulse_cuda.h"
#include "pulse_publisher.h"
#include "pulse_store.h"
#include "store_impl.h"

/* A file whose bytes are written under a temporary name ".NAME.tmp-*"
 * (what recovery removes) with its data made durable, not yet renamed. */
typedef struct {
  char tmp[4352]; /* "" when there is none */
} pub_staged;

/* pub_staged_write on a thread of its own, optionally followed by the
 * rename once the committing thread has found the name (a commit stages its
 * patch while it hashes it, and its head while it checks it). */
typedef struct {
  const char *folder, *hint;
  const void *data; /* borrowed until pub_stage_finish */
  size_t size;
  pub_staged staged; /* the staged file (when not renamed by the job) */
  int rename;        /* rename to `final` once named */
  int named;         /* 0: waiting; 1: `final` given; -1: drop the file */
  char final[4096];
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pulse_status status;
  char detail[512];
  pthread_t thread;
  int threaded;
} pub_stage_job;

/* A head built, signed and being staged (its bytes in `json` until the job
 * is finished), then checked, waiting for its rename. */
typedef struct {
  pulse_store_head *head;
  pulse_buffer json;
  pub_stage_job job;
  int started;
} pub_head_txn;

/* The work a commit leaves to a thread once its head has moved and the
 * head's hook has run: moving the host snapshot to the step (host commits),
 * removing what the head stopped naming, then writing an anchor (when due
 * and not written in the commit). */
typedef struct {
  struct pulse_pub *pub;
  uint64_t step;
  int move;   /* move the snapshot first (pub->changes' new bits) */
  int anchor; /* then write an anchor of it */
  int moved;  /* set (under pub->moved_mu) once the snapshot has moved */
  pulse_store_object *garbage; /* owned: objects to remove */
  size_t ngarbage;
  pulse_state_digest digest;
  pulse_status status;
  char detail[512];
  pulse_store_object obj;
  double seconds;      /* the anchor's write */
  double move_seconds; /* the snapshot's move */
} pub_anchor_job;

/* An object the head stopped naming, removed once its grace period is
 * over (publisher_gc.c). */
typedef struct {
  char path[PULSE_STORE_PATH_MAX]; /* relative to the store */
  double since;                    /* wall-clock seconds it left the head */
} pub_retired;

/* Where the last host commit's time went, finer than pulse_pub_figures
 * (wall-clock seconds; what `pulse-bench codec --commit` prints). */
typedef struct {
  double detect;  /* change detection over every tensor */
  double encode;  /* pulse_patch_encode (its own split: pulse_encode_times) */
  double digests; /* the target digests read back from the patch's table */
  double hash;    /* SHA-256 of the patch (its object name) */
  double head;    /* the head built, signed, checked and staged */
  double durable; /* then waiting for the patch to be durable under its name */
  double publish; /* the head renamed over head.json, the folder fsynced */
} pub_commit_split;

struct pulse_pub {
  char *dir;
  pulse_pub_opts opts; /* opts.tensors points at `info` */
  size_t count;
  pulse_tensor_info *info; /* names owned */
  uint64_t *numel;
  uint64_t params;
  uint16_t **snap; /* NULL before the first commit */
  pulse_tensor_digest *digests;
  pulse_tensor_digest *scratch_digests;
  pulse_state_digest state_digest;
  pulse_store_head *head; /* NULL before the first commit */
  pulse_changes *changes;
  pulse_encode_tensor *enc;
  uint64_t last_anchor_step;
  /* background job (snapshot move, removals, anchor): running, or its
   * anchor finished and not yet named by a head */
  pthread_t anchor_thread;
  int anchor_running;
  pub_anchor_job job;
  pthread_mutex_t moved_mu; /* job.moved, signalled on moved_cv */
  pthread_cond_t moved_cv;
  /* the background job the last commit asks for (pub_anchor_start) */
  int next_move, next_anchor;
  int pending_ready;
  pulse_store_object pending;
  /* objects the head stopped naming, retired after the head's hook */
  pulse_store_object *garbage;
  size_t ngarbage, garbage_cap;
  /* retired objects in their grace period; only the background job (or the
   * driving thread while none runs) touches the list */
  pub_retired *retired;
  size_t nretired, retired_cap;
  /* Where the head's state is held (publisher_device.c): `snap` on the host
   * (always allocated once there is a head) and, after a commit of device
   * tensors, `snap_d` on the device. A commit runs where its tensors are
   * and leaves the other copy stale; the other side catches up (download,
   * upload, or a rebuild from the store) when it is next needed. */
  int host_current;
  int device_current;
  void *snap_block_d; /* one allocation for every tensor's snap_d */
  uint16_t **snap_d;  /* NULL before the first device commit */
  void **stage_d;     /* device copies of host tensors of a mixed commit */
  size_t *stage_bytes;
  pulse_cuda_workspace *ws;
  /* During pulse_pub_rotate_key: the key heads were signed with, which
   * signs the rotation record of the head being written (opts.key is then
   * the new key already). NULL otherwise. */
  const pulse_sign_key *rotating_from;
  /* The store's writer lock (writer_lock_impl.h), held for the
   * publisher's life; -1 before it is taken. */
  int lock_fd;
  /* pulse_pub_create_committer: no snapshot; commits what the ranks of a
   * sharded step made (pulse_pub_commit_made). */
  int committer;
  /* The last commit's time split (the snapshot's move after it:
   * job.move_seconds, once pulse_pub_wait returned). */
  pub_commit_split split;
  /* Host detection (publisher_detect.c): one item per chunk, kept from
   * commit to commit, and per tensor the rank form given to the encoder. */
  struct pub_detect_item *det;
  size_t det_items;
  uint32_t **det_hist; /* per tensor: chunks x PULSE_CLASS_COUNT counts */
  uint8_t **det_cls;   /* per tensor: each change's class */
  uint32_t **det_rank; /* per tensor: each change's rank in its class */
  uint64_t *det_cap;   /* per tensor: room in det_cls and det_rank */
};

/** The key rotation record of the next head (publisher_rotate.c): a new
 * one, signed by pub->rotating_from, during a rotation; else the current
 * head's, carried on while the head is signed by the key it rotated to,
 * so that a worker that missed the rotation head still can follow it. */
pulse_status pub_rotation_fields(const pulse_pub *pub, store_head_fields *f);

/** PULSE_ERR_ARG when opts.key is the key the store's head rotated away
 * from (a publisher restarted with the old key by mistake). */
pulse_status pub_key_check(const pulse_pub *pub);

/** Hashes the anchor file `staged` (in objects/), renames it to
 * objects/<sha256>.safetensors and fsyncs the folder; removes it on
 * failure. */
pulse_status pub_anchor_name(const char *dir, const char *staged, uint64_t step,
                             pulse_store_object *out);

/** Writes the state (table order) as an anchor object: staged under a
 * temporary name, hashed, renamed to objects/<sha256>.safetensors. */
pulse_status pub_anchor_write(const char *dir, const pulse_tensor_info *info,
                              size_t count, uint16_t *const *bits,
                              uint64_t step, const pulse_state_digest *digest,
                              pulse_store_object *out);

/** Starts the background job of step `step` (the head has moved to it and
 * its hook has run): with `move`, the snapshot moves to the step
 * (pub->changes' new bits); then the queued garbage is removed (the job
 * takes the list); with `anchor`, an anchor of the snapshot at the step is
 * written. pub->changes and pub->snap belong to the job until
 * pub_snapshot_wait (the move) or pub_anchor_join (the anchor). Nothing to
 * do: no thread. When no thread can be started, the move and the removals
 * are done in line and PULSE_ERR_NOMEM says that the anchor was not
 * started. */
pulse_status pub_anchor_start(pulse_pub *pub, uint64_t step, int move,
                              int anchor);

/** Waits for the whole background job; a finished anchor becomes pending
 * (a failed one is logged and dropped). */
void pub_anchor_join(pulse_pub *pub);

/** Waits until the background job has moved the snapshot (then pub->snap
 * and pub->changes may be read; only after pub_anchor_join written). */
void pub_snapshot_wait(pulse_pub *pub);

/** Detects the changes of a host commit's tensors against the host
 * snapshot (not written) on the publisher's threads into pub->changes, and
 * points pub->enc at them in the rank form (base NULL: the encoder takes
 * each change's class and rank, which detection found from the same pass
 * over the snapshot). */
pulse_status pub_detect(pulse_pub *pub, const pulse_pub_tensor *t);

/** Frees what pub_detect keeps between commits. */
void pub_detect_free(pulse_pub *pub);

/** Writes every change's new (old: 1) bits into the host snapshot. */
void pub_snapshot_move(pulse_pub *pub, int old);

/** Builds, signs, self-checks and writes the head of the given fields and
 * replaces pub->head; the objects the previous head or the lists named that
 * this one does not are queued for pub_remove_garbage. Retention is applied
 * to the lists first. pub_head_prepare then pub_head_publish. */
pulse_status pub_head_write(pulse_pub *pub, uint64_t step,
                            const pulse_state_digest *digest,
                            const pulse_store_object *patches, size_t npatches,
                            const pulse_store_object *anchors, size_t nanchors);

/** The first half of pub_head_write: the head built, signed, self-checked
 * and staged (temporary file, data durable) in *txn. Nothing visible moves;
 * finish with pub_head_publish or pub_head_abort. */
pulse_status pub_head_prepare(pulse_pub *pub, uint64_t step,
                              const pulse_state_digest *digest,
                              const pulse_store_object *patches,
                              size_t npatches,
                              const pulse_store_object *anchors,
                              size_t nanchors, pub_head_txn *txn);

/** The second half: renames the staged head over head.json, fsyncs the
 * store folder, replaces pub->head and queues what it stopped naming (of
 * the previous head and of the lists given to pub_head_prepare). On error
 * pub->head stays the previous one (after a rename whose fsync failed the
 * new head is on disk but maybe not durable; a retry writes it again). */
pulse_status pub_head_publish(pulse_pub *pub, pub_head_txn *txn,
                              const pulse_store_object *patches,
                              size_t npatches,
                              const pulse_store_object *anchors,
                              size_t nanchors);

/** Drops a prepared head (NULL fields are fine). */
void pub_head_abort(pub_head_txn *txn);

/** Writes `n` bytes into a new temporary file ".HINT.tmp-*" of `folder` and
 * makes them durable (write, fdatasync): recovery removes the file after a
 * crash until pub_staged_publish names it. On error nothing is left. */
pulse_status pub_staged_write(const char *folder, const char *hint,
                              const void *data, size_t n, pub_staged *out);

/** Renames a staged file to `final` (in the same folder) and fsyncs the
 * folder: the file is then durable under its name. *renamed tells whether
 * the rename happened (an fsync error comes after it). On a failed rename
 * the staged file is removed. */
pulse_status pub_staged_publish(pub_staged *s, const char *final, int *renamed);

/** Removes a staged file, if any. */
void pub_staged_drop(pub_staged *s);

/** Starts pub_staged_write(job->folder, job->hint, job->data, job->size)
 * on a thread (in line when no thread can be started). With `rename`, the
 * job then waits for pub_stage_name and renames the file itself (the rename
 * and the folder's fsync are part of its status). */
void pub_stage_start(pub_stage_job *job, int rename);

/** The final path of a job started with `rename` (once; later calls and
 * calls for other jobs are ignored). */
void pub_stage_name(pub_stage_job *job, const char *final);

/** Waits for the job (a `rename` job never named drops its file).
 * @return its status: without `rename`, job->staged holds the file on OK;
 * with it, the file is durable under its final name on OK. */
pulse_status pub_stage_finish(pub_stage_job *job);

/** Waits for a job whose result no longer matters (the commit failed
 * already) and drops its staged file; the current error detail stays. A job
 * already named may have renamed its file: an unnamed object, which
 * recovery removes. */
void pub_stage_cancel(pub_stage_job *job);

/* ------------------------------------------- device snapshot (CUDA builds) */

/** Makes pub->snap hold the head's state: downloaded from the device copy,
 * or rebuilt from the store when neither copy is current (after a device
 * commit that failed late). Joins a background anchor first (it reads
 * pub->snap). */
pulse_status pub_host_current(pulse_pub *pub);

/** Runs detection and encoding of a step whose tensors are (at least
 * partly) in device memory: the device snapshot is made current first (one
 * upload), host tensors of the step are uploaded to staging, and
 * pulse_cuda_patch_encode makes the patch and moves the device snapshot to
 * the step. On success pub->scratch_digests holds the target digests, the
 * host snapshot is stale (host_current 0) and pub->changes is not used.
 * On failure no snapshot has moved. */
pulse_status pub_device_encode(pulse_pub *pub, const pulse_pub_tensor *t,
                               const pulse_encode_opts *eo,
                               pulse_buffer *patch);

/** Copies the device snapshot into pub->snap (after pub_anchor_join). */
pulse_status pub_device_download(pulse_pub *pub);

/** Copies a device tensor of a step to host memory `dst` (numel values of
 * its dtype): the first commit of a store starts on the host. */
pulse_status pub_device_fetch(const pulse_pub *pub, size_t i,
                              const pulse_pub_tensor *t, void *dst);

/** Releases the device snapshot, staging and workspace. */
void pub_device_free(pulse_pub *pub);

/** Retires the queued objects (after the head's hook has run). */
void pub_remove_garbage(pulse_pub *pub);

/* ------------------------------------------- retired objects (publisher_gc.c) */

/** Retires objects the head stopped naming: with a grace period, stamps
 * each file's modification time with now (the time it left the head, which
 * outlives the process) and keeps it on the list; without one, removes
 * them. Then removes the listed objects whose grace is over. */
void pub_gc_retire(pulse_pub *pub, const pulse_store_object *list, size_t n);

/** Lists the objects no head names that recovery kept (their grace not
 * over), retired at their modification time. After the head is loaded. */
pulse_status pub_gc_open(pulse_pub *pub);

/** Removes the listed objects whose grace is over. */
void pub_gc_sweep(pulse_pub *pub);

/** 1 when a listed object's grace is over (a sweep would remove it). */
int pub_gc_due(const pulse_pub *pub);

/** Frees the list (the files stay). */
void pub_gc_free(pulse_pub *pub);

/** Queues an object for removal unless the current head names it. */
void pub_garbage_add(pulse_pub *pub, const pulse_store_object *obj);

#endif /* PULSE_PUBLISHER_IMPL_H */
