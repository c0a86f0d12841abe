/* test_partition_http.c - partitioned rounds over HTTP on loopback
 * (loco_partition_round, docs/protocols/loco-collaboration.md "Partitioned averaging"): N trainers
 * in threads, each with its own server, against the same rounds finished
 * all-to-all in memory: the same bits; a wrong reduction is caught, its
 * owner dropped, and the round equals all-to-all without it; and the bytes
 * each trainer moves per round against its own payload. */
#include <pthread.h>
#include <stdio.h>

#include "peer_http_impl.h"
#include "loco_testutil.h"
#include "partition_impl.h"

#define MAXN 8u

static unsigned on_post(void *user, const char *path, const char *id,
                        const char *url, char *reply, size_t cap) {
  (void)user, (void)path, (void)id, (void)url;
  snprintf(reply, cap, "{\"error\":\"no POST here\"}");
  return 405;
}

typedef struct {
  uint32_t n;
  uint64_t P;
  uint32_t ids[MAXN];
  uint64_t weights[MAXN];
  char urls[MAXN][64];
  const char *url_ptr[MAXN];
  loco_server *srv[MAXN];
  pulse_loco *ref[MAXN], *part[MAXN];
  float *theta_r[MAXN];
  float *common;
  float common_scale, own_scale; /* of the local steps */
  int skew; /* the common direction 4x larger in the last half */
  int receipts_only;
  uint32_t check_period;
  uint64_t sent, prepared; /* entries sent, payloads prepared */
} group;

typedef struct {
  group *g;
  uint32_t i;
  uint64_t samples[MAXN];
  int lie;
  pulse_status st;
  loco_partition_out out;
  pulse_loco_plan active, flat; /* the plans of the round, made before it */
} peer_job;

static void group_create(group *g, uint32_t n, uint64_t P, uint64_t seed) {
  memset(g, 0, sizeof *g);
  g->n = n, g->P = P;
  float *theta = malloc(P * sizeof *theta);
  lt_fill_weights(theta, P, seed, 0.05f);
  g->common = malloc(P * sizeof(float));
  g->common_scale = 2e-4f, g->own_scale = 6e-5f;
  for (uint32_t i = 0; i < n; i++) {
    g->ids[i] = 10 + 3 * i;
    g->weights[i] = 1 + i % 3; /* uneven bandwidths */
    g->ref[i] = lt_ctx(P, g->ids[i], theta);
    g->part[i] = lt_ctx(P, g->ids[i], theta);
    g->theta_r[i] = malloc(P * sizeof(float));
    cr_assert_eq(loco_server_start(on_post, NULL, &g->srv[i]), PULSE_OK);
    snprintf(g->urls[i], sizeof g->urls[i], "http://127.0.0.1:%u",
             (unsigned)loco_server_port(g->srv[i]));
    g->url_ptr[i] = g->urls[i];
  }
  free(theta);
}

static void group_free(group *g) {
  for (uint32_t i = 0; i < g->n; i++) {
    loco_server_stop(g->srv[i]);
    pulse_loco_free(g->ref[i]);
    pulse_loco_free(g->part[i]);
    free(g->theta_r[i]);
  }
  free(g->common);
}

static void *run_peer(void *arg) {
  peer_job *j = arg;
  group *g = j->g;
  loco_partition_in in;
  memset(&in, 0, sizeof in);
  in.ctx = g->part[j->i];
  in.count = g->n;
  in.ids = g->ids;
  in.urls = g->url_ptr;
  in.samples = j->samples;
  in.weights = g->weights;
  in.srv = g->srv[j->i];
  in.timeout_ms = 20000;
  in.test_wrong_reduction = j->lie;
  in.receipts_only = g->receipts_only;
  in.check_period = g->check_period;
  cr_assert_eq(pulse_loco_plan_make_active(in.ctx, g->ids, g->weights, g->n,
                                           &j->active),
               PULSE_OK);
  cr_assert_eq(pulse_loco_plan_make(g->P, g->ids, g->weights, g->n, &j->flat),
               PULSE_OK);
  j->st = loco_partition_round(&in, &j->out);
  return NULL;
}

/* One round: local steps (a common direction plus each trainer's own, so
 * the gates overlap as in training), prepare both copies, the partitioned
 * exchange in threads, the reference all-to-all over everyone but `liar`
 * (-1: none). Returns the bytes of the round in jobs. */
static void group_round(group *g, uint64_t *rng, int liar, peer_job *jobs) {
  for (uint64_t x = 0; x < g->P; x++)
    g->common[x] = lt_normal(rng) * g->common_scale *
                   (g->skew && x >= g->P / 2 ? 4.0f : 1.0f);
  uint64_t samples[MAXN];
  uint8_t *copies[MAXN];
  pulse_loco_contribution set[MAXN];
  size_t ns = 0;
  for (uint32_t i = 0; i < g->n; i++) {
    samples[i] = 20 + pulse_rng_next(rng) % 100;
    const float *tg = pulse_loco_global(g->ref[i]);
    for (uint64_t x = 0; x < g->P; x++)
      g->theta_r[i][x] = tg[x] - g->common[x] - lt_normal(rng) * g->own_scale;
    const uint8_t *p;
    size_t sz;
    cr_assert_eq(pulse_loco_prepare(g->ref[i], g->theta_r[i], samples[i], 0,
                                    &p, &sz, NULL),
                 PULSE_OK);
    copies[i] = malloc(sz);
    memcpy(copies[i], p, sz);
    if ((int)i != liar)
      set[ns++] = (pulse_loco_contribution){copies[i], sz};
    pulse_loco_prepare_figures pi;
    cr_assert_eq(pulse_loco_prepare(g->part[i], g->theta_r[i], samples[i], 0,
                                    NULL, NULL, &pi),
                 PULSE_OK);
    g->sent += pi.sent, g->prepared++;
  }
  pthread_t t[MAXN];
  uint64_t served_before[MAXN];
  for (uint32_t i = 0; i < g->n; i++) {
    memset(&jobs[i], 0, sizeof jobs[i]);
    jobs[i].g = g, jobs[i].i = i, jobs[i].lie = (int)i == liar;
    memcpy(jobs[i].samples, samples, sizeof samples);
    served_before[i] = loco_server_bytes_served(g->srv[i]);
    pthread_create(&t[i], NULL, run_peer, &jobs[i]);
  }
  for (uint32_t i = 0; i < g->n; i++)
    pthread_join(t[i], NULL);
  for (uint32_t i = 0; i < g->n; i++) {
    /* Counted after every peer is done (some fetch late). */
    jobs[i].out.bytes_out = loco_server_bytes_served(g->srv[i]) - served_before[i];
    if ((int)i == liar) {
      cr_assert_neq(jobs[i].st, PULSE_OK, "the liar is dropped");
      pulse_loco_abandon(g->ref[i], 0);
      pulse_loco_abandon(g->part[i], 0);
      continue;
    }
    cr_assert_eq(jobs[i].st, PULSE_OK, "trainer %u: %s", i,
                 pulse_error_detail());
    cr_assert_eq(pulse_loco_finish(g->ref[i], set, ns, NULL, NULL), PULSE_OK);
    const float *a = pulse_loco_global(g->ref[i]),
                *b = pulse_loco_global(g->part[i]);
    const float *ea = pulse_loco_residual(g->ref[i]),
                *eb = pulse_loco_residual(g->part[i]);
    const float *ma = pulse_loco_momentum(g->ref[i]),
                *mb = pulse_loco_momentum(g->part[i]);
    for (uint64_t x = 0; x < g->P; x++)
      cr_assert(lt_bits(a[x]) == lt_bits(b[x]) &&
                    lt_bits(ea[x]) == lt_bits(eb[x]) &&
                    lt_bits(ma[x]) == lt_bits(mb[x]),
                "trainer %u differs at %llu", i, (unsigned long long)x);
  }
  for (uint32_t i = 0; i < g->n; i++)
    free(copies[i]);
}

Test(partition_http, equals_all_to_all_bit_for_bit, .timeout = 120) {
  uint64_t rng = 5;
  static const uint32_t sizes[] = {1, 3, 5};
  for (size_t c = 0; c < 3; c++) {
    group g;
    group_create(&g, sizes[c], 3000 + 77 * c, 40 + c);
    peer_job jobs[MAXN];
    for (int r = 0; r < 2; r++) {
      group_round(&g, &rng, -1, jobs);
      for (uint32_t i = 0; i < g.n; i++)
        cr_assert_eq(jobs[i].out.attempts, 1);
    }
    group_free(&g);
  }
}

/* The exchange cuts the active plan (docs/protocols/loco-collaboration.md "Active plan") of the
 * replicated theta_g and b: with the last half of the vector moving more,
 * after round 0 the owners of the last ranges own fewer parameters than
 * the parameter cut gives them, and each trainer's range is the plan's. */
Test(partition_http, ranges_follow_the_momentum_s_active_entries,
     .timeout = 120) {
  uint64_t rng = 21;
  group g;
  group_create(&g, 4, 8192, 31);
  g.skew = 1;
  for (uint32_t i = 0; i < g.n; i++)
    g.weights[i] = 1;
  peer_job jobs[MAXN];
  for (int r = 0; r < 3; r++) {
    group_round(&g, &rng, -1, jobs);
    for (uint32_t i = 0; i < g.n; i++) {
      cr_assert_eq(jobs[i].out.attempts, 1);
      cr_assert_eq(memcmp(&jobs[i].active, &jobs[0].active,
                          sizeof jobs[i].active), 0,
                   "round %d: trainers %u and 0 plan differently", r, i);
      cr_assert_eq(jobs[i].out.range_start, jobs[i].active.start[i]);
      cr_assert_eq(jobs[i].out.range_end, jobs[i].active.start[i + 1]);
    }
    const pulse_loco_plan *a = &jobs[0].active, *f = &jobs[0].flat;
    if (r == 0) { /* a zero momentum: the parameter cut */
      cr_assert_eq(memcmp(a, f, sizeof *a), 0);
      continue;
    }
    uint64_t last = g.n - 1;
    cr_assert_lt(a->start[g.n] - a->start[last],
                 f->start[g.n] - f->start[last],
                 "round %d: the last range has %llu parameters, as many as "
                 "the parameter cut's %llu", r,
                 (unsigned long long)(a->start[g.n] - a->start[last]),
                 (unsigned long long)(f->start[g.n] - f->start[last]));
    cr_assert_gt(a->start[2], f->start[2], "round %d", r);
  }
  group_free(&g);
}

Test(partition_http, a_wrong_reduction_is_caught_and_its_owner_dropped,
     .timeout = 120) {
  uint64_t rng = 9;
  group g;
  group_create(&g, 4, 5000, 77);
  peer_job jobs[MAXN];
  group_round(&g, &rng, 2, jobs); /* trainer 2 publishes a wrong average */
  for (uint32_t i = 0; i < g.n; i++) {
    if (i == 2)
      continue;
    cr_assert_eq(jobs[i].out.attempts, 2);
    cr_assert_eq(jobs[i].out.noffenders, 1);
    cr_assert_eq(jobs[i].out.offenders[0], g.ids[2]);
    cr_assert_eq(jobs[i].out.contributors, 3);
  }
  group_free(&g);
}

/* The figure of docs/formats/loco-payload.md: bytes in and out per trainer and round at 8
 * trainers, against its own payload (all-to-all: 7 payloads in), with and
 * without the recomputation checks. */
static void measure(int receipts_only, double *mean_in, double *mean_out) {
  uint64_t rng = 13;
  group g;
  const char *ps = getenv("PART_P");
  group_create(&g, 8, ps ? (uint64_t)atoll(ps) : 40000u, 99);
  g.receipts_only = receipts_only;
  for (uint32_t i = 0; i < g.n; i++)
    g.weights[i] = 1; /* equal links: the plain reduce-scatter */
  const char *cs = getenv("PART_COMMON"), *os = getenv("PART_OWN");
  if (cs)
    g.common_scale = (float)atof(cs);
  if (os)
    g.own_scale = (float)atof(os);
  const char *cp = getenv("PART_CHECK_PERIOD"); /* measurements by hand */
  if (cp)
    g.check_period = (uint32_t)atoi(cp);
  peer_job jobs[MAXN];
  double worst_in = 0, worst_out = 0, sum_in = 0, sum_out = 0, parts[4] = {0};
  const int rounds = 2;
  for (int r = 0; r < rounds; r++) {
    group_round(&g, &rng, -1, jobs);
    for (uint32_t i = 0; i < g.n; i++) {
      const loco_partition_out *o = &jobs[i].out;
      double own = (double)o->own_payload;
      double in = (double)o->bytes_in / own, out = (double)o->bytes_out / own;
      worst_in = in > worst_in ? in : worst_in;
      worst_out = out > worst_out ? out : worst_out;
      sum_in += in, sum_out += out;
      parts[0] += (double)o->slice_bytes_in / own;
      parts[1] += (double)o->reduced_bytes_in / own;
      parts[2] += (double)o->check_bytes_in / own;
      parts[3] += (double)o->verdict_bytes_in / own;
    }
  }
  double n = rounds * g.n;
  *mean_in = sum_in / n, *mean_out = sum_out / n;
  fprintf(stderr,
          "partition, 8 trainers, %.1f%% of the entries sent, %s (period "
          "%u): per round a trainer moves in %.2fx its "
          "payload (worst %.2fx: slices %.2f, reduced ranges %.2f, checks "
          "%.2f, verdicts %.3f), out %.2fx (worst %.2fx); all-to-all: 7x in\n",
          100.0 * (double)g.sent / (double)(g.prepared * g.P),
          receipts_only ? "receipts only" : "ranges recomputed",
          g.check_period > 1 ? g.check_period : 1u,
          *mean_in, worst_in, parts[0] / n, parts[1] / n, parts[2] / n,
          parts[3] / n, *mean_out, worst_out);
  group_free(&g);
}

Test(partition_http, eight_trainers_move_far_less_than_all_to_all,
     .timeout = 120) {
  double in_full, out_full, in_receipts, out_receipts;
  measure(0, &in_full, &out_full);
  measure(1, &in_receipts, &out_receipts);
  /* All-to-all brings 7 payloads in; the reduce-scatter about 7/8 of a
   * payload of slices plus 7/8 of the reduced ranges, each way. */
  cr_expect_lt(in_full, 0.6 * 7.0);
  cr_expect_lt(out_full, 0.6 * 7.0);
  cr_expect_lt(in_receipts, in_full, "the checks cost their slices");
}
