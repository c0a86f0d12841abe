/* files_testutil.h - what the trainer-side and inference-side suites share:
 * allocation that aborts on failure, temporary folders, file pokes (write,
 * read, flip a byte), and a small GPT-like FP32 model whose step() moves a
 * fraction of its weights by about one BF16 ulp, like Adam at an RL
 * learning rate. */
#ifndef PULSE_FILES_TESTUTIL_H
#define PULSE_FILES_TESTUTIL_H

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "pulse_codec.h"
#include "rng_impl.h"

/* Seconds on the monotonic clock (for time bounds and rates). */
static inline double tu_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline void *tu_alloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (p == NULL)
    abort();
  return p;
}

static inline char *tu_make_dir(void) {
  char tmpl[] = "/tmp/pulse-test-XXXXXX";
  char *d = mkdtemp(tmpl);
  if (d == NULL)
    abort();
  return strdup(d);
}

static inline int tu_rm_cb(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static inline void tu_rm_rf(char *dir) {
  if (dir != NULL)
    nftw(dir, tu_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}


static inline int tu_write(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return -1;
  size_t w = fwrite(data, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}

static inline uint8_t *tu_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = tu_alloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  fclose(f);
  return buf;
}

/* Flips one byte of a file at `offset` (from the end when negative). */
static inline int tu_flip(const char *path, long offset) {
  FILE *f = fopen(path, "r+b");
  if (f == NULL)
    return -1;
  fseek(f, offset, offset < 0 ? SEEK_END : SEEK_SET);
  long at = ftell(f);
  int c = fgetc(f);
  fseek(f, at, SEEK_SET);
  fputc(c ^ 0x5a, f);
  fclose(f);
  return 0;
}

/* --------------------------------------------------------------- model */

static inline double tu_normal(uint64_t *s) {
  double u1 = ((double)(pulse_rng_next(s) >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(pulse_rng_next(s) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#define TU_TENSORS 4

typedef struct {
  pulse_tensor_info info[TU_TENSORS];
  uint64_t numel[TU_TENSORS];
  float *w[TU_TENSORS];
  uint64_t seed;
} tu_model;

/* A GPT-like table of four tensors; `scale` grows the matrices. */
static inline void tu_model_init(tu_model *m, uint64_t seed, uint64_t scale) {
  static const char *names[TU_TENSORS] = {"embed.weight", "layer.0.attn.weight",
                                          "layer.0.norm.bias", "head.weight"};
  uint64_t rows[TU_TENSORS] = {64 * scale, 48 * scale, 1, 32 * scale};
  uint64_t cols[TU_TENSORS] = {40, 64, 333, 40};
  memset(m, 0, sizeof *m);
  m->seed = seed;
  for (int i = 0; i < TU_TENSORS; i++) {
    m->info[i].name = names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = rows[i] == 1 ? 1 : 2;
    m->info[i].shape[0] = rows[i] == 1 ? cols[i] : rows[i];
    m->info[i].shape[1] = rows[i] == 1 ? 0 : cols[i];
    m->numel[i] = rows[i] * cols[i];
    m->w[i] = tu_alloc(m->numel[i] * sizeof(float));
    for (uint64_t k = 0; k < m->numel[i]; k++)
      m->w[i][k] = (float)(tu_normal(&m->seed) * (i == 0 ? 1.0 : 0.02));
  }
}

/* Moves about `density` of the weights by 1-3 BF16 ulps. */
static inline void tu_model_step(tu_model *m, double density) {
  for (int i = 0; i < TU_TENSORS; i++)
    for (uint64_t k = 0; k < m->numel[i]; k++)
      if ((double)(pulse_rng_next(&m->seed) >> 11) * 0x1p-53 < density) {
        float w = m->w[i][k];
        float ulp = fabsf(w) / 128.0f + 1e-30f;
        m->w[i][k] = w + (float)((int)(pulse_rng_next(&m->seed) % 5) - 2) * ulp;
      }
}

static inline void tu_model_free(tu_model *m) {
  for (int i = 0; i < TU_TENSORS; i++)
    free(m->w[i]);
}


#endif
