/* bench_serve_clients.c - the throughput clients of `pulse-bench serve`:
 * threads with one keep-alive connection each, the same for both servers,
 * reading every byte into user space as a real client does; MB/s over the
 * run from the first start to the last end. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "bench_serve_impl.h"
#include "cli_time.h"

typedef struct {
  uint16_t port;
  char **paths;
  int npaths, first;
  double deadline;
  uint64_t bytes, requests;
  int errors;
  double end;
  pthread_barrier_t *start;
} client_job;

static void *client_main(void *arg) {
  client_job *j = arg;
  size_t cap = (size_t)1 << 18;
  char *buf = malloc(cap), hbuf[16384];
  int fd = -1, k = j->first;
  pthread_barrier_wait(j->start);
  while (buf != NULL && pulse_cli_now() < j->deadline) {
    if (fd < 0 && (fd = bench_serve_connect_local(j->port)) < 0) {
      j->errors++;
      break;
    }
    char req[512];
    int len =
        snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                 j->paths[k++ % j->npaths]);
    size_t hlen, extra;
    uint64_t clen;
    int close_after;
    int status = bench_serve_send_all(fd, req, (size_t)len) == 0
                     ? bench_serve_read_headers(fd, hbuf, sizeof hbuf, &hlen,
                                                &clen, &close_after, &extra)
                     : -1;
    if (status != 200) {
      j->errors++;
      close(fd);
      fd = -1;
      continue;
    }
    uint64_t left = clen - extra;
    j->bytes += extra;
    int cut = 0;
    while (left > 0) {
      ssize_t n = recv(fd, buf, left < cap ? (size_t)left : cap, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        j->errors++;
        cut = 1;
        break;
      }
      j->bytes += (uint64_t)n;
      left -= (uint64_t)n;
      if (pulse_cli_now() >= j->deadline) { /* time is up mid-body */
        cut = 1;
        break;
      }
    }
    if (!cut)
      j->requests++;
    if (cut || close_after) {
      close(fd);
      fd = -1;
    }
  }
  if (fd >= 0)
    close(fd);
  free(buf);
  j->end = pulse_cli_now();
  return NULL;
}

tp_result bench_serve_run_clients(uint16_t port, char **paths, int npaths,
                                  int clients, double seconds) {
  tp_result r = {0, 0, 0};
  client_job *jobs = calloc((size_t)clients, sizeof *jobs);
  pthread_t *th = calloc((size_t)clients, sizeof *th);
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)clients + 1);
  for (int i = 0; i < clients; i++) {
    jobs[i].port = port;
    jobs[i].paths = paths;
    jobs[i].npaths = npaths;
    jobs[i].first = i;
    jobs[i].start = &start;
  }
  double t0 = pulse_cli_now() + 0.05;
  for (int i = 0; i < clients; i++) {
    jobs[i].deadline = t0 + seconds;
    pthread_create(&th[i], NULL, client_main, &jobs[i]);
  }
  pthread_barrier_wait(&start);
  t0 = pulse_cli_now();
  uint64_t bytes = 0;
  double end = t0;
  for (int i = 0; i < clients; i++) {
    pthread_join(th[i], NULL);
    bytes += jobs[i].bytes;
    r.requests += jobs[i].requests;
    r.errors += jobs[i].errors;
    if (jobs[i].end > end)
      end = jobs[i].end;
  }
  pthread_barrier_destroy(&start);
  r.mbps = end > t0 ? (double)bytes / (end - t0) / 1e6 : 0;
  free(jobs), free(th);
  return r;
}
