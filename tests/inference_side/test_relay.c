/* Relays: a subscriber that mirrors the store into its cache, with a pulse
 * server over that cache, serves other subscribers, which verify every
 * object themselves: a corrupted object in the relay's store is refused
 * downstream, and the origin (a second URL) serves instead. */
#include <inttypes.h>
#include <pthread.h>

#include "inf_testutil.h"

typedef struct {
  it_trainer t;
  char *relay_cache, *down_cache;
  pulse_sub *relay;
  pulse_server *relay_srv;
  char relay_url[64];
  const char *urls[2];
} fx;

static void fx_up(fx *f, uint64_t steps) {
  memset(f, 0, sizeof *f);
  it_trainer_up(&f->t, 4, 32, 2);
  it_trainer_run(&f->t, 0, steps, 0.01);
  f->relay_cache = tu_make_dir();
  f->down_cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&f->t, f->relay_cache, urls);
  o.mirror = 1;
  cr_assert_eq(pulse_sub_create(&o, &f->relay), PULSE_OK);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = f->relay_cache;
  so.threads = 2;
  so.watch = 1;
  cr_assert_eq(pulse_server_create(&so, &f->relay_srv), PULSE_OK);
  snprintf(f->relay_url, sizeof f->relay_url, "http://127.0.0.1:%u",
           (unsigned)pulse_server_port(f->relay_srv));
}

static void relay_sync(fx *f) {
  cr_assert_eq(pulse_sub_sync(f->relay), PULSE_OK, "%s",
               pulse_sub_error(f->relay));
  pulse_server_notify(f->relay_srv, -1);
}

static void fx_down(fx *f) {
  pulse_server_free(f->relay_srv);
  pulse_sub_free(f->relay);
  it_trainer_down(&f->t);
  tu_rm_rf(f->relay_cache);
  tu_rm_rf(f->down_cache);
}

Test(inference_side, a_relay_re_serves_what_it_holds) {
  fx f;
  fx_up(&f, 5);
  relay_sync(&f);
  /* The relay's cache is a whole store. */
  cr_assert_eq(
      pulse_store_verify(f.relay_cache,
                         PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE,
                         f.t.pub, NULL),
      PULSE_OK, "%s", pulse_error_detail());
  pulse_sub_opts o = it_sub_opts(&f.t, f.down_cache, f.urls);
  f.urls[0] = f.relay_url;
  pulse_sub *down;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &down), PULSE_OK);
  it_targets_attach(&tg, &f.t, down);
  cr_assert_eq(pulse_sub_sync(down), PULSE_OK, "%s", pulse_sub_error(down));
  cr_assert(it_targets_equal(&tg, &f.t, 5));
  it_trainer_run(&f.t, 6, 9, 0.01);
  relay_sync(&f);
  cr_assert_eq(pulse_sub_sync(down), PULSE_OK, "%s", pulse_sub_error(down));
  cr_assert(it_targets_equal(&tg, &f.t, 9));
  pulse_sub_figures fig;
  pulse_sub_figures_get(down, &fig);
  /* The relay holds no signing key: its catch-ups are not trusted. */
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN);
  cr_assert_eq(fig.rejected, 0);
  pulse_sub_free(down);
  it_targets_free(&tg);
  fx_down(&f);
}

Test(inference_side, a_corrupted_object_in_a_relay_is_refused_downstream) {
  fx f;
  fx_up(&f, 5);
  relay_sync(&f);
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(f.relay_cache, &h), PULSE_OK);
  const pulse_store_object *a =
      pulse_store_head_anchor(h, pulse_store_head_anchor_count(h) - 1);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", f.relay_cache, a->path);
  cr_assert_eq(tu_flip(path, 100), 0);

  /* Only the relay: its server sees the file changed, hashes it again
   * and answers 500 (it never serves the rotten bytes); nothing applied. */
  pulse_sub_opts o = it_sub_opts(&f.t, f.down_cache, f.urls);
  f.urls[0] = f.relay_url;
  pulse_sub *down;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &down), PULSE_OK);
  it_targets_attach(&tg, &f.t, down);
  cr_assert_eq(pulse_sub_sync(down), PULSE_ERR_IO);
  cr_assert_eq(pulse_sub_step(down), PULSE_SUB_NO_STEP);
  for (int i = 0; i < TU_TENSORS; i++)
    for (uint64_t k = 0; k < f.t.m.numel[i]; k++)
      cr_assert_eq(tg.data[i][k], 0);
  pulse_sub_free(down);

  /* The relay, then the origin: the origin's bytes verify. */
  f.urls[1] = f.t.url;
  o.url_count = 2;
  cr_assert_eq(pulse_sub_create(&o, &down), PULSE_OK);
  it_targets_free(&tg);
  it_targets_attach(&tg, &f.t, down);
  cr_assert_eq(pulse_sub_sync(down), PULSE_OK, "%s", pulse_sub_error(down));
  cr_assert(it_targets_equal(&tg, &f.t, 5));
  pulse_sub_free(down);
  it_targets_free(&tg);
  pulse_store_head_free(h);
  fx_down(&f);
}

/* Issue 20, finding 7 (the relay's side): an object that went bad in a
 * relay's cache was served to every downstream worker for ever, since the
 * relay hashed it once per process. Now a cached file that changed since
 * it was hashed is hashed again whenever the relay looks at it (each sync,
 * and each long-poll's end when it follows), dropped and fetched again:
 * a downstream worker is refused at most once. */
static void down_sync(fx *f, pulse_status want, uint64_t step) {
  pulse_sub_opts o = it_sub_opts(&f->t, f->down_cache, f->urls);
  f->urls[0] = f->relay_url;
  pulse_sub *down;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &down), PULSE_OK);
  it_targets_attach(&tg, &f->t, down);
  cr_assert_eq(pulse_sub_sync(down), want, "%s", pulse_sub_error(down));
  if (want == PULSE_OK)
    cr_assert(it_targets_equal(&tg, &f->t, step));
  pulse_sub_free(down);
  it_targets_free(&tg);
  tu_rm_rf(f->down_cache);
  f->down_cache = tu_make_dir();
}

/* Flips a byte of the relay's newest anchor. */
static void rot_anchor(fx *f) {
  pulse_store_head *h;
  cr_assert_eq(pulse_store_head_load(f->relay_cache, &h), PULSE_OK);
  const pulse_store_object *a =
      pulse_store_head_anchor(h, pulse_store_head_anchor_count(h) - 1);
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", f->relay_cache, a->path);
  cr_assert_eq(tu_flip(path, 100), 0);
  pulse_store_head_free(h);
}

static void *follow_thread(void *arg) {
  pulse_sub_follow(arg);
  return NULL;
}

Test(inference_side, a_relay_refetches_a_cached_object_that_went_bad,
     .timeout = 60) {
  fx f;
  fx_up(&f, 5);
  relay_sync(&f);
  rot_anchor(&f);
  down_sync(&f, PULSE_ERR_IO, 0); /* not served: the relay's server sees it */
  relay_sync(&f);                      /* the same head: nothing new */
  pulse_sub_figures fig;
  pulse_sub_figures_get(f.relay, &fig);
  cr_assert_eq(fig.rejected, 1, "the relay found its rotten anchor");
  cr_assert_eq(
      pulse_store_verify(f.relay_cache, PULSE_STORE_VERIFY_HASHES, f.t.pub,
                         NULL),
      PULSE_OK, "%s", pulse_error_detail());
  down_sync(&f, PULSE_OK, 5);

  /* A relay that follows checks at the end of every long-poll too, with no
   * new step to wake it. */
  pulse_sub_free(f.relay);
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&f.t, f.relay_cache, urls);
  o.mirror = 1;
  o.poll_timeout_ms = 200;
  cr_assert_eq(pulse_sub_create(&o, &f.relay), PULSE_OK);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, follow_thread, f.relay), 0);
  for (int i = 0; i < 500; i++) { /* its first sync */
    pulse_sub_figures_get(f.relay, &fig);
    if (fig.syncs > 0)
      break;
    usleep(10000);
  }
  rot_anchor(&f);
  for (int i = 0; i < 500; i++) {
    pulse_sub_figures_get(f.relay, &fig);
    if (fig.rejected > 0 && fig.objects_fetched > 0)
      break;
    usleep(10000);
  }
  pulse_sub_stop(f.relay);
  pthread_join(th, NULL);
  cr_assert_eq(fig.rejected, 1, "the following relay found it");
  cr_assert_eq(fig.objects_fetched, 1, "and fetched it again");
  down_sync(&f, PULSE_OK, 5);
  fx_down(&f);
}
