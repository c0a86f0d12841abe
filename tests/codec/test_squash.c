/* test_squash.c - pulse_patch_squash over random trajectories: the squashed
 * patch equals sequential apply, is byte for byte the patch the encoder
 * makes from the first base to the last target, names the chain's ends,
 * drops positions that changed back, and broken chains are refused. */
#include "patch_testutil.h"

#include <criterion/criterion.h>

#define MAX_STEPS 6
#define TENSORS 5

/* States S0..Sn of a small table and the patches P1..Pn between them. */
typedef struct {
  size_t steps;
  pt_tensor shape[TENSORS]; /* names and shapes only */
  uint16_t *state[MAX_STEPS + 1][TENSORS];
  pulse_buffer buf[MAX_STEPS + 1]; /* buf[k]: S(k-1) -> S(k) */
  pulse_patch *patch[MAX_STEPS + 1];
  uint64_t changes_sum; /* changes over all patches */
} trajectory;

static const uint64_t first_step = 100;

/* Each step changes elements at `density`; an element that changed in the
 * previous step goes back to its older bits half of the time (so chains
 * hold changes that cancel out), through a plain revert or two +0x8000. */
static void trajectory_make_versions(trajectory *tr, size_t steps,
                                     uint64_t seed,
                                     const pulse_pos_model *models,
                                     const unsigned *versions, double density) {
  memset(tr, 0, sizeof *tr);
  tr->steps = steps;
  static const struct {
    const char *name;
    uint32_t ndim;
    uint64_t shape[2];
  } table[TENSORS] = {{"a", 1, {3000}},
                      {"b", 2, {2, 513}},
                      {"c", 1, {1}},
                      {"d", 1, {0}},
                      {"e", 1, {40}}};
  uint64_t s = seed * 7919 + 1;
  for (size_t t = 0; t < TENSORS; t++) {
    pt_tensor_shape(&tr->shape[t], table[t].name, table[t].ndim,
                    table[t].shape);
    uint64_t n = tr->shape[t].numel;
    tr->state[0][t] = pt_alloc((size_t)n * 2);
    for (uint64_t i = 0; i < n; i++)
      tr->state[0][t][i] = pt_weight(&s, PT_WEIGHTS_EDGE);
  }
  for (size_t k = 1; k <= steps; k++) {
    pt_tensor ts[TENSORS];
    for (size_t t = 0; t < TENSORS; t++) {
      uint64_t n = tr->shape[t].numel;
      const uint16_t *prev = tr->state[k - 1][t];
      const uint16_t *older = k >= 2 ? tr->state[k - 2][t] : NULL;
      uint16_t *cur = pt_copy(prev, n);
      ts[t] = tr->shape[t];
      ts[t].changes = (pulse_changes)PULSE_CHANGES_INIT;
      for (uint64_t i = 0; i < n; i++) {
        if (older && older[i] != prev[i] && pulse_rng_below(&s, 2) == 0)
          cur[i] = older[i];
        else if (pulse_rng_below(&s, 8) == 0 &&
                 (uint16_t)(prev[i] - (older ? older[i] : prev[i])) == 0x8000)
          cur[i] = (uint16_t)(prev[i] + 0x8000);
        else if (pulse_rng_uniform(&s) < density)
          cur[i] = pt_new_bits(&s, prev[i], 1);
        if (cur[i] != prev[i])
          pt_push(&ts[t].changes, i, prev[i], cur[i]);
      }
      ts[t].base = (uint16_t *)prev;
      tr->state[k][t] = cur;
      tr->changes_sum += ts[t].changes.count;
    }
    pulse_encode_opts o = pt_opts(models[k - 1], 10 + (uint32_t)(k % 2), 1);
    o.format_version = versions ? versions[k - 1] : 0;
    o.base_step = first_step + k - 1;
    o.step = first_step + k;
    cr_assert_eq(pt_encode(&o, ts, TENSORS, &tr->buf[k]), PULSE_OK);
    cr_assert_eq(
        pulse_patch_open(tr->buf[k].data, tr->buf[k].size, &tr->patch[k]),
        PULSE_OK);
    for (size_t t = 0; t < TENSORS; t++)
      pulse_changes_free(&ts[t].changes);
  }
}

static void trajectory_make(trajectory *tr, size_t steps, uint64_t seed,
                            const pulse_pos_model *models, double density) {
  trajectory_make_versions(tr, steps, seed, models, NULL, density);
}

static void trajectory_free(trajectory *tr) {
  for (size_t k = 0; k <= tr->steps; k++) {
    for (size_t t = 0; t < TENSORS; t++)
      free(tr->state[k][t]);
    pulse_patch_free(tr->patch[k]);
    pulse_buffer_free(&tr->buf[k]);
  }
}

/* Squashes patches from..to (1-based, inclusive) into format version
 * out_version (0: the default) and checks the result against the states. */
static void check_squash_version(const trajectory *tr, size_t from, size_t to,
                                 pulse_pos_model out_model,
                                 unsigned out_version, int with_base,
                                 const char *label) {
  const pulse_patch *chain[MAX_STEPS];
  for (size_t k = from; k <= to; k++)
    chain[k - from] = tr->patch[k];
  const uint16_t *base[TENSORS];
  for (size_t t = 0; t < TENSORS; t++)
    base[t] = tr->state[from - 1][t];
  pulse_encode_opts o = pt_opts(out_model, 10, 3);
  o.format_version = out_version;
  pulse_buffer out = {NULL, 0};
  pulse_status st = pulse_patch_squash(chain, to - from + 1,
                                       with_base ? base : NULL, &o, &out);
  cr_assert_eq(st, PULSE_OK, "%s: squash: %s (%s)", label,
               pulse_status_name(st), pulse_error_detail());
  pulse_patch *p = NULL;
  cr_assert_eq(pulse_patch_open(out.data, out.size, &p), PULSE_OK, "%s", label);
  cr_assert_eq(pulse_patch_base_step(p), first_step + from - 1, "%s", label);
  cr_assert_eq(pulse_patch_step(p), first_step + to, "%s", label);
  cr_assert_eq(pulse_patch_pos_model(p), out_model, "%s", label);
  cr_assert_eq(pulse_patch_format_version(p),
               out_version ? out_version : PULSE_PATCH_VERSION, "%s", label);
  cr_assert_arr_eq(pulse_patch_base_digest(p)->bytes,
                   pulse_patch_base_digest(tr->patch[from])->bytes, 32);
  cr_assert_arr_eq(pulse_patch_target_digest(p)->bytes,
                   pulse_patch_target_digest(tr->patch[to])->bytes, 32);

  /* Exactly the net changes, which is what the encoder makes from them. */
  uint64_t sum = 0, net = 0;
  for (size_t k = from; k <= to; k++)
    sum += pulse_patch_total_changed(tr->patch[k]);
  pt_tensor direct[TENSORS];
  for (size_t t = 0; t < TENSORS; t++) {
    const uint16_t *a = tr->state[from - 1][t], *b = tr->state[to][t];
    uint64_t n = tr->shape[t].numel;
    direct[t] = tr->shape[t];
    direct[t].base = (uint16_t *)a;
    direct[t].changes = (pulse_changes)PULSE_CHANGES_INIT;
    pt_diff(a, b, n, &direct[t].changes);
    net += direct[t].changes.count;
    pulse_changes got = PULSE_CHANGES_INIT;
    cr_assert_eq(pulse_patch_decode_tensor(p, t, a, n, &got), PULSE_OK, "%s",
                 label);
    uint64_t bad = pt_changes_diff(&direct[t].changes, &got);
    cr_assert_eq(bad, PT_NONE, "%s: '%s' change %llu", label, tr->shape[t].name,
                 (unsigned long long)bad);
    pulse_changes_free(&got);
  }
  cr_assert_eq(pulse_patch_total_changed(p), net, "%s: net changes", label);
  cr_assert_leq(net, sum, "%s", label);
  o.base_step = first_step + from - 1;
  o.step = first_step + to;
  pulse_buffer want = {NULL, 0};
  cr_assert_eq(pt_encode(&o, direct, TENSORS, &want), PULSE_OK);
  cr_assert_eq(out.size, want.size, "%s: size vs direct encode", label);
  cr_assert_arr_eq(out.data, want.data, want.size, "%s: bytes", label);
  pulse_buffer_free(&want);

  /* Squashed apply and sequential apply both reach the last state. */
  pt_tensor start[TENSORS];
  for (size_t t = 0; t < TENSORS; t++) {
    start[t] = tr->shape[t];
    start[t].base = tr->state[from - 1][t];
  }
  pulse_host_tensor *h1 = pt_hosts(start, TENSORS);
  pulse_host_tensor *h2 = pt_hosts(start, TENSORS);
  cr_assert_eq(pulse_patch_apply(p, h1, TENSORS, NULL), PULSE_OK, "%s: %s",
               label, pulse_error_detail());
  for (size_t k = from; k <= to; k++)
    cr_assert_eq(pulse_patch_apply(tr->patch[k], h2, TENSORS, NULL), PULSE_OK,
                 "%s: patch %zu", label, k);
  for (size_t t = 0; t < TENSORS; t++) {
    uint64_t n = tr->shape[t].numel;
    cr_assert_eq(pt_first_diff(tr->state[to][t], h1[t].data, n), PT_NONE,
                 "%s: squashed apply '%s'", label, tr->shape[t].name);
    cr_assert_eq(pt_first_diff(h2[t].data, h1[t].data, n), PT_NONE,
                 "%s: squashed vs sequential '%s'", label, tr->shape[t].name);
    pulse_changes_free(&direct[t].changes);
  }
  pt_hosts_free(h1, TENSORS);
  pt_hosts_free(h2, TENSORS);
  pulse_patch_free(p);
  pulse_buffer_free(&out);
}

static void check_squash(const trajectory *tr, size_t from, size_t to,
                         pulse_pos_model out_model, int with_base,
                         const char *label) {
  check_squash_version(tr, from, to, out_model, 0, with_base, label);
}

static const char *const model_names[] = {"plain", "class"};

/* A chain of patches in every format version squashes into the version
 * the options ask for (the inputs' versions do not matter: each is
 * decoded by its own version, the result encoded anew). */
Test(squash, a_chain_of_mixed_versions_squashes_into_the_version_asked) {
  static const unsigned versions[MAX_STEPS] = {3, 1, 2, 3, 3, 2};
  for (uint64_t seed = 0; seed < 3; seed++)
    for (int mix = 0; mix < 3; mix++) {
      pulse_pos_model models[MAX_STEPS];
      for (size_t k = 0; k < MAX_STEPS; k++)
        models[k] = mix == 2 ? (pulse_pos_model)(k % 2) : (pulse_pos_model)mix;
      trajectory tr;
      trajectory_make_versions(&tr, MAX_STEPS, 40 + seed * 3 + (uint64_t)mix,
                               models, versions, seed % 2 ? 0.05 : 0.3);
      for (unsigned out_version = 1; out_version <= 3; out_version++)
        for (int out = 0; out < 2; out++) {
          char label[128];
          snprintf(label, sizeof label, "seed %llu mix %d -> %s v%u",
                   (unsigned long long)seed, mix, model_names[out],
                   out_version);
          check_squash_version(&tr, 1, MAX_STEPS, (pulse_pos_model)out,
                               out_version, 1, label);
          check_squash_version(&tr, 4, 5, (pulse_pos_model)out, out_version, 1,
                               label);
          if (mix == 0 && out == 0) /* plain needs no weights */
            check_squash_version(&tr, 2, 5, PULSE_POS_PLAIN, out_version, 0,
                                 label);
        }
      trajectory_free(&tr);
    }
}

Test(squash, equals_sequential_apply_over_random_chains) {
  /* Input models: all plain, all class, alternating. */
  for (uint64_t seed = 0; seed < 6; seed++)
    for (int mix = 0; mix < 3; mix++) {
      pulse_pos_model models[MAX_STEPS];
      for (size_t k = 0; k < MAX_STEPS; k++)
        models[k] = mix == 2 ? (pulse_pos_model)(k % 2) : (pulse_pos_model)mix;
      trajectory tr;
      trajectory_make(&tr, MAX_STEPS, seed * 3 + (uint64_t)mix, models,
                      seed % 2 ? 0.05 : 0.3);
      for (size_t len = 2; len <= MAX_STEPS; len++)
        for (int out = 0; out < 2; out++) {
          size_t from = 1 + (seed + len) % (MAX_STEPS - len + 1);
          char label[128];
          snprintf(label, sizeof label, "seed %llu mix %d chain %zu..%zu -> %s",
                   (unsigned long long)seed, mix, from, from + len - 1,
                   model_names[out]);
          check_squash(&tr, from, from + len - 1, (pulse_pos_model)out, 1,
                       label);
          if (mix == 0 && out == 0) /* plain needs no weights */
            check_squash(&tr, from, from + len - 1, PULSE_POS_PLAIN, 0, label);
        }
      trajectory_free(&tr);
    }
}

Test(squash, changes_that_cancel_out_disappear) {
  pulse_pos_model models[2] = {PULSE_POS_CLASS, PULSE_POS_PLAIN};
  trajectory tr;
  trajectory_make(&tr, 2, 1, models, 0.2);
  /* S2 == S0 wherever step 2 reverted step 1: those positions are gone. */
  uint64_t reverted = 0;
  for (size_t t = 0; t < TENSORS; t++)
    for (uint64_t i = 0; i < tr.shape[t].numel; i++)
      reverted += tr.state[1][t][i] != tr.state[0][t][i] &&
                  tr.state[2][t][i] == tr.state[0][t][i];
  cr_assert_gt(reverted, 50, "the trajectory reverts changes");
  check_squash(&tr, 1, 2, PULSE_POS_CLASS, 1, "cancel");
  trajectory_free(&tr);

  /* A whole step undone: the squashed patch has no changes at all. */
  pt_tensor t;
  pt_tensor_make1(&t, "w", 5000, PT_WEIGHTS_NORMAL, 0.1, 1, 3);
  pt_tensor back = t;
  back.base = t.target;
  back.changes = (pulse_changes)PULSE_CHANGES_INIT;
  pt_diff(t.target, t.base, t.numel, &back.changes);
  for (int m = 0; m < 2; m++) {
    pulse_encode_opts o = pt_opts((pulse_pos_model)m, 10, 1);
    pulse_buffer b1 = {NULL, 0}, b2 = {NULL, 0}, out = {NULL, 0};
    cr_assert_eq(pt_encode(&o, &t, 1, &b1), PULSE_OK);
    o.base_step = o.step, o.step++;
    cr_assert_eq(pt_encode(&o, &back, 1, &b2), PULSE_OK);
    pulse_patch *p[2];
    cr_assert_eq(pulse_patch_open(b1.data, b1.size, &p[0]), PULSE_OK);
    cr_assert_eq(pulse_patch_open(b2.data, b2.size, &p[1]), PULSE_OK);
    const uint16_t *base[1] = {t.base};
    cr_assert_eq(pulse_patch_squash((const pulse_patch *const *)p, 2,
                                    m ? base : NULL, &o, &out),
                 PULSE_OK, "%s", pulse_error_detail());
    pulse_patch *sq = NULL;
    cr_assert_eq(pulse_patch_open(out.data, out.size, &sq), PULSE_OK);
    cr_assert_eq(pulse_patch_total_changed(sq), 0);
    cr_assert_arr_eq(pulse_patch_base_digest(sq)->bytes,
                     pulse_patch_target_digest(sq)->bytes, 32);
    pulse_patch_free(sq), pulse_patch_free(p[0]), pulse_patch_free(p[1]);
    pulse_buffer_free(&b1), pulse_buffer_free(&b2), pulse_buffer_free(&out);
  }
  pulse_changes_free(&back.changes);
  pt_tensor_free(&t);
}

Test(squash, a_single_patch_squashes_to_itself) {
  for (int m = 0; m < 2; m++) {
    pulse_pos_model models[1] = {(pulse_pos_model)m};
    trajectory tr;
    trajectory_make(&tr, 1, 9, models, 0.1);
    const uint16_t *base[TENSORS];
    for (size_t t = 0; t < TENSORS; t++)
      base[t] = tr.state[0][t];
    pulse_encode_opts o = pt_opts((pulse_pos_model)m, 11, 2);
    pulse_buffer out = {NULL, 0};
    const pulse_patch *one = tr.patch[1];
    cr_assert_eq(pulse_patch_squash(&one, 1, base, &o, &out), PULSE_OK);
    cr_assert_eq(out.size, tr.buf[1].size);
    cr_assert_arr_eq(out.data, tr.buf[1].data, out.size);
    pulse_buffer_free(&out);
    trajectory_free(&tr);
  }
}

/* Positions past 2^32 in a 2^40-element tensor that no one holds: plain
 * patches squash from their (position, delta) lists alone. */
Test(squash, plain_chain_of_a_huge_tensor_without_weights) {
  const uint64_t n = 1ull << 40;
  pt_tensor t;
  pt_tensor_shape(&t, "huge", 1, &n);
  pulse_tensor_digest d0 = {0x1234, 0x5678}; /* of an all-zero tensor */
  pulse_changes c1 = PULSE_CHANGES_INIT, c2 = PULSE_CHANGES_INIT,
                net = PULSE_CHANGES_INIT;
  pt_push(&c1, 5, 0, 0x3F80);
  pt_push(&c1, (1ull << 32) + 1, 0, 0x8000);
  pt_push(&c1, n - 1, 0, 0x7FC1);
  pt_push(&c2, 5, 0x3F80, 0); /* back to zero */
  pt_push(&c2, 1ull << 33, 0, 0x0001);
  pt_push(&c2, n - 1, 0x7FC1, 0xFF80);
  pt_push(&net, (1ull << 32) + 1, 0, 0x8000);
  pt_push(&net, 1ull << 33, 0, 0x0001);
  pt_push(&net, n - 1, 0, 0xFF80);
  pulse_tensor_digest d1 = pulse_digest_apply_changes(d0, &c1);
  pulse_encode_tensor e;
  pt_encode_table(&t, 1, &e);
  e.base = NULL;
  pulse_encode_opts o = pt_opts(PULSE_POS_PLAIN, 30, 2);
  pulse_buffer b1 = {NULL, 0}, b2 = {NULL, 0}, out = {NULL, 0},
               want = {NULL, 0};
  e.base_digest = &d0, e.changes = &c1;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b1), PULSE_OK, "%s",
               pulse_error_detail());
  o.base_step = o.step, o.step++;
  e.base_digest = &d1, e.changes = &c2;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &b2), PULSE_OK);
  pulse_patch *p[2];
  cr_assert_eq(pulse_patch_open(b1.data, b1.size, &p[0]), PULSE_OK);
  cr_assert_eq(pulse_patch_open(b2.data, b2.size, &p[1]), PULSE_OK);
  pulse_patch_tensor pe;
  cr_assert_eq(pulse_patch_tensor_get(p[0], 0, &pe), PULSE_OK);
  cr_assert_eq(pe.numel, n);
  cr_assert_eq(pe.chunk_count, 1024);
  cr_assert_eq(
      pulse_patch_squash((const pulse_patch *const *)p, 2, NULL, &o, &out),
      PULSE_OK, "%s", pulse_error_detail());
  o.base_step = 7;
  e.base_digest = &d0, e.changes = &net;
  cr_assert_eq(pulse_patch_encode(&o, &e, 1, &want), PULSE_OK);
  cr_assert_eq(out.size, want.size);
  cr_assert_arr_eq(out.data, want.data, want.size, "squash == direct encode");
  pulse_patch_free(p[0]), pulse_patch_free(p[1]);
  pulse_buffer_free(&b1), pulse_buffer_free(&b2), pulse_buffer_free(&out),
      pulse_buffer_free(&want);
  pulse_changes_free(&c1), pulse_changes_free(&c2), pulse_changes_free(&net);
}

Test(squash, refuses_broken_chains_and_missing_weights) {
  pulse_pos_model plain[3] = {PULSE_POS_PLAIN, PULSE_POS_PLAIN,
                              PULSE_POS_PLAIN};
  pulse_pos_model mixed[3] = {PULSE_POS_PLAIN, PULSE_POS_CLASS,
                              PULSE_POS_PLAIN};
  trajectory tr, other, mix;
  trajectory_make(&tr, 3, 20, plain, 0.1);
  trajectory_make(&other, 3, 21, plain, 0.1);
  trajectory_make(&mix, 3, 20, mixed, 0.1);
  const uint16_t *base[TENSORS];
  for (size_t t = 0; t < TENSORS; t++)
    base[t] = tr.state[0][t];
  pulse_encode_opts o = pt_opts(PULSE_POS_PLAIN, 10, 1);
  pulse_buffer out = {(uint8_t *)1, 1};
#define SQUASH(want, b, ...)                                                   \
  do {                                                                         \
    const pulse_patch *chain_[] = {__VA_ARGS__};                               \
    pulse_status st_ =                                                         \
        pulse_patch_squash(chain_, PT_COUNT_OF(chain_), b, &o, &out);          \
    cr_assert_eq(st_, want, "%s: got %s (%s)", #__VA_ARGS__,                   \
                 pulse_status_name(st_), pulse_error_detail());                \
    if (st_ != PULSE_OK)                                                       \
      cr_assert(out.data == NULL && out.size == 0, "no output on failure");    \
    pulse_buffer_free(&out);                                                   \
  } while (0)
  SQUASH(PULSE_OK, NULL, tr.patch[1], tr.patch[2], tr.patch[3]);
  SQUASH(PULSE_ERR_BASE_STEP, NULL, tr.patch[1], tr.patch[3]);
  SQUASH(PULSE_ERR_BASE_STEP, NULL, tr.patch[2], tr.patch[1]);
  SQUASH(PULSE_ERR_BASE_DIGEST, NULL, tr.patch[1], other.patch[2]);
  SQUASH(PULSE_ERR_BASE_DIGEST, NULL, other.patch[1], tr.patch[2], tr.patch[3]);
  SQUASH(PULSE_ERR_BASE_STEP, NULL, tr.patch[1], tr.patch[1]);
  /* The class model needs the first base's weights. */
  SQUASH(PULSE_ERR_ARG, NULL, mix.patch[1], mix.patch[2]);
  SQUASH(PULSE_OK, base, mix.patch[1], mix.patch[2]);
  o.pos_model = PULSE_POS_CLASS;
  SQUASH(PULSE_ERR_ARG, NULL, tr.patch[1], tr.patch[2]);
  SQUASH(PULSE_OK, base, tr.patch[1], tr.patch[2]);
  /* Weights that are not the first base. */
  uint16_t *wrong = pt_copy(tr.state[0][0], tr.shape[0].numel);
  wrong[17] ^= 0x40;
  base[0] = wrong;
  SQUASH(PULSE_ERR_BASE_DIGEST, base, tr.patch[1], tr.patch[2]);
  base[0] = tr.state[0][0];
  base[4] = NULL;
  SQUASH(PULSE_ERR_ARG, base, tr.patch[1], tr.patch[2]);
  base[4] = tr.state[0][4];
  o.struct_version = 0;
  SQUASH(PULSE_ERR_VERSION, base, tr.patch[1], tr.patch[2]);
  o.struct_version = PULSE_ENCODE_OPTS_VERSION;
  SQUASH(PULSE_ERR_ARG, base, tr.patch[1], NULL);
#undef SQUASH
  const pulse_patch *one = tr.patch[1];
  cr_assert_eq(pulse_patch_squash(&one, 0, base, &o, &out), PULSE_ERR_ARG);
  cr_assert_eq(pulse_patch_squash(NULL, 1, base, &o, &out), PULSE_ERR_ARG);
  cr_assert_eq(pulse_patch_squash(&one, 1, base, NULL, &out), PULSE_ERR_ARG);
  cr_assert_eq(pulse_patch_squash(&one, 1, base, &o, NULL), PULSE_ERR_ARG);
  free(wrong);
  trajectory_free(&tr);
  trajectory_free(&other);
  trajectory_free(&mix);
}
