/* server_metrics.c - the store server's own /metrics families (after the
 * serving layer's per-route ones; Prometheus exposition format 0.0.4). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "server_impl.h"
#include "status_impl.h"

void srv_metrics_text(void *server, pulse_bytebuf *b) {
  pulse_server *srv = server;
  srv_metrics *m = &srv->metrics;
  pulse_bytebuf_printf(
      b, "# HELP pulse_longpoll_wakeup_seconds From the server learning of a "
         "new head to resuming a waiting long-poll.\n"
         "# TYPE pulse_longpoll_wakeup_seconds histogram\n");
  pulse_serve_histogram_text(b, "pulse_longpoll_wakeup_seconds", "",
                             &m->wakeup);
  pulse_bytebuf_printf(
      b, "# HELP pulse_commit_duration_seconds Commit time of the in-process "
         "publisher.\n# TYPE pulse_commit_duration_seconds histogram\n");
  pulse_serve_histogram_text(b, "pulse_commit_duration_seconds", "",
                             &m->commit);
  srv_head *h = srv_head_get(srv);
  size_t waiters = pulse_server_waiters(srv);
  pulse_bytebuf_printf(
      b,
      "# HELP pulse_head_step Step of the head being served (-1: none).\n"
      "# TYPE pulse_head_step gauge\npulse_head_step %lld\n",
      h ? (long long)h->step : -1LL);
  if (h != NULL) {
    pulse_bytebuf_printf(b,
                         "# HELP pulse_head_objects Objects the head names.\n"
                         "# TYPE pulse_head_objects gauge\n"
                         "pulse_head_objects{kind=\"patch\"} %zu\n"
                         "pulse_head_objects{kind=\"anchor\"} %zu\n",
                         pulse_store_head_patch_count(h->head),
                         pulse_store_head_anchor_count(h->head));
  }
  srv_head_release(h);
  pulse_bytebuf_printf(
      b,
      "# HELP pulse_longpoll_waiters Long-polls waiting now.\n"
      "# TYPE pulse_longpoll_waiters gauge\npulse_longpoll_waiters %zu\n",
      waiters);
  pulse_bytebuf_printf(
      b,
      "# HELP pulse_head_reloads_total Times head.json was read.\n"
      "# TYPE pulse_head_reloads_total counter\npulse_head_reloads_total %llu\n"
      "# HELP pulse_head_errors_total Heads refused (the previous one stays "
      "served).\n# TYPE pulse_head_errors_total counter\n"
      "pulse_head_errors_total %llu\n",
      (unsigned long long)atomic_load(&m->head_reloads),
      (unsigned long long)atomic_load(&m->head_errors));
  pulse_bytebuf_printf(
      b,
      "# HELP pulse_catchup_builds_total Squashed catch-up patches built.\n"
      "# TYPE pulse_catchup_builds_total counter\n"
      "pulse_catchup_builds_total %llu\n"
      "# HELP pulse_catchup_build_seconds_total Time spent building them.\n"
      "# TYPE pulse_catchup_build_seconds_total counter\n"
      "pulse_catchup_build_seconds_total %.6f\n"
      "# HELP pulse_catchup_cache_hits_total Catch-ups served from the cache.\n"
      "# TYPE pulse_catchup_cache_hits_total counter\n"
      "pulse_catchup_cache_hits_total %llu\n",
      (unsigned long long)atomic_load(&m->catchup_builds),
      (double)atomic_load(&m->catchup_build_us) / 1e6,
      (unsigned long long)atomic_load(&m->catchup_cache_hits));
  pulse_bytebuf_printf(
      b,
      "# HELP pulse_catchup_builds_pending Catch-ups queued or being built.\n"
      "# TYPE pulse_catchup_builds_pending gauge\n"
      "pulse_catchup_builds_pending %zu\n"
      "# HELP pulse_catchup_refused_total Catch-up requests answered 503 (queue "
      "full, or the build outlasted the wait).\n"
      "# TYPE pulse_catchup_refused_total counter\n"
      "pulse_catchup_refused_total %llu\n"
      "# HELP pulse_catchup_corrupt_total Cached catch-ups whose bytes did not "
      "match their SHA-256 (dropped and rebuilt).\n"
      "# TYPE pulse_catchup_corrupt_total counter\n"
      "pulse_catchup_corrupt_total %llu\n"
      "# HELP pulse_catchup_history_total Catch-up requests from a step the "
      "head no longer retains that earlier heads' objects still reach.\n"
      "# TYPE pulse_catchup_history_total counter\n"
      "pulse_catchup_history_total %llu\n"
      "# HELP pulse_catchup_pinned_total Catch-up requests pinned to a "
      "target step (?to=) answered with the catch-up.\n"
      "# TYPE pulse_catchup_pinned_total counter\n"
      "pulse_catchup_pinned_total %llu\n"
      "# HELP pulse_objects_rehashed_total Object files hashed again before "
      "being served, because they changed on disk since first seen.\n"
      "# TYPE pulse_objects_rehashed_total counter\n"
      "pulse_objects_rehashed_total %llu\n"
      "# HELP pulse_objects_corrupt_total Of them, files that no longer "
      "matched their name (SHA-256): refused with 500.\n"
      "# TYPE pulse_objects_corrupt_total counter\n"
      "pulse_objects_corrupt_total %llu\n",
      srv_build_count(srv), (unsigned long long)atomic_load(&m->catchup_refused),
      (unsigned long long)atomic_load(&m->catchup_corrupt),
      (unsigned long long)atomic_load(&m->catchup_history),
      (unsigned long long)atomic_load(&m->catchup_pinned),
      (unsigned long long)atomic_load(&m->objects_rehashed),
      (unsigned long long)atomic_load(&m->objects_corrupt));
}
