/* bench_netns.c - parsing and entering network namespaces for
 * pulse-bench's multi-process runs. */
#include "bench_netns.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define NAME_CHARS                                                            \
  "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-"

/* One "NAME=A.B.C.D" of n bytes into *ns. */
static int parse_one(const char *v, size_t n, pulse_sim_netns *ns) {
  size_t name = strcspn(v, "=");
  if (name == 0 || name >= n || name >= sizeof ns->name ||
      strspn(v, NAME_CHARS) < name)
    return -1;
  size_t k = n - name - 1;
  char addr[16], tail;
  unsigned o[4];
  if (k == 0 || k >= sizeof addr)
    return -1;
  memcpy(addr, v + name + 1, k);
  addr[k] = '\0';
  if (sscanf(addr, "%3u.%3u.%3u.%3u%c", &o[0], &o[1], &o[2], &o[3], &tail) !=
          4 ||
      o[0] > 255 || o[1] > 255 || o[2] > 255 || o[3] > 255)
    return -1;
  memcpy(ns->name, v, name);
  ns->name[name] = '\0';
  snprintf(ns->addr, sizeof ns->addr, "%u.%u.%u.%u", o[0], o[1], o[2], o[3]);
  return 0;
}

int pulse_sim_netns_parse(const char *v, pulse_sim_netns *out, uint32_t cap,
                         uint32_t *count) {
  uint32_t n = 0;
  pulse_sim_netns got[64];
  if (v == NULL || cap > 64)
    return -1;
  while (*v) {
    size_t len = strcspn(v, ",");
    if (n == cap || parse_one(v, len, &got[n]) != 0)
      return -1;
    n++;
    v += len;
    if (*v == ',')
      v++;
  }
  if (n == 0)
    return -1;
  memcpy(out, got, n * sizeof *got);
  *count = n;
  return 0;
}

int pulse_sim_netns_enter(const pulse_sim_netns *ns) {
  char path[64];
  snprintf(path, sizeof path, "/run/netns/%s", ns->name);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  int r = setns(fd, CLONE_NEWNET);
  int saved = errno;
  close(fd);
  errno = saved;
  return r;
}
