/* trainer_testutil.h - helpers shared by the trainer_side suites: folder
 * counts and paths, and the publisher's view of the model of
 * files_testutil.h (which also has the folders and file pokes). */
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

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_publisher.h"

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

static inline void tt_model_tensors(const tu_model *m, pulse_pub_tensor *t) {
  for (int i = 0; i < TU_TENSORS; i++) {
    t[i].data = m->w[i];
    t[i].dtype = PULSE_DTYPE_F32;
    t[i].memory = PULSE_PUB_HOST;
  }
}

/* The BF16 state of the model, concatenated, and its state digest. */
static inline uint16_t *tt_model_bf16(const tu_model *m, uint64_t *total) {
  uint64_t n = 0;
  for (int i = 0; i < TU_TENSORS; i++)
    n += m->numel[i];
  uint16_t *out = tu_alloc(n * 2), *at = out;
  for (int i = 0; i < TU_TENSORS; i++) {
    pulse_bf16_cast_f32(m->w[i], at, m->numel[i]);
    at += m->numel[i];
  }
  if (total)
    *total = n;
  return out;
}

static inline pulse_state_digest tt_model_digest(const tu_model *m) {
  pulse_tensor_digest d[TU_TENSORS];
  uint64_t n;
  uint16_t *bits = tt_model_bf16(m, &n), *at = bits;
  for (int i = 0; i < TU_TENSORS; i++) {
    d[i] = pulse_digest_bf16(at, m->numel[i]);
    at += m->numel[i];
  }
  pulse_state_digest s;
  pulse_state_digest_compute(m->info, d, TU_TENSORS, &s);
  free(bits);
  return s;
}

#endif /* PULSE_TRAINER_TESTUTIL_H */
