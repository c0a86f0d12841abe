/* test_collab_partition.c - a collaboration with partitioned averaging
 * (pulse_loco_collab_opts.partitioned): its peers as processes on loopback
 * (collab_testutil.h) end every round with the weights that an all-to-all
 * finish over the same payloads gives, bit for bit. Which peer did how
 * many steps depends on timing, so the reference is a replay: the rounds
 * as the peers reported them (each peer's own samples), rerun in memory
 * with pulse_loco_finish over every payload. */
#include "collab_testutil.h"
#include "manifest_impl.h"

#define PT_PEERS 4
#define PT_ROUNDS 4

Test(collab_partition, equals_an_all_to_all_replay_bit_for_bit,
     .timeout = 60) {
  const uint64_t step = 4, T = 48;
  ct_peer_cfg cfg[PT_PEERS];
  ct_child ks[PT_PEERS];
  for (uint32_t i = 0; i < PT_PEERS; i++)
    cfg[i] = (ct_peer_cfg){i + 1, step, T, PT_ROUNDS, -1, 10000u * (i + 1)};
  ct_partitioned = 1;
  for (size_t i = 0; i < PT_PEERS; i++)
    ct_spawn(&ks[i], &cfg[i]);
  for (size_t i = 0; i < PT_PEERS; i++)
    ct_hello(&ks[i]);
  ct_start(ks, PT_PEERS);
  static ct_round row[PT_PEERS][PT_ROUNDS];
  static int part[PT_PEERS][PT_ROUNDS];
  uint64_t final_digest[PT_PEERS];
  for (size_t i = 0; i < PT_PEERS; i++) {
    char line[512];
    size_t got = 0;
    for (;;) {
      cr_assert(ct_read_line(&ks[i], line, sizeof line, 30000),
                "peer %u went quiet", ks[i].id);
      cr_assert_neq(strncmp(line, "error", 5), 0, "peer %u: %s", ks[i].id,
                    line);
      ct_round r;
      if (ct_parse_round(line, &r)) {
        cr_assert_lt(r.round, PT_ROUNDS);
        row[i][r.round] = r;
        /* The last field: finished by the partitioned exchange. */
        const char *last = strrchr(line, ' ');
        part[i][r.round] = last != NULL && strcmp(last, " 1") == 0;
        got++;
      } else if (sscanf(line, "done %*u %" SCNx64, &final_digest[i]) == 1) {
        break;
      }
    }
    cr_assert_eq(got, PT_ROUNDS);
  }
  ct_quit(ks, PT_PEERS);

  /* The replay: same start, same steps, all-to-all finish. */
  pulse_loco *ctx[PT_PEERS];
  float *theta[PT_PEERS];
  ct_step_state st[PT_PEERS];
  for (uint32_t i = 0; i < PT_PEERS; i++) {
    pulse_loco_opts o = PULSE_LOCO_OPTS_INIT;
    o.param_count = CT_P;
    o.trainer_id = i + 1;
    o.rule = PULSE_LOCO_RULE_KEEP;
    o.chunk_log2 = 10;
    theta[i] = calloc(CT_P, sizeof *theta[i]);
    cr_assert_not_null(theta[i]);
    for (uint64_t p = 0; p < CT_P; p++)
      theta[i][p] = (float)((double)((p * 37u) % 101u) / 50.0 - 1.0);
    cr_assert_eq(pulse_loco_create(&o, theta[i], &ctx[i]), PULSE_OK);
    st[i] = (ct_step_state){i + 1, 0};
  }
  for (uint64_t r = 0; r < PT_ROUNDS; r++) {
    pulse_loco_contribution set[PT_PEERS];
    size_t n = 0;
    for (size_t i = 0; i < PT_PEERS; i++) {
      const ct_round *x = &row[i][r];
      /* A clean run: every peer that stepped is in the round; one that
       * did not step imports the state of r + 1. */
      cr_assert_eq(x->own % step, 0);
      cr_assert_eq(x->resynced, x->own == 0, "round %llu: peer %zu",
                   (unsigned long long)r, i);
      if (x->own == 0)
        continue;
      cr_assert(x->included);
      /* Not the all-to-all fallback: the exchange did the finish. */
      cr_assert(part[i][r], "round %llu: peer %zu finished all-to-all",
                (unsigned long long)r, i);
      for (uint64_t s = 0; s < x->own / step; s++)
        ct_step(&st[i], theta[i], step);
      const uint8_t *data;
      size_t size;
      cr_assert_eq(pulse_loco_prepare(ctx[i], theta[i], x->own, 0, &data,
                                      &size, NULL),
                   PULSE_OK);
      set[n++] = (pulse_loco_contribution){data, size};
    }
    cr_assert_gt(n, 1, "round %llu: one contributor proves nothing",
                 (unsigned long long)r);
    cr_assert_eq(row[0][r].contrib, n);
    /* Every payload prepared before the first finish (they are borrowed
     * until then): copy them, then finish each context. */
    uint8_t *copy[PT_PEERS];
    for (size_t j = 0; j < n; j++) {
      copy[j] = malloc(set[j].size);
      cr_assert_not_null(copy[j]);
      memcpy(copy[j], set[j].data, set[j].size);
      set[j].data = copy[j];
    }
    uint64_t want = 0;
    size_t done_by = 0;
    for (size_t i = 0; i < PT_PEERS; i++)
      if (row[i][r].own > 0) {
        cr_assert_eq(pulse_loco_finish(ctx[i], set, n, theta[i], NULL),
                     PULSE_OK);
        want = pulse_loco_global_digest(ctx[i]);
        done_by = i;
      }
    /* A member without a payload imports the state (keeps its e). */
    for (size_t i = 0; i < PT_PEERS; i++)
      if (row[i][r].own == 0) {
        pulse_buffer b = {0};
        cr_assert_eq(pulse_loco_state_export(ctx[done_by], &b), PULSE_OK);
        cr_assert_eq(pulse_loco_state_import(ctx[i], b.data, b.size,
                                             theta[i]),
                     PULSE_OK);
        pulse_buffer_free(&b);
      }
    for (size_t j = 0; j < n; j++)
      free(copy[j]);
    for (size_t i = 0; i < PT_PEERS; i++)
      cr_assert_eq(row[i][r].digest, want,
                   "round %llu: peer %zu has %016llx, all-to-all %016llx",
                   (unsigned long long)r, i,
                   (unsigned long long)row[i][r].digest,
                   (unsigned long long)want);
  }
  for (size_t i = 0; i < PT_PEERS; i++) {
    cr_assert_eq(final_digest[i], final_digest[0]);
    pulse_loco_free(ctx[i]);
    free(theta[i]);
  }
}

/* The manifest's optional per-contributor "samples" (what the members of
 * a partitioned round check slices against): kept through a write and a
 * parse, absent = 0, and anything but a positive integer refused. */
Test(collab_partition, manifest_samples_round_trip_and_bad_ones_refused) {
  loco_contrib_ref refs[2] = {{3, 100, {1}, 64}, {5, 200, {2}, 0}};
  pulse_loco_member next[1] = {{3, "http://127.0.0.1:9"}};
  loco_manifest m = {7, 3, 1, refs, 2, next, 1};
  pulse_bytebuf b = PULSE_BYTEBUF_INIT;
  cr_assert_eq(loco_manifest_write(&m, &b), PULSE_OK);
  loco_manifest x;
  cr_assert_eq(loco_manifest_parse(b.data, b.size, &x), PULSE_OK);
  cr_assert_eq(x.ncontrib, 2);
  cr_assert_eq(x.contrib[0].samples, 64);
  cr_assert_eq(x.contrib[1].samples, 0);
  loco_manifest_free(&x);
  char text[2048];
  cr_assert_lt(b.size, sizeof text);
  memcpy(text, b.data, b.size);
  text[b.size] = '\0';
  const char *at = strstr(text, "\"samples\":64");
  cr_assert_not_null(at);
  const char *bad[] = {"\"samples\":0", "\"samples\":-1", "\"samples\":\"64\"",
                       "\"samples\":6.5"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char doc[2048];
    size_t pre = (size_t)(at - text);
    snprintf(doc, sizeof doc, "%.*s%s%s", (int)pre, text, bad[i],
             at + strlen("\"samples\":64"));
    cr_assert_neq(loco_manifest_parse((const uint8_t *)doc, strlen(doc), &x),
                  PULSE_OK, "accepted %s", bad[i]);
  }
  pulse_bytebuf_free(&b);
}
