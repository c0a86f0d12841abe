/* pulse_log.c - leveled logging to stderr. */
#include "pulse_log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_int log_level = -1;

static pulse_log_level level_from_env(void) {
  const char *s = getenv("PULSE_LOG");
  if (s == NULL)
    return PULSE_LOG_WARN;
  if (strcmp(s, "error") == 0)
    return PULSE_LOG_ERROR;
  if (strcmp(s, "info") == 0)
    return PULSE_LOG_INFO;
  if (strcmp(s, "debug") == 0)
    return PULSE_LOG_DEBUG;
  return PULSE_LOG_WARN;
}

pulse_log_level pulse_log_level_get(void) {
  int level = atomic_load_explicit(&log_level, memory_order_relaxed);
  if (level < 0) {
    level = (int)level_from_env();
    atomic_store_explicit(&log_level, level, memory_order_relaxed);
  }
  return (pulse_log_level)level;
}

void pulse_log_level_set(pulse_log_level level) {
  atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

void pulse_log_write(pulse_log_level level, const char *fmt, ...) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  /* One fprintf per line keeps lines from different threads whole. */
  fprintf(stderr, "pulse %s: %s\n", names[level & 3], line);
}
