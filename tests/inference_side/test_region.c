/* Region targets (pulse_sub_attach_region): two tensor-parallel ranks sync
 * their blocks of an in-process trainer's plain-position store (rows of
 * two tensors fused into one buffer, columns of a third, a whole bias) and
 * hold exactly the trainer's slices after the anchor and along the chain;
 * the table comes from pulse_sub_table; a block written by someone else
 * is refused by the patch's digests and repaired from an anchor; the
 * default publisher's class-model patches apply into the blocks too; bad
 * attaches are refused. */
#include <inttypes.h>

#include "inf_testutil.h"

/* The trainer of inf_testutil.h, writing plain positions when `plain`. */
static void trainer_up(it_trainer *t, int plain) {
  it_trainer_up(t, 4, 8, 2);
  if (!plain)
    return;
  pulse_pub_free(t->pub_);
  pulse_pub_opts po;
  pulse_pub_opts_init(&po);
  po.anchor_every = 4;
  po.keep_patches = 8;
  po.keep_anchors = 2;
  po.key = t->key;
  po.tensors = t->m.info;
  po.tensor_count = TU_TENSORS;
  po.threads = 1;
  po.anchor_sync = 1;
  po.pos_model = PULSE_POS_PLAIN;
  po.on_head = pulse_server_on_head;
  po.on_head_ctx = t->srv;
  cr_assert_eq(pulse_pub_create(t->dir, &po, &t->pub_), PULSE_OK, "%s", pulse_error_detail());
}

/* Rank `rank` of 2: embed.weight and head.weight rows (both 40 columns)
 * one after the other in `fused`, layer.0.attn.weight columns in `cols`,
 * layer.0.norm.bias whole in `bias`. */
typedef struct {
  pulse_sub *sub;
  char *cache;
  const char *urls[4];
  uint16_t *fused, *cols, *bias;
  pulse_region g[4];
} rank_fx;

static void rank_up(rank_fx *r, const it_trainer *t, int rank) {
  memset(r, 0, sizeof *r);
  r->cache = tu_make_dir();
  pulse_sub_opts o = it_sub_opts(t, r->cache, r->urls);
  cr_assert_eq(pulse_sub_create(&o, &r->sub), PULSE_OK, "%s", pulse_error_detail());
  const pulse_tensor_info *in = t->m.info;
  uint64_t er = in[0].shape[0] / 2, hr = in[3].shape[0] / 2, ac = in[1].shape[1] / 2;
  r->fused = tu_alloc((er + hr) * 40 * 2);
  r->cols = tu_alloc(in[1].shape[0] * ac * 2);
  r->bias = tu_alloc(in[2].shape[0] * 2);
  r->g[0] = (pulse_region){in[0].name, rank * er, er, 0, 40, r->fused, 40, {0, 0}, 0, NULL, {0, 0}};
  r->g[1] = (pulse_region){in[3].name, rank * hr, hr, 0, 40, r->fused + er * 40, 40, {0, 0}, 0, NULL, {0, 0}};
  r->g[2] = (pulse_region){in[1].name, 0, in[1].shape[0], rank * ac, ac, r->cols, ac, {0, 0}, 0, NULL, {0, 0}};
  r->g[3] = (pulse_region){in[2].name, 0, in[2].shape[0], 0, 1, r->bias, 1, {0, 0}, 0, NULL, {0, 0}};
  const int tensor_of[4] = {0, 3, 1, 2};
  for (int k = 0; k < 4; k++) {
    const pulse_tensor_info *ti = &in[tensor_of[k]];
    cr_assert_eq(pulse_sub_attach_region(r->sub, ti->ndim, ti->shape, &r->g[k]), PULSE_OK, "%s",
                 pulse_error_detail());
  }
}

static void rank_down(rank_fx *r) {
  pulse_sub_free(r->sub);
  free(r->fused), free(r->cols), free(r->bias);
  tu_rm_rf(r->cache);
}

/* The blocks hold the trainer's step `step`. */
static void expect_blocks(const rank_fx *r, const it_trainer *t, uint64_t step, const char *what) {
  const int tensor_of[4] = {0, 3, 1, 2};
  for (int k = 0; k < 4; k++) {
    const pulse_region *g = &r->g[k];
    int i = tensor_of[k];
    uint64_t C = t->m.info[i].ndim == 1 ? 1 : t->m.info[i].shape[1];
    for (uint64_t row = 0; row < g->rows; row++)
      cr_assert_eq(memcmp(g->data + row * g->stride,
                          t->bits[step][i] + (g->row0 + row) * C + g->col0, g->cols * 2),
                   0, "%s: '%s' row %" PRIu64 " differs from step %" PRIu64, what, g->name,
                   g->row0 + row, step);
  }
  cr_assert_eq(pulse_sub_step(r->sub), step, "%s", what);
}

Test(inference_side, region_ranks_hold_their_blocks_after_the_anchor_and_the_chain) {
  it_trainer t;
  trainer_up(&t, 1);
  it_trainer_run(&t, 0, 3, 0.05);
  rank_fx r[2];
  for (int k = 0; k < 2; k++) {
    rank_up(&r[k], &t, k);
    cr_assert_eq(pulse_sub_sync(r[k].sub), PULSE_OK, "%s", pulse_sub_error(r[k].sub));
    expect_blocks(&r[k], &t, 3, "after the first sync");
  }
  for (uint64_t s = 4; s <= 7; s++) {
    it_trainer_run(&t, s, s, 0.05);
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(pulse_sub_sync(r[k].sub), PULSE_OK, "%s", pulse_sub_error(r[k].sub));
      expect_blocks(&r[k], &t, s, "along the chain");
    }
  }
  pulse_sub_figures fig;
  pulse_sub_figures_get(r[0].sub, &fig);
  cr_assert_geq(fig.patches_applied + fig.catchups_applied, 1, "no patch was applied");
  const uint16_t *data;
  uint64_t numel;
  cr_assert_eq(pulse_sub_tensor(r[0].sub, "head.weight", &data, &numel), PULSE_ERR_UNSUPPORTED);
  for (int k = 0; k < 2; k++)
    rank_down(&r[k]);
  it_trainer_down(&t);
}

Test(inference_side, region_block_written_by_someone_else_is_refused_then_repaired) {
  it_trainer t;
  trainer_up(&t, 1);
  it_trainer_run(&t, 0, 2, 0.05);
  rank_fx r;
  rank_up(&r, &t, 1);
  cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
  /* Under the subscriber's feet: every element of its first block. The
   * next patch changes some of them; their bits are not the ones the kept
   * digests count, so the result misses the patch's target digest (block
   * and halo are the whole tensor here). */
  for (uint64_t i = 0; i < r.g[0].rows * 40; i++)
    r.fused[i] ^= 0x0101;
  it_trainer_run(&t, 3, 3, 0.05);
  cr_assert_eq(pulse_sub_sync(r.sub), PULSE_OK, "%s", pulse_sub_error(r.sub));
  expect_blocks(&r, &t, 3, "after the repair");
  pulse_sub_figures fig;
  pulse_sub_figures_get(r.sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_ANCHOR, "the patch applied over a bad block");
  rank_down(&r);
  it_trainer_down(&t);
}

Test(inference_side, region_class_model_patches_apply_into_blocks) {
  /* The default publisher (class-model positions): each rank decodes its
   * blocks from the bits its halo keeps around them. */
  it_trainer t;
  trainer_up(&t, 0);
  it_trainer_run(&t, 0, 0, 0.05);
  rank_fx r[2];
  for (int k = 0; k < 2; k++) {
    rank_up(&r[k], &t, k);
    cr_assert_eq(pulse_sub_sync(r[k].sub), PULSE_OK, "%s", pulse_sub_error(r[k].sub));
    expect_blocks(&r[k], &t, 0, "the anchor");
  }
  for (uint64_t s = 1; s <= 3; s++) {
    it_trainer_run(&t, s, s, 0.05);
    for (int k = 0; k < 2; k++) {
      cr_assert_eq(pulse_sub_sync(r[k].sub), PULSE_OK, "%s", pulse_sub_error(r[k].sub));
      expect_blocks(&r[k], &t, s, "along the chain");
    }
  }
  pulse_sub_figures fig;
  pulse_sub_figures_get(r[1].sub, &fig);
  cr_assert_eq(fig.last_route, PULSE_SUB_ROUTE_CHAIN, "the last step came by another route");
  for (int k = 0; k < 2; k++)
    rank_down(&r[k]);
  it_trainer_down(&t);
}

Test(inference_side, region_table_and_bad_attaches) {
  it_trainer t;
  trainer_up(&t, 1);
  it_trainer_run(&t, 0, 1, 0.05);
  char *cache = tu_make_dir();
  const char *urls[4];
  pulse_sub_opts o = it_sub_opts(&t, cache, urls);
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  pulse_tensor_info *table = NULL;
  size_t n = 0;
  cr_assert_eq(pulse_sub_table(sub, &table, &n), PULSE_OK, "%s", pulse_sub_error(sub));
  cr_assert_eq(n, TU_TENSORS);
  for (size_t i = 0; i < n; i++) {
    cr_assert_str_eq(table[i].name, t.m.info[i].name);
    cr_assert_eq(table[i].ndim, t.m.info[i].ndim);
    cr_assert_eq(memcmp(table[i].shape, t.m.info[i].shape, sizeof table[i].shape), 0);
  }
  pulse_sub_table_free(table);
  pulse_sub_table_free(NULL);

  const pulse_tensor_info *in = t.m.info;
  uint16_t *buf = tu_alloc(64 * 2 * 40 * 2 * 2);
  pulse_region g = {in[0].name, 0, 64, 0, 40, buf, 40, {0, 0}, 0, NULL, {0, 0}};
  pulse_region bad = g;
  bad.row0 = in[0].shape[0] - 63; /* past the last row */
  cr_assert_eq(pulse_sub_attach_region(sub, in[0].ndim, in[0].shape, &bad), PULSE_ERR_ARG);
  bad = g;
  bad.stride = 39;
  cr_assert_eq(pulse_sub_attach_region(sub, in[0].ndim, in[0].shape, &bad), PULSE_ERR_ARG);
  bad = g;
  bad.data = (uint16_t *)((char *)buf + 1);
  cr_assert_eq(pulse_sub_attach_region(sub, in[0].ndim, in[0].shape, &bad), PULSE_ERR_ARG);
  cr_assert_eq(pulse_sub_attach_region(sub, in[0].ndim, in[0].shape, &g), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_sub_attach_region(sub, in[0].ndim, in[0].shape, &g), PULSE_ERR_ARG,
               "a name attached twice");
  pulse_region over = {in[3].name, 0, 8, 0, 40, buf + 63 * 40, 40, {0, 0}, 0, NULL, {0, 0}};
  cr_assert_eq(pulse_sub_attach_region(sub, in[3].ndim, in[3].shape, &over), PULSE_ERR_ARG,
               "overlapping blocks");
  over.data = buf + 64 * 40;
  cr_assert_eq(pulse_sub_attach_region(sub, in[3].ndim, in[3].shape, &over), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(pulse_sub_attach_host(sub, in[1].name, in[1].ndim, in[1].shape, buf + 80 * 40),
               PULSE_ERR_ARG, "host and region targets mixed");
  cr_assert_eq(pulse_sub_table(sub, &table, &n), PULSE_ERR_ARG, "a table with targets attached");
  /* A block of a shape other than the publisher's: refused at the sync. */
  uint64_t wrong[2] = {in[1].shape[0], in[1].shape[1] + 2};
  pulse_region w = {in[1].name, 0, 4, 0, 4, buf + 80 * 40, 4, {0, 0}, 0, NULL, {0, 0}};
  cr_assert_eq(pulse_sub_attach_region(sub, 2, wrong, &w), PULSE_OK);
  cr_assert_eq(pulse_sub_sync(sub), PULSE_ERR_SIZE_MISMATCH, "%s", pulse_sub_error(sub));
  cr_assert(strstr(pulse_sub_error(sub), in[1].name) != NULL, "%s", pulse_sub_error(sub));
  pulse_sub_free(sub);
  free(buf);
  tu_rm_rf(cache);
  it_trainer_down(&t);
}
