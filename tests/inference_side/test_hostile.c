/* Hostile servers (issue 15, "Hostile networks"): a head naming an object
 * of nearly 2^64 bytes is refused with an error, never a crash (it once
 * wrapped the parallel range planner's arithmetic and overran its arrays);
 * the planner covers every size exactly. */
#include <inttypes.h>

#include "forge_testutil.h"
#include "sub_segments_impl.h"


Test(hostile, a_head_naming_an_object_near_2_64_bytes_is_refused_not_a_crash) {
  it_trainer t;
  it_trainer_up(&t, 4, 4, 1);
  it_trainer_run(&t, 0, 1, 0.01);
  const uint64_t sizes[] = {UINT64_MAX, UINT64_MAX - ((uint64_t)3 << 20),
                            UINT64_MAX - ((uint64_t)1 << 20) + 1,
                            (uint64_t)INT64_MAX + 1};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    forge_object_sizes(t.dir, t.key, 0, sizes[s]);
    pulse_server_notify(t.srv, 0);
    char *work = tu_make_dir(), cache[4096], out[4096];
    snprintf(cache, sizeof cache, "%s/cache", work);
    snprintf(out, sizeof out, "%s/model.safetensors", work);
    const char *urls[1];
    pulse_sub_opts o = it_sub_opts(&t, cache, urls);
    o.parallel = 4;
    o.parallel_min_bytes = 1;
    pulse_sub *sub;
    cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
    cr_assert_eq(pulse_sub_attach_file(sub, out), PULSE_OK);
    pulse_status st = pulse_sub_sync(sub);
    cr_expect_neq(st, PULSE_OK, "size %" PRIu64 " was taken", sizes[s]);
    cr_expect(strstr(pulse_sub_error(sub), "larger than any file") != NULL,
              "size %" PRIu64 ": %s", sizes[s], pulse_sub_error(sub));
    pulse_sub_free(sub);
    tu_rm_rf(work);
  }
  it_trainer_down(&t);
}

Test(hostile, the_range_planner_covers_every_size_exactly) {
  const uint64_t mib = (uint64_t)1 << 20;
  const uint64_t sizes[] = {0,
                            1,
                            mib,
                            mib + 1,
                            33 * mib,
                            14 * (mib << 10) + 12345,
                            (uint64_t)INT64_MAX,
                            UINT64_MAX - 3 * mib,
                            UINT64_MAX - mib + 1,
                            UINT64_MAX - 1,
                            UINT64_MAX};
  const unsigned parallel[] = {0, 1, 2, 3, 4, 15, 16, 17, 1000};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++)
    for (size_t p = 0; p < sizeof parallel / sizeof *parallel; p++) {
      uint64_t origin[SUB_SEG_MAX + 1], len[SUB_SEG_MAX + 1];
      size_t n =
          sub_segments_plan(parallel[p], 0, sizes[s], origin, len);
      cr_assert(n >= 1 && n <= SUB_SEG_MAX, "%zu segments", n);
      uint64_t at = 0;
      for (size_t k = 0; k < n; k++) {
        cr_assert_eq(origin[k], at, "size %" PRIu64 " parallel %u seg %zu",
                     sizes[s], parallel[p], k);
        cr_assert(len[k] <= sizes[s] - at);
        cr_assert(len[k] > 0 || sizes[s] == 0);
        at += len[k];
      }
      cr_assert_eq(at, sizes[s], "size %" PRIu64 " parallel %u", sizes[s],
                   parallel[p]);
    }
}
