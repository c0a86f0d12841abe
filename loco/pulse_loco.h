/* pulse_loco.h - PULSELoCo: DiLoCo between trainers with BF16-gated sparse
 * pseudo-gradients and FP32 error feedback (docs/design.md, "PULSELoCo").
 *
 * One pulse_loco context per trainer holds, over a flat vector of P FP32
 * parameters, the global copy theta_g (identical on every trainer, bit for
 * bit), the error-feedback residual e and the outer Nesterov momentum b. A
 * round is two calls around an exchange:
 *
 *   pulse_loco_prepare(ctx, theta_r)   s = e + (theta_g - theta_r); the gate
 *                                      picks the entries that would change
 *                                      bf16(theta_g); they become this
 *                                      trainer's payload (docs/formats/loco-payload.md)
 *   ... exchange: every trainer must end up with the same contributor set
 *       (the coordinator exchange does it over HTTP or datagrams,
 *       pulse_loco_coord.h; the collaboration, pulse_loco_collab.h; gossip,
 *       pulse_gossip.h; tests and simulations in memory)
 *   pulse_loco_finish(ctx, set, theta_r)  avg = sample-weighted mean of the
 *                                      contributions; Nesterov outer step;
 *                                      e = s minus what got through;
 *                                      theta_r = theta_g
 *
 * Error feedback rule: when this trainer's own payload is in the contributor
 * set, e = s where not sent and 0 where sent. When it is not (lost, late),
 * the loss rule decides (pulse_loco_rule, docs/formats/loco-payload.md "Loss rules"): by
 * default the sent part goes (the others' mean did not need it), or it is
 * kept in e to be sent again.
 *
 * The per-element arithmetic is codec/pulse_loco_elem.h (shared with the
 * CUDA kernels); this library is its CPU reference.
 *
 * Thread-safety: a context is used by one thread at a time; distinct
 * contexts are independent. Errors: a non-OK pulse_status, with details in
 * pulse_error_detail(). Nothing here prints to stdout. No libcurl or
 * libmicrohttpd type appears in this header. */
#ifndef PULSE_LOCO_H
#define PULSE_LOCO_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_codec.h" /* pulse_buffer, pulse_pos_model */
#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- context */

typedef struct pulse_loco pulse_loco;

/* Which entries a trainer sends. */
typedef enum {
  /* PULSELoCo: only entries where bf16(theta_g) != bf16(theta_g - s). */
  PULSE_LOCO_GATE_BF16 = 0,
  /* Dense DiLoCo: every entry, nothing kept (the baseline). */
  PULSE_LOCO_GATE_NONE = 1
} pulse_loco_gate_mode;

/* How a payload codes its FP32 values (docs/formats/loco-payload.md). Part of the format. */
typedef enum {
  PULSE_LOCO_VALUES_RAW = 0,    /* 4 bytes little-endian each */
  PULSE_LOCO_VALUES_MODELED = 1 /* sign/exponent modeled, range coded */
} pulse_loco_value_coding;

/* What a round does with a contribution that did not arrive (lost, late,
 * invalid); docs/formats/loco-payload.md "Loss rules" has the measurements behind the
 * default. */
typedef enum {
  /* Divide by the contributions that arrived, let the lost part go (its
   * sender clears what it sent from error feedback, as if it had counted):
   * each round's mean is unbiased and nothing is counted twice. The
   * default. */
  PULSE_LOCO_RULE_DROP = 0,
  /* Divide by the trainers of the round (their sample weight), keep what
   * was lost in its sender's error feedback: delayed, never lost, never
   * counted twice; a round's mean falls short by the loss rate and the
   * rest comes later. */
  PULSE_LOCO_RULE_KEEP = 1,
  /* Version 1's rule, kept for the record: divide by what arrived AND keep
   * the lost part; a lost contribution is corrected twice (about 1/(1-p)
   * times its mass over time). */
  PULSE_LOCO_RULE_LEGACY = 2
} pulse_loco_rule;

/* Context options; start from pulse_loco_opts_init. */
typedef struct {
  uint32_t struct_version; /* PULSE_LOCO_OPTS_VERSION */
  uint64_t param_count;    /* P >= 1, at most PULSE_LOCO_MAX_PARAMS */
  uint32_t trainer_id;     /* unique among the trainers of one run */
  float alpha;             /* outer learning rate (0.7) */
  float mu;                /* outer Nesterov momentum (0.9) */
  pulse_loco_gate_mode gate;
  pulse_loco_value_coding values;
  pulse_pos_model pos_model; /* PULSE_POS_PLAIN, _CLASS or _AUTO (default) */
  uint32_t chunk_log2; /* payload chunk = 2^chunk_log2 parameters, 10..30 */
  /* Version 2: the loss rule (version 1 callers get the default). */
  pulse_loco_rule rule;
  /* Version 3 (older callers get 0, off): non-zero gates the round's mean
   * as a payload's entries are gated. The outer step applies the entries
   * of the mean that at least 2 contributors sent (a quorum) and those
   * that would move bf16(theta_g) (pulse_loco_gate on theta_g and the
   * mean); elsewhere it applies 0, and every contributor whose payload is
   * in the set keeps the entries it sent there in its error feedback
   * (e = s: deferred, not lost). Partitioned, the reduced
   * ranges then carry only those entries (fewer bytes in: docs/formats/loco-payload.md "The
   * round", "Reduced range"). Every trainer of a run must use the same
   * setting: a reduced range of the other setting is refused; all-to-all
   * cannot tell, and the trainers' theta_g part (the next round's
   * payloads are then refused for their base digest). */
  int gate_mean;
} pulse_loco_opts;

#define PULSE_LOCO_OPTS_VERSION 3u
#define PULSE_LOCO_MAX_PARAMS (1ull << 36)
/** Sets every field of *opts to its default (struct_version included):
 * the one way to start options; then set the fields you need. */
void pulse_loco_opts_init(pulse_loco_opts *opts);

/** The rule's name ("drop", "keep", "legacy") and back.
 * @return the name, "?" for an unknown value; pulse_loco_rule_parse:
 * PULSE_OK or PULSE_ERR_ARG (unknown name). */
const char *pulse_loco_rule_name(pulse_loco_rule rule);
pulse_status pulse_loco_rule_parse(const char *name, pulse_loco_rule *rule);

/** Creates a context at round 0 with theta_g = theta_init (P floats,
 * copied), e = 0 and b = 0. theta_init may be NULL for zeros (a joiner that
 * imports the state next).
 * @return PULSE_OK; PULSE_ERR_ARG for a bad option (version, P, alpha or mu
 * not finite, unknown mode, chunk_log2); PULSE_ERR_NOMEM. */
pulse_status pulse_loco_create(const pulse_loco_opts *opts,
                               const float *theta_init, pulse_loco **out);

/** Frees a context. NULL is fine. */
void pulse_loco_free(pulse_loco *ctx);

uint64_t pulse_loco_param_count(const pulse_loco *ctx);
uint32_t pulse_loco_trainer_id(const pulse_loco *ctx);

/** The round the next pulse_loco_prepare builds (rounds finished so far,
 * counted from the state's origin). */
uint64_t pulse_loco_round(const pulse_loco *ctx);

/** The global parameters theta_g, error feedback e and momentum b (P floats
 * each). Borrowed: valid until the next finish, import or free. */
const float *pulse_loco_global(const pulse_loco *ctx);
const float *pulse_loco_residual(const pulse_loco *ctx);
const float *pulse_loco_momentum(const pulse_loco *ctx);

/** 64-bit digest of theta_g's bits (pulse_loco_digest_f32): equal on every
 * trainer of a run, and carried in every payload as its base. */
uint64_t pulse_loco_global_digest(const pulse_loco *ctx);

/** Additive 64-bit digest of n floats' bits: the sum modulo 2^64 of a mixed
 * hash of (index, bits), so -0.0 and +0.0, or two NaNs, differ. */
uint64_t pulse_loco_digest_f32(const float *x, uint64_t n);

/* Flags of a trainer's round, the same in every exchange (pulse_loco_prepare,
 * pulse_loco_coord_step, pulse_loco_collab_round). */
typedef enum {
  /* This trainer's last round: it sends every non-zero entry of s (the
   * flush: no gate), then leaves the exchange. */
  PULSE_LOCO_LEAVING = 1u
} pulse_loco_round_flag;

/* What pulse_loco_prepare did (may be NULL). */
typedef struct {
  uint64_t round;
  uint64_t sent;          /* entries in the payload */
  uint64_t payload_bytes; /* its encoded size */
} pulse_loco_prepare_figures;

/** Starts round pulse_loco_round(ctx): computes s from the local parameters
 * theta_r (P floats, read only), gates it and encodes the payload. Nothing
 * of the context's state changes until finish or abandon. `samples` (>= 1)
 * weights this trainer's contribution in the mean. The payload is borrowed
 * from the context: valid until finish, abandon or free.
 * @return PULSE_OK; PULSE_ERR_ARG when a round is already prepared, the
 * context waits for a state import (after abandon) or samples is 0;
 * PULSE_ERR_NOMEM. */
pulse_status pulse_loco_prepare(pulse_loco *ctx, const float *theta_r,
                                uint64_t samples, uint32_t flags,
                                const uint8_t **payload, size_t *size,
                                pulse_loco_prepare_figures *info);

/** Tells the prepared round how many trainers it has (contributing or
 * not): the mean's denominator under PULSE_LOCO_RULE_KEEP is the arrived
 * contributions' sample weight times members / contributors (exact when
 * every trainer weighs the same samples). Without this call the round
 * counts only its contributors (no loss assumed).
 * @return PULSE_OK; PULSE_ERR_ARG (no prepared round, 0 members). */
pulse_status pulse_loco_set_members(pulse_loco *ctx, uint32_t members);

/* One contribution to a round: a payload's bytes (borrowed). */
typedef struct {
  const uint8_t *data;
  size_t size;
} pulse_loco_contribution;

/* What pulse_loco_finish did (may be NULL). */
typedef struct {
  uint64_t round;        /* the round just finished */
  uint32_t contributors; /* payloads averaged */
  int self_included;     /* this trainer's payload was among them */
  uint64_t samples;      /* sum of their sample counts */
  uint64_t entries;      /* sum of their entry counts */
} pulse_loco_finish_figures;

/** Finishes the prepared round with the agreed contributor set (count >= 1
 * payloads, any order; this trainer's own counts when its sender id is
 * there, and must then be byte-identical to the prepared payload). Every
 * payload is decoded and checked (round, parameter count, base digest,
 * distinct senders, docs/formats/loco-payload.md rules) before anything changes; then
 * avg[i] = (sum over senders in increasing id of samples * value) / (sum of
 * samples; under PULSE_LOCO_RULE_KEEP scaled to every member of the round),
 * accumulated in double and rounded once to float (0 where nobody sent
 * i); Nesterov step on every element; error feedback as above; round + 1;
 * theta_r (P floats, may be NULL) = theta_g.
 * @return PULSE_OK; PULSE_ERR_ARG (no prepared round, count 0);
 * PULSE_ERR_BASE_STEP (a payload of another round); PULSE_ERR_BASE_DIGEST
 * (built on another theta_g); PULSE_ERR_DUPLICATE (two payloads of one
 * sender, or a foreign payload under this trainer's id); a decode error;
 * PULSE_ERR_NOMEM. On error the round stays prepared and nothing changed. */
pulse_status pulse_loco_finish(pulse_loco *ctx,
                               const pulse_loco_contribution *set, size_t count,
                               float *theta_r, pulse_loco_finish_figures *info);

/** Checks one payload as finish would (round, size, digest, decode) without
 * using it: what a coordinator does before admitting it to the set.
 * @return PULSE_OK or the error finish would give. */
pulse_status pulse_loco_check(const pulse_loco *ctx, const uint8_t *data,
                              size_t size);

/** Ends the prepared round without an outer step (this trainer could not
 * get the whole contributor set): the error feedback rule is applied as if
 * finished, with self_included saying whether the others used its payload.
 * The context then refuses to prepare until pulse_loco_state_import. */
pulse_status pulse_loco_abandon(pulse_loco *ctx, int self_included);

/** Serializes the global state a joiner needs (round, alpha, mu, theta_g, b;
 * docs/formats/loco-state.md "State") into out (owned by the caller). Not while a round is
 * prepared. @return PULSE_OK, PULSE_ERR_ARG or PULSE_ERR_NOMEM. */
pulse_status pulse_loco_state_export(const pulse_loco *ctx, pulse_buffer *out);

/** Replaces theta_g, b and the round with a state from pulse_loco_state_export
 * (untrusted bytes: every field checked, digests verified); e is kept (the
 * mass it holds is still owed). theta_r (P floats, may be NULL) = theta_g.
 * Not while a round is prepared (abandon it first).
 * @return PULSE_OK; PULSE_ERR_MAGIC, PULSE_ERR_VERSION, PULSE_ERR_TRUNCATED,
 * PULSE_ERR_TRAILING, PULSE_ERR_SIZE_MISMATCH (other P), PULSE_ERR_CORRUPT
 * (other alpha/mu, digest mismatch); nothing changes on error. */
pulse_status pulse_loco_state_import(pulse_loco *ctx, const uint8_t *data,
                                     size_t size, float *theta_r);

/* ------------------------------------------------------------ payloads */

#define PULSE_LOCO_PAYLOAD_VERSION 1u
#define PULSE_LOCO_STATE_VERSION 1u

/* Payload flags (docs/formats/loco-payload.md). */
#define PULSE_LOCO_PAYLOAD_GATED 1u   /* every entry passed the BF16 gate */
#define PULSE_LOCO_PAYLOAD_LEAVING 2u /* the sender's last round */

/* The fixed header of a payload. */
typedef struct {
  uint32_t version;   /* PULSE_LOCO_PAYLOAD_VERSION */
  uint32_t flags;     /* PULSE_LOCO_PAYLOAD_* */
  uint32_t pos_model; /* pulse_pos_model */
  uint32_t values;    /* pulse_loco_value_coding */
  uint32_t chunk_log2;
  uint32_t sender;
  uint64_t round;
  uint64_t samples;     /* >= 1 */
  uint64_t param_count; /* P */
  uint64_t base_digest; /* pulse_loco_digest_f32(theta_g) */
  uint64_t count;       /* entries, <= P */
} pulse_loco_payload_header;

/* Decoded entries: strictly increasing positions and their FP32 values. */
typedef struct {
  uint64_t count;
  uint64_t *pos;
  float *val;
} pulse_loco_entries;

#define PULSE_LOCO_ENTRIES_INIT                                                \
  { 0, NULL, NULL }

/** Releases the arrays and resets the struct. NULL is fine. */
void pulse_loco_entries_free(pulse_loco_entries *e);

/** Encodes k entries against the base theta_g (P floats; its BF16 bits
 * theta_bf16 may be given, else NULL and computed). hdr gives version-
 * independent fields (flags, pos_model or PULSE_POS_AUTO, values,
 * chunk_log2, sender, round, samples, base_digest); count and param_count
 * come from k and P. Positions must increase strictly and be < P; with
 * PULSE_LOCO_PAYLOAD_GATED every entry must pass the gate, and values must
 * be finite. out is owned by the caller on success.
 * @return PULSE_OK, PULSE_ERR_ARG (a broken precondition), PULSE_ERR_NOMEM. */
pulse_status pulse_loco_payload_encode(const pulse_loco_payload_header *hdr,
                                       const float *theta_g,
                                       const uint16_t *theta_bf16, uint64_t P,
                                       const uint64_t *pos, const float *val,
                                       uint64_t k, pulse_buffer *out);

/** Reads and checks the fixed header only (magic, version, flags, models,
 * counts within limits). Untrusted bytes.
 * @return PULSE_OK, PULSE_ERR_TRUNCATED, PULSE_ERR_MAGIC, PULSE_ERR_VERSION,
 * PULSE_ERR_CORRUPT, PULSE_ERR_OVERFLOW. */
pulse_status pulse_loco_payload_peek(const uint8_t *data, size_t size,
                                     pulse_loco_payload_header *hdr);

/** Decodes a whole payload against the receiver's theta_g (P floats, and
 * optionally its BF16 bits, else NULL). Untrusted bytes: every count, size,
 * position and value is checked, the streams must be consumed exactly,
 * values must be finite, a gated payload's entries must pass the gate, and
 * the header's P must equal P. Does not compare base_digest (the caller
 * knows its own). out is cleared first and owns its arrays on success
 * (empty on error).
 * @return PULSE_OK or a decode error (see pulse_status.h). */
pulse_status pulse_loco_payload_decode(const uint8_t *data, size_t size,
                                       const float *theta_g,
                                       const uint16_t *theta_bf16, uint64_t P,
                                       pulse_loco_payload_header *hdr,
                                       pulse_loco_entries *out);

/* ------------------------------------------------------------ chunks */

/* A payload as independently decodable chunks, each small enough for one
 * datagram (docs/formats/loco-chunks.md "Chunks"): a lost datagram loses one range of one
 * sender. Ranges are whole cells of PULSE_LOCO_CHUNK_CELL parameters; a
 * receiver aggregates per cell. Raw values (8 bytes an entry). */
#define PULSE_LOCO_CHUNK_VERSION 1u
#define PULSE_LOCO_CHUNK_HEADER 68u
#define PULSE_LOCO_CHUNK_CELL 128u
/* Chunk flag (beside the payload's GATED and LEAVING): the sender's theta_g
 * differs from the reference replica's over this chunk's range (drift
 * between re-syncs), so its gate cannot be checked by a receiver. */
#define PULSE_LOCO_CHUNK_DRIFTED 4u

/* One chunk's header. */
typedef struct {
  uint32_t flags; /* PULSE_LOCO_PAYLOAD_GATED, _LEAVING, CHUNK_DRIFTED */
  uint32_t sender;
  uint64_t round, samples, param_count, base_digest;
  uint64_t start;  /* first parameter of the range, a multiple of the cell */
  uint32_t length; /* parameters of the range: whole cells (the last may end
                      at P) */
  uint32_t count;  /* entries, <= length */
} pulse_loco_chunk_header;

/** The smallest datagram a chunk encoder accepts: header + a full cell. */
size_t pulse_loco_chunk_bound(void);

/** Splits k entries (strictly increasing positions < P, finite values) into
 * chunks of at most max_datagram bytes (>= pulse_loco_chunk_bound()),
 * covering every cell of [0, P) once (a range without entries still says
 * "nothing here"), written back to back into out (owned by the caller).
 * hdr gives flags, sender, round, samples (>= 1) and base_digest.
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_loco_chunks_encode(const pulse_loco_payload_header *hdr,
                                      uint64_t P, const uint64_t *pos,
                                      const float *val, uint64_t k,
                                      size_t max_datagram, pulse_buffer *out,
                                      uint64_t *nchunks);

/** For a replica that drifted from the reference between re-syncs:
 * flags PULSE_LOCO_CHUNK_DRIFTED (and re-checksums) every chunk of the
 * nchunks in chunks (from pulse_loco_chunks_encode for P parameters) whose
 * range overlaps a range of range_len parameters flagged in drifted.
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_TRUNCATED, PULSE_ERR_CORRUPT. */
pulse_status pulse_loco_chunks_mark_drifted(pulse_buffer *chunks,
                                            uint64_t nchunks, uint64_t P,
                                            const uint8_t *drifted,
                                            uint64_t range_len);

/** The size of the chunk at the start of data (to walk a buffer of chunks
 * from pulse_loco_chunks_encode). @return PULSE_OK, PULSE_ERR_TRUNCATED,
 * PULSE_ERR_CORRUPT. */
pulse_status pulse_loco_chunk_size(const uint8_t *data, size_t size,
                                   size_t *chunk_size);

/** Decodes one chunk (untrusted bytes: exactly one chunk, checksum, range
 * inside P, positions increasing inside the range, finite values, and a
 * GATED chunk's entries pass the gate against theta_g when theta_g is not
 * NULL and the chunk is not DRIFTED). pos and val need room for 64 * PULSE_LOCO_CHUNK_CELL entries.
 * @return PULSE_OK, PULSE_ERR_TRUNCATED, PULSE_ERR_TRAILING, PULSE_ERR_MAGIC,
 * PULSE_ERR_VERSION, PULSE_ERR_SIZE_MISMATCH, PULSE_ERR_CORRUPT. */
pulse_status pulse_loco_chunk_decode(const uint8_t *data, size_t size,
                                     const float *theta_g, uint64_t P,
                                     pulse_loco_chunk_header *h, uint64_t *pos,
                                     float *val);

/* Chunks a receiver took and refused, by reason. */
typedef struct {
  uint64_t accepted;
  uint64_t truncated;      /* shorter or longer than its count says */
  uint64_t bad_checksum;   /* a flipped bit */
  uint64_t malformed;      /* magic, version, range, positions, values */
  uint64_t unknown_sender; /* not a member of the round (or this trainer) */
  uint64_t other_round;
  uint64_t other_base; /* built on another theta_g */
  uint64_t duplicate;  /* a cell of that sender already here */
} pulse_loco_inbox_figures;

/* The chunks one trainer received for its prepared round. */
typedef struct pulse_loco_inbox pulse_loco_inbox;

/** An inbox for ctx's prepared round (ctx borrowed; must stay prepared)
 * from the other members `senders` (this trainer's id among them is
 * ignored). @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_DUPLICATE,
 * PULSE_ERR_NOMEM. */
pulse_status pulse_loco_inbox_create(pulse_loco *ctx, const uint32_t *senders,
                                     size_t nsenders, pulse_loco_inbox **out);
void pulse_loco_inbox_free(pulse_loco_inbox *in);

/** Takes one received datagram: a chunk that decodes, from a known sender,
 * of this round and base, for cells of that sender not yet here, is kept;
 * anything else is counted by reason and changes nothing.
 * @return PULSE_OK when kept, else why not. */
pulse_status pulse_loco_inbox_add(pulse_loco_inbox *in, const uint8_t *data,
                                  size_t size);
void pulse_loco_inbox_figures_get(const pulse_loco_inbox *in,
                            pulse_loco_inbox_figures *stats);

/** Between re-syncs (docs/formats/loco-chunks.md "Drift"): chunks must name base_digest
 * (the reference replica's theta_g digest, which every member learned
 * with its digests) instead of this replica's own, and the gate is not
 * checked in the ranges of range_len parameters flagged in drifted (where
 * this replica's theta_g differs from the reference's; copied; NULL: none).
 * Call before the first pulse_loco_inbox_add.
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_NOMEM. */
pulse_status pulse_loco_inbox_set_drift(pulse_loco_inbox *in,
                                       uint64_t base_digest,
                                       const uint8_t *drifted,
                                       uint64_t range_len);

/** Finishes ctx's prepared round from its inbox: per cell, the mean over
 * this trainer and the senders whose chunk for that cell arrived (sample
 * weights, sums in increasing sender id), then the Nesterov step; error
 * feedback by the drop rule (the only one a sender can apply without
 * learning which of its ranges arrived). Trainers that got the same chunks
 * end with the same bits; others drift (docs/formats/loco-chunks.md "Chunks").
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_UNSUPPORTED (keep or legacy
 * rule); PULSE_ERR_NOMEM. */
pulse_status pulse_loco_finish_inbox(pulse_loco *ctx, pulse_loco_inbox *in,
                                     float *theta_r,
                                     pulse_loco_finish_figures *info);

/* ------------------------------------------------------------- drift */

/* Trainers that received different chunks end a round with different
 * theta_g (and b). These find where and bring the ranges back (docs/formats/loco-payload.md
 * "Drift"): each replica publishes a digest per range; a range whose digest
 * differs from the reference replica's is copied from it over the reliable
 * path. */

/** Digest of theta_g and b over [start, start + length): equal on two
 * replicas when both hold the same bits there (up to hash collisions).
 * @return PULSE_OK or PULSE_ERR_ARG (range outside the vector). */
pulse_status pulse_loco_range_digest(const pulse_loco *ctx, uint64_t start,
                                     uint64_t length, uint64_t *digest);

/** Overwrites theta_g and b over [start, start + length) with a reference
 * replica's values (length floats each, untrusted: must be finite); not
 * while a round is prepared. e is this trainer's and is kept.
 * @return PULSE_OK, PULSE_ERR_ARG, PULSE_ERR_CORRUPT (a non-finite value;
 * nothing changed). */
pulse_status pulse_loco_resync_range(pulse_loco *ctx, uint64_t start,
                                     uint64_t length, const float *theta_g,
                                     const float *b);

/** ||a - b|| / ||a|| over n floats (the drift that lossy rounds report, max over
 * pairs); 0 when both are 0. */
double pulse_loco_drift(const float *theta_a, const float *theta_b, uint64_t n);

/* A sketch of a range of theta_g: PULSE_LOCO_SKETCH sums of its values
 * under signs drawn from each parameter's index (the same on every
 * replica). Two replicas' sketches of a range estimate the squared distance
 * between them there without its values: 8 doubles instead of 4 bytes a
 * parameter (docs/formats/loco-chunks.md "Drift"). */
#define PULSE_LOCO_SKETCH 8u

/** The sketch of theta_g over [start, start + length).
 * @return PULSE_OK or PULSE_ERR_ARG (range outside the vector). */
pulse_status pulse_loco_range_sketch(const pulse_loco *ctx, uint64_t start,
                                     uint64_t length,
                                     double sketch[PULSE_LOCO_SKETCH]);

/** An estimate of ctx's drift from a reference replica, ||theta_g - ref|| /
 * ||theta_g||, from the reference's sketches (PULSE_LOCO_SKETCH per range of
 * range_len parameters, range after range) over the ranges flagged in
 * differ (the others hold the same bits): each range's squared distance is
 * estimated by the mean squared difference of the sketches (relative
 * standard error about 0.5 for one range, less over many). INFINITY on
 * NULL arguments. */
double pulse_loco_drift_estimate(const pulse_loco *ctx, uint64_t range_len,
                                 const uint8_t *differ,
                                 const double *ref_sketch);

/* ---------------------------------------------------- exchange members */

/* What every exchange (pulse_loco_coord.h, pulse_loco_collab.h) names a
 * trainer by. */
/* One member: id and base URL ("http://127.0.0.1:PORT"). */
typedef struct {
  uint32_t id;
  char url[64];
} pulse_loco_member;

#ifdef __cplusplus
}
#endif
#endif /* PULSE_LOCO_H */
