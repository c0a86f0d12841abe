/* emu_counts.h - what the CUDA emulator (emu_runtime.cc) counted, for tests
 * written in C: the runtime calls a steady state must not make. Only the
 * emulator defines pulse_emu_counts_get; tests declare it weak and skip
 * where it is absent (a real device). */
#ifndef PULSE_EMU_COUNTS_H
#define PULSE_EMU_COUNTS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  uint64_t device_allocs; /* cudaMalloc */
  uint64_t device_frees;  /* cudaFree */
  uint64_t host_allocs;   /* cudaHostAlloc (pinned) */
  uint64_t host_frees;    /* cudaFreeHost */
  uint64_t device_syncs;  /* cudaDeviceSynchronize */
  uint64_t null_stream;   /* work or a synchronization on the NULL stream */
  uint64_t streams_made;  /* cudaStreamCreateWithFlags */
  uint64_t events_made;   /* cudaEventCreateWithFlags */
  uint64_t launches;      /* kernels */
  uint64_t copies;        /* cudaMemcpyAsync */
  uint64_t pinned_copies; /* of them, from or to cudaHostAlloc memory */
  uint64_t set_device;    /* cudaSetDevice to another device than current */
} pulse_emu_counts;

/** What the emulator counted since the process started. */
void pulse_emu_counts_get(pulse_emu_counts *out);

#ifdef __cplusplus
}
#endif
#endif
