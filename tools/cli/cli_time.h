/* cli_time.h - monotonic clock and timing statistics for the programs in
 * tools/ (benchmarks, demos). Thread-safe: no shared state. */
#ifndef PULSE_CLI_TIME_H
#define PULSE_CLI_TIME_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Seconds on the monotonic clock (CLOCK_MONOTONIC) from an arbitrary
 * origin; only differences mean anything. */
double pulse_cli_now(void);

/** Seconds elapsed since `start`, a value returned by pulse_cli_now(). */
double pulse_cli_since(double start);

/** Median of n samples (n >= 1; 0.0 when n == 0). Sorts `samples` in place:
 * the caller's order is lost. With an even n, the mean of the middle two. */
double pulse_cli_median(double *samples, size_t n);

/** Smallest of n samples (0.0 when n == 0). */
double pulse_cli_min(const double *samples, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CLI_TIME_H */
