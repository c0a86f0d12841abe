/* bench_serve_impl.h - private to `pulse-bench serve` (bench_serve*.c): the
 * command line, what each of the three benchmarks measured, and what the
 * parts export. Names start with bench_serve_. */
#ifndef PULSE_BENCH_SERVE_IMPL_H
#define PULSE_BENCH_SERVE_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define PROG "pulse-bench serve"
#define MAX_CLIENT_COUNTS 8

typedef struct {
  uint64_t object_mb;
  int objects;
  int clients[MAX_CLIENT_COUNTS];
  int nclients;
  double seconds;
  int rounds;
  int threads; /* server threads and nginx workers; 0: one per CPU */
  const char *nginx;
  int no_nginx;
  int polls;
  uint64_t params, steps, anchor_every;
  int commit_threads;
  int json;
  int skip_throughput, skip_poll, skip_commit;
  const char *report; /* --report DIR */
} serve_args;

typedef struct {
  double mbps;
  uint64_t requests;
  int errors;
} tp_result;

typedef struct {
  double median_ms, p90_ms, max_ms; /* from the rename */
  double hook_median_ms;            /* from the publisher's head hook */
  int n, errors;
} poll_result;

typedef struct {
  uint64_t params;
  int steps;
  double bare_median_s, commit_median_s, ratio_median, ratio_max;
  double anchor_steps_ratio_max;
  double write_median_s;
  uint64_t changed_median, patch_median;
  int errors;
} commit_result;

/* What the three parts measured, for the JSON line and the report. */
typedef struct {
  int workers;
  tp_result pulse_tp[MAX_CLIENT_COUNTS], nginx_tp[MAX_CLIENT_COUNTS];
  int have_nginx;
  poll_result notify_r, watch_r;
  commit_result cr;
} serve_results;

/** Reads argv into *a (--help: prints the usage and exits 0).
 * @return 0, or -1 on bad usage (printed) (bench_serve_args.c). */
int bench_serve_parse_args(int argc, char **argv, serve_args *a);

/** Removes dir and everything under it (bench_serve.c). */
void bench_serve_rm_rf(const char *dir);

/* ------------------------- HTTP/1.1 on plain sockets (bench_serve_http.c) */

/** A TCP connection to 127.0.0.1:port, TCP_NODELAY. @return the fd, or -1. */
int bench_serve_connect_local(uint16_t port);

/** Sends all n bytes. @return 0, or -1. */
int bench_serve_send_all(int fd, const char *p, size_t n);

/** Reads a response's header block; leaves body bytes already read in
 * hbuf[*hlen - *extra ..). Returns the status, or -1. */
int bench_serve_read_headers(int fd, char *hbuf, size_t cap, size_t *hlen,
                             uint64_t *clen, int *close_after, size_t *extra);

/* ------------------------------------- what the throughput benchmark runs */

/** `clients` keep-alive client threads GET paths[] in turn from
 * 127.0.0.1:port for `seconds` (bench_serve_clients.c). */
tp_result bench_serve_run_clients(uint16_t port, char **paths, int npaths,
                                  int clients, double seconds);

/** The nginx binary: `given`, else /usr/sbin/nginx, else the first on PATH.
 * @return NULL when none is executable (bench_serve_nginx.c). */
const char *bench_serve_find_nginx(const char *given);

/** Starts nginx serving store/objects at /v1/objects/ on a free port, its
 * files under work/nginx. @return its pid, or -1. */
pid_t bench_serve_start_nginx(const char *bin, const char *work,
                              const char *store, int workers,
                              uint16_t *port_out);

/* --------------------------------------------------- the three benchmarks */

/** 1. Throughput: pulse's server and nginx over the same objects, best of
 * interleaved rounds per client count. 0 or 1 (said on stderr)
 * (bench_serve_throughput.c). */
int bench_serve_throughput(const serve_args *a, const char *work,
                           serve_results *res);

/** 2. Long-poll wake-up: a server told by the in-process publisher, and one
 * that watches head.json. 0 or 1 (said on stderr) (bench_serve_longpoll.c). */
int bench_serve_longpoll(const serve_args *a, const char *work,
                         serve_results *res);

/** 3. Commit vs bare encoder. 0 or 1 (bench_serve_commit.c). */
int bench_serve_commit(const serve_args *a, const char *work,
                       serve_results *res);

/* ----------------------------------------------------------------- output */

/** The results as one JSON object (bench_serve_print.c). */
void bench_serve_json(const serve_args *a, const serve_results *res);

/** --report DIR: the three tables and their charts. 0 or 1. */
int bench_serve_report(const serve_args *a, int argc, char **argv,
                       const serve_results *res);

#endif /* PULSE_BENCH_SERVE_IMPL_H */
