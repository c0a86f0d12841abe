/* bench_serve_throughput.c - benchmark 1 of `pulse-bench serve`: large
 * immutable objects to 1, 8 and 32 concurrent clients over loopback,
 * pulse_server side by side with nginx serving the same files, in the same
 * run, rounds interleaved. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "bench_serve_impl.h"
#include "cli_args.h"
#include "pulse_server.h"
#include "pulse_store.h"
#include "rng_impl.h"

/* Writes k objects of random bytes into dir/objects, named by their hash;
 * fills the URL paths. */
static int make_objects(const char *dir, uint64_t mb, int k, char **paths) {
  char objs[4200], tmp[4300], final[4400];
  snprintf(objs, sizeof objs, "%s/objects", dir);
  mkdir(dir, 0755);
  mkdir(objs, 0755);
  chmod(dir, 0755); /* nginx workers may run as another user */
  size_t chunk = (size_t)1 << 20;
  uint64_t *buf = malloc(chunk);
  uint64_t x = 1; /* any seed: random bytes no compressor can shrink */
  for (int i = 0; i < k && buf; i++) {
    snprintf(tmp, sizeof tmp, "%s/.object%d.tmp-bench", objs, i);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
      return -1;
    for (uint64_t m = 0; m < mb; m++) {
      for (size_t w = 0; w < chunk / 8; w++) {
        buf[w] = pulse_rng_next(&x);
      }
      fwrite(buf, 1, chunk, f);
    }
    fclose(f);
    uint8_t sha[32];
    char hex[65];
    if (pulse_store_file_sha256(tmp, sha, NULL) != PULSE_OK)
      return -1;
    for (int b = 0; b < 32; b++)
      snprintf(hex + 2 * b, 3, "%02x", sha[b]);
    snprintf(final, sizeof final, "%s/%s.pulse", objs, hex);
    if (rename(tmp, final) != 0)
      return -1;
    chmod(final, 0644);
    paths[i] = malloc(128);
    snprintf(paths[i], 128, "/v1/objects/%s.pulse", hex);
  }
  free(buf);
  return buf ? 0 : -1;
}

/* 1. Throughput: pulse's server and nginx over the same objects, best of
 * interleaved rounds per client count. 0 or 1 (said on stderr). */
int bench_serve_throughput(const serve_args *a, const char *work,
                           serve_results *res) {
  char store[4096];
  snprintf(store, sizeof store, "%s/store", work);
  int workers = res->workers;
  char **paths = calloc((size_t)a->objects, sizeof *paths);
  if (make_objects(store, a->object_mb, a->objects, paths) != 0) {
    fprintf(stderr, PROG ": cannot write the objects in %s\n", store);
    return 1;
  }
  pulse_server_opts so;
  pulse_server_opts_init(&so);
  so.store_dir = store;
  so.threads = (unsigned)workers;
  so.watch = 0;
  pulse_server *srv = NULL;
  pulse_status st = pulse_server_create(&so, &srv);
  if (st != PULSE_OK)
    return pulse_cli_fail(PROG, "server", st);
  pid_t nginx = -1;
  uint16_t nport = 0;
  const char *nginx_why = "";
  const char *bin = a->no_nginx ? NULL : bench_serve_find_nginx(a->nginx);
  if (a->no_nginx)
    nginx_why = "--no-nginx";
  else if (bin == NULL)
    nginx_why = "nginx not found (apt-get install nginx)";
  else if ((nginx =
                bench_serve_start_nginx(bin, work, store, workers, &nport)) < 0)
    nginx_why = "nginx did not start (see its error.log)";
  int have_nginx = res->have_nginx = nginx > 0;
  if (!have_nginx && !a->json)
    printf("nginx column skipped: %s\n", nginx_why);
  if (!a->json)
    printf("throughput: %d objects of %" PRIu64
           " MiB, %.1f s per run, best of %d interleaved "
           "rounds, %d server threads / nginx workers, loopback\n",
           a->objects, a->object_mb, a->seconds, a->rounds, workers);
  /* Warm the page cache so neither server pays for the first read. */
  bench_serve_run_clients(pulse_server_port(srv), paths, a->objects, a->objects,
                          0.5);
  tp_result *pulse_tp = res->pulse_tp, *nginx_tp = res->nginx_tp;
  for (int c = 0; c < a->nclients; c++) {
    for (int r = 0; r < a->rounds; r++) {
      tp_result p = bench_serve_run_clients(
          pulse_server_port(srv), paths, a->objects, a->clients[c], a->seconds);
      if (p.mbps > pulse_tp[c].mbps)
        pulse_tp[c] = p;
      if (have_nginx) {
        tp_result n = bench_serve_run_clients(nport, paths, a->objects,
                                              a->clients[c], a->seconds);
        if (n.mbps > nginx_tp[c].mbps)
          nginx_tp[c] = n;
      }
    }
    if (!a->json) {
      printf("  %3d clients: pulse %8.0f MB/s (%" PRIu64 " objects, %d errors)",
             a->clients[c], pulse_tp[c].mbps, pulse_tp[c].requests,
             pulse_tp[c].errors);
      if (have_nginx)
        printf("   nginx %8.0f MB/s (%" PRIu64
               " objects, %d errors)   pulse/nginx %.2f",
               nginx_tp[c].mbps, nginx_tp[c].requests, nginx_tp[c].errors,
               nginx_tp[c].mbps > 0 ? pulse_tp[c].mbps / nginx_tp[c].mbps : 0);
      printf("\n");
      fflush(stdout);
    }
  }
  if (have_nginx) {
    kill(nginx, SIGTERM);
    waitpid(nginx, NULL, 0);
  }
  pulse_server_free(srv);
  for (int i = 0; i < a->objects; i++)
    free(paths[i]);
  free(paths);
  bench_serve_rm_rf(store);
  return 0;
}
