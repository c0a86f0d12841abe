/* fail_impl.h - re-raising an error with context; internal to pulse
 * (pulse_codec_internal). */
#ifndef PULSE_TRAINER_FAIL_IMPL_H
#define PULSE_TRAINER_FAIL_IMPL_H

#include "status_impl.h"

/** Re-raises `status` with the current detail (pulse_error_detail())
 * prefixed by a formatted context: "CONTEXT: DETAIL". The detail is copied
 * first: passing pulse_error_detail() to pulse_fail itself would format a
 * buffer into itself. */
pulse_status pulse_fail_context(pulse_status status, const char *fmt, ...)
    PULSE_PRINTF_(2, 3);

#endif /* PULSE_TRAINER_FAIL_IMPL_H */
