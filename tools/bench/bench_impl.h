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
/* `pulse-bench loco` with collaboration flags (bench_loco_collab.c). */
int bench_loco_collab_main(int argc, char **argv);
void bench_loco_collab_usage(FILE *out);
int bench_topology_main(int argc, char **argv);
void bench_topology_usage(FILE *out);
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

/* The zstd levels every compressed baseline is measured at: the fast one,
 * zstd's default and a slow strong one. */
#define BENCH_ZSTD_LEVELS 3
#define BENCH_ZSTD_LEVEL(i) ((i) == 0 ? 1 : (i) == 1 ? 3 : 19)

/* Dense BF16 through zstd-19 runs at a few MB/s: a state larger than this
 * is compressed at level 19 on BENCH_Z19_SLICES evenly spaced slices of
 * this many bytes in all, and the size scaled to the whole state (said in
 * the output; such a figure is never "the baseline"). */
#define BENCH_Z19_DENSE_SAMPLE ((uint64_t)8 << 20)
#define BENCH_Z19_SLICES 16

/* The encodings compressed by zstd. Each sparse one lays out, per tensor in
 * table order, its positions (tensor-local) and then its values, and zstd
 * runs over the whole step's buffer. */
typedef enum {
  BENCH_DENSE_Z,   /* the new BF16 state */
  BENCH_INT32_Z,   /* uint32 index + absolute BF16 value */
  BENCH_GAP_ABS_Z, /* LEB128 varint gaps (pos - prev - 1) + absolute BF16
                      values: a proxy of the published production format */
  BENCH_GAP_XOR_Z, /* varint gaps + (old XOR new) as a low and a high byte
                      plane */
  BENCH_ZKINDS
} bench_zkind;

/* Sizes in bytes of the reference encodings of one step's changes. */
typedef struct {
  uint64_t dense;      /* every BF16 value: 2 bytes per parameter */
  uint64_t int32_bf16; /* uint32 index + absolute BF16 value: 6/change */
  uint64_t zstd[BENCH_ZKINDS][BENCH_ZSTD_LEVELS]; /* by level index */
  /* Bytes of the state that dense zstd-19 read: == dense when whole, else
   * a sample and zstd[BENCH_DENSE_Z][2] is scaled from it. */
  uint64_t dense_z19_read;
} bench_baseline_bytes;

/** Writes the readable name of baseline `kind` at level index `li` ("int32
 * index + BF16 value + zstd-3") into buf. */
void bench_baseline_label(int kind, int li, char *buf, size_t size);

/** Writes the JSON key stem of baseline `kind` at level index `li` into
 * buf: level 1 keeps the names it had before levels 3 and 19 came
 * ("int32_bf16_zstd"), the others carry the level ("int32_bf16_zstd19"). */
void bench_baseline_key(int kind, int li, char *buf, size_t size);

/** "The baseline": the smallest of the zstd baselines measured on the whole
 * input (a sampled dense zstd-19 never counts). Sets *kind and *li.
 * @return its size in bytes. */
uint64_t bench_baseline_best(const bench_baseline_bytes *b, int *kind, int *li);

/** Computes every baseline size for one step. `changes` has t->count
 * entries (tensor-local positions); `new_bf16` is the new state (t->total
 * values). The compressions run in parallel (one per core); nothing here
 * is timed.
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
