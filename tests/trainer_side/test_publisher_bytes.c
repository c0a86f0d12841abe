/* A host commit's patch, byte for byte, is the reference path's: the
 * reference detection (pulse_detect_ref) against the previous state and the
 * encoder given the base itself (it classifies from it), where the
 * publisher detects chunk by chunk with class ranks (publisher_detect.c)
 * and gives the encoder the rank form. Both position models, chunks of
 * 2^10 and the default, one thread and two. */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <sys/stat.h>

#include "pulse_publisher.h"
#include "pulse_store.h"
#include "trainer_testutil.h"

static void read_file(const char *path, pulse_buffer *out) {
  FILE *f = fopen(path, "rb");
  cr_assert(f != NULL, "%s", path);
  struct stat sb;
  cr_assert_eq(fstat(fileno(f), &sb), 0);
  out->size = (size_t)sb.st_size;
  out->data = tu_alloc(out->size);
  cr_assert_eq(fread(out->data, 1, out->size, f), out->size);
  fclose(f);
}

/* The patch of `step` in the store at dir. */
static void store_patch(const char *dir, uint64_t step, pulse_buffer *out) {
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  char path[4200] = "";
  for (size_t i = 0; i < pulse_store_head_patch_count(h); i++)
    if (pulse_store_head_patch(h, i)->step == step)
      snprintf(path, sizeof path, "%s/%s", dir, pulse_store_head_patch(h, i)->path);
  pulse_store_head_free(h);
  cr_assert(path[0] != '\0', "no patch of step %" PRIu64, step);
  read_file(path, out);
}

static void run(pulse_pos_model model, uint32_t chunk_log2, int threads) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 11, 40); /* 102,400 + 122,880 + 333 + 51,200 weights */
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.pos_model = model;
  o.chunk_log2 = chunk_log2;
  o.threads = threads;
  o.grace_seconds = 0;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s", pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_OK);
  uint64_t total;
  uint16_t *base = tt_model_bf16(&m, &total);
  static const double density[] = {0.0, 0.02, 0.3, 0.005}; /* a first step without changes too */
  for (uint64_t step = 1; step <= 4; step++) {
    tu_model_step(&m, density[step - 1]);
    cr_assert_eq(pulse_pub_commit(pub, step, t, TU_TENSORS, NULL), PULSE_OK, "%s",
                 pulse_error_detail());
    pulse_changes ch[TU_TENSORS];
    pulse_encode_tensor enc[TU_TENSORS];
    uint16_t *at = base;
    for (int i = 0; i < TU_TENSORS; i++) {
      ch[i] = (pulse_changes)PULSE_CHANGES_INIT;
      cr_assert_eq(pulse_detect_ref(m.w[i], PULSE_DTYPE_F32, at, m.numel[i], 0, &ch[i]),
                   PULSE_OK);
      memset(&enc[i], 0, sizeof enc[i]);
      enc[i].info = m.info[i];
      enc[i].base = at;
      enc[i].changes = &ch[i];
      at += m.numel[i];
    }
    pulse_encode_opts eo;
    pulse_encode_opts_init(&eo);
    eo.step = step;
    eo.base_step = step - 1;
    eo.pos_model = model;
    eo.chunk_log2 = chunk_log2;
    eo.threads = 1;
    pulse_buffer want = {NULL, 0}, got = {NULL, 0};
    cr_assert_eq(pulse_patch_encode(&eo, enc, TU_TENSORS, &want), PULSE_OK);
    store_patch(dir, step, &got);
    cr_assert_eq(got.size, want.size, "step %" PRIu64 ": %zu bytes, want %zu", step,
                 got.size, want.size);
    cr_assert_eq(memcmp(got.data, want.data, got.size), 0, "step %" PRIu64, step);
    pulse_buffer_free(&want);
    pulse_buffer_free(&got);
    for (int i = 0; i < TU_TENSORS; i++)
      pulse_changes_free(&ch[i]);
    free(base);
    base = tt_model_bf16(&m, &total);
  }
  free(base);
  pulse_pub_free(pub);
  tu_model_free(&m);
  tu_rm_rf(dir);
}

Test(publisher_bytes, host_commits_write_the_reference_encoders_bytes) {
  run(PULSE_POS_CLASS, 10, 1);
  run(PULSE_POS_CLASS, 10, 2);
  run(PULSE_POS_CLASS, PULSE_CHUNK_LOG2_DEFAULT, 2);
  run(PULSE_POS_PLAIN, 10, 2);
}
