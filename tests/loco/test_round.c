/* test_round.c - whole rounds between contexts in one process: the mean is
 * over the contributors that arrived (weighted by samples), replicas stay
 * bit-identical, a late joiner catches up through the state, the state
 * format rejects bad bytes, and a 3-trainer PULSELoCo run ends within 2% of
 * DiLoCo's loss with at least 10x fewer bytes. */
#include "loco_testutil.h"
#include "sim_trainers.h"

/* Expected theta_g after one round from the definition, computed here
 * independently: weighted mean in double, one rounding, Nesterov. */
static void expected_step(const float *theta, const float *b, uint64_t P,
                          const pulse_loco_entries *e, const uint64_t *w,
                          size_t n, float alpha, float mu, float *out_theta,
                          float *out_b) {
  double *acc = calloc(P, sizeof *acc);
  double W = 0;
  for (size_t i = 0; i < n; i++) {
    W += (double)w[i];
    for (uint64_t j = 0; j < e[i].count; j++)
      acc[e[i].pos[j]] += (double)w[i] * (double)e[i].val[j];
  }
  for (uint64_t i = 0; i < P; i++) {
    volatile float avg = (float)(acc[i] / W);
    volatile float nb = mu * b[i];
    nb = nb + avg;
    volatile float look = mu * nb;
    volatile float step = avg + look;
    volatile float scaled = alpha * step;
    out_b[i] = nb;
    out_theta[i] = theta[i] - scaled;
  }
  free(acc);
}

/* Four trainers, one round, contributor set `present` (bit i = trainer i);
 * samples differ per trainer when `weighted`. */
static void round_with(unsigned present, int weighted) {
  const uint64_t P = 30000;
  const uint32_t N = 4;
  float *theta = malloc(P * sizeof *theta);
  lt_fill_weights(theta, P, 40 + present, 0.5f);
  pulse_loco *ctx[4];
  float *local[4];
  uint8_t *pay[4];
  size_t size[4];
  uint64_t seed = present * 1000u + 1u;
  for (uint32_t i = 0; i < N; i++) {
    ctx[i] = lt_ctx(P, i, theta);
    local[i] = malloc(P * sizeof(float));
    for (uint64_t j = 0; j < P; j++)
      local[i][j] = theta[j] - lt_normal(&seed) * fabsf(theta[j]) * 0x1p-7f;
    const uint8_t *d;
    cr_assert_eq(pulse_loco_prepare(ctx[i], local[i],
                                    weighted ? 100u * (i + 1u) : 640u, 0, &d,
                                    &size[i], NULL),
                 PULSE_OK);
    pay[i] = malloc(size[i]);
    memcpy(pay[i], d, size[i]);
  }
  /* What the contributors sent, decoded here; the expected result. */
  pulse_loco_entries ent[4] = {PULSE_LOCO_ENTRIES_INIT, PULSE_LOCO_ENTRIES_INIT,
                               PULSE_LOCO_ENTRIES_INIT,
                               PULSE_LOCO_ENTRIES_INIT};
  uint64_t w[4];
  pulse_loco_contribution set[4];
  size_t n = 0;
  /* Given in a scrambled order: the result must not depend on it. */
  const uint32_t order[4] = {2, 0, 3, 1};
  for (uint32_t o = 0; o < N; o++) {
    uint32_t i = order[o];
    if (!(present >> i & 1u))
      continue;
    pulse_loco_payload_header h;
    cr_assert_eq(
        pulse_loco_payload_decode(pay[i], size[i], theta, NULL, P, &h, &ent[n]),
        PULSE_OK);
    w[n] = h.samples;
    set[n].data = pay[i];
    set[n++].size = size[i];
  }
  float *want = malloc(P * sizeof *want), *want_b = malloc(P * sizeof *want_b);
  float *zero = calloc(P, sizeof *zero);
  expected_step(theta, zero, P, ent, w, n, 0.7f, 0.9f, want, want_b);
  for (uint32_t i = 0; i < N; i++) {
    pulse_loco_finish_figures fi;
    float *s = malloc(P * sizeof *s);
    for (uint64_t j = 0; j < P; j++) {
      volatile float dlt = theta[j] - local[i][j];
      s[j] = 0.0f + dlt;
    }
    cr_assert_eq(pulse_loco_finish(ctx[i], set, n, local[i], &fi), PULSE_OK,
                 "%s", pulse_error_detail());
    cr_assert_eq(fi.contributors, n);
    cr_assert_eq(fi.self_included, (int)(present >> i & 1u));
    const float *g = pulse_loco_global(ctx[i]),
                *b = pulse_loco_momentum(ctx[i]);
    for (uint64_t j = 0; j < P; j++) {
      cr_assert_eq(lt_bits(g[j]), lt_bits(want[j]), "trainer %u element %llu",
                   i, (unsigned long long)j);
      cr_assert_eq(lt_bits(b[j]), lt_bits(want_b[j]));
      cr_assert_eq(lt_bits(local[i][j]), lt_bits(g[j]), "theta_r reset");
    }
    /* An excluded trainer keeps s where it did not send; under the
     * default (drop) rule what it sent is gone. */
    if (!(present >> i & 1u)) {
      pulse_loco_payload_header h;
      pulse_loco_entries own = PULSE_LOCO_ENTRIES_INIT;
      cr_assert_eq(
          pulse_loco_payload_decode(pay[i], size[i], theta, NULL, P, &h, &own),
          PULSE_OK);
      for (uint64_t j = 0, k = 0; j < P; j++) {
        int was_sent = k < own.count && own.pos[k] == j;
        k += was_sent;
        cr_assert_eq(lt_bits(pulse_loco_residual(ctx[i])[j]),
                     was_sent ? 0u : lt_bits(s[j]));
      }
      pulse_loco_entries_free(&own);
    }
    free(s);
  }
  for (uint32_t i = 0; i < N; i++) {
    pulse_loco_free(ctx[i]);
    free(local[i]), free(pay[i]);
    pulse_loco_entries_free(&ent[i]);
  }
  free(want), free(want_b), free(zero), free(theta);
}

Test(loco, aggregation_with_missing_peers_is_the_mean_over_those_present) {
  round_with(0xF, 0);
  round_with(0xD, 0); /* trainer 1 missed the deadline */
  round_with(0x9, 0); /* trainers 1 and 2 missed it */
  round_with(0x4, 0); /* only trainer 2 */
  round_with(0xB, 1); /* weighted by samples */
}

Test(loco, the_mean_differs_when_a_peer_is_missing) {
  /* Guard against a test that cannot fail: the set changes the result. */
  const uint64_t P = 2000;
  float *theta = malloc(P * sizeof *theta), *l0 = malloc(P * 4),
        *l1 = malloc(P * 4);
  lt_fill_weights(theta, P, 2, 0.5f);
  for (uint64_t j = 0; j < P; j++) {
    l0[j] = theta[j] * (1.0f - 0x1p-6f);
    l1[j] = theta[j] * (1.0f + 0x1p-6f);
  }
  pulse_loco *a = lt_ctx(P, 0, theta), *b = lt_ctx(P, 1, theta);
  const uint8_t *d0, *d1;
  size_t s0, s1;
  cr_assert_eq(pulse_loco_prepare(a, l0, 1, 0, &d0, &s0, NULL), PULSE_OK);
  cr_assert_eq(pulse_loco_prepare(b, l1, 1, 0, &d1, &s1, NULL), PULSE_OK);
  pulse_loco_contribution both[2] = {{d0, s0}, {d1, s1}}, one[1] = {{d0, s0}};
  float *g = malloc(P * 4);
  cr_assert_eq(pulse_loco_finish(b, both, 2, NULL, NULL), PULSE_OK);
  memcpy(g, pulse_loco_global(b), P * 4);
  cr_assert_eq(pulse_loco_finish(a, one, 1, NULL, NULL), PULSE_OK);
  cr_assert_neq(memcmp(g, pulse_loco_global(a), P * 4), 0);
  pulse_loco_free(a), pulse_loco_free(b);
  free(theta), free(l0), free(l1), free(g);
}

Test(loco, finish_refuses_inconsistent_sets_and_changes_nothing) {
  const uint64_t P = 3000;
  float *theta = malloc(P * sizeof *theta), *loc = malloc(P * 4);
  lt_fill_weights(theta, P, 9, 0.5f);
  for (uint64_t j = 0; j < P; j++)
    loc[j] = theta[j] * (1.0f - 0x1p-6f);
  pulse_loco *a = lt_ctx(P, 0, theta), *b = lt_ctx(P, 1, theta),
             *c = lt_ctx(P, 0, theta);
  const uint8_t *da, *db, *dc;
  size_t sa, sb, sc;
  cr_assert_eq(pulse_loco_prepare(a, loc, 1, 0, &da, &sa, NULL), PULSE_OK);
  cr_assert_eq(pulse_loco_prepare(b, loc, 1, 0, &db, &sb, NULL), PULSE_OK);
  loc[0] += 1.0f;
  cr_assert_eq(pulse_loco_prepare(c, loc, 2, 0, &dc, &sc, NULL), PULSE_OK);
  uint64_t digest = pulse_loco_global_digest(a);
  pulse_loco_contribution twice[2] = {{db, sb}, {db, sb}};
  cr_assert_eq(pulse_loco_finish(a, twice, 2, NULL, NULL), PULSE_ERR_DUPLICATE);
  /* Another payload under a's own id. */
  pulse_loco_contribution impostor[1] = {{dc, sc}};
  cr_assert_eq(pulse_loco_finish(a, impostor, 1, NULL, NULL),
               PULSE_ERR_DUPLICATE);
  cr_assert_eq(pulse_loco_finish(a, NULL, 0, NULL, NULL), PULSE_ERR_ARG);
  /* Truncated member of the set. */
  pulse_loco_contribution cut[2] = {{da, sa}, {db, sb - 1}};
  cr_assert_neq(pulse_loco_finish(a, cut, 2, NULL, NULL), PULSE_OK);
  cr_assert_eq(pulse_loco_global_digest(a), digest,
               "a failed finish changed theta_g");
  pulse_loco_contribution good[2] = {{da, sa}, {db, sb}};
  cr_assert_eq(pulse_loco_finish(a, good, 2, NULL, NULL), PULSE_OK);
  /* b's payload is for round 0; a is at round 1 now: another round. */
  float *loc2 = malloc(P * 4);
  memcpy(loc2, pulse_loco_global(a), P * 4);
  cr_assert_eq(pulse_loco_prepare(a, loc2, 1, 0, NULL, NULL, NULL), PULSE_OK);
  cr_assert_eq(pulse_loco_check(a, db, sb), PULSE_ERR_BASE_STEP);
  pulse_loco_free(a), pulse_loco_free(b), pulse_loco_free(c);
  free(theta), free(loc), free(loc2);
}

Test(loco, state_round_trips_and_rejects_bad_bytes) {
  const uint64_t P = 5000;
  float *theta = malloc(P * sizeof *theta), *loc = malloc(P * 4);
  lt_fill_weights(theta, P, 19, 0.5f);
  pulse_loco *a = lt_ctx(P, 0, theta), *j = lt_ctx(P, 7, NULL);
  for (int r = 0; r < 3; r++) {
    for (uint64_t k = 0; k < P; k++)
      loc[k] = pulse_loco_global(a)[k] * (1.0f - 0x1p-7f);
    const uint8_t *d;
    size_t s;
    cr_assert_eq(pulse_loco_prepare(a, loc, 1, 0, &d, &s, NULL), PULSE_OK);
    pulse_loco_contribution c = {d, s};
    cr_assert_eq(pulse_loco_finish(a, &c, 1, NULL, NULL), PULSE_OK);
  }
  pulse_buffer st = {NULL, 0};
  cr_assert_eq(pulse_loco_state_export(a, &st), PULSE_OK);
  cr_assert_eq(st.size, 48 + 8 * P);
  /* Every truncation, and one byte too many, is refused and changes nothing. */
  uint64_t before = pulse_loco_global_digest(j);
  for (size_t n = 0; n < st.size; n += (n < 64 ? 1 : 997))
    cr_assert_neq(pulse_loco_state_import(j, st.data, n, NULL), PULSE_OK);
  uint8_t *longer = malloc(st.size + 1);
  memcpy(longer, st.data, st.size);
  longer[st.size] = 0;
  cr_assert_eq(pulse_loco_state_import(j, longer, st.size + 1, NULL),
               PULSE_ERR_TRAILING);
  /* A flipped bit in theta_g or b breaks its digest. */
  longer[48 + 4 * 10] ^= 1;
  cr_assert_eq(pulse_loco_state_import(j, longer, st.size, NULL),
               PULSE_ERR_CORRUPT);
  memcpy(longer, st.data, st.size);
  longer[48 + 4 * P + 3] ^= 0x10;
  cr_assert_eq(pulse_loco_state_import(j, longer, st.size, NULL),
               PULSE_ERR_CORRUPT);
  memcpy(longer, st.data, st.size);
  longer[0] = 'X';
  cr_assert_eq(pulse_loco_state_import(j, longer, st.size, NULL),
               PULSE_ERR_MAGIC);
  memcpy(longer, st.data, st.size);
  longer[4] = 9;
  cr_assert_eq(pulse_loco_state_import(j, longer, st.size, NULL),
               PULSE_ERR_VERSION);
  cr_assert_eq(pulse_loco_global_digest(j), before);
  /* Another size or optimizer is refused. */
  pulse_loco *other = lt_ctx(P + 1, 8, NULL);
  cr_assert_eq(pulse_loco_state_import(other, st.data, st.size, NULL),
               PULSE_ERR_SIZE_MISMATCH);
  pulse_loco_free(other);
  pulse_loco_opts o;
  pulse_loco_opts_init(&o);
  o.param_count = P;
  o.mu = 0.5f;
  cr_assert_eq(pulse_loco_create(&o, NULL, &other), PULSE_OK);
  cr_assert_eq(pulse_loco_state_import(other, st.data, st.size, NULL),
               PULSE_ERR_CORRUPT);
  pulse_loco_free(other);
  /* The real thing. */
  cr_assert_eq(pulse_loco_state_import(j, st.data, st.size, loc), PULSE_OK);
  cr_assert_eq(pulse_loco_round(j), 3u);
  cr_assert_eq(pulse_loco_global_digest(j), pulse_loco_global_digest(a));
  cr_assert_eq(memcmp(pulse_loco_momentum(j), pulse_loco_momentum(a), P * 4),
               0);
  cr_assert_eq(memcmp(loc, pulse_loco_global(a), P * 4), 0);
  pulse_buffer_free(&st);
  free(longer), free(theta), free(loc);
  pulse_loco_free(a), pulse_loco_free(j);
}

/* Trainers 0..2 from the start, trainer 3 joins at round 4 through the
 * state of trainer 1; trainer 2 leaves after round 7 with a flush. */
Test(loco, late_joiner_ends_with_the_same_global_weights_in_process) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.hidden = 32;
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  uint64_t P = pulse_sim_problem_param_count(p);
  float *init = malloc(P * 4);
  pulse_sim_problem_init(p, init);
  pulse_loco *ctx[4] = {0};
  pulse_sim_learner *learn[4] = {0};
  float *local[4];
  for (uint32_t i = 0; i < 4; i++) {
    ctx[i] = lt_ctx(P, i, i < 3 ? init : NULL);
    cr_assert_eq(pulse_sim_learner_create(p, i, &learn[i]), PULSE_OK);
    local[i] = malloc(P * 4);
    memcpy(local[i], init, P * 4);
  }
  int live[4] = {1, 1, 1, 0};
  for (uint32_t round = 0; round < 12; round++) {
    if (round == 4) {
      pulse_buffer st = {NULL, 0};
      cr_assert_eq(pulse_loco_state_export(ctx[1], &st), PULSE_OK);
      cr_assert_eq(pulse_loco_state_import(ctx[3], st.data, st.size, local[3]),
                   PULSE_OK);
      pulse_buffer_free(&st);
      live[3] = 1;
    }
    pulse_loco_contribution set[4];
    uint8_t *copies[4] = {0};
    size_t n = 0;
    for (uint32_t i = 0; i < 4; i++) {
      if (!live[i])
        continue;
      for (int h = 0; h < 5; h++)
        pulse_sim_learner_step(learn[i], local[i]);
      const uint8_t *d;
      size_t s;
      uint32_t flags = (i == 2 && round == 7) ? PULSE_LOCO_LEAVING : 0;
      cr_assert_eq(
          pulse_loco_prepare(ctx[i], local[i], 160, flags, &d, &s, NULL),
          PULSE_OK);
      copies[i] = malloc(s);
      memcpy(copies[i], d, s);
      /* Trainer 1 misses round 6. */
      if (!(i == 1 && round == 6)) {
        set[n].data = copies[i];
        set[n++].size = s;
      }
    }
    for (uint32_t i = 0; i < 4; i++)
      if (live[i])
        cr_assert_eq(pulse_loco_finish(ctx[i], set, n, local[i], NULL),
                     PULSE_OK, "%s", pulse_error_detail());
    if (round == 7) {
      /* The leaver flushed: nothing of its s stays behind. */
      const float *e = pulse_loco_residual(ctx[2]);
      for (uint64_t j = 0; j < P; j++)
        cr_assert_eq(lt_bits(e[j]) & 0x7FFFFFFFu, 0u);
      live[2] = 0;
    }
    for (uint32_t i = 0; i < 4; i++)
      free(copies[i]);
  }
  for (uint32_t i = 0; i < 4; i++)
    if (live[i]) {
      cr_assert_eq(pulse_loco_round(ctx[i]), 12u);
      cr_assert_eq(
          memcmp(pulse_loco_global(ctx[i]), pulse_loco_global(ctx[0]), P * 4),
          0, "trainer %u's theta_g differs", i);
    }
  for (uint32_t i = 0; i < 4; i++) {
    pulse_loco_free(ctx[i]);
    pulse_sim_learner_free(learn[i]);
    free(local[i]);
  }
  free(init);
  pulse_sim_problem_free(p);
}

typedef struct {
  double start, loss;
  uint64_t bytes;
} run_total;

static void tally(void *user, const pulse_sim_round *r) {
  run_total *t = user;
  if (r->round == 0)
    t->start = r->loss;
  t->loss = r->loss;
  t->bytes += r->bytes;
}

Test(loco, three_trainers_converge_within_2_percent_of_diloco, .timeout = 600) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.hidden = 160; /* ~23k parameters keeps the test quick */
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  pulse_sim_opts so;
  pulse_sim_opts_init(&so);
  so.trainers = 3;
  run_total diloco = {0, 0, 0}, pulse = {0, 0, 0};
  so.method = PULSE_SIM_DILOCO;
  cr_assert_eq(pulse_sim_run(p, &so, tally, &diloco, NULL), PULSE_OK);
  so.method = PULSE_SIM_PULSELOCO;
  cr_assert_eq(pulse_sim_run(p, &so, tally, &pulse, NULL), PULSE_OK);
  double floor = pulse_sim_problem_floor(p);
  cr_log_info(
      "start %.5f, DiLoCo %.5f (%llu B), PULSELoCo %.5f (%llu B), floor %.5f",
      diloco.start, diloco.loss, (unsigned long long)diloco.bytes, pulse.loss,
      (unsigned long long)pulse.bytes, floor);
  /* The run must train: DiLoCo removes at least half the excess loss. */
  cr_assert(diloco.loss - floor < 0.5 * (diloco.start - floor),
            "DiLoCo did not train");
  cr_assert(pulse.loss <= diloco.loss * 1.02, "PULSELoCo %.5f vs DiLoCo %.5f",
            pulse.loss, diloco.loss);
  cr_assert(pulse.bytes * 10 <= diloco.bytes, "bytes %llu vs %llu",
            (unsigned long long)pulse.bytes, (unsigned long long)diloco.bytes);
  pulse_sim_problem_free(p);
}
