/* status_impl.h - private helpers for raising errors with detail. */
#ifndef PULSE_STATUS_IMPL_H
#define PULSE_STATUS_IMPL_H

#include <stdint.h>

#include "pulse_status.h"

#if defined(__GNUC__)
#define PULSE_PRINTF_(a, b) __attribute__((format(printf, a, b)))
#else
#define PULSE_PRINTF_(a, b)
#endif

/* Records a formatted detail for pulse_error_detail() and returns status, so
 * call sites read: return pulse_fail(PULSE_ERR_CORRUPT, "chunk %u ...", i); */
pulse_status pulse_fail(pulse_status status, const char *fmt, ...)
    PULSE_PRINTF_(2, 3);

void pulse_error_clear(void);

/* Propagates a non-OK status from a call. */
#define PULSE_TRY(expr)                                                        \
  do {                                                                         \
    pulse_status pulse_try_st_ = (expr);                                       \
    if (pulse_try_st_ != PULSE_OK)                                             \
      return pulse_try_st_;                                                    \
  } while (0)

/* The one check of an options struct (docs/api-conventions.md): NULL is
 * PULSE_ERR_ARG; a struct_version other than this library's is
 * PULSE_ERR_VERSION, the detail naming both (the caller was built against
 * other headers, or did not start from its pulse_X_opts_init). */
pulse_status pulse_opts_check(const char *who, int present, uint32_t version,
                              uint32_t expected);
#define PULSE_OPTS_CHECK(who, opts, expected)                                  \
  pulse_opts_check((who), (opts) != NULL,                                      \
                   (opts) != NULL ? (opts)->struct_version : 0u, (expected))


#endif
