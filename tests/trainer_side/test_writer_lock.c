/* One writer per store: a second publisher on a live store (in this
 * process, or another) is refused, with its holder named, before it writes
 * anything; recovery is refused while a publisher holds the store; a dead
 * holder leaves no stale lock; verification hashes every named object. */
#include <criterion/criterion.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pulse_publisher.h"
#include "pulse_store.h"
#include "pulse_store_writer.h"
#include "trainer_testutil.h"

static pulse_status open_pub(const char *dir, tu_model *m, pulse_pub **pub) {
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m->info;
  o.tensor_count = TU_TENSORS;
  o.anchor_sync = 1;
  o.threads = 1;
  o.grace_seconds = 0;
  *pub = NULL;
  return pulse_pub_create(dir, &o, pub);
}

static void commit(pulse_pub *pub, tu_model *m, uint64_t step) {
  pulse_pub_tensor t[TU_TENSORS];
  if (step > 0)
    tu_model_step(m, 0.02);
  tt_model_tensors(m, t);
  cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, NULL), PULSE_OK,
               "%s", pulse_error_detail());
  pulse_pub_wait(pub);
}

static uint8_t *head_bytes(const char *dir, size_t *n) {
  char p[4096];
  tt_path(p, sizeof p, dir, "head.json");
  return tu_read(p, n);
}

Test(writer_lock, a_second_publisher_on_a_live_store_is_refused_naming_the_holder) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 3, 1);
  pulse_pub *first = NULL, *second = NULL;
  cr_assert_eq(open_pub(dir, &m, &first), PULSE_OK, "%s", pulse_error_detail());
  commit(first, &m, 0);
  commit(first, &m, 1);
  /* A live publisher's temporary: a second writer's recovery would take it. */
  char tmp[4096], objects[4096];
  tt_path(objects, sizeof objects, dir, "objects");
  tt_path(tmp, sizeof tmp, dir, "objects/.x.pulse.tmp-live");
  cr_assert_eq(tu_write(tmp, "x", 1), 0);
  size_t n0 = 0, n1 = 0;
  uint8_t *h0 = head_bytes(dir, &n0);
  int files = tt_count(objects);

  cr_assert_eq(open_pub(dir, &m, &second), PULSE_ERR_IO);
  cr_assert_null(second);
  char want[64];
  snprintf(want, sizeof want, "pid %ld on host", (long)getpid());
  cr_assert(strstr(pulse_error_detail(), "already has a writer") != NULL &&
                strstr(pulse_error_detail(), want) != NULL,
            "%s", pulse_error_detail());
  cr_assert_eq(pulse_store_recover(dir, NULL), PULSE_ERR_IO);
  cr_assert(access(tmp, F_OK) == 0, "the live publisher's temporary stays");
  cr_assert_eq(tt_count(objects), files);
  uint8_t *h1 = head_bytes(dir, &n1);
  cr_assert(n0 == n1 && memcmp(h0, h1, n0) == 0, "the head is untouched");
  free(h1);

  /* The holder goes on publishing; once it is gone the store is free. */
  commit(first, &m, 2);
  pulse_pub_free(first);
  cr_assert_eq(open_pub(dir, &m, &second), PULSE_OK, "%s", pulse_error_detail());
  uint64_t step = 0;
  cr_assert(pulse_pub_head_step(second, &step) && step == 2);
  commit(second, &m, 3);
  pulse_pub_free(second);
  free(h0);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(writer_lock, a_publisher_in_another_process_holds_the_store_until_it_dies) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 4, 1);
  int ready[2], go[2];
  cr_assert_eq(pipe(ready), 0);
  cr_assert_eq(pipe(go), 0);
  pid_t child = fork();
  cr_assert(child >= 0);
  if (child == 0) {
    pulse_pub *pub = NULL;
    char c = open_pub(dir, &m, &pub) == PULSE_OK ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1)
      _exit(2);
    _exit(0); /* dies holding it: no pulse_pub_free */
  }
  char c = 0;
  cr_assert_eq(read(ready[0], &c, 1), 1);
  cr_assert_eq(c, 'y');
  pulse_pub *pub = NULL;
  cr_assert_eq(open_pub(dir, &m, &pub), PULSE_ERR_IO);
  char want[64];
  snprintf(want, sizeof want, "pid %ld on host", (long)child);
  cr_assert(strstr(pulse_error_detail(), want) != NULL, "%s",
            pulse_error_detail());
  cr_assert_eq(write(go[1], "g", 1), 1);
  int status = 0;
  cr_assert_eq(waitpid(child, &status, 0), child);
  cr_assert_eq(open_pub(dir, &m, &pub), PULSE_OK, "no stale lock: %s",
               pulse_error_detail());
  commit(pub, &m, 0);
  pulse_pub_free(pub);
  close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(writer_lock, verify_refuses_a_named_object_whose_bytes_do_not_hash_to_its_name) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 1);
  pulse_pub *pub = NULL;
  cr_assert_eq(open_pub(dir, &m, &pub), PULSE_OK, "%s", pulse_error_detail());
  commit(pub, &m, 0);
  commit(pub, &m, 1);
  pulse_pub_free(pub);
  unsigned all = PULSE_STORE_VERIFY_HASHES | PULSE_STORE_VERIFY_STATE;
  cr_assert_eq(pulse_store_verify(dir, all, NULL, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  char path[4096];
  tt_path(path, sizeof path, dir, pulse_store_head_patch(h, 0)->path);
  pulse_store_head_free(h);
  /* Same size, one byte of the body flipped (the format may still parse). */
  size_t n = 0;
  uint8_t *bytes = tu_read(path, &n);
  bytes[n - 1] ^= 1;
  cr_assert_eq(tu_write(path, bytes, n), 0);
  free(bytes);
  cr_assert_eq(pulse_store_verify(dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
               PULSE_ERR_CORRUPT);
  cr_assert(strstr(pulse_error_detail(), "does not match its SHA-256 name") != NULL,
            "%s", pulse_error_detail());
  tu_model_free(&m);
  tu_rm_rf(dir);
}
