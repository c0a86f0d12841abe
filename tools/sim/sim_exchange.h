/* sim_exchange.h - how the in-process runs of sim_trainers.h move their
 * messages between trainers: all to all, every trainer publishes one
 * message per exchange and receives every other trainer's.
 *
 * Over HTTP (the benchmark) each trainer has its own loco blob server on
 * 127.0.0.1 (loco/transport/peer_http_impl.h, the server and fetches PULSELoCo's nodes
 * use): a message is served from memory to each of the other trainers,
 * fetched with libcurl, and its bytes are counted as the servers served
 * them. In memory (the tests) the receivers read the published copies and
 * the same bytes are counted as if they had been sent.
 *
 * Thread-safety: one thread at a time (the servers run their own threads). */
#ifndef PULSE_SIM_EXCHANGE_H
#define PULSE_SIM_EXCHANGE_H

#include <stddef.h>
#include <stdint.h>

#include "pulse_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_sim_exchange pulse_sim_exchange;

/* A received message (borrowed). */
typedef struct {
  const uint8_t *data;
  size_t size;
} pulse_sim_message;

/* Byte counts since creation. */
typedef struct {
  uint64_t put;      /* sizes of the messages published, each counted once */
  uint64_t served;   /* message bodies that left their trainers: every
                        message once per other trainer (HTTP: as counted
                        by the servers, loco_server_bytes_served) */
  uint64_t received; /* message bodies that arrived */
} pulse_sim_exchange_bytes;

/** An exchange between `trainers` trainers (1..4096), over HTTP on
 * 127.0.0.1 (one server per trainer, ports chosen by the kernel) when
 * over_http is set, else in memory.
 * @return PULSE_OK; PULSE_ERR_ARG; PULSE_ERR_IO (a server did not start);
 * PULSE_ERR_NOMEM. */
pulse_status pulse_sim_exchange_create(uint32_t trainers, int over_http,
                                      pulse_sim_exchange **out);

/** Stops the servers and frees everything. NULL is fine. */
void pulse_sim_exchange_free(pulse_sim_exchange *x);

/** Trainer `from` publishes its message of exchange `seq` (copied); its
 * messages of earlier exchanges are dropped.
 * @return PULSE_OK, PULSE_ERR_ARG or PULSE_ERR_NOMEM. */
pulse_status pulse_sim_exchange_put(pulse_sim_exchange *x, uint32_t from,
                                   uint64_t seq, const void *data, size_t size);

/** Trainer `to` receives the messages of exchange `seq` of every trainer:
 * msgs[j] for j < trainers, msgs[to] being its own (not sent). Every
 * trainer must have published its message of seq first; a message longer
 * than max_bytes is refused. Over HTTP the messages of the next receivers
 * (to + 1, ...) are fetched at the same time, for their own calls. The
 * messages are borrowed until the next put, receive or free.
 * @return PULSE_OK; PULSE_ERR_IO (a message did not arrive in time);
 * PULSE_ERR_ARG; PULSE_ERR_NOMEM. */
pulse_status pulse_sim_exchange_receive(pulse_sim_exchange *x, uint32_t to,
                                       uint64_t seq, size_t max_bytes,
                                       pulse_sim_message *msgs);

/** The byte counts so far. */
void pulse_sim_exchange_counts(const pulse_sim_exchange *x,
                              pulse_sim_exchange_bytes *out);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_SIM_EXCHANGE_H */
