/* cuda_stub.c - the CUDA entry points of a build without CUDA: each says so
 * with PULSE_ERR_NOT_BUILT (the CPU references in loco_ref.c and the host
 * helpers in chunks.c are built in both). */
#include <string.h>

#include "cuda_impl.h"
#include "pulse_cuda.h"
#include "status_impl.h"

#define NOT_BUILT(what)                                                        \
  pulse_fail(PULSE_ERR_NOT_BUILT,                                              \
             "%s: pulse was built without CUDA (PULSE_CUDA=OFF or no nvcc)",   \
             what)

int pulse_cuda_available(void) {
  return 0;
}

const char *pulse_cuda_unavailable_reason(void) {
  return "pulse was built without CUDA (PULSE_CUDA=OFF or no nvcc)";
}

int pulse_cuda_device_count(void) {
  return 0;
}

pulse_status pulse_cuda_device_of(const void *ptr_d, int *device) {
  (void)ptr_d;
  if (device != NULL)
    *device = -1;
  return NOT_BUILT("device of");
}

pulse_status pulse_cuda_set_device(int device) {
  (void)device;
  return NOT_BUILT("set device");
}

pulse_status pulse_cuda_get_device(int *device) {
  if (device != NULL)
    *device = -1;
  return NOT_BUILT("get device");
}

pulse_status pulse_cuda_stream_create(void **out) {
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("stream create");
}

void pulse_cuda_stream_free(void *stream) {
  (void)stream;
}

pulse_status pulse_cuda_alloc(void **out_d, size_t bytes) {
  (void)bytes;
  if (out_d != NULL)
    *out_d = NULL;
  return NOT_BUILT("cuda alloc");
}

void pulse_cuda_free(void *ptr_d) {
  (void)ptr_d;
}

pulse_status pulse_cuda_upload(void *dst_d, const void *src, size_t bytes,
                               void *stream) {
  (void)dst_d, (void)src, (void)bytes, (void)stream;
  return NOT_BUILT("cuda upload");
}

pulse_status pulse_cuda_download(void *dst, const void *src_d, size_t bytes,
                                 void *stream) {
  (void)dst, (void)src_d, (void)bytes, (void)stream;
  return NOT_BUILT("cuda download");
}

pulse_status pulse_cuda_copy(void *dst_d, const void *src_d, size_t bytes,
                             void *stream) {
  (void)dst_d, (void)src_d, (void)bytes, (void)stream;
  return NOT_BUILT("cuda copy");
}

pulse_status pulse_cuda_fill(void *dst_d, int byte, size_t bytes,
                             void *stream) {
  (void)dst_d, (void)byte, (void)bytes, (void)stream;
  return NOT_BUILT("cuda fill");
}

pulse_status pulse_cuda_sync(void *stream) {
  (void)stream;
  return NOT_BUILT("cuda sync");
}

pulse_status pulse_cuda_workspace_create(pulse_cuda_workspace **out) {
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("workspace");
}

void pulse_cuda_workspace_free(pulse_cuda_workspace *ws) {
  (void)ws;
}

pulse_status pulse_cuda_detect(pulse_cuda_workspace *ws,
                               const pulse_cuda_detect_tensor *table,
                               size_t count, const pulse_cuda_detect_opts *opts,
                               const pulse_cuda_changes *out,
                               uint64_t *tensor_changes, uint64_t *total,
                               void *stream) {
  (void)ws, (void)table, (void)count, (void)opts, (void)out,
      (void)tensor_changes, (void)stream;
  if (total != NULL)
    *total = 0;
  return NOT_BUILT("cuda detect");
}

pulse_status pulse_cuda_digest(pulse_cuda_workspace *ws,
                               const pulse_cuda_bf16_tensor *table,
                               size_t count, pulse_tensor_digest *digests,
                               void *stream) {
  (void)ws, (void)table, (void)count, (void)digests, (void)stream;
  return NOT_BUILT("cuda digest");
}

pulse_status pulse_cuda_changes_digest(
    pulse_cuda_workspace *ws, const uint64_t *tensor_first, size_t count,
    const uint64_t *pos_d, const uint16_t *old_d, const uint16_t *new_d,
    pulse_tensor_digest *moves, void *stream) {
  (void)ws, (void)tensor_first, (void)count, (void)pos_d, (void)old_d,
      (void)new_d, (void)moves, (void)stream;
  return NOT_BUILT("cuda changes digest");
}

pulse_status pulse_cuda_scatter(pulse_cuda_workspace *ws,
                                const pulse_cuda_bf16_tensor *table,
                                size_t count, const uint64_t *tensor_first,
                                const uint64_t *pos_d, const uint16_t *new_d,
                                void *stream) {
  (void)ws, (void)table, (void)count, (void)tensor_first, (void)pos_d,
      (void)new_d, (void)stream;
  return NOT_BUILT("cuda scatter");
}

pulse_status pulse_cuda_class_index_build(const pulse_cuda_bf16_tensor *table,
                                          size_t count, uint32_t chunk_log2,
                                          void *stream,
                                          pulse_cuda_class_index **out) {
  (void)table, (void)count, (void)chunk_log2, (void)stream;
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("cuda class index");
}

void pulse_cuda_class_index_free(pulse_cuda_class_index *idx) {
  (void)idx;
}

const uint32_t *pulse_cuda_class_index_hist(const pulse_cuda_class_index *idx,
                                            uint64_t *chunks) {
  (void)idx;
  if (chunks != NULL)
    *chunks = 0;
  return NULL;
}

pulse_status pulse_cuda_locate(pulse_cuda_class_index *idx,
                               const uint64_t *chunk_first, const uint8_t *cls,
                               const uint32_t *rank, uint64_t *pos_d,
                               void *stream) {
  (void)idx, (void)chunk_first, (void)cls, (void)rank, (void)pos_d,
      (void)stream;
  return NOT_BUILT("cuda locate");
}

pulse_status pulse_cuda_patch_encode(pulse_cuda_workspace *ws,
                                     const pulse_encode_opts *opts,
                                     const pulse_cuda_encode_tensor *tensors,
                                     size_t count, int update_snapshot,
                                     void *stream, pulse_buffer *out,
                                     pulse_tensor_digest *target_digests) {
  (void)ws, (void)opts, (void)tensors, (void)count, (void)update_snapshot,
      (void)stream, (void)target_digests;
  if (out != NULL) {
    out->data = NULL;
    out->size = 0;
  }
  return NOT_BUILT("cuda encode");
}

pulse_status pulse_cuda_patch_apply(pulse_cuda_workspace *ws,
                                    const pulse_patch *patch,
                                    const pulse_cuda_target *targets,
                                    size_t count, const pulse_apply_opts *opts,
                                    void *stream,
                                    pulse_tensor_digest *digests) {
  (void)ws, (void)patch, (void)targets, (void)count, (void)opts, (void)stream,
      (void)digests;
  return NOT_BUILT("cuda apply");
}

pulse_status pulse_cuda_patch_stream_begin(pulse_cuda_workspace *ws, const pulse_patch *patch,
                                           const pulse_cuda_target *targets, size_t count,
                                           const pulse_apply_opts *opts, void *stream,
                                           pulse_cuda_patch_stream **out) {
  (void)ws, (void)patch, (void)targets, (void)count, (void)opts, (void)stream;
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("cuda apply");
}

void pulse_cuda_patch_stream_feed(pulse_cuda_patch_stream *s, size_t avail) {
  (void)s, (void)avail;
}

pulse_status pulse_cuda_patch_stream_finish(pulse_cuda_patch_stream *s) {
  (void)s;
  return NOT_BUILT("cuda apply");
}

pulse_status pulse_cuda_patch_stream_commit(pulse_cuda_patch_stream *s,
                                            pulse_tensor_digest *digests) {
  (void)s, (void)digests;
  return NOT_BUILT("cuda apply");
}

void pulse_cuda_patch_stream_free(pulse_cuda_patch_stream *s) { (void)s; }

pulse_status pulse_cuda_changes_shift_(const uint64_t *pos_d, const uint16_t *new_d,
                                       uint64_t count, uint64_t base, uint64_t *out_pos_d,
                                       uint16_t *out_new_d, void *stream) {
  (void)pos_d, (void)new_d, (void)count, (void)base, (void)out_pos_d, (void)out_new_d,
      (void)stream;
  return NOT_BUILT("cuda shift changes");
}

pulse_status pulse_cuda_patch_stream_changes_(const pulse_cuda_patch_stream *s, size_t tensor,
                                              const uint64_t **pos_d, const uint16_t **new_d,
                                              uint64_t *count) {
  (void)s, (void)tensor;
  if (pos_d != NULL)
    *pos_d = NULL;
  if (new_d != NULL)
    *new_d = NULL;
  if (count != NULL)
    *count = 0;
  return NOT_BUILT("cuda apply");
}

pulse_status pulse_cuda_loco_gate(pulse_cuda_workspace *ws,
                                  const float *theta_g_d,
                                  const float *theta_r_d, float *e_d,
                                  uint64_t n, uint64_t capacity,
                                  uint64_t *pos_d, float *value_d,
                                  uint64_t *sent, void *stream) {
  (void)ws, (void)theta_g_d, (void)theta_r_d, (void)e_d, (void)n,
      (void)capacity, (void)pos_d, (void)value_d, (void)stream;
  if (sent != NULL)
    *sent = 0;
  return NOT_BUILT("cuda loco gate");
}

pulse_status pulse_cuda_fp8_quantize(pulse_cuda_workspace *ws,
                                     const uint16_t *bf16_d,
                                     const pulse_cuda_fp8_tensor *t,
                                     void *stream) {
  (void)ws, (void)bf16_d, (void)t, (void)stream;
  return NOT_BUILT("cuda fp8 quantize");
}

pulse_status pulse_cuda_fp8_track_create(const uint16_t *bf16_d,
                                         const pulse_cuda_fp8_tensor *t,
                                         void *stream,
                                         pulse_cuda_fp8_track **out) {
  (void)bf16_d, (void)t, (void)stream;
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("cuda fp8 track");
}

void pulse_cuda_fp8_track_free(pulse_cuda_fp8_track *track) { (void)track; }

pulse_status pulse_cuda_fp8_track_requantize(pulse_cuda_fp8_track *track,
                                             void *stream) {
  (void)track, (void)stream;
  return NOT_BUILT("cuda fp8 requantize");
}

pulse_status pulse_cuda_fp8_track_stage(pulse_cuda_fp8_track *track,
                                        const uint64_t *pos_d,
                                        const uint16_t *new_d, uint64_t count,
                                        void *stream) {
  (void)track, (void)pos_d, (void)new_d, (void)count, (void)stream;
  return NOT_BUILT("cuda fp8 stage");
}

pulse_status pulse_cuda_fp8_track_commit(pulse_cuda_fp8_track *track,
                                         void *stream,
                                         pulse_fp8_stage_figures *figures) {
  (void)track, (void)stream;
  if (figures != NULL)
    memset(figures, 0, sizeof *figures);
  return NOT_BUILT("cuda fp8 commit");
}

void pulse_cuda_fp8_track_drop(pulse_cuda_fp8_track *track) { (void)track; }

/* The device stages of an apply, one by one (cuda_impl.h): pulse-bench gpu
 * times them, and links in every build. */
pulse_status pulse_cuda_changes_digest_in_(pulse_cuda_workspace *ws,
                                           const uint64_t *tensor_first,
                                           size_t count, const uint64_t *pos_d,
                                           const uint16_t *old_d,
                                           const uint16_t *new_d,
                                           pulse_tensor_digest *moves,
                                           void *stream) {
  (void)ws, (void)tensor_first, (void)count, (void)pos_d, (void)old_d,
      (void)new_d, (void)moves, (void)stream;
  return NOT_BUILT("cuda changes digest");
}

pulse_status pulse_cuda_scatter_in_(pulse_cuda_workspace *ws,
                                    const pulse_cuda_bf16_tensor *table,
                                    size_t count, const uint64_t *tensor_first,
                                    const uint64_t *pos_d,
                                    const uint16_t *new_d, void *stream) {
  (void)ws, (void)table, (void)count, (void)tensor_first, (void)pos_d,
      (void)new_d, (void)stream;
  return NOT_BUILT("cuda scatter");
}

pulse_status pulse_cuda_class_index_build_in_(
    pulse_cuda_workspace *ws, const pulse_cuda_bf16_tensor *table, size_t count,
    uint32_t chunk_log2, void *stream, pulse_cuda_class_index **out) {
  (void)ws, (void)table, (void)count, (void)chunk_log2, (void)stream;
  if (out != NULL)
    *out = NULL;
  return NOT_BUILT("cuda class index");
}

pulse_status pulse_cuda_locate_in_(pulse_cuda_class_index *idx,
                                   const uint64_t *chunk_first_d,
                                   const uint64_t *keys_d, uint64_t entries,
                                   uint64_t *pos_d, void *stream) {
  (void)idx, (void)chunk_first_d, (void)keys_d, (void)entries, (void)pos_d,
      (void)stream;
  return NOT_BUILT("cuda locate");
}

pulse_status pulse_cuda_gather_(pulse_cuda_workspace *ws,
                                const pulse_cuda_bf16_tensor *table,
                                size_t count, const uint64_t *tensor_first,
                                const uint64_t *pos_d, const uint16_t *delta_d,
                                uint16_t *old_d, uint16_t *new_d, void *stream) {
  (void)ws, (void)table, (void)count, (void)tensor_first, (void)pos_d,
      (void)delta_d, (void)old_d, (void)new_d, (void)stream;
  return NOT_BUILT("cuda gather");
}
