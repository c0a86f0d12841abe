/* bench_sync_netns.c - the rate-limited link of `pulse-bench sync`: a veth
 * pair between the root network namespace (server side) and a new one
 * (client side), shaped by tc tbf on the server's end. One per process;
 * bs_netns_teardown removes it on every exit path. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_sync_impl.h"

static char ns_name[64], veth_srv[16], veth_cli[16], ns_subnet[32],
    srv_addr[40];
static int ns_made = 0;

int bs_sh(const char *fmt, ...) {
  char cmd[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[1200];
  snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
  int rc = system(full);
  return rc == 0 ? 0 : -1;
}

void bs_netns_teardown(void) {
  if (!ns_made)
    return;
  bs_sh("ip link del %s", veth_srv);
  bs_sh("ip netns del %s", ns_name);
  ns_made = 0;
}

int bs_netns_setup(void) {
  if (geteuid() != 0 || bs_sh("ip -V") != 0 || bs_sh("tc -V") != 0)
    return -1;
  unsigned pid = (unsigned)getpid();
  snprintf(ns_name, sizeof ns_name, "pulse-bench-%u", pid);
  snprintf(veth_srv, sizeof veth_srv, "pb%us", pid % 10000000u);
  snprintf(veth_cli, sizeof veth_cli, "pb%uc", pid % 10000000u);
  snprintf(ns_subnet, sizeof ns_subnet, "10.213.%u", pid % 250u + 1);
  if (bs_sh("ip netns add %s", ns_name) != 0)
    return -1;
  ns_made = 1;
  if (bs_sh("ip link add %s type veth peer name %s", veth_srv, veth_cli) != 0 ||
      bs_sh("ip link set %s netns %s", veth_cli, ns_name) != 0 ||
      bs_sh("ip addr add %s.1/30 dev %s", ns_subnet, veth_srv) != 0 ||
      bs_sh("ip link set %s up", veth_srv) != 0 ||
      bs_sh("ip netns exec %s ip addr add %s.2/30 dev %s", ns_name, ns_subnet,
            veth_cli) != 0 ||
      bs_sh("ip netns exec %s ip link set %s up", ns_name, veth_cli) != 0 ||
      bs_sh("ip netns exec %s ip link set lo up", ns_name) != 0) {
    bs_netns_teardown();
    return -1;
  }
  return 0;
}

int bs_netns_rate(const char *rate, const char *burst) {
  return bs_sh("tc qdisc replace dev %s root tbf rate %s burst %s latency 50ms",
               veth_srv, rate, burst);
}

const char *bs_netns_name(void) {
  return ns_made ? ns_name : "";
}

const char *bs_netns_server_addr(void) {
  snprintf(srv_addr, sizeof srv_addr, "%s.1", ns_subnet);
  return srv_addr;
}

/* Bits per second of a tc rate ("100mbit", "1gbit"), for the output. */
double bs_rate_bps(const char *rate) {
  char *end;
  double v = strtod(rate, &end);
  if (strncmp(end, "kbit", 4) == 0)
    return v * 1e3;
  if (strncmp(end, "mbit", 4) == 0)
    return v * 1e6;
  if (strncmp(end, "gbit", 4) == 0)
    return v * 1e9;
  return v;
}
