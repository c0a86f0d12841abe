/* bench_netns.h - the `--netns NAME=ADDR,...` option of pulse-bench's
 * PULSELoCo runs: each trainer or peer process enters a network namespace
 * (made by `ip netns add`, e.g. by tools/scripts/loco_netns.sh) before it opens
 * any socket, and listens on that namespace's address. Linux only. */
#ifndef PULSE_BENCH_NETNS_H
#define PULSE_BENCH_NETNS_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** A network namespace (/run/netns/NAME) and the IPv4 address a process
 * in it listens on. */
typedef struct {
  char name[32];
  char addr[16];
} pulse_sim_netns;

/** Parses "NAME=A.B.C.D[,NAME=A.B.C.D...]": names of [A-Za-z0-9_.-] (at
 * most 31 bytes), dotted-quad IPv4 addresses; at most `cap` entries, at
 * least one. @return 0 with *count entries in out, or -1 (out and *count
 * left alone). */
int pulse_sim_netns_parse(const char *v, pulse_sim_netns *out, uint32_t cap,
                         uint32_t *count);

/** Moves the calling thread into the namespace (setns: call it in a
 * process before it starts threads or opens sockets). @return 0, or -1
 * with errno set. */
int pulse_sim_netns_enter(const pulse_sim_netns *ns);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_BENCH_NETNS_H */
