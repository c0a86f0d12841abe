/* pulse_region.h - applying a patch into parts of tensors: a
 * tensor-parallel rank holds rows [r0, r1) or columns [c0, c1) of a
 * published tensor, often inside a larger buffer of its own (a fused
 * projection: q, k and v rows one after the other), and brings exactly that
 * part to the patch's target, with no copy of the rest of the tensor.
 *
 * A region names a tensor of the patch table and a block of it in 2-D
 * terms: the tensor seen as shape[0] rows of numel / shape[0] columns (a 1-D
 * tensor is one column; a 0-D one, one row). The block's element (r, c)
 * lives at data[r * stride + c] in the caller's memory.
 *
 * Class-model patches (the codec's default) code a change by its rank
 * among the elements of its exponent class in the whole chunk
 * (docs/formats/patch.md), so decoding a chunk needs the base bits of every element of
 * it, also those outside the block. A region may therefore keep a *halo*:
 * the bits of the tensor outside the block inside its *span*, the block's
 * positions [row0 * C + col0, last + 1) widened to multiples of
 * 2^halo_log2 and cut at the tensor's end (pulse_region_span). Every patch
 * moves the halo with the changes that fall in it, class or plain, so it
 * stays the tensor's bits. A rank of a column-parallel weight (a row
 * block) keeps at most two partial spans' worth of bits, none when its
 * rows start and end on multiples of 2^halo_log2 elements; a rank of a
 * row-parallel weight (a column block) keeps the other columns of the rows
 * its span meets: for tensors of up to 2^halo_log2 elements, and in
 * general, the rest of the tensor. Without a halo (halo_log2 = 0) only
 * plain-position patches, or class-model patches into a block whose
 * positions are contiguous, can be decoded; the others are refused.
 *
 * Verification: a region's digest is the additive tensor digest (docs/formats/patch.md)
 * of the block alone, each element counted at its position in the whole
 * tensor (pulse_region_digest), so the blocks of every rank add up to
 * the tensor's digest; halo_digest is the same for the halo. Both are kept
 * current in O(changes), from the bits each change replaces, never by
 * reading the block again. When block and halo together are the whole
 * tensor (a whole region; a column block or a small tensor with its halo),
 * the stage checks their sum against the patch's base digest and the staged
 * result against its target digest: the trainer's whole-tensor digests
 * verify the rank's block. Otherwise (a row block of a tensor larger than
 * its span) the block's digest is derived: from a verified anchor (whose
 * state digest the signed head vouches for), moved by each applied patch's
 * changes (whose bytes the signed head vouches for: the subscriber checks
 * every object against its signed SHA-256 before it gets here). The
 * caller must not write the block between calls: a write the next patch
 * does not touch goes unseen, as for whole-tensor targets.
 *
 * Thread-safety: reentrant; a staged transaction belongs to one thread.
 * Nothing here prints to stdout. */
#ifndef PULSE_REGION_H
#define PULSE_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h"
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One block of one tensor of the patch table, held by the caller. */
typedef struct {
  const char *name;    /* the tensor's name in the patch table */
  uint64_t row0, rows; /* rows [row0, row0 + rows) of the 2-D view */
  uint64_t col0, cols; /* columns [col0, col0 + cols) */
  uint16_t *data;      /* element (r, c) of the block at data[r * stride + c] */
  uint64_t stride;     /* >= cols */
  /* The block's digest (pulse_region_digest) of what data holds: checked
   * against the patch by stage when block and halo are the whole tensor,
   * moved to the new contents by commit. */
  pulse_tensor_digest digest;
  /* The halo: 0, none; else 10..30, its span's alignment (class-model
   * patches with chunks of up to 2^halo_log2 elements decode). */
  uint32_t halo_log2;
  /* The tensor's bits outside the block inside its span, in position order
   * (pulse_region_span's halo count of them; pulse_region_halo_take fills
   * it): moved by commit as the block is. NULL when the count is 0. */
  uint16_t *halo;
  pulse_tensor_digest halo_digest; /* of what halo holds, kept as digest */
} pulse_region;

/** The 2-D view of a shape: rows = shape[0] (1 for ndim 0), cols = the
 * product of the other dimensions (0 when rows is 0).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, ndim above PULSE_MAX_DIMS);
 * PULSE_ERR_OVERFLOW. */
pulse_status pulse_region_view(const uint64_t *shape, uint32_t ndim,
                               uint64_t *rows, uint64_t *cols);

/** The digest of region r's block as data holds it, for a tensor of
 * full_cols columns (its 2-D view): pulse_digest_bf16_block with the block's
 * first position row0 * full_cols + col0.
 * @return PULSE_OK and *out; PULSE_ERR_ARG; PULSE_ERR_OVERFLOW. */
pulse_status pulse_region_digest(const pulse_region *r, uint64_t full_cols,
                                 pulse_tensor_digest *out);

/** The span of region r in a tensor of numel elements and full_cols
 * columns, for alignment 2^log2 (10..30): positions [*lo, *hi), of which
 * *halo are outside the block (0, 0, 0 for an empty block).
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, log2 out of range, a block outside
 * the tensor); PULSE_ERR_OVERFLOW. */
pulse_status pulse_region_span(const pulse_region *r, uint64_t numel, uint64_t full_cols,
                               uint32_t log2, uint64_t *lo, uint64_t *hi, uint64_t *halo);

/** Fills r->halo (room for pulse_region_span's count at r->halo_log2) from
 * `tensor`, the whole tensor's bits (numel elements, full_cols columns), and
 * sets r->halo_digest; r->data and r->digest are not touched.
 * @return PULSE_OK; PULSE_ERR_ARG (NULL, no halo); PULSE_ERR_OVERFLOW. */
pulse_status pulse_region_halo_take(pulse_region *r, const uint16_t *tensor, uint64_t numel,
                                    uint64_t full_cols);

/* Staged changes of a patch into regions, not yet written. */
typedef struct pulse_region_staged pulse_region_staged;

/** First half of a transactional apply into regions: checks every region
 * (a tensor of the table, inside its view, stride >= cols, a halo as its
 * halo_log2 says, no tensor twice, no two blocks whose memory spans
 * overlap), checks block plus halo against the patch's base digest where
 * they are the whole tensor, decodes the chunks of the patch that meet each
 * block or its span (on `threads` threads, 0: one per core; a class-model
 * chunk from its base bits gathered from block and halo) and keeps the
 * changes that fall in block or halo, and checks the result against the
 * patch's target digest where block and halo are the whole tensor. Nothing
 * is written. Work: the patch's changes in the spans, plus for class-model
 * patches one pass over each changed chunk's base bits (as any decode
 * without a class index); the blocks are not read otherwise. Extra memory:
 * the staged changes and one chunk's base bits per region, O(patch). The
 * patch and the regions array must outlive the staged changes, and blocks
 * and halos must not change until commit. Tensors of the table that no
 * region names are not read.
 * @return PULSE_OK and *out (commit, then free with
 * pulse_region_staged_free); PULSE_ERR_ARG (bad region, overlapping
 * blocks, a tensor twice, a halo missing); PULSE_ERR_NOT_FOUND (a name
 * not in the table); PULSE_ERR_UNSUPPORTED (a class-model chunk with
 * changes that block and halo do not cover: no halo, or chunks larger
 * than 2^halo_log2); PULSE_ERR_BASE_DIGEST (block and halo, the whole
 * tensor, are not the patch's base); PULSE_ERR_TARGET_DIGEST; the decoder's
 * errors for a
 * corrupt patch; PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_region_stage(const pulse_patch *patch, pulse_region *regions,
                                size_t count, int threads,
                                pulse_region_staged **out);

/** Writes the staged changes into the blocks and halos and sets each
 * region's digests to their new contents (cannot fail). Calling it twice writes the same bits. */
void pulse_region_staged_commit(pulse_region_staged *staged);

/** Changes staged in all regions (what commit writes). */
uint64_t pulse_region_staged_changes(const pulse_region_staged *staged);

/** Frees staged changes, committed or not. NULL is fine. */
void pulse_region_staged_free(pulse_region_staged *staged);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_REGION_H */
