/* emu_runtime.cc - the scheduler and runtime of emu_cuda.h (see there). */
#include "emu_cuda.h"
#include "emu_counts.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if !defined(__x86_64__)
#error "the CUDA emulator switches stacks with x86-64 assembly"
#endif

/* Saves the callee-saved registers on the current stack, stores the stack
 * pointer in *save and resumes the stack at `load`. */
extern "C" void emu_switch(void **save, void *load);
__asm__(".text\n"
        ".globl emu_switch\n"
        ".type emu_switch,@function\n"
        "emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size emu_switch, .-emu_switch\n");

emu_dim3 emu_block_idx, emu_block_dim, emu_grid_dim;

void emu_fatal(const char *what) {
  fprintf(stderr, "CUDA emulator: %s\n", what);
  abort();
}

namespace {

[[noreturn]] void fatal(const char *what) {
  emu_fatal(what);
}

enum State { RUN, WAIT_WARP, WAIT_BLOCK, DONE };
enum Op { OP_SYNCWARP, OP_BALLOT, OP_MATCH, OP_SHFL_XOR };

const size_t kStack = 256 * 1024;
const size_t kGuard = 4096;

struct Thread {
  void *sp = nullptr;
  char *mem = nullptr; /* guard page, then the stack */
  emu_dim3 tid = {0, 0, 0};
  State state = DONE;
  Op op = OP_SYNCWARP;
  unsigned mask = 0;
  uint64_t value = 0;
  int arg = 0;
  uint64_t result = 0;
};

std::vector<Thread> threads;
Thread *current = nullptr;
void *sched_sp = nullptr;
const void *sched_bottom = nullptr;
size_t sched_size = 0;
std::function<void()> *kernel = nullptr;
/* The order threads run in: PULSE_EMU_SEED picks another one. */
std::mt19937_64 rng(getenv("PULSE_EMU_SEED")
                        ? strtoull(getenv("PULSE_EMU_SEED"), nullptr, 10)
                        : 12345u);
bool launching = false;
cudaError_t last_error = cudaSuccess;

/* The runtime is called from several host threads (the patch stream's
 * decode threads queue copies): one lock around it; kernels run under it. */
std::recursive_mutex api_lock;
#define EMU_API std::lock_guard<std::recursive_mutex> emu_api_guard_(api_lock)

struct Allocation {
  size_t bytes;
  int device;
};
std::map<uintptr_t, Allocation> allocations; /* device memory */
std::map<uintptr_t, size_t> pinned;          /* cudaHostAlloc memory */
thread_local int current_device = 0;
pulse_emu_counts counts;

struct Stream {
  int device;
};
struct Event {
  int device;
};
std::set<const void *> streams, events;

char *stack_base(Thread *t) {
  return t->mem + kGuard;
}

extern "C" void emu_thread_main(void);

/* Scheduler -> thread. */
void resume(Thread *t) {
  void *fake = nullptr;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&fake, stack_base(t), kStack);
#endif
  current = t;
  emu_switch(&sched_sp, t->sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  current = nullptr;
}

/* Thread -> scheduler; returns when the scheduler resumes it. */
void yield(void) {
  Thread *t = current;
  void *fake = nullptr;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(&fake, sched_bottom, sched_size);
#endif
  emu_switch(&t->sp, sched_sp);
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

extern "C" void emu_thread_main(void) {
#if EMU_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &sched_bottom, &sched_size);
#endif
  (*kernel)();
  Thread *t = current;
  t->state = DONE;
#if EMU_ASAN
  __sanitizer_start_switch_fiber(nullptr, sched_bottom, sched_size);
#endif
  void *dead = nullptr;
  emu_switch(&dead, sched_sp);
  fatal("a finished thread was resumed");
}

void start(Thread *t, unsigned tid) {
  if (t->mem == nullptr) {
    void *m = mmap(nullptr, kGuard + kStack, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      fatal("no memory for a thread stack");
    mprotect(m, kGuard, PROT_NONE); /* a stack overflow faults */
    t->mem = (char *)m;
  }
#if EMU_ASAN
  /* A finished thread's frames leave their poison behind. */
  __asan_unpoison_memory_region(stack_base(t), kStack);
#endif
  /* emu_switch pops six registers and returns into emu_thread_main, which
   * then sees the stack as if called (rsp % 16 == 8). */
  uintptr_t top = ((uintptr_t)stack_base(t) + kStack) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)(top - 64);
  for (int i = 0; i < 8; i++)
    sp[i] = 0;
  sp[6] = (uint64_t)(uintptr_t)&emu_thread_main;
  t->sp = sp;
  t->tid = {tid, 0, 0};
  t->state = RUN;
}

/* Waits at a warp collective and returns this lane's result. */
uint64_t collective(Op op, unsigned mask, uint64_t value, int arg) {
  Thread *t = current;
  if (t == nullptr)
    fatal("a warp intrinsic outside a kernel");
  if (mask != 0xFFFFFFFFu)
    fatal("a warp collective without the full mask (not emulated)");
  t->state = WAIT_WARP;
  t->op = op;
  t->mask = mask;
  t->value = value;
  t->arg = arg;
  yield();
  return t->result;
}

/* Resolves warps whose 32 lanes all wait at one collective. */
bool resolve_warps(unsigned block) {
  bool any = false;
  for (unsigned w = 0; w < block / 32; w++) {
    Thread *lane = &threads[w * 32];
    int waiting = 0, done = 0;
    for (int l = 0; l < 32; l++) {
      waiting += lane[l].state == WAIT_WARP;
      done += lane[l].state == DONE;
    }
    if (waiting == 0)
      continue;
    if (waiting != 32) {
      if (done > 0)
        fatal("a lane ended while others of its warp wait at a collective");
      continue; /* others are at __syncthreads: deadlock is reported later */
    }
    for (int l = 1; l < 32; l++)
      if (lane[l].op != lane[0].op)
        fatal("lanes of a warp wait at different collectives");
    for (int l = 0; l < 32; l++) {
      uint64_t r = 0;
      switch (lane[0].op) {
      case OP_SYNCWARP:
        break;
      case OP_BALLOT:
        for (int k = 0; k < 32; k++)
          r |= (uint64_t)(lane[k].value != 0) << k;
        break;
      case OP_MATCH:
        for (int k = 0; k < 32; k++)
          r |= (uint64_t)(lane[k].value == lane[l].value) << k;
        break;
      case OP_SHFL_XOR: {
        int width = 32, src = l ^ lane[l].arg;
        if (src / width != l / width)
          src = l; /* outside the segment: own value */
        r = lane[src].value;
        break;
      }
      }
      lane[l].result = r;
    }
    for (int l = 0; l < 32; l++)
      lane[l].state = RUN;
    any = true;
  }
  return any;
}

bool resolve_block(unsigned block) {
  unsigned waiting = 0, done = 0;
  for (unsigned i = 0; i < block; i++) {
    waiting += threads[i].state == WAIT_BLOCK;
    done += threads[i].state == DONE;
  }
  if (waiting == 0 || waiting + done != block)
    return false;
  for (unsigned i = 0; i < block; i++)
    if (threads[i].state == WAIT_BLOCK)
      threads[i].state = RUN;
  return true;
}

void run_block(unsigned block) {
  std::vector<unsigned> order(block);
  for (;;) {
    order.clear();
    for (unsigned i = 0; i < block; i++)
      if (threads[i].state == RUN)
        order.push_back(i);
    std::shuffle(order.begin(), order.end(), rng);
    for (unsigned i : order)
      resume(&threads[i]);
    bool all_done = true;
    for (unsigned i = 0; i < block; i++)
      all_done = all_done && threads[i].state == DONE;
    if (all_done)
      return;
    bool moved = resolve_warps(block);
    moved = resolve_block(block) || moved;
    if (!moved)
      fatal("deadlock: threads wait at barriers that can never complete");
  }
}

} // namespace

namespace {

/* The allocation holding [p, p + bytes), or NULL. */
const Allocation *allocation_of(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  auto it = allocations.upper_bound(a);
  if (it == allocations.begin())
    return nullptr;
  --it;
  if (a >= it->first && a + bytes <= it->first + it->second.bytes)
    return &it->second;
  return nullptr;
}

bool is_pinned(const void *p, size_t bytes) {
  uintptr_t a = (uintptr_t)p;
  auto it = pinned.upper_bound(a);
  if (it == pinned.begin())
    return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

} // namespace

bool emu_is_device(const void *p, size_t bytes) {
  EMU_API;
  const Allocation *al = allocation_of(p, bytes);
  if (al != nullptr && al->device != current_device)
    fatal("device memory of another device than the current one");
  return al != nullptr;
}

void emu_stream_use(cudaStream_t stream, const char *what) {
  EMU_API;
  if (stream == nullptr) {
    counts.null_stream++;
    return;
  }
  if (streams.count(stream) == 0)
    fatal("a stream that cudaStreamCreateWithFlags did not make (or "
          "destroyed)");
  if (((Stream *)stream)->device != current_device) {
    fprintf(stderr, "CUDA emulator: %s\n", what);
    fatal("work queued on a stream of another device than the current one");
  }
}

namespace {

void check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  bool dd = emu_is_device(dst, bytes), sd = emu_is_device(src, bytes);
  bool ok = kind == cudaMemcpyDefault ||
            (kind == cudaMemcpyHostToDevice && dd && !sd) ||
            (kind == cudaMemcpyDeviceToHost && !dd && sd) ||
            (kind == cudaMemcpyDeviceToDevice && dd && sd) ||
            (kind == cudaMemcpyHostToHost && !dd && !sd);
  if (!ok)
    fatal("cudaMemcpy with pointers that do not match its kind (or past an "
          "allocation)");
}

} // namespace

const emu_dim3 &emu_thread_idx(void) {
  if (current == nullptr)
    fatal("threadIdx outside a kernel");
  return current->tid;
}

void emu_launch(unsigned grid, unsigned block, cudaStream_t stream,
                std::function<void()> fn) {
  EMU_API;
  emu_stream_use(stream, "a kernel launch");
  counts.launches++;
  if (launching)
    fatal("a launch inside a kernel");
  if (grid == 0 || block == 0 || block % 32 != 0 || block > 1024)
    fatal("launch configuration not emulated (block must be 32..1024, a "
          "multiple of 32)");
  launching = true;
  kernel = &fn;
  if (threads.size() < block)
    threads.resize(block);
  emu_block_dim = {block, 1, 1};
  emu_grid_dim = {grid, 1, 1};
  /* Blocks in a random order too: none may depend on another. */
  std::vector<unsigned> order(grid);
  for (unsigned b = 0; b < grid; b++)
    order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  for (unsigned b : order) {
    emu_block_idx = {b, 0, 0};
    for (unsigned i = 0; i < block; i++)
      start(&threads[i], i);
    run_block(block);
  }
  kernel = nullptr;
  launching = false;
}

void __syncthreads(void) {
  Thread *t = current;
  if (t == nullptr)
    fatal("__syncthreads outside a kernel");
  t->state = WAIT_BLOCK;
  yield();
}

void __syncwarp(unsigned mask) {
  (void)collective(OP_SYNCWARP, mask, 0, 0);
}

unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)collective(OP_BALLOT, mask, predicate != 0, 0);
}

unsigned __match_any_sync(unsigned mask, unsigned value) {
  return (unsigned)collective(OP_MATCH, mask, value, 0);
}

unsigned __match_any_sync(unsigned mask, unsigned long long value) {
  return (unsigned)collective(OP_MATCH, mask, value, 0);
}

unsigned long long __shfl_xor_sync(unsigned mask, unsigned long long value,
                                   int lane_mask, int width) {
  if (width != 32)
    fatal("__shfl_xor_sync width other than 32 is not emulated");
  return collective(OP_SHFL_XOR, mask, value, lane_mask);
}

unsigned __shfl_xor_sync(unsigned mask, unsigned value, int lane_mask,
                         int width) {
  return (unsigned)__shfl_xor_sync(mask, (unsigned long long)value, lane_mask,
                                   width);
}

/* ------------------------------------------------------------ runtime API */

static cudaError_t fail(cudaError_t e) {
  last_error = e;
  return e;
}

static int device_count(void) {
  /* PULSE_EMU_NO_DEVICE=1: a machine whose driver sees no device. */
  const char *none = getenv("PULSE_EMU_NO_DEVICE");
  if (none != nullptr && strcmp(none, "1") == 0)
    return 0;
  const char *n = getenv("PULSE_EMU_DEVICES");
  int k = n != nullptr ? atoi(n) : 2;
  return k < 1 ? 1 : k > 8 ? 8 : k;
}

cudaError_t cudaGetDeviceCount(int *count) {
  EMU_API;
  *count = device_count();
  return *count == 0 ? fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
  EMU_API;
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  EMU_API;
  if (device < 0 || device >= device_count())
    return fail(cudaErrorInvalidDevice);
  if (device != current_device)
    counts.set_device++;
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *attr,
                                     const void *ptr) {
  EMU_API;
  memset(attr, 0, sizeof *attr);
  attr->device = -2;
  const Allocation *al = allocation_of(ptr, 1);
  if (al != nullptr) {
    attr->type = cudaMemoryTypeDevice;
    attr->device = al->device;
    attr->devicePointer = (void *)ptr;
  } else if (is_pinned(ptr, 1)) {
    attr->type = cudaMemoryTypeHost;
    attr->device = current_device;
    attr->hostPointer = attr->devicePointer = (void *)ptr;
  } else {
    attr->type = cudaMemoryTypeUnregistered;
    attr->hostPointer = (void *)ptr;
  }
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
  EMU_API;
  *ptr = nullptr;
  if (bytes == 0)
    return cudaSuccess;
  counts.device_allocs++;
  void *p = malloc(bytes);
  if (p == nullptr)
    return fail(cudaErrorMemoryAllocation);
  memset(p, 0xA5, bytes); /* device memory starts as garbage */
  allocations[(uintptr_t)p] = Allocation{bytes, current_device};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  EMU_API;
  if (ptr == nullptr)
    return cudaSuccess;
  counts.device_frees++;
  auto it = allocations.find((uintptr_t)ptr);
  if (it == allocations.end())
    fatal("cudaFree of a pointer cudaMalloc did not return");
  allocations.erase(it);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void **ptr, size_t bytes, unsigned flags) {
  EMU_API;
  (void)flags;
  *ptr = nullptr;
  counts.host_allocs++;
  void *p = malloc(bytes ? bytes : 1);
  if (p == nullptr)
    return fail(cudaErrorMemoryAllocation);
  memset(p, 0x5A, bytes);
  pinned[(uintptr_t)p] = bytes ? bytes : 1;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
  EMU_API;
  if (ptr == nullptr)
    return cudaSuccess;
  counts.host_frees++;
  auto it = pinned.find((uintptr_t)ptr);
  if (it == pinned.end())
    fatal("cudaFreeHost of a pointer cudaHostAlloc did not return");
  pinned.erase(it);
  free(ptr);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
  EMU_API;
  if ((flags & cudaStreamNonBlocking) == 0)
    fatal("a blocking stream (it would wait for the legacy NULL stream)");
  counts.streams_made++;
  Stream *s = new Stream{current_device};
  streams.insert(s);
  *stream = (cudaStream_t)s;
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  EMU_API;
  if (streams.erase(stream) == 0)
    fatal("cudaStreamDestroy of a stream that does not exist");
  delete (Stream *)stream;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
  EMU_API;
  (void)flags;
  counts.events_made++;
  Event *e = new Event{current_device};
  events.insert(e);
  *event = (cudaEvent_t)e;
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  EMU_API;
  if (events.erase(event) == 0)
    fatal("cudaEventDestroy of an event that does not exist");
  delete (Event *)event;
  return cudaSuccess;
}

static void check_event(cudaEvent_t event) {
  if (events.count(event) == 0)
    fatal("an event that cudaEventCreateWithFlags did not make (or "
          "destroyed)");
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  EMU_API;
  check_event(event);
  emu_stream_use(stream, "cudaEventRecord");
  if (((Event *)event)->device != current_device)
    fatal("cudaEventRecord of an event of another device");
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  EMU_API;
  check_event(event);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                unsigned flags) {
  EMU_API;
  (void)flags;
  check_event(event);
  emu_stream_use(stream, "cudaStreamWaitEvent");
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes,
                            cudaMemcpyKind kind, cudaStream_t stream) {
  EMU_API;
  emu_stream_use(stream, "cudaMemcpyAsync");
  counts.copies++;
  if (bytes == 0)
    return cudaSuccess;
  if (is_pinned(dst, bytes) || is_pinned(src, bytes))
    counts.pinned_copies++;
  check_copy(dst, src, bytes, kind);
  memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes,
                       cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, 0);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes,
                            cudaStream_t stream) {
  EMU_API;
  emu_stream_use(stream, "cudaMemsetAsync");
  if (bytes == 0)
    return cudaSuccess;
  if (!emu_is_device(dst, bytes))
    fatal("cudaMemset of memory cudaMalloc did not return (or past it)");
  memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  EMU_API;
  if (stream == nullptr)
    counts.null_stream++;
  else if (streams.count(stream) == 0)
    fatal("cudaStreamSynchronize of a stream that does not exist");
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  EMU_API;
  counts.device_syncs++;
  return cudaSuccess;
}

extern "C" void pulse_emu_counts_get(pulse_emu_counts *out) {
  EMU_API;
  *out = counts;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  return last_error;
}

const char *cudaGetErrorString(cudaError_t err) {
  switch (err) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  case cudaErrorInvalidResourceHandle:
    return "invalid resource handle";
  }
  return "unknown error";
}
