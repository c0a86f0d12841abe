/* loco_impl.h - private to loco/: the context's fields and helpers shared by
 * its files. */
#ifndef PULSE_LOCO_IMPL_H
#define PULSE_LOCO_IMPL_H

#include <stdint.h>

#include "pulse_loco.h"

struct pulse_loco {
  pulse_loco_opts opts;
  uint64_t n;
  uint64_t round;
  float *theta_g;
  float *e;
  float *b;
  uint16_t *theta_bf16; /* bf16 of theta_g, refreshed when theta_g changes */
  uint64_t digest;      /* pulse_loco_digest_f32(theta_g) */

  /* The prepared round (prepared != 0): s for every element, the entries
   * sent (positions and values) and the encoded payload. */
  int prepared;
  int need_state; /* abandoned: refuse to prepare until a state import */
  float *s;
  uint64_t *sent_pos;
  float *sent_val;
  uint64_t sent_count;
  uint64_t samples;
  uint32_t members; /* trainers of the round (pulse_loco_set_members); 0:
                       the contributors */
  pulse_buffer payload;
};

/* Ends the prepared round's bookkeeping (payload, sent entries). */
void pulse_loco_drop_round_(pulse_loco *ctx);

/* Refreshes theta_bf16 and digest after theta_g changed. */
void pulse_loco_refresh_(pulse_loco *ctx);

/* Checks one payload against the context as finish does; on success `hdr`
 * and `entries` hold it (entries owned by the caller). */
pulse_status pulse_loco_check_decode_(const pulse_loco *ctx,
                                      const uint8_t *data, size_t size,
                                      pulse_loco_payload_header *hdr,
                                      pulse_loco_entries *entries);

/* The mean's denominator of a round with `count` contributions of total
 * sample weight `weight` (the keep rule scales it to every member). */
double pulse_loco_denominator_(const pulse_loco *ctx, uint64_t weight,
                               size_t count);

/* One element's mean from its double sum: rounded once to float. Every
 * reduction of a round (whole payloads, partitioned ranges) goes through
 * it, so they give the same bits. */
float pulse_loco_mean_(double acc, double wsum);

/* The mean gate's quorum (pulse_loco_opts.gate_mean, docs/formats/loco-payload.md "The
 * round"): a mean that at least this many contributors sent an entry to is
 * applied whatever its size (so its senders' e are cleared, as without the
 * option); only the means fewer sent need to pass the gate. 2, measured
 * against half the contributors (docs/benchmarks/collaboration.md, --gate-mean):
 * with more, the entries a few peers push with opposite signs wait in e
 * round after round and the payloads grow. */
#define LOCO_GATE_QUORUM 2u

/* The mean gate's decision, the one every finish and range owner makes:
 * non-zero (apply `mean`) when the option is off, when `exempt` (an
 * element a leaving sender flushed), when `senders` (the contributors that
 * sent an entry there) reach LOCO_GATE_QUORUM, or when the mean passes
 * pulse_loco_gate on theta_g; 0: the element gets 0 (not applied). */
int pulse_loco_gate_mean_(const pulse_loco *ctx, float theta_g, float mean,
                          uint32_t senders, int exempt);

/* The mean gate's inputs of a whole round, one entry per element: how many
 * contributors sent an entry there, and whether a leaving one did (NULL:
 * none left). */
typedef struct {
  const uint32_t *senders;
  const uint8_t *exempt;
} pulse_loco_gate_in_;

/* The end of every finish: the Nesterov step on every element with
 * avg[i] as given (final: under gate_mean already gated, as a range owner
 * writes it) or, when avg is NULL, pulse_loco_mean_(acc[i], wsum), through
 * pulse_loco_gate_mean_ with `gate`'s inputs when `gate` is not NULL (it is
 * under gate_mean); the error feedback rule, under gate_mean with this
 * trainer's sent entries whose applied mean is 0 kept; round + 1,
 * theta_r = theta_g (theta_r may be NULL). */
void pulse_loco_conclude_(pulse_loco *ctx, const float *avg, const double *acc,
                          double wsum, const pulse_loco_gate_in_ *gate,
                          int self_included, float *theta_r);

/* An inbox's senders (the others), how many were heard from (a chunk
 * kept) and how many sent every cell (docs/protocols/loco-datagrams.md "Exchange over
 * datagrams": a receiver waits no longer once all are complete). */
void loco_inbox_progress(const pulse_loco_inbox *in, size_t *senders,
                         size_t *heard, size_t *complete);

/* The cells of `sender` kept so far, and in sha the SHA-256 of its arrival
 * map (one byte per cell, 1 arrived): the per-range arrival a manifest
 * names. 0 and zeros for a sender the inbox does not know. */
uint64_t loco_inbox_arrival(const pulse_loco_inbox *in, uint32_t sender,
                            uint8_t sha[32]);

/* SHA-256 of bytes (all zeros should OpenSSL fail): what chunk checksums,
 * chunk lists, manifests and payload references name blobs by. */
void loco_sha256(const uint8_t *data, size_t size, uint8_t out[32]);

#endif
