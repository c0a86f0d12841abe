/* bench_serve_args.c - the command line of `pulse-bench serve`: its usage
 * text and the options. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_impl.h"
#include "bench_serve_impl.h"
#include "cli_args.h"
#include "sim_synth.h"

void bench_serve_usage(FILE *out) {
  fprintf(
      out,
      "usage: pulse-bench serve [options]\n"
      "  Serving throughput of large objects (pulse vs nginx on the same "
      "files),\n"
      "  long-poll wake-up latency, commit time vs the bare encoder.\n"
      "  --object-mb N     size of each object (default 256)\n"
      "  --objects K       distinct objects the clients cycle through (default "
      "2)\n"
      "  --clients LIST    concurrent clients, comma separated (default "
      "1,8,32)\n"
      "  --seconds S       per measurement (default 3)\n"
      "  --rounds R        interleaved rounds per client count, best kept "
      "(default 2)\n"
      "  --threads N       server threads = nginx workers (default: one per "
      "CPU)\n"
      "  --nginx PATH      nginx binary (default: /usr/sbin/nginx, then PATH)\n"
      "  --no-nginx        pulse only\n"
      "  --polls N         long-poll wake-ups timed per mode (default 50)\n"
      "  --params N        parameters of the commit trajectory (default 20M)\n"
      "  --steps S         commits timed (default 8)\n"
      "  --anchor-every K  anchors during the commit run (default 4; "
      "background)\n"
      "  --commit-threads T  detection/encoding threads (default: one per "
      "core)\n"
      "  --only throughput|poll|commit\n"
      "  --json            one JSON object\n"
      "  --report DIR      also write DIR/throughput.csv, DIR/longpoll.csv,\n"
      "                    DIR/commit.csv and DIR/report.html (charts)\n");
}

int bench_serve_parse_args(int argc, char **argv, serve_args *a) {
  memset(a, 0, sizeof *a);
  a->object_mb = 256;
  a->objects = 2;
  a->clients[0] = 1, a->clients[1] = 8, a->clients[2] = 32;
  a->nclients = 3;
  a->seconds = 3;
  a->rounds = 2;
  a->polls = 50;
  a->params = 20000000;
  a->steps = 8;
  a->anchor_every = 4;
  const char *v;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help")) {
      bench_serve_usage(stdout);
      exit(0);
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--object-mb", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->object_mb) != 0 ||
          a->object_mb < 1 || a->object_mb > 65536)
        return fprintf(stderr, PROG ": --object-mb needs 1..65536\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--objects", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 64, &a->objects) != 0)
        return fprintf(stderr, PROG ": --objects needs 1..64\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--clients", &v)) !=
               0) {
      if (r < 0)
        return -1;
      a->nclients = 0;
      char tmp[256];
      snprintf(tmp, sizeof tmp, "%s", v);
      for (char *save = NULL, *tok = strtok_r(tmp, ",", &save); tok;
           tok = strtok_r(NULL, ",", &save)) {
        if (a->nclients == MAX_CLIENT_COUNTS ||
            pulse_cli_parse_int(tok, 1, 1024, &a->clients[a->nclients]) != 0)
          return fprintf(stderr,
                         PROG ": --clients needs up to 8 counts in 1..1024\n"),
                 -1;
        a->nclients++;
      }
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--seconds", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_double(v, &a->seconds) != 0 ||
          !(a->seconds > 0) || a->seconds > 600)
        return fprintf(stderr, PROG ": --seconds needs a number in (0, 600]\n"),
               -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--rounds", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 100, &a->rounds) != 0)
        return fprintf(stderr, PROG ": --rounds needs 1..100\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &a->threads) != 0)
        return fprintf(stderr, PROG ": --threads needs 0..256\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--nginx", &v)) != 0) {
      if (r < 0)
        return -1;
      a->nginx = v;
    } else if (pulse_cli_opt_flag(argv[i], "--no-nginx")) {
      a->no_nginx = 1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--polls", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 100000, &a->polls) != 0)
        return fprintf(stderr, PROG ": --polls needs 1..100000\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--params", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->params) != 0 ||
          a->params < PULSE_SYNTH_MIN_PARAMS)
        return fprintf(stderr, PROG ": --params needs an integer >= %u\n",
                       PULSE_SYNTH_MIN_PARAMS),
               -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--steps", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->steps) != 0 || a->steps < 1 ||
          a->steps > 10000)
        return fprintf(stderr, PROG ": --steps needs 1..10000\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--anchor-every",
                                        &v)) != 0) {
      if (r < 0 || pulse_cli_parse_u64(v, &a->anchor_every) != 0)
        return fprintf(stderr, PROG ": --anchor-every needs an integer\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--commit-threads",
                                        &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &a->commit_threads) != 0)
        return fprintf(stderr, PROG ": --commit-threads needs 0..256\n"), -1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--only", &v)) != 0) {
      if (r < 0 ||
          (strcmp(v, "throughput") && strcmp(v, "poll") && strcmp(v, "commit")))
        return fprintf(stderr, PROG ": --only throughput|poll|commit\n"), -1;
      a->skip_throughput = strcmp(v, "throughput") != 0;
      a->skip_poll = strcmp(v, "poll") != 0;
      a->skip_commit = strcmp(v, "commit") != 0;
    } else if (pulse_cli_opt_flag(argv[i], "--json")) {
      a->json = 1;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--report", &v)) != 0) {
      if (r < 0)
        return -1;
      a->report = v;
    } else {
      fprintf(stderr, PROG ": unknown argument '%s'\n", argv[i]);
      return -1;
    }
  }
  return 0;
}
