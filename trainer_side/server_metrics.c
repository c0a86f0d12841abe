/* server_metrics.c - counters and histograms, and their /metrics text
 * (Prometheus exposition format 0.0.4). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_impl.h"
#include "status_impl.h"
#include "strbuf_impl.h"

static const double bounds[SRV_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};
static const char *const route_names[SRV_ROUTES] = {
    "head", "head_poll", "object", "catchup", "metrics", "healthz", "other"};
static const char *const code_names[SRV_CODES] = {
    "200", "206", "304", "400", "404", "405", "416", "500", "503", "other"};

void srv_histogram_add(srv_histogram *h, double seconds) {
  if (!(seconds >= 0))
    seconds = 0;
  unsigned b = 0;
  while (b < SRV_BUCKETS - 1 && seconds > bounds[b])
    b++;
  atomic_fetch_add(&h->bucket[b], 1);
  atomic_fetch_add(&h->count, 1);
  atomic_fetch_add(&h->sum_us, (unsigned long long)(seconds * 1e6 + 0.5));
}

static void histogram_text(pulse_strbuf *b, const char *name,
                           const char *labels, srv_histogram *h) {
  unsigned long long cum = 0;
  const char *sep = labels[0] ? "," : "";
  for (unsigned i = 0; i < SRV_BUCKETS; i++) {
    cum += atomic_load(&h->bucket[i]);
    if (i < SRV_BUCKETS - 1)
      pulse_strbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels,
                          sep, bounds[i], cum);
    else
      pulse_strbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels,
                          sep, cum);
  }
  const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
  pulse_strbuf_printf(b, "%s_sum%s%s%s %.6f\n", name, open, labels, close,
                      (double)atomic_load(&h->sum_us) / 1e6);
  pulse_strbuf_printf(b, "%s_count%s%s%s %llu\n", name, open, labels, close,
                      (unsigned long long)atomic_load(&h->count));
}

pulse_status srv_metrics_text(pulse_server *srv, pulse_buffer *out) {
  srv_metrics *m = &srv->metrics;
  pulse_strbuf b = PULSE_STRBUF_INIT;
  pulse_strbuf_printf(
      &b, "# HELP pulse_http_requests_total HTTP requests answered, by route "
          "and status.\n# TYPE pulse_http_requests_total counter\n");
  for (unsigned r = 0; r < SRV_ROUTES; r++)
    for (unsigned c = 0; c < SRV_CODES; c++) {
      unsigned long long v = atomic_load(&m->requests[r][c]);
      if (v > 0)
        pulse_strbuf_printf(
            &b, "pulse_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
            route_names[r], code_names[c], v);
    }
  pulse_strbuf_printf(
      &b,
      "# HELP pulse_http_response_bytes_total Body bytes of completed "
      "responses, by route.\n# TYPE pulse_http_response_bytes_total counter\n");
  for (unsigned r = 0; r < SRV_ROUTES; r++)
    pulse_strbuf_printf(
        &b, "pulse_http_response_bytes_total{route=\"%s\"} %llu\n",
        route_names[r], (unsigned long long)atomic_load(&m->bytes[r]));
  pulse_strbuf_printf(
      &b,
      "# HELP pulse_http_request_duration_seconds From the request line to "
      "the last byte handed to the kernel (long-polls include their wait).\n"
      "# TYPE pulse_http_request_duration_seconds histogram\n");
  for (unsigned r = 0; r < SRV_ROUTES; r++) {
    char labels[64];
    snprintf(labels, sizeof labels, "route=\"%s\"", route_names[r]);
    histogram_text(&b, "pulse_http_request_duration_seconds", labels,
                   &m->duration[r]);
  }
  pulse_strbuf_printf(
      &b, "# HELP pulse_longpoll_wakeup_seconds From the server learning of a "
          "new head to resuming a waiting long-poll.\n"
          "# TYPE pulse_longpoll_wakeup_seconds histogram\n");
  histogram_text(&b, "pulse_longpoll_wakeup_seconds", "", &m->wakeup);
  pulse_strbuf_printf(
      &b, "# HELP pulse_commit_duration_seconds Commit time of the in-process "
          "publisher.\n# TYPE pulse_commit_duration_seconds histogram\n");
  histogram_text(&b, "pulse_commit_duration_seconds", "", &m->commit);
  srv_head *h = srv_head_get(srv);
  size_t waiters = pulse_server_waiters(srv);
  pulse_strbuf_printf(
      &b,
      "# HELP pulse_head_step Step of the head being served (-1: none).\n"
      "# TYPE pulse_head_step gauge\npulse_head_step %lld\n",
      h ? (long long)h->step : -1LL);
  if (h != NULL) {
    pulse_strbuf_printf(&b,
                        "# HELP pulse_head_objects Objects the head names.\n"
                        "# TYPE pulse_head_objects gauge\n"
                        "pulse_head_objects{kind=\"patch\"} %zu\n"
                        "pulse_head_objects{kind=\"anchor\"} %zu\n",
                        pulse_store_head_patch_count(h->head),
                        pulse_store_head_anchor_count(h->head));
  }
  srv_head_release(h);
  pulse_strbuf_printf(
      &b,
      "# HELP pulse_longpoll_waiters Long-polls waiting now.\n"
      "# TYPE pulse_longpoll_waiters gauge\npulse_longpoll_waiters %zu\n",
      waiters);
  pulse_strbuf_printf(
      &b,
      "# HELP pulse_head_reloads_total Times head.json was read.\n"
      "# TYPE pulse_head_reloads_total counter\npulse_head_reloads_total %llu\n"
      "# HELP pulse_head_errors_total Heads refused (the previous one stays "
      "served).\n# TYPE pulse_head_errors_total counter\n"
      "pulse_head_errors_total %llu\n",
      (unsigned long long)atomic_load(&m->head_reloads),
      (unsigned long long)atomic_load(&m->head_errors));
  pulse_strbuf_printf(
      &b,
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
  if (b.failed) {
    pulse_strbuf_free(&b);
    return pulse_fail(PULSE_ERR_NOMEM, "server: metrics");
  }
  out->data = (uint8_t *)b.data;
  out->size = b.len;
  return PULSE_OK;
}
