/* What a worker refuses besides a bad signature (issue 20, findings 1-3;
 * docs/protocols/sync.md, "What a subscriber refuses"): a head older than
 * the step its file holds, even with its cache gone (unless rolling back is
 * asked for); a head older than the maximum age; a head of another run
 * under the same key (unless switching is asked for); and with a stale
 * mirror listed before the trainer, a follower still reaches the trainer's
 * head within two poll intervals and reports the mirror as lagging. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "inf_testutil.h"
#include "pulse_safetensors.h"
#include "store_impl.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A copy of a store, served without a key (a mirror that stopped
 * updating). */
typedef struct {
  char *dir;
  pulse_server *srv;
  char url[64];
} mirror;

static void mirror_up(mirror *m, const char *store) {
  m->dir = tu_make_dir();
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cp -r %s/. %s/", store, m->dir);
  cr_assert_eq(system(cmd), 0);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = m->dir;
  so.threads = 2;
  cr_assert_eq(pulse_server_create(&so, &m->srv), PULSE_OK, "%s",
               pulse_error_detail());
  snprintf(m->url, sizeof m->url, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(m->srv));
}

static void mirror_down(mirror *m) {
  pulse_server_free(m->srv);
  tu_rm_rf(m->dir);
}

/* A worker with a file target in `work`. */
typedef struct {
  char *work;
  char cache[4096], out[4096];
  const char *urls[4];
} worker;

static void worker_up(worker *w) {
  memset(w, 0, sizeof *w);
  w->work = tu_make_dir();
  snprintf(w->cache, sizeof w->cache, "%s/cache", w->work);
  snprintf(w->out, sizeof w->out, "%s/model.safetensors", w->work);
}

static void worker_lose_cache(worker *w) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "rm -rf %s", w->cache);
  cr_assert_eq(system(cmd), 0);
}

/* One sync of the file target from `url` with options `o`. */
static pulse_status worker_sync(worker *w, const it_trainer *t,
                                const char *url, pulse_sub_opts *o0,
                                char *err, size_t cap) {
  pulse_sub_opts o = o0 ? *o0 : it_sub_opts(t, w->cache, w->urls);
  w->urls[0] = url;
  o.urls = w->urls;
  o.url_count = 1;
  o.cache_dir = w->cache;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_sub_attach_file(sub, w->out), PULSE_OK);
  pulse_status st = pulse_sub_sync(sub);
  if (err != NULL)
    snprintf(err, cap, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  return st;
}

/* The step and run the file's metadata name ("" when none). */
static uint64_t file_step(const worker *w, char run[64]) {
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open(w->out, &f), PULSE_OK);
  uint64_t step = strtoull(pulse_st_metadata_get(f, "step"), NULL, 10);
  const char *r = pulse_st_metadata_get(f, "run");
  snprintf(run, 64, "%s", r ? r : "");
  pulse_st_close(f);
  return step;
}

static void head_run_hex(const char *store, char out[64]) {
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(store, &h), PULSE_OK);
  uint8_t run[PULSE_STORE_RUN_BYTES];
  cr_assert_eq(pulse_store_head_run(h, run), 1);
  store_hex(run, sizeof run, out);
  pulse_store_head_free(h);
}

Test(trust, a_lost_cache_never_rolls_the_file_back_to_a_stale_mirror) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 5, 0.01);
  mirror m;
  mirror_up(&m, t.dir); /* stays at step 5 */
  it_trainer_run(&t, 6, 12, 0.01);
  worker w;
  worker_up(&w);
  char err[1024], run[64];
  cr_assert_eq(worker_sync(&w, &t, t.url, NULL, NULL, 0), PULSE_OK);
  cr_assert_eq(file_step(&w, run), 12);
  size_t n0 = 0, n1 = 0;
  uint8_t *before = tu_read(w.out, &n0);
  /* The cache was on ephemeral storage; the file says step 12. */
  worker_lose_cache(&w);
  cr_assert_eq(worker_sync(&w, &t, m.url, NULL, err, sizeof err),
               PULSE_ERR_BASE_STEP, "the stale head was taken");
  cr_assert(strstr(err, "older than step 12") != NULL, "%s", err);
  uint8_t *after = tu_read(w.out, &n1);
  cr_assert(n0 == n1 && memcmp(before, after, n0) == 0, "the file changed");
  free(before), free(after);
  /* Going back is possible when asked for, from the mirror's anchor. */
  pulse_sub_opts o = it_sub_opts(&t, w.cache, w.urls);
  o.allow_rollback = 1;
  cr_assert_eq(worker_sync(&w, &t, m.url, &o, err, sizeof err), PULSE_OK, "%s",
               err);
  cr_assert_eq(file_step(&w, run), 5);
  mirror_down(&m);
  it_trainer_down(&t);
  tu_rm_rf(w.work);
}

/* A copy of `store` whose head is re-signed with `key` as published at
 * `published` (0: a pulse-head/1 head). */
static void age_head(const char *store, const pulse_sign_key *key,
                     uint64_t published) {
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(store, &h), PULSE_OK);
  store_head_fields f;
  memset(&f, 0, sizeof f);
  f.step = pulse_store_head_step(h);
  f.digest = *pulse_store_head_state_digest(h);
  f.npatches = pulse_store_head_patch_count(h);
  f.patches = f.npatches ? pulse_store_head_patch(h, 0) : NULL;
  f.nanchors = pulse_store_head_anchor_count(h);
  f.anchors = pulse_store_head_anchor(h, 0);
  f.version = published ? 2 : 1;
  pulse_store_head_run(h, f.run);
  f.published = published;
  pulse_buffer b = {NULL, 0};
  cr_assert_eq(store_head_serialize(&f, key, &b), PULSE_OK);
  char path[4096];
  snprintf(path, sizeof path, "%s/head.json", store);
  cr_assert_eq(tu_write(path, b.data, b.size), 0);
  pulse_buffer_free(&b);
  pulse_store_head_free(h);
}

Test(trust, a_head_older_than_the_maximum_age_is_refused) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 3, 0.01);
  /* The trainer's own head is fresh. */
  worker w;
  worker_up(&w);
  char err[1024], run[64];
  pulse_sub_opts o = it_sub_opts(&t, w.cache, w.urls);
  o.max_head_age_s = 600;
  cr_assert_eq(worker_sync(&w, &t, t.url, &o, err, sizeof err), PULSE_OK, "%s",
               err);
  cr_assert_eq(file_step(&w, run), 3);
  /* A mirror serving the same head as signed an hour ago. */
  mirror m;
  mirror_up(&m, t.dir);
  age_head(m.dir, t.key, (uint64_t)time(NULL) - 3600);
  pulse_server_free(m.srv); /* reload the edited head */
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = m.dir;
  cr_assert_eq(pulse_server_create(&so, &m.srv), PULSE_OK);
  snprintf(m.url, sizeof m.url, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(m.srv));
  worker w2;
  worker_up(&w2);
  o = it_sub_opts(&t, w2.cache, w2.urls);
  o.max_head_age_s = 600;
  cr_assert_eq(worker_sync(&w2, &t, m.url, &o, err, sizeof err),
               PULSE_ERR_STALE, "%s", err);
  cr_assert(strstr(err, "published 36") != NULL &&
                strstr(err, "maximum age of 600 s") != NULL,
            "%s", err);
  cr_assert_eq(access(w2.out, F_OK), -1, "nothing was written");
  /* Without a maximum age it is taken; a format-1 head, which does not say
   * when, is refused under one. */
  o.max_head_age_s = 0;
  cr_assert_eq(worker_sync(&w2, &t, m.url, &o, err, sizeof err), PULSE_OK,
               "%s", err);
  age_head(m.dir, t.key, 0);
  pulse_server_free(m.srv);
  cr_assert_eq(pulse_server_create(&so, &m.srv), PULSE_OK);
  snprintf(m.url, sizeof m.url, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(m.srv));
  worker_lose_cache(&w2);
  unlink(w2.out); /* its run is not the question here */
  o.max_head_age_s = 600;
  cr_assert_eq(worker_sync(&w2, &t, m.url, &o, err, sizeof err),
               PULSE_ERR_STALE, "%s", err);
  cr_assert(strstr(err, "does not say when") != NULL, "%s", err);
  mirror_down(&m);
  it_trainer_down(&t);
  tu_rm_rf(w.work);
  tu_rm_rf(w2.work);
}

/* A second store published with the key of `a` (another run). */
static void trainer_up_same_key(it_trainer *b, const it_trainer *a) {
  it_trainer_up(b, 4, 32, 2);
  pulse_pub_free(b->pub_);
  pulse_sign_key_free(b->key);
  pulse_server_free(b->srv);
  tu_rm_rf(b->dir);
  b->dir = tu_make_dir();
  b->key = NULL; /* a's: not freed by b */
  memcpy(b->pub, a->pub, 32);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = b->dir;
  so.threads = 2;
  so.key = a->key;
  cr_assert_eq(pulse_server_create(&so, &b->srv), PULSE_OK);
  b->port = pulse_server_port(b->srv);
  snprintf(b->url, sizeof b->url, "http://127.0.0.1:%u", (unsigned)b->port);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.anchor_every = 4;
  po.keep_patches = 32;
  po.key = a->key;
  po.tensors = b->m.info;
  po.tensor_count = TU_TENSORS;
  po.threads = 1;
  po.anchor_sync = 1;
  po.on_head = pulse_server_on_head;
  po.on_head_ctx = b->srv;
  cr_assert_eq(pulse_pub_create(b->dir, &po, &b->pub_), PULSE_OK);
}

Test(trust, a_store_of_another_run_under_the_same_key_is_refused) {
  it_trainer a, b;
  it_trainer_up(&a, 4, 32, 2);
  it_trainer_run(&a, 0, 5, 0.01);
  trainer_up_same_key(&b, &a);
  it_trainer_run(&b, 0, 8, 0.02); /* other weights, further on */
  worker w;
  worker_up(&w);
  char err[1024], run[64], run_a[64], run_b[64];
  head_run_hex(a.dir, run_a);
  head_run_hex(b.dir, run_b);
  cr_assert_str_neq(run_a, run_b, "two stores, two runs");
  cr_assert_eq(worker_sync(&w, &a, a.url, NULL, NULL, 0), PULSE_OK);
  cr_assert_eq(file_step(&w, run), 5);
  cr_assert_str_eq(run, run_a, "the file names its run");
  /* With the cache, and without it (the file says which run it holds). */
  for (int lost = 0; lost < 2; lost++) {
    if (lost)
      worker_lose_cache(&w);
    cr_assert_eq(worker_sync(&w, &a, b.url, NULL, err, sizeof err),
                 PULSE_ERR_CORRUPT, "run B taken (cache lost: %d)", lost);
    cr_assert(strstr(err, "another run") != NULL, "%s", err);
    cr_assert_eq(file_step(&w, run), 5);
    cr_assert_str_eq(run, run_a);
  }
  /* Switching on purpose: from B's anchor, to B's weights. */
  pulse_sub_opts o = it_sub_opts(&a, w.cache, w.urls);
  o.switch_run = 1;
  cr_assert_eq(worker_sync(&w, &a, b.url, &o, err, sizeof err), PULSE_OK, "%s",
               err);
  cr_assert_eq(file_step(&w, run), 8);
  cr_assert_str_eq(run, run_b);
  pulse_st_file *f;
  cr_assert_eq(pulse_st_open(w.out, &f), PULSE_OK);
  cr_assert_str_eq(pulse_st_metadata_get(f, "state_digest"), b.digest[8]);
  pulse_st_close(f);
  /* And then B is the run it holds: A is refused. */
  it_trainer_run(&a, 6, 9, 0.01);
  cr_assert_eq(worker_sync(&w, &a, a.url, NULL, err, sizeof err),
               PULSE_ERR_CORRUPT, "%s", err);
  it_trainer_down(&b);
  it_trainer_down(&a);
  tu_rm_rf(w.work);
}

/* ------------------------------------------------------- several sources */

typedef struct {
  char mirror_url[64];
  atomic_int lagging;       /* LAGGING events naming the mirror */
  atomic_uint_fast64_t lag_step;
} lag_seen;

static void on_event(void *ctx, const pulse_sub_event *ev) {
  lag_seen *l = ctx;
  if (ev->type == PULSE_SUB_EV_LAGGING && ev->object != NULL &&
      strcmp(ev->object, l->mirror_url) == 0) {
    atomic_fetch_add(&l->lagging, 1);
    atomic_store(&l->lag_step, ev->from_step);
  }
}

static void *follow_thread(void *arg) {
  pulse_status *st = malloc(sizeof *st);
  *st = pulse_sub_follow(arg);
  return st;
}

static int wait_step(pulse_sub *sub, uint64_t step, double seconds) {
  double end = tu_now_s() + seconds;
  while (tu_now_s() < end) {
    uint64_t s = pulse_sub_step(sub);
    if (s != PULSE_SUB_NO_STEP && s >= step)
      return 1;
    sleep_ms(2);
  }
  return 0;
}

Test(trust, a_follower_leaves_a_stale_mirror_listed_first_for_the_trainer,
     .timeout = 60) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 5, 0.01);
  mirror m;
  mirror_up(&m, t.dir); /* step 5, like the trainer for now */
  char *cache = tu_make_dir();
  const char *urls[2];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  urls[0] = m.url;
  urls[1] = t.url;
  o.url_count = 2;
  const uint32_t interval_ms = 1000;
  o.poll_timeout_ms = interval_ms;
  lag_seen seen;
  memset(&seen, 0, sizeof seen);
  snprintf(seen.mirror_url, sizeof seen.mirror_url, "%s", m.url);
  o.on_event = on_event;
  o.on_event_ctx = &seen;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  pthread_t th;
  pthread_create(&th, NULL, follow_thread, sub);
  cr_assert(wait_step(sub, 5, 10), "the first sync");
  sleep_ms(50); /* the follower waits on a long-poll now */
  /* The trainer moves on; the mirror does not. */
  it_trainer_run(&t, 6, 7, 0.01);
  double t0 = tu_now_s();
  int reached = wait_step(sub, 7, 2.0 * interval_ms / 1000.0);
  double took = tu_now_s() - t0;
  cr_assert(reached, "the trainer's step 7 not reached in two poll intervals "
                     "(%.2f s)", took);
  cr_assert(it_targets_equal(&tg, &t, 7));
  /* The mirror is reported as lagging, once for its step. */
  double end = tu_now_s() + 2.0;
  while (atomic_load(&seen.lagging) == 0 && tu_now_s() < end)
    sleep_ms(10);
  pulse_sub_stop(sub);
  void *ret;
  pthread_join(th, &ret);
  cr_assert_eq(*(pulse_status *)ret, PULSE_OK);
  free(ret);
  cr_assert_eq(atomic_load(&seen.lagging), 1, "%d lagging events",
               atomic_load(&seen.lagging));
  cr_assert_eq(atomic_load(&seen.lag_step), 5);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_eq(fig.lagging_sources, 1);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  mirror_down(&m);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}
