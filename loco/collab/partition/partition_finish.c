/* partition_finish.c - the end of a partitioned round (docs/formats/loco-payload.md
 * "Partitioned averaging"): the reduced ranges of every owner checked, put
 * together, then the same Nesterov step and error feedback as
 * pulse_loco_finish (pulse_loco_conclude_). */
#include <stdlib.h>
#include <string.h>

#include <math.h>

#include "loco_impl.h"
#include "outer_elem_impl.h"
#include "partition_blob_impl.h"
#include "pulse_loco_partition.h"
#include "status_impl.h"

static pulse_status blame(pulse_loco_reduced_verdict *v, uint32_t owner,
                          pulse_status st) {
  if (v) {
    v->offender = owner;
    v->has_offender = 1;
  }
  return st;
}

pulse_status pulse_loco_finish_reduced(pulse_loco *ctx,
                                       const pulse_loco_plan *plan,
                                       const pulse_loco_contribution *blobs,
                                       const uint64_t *expected_samples,
                                       float *theta_r,
                                       pulse_loco_finish_figures *info,
                                       pulse_loco_reduced_verdict *v) {
  if (v)
    memset(v, 0, sizeof *v);
  if (ctx == NULL || plan == NULL || blobs == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco finish reduced: NULL argument");
  if (!ctx->prepared || plan->param_count != ctx->n || plan->count == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco finish reduced: no prepared round, or a plan "
                      "of another vector");
  uint32_t N = plan->count;
  int self = pulse_loco_plan_index(plan, ctx->opts.trainer_id);
  pulse_loco_reduced *red = calloc(N, sizeof *red);
  float *avg = calloc((size_t)ctx->n, sizeof *avg); /* +0.0: nobody sent */
  pulse_status st = PULSE_OK;
  if (red == NULL || avg == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco finish reduced: %u ranges", N);
    goto done;
  }
  for (uint32_t k = 0; k < N && st == PULSE_OK; k++) {
    st = pulse_loco_reduced_decode(ctx, plan, k, expected_samples,
                                   blobs[k].data, blobs[k].size, &red[k]);
    if (st != PULSE_OK) {
      st = blame(v, plan->ids[k], st == PULSE_ERR_NOMEM ? st
                                                         : PULSE_ERR_CORRUPT);
      break;
    }
    /* Without the granted samples, the first blob is the reference. */
    for (uint32_t i = 0; i < N && k > 0 && st == PULSE_OK; i++)
      if (red[k].contrib[i].samples != red[0].contrib[i].samples)
        st = blame(v, plan->ids[k],
                   pulse_fail(PULSE_ERR_CORRUPT,
                              "loco finish reduced: owners %u and %u name "
                              "other samples for %u",
                              plan->ids[0], plan->ids[k], plan->ids[i]));
    if (st == PULSE_OK && self >= 0 &&
        (red[k].contrib[self].samples != ctx->samples ||
         red[k].contrib[self].entries !=
             pulse_loco_own_entries_(ctx, plan->start[k],
                                     plan->start[k + 1]) ||
         red[k].contrib[self].receipt !=
             pulse_loco_own_receipt(ctx, plan->start[k], plan->start[k + 1])))
      st = blame(v, plan->ids[k],
                 pulse_fail(PULSE_ERR_CORRUPT,
                            "loco finish reduced: owner %u did not use this "
                            "trainer's slice as sent",
                            plan->ids[k]));
    /* An average that would take theta_g or b out of the finite numbers
     * is a wrong one (the recomputation would say so too, later). */
    for (uint64_t j = 0; st == PULSE_OK && j < red[k].avg.count; j++) {
      uint64_t p = red[k].avg.pos[j];
      float g = ctx->theta_g[p], b = ctx->b[p];
      pulse_loco_outer(&g, &b, red[k].avg.val[j], ctx->opts.alpha,
                       ctx->opts.mu);
      if (!isfinite(g) || !isfinite(b))
        st = blame(v, plan->ids[k],
                   pulse_fail(PULSE_ERR_CORRUPT,
                              "loco finish reduced: owner %u's average at "
                              "%llu overflows the weights",
                              plan->ids[k], (unsigned long long)p));
    }
  }
  if (st != PULSE_OK)
    goto done;
  /* Everything checked: from here nothing fails. */
  uint64_t weight = 0, entries = 0;
  for (uint32_t i = 0; i < N; i++)
    weight += red[0].contrib[i].samples; /* decode checked no overflow */
  for (uint32_t k = 0; k < N; k++) {
    for (uint64_t j = 0; j < red[k].avg.count; j++)
      avg[red[k].avg.pos[j]] = red[k].avg.val[j];
    for (uint32_t i = 0; i < N; i++)
      entries += red[k].contrib[i].entries;
  }
  if (info) {
    info->round = ctx->round;
    info->contributors = N;
    info->self_included = self >= 0;
    info->samples = weight;
    info->entries = entries;
  }
  /* Under gate_mean the owners wrote only the means that passed the gate
   * (and a leaving sender's elements): the rest are +0.0 here, rejected,
   * as pulse_loco_finish's gate makes them. */
  pulse_loco_conclude_(ctx, avg, NULL, 0.0, NULL, self >= 0, theta_r);
done:
  for (uint32_t k = 0; red && k < N; k++)
    pulse_loco_reduced_free(&red[k]);
  free(red), free(avg);
  return st;
}
