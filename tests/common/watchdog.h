/* watchdog.h - a hung test fails under its own name instead of holding the
 * whole run.
 *
 * Criterion 2.4 times out only the tests that set .timeout themselves:
 * neither `--timeout` nor a suite's .timeout reaches the others (tried on
 * 2.4.1), and one hung test once held CI's run until its 90-minute limit
 * (the loco suite under ASan), with nothing to say which. So each module's
 * suites.c gives every suite of the module .init = pulse_test_watchdog.
 * Criterion runs each test in a worker process of its own and a suite's
 * .init there, before the test's own .init; the alarm it arms ends a test
 * still running after PULSE_TEST_WATCHDOG_S seconds (default 600, above
 * every test's own .timeout) with SIGALRM, which Criterion reports as a
 * crash of that test. Tests must not use SIGALRM themselves (a child
 * process a test forks does not inherit the alarm). */
#ifndef PULSE_WATCHDOG_H
#define PULSE_WATCHDOG_H

#include <stdlib.h>
#include <unistd.h>

static inline void pulse_test_watchdog(void) {
  unsigned seconds = 600;
  const char *env = getenv("PULSE_TEST_WATCHDOG_S");
  if (env != NULL && atoi(env) > 0)
    seconds = (unsigned)atoi(env);
  alarm(seconds);
}

#endif
