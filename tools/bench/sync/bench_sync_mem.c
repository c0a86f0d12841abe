/* bench_sync_mem.c - a worker's resident memory, from /proc: what
 * `pulse-bench sync` reports as each worker's peak above its targets. */
#include <stdio.h>
#include <string.h>

#include "bench_sync_impl.h"

uint64_t bs_mem_kib(int pid, const char *field) {
  char path[64], line[256];
  if (pid > 0)
    snprintf(path, sizeof path, "/proc/%d/status", pid);
  else
    snprintf(path, sizeof path, "/proc/self/status");
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return 0;
  size_t n = strlen(field);
  uint64_t kib = 0;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, field, n) == 0 && line[n] == ':') {
      unsigned long long v = 0;
      if (sscanf(line + n + 1, "%llu", &v) == 1)
        kib = v;
      break;
    }
  fclose(f);
  return kib;
}

int bs_mem_reset_peak(int pid) {
  char path[64];
  if (pid > 0)
    snprintf(path, sizeof path, "/proc/%d/clear_refs", pid);
  else
    snprintf(path, sizeof path, "/proc/self/clear_refs");
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return -1;
  int ok = fputs("5", f) >= 0; /* 5: VmHWM back to the current VmRSS */
  return fclose(f) == 0 && ok ? 0 : -1;
}
