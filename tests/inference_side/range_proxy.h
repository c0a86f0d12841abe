/* range_proxy.h - a small HTTP proxy on 127.0.0.1 for the partial-route
 * tests (test_partial.c): one request per connection (it asks the
 * upstream server to close after each answer), and, as asked, drops the
 * Range and If-Range headers (a server without Range support), answers 404
 * to section indexes (a store or relay from before them), or flips one
 * body byte of the first 206 answer that does not start at byte 0 (a
 * corrupted section). It counts the response bytes it relays: what the
 * worker took from the server. */
#ifndef PULSE_RANGE_PROXY_H
#define PULSE_RANGE_PROXY_H

#include <stdint.h>

enum {
  RANGE_PROXY_PASS = 0,
  RANGE_PROXY_NO_RANGE = 1,     /* Range and If-Range dropped */
  RANGE_PROXY_NO_SECTIONS = 2,  /* .sections: 404 */
  RANGE_PROXY_FLIP_SECTION = 4  /* one byte of one ranged section answer */
};

typedef struct range_proxy range_proxy;

/** Starts a proxy in front of 127.0.0.1:upstream_port with the mode's bits;
 * NULL on failure. */
range_proxy *range_proxy_start(uint16_t upstream_port, int mode);
uint16_t range_proxy_port(const range_proxy *p);
/** Response bytes relayed so far (headers included). */
uint64_t range_proxy_bytes(const range_proxy *p);
/** 206 answers relayed so far; section indexes asked for. */
int range_proxy_partials(const range_proxy *p);
int range_proxy_sections(const range_proxy *p);
/** Answer bodies flipped so far. */
int range_proxy_flips(const range_proxy *p);
void range_proxy_stop(range_proxy *p); /* NULL is fine */

#endif
