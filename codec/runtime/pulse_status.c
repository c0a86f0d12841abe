/* pulse_status.c - status messages and the per-thread error detail. */
#include "pulse_status.h"
#include "status_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_detail[512];

const char *pulse_status_str(pulse_status status) {
  switch (status) {
#define PULSE_STATUS_MSG_(name, num, msg)                                      \
  case name:                                                                   \
    return msg;
    PULSE_STATUS_LIST(PULSE_STATUS_MSG_)
#undef PULSE_STATUS_MSG_
  }
  return "unknown status";
}

const char *pulse_status_name(pulse_status status) {
  switch (status) {
#define PULSE_STATUS_NAME_(name, num, msg)                                     \
  case name:                                                                   \
    return #name;
    PULSE_STATUS_LIST(PULSE_STATUS_NAME_)
#undef PULSE_STATUS_NAME_
  }
  return "PULSE_ERR_UNKNOWN";
}

const char *pulse_error_detail(void) { return error_detail; }

pulse_status pulse_fail(pulse_status status, const char *fmt, ...) {
  /* Formatted aside first: callers often wrap the previous detail
   * (pulse_fail(st, "tensor '%s': %s", name, pulse_error_detail())), and
   * formatting in place would read what it is overwriting. */
  char detail[sizeof error_detail];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(detail, sizeof detail, fmt, ap);
  va_end(ap);
  memcpy(error_detail, detail, sizeof detail);
  return status;
}

void pulse_error_clear(void) { error_detail[0] = '\0'; }

pulse_status pulse_opts_check(const char *who, int present, uint32_t version,
                              uint32_t expected) {
  if (!present)
    return pulse_fail(PULSE_ERR_ARG, "%s: NULL options", who);
  if (version != expected)
    return pulse_fail(PULSE_ERR_VERSION,
                      "%s: options of version %u, this library's are %u "
                      "(built against other headers? start from the "
                      "options' _init function)",
                      who, version, expected);
  return PULSE_OK;
}
