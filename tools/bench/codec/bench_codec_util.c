/* bench_codec_util.c - the small helpers every part of `pulse-bench codec`
 * uses: the failure message, numbers with thousands separators, a ratio
 * that is 0 where there is nothing to divide by. */
#include <inttypes.h>
#include <stdio.h>

#include "bench_codec_impl.h"

int bench_codec_fail_status(const char *what, pulse_status st) {
  const char *detail = pulse_error_detail();
  fprintf(stderr, PROG ": %s: %s%s%s%s\n", what, pulse_status_str(st),
          detail[0] ? " (" : "", detail, detail[0] ? ")" : "");
  return 1;
}

/* Decimal with thousands separators, into buf (32 bytes). */
const char *bench_codec_fmt_u64(uint64_t v, char *buf) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%" PRIu64, v);
  int out = 0;
  for (int i = 0; i < n; i++) {
    if (i > 0 && (n - i) % 3 == 0)
      buf[out++] = ',';
    buf[out++] = tmp[i];
  }
  buf[out] = '\0';
  return buf;
}

double bench_codec_per(double num, double den) {
  return den > 0 ? num / den : 0.0;
}
