/* inf_testutil.h - helpers shared by the inference_side suites: a trainer
 * in the test process (a small model whose FP32 master weights move like
 * Adam's at an RL learning rate, a publisher with a signing key, and the
 * HTTP server on 127.0.0.1 port 0), host targets, temporary folders and
 * file pokes. Helpers abort on allocation failure. */
#ifndef PULSE_INF_TESTUTIL_H
#define PULSE_INF_TESTUTIL_H

#include <criterion/criterion.h>
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
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "pulse_subscriber.h"

static inline void *it_alloc(size_t n) {
  void *p = calloc(n ? n : 1, 1);
  if (p == NULL)
    abort();
  return p;
}

static inline char *it_make_dir(void) {
  char tmpl[] = "/tmp/pulse-inf-XXXXXX";
  char *d = mkdtemp(tmpl);
  if (d == NULL)
    abort();
  return strdup(d);
}

static inline int it_rm_cb(const char *path, const struct stat *sb, int flag,
                           struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

static inline void it_rm_rf(char *dir) {
  if (dir != NULL)
    nftw(dir, it_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
  free(dir);
}

static inline int it_write(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (f == NULL)
    return -1;
  size_t w = fwrite(data, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}

static inline uint8_t *it_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *buf = it_alloc((size_t)len + 1);
  *n = fread(buf, 1, (size_t)len, f);
  fclose(f);
  return buf;
}

/* Flips one byte of a file at `offset` (from the end when negative). */
static inline int it_flip(const char *path, long offset) {
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

static inline uint64_t it_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline double it_normal(uint64_t *s) {
  double u1 = ((double)(it_rand(s) >> 11) + 1.0) * 0x1p-53;
  double u2 = (double)(it_rand(s) >> 11) * 0x1p-53;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#define IT_TENSORS 4

typedef struct {
  pulse_tensor_info info[IT_TENSORS];
  uint64_t numel[IT_TENSORS];
  float *w[IT_TENSORS];
  uint64_t seed;
} it_model;

/* A GPT-like table of four tensors; `scale` grows the matrices. */
static inline void it_model_init(it_model *m, uint64_t seed, uint64_t scale) {
  static const char *names[IT_TENSORS] = {"embed.weight", "layer.0.attn.weight",
                                          "layer.0.norm.bias", "head.weight"};
  uint64_t rows[IT_TENSORS] = {64 * scale, 48 * scale, 1, 32 * scale};
  uint64_t cols[IT_TENSORS] = {40, 64, 333, 40};
  memset(m, 0, sizeof *m);
  m->seed = seed;
  for (int i = 0; i < IT_TENSORS; i++) {
    m->info[i].name = names[i];
    m->info[i].dtype = PULSE_DTYPE_BF16;
    m->info[i].ndim = rows[i] == 1 ? 1 : 2;
    m->info[i].shape[0] = rows[i] == 1 ? cols[i] : rows[i];
    m->info[i].shape[1] = rows[i] == 1 ? 0 : cols[i];
    m->numel[i] = rows[i] * cols[i];
    m->w[i] = it_alloc(m->numel[i] * sizeof(float));
    for (uint64_t k = 0; k < m->numel[i]; k++)
      m->w[i][k] = (float)(it_normal(&m->seed) * (i == 0 ? 1.0 : 0.02));
  }
}

/* Moves about `density` of the weights by 1-3 BF16 ulps. */
static inline void it_model_step(it_model *m, double density) {
  for (int i = 0; i < IT_TENSORS; i++)
    for (uint64_t k = 0; k < m->numel[i]; k++)
      if ((double)(it_rand(&m->seed) >> 11) * 0x1p-53 < density) {
        float w = m->w[i][k];
        float ulp = fabsf(w) / 128.0f + 1e-30f;
        m->w[i][k] = w + (float)((int)(it_rand(&m->seed) % 5) - 2) * ulp;
      }
}

static inline void it_model_free(it_model *m) {
  for (int i = 0; i < IT_TENSORS; i++)
    free(m->w[i]);
}

/* --------------------------------------------------------------- trainer */

typedef struct {
  char *dir;
  it_model m;
  pulse_sign_key *key;
  uint8_t pub[32];
  pulse_pub *pub_;
  pulse_server *srv;
  uint16_t port;
  char url[64];
  uint64_t step; /* head step */
  /* BF16 state of every published step, per tensor (for comparisons) */
  uint16_t *bits[64][IT_TENSORS];
  char digest[64][65];
} it_trainer;

/* A store with a publisher (anchor every `anchor_every`, keep `keep`
 * patches), served on 127.0.0.1 (catch-ups signed). Publishes step 0. */
static inline void it_trainer_up(it_trainer *t, uint64_t anchor_every,
                                 uint64_t keep, uint64_t scale) {
  memset(t, 0, sizeof *t);
  t->dir = it_make_dir();
  it_model_init(&t->m, 17, scale);
  cr_assert_eq(pulse_sign_key_generate(&t->key), PULSE_OK);
  pulse_sign_key_public(t->key, t->pub);
  pulse_server_opts so = PULSE_SERVER_OPTS_INIT;
  so.store_dir = t->dir;
  so.threads = 2;
  so.watch = 0;
  so.key = t->key;
  so.catchup_threads = 1;
  cr_assert_eq(pulse_server_create(&so, &t->srv), PULSE_OK, "%s",
               pulse_error_detail());
  t->port = pulse_server_port(t->srv);
  snprintf(t->url, sizeof t->url, "http://127.0.0.1:%u", (unsigned)t->port);
  pulse_pub_opts po = PULSE_PUB_OPTS_INIT;
  po.anchor_every = anchor_every;
  po.keep_patches = keep;
  po.keep_anchors = 2;
  po.key = t->key;
  po.tensors = t->m.info;
  po.tensor_count = IT_TENSORS;
  po.threads = 1;
  po.anchor_sync = 1;
  po.on_head = pulse_server_on_head;
  po.on_head_ctx = t->srv;
  cr_assert_eq(pulse_pub_create(t->dir, &po, &t->pub_), PULSE_OK, "%s",
               pulse_error_detail());
}

/* Publishes the model's current weights as step `step`. */
static inline void it_trainer_commit(it_trainer *t, uint64_t step) {
  pulse_pub_tensor pt[IT_TENSORS];
  for (int i = 0; i < IT_TENSORS; i++) {
    pt[i].data = t->m.w[i];
    pt[i].dtype = PULSE_DTYPE_F32;
    pt[i].memory = PULSE_PUB_HOST;
  }
  pulse_pub_figures fig;
  cr_assert_eq(pulse_pub_commit(t->pub_, step, pt, IT_TENSORS, &fig), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_lt(step, 64);
  for (int i = 0; i < IT_TENSORS; i++) {
    t->bits[step][i] = it_alloc(t->m.numel[i] * 2);
    memcpy(t->bits[step][i], pulse_pub_snapshot(t->pub_, (size_t)i),
           t->m.numel[i] * 2);
  }
  snprintf(t->digest[step], 65, "%s", fig.state_digest);
  t->step = step;
}

/* Steps the model and publishes steps first..last. */
static inline void it_trainer_run(it_trainer *t, uint64_t first, uint64_t last,
                                  double density) {
  for (uint64_t s = first; s <= last; s++) {
    if (s > 0)
      it_model_step(&t->m, density);
    it_trainer_commit(t, s);
  }
}

/* Stops the server only (the store stays). */
static inline void it_trainer_stop_server(it_trainer *t) {
  pulse_server_free(t->srv);
  t->srv = NULL;
}

static inline void it_trainer_down(it_trainer *t) {
  pulse_server_free(t->srv);
  pulse_pub_free(t->pub_);
  pulse_sign_key_free(t->key);
  for (int s = 0; s < 64; s++)
    for (int i = 0; i < IT_TENSORS; i++)
      free(t->bits[s][i]);
  it_model_free(&t->m);
  it_rm_rf(t->dir);
}

/* --------------------------------------------------------------- targets */

typedef struct {
  uint16_t *data[IT_TENSORS];
} it_targets;

/* Host buffers for every tensor of the trainer's table, attached. */
static inline void it_targets_attach(it_targets *tg, const it_trainer *t,
                                     pulse_sub *sub) {
  for (int i = 0; i < IT_TENSORS; i++) {
    tg->data[i] = it_alloc(t->m.numel[i] * 2);
    cr_assert_eq(pulse_sub_attach_host(sub, t->m.info[i].name,
                                       t->m.info[i].ndim, t->m.info[i].shape,
                                       tg->data[i]),
                 PULSE_OK, "%s", pulse_error_detail());
  }
}

static inline void it_targets_free(it_targets *tg) {
  for (int i = 0; i < IT_TENSORS; i++)
    free(tg->data[i]);
}

/* 1 when the targets hold the trainer's step `step`, bit for bit. */
static inline int it_targets_equal(const it_targets *tg, const it_trainer *t,
                                   uint64_t step) {
  for (int i = 0; i < IT_TENSORS; i++)
    if (t->bits[step][i] == NULL ||
        memcmp(tg->data[i], t->bits[step][i], t->m.numel[i] * 2) != 0)
      return 0;
  return 1;
}

/* Options for a subscriber of `t` with fast retries. The URL list is
 * static storage of the fixture. */
static inline pulse_sub_opts it_sub_opts(const it_trainer *t, const char *cache,
                                         const char **urls) {
  pulse_sub_opts o = PULSE_SUB_OPTS_INIT;
  urls[0] = t->url;
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.public_key = t->pub;
  o.retries = 2;
  o.backoff_ms = 10;
  o.backoff_max_ms = 50;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 10000;
  o.threads = 2;
  return o;
}

#endif /* PULSE_INF_TESTUTIL_H */
