/* test_format_versions.c - what the trainer side does with each patch
 * format version: the publisher writes the version its options name; the
 * sharded publisher writes versions 1 and 2 and refuses 3 (its value model
 * counts the whole patch's changes, which no rank holds) at creation and
 * at encode, with an error that says so. */
#include <criterion/criterion.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_pub_shard.h"
#include "pulse_publisher.h"
#include "pulse_store.h"
#include "trainer_testutil.h"

/* The version of the patch a publisher of format_version writes for its
 * second step, which must apply to the first step's weights. */
static unsigned published_version(uint32_t format_version) {
  char *dir = tu_make_dir();
  tu_model m;
  tu_model_init(&m, 3, 1);
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.tensors = m.info;
  o.tensor_count = TU_TENSORS;
  o.threads = 2;
  o.format_version = format_version;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_tensor t[TU_TENSORS];
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 0, t, TU_TENSORS, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  uint64_t total;
  uint16_t *before = tt_model_bf16(&m, &total);
  tu_model_step(&m, 0.02);
  tt_model_tensors(&m, t);
  cr_assert_eq(pulse_pub_commit(pub, 1, t, TU_TENSORS, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_pub_free(pub);
  pulse_store_head *h = NULL;
  cr_assert_eq(pulse_store_head_load(dir, &h), PULSE_OK);
  cr_assert_eq(pulse_store_head_patch_count(h), 1);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, pulse_store_head_patch(h, 0)->path);
  size_t size = 0;
  uint8_t *bytes = tu_read(path, &size);
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(bytes, size, &p), PULSE_OK, "%s",
               pulse_error_detail());
  unsigned version = pulse_patch_format_version(p);
  pulse_host_tensor h_t[TU_TENSORS];
  uint16_t *at = before;
  for (size_t i = 0; i < TU_TENSORS; i++) {
    h_t[i] = (pulse_host_tensor){m.info[i].name, at, m.numel[i], NULL};
    at += m.numel[i];
  }
  cr_assert_eq(pulse_patch_apply(p, h_t, TU_TENSORS, NULL), PULSE_OK, "%s",
               pulse_error_detail());
  pulse_patch_free(p);
  free(bytes), free(before);
  pulse_store_head_free(h);
  tu_model_free(&m);
  tu_rm_rf(dir);
  return version;
}

Test(format_versions, a_publisher_writes_the_version_its_options_name) {
  cr_assert_eq(published_version(0), PULSE_PATCH_VERSION);
  for (uint32_t v = PULSE_PATCH_VERSION_MIN; v <= PULSE_PATCH_VERSION_MAX; v++)
    cr_assert_eq(published_version(v), v);
  char *dir = tu_make_dir();
  pulse_pub_opts o;
  pulse_pub_opts_init(&o);
  o.format_version = PULSE_PATCH_VERSION_MAX + 1;
  pulse_pub *pub = NULL;
  cr_assert_eq(pulse_pub_create(dir, &o, &pub), PULSE_ERR_ARG);
  cr_assert_null(pub);
  tu_rm_rf(dir);
}

static const pulse_tensor_info table[1] = {{"w", PULSE_DTYPE_BF16, 1, {4096}}};

static pulse_pub_shard_opts whole_table_opts(pulse_pub_block *block) {
  memset(block, 0, sizeof *block);
  block->name = "w";
  block->kind = PULSE_PUB_BLOCK_FLAT;
  block->extent[0] = 4096;
  pulse_pub_shard_opts o;
  pulse_pub_shard_opts_init(&o);
  o.tensors = table;
  o.tensor_count = 1;
  o.blocks = block;
  o.block_count = 1;
  return o;
}

Test(format_versions, the_sharded_publisher_refuses_version_3_at_creation) {
  pulse_pub_block block;
  pulse_pub_shard_opts o = whole_table_opts(&block);
  for (uint32_t v = 0; v <= 2; v++) {
    o.format_version = v;
    pulse_pub_shard *s = NULL;
    cr_assert_eq(pulse_pub_shard_create(&o, &s), PULSE_OK, "version %u: %s", v,
                 pulse_error_detail());
    pulse_pub_shard_free(s);
  }
  o.format_version = 3;
  pulse_pub_shard *s = NULL;
  cr_assert_eq(pulse_pub_shard_create(&o, &s), PULSE_ERR_UNSUPPORTED);
  cr_assert_null(s);
  cr_assert_not_null(strstr(pulse_error_detail(), "format version 3"), "%s",
                     pulse_error_detail());
  o.format_version = PULSE_PATCH_VERSION_MAX + 1;
  cr_assert_eq(pulse_pub_shard_create(&o, &s), PULSE_ERR_ARG);
}

Test(format_versions, the_sharded_encode_refuses_version_3) {
  pulse_encode_opts eo;
  pulse_encode_opts_init(&eo);
  eo.format_version = 3;
  pulse_buffer patch = {NULL, 0};
  cr_assert_eq(
      pulse_pub_shard_encode(table, 1, &eo, NULL, 0, NULL, 0, NULL, &patch),
      PULSE_ERR_UNSUPPORTED);
  cr_assert_null(patch.data);
  cr_assert_not_null(strstr(pulse_error_detail(), "format version 3"), "%s",
                     pulse_error_detail());
}
