/* pulse_publisher.h - the trainer's side of pulse: publish each step's BF16
 * weights into a store (pulse_store.h) as a patch against the previous step,
 * with an anchor (the whole state) every few steps, a signed head that moves
 * atomically, and retention of old objects.
 *
 *   pulse_pub_opts o; pulse_pub_opts_init(&o);
 *   o.tensors = table; o.tensor_count = n; o.key = key;
 *   pulse_pub *pub;
 *   pulse_pub_create("/data/store", &o, &pub);      // resumes an existing
 * store for (;;) {                                      // after each optimizer
 * step pulse_pub_tensor t[n] = {{master[0], PULSE_DTYPE_F32, PULSE_PUB_HOST},
 * ...}; pulse_pub_figures fig; pulse_pub_commit(pub, step, t, n, &fig);
 *   }
 *   pulse_pub_free(pub);
 *
 * The publisher keeps the published BF16 state (the snapshot, 2 bytes per
 * parameter of host memory) and its per-tensor digests, kept current in
 * O(changes) per step. A commit finds the changed BF16 values (FP32 master
 * weights are cast by the one rounding), encodes the patch, writes it
 * durably, moves the head, then drops what retention no longer keeps. A
 * failed commit changes nothing: the snapshot, the head and every object the
 * head names are as before, and the next commit may retry.
 *
 * Device tensors (CUDA builds): a commit whose tensors are in GPU memory
 * (PULSE_PUB_DEVICE) detects and encodes on the device against a second copy
 * of the snapshot kept in device memory (2 bytes per parameter, allocated and
 * uploaded from the host copy at the first device commit, after
 * pulse_pub_create too), so that only the change lists cross the bus
 * (pulse_cuda_patch_encode); the patch bytes are those a host commit of the
 * same weights writes. The host copy is then stale until something needs it:
 * an anchor (written from a download of the device copy), a host commit or
 * pulse_pub_snapshot, which download it once. Tensors of one commit may mix
 * host and device memory: the host ones are uploaded to device staging kept
 * for the next commits. Device work runs on the tensors' device and on
 * opts.cuda_stream (NULL: pulse's own non-blocking stream of that device,
 * which does not wait for other streams: pass the stream that wrote the
 * tensors, or synchronize it before committing); keep to one device for
 * the publisher's life.
 *
 * Crash safety: objects and the head are written with temporary file,
 * fdatasync, rename, fsync of the folder; the patch's data and the head's go
 * to disk at the same time, the patch is renamed (and its folder synced)
 * before the head. Reopening a store after a crash (pulse_pub_create)
 * removes what an interrupted commit left, rebuilds the snapshot from the
 * newest anchor and the patches after it, checks it against the head's state
 * digest, and continues from the head.
 *
 * Thread-safety: one publisher is driven by one thread at a time; it starts
 * threads of its own: two that stage the patch and the head while the commit
 * hashes and checks them, and a background one that, once a commit has
 * moved the head and run its hook, moves the host snapshot to the step,
 * removes the objects the head stopped naming and writes anchors (the next
 * commit, pulse_pub_snapshot, pulse_pub_wait, pulse_pub_flush and
 * pulse_pub_free wait for what they need of it). The only writer of a store
 * is its one publisher (pulse_pub_create refuses a second one); any number
 * of servers may read the store meanwhile.
 * */
#ifndef PULSE_PUBLISHER_H
#define PULSE_PUBLISHER_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_sign.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a tensor given to a commit lives. */
typedef enum {
  PULSE_PUB_HOST = 0,
  /* CUDA device memory (cudaMalloc'd, or managed), see the top of this
   * file. A commit with device tensors fails with PULSE_ERR_NOT_BUILT when
   * pulse is built without CUDA, with PULSE_ERR_CUDA when no device is
   * usable at run time. */
  PULSE_PUB_DEVICE = 1
} pulse_pub_memory;

/* One tensor of a step, in table order. Borrowed for the call. */
typedef struct {
  /* numel elements of dtype, aligned to the dtype. */
  const void *data;
  /* PULSE_DTYPE_F32 (master weights, cast to BF16 by the one rounding) or
   * PULSE_DTYPE_BF16. Tensors of one step may mix both. */
  pulse_dtype dtype;
  pulse_pub_memory memory;
} pulse_pub_tensor;

/* What a commit did. Times are wall-clock seconds. */
typedef struct {
  uint64_t step;
  uint64_t base_step;    /* the previous head; == step for a store's first */
  uint64_t params;       /* parameters in the table */
  uint64_t changed;      /* BF16 values that changed (0 for the first) */
  uint64_t patch_bytes;  /* 0 for the first commit (an anchor only) */
  uint64_t anchor_bytes; /* bytes of the anchor this commit named, if any */
  int anchor_started;    /* an anchor of this step is being written in the
                            background (a later head names it) */
  int flush;             /* 1: no new step, the head only names an anchor
                            finished in the background */
  double detect_seconds; /* change detection (0 for a device commit) */
  double encode_seconds; /* patch encoding (device commits: detection,
                            encoding and the device snapshot's update, one
                            call) */
  double write_seconds;  /* hashing and durable writes, head included (the
                            host snapshot moves after the call, in the
                            background) */
  double total_seconds;  /* the whole call */
  char state_digest[65]; /* hex state digest of the step (docs/formats/patch.md) */
} pulse_pub_figures;

/* Called on the committing thread each time the head has moved (after the
 * rename, before the commit returns): the hook an in-process server uses to
 * wake long-polls (pulse_server_head_moved). Must not call the publisher. */
typedef void (*pulse_pub_head_fn)(void *ctx, const pulse_pub_figures *figures);

/* Publisher options; start from pulse_pub_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_PUB_OPTS_VERSION */
  /* Anchor when the step is at least this far past the last anchor
   * (0: only the first state). The first commit is always an anchor. */
  uint64_t anchor_every;
  /* Retention (docs/protocols/sync.md): at least the newest keep_patches (>= 1)
   * patches stay, extended back to the newest anchor at or below the oldest
   * one's base (the floor) so that every retained step can be rebuilt; of
   * the anchors, the floor, the first one above it (the next floor) and the
   * newest keep_anchors - 2 (keep_anchors >= 2) stay. */
  uint64_t keep_patches;
  uint64_t keep_anchors;
  /* Signs every head; borrowed, must outlive the publisher. NULL writes
   * unsigned heads (clients then rely on digests alone). */
  const pulse_sign_key *key;
  /* The tensor table in the trainer's order (dtype is ignored: the published
   * state is BF16). Copied. Required for a new store; for an existing one it
   * may be NULL (taken from the store) or must equal the store's. */
  const pulse_tensor_info *tensors;
  size_t tensor_count;
  pulse_pos_model pos_model; /* default PULSE_POS_CLASS */
  uint32_t chunk_log2;       /* default PULSE_CHUNK_LOG2_DEFAULT */
  int threads;               /* detection, encoding, rebuild; 0 = per core */
  /* 0 (default): anchors are written by a background thread from the
   * snapshot while the next step trains, and named by the next head (or by
   * pulse_pub_flush); 1: within the commit that makes them due. */
  int anchor_sync;
  pulse_pub_head_fn on_head;
  void *on_head_ctx;
  /* The cudaStream_t device commits run on (NULL: see the top of this
   * file). */
  void *cuda_stream;
  /* Objects the head stops naming stay downloadable for at least this many
   * seconds (>= 0; default 600) before they are removed, so that a worker
   * that planned from an older head can still finish (docs/protocols/sync.md,
   * "Retention"). The time an object left the head is its file's
   * modification time, set when it leaves: it survives a restart of the
   * publisher. Removal happens in a later commit's background work (or when
   * the publisher is opened or freed); 0 removes at once. */
  double grace_seconds;
  /* The patch format version written (docs/formats/patch.md): 0 (the
   * default) PULSE_PATCH_VERSION, or 1..PULSE_PATCH_VERSION_MAX; host and
   * device commits write the same bytes in every version. */
  uint32_t format_version;
} pulse_pub_opts;

#define PULSE_PUB_OPTS_VERSION 2u
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_pub_opts_init(pulse_pub_opts *opts);

typedef struct pulse_pub pulse_pub;

/** Opens the store folder `dir` (created when missing) for publishing.
 * Takes the store's writer lock for the publisher's life (one writer per
 * store, docs/protocols/sync.md "Writing a store": a store another publisher holds,
 * in this process or any other, on this host or another one sharing the
 * folder, is refused with PULSE_ERR_IO naming the holder, before anything
 * is written), recovers it (pulse_store_recover) and, when it has a head,
 * rebuilds the snapshot at the head and checks it against the head's state
 * digest.
 * @return PULSE_OK and *out (free with pulse_pub_free); PULSE_ERR_ARG (bad
 * options; a new store without a table; opts.key is the key the store's
 * head rotated away from, checked before the lock); PULSE_ERR_IO (another
 * writer holds the store; the detail names it); PULSE_ERR_SIZE_MISMATCH (a
 * table that differs from the store's); any error of pulse_store_recover and
 * pulse_store_state_rebuild; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_create(const char *dir, const pulse_pub_opts *opts,
                              pulse_pub **out);

/** Waits for a background anchor, writes the head naming it (see
 * pulse_pub_figures.flush), and frees the publisher. NULL is fine. Errors
 * are logged; call pulse_pub_flush first to see them. */
void pulse_pub_free(pulse_pub *pub);

/** Publishes the state of `step` (above the head's; steps may skip). The
 * first commit of a new store writes an anchor only (from device tensors
 * too: they are copied to the host for it). `tensors` holds tensor_count
 * entries in table order, in host or device memory (PULSE_PUB_DEVICE: see
 * the top of this file). `figures` may be NULL.
 * @return PULSE_OK; PULSE_ERR_ARG (count, NULL data, misaligned data, an
 * unknown memory kind); PULSE_ERR_BASE_STEP (step not above the head);
 * PULSE_ERR_DTYPE; PULSE_ERR_NOT_BUILT (device tensors, pulse built without
 * CUDA); PULSE_ERR_CUDA (device tensors and no usable device, or a CUDA
 * error); PULSE_ERR_IO (a write failed: nothing changed; after a device
 * commit failed late the next commit takes the head's state from the host
 * copy or, when that is stale, from the store); PULSE_ERR_NOMEM. */
pulse_status pulse_pub_commit(pulse_pub *pub, uint64_t step,
                              const pulse_pub_tensor *tensors, size_t count,
                              pulse_pub_figures *figures);

/** Opens `dir` as pulse_pub_create does (writer lock, recovery), as the
 * **committer** of a sharded trainer (pulse_pub_shard.h): it holds no
 * snapshot and never rebuilds one; its steps are made by the ranks and
 * given to pulse_pub_commit_made (pulse_pub_commit refuses it). opts.tensors
 * is required (the whole table); the head's state digest, which every
 * patch must start from, checks that it is the store's.
 * @return as pulse_pub_create. */
pulse_status pulse_pub_create_committer(const char *dir, const pulse_pub_opts *opts,
                                        pulse_pub **out);

/** Commits a step that the ranks of a sharded trainer made: `patch` (from
 * the head's state to `state`, pulse_pub_shard_encode; NULL for a store's
 * first step) and `anchor_staged` (NULL, or a file in objects/ named
 * ".NAME.tmp-*" that the ranks wrote, pulse_pub_shard_anchor_write: hashed
 * and renamed here; required for the first step). Both are durable under
 * their names before the head that names them moves; on failure the head
 * stays (what was written is unnamed, removed by retention or recovery).
 * Retention, the grace period, signing and the head hook are as for
 * pulse_pub_commit. `figures` may be NULL.
 * @return PULSE_OK; PULSE_ERR_ARG (not a committer, a missing patch or
 * anchor); PULSE_ERR_BASE_STEP; PULSE_ERR_BASE_DIGEST (a patch not from
 * the head's state to `state`, or of another step); PULSE_ERR_IO; the
 * patch's parse errors; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_commit_made(pulse_pub *pub, uint64_t step, const pulse_buffer *patch,
                                   const char *anchor_staged, const pulse_state_digest *state,
                                   pulse_pub_figures *figures);

/** pulse_pub_commit_made for an anchor that is already in the bucket the
 * store folder is the staging copy of (the ranks uploaded it part by part,
 * pulse_pub_shard_anchor_read): it is named by its SHA-256 `anchor_sha256`
 * and size `anchor_size` (the caller completed the upload and checked the
 * size there; nothing here reads it) and is not in the local store. The
 * head names objects/<sha256>.safetensors with that size and step; later
 * commits, retention and removals (a named object absent here is skipped)
 * and pulse_pub_anchor_due go on as with a local anchor. `patch` as
 * pulse_pub_commit_made (NULL for the store's first step).
 * Such a store cannot be served (pulse_server) or resumed from
 * (pulse_pub_shard_resume, reopening: recovery refuses a head naming a
 * missing object) until its missing objects are fetched back from the
 * bucket (pulse_upload_fetch_missing).
 * @return as pulse_pub_commit_made; PULSE_ERR_ARG also for a NULL
 * anchor_sha256 or a size of 0. */
pulse_status pulse_pub_commit_made_uploaded(pulse_pub *pub, uint64_t step,
                                            const pulse_buffer *patch,
                                            const uint8_t anchor_sha256[32],
                                            uint64_t anchor_size,
                                            const pulse_state_digest *state,
                                            pulse_pub_figures *figures);

/** 1 when a commit of `step` must name an anchor (the first step, or
 * opts.anchor_every steps past the last anchor), else 0. */
int pulse_pub_anchor_due(const pulse_pub *pub, uint64_t step);

/** Waits for a background anchor and, when it succeeded, writes a head that
 * names it (same step). `figures` (may be NULL) says what was written;
 * without a pending anchor nothing happens.
 * @return PULSE_OK, or the anchor's or the head's write error (the head then
 * stays as it was). */
pulse_status pulse_pub_flush(pulse_pub *pub, pulse_pub_figures *figures);

/** Rotates the signing key (docs/protocols/sync.md, "Key rotation"): names a pending
 * background anchor (pulse_pub_flush), then writes a head at the same step
 * signed by `new_key` that carries a rotation record signed by the current
 * key (opts.key) naming new_key as its successor. Every later head is
 * signed by new_key and carries the record on, so a worker that trusts the
 * old key follows to the new one (without a restart), and from then on
 * refuses heads signed by the old key. `new_key` is borrowed and replaces
 * opts.key: it must outlive the publisher. Reopening the store with the
 * old key afterwards is refused (PULSE_ERR_ARG). The head hook runs as for
 * a flush (figures.flush = 1). `figures` may be NULL.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, an unsigned store, nothing
 * published yet, the same key); the errors of pulse_pub_flush and of a
 * head's write (the head and opts.key then stay as they were). */
pulse_status pulse_pub_rotate_key(pulse_pub *pub, const pulse_sign_key *new_key,
                                  pulse_pub_figures *figures);

/** Waits for the background work of the last commit: the host snapshot's
 * move to the step, the removal of objects its head stopped naming, and an
 * anchor being written (named by the next head, or at once by
 * pulse_pub_flush). A trainer never needs it: the next commit waits for
 * what it depends on. For tests and benchmarks that count files or time
 * other work alone. NULL is fine. */
void pulse_pub_wait(pulse_pub *pub);

/** 1 and the head step in *step when the store has a head, else 0. */
int pulse_pub_head_step(const pulse_pub *pub, uint64_t *step);

/** State digest of the head (NULL before the first commit). Borrowed until
 * the next commit. */
const pulse_state_digest *pulse_pub_state_digest(const pulse_pub *pub);

/** Number of tensors in the table. */
size_t pulse_pub_tensor_count(const pulse_pub *pub);

/** Table entry i (NULL when out of range), borrowed from the publisher. */
const pulse_tensor_info *pulse_pub_tensor_info(const pulse_pub *pub, size_t i);

/** The published BF16 bits of tensor i (NULL before the first commit or out
 * of range), borrowed: valid until the next commit. Waits for the snapshot's
 * background move; after device commits, downloads the device copy first
 * (NULL and pulse_error_detail() if that fails). */
const uint16_t *pulse_pub_snapshot(const pulse_pub *pub, size_t i);

/** The store folder (as given to create), borrowed. */
const char *pulse_pub_dir(const pulse_pub *pub);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_PUBLISHER_H */
