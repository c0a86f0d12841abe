/* shard_impl.h - private to the sharded publish (pulse_pub_shard.h): a
 * block's geometry as runs of consecutive positions of its tensor, and the
 * byte layout of parts and counts. */
#ifndef PULSE_SHARD_IMPL_H
#define PULSE_SHARD_IMPL_H

#include "bytebuf_impl.h"
#include "pulse_pub_shard.h"

/* A block as `runs` runs of `run_len` consecutive tensor positions, in
 * increasing position order; the block's element i is run i / run_len. */
typedef struct {
  size_t tensor;
  uint64_t elems, runs, run_len;
  uint32_t lead; /* dimensions of the run grid */
  uint64_t lead_ext[PULSE_MAX_DIMS], lead_start[PULSE_MAX_DIMS];
  uint64_t stride[PULSE_MAX_DIMS]; /* the tensor's, per grid dimension */
  uint64_t base;                   /* position offset of the last dimension */
} shard_geom;

/** The geometry of block b of tensor `info` (index `tensor`).
 * @return PULSE_OK; PULSE_ERR_ARG (outside the tensor, unknown kind);
 * PULSE_ERR_OVERFLOW. */
pulse_status shard_geom_make(const pulse_tensor_info *info, size_t tensor,
                             const pulse_pub_block *b, shard_geom *g);

/** The tensor position of run r's first element. */
uint64_t shard_run_pos(const shard_geom *g, uint64_t r);

/** The digest of block g's bits (its runs at their tensor positions). */
pulse_tensor_digest shard_block_digest(const shard_geom *g,
                                       const uint16_t *bits);

/** Index of `name` in the table, or (size_t)-1. */
size_t shard_find(const pulse_tensor_info *table, size_t count, const char *name);

/** pulse_pub_blocks_check of the blocks the parts describe (every rank's,
 * the table's names). */
pulse_status shard_parts_check(const pulse_tensor_info *table, size_t count,
                               const pulse_buffer *parts, size_t nparts);

/** The blocks each part describes (names point into the table):
 * (*blocks)[i] holds (*counts)[i] blocks of part i. Free with
 * shard_parts_blocks_free. @return PULSE_OK; a part's parse errors;
 * PULSE_ERR_NOMEM. */
pulse_status shard_parts_blocks(const pulse_tensor_info *table, size_t count,
                                const pulse_buffer *parts, size_t nparts,
                                pulse_pub_block ***blocks, size_t **counts);

/** Frees shard_parts_blocks' arrays (NULL is fine). */
void shard_parts_blocks_free(pulse_pub_block **blocks, size_t *counts,
                             size_t nparts);

/** The table's fingerprint: its state digest with every tensor digest 0. */
pulse_status shard_table_id(const pulse_tensor_info *table, size_t count,
                            uint8_t out[32]);

/** A bitmap (bit k: chunk k) of the chunks of tensor t (numel elements) that
 * the blocks g (ng of them; other tensors' are skipped) meet; NULL when out
 * of memory. Free with free(). */
uint8_t *shard_chunk_marks(const shard_geom *g, size_t ng, size_t t, uint64_t numel,
                           uint32_t log2);

/* One block of a part, read in place. */
typedef struct {
  uint64_t tensor, elems, k;
  pulse_tensor_digest base, target;
  const uint8_t *header; /* its SHARD_BLOCK_HEADER bytes */
  const uint8_t *ch;     /* its k changes' bytes (see the part's layout) */
  size_t ch_size;
  int deltas; /* the changes carry their deltas (a whole part) */
} shard_part_block;

typedef struct {
  shard_part_block *blocks;
  size_t nblocks;
  uint64_t changes;         /* over every part */
  pulse_tensor_digest step; /* the sums of every block's target digest */
} shard_parts_view;

/* One change of a chunk: its tensor position, the class of its old bits
 * and its delta (pulse_elem.h); what counting and coding read. */
typedef struct {
  uint64_t *pos;
  uint8_t *cls;
  uint16_t *delta;
  uint64_t count, cap;
} shard_chunk;

#define SHARD_CHUNK_INIT {NULL, NULL, NULL, 0, 0}
pulse_status shard_chunk_push(shard_chunk *c, uint64_t pos, uint8_t cls, uint16_t delta);
void shard_chunk_free(shard_chunk *c);

/* Reads a part block's changes in order (the view checked them). */
typedef struct {
  const shard_part_block *b;
  pulse_reader r;
  uint64_t j; /* the change loaded below; b->k when none is left */
  uint64_t pos;
  uint8_t cls;
  uint16_t delta;
} shard_part_cursor;

void shard_cursor_open(shard_part_cursor *c, const shard_part_block *b);
void shard_cursor_next(shard_part_cursor *c);

/* A block's pending changes as a rank holds them during a step: per
 * change, in block element order, the LEB128 gap of its element index in
 * the block (the first's index, then index - previous - 1), the class of
 * its old bits (a byte) and its delta (shard_zigzag, LEB128): about 3
 * bytes instead of pulse_changes' 12, and what parts and streams carry,
 * so that they are made without reading the snapshot at each change (a
 * cache miss each); the new bits are the snapshot's plus the delta. */
typedef struct {
  pulse_bytebuf bytes;
  uint64_t count;
  /* Every SHARD_PENDING_MARK changes, where the next change's bytes start
   * and the index of the change before it: a reader of a range of the
   * block (pulse_pub_shard_anchor_read) starts near it instead of
   * decoding every change before it (shard_own_seek). */
  size_t *mark_at;
  uint64_t *mark_idx;
  size_t nmarks, mark_cap;
} shard_pending;

#define SHARD_PENDING_MARK 4096u

/** Appends a mark (at the current end of pd's bytes, after change
 * `prev_idx`). @return 0, or -1 out of memory. */
int shard_pending_mark(shard_pending *pd, uint64_t prev_idx);

/** Frees pd's changes and marks; pd is then empty. */
void shard_pending_clear(shard_pending *pd);

/* Reads a block's pending changes in order, with their tensor positions. */
typedef struct {
  const shard_geom *g;
  const uint8_t *p, *end;
  int has; /* a change is loaded below */
  uint64_t idx, pos;
  uint8_t cls;
  uint16_t delta;
} shard_own_cursor;

void shard_own_open(shard_own_cursor *c, const shard_geom *g, const shard_pending *pd);
void shard_own_next(shard_own_cursor *c);

/** Moves c (over pd, as opened) forward to the first change of index
 * >= idx, through pd's marks: about SHARD_PENDING_MARK changes decoded,
 * not every one before idx. A cursor already there stays. */
void shard_own_seek(shard_own_cursor *c, const shard_pending *pd, uint64_t idx);

/** Walks block g's elements in the changed chunks (chunks, m of them,
 * sorted) in position order beside the sorted changes c (their positions
 * and classes are read): each change gets the count of the block's
 * elements of its class before it in its chunk (added to contrib), and
 * each changed chunk the block's class counts (added to hist,
 * m * PULSE_CLASS_COUNT). */
void shard_count_block(const shard_geom *g, const uint16_t *snap, const shard_chunk *c,
                       const uint64_t *chunks, uint64_t m, uint32_t log2, uint32_t *contrib,
                       uint32_t *hist);

/** 1 when position `pos` of tensor t is in a chunk that the shard's own
 * blocks cover entirely (the shard codes that chunk alone). */
int shard_chunk_whole(const pulse_pub_shard *s, size_t t, uint64_t pos);

/** Appends the stream of one chunk of n elements starting at tensor
 * position `first`: its changes are c's (position order), with their class
 * ranks (rank, one a change) and the chunk's class counts (hist) for
 * PULSE_POS_CLASS (both unread for PULSE_POS_PLAIN).
 * @return PULSE_OK; PULSE_ERR_CORRUPT (ranks and counts that are no rank
 * form: counts that did not add up); the coder's errors. */
pulse_status shard_code_chunk(unsigned version, pulse_pos_model model, const uint32_t *hist,
                              uint32_t n, uint64_t first, const shard_chunk *c,
                              const uint32_t *rank, pulse_bytebuf *out);

/** The chunk streams of every changed chunk that the shard's blocks cover
 * entirely (the pending step's changes), appended to out as coded items
 * (see the counts' layout below); *items gets how many. */
pulse_status shard_code_whole(const pulse_pub_shard *s, pulse_bytebuf *out, uint64_t *items);

/* A chunk stream one rank coded, read in place from its counts. */
typedef struct {
  uint64_t tensor, chunk, changes;
  const uint8_t *bytes;
  size_t size;
} shard_coded;

/** The patch (docs/formats/patch.md) from every changed chunk's stream:
 * items sorted by tensor then chunk, each chunk once; base and target the
 * tensors' digests (count of each). `table` is the whole table. Into
 * *patch, or with `path` into that file (created or truncated, synced;
 * removed on failure): patch->data is then NULL and patch->size its size.
 * @return PULSE_OK and *patch; PULSE_ERR_IO; PULSE_ERR_NOMEM. */
pulse_status shard_patch_write(const pulse_encode_opts *opts, unsigned version,
                               const pulse_tensor_info *table, size_t count,
                               const pulse_tensor_digest *base, const pulse_tensor_digest *target,
                               const shard_coded *items, size_t nitems, const char *path,
                               pulse_buffer *patch);

/** Reads parts in place (checked: magic, version, table, chunk size,
 * lengths, every change's position inside its tensor and in increasing
 * order, deltas not 0). `table` is the whole table.
 * @return PULSE_OK; PULSE_ERR_CORRUPT; PULSE_ERR_NOMEM. */
pulse_status shard_view_parts(const pulse_buffer *parts, size_t nparts,
                              const pulse_tensor_info *table, size_t tensor_count,
                              const uint8_t table_id[32], uint32_t chunk_log2,
                              shard_parts_view *v);
void shard_view_free(shard_parts_view *v);

#define SHARD_PART_MAGIC "PULSESHP"
#define SHARD_COUNT_MAGIC "PULSESHC"
#define SHARD_WIRE_VERSION 4u
/* Part: magic, u32 version, u32 chunk_log2, 32-byte table id, u64 blocks,
 * u32 flags (SHARD_PART_DELTAS), u32 0; per block: u64 tensor, u64
 * elements, u64 base digest a, b, u64 target digest a, b, u64 changes k,
 * u64 kind, 8 u64 starts, 8 u64 extents (the block as its rank described
 * it), u64 change bytes; then per change, in position order, the LEB128
 * gap of its tensor position (the first's position, then position -
 * previous - 1), a byte: the class of its old bits, and in a part with
 * SHARD_PART_DELTAS its delta (pulse_bf16_delta, never 0) as a signed
 * 16-bit step, zigzag LEB128 (shard_zigzag: mostly one byte, Adam moves
 * a weight by a few ulps): about 3-4 bytes a change, not 12. A part
 * holds only the changes of chunks that its rank's blocks do not cover
 * entirely (the rank codes those chunks itself, into its counts); a part
 * cut for another rank (pulse_pub_shard_part_for) has every block, with
 * only the changes in the chunks that rank's blocks meet and no deltas
 * (counting reads positions and classes; only the encoding rank, which
 * gets whole parts, reads deltas). */
#define SHARD_PART_HEADER 64u

/* A delta (new - old bits, modulo 2^16) as a signed step, zigzagged:
 * -1 -> 1, 1 -> 2, -2 -> 3 ... (0 stays 0: no change has it). */
static inline uint64_t shard_zigzag(uint16_t delta) {
  int32_t d = (int16_t)delta;
  return d < 0 ? 2 * (uint64_t)(-(int64_t)d) - 1 : 2 * (uint64_t)d;
}

/* The inverse of shard_zigzag for z <= 0xFFFF (checked by the reader). */
static inline uint16_t shard_unzigzag(uint64_t z) {
  int32_t d = (z & 1) ? -(int32_t)((z + 1) / 2) : (int32_t)(z / 2);
  return (uint16_t)d;
}
#define SHARD_BLOCK_HEADER 200u
#define SHARD_PART_DELTAS 1u
/* Counts (sparse: only what the rank's own chunks can hold): magic, u32
 * version, u32 chunk_log2, 32-byte table id, u64 step a, b (the sums of
 * every part block's target digest: the step the counts are of, the same
 * from cut parts), u64 sections, u32 position model, u32 patch format
 * version (the coded chunks'); per tensor the rank owns elements of:
 * u64 tensor, u64 chunks nh, u64 entry bytes eb, u64 class count bytes hb;
 * eb bytes of entries, hb bytes of class counts. The chunks are the
 * changed chunks (those the parts carry changes of) that the rank's blocks
 * meet, in chunk order; the class counts are, per chunk, the LEB128 gap of
 * its index (the first's index, then index - previous - 1) and 256 LEB128
 * counts; the entries are, per chunk, one LEB128 per change of the parts
 * in that chunk, in position order: the rank's contribution to that
 * change's class rank less its contribution to the previous change of the
 * same class in the chunk (contributions never decrease along a class, and
 * start from 0 in each chunk). Changes are named by their place in the
 * chunk, not by position, so that a rank can count from parts cut for it
 * (which keep every change of the chunks it meets) and an entry is mostly
 * one byte. Then the coded chunks: u64 items; per item u64 tensor, u64
 * chunk, u64 changes, u64 bytes and the chunk stream's bytes (every
 * changed chunk the rank's blocks cover entirely, coded by the rank: the
 * encoding rank receives streams, not changes). */
#define SHARD_COUNT_SECTION 32u
#define SHARD_COUNT_HEADER 80u
#define SHARD_CODED_HEADER 32u

struct pulse_pub_shard {
  size_t count;
  pulse_tensor_info *info; /* names owned */
  uint8_t table_id[32];
  uint32_t chunk_log2;
  pulse_pos_model pos_model;
  uint32_t format_version; /* the patch's: 1 or 2 */
  /* Per tensor, a bitmap of the chunks this rank's blocks cover entirely
   * (NULL where it has no blocks): their streams are coded here. */
  uint8_t **whole;
  size_t nblocks;
  shard_geom *geom;
  pulse_pub_block *blocks; /* as given; names point into info */
  uint16_t **snap; /* per block, NULL before the first detect */
  pulse_tensor_digest *digest;
  int have_snapshot;
  int pending;
  shard_pending *changes; /* per block: the pending step's */
  pulse_tensor_digest *target;
  /* The last failed attempt (pulse_pub_shard_step): its go is stale. */
  uint64_t failed_step, failed_nonce;
  /* The step the snapshot is of (resume, or the last step taken): a rank
   * of the bucket exchange below the bucket's head takes it again. */
  uint64_t snap_step;
};

#endif
