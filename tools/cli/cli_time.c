/* cli_time.c - monotonic clock and timing statistics. */
#include "cli_time.h"

#include <stdlib.h>
#include <time.h>

double pulse_cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double pulse_cli_since(double start) {
  return pulse_cli_now() - start;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double pulse_cli_median(double *samples, size_t n) {
  if (n == 0)
    return 0.0;
  qsort(samples, n, sizeof *samples, cmp_double);
  if (n % 2 == 1)
    return samples[n / 2];
  return 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

double pulse_cli_min(const double *samples, size_t n) {
  if (n == 0)
    return 0.0;
  double m = samples[0];
  for (size_t i = 1; i < n; i++)
    if (samples[i] < m)
      m = samples[i];
  return m;
}
