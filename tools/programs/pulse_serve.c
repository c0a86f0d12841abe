/* pulse-serve --store DIR --listen HOST:PORT: serves a pulse store folder
 * over HTTP (docs/protocols/sync.md) until SIGINT or SIGTERM, following
 * the head that a publisher in another process moves. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "pulse_server.h"
#include "pulse_sign.h"
#include "cli_args.h"

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pulse-serve --store DIR --listen HOST:PORT [options]\n"
      "  --store DIR            a store folder written by pulse-publish (or a "
      "publisher)\n"
      "  --listen HOST:PORT     address to listen on; port 0 picks a free one "
      "(printed)\n"
      "  --threads N            worker threads (default: one per CPU, at least "
      "2)\n"
      "  --max-connections N    connections at once, long-polls included "
      "(default 1024);\n"
      "                         past it a new one evicts the one waiting "
      "longest\n"
      "                         with no request running\n"
      "  --max-per-ip N         connections from one address (default 128; "
      "0: no limit;\n"
      "                         behind a relay, the relay's own limit)\n"
      "  --max-waiters N        long-polls at once (default 512)\n"
      "  --idle-timeout S       close idle connections after S seconds "
      "(default 60)\n"
      "  --header-timeout S     close a connection whose request headers "
      "take longer\n"
      "                         than S seconds, or whose POST body then arrives "
      "slower\n"
      "                         than 16 KiB/s after S seconds of grace "
      "(default 10; 0: none)\n"
      "  --key KEY.pem          sign catch-up patches with this Ed25519 key\n"
      "                         (default: DIR/signing-key.pem when it exists; "
      "a server\n"
      "                         without the head's key builds no catch-ups: "
      "clients fetch\n"
      "                         the signed patches)\n"
      "  --catchup-builds N     catch-ups built at once, off the HTTP threads "
      "(default 1)\n"
      "  --catchup-queue N      catch-ups waiting to be built; beyond, 503 "
      "(default 16)\n"
      "  --catchup-wait-ms N    how long a request waits for its catch-up's "
      "build before\n"
      "                         503 + Retry-After (default 10000; 0: answer "
      "at once)\n"
      "Prints 'pulse-serve: serving DIR on http://HOST:PORT' once "
      "listening.\n");
}

static int fail(const char *what, pulse_status st) {
  return pulse_cli_fail("pulse-serve", what, st);
}

int main(int argc, char **argv) {
  const char *store = NULL, *listen = NULL, *key_path = NULL, *v;
  pulse_server_opts o;
  pulse_server_opts_init(&o);
  for (int i = 1; i < argc; i++) {
    int r, n;
    if (pulse_cli_opt_flag(argv[i], "--help") ||
        pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--store", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      store = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--listen", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      listen = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--key", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      key_path = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--catchup-builds",
                                       &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 64, &n) != 0)
        return fprintf(stderr, "pulse-serve: --catchup-builds needs 1..64\n"),
               2;
      o.catchup_builds = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--catchup-queue",
                                       &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 100000, &n) != 0)
        return fprintf(stderr,
                       "pulse-serve: --catchup-queue needs 1..100000\n"),
               2;
      o.catchup_queue = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--catchup-wait-ms",
                                       &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 600000, &n) != 0)
        return fprintf(stderr,
                       "pulse-serve: --catchup-wait-ms needs 0..600000\n"),
               2;
      o.catchup_wait_ms = (uint32_t)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 1024, &n) != 0)
        return fprintf(stderr, "pulse-serve: --threads needs 0..1024\n"), 2;
      o.threads = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--max-connections",
                                       &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 1000000, &n) != 0)
        return fprintf(stderr,
                       "pulse-serve: --max-connections needs 1..1000000\n"),
               2;
      o.max_connections = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--max-per-ip", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 1000000, &n) != 0)
        return fprintf(stderr, "pulse-serve: --max-per-ip needs 0..1000000\n"),
               2;
      o.max_per_ip = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--max-waiters", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 1, 1000000, &n) != 0)
        return fprintf(stderr, "pulse-serve: --max-waiters needs 1..1000000\n"),
               2;
      o.max_waiters = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--header-timeout",
                                       &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 3600, &n) != 0)
        return fprintf(stderr,
                       "pulse-serve: --header-timeout needs 0..3600 seconds\n"),
               2;
      o.header_timeout_s = (unsigned)n;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--idle-timeout", &v)) !=
               0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 86400, &n) != 0)
        return fprintf(stderr,
                       "pulse-serve: --idle-timeout needs 0..86400 seconds\n"),
               2;
      o.idle_timeout_s = (unsigned)n;
    } else {
      fprintf(stderr, "pulse-serve: unknown argument '%s'\n", argv[i]);
      return usage(stderr), 2;
    }
  }
  if (store == NULL || listen == NULL)
    return usage(stderr), 2;
  char host[256];
  pulse_status st =
      pulse_server_parse_listen(listen, host, sizeof host, &o.port);
  if (st != PULSE_OK)
    return fail("--listen", st);
  o.host = host;
  o.store_dir = store;
  pulse_sign_key *key = NULL;
  if (key_path != NULL &&
      (st = pulse_sign_key_load(key_path, &key)) != PULSE_OK)
    return fail(key_path, st);
  if (key_path == NULL) {
    /* The server next to its publisher signs with pulse-publish's default
     * key; a mirror (which never holds it) builds no catch-ups. */
    char def[4096];
    snprintf(def, sizeof def, "%s/signing-key.pem", store);
    st = pulse_sign_key_load(def, &key);
    if (st == PULSE_OK)
      fprintf(stderr, "pulse-serve: signing catch-ups with %s\n", def);
    else if (st != PULSE_ERR_NOT_FOUND)
      return fail(def, st);
  }
  o.key = key;

  /* Block the stop signals before any thread starts: every thread inherits
   * the mask, and main takes them with sigwait. */
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);
  signal(SIGPIPE, SIG_IGN);
  /* Room for the connection cap (the server needs about 2 descriptors per
   * connection allowed, and lowers the cap when it has fewer). */
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &rl);
  }

  pulse_server *srv = NULL;
  st = pulse_server_create(&o, &srv);
  if (st != PULSE_OK) {
    pulse_sign_key_free(key);
    return fail(store, st);
  }
  printf("pulse-serve: serving %s on http://%s:%u\n", store,
         host[0] ? host : "0.0.0.0", (unsigned)pulse_server_port(srv));
  fflush(stdout);
  int sig = 0;
  sigwait(&stop, &sig);
  fprintf(stderr, "pulse-serve: %s, stopping\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM");
  pulse_server_free(srv);
  pulse_sign_key_free(key);
  return 0;
}
