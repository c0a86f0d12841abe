/* pulse_pub_shard.h - the encoding half of a sharded publish: each rank of a
 * sharded trainer (FSDP/ZeRO-3 flat ranges, FSDP2/DTensor dim-0 blocks,
 * Megatron column/row blocks, pipeline stages' tensor sets, and mixes)
 * detects the changes of the blocks it owns against its own BF16 snapshot of
 * them, and the ranks together make the one patch that a single publisher
 * of the gathered weights would write, byte for byte, without any rank
 * holding a tensor or a snapshot of what it does not own.
 *
 * A step, on every rank, with any transport between them (a
 * torch.distributed group, files in the store):
 *
 *   1. pulse_pub_shard_detect(shard, data, &part)   this rank's part:
 *      its blocks' digests and the changes of the chunks its blocks do
 *      not cover entirely (those it shares with other ranks; for dim-0 or
 *      flat blocks that fill whole chunks, none)
 *   2. exchange: the encoding rank gets every part; every other rank
 *      gets, from each rank, that rank's part cut to what its counts read
 *      (pulse_pub_shard_part_for: the changes in the chunks its blocks
 *      meet)
 *   3. pulse_pub_shard_count(shard, parts, &counts)  this rank's counts:
 *      for each change of every part in a chunk its blocks meet, how many
 *      elements of this rank's blocks precede it in its chunk within its
 *      position class, and the class counts of those changed chunks
 *      (docs/formats/patch.md "Position classes": the class model ranks a
 *      change among the base elements of its class in the whole chunk,
 *      which a rank sees only in part); and the coded chunk streams of the
 *      changed chunks its blocks cover entirely, which it alone sees whole
 *   4. the encoding rank gathers every rank's counts and calls
 *      pulse_pub_shard_encode(parts, counts, &patch): the shared chunks
 *      are coded from the summed counts, the others are the ranks'
 *      streams, and the patch is the bytes of a single publish
 *   5. once the step is durable, every rank calls pulse_pub_shard_advance
 *      (its snapshot moves to the step); on failure pulse_pub_shard_abort
 *      (or the next detect) drops the step and it can be retried.
 *
 * Memory per rank: the BF16 snapshot of its blocks; during a step its own
 * changes (about 3 bytes each: a position gap, the old bits' class and
 * the delta, freed by advance and abort), its part (3-4 bytes per change of a shared
 * chunk: a position gap, the old bits' class and the delta), the parts
 * cut for it (2-3 bytes a change: no deltas), and its counts: an entry
 * for each change of the shared chunks its blocks meet (mostly one byte:
 * the growth of its contribution since the last change of that class)
 * and the streams of its own chunks (about the patch's bytes for those
 * chunks). Counting and coding walk the parts one changed chunk at a
 * time: beyond the parts and counts, they hold one chunk's changes, about
 * 15 bytes each. The encoding rank also holds every rank's part and
 * counts (the shared chunks' changes, every rank's streams) and the
 * patch, or with pulse_pub_shard_encode_file the received streams, then
 * the patch: for blocks that meet few chunks of other ranks (dim-0
 * blocks, flat ranges, tensor sets), about the patch's bytes; a rank of
 * column blocks shares every chunk, and the encoding rank then receives
 * every change (3-4 bytes) and every rank's entry for it. The per-tensor
 * digests of the patch are the sums of the blocks' digests
 * (docs/formats/patch.md "Digests" is additive).
 *
 * Parts and counts are opaque bytes to carry between ranks of one job, built
 * by one library version; they are checked (magic, version, table,
 * lengths, positions) but are not a stored format.
 *
 * Thread-safety: a shard is driven by one thread at a time; the free
 * functions are reentrant. Nothing here prints to stdout. */
#ifndef PULSE_PUB_SHARD_H
#define PULSE_PUB_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_publisher.h"
#include "pulse_status.h"
#include "pulse_upload.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How a block is described. */
typedef enum {
  /* A rectangular block: ndim (the tensor's) starts and extents; the block
   * is row-major in the rank's memory. Dim-0 blocks (FSDP2/DTensor),
   * column-parallel (dim 0) and row-parallel (dim 1) Megatron blocks, and a
   * whole tensor (start 0, extent = shape) are all of this kind. */
  PULSE_PUB_BLOCK_RECT = 0,
  /* An element range of the flattened tensor (FSDP1/ZeRO-3 flat
   * parameters): start[0] its first element, extent[0] its length. */
  PULSE_PUB_BLOCK_FLAT = 1
} pulse_pub_block_kind;

/* One block of one published tensor that a rank owns. */
typedef struct {
  const char *name; /* the tensor's name in the table; borrowed */
  pulse_pub_block_kind kind;
  uint64_t start[PULSE_MAX_DIMS];
  uint64_t extent[PULSE_MAX_DIMS];
} pulse_pub_block;

/** Checks that the blocks of every rank tile the table exactly: every
 * block names a tensor of the table and lies inside it, no two blocks
 * (of one rank or of two) share an element, and every element of every
 * tensor is in a block. `blocks[r]` holds `counts[r]` blocks of rank r.
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (a name not in the table);
 * PULSE_ERR_ARG (a block outside its tensor, two blocks overlapping, an
 * element no block holds, NULL): the detail names the tensor (and the
 * ranks); PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_blocks_check(const pulse_tensor_info *table, size_t tensor_count,
                                    const pulse_pub_block *const *blocks, const size_t *counts,
                                    size_t ranks);

/* Options of a rank's shard; start from pulse_pub_shard_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_PUB_SHARD_OPTS_VERSION */
  /* The whole table, in the trainer's order, the same on every rank (a
   * part of a rank with another table is refused). Copied. */
  const pulse_tensor_info *tensors;
  size_t tensor_count;
  /* This rank's blocks (the ranks' blocks together tile the table:
   * pulse_pub_blocks_check). Copied. */
  const pulse_pub_block *blocks;
  size_t block_count;
  uint32_t chunk_log2; /* default PULSE_CHUNK_LOG2_DEFAULT */
  /* How this rank codes the chunks its blocks cover entirely (see
   * pulse_pub_shard_count): the committer's position model (default
   * PULSE_POS_CLASS) and patch format version (0, the default:
   * PULSE_PATCH_VERSION; 1 or 2: version 3's value model counts the whole
   * patch's changes, which no rank holds, so create and encode refuse it
   * with PULSE_ERR_UNSUPPORTED); pulse_pub_shard_encode refuses counts coded
   * otherwise than its options say. */
  pulse_pos_model pos_model;
  uint32_t format_version;
} pulse_pub_shard_opts;

#define PULSE_PUB_SHARD_OPTS_VERSION 2u
/** Sets every field of *opts to its default (struct_version included). */
void pulse_pub_shard_opts_init(pulse_pub_shard_opts *opts);

typedef struct pulse_pub_shard pulse_pub_shard;

/** A rank's shard, without a snapshot yet.
 * @return PULSE_OK and *out (free with pulse_pub_shard_free); PULSE_ERR_ARG
 * (bad options or block); PULSE_ERR_VERSION; PULSE_ERR_UNSUPPORTED (format
 * version 3); PULSE_ERR_NOT_FOUND (a block's name not in the table);
 * PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_create(const pulse_pub_shard_opts *opts, pulse_pub_shard **out);

/** NULL is fine. */
void pulse_pub_shard_free(pulse_pub_shard *shard);

/** This rank's part of a step: `data` holds one host tensor per block
 * (block order; the block's elements row-major, FP32 or BF16; memory must be
 * PULSE_PUB_HOST). The first call takes the snapshot and its part has no
 * changes (the state a first step's anchor holds); later calls find the
 * BF16 values that differ from the snapshot and keep them pending (a
 * pending step of an earlier call is dropped). The snapshot does not move
 * until pulse_pub_shard_advance. `part` is filled (free with
 * pulse_buffer_free).
 * @return PULSE_OK; PULSE_ERR_ARG (count, NULL data, device memory);
 * PULSE_ERR_DTYPE; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_detect(pulse_pub_shard *shard, const pulse_pub_tensor *data,
                                    size_t count, pulse_buffer *part);

/** `part` (a part of this step, this rank's or any rank's of the same
 * table) cut to what a rank whose blocks are `blocks` (block_count of
 * them) reads in pulse_pub_shard_count: every block with its digests and
 * description, and only the changes in the chunks those blocks meet.
 * `out` is filled (free with pulse_buffer_free). Counts made from parts
 * cut for the counting rank are the counts made from the whole parts.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (a part that does not parse, or of
 * another table or chunk size); PULSE_ERR_NOT_FOUND (a block's name not in
 * the table); PULSE_ERR_ARG (a block outside its tensor, NULL);
 * PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_part_for(const pulse_pub_shard *shard, const pulse_buffer *part,
                                      const pulse_pub_block *blocks, size_t block_count,
                                      pulse_buffer *out);

/** This rank's counts for the step whose parts (every rank's, whole or cut
 * for this rank by pulse_pub_shard_part_for, in any order) are given: see
 * the top of this file. Changes are named by position. Counts from the
 * snapshot (the base); codes the pending changes of the chunks this rank's
 * blocks cover entirely with the options' position model and format
 * version. `counts` is filled (free with pulse_buffer_free).
 * @return PULSE_OK; PULSE_ERR_ARG (before the first detect); PULSE_ERR_CORRUPT
 * (a part that does not parse, or of another table or chunk size); the
 * errors of coding a chunk; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_count(const pulse_pub_shard *shard, const pulse_buffer *parts,
                                   size_t nparts, pulse_buffer *counts);

/** The patch of the step from every rank's whole part and counts (both in
 * any order): the bytes pulse_patch_encode writes for the gathered
 * weights with the same options. The chunks that parts carry changes of
 * are coded here from the summed counts; every other changed chunk is a
 * stream from one rank's counts, laid out in its place. Needs no shard:
 * any rank, or a process that is not one, can encode. `base_digest` (may
 * be NULL) receives the state digest of the base, which must be the store
 * head's.
 * @return PULSE_OK and *patch; PULSE_ERR_CORRUPT (parts or counts that
 * do not parse or do not fit together: another table, counts of another
 * step, naming an element no part changes, a chunk coded twice);
 * PULSE_ERR_ARG (blocks that overlap or leave elements out, bad options,
 * counts coded with another position model or format version than opts);
 * PULSE_ERR_UNSUPPORTED (format version 3); the errors of coding a chunk;
 * PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_encode(const pulse_tensor_info *table, size_t tensor_count,
                                    const pulse_encode_opts *opts, const pulse_buffer *parts,
                                    size_t nparts, const pulse_buffer *counts, size_t ncounts,
                                    pulse_state_digest *base_digest, pulse_buffer *patch);

/** pulse_pub_shard_encode into the file `path` (created or truncated,
 * synced; removed on failure) instead of memory: the patch's bytes go out
 * as they are laid out, so the encoding rank holds the streams it received
 * but never the patch beside them (map the file to commit it). *size gets
 * the patch's size.
 * @return as pulse_pub_shard_encode; PULSE_ERR_IO. */
pulse_status pulse_pub_shard_encode_file(const pulse_tensor_info *table, size_t tensor_count,
                                         const pulse_encode_opts *opts,
                                         const pulse_buffer *parts, size_t nparts,
                                         const pulse_buffer *counts, size_t ncounts,
                                         const char *path, uint64_t *size);

/** The state digest of a step from every rank's part (whole or cut): `target` 0 gives
 * the base's (the snapshots the parts were detected against), 1 the
 * step's. Any rank can compute it.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (parts that do not parse, of
 * another table); PULSE_ERR_ARG; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_state_digest(const pulse_tensor_info *table, size_t tensor_count,
                                          uint32_t chunk_log2, const pulse_buffer *parts,
                                          size_t nparts, int target, pulse_state_digest *out);

/** Writes this rank's blocks of an anchor (docs/protocols/sync.md: the whole BF16
 * state as safetensors, metadata step and state_digest) into `path`, a file
 * every rank of the step writes into on a shared folder: each rank writes
 * the same header and its own blocks' bytes (the snapshot, or the pending
 * step's values when `pending` is 1) at their places, sizes the file and
 * syncs it; the file is whole once every rank has returned PULSE_OK, and is
 * then byte for byte the anchor a single publisher writes of that state
 * (hash it, name it objects/<sha256>.safetensors). No rank holds more than
 * its blocks. `digest` is the state's (pulse_pub_shard_state_digest).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, no snapshot, nothing pending when
 * asked); PULSE_ERR_IO; the errors of the safetensors header. */
pulse_status pulse_pub_shard_anchor_write(const pulse_pub_shard *shard, const char *path,
                                          uint64_t step, const pulse_state_digest *digest,
                                          int pending);

/* ----------------------------------- an anchor uploaded part by part */

/* An anchor's file (the bytes pulse_pub_shard_anchor_write makes) cut
 * into parts of any sizes, in file order, for a multipart upload without
 * a shared filesystem and without a rank holding the whole file: every
 * rank knows the header (pulse_pub_shard_anchor_header, the same on every
 * rank) and every rank's blocks; the rank assembling a part copies the
 * header's bytes in it, gets from each rank that rank's bytes of it
 * (pulse_pub_shard_anchor_read, pulse_pub_anchor_owned bytes) and places
 * them (pulse_pub_anchor_place): the part is then exactly that range of
 * the file. Each costs about a copy of the part's bytes (runs of blocks,
 * not elements, are walked) beside O(tensors + blocks) of layout. */

/** The anchor's header (everything before the first tensor's data: the
 * safetensors length prefix and JSON, metadata step and state_digest, as
 * pulse_pub_shard_anchor_write writes it) into `header` (free with
 * pulse_buffer_free) and the whole file's size into *file_size. The same
 * on every rank of a table; needs no snapshot.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL); PULSE_ERR_OVERFLOW; the errors
 * of the safetensors header; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_anchor_header(const pulse_pub_shard *shard,
                                           uint64_t step,
                                           const pulse_state_digest *digest,
                                           pulse_buffer *header,
                                           uint64_t *file_size);

/** The bytes of this rank's blocks (the snapshot, or the pending step's
 * values when `pending` is 1, as pulse_pub_shard_anchor_write) that lie
 * in the anchor file's range [off, off + len), concatenated in file order
 * (the header, header_size bytes, is no rank's), into `out` (free with
 * pulse_buffer_free; its size is pulse_pub_anchor_owned of this rank's
 * blocks). Holds O(len) beyond the shard. With `pending`, a block's
 * pending changes are found from a mark kept every 4096 changes (about
 * 4096 changes decoded to reach the range, then the range's own).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, no snapshot, nothing pending when
 * asked, a range past the file's end); PULSE_ERR_OVERFLOW;
 * PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_anchor_read(const pulse_pub_shard *shard,
                                         int pending, uint64_t header_size,
                                         uint64_t off, uint64_t len,
                                         pulse_buffer *out);

/** How many bytes of the anchor file's range [off, off + len) the blocks
 * (any rank's: nblocks of them, of the table of `count` tensors) own: the
 * size of that rank's pulse_pub_shard_anchor_read of the range. The
 * blocks are checked one by one (names, bounds), not for tiling
 * (pulse_pub_blocks_check).
 * @return PULSE_OK and *bytes; PULSE_ERR_ARG (NULL, a block outside its
 * tensor, a range past the file's end); PULSE_ERR_NOT_FOUND (a block's
 * name not in the table); PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_anchor_owned(const pulse_tensor_info *table,
                                    size_t count, const pulse_pub_block *blocks,
                                    size_t nblocks, uint64_t header_size,
                                    uint64_t off, uint64_t len,
                                    uint64_t *bytes);

/** Writes a rank's pulse_pub_shard_anchor_read bytes of the range [off,
 * off + len) (`bytes`, nbytes of them; `blocks` that rank's) at their
 * places in `dst` (len bytes: dst[0] is file offset off); the other bytes
 * of dst are left as they are. With the header's bytes (copied by the
 * caller where the range meets it) and every rank's bytes placed, dst is
 * exactly that range of the file pulse_pub_shard_anchor_write makes.
 * Nothing is written on failure.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, nbytes not the blocks' bytes in
 * the range, as pulse_pub_anchor_owned); the errors of
 * pulse_pub_anchor_owned. */
pulse_status pulse_pub_anchor_place(const pulse_tensor_info *table,
                                    size_t count, const pulse_pub_block *blocks,
                                    size_t nblocks, uint64_t header_size,
                                    uint64_t off, uint64_t len,
                                    const uint8_t *bytes, size_t nbytes,
                                    uint8_t *dst);

/** Takes the snapshot of this rank's blocks at the head of the store `dir`
 * (a restarted job resumes from the store as a single publisher does), so
 * that the next step is a patch from the head. Holds the rank's blocks,
 * one tensor at a time (the newest anchor's bits of a tensor the rank has
 * blocks in, brought through every patch after it, then freed; the
 * anchor's other tensors are read for their digests only, page by page
 * released), the patches after the anchor (mapped) and a digest per tensor
 * and patch: not the whole state. Every check of
 * pulse_store_state_rebuild is made (sizes and SHA-256 against the head,
 * the anchor's state digest, each patch's steps, table and digests, the
 * head's state digest) and a bad store gets the error it gives; only the
 * sections of tensors the rank holds are decoded (the others' bytes are
 * covered by their object's SHA-256).
 * @return PULSE_OK; PULSE_ERR_NOT_FOUND (no head: the first step is then
 * an anchor); PULSE_ERR_SIZE_MISMATCH (the store holds another table); the
 * errors of pulse_store_state_rebuild; PULSE_ERR_NOMEM. */
pulse_status pulse_pub_shard_resume(pulse_pub_shard *shard, const char *dir);

/** Moves the snapshot (and the blocks' digests) to the pending step. */
void pulse_pub_shard_advance(pulse_pub_shard *shard);

/** Drops the pending step: the snapshot stays at the last advanced one. */
void pulse_pub_shard_abort(pulse_pub_shard *shard);

/** The BF16 snapshot of block i (block order), borrowed until the next
 * advance; NULL before the first detect or out of range. */
const uint16_t *pulse_pub_shard_snapshot(const pulse_pub_shard *shard, size_t i);

/* ------------------------------------------- a step through the store */

/* Options of pulse_pub_shard_step; start from pulse_pub_shard_step_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_PUB_SHARD_STEP_OPTS_VERSION */
  int rank, world;         /* this rank of world ranks (0 <= rank < world) */
  /* Rank 0: the store's committer (pulse_pub_create_committer, the same
   * chunk_log2 as the shards'); NULL on every other rank. */
  pulse_pub *committer;
  int timeout_ms; /* waiting for the other ranks; default 60000 */
  /* ---- version 2 (a version 1 struct is still read: without a bucket) */
  /* This rank's own handle on the store's bucket (every rank passes one,
   * or none does; borrowed for the call): the step's files go through the
   * bucket instead of a shared folder (see pulse_pub_shard_step). NULL:
   * the folder. */
  pulse_upload *bucket;
  /* With a bucket: the size of the parts an anchor is uploaded in (the
   * last may be shorter; raised so that no anchor has over 10,000 parts);
   * default PULSE_PUB_SHARD_PART_BYTES_DEFAULT. S3 refuses parts other
   * than the last under 5 MiB; some services (and tests) take smaller. */
  uint64_t part_bytes;
} pulse_pub_shard_step_opts;

#define PULSE_PUB_SHARD_STEP_OPTS_VERSION 2u
#define PULSE_PUB_SHARD_PART_BYTES_DEFAULT (16u << 20)
/** Sets every field of *opts to its default (struct_version included). */
void pulse_pub_shard_step_opts_init(pulse_pub_shard_step_opts *opts);

/** One collective step of a sharded trainer through the store folder `dir`
 * (shared by every rank: a shared filesystem), for a trainer without any
 * other channel between its ranks (docs/protocols/sync.md, "Sharded trainers").
 * Every rank calls it with the same step and its blocks' tensors (as
 * pulse_pub_shard_detect). Rank 0 opens the step (shard/<step>.go: a nonce,
 * the head's step, whether an anchor is due); each rank writes its part,
 * reads every part, writes its blocks of the anchor when one is due and its
 * counts; rank 0 encodes the patch and commits it with its committer: the
 * head moves once, after every rank's part of the step is durable. Every
 * rank's snapshot moves to the step once it sees the head of the step;
 * on any failure (a rank that errs, crashes or is late past timeout_ms) no
 * head names the step, every snapshot stays at the head and the step can
 * be called again. A rank that fails inside the call stops the others at
 * once, with its reason (shard/S.N.fail-R; rank 0 removes its go); one that
 * dies or never calls costs them timeout_ms. Every rank checks every rank's
 * blocks (pulse_pub_blocks_check, from the parts) before anything is
 * written: ranks that do not tile the table fail the step, naming the
 * tensor. `figures` (may be NULL) is the committer's on rank 0;
 * on the others its step and state digest.
 *
 * With opts.bucket (every rank its own handle on the store's bucket, for
 * ranks that share no folder) the same files are objects under the
 * bucket prefix's shard/ (each stored with its SHA-256, read only whole),
 * polled with a backoff from 5 to 200 ms; `dir` is then this rank's own
 * folder: rank 0's store (its staging copy), which it commits into and
 * uploads with pulse_upload_store, head last; the others follow the
 * bucket's head.json and write nothing into `dir`. No rank writes an
 * anchor file: each anchor is cut in file order into parts of
 * opts.part_bytes, each assembled by the rank owning most of its bytes
 * (rank 0 holds the header, ties to the lowest rank) from what the others
 * own of it (their files "S.N.bytes-K-R"), hashed as a SHA-256 chain in
 * file order (the state after part K in "S.N.sha-K-R"), then put by its
 * rank into one multipart upload rank 0 begins at
 * objects/<sha256>.safetensors ("S.N.upload-0"); rank 0 completes it once
 * every rank's ETags are in ("S.N.etags-R"), checks its size and commits
 * it with pulse_pub_commit_made_uploaded, so rank 0's folder never holds
 * it. A failed part fails the step on every rank with its reason; rank 0
 * aborts the upload and the bucket keeps its head. The step's shard/
 * objects are deleted once it is committed (and, but for the ranks'
 * reasons, when it is given up; the next attempt removes those). A
 * restarted job: rank 0 runs pulse_upload_fetch_missing on its folder
 * before it creates its committer and resumes from it; another rank
 * resumes from a transient copy of the bucket's store
 * (pulse_upload_fetch_store into a scratch folder, pulse_pub_shard_resume,
 * then remove the folder). If rank 0's commit succeeds and its upload
 * fails, the step fails on every rank with rank 0's reason ("step S is
 * committed in rank 0's store but its upload to the bucket failed ...");
 * rank 0's snapshot moves to S, the others' stay. Before the next step
 * opens, rank 0 uploads what the bucket lacks (a failure then fails that
 * call, with its reason on every rank that read its go, a rank that had
 * not joins the next attempt; nothing else changes), and a rank whose
 * snapshot is below the bucket's head takes it again from a copy of the
 * bucket's store (a warning says so). Publishing S again then returns S on
 * every rank without detecting (the bucket's head, uploaded by rank 0's
 * call); publishing S+1 goes on from S. A restarted job's first call of
 * the bucket's head step + 1 (rank 0's store may hold it) does the same,
 * whether a rank resumed before rank 0 uploaded it or after. A rank other
 * than 0 cannot tell such a retry of the bucket's head step from a
 * repeat: it waits for rank 0's go, and a repeat (refused at once on rank
 * 0) fails it at timeout_ms, naming the step to publish.
 * @return PULSE_OK; PULSE_ERR_BASE_STEP (step not above the head, but
 * for the retry above);
 * PULSE_ERR_IO (a rank did not answer within timeout_ms, or a write or a
 * request failed); PULSE_ERR_ARG; PULSE_ERR_VERSION (options of another
 * version than 1 or 2); the errors of detect, count, encode,
 * pulse_pub_commit_made(_uploaded) and pulse_upload_store. */
pulse_status pulse_pub_shard_step(pulse_pub_shard *shard, const char *dir,
                                  const pulse_pub_shard_step_opts *opts, uint64_t step,
                                  const pulse_pub_tensor *data, size_t count,
                                  pulse_pub_figures *figures);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_PUB_SHARD_H */
