/* locate_bench.c - the turns of class ranks into positions that a decode
 * without a class index makes (pulse_chunk_locate_isa, chunk_locate.c),
 * timed path by path on chunks of 2^20 N(0, 0.02) BF16 weights read from
 * memory:
 *
 *   locate_bench [--chunks N] [--reps R] [density ...]   (default 0.005 0.01 0.02 0.05)
 *
 * Per density: each path's result is checked against the reference on
 * every chunk, then each path is timed R times over all chunks (one
 * thread's CPU time, median), in ns per base element. A path this CPU
 * cannot run times the reference's loop. The last column, "read", is the
 * floor under every path: the same chunks' bytes read once and summed, no
 * locating (a pass without an index has to read the whole base, since the
 * classes' elements are spread through it). Not a test: a measuring tool. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chunk_impl.h"
#include "chunk_locate_impl.h"
#include "detect_impl.h"
#include "rank_form_testutil.h"

#define CHUNK ((uint32_t)1 << 20)
#define MAX_REPS 99

static const struct {
  int isa;
  const char *name;
} paths[] = {{PULSE_ISA_SCALAR, "reference"},
             {PULSE_CHUNK_LOCATE_AVX512, "blocks"},
             {PULSE_CHUNK_LOCATE_WINDOW, "windows"},
             {PULSE_CHUNK_LOCATE_GROUPS, "groups"},
             {PULSE_ISA_AUTO, "default"}};

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The sum of a chunk's 64-bit words: a read of its bytes, and nothing else
 * (returned so that the compiler keeps it). */
static uint64_t read_chunk(const uint16_t *b) {
  const uint64_t *w = (const uint64_t *)b;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i < CHUNK / 4; i += 4)
    s0 += w[i], s1 += w[i + 1], s2 += w[i + 2], s3 += w[i + 3];
  return s0 + s1 + s2 + s3;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *t, unsigned n) {
  qsort(t, n, sizeof *t, by_value);
  return t[n / 2];
}

int main(int argc, char **argv) {
  unsigned chunks = 64, reps = 5;
  double densities[32];
  unsigned nd = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--chunks") == 0 && i + 1 < argc)
      chunks = (unsigned)strtoul(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = (unsigned)strtoul(argv[++i], NULL, 10);
    else if (nd < PT_COUNT_OF(densities) && strtod(argv[i], NULL) > 0)
      densities[nd++] = strtod(argv[i], NULL);
    else {
      fprintf(stderr, "usage: locate_bench [--chunks N] [--reps R] [density ...]\n");
      return 2;
    }
  }
  if (nd == 0)
    densities[0] = 0.005, densities[1] = 0.01, densities[2] = 0.02, densities[3] = 0.05, nd = 4;
  if (chunks == 0 || reps == 0 || reps > MAX_REPS) {
    fprintf(stderr, "locate_bench: --chunks from 1, --reps 1..%d\n", MAX_REPS);
    return 2;
  }
  uint64_t s = 1;
  size_t total = (size_t)CHUNK * chunks;
  uint16_t *base = pt_alloc(total * 2);
  for (size_t i = 0; i < total; i++)
    base[i] = pt_weight(&s, PT_WEIGHTS_NORMAL);
  uint32_t *at = pt_alloc((size_t)CHUNK * 4);
  uint64_t *pos = pt_alloc((size_t)CHUNK * 8 + 8), *want_pos = pt_alloc((size_t)CHUNK * 8 + 8);
  uint16_t *delta = pt_alloc((size_t)CHUNK * 2 + 2), *want_delta = pt_alloc((size_t)CHUNK * 2 + 2);
  pt_rank_form *f = calloc(chunks, sizeof *f);
  printf("%u chunks of %u N(0, 0.02) elements, CPU ns per element, median of %u\n", chunks, CHUNK,
         reps);
  printf("%-8s", "density");
  for (size_t p = 0; p < PT_COUNT_OF(paths); p++)
    printf(" %10s", paths[p].name);
  printf(" %10s\n", "read");
  for (unsigned d = 0; d < nd; d++) {
    for (unsigned c = 0; c < chunks; c++)
      pt_rank_form_make(base + (size_t)c * CHUNK, CHUNK,
                        at, pt_positions(CHUNK, densities[d], &s, at), &s, &f[c]);
    for (unsigned c = 0; c < chunks; c++) {
      const uint16_t *b = base + (size_t)c * CHUNK;
      uint32_t want = pulse_chunk_locate(b, CHUNK, f[c].k, f[c].start, f[c].rank, f[c].cdelta, 0,
                                         want_pos, want_delta);
      for (size_t p = 0; p < PT_COUNT_OF(paths); p++) {
        uint32_t got = pulse_chunk_locate_isa(paths[p].isa, b, CHUNK, f[c].k, f[c].start,
                                              f[c].rank, f[c].cdelta, 0, pos, delta);
        if (got != want || memcmp(pos, want_pos, (size_t)got * 8) != 0 ||
            memcmp(delta, want_delta, (size_t)got * 2) != 0) {
          fprintf(stderr, "locate_bench: %s differs from the reference (density %g, chunk %u)\n",
                  paths[p].name, densities[d], c);
          return 1;
        }
      }
    }
    printf("%-8g", densities[d]);
    for (size_t p = 0; p < PT_COUNT_OF(paths); p++) {
      double t[MAX_REPS];
      for (unsigned r = 0; r < reps; r++) {
        double t0 = cpu_now();
        for (unsigned c = 0; c < chunks; c++)
          pulse_chunk_locate_isa(paths[p].isa, base + (size_t)c * CHUNK, CHUNK, f[c].k,
                                 f[c].start, f[c].rank, f[c].cdelta, 0, pos, delta);
        t[r] = cpu_now() - t0;
      }
      printf(" %10.3f", median(t, reps) * 1e9 / (double)total);
    }
    double t[MAX_REPS];
    volatile uint64_t sink = 0;
    for (unsigned r = 0; r < reps; r++) {
      double t0 = cpu_now();
      for (unsigned c = 0; c < chunks; c++)
        sink += read_chunk(base + (size_t)c * CHUNK);
      t[r] = cpu_now() - t0;
    }
    printf(" %10.3f\n", median(t, reps) * 1e9 / (double)total);
    for (unsigned c = 0; c < chunks; c++)
      pt_rank_form_free(&f[c]);
  }
  free(base), free(at), free(pos), free(want_pos), free(delta), free(want_delta), free(f);
  return 0;
}
