/* udp_impl.h - private to loco/: the datagram socket of the exchange over
 * UDP (docs/protocols/loco-datagrams.md "Exchange over datagrams"). One socket per node, bound to
 * the node's address with a given or kernel-chosen port; a thread drains
 * it into a queue as fast as datagrams come (a node busy with HTTP or its
 * inner steps must not let the kernel's small buffer overflow: that would
 * be loss nobody chose), and the node takes them from the queue with a
 * deadline. */
#ifndef PULSE_LOCO_UDP_IMPL_H
#define PULSE_LOCO_UDP_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

/* The largest datagram kept whole; a longer one is kept cut, flagged. */
#define LOCO_UDP_MAX 2048u

typedef struct loco_datagram {
  struct loco_datagram *next;
  uint32_t addr;  /* source IPv4 address, host order */
  uint16_t port;  /* source port */
  int cut;        /* longer than LOCO_UDP_MAX: only the start is here */
  size_t size;    /* bytes in data */
  uint8_t data[]; /* size bytes */
} loco_datagram;

typedef struct loco_udp loco_udp;

/** Opens a socket on the IPv4 address addr (host order; 127.0.0.1 in
 * tests) and port (0: chosen by the kernel), and starts its receiving
 * thread.
 * @return PULSE_OK, PULSE_ERR_IO (the port is taken, ...), PULSE_ERR_NOMEM. */
pulse_status loco_udp_open(uint32_t addr, uint16_t port, loco_udp **out);

/** Stops the thread, closes the socket, frees what is queued. NULL is
 * fine. */
void loco_udp_close(loco_udp *u);

uint16_t loco_udp_port(const loco_udp *u);

/** Sends one datagram to addr:port (host order). A full send buffer waits
 * a little (datagrams are not dropped here on purpose: simulated loss is
 * the caller's). A datagram the network path refuses (a local firewall's
 * drop makes sendto fail with EPERM, an earlier ICMP unreachable with
 * ECONNREFUSED, no route, a full buffer that stays full) is lost like one
 * dropped on the wire: *lost is set and the round goes on.
 * @return PULSE_OK, or PULSE_ERR_IO for a socket that cannot send at all. */
pulse_status loco_udp_send(loco_udp *u, uint32_t addr, uint16_t port,
                           const uint8_t *data, size_t size, int *lost);

/** Bytes of the datagrams sent so far (those sendto took whole; not the
 * ones *lost on the path). Called by the sending thread. */
uint64_t loco_udp_bytes_sent(const loco_udp *u);

/** Takes the oldest queued datagram, waiting until deadline (loco_now_ms()
 * value) at most; NULL when none came. The caller frees it with free(). */
loco_datagram *loco_udp_take(loco_udp *u, uint64_t deadline_ms);

/** Moves what the socket holds to the queue now, on the calling thread
 * (before a receiver concludes that nothing more came: the thread may not
 * have run). */
void loco_udp_flush(loco_udp *u);

/** Datagrams the thread could not queue (the queue's byte cap). */
uint64_t loco_udp_overflow(const loco_udp *u);

#endif
