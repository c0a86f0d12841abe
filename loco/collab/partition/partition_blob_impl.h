/* partition_blob_impl.h - private to loco/: the reduced-range blob (PLRD,
 * docs/protocols/loco-collaboration.md "Partitioned averaging") shared by the reducer that writes it
 * and the finish that reads it. */
#ifndef PULSE_LOCO_PARTITION_BLOB_IMPL_H
#define PULSE_LOCO_PARTITION_BLOB_IMPL_H

#include "pulse_loco_partition.h"

#define LOCO_REDUCED_MAGIC 0x44524C50u /* "PLRD" */
#define LOCO_REDUCED_HEADER 64u
#define LOCO_REDUCED_RECEIPT 28u
#define LOCO_REDUCED_MAX_SCALE 30u /* the averages' scale q, at most */
/* Flags (byte 6): the owner wrote only the means that pass the mean gate
 * (pulse_loco_opts.gate_mean); a reader with the other setting refuses. */
#define LOCO_REDUCED_GATED_MEANS 1u

/* The fixed fields of a blob. */
typedef struct {
  uint32_t owner, members, ncontrib;
  uint64_t round, param_count, base_digest, start, end;
  uint64_t weight; /* sum of the contributors' samples */
} loco_reduced_head;

/* Writes a blob: head, the ncontrib receipts, then the k averages (pos in
 * [start, end), increasing) as an ungated PLCO payload of the owner with
 * samples = weight, coded against ctx's theta_g. */
pulse_status loco_reduced_encode(const pulse_loco *ctx,
                                 const loco_reduced_head *head,
                                 const pulse_loco_receipt *rc,
                                 const uint64_t *pos, const float *val,
                                 uint64_t k, pulse_buffer *out);

/* The blob of an empty range k (nothing to reduce): every trainer builds
 * the same bytes from the plan and the granted samples, so nobody has to
 * serve it. */
pulse_status loco_reduced_empty(const pulse_loco *ctx,
                                const pulse_loco_plan *plan, uint32_t k,
                                const uint64_t *samples, pulse_buffer *out);

/* This trainer's prepared entries in [start, end). */
uint64_t pulse_loco_own_entries_(const pulse_loco *ctx, uint64_t start,
                                 uint64_t end);

#endif
