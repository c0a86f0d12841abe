/* Histogram sums of /metrics (issue "Reliability and security", finding
 * 13a): pulse_longpoll_wakeup_seconds_sum read 0 after 500 wake-ups. An
 * in-process wake-up takes a fraction of a microsecond, and the sum was
 * kept in whole microseconds, each observation rounded to 0. The sum is
 * kept in nanoseconds now. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "http_serve_impl.h"
#include "http_testutil.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "trainer_testutil.h"

/* The value of the line "NAME VALUE" in a metrics text, or -1. */
static double metric(const char *text, const char *name) {
  size_t n = strlen(name);
  for (const char *p = text; (p = strstr(p, name)) != NULL; p += n)
    if ((p == text || p[-1] == '\n') && p[n] == ' ')
      return strtod(p + n + 1, NULL);
  return -1;
}

Test(serve_metrics, sub_microsecond_observations_add_up_in_the_sum) {
  pulse_serve_histogram h;
  memset(&h, 0, sizeof h);
  for (int i = 0; i < 500; i++)
    pulse_serve_histogram_add(&h, 2e-7); /* 0.2 us, an in-process wake-up */
  pulse_serve_histogram_add(&h, 1e300); /* clamped, not undefined */
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_serve_histogram_text(&b, "x_seconds", "", &h);
  pulse_bytebuf_byte(&b, 0);
  double sum = metric((const char *)b.data, "x_seconds_sum");
  cr_expect(sum > 1e9 && sum < 1e9 + 1e-3, "sum %.9f: %s", sum,
            (const char *)b.data);
  pulse_bytebuf_free(&b);
  memset(&h, 0, sizeof h);
  for (int i = 0; i < 500; i++)
    pulse_serve_histogram_add(&h, 2e-7);
  pulse_serve_histogram_text(&b, "x_seconds", "", &h);
  pulse_bytebuf_byte(&b, 0);
  sum = metric((const char *)b.data, "x_seconds_sum");
  cr_expect(sum > 0.9e-4 && sum < 1.1e-4, "500 x 0.2 us summed to %.9f s: %s",
            sum, (const char *)b.data);
  cr_expect_eq(metric((const char *)b.data, "x_seconds_count"), 500);
  pulse_bytebuf_free(&b);
}

typedef struct {
  uint16_t port;
  uint64_t after;
  ht_reply r;
} poll_job;

static void *poll_main(void *arg) {
  poll_job *j = arg;
  char path[96];
  snprintf(path, sizeof path, "/v1/head?after=%" PRIu64 "&timeout_ms=20000",
           j->after);
  j->r = ht_request(j->port, NULL, path, NULL, NULL);
  return NULL;
}

/* The real server: long-polls woken by an in-process commit. */
Test(serve_metrics, the_long_poll_wakeup_sum_is_not_zero) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 2);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  pulse_server *srv;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.threads = 1;
  o.on_head = pulse_server_on_head;
  o.on_head_ctx = srv;
  pulse_pub *pub;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_OK);
  enum { POLLS = 8, ROUNDS = 4 };
  for (uint64_t step = 1; step <= ROUNDS; step++) {
    poll_job j[POLLS];
    pthread_t th[POLLS];
    for (int i = 0; i < POLLS; i++) {
      j[i] = (poll_job){pulse_server_port(srv), step - 1, {0}};
      cr_assert_eq(pthread_create(&th[i], NULL, poll_main, &j[i]), 0);
    }
    for (int i = 0; i < 3000 && pulse_server_waiters(srv) < POLLS; i++)
      usleep(1000);
    cr_assert_eq(pulse_server_waiters(srv), POLLS);
    tu_model_step(&m, 0.02);
    tt_model_tensors(&m, t);
    cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, NULL), PULSE_OK);
    for (int i = 0; i < POLLS; i++) {
      pthread_join(th[i], NULL);
      cr_assert_eq(j[i].r.status, 200);
      ht_reply_free(&j[i].r);
    }
  }
  pulse_buffer text = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(srv, &text), PULSE_OK);
  char *s = strndup((const char *)text.data, text.size);
  double count = metric(s, "pulse_longpoll_wakeup_seconds_count");
  double sum = metric(s, "pulse_longpoll_wakeup_seconds_sum");
  cr_expect_eq(count, POLLS * ROUNDS, "%s", s);
  cr_expect(sum > 0 && sum < 1.0, "%g wake-ups summed to %.9f s", count, sum);
  free(s);
  pulse_buffer_free(&text);
  pulse_server_free(srv);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}
