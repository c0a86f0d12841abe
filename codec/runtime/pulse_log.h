/* pulse_log.h - leveled logging to stderr; the library never prints to stdout.
 *
 * The level comes from the PULSE_LOG environment variable (error, warn, info,
 * debug; default warn). PULSE_LOG_AT checks the level before formatting, so a
 * disabled message costs one comparison. Thread-safe. */
#ifndef PULSE_LOG_H
#define PULSE_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  PULSE_LOG_ERROR = 0,
  PULSE_LOG_WARN = 1,
  PULSE_LOG_INFO = 2,
  PULSE_LOG_DEBUG = 3
} pulse_log_level;

/** Current level (read once from PULSE_LOG, then cached). */
pulse_log_level pulse_log_level_get(void);

/** Overrides the level for this process. */
void pulse_log_level_set(pulse_log_level level);

/** Writes one line "pulse LEVEL: message" to stderr. Use PULSE_LOG_AT. */
void pulse_log_write(pulse_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define PULSE_LOG_AT(level, ...)                                               \
  do {                                                                         \
    if ((level) <= pulse_log_level_get())                                      \
      pulse_log_write((level), __VA_ARGS__);                                   \
  } while (0)

#ifdef __cplusplus
}
#endif
#endif
