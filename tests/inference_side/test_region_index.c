/* The checks of pulse_sub_attach_region at the scale of a
 * mixture-of-experts engine (sub_region_index.c): thousands of blocks,
 * most of them past the unsorted tail, each refused exactly when a plain
 * scan of every attached block refuses it (a name attached twice, memory
 * overlapping another block), over random names and blocks, several rows
 * with strides included; and 44,544 blocks (DeepSeek-V3's 58 layers x
 * 256 experts x 3) attach, the first name still refused at the end. How
 * fast is python/bench_moe.py's to say, not a test's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "files_testutil.h"
#include "pulse_subscriber.h"

static pulse_sub *sub_up(char **cache) {
  static const char *urls[1] = {"http://127.0.0.1:9/"}; /* never asked: attach is local */
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  *cache = tu_make_dir();
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = *cache;
  o.allow_unsigned = 1;
  pulse_sub *sub = NULL;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK, "%s", pulse_error_detail());
  return sub;
}

/* A block as the reference sees it: name, rows of `cols` elements
 * `stride` apart from element `at` of the buffer. */
typedef struct {
  char name[64];
  uint64_t at, rows, cols, stride;
} ref_block;

static int ref_overlap(const ref_block *a, const ref_block *b) {
  if (a->rows == 0 || a->cols == 0 || b->rows == 0 || b->cols == 0)
    return 0;
  uint64_t alo = a->at, ahi = a->at + (a->rows - 1) * a->stride + a->cols;
  uint64_t blo = b->at, bhi = b->at + (b->rows - 1) * b->stride + b->cols;
  return alo < bhi && blo < ahi; /* spans, as the subscriber compares them */
}

Test(region_index, attach_refuses_exactly_what_a_scan_of_every_block_refuses) {
  char *cache;
  pulse_sub *sub = sub_up(&cache);
  enum { BUF = 1 << 20, TRIES = 6000 };
  uint16_t *buf = calloc(BUF, 2);
  ref_block *held = calloc(TRIES, sizeof *held);
  size_t nheld = 0, refused_name = 0, refused_overlap = 0;
  srand(7);
  uint64_t next = 0; /* most blocks sit side by side, as stacks do */
  for (int i = 0; i < TRIES; i++) {
    ref_block b = {{0}, 0, 1 + (uint64_t)rand() % 3, 1 + (uint64_t)rand() % 40, 0};
    b.stride = b.cols + (uint64_t)rand() % 3;
    int kind = rand() % 10;
    if (kind == 0 && nheld > 0) /* a name attached already, early or late */
      snprintf(b.name, sizeof b.name, "%s", held[(size_t)rand() % nheld].name);
    else
      snprintf(b.name, sizeof b.name, "model.layers.%d.mlp.experts.%d.w", i % 61, i);
    const ref_block *o = nheld > 0 ? &held[(size_t)rand() % nheld] : NULL;
    if (kind == 1 && o != NULL && o->rows > 0) { /* over or beside a held block */
      uint64_t span = (o->rows - 1) * o->stride + o->cols;
      b.at = o->at + span - 1 - (uint64_t)rand() % (span + 3);
      b.at = b.at > BUF ? 0 : b.at;
    } else if (kind == 2) {
      b.rows = 0; /* an empty block owns no memory */
      b.at = (uint64_t)rand() % BUF;
    } else {
      kind = 3; /* after the last one, as a stack's blocks are */
      b.at = next + (uint64_t)(rand() % 4 == 0);
    }
    uint64_t end = b.at + (b.rows ? (b.rows - 1) * b.stride + b.cols : 0);
    if (end > BUF)
      continue;
    int want_name = 0, want_overlap = 0;
    for (size_t k = 0; k < nheld; k++) {
      want_name |= strcmp(held[k].name, b.name) == 0;
      want_overlap |= ref_overlap(&held[k], &b);
    }
    uint64_t shape[2] = {b.rows ? b.rows : 1, b.stride};
    pulse_region r = {b.name, 0, b.rows, 0, b.cols, buf + b.at, b.stride,
                      {0, 0}, 0, NULL, {0, 0}};
    pulse_status st = pulse_sub_attach_region(sub, 2, shape, &r);
    if (want_name || want_overlap) {
      cr_assert_eq(st, PULSE_ERR_ARG, "try %d: '%s' at %llu should be refused", i, b.name,
                   (unsigned long long)b.at);
      const char *why = pulse_sub_error(sub);
      if (want_name)
        cr_assert(strstr(why, "attached already") != NULL || want_overlap, "%s", why);
      else
        cr_assert(strstr(why, "overlaps") != NULL, "%s", why);
      refused_name += want_name;
      refused_overlap += !want_name;
    } else {
      cr_assert_eq(st, PULSE_OK, "try %d: '%s' at %llu: %s", i, b.name,
                   (unsigned long long)b.at, pulse_sub_error(sub));
      held[nheld++] = b;
      if (kind == 3)
        next = end;
    }
  }
  cr_assert_gt(nheld, 3000, "only %zu blocks attached (%zu refused for a name, %zu for memory)",
               nheld, refused_name, refused_overlap);
  cr_assert_gt(refused_name, 100);
  cr_assert_gt(refused_overlap, 100);
  pulse_sub_free(sub);
  free(buf);
  free(held);
  tu_rm_rf(cache);
}

Test(region_index, deepseek_v3_sized_expert_blocks_attach) {
  char *cache;
  pulse_sub *sub = sub_up(&cache);
  enum { LAYERS = 58, EXPERTS = 256, ROWS = 2, COLS = 8 };
  size_t n = (size_t)LAYERS * EXPERTS * 3;
  uint16_t *buf = calloc(n * ROWS * COLS, 2);
  uint64_t shape[2] = {ROWS * 2, COLS};
  static const char *proj[3] = {"gate_proj", "up_proj", "down_proj"};
  for (size_t i = 0; i < n; i++) {
    char name[96];
    snprintf(name, sizeof name, "model.layers.%zu.mlp.experts.%zu.%s.weight",
             i / (EXPERTS * 3), i / 3 % EXPERTS, proj[i % 3]);
    pulse_region r = {name, ROWS, ROWS, 0, COLS, buf + i * ROWS * COLS, COLS,
                      {0, 0}, 0, NULL, {0, 0}};
    cr_assert_eq(pulse_sub_attach_region(sub, 2, shape, &r), PULSE_OK, "%s",
                 pulse_sub_error(sub));
  }
  /* The first block again: found in the sorted part. */
  pulse_region again = {"model.layers.0.mlp.experts.0.gate_proj.weight", 0, 1, 0, COLS,
                        buf + n * ROWS * COLS - COLS, COLS, {0, 0}, 0, NULL, {0, 0}};
  cr_assert_eq(pulse_sub_attach_region(sub, 2, shape, &again), PULSE_ERR_ARG);
  pulse_sub_free(sub);
  free(buf);
  tu_rm_rf(cache);
}
