/* metrics_testutil.h - one counter of a store server's /metrics text, for
 * the suites that check what the server counted. Header-only. */
#ifndef PULSE_METRICS_TESTUTIL_H
#define PULSE_METRICS_TESTUTIL_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_server.h"

/* The value of metric NAME (its sample line, not its HELP), or -1 when the
 * text has none. */
static inline long long tu_server_metric(pulse_server *srv, const char *name) {
  pulse_buffer text = {NULL, 0};
  cr_assert_eq(pulse_server_metrics(srv, &text), PULSE_OK);
  char *s = strndup((const char *)text.data, text.size), want[128];
  pulse_buffer_free(&text);
  cr_assert_not_null(s);
  snprintf(want, sizeof want, "\n%s ", name);
  const char *p = strstr(s, want);
  long long v = p != NULL ? strtoll(p + strlen(want), NULL, 10) : -1;
  free(s);
  return v;
}

#endif /* PULSE_METRICS_TESTUTIL_H */
