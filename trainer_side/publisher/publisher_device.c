/* publisher_device.c - the publisher's snapshot on the device: commits of
 * tensors in GPU memory encode with pulse_cuda_patch_encode against a BF16
 * snapshot kept in device memory, so that only the change lists cross the
 * bus; the host copy of the snapshot catches up (one download) when an
 * anchor or a host commit needs it (publisher_impl.h). Built the same with
 * or without CUDA: without it, pulse_cuda_* say PULSE_ERR_NOT_BUILT, and
 * the commit refuses device tensors before any of this runs. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "publisher_impl.h"
#include "pulse_log.h"
#include "status_impl.h"

/* Tensors start on 256-byte boundaries of the snapshot block. */
#define SNAP_ALIGN_ELEMS 128u

pulse_status pub_device_download(pulse_pub *pub) {
  if (!pub->device_current || pub->snap_d == NULL)
    return pulse_fail(PULSE_ERR_INTERNAL,
                      "publisher: no current device snapshot to download");
  for (size_t i = 0; i < pub->count; i++)
    if (pub->numel[i] > 0)
      PULSE_TRY(pulse_cuda_download(pub->snap[i], pub->snap_d[i],
                                    (size_t)pub->numel[i] * 2,
                                    pub->opts.cuda_stream));
  return PULSE_OK;
}

/* Neither copy is current (a device commit failed after its encoder had
 * moved the device snapshot): the store holds the head's state. */
static pulse_status rebuild(pulse_pub *pub) {
  pulse_store_state s = PULSE_STORE_STATE_INIT;
  PULSE_TRY(pulse_store_state_rebuild(pub->dir, pub->head,
                                      pulse_store_head_step(pub->head),
                                      pub->opts.threads, &s));
  pulse_status st = PULSE_OK;
  if (s.count != pub->count ||
      memcmp(s.state_digest.bytes, pub->state_digest.bytes, 32) != 0)
    st = pulse_fail(PULSE_ERR_CORRUPT,
                    "publisher: %s: the store's head is not the publisher's",
                    pub->dir);
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++)
    if (pub->numel[i] > 0)
      memcpy(pub->snap[i], s.bits[i], (size_t)pub->numel[i] * 2);
  pulse_store_state_free(&s);
  if (st == PULSE_OK)
    PULSE_LOG_AT(PULSE_LOG_INFO,
                 "publisher: %s: snapshot of step %" PRIu64
                 " rebuilt from the store",
                 pub->dir, pulse_store_head_step(pub->head));
  return st;
}

pulse_status pub_host_current(pulse_pub *pub) {
  pub_snapshot_wait(pub); /* a host commit's move, in the background */
  if (pub->host_current)
    return PULSE_OK;
  if (pub->snap == NULL || pub->head == NULL)
    return pulse_fail(PULSE_ERR_INTERNAL, "publisher: no snapshot");
  pub_anchor_join(pub); /* it reads pub->snap */
  pulse_status st =
      pub->device_current ? pub_device_download(pub) : rebuild(pub);
  if (st == PULSE_OK)
    pub->host_current = 1;
  return st;
}

/* Allocates the device snapshot (first device commit) and uploads the
 * host's. */
static pulse_status device_current(pulse_pub *pub) {
  if (pub->device_current)
    return PULSE_OK;
  PULSE_TRY(pub_host_current(pub));
  if (pub->snap_block_d == NULL) {
    uint64_t elems = 0;
    for (size_t i = 0; i < pub->count; i++) {
      uint64_t n = (pub->numel[i] + SNAP_ALIGN_ELEMS - 1) / SNAP_ALIGN_ELEMS *
                   SNAP_ALIGN_ELEMS;
      if (n < pub->numel[i] || elems > UINT64_MAX / 2 - n)
        return pulse_fail(PULSE_ERR_OVERFLOW, "publisher: device snapshot");
      elems += n;
    }
    if (elems > SIZE_MAX / 2)
      return pulse_fail(PULSE_ERR_OVERFLOW, "publisher: device snapshot");
    pub->snap_d = calloc(pub->count + 1, sizeof *pub->snap_d);
    pub->stage_d = calloc(pub->count + 1, sizeof *pub->stage_d);
    pub->stage_bytes = calloc(pub->count + 1, sizeof *pub->stage_bytes);
    pulse_status st = PULSE_OK;
    if (!pub->snap_d || !pub->stage_d || !pub->stage_bytes)
      st = pulse_fail(PULSE_ERR_NOMEM, "publisher: device snapshot table");
    else /* one block of at least 2 bytes: every tensor has an address */
      st = pulse_cuda_alloc(&pub->snap_block_d,
                            elems > 0 ? (size_t)elems * 2 : 2);
    if (st != PULSE_OK) {
      pub_device_free(pub); /* nothing allocated on the device yet */
      return st;
    }
    uint16_t *at = pub->snap_block_d;
    for (size_t i = 0; i < pub->count; i++) {
      pub->snap_d[i] = at;
      at += (pub->numel[i] + SNAP_ALIGN_ELEMS - 1) / SNAP_ALIGN_ELEMS *
            SNAP_ALIGN_ELEMS;
    }
  }
  for (size_t i = 0; i < pub->count; i++)
    if (pub->numel[i] > 0)
      PULSE_TRY(pulse_cuda_upload(pub->snap_d[i], pub->snap[i],
                                  (size_t)pub->numel[i] * 2,
                                  pub->opts.cuda_stream));
  pub->device_current = 1;
  return PULSE_OK;
}

/* A host tensor of a mixed commit, uploaded to its staging buffer (kept
 * between commits, grown on demand). */
static pulse_status stage(pulse_pub *pub, size_t i, const pulse_pub_tensor *t,
                          const void **out_d) {
  size_t bytes = (size_t)pub->numel[i] * pulse_dtype_size(t->dtype);
  *out_d = NULL;
  if (bytes == 0)
    return PULSE_OK;
  if (pub->stage_bytes[i] < bytes) {
    pulse_cuda_free(pub->stage_d[i]);
    pub->stage_d[i] = NULL;
    pub->stage_bytes[i] = 0;
    PULSE_TRY(pulse_cuda_alloc(&pub->stage_d[i], bytes));
    pub->stage_bytes[i] = bytes;
  }
  PULSE_TRY(pulse_cuda_upload(pub->stage_d[i], t->data, bytes,
                              pub->opts.cuda_stream));
  *out_d = pub->stage_d[i];
  return PULSE_OK;
}

/* The device of the commit's device tensors; it is made current while the
 * device snapshot and staging are allocated (pulse_cuda_alloc allocates on
 * the current device), the caller's restored after. */
static pulse_status use_tensors_device(pulse_pub *pub,
                                       const pulse_pub_tensor *t,
                                       int *previous) {
  int device = -1;
  *previous = -1;
  for (size_t i = 0; i < pub->count && device < 0; i++)
    if (t[i].memory == PULSE_PUB_DEVICE && pub->numel[i] > 0)
      PULSE_TRY(pulse_cuda_device_of(t[i].data, &device));
  if (device < 0)
    return PULSE_OK;
  int current = -1;
  PULSE_TRY(pulse_cuda_get_device(&current));
  if (current != device) {
    PULSE_TRY(pulse_cuda_set_device(device));
    *previous = current;
  }
  return PULSE_OK;
}

static pulse_status device_encode(pulse_pub *pub, const pulse_pub_tensor *t,
                                  const pulse_encode_opts *eo,
                                  pulse_buffer *patch);

pulse_status pub_device_encode(pulse_pub *pub, const pulse_pub_tensor *t,
                               const pulse_encode_opts *eo,
                               pulse_buffer *patch) {
  int previous = -1;
  PULSE_TRY(use_tensors_device(pub, t, &previous));
  pulse_status st = device_encode(pub, t, eo, patch);
  if (previous >= 0)
    (void)pulse_cuda_set_device(previous);
  return st;
}

static pulse_status device_encode(pulse_pub *pub, const pulse_pub_tensor *t,
                                  const pulse_encode_opts *eo,
                                  pulse_buffer *patch) {
  PULSE_TRY(device_current(pub));
  if (pub->ws == NULL)
    PULSE_TRY(pulse_cuda_workspace_create(&pub->ws));
  pulse_cuda_encode_tensor *enc = calloc(pub->count + 1, sizeof *enc);
  if (enc == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "publisher: device table");
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < pub->count && st == PULSE_OK; i++) {
    enc[i].info = pub->info[i];
    enc[i].cur_d = t[i].data;
    enc[i].cur_dtype = t[i].dtype;
    enc[i].snapshot_d = pub->snap_d[i];
    enc[i].base_digest = &pub->digests[i];
    if (t[i].memory == PULSE_PUB_HOST)
      st = stage(pub, i, &t[i], &enc[i].cur_d);
  }
  /* The device snapshot moves to the step once the patch exists; whoever
   * fails later marks it stale (the host copy, or the store, has the base). */
  if (st == PULSE_OK)
    st = pulse_cuda_patch_encode(pub->ws, eo, enc, pub->count, 1,
                                 pub->opts.cuda_stream, patch,
                                 pub->scratch_digests);
  free(enc);
  /* The encoder leaves the snapshot as it was on failure, but a CUDA error
   * in its last step (the scatter) could leave it half moved: upload it again
   * at the next device commit rather than trust it. */
  if (st != PULSE_OK)
    pub->device_current = 0;
  return st;
}

pulse_status pub_device_fetch(const pulse_pub *pub, size_t i,
                              const pulse_pub_tensor *t, void *dst) {
  size_t bytes = (size_t)pub->numel[i] * pulse_dtype_size(t->dtype);
  return bytes == 0 ? PULSE_OK
                    : pulse_cuda_download(dst, t->data, bytes,
                                          pub->opts.cuda_stream);
}

void pub_device_free(pulse_pub *pub) {
  for (size_t i = 0; pub->stage_d != NULL && i < pub->count; i++)
    pulse_cuda_free(pub->stage_d[i]);
  pulse_cuda_free(pub->snap_block_d);
  pulse_cuda_workspace_free(pub->ws);
  free(pub->snap_d), free(pub->stage_d), free(pub->stage_bytes);
  pub->snap_block_d = NULL;
  pub->snap_d = NULL;
  pub->stage_d = NULL;
  pub->stage_bytes = NULL;
  pub->ws = NULL;
  pub->device_current = 0;
}
