/* device.cu - the device: run-time detection, memory helpers, workspaces and
 * the device copy of tensor tables. */
#include <stdlib.h>
#include <string.h>

#include "common.cuh"

#ifndef PULSE_CUDA_EMU
#include <cub/device/device_scan.cuh>
#endif

/* ------------------------------------------------------------ detection */

static int probed = 0;
static int available = 0;
static const char *reason = "";

static void probe(void) {
  if (probed)
    return;
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    (void)cudaGetLastError(); /* not sticky: forget it */
    reason = "no CUDA device";
    available = 0;
  } else {
    available = 1;
  }
  probed = 1;
}

extern "C" int pulse_cuda_available(void) {
  probe();
  return available;
}

extern "C" const char *pulse_cuda_unavailable_reason(void) {
  probe();
  return reason;
}

extern "C" pulse_status pulse_cuda_require_(const char *what) {
  if (!pulse_cuda_available())
    return pulse_fail(PULSE_ERR_CUDA, "%s: no CUDA device", what);
  /* A failed call of the caller's (not sticky) would otherwise be reported
   * by our first cudaGetLastError after a launch. */
  (void)cudaGetLastError();
  return PULSE_OK;
}

/* --------------------------------------------------------------- memory */

static pulse_status malloc_status(cudaError_t err, size_t bytes,
                                  const char *what) {
  (void)cudaGetLastError();
  return pulse_fail(
      err == cudaErrorMemoryAllocation ? PULSE_ERR_NOMEM : PULSE_ERR_CUDA,
      "%s: cudaMalloc of %zu bytes: %s", what, bytes, cudaGetErrorString(err));
}

extern "C" pulse_status pulse_cuda_alloc(void **out_d, size_t bytes) {
  if (out_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "cuda alloc: NULL output");
  *out_d = NULL;
  if (bytes == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_cuda_require_("cuda alloc"));
  cudaError_t err = cudaMalloc(out_d, bytes);
  if (err != cudaSuccess) {
    *out_d = NULL;
    return malloc_status(err, bytes, "cuda alloc");
  }
  return PULSE_OK;
}

extern "C" void pulse_cuda_free(void *ptr_d) {
  if (ptr_d != NULL && pulse_cuda_available())
    (void)cudaFree(ptr_d);
}

static pulse_status copy(void *dst, const void *src, size_t bytes,
                         cudaMemcpyKind kind, int wait, void *stream,
                         const char *what) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  if ((dst == NULL || src == NULL) && bytes > 0)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL pointer", what);
  PULSE_TRY(pulse_cuda_require_(what));
  if (bytes > 0)
    PULSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (wait)
    PULSE_CUDA_CHECK(cudaStreamSynchronize(s));
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_upload(void *dst_d, const void *src,
                                          size_t bytes, void *stream) {
  return copy(dst_d, src, bytes, cudaMemcpyHostToDevice, 1, stream,
              "cuda upload");
}

extern "C" pulse_status pulse_cuda_download(void *dst, const void *src_d,
                                            size_t bytes, void *stream) {
  return copy(dst, src_d, bytes, cudaMemcpyDeviceToHost, 1, stream,
              "cuda download");
}

extern "C" pulse_status pulse_cuda_copy(void *dst_d, const void *src_d,
                                        size_t bytes, void *stream) {
  return copy(dst_d, src_d, bytes, cudaMemcpyDeviceToDevice, 0, stream,
              "cuda copy");
}

extern "C" pulse_status pulse_cuda_fill(void *dst_d, int byte, size_t bytes,
                                        void *stream) {
  pulse_status st = PULSE_OK;
  if (dst_d == NULL && bytes > 0)
    return pulse_fail(PULSE_ERR_ARG, "cuda fill: NULL pointer");
  PULSE_TRY(pulse_cuda_require_("cuda fill"));
  if (bytes > 0)
    PULSE_CUDA_CHECK(cudaMemsetAsync(dst_d, byte, bytes, (cudaStream_t)stream));
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_sync(void *stream) {
  pulse_status st = PULSE_OK;
  PULSE_TRY(pulse_cuda_require_("cuda sync"));
  PULSE_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)stream));
cleanup:
  return st;
}

/* ------------------------------------------------------------ workspace */

struct pulse_cuda_workspace {
  void *ptr[PULSE_WS_SLOTS];
  size_t size[PULSE_WS_SLOTS];
};

extern "C" pulse_status
pulse_cuda_workspace_create(pulse_cuda_workspace **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "workspace: NULL output");
  *out = NULL;
  PULSE_TRY(pulse_cuda_require_("workspace"));
  pulse_cuda_workspace *ws = (pulse_cuda_workspace *)calloc(1, sizeof *ws);
  if (ws == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "workspace");
  *out = ws;
  return PULSE_OK;
}

extern "C" void pulse_cuda_workspace_free(pulse_cuda_workspace *ws) {
  if (ws == NULL)
    return;
  for (unsigned i = 0; i < PULSE_WS_SLOTS; i++)
    if (ws->ptr[i] != NULL)
      (void)cudaFree(ws->ptr[i]);
  free(ws);
}

extern "C" pulse_status pulse_cuda_ws_get_(pulse_cuda_workspace *ws,
                                           unsigned slot, size_t bytes,
                                           void **out_d) {
  *out_d = NULL;
  if (ws == NULL || slot >= PULSE_WS_SLOTS)
    return pulse_fail(PULSE_ERR_INTERNAL, "workspace: slot %u", slot);
  if (bytes < 256)
    bytes = 256;
  if (ws->size[slot] >= bytes) {
    *out_d = ws->ptr[slot];
    return PULSE_OK;
  }
  if (ws->ptr[slot] != NULL)
    (void)cudaFree(ws->ptr[slot]); /* waits for the device */
  ws->ptr[slot] = NULL;
  ws->size[slot] = 0;
  size_t want =
      bytes + (bytes / 8 < SIZE_MAX - bytes ? bytes / 8 : 0); /* room to grow */
  void *p = NULL;
  cudaError_t err = cudaMalloc(&p, want);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    want = bytes;
    err = cudaMalloc(&p, want);
  }
  if (err != cudaSuccess)
    return malloc_status(err, want, "workspace");
  ws->ptr[slot] = p;
  ws->size[slot] = want;
  *out_d = p;
  return PULSE_OK;
}

/* --------------------------------------------------------------- tables */

static uint64_t blocks_of(uint64_t n, uint32_t log2) {
  return n ? ((n - 1) >> log2) + 1 : 0;
}

pulse_status pulse_table_upload(pulse_cuda_workspace *ws,
                                const pulse_table_desc *desc, void *stream,
                                pulse_dev_table *out) {
  pulse_status st = PULSE_OK;
  size_t T = desc->count;
  size_t words = 0, bytes = 0;
  uint64_t *blob = NULL;
  void *dev = NULL;
  uint64_t *cur = NULL, *base = NULL, *numel = NULL, *tile_first = NULL,
           *chunk_first = NULL, *entry_first = NULL;
  uint32_t tile_log2 = pulse_tile_log2(desc->chunk_log2);
  memset(out, 0, sizeof *out);
  if (T >= UINT32_MAX)
    return pulse_fail(PULSE_ERR_ARG, "table of %zu tensors", T);
  words = 3 * T + 3 * (T + 1);
  bytes = words * sizeof(uint64_t) + T + 8;
  blob = (uint64_t *)calloc(1, bytes);
  if (blob == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "table of %zu tensors", T);
  cur = blob;
  base = cur + T;
  numel = base + T;
  tile_first = numel + T;
  chunk_first = tile_first + T + 1;
  entry_first = chunk_first + T + 1;
  for (size_t t = 0; t < T; t++) {
    uint64_t n = desc->numel ? desc->numel[t] : 0;
    uint64_t tiles = blocks_of(n, tile_log2);
    uint64_t chunks = blocks_of(n, desc->chunk_log2);
    cur[t] = desc->cur ? (uint64_t)(uintptr_t)desc->cur[t] : 0;
    base[t] = desc->base ? (uint64_t)(uintptr_t)desc->base[t] : 0;
    numel[t] = desc->numel ? desc->numel[t] : 0;
    if (tiles > UINT64_MAX - tile_first[t] ||
        chunks > UINT64_MAX - chunk_first[t]) {
      st = pulse_fail(PULSE_ERR_OVERFLOW, "table: element counts overflow");
      goto cleanup;
    }
#ifdef PULSE_CUDA_EMU
    /* Every tensor must be device memory of its whole size. */
    if (n > 0 &&
        ((cur[t] && !emu_is_device((const void *)(uintptr_t)cur[t],
                                   n * pulse_dtype_size(desc->dtype[t]))) ||
         (base[t] && !emu_is_device((const void *)(uintptr_t)base[t], n * 2))))
      emu_fatal("a tensor that is not device memory of its size");
#endif
    tile_first[t + 1] = tile_first[t] + tiles;
    chunk_first[t + 1] = chunk_first[t] + chunks;
    ((uint8_t *)(entry_first + T + 1))[t] =
        desc->dtype ? (uint8_t)desc->dtype[t] : 0;
  }
  for (size_t t = 0; t <= T; t++)
    entry_first[t] = desc->entry_first ? desc->entry_first[t] : 0;
  PULSE_CHECK(pulse_cuda_ws_get_(ws, PULSE_WS_TABLE, bytes, &dev));
  /* From pageable memory the copy is staged before cudaMemcpyAsync returns,
   * so the blob may be freed right after. */
  PULSE_CUDA_CHECK(cudaMemcpyAsync(dev, blob, bytes, cudaMemcpyHostToDevice,
                                   (cudaStream_t)stream));
  out->cur = (const uint64_t *)dev;
  out->base = out->cur + T;
  out->numel = out->base + T;
  out->tile_first = out->numel + T;
  out->chunk_first = out->tile_first + T + 1;
  out->entry_first = out->chunk_first + T + 1;
  out->dtype = (const uint8_t *)(out->entry_first + T + 1);
  out->count = (uint32_t)T;
  out->tile_log2 = tile_log2;
  out->chunk_log2 = desc->chunk_log2;
  out->tiles = tile_first[T];
  out->chunks = chunk_first[T];
  out->entries = entry_first[T];
cleanup:
  free(blob);
  return st;
}

/* ----------------------------------------------------------------- scan */

pulse_status pulse_scan_u64(pulse_cuda_workspace *ws, const uint64_t *in,
                            uint64_t *out, uint64_t n, cudaStream_t stream) {
  pulse_status st = PULSE_OK;
  size_t temp_bytes = 0;
  void *temp = NULL;
  if (n == 0)
    return PULSE_OK;
  PULSE_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(NULL, temp_bytes, in, out, n, stream));
  PULSE_CHECK(pulse_cuda_ws_get_(ws, PULSE_WS_SCAN, temp_bytes, &temp));
  PULSE_CUDA_CHECK(
      cub::DeviceScan::ExclusiveSum(temp, temp_bytes, in, out, n, stream));
cleanup:
  return st;
}
