/* test_format_versions.c - what the trainer side does with each patch
 * format version: the sharded publisher writes versions 1 and 2 and
 * refuses 3 (its value model counts the whole patch's changes, which no
 * rank holds) at creation and at encode, with an error that says so. */
#include <criterion/criterion.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_pub_shard.h"

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
