/* fail.c - re-raising an error with context (fail_impl.h). */
#include "fail_impl.h"

#include <stdarg.h>
#include <stdio.h>

pulse_status pulse_fail_context(pulse_status status, const char *fmt, ...) {
  char detail[512], context[512];
  snprintf(detail, sizeof detail, "%s", pulse_error_detail());
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(context, sizeof context, fmt, ap);
  va_end(ap);
  return pulse_fail(status, "%s: %s", context, detail);
}
