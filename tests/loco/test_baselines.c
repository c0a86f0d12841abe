/* test_baselines.c - the dense baselines of `pulse-bench loco`
 * (tools/sim/sim_trainers.h, tools/sim/sim_dense.h): DiLoCo over dense FP32
 * messages is the library's dense DiLoCo bit for bit, DDP's replicas are the
 * one-model DDP bit for bit, BF16 messages carry exactly the rounded values,
 * runs over HTTP give the bits of runs in memory with every message served
 * once per other trainer, and the message decoder refuses hostile bytes. */
#include "loco_testutil.h"
#include "sim_trainers.h"

static pulse_sim_problem *tiny_problem(void) {
  pulse_sim_problem_opts po;
  pulse_sim_problem_opts_init(&po);
  po.hidden = 24;
  pulse_sim_problem *p;
  cr_assert_eq(pulse_sim_problem_create(&po, &p), PULSE_OK);
  return p;
}

typedef struct {
  uint32_t rounds;
  double loss;
  uint64_t bytes, wire, max_message, max_trainer;
  int wire_is_n_minus_1_messages; /* every round */
  uint32_t trainers;
} totals;

static void count(void *user, const pulse_sim_round *r) {
  totals *t = user;
  t->loss = r->loss;
  if (r->round == 0) {
    cr_assert_eq(r->bytes + r->wire_bytes, 0u);
    return;
  }
  t->rounds++;
  t->bytes += r->bytes;
  t->wire += r->wire_bytes;
  if (r->wire_bytes != (uint64_t)(t->trainers - 1) * r->bytes)
    t->wire_is_n_minus_1_messages = 0;
  if (r->max_message_bytes > t->max_message)
    t->max_message = r->max_message_bytes;
  if (r->max_trainer_bytes > t->max_trainer)
    t->max_trainer = r->max_trainer_bytes;
}

static float *run_sim(const pulse_sim_problem *p, pulse_sim_method m,
                      pulse_sim_dense_values v, int http, uint32_t rounds,
                      uint32_t inner, totals *t) {
  pulse_sim_opts so;
  pulse_sim_opts_init(&so);
  so.method = m;
  so.values = v;
  so.over_http = http;
  so.rounds = rounds;
  so.inner = inner;
  memset(t, 0, sizeof *t);
  t->trainers = so.trainers;
  t->wire_is_n_minus_1_messages = 1;
  uint64_t P = pulse_sim_problem_param_count(p);
  float *theta = malloc(P * sizeof *theta);
  cr_assert_eq(pulse_sim_run(p, &so, count, t, theta), PULSE_OK, "%s",
               pulse_error_detail());
  cr_assert_eq(t->rounds, rounds);
  return theta;
}

Test(loco, dense_fp32_diloco_equals_the_library_dense_mode_bit_for_bit) {
  pulse_sim_problem *p = tiny_problem();
  uint64_t P = pulse_sim_problem_param_count(p);
  totals t;
  float *sim =
      run_sim(p, PULSE_SIM_DILOCO, PULSE_SIM_DENSE_FP32, 0, 5, 4, &t);
  /* The same rounds through pulse_loco contexts in their dense mode. */
  pulse_loco *ctx[3];
  pulse_sim_learner *learn[3];
  float *local[3];
  for (uint32_t i = 0; i < 3; i++) {
    pulse_loco_opts o;
    pulse_loco_opts_init(&o);
    o.param_count = P;
    o.trainer_id = i;
    o.gate = PULSE_LOCO_GATE_NONE;
    o.values = PULSE_LOCO_VALUES_RAW;
    local[i] = malloc(P * sizeof *local[i]);
    pulse_sim_problem_init(p, local[i]);
    cr_assert_eq(pulse_loco_create(&o, local[i], &ctx[i]), PULSE_OK);
    cr_assert_eq(pulse_sim_learner_create(p, i, &learn[i]), PULSE_OK);
  }
  for (uint32_t round = 0; round < 5; round++) {
    pulse_loco_contribution set[3];
    uint8_t *copies[3];
    for (uint32_t i = 0; i < 3; i++) {
      for (int h = 0; h < 4; h++)
        pulse_sim_learner_step(learn[i], local[i]);
      const uint8_t *d;
      size_t s;
      cr_assert_eq(pulse_loco_prepare(ctx[i], local[i],
                                      4u * pulse_sim_problem_batch(p), 0, &d, &s,
                                      NULL),
                   PULSE_OK);
      copies[i] = malloc(s);
      memcpy(copies[i], d, s);
      set[i] = (pulse_loco_contribution){copies[i], s};
    }
    for (uint32_t i = 0; i < 3; i++)
      cr_assert_eq(pulse_loco_finish(ctx[i], set, 3, local[i], NULL), PULSE_OK);
    for (uint32_t i = 0; i < 3; i++)
      free(copies[i]);
  }
  cr_assert_eq(memcmp(sim, pulse_loco_global(ctx[0]), P * sizeof *sim), 0,
               "dense-message DiLoCo and the library's dense mode differ");
  cr_assert_eq(t.max_message, 40u + 4u * P);
  cr_assert_eq(t.bytes, 5u * 3u * (40u + 4u * P));
  for (uint32_t i = 0; i < 3; i++) {
    pulse_loco_free(ctx[i]);
    pulse_sim_learner_free(learn[i]);
    free(local[i]);
  }
  free(sim);
  pulse_sim_problem_free(p);
}

Test(loco, ddp_replicas_equal_the_one_model_ddp_bit_for_bit) {
  pulse_sim_problem *p = tiny_problem();
  uint64_t P = pulse_sim_problem_param_count(p);
  totals t;
  float *sim = run_sim(p, PULSE_SIM_DDP, PULSE_SIM_DENSE_FP32, 0, 2, 3, &t);
  /* One model: the three gradients summed in order, divided by 3, one Adam
   * step with trainer 0's moments. */
  pulse_sim_learner *learn[3];
  for (uint32_t i = 0; i < 3; i++)
    cr_assert_eq(pulse_sim_learner_create(p, i, &learn[i]), PULSE_OK);
  float *theta = malloc(P * 4), *g = malloc(P * 4), *sum = malloc(P * 4);
  pulse_sim_problem_init(p, theta);
  for (int step = 0; step < 6; step++) {
    memset(sum, 0, P * 4);
    for (uint32_t i = 0; i < 3; i++) {
      pulse_sim_learner_grad(learn[i], theta, g);
      for (uint64_t k = 0; k < P; k++)
        sum[k] += g[k];
    }
    for (uint64_t k = 0; k < P; k++)
      sum[k] *= 1.0f / 3.0f;
    pulse_sim_learner_adam(learn[0], theta, sum);
  }
  cr_assert_eq(memcmp(sim, theta, P * 4), 0, "DDP replicas differ");
  cr_assert_eq(t.bytes, 6u * 3u * (40u + 4u * P),
               "one message per trainer "
               "per inner step");
  cr_assert_eq(t.max_trainer, 3u * (40u + 4u * P));
  for (uint32_t i = 0; i < 3; i++)
    pulse_sim_learner_free(learn[i]);
  free(theta), free(g), free(sum), free(sim);
  pulse_sim_problem_free(p);
}

Test(loco, bf16_diloco_sends_two_bytes_per_parameter_and_still_trains) {
  pulse_sim_problem *p = tiny_problem();
  uint64_t P = pulse_sim_problem_param_count(p);
  totals f, b;
  float *fp32 =
      run_sim(p, PULSE_SIM_DILOCO, PULSE_SIM_DENSE_FP32, 0, 12, 10, &f);
  float *bf16 =
      run_sim(p, PULSE_SIM_DILOCO, PULSE_SIM_DENSE_BF16, 0, 12, 10, &b);
  cr_assert_eq(b.max_message, 40u + 2u * P);
  cr_assert_eq(b.bytes, 12u * 3u * (40u + 2u * P));
  cr_assert_neq(memcmp(fp32, bf16, P * 4), 0, "the rounding changed nothing");
  cr_log_info("DiLoCo loss after 12 rounds: FP32 %.6f, BF16 %.6f", f.loss,
              b.loss);
  cr_assert(fabs(b.loss - f.loss) < 0.02 * f.loss, "FP32 %.6f, BF16 %.6f",
            f.loss, b.loss);
  free(fp32), free(bf16);
  pulse_sim_problem_free(p);
}

Test(loco, runs_over_http_equal_runs_in_memory_and_count_every_served_byte,
     .timeout = 120) {
  pulse_sim_problem *p = tiny_problem();
  uint64_t P = pulse_sim_problem_param_count(p);
  const struct {
    pulse_sim_method m;
    pulse_sim_dense_values v;
  } arms[] = {{PULSE_SIM_DDP, PULSE_SIM_DENSE_FP32},
              {PULSE_SIM_DILOCO, PULSE_SIM_DENSE_BF16},
              {PULSE_SIM_PULSELOCO, PULSE_SIM_DENSE_FP32}};
  for (size_t a = 0; a < sizeof arms / sizeof arms[0]; a++) {
    totals mem, http;
    float *x = run_sim(p, arms[a].m, arms[a].v, 0, 3, 2, &mem);
    float *y = run_sim(p, arms[a].m, arms[a].v, 1, 3, 2, &http);
    cr_assert_eq(memcmp(x, y, P * 4), 0, "arm %zu: HTTP and memory differ", a);
    cr_assert_eq(http.bytes, mem.bytes, "arm %zu", a);
    cr_assert(http.bytes > 0);
    /* Every message went to each of the two other trainers, and the
     * servers served exactly those bytes. */
    cr_assert(http.wire_is_n_minus_1_messages, "arm %zu: served %llu for %llu",
              a, (unsigned long long)http.wire, (unsigned long long)http.bytes);
    cr_assert(mem.wire_is_n_minus_1_messages, "arm %zu", a);
    free(x), free(y);
  }
  pulse_sim_problem_free(p);
}

/* ------------------------------------------------------- dense messages */

static uint8_t *encode(pulse_sim_dense_values v, const float *x, uint64_t n,
                       size_t *size) {
  *size = pulse_sim_dense_size(v, n);
  cr_assert(*size > 0);
  uint8_t *m = malloc(*size);
  pulse_sim_dense_header h = {v, 7, 42, 160, n};
  cr_assert_eq(pulse_sim_dense_encode(&h, x, m), PULSE_OK);
  return m;
}

Test(loco, dense_messages_round_trip_with_bf16_rounded_to_nearest_even) {
  enum { N = 4099 };
  float *x = malloc(N * 4), *y = malloc(N * 4);
  lt_fill_weights(x, N, 5, 1e-3f);
  x[0] = lt_float(0x3F808000u); /* a tie: rounds to even, 0x3F80 */
  x[1] = lt_float(0x3F818000u); /* a tie: rounds up to even, 0x3F82 */
  x[2] = -0.0f;
  pulse_sim_dense_header want = {PULSE_SIM_DENSE_FP32, 0, 42, 1, N}, got;
  size_t size;
  uint8_t *m = encode(PULSE_SIM_DENSE_FP32, x, N, &size);
  cr_assert_eq(size, 40u + 4u * N);
  cr_assert_eq(pulse_sim_dense_decode(m, size, &want, &got, y), PULSE_OK);
  cr_assert_eq(memcmp(x, y, N * 4), 0);
  cr_assert_eq(got.sender, 7u);
  cr_assert_eq(got.samples, 160u);
  free(m);
  m = encode(PULSE_SIM_DENSE_BF16, x, N, &size);
  cr_assert_eq(size, 40u + 2u * N);
  want.values = PULSE_SIM_DENSE_BF16;
  cr_assert_eq(pulse_sim_dense_decode(m, size, &want, &got, y), PULSE_OK);
  for (uint64_t i = 0; i < N; i++)
    cr_assert_eq(lt_bits(y[i]), (uint32_t)lt_ref_bf16(x[i]) << 16, "value %llu",
                 (unsigned long long)i);
  cr_assert_eq(lt_bits(y[0]), 0x3F800000u);
  cr_assert_eq(lt_bits(y[1]), 0x3F820000u);
  cr_assert_eq(lt_bits(y[2]), 0x80000000u);
  free(m), free(x), free(y);
}

Test(loco, dense_messages_refuse_hostile_bytes_and_bad_values) {
  enum { N = 64 };
  float x[N], y[N];
  for (int i = 0; i < N; i++)
    x[i] = 0.25f * (float)(i - 20);
  size_t size;
  uint8_t *m = encode(PULSE_SIM_DENSE_FP32, x, N, &size);
  pulse_sim_dense_header want = {PULSE_SIM_DENSE_FP32, 0, 42, 1, N};
  uint8_t *bad = malloc(size + 1);
  memcpy(bad, m, size);
  bad[size] = 0;
  cr_assert_eq(pulse_sim_dense_decode(bad, size - 1, &want, NULL, y),
               PULSE_ERR_TRUNCATED);
  cr_assert_eq(pulse_sim_dense_decode(bad, 39, &want, NULL, y),
               PULSE_ERR_TRUNCATED);
  cr_assert_eq(pulse_sim_dense_decode(bad, size + 1, &want, NULL, y),
               PULSE_ERR_TRAILING);
  const struct {
    size_t at;
    uint8_t v;
    pulse_status want;
  } flips[] = {{0, 'X', PULSE_ERR_MAGIC},
               {4, 2, PULSE_ERR_VERSION},
               {5, 1, PULSE_ERR_DTYPE},
               {5, 9, PULSE_ERR_CORRUPT},
               {6, 1, PULSE_ERR_CORRUPT},
               {13, 1, PULSE_ERR_CORRUPT},
               {16, 43, PULSE_ERR_BASE_STEP},
               {24, 0, PULSE_ERR_CORRUPT},
               {32, N + 1, PULSE_ERR_SIZE_MISMATCH}};
  for (size_t f = 0; f < sizeof flips / sizeof flips[0]; f++) {
    memcpy(bad, m, size);
    bad[flips[f].at] = flips[f].v;
    if (flips[f].at == 24) /* samples 0: all eight bytes */
      memset(bad + 24, 0, 8);
    cr_assert_eq(pulse_sim_dense_decode(bad, size, &want, NULL, y),
                 flips[f].want, "byte %zu", flips[f].at);
  }
  /* An infinite value (FP32 bits 0x7F800000) in the body. */
  memcpy(bad, m, size);
  memcpy(bad + 40 + 4 * 3, (uint8_t[]){0, 0, 0x80, 0x7F}, 4);
  cr_assert_eq(pulse_sim_dense_decode(bad, size, &want, NULL, y),
               PULSE_ERR_CORRUPT);
  /* The encoder refuses what cannot be sent: NaN, and FP32 values that
   * round past the largest BF16. */
  pulse_sim_dense_header h = {PULSE_SIM_DENSE_FP32, 0, 42, 1, N};
  x[5] = NAN;
  cr_assert_eq(pulse_sim_dense_encode(&h, x, bad), PULSE_ERR_ARG);
  x[5] = FLT_MAX;
  cr_assert_eq(pulse_sim_dense_encode(&h, x, bad), PULSE_OK);
  h.values = PULSE_SIM_DENSE_BF16;
  cr_assert_eq(pulse_sim_dense_encode(&h, x, bad), PULSE_ERR_ARG);
  h.samples = 0;
  x[5] = 1.0f;
  cr_assert_eq(pulse_sim_dense_encode(&h, x, bad), PULSE_ERR_ARG);
  cr_assert_eq(pulse_sim_dense_size(PULSE_SIM_DENSE_BF16, 0), 0u);
  cr_assert_eq(pulse_sim_dense_size((pulse_sim_dense_values)7, 10), 0u);
  free(bad), free(m);
}
