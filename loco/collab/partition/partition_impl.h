/* partition_impl.h - private to loco/: a partitioned round over HTTP
 * (docs/protocols/loco-collaboration.md "Partitioned averaging"), one call for a node's round loop:
 * slices out, ranges reduced by their owners, every range recomputed by one
 * other trainer, verdicts, offenders dropped and the round run again
 * without them, then pulse_loco_finish_reduced. */
#ifndef PULSE_LOCO_PARTITION_IMPL_H
#define PULSE_LOCO_PARTITION_IMPL_H

#include "peer_http_impl.h"
#include "pulse_loco_auth.h"
#include "pulse_loco_partition.h"

typedef struct {
  pulse_loco *ctx;  /* prepared for the round (pulse_loco_set_members done) */
  float *theta_r;   /* P floats or NULL: gets theta_g */
  size_t count;     /* contributors C, increasing id, this trainer among them */
  const uint32_t *ids;       /* [count] */
  const char *const *urls;   /* [count] base URLs. A client-mode peer's
                                (it owns no range, checks no one's) is
                                its hosted URL "HOST/v1/hosted/ID"
                                (loco_url_hosted): it uploads its slices
                                and verdict to its host (upload below),
                                which serves them under that URL as a
                                trainer serves its own; or "": it
                                publishes nothing and its whole payload,
                                which reduces as well as a slice, is read
                                from relay_url */
  const uint64_t *samples;   /* [count] what each payload must claim */
  const uint64_t *weights;   /* [count] bandwidth (any unit) or NULL: equal */
  const char *relay_url;     /* serves /v1/loco/round/R/from/ID (whole
                                payloads of client-mode peers); NULL: none */
  loco_server *srv;          /* this trainer's server (NULL or a table
                                that listens nowhere in client mode):
                                blobs go under /v1/loco/part/R/ */
  /* Client mode with a hosted URL: puts this trainer's blob (path as on
   * a server, "/v1/loco/part/R/A/...") at its host, with its signature
   * (sig not present: none); called in place of loco_server_put. */
  pulse_status (*upload)(void *user, const char *path, const uint8_t *data,
                         size_t size, const loco_sig *sig);
  void *upload_user;
  /* Authentication (NULL: none; the collaboration's, collab_auth.c):
   * sign fills *sig for a blob of `kind` this trainer publishes for the
   * round at `path` ("/v1/loco/part/R/A/WHAT": the signature covers it, so
   * a blob of another attempt or place does not pass; 0: it could not,
   * the blob goes unsigned); accept says whether a fetched blob of `kind`
   * from `path` (NULL: a client's whole payload, its bytes alone) carries
   * trainer id's signature for the round (refusals counted there). A
   * refused blob is as one that never came. */
  int (*sign)(void *user, pulse_loco_auth_kind kind, uint64_t round,
              const char *path, const void *data, size_t size, loco_sig *sig);
  int (*accept)(void *user, pulse_loco_auth_kind kind, uint64_t round,
                uint32_t id, const char *path, const loco_sig *sig,
                const void *data, size_t size);
  void *auth_user;
  uint32_t timeout_ms;       /* the whole exchange */
  uint32_t check_period;     /* 0 or 1: every range recomputed by another
                                trainer every round (the default); p > 1:
                                range k in rounds r with r % p == k % p
                                (pulse_loco_plan_round_checker; cheaper, a
                                wrong range can then pass) */
  int receipts_only;         /* no recomputation at all: only each sender's
                                receipt and the blobs' consistency */
  uint32_t max_attempts;     /* runs without the offenders (0 means 2) */
  /* A verdict that has not come by the deadline does not fail the round:
   * a trainer that holds every reduced range and whose verdicts in hand
   * name no offender finishes (a peer that died mid-exchange sends none;
   * the collaboration's rule). Safe against a dead peer, not against a
   * dead peer plus a wrong owner that only its verdict would have shown:
   * then trainers that got that verdict drop the owner and those that did
   * not keep it. 0: every serving trainer's verdict is required. */
  int lenient_verdicts;
  /* Tests only: as an owner, publish a reduction with one average changed
   * (and correct receipts), as a wrong or malicious owner would. */
  int test_wrong_reduction;
} loco_partition_in;

#define LOCO_PARTITION_MAX_OFFENDERS 16u

typedef struct {
  uint64_t bytes_in;  /* bodies fetched by this trainer */
  uint64_t bytes_out; /* bodies its server answered during the call */
  uint64_t slice_bytes_in, reduced_bytes_in, check_bytes_in, verdict_bytes_in;
  uint64_t own_payload; /* the prepared payload's size, for comparison */
  uint32_t attempts;
  uint64_t range_start, range_end; /* this trainer's range, last attempt's
                                      plan (the active plan) */
  uint32_t verdicts_missing; /* lenient_verdicts: finished without them */
  uint32_t contributors; /* averaged in the end */
  int self_included;
  size_t noffenders;
  uint32_t offenders[LOCO_PARTITION_MAX_OFFENDERS]; /* owners dropped */
} loco_partition_out;

/** Runs the partitioned exchange of ctx's prepared round with every other
 * trainer of C (each calls it with the same arrays) and finishes the
 * round: theta_g, b and e as pulse_loco_finish over C minus the offenders,
 * bit for bit.
 * @return PULSE_OK; PULSE_ERR_IO (a peer's blob did not come in time);
 * PULSE_ERR_CORRUPT (still offenders after max_attempts, or this trainer
 * was found one); PULSE_ERR_ARG; on error ctx stays prepared. */
pulse_status loco_partition_round(const loco_partition_in *in,
                                  loco_partition_out *out);

/* floor(a * b / c) for c > 0 and a result below 2^64, in integers only
 * (the plans' arithmetic: the same on every trainer). */
uint64_t loco_mul_div(uint64_t a, uint64_t b, uint64_t c);

/* Tests only (a process killed mid-exchange): in round
 * loco_partition_test_stall_round the trainer with id
 * loco_partition_test_stall_id stops for good (sleeps until killed) once
 * it published its slices (phase 1) or its reduced range (phase 2) of
 * attempt 0, or (phase 3) waits 1.5 s before fetching the other owners'
 * reduced ranges. Phase 0: never (the default). */
extern uint32_t loco_partition_test_stall_id;
extern uint64_t loco_partition_test_stall_round;
extern int loco_partition_test_stall_phase;

#endif
