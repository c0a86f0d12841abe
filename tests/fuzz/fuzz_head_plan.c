/* fuzz_head_plan.c - libFuzzer target for the path from a head to a
 * download plan (issue 15, "Hostile networks"): a head's sizes, steps and
 * object lists come from whoever serves it (under trust on first use or
 * --insecure-unsigned any server), and the planner turns them into loop
 * bounds and array indexes (the range segments of sub_object.c once
 * overran their arrays for sizes near 2^64).
 *
 * Input: 1 byte of options (parallel 0..31 in the low bits; bit 5: the
 * targets hold step below; bit 6: split objects of any size), 8 bytes of
 * the targets' step (little-endian), then the head's JSON. A head that
 * parses (unsigned, or signed and verifying) is planned against an empty
 * cache with catch-ups off (no network); checked:
 *   - the route's objects are the head's own, in its bounds;
 *   - every object of the plan cuts into 1..SUB_SEG_MAX segments that
 *     cover its bytes exactly, in order.
 * Corpus: tests/fuzz/corpus/head_plan (heads of a small store). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "endian_impl.h"
#include "store_impl.h"
#include "sub_impl.h"
#include "sub_segments_impl.h"

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond))                                                               \
      abort();                                                                 \
  } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static pulse_sub *sub_for_fuzzing(void) {
  static pulse_sub *sub;
  static char dir[] = "/tmp/pulse-fuzz-plan-XXXXXX";
  if (sub != NULL)
    return sub;
  CHECK(mkdtemp(dir) != NULL);
  static const char *urls[] = {"http://127.0.0.1:9"};
  pulse_sub_opts o;
  pulse_sub_opts_init(&o);
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = dir;
  o.allow_unsigned = 1;
  o.use_catchup = 0;
  CHECK(pulse_sub_create(&o, &sub) == PULSE_OK);
  return sub;
}

static void check_segments(const pulse_sub *sub, const pulse_store_object *o) {
  uint64_t origin[SUB_SEG_MAX], len[SUB_SEG_MAX];
  size_t n = sub_segments_plan(sub->opts.parallel, sub->opts.parallel_min_bytes,
                               o->size, origin, len);
  CHECK(n >= 1 && n <= SUB_SEG_MAX);
  uint64_t at = 0;
  for (size_t k = 0; k < n; k++) {
    CHECK(origin[k] == at);
    CHECK(len[k] <= o->size - at);
    at += len[k];
  }
  CHECK(at == o->size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 9)
    return 0;
  pulse_sub *sub = sub_for_fuzzing();
  sub->opts.parallel = data[0] & 31u;
  sub->opts.parallel_min_bytes = data[0] & 64u ? 0 : (uint64_t)32 << 20;
  uint64_t step = pulse_load_le64(data + 1);
  pulse_store_head *h;
  if (pulse_store_head_parse(data + 9, size - 9, &h) != PULSE_OK)
    return 0;
  sub->head = h;
  sub->step = data[0] & 32u ? step : PULSE_SUB_NO_STEP;
  for (unsigned avoid = 0; avoid < 8; avoid += 2) {
    sub_plan plan;
    if (sub_plan_make(sub, avoid, &plan) != PULSE_OK)
      continue;
    size_t np = pulse_store_head_patch_count(h);
    CHECK(plan.first_patch <= np);
    CHECK(plan.patch_count <= np - plan.first_patch);
    if (plan.route == PULSE_SUB_ROUTE_ANCHOR) {
      CHECK(plan.anchor != NULL);
      check_segments(sub, plan.anchor);
    }
    if (plan.route == PULSE_SUB_ROUTE_CHAIN ||
        plan.route == PULSE_SUB_ROUTE_ANCHOR)
      for (size_t i = 0; i < plan.patch_count; i++)
        check_segments(sub, pulse_store_head_patch(h, plan.first_patch + i));
  }
  for (size_t i = 0; i < pulse_store_head_anchor_count(h); i++)
    check_segments(sub, pulse_store_head_anchor(h, i));
  sub->head = NULL;
  pulse_store_head_free(h);
  return 0;
}
