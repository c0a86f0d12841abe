/* Key rotation (issue 15; docs/protocols/sync.md, "Key rotation"): a
 * worker that trusts the old key takes the head that rotates it, without a
 * restart, and from then on requires the new key: heads signed by the old
 * key alone are refused, even newer ones; a rotation signed by another key
 * than the trusted one is refused; a worker that joins after the rotation
 * still follows it (every later head carries the record); trust on first
 * use moves to the new key; the publisher refuses to sign with the old key
 * afterwards. */
#include "inf_testutil.h"
#include "store_impl.h"

/* A copy of the trainer's store at its current head. */
static char *store_copy(const it_trainer *t) {
  char *dir = tu_make_dir(), cmd[8192];
  snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", t->dir, dir);
  cr_assert_eq(system(cmd), 0);
  return dir;
}

static pulse_server *serve(const char *dir, char url[64]) {
  pulse_server *srv = NULL;
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  snprintf(url, 64, "http://127.0.0.1:%u", (unsigned)pulse_server_port(srv));
  return srv;
}

/* Publishes steps first..last of the trainer's model into store `dir`
 * signed by `key` (another publisher of the same run). */
static void publish_into(const char *dir, it_trainer *t,
                         const pulse_sign_key *key, uint64_t first,
                         uint64_t last) {
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.key = key;
  po.threads = 1;
  po.anchor_sync = 1;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &po, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor pt[TU_TENSORS];
  for (uint64_t s = first; s <= last; s++) {
    tu_model_step(&t->m, 0.01);
    for (int i = 0; i < TU_TENSORS; i++) {
      pt[i].data = t->m.w[i];
      pt[i].dtype = PULSE_DTYPE_F32;
      pt[i].memory = PULSE_PUB_HOST;
    }
    cr_assert_eq(pulse_pub_commit(pub, s, pt, TU_TENSORS, NULL), PULSE_OK,
                 "%s", pulse_error_detail());
  }
  pulse_pub_free(pub);
}

/* A subscriber of `url` (and `url2` when not NULL) with host targets. */
static pulse_sub *sub_up2(const it_trainer *t, const char *cache,
                          const char **urls, const char *url,
                          const char *url2, it_targets *tg, int tofu) {
  pulse_sub_opts o = it_sub_opts(t, cache, urls);
  urls[0] = url;
  if (url2 != NULL) {
    urls[1] = url2;
    o.url_count = 2;
  }
  if (tofu) {
    o.public_key = NULL;
    o.trust_first_use = 1;
  }
  pulse_sub *sub = NULL;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s",
               pulse_error_detail());
  it_targets_attach(tg, t, sub);
  return sub;
}

static pulse_sub *sub_up(const it_trainer *t, const char *cache,
                         const char **urls, const char *url, it_targets *tg,
                         int tofu) {
  return sub_up2(t, cache, urls, url, NULL, tg, tofu);
}

static void key_hex(const pulse_sign_key *k, char hex[65]) {
  uint8_t pub[32];
  pulse_sign_key_public(k, pub);
  store_hex(pub, 32, hex);
}

Test(trust_rotation, a_worker_follows_a_rotation_and_then_refuses_the_old_key) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  char *cache = tu_make_dir(), *cache2 = tu_make_dir();
  const char *urls[2], *urls2[1];
  it_targets tg, tg2;
  /* A second source: a copy of the store at step 3, the old key's, which
   * the old key goes on publishing into later. */
  char *before = store_copy(&t), old_url[64];
  pulse_server *old_srv = serve(before, old_url);
  pulse_sub *sub = sub_up2(&t, cache, urls, t.url, old_url, &tg, 0);
  pulse_sub *tofu = sub_up(&t, cache2, urls2, t.url, &tg2, 1);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert_eq(pulse_sub_sync(tofu), PULSE_OK, "%s", pulse_sub_error(tofu));

  pulse_sign_key *k2 = NULL;
  cr_assert_eq(pulse_sign_key_generate(&k2), PULSE_OK);
  pulse_pub_figures f;
  cr_assert_eq(pulse_pub_rotate_key(t.pub_, k2, &f), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(f.step, 3);
  it_trainer_run(&t, 4, 5, 0.01);
  /* The same subscribers, no restart: they take the rotation. */
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert_eq(pulse_sub_step(sub), 5);
  cr_assert(it_targets_equal(&tg, &t, 5));
  cr_assert_eq(pulse_sub_sync(tofu), PULSE_OK, "%s", pulse_sub_error(tofu));
  cr_assert(it_targets_equal(&tg2, &t, 5));
  char path[4096], hex2[65];
  key_hex(k2, hex2);
  snprintf(path, sizeof path, "%s/trusted-key", cache2);
  size_t n = 0;
  uint8_t *kept = tu_read(path, &n);
  cr_assert(kept != NULL && n >= 64 && memcmp(kept, hex2, 64) == 0,
            "trust on first use moves to the new key");
  free(kept);

  /* The old key keeps publishing the same run, at newer steps than the
   * new key's (a replay, or the old key in other hands): the same worker
   * refuses those heads and stays at step 5. */
  pulse_sub_figures fig0, fig1;
  pulse_sub_figures_get(sub, &fig0);
  publish_into(before, &t, t.key, 4, 8);
  pulse_server_notify(old_srv, -1.0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));
  pulse_sub_figures_get(sub, &fig1);
  cr_assert_gt(fig1.rejected, fig0.rejected, "the old key's head refused");
  cr_assert_eq(pulse_sub_step(sub), 5);
  cr_assert(it_targets_equal(&tg, &t, 5));
  /* A worker restarted with the old key pinned, against the old key's
   * source alone: its cache's head carries the rotation, which it follows
   * again before asking, so step 8 of the old key is refused. */
  pulse_sub_free(sub);
  it_targets_free(&tg);
  sub = sub_up(&t, cache, urls, old_url, &tg, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_sub_error(sub), "not by the pinned key") != NULL,
            "%s", pulse_sub_error(sub));
  pulse_server_free(old_srv);

  /* A worker that joins after the rotation, pinned to the old key. */
  char *cache3 = tu_make_dir();
  const char *urls3[1];
  it_targets tg3;
  pulse_sub *late = sub_up(&t, cache3, urls3, t.url, &tg3, 0);
  cr_assert_eq(pulse_sub_sync(late), PULSE_OK, "%s", pulse_sub_error(late));
  cr_assert(it_targets_equal(&tg3, &t, 5));

  /* The publisher does not sign with the old key any more. */
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.key = t.key;
  pulse_pub *again = NULL;
  cr_assert_eq(pulse_pub_create(t.dir, &po, &again), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "rotated") != NULL, "%s",
            pulse_error_detail());

  pulse_sub_free(sub), pulse_sub_free(tofu), pulse_sub_free(late);
  it_targets_free(&tg), it_targets_free(&tg2), it_targets_free(&tg3);
  it_trainer_down(&t);
  pulse_sign_key_free(k2);
  tu_rm_rf(cache), tu_rm_rf(cache2), tu_rm_rf(cache3), tu_rm_rf(before);
}

Test(trust_rotation, a_rotation_not_signed_by_the_trusted_key_is_refused) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  it_targets tg;
  char *forged = store_copy(&t), url[64];
  pulse_server *srv = serve(forged, url);
  pulse_sub *sub = sub_up(&t, cache, urls, url, &tg, 0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_OK, "%s", pulse_sub_error(sub));

  /* Another key "rotates" the store (the worker's only source) to a key of
   * its own: a valid record, but not by the key the worker trusts. */
  pulse_sign_key *k3 = NULL, *k4 = NULL;
  cr_assert_eq(pulse_sign_key_generate(&k3), PULSE_OK);
  cr_assert_eq(pulse_sign_key_generate(&k4), PULSE_OK);
  publish_into(forged, &t, k3, 4, 4);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.key = k3;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(forged, &po, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_pub_rotate_key(pub, k4, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_free(pub);
  pulse_server_notify(srv, -1.0);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_sub_error(sub), "its key rotation") != NULL, "%s",
            pulse_sub_error(sub));
  cr_assert_eq(pulse_sub_step(sub), 3);
  cr_assert(it_targets_equal(&tg, &t, 3));
  pulse_server_free(srv);

  /* A record that claims the trusted key but is signed by another: the
   * head does not even parse. */
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(t.dir, &h), PULSE_OK);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = pulse_store_head_step(h);
  f.digest = *pulse_store_head_state_digest(h);
  f.npatches = pulse_store_head_patch_count(h);
  f.patches = f.npatches ? pulse_store_head_patch(h, 0) : NULL;
  f.nanchors = pulse_store_head_anchor_count(h);
  f.anchors = pulse_store_head_anchor(h, 0);
  f.version = 2;
  pulse_store_head_run(h, f.run);
  f.published = pulse_store_head_published(h);
  uint8_t k4pub[32];
  pulse_sign_key_public(k4, k4pub);
  cr_assert_eq(store_rotation_sign(k3, k4pub, f.run, f.step, &f.rotation),
               PULSE_OK);
  memcpy(f.rotation.from, t.pub, 32); /* claims the trainer's key */
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, k4, &b), PULSE_OK);
  pulse_store_head *bad = NULL;
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &bad),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "key rotation signature") != NULL,
            "%s", pulse_error_detail());
  pulse_buffer_free(&b);
  /* Nor does one naming another key than the head's signer; the genuine
   * record parses. */
  cr_assert_eq(store_rotation_sign(t.key, k4pub, f.run, f.step, &f.rotation),
               PULSE_OK);
  cr_assert_eq(store_head_serialize(&f, k3, &b), PULSE_OK);
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &bad),
               PULSE_ERR_CORRUPT);
  pulse_buffer_free(&b);
  cr_assert_eq(store_head_serialize(&f, k4, &b), PULSE_OK);
  cr_assert_eq(pulse_store_head_parse(b.data, b.size, &bad), PULSE_OK,
               "%s", pulse_error_detail());
  uint8_t from[32];
  uint64_t at = 0;
  cr_assert_eq(pulse_store_head_rotation(bad, from, &at), 1);
  cr_assert(memcmp(from, t.pub, 32) == 0 && at == f.step);
  pulse_store_head_free(bad);
  pulse_buffer_free(&b);
  pulse_store_head_free(h);

  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  pulse_sign_key_free(k3), pulse_sign_key_free(k4);
  tu_rm_rf(cache), tu_rm_rf(forged);
}
