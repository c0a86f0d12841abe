/* bench_loco_collab_eval.c - a collaboration peer's loss evaluator for
 * `pulse-bench loco`.
 *
 * The held-out loss of each round, off the peer's critical path. The
 * evaluating member (the next round's lowest id) hands a copy of the
 * global weights to a thread under SCHED_IDLE, which runs only when
 * nothing else wants the CPU, and reports "loss R LOSS" when done; the
 * peer waits for it before "done". Evaluated in line, the loss made that
 * member late to every next round: at 1,000,000 params it was busy 32% of
 * its time against 48% for the others and sent smaller payloads, so its
 * bytes in over its payload and the run's busy figures measured the
 * bench, not the collaboration. Copies wait at most EVAL_QUEUE_BYTES;
 * beyond, a round is evaluated in line. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_loco_collab_impl.h"

#define EVAL_QUEUE_BYTES (1ull << 30)

static void report_loss(int out, uint64_t round, double loss) {
  char line[96];
  int n = snprintf(line, sizeof line, "loss %" PRIu64 " %.9g\n", round, loss);
  if (write(out, line, (size_t)n) != n) /* one write: lines do not mix */
    return;
}

static void *evaluate_losses(void *arg) {
  loss_evaluator *ev = arg;
  struct sched_param none = {0};
  pthread_setschedparam(pthread_self(), SCHED_IDLE, &none); /* best effort */
  pthread_mutex_lock(&ev->lock);
  for (;;) {
    while (ev->head == NULL && !ev->closing)
      pthread_cond_wait(&ev->cond, &ev->lock);
    eval_job *j = ev->head;
    if (j == NULL)
      break;
    ev->head = j->next;
    if (ev->head == NULL)
      ev->tail = &ev->head;
    pthread_mutex_unlock(&ev->lock);
    double loss = NAN, acc;
    pulse_sim_problem_eval(ev->p, j->theta, &loss, &acc);
    report_loss(ev->out, j->round, loss);
    free(j->theta);
    free(j);
    pthread_mutex_lock(&ev->lock);
    ev->queued_bytes -= ev->P * sizeof(float);
  }
  pthread_mutex_unlock(&ev->lock);
  return NULL;
}

void bench_loco_collab_evaluator_start(loss_evaluator *ev,
                                       const pulse_sim_problem *p, uint64_t P,
                                       int out) {
  memset(ev, 0, sizeof *ev);
  ev->p = p;
  ev->P = P;
  ev->out = out;
  ev->tail = &ev->head;
  pthread_mutex_init(&ev->lock, NULL);
  pthread_cond_init(&ev->cond, NULL);
  ev->started = pthread_create(&ev->thread, NULL, evaluate_losses, ev) == 0;
}

/* Queues the loss of `round` at theta (copied), or evaluates it here when
 * the thread or the memory for a copy is missing. */
void bench_loco_collab_evaluator_post(loss_evaluator *ev, uint64_t round,
                                      const float *theta) {
  uint64_t bytes = ev->P * sizeof(float);
  eval_job *j = NULL;
  pthread_mutex_lock(&ev->lock);
  int room = ev->started && ev->queued_bytes + bytes <= EVAL_QUEUE_BYTES;
  pthread_mutex_unlock(&ev->lock);
  if (room && (j = calloc(1, sizeof *j)) != NULL &&
      (j->theta = malloc((size_t)bytes)) != NULL) {
    memcpy(j->theta, theta, (size_t)bytes);
    j->round = round;
    pthread_mutex_lock(&ev->lock);
    *ev->tail = j;
    ev->tail = &j->next;
    ev->queued_bytes += bytes;
    pthread_cond_signal(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    return;
  }
  free(j);
  double loss = NAN, acc;
  pulse_sim_problem_eval(ev->p, theta, &loss, &acc);
  report_loss(ev->out, round, loss);
}

/* Evaluates what is queued, then stops the thread. */
void bench_loco_collab_evaluator_finish(loss_evaluator *ev) {
  if (ev->started) {
    pthread_mutex_lock(&ev->lock);
    ev->closing = 1;
    pthread_cond_signal(&ev->cond);
    pthread_mutex_unlock(&ev->lock);
    pthread_join(ev->thread, NULL);
  }
  pthread_mutex_destroy(&ev->lock);
  pthread_cond_destroy(&ev->cond);
}
