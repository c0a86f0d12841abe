/* shard_bench: a sharded publish through the store (4 processes, one per
 * rank, pulse_pub_shard_step) against one publisher of the gathered FP32
 * weights (pulse_pub_commit), on the same steps: per rank the time per step
 * and the peak resident memory above what the rank held before publishing
 * (its FP32 master blocks), against its shard's BF16 bytes; and whether
 * both stores hold the same objects (their names are their SHA-256).
 * Usage: shard_bench DIR ROWS dim0|rect PER1024 (elements moved per 1024
 * per step). Weights are a hash of (tensor, position, step): each rank makes
 * its own blocks, no rank ever holds the others'. */
#include "pulse_codec.h"
#include "pulse_pub_shard.h"
#include "pulse_publisher.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#define R 4
#define NT 2
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + 1e-9 * t.tv_nsec;
}
static long maxrss_kb(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}
static int thr = 205;
static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return x;
}
static float w0(int t, uint64_t p) {
  return (float)(((double)(mix(p * 2 + t) >> 11) / 9007199254740992.0 - 0.5) *
                 0.05);
}
static float dlt(int t, uint64_t p, int s) {
  uint64_t h = mix(p * 131 + t * 7 + (uint64_t)s * 1000003ull);
  if ((h & 1023) >= (uint64_t)thr)
    return 0;
  return (float)(((double)(h >> 20) / 17592186044416.0 - 0.5) * 4e-4);
}
static uint64_t rows = 4096, cols = 4096;
static const char *nm[NT] = {"w.col", "w.row"};
static pulse_tensor_info info[NT];
static void setup(void) {
  for (int t = 0; t < NT; t++) {
    memset(&info[t], 0, sizeof info[t]);
    info[t].name = nm[t];
    info[t].dtype = PULSE_DTYPE_BF16;
    info[t].ndim = 2;
    info[t].shape[0] = rows;
    info[t].shape[1] = cols;
  }
}
static void popts(pulse_pub_opts *o) {
  pulse_pub_opts_init(o);
  o->tensors = info;
  o->tensor_count = NT;
  o->anchor_every = 0;
  o->anchor_sync = 1;
  o->grace_seconds = 0;
  o->threads = 1;
}
int steps = 4;
int dim0 = 0;
static int rank_main(const char *dir, int r) {
  pulse_pub_block bl[2];
  memset(bl, 0, sizeof bl);
  bl[0].name = nm[0];
  bl[0].start[0] = rows / R * r;
  bl[0].extent[0] = rows / R;
  bl[0].extent[1] = cols;
  bl[1].name = nm[1];
  bl[1].start[1] = cols / R * r;
  bl[1].extent[1] = cols / R;
  bl[1].extent[0] = rows;
  if (dim0) {
    bl[1] = bl[0];
    bl[1].name = nm[1];
  }
  uint64_t n = rows * cols / R;
  float *d[2];
  uint64_t *pos[2];
  for (int b = 0; b < 2; b++) {
    d[b] = malloc(n * 4);
    pos[b] = malloc(n * 8);
  }
  for (uint64_t i = 0; i < n; i++) {
    pos[0][i] = rows / R * r * cols + i;
    pos[1][i] = dim0 ? pos[0][i]
                     : (i / (cols / R)) * cols + cols / R * r + i % (cols / R);
  }
  for (int b = 0; b < 2; b++)
    for (uint64_t i = 0; i < n; i++)
      d[b][i] = w0(b, pos[b][i]);
  long rss0 = maxrss_kb();
  pulse_pub_shard_opts so;
  pulse_pub_shard_opts_init(&so);
  so.tensors = info;
  so.tensor_count = NT;
  so.blocks = bl;
  so.block_count = 2;
  pulse_pub_shard *sh;
  pulse_pub_shard_create(&so, &sh);
  pulse_pub *c = NULL;
  if (r == 0) {
    pulse_pub_opts o;
    popts(&o);
    if (pulse_pub_create_committer(dir, &o, &c)) {
      fprintf(stderr, "%s\n", pulse_error_detail());
      return 1;
    }
  }
  pulse_pub_shard_step_opts po;
  pulse_pub_shard_step_opts_init(&po);
  po.rank = r;
  po.world = R;
  po.committer = c;
  double tot = 0;
  for (int s = 0; s <= steps; s++) {
    if (s > 0)
      for (int b = 0; b < 2; b++)
        for (uint64_t i = 0; i < n; i++)
          d[b][i] += dlt(b, pos[b][i], s);
    pulse_pub_tensor t[2] = {{d[0], PULSE_DTYPE_F32, 0},
                             {d[1], PULSE_DTYPE_F32, 0}};
    pulse_pub_figures f;
    double a = now();
    if (pulse_pub_shard_step(sh, dir, &po, s, t, 2, &f)) {
      fprintf(stderr, "rank %d: %s\n", r, pulse_error_detail());
      return 1;
    }
    double e = now() - a;
    if (s > 0)
      tot += e;
    if (r == 0 && s > 0)
      printf("  step %d: patch %llu bytes, %llu changed, rank 0 %.0f ms\n", s,
             (unsigned long long)f.patch_bytes, (unsigned long long)f.changed,
             e * 1e3);
  }
  printf("rank %d: %.0f ms/step (steps 1..%d), peak extra RSS %.1f MiB, shard "
         "BF16 %.1f MiB\n",
         r, tot / steps * 1e3, steps, (maxrss_kb() - rss0) / 1024.0,
         n * 2 * 2 / 1048576.0);
  pulse_pub_free(c);
  pulse_pub_shard_free(sh);
  return 0;
}
static int single_main(const char *dir) {
  uint64_t n = rows * cols;
  float *w[NT];
  for (int t = 0; t < NT; t++) {
    w[t] = malloc(n * 4);
    for (uint64_t i = 0; i < n; i++)
      w[t][i] = w0(t, i);
  }
  long rss0 = maxrss_kb();
  pulse_pub_opts o;
  popts(&o);
  pulse_pub *p;
  if (pulse_pub_create(dir, &o, &p))
    return 1;
  double tot = 0;
  for (int s = 0; s <= steps; s++) {
    if (s > 0)
      for (int t = 0; t < NT; t++)
        for (uint64_t i = 0; i < n; i++)
          w[t][i] += dlt(t, i, s);
    pulse_pub_tensor tt[NT] = {{w[0], PULSE_DTYPE_F32, 0},
                               {w[1], PULSE_DTYPE_F32, 0}};
    pulse_pub_figures f;
    double a = now();
    if (pulse_pub_commit(p, s, tt, NT, &f))
      return 1;
    pulse_pub_wait(p);
    double e = now() - a;
    if (s > 0)
      tot += e;
    if (s > 0)
      printf("  step %d: patch %llu bytes, %llu changed, %.0f ms\n", s,
             (unsigned long long)f.patch_bytes, (unsigned long long)f.changed,
             e * 1e3);
  }
  printf("single (gathered FP32 on one process): %.0f ms/step, peak extra RSS "
         "%.1f MiB (model BF16 %.1f MiB)\n",
         tot / steps * 1e3, (maxrss_kb() - rss0) / 1024.0,
         n * 2 * NT / 1048576.0);
  pulse_pub_free(p);
  return 0;
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 2)
    rows = strtoull(argv[2], 0, 10);
  if (argc > 3 && argv[3][0] == 'd')
    dim0 = 1;
  if (argc > 4)
    thr = atoi(argv[4]);
  setup();
  if (argc < 2)
    return 2;
  const char *dir = argv[1];
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/single", dir);
  snprintf(b, sizeof b, "%s/sharded", dir);
  printf(
      "model: 2 tensors [%llu, %llu] (%.1fM params), 4 ranks: %s\n",
      (unsigned long long)rows, (unsigned long long)cols, rows * cols * 2 / 1e6,
      dim0 ? "dim-0 blocks of both" : "column-parallel + row-parallel blocks");
  pid_t p = fork();
  if (p == 0)
    _exit(single_main(a));
  int st = 0, bad = 0;
  bad |= waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  pid_t k[R];
  for (int r = 0; r < R; r++) {
    k[r] = fork();
    if (k[r] == 0) {
      _exit(rank_main(b, r));
    }
  }
  for (int r = 0; r < R; r++)
    bad |= waitpid(k[r], &st, 0) != k[r] || !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  return bad;
}
