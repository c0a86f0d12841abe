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
 * Verification: a region's digest is the additive tensor digest (FORMAT.md)
 * of the block alone, each element counted at its position in the whole
 * tensor (pulse_digest_bf16_block), so the blocks of every rank add up to
 * the tensor's digest. The trainer publishes whole-tensor digests only; a
 * region's digest is derived: from a verified anchor (whose state digest the
 * signed head vouches for) and then moved by each applied patch's changes
 * (whose bytes the signed head vouches for). pulse_region_stage checks the
 * caller's memory against that kept digest before it reads a base bit, and
 * a region that covers its whole tensor against the patch's own base and
 * target digests too.
 * A partial region cannot check the patch's changes against the trainer's
 * whole-tensor digests, so the patch's bytes must be authentic before they
 * get here (the subscriber checks every object against its signed SHA-256
 * first). Patches whose positions cannot be decoded without
 * the rest of the tensor (the class position model, whose ranks count base
 * elements of the whole chunk) are refused for a partial region: a
 * publisher that serves tensor-parallel ranks writes PULSE_POS_PLAIN
 * patches.
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
   * by stage, moved to the new contents by commit. */
  pulse_tensor_digest digest;
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

/* Staged changes of a patch into regions, not yet written. */
typedef struct pulse_region_staged pulse_region_staged;

/** First half of a transactional apply into regions: checks every region
 * (a tensor of the table, inside its view, stride >= cols, no tensor twice,
 * no two blocks whose memory spans overlap), checks each region's memory
 * against its kept digest (one read pass over the blocks; whole-tensor
 * regions against the patch's base digest too), decodes the chunks of the
 * patch that meet each block (on `threads` threads, 0: one per core) and
 * keeps the changes that fall inside it, and checks a whole-tensor region's
 * resulting digest against the patch's target digest. Nothing is written.
 * Extra memory: the staged changes of the blocks and one chunk's decode
 * buffer per thread, O(patch). The patch and the regions array must
 * outlive the staged changes, and the blocks must not change until commit.
 * Tensors of the table that no region names are not read.
 * @return PULSE_OK and *out (commit, then free with
 * pulse_region_staged_free); PULSE_ERR_ARG (bad region, overlapping
 * blocks, a tensor twice); PULSE_ERR_NOT_FOUND (a name not in the table);
 * PULSE_ERR_UNSUPPORTED (a class-model patch with changes in a tensor that
 * a region holds only part of); PULSE_ERR_BASE_DIGEST (a block whose
 * memory is not what its digest says, or a whole tensor that is not the
 * patch's base); PULSE_ERR_TARGET_DIGEST; the decoder's errors for a
 * corrupt patch; PULSE_ERR_OVERFLOW; PULSE_ERR_NOMEM. */
pulse_status pulse_region_stage(const pulse_patch *patch, pulse_region *regions,
                                size_t count, int threads,
                                pulse_region_staged **out);

/** Writes the staged changes into the blocks and sets each region's digest
 * to its new contents (cannot fail). Calling it twice writes the same bits. */
void pulse_region_staged_commit(pulse_region_staged *staged);

/** Changes staged in all regions (what commit writes). */
uint64_t pulse_region_staged_changes(const pulse_region_staged *staged);

/** Frees staged changes, committed or not. NULL is fine. */
void pulse_region_staged_free(pulse_region_staged *staged);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_REGION_H */
