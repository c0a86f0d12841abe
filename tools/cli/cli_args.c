/* cli_args.c - option matching and strict number parsing. */
#include "cli_args.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_status.h"

int pulse_cli_opt_value(int argc, char **argv, int *i, const char *name,
                       const char **value) {
  const char *arg = argv[*i];
  size_t len = strlen(name);
  if (strncmp(arg, name, len) != 0)
    return 0;
  if (arg[len] == '=') {
    *value = arg + len + 1;
    return 1;
  }
  if (arg[len] != '\0')
    return 0;
  if (*i + 1 >= argc)
    return -1;
  *i += 1;
  *value = argv[*i];
  return 1;
}

int pulse_cli_opt_flag(const char *arg, const char *name) {
  return strcmp(arg, name) == 0;
}

int pulse_cli_parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s < '0' || *s > '9')
    return -1;
  char *end = NULL;
  errno = 0;
  uint64_t v = strtoull(s, &end, 10);
  if (errno != 0)
    return -1;
  if (*end == '.' || *end == 'e' || *end == 'E') {
    /* Scientific form: accepted only when the value is an exact integer
     * that a double holds exactly (below 2^53). */
    errno = 0;
    double d = strtod(s, &end);
    if (errno != 0 || !isfinite(d) || d < 0 || d >= 9007199254740992.0 ||
        d != floor(d))
      return -1;
    v = (uint64_t)d;
  }
  uint64_t mul = 1;
  switch (*end) {
  case 'k':
  case 'K':
    mul = 1000ull;
    break;
  case 'M':
    mul = 1000000ull;
    break;
  case 'G':
    mul = 1000000000ull;
    break;
  case 'T':
    mul = 1000000000000ull;
    break;
  default:
    break;
  }
  if (mul != 1)
    end++;
  if (*end != '\0')
    return -1;
  if (v != 0 && mul > UINT64_MAX / v)
    return -1;
  *out = v * mul;
  return 0;
}

int pulse_cli_parse_double(const char *s, double *out) {
  if (s == NULL || *s == '\0')
    return -1;
  char *end = NULL;
  errno = 0;
  double d = strtod(s, &end);
  if (errno != 0 || *end != '\0' || !isfinite(d))
    return -1;
  *out = d;
  return 0;
}

int pulse_cli_parse_int(const char *s, int min, int max, int *out) {
  if (s == NULL || *s == '\0')
    return -1;
  char *end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min || v > max)
    return -1;
  *out = (int)v;
  return 0;
}

int pulse_cli_fail(const char *prog, const char *what, int status) {
  pulse_status st = (pulse_status)status;
  const char *detail = pulse_error_detail();
  fprintf(stderr, "%s: %s: %s (%s)%s%s\n", prog, what, pulse_status_str(st), pulse_status_name(st),
          detail[0] ? ": " : "", detail);
  return 1;
}
