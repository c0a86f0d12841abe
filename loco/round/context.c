/* context.c - a trainer's PULSELoCo context: the CPU reference of the outer
 * round (signal, gate, error feedback, weighted mean, Nesterov step), as
 * plain loops over codec/pulse_loco_elem.h. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "loco_impl.h"
#include "outer_elem_impl.h"
#include "payload_impl.h"
#include "pulse_loco_elem.h"
#include "status_impl.h"

uint64_t pulse_loco_digest_f32(const float *x, uint64_t n) {
  uint64_t sum = 0;
  for (uint64_t i = 0; i < n; i++)
    sum += pulse_digest_lane_a(pulse_digest_lane_b(i) ^ pulse_f32_bits(x[i]));
  return sum;
}

void pulse_loco_refresh_(pulse_loco *ctx) {
  pulse_bf16_cast_f32(ctx->theta_g, ctx->theta_bf16, ctx->n);
  ctx->digest = pulse_loco_digest_f32(ctx->theta_g, ctx->n);
}

void pulse_loco_opts_init(pulse_loco_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_LOCO_OPTS_VERSION;
  o->alpha = 0.7f;
  o->mu = 0.9f;
  o->gate = PULSE_LOCO_GATE_BF16;
  o->values = PULSE_LOCO_VALUES_MODELED;
  o->pos_model = PULSE_POS_AUTO;
  o->chunk_log2 = 20;
  o->rule = PULSE_LOCO_RULE_DROP;
}

pulse_status pulse_loco_create(const pulse_loco_opts *opts,
                               const float *theta_init, pulse_loco **out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco: NULL output");
  *out = NULL;
  PULSE_TRY(PULSE_OPTS_CHECK("loco", opts, PULSE_LOCO_OPTS_VERSION));
  pulse_loco_opts o = *opts;
  o.gate_mean = o.gate_mean != 0;
  opts = &o;
  if (opts->param_count == 0 || opts->param_count > PULSE_LOCO_MAX_PARAMS)
    return pulse_fail(PULSE_ERR_ARG, "loco: %llu parameters",
                      (unsigned long long)opts->param_count);
  if (!isfinite(opts->alpha) || !isfinite(opts->mu) ||
      opts->gate > PULSE_LOCO_GATE_NONE ||
      opts->values > PULSE_LOCO_VALUES_MODELED ||
      (opts->pos_model > PULSE_POS_CLASS &&
       opts->pos_model != PULSE_POS_AUTO) ||
      opts->chunk_log2 < LOCO_CHUNK_LOG2_MIN ||
      opts->chunk_log2 > LOCO_CHUNK_LOG2_MAX ||
      (unsigned)opts->rule > PULSE_LOCO_RULE_LEGACY)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco: bad option (alpha, mu, gate, coding, chunk, "
                      "rule)");
  pulse_loco *c = calloc(1, sizeof *c);
  if (c == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "loco: context");
  size_t n = (size_t)opts->param_count;
  c->opts = *opts;
  c->n = opts->param_count;
  c->theta_g = malloc(n * sizeof *c->theta_g);
  c->e = calloc(n, sizeof *c->e);
  c->b = calloc(n, sizeof *c->b);
  c->s = malloc(n * sizeof *c->s);
  c->theta_bf16 = malloc(n * sizeof *c->theta_bf16);
  if (!c->theta_g || !c->e || !c->b || !c->s || !c->theta_bf16) {
    pulse_loco_free(c);
    return pulse_fail(PULSE_ERR_NOMEM, "loco: %zu parameters", n);
  }
  if (theta_init)
    memcpy(c->theta_g, theta_init, n * sizeof *c->theta_g);
  else
    memset(c->theta_g, 0, n * sizeof *c->theta_g);
  pulse_loco_refresh_(c);
  *out = c;
  return PULSE_OK;
}

void pulse_loco_drop_round_(pulse_loco *ctx) {
  free(ctx->sent_pos), free(ctx->sent_val);
  ctx->sent_pos = NULL, ctx->sent_val = NULL, ctx->sent_count = 0;
  pulse_buffer_free(&ctx->payload);
  ctx->prepared = 0;
  ctx->members = 0;
}

static const char *const RULE_NAMES[] = {"drop", "keep", "legacy"};

const char *pulse_loco_rule_name(pulse_loco_rule rule) {
  return (unsigned)rule <= PULSE_LOCO_RULE_LEGACY ? RULE_NAMES[rule] : "?";
}

pulse_status pulse_loco_rule_parse(const char *name, pulse_loco_rule *rule) {
  for (unsigned i = 0; name && i <= PULSE_LOCO_RULE_LEGACY; i++)
    if (strcmp(name, RULE_NAMES[i]) == 0) {
      *rule = (pulse_loco_rule)i;
      return PULSE_OK;
    }
  return pulse_fail(PULSE_ERR_ARG,
                    "loco: unknown rule '%s' (drop, keep, legacy)",
                    name ? name : "");
}

pulse_status pulse_loco_set_members(pulse_loco *ctx, uint32_t members) {
  if (ctx == NULL || !ctx->prepared || members == 0)
    return pulse_fail(PULSE_ERR_ARG, "loco: members of no prepared round");
  ctx->members = members;
  return PULSE_OK;
}

void pulse_loco_free(pulse_loco *ctx) {
  if (ctx == NULL)
    return;
  pulse_loco_drop_round_(ctx);
  free(ctx->theta_g), free(ctx->e), free(ctx->b), free(ctx->s),
      free(ctx->theta_bf16);
  free(ctx);
}

uint64_t pulse_loco_param_count(const pulse_loco *ctx) {
  return ctx->n;
}
uint32_t pulse_loco_trainer_id(const pulse_loco *ctx) {
  return ctx->opts.trainer_id;
}
uint64_t pulse_loco_round(const pulse_loco *ctx) {
  return ctx->round;
}
const float *pulse_loco_global(const pulse_loco *ctx) {
  return ctx->theta_g;
}
const float *pulse_loco_residual(const pulse_loco *ctx) {
  return ctx->e;
}
const float *pulse_loco_momentum(const pulse_loco *ctx) {
  return ctx->b;
}
uint64_t pulse_loco_global_digest(const pulse_loco *ctx) {
  return ctx->digest;
}

/* ------------------------------------------------------------------ prepare */

/* Whether entry i goes into the payload. */
static int selects(const pulse_loco *ctx, int leaving, float theta_g, float s) {
  if (ctx->opts.gate == PULSE_LOCO_GATE_NONE)
    return 1;
  if (leaving)
    return s != 0.0f;
  return pulse_loco_gate(theta_g, s);
}

pulse_status pulse_loco_prepare(pulse_loco *ctx, const float *theta_r,
                                uint64_t samples, uint32_t flags,
                                const uint8_t **payload, size_t *size,
                                pulse_loco_prepare_figures *info) {
  if (ctx == NULL || theta_r == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco prepare: NULL argument");
  if (ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco prepare: round %llu is already prepared",
                      (unsigned long long)ctx->round);
  if (ctx->need_state)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco prepare: the round was abandoned; import a state");
  if (samples == 0 || (flags & ~PULSE_LOCO_LEAVING) != 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco prepare: zero samples or unknown flags");
  int leaving = (flags & PULSE_LOCO_LEAVING) != 0;
  uint64_t n = ctx->n, k = 0;
  for (uint64_t i = 0; i < n; i++) {
    float s = pulse_loco_signal(ctx->theta_g[i], theta_r[i], ctx->e[i]);
    ctx->s[i] = s;
    if (selects(ctx, leaving, ctx->theta_g[i], s)) {
      if (!isfinite(s))
        return pulse_fail(PULSE_ERR_ARG,
                          "loco prepare: pseudo-gradient at %llu is not "
                          "finite (the local parameters diverged)",
                          (unsigned long long)i);
      k++;
    }
  }
  ctx->sent_pos = malloc((size_t)k * sizeof *ctx->sent_pos + 8);
  ctx->sent_val = malloc((size_t)k * sizeof *ctx->sent_val + 4);
  if (ctx->sent_pos == NULL || ctx->sent_val == NULL) {
    pulse_loco_drop_round_(ctx);
    return pulse_fail(PULSE_ERR_NOMEM, "loco prepare: %llu entries",
                      (unsigned long long)k);
  }
  for (uint64_t i = 0, j = 0; i < n; i++)
    if (selects(ctx, leaving, ctx->theta_g[i], ctx->s[i])) {
      ctx->sent_pos[j] = i;
      ctx->sent_val[j++] = ctx->s[i];
    }
  ctx->sent_count = k;
  pulse_loco_payload_header h;
  memset(&h, 0, sizeof h);
  h.flags = (ctx->opts.gate == PULSE_LOCO_GATE_BF16 && !leaving
                 ? PULSE_LOCO_PAYLOAD_GATED
                 : 0) |
            (leaving ? PULSE_LOCO_PAYLOAD_LEAVING : 0);
  h.pos_model = ctx->opts.pos_model;
  h.values = ctx->opts.values;
  h.chunk_log2 = ctx->opts.chunk_log2;
  h.sender = ctx->opts.trainer_id;
  h.round = ctx->round;
  h.samples = samples;
  h.base_digest = ctx->digest;
  pulse_status st =
      pulse_loco_payload_encode(&h, ctx->theta_g, ctx->theta_bf16, n,
                                ctx->sent_pos, ctx->sent_val, k, &ctx->payload);
  if (st != PULSE_OK) {
    pulse_loco_drop_round_(ctx);
    return st;
  }
  ctx->samples = samples;
  ctx->prepared = 1;
  if (payload)
    *payload = ctx->payload.data;
  if (size)
    *size = ctx->payload.size;
  if (info) {
    info->round = ctx->round;
    info->sent = k;
    info->payload_bytes = ctx->payload.size;
  }
  return PULSE_OK;
}

/* ------------------------------------------------------------------- finish */

pulse_status pulse_loco_check_decode_(const pulse_loco *ctx,
                                      const uint8_t *data, size_t size,
                                      pulse_loco_payload_header *hdr,
                                      pulse_loco_entries *entries) {
  pulse_loco_payload_header h;
  PULSE_TRY(pulse_loco_payload_peek(data, size, &h));
  if (h.param_count != ctx->n)
    return pulse_fail(PULSE_ERR_SIZE_MISMATCH,
                      "loco: payload of sender %u has %llu "
                      "parameters, this run %llu",
                      h.sender, (unsigned long long)h.param_count,
                      (unsigned long long)ctx->n);
  if (h.round != ctx->round)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "loco: payload of sender %u is for round %llu, "
                      "this trainer is at %llu",
                      h.sender, (unsigned long long)h.round,
                      (unsigned long long)ctx->round);
  if (h.base_digest != ctx->digest)
    return pulse_fail(PULSE_ERR_BASE_DIGEST,
                      "loco: payload of sender %u was built on "
                      "another theta_g",
                      h.sender);
  return pulse_loco_payload_decode(data, size, ctx->theta_g, ctx->theta_bf16,
                                   ctx->n, hdr, entries);
}

pulse_status pulse_loco_check(const pulse_loco *ctx, const uint8_t *data,
                              size_t size) {
  if (ctx == NULL)
    return pulse_fail(PULSE_ERR_ARG, "loco check: NULL context");
  pulse_loco_payload_header h;
  pulse_loco_entries e = PULSE_LOCO_ENTRIES_INIT;
  pulse_status st = pulse_loco_check_decode_(ctx, data, size, &h, &e);
  pulse_loco_entries_free(&e);
  return st;
}

/* The error feedback rule: e = s, minus what got through; under the drop
 * rule minus what was sent, through or not. */
static void keep_residual(pulse_loco *ctx, int self_included) {
  memcpy(ctx->e, ctx->s, (size_t)ctx->n * sizeof *ctx->e);
  if (self_included || ctx->opts.rule == PULSE_LOCO_RULE_DROP)
    for (uint64_t j = 0; j < ctx->sent_count; j++)
      ctx->e[ctx->sent_pos[j]] = 0.0f;
}

double pulse_loco_denominator_(const pulse_loco *ctx, uint64_t weight,
                               size_t count) {
  double wsum = (double)weight;
  /* The keep rule divides by every trainer of the round, arrived or not. */
  if (ctx->opts.rule == PULSE_LOCO_RULE_KEEP && ctx->members > count)
    wsum = wsum * (double)ctx->members / (double)count;
  return wsum;
}

float pulse_loco_mean_(double acc, double wsum) {
  return (float)(acc / wsum);
}

int pulse_loco_gate_mean_(const pulse_loco *ctx, float theta_g, float mean,
                          uint32_t senders, int exempt) {
  return !ctx->opts.gate_mean || exempt || senders >= LOCO_GATE_QUORUM ||
         pulse_loco_gate(theta_g, mean);
}

/* The mean applied to element i: avg[i] as given (already final: a range
 * owner gated it), or the mean of acc[i] through the mean gate. */
static float applied_mean(const pulse_loco *ctx, const float *avg,
                          const double *acc, double wsum,
                          const pulse_loco_gate_in_ *in, uint64_t i) {
  if (avg)
    return avg[i];
  float m = pulse_loco_mean_(acc[i], wsum);
  if (in == NULL ||
      pulse_loco_gate_mean_(ctx, ctx->theta_g[i], m, in->senders[i],
                            in->exempt != NULL && in->exempt[i]))
    return m;
  return 0.0f;
}

void pulse_loco_conclude_(pulse_loco *ctx, const float *avg, const double *acc,
                          double wsum, const pulse_loco_gate_in_ *in,
                          int self_included, float *theta_r) {
  float alpha = ctx->opts.alpha, mu = ctx->opts.mu;
  keep_residual(ctx, self_included);
  /* Under gate_mean an element whose mean the gate rejected gets 0, so an
   * applied mean of 0 means rejected (or a quorum's mean that cancelled
   * exactly: nothing to apply either), here and at a reader of range
   * owners' means alike: this trainer's entries sent there were not
   * applied, so they stay in e, deferred. Decided on theta_g before the
   * step changes it, as the gate itself was. */
  if (ctx->opts.gate_mean && self_included)
    for (uint64_t j = 0; j < ctx->sent_count; j++) {
      uint64_t p = ctx->sent_pos[j];
      if (applied_mean(ctx, avg, acc, wsum, in, p) == 0.0f)
        ctx->e[p] = ctx->s[p];
    }
  for (uint64_t i = 0; i < ctx->n; i++)
    pulse_loco_outer(&ctx->theta_g[i], &ctx->b[i],
                     applied_mean(ctx, avg, acc, wsum, in, i), alpha, mu);
  ctx->round++;
  pulse_loco_refresh_(ctx);
  pulse_loco_drop_round_(ctx);
  if (theta_r)
    memcpy(theta_r, ctx->theta_g, (size_t)ctx->n * sizeof *theta_r);
}

typedef struct {
  pulse_loco_payload_header h;
  pulse_loco_entries e;
} decoded;

static int by_sender(const void *a, const void *b) {
  uint32_t x = ((const decoded *)a)->h.sender,
           y = ((const decoded *)b)->h.sender;
  return (x > y) - (x < y);
}

pulse_status pulse_loco_finish(pulse_loco *ctx,
                               const pulse_loco_contribution *set, size_t count,
                               float *theta_r, pulse_loco_finish_figures *info) {
  if (ctx == NULL || (set == NULL && count > 0))
    return pulse_fail(PULSE_ERR_ARG, "loco finish: NULL argument");
  if (!ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco finish: no prepared round");
  if (count == 0)
    return pulse_fail(PULSE_ERR_ARG,
                      "loco finish: empty contributor set (abandon instead)");
  decoded *d = calloc(count, sizeof *d);
  double *acc = calloc((size_t)ctx->n, sizeof *acc);
  /* The mean gate's other inputs (pulse_loco_gate_mean_): how many
   * contributors sent each element (a mean a quorum of them pushed is
   * applied whatever its size), and the elements a leaving sender flushed
   * (applied whole: nothing of it may wait in an error feedback that
   * leaves with it). */
  int gated = ctx->opts.gate_mean;
  uint32_t *senders = gated ? calloc((size_t)ctx->n, sizeof *senders) : NULL;
  uint8_t *exempt = gated ? calloc((size_t)ctx->n, 1) : NULL;
  pulse_status st = PULSE_OK;
  if (d == NULL || acc == NULL ||
      (gated && (senders == NULL || exempt == NULL))) {
    st = pulse_fail(PULSE_ERR_NOMEM, "loco finish: %zu contributions", count);
    goto done;
  }
  int self_included = 0;
  uint64_t weight = 0, entries = 0;
  for (size_t i = 0; i < count && st == PULSE_OK; i++) {
    st = pulse_loco_check_decode_(ctx, set[i].data, set[i].size, &d[i].h,
                                  &d[i].e);
    if (st != PULSE_OK)
      break;
    if (d[i].h.sender == ctx->opts.trainer_id) {
      if (set[i].size != ctx->payload.size ||
          memcmp(set[i].data, ctx->payload.data, set[i].size) != 0)
        st = pulse_fail(PULSE_ERR_DUPLICATE,
                        "loco finish: a payload under this trainer's "
                        "id %u differs from its own",
                        d[i].h.sender);
      self_included = 1;
    }
    if (d[i].h.samples > UINT64_MAX - weight)
      st =
          pulse_fail(PULSE_ERR_OVERFLOW, "loco finish: sample counts overflow");
    else
      weight += d[i].h.samples;
    entries += d[i].e.count;
  }
  if (st != PULSE_OK)
    goto done;
  qsort(d, count, sizeof *d, by_sender);
  for (size_t i = 1; i < count; i++)
    if (d[i].h.sender == d[i - 1].h.sender) {
      st =
          pulse_fail(PULSE_ERR_DUPLICATE,
                     "loco finish: two payloads from sender %u", d[i].h.sender);
      goto done;
    }

  /* Everything checked: from here nothing fails. The sum runs in increasing
   * sender order on every trainer, so every trainer gets the same bits. */
  for (size_t i = 0; i < count; i++) {
    double w = (double)d[i].h.samples;
    int leaving = (d[i].h.flags & PULSE_LOCO_PAYLOAD_LEAVING) != 0;
    for (uint64_t j = 0; j < d[i].e.count; j++) {
      uint64_t p = d[i].e.pos[j];
      acc[p] += w * (double)d[i].e.val[j];
      if (gated) {
        senders[p]++;
        exempt[p] |= (uint8_t)leaving;
      }
    }
  }
  double wsum = pulse_loco_denominator_(ctx, weight, count);
  if (info) {
    info->round = ctx->round;
    info->contributors = (uint32_t)count;
    info->self_included = self_included;
    info->samples = weight;
    info->entries = entries;
  }
  pulse_loco_gate_in_ gin = {senders, exempt};
  pulse_loco_conclude_(ctx, NULL, acc, wsum, gated ? &gin : NULL, self_included,
                       theta_r);
done:
  if (d)
    for (size_t i = 0; i < count; i++)
      pulse_loco_entries_free(&d[i].e);
  free(d), free(acc);
  free(senders), free(exempt);
  return st;
}

pulse_status pulse_loco_abandon(pulse_loco *ctx, int self_included) {
  if (ctx == NULL || !ctx->prepared)
    return pulse_fail(PULSE_ERR_ARG, "loco abandon: no prepared round");
  keep_residual(ctx, self_included);
  pulse_loco_drop_round_(ctx);
  ctx->need_state = 1;
  return PULSE_OK;
}
