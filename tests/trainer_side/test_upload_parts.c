/* test_upload_parts.c - one object uploaded in parts by several handles
 * (pulse_upload.h, "One object, its parts put by several handles"), against
 * s3rver with S3's multipart answers (tests/cli/lib/s3rver_multipart.js:
 * abort, ETags checked at completion), started per test on 127.0.0.1 port
 * 0: parts put by two handles, one in another process, and completed by a
 * third make the object, byte for byte, named by the SHA-256 chained over
 * the parts; an abort leaves no object; a wrong ETag fails the completion
 * and leaves the upload open; bad arguments are refused before any request;
 * fetch_missing brings back what only the bucket holds, and refuses a
 * bucket object that is not its name's bytes, leaving nothing behind.
 * Skipped where node or s3rver is missing. */
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>

#include <criterion/criterion.h>

#include "http_testutil.h"
#include "pulse_sha256.h"
#include "pulse_store.h"
#include "pulse_upload.h"
#include "s3rver_testutil.h"
#include "store_impl.h"
#include "trainer_testutil.h"

#define TARGET "s3://bkt/runs/c"

/* ---------------------------------------------------------------- server */

static s3rver_tu s3;

/* Starts the stand-in (skips the test where it cannot run) and points the
 * uploader's environment at it. */
static void s3_start(void) {
  s3rver_tu_start(&s3, NULL);
}

static void s3_stop(void) {
  s3rver_tu_stop(&s3);
}

static pulse_upload *handle(unsigned retries) {
  pulse_upload_opts o;
  pulse_upload_opts_init(&o);
  o.target = TARGET;
  o.retries = retries;
  pulse_upload *up = NULL;
  cr_assert_eq(pulse_upload_create(&o, &up), PULSE_OK, "%s",
               pulse_error_detail());
  return up;
}

/* The bucket's object rel (anonymous GET: s3rver serves it). */
static ht_reply get_object(const char *rel) {
  char path[1200];
  snprintf(path, sizeof path, "/bkt/runs/c/%s", rel);
  return ht_request(s3.port, "GET", path, NULL, NULL);
}

/* Part k (1-based) of the object of the first test: distinct bytes, the
 * last one shorter. */
enum { PART = 4096, LAST = 1000, PARTS = 3 };
static size_t part_len(int k) {
  return k == PARTS ? LAST : PART;
}
static void part_fill(int k, uint8_t *out) {
  for (size_t i = 0; i < part_len(k); i++)
    out[i] = (uint8_t)(k * 31 + i * 7);
}

/* ----------------------------------------------------------------- parts */

Test(upload_parts, parts_from_two_handles_and_processes_make_one_object,
     .init = s3_start, .fini = s3_stop) {
  uint8_t parts[PARTS][PART], whole[2 * PART + LAST];
  size_t total = 0;
  for (int k = 1; k <= PARTS; k++) {
    part_fill(k, parts[k - 1]);
    memcpy(whole + total, parts[k - 1], part_len(k));
    total += part_len(k);
  }
  /* The name: the SHA-256 chained over the parts, its state sent between
   * holders as bytes. */
  pulse_sha256_state s, received;
  pulse_sha256_begin(&s);
  for (int k = 1; k <= PARTS; k++) {
    cr_assert_eq(pulse_sha256_add(&s, parts[k - 1], part_len(k)), PULSE_OK);
    memcpy(received.bytes, s.bytes, sizeof s.bytes);
    s = received;
  }
  uint8_t sha[32], want[32];
  char hex[65], rel[128];
  cr_assert_eq(pulse_sha256_end(&s, sha), PULSE_OK);
  store_sha256(whole, total, want);
  cr_assert_arr_eq(sha, want, 32);
  store_hex(sha, 32, hex);
  snprintf(rel, sizeof rel, "objects/%s.safetensors", hex);

  pulse_upload *first = handle(1), *third = handle(1);
  char id[1024], etags[PARTS][256];
  cr_assert_eq(pulse_upload_part_begin(first, rel, id, sizeof id), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(pulse_upload_part_put(first, rel, id, 1, parts[0], PART,
                                     etags[0], sizeof etags[0]),
               PULSE_OK, "%s", pulse_error_detail());
  /* Parts 2 and 3 from another process and its own handle; the ETags come
   * back through a pipe. */
  int fds[2];
  cr_assert_eq(pipe(fds), 0);
  pid_t child = fork();
  cr_assert_geq(child, 0);
  if (child == 0) {
    close(fds[0]);
    pulse_upload_opts o;
    pulse_upload_opts_init(&o);
    o.target = TARGET;
    pulse_upload *second = NULL;
    int ok = pulse_upload_create(&o, &second) == PULSE_OK;
    for (int k = 2; ok && k <= PARTS; k++)
      ok = pulse_upload_part_put(second, rel, id, (uint32_t)k, parts[k - 1],
                                 part_len(k), etags[k - 1],
                                 sizeof etags[k - 1]) == PULSE_OK &&
           write(fds[1], etags[k - 1], sizeof etags[k - 1]) ==
               (ssize_t)sizeof etags[k - 1];
    pulse_upload_free(second);
    _exit(ok ? 0 : 1);
  }
  close(fds[1]);
  for (int k = 2; k <= PARTS; k++)
    cr_assert_eq(read(fds[0], etags[k - 1], sizeof etags[k - 1]),
                 (ssize_t)sizeof etags[k - 1]);
  close(fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  uint64_t size = 0;
  cr_assert_eq(pulse_upload_object_size(third, rel, &size), PULSE_ERR_NOT_FOUND,
               "the object is there before its upload completed");
  const char *list[PARTS] = {etags[0], etags[1], etags[2]};
  cr_assert_eq(pulse_upload_part_finish(third, rel, id, list, PARTS), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(pulse_upload_object_size(third, rel, &size), PULSE_OK);
  cr_assert_eq(size, total);
  ht_reply r = get_object(rel);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, total);
  cr_assert_arr_eq(r.body, whole, total, "the object is not its parts");
  ht_reply_free(&r);
  pulse_upload_free(first);
  pulse_upload_free(third);
}

/* Begins an upload of rel (its id in id) and puts part as its part 1 (the
 * part's ETag in etag). */
static void begin_with_part_1(pulse_upload *up, const char *rel,
                              const uint8_t part[PART], char id[1024],
                              char etag[256]) {
  cr_assert_eq(pulse_upload_part_begin(up, rel, id, 1024), PULSE_OK);
  cr_assert_eq(pulse_upload_part_put(up, rel, id, 1, part, PART, etag, 256),
               PULSE_OK);
}

Test(upload_parts, an_abort_leaves_no_object_and_the_upload_gone,
     .init = s3_start, .fini = s3_stop) {
  pulse_upload *up = handle(1);
  const char *rel = "objects/aborted.safetensors";
  char id[1024], etag[256];
  uint8_t part[PART];
  part_fill(1, part);
  begin_with_part_1(up, rel, part, id, etag);
  cr_assert_eq(pulse_upload_part_abort(up, rel, id), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t size;
  cr_assert_eq(pulse_upload_object_size(up, rel, &size), PULSE_ERR_NOT_FOUND);
  cr_assert_eq(pulse_upload_part_abort(up, rel, id), PULSE_ERR_NOT_FOUND);
  char etag2[256];
  cr_assert_eq(
      pulse_upload_part_put(up, rel, id, 2, part, PART, etag2, sizeof etag2),
      PULSE_ERR_IO);
  cr_assert(strstr(pulse_error_detail(), "NoSuchUpload") != NULL, "%s",
            pulse_error_detail());
  const char *list[1] = {etag};
  cr_assert_eq(pulse_upload_part_finish(up, rel, id, list, 1), PULSE_ERR_IO);
  cr_assert_eq(pulse_upload_object_size(up, rel, &size), PULSE_ERR_NOT_FOUND);
  pulse_upload_free(up);
}

Test(upload_parts, a_wrong_etag_fails_the_completion_and_leaves_it_open,
     .init = s3_start, .fini = s3_stop) {
  pulse_upload *up = handle(1);
  const char *rel = "objects/wrong-etag.safetensors";
  char id[1024], etag[256];
  uint8_t part[PART];
  part_fill(2, part);
  begin_with_part_1(up, rel, part, id, etag);
  const char *wrong[1] = {"\"00000000000000000000000000000000\""};
  cr_assert_eq(pulse_upload_part_finish(up, rel, id, wrong, 1), PULSE_ERR_IO);
  const char *why = pulse_error_detail();
  cr_assert(strstr(why, "completing a multipart upload") != NULL &&
                strstr(why, "HTTP 400 InvalidPart") != NULL &&
                strstr(why, "runs/c/objects/wrong-etag.safetensors") != NULL,
            "%s", why);
  /* A part that was never put. */
  const char *two[2] = {etag, etag};
  cr_assert_eq(pulse_upload_part_finish(up, rel, id, two, 2), PULSE_ERR_IO);
  uint64_t size;
  cr_assert_eq(pulse_upload_object_size(up, rel, &size), PULSE_ERR_NOT_FOUND);
  const char *right[1] = {etag};
  cr_assert_eq(pulse_upload_part_finish(up, rel, id, right, 1), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_upload_object_size(up, rel, &size), PULSE_OK);
  cr_assert_eq(size, PART);
  pulse_upload_free(up);
}

/* No server: each call must refuse before it sends anything. */
Test(upload_parts, bad_arguments_are_refused_before_any_request) {
  setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1", 1); /* nothing listens */
  pulse_upload *up = handle(1);
  char id[1024], etag[256];
  uint8_t part[16] = {0};
  uint64_t size;
  const char *bad_rels[] = {
      "",           "/objects/x", "../x",         "objects/../../x",
      "objects/..", "a b",        "objects/\x01", ".."};
  for (size_t i = 0; i < sizeof bad_rels / sizeof *bad_rels; i++) {
    cr_assert_eq(pulse_upload_part_begin(up, bad_rels[i], id, sizeof id),
                 PULSE_ERR_ARG, "rel '%s'", bad_rels[i]);
    cr_assert_eq(pulse_upload_object_size(up, bad_rels[i], &size),
                 PULSE_ERR_ARG, "rel '%s'", bad_rels[i]);
  }
  const char *rel = "objects/x.safetensors";
  cr_assert_eq(pulse_upload_part_put(up, rel, "id", 0, part, 16, etag, 256),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_put(up, rel, "id", 10001, part, 16, etag, 256),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_put(up, rel, "id", 1, NULL, 16, etag, 256),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_put(up, rel, "", 1, part, 16, etag, 256),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_put(up, rel, "id\n", 1, part, 16, etag, 256),
               PULSE_ERR_ARG);
  const char *xml[1] = {"\"a</ETag><Part>\""};
  cr_assert_eq(pulse_upload_part_finish(up, rel, "id", xml, 1), PULSE_ERR_ARG);
  const char *null_etag[1] = {NULL};
  cr_assert_eq(pulse_upload_part_finish(up, rel, "id", null_etag, 1),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_finish(up, rel, "id", xml, 0), PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_abort(up, rel, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_begin(up, rel, id, 0), PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_object_size(up, rel, NULL), PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_part_begin(NULL, rel, id, sizeof id),
               PULSE_ERR_ARG);
  cr_assert_eq(pulse_upload_fetch_missing(NULL, "/tmp", NULL), PULSE_ERR_ARG);
  pulse_upload_free(up);
}

/* ----------------------------------------------------------- fetch_missing */

/* The names in dir that start with '.' (temporaries). */
static int hidden_in(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;)
    n += e->d_name[0] == '.' && strcmp(e->d_name, ".") != 0 &&
         strcmp(e->d_name, "..") != 0;
  if (d != NULL)
    closedir(d);
  return n;
}

/* A store of two steps (an anchor each, and a patch), uploaded by up:
 * its folder (tu_rm_rf). */
static char *published_store(pulse_upload *up) {
  char *store = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 5, 1);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.anchor_every = 1;
  o.threads = 2;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(store, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  for (uint64_t step = 1; step <= 2; step++) {
    tu_model_step(&m, 0.01);
    tt_model_tensors(&m, t);
    cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, NULL), PULSE_OK,
                 "%s", pulse_error_detail());
  }
  cr_assert_eq(pulse_pub_flush(pub, NULL), PULSE_OK);
  pulse_pub_free(pub);
  tu_model_free(&m);
  cr_assert_eq(pulse_upload_store(up, store, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  return store;
}

Test(upload_parts, fetch_missing_brings_back_only_the_named_bytes,
     .init = s3_start, .fini = s3_stop) {
  pulse_upload *up = handle(1);
  char *store = published_store(up);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(store, &h), PULSE_OK);
  size_t np = pulse_store_head_patch_count(h);
  size_t n = np + pulse_store_head_anchor_count(h);
  cr_assert_geq(pulse_store_head_anchor_count(h), 1);
  cr_assert_geq(n, 2);
  /* Every object gone from the store: all come back, byte for byte. */
  uint8_t *saved[16] = {0};
  size_t saved_len[16];
  char path[1200], objects[1200];
  tt_path(objects, sizeof objects, store, PULSE_STORE_OBJECTS_DIR);
  for (size_t i = 0; i < n && i < 16; i++) {
    const pulse_store_object *obj = i < np ? pulse_store_head_patch(h, i)
                                           : pulse_store_head_anchor(h, i - np);
    tt_path(path, sizeof path, store, obj->path);
    saved[i] = tu_read(path, &saved_len[i]);
    cr_assert_not_null(saved[i]);
    cr_assert_eq(unlink(path), 0);
  }
  size_t fetched = 0;
  cr_assert_eq(pulse_upload_fetch_missing(up, store, &fetched), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(fetched, n);
  for (size_t i = 0; i < n && i < 16; i++) {
    const pulse_store_object *obj = i < np ? pulse_store_head_patch(h, i)
                                           : pulse_store_head_anchor(h, i - np);
    tt_path(path, sizeof path, store, obj->path);
    size_t len = 0;
    uint8_t *back = tu_read(path, &len);
    cr_assert_eq(len, saved_len[i]);
    cr_assert_arr_eq(back, saved[i], len, "%s came back changed", obj->path);
    free(back);
  }
  cr_assert_eq(pulse_upload_fetch_missing(up, store, &fetched), PULSE_OK);
  cr_assert_eq(fetched, 0, "fetched what was not missing");

  /* The bucket's anchor replaced by other bytes (its size, then one byte
   * more), the store's removed: refused, nothing left in objects/. */
  const pulse_store_object *anchor = pulse_store_head_anchor(h, 0);
  size_t ai = np, alen = saved_len[ai];
  uint8_t *other = malloc(alen + 1);
  memcpy(other, saved[ai], alen);
  other[alen / 2] ^= 1;
  other[alen] = 'x';
  int entries = tt_count(objects);
  for (int more = 0; more <= 1; more++) {
    char id[1024], etag[256];
    cr_assert_eq(pulse_upload_part_begin(up, anchor->path, id, sizeof id),
                 PULSE_OK);
    cr_assert_eq(pulse_upload_part_put(up, anchor->path, id, 1, other,
                                       alen + (size_t)more, etag, sizeof etag),
                 PULSE_OK);
    const char *list[1] = {etag};
    cr_assert_eq(pulse_upload_part_finish(up, anchor->path, id, list, 1),
                 PULSE_OK);
    tt_path(path, sizeof path, store, anchor->path);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(pulse_upload_fetch_missing(up, store, &fetched),
                 PULSE_ERR_CORRUPT, "bucket object of %s bytes was taken",
                 more ? "more" : "other");
    cr_assert_eq(fetched, 0);
    cr_assert_eq(access(path, F_OK), -1, "a refused object is in the store");
    cr_assert_eq(hidden_in(objects), 0, "a temporary was left behind");
    cr_assert_eq(tt_count(objects), entries - 1);
    cr_assert_eq(tu_write(path, saved[ai], alen), 0); /* as it was */
  }
  free(other);

  /* An object neither the store nor the bucket holds. */
  const pulse_store_object *patch = pulse_store_head_patch(h, 0);
  if (np > 0) {
    char key[1200];
    snprintf(key, sizeof key, "/bkt/runs/c/%s", patch->path);
    ht_reply r = ht_request(s3.port, "DELETE", key, NULL, NULL);
    ht_reply_free(&r);
    tt_path(path, sizeof path, store, patch->path);
    cr_assert_eq(unlink(path), 0);
    cr_assert_eq(pulse_upload_fetch_missing(up, store, &fetched),
                 PULSE_ERR_NOT_FOUND);
    cr_assert(strstr(pulse_error_detail(), "no such object either") != NULL,
              "%s", pulse_error_detail());
    cr_assert_eq(hidden_in(objects), 0);
  }
  for (size_t i = 0; i < n && i < 16; i++)
    free(saved[i]);
  pulse_store_head_free(h);
  pulse_upload_free(up);
  tu_rm_rf(store);
}

Test(upload_parts, a_completion_failing_inside_a_200_answer_is_a_failure,
     .init = s3_start, .fini = s3_stop) {
  pulse_upload *up = handle(1);
  const char *rel = "objects/error-in-200.safetensors"; /* the stand-in's */
  char id[1024], etag[256];
  uint8_t part[PART];
  part_fill(1, part);
  begin_with_part_1(up, rel, part, id, etag);
  const char *list[1] = {etag};
  cr_assert_eq(pulse_upload_part_finish(up, rel, id, list, 1), PULSE_ERR_IO);
  cr_assert(strstr(pulse_error_detail(), "HTTP 200 InternalError") != NULL,
            "%s", pulse_error_detail());
  uint64_t size;
  cr_assert_eq(pulse_upload_object_size(up, rel, &size), PULSE_ERR_NOT_FOUND);
  pulse_upload_free(up);
}

/* The stand-in cuts the first two GETs of objects after half their body. */
static void s3_start_cutting(void) {
  setenv("S3_CUT_GETS", "2", 1);
  s3_start();
  unsetenv("S3_CUT_GETS");
}

Test(upload_parts, fetch_missing_starts_over_after_a_cut_answer,
     .init = s3_start_cutting, .fini = s3_stop) {
  pulse_upload *up = handle(0), *retrying = handle(1);
  char *store = published_store(up);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(store, &h), PULSE_OK);
  const pulse_store_object *anchor = pulse_store_head_anchor(h, 0);
  char path[1200], objects[1200];
  tt_path(path, sizeof path, store, anchor->path);
  tt_path(objects, sizeof objects, store, PULSE_STORE_OBJECTS_DIR);
  size_t len = 0, fetched = 9;
  uint8_t *want = tu_read(path, &len);
  cr_assert_eq(unlink(path), 0);
  /* Without retries: the cut is a failure, and nothing is left. */
  cr_assert_eq(pulse_upload_fetch_missing(up, store, &fetched), PULSE_ERR_IO);
  cr_assert_eq(fetched, 0);
  cr_assert_eq(access(path, F_OK), -1);
  cr_assert_eq(hidden_in(objects), 0, "a temporary was left behind");
  /* With one: cut again, then whole; the retry starts the file over. */
  cr_assert_eq(pulse_upload_fetch_missing(retrying, store, &fetched), PULSE_OK,
               "%s", pulse_error_detail());
  cr_assert_eq(fetched, 1);
  size_t got_len = 0;
  uint8_t *got = tu_read(path, &got_len);
  cr_assert_eq(got_len, len);
  cr_assert_arr_eq(got, want, len);
  cr_assert_eq(hidden_in(objects), 0, "a temporary was left behind");
  free(got), free(want);
  pulse_store_head_free(h);
  pulse_upload_free(up), pulse_upload_free(retrying);
  tu_rm_rf(store);
}
