/* sim_exchange.c - all-to-all message exchange of the in-process runs
 * (sim_exchange.h), in memory or over loco's HTTP blob servers. */
#include <stdio.h>
#include <stdlib.h>

#include "bytebuf_impl.h"
#include "peer_http_impl.h"
#include "status_impl.h"
#include "sim_exchange.h"

#define PATH_PREFIX "/v1/bench/msg/"
/* Fetches in flight at once: the messages of several receivers are fetched
 * together (fewer, fuller rounds of the fetch loop), within this bound. */
#define MAX_IN_FLIGHT 64u
/* Everything runs on this machine and every message is published before it
 * is asked for: the deadline only turns a hang into an error. */
#define RECEIVE_TIMEOUT_MS 60000u

struct pulse_sim_exchange {
  uint32_t n;
  int http;
  pulse_bytebuf *own; /* n: each trainer's newest message */
  uint64_t *own_seq;  /* n: its exchange; UINT64_MAX before the first */
  /* HTTP only */
  loco_server **srv; /* n */
  char (*base)[40];  /* n: "http://127.0.0.1:PORT" */
  uint32_t group;    /* receivers fetched together */
  /* group * n: box[(to % group) * n + from], kept to reuse capacity */
  pulse_bytebuf *box;
  uint64_t *box_seq; /* group: the exchange a receiver's boxes hold */
  uint32_t *box_to;  /* group: that receiver */
  loco_fetch *fetch; /* group * n scratch targets */
  char (*url)[96];   /* group * n scratch URLs */
  uint64_t put, served_memory, received;
};

pulse_status pulse_sim_exchange_create(uint32_t trainers, int over_http,
                                      pulse_sim_exchange **out) {
  if (out == NULL || trainers == 0 || trainers > 4096)
    return pulse_fail(PULSE_ERR_ARG, "exchange: 1..4096 trainers");
  *out = NULL;
  pulse_sim_exchange *x = calloc(1, sizeof *x);
  if (x == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "exchange");
  size_t n = trainers;
  x->n = trainers;
  x->http = over_http != 0;
  x->own = calloc(n, sizeof *x->own);
  x->own_seq = malloc(n * sizeof *x->own_seq);
  if (x->own == NULL || x->own_seq == NULL) {
    pulse_sim_exchange_free(x);
    return pulse_fail(PULSE_ERR_NOMEM, "exchange of %zu trainers", n);
  }
  for (size_t i = 0; i < n; i++)
    x->own_seq[i] = UINT64_MAX;
  if (x->http) {
    x->group = n > 1 && MAX_IN_FLIGHT / (n - 1) > 1
                   ? (uint32_t)(MAX_IN_FLIGHT / (n - 1))
                   : 1u;
    if (x->group > n)
      x->group = (uint32_t)n;
    size_t slots = (size_t)x->group * n;
    x->srv = calloc(n, sizeof *x->srv);
    x->base = calloc(n, sizeof *x->base);
    x->box = calloc(slots, sizeof *x->box);
    x->box_seq = malloc(x->group * sizeof *x->box_seq);
    x->box_to = calloc(x->group, sizeof *x->box_to);
    x->fetch = calloc(slots, sizeof *x->fetch);
    x->url = calloc(slots, sizeof *x->url);
    if (!x->srv || !x->base || !x->box || !x->box_seq || !x->box_to ||
        !x->fetch || !x->url) {
      pulse_sim_exchange_free(x);
      return pulse_fail(PULSE_ERR_NOMEM, "exchange of %zu trainers", n);
    }
    for (size_t g = 0; g < x->group; g++)
      x->box_seq[g] = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
      pulse_status st = loco_server_start(NULL, NULL, &x->srv[i]);
      if (st != PULSE_OK) {
        pulse_sim_exchange_free(x);
        return st;
      }
      snprintf(x->base[i], sizeof x->base[i], "http://127.0.0.1:%u",
               (unsigned)loco_server_port(x->srv[i]));
    }
  }
  *out = x;
  return PULSE_OK;
}

void pulse_sim_exchange_free(pulse_sim_exchange *x) {
  if (x == NULL)
    return;
  size_t n = x->n;
  for (size_t i = 0; x->srv && i < n; i++)
    loco_server_stop(x->srv[i]);
  for (size_t i = 0; x->own && i < n; i++)
    pulse_bytebuf_free(&x->own[i]);
  for (size_t i = 0; x->box && i < (size_t)x->group * n; i++)
    pulse_bytebuf_free(&x->box[i]);
  free(x->own), free(x->own_seq), free(x->srv), free(x->base), free(x->box);
  free(x->box_seq), free(x->box_to), free(x->fetch), free(x->url);
  free(x);
}

pulse_status pulse_sim_exchange_put(pulse_sim_exchange *x, uint32_t from,
                                   uint64_t seq, const void *data,
                                   size_t size) {
  if (x == NULL || from >= x->n || (data == NULL && size > 0) ||
      seq == UINT64_MAX)
    return pulse_fail(PULSE_ERR_ARG, "exchange put: bad argument");
  pulse_bytebuf *own = &x->own[from];
  own->size = 0;
  pulse_bytebuf_put(own, data, size);
  if (own->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "exchange put: %zu bytes", size);
  x->own_seq[from] = seq;
  x->put += size;
  if (!x->http)
    return PULSE_OK;
  char path[64];
  snprintf(path, sizeof path, PATH_PREFIX "%llu", (unsigned long long)seq);
  PULSE_TRY(loco_server_put(x->srv[from], path, data, size));
  if (seq > 0)
    loco_server_drop(x->srv[from], PATH_PREFIX, seq);
  return PULSE_OK;
}

/* Over HTTP: the messages of seq for receivers first, first + 1, ... (a
 * group, at most x->group of them), every other trainer's, all at once. */
static pulse_status fetch_group(pulse_sim_exchange *x, uint32_t first,
                                uint64_t seq, size_t max_bytes) {
  size_t n = x->n, k = 0;
  uint32_t end = first + x->group < x->n ? first + x->group : x->n;
  for (uint32_t to = first; to < end; to++)
    for (size_t j = 0; j < n; j++) {
      if (j == to)
        continue;
      snprintf(x->url[k], sizeof x->url[k], "%s" PATH_PREFIX "%llu", x->base[j],
               (unsigned long long)seq);
      x->fetch[k].url = x->url[k];
      x->fetch[k].max_bytes = max_bytes;
      /* lent, taken back below */
      x->fetch[k].body = x->box[(to % x->group) * n + j];
      x->fetch[k].done = 0;
      k++;
    }
  pulse_status st =
      loco_http_gather(x->fetch, k, loco_now_ms() + RECEIVE_TIMEOUT_MS);
  k = 0;
  for (uint32_t to = first; to < end; to++) {
    int all = 1;
    for (size_t j = 0; j < n; j++) {
      if (j == to)
        continue;
      x->box[(to % x->group) * n + j] = x->fetch[k].body;
      all &= x->fetch[k].done;
      k++;
    }
    x->box_to[to % x->group] = to;
    x->box_seq[to % x->group] = all ? seq : UINT64_MAX;
    if (st == PULSE_OK && !all)
      st = pulse_fail(PULSE_ERR_IO,
                      "exchange: trainer %u did not get every message %llu "
                      "within %u ms",
                      to, (unsigned long long)seq, RECEIVE_TIMEOUT_MS);
  }
  return st;
}

pulse_status pulse_sim_exchange_receive(pulse_sim_exchange *x, uint32_t to,
                                       uint64_t seq, size_t max_bytes,
                                       pulse_sim_message *msgs) {
  if (x == NULL || msgs == NULL || to >= x->n)
    return pulse_fail(PULSE_ERR_ARG, "exchange receive: bad argument");
  for (uint32_t j = 0; j < x->n; j++)
    if (x->own_seq[j] != seq)
      return pulse_fail(PULSE_ERR_ARG,
                        "exchange receive: trainer %u has not published "
                        "message %llu",
                        j, (unsigned long long)seq);
  if (x->http) {
    uint32_t g = to % x->group;
    if (x->box_seq[g] != seq || x->box_to[g] != to)
      PULSE_TRY(fetch_group(x, to, seq, max_bytes));
    for (uint32_t j = 0; j < x->n; j++) {
      const pulse_bytebuf *b = &x->box[(size_t)g * x->n + j];
      if (j == to)
        continue;
      if (b->size > max_bytes)
        return pulse_fail(PULSE_ERR_ARG,
                          "exchange: message of trainer %u is over %zu bytes",
                          j, max_bytes);
      msgs[j].data = b->data;
      msgs[j].size = b->size;
    }
  } else {
    for (uint32_t j = 0; j < x->n; j++) {
      if (j == to)
        continue;
      if (x->own[j].size > max_bytes)
        return pulse_fail(PULSE_ERR_ARG,
                          "exchange: message of trainer %u is over %zu bytes",
                          j, max_bytes);
      msgs[j].data = x->own[j].data;
      msgs[j].size = x->own[j].size;
      x->served_memory += x->own[j].size;
    }
  }
  for (uint32_t j = 0; j < x->n; j++)
    if (j != to)
      x->received += msgs[j].size;
  msgs[to].data = x->own[to].data;
  msgs[to].size = x->own[to].size;
  return PULSE_OK;
}

void pulse_sim_exchange_counts(const pulse_sim_exchange *x,
                              pulse_sim_exchange_bytes *out) {
  out->put = x->put;
  out->received = x->received;
  out->served = x->served_memory;
  for (uint32_t i = 0; x->http && i < x->n; i++)
    out->served += loco_server_bytes_served(x->srv[i]);
}
