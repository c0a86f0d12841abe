/* inf_testutil.h - helpers shared by the inference_side suites: a trainer
 * in the test process (the model of files_testutil.h, a publisher with a
 * signing key, and the HTTP server on 127.0.0.1 port 0) and host targets. */
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

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_sign.h"
#include "pulse_store.h"
#include "pulse_subscriber.h"

/* --------------------------------------------------------------- trainer */

typedef struct {
  char *dir;
  tu_model m;
  pulse_sign_key *key;
  uint8_t pub[32];
  pulse_pub *pub_;
  pulse_server *srv;
  uint16_t port;
  char url[64];
  uint64_t step; /* head step */
  /* BF16 state of every published step, per tensor (for comparisons) */
  uint16_t *bits[64][TU_TENSORS];
  char digest[64][65];
} it_trainer;

/* The patch format the next it_trainer_up's publisher writes (0: the
 * default); a test that sets it sets it back. */
static uint32_t it_format_version;

/* A store with a publisher (anchor every `anchor_every`, keep `keep`
 * patches), served on 127.0.0.1 (catch-ups signed). Publishes step 0. */
static inline void it_trainer_up(it_trainer *t, uint64_t anchor_every,
                                 uint64_t keep, uint64_t scale) {
  memset(t, 0, sizeof *t);
  t->dir = tu_make_dir();
  tu_model_init(&t->m, 17, scale);
  cr_assert_eq(pulse_sign_key_generate(&t->key), PULSE_OK);
  pulse_sign_key_public(t->key, t->pub);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = t->dir;
  so.threads = 2;
  so.watch = 0;
  so.key = t->key;
  so.catchup_threads = 1;
  cr_assert_eq(pulse_server_create(&so, &t->srv), PULSE_OK, "%s",
               pulse_error_detail());
  t->port = pulse_server_port(t->srv);
  snprintf(t->url, sizeof t->url, "http://127.0.0.1:%u", (unsigned)t->port);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.anchor_every = anchor_every;
  po.keep_patches = keep;
  po.keep_anchors = 2;
  po.key = t->key;
  po.tensors = t->m.info;
  po.tensor_count = TU_TENSORS;
  po.threads = 1;
  po.anchor_sync = 1;
  po.format_version = it_format_version;
  po.on_head = pulse_server_on_head;
  po.on_head_ctx = t->srv;
  cr_assert_eq(pulse_pub_create(t->dir, &po, &t->pub_), PULSE_OK, "%s",
               pulse_error_detail());
}

/* Publishes the model's current weights as step `step`. */
static inline void it_trainer_commit(it_trainer *t, uint64_t step) {
  pulse_pub_tensor pt[TU_TENSORS];
  for (int i = 0; i < TU_TENSORS; i++) {
    pt[i].data = t->m.w[i];
    pt[i].dtype = PULSE_DTYPE_F32;
    pt[i].memory = PULSE_PUB_HOST;
  }
  pulse_pub_figures fig;
  cr_assert_eq(pulse_pub_commit(t->pub_, step, pt, TU_TENSORS, &fig), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_lt(step, 64);
  for (int i = 0; i < TU_TENSORS; i++) {
    t->bits[step][i] = tu_alloc(t->m.numel[i] * 2);
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
      tu_model_step(&t->m, density);
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
    for (int i = 0; i < TU_TENSORS; i++)
      free(t->bits[s][i]);
  tu_model_free(&t->m);
  tu_rm_rf(t->dir);
}

/* --------------------------------------------------------------- targets */

typedef struct {
  uint16_t *data[TU_TENSORS];
} it_targets;

/* Attaches the host buffers tg holds already, one per table tensor. */
static inline void it_targets_attach_held(const it_targets *tg, const it_trainer *t,
                                          pulse_sub *sub) {
  for (int i = 0; i < TU_TENSORS; i++)
    cr_assert_eq(pulse_sub_attach_host(sub, t->m.info[i].name,
                                       t->m.info[i].ndim, t->m.info[i].shape,
                                       tg->data[i]),
                 PULSE_OK, "%s", pulse_error_detail());
}

/* Host buffers for every tensor of the trainer's table, attached. */
static inline void it_targets_attach(it_targets *tg, const it_trainer *t,
                                     pulse_sub *sub) {
  for (int i = 0; i < TU_TENSORS; i++)
    tg->data[i] = tu_alloc(t->m.numel[i] * 2);
  it_targets_attach_held(tg, t, sub);
}

/* A worker restarting over the buffers tg holds, which it says hold
 * `step` (pulse_sub_assume_step). */
static inline void it_targets_resume(const it_targets *tg, const it_trainer *t,
                                     pulse_sub *sub, uint64_t step) {
  it_targets_attach_held(tg, t, sub);
  cr_assert_eq(pulse_sub_assume_step(sub, step), PULSE_OK);
}

static inline void it_targets_free(it_targets *tg) {
  for (int i = 0; i < TU_TENSORS; i++)
    free(tg->data[i]);
}

/* 1 when the targets hold the trainer's step `step`, bit for bit. */
static inline int it_targets_equal(const it_targets *tg, const it_trainer *t,
                                   uint64_t step) {
  for (int i = 0; i < TU_TENSORS; i++)
    if (t->bits[step][i] == NULL ||
        memcmp(tg->data[i], t->bits[step][i], t->m.numel[i] * 2) != 0)
      return 0;
  return 1;
}

/* Options for a subscriber of `t` with fast retries. The URL list is
 * static storage of the fixture. */
static inline pulse_sub_opts it_sub_opts(const it_trainer *t, const char *cache,
                                         const char **urls) {
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
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
