/* bench_loco_summary.c - the summary of a `pulse-bench loco` run: totals
 * per method over the rounds, the ratios and targets against the
 * baselines, PULSELoCo's exchange (drift, re-syncs, datagrams,
 * authentication, round times), as one JSON object or as text. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_loco_impl.h"
#include "pulse_loco_coord.h"

static double ratio(uint64_t a, uint64_t b) {
  return b ? (double)a / (double)b : 0.0;
}

/* The drift over all trainer pairs and the spread of round wall times. */
static void sum_up_pairs_and_times(const bench *b, totals *t) {
  uint32_t R = b->a.rounds, n = 0;
  double *rt = malloc(R * sizeof *rt), *xt = malloc(R * sizeof *xt);
  for (uint32_t r = 1; r <= R; r++) {
    const round_row *w = &b->rows[r];
    if (w->pair_measured) {
      t->pair_rounds++;
      if (w->pair_drift > t->max_pair_drift)
        t->max_pair_drift = w->pair_drift;
    }
    if (rt && xt && w->have[PULSELOCO])
      rt[n] = (double)w->round_ms, xt[n++] = (double)w->exchange_ms;
  }
  bench_time_stats_of(rt, n, &t->round_t);
  bench_time_stats_of(xt, n, &t->exchange_t);
  free(rt), free(xt);
}

/* Text RL: each method's held-out reward over the last fifth of the rounds
 * (one at least), where a single round's figure would be noisy; and the
 * density of each method's messages. */
static void sum_up_rewards_and_density(const bench *b, totals *t) {
  uint32_t R = b->a.rounds;
  t->reward_rounds = R / 5 > 0 ? R / 5 : 1;
  for (int m = 0; m < METHODS; m++) {
    for (uint32_t r = R - t->reward_rounds + 1; r <= R; r++)
      t->last_reward[m] += b->rows[r].reward[m] / t->reward_rounds;
    t->density[m] = 1.0; /* dense messages carry every entry */
  }
  double messages = (double)b->a.trainers * R;
  t->density[PULSELOCO] =
      b->P ? (double)t->entries / ((double)b->P * messages) : 0.0;
  for (int m = 0; m < METHODS; m++)
    t->reward_gap[m] = t->last_reward[m] > 0
                           ? t->last_reward[PULSELOCO] / t->last_reward[m] - 1.0
                           : 0.0;
  /* Not met when the baseline did not run (--only-pulseloco). */
  t->t_reward = t->last_reward[REFERENCE] > 0 &&
                t->reward_gap[REFERENCE] >= -0.01;
}

void bench_loco_sum_up(const bench *b, totals *t) {
  memset(t, 0, sizeof *t);
  const round_row *last = &b->rows[b->a.rounds];
  for (uint32_t r = 1; r <= b->a.rounds; r++) {
    const round_row *w = &b->rows[r];
    for (int m = 0; m < METHODS; m++) {
      t->bytes[m] += w->bytes[m], t->wire[m] += w->wire[m];
      if (w->message[m] > t->message[m])
        t->message[m] = w->message[m];
    }
    t->entries += w->sent;
    t->update_bias += w->bias / (double)b->a.rounds;
    if (w->drift > t->max_drift)
      t->max_drift = w->drift;
    if (w->replay_drift > t->max_replay_drift)
      t->max_replay_drift = w->replay_drift;
    t->round_ms += (double)w->round_ms / (double)b->a.rounds;
    t->exchange_ms += (double)w->exchange_ms / (double)b->a.rounds;
    t->resynced_ranges += w->resynced_ranges;
    t->resync_bytes += w->resync_bytes;
    t->dgram_sent += w->dgram_sent, t->dgram_dropped += w->dgram_dropped;
    t->chunks_accepted += w->chunks_accepted;
    t->chunks_refused += w->chunks_refused;
  }
  for (int m = 0; m < METHODS; m++) {
    t->final_loss[m] = last->loss[m];
    t->reduction[m] = ratio(t->wire[m], t->wire[PULSELOCO]);
    t->gap[m] =
        last->loss[m] > 0 ? last->loss[PULSELOCO] / last->loss[m] - 1.0 : 0.0;
  }
  sum_up_pairs_and_times(b, t);
  sum_up_rewards_and_density(b, t);
  t->t10 = t->wire[PULSELOCO] * 10 <= t->wire[REFERENCE];
  t->t100 = t->wire[PULSELOCO] * 100 <= t->wire[DDP_FP32];
  t->t2 = t->gap[REFERENCE] <= 0.02;
}

static const char *yes(int v) {
  return v ? "true" : "false";
}

/* Text RL: PULSELoCo's reward gain over the start as a share of
 * DiLoCo-BF16's (a small step moves the reward little, so the shares say
 * more than the final figures). */
static double reward_gain_share(const bench *b, const totals *t) {
  double ref = t->last_reward[DILOCO_BF16] - b->init_reward;
  return ref != 0.0 ? (t->last_reward[PULSELOCO] - b->init_reward) / ref
                    : 0.0;
}

void bench_loco_print_summary_json(const bench *b, const totals *t,
                                   double seconds, int identical) {
  const loco_args *a = &b->a;
  double per = (double)a->trainers * a->rounds;
  printf("{\"summary\":true,\"trainers\":%u,\"rounds\":%u,\"inner\":%u,"
         "\"params\":%" PRIu64 ",\"seed\":%" PRIu64
         ",\"drop_rate\":%g,\"baseline\":\"%s\"",
         a->trainers, a->rounds, a->inner, b->P, a->seed, a->drop_rate,
         bench_loco_method[REFERENCE].key);
  for (int m = 0; m < METHODS; m++) {
    const char *k = bench_loco_method[m].key;
    printf(",\"bytes_%s\":%" PRIu64 ",\"wire_bytes_%s\":%" PRIu64
           ",\"wire_bytes_per_trainer_round_%s\":%.1f,\"final_loss_%s\":%.6f",
           k, t->bytes[m], k, t->wire[m], k, (double)t->wire[m] / per, k,
           t->final_loss[m]);
    if (m != PULSELOCO)
      printf(",\"message_bytes_%s\":%" PRIu64 ",\"reduction_vs_%s\":%.2f"
             ",\"pulseloco_vs_%s_loss\":%.5f",
             k, t->message[m], k, t->reduction[m], k, t->gap[m]);
  }
  /* The arm's figures (issue 16): PULSELoCo under its rule and loss. */
  printf(",\"rule\":\"%s\",\"final_loss\":%.6f,\"bytes_per_trainer\":%.1f,"
         "\"update_bias\":%.5f",
         pulse_loco_rule_name(a->rule), t->final_loss[PULSELOCO],
         (double)t->bytes[PULSELOCO] / a->trainers, t->update_bias);
  printf(",\"problem\":\"%s\",\"text_bytes\":%" PRIu64
         ",\"text_digest\":\"%016" PRIx64 "\",\"max_drift\":%.6g,"
         "\"drift_rounds_measured\":%u,\"max_ref_drift\":%.6g,"
         "\"round_ms_median\":%.1f,\"round_ms_p10\":%.1f,"
         "\"round_ms_p90\":%.1f,\"exchange_ms_median\":%.1f",
         bench_loco_problem_name(a->problem),
         b->text_bytes, b->text_digest, t->max_pair_drift, t->pair_rounds,
         t->max_drift, t->round_t.median, t->round_t.p10, t->round_t.p90,
         t->exchange_t.median);
  printf(",\"auth\":%s,\"auth_accepted\":%" PRIu64 ",\"auth_refused\":%" PRIu64,
         a->no_auth ? "false" : "true", b->auth_accepted, b->auth_refused);
  /* What signing adds: headers, signed queries, chunk lists, sums
   * (pulse_loco_coord_step_figures.auth_bytes), against the bytes received. */
  printf(",\"auth_bytes\":%" PRIu64 ",\"auth_bytes_per_trainer_round\":%.1f"
         ",\"auth_bytes_share\":%.5f",
         b->auth_bytes,
         (double)b->auth_bytes / ((double)a->trainers * (a->rounds ? a->rounds : 1)),
         t->wire[PULSELOCO] ? (double)b->auth_bytes / (double)t->wire[PULSELOCO]
                            : 0.0);
  printf(",\"transport\":\"%s\",\"drop\":%g,"
         "\"max_replay_drift\":%.6g,\"drift_budget\":%g,\"resync_period\":%u,"
         "\"resynced_ranges\":%" PRIu64 ",\"resync_bytes\":%" PRIu64
         ",\"datagrams_sent\":%" PRIu64 ",\"datagrams_dropped\":%" PRIu64
         ",\"chunks_accepted\":%" PRIu64 ",\"chunks_refused\":%" PRIu64
         ",\"round_ms\":%.1f,\"exchange_ms\":%.1f",
         a->transport == PULSE_LOCO_TRANSPORT_UDP ? "udp" : "http", a->drop,
         t->max_replay_drift, a->drift_budget, a->resync_period,
         t->resynced_ranges, t->resync_bytes, t->dgram_sent, t->dgram_dropped,
         t->chunks_accepted, t->chunks_refused, t->round_ms, t->exchange_ms);
  /* The regime: the rate, the pretraining (text-sft) and how dense
   * PULSELoCo's messages were (entries sent over P, every trainer and
   * round; the dense methods send every entry: 1). */
  /* Fine-tuning barely moves the loss, so final losses within 1% say
   * little: how much of DiLoCo-BF16's decrease PULSELoCo made says more. */
  double dec_ref = b->init_loss - t->final_loss[DILOCO_BF16];
  double dec_pulse = b->init_loss - t->final_loss[PULSELOCO];
  printf(",\"lr\":%g,\"compute\":\"%s\",\"param\":\"%s\","
         "\"pretrain_steps\":%u,\"pretrain_loss\":%.6f,"
         "\"density_pulseloco\":%.5f,\"loss_decrease_vs_diloco_bf16\":%.4f",
         b->lr, bench_loco_compute_name(a->compute),
         a->parametrization == PULSE_SIM_PARAM_STANDARD ? "standard" : "scaled",
         b->pretrain_steps, b->pretrain_loss,
         (double)t->entries / ((double)b->P * per),
         dec_ref != 0.0 ? dec_pulse / dec_ref : 0.0);
  for (int m = 0; m < METHODS; m++)
    printf(",\"density_%s\":%.5f", bench_loco_method[m].key, t->density[m]);
  if (a->problem == PULSE_SIM_PROBLEM_TEXT_RL) {
    /* Text RL: what it optimizes, held out, over the last rounds. */
    printf(",\"initial_reward\":%.6f,\"reward_rounds\":%u", b->init_reward,
           t->reward_rounds);
    for (int m = 0; m < METHODS; m++)
      printf(",\"reward_%s\":%.6f", bench_loco_method[m].key,
             t->last_reward[m]);
    printf(",\"pulseloco_vs_diloco_bf16_reward\":%.5f,"
           "\"reward_gain_vs_diloco_bf16\":%.4f,"
           "\"target_reward_1pct_diloco_bf16\":%s",
           t->reward_gap[REFERENCE], reward_gain_share(b, t),
           yes(t->t_reward));
  }
  printf(",\"target_loss_1pct_diloco_bf16\":%s",
         yes(t->gap[REFERENCE] <= 0.01));
  printf(",\"bytes_per_entry_pulseloco\":%.3f,\"initial_loss\":%.6f,"
         "\"loss_floor\":%.6f,\"target_10x_diloco_bf16\":%s,"
         "\"target_100x_ddp_fp32\":%s,\"target_loss_2pct_diloco_bf16\":%s,"
         "\"replicas_identical\":%s,\"seconds\":%.2f}\n",
         ratio(t->bytes[PULSELOCO], t->entries), b->init_loss, b->floor,
         yes(t->t10), yes(t->t100), yes(t->t2), yes(identical), seconds);
}

/* PULSELoCo against the baselines and the targets. */
static void print_versus_text(const bench *b, const totals *t) {
  const loco_args *a = &b->a;
  printf("  PULSELoCo: final loss %+.2f%% vs DiLoCo-BF16 (%+.2f%% vs "
         "DiLoCo-FP32), %.2f B per sent entry, %.2f%% of the entries sent\n",
         100.0 * t->gap[DILOCO_BF16], 100.0 * t->gap[DILOCO_FP32],
         ratio(t->bytes[PULSELOCO], t->entries),
         100.0 * (double)t->entries /
             ((double)b->P * (double)a->trainers * (double)a->rounds));
  printf("  PULSELoCo puts %.1fx fewer bytes on the wire than DiLoCo-BF16 "
         "(FP32: %.1fx), %.1fx fewer than DDP-FP32\n",
         t->reduction[DILOCO_BF16], t->reduction[DILOCO_FP32],
         t->reduction[DDP_FP32]);
  printf("  targets: >= 10x fewer than DiLoCo-BF16: %s; >= 100x fewer than "
         "DDP-FP32: %s; final loss within 2%% of DiLoCo-BF16's: %s\n",
         t->t10 ? "met" : "MISSED", t->t100 ? "met" : "MISSED",
         t->t2 ? "met" : "MISSED");
  if (a->problem == PULSE_SIM_PROBLEM_TEXT_RL)
    printf("  PULSELoCo's reward %+.2f%% vs DiLoCo-BF16 (%+.2f%% vs "
           "DiLoCo-FP32), target within 1%%: %s; its gain over the start "
           "%.2f of DiLoCo-BF16's\n",
           100.0 * t->reward_gap[DILOCO_BF16],
           100.0 * t->reward_gap[DILOCO_FP32], t->t_reward ? "met" : "MISSED",
           reward_gain_share(b, t));
}

void bench_loco_print_summary_text(const bench *b, const totals *t,
                                   double seconds, int identical) {
  const loco_args *a = &b->a;
  double per = (double)a->trainers * a->rounds;
  int rl = a->problem == PULSE_SIM_PROBLEM_TEXT_RL;
  printf("\nsummary: %" PRIu64
         " parameters, %u trainers, %u rounds x %u inner steps, seed %" PRIu64
         "\n  held-out loss: start %.5f, floor %.5f (the teacher's entropy; "
         "text: 0, unknown)\n",
         b->P, a->trainers, a->rounds, a->inner, a->seed, b->init_loss,
         b->floor);
  printf("  trainers compute with the %s weights%s; %s parametrization\n",
         a->compute == PULSE_SIM_COMPUTE_BF16 ? "BF16-rounded" : "FP32",
         a->compute == PULSE_SIM_COMPUTE_BF16
             ? " (Adam updates FP32 master weights; --compute)"
             : " (--compute)",
         a->parametrization == PULSE_SIM_PARAM_STANDARD
             ? "standard (scale in the weights; --param)"
             : "scaled (scale in the forward; --param)");
  if (b->pretrain_steps > 0)
    printf("  pretrained: %u Adam steps at %g, held-out loss %.5f; %s at %g "
           "on unseen text\n",
           b->pretrain_steps, PULSE_SIM_TEXT_LR, b->pretrain_loss,
           rl ? "trained by RL" : "fine-tuned", b->lr);
  if (rl)
    printf("  held-out reward (expected matching prefix of %u bytes): start "
           "%.5f; per method the mean over the last %u rounds\n",
           PULSE_SIM_TEXT_RL_LENGTH, b->init_reward, t->reward_rounds);
  printf("  %-12s %14s %14s %20s %11s %8s%s\n", "method", "bytes sent",
         "on the wire", "wire B/trainer/round", "final loss", "density",
         rl ? "   reward" : "");
  /* --only-pulseloco: the baselines did not run; leave them out. */
  for (int m = a->only_pulseloco ? PULSELOCO : 0; m < METHODS; m++) {
    printf("  %-12s %14" PRIu64 " %14" PRIu64 " %20.0f %11.5f %7.3f%%",
           bench_loco_method[m].name, t->bytes[m], t->wire[m],
           (double)t->wire[m] / per, t->final_loss[m], 100.0 * t->density[m]);
    if (rl)
      printf(" %8.5f", t->last_reward[m]);
    printf("\n");
  }
  if (a->only_pulseloco)
    printf("  PULSELoCo: %.2f B per sent entry, %.2f%% of the entries sent "
           "(baselines not run)\n",
           ratio(t->bytes[PULSELOCO], t->entries),
           100.0 * (double)t->entries /
               ((double)b->P * (double)a->trainers * (double)a->rounds));
  else
    print_versus_text(b, t);
  printf("  PULSELoCo rule %s: update bias %.4f (1 = unbiased; mean over "
         "rounds against a lossless replay of each)\n",
         pulse_loco_rule_name(a->rule), t->update_bias);
  if (a->transport == PULSE_LOCO_TRANSPORT_UDP)
    printf("  over UDP, each datagram lost with p = %g: %" PRIu64
           " sent, %" PRIu64 " lost, %" PRIu64
           " refused; drift against the reference before "
           "re-sync %.3g (budget %g), %" PRIu64 " ranges re-synced (%" PRIu64
           " bytes)\n",
           a->drop, t->dgram_sent, t->dgram_dropped, t->chunks_refused,
           t->max_drift, a->drift_budget, t->resynced_ranges, t->resync_bytes);
  printf("  max drift over all trainer pairs (after a round's aggregate, "
         "before re-sync): %.3g (%u of %u rounds measured)\n",
         t->max_pair_drift, t->pair_rounds, a->rounds);
  printf("  a round: %.0f ms (trainer 0: inner steps and exchange; median "
         "%.0f, 10-90%% %.0f-%.0f), the exchange %.0f ms (median %.0f)\n",
         t->round_ms, t->round_t.median, t->round_t.p10, t->round_t.p90,
         t->exchange_ms, t->exchange_t.median);
  if (a->no_auth)
    printf("  authentication off (--no-auth)\n");
  else
    printf("  authentication on (Ed25519, every trainer's key pinned): %" PRIu64
           " bodies accepted, %" PRIu64 " bodies or datagrams refused; "
           "signing added %.0f bytes per trainer and round (%.2f%% of the "
           "bytes received)\n",
           b->auth_accepted, b->auth_refused,
           (double)b->auth_bytes /
               ((double)a->trainers * (a->rounds ? a->rounds : 1)),
           t->wire[PULSELOCO]
               ? 100.0 * (double)b->auth_bytes / (double)t->wire[PULSELOCO]
               : 0.0);
  printf("  replicas identical at the end: %s; %.1f s\n",
         identical ? "yes" : "NO", seconds);
}
