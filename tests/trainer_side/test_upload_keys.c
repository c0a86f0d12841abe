/* test_upload_keys.c - small objects of a bucket prefix by key
 * (pulse_upload.h, "Small objects by key": what the ranks of a sharded
 * trainer exchange through the bucket), against s3rver started per test on
 * 127.0.0.1 port 0: objects put are got back (one, or several at once,
 * absent ones empty) and listed, in key order; a many-object delete
 * crossing its batches removes exactly its names, an absent one being no
 * error; a bad name among them is refused with its reason while the others
 * still go. Skipped where node or s3rver is missing. */
#include <criterion/criterion.h>

#include "pulse_upload.h"
#include "s3rver_testutil.h"
#include "trainer_testutil.h"

#define TARGET "s3://bkt/runs/keys"
#define N 150 /* more than a delete batch (64) */

static s3rver_tu s3;

static void s3_start(void) {
  s3rver_tu_start(&s3, NULL);
}

static void s3_stop(void) {
  s3rver_tu_stop(&s3);
}

/* How many names are listed under shard/ (each once, in key order); the
 * first in `first`. */
static size_t listed(pulse_upload *up, char *first, size_t cap) {
  pulse_buffer names = {0};
  size_t n = 0;
  cr_assert_eq(pulse_upload_key_list(up, "shard/", &names, &n), PULSE_OK, "%s",
               pulse_error_detail());
  snprintf(first, cap, "%s", n > 0 ? (const char *)names.data : "");
  /* In key order, each name once. */
  const char *at = (const char *)names.data, *prev = NULL;
  for (size_t i = 0; i < n; prev = at, at += strlen(at) + 1, i++)
    cr_assert(prev == NULL || strcmp(prev, at) < 0, "%s listed after %s", at,
              prev);
  pulse_buffer_free(&names);
  return n;
}

Test(upload_keys, objects_put_are_listed_and_a_delete_of_many_removes_them,
     .init = s3_start, .fini = s3_stop, .timeout = 120) {
  pulse_upload_opts o;
  pulse_upload_opts_init(&o);
  o.target = TARGET;
  o.retries = 1;
  pulse_upload *up = NULL;
  cr_assert_eq(pulse_upload_create(&o, &up), PULSE_OK, "%s",
               pulse_error_detail());
  char rels[N][32], text[32], first[64];
  for (int i = 0; i < N; i++) {
    snprintf(rels[i], sizeof rels[i], "shard/k-%03d", i);
    int len = snprintf(text, sizeof text, "value %d", i);
    cr_assert_eq(pulse_upload_key_put(up, rels[i], text, (size_t)len), PULSE_OK,
                 "%s", pulse_error_detail());
  }
  cr_assert_eq(listed(up, first, sizeof first), N);
  cr_assert_str_eq(first, "shard/k-000");
  pulse_buffer b = {0};
  cr_assert_eq(pulse_upload_key_get(up, "shard/k-077", &b), PULSE_OK);
  cr_assert_eq(b.size, strlen("value 77"));
  cr_assert_arr_eq(b.data, "value 77", b.size);
  pulse_buffer_free(&b);

  /* Got at once: those there whole, none for one that is not. */
  const char *some[3] = {rels[3], "shard/absent", rels[120]};
  pulse_buffer outs[3];
  cr_assert_eq(pulse_upload_key_get_many(up, some, 3, outs), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert(outs[0].data != NULL && outs[0].size == strlen("value 3") &&
            memcmp(outs[0].data, "value 3", outs[0].size) == 0);
  cr_assert_null(outs[1].data);
  cr_assert(outs[2].data != NULL && outs[2].size == strlen("value 120") &&
            memcmp(outs[2].data, "value 120", outs[2].size) == 0);
  for (int i = 0; i < 3; i++)
    pulse_buffer_free(&outs[i]);
  const char *bad[2] = {rels[3], "/rooted"};
  cr_assert_eq(pulse_upload_key_get_many(up, bad, 2, outs), PULSE_ERR_ARG);
  cr_assert(outs[0].data == NULL && outs[1].data == NULL,
            "a failed call left a buffer");

  /* 100 of them and one that is not there: two batches. */
  const char *gone[101];
  for (int i = 0; i < 100; i++)
    gone[i] = rels[i];
  gone[100] = "shard/absent";
  cr_assert_eq(pulse_upload_key_delete_many(up, gone, 101), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(listed(up, first, sizeof first), N - 100);
  cr_assert_str_eq(first, "shard/k-100");
  cr_assert_eq(pulse_upload_key_get(up, "shard/k-099", &b), PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_upload_key_get(up, "shard/k-100", &b), PULSE_OK);
  pulse_buffer_free(&b);

  /* A bad name is refused, with its reason; the others still go. */
  const char *mixed[3] = {rels[100], "../elsewhere", rels[101]};
  cr_assert_eq(pulse_upload_key_delete_many(up, mixed, 3), PULSE_ERR_ARG);
  cr_assert(strstr(pulse_error_detail(), "'../elsewhere' is not a relative "
                                         "path") != NULL,
            "%s", pulse_error_detail());
  cr_assert_eq(listed(up, first, sizeof first), N - 102);
  cr_assert_str_eq(first, "shard/k-102");

  cr_assert_eq(pulse_upload_key_delete(up, "shard/absent"), PULSE_OK);
  cr_assert_eq(pulse_upload_key_delete(up, rels[149]), PULSE_OK);
  cr_assert_eq(listed(up, first, sizeof first), N - 103);
  cr_assert_eq(pulse_upload_key_delete_many(up, NULL, 0), PULSE_OK);
  cr_assert_eq(pulse_upload_key_delete_many(up, NULL, 1), PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_key_delete_many(NULL, gone, 1), PULSE_ERR_ARG);
  cr_assert_eq(listed(up, first, sizeof first), N - 103);
  pulse_upload_free(up);
}
