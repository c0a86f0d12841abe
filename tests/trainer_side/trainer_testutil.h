/* trainer_testutil.h - helpers shared by the trainer_side suites: temporary
 * store folders, a small model whose FP32 master weights move like a
 * trainer's, and file pokes. Helpers abort on allocation failure. */
#ifndef PULSE_TRAINER_TESTUTIL_H
#define PULSE_TRAINER_TESTUTIL_H

#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pulse_codec.h"
#include "pulse_publisher.h"

static inline void *tt_alloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (p == NULL)
    abort();
  return p;
}

static inline char *tt_make_dir(void) {
  char tmpl[] = "/tmp/pulse-ts-XXXXXX";
  char *d = mkdtemp(tmpl);
  if (d == NULL)
    abort();
  return strdup(d);
}

static inline int tt_rm_cb(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static inline void tt_rm_rf(char *dir) {
  if (dir != NULL)
    nftw(dir, tt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

/* Number of entries in a folder (0 when missing). */
static inline int tt_count(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  if (d == NULL)
    return 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

static inline void tt_path(char *buf, size_t cap, const char *dir,
                           const char *rel) {
  snprintf(buf, cap, "%s/%s", dir, rel);
}

static inline int tt_write(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return -1;
  size_t w = fwrite(data, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}

static inline uint8_t *tt_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = tt_alloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  fclose(f);
  return buf;
}

/* Flips one byte of a file at `offset` (from the end when negative). */
static inline int tt_flip(const char *path, long offset) {
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

/* ------------------------------------------------------------ the model */

static inline uint64_t tt_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline double tt_normal(uint64_t *s) {
  double u1 = ((double)(tt_rand(s) >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(tt_rand(s) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#define TT_TENSORS 4

/* FP32 master weights of a small table; step() moves a fraction of them by
 * about one BF16 ulp, like Adam at an RL learning rate. */
typedef struct {
  pulse_tensor_info info[TT_TENSORS];
  uint64_t numel[TT_TENSORS];
  float *w[TT_TENSORS];
  uint64_t seed;
} tt_model;

static inline void tt_model_init(tt_model *m, uint64_t seed, uint64_t scale) {
  static const char *names[TT_TENSORS] = {"embed.weight", "layer.0.attn.weight",
                                          "layer.0.norm.bias", "head.weight"};
  uint64_t rows[TT_TENSORS] = {64 * scale, 48 * scale, 1, 32 * scale};
  uint64_t cols[TT_TENSORS] = {40, 64, 333, 40};
  memset(m, 0, sizeof *m);
  m->seed = seed;
  for (int i = 0; i < TT_TENSORS; i++) {
    m->info[i].name = names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = rows[i] == 1 ? 1 : 2;
    m->info[i].shape[0] = rows[i] == 1 ? cols[i] : rows[i];
    m->info[i].shape[1] = rows[i] == 1 ? 0 : cols[i];
    m->numel[i] = rows[i] * cols[i];
    m->w[i] = tt_alloc(m->numel[i] * sizeof(float));
    for (uint64_t k = 0; k < m->numel[i]; k++)
      m->w[i][k] = (float)(tt_normal(&m->seed) * (i == 0 ? 1.0 : 0.02));
  }
}

/* Moves about `density` of the weights by 1-3 BF16 ulps. */
static inline void tt_model_step(tt_model *m, double density) {
  for (int i = 0; i < TT_TENSORS; i++)
    for (uint64_t k = 0; k < m->numel[i]; k++)
      if ((double)(tt_rand(&m->seed) >> 11) * 0x1p-53 < density) {
        float w = m->w[i][k];
        float ulp = fabsf(w) / 128.0f + 1e-30f;
        m->w[i][k] = w + (float)((int)(tt_rand(&m->seed) % 5) - 2) * ulp;
      }
}

static inline void tt_model_free(tt_model *m) {
  for (int i = 0; i < TT_TENSORS; i++)
    free(m->w[i]);
}

static inline void tt_model_tensors(const tt_model *m, pulse_pub_tensor *t) {
  for (int i = 0; i < TT_TENSORS; i++) {
    t[i].data = m->w[i];
    t[i].dtype = PULSE_DTYPE_F32;
    t[i].memory = PULSE_PUB_HOST;
  }
}

/* The BF16 state of the model, concatenated, and its state digest. */
static inline uint16_t *tt_model_bf16(const tt_model *m, uint64_t *total) {
  uint64_t n = 0;
  for (int i = 0; i < TT_TENSORS; i++)
    n += m->numel[i];
  uint16_t *out = tt_alloc(n * 2), *at = out;
  for (int i = 0; i < TT_TENSORS; i++) {
    pulse_bf16_cast_f32(m->w[i], at, m->numel[i]);
    at += m->numel[i];
  }
  if (total)
    *total = n;
  return out;
}

static inline pulse_state_digest tt_model_digest(const tt_model *m) {
  pulse_tensor_digest d[TT_TENSORS];
  uint64_t n;
  uint16_t *bits = tt_model_bf16(m, &n), *at = bits;
  for (int i = 0; i < TT_TENSORS; i++) {
    d[i] = pulse_digest_bf16(at, m->numel[i]);
    at += m->numel[i];
  }
  pulse_state_digest s;
  pulse_state_digest_compute(m->info, d, TT_TENSORS, &s);
  free(bits);
  return s;
}

#endif /* PULSE_TRAINER_TESTUTIL_H */
