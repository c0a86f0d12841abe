/* bench_loco_collab.c - `pulse-bench loco --target-batch T ...`: PULSELoCo
 * as an open collaboration (loco/pulse_loco_collab.h) on the built-in
 * problem, one process per peer on 127.0.0.1, peers throttled to given
 * speeds (samples per second) so that scaling shows on a small machine,
 * and churn (joins, clean leaves, kill -9 of a peer or of a round's writer)
 * at given rounds.
 *
 * Each peer speaks to this parent through two pipes, one line each:
 *   peer -> parent  "url ID URL"
 *                   "round R SAMPLES OWN CONTRIB WRITER TAKEOVERS IN OUT
 *                    BUSY_MS WALL_MS LOSS MEMBERS" (MEMBERS: ids of the next
 *                    round, comma separated; LOSS nan: it comes apart)
 *                   "loss R LOSS" (from the next round's lowest id, once
 *                    evaluated off the peer's critical path)
 *                   "done ID ROUND DIGEST BUSY_MS ALIVE_MS", "error TEXT"
 *   parent -> peer  "start N ID URL ...", "join URL", "leave", "quit"
 *
 * This file: the run from the command line to the summary. The parts:
 * bench_loco_collab_args.c (the command line), bench_loco_collab_peer.c and
 * bench_loco_collab_eval.c (a peer), bench_loco_collab_parent.c and
 * bench_loco_collab_churn.c (forking, reading and disturbing the peers),
 * bench_loco_collab_print.c (the rounds and the report). */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_impl.h"
#include "bench_loco_collab_impl.h"
#include "cli_time.h"

int bench_loco_collab_main(int argc, char **argv) {
  static collab_bench b;
  memset(&b, 0, sizeof b);
  b.a.rounds = 30;
  b.a.target = 1024;
  b.a.params = 20000;
  b.a.seed = 1;
  b.a.claim_ms = 1500;
  b.a.round_ms = 5000;
  b.a.gate_mean = -1; /* by the averaging, once parsed */
  int rc = bench_loco_collab_parse(argc, argv, &b.a);
  if (rc >= 0)
    return rc;
  b.rng = b.a.seed ^ 0xC011ABull;
  signal(SIGPIPE, SIG_IGN);
  /* Every id a peer may have (joiners included): keys before any fork. */
  for (uint32_t id = 1; !b.a.no_auth && id <= MAXP; id++) {
    if (pulse_sign_key_generate(&b.a.keys[id]) != PULSE_OK)
      return fprintf(stderr, PROG ": key: %s\n", pulse_error_detail()), 1;
    b.a.pins[id - 1].id = id;
    pulse_sign_key_public(b.a.keys[id], b.a.pins[id - 1].key);
  }
  uint32_t serving = b.a.trainers - b.a.clients;
  for (uint32_t i = 0; i < b.a.trainers; i++) {
    /* Clients after every serving founder is up: each names one. */
    const char *host = i < serving ? NULL : b.p[(i - serving) % serving].url;
    if (bench_loco_collab_spawn_peer(&b, i + 1, host) != 0)
      return fprintf(stderr, PROG ": could not start peer %u\n", i + 1), 1;
  }
  char line[8192];
  int off = snprintf(line, sizeof line, "start %u", b.a.trainers);
  for (size_t i = 0; i < b.n; i++)
    off += snprintf(line + off, sizeof line - (size_t)off, " %u %s", b.p[i].id,
                    b.p[i].url);
  b.start = pulse_cli_now();
  for (size_t i = 0; i < b.n; i++)
    dprintf(b.p[i].to, "%s\n", line);
  bench_loco_collab_event_loop(&b);
  bench_loco_collab_heal(&b, 1);
  double wall = pulse_cli_since(b.start);
  for (size_t i = 0; i < b.n; i++)
    if (b.p[i].alive)
      dprintf(b.p[i].to, "quit\n");
  for (size_t i = 0; i < b.n; i++) {
    int status;
    for (int t = 0; t < 200 && waitpid(b.p[i].pid, &status, WNOHANG) == 0; t++)
      usleep(10000);
    kill(b.p[i].pid, SIGKILL);
    waitpid(b.p[i].pid, &status, 0);
  }
  uint32_t last = 0;
  while (last < b.a.rounds && b.rows[last].have)
    last++;
  /* Survivors' final states. */
  int identical = 1, survivors = 0;
  uint64_t digest = 0;
  double busy_min = 1.0;
  for (size_t i = 0; i < b.n; i++) {
    if (!b.p[i].done || b.p[i].final_round != b.a.rounds)
      continue;
    if (survivors++ == 0)
      digest = b.p[i].digest;
    identical &= b.p[i].digest == digest;
  }
  uint64_t samples = 0;
  double final_loss = NAN, t_end = 0;
  for (uint32_t r = 0; r < last; r++) {
    samples += b.rows[r].samples;
    if (!isnan(b.rows[r].loss))
      final_loss = b.rows[r].loss;
    t_end = b.rows[r].t_s;
  }
  bench_loco_collab_print_rounds(&b, last);
  double sps = t_end > 0 ? (double)samples / t_end : 0;
  in_ratios q = bench_loco_collab_ratios_of(&b, last);
  if (b.a.json) {
    printf("{\"summary\":true,\"auth\":%s,\"auth_bytes\":%" PRIu64
           ",\"auth_bytes_per_peer_round\":%.1f,",
           b.a.no_auth ? "false" : "true", b.auth_bytes,
           b.auth_reports ? (double)b.auth_bytes / (double)b.auth_reports
                          : 0.0);
    printf("\"final_loss\":%.9g,\"samples\":%" PRIu64
           ",\"samples_per_s\":%.2f,\"rounds\":%u,\"wall_s\":%.3f,"
           "\"target_batch\":%" PRIu64 ",\"gate_mean\":%s,\"identical\":%s,"
           "\"in_over_payload\":{\"mean\":%.3f,\"worst_peer\":%.3f,"
           "\"worst_peer_round\":%.3f,\"writer\":%.3f},\"busy\":{",
           final_loss, samples, sps, last, wall, b.a.target,
           b.a.gate_mean ? "true" : "false", identical ? "true" : "false",
           q.mean, q.worst_peer, q.worst_peer_round, q.writer);
  } else {
    if (b.a.no_auth)
      printf("authentication off (--no-auth)\n");
    else
      printf("authentication on (Ed25519, every peer's key pinned; views, "
             "states, manifests, payloads, partitioned blobs, claims, "
             "grants): signing added "
             "%.1f bytes per peer and "
             "round\n",
             b.auth_reports ? (double)b.auth_bytes / (double)b.auth_reports
                            : 0.0);
    printf("rounds %u  samples %" PRIu64 "  samples/s %.1f  final loss %.6f"
           "  survivors identical: %s\nmean gate %s; bytes in / own payload: "
           "mean %.2fx, worst peer %.2fx, worst peer-round %.2fx, writers "
           "%.2fx\nbusy:",
           last, samples, sps, final_loss, identical ? "yes" : "no",
           b.a.gate_mean ? "on" : "off", q.mean, q.worst_peer,
           q.worst_peer_round, q.writer);
  }
  int first = 1;
  for (size_t i = 0; i < b.n; i++) {
    if (!b.p[i].done || b.p[i].alive_ms == 0)
      continue;
    double f = (double)b.p[i].busy_ms / (double)b.p[i].alive_ms;
    if (f < busy_min)
      busy_min = f;
    if (b.a.json)
      printf("%s\"%u\":%.4f", first ? "" : ",", b.p[i].id, f);
    else
      printf(" %u:%.1f%%", b.p[i].id, 100 * f);
    first = 0;
  }
  if (b.a.json)
    printf("},\"busy_min\":%.4f}\n", busy_min);
  else
    printf("  (min %.1f%%)\n", 100 * busy_min);
  for (uint32_t id = 1; id <= MAXP; id++)
    pulse_sign_key_free(b.a.keys[id]);
  if (b.a.report && bench_loco_collab_write_report(&b, last, argc, argv) != 0)
    return 1;
  if (b.failed || last < b.a.rounds) {
    fprintf(stderr,
            PROG ": the collaboration did not complete (%u of %u "
                 "rounds)\n",
            last, b.a.rounds);
    return 1;
  }
  return 0;
}
