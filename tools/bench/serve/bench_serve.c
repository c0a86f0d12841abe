/* bench_serve.c - `pulse-bench serve`: the trainer side's serving and
 * publishing costs.
 *
 *  1. throughput of large immutable objects to 1, 8 and 32 concurrent
 *     clients over loopback, pulse_server side by side with nginx (the
 *     Debian package, run as a child with a generated configuration) serving
 *     the same files, in the same run, rounds interleaved;
 *  2. long-poll wake-up latency: from the head's rename to the waiting
 *     client holding the new head, with the publisher in the server's
 *     process (notify) and with a server that follows head.json (inotify);
 *  3. commit time against the bare encoder (detection + patch encoding with
 *     the same threads and the same cached digests) on a synthetic AdamW
 *     trajectory.
 *
 * The HTTP clients are threads with one keep-alive connection each, written
 * here on plain sockets (pulse-bench does not link libcurl): the same client
 * for both servers, reading every byte into user space as a real one does.
 *
 * This file: the work folder and the order of the three. The parts:
 * bench_serve_throughput.c (with bench_serve_clients.c and
 * bench_serve_nginx.c), bench_serve_longpoll.c, bench_serve_commit.c; the
 * command line (bench_serve_args.c), HTTP on plain sockets for the clients
 * (bench_serve_http.c), the JSON and the report (bench_serve_print.c). */
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_impl.h"
#include "bench_serve_impl.h"

static int rm_cb(const char *path, const struct stat *sb, int flag,
                 struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(path);
}

void bench_serve_rm_rf(const char *dir) {
  if (dir != NULL && dir[0] != '\0')
    nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

int bench_serve_main(int argc, char **argv) {
  serve_args a;
  if (bench_serve_parse_args(argc, argv, &a) != 0)
    return bench_serve_usage(stderr), 2;
  signal(SIGPIPE, SIG_IGN);
  /* $TMPDIR picks the file system (fsync costs differ widely). */
  const char *tmp = getenv("TMPDIR");
  if (tmp == NULL || tmp[0] == '\0' || strlen(tmp) > 512)
    tmp = "/tmp";
  char work[600];
  snprintf(work, sizeof work, "%s/pulse-bench-serve-XXXXXX", tmp);
  if (mkdtemp(work) == NULL)
    return fprintf(stderr, PROG ": mkdtemp: %s\n", strerror(errno)), 1;
  chmod(work, 0755);
  static serve_results res; /* static: large, and one per process */
  memset(&res, 0, sizeof res);
  res.workers = a.threads > 0 ? a.threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
  if (res.workers < 2)
    res.workers = 2;
  int rc = 0;
  if (!a.skip_throughput && bench_serve_throughput(&a, work, &res) != 0) {
    bench_serve_rm_rf(work);
    return 1;
  }
  if (!a.skip_poll)
    rc |= bench_serve_longpoll(&a, work, &res);
  if (!a.skip_commit)
    rc |= bench_serve_commit(&a, work, &res);
  if (a.json)
    bench_serve_json(&a, &res);
  if (a.report != NULL)
    rc |= bench_serve_report(&a, argc, argv, &res);
  bench_serve_rm_rf(work);
  return rc;
}
