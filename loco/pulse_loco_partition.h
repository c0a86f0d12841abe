/* pulse_loco_partition.h - partitioned averaging for PULSELoCo (docs/formats/loco-payload.md
 * "Partitioned averaging"): instead of every trainer fetching every other
 * trainer's payload, the parameter vector is cut into disjoint ranges, one
 * per owner, sized in proportion to the owners' bandwidth; every trainer
 * sends each owner the slice of its payload in that owner's range, the
 * owner reduces its range, and every trainer fetches the reduced ranges
 * back. The result is bit for bit pulse_loco_finish's over the same
 * contributor set: the owner sums in increasing sender id in double and
 * rounds once, as finish does.
 *
 *   plan     pulse_loco_plan_make: identical on every trainer (integers only)
 *   slice    pulse_loco_slice_encode: this trainer's entries in one range, as
 *            a PLCO payload of its own (same header: round, base, samples)
 *   reduce   pulse_loco_reducer_*: an owner's range from every contributor's
 *            slice (or whole payload) -> a reduced-range blob (PLRD) that
 *            names each contributor's samples and a digest of its entries
 *   verify   each sender checks its receipt in every blob; one other
 *            trainer per range recomputes it (pulse_loco_plan_checker) and
 *            publishes a verdict (PLVD); pulse_loco_verdicts_offenders says,
 *            identically everywhere, which owners to drop
 *   finish   pulse_loco_finish_reduced: the blobs of every range -> the
 *            Nesterov step and error feedback of pulse_loco_finish
 *
 * loco/collab/partition/partition_impl.h runs all of it over HTTP for a node. Threading and
 * errors as pulse_loco.h. Every decoder here reads untrusted bytes. */
#ifndef PULSE_LOCO_PARTITION_H
#define PULSE_LOCO_PARTITION_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_loco.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most contributors of one partitioned round. */
#define PULSE_LOCO_PART_MAX 1024u
/* Range boundaries are multiples of this many parameters (the chunk cell:
 * ranges line up with PLCK chunks and drift ranges). */
#define PULSE_LOCO_PART_ALIGN PULSE_LOCO_CHUNK_CELL

#define PULSE_LOCO_REDUCED_VERSION 2u
#define PULSE_LOCO_VERDICT_VERSION 1u

/* ------------------------------------------------------------------ plan */

/* Who owns which range: ids[k] owns [start[k], start[k + 1]); start[0] = 0,
 * start[count] = P; an owner of weight 0 owns an empty range. */
typedef struct {
  uint64_t param_count;
  uint32_t count;
  uint32_t ids[PULSE_LOCO_PART_MAX];        /* strictly increasing */
  uint64_t start[PULSE_LOCO_PART_MAX + 1]; /* multiples of the alignment */
} pulse_loco_plan;

/** Cuts [0, P) among count contributors (ids strictly increasing) in
 * proportion to weights (any unit, e.g. bytes/s; NULL: equal; 0: no range;
 * all 0: equal), boundaries on multiples of PULSE_LOCO_PART_ALIGN (the last
 * at P). Integer arithmetic only: every trainer given the same ids and
 * weights gets the same plan.
 * @return PULSE_OK; PULSE_ERR_ARG (count 0 or over PULSE_LOCO_PART_MAX, ids
 * not increasing, P 0 or over PULSE_LOCO_MAX_PARAMS). */
pulse_status pulse_loco_plan_make(uint64_t P, const uint32_t *ids,
                                  const uint64_t *weights, size_t count,
                                  pulse_loco_plan *plan);

/** pulse_loco_plan_make counted in bytes rather than parameters: each owner
 * gets the share of its weight of the cells' costs, a cell of
 * PULSE_LOCO_PART_ALIGN parameters costing 1 plus its active elements:
 * those whose outer momentum b is about a BF16 step of theta_g or more
 * (b's exponent at least theta_g's less 8, b not 0 or subnormal: the BF16
 * gate in integers). The momentum holds the last rounds' means (decaying
 * by mu a round), so these are where the model has been changing, where
 * payload entries and means are dense; a parameter count cut gives the
 * owner of such a range several times the bytes of the others. theta_g
 * and b are replicated bit for bit (the state's digests), so every
 * trainer of the round plans the same; a zero momentum (round 0) gives
 * pulse_loco_plan_make's plan. P is ctx's parameter count; the other
 * arguments and returns as pulse_loco_plan_make (PULSE_ERR_ARG also for a
 * NULL ctx; PULSE_ERR_NOMEM: no room for a byte per cell). Reads theta_g
 * and b once (0.1-0.2 s per 10^8 parameters on this 2-core machine). */
pulse_status pulse_loco_plan_make_active(const pulse_loco *ctx,
                                         const uint32_t *ids,
                                         const uint64_t *weights,
                                         size_t count, pulse_loco_plan *plan);

/* The largest ratio between two weights pulse_loco_plan_weights gives. */
#define PULSE_LOCO_PLAN_MAX_RATIO 4u

/** Weights for pulse_loco_plan_make from reported bandwidths (count values,
 * any unit; 0: not reported): m is the median of the reported ones (the
 * lower middle of their sorted values), a missing one counts as m, and
 * every weight is held within [ceil(m / 2), 2m], so the largest is at most
 * PULSE_LOCO_PLAN_MAX_RATIO times the smallest: one peer that lies or
 * measures badly moves range sizes within that bound, never takes all or
 * nothing (and never changes the result, which is bit-identical whatever
 * the plan). None reported: all 1 (equal). Integers only (the same on
 * every trainer). count <= PULSE_LOCO_PART_MAX. */
void pulse_loco_plan_weights(const uint64_t *bandwidth, size_t count,
                             uint64_t *weights);

/** Index of id in the plan, -1 when absent. */
int pulse_loco_plan_index(const pulse_loco_plan *plan, uint32_t id);

/** Index of the trainer that recomputes range k in round `round`, attempt
 * `attempt`: a rotation over the others (never k itself) whose `eligible`
 * flag is set (count flags; NULL: all), so a given pair of owner and
 * checker does not repeat round after round. -1 when nobody else is
 * eligible or the range is empty. */
int pulse_loco_plan_checker(const pulse_loco_plan *plan, uint64_t round,
                            uint32_t attempt, uint32_t k,
                            const uint8_t *eligible);

/** Who recomputes range k in round `round` (attempt `attempt`) when one
 * range in `period` is recomputed a round (0 or 1: every range, every
 * round): range k in the rounds with round % period == k % period, by
 * pulse_loco_plan_checker at round / period. Within a period the shift is
 * fixed, so the checkers of its rounds are all different (each trainer
 * checks one range per period when period is the count) and the pairs
 * change from one period to the next. (Both rotating with the round would
 * cancel: the same trainer would check every round.) -1: range k is not
 * recomputed this round, or nobody eligible. */
int pulse_loco_plan_round_checker(const pulse_loco_plan *plan, uint64_t round,
                                  uint32_t attempt, uint32_t period,
                                  uint32_t k, const uint8_t *eligible);

/* ----------------------------------------------------------------- slices */

/** This trainer's slice for [start, end) of ctx's prepared round: a PLCO
 * payload with the prepared payload's header (flags, sender, round,
 * samples, base digest) and only its entries in the range (possibly none).
 * out is owned by the caller. @return PULSE_OK; PULSE_ERR_ARG (no prepared
 * round, range outside P); PULSE_ERR_NOMEM. */
pulse_status pulse_loco_slice_encode(const pulse_loco *ctx, uint64_t start,
                                     uint64_t end, pulse_buffer *out);

/** The receipt digest of one contributor's part of a range: the first 8
 * bytes (little-endian) of SHA-256 over (sender u32, samples u64, then each
 * entry's position u64 and FP32 bits u32). pos/val: its entries in the
 * range. */
uint64_t pulse_loco_receipt_digest(uint32_t sender, uint64_t samples,
                                   const uint64_t *pos, const float *val,
                                   uint64_t count);

/** The receipt digest of this trainer's own prepared entries in
 * [start, end) (what an honest owner lists for it). */
uint64_t pulse_loco_own_receipt(const pulse_loco *ctx, uint64_t start,
                                uint64_t end);

/* --------------------------------------------------------------- reducer */

typedef struct pulse_loco_reducer pulse_loco_reducer;

/** A reducer of range k of plan for ctx's prepared round (ctx borrowed,
 * must stay prepared): every id of the plan is a contributor and must be
 * added once. expected_samples (plan->count values, or NULL) is what each
 * must claim (the manifest's).
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_loco_reducer_create(const pulse_loco *ctx,
                                       const pulse_loco_plan *plan, uint32_t k,
                                       const uint64_t *expected_samples,
                                       pulse_loco_reducer **out);
void pulse_loco_reducer_free(pulse_loco_reducer *r);

/** Takes one contributor's slice, or its whole payload (only the range is
 * kept): untrusted bytes, checked as pulse_loco_check does (round, P, base
 * digest, full decode), from a sender of the plan not added yet, with the
 * expected samples; a slice with entries outside the range is refused.
 * @return PULSE_OK or why not (PULSE_ERR_DUPLICATE, PULSE_ERR_CORRUPT for
 * an unknown sender, wrong samples or out-of-range entries, a decode
 * error); a refused input changes nothing. */
pulse_status pulse_loco_reducer_add(pulse_loco_reducer *r, const uint8_t *data,
                                    size_t size);

/** Whether every contributor was added. */
int pulse_loco_reducer_complete(const pulse_loco_reducer *r);

/** The reduced range (PLRD, docs/formats/loco-payload.md): for every position where some
 * contributor has an entry, avg = (sum in increasing sender id of samples *
 * value, in double) / pulse_loco_finish's denominator, rounded once; and
 * each contributor's id, samples, entry count and receipt digest. The same
 * inputs always give the same bytes (a checker compares them).
 * @return PULSE_OK; PULSE_ERR_ARG (a contributor missing); NOMEM. */
pulse_status pulse_loco_reducer_finish(pulse_loco_reducer *r,
                                       pulse_buffer *blob);

/* ---------------------------------------------------------- reduced blobs */

/* One contributor as a reduced range names it. */
typedef struct {
  uint32_t id;
  uint64_t samples;
  uint64_t entries; /* its entries in the range */
  uint64_t receipt; /* pulse_loco_receipt_digest of them */
} pulse_loco_receipt;

/* A decoded reduced range. */
typedef struct {
  uint32_t owner;
  uint64_t round, param_count, base_digest;
  uint64_t start, end;
  uint32_t members;    /* the round's members (keep rule's denominator) */
  uint32_t ncontrib;   /* = the plan's count */
  pulse_loco_receipt *contrib; /* increasing id */
  pulse_loco_entries avg;      /* positions in [start, end), exact bits */
} pulse_loco_reduced;

#define PULSE_LOCO_REDUCED_INIT                                                \
  { 0, 0, 0, 0, 0, 0, 0, 0, NULL, PULSE_LOCO_ENTRIES_INIT }

/** Decodes range k's blob for ctx's prepared round and plan (untrusted:
 * magic, version, owner = the plan's k, round, P, base digest, range =
 * the plan's, members, contributors = the plan's ids in order with
 * samples >= 1 (and = expected_samples when given), the embedded averages
 * in range and finite). out is cleared first and owns its arrays on
 * success. @return PULSE_OK or a decode error. */
pulse_status pulse_loco_reduced_decode(const pulse_loco *ctx,
                                       const pulse_loco_plan *plan, uint32_t k,
                                       const uint64_t *expected_samples,
                                       const uint8_t *data, size_t size,
                                       pulse_loco_reduced *out);
void pulse_loco_reduced_free(pulse_loco_reduced *r);

/* What pulse_loco_finish_reduced did besides pulse_loco_finish_figures. */
typedef struct {
  uint32_t offender; /* on PULSE_ERR_CORRUPT: the owner whose blob is wrong */
  int has_offender;
} pulse_loco_reduced_verdict;

/** Finishes ctx's prepared round from the reduced blobs of every range of
 * plan (blobs[k] for range k, count = plan->count; an empty range's blob
 * too): each is decoded as pulse_loco_reduced_decode does, all must name
 * the same samples, and where this trainer contributes, every blob's
 * receipt for it must equal its own (pulse_loco_own_receipt). Then exactly
 * what pulse_loco_finish does with the plan's ids as the contributor set
 * (avg 0 where no blob has an entry; Nesterov; error feedback with
 * self_included = this trainer in the plan; round + 1; theta_r).
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_CORRUPT with v->offender set
 * (a blob that does not decode or fit, a wrong receipt); PULSE_ERR_NOMEM.
 * On error the round stays prepared and nothing changed. */
pulse_status pulse_loco_finish_reduced(pulse_loco *ctx,
                                       const pulse_loco_plan *plan,
                                       const pulse_loco_contribution *blobs,
                                       const uint64_t *expected_samples,
                                       float *theta_r,
                                       pulse_loco_finish_figures *info,
                                       pulse_loco_reduced_verdict *v);

/* --------------------------------------------------------------- verdicts */

/* What one trainer saw of one range (PLVD flags). */
#define PULSE_LOCO_VERDICT_BAD_BLOB 1u    /* did not decode or fit the plan */
#define PULSE_LOCO_VERDICT_BAD_RECEIPT 2u /* this trainer's receipt wrong */
#define PULSE_LOCO_VERDICT_CHECKED 4u     /* this trainer recomputed it */
#define PULSE_LOCO_VERDICT_MISMATCH 8u    /* ... and got other bytes */
#define PULSE_LOCO_VERDICT_FLAGS_KNOWN 15u

typedef struct {
  uint32_t owner;
  uint8_t flags;
  uint64_t blob_digest; /* first 8 bytes of SHA-256 of the blob it got */
} pulse_loco_verdict_item;

/* One trainer's verdict on one attempt of a round: an item per range of
 * the plan, in plan order. */
typedef struct {
  uint32_t peer;
  uint64_t round;
  uint32_t attempt;
  uint32_t count;
  pulse_loco_verdict_item items[PULSE_LOCO_PART_MAX];
} pulse_loco_verdict;

/** Encodes a verdict (PLVD) into out (owned by the caller).
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_loco_verdict_encode(const pulse_loco_verdict *v,
                                       pulse_buffer *out);

/** Decodes a verdict (untrusted: exact size, known flags, count within
 * PULSE_LOCO_PART_MAX). @return PULSE_OK, PULSE_ERR_TRUNCATED,
 * PULSE_ERR_TRAILING, PULSE_ERR_MAGIC, PULSE_ERR_VERSION, PULSE_ERR_CORRUPT. */
pulse_status pulse_loco_verdict_decode(const uint8_t *data, size_t size,
                                       pulse_loco_verdict *out);

/** The owners to drop, from every trainer's verdict on one attempt (n
 * verdicts, each checked against plan: same round, attempt and owners):
 * an owner is an offender when some verdict flags its blob bad, a receipt
 * wrong or a recomputation different, or when two verdicts saw different
 * bytes from it (it served two versions). Every trainer that reads the
 * same verdicts gets the same list (increasing ids) into offenders
 * (capacity plan->count); *noff their number.
 * @return PULSE_OK; PULSE_ERR_CORRUPT (a verdict of another round, attempt
 * or plan). */
pulse_status pulse_loco_verdicts_offenders(const pulse_loco_plan *plan,
                                           uint64_t round, uint32_t attempt,
                                           const pulse_loco_verdict *v,
                                           size_t n, uint32_t *offenders,
                                           size_t *noff);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_PARTITION_H */
