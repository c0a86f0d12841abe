/* shard_anchor_impl.h - private to the sharded publish: the byte layout
 * of an anchor (docs/protocols/sync.md: the safetensors header, then every
 * tensor's BF16 elements in table order) and a walk over the bytes that a
 * set of blocks owns in a range of it. One walk serves every rank writing
 * its blocks into a shared file (pulse_pub_shard_anchor_write) and every
 * rank reading, counting or placing its bytes of one part of the file
 * (pulse_pub_shard_anchor_read, pulse_pub_anchor_owned,
 * pulse_pub_anchor_place), so that the parts are the file's bytes. */
#ifndef PULSE_SHARD_ANCHOR_IMPL_H
#define PULSE_SHARD_ANCHOR_IMPL_H

#include "bytebuf_impl.h"
#include "shard_impl.h"

/** The anchor's header (safetensors length prefix and JSON, metadata step
 * and state_digest, as a single publisher writes it) into *head, and the
 * size of the data after it (every tensor's BF16 elements).
 * @return PULSE_OK; the errors of the safetensors header; PULSE_ERR_NOMEM. */
pulse_status shard_anchor_header_build(const pulse_tensor_info *table,
                                       size_t count, uint64_t step,
                                       const pulse_state_digest *digest,
                                       pulse_bytebuf *head,
                                       uint64_t *data_size);

/* Blocks laid out in an anchor's data: per tensor, where its elements
 * start, and the blocks of that tensor. */
typedef struct {
  size_t count;
  uint64_t *tensor_at; /* count + 1: byte offset of each tensor's data in
                          the data; [count] the data's size */
  const shard_geom *geom;
  size_t ngeom;
  size_t *by_tensor; /* geom indices, grouped by tensor (block order kept) */
  size_t *first; /* count + 1: tensor t's are by_tensor[first[t]..first[t+1]) */
  uint64_t *next_run, *next_pos; /* a walk's cursors, one per geom */
} shard_anchor_layout;

/** The layout of the blocks `geom` (ngeom, any rank's) in the anchor of
 * `table`. Borrows geom until shard_anchor_layout_free.
 * @return PULSE_OK; PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status shard_anchor_layout_make(const pulse_tensor_info *table,
                                      size_t count, const shard_geom *geom,
                                      size_t ngeom, shard_anchor_layout *out);
void shard_anchor_layout_free(shard_anchor_layout *l);

/* A piece of one block's bytes in the file: `size` bytes from byte `byte`
 * of the block's row-major BF16 elements, at file offset `file_at`. */
typedef struct {
  size_t block; /* index into the layout's geom */
  uint64_t byte, size, file_at;
} shard_anchor_piece;

typedef pulse_status (*shard_anchor_visit)(void *ctx,
                                           const shard_anchor_piece *piece);

/** Checks [off, off + len) against a file of header_size header bytes and
 * the layout's data.
 * @return PULSE_OK; PULSE_ERR_ARG (past the file's end, naming both). */
pulse_status shard_anchor_range_check(const shard_anchor_layout *l,
                                      uint64_t header_size, uint64_t off,
                                      uint64_t len);

/** Calls visit for every piece of the blocks' bytes in the file range
 * [off, off + len) (checked by shard_anchor_range_check), in file order;
 * each block's pieces come in increasing byte order. Walks runs (a binary
 * search finds a block's first run in the range), never elements. Stops
 * at the first status that is not PULSE_OK and returns it. */
pulse_status shard_anchor_walk(shard_anchor_layout *l, uint64_t header_size,
                               uint64_t off, uint64_t len,
                               shard_anchor_visit visit, void *ctx);

#endif
