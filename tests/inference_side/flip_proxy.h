/* flip_proxy.h - a small TCP proxy on 127.0.0.1 for the tests: it relays
 * HTTP between a client and a pulse server and, when asked, flips one bit
 * of every immutable object body it carries (byte 40 of each response whose
 * headers say "immutable"), like a faulty or hostile relay would, or cuts
 * catch-up answers mid-body. It can be stopped (every connection cut, new
 * ones refused) and started again on its port, like a server that dies and
 * comes back. */
#ifndef PULSE_FLIP_PROXY_H
#define PULSE_FLIP_PROXY_H

#include <stdint.h>

typedef struct flip_proxy flip_proxy;

/** Starts a proxy in front of 127.0.0.1:upstream_port; `flip` turns the
 * corruption on (1: immutable objects; 2: catch-up bodies too). Returns
 * NULL on failure. */
flip_proxy *flip_proxy_start(uint16_t upstream_port, int flip);

/** The same on a given port (0: any), with SO_REUSEADDR, so that a proxy
 * stopped a moment ago can be brought back on its port. */
flip_proxy *flip_proxy_start_at(uint16_t upstream_port, int flip,
                                uint16_t port);

/** Relays server bytes at most this fast per connection (0: no limit), so
 * that a cut lands in the middle of a download. */
void flip_proxy_set_rate(flip_proxy *p, uint64_t bytes_per_s);

/** Cuts the connection of the next `times` catch-up answers (GET
 * /v1/catchup/...; times < 0: every one) after `after` body bytes, like a
 * link that drops (0: right after the headers). */
void flip_proxy_cut_catchups(flip_proxy *p, uint64_t after, int times);

/** Catch-up answers cut so far. */
int flip_proxy_cuts(const flip_proxy *p);

/** The port the proxy listens on. */
uint16_t flip_proxy_port(const flip_proxy *p);

/** Object bodies corrupted so far. */
int flip_proxy_flips(const flip_proxy *p);

/** Stops accepting, closes every connection, frees. NULL is fine. */
void flip_proxy_stop(flip_proxy *p);

#endif
