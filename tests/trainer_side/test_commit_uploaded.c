/* test_commit_uploaded.c - a committer commits anchors that only the
 * bucket holds (pulse_pub_commit_made_uploaded): the head names them by
 * SHA-256 and size, patches commit after them, retention drops them
 * without failing on their absence, pulse_pub_anchor_due follows them, and
 * the store opens again once the missing anchors are put back. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "files_testutil.h"
#include "pulse_codec.h"
#include "pulse_publisher.h"
#include "pulse_safetensors.h"
#include "pulse_store.h"
#include "shard_testutil.h"

#define CU_NT 2
static const char *cu_names[CU_NT] = {"w", "b"};
static const uint32_t cu_ndims[CU_NT] = {1, 1};
static const uint64_t cu_shapes[CU_NT][3] = {{3000}, {40}};
static const sm_spec cu_spec = {CU_NT, cu_names, cu_ndims, cu_shapes, NULL, 1};

static pulse_state_digest cu_digest(const sm_model *m) {
  pulse_tensor_digest d[CU_NT];
  pulse_tensor_info bf[CU_NT];
  for (int t = 0; t < CU_NT; t++) {
    d[t] = pulse_digest_bf16(m->snap[t], m->numel[t]);
    bf[t] = m->info[t], bf[t].dtype = PULSE_DTYPE_BF16;
  }
  pulse_state_digest out;
  cr_assert_eq(pulse_state_digest_compute(bf, d, CU_NT, &out), PULSE_OK);
  return out;
}

/* One step of the weights and its patch from the snapshot (which moves). */
static pulse_buffer cu_step(sm_model *m, uint64_t step) {
  sm_model_step(m, 0.2, 0.05);
  return sm_single_patch(m, step, 0);
}

/* The anchor of the state into the "bucket" folder, and its SHA-256 and
 * size (what the ranks' multipart upload leaves there). */
static void cu_anchor(const sm_model *m, uint64_t step, const char *bucket,
                      uint8_t sha[32], uint64_t *size, char *path, size_t cap) {
  pulse_state_digest d = cu_digest(m);
  pulse_st_write_tensor t[CU_NT];
  memset(t, 0, sizeof t);
  for (int i = 0; i < CU_NT; i++) {
    t[i].name = cu_names[i];
    t[i].dtype = PULSE_DTYPE_BF16;
    t[i].ndim = 1;
    t[i].shape[0] = m->numel[i];
    t[i].data = m->snap[i];
  }
  char step_s[32], hex[65];
  snprintf(step_s, sizeof step_s, "%llu", (unsigned long long)step);
  pulse_state_digest_hex(&d, hex);
  pulse_st_kv meta[2] = {{"step", step_s}, {"state_digest", hex}};
  snprintf(path, cap, "%s/anchor-%llu.safetensors", bucket,
           (unsigned long long)step);
  cr_assert_eq(pulse_st_write(path, t, CU_NT, meta, 2), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_file_sha256(path, sha, size), PULSE_OK);
}

static int cu_exists(const char *dir, const char *rel) {
  char path[4096];
  struct stat sb;
  snprintf(path, sizeof path, "%s/%s", dir, rel);
  return stat(path, &sb) == 0;
}

static void cu_opts(pulse_pub_opts *o, const sm_model *m) {
  pulse_pub_opts_init(o);
  o->tensors = m->info;
  o->tensor_count = CU_NT;
  o->anchor_every = 2;
  o->keep_patches = 2;
  o->keep_anchors = 2;
  o->threads = 1;
  o->grace_seconds = 0;
}

/* The committer of a new store in dir, of the model m (seed 31); its
 * options in o, for opening it again. */
static pulse_pub *cu_committer(const char *dir, sm_model *m,
                               pulse_pub_opts *o) {
  sm_model_init(m, &cu_spec, 31);
  cu_opts(o, m);
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create_committer(dir, o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  return pub;
}

/* The store's path of the anchor whose SHA-256 is sha. */
static void cu_anchor_rel(const uint8_t sha[32],
                          char rel[PULSE_STORE_PATH_MAX]) {
  snprintf(rel, PULSE_STORE_PATH_MAX, "objects/");
  for (int k = 0; k < 32; k++)
    snprintf(rel + 8 + 2 * k, 3, "%02x", sha[k]);
  strcat(rel, ".safetensors");
}

/* The head is of `step` and names the anchor of that step: the given
 * one, absent from the folder. */
static void cu_head_names(const char *dir, uint64_t step, const uint8_t sha[32],
                          uint64_t size) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_store_head_step(h), step);
  const pulse_store_object *a = NULL;
  for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++)
    if (pulse_store_head_anchor(h, i)->step == step)
      a = pulse_store_head_anchor(h, i);
  cr_assert(a != NULL, "the head names an anchor of step %llu",
            (unsigned long long)step);
  char want[PULSE_STORE_PATH_MAX];
  cu_anchor_rel(sha, want);
  cr_assert_eq(a->kind, PULSE_STORE_ANCHOR);
  cr_assert_eq(a->step, step);
  cr_assert_eq(a->size, size);
  cr_assert_eq(memcmp(a->sha256, sha, 32), 0);
  cr_assert_str_eq(a->path, want);
  cr_assert(!cu_exists(dir, a->path),
            "the uploaded anchor is not in the local store");
  pulse_store_head_free(h);
}

Test(commit_uploaded,
     the_head_names_anchors_only_the_bucket_holds_and_the_store_goes_on) {
  char *dir = tu_make_dir(), *bucket = tu_make_dir();
  sm_model m;
  pulse_pub_opts o;
  pulse_pub *pub = cu_committer(dir, &m, &o);
  uint8_t sha[32];
  uint64_t size = 0;
  char path[4096];
  pulse_pub_figures f;
  /* steps 1..8: anchors (uploaded) at 1, 3, 5, 7; patches between */
  for (uint64_t step = 1; step <= 8; step++) {
    pulse_buffer patch = {0};
    if (step > 1)
      patch = cu_step(&m, step);
    pulse_state_digest d = cu_digest(&m);
    cr_assert_eq(pulse_pub_anchor_due(pub, step), step % 2 == 1, "step %llu",
                 (unsigned long long)step);
    if (step % 2 == 1) {
      cu_anchor(&m, step, bucket, sha, &size, path, sizeof path);
      cr_assert_eq(pulse_pub_commit_made_uploaded(
                       pub, step, step > 1 ? &patch : NULL, sha, size, &d, &f),
                   PULSE_OK, "step %llu: %s", (unsigned long long)step,
                   pulse_error_detail());
      cr_assert_eq(f.anchor_bytes, size);
      cr_assert_eq(f.step, step);
      cu_head_names(dir, step, sha, size);
    } else {
      cr_assert_eq(pulse_pub_commit_made(pub, step, &patch, NULL, &d, &f),
                   PULSE_OK, "step %llu: %s", (unsigned long long)step,
                   pulse_error_detail());
      cr_assert(f.changed > 0 && f.anchor_bytes == 0);
    }
    pulse_buffer_free(&patch);
  }
  /* keep_anchors 2: the anchors of steps 1 and 3 left the head (their
   * removal found nothing to remove); 5's and 7's are named, and the
   * patch of step 8 after them */
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_step(h), 8);
  cr_assert_eq(pulse_store_head_anchor_count(h), 2);
  char named[2][PULSE_STORE_PATH_MAX];
  for (size_t i = 0; i < 2; i++) {
    const pulse_store_object *a = pulse_store_head_anchor(h, i);
    cr_assert(a->step == 5 || a->step == 7, "anchor of step %llu",
              (unsigned long long)a->step);
    cr_assert(!cu_exists(dir, a->path));
    snprintf(named[i], sizeof named[i], "%s", a->path);
  }
  pulse_store_head_free(h);
  cr_assert_eq(pulse_pub_anchor_due(pub, 9), 1);
  pulse_pub_free(pub);
  /* Recovery stays strict: a head naming a missing object does not open
   * until the objects are fetched back from the bucket. */
  cr_assert_neq(pulse_pub_create_committer(dir, &o, &pub), PULSE_OK);
  for (uint64_t step = 5; step <= 7; step += 2) {
    uint8_t s2[32];
    uint64_t n2 = 0;
    char from[4096], to[4096], rel[PULSE_STORE_PATH_MAX];
    snprintf(from, sizeof from, "%s/anchor-%llu.safetensors", bucket,
             (unsigned long long)step);
    cr_assert_eq(pulse_store_file_sha256(from, s2, &n2), PULSE_OK);
    cu_anchor_rel(s2, rel);
    cr_assert(strcmp(rel, named[0]) == 0 || strcmp(rel, named[1]) == 0, "%s",
              rel);
    snprintf(to, sizeof to, "%s/%s", dir, rel);
    size_t n = 0;
    uint8_t *bytes = tu_read(from, &n);
    cr_assert_eq(tu_write(to, bytes, n), 0);
    free(bytes);
  }
  cr_assert_eq(pulse_pub_create_committer(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t head = 0;
  cr_assert(pulse_pub_head_step(pub, &head) && head == 8);
  pulse_pub_free(pub);
  sm_model_free(&m);
  tu_rm_rf(dir), tu_rm_rf(bucket);
}

Test(commit_uploaded, bad_arguments_are_refused_and_the_head_stays) {
  char *dir = tu_make_dir();
  sm_model m;
  pulse_pub_opts o;
  pulse_pub *pub = cu_committer(dir, &m, &o);
  pulse_state_digest d = cu_digest(&m);
  uint8_t sha[32];
  memset(sha, 0xab, sizeof sha);
  pulse_buffer some = {(uint8_t *)"x", 1};
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(NULL, 1, NULL, sha, 100, &d, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(pub, 1, NULL, NULL, 100, &d, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(pulse_pub_commit_made_uploaded(pub, 1, NULL, sha, 0, &d, NULL),
               PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(pub, 1, NULL, sha, 100, NULL, NULL),
      PULSE_ERR_ARG);
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(pub, 1, &some, sha, 100, &d, NULL),
      PULSE_ERR_ARG, "the first step is an anchor alone");
  cr_assert(!cu_exists(dir, "head.json"), "no head after refused commits");
  cr_assert_eq(pulse_pub_commit_made_uploaded(pub, 4, NULL, sha, 100, &d, NULL),
               PULSE_OK, "%s", pulse_error_detail());
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(pub, 4, &some, sha, 100, &d, NULL),
      PULSE_ERR_BASE_STEP);
  cr_assert_eq(pulse_pub_commit_made_uploaded(pub, 5, NULL, sha, 100, &d, NULL),
               PULSE_ERR_ARG, "a later step needs its patch");
  cr_assert_eq(
      pulse_pub_commit_made_uploaded(pub, 5, &some, sha, 100, &d, NULL),
      PULSE_ERR_TRUNCATED, "%s", pulse_error_detail());
  cu_head_names(dir, 4, sha, 100);
  pulse_pub_free(pub);
  sm_model_free(&m);
  tu_rm_rf(dir);
}
