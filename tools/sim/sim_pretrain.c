/* sim_pretrain.c - the checkpoint cache of text SFT's pretraining
 * (sim_pretrain.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sim_pretrain.h"

#define PRETRAIN_MAGIC 0x54504C50u /* "PLPT" */
#define PRETRAIN_VERSION 1u

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
  const unsigned char *p = data;
  for (size_t i = 0; i < n; i++) {
    h ^= p[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t pulse_sim_pretrain_key(const pulse_sim_problem_opts *o, uint64_t P,
                                uint64_t text_digest) {
  uint64_t h = 0xCBF29CE484222325ull;
  uint32_t u32[] = {o->context, o->embed, o->hidden, o->batch,
                    o->pretrain_steps, PRETRAIN_VERSION};
  float f32[] = {o->pretrain_lr, o->init_scale, o->beta1, o->beta2, o->eps};
  h = fnv(h, &o->seed, sizeof o->seed);
  h = fnv(h, &P, sizeof P);
  h = fnv(h, &text_digest, sizeof text_digest);
  h = fnv(h, u32, sizeof u32);
  h = fnv(h, f32, sizeof f32);
  return h;
}

/* The cache folder, created when missing; 0 when none can be had. */
static int cache_dir(char *dir, size_t cap) {
  const char *env = getenv("PULSE_CACHE_DIR");
  const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
  if (env != NULL && env[0] != '\0')
    snprintf(dir, cap, "%s", env);
  else if (xdg != NULL && xdg[0] != '\0')
    snprintf(dir, cap, "%s/pulse", xdg);
  else if (home != NULL && home[0] != '\0')
    snprintf(dir, cap, "%s/.cache/pulse", home);
  else
    snprintf(dir, cap, "/tmp/pulse-cache");
  /* mkdir -p */
  for (char *s = dir + 1; *s; s++) {
    if (*s != '/')
      continue;
    *s = '\0';
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
      *s = '/';
      return 0;
    }
    *s = '/';
  }
  return mkdir(dir, 0755) == 0 || errno == EEXIST;
}

static void path_of(char *path, size_t cap, const char *dir, uint64_t key) {
  snprintf(path, cap, "%s/text-pretrained-%016llx.bin", dir,
           (unsigned long long)key);
}

int pulse_sim_pretrain_load(uint64_t key, uint64_t P, float *theta,
                            double *loss) {
  char dir[3072], path[4096];
  if (!cache_dir(dir, sizeof dir))
    return 0;
  path_of(path, sizeof path, dir, key);
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return 0;
  uint32_t head[2];
  uint64_t k, n, sum;
  double l;
  int ok = fread(head, sizeof head, 1, f) == 1 && head[0] == PRETRAIN_MAGIC &&
           head[1] == PRETRAIN_VERSION && fread(&k, sizeof k, 1, f) == 1 &&
           k == key && fread(&n, sizeof n, 1, f) == 1 && n == P &&
           fread(&l, sizeof l, 1, f) == 1 &&
           fread(theta, sizeof *theta, (size_t)P, f) == (size_t)P &&
           fread(&sum, sizeof sum, 1, f) == 1 &&
           sum == fnv(0xCBF29CE484222325ull, theta, (size_t)P * sizeof *theta) &&
           fgetc(f) == EOF;
  fclose(f);
  if (ok)
    *loss = l;
  return ok;
}

void pulse_sim_pretrain_save(uint64_t key, uint64_t P, const float *theta,
                             double loss) {
  char dir[3072], path[4096], tmp[4200];
  if (!cache_dir(dir, sizeof dir))
    return;
  path_of(path, sizeof path, dir, key);
  snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
  FILE *f = fopen(tmp, "wb");
  if (f == NULL)
    return;
  uint32_t head[2] = {PRETRAIN_MAGIC, PRETRAIN_VERSION};
  uint64_t sum = fnv(0xCBF29CE484222325ull, theta, (size_t)P * sizeof *theta);
  int ok = fwrite(head, sizeof head, 1, f) == 1 &&
           fwrite(&key, sizeof key, 1, f) == 1 &&
           fwrite(&P, sizeof P, 1, f) == 1 &&
           fwrite(&loss, sizeof loss, 1, f) == 1 &&
           fwrite(theta, sizeof *theta, (size_t)P, f) == (size_t)P &&
           fwrite(&sum, sizeof sum, 1, f) == 1;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0)
    unlink(tmp);
}
