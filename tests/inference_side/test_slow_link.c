/* A worker on a slow link converges with the default options (issue
 * "Reliability and security: what hostile networks and failures still
 * break", finding 9): at 50 KB/s a 2.1 MB anchor takes 42 s, longer than
 * the per-object deadline of the defaults (30 s of grace plus the size at
 * 256 KB/s: 38 s), which once cut every anchor download and the worker
 * never synced. The deadline now follows the rate measured while the
 * source delivers at least an eighth of the minimum rate. The link is the
 * fetch engine's own rate limit (max_recv_bytes_per_s). About 45 s. */
#include <inttypes.h>
#include <time.h>

#include "inf_testutil.h"

Test(slow_link, a_worker_at_50_kb_per_s_syncs_with_the_default_deadline,
     .timeout = 120) {
  it_trainer t;
  it_trainer_up(&t, 3, 2, 152); /* 2.1 MB of BF16; anchor every 3, keep 2 */
  it_trainer_run(&t, 0, 2, 0.01);
  char *work = tu_make_dir(), cache[4096];
  snprintf(cache, sizeof cache, "%s/cache", work);
  const char *urls[1];
  pulse_sub_opts o;
  pulse_sub_opts_init(&o); /* the defaults: deadline, retries, backoff */
  urls[0] = t.url;
  o.urls = urls;
  o.url_count = 1;
  o.cache_dir = cache;
  o.public_key = t.pub;
  o.threads = 2;
  o.max_recv_bytes_per_s = 50000;
  pulse_sub *sub;
  cr_assert_eq(pulse_sub_create(&o, &sub), PULSE_OK);
  it_targets tg;
  it_targets_attach(&tg, &t, sub);
  double t0 = tu_now_s();
  pulse_status st = pulse_sub_sync(sub);
  double dt = tu_now_s() - t0;
  cr_expect_eq(st, PULSE_OK, "after %.1f s: %s", dt, pulse_sub_error(sub));
  cr_expect(it_targets_equal(&tg, &t, 2), "the targets are not step 2");
  cr_expect_lt(dt, 60.0, "synced in %.1f s", dt);
  pulse_sub_figures f;
  pulse_sub_figures_get(sub, &f);
  /* Every byte of the anchor downloaded once: none thrown away. */
  cr_expect_lt(f.bytes_downloaded, (uint64_t)(2.4e6), "%" PRIu64 " bytes",
               f.bytes_downloaded);
  pulse_sub_free(sub);
  it_targets_free(&tg);
  tu_rm_rf(work);
  it_trainer_down(&t);
}
