/* pulse_status.h - status codes shared by every pulse module.
 *
 * Every fallible public function returns a pulse_status. Codes are never
 * reused or renumbered: a number, once published, keeps its meaning. */
#ifndef PULSE_STATUS_H
#define PULSE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* One list makes both the enum and the message table (pulse_status.c). */
#define PULSE_STATUS_LIST(X)                                                   \
  X(PULSE_OK, 0, "success")                                                    \
  X(PULSE_ERR_ARG, 1, "invalid argument")                                      \
  X(PULSE_ERR_NOMEM, 2, "out of memory")                                       \
  X(PULSE_ERR_IO, 3, "input/output error")                                     \
  X(PULSE_ERR_TRUNCATED, 4, "input is truncated")                              \
  X(PULSE_ERR_MAGIC, 5, "bad magic number")                                    \
  X(PULSE_ERR_VERSION, 6, "unsupported format version")                        \
  X(PULSE_ERR_CORRUPT, 7, "corrupt or inconsistent data")                      \
  X(PULSE_ERR_POSITION, 8, "position out of range or not increasing")          \
  X(PULSE_ERR_OVERFLOW, 9, "count or size overflows")                          \
  X(PULSE_ERR_SIZE_MISMATCH, 10, "size or shape mismatch")                     \
  X(PULSE_ERR_BASE_DIGEST, 11, "base digest does not match")                   \
  X(PULSE_ERR_TARGET_DIGEST, 12, "target digest does not match")               \
  X(PULSE_ERR_BASE_STEP, 13, "base step does not match")                       \
  X(PULSE_ERR_DTYPE, 14, "unsupported or mismatched dtype")                    \
  X(PULSE_ERR_JSON, 15, "malformed JSON")                                      \
  X(PULSE_ERR_DUPLICATE, 16, "duplicate tensor name")                          \
  X(PULSE_ERR_OFFSETS, 17, "tensor data offsets are invalid")                  \
  X(PULSE_ERR_NOT_FOUND, 18, "not found")                                      \
  X(PULSE_ERR_NOT_BUILT, 19, "feature not built in")                           \
  X(PULSE_ERR_CUDA, 20, "CUDA error")                                          \
  X(PULSE_ERR_TRAILING, 21, "unexpected trailing bytes")                       \
  X(PULSE_ERR_UNSUPPORTED, 22, "unsupported feature")                          \
  X(PULSE_ERR_INTERNAL, 23, "internal error")                                 \
  X(PULSE_ERR_STALE, 24, "older than the maximum age")

typedef enum {
#define PULSE_STATUS_ENUM_(name, num, msg) name = num,
  PULSE_STATUS_LIST(PULSE_STATUS_ENUM_)
#undef PULSE_STATUS_ENUM_
} pulse_status;

/** Returns a static, human-readable message for a status (never NULL). */
const char *pulse_status_str(pulse_status status);

/** Returns the status' symbolic name, e.g. "PULSE_ERR_CORRUPT" (never NULL). */
const char *pulse_status_name(pulse_status status);

/** Detailed text of the last error raised on this thread by any pulse
 * function ("" when none). Valid until the next pulse call on this thread. */
const char *pulse_error_detail(void);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_STATUS_H */
