/* bench_impl.h - private to pulse-bench: the modes' entry points and the
 * pieces of `pulse-bench codec` (baselines, entropy bound). */
#ifndef PULSE_BENCH_IMPL_H
#define PULSE_BENCH_IMPL_H

#include <stdint.h>
#include <stdio.h>

#include "pulse_codec.h"

/* ------------------------------------------------------------------ modes */

/* A mode's main: argv[0] is the mode name. Returns the process exit code:
 * 0 success, 1 failure (a check or an I/O error), 2 bad usage. */
int bench_codec_main(int argc, char **argv);
int bench_trajectory_main(int argc, char **argv);
void bench_trajectory_usage(FILE *out);
void bench_codec_usage(FILE *out);
int bench_sync_main(int argc, char **argv); void bench_sync_usage(FILE *out);
int bench_demo_main(int argc, char **argv);
void bench_demo_usage(FILE *out);
int bench_serve_main(int argc, char **argv);
void bench_serve_usage(FILE *out);
int bench_loco_main(int argc, char **argv); void bench_loco_usage(FILE *out);
int bench_gpu_main(int argc, char **argv); void bench_gpu_usage(FILE *out);

/* ---------------------------------------------------------- tensor table */

/* The tensors of one benchmark state, all in flat arrays in table order:
 * tensor i holds elements [offset[i], offset[i] + numel[i]). */
typedef struct {
  size_t count;
  pulse_tensor_info *info; /* dtype PULSE_DTYPE_BF16 (the published state) */
  uint64_t *numel;
  uint64_t *offset;
  uint64_t total; /* sum of numel */
} bench_table;

/* ------------------------------------------------------------- baselines */

/* Sizes in bytes of the reference encodings of one step's changes. Each
 * sparse encoding lays out, per tensor in table order, its positions
 * (tensor-local) and then its values; a "+ zstd-1" size is ZSTD level 1 over
 * the whole step's buffer. */
typedef struct {
  uint64_t dense;           /* every BF16 value: 2 bytes per parameter */
  uint64_t dense_zstd;      /* the new BF16 state through zstd-1 */
  uint64_t int32_bf16;      /* uint32 index + absolute BF16 value: 6/change */
  uint64_t int32_bf16_zstd; /* the same through zstd-1 */
  /* LEB128 varint gaps (pos - prev - 1) + absolute BF16 values, zstd-1: a
   * proxy of the published production format. */
  uint64_t delta_abs_zstd;
  /* LEB128 varint gaps + (old XOR new) split into a low and a high byte
   * plane, zstd-1. */
  uint64_t gap_xor_zstd;
} bench_baseline_bytes;

/** Computes every baseline size for one step. `changes` has t->count
 * entries (tensor-local positions); `new_bf16` is the new state (t->total
 * values). Single-threaded.
 * @return PULSE_OK, PULSE_ERR_NOMEM, or PULSE_ERR_INTERNAL (zstd failed). */
pulse_status bench_baselines_compute(const bench_table *t,
                                     const pulse_changes *changes,
                                     const uint16_t *new_bf16,
                                     bench_baseline_bytes *out);

/* ---------------------------------------------------------- entropy bound */

/* One line naming the model of the bound, for the output. */
#define BENCH_BOUND_MODEL                                                      \
  "positions: order-0 per (tensor, old exponent class = pulse_bf16_class), "   \
  "sum n_c*H2(k_c/n_c); values: order-0 entropy of "                           \
  "pulse_zigzag16(pulse_bf16_delta) over the whole step"

/* Empirical entropies of one step's changes, in bits. */
typedef struct {
  double positions_class_bits;  /* sum over (tensor, class) n_c*H2(k_c/n_c) */
  double positions_tensor_bits; /* sum over tensors n*H2(k/n), for context */
  double values_bits;           /* order-0 entropy of the zig-zag deltas */
  /* the same within each old exponent class, for context: a coder that
   * conditions values on the class can go below the bound */
  double values_class_bits;
} bench_entropy_bits;

/** Computes the entropies of one step: `old_bf16` is the base state
 * (t->total values), `changes` has t->count entries.
 * @return PULSE_OK or PULSE_ERR_NOMEM. */
pulse_status bench_entropy_compute(const bench_table *t,
                                   const uint16_t *old_bf16,
                                   const pulse_changes *changes,
                                   bench_entropy_bits *out);

#endif /* PULSE_BENCH_IMPL_H */
