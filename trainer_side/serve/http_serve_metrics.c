/* http_serve_metrics.c - the HTTP serving layer's counters and histograms
 * per route label, and their /metrics text (Prometheus exposition format
 * 0.0.4), followed by the user's own. */
#include <stdio.h>
#include <string.h>

#include "http_serve_core_impl.h"
#include "status_impl.h"

static const double bounds[PULSE_SERVE_BUCKETS - 1] = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25,   0.5,   1,      2.5,   5,    10,    30,   60};

/* Statuses counted by name; any other is "other". */
static const unsigned codes[SERVE_CODES - 1] = {
    200, 201, 202, 204, 206, 304, 400, 403, 404,
    405, 409, 413, 416, 422, 429, 500, 503};
static const char *const code_names[SERVE_CODES] = {
    "200", "201", "202", "204", "206", "304", "400", "403", "404",
    "405", "409", "413", "416", "422", "429", "500", "503", "other"};

static unsigned code_index(unsigned status) {
  for (unsigned i = 0; i < SERVE_CODES - 1; i++)
    if (codes[i] == status)
      return i;
  return SERVE_CODES - 1;
}

unsigned serve_label_index(const pulse_serve *s, const char *label) {
  for (unsigned i = 0; label != NULL && i < s->nlabels; i++)
    if (strcmp(s->labels[i], label) == 0)
      return i;
  return s->label_other;
}

void pulse_serve_histogram_add(pulse_serve_histogram *h, double seconds) {
  if (!(seconds >= 0))
    seconds = 0;
  if (seconds > 1e9) /* the sum in nanoseconds stays in range */
    seconds = 1e9;
  unsigned b = 0;
  while (b < PULSE_SERVE_BUCKETS - 1 && seconds > bounds[b])
    b++;
  atomic_fetch_add(&h->bucket[b], 1);
  atomic_fetch_add(&h->count, 1);
  atomic_fetch_add(&h->sum_ns, (unsigned long long)(seconds * 1e9 + 0.5));
}

void serve_metrics_count(pulse_serve *s, unsigned label, unsigned status,
                         uint64_t bytes, double seconds) {
  serve_metrics *m = &s->metrics;
  atomic_fetch_add(&m->requests[label][code_index(status)], 1);
  atomic_fetch_add(&m->bytes[label], bytes);
  pulse_serve_histogram_add(&m->duration[label], seconds);
}

void pulse_serve_histogram_text(pulse_bytebuf *b, const char *name,
                                const char *labels,
                                const pulse_serve_histogram *hc) {
  pulse_serve_histogram *h = (pulse_serve_histogram *)hc; /* atomic loads */
  unsigned long long cum = 0;
  const char *sep = labels[0] ? "," : "";
  for (unsigned i = 0; i < PULSE_SERVE_BUCKETS; i++) {
    cum += atomic_load(&h->bucket[i]);
    if (i < PULSE_SERVE_BUCKETS - 1)
      pulse_bytebuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels,
                           sep, bounds[i], cum);
    else
      pulse_bytebuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels,
                           sep, cum);
  }
  const char *open = labels[0] ? "{" : "", *close = labels[0] ? "}" : "";
  pulse_bytebuf_printf(b, "%s_sum%s%s%s %.9f\n", name, open, labels, close,
                       (double)atomic_load(&h->sum_ns) / 1e9);
  pulse_bytebuf_printf(b, "%s_count%s%s%s %llu\n", name, open, labels, close,
                       (unsigned long long)atomic_load(&h->count));
}

pulse_status pulse_serve_metrics_text(pulse_serve *s, pulse_buffer *out) {
  if (s == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "serve: NULL argument");
  serve_metrics *m = &s->metrics;
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  pulse_bytebuf_printf(
      &b, "# HELP pulse_http_requests_total HTTP requests answered, by route "
          "and status.\n# TYPE pulse_http_requests_total counter\n");
  for (unsigned r = 0; r < s->nlabels; r++)
    for (unsigned c = 0; c < SERVE_CODES; c++) {
      unsigned long long v = atomic_load(&m->requests[r][c]);
      if (v > 0)
        pulse_bytebuf_printf(
            &b, "pulse_http_requests_total{route=\"%s\",code=\"%s\"} %llu\n",
            s->labels[r], code_names[c], v);
    }
  pulse_bytebuf_printf(
      &b,
      "# HELP pulse_http_response_bytes_total Body bytes of completed "
      "responses, by route.\n# TYPE pulse_http_response_bytes_total counter\n");
  for (unsigned r = 0; r < s->nlabels; r++)
    pulse_bytebuf_printf(
        &b, "pulse_http_response_bytes_total{route=\"%s\"} %llu\n",
        s->labels[r], (unsigned long long)atomic_load(&m->bytes[r]));
  pulse_bytebuf_printf(
      &b,
      "# HELP pulse_http_request_duration_seconds From the request line to "
      "the last byte handed to the kernel (long-polls include their wait).\n"
      "# TYPE pulse_http_request_duration_seconds histogram\n");
  for (unsigned r = 0; r < s->nlabels; r++) {
    char labels[96];
    snprintf(labels, sizeof labels, "route=\"%s\"", s->labels[r]);
    pulse_serve_histogram_text(&b, "pulse_http_request_duration_seconds",
                               labels, &m->duration[r]);
  }
  pulse_bytebuf_printf(
      &b,
      "# HELP pulse_http_header_timeouts_total Connections closed because "
      "a request's headers did not arrive in time.\n"
      "# TYPE pulse_http_header_timeouts_total counter\n"
      "pulse_http_header_timeouts_total %llu\n"
      "# HELP pulse_http_body_timeouts_total Connections closed because "
      "a request's body arrived too slowly (under the minimum rate once "
      "the header timeout's grace was over).\n"
      "# TYPE pulse_http_body_timeouts_total counter\n"
      "pulse_http_body_timeouts_total %llu\n"
      "# HELP pulse_http_evicted_connections_total Connections closed to make "
      "room for a new one at the cap (the one waiting longest with no "
      "request running).\n"
      "# TYPE pulse_http_evicted_connections_total counter\n"
      "pulse_http_evicted_connections_total %llu\n"
      "# HELP pulse_http_refused_connections_total New connections closed at "
      "the cap, every other one running a request.\n"
      "# TYPE pulse_http_refused_connections_total counter\n"
      "pulse_http_refused_connections_total %llu\n",
      (unsigned long long)atomic_load(&m->header_timeouts),
      (unsigned long long)atomic_load(&m->body_timeouts),
      (unsigned long long)atomic_load(&m->evictions),
      (unsigned long long)atomic_load(&m->refused));
  if (s->opts.metrics != NULL)
    s->opts.metrics(s->opts.user, &b);
  if (pulse_bytebuf_take(&b, out) != PULSE_OK)
    return pulse_fail(PULSE_ERR_NOMEM, "%s: metrics", s->opts.name);
  return PULSE_OK;
}

uint64_t pulse_serve_response_bytes(const pulse_serve *s) {
  serve_metrics *m = (serve_metrics *)&s->metrics; /* atomic loads */
  uint64_t total = 0;
  for (unsigned r = 0; r < s->nlabels; r++)
    if (r != s->label_metrics)
      total += atomic_load(&m->bytes[r]);
  return total;
}
