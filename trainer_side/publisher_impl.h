/* publisher_impl.h - private to the publisher: its state and the pieces of
 * a commit shared by publisher*.c. */
#ifndef PULSE_PUBLISHER_IMPL_H
#define PULSE_PUBLISHER_IMPL_H

#include <pthread.h>

#include "pulse_publisher.h"
#include "pulse_store.h"

/* A background anchor write. */
typedef struct {
  struct pulse_pub *pub;
  uint64_t step;
  pulse_state_digest digest;
  pulse_status status;
  char detail[512];
  pulse_store_object obj;
  double seconds;
} pub_anchor_job;

struct pulse_pub {
  char *dir;
  pulse_pub_opts opts; /* opts.tensors points at `info` */
  size_t count;
  pulse_tensor_info *info; /* names owned */
  uint64_t *numel;
  uint64_t params;
  uint16_t **snap; /* NULL before the first commit */
  pulse_tensor_digest *digests;
  pulse_tensor_digest *scratch_digests;
  pulse_state_digest state_digest;
  pulse_store_head *head; /* NULL before the first commit */
  pulse_changes *changes;
  pulse_encode_tensor *enc;
  uint64_t last_anchor_step;
  /* background anchor: running, or finished and not yet named by a head */
  pthread_t anchor_thread;
  int anchor_running;
  pub_anchor_job job;
  int pending_ready;
  pulse_store_object pending;
  /* objects the head stopped naming, removed after the head's hook */
  pulse_store_object *garbage;
  size_t ngarbage, garbage_cap;
};

/** Writes the state (table order) as an anchor object: staged under a
 * temporary name, hashed, renamed to objects/<sha256>.safetensors. */
pulse_status pub_anchor_write(const char *dir, const pulse_tensor_info *info,
                              size_t count, uint16_t *const *bits,
                              uint64_t step, const pulse_state_digest *digest,
                              pulse_store_object *out);

/** Starts the background anchor of the current snapshot (step `step`). */
pulse_status pub_anchor_start(pulse_pub *pub, uint64_t step);

/** Waits for a running background anchor; a finished one becomes pending
 * (a failed one is logged and dropped). */
void pub_anchor_join(pulse_pub *pub);

/** Builds, signs, self-checks and writes the head of the given fields and
 * replaces pub->head; the objects the previous head or the lists named that
 * this one does not are queued for pub_remove_garbage. Retention is applied
 * to the lists first. */
pulse_status pub_head_write(pulse_pub *pub, uint64_t step,
                            const pulse_state_digest *digest,
                            const pulse_store_object *patches, size_t npatches,
                            const pulse_store_object *anchors, size_t nanchors);

/** Removes the queued objects (after the head's hook has run). */
void pub_remove_garbage(pulse_pub *pub);

#endif /* PULSE_PUBLISHER_IMPL_H */
