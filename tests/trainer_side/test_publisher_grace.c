/* Retention's grace period (issue 20, finding 5): with small retention and
 * fast publishing, an object that left the head stays downloadable for the
 * grace period, also across a restart of the publisher, and goes after
 * it. */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <time.h>

#include "http_testutil.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "store_impl.h"
#include "trainer_testutil.h"

static pulse_pub *open_pub(const char *dir, tu_model *m, pulse_server *srv,
                           double grace) {
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m->info;
  o.tensor_count = TU_TENSORS;
  o.keep_patches = 1;
  o.keep_anchors = 2;
  o.anchor_every = 2;
  o.anchor_sync = 1;
  o.threads = 1;
  o.grace_seconds = grace;
  o.on_head = pulse_server_on_head;
  o.on_head_ctx = srv;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  return pub;
}

static void commit(pulse_pub *pub, tu_model *m, uint64_t step) {
  pulse_pub_tensor t[TU_TENSORS];
  if (step > 0)
    tu_model_step(m, 0.02);
  tt_model_tensors(m, t);
  cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, NULL), PULSE_OK,
               "%s", pulse_error_detail());
  pulse_pub_wait(pub); /* the background removals are done */
}

static int head_names(const char *dir, const uint8_t sha[32]) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  int found = 0;
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++)
    found |= memcmp(pulse_store_head_patch(h, i)->sha256, sha, 32) == 0;
  for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++)
    found |= memcmp(pulse_store_head_anchor(h, i)->sha256, sha, 32) == 0;
  pulse_store_head_free(h);
  return found;
}

/* GET of the object: its status, and with 200 the body must hash to its
 * name. */
static long fetch(uint16_t port, const char *url_path, const uint8_t sha[32]) {
  ht_reply r = ht_request(port, NULL, url_path, NULL, NULL);
  if (r.status == 200) {
    uint8_t got[32];
    store_sha256(r.body, r.size, got);
    cr_assert_eq(memcmp(got, sha, 32), 0);
  }
  long status = r.status;
  ht_reply_free(&r);
  return status;
}

Test(publisher_grace, an_object_that_left_the_head_is_served_until_its_grace_ends) {
  const double grace = 1.5;
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 2);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = dir;
  so.threads = 2;
  so.watch = 0;
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK);
  uint16_t port = pulse_server_port(srv);
  pulse_pub *pub = open_pub(dir, &m, srv, grace);
  commit(pub, &m, 0);
  commit(pub, &m, 1);
  /* The patch of step 1, which a worker at step 0 plans to fetch. */
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  pulse_store_object x = *pulse_store_head_patch(h, 0);
  pulse_store_head_free(h);
  char url[200];
  snprintf(url, sizeof url, "/v1/%s", x.path);
  /* Fast publishing with one patch retained: it leaves the head at once. */
  uint64_t step = 2;
  double left = 0;
  for (; step <= 6; step++) {
    commit(pub, &m, step);
    if (left == 0 && !head_names(dir, x.sha256))
      left = tu_now_s();
  }
  cr_assert_gt(left, 0, "retention kept the patch of step 1");
  cr_assert_eq(fetch(port, url, x.sha256), 200,
               "an object that just left the head is gone");
  /* A restarted publisher keeps it for what is left of its grace. */
  pulse_pub_free(pub);
  pub = open_pub(dir, &m, srv, grace);
  commit(pub, &m, step++);
  cr_assert_lt(tu_now_s() - left, grace, "the test ran too slowly to check");
  cr_assert_eq(fetch(port, url, x.sha256), 200,
               "the restarted publisher removed an object in its grace");
  /* After the grace, the next commit removes it. */
  while (tu_now_s() < left + grace + 0.2)
    usleep(20000);
  commit(pub, &m, step++);
  cr_assert_eq(fetch(port, url, x.sha256), 404,
               "an object outlived its grace period");
  /* With no grace, retention removes at once (and recovery too). */
  pulse_pub_free(pub);
  pub = open_pub(dir, &m, srv, 0);
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  x = *pulse_store_head_patch(h, 0);
  pulse_store_head_free(h);
  snprintf(url, sizeof url, "/v1/%s", x.path);
  commit(pub, &m, step++);
  cr_assert(!head_names(dir, x.sha256));
  cr_assert_eq(fetch(port, url, x.sha256), 404);
  pulse_pub_free(pub);
  pulse_server_free(srv);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher_grace, a_negative_grace_is_refused) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 1);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.grace_seconds = -1;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_ARG);
  cr_assert_eq(pulse_store_recover_grace(dir, -1, NULL), PULSE_ERR_ARG);
  tu_model_free(&m);
  tu_rm_rf(dir);
}
