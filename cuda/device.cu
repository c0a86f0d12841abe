/* device.cu - the device: run-time detection, which device a call runs on
 * and its stream, memory helpers, workspaces (device slots and pinned host
 * staging) and the device copy of tensor tables. */
#include <pthread.h>
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

/* ------------------------------------------------- devices and streams */

/* Engines: per device, the stream a call given no stream runs on. Made on
 * first use (non-blocking: it never waits for, nor holds up, the legacy
 * NULL stream), kept for the process's life. */
#define PULSE_MAX_DEVICES 64
static pthread_mutex_t engine_lock = PTHREAD_MUTEX_INITIALIZER;
static cudaStream_t engine_stream[PULSE_MAX_DEVICES];

static pulse_status engine_stream_of(int device, cudaStream_t *out) {
  pulse_status st = PULSE_OK;
  if (device < 0 || device >= PULSE_MAX_DEVICES)
    return pulse_fail(PULSE_ERR_CUDA, "device %d: more than %d devices",
                      device, PULSE_MAX_DEVICES);
  pthread_mutex_lock(&engine_lock);
  if (engine_stream[device] == NULL) {
    cudaStream_t s = NULL;
    cudaError_t err = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      st = pulse_fail(PULSE_ERR_CUDA, "device %d: its stream: %s", device,
                      cudaGetErrorString(err));
    } else {
      engine_stream[device] = s;
    }
  }
  *out = engine_stream[device];
  pthread_mutex_unlock(&engine_lock);
  return st;
}

struct pulse_cuda_workspace {
  int device; /* -1 until its first call binds it */
  void *ptr[PULSE_WS_SLOTS];
  size_t size[PULSE_WS_SLOTS];
  void *pin[PULSE_PIN_SLOTS]; /* pinned host staging */
  size_t pin_size[PULSE_PIN_SLOTS];
  cudaEvent_t pin_free[PULSE_PIN_SLOTS]; /* after the last copy from it */
};

extern "C" pulse_status pulse_cuda_device_of(const void *ptr_d, int *device) {
  pulse_status st = PULSE_OK;
  cudaPointerAttributes attr;
  if (device == NULL)
    return pulse_fail(PULSE_ERR_ARG, "device of: NULL output");
  *device = -1;
  if (ptr_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "device of: NULL pointer");
  PULSE_TRY(pulse_cuda_require_("device of"));
  memset(&attr, 0, sizeof attr);
  PULSE_CUDA_CHECK(cudaPointerGetAttributes(&attr, ptr_d));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return pulse_fail(PULSE_ERR_ARG, "%p is not CUDA device memory", ptr_d);
  *device = attr.device;
cleanup:
  if (st != PULSE_OK)
    (void)cudaGetLastError();
  return st;
}

extern "C" int pulse_cuda_device_count(void) {
  int count = 0;
  if (!pulse_cuda_available())
    return 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

extern "C" pulse_status pulse_cuda_set_device(int device) {
  pulse_status st = PULSE_OK;
  PULSE_TRY(pulse_cuda_require_("set device"));
  if (device < 0 || device >= pulse_cuda_device_count())
    return pulse_fail(PULSE_ERR_ARG, "set device: no device %d", device);
  PULSE_CUDA_CHECK(cudaSetDevice(device));
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_get_device(int *device) {
  pulse_status st = PULSE_OK;
  if (device == NULL)
    return pulse_fail(PULSE_ERR_ARG, "get device: NULL output");
  *device = -1;
  PULSE_TRY(pulse_cuda_require_("get device"));
  PULSE_CUDA_CHECK(cudaGetDevice(device));
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_stream_create(void **out) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = NULL;
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "stream create: NULL output");
  *out = NULL;
  PULSE_TRY(pulse_cuda_require_("stream create"));
  PULSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  *out = (void *)s;
cleanup:
  return st;
}

extern "C" void pulse_cuda_stream_free(void *stream) {
  if (stream != NULL && pulse_cuda_available())
    (void)cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" pulse_status pulse_cuda_check_ptr_(const void *ptr_d, int device,
                                              const char *what) {
  int owner = -1;
  if (ptr_d == NULL)
    return PULSE_OK;
  if (pulse_cuda_device_of(ptr_d, &owner) != PULSE_OK)
    return pulse_fail(PULSE_ERR_ARG, "%s: %p is not CUDA device memory", what,
                      ptr_d);
  if (owner != device)
    return pulse_fail(PULSE_ERR_ARG,
                      "%s: memory of device %d in a call on device %d", what,
                      owner, device);
  return PULSE_OK;
}

extern "C" pulse_status pulse_cuda_enter_(pulse_cuda_workspace *ws,
                                          const void *ptr_d, void *stream,
                                          const char *what,
                                          pulse_cuda_at *at) {
  pulse_status st = PULSE_OK;
  cudaStream_t s = (cudaStream_t)stream;
  int current = 0, device = 0;
  at->device = -1;
  at->previous = -1;
  at->stream = NULL;
  PULSE_TRY(pulse_cuda_require_(what));
  PULSE_CUDA_CHECK(cudaGetDevice(&current));
  device = ws != NULL && ws->device >= 0 ? ws->device : current;
  if (ptr_d != NULL) {
    if (pulse_cuda_device_of(ptr_d, &device) != PULSE_OK)
      return pulse_fail(PULSE_ERR_ARG, "%s: %p is not CUDA device memory",
                        what, ptr_d);
    if (ws != NULL && ws->device >= 0 && ws->device != device)
      return pulse_fail(PULSE_ERR_ARG,
                        "%s: a workspace of device %d given memory of device "
                        "%d (one workspace per device)",
                        what, ws->device, device);
  }
  if (device != current) {
    PULSE_CUDA_CHECK(cudaSetDevice(device));
    at->previous = current;
  }
  at->device = device;
  if (s == NULL)
    PULSE_CHECK(engine_stream_of(device, &s));
  at->stream = (void *)s;
  if (ws != NULL && ws->device < 0)
    ws->device = device;
cleanup:
  if (st != PULSE_OK)
    pulse_cuda_leave_(at);
  return st;
}

extern "C" void pulse_cuda_leave_(pulse_cuda_at *at) {
  if (at->previous >= 0)
    (void)cudaSetDevice(at->previous);
  at->previous = -1;
}

extern "C" pulse_status pulse_cuda_reenter_(int device, void *stream,
                                            pulse_cuda_at *at) {
  pulse_status st = PULSE_OK;
  int current = 0;
  at->device = device;
  at->previous = -1;
  at->stream = stream;
  PULSE_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) {
    PULSE_CUDA_CHECK(cudaSetDevice(device));
    at->previous = current;
  }
cleanup:
  return st;
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
  pulse_cuda_at at;
  if (ptr_d == NULL || !pulse_cuda_available())
    return;
  /* On the device that owns it. */
  if (pulse_cuda_enter_(NULL, ptr_d, NULL, "cuda free", &at) == PULSE_OK) {
    (void)cudaFree(ptr_d);
    pulse_cuda_leave_(&at);
  }
}

static pulse_status copy(void *dst, const void *src, size_t bytes,
                         cudaMemcpyKind kind, int wait, void *stream,
                         const char *what) {
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  const void *dev_ptr = kind == cudaMemcpyHostToDevice ? dst : src;
  at.previous = -1;
  if ((dst == NULL || src == NULL) && bytes > 0)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL pointer", what);
  PULSE_TRY(pulse_cuda_require_(what));
  if (bytes == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_cuda_enter_(NULL, dev_ptr, stream, what, &at));
  if (kind == cudaMemcpyDeviceToDevice)
    PULSE_CHECK(pulse_cuda_check_ptr_(dst, at.device, what));
  PULSE_CUDA_CHECK(
      cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)at.stream));
  if (wait)
    PULSE_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)at.stream));
cleanup:
  pulse_cuda_leave_(&at);
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
  pulse_cuda_at at;
  at.previous = -1;
  if (dst_d == NULL && bytes > 0)
    return pulse_fail(PULSE_ERR_ARG, "cuda fill: NULL pointer");
  PULSE_TRY(pulse_cuda_require_("cuda fill"));
  if (bytes == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_cuda_enter_(NULL, dst_d, stream, "cuda fill", &at));
  PULSE_CUDA_CHECK(
      cudaMemsetAsync(dst_d, byte, bytes, (cudaStream_t)at.stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

extern "C" pulse_status pulse_cuda_sync(void *stream) {
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  at.previous = -1;
  PULSE_TRY(pulse_cuda_enter_(NULL, NULL, stream, "cuda sync", &at));
  PULSE_CUDA_CHECK(cudaStreamSynchronize((cudaStream_t)at.stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

extern "C" pulse_status pulse_cuda_h2d_(int device, void *dst_d,
                                        const void *src, size_t bytes,
                                        void *stream) {
  pulse_status st = PULSE_OK;
  pulse_cuda_at at;
  if (bytes == 0)
    return PULSE_OK;
  PULSE_TRY(pulse_cuda_reenter_(device, stream, &at));
  PULSE_CUDA_CHECK(cudaMemcpyAsync(dst_d, src, bytes, cudaMemcpyHostToDevice,
                                   (cudaStream_t)stream));
cleanup:
  pulse_cuda_leave_(&at);
  return st;
}

/* ------------------------------------------------------------ workspace */

extern "C" pulse_status
pulse_cuda_workspace_create(pulse_cuda_workspace **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "workspace: NULL output");
  *out = NULL;
  PULSE_TRY(pulse_cuda_require_("workspace"));
  pulse_cuda_workspace *ws = (pulse_cuda_workspace *)calloc(1, sizeof *ws);
  if (ws == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "workspace");
  ws->device = -1;
  *out = ws;
  return PULSE_OK;
}

extern "C" void pulse_cuda_workspace_free(pulse_cuda_workspace *ws) {
  pulse_cuda_at at;
  if (ws == NULL)
    return;
  at.previous = -1;
  if (ws->device >= 0)
    (void)pulse_cuda_reenter_(ws->device, NULL, &at);
  for (unsigned i = 0; i < PULSE_PIN_SLOTS; i++) {
    if (ws->pin_free[i] != NULL) {
      (void)cudaEventSynchronize(ws->pin_free[i]);
      (void)cudaEventDestroy(ws->pin_free[i]);
    }
    if (ws->pin[i] != NULL)
      (void)cudaFreeHost(ws->pin[i]);
  }
  for (unsigned i = 0; i < PULSE_WS_SLOTS; i++)
    if (ws->ptr[i] != NULL)
      (void)cudaFree(ws->ptr[i]);
  pulse_cuda_leave_(&at);
  free(ws);
}

/* Room to grow: a steady state whose sizes wander a little allocates
 * nothing after its first call. */
static size_t with_slack(size_t bytes) {
  return bytes + (bytes / 4 < SIZE_MAX - bytes ? bytes / 4 : 0);
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
  size_t want = with_slack(bytes);
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

extern "C" pulse_status pulse_cuda_pin_get_(pulse_cuda_workspace *ws,
                                            unsigned slot, size_t bytes,
                                            void **out) {
  pulse_status st = PULSE_OK;
  void *p = NULL;
  size_t want = 0;
  *out = NULL;
  if (ws == NULL || slot >= PULSE_PIN_SLOTS)
    return pulse_fail(PULSE_ERR_INTERNAL, "workspace: pinned slot %u", slot);
  if (bytes < 256)
    bytes = 256;
  /* The device may still read what the last call queued from it. */
  if (ws->pin_free[slot] != NULL)
    PULSE_CUDA_CHECK(cudaEventSynchronize(ws->pin_free[slot]));
  if (ws->pin_size[slot] >= bytes) {
    *out = ws->pin[slot];
    return PULSE_OK;
  }
  if (ws->pin_free[slot] == NULL)
    PULSE_CUDA_CHECK(cudaEventCreateWithFlags(&ws->pin_free[slot],
                                              cudaEventDisableTiming));
  if (ws->pin[slot] != NULL)
    (void)cudaFreeHost(ws->pin[slot]);
  ws->pin[slot] = NULL;
  ws->pin_size[slot] = 0;
  want = with_slack(bytes);
  if (cudaHostAlloc(&p, want, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();
    return pulse_fail(PULSE_ERR_NOMEM, "workspace: %zu bytes of pinned memory",
                      want);
  }
  ws->pin[slot] = p;
  ws->pin_size[slot] = want;
  *out = p;
cleanup:
  return st;
}

extern "C" pulse_status pulse_cuda_pin_queued_(pulse_cuda_workspace *ws,
                                               unsigned slot, void *stream) {
  pulse_status st = PULSE_OK;
  if (ws == NULL || slot >= PULSE_PIN_SLOTS || ws->pin_free[slot] == NULL)
    return PULSE_OK;
  PULSE_CUDA_CHECK(cudaEventRecord(ws->pin_free[slot], (cudaStream_t)stream));
cleanup:
  return st;
}

extern "C" int pulse_cuda_ws_device_(const pulse_cuda_workspace *ws) {
  return ws != NULL ? ws->device : -1;
}

/* --------------------------------------------------------------- tables */

static uint64_t blocks_of(uint64_t n, uint32_t log2) {
  return n ? ((n - 1) >> log2) + 1 : 0;
}

pulse_status pulse_table_upload(pulse_cuda_workspace *ws, unsigned which,
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
  /* Built in pinned staging, so the upload is a plain DMA that does not
   * hold the host up. */
  PULSE_TRY(pulse_cuda_pin_get_(
      ws, which == PULSE_WS_IDX_TABLE ? PULSE_PIN_IDX_TABLE : PULSE_PIN_TABLE,
      bytes, (void **)&blob));
  memset(blob, 0, bytes);
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
  PULSE_CHECK(pulse_cuda_ws_get_(ws, which, bytes, &dev));
  PULSE_CUDA_CHECK(cudaMemcpyAsync(dev, blob, bytes, cudaMemcpyHostToDevice,
                                   (cudaStream_t)stream));
  PULSE_CHECK(pulse_cuda_pin_queued_(
      ws, which == PULSE_WS_IDX_TABLE ? PULSE_PIN_IDX_TABLE : PULSE_PIN_TABLE,
      stream));
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
