/* Following a publisher with long-polls: new steps arrive promptly, a
 * reader holding the read lock always sees one whole step, and a stop ends
 * a waiting long-poll at once. */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "inf_testutil.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
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

Test(inference_side, follow_keeps_up_with_new_steps_through_long_polls,
     .timeout = 60) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 0, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.poll_timeout_ms = 20000;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  pthread_t th;
  pthread_create(&th, NULL, follow_thread, sub);
  cr_assert(wait_step(sub, 0, 10), "the first sync");
  double worst = 0;
  for (uint64_t s = 1; s <= 8; s++) {
    sleep_ms(30); /* let the follower reach its long-poll */
    tu_model_step(&t.m, 0.01);
    it_trainer_commit(&t, s);
    double t0 = tu_now_s();
    cr_assert(wait_step(sub, s, 10), "step %" PRIu64 " never arrived", s);
    if (tu_now_s() - t0 > worst)
      worst = tu_now_s() - t0;
  }
  pulse_sub_stop(sub);
  void *ret;
  pthread_join(th, &ret);
  cr_assert_eq(*(pulse_status *)ret, PULSE_OK);
  free(ret);
  cr_assert(it_targets_equal(&tg, &t, 8));
  cr_assert_lt(worst, 2.0, "a step took %.3f s to arrive", worst);
  pulse_sub_figures fig;
  pulse_sub_figures_get(sub, &fig);
  cr_assert_geq(fig.syncs, 9);
  cr_assert_eq(fig.anchors_applied, 1, "one anchor, then patches only");
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

/* A reader that records, under the read lock, the step and the state digest
 * of what it sees. */
typedef struct {
  pulse_sub *sub;
  it_trainer *t;
  it_targets *tg;
  atomic_int stop;
  uint64_t steps[4096];
  char digests[4096][65];
  size_t n;
} reader;

static void *read_loop(void *arg) {
  reader *r = arg;
  while (!atomic_load(&r->stop) && r->n < 4096) {
    uint64_t step;
    pulse_sub_read_lock(r->sub, &step);
    if (step != PULSE_SUB_NO_STEP) {
      pulse_tensor_digest d[TU_TENSORS];
      for (int i = 0; i < TU_TENSORS; i++)
        d[i] = pulse_digest_bf16(r->tg->data[i], r->t->m.numel[i]);
      pulse_state_digest sd;
      pulse_state_digest_compute(r->t->m.info, d, TU_TENSORS, &sd);
      r->steps[r->n] = step;
      pulse_state_digest_hex(&sd, r->digests[r->n]);
      r->n++;
    }
    pulse_sub_read_unlock(r->sub);
  }
  return NULL;
}

Test(inference_side, readers_never_see_a_mix_of_two_steps, .timeout = 60) {
  it_trainer t;
  it_trainer_up(&t, 5, 32, 20); /* larger tensors: a commit takes a while */
  it_trainer_run(&t, 0, 0, 0.05);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  reader *r = calloc(1, sizeof *r);
  r->sub = sub;
  r->t = &t;
  r->tg = &tg;
  pthread_t fth, rth;
  pthread_create(&fth, NULL, follow_thread, sub);
  pthread_create(&rth, NULL, read_loop, r);
  for (uint64_t s = 1; s <= 12; s++) {
    sleep_ms(15);
    tu_model_step(&t.m, 0.05);
    it_trainer_commit(&t, s);
  }
  cr_assert(wait_step(sub, 12, 10));
  atomic_store(&r->stop, 1);
  pthread_join(rth, NULL);
  pulse_sub_stop(sub);
  void *ret;
  pthread_join(fth, &ret);
  free(ret);
  cr_assert_gt(r->n, 10, "the reader read");
  uint64_t distinct = 0, last = PULSE_SUB_NO_STEP;
  for (size_t i = 0; i < r->n; i++) {
    cr_assert_lt(r->steps[i], 64);
    cr_assert_str_eq(r->digests[i], t.digest[r->steps[i]],
                     "read %zu saw a mix at step %" PRIu64, i, r->steps[i]);
    distinct += r->steps[i] != last;
    last = r->steps[i];
  }
  cr_assert_geq(distinct, 2, "the reader saw steps change");
  free(r);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}

Test(inference_side, stop_ends_a_waiting_long_poll_at_once) {
  it_trainer t;
  it_trainer_up(&t, 4, 32, 2);
  it_trainer_run(&t, 0, 1, 0.01);
  char *cache = tu_make_dir();
  const char *urls[1];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  o.poll_timeout_ms = 30000;
  pulse_sub *sub;
  it_targets tg;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets_attach(&tg, &t, sub);
  pthread_t th;
  pthread_create(&th, NULL, follow_thread, sub);
  cr_assert(wait_step(sub, 1, 10));
  sleep_ms(100); /* inside the long-poll now */
  double t0 = tu_now_s();
  pulse_sub_stop(sub);
  void *ret;
  pthread_join(th, &ret);
  free(ret);
  cr_assert_lt(tu_now_s() - t0, 1.0);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  it_trainer_down(&t);
  tu_rm_rf(cache);
}
