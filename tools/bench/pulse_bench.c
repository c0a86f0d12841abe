/* pulse_bench.c - `pulse-bench MODE [options]`: benchmarks of the pulse
 * codec and sync paths. Each mode lives in bench_MODE.c and is listed in
 * `modes` below. */
#include "bench_impl.h"

#include <stdio.h>
#include <string.h>

typedef struct {
  const char *name;
  const char *summary;
  int (*main)(int argc, char **argv); /* argv[0] is the mode name */
  void (*usage)(FILE *out);
} bench_mode;

static const bench_mode modes[] = {
    {"demo", "the main job: a trainer publishes, pullers follow over HTTP, bytes vs dense",
     bench_demo_main, bench_demo_usage},
    {"codec", "patch sizes vs baselines and entropy bound, codec throughput",
     bench_codec_main, bench_codec_usage},
    {"trajectory", "write a synthetic RL trajectory as safetensors checkpoints",
     bench_trajectory_main, bench_trajectory_usage},
    {"sync", "per-step sync time and bytes, dense vs pulse, loopback and rate-limited links", bench_sync_main, bench_sync_usage},
    {"serve", "serving throughput vs nginx, long-poll wake-up, commit vs encoder",
     bench_serve_main, bench_serve_usage},
    {"loco", "DDP vs DiLoCo vs PULSELoCo trainers over HTTP: bytes and loss", bench_loco_main, bench_loco_usage},
    {"topology", "decentralized gossip over graphs: replica variance, loss, bytes",
     bench_topology_main, bench_topology_usage},
    {"gpu", "device encode and apply against a device-to-device copy", bench_gpu_main, bench_gpu_usage},
};

#define MODE_COUNT (sizeof modes / sizeof modes[0])

static void usage(FILE *out) {
  fprintf(out, "usage: pulse-bench MODE [options]\n"
               "       pulse-bench MODE --help\n"
               "modes:\n");
  for (size_t i = 0; i < MODE_COUNT; i++)
    fprintf(out, "  %-10s %s\n", modes[i].name, modes[i].summary);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
      strcmp(argv[1], "help") == 0) {
    usage(stdout);
    for (size_t i = 0; i < MODE_COUNT; i++) {
      printf("\n");
      modes[i].usage(stdout);
    }
    return 0;
  }
  for (size_t i = 0; i < MODE_COUNT; i++)
    if (strcmp(argv[1], modes[i].name) == 0)
      return modes[i].main(argc - 1, argv + 1);
  fprintf(stderr, "pulse-bench: unknown mode '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
