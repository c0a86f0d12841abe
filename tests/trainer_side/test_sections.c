/* The section index beside each patch (issue 34): the publisher writes
 * sections/<patch sha256>, signed by its key, naming the patch and
 * the hash of its header and table and of every tensor's section; store
 * verification checks it; the server serves it; it goes with its patch;
 * hostile indexes (truncated, oversized, another magic or version, a
 * flipped byte) are refused with a clear error. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>

#include "http_testutil.h"
#include "pulse_publisher.h"
#include "pulse_server.h"
#include "pulse_store.h"
#include "store_impl.h"
#include "store_sections_impl.h"
#include "trainer_testutil.h"

typedef struct {
  char *dir;
  tu_model m;
  pulse_sign_key *key;
  uint8_t pub[32];
  pulse_pub *p;
} fx;

/* A publisher keeping `keep` patches and an anchor every `anchor_every`
 * steps, removing what leaves the head at once (no grace). */
static double fx_grace = 0; /* grace_seconds of the next fx_up_anchors */

static void fx_up_anchors(fx *f, uint64_t keep, uint64_t anchor_every) {
  memset(f, 0, sizeof *f);
  f->dir = tu_make_dir();
  tu_model_init(&f->m, 5, 8);
  cr_assert_eq(pulse_sign_key_generate(&f->key), PULSE_OK);
  pulse_sign_key_public(f->key, f->pub);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = f->m.info;
  o.tensor_count = TU_TENSORS;
  o.keep_patches = keep;
  o.keep_anchors = 2;
  o.anchor_every = anchor_every;
  o.anchor_sync = 1;
  o.threads = 1;
  o.key = f->key;
  o.grace_seconds = fx_grace;
  cr_assert_eq(pulse_pub_create(f->dir, &o, &f->p), PULSE_OK, "%s",
               pulse_error_detail());
}

static void fx_up(fx *f, uint64_t keep) {
  fx_up_anchors(f, keep, 100);
}

static void fx_commit(fx *f, uint64_t step) {
  pulse_pub_tensor t[TU_TENSORS];
  if (step > 0)
    tu_model_step(&f->m, 0.05);
  tt_model_tensors(&f->m, t);
  cr_assert_eq(pulse_pub_commit(f->p, step, t, TU_TENSORS, NULL), PULSE_OK,
               "%s", pulse_error_detail());
  pulse_pub_wait(f->p);
}

static void fx_down(fx *f) {
  pulse_pub_free(f->p);
  pulse_sign_key_free(f->key);
  tu_model_free(&f->m);
  tu_rm_rf(f->dir);
}

/* The oldest patch the store's head names. */
static pulse_store_object first_patch(const fx *f) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f->dir, &h), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_store_object o = *pulse_store_head_patch(h, 0);
  pulse_store_head_free(h);
  return o;
}

static char *index_path(const fx *f, const uint8_t sha[32]) {
  static char path[4096];
  char rel[160];
  store_sections_path(sha, rel, sizeof rel);
  snprintf(path, sizeof path, "%s/%s", f->dir, rel);
  return path;
}

Test(sections, every_patch_has_a_signed_index_that_matches_it) {
  fx f;
  fx_up(&f, 8);
  for (uint64_t s = 0; s <= 3; s++)
    fx_commit(&f, s);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_patch_count(h), 3);
  for (size_t i = 0; i < 3; i++) {
    const pulse_store_object *o = pulse_store_head_patch(h, i);
    size_t n = 0, pn = 0;
    uint8_t *b = tu_read(index_path(&f, o->sha256), &n);
    cr_assert_not_null(b, "no index for %s", o->path);
    char pp[4096];
    tt_path(pp, sizeof pp, f.dir, o->path);
    uint8_t *patch = tu_read(pp, &pn);
    store_sections s;
    cr_assert_eq(store_sections_parse(b, n, &s), PULSE_OK, "%s",
                 pulse_error_detail());
    cr_assert(s.is_signed);
    cr_assert_eq(memcmp(s.pub, f.pub, 32), 0, "signed by another key");
    cr_assert_eq(memcmp(s.patch_sha256, o->sha256, 32), 0);
    cr_assert_eq(s.patch_size, o->size);
    cr_assert_eq(s.count, TU_TENSORS);
    cr_assert_eq(store_sections_check_patch(&s, patch, pn), PULSE_OK, "%s",
                 pulse_error_detail());
    /* A flipped byte in any section, or in the table, is found. */
    for (size_t at = 120; at < pn; at += pn / 7) {
      patch[at] ^= 0x10;
      cr_assert_eq(store_sections_check_patch(&s, patch, pn), PULSE_ERR_CORRUPT,
                   "byte %zu flipped went unseen", at);
      patch[at] ^= 0x10;
    }
    store_sections_free(&s);
    free(b);
    free(patch);
  }
  pulse_store_head_free(h);
  pulse_store_verify_figures vf;
  cr_assert_eq(pulse_store_verify(f.dir, PULSE_STORE_VERIFY_HASHES, f.pub, &vf),
               PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(vf.strays, 0, "the indexes count as strays");
  fx_down(&f);
}

Test(sections, verify_refuses_an_index_that_does_not_match_its_patch) {
  fx f;
  fx_up(&f, 8);
  fx_commit(&f, 0);
  fx_commit(&f, 1);
  pulse_store_object first = first_patch(&f);
  const char *path = index_path(&f, first.sha256);
  size_t n = 0;
  uint8_t *b = tu_read(path, &n);
  for (size_t at = 0; at < n; at += 29) {
    b[at] ^= 4;
    cr_assert_eq(tu_write(path, b, n), 0);
    cr_assert_eq(
        pulse_store_verify(f.dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
        PULSE_ERR_CORRUPT, "byte %zu of the index flipped went unseen", at);
    b[at] ^= 4;
  }
  cr_assert_eq(tu_write(path, b, n), 0);
  cr_assert_eq(pulse_store_verify(f.dir, PULSE_STORE_VERIFY_HASHES, NULL, NULL),
               PULSE_OK);
  free(b);
  fx_down(&f);
}

Test(sections, hostile_indexes_are_refused_with_clear_errors) {
  fx f;
  fx_up(&f, 8);
  fx_commit(&f, 0);
  fx_commit(&f, 1);
  pulse_store_object first = first_patch(&f);
  size_t n = 0;
  uint8_t *b = tu_read(index_path(&f, first.sha256), &n);
  store_sections s;
  uint8_t *big = tu_alloc(n + 32);
  memcpy(big, b, n);
  memset(big + n, 0, 32);
  cr_assert_eq(store_sections_parse(big, n + 32, &s), PULSE_ERR_TRAILING);
  cr_assert_eq(store_sections_parse(b, n - 1, &s), PULSE_ERR_TRUNCATED);
  cr_assert_eq(store_sections_parse(b, 50, &s), PULSE_ERR_TRUNCATED);
  cr_assert_eq(store_sections_parse(NULL, 0, &s), PULSE_ERR_TRUNCATED);
  /* A count that does not fit the bytes, or that overflows a size. */
  memcpy(big, b, n);
  memset(big + 96, 0xff, 8);
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_ERR_TRUNCATED);
  memcpy(big, b, n);
  big[96] ^= 1;
  pulse_status st = store_sections_parse(big, n, &s);
  cr_assert(st == PULSE_ERR_TRUNCATED || st == PULSE_ERR_TRAILING, "%d", st);
  memcpy(big, b, n);
  big[0] = 'X';
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_ERR_MAGIC);
  memcpy(big, b, n);
  big[8] = 2;
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_ERR_VERSION);
  memcpy(big, b, n);
  big[10] |= 2;
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_ERR_CORRUPT);
  /* Any other byte: the signature. */
  for (size_t at = 16; at < n; at += 7) {
    if (at >= 96 && at < 104)
      continue; /* the count: sizes, above */
    memcpy(big, b, n);
    big[at] ^= 0x40;
    cr_assert_neq(store_sections_parse(big, n, &s), PULSE_OK,
                  "byte %zu flipped went unseen", at);
  }
  /* Unsigned, with a key left in: refused; unsigned and clean: parses. */
  memcpy(big, b, n);
  big[10] = 0;
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_ERR_CORRUPT);
  memset(big + n - 96, 0, 96);
  cr_assert_eq(store_sections_parse(big, n, &s), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert(!s.is_signed);
  store_sections_free(&s);
  free(big);
  free(b);
  fx_down(&f);
}

Test(sections, an_index_goes_with_its_patch) {
  fx f;
  fx_up_anchors(&f, 2, 2);
  uint8_t first[32];
  for (uint64_t s = 0; s <= 5; s++) {
    fx_commit(&f, s);
    if (s == 1) {
      memcpy(first, first_patch(&f).sha256, 32);
      cr_assert_eq(access(index_path(&f, first), F_OK), 0, "no index written");
    }
  }
  cr_assert_neq(access(index_path(&f, first), F_OK), 0,
                "the index outlived its patch");
  /* Those of the patches still named are there, and nothing else. */
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  size_t np = pulse_store_head_patch_count(h),
         na = pulse_store_head_anchor_count(h);
  for (size_t i = 0; i < np; i++)
    cr_assert_eq(
        access(index_path(&f, pulse_store_head_patch(h, i)->sha256), F_OK), 0);
  char objects[4096];
  tt_path(objects, sizeof objects, f.dir, "objects");
  cr_assert_eq(tt_count(objects), (int)(np + na));
  tt_path(objects, sizeof objects, f.dir, "sections");
  cr_assert_eq(tt_count(objects), (int)np);
  pulse_store_head_free(h);
  fx_down(&f);
}

/* With a grace period, a patch that leaves the head is kept until its
 * mtime (when it left) plus the grace, and a restarted publisher goes by
 * that mtime: its index must say the same, or a restart would remove the
 * index first (workers would then fetch that patch whole). */
Test(sections, a_retired_index_keeps_its_patch_s_time) {
  fx f;
  fx_grace = 3600;
  fx_up_anchors(&f, 1, 2);
  fx_grace = 0;
  fx_commit(&f, 0);
  fx_commit(&f, 1);
  pulse_store_object first = first_patch(&f);
  /* Made an hour ago, as far as the files say. */
  char patch[4096];
  tt_path(patch, sizeof patch, f.dir, first.path);
  struct timespec old[2] = {{0, UTIME_OMIT}, {time(NULL) - 3600, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, patch, old, 0), 0);
  cr_assert_eq(utimensat(AT_FDCWD, index_path(&f, first.sha256), old, 0), 0);
  /* Anchors at 2 and 4, one patch kept: step 1's patch leaves the head. */
  for (uint64_t s = 2; s <= 4; s++)
    fx_commit(&f, s);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++)
    cr_assert_neq(pulse_store_head_patch(h, i)->step, 1,
                  "step 1 is still named");
  pulse_store_head_free(h);
  struct stat ps, is;
  cr_assert_eq(stat(patch, &ps), 0, "the patch is in its grace period");
  cr_assert_eq(stat(index_path(&f, first.sha256), &is), 0);
  cr_assert_geq(ps.st_mtime, time(NULL) - 60, "the patch's retirement time");
  cr_assert_geq(is.st_mtime, ps.st_mtime - 1,
                "the index kept its creation time");
  fx_down(&f);
}

Test(sections, the_server_serves_an_index_and_404s_one_that_is_not_there) {
  fx f;
  fx_up(&f, 8);
  fx_commit(&f, 0);
  fx_commit(&f, 1);
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = f.dir;
  so.threads = 1;
  so.watch = 0;
  pulse_server *srv = NULL;
  cr_assert_eq(pulse_server_create(&so, &srv), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(f.dir, &h), PULSE_OK);
  const pulse_store_object *o = pulse_store_head_patch(h, 0);
  char rel[160], url[256];
  store_sections_path(o->sha256, rel, sizeof rel);
  snprintf(url, sizeof url, "/v1/%s", rel);
  size_t n = 0;
  uint8_t *b = tu_read(index_path(&f, o->sha256), &n);
  ht_reply r = ht_request(pulse_server_port(srv), "GET", url, NULL, NULL);
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.size, n);
  cr_assert_eq(memcmp(r.body, b, n), 0);
  char v[256];
  cr_assert(ht_header(&r, "Cache-Control", v, sizeof v) != NULL &&
            strstr(v, "immutable"));
  ht_reply_free(&r);
  /* A Range of it, as of any object. */
  const char *range[] = {"Range: bytes=16-47", NULL};
  r = ht_request(pulse_server_port(srv), "GET", url, range, NULL);
  cr_assert_eq(r.status, 206);
  cr_assert_eq(r.size, 32);
  cr_assert_eq(memcmp(r.body, o->sha256, 32), 0);
  ht_reply_free(&r);
  url[strlen(url) - 3] ^= 1; /* another hex digit */
  r = ht_request(pulse_server_port(srv), "GET", url, NULL, NULL);
  cr_assert_eq(r.status, 404);
  ht_reply_free(&r);
  r = ht_request(pulse_server_port(srv), "GET", "/v1/sections/../head.json",
                 NULL, NULL);
  cr_assert(r.status == 404 || r.status == 400, "HTTP %ld", r.status);
  ht_reply_free(&r);
  free(b);
  pulse_store_head_free(h);
  pulse_server_free(srv);
  fx_down(&f);
}
