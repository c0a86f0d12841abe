/* sim_rl.c - text RL, GRPO-style (sim_rl.h): sampling, the prefix-match
 * reward, group-normalized advantages and the exact held-out reward, over
 * the text model's rows (sim_text.h). Built with -O3 like sim_text.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rng_impl.h"
#include "sim_rl.h"
#include "status_impl.h"

#define V 256u /* byte vocabulary */

struct pulse_sim_rl_scratch {
  uint32_t group, length, k;
  uint8_t *seq;         /* group x (k + length): the prompt, then a sample */
  const uint8_t **ctx;  /* group x length rows: row j * group + g */
  uint8_t *y;           /* each row's sampled byte */
  float *w;             /* each row's weight in the loss */
  double *reward, *adv; /* group */
};

uint32_t pulse_sim_rl_reward(const uint8_t *sample, const uint8_t *truth,
                             uint32_t length) {
  uint32_t n = 0;
  while (n < length && sample[n] == truth[n])
    n++;
  return n;
}

void pulse_sim_rl_advantages(const double *reward, uint32_t n, double *adv) {
  double mean = 0.0, var = 0.0;
  for (uint32_t i = 0; i < n; i++)
    mean += reward[i];
  mean /= n;
  for (uint32_t i = 0; i < n; i++)
    var += (reward[i] - mean) * (reward[i] - mean);
  double sd = sqrt(var / n);
  for (uint32_t i = 0; i < n; i++)
    adv[i] = (reward[i] - mean) / (sd + PULSE_SIM_RL_STD_EPS);
}

pulse_status pulse_sim_rl_scratch_create(const pulse_sim_text *t,
                                         pulse_sim_rl_scratch **out) {
  const pulse_sim_problem_opts *o = pulse_sim_text_opts(t);
  pulse_sim_rl_scratch *r = calloc(1, sizeof *r);
  size_t G = o->rl_group, L = o->rl_length, k = pulse_sim_text_context(t);
  if (r != NULL) {
    r->group = (uint32_t)G, r->length = (uint32_t)L, r->k = (uint32_t)k;
    r->seq = malloc(G * (k + L));
    r->ctx = malloc(G * L * sizeof *r->ctx);
    r->y = malloc(G * L);
    r->w = malloc(G * L * sizeof *r->w);
    r->reward = malloc(G * sizeof *r->reward);
    r->adv = malloc(G * sizeof *r->adv);
  }
  if (r == NULL || !r->seq || !r->ctx || !r->y || !r->w || !r->reward ||
      !r->adv) {
    pulse_sim_rl_scratch_free(r);
    return pulse_fail(PULSE_ERR_NOMEM, "text RL: learner buffers");
  }
  *out = r;
  return PULSE_OK;
}

void pulse_sim_rl_scratch_free(pulse_sim_rl_scratch *r) {
  if (r == NULL)
    return;
  free(r->seq), free(r->ctx), free(r->y), free(r->w), free(r->reward),
      free(r->adv);
  free(r);
}

/* A byte drawn from softmax(l) with one uniform of the stream. */
static uint8_t sample_byte(const float *l, uint64_t *rng) {
  float mx = l[0];
  for (uint32_t c = 1; c < V; c++)
    if (l[c] > mx)
      mx = l[c];
  double e[V], sum = 0.0;
  for (uint32_t c = 0; c < V; c++) {
    e[c] = exp((double)(l[c] - mx));
    sum += e[c];
  }
  double u = pulse_rng_uniform(rng) * sum, acc = 0.0;
  for (uint32_t c = 0; c < V; c++) {
    acc += e[c];
    if (u < acc)
      return (uint8_t)c;
  }
  return (uint8_t)(V - 1); /* u < sum = the last acc: not reached */
}

/* One prompt at text position pos: samples the group's continuations one
 * byte at a time (rows of byte j are j * group .. + group), scores them,
 * and adds their weighted log-likelihood gradient. @return the rewards'
 * sum. */
static double one_prompt(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                         pulse_sim_rl_scratch *r, uint64_t *rng,
                         const float *theta, uint32_t pos, double samples,
                         float *grad) {
  const uint8_t *text = pulse_sim_text_data(t);
  uint32_t G = r->group, L = r->length, k = r->k, span = k + L;
  for (uint32_t g = 0; g < G; g++)
    memcpy(r->seq + (size_t)g * span, text + pos - k, k);
  for (uint32_t j = 0; j < L; j++) {
    for (uint32_t g = 0; g < G; g++)
      r->ctx[j * G + g] = r->seq + (size_t)g * span + j;
    const float *l =
        pulse_sim_text_forward(t, s, theta, r->ctx + j * G, j * G, G);
    for (uint32_t g = 0; g < G; g++) {
      uint8_t c = sample_byte(l + (size_t)g * V, rng);
      r->seq[(size_t)g * span + k + j] = c;
      r->y[j * G + g] = c;
    }
  }
  double sum = 0.0;
  for (uint32_t g = 0; g < G; g++) {
    r->reward[g] =
        pulse_sim_rl_reward(r->seq + (size_t)g * span + k, text + pos, L);
    sum += r->reward[g];
  }
  pulse_sim_rl_advantages(r->reward, G, r->adv);
  int any = 0;
  for (uint32_t j = 0; j < L; j++)
    for (uint32_t g = 0; g < G; g++) {
      /* loss = (1/N) sum A * (-log pi): a cross-entropy of weight A/N. */
      r->w[j * G + g] = (float)(r->adv[g] / samples);
      any |= r->w[j * G + g] != 0.0f;
    }
  if (any) /* a group that scored alike teaches nothing */
    pulse_sim_text_backward(t, s, theta, r->ctx, r->y, r->w, G * L, grad);
  return sum;
}

double pulse_sim_rl_grad(const pulse_sim_text *t, pulse_sim_text_scratch *s,
                         pulse_sim_rl_scratch *r, uint64_t *rng,
                         const float *theta, float *grad) {
  const pulse_sim_problem_opts *o = pulse_sim_text_opts(t);
  uint32_t prompts = o->batch / r->group;
  uint64_t n;
  const uint32_t *from = pulse_sim_text_rl_prompts(t, 0, &n);
  memset(grad, 0, (size_t)pulse_sim_text_param_count(t) * sizeof *grad);
  double samples = (double)prompts * r->group, total = 0.0;
  for (uint32_t q = 0; q < prompts; q++)
    total += one_prompt(t, s, r, rng, theta, from[pulse_rng_below(rng, n)],
                        samples, grad);
  return -total / samples;
}

double pulse_sim_rl_eval(const pulse_sim_text *t, const float *theta) {
  enum { BLOCK = 16 }; /* prompts per forward pass */
  const pulse_sim_problem_opts *o = pulse_sim_text_opts(t);
  const uint8_t *text = pulse_sim_text_data(t);
  uint32_t L = o->rl_length, k = pulse_sim_text_context(t);
  uint64_t n;
  const uint32_t *test = pulse_sim_text_rl_prompts(t, 1, &n);
  pulse_sim_text_scratch *s = NULL;
  const uint8_t **ctx = malloc((size_t)BLOCK * L * sizeof *ctx);
  if (ctx == NULL ||
      pulse_sim_text_scratch_create(t, BLOCK * L, &s) != PULSE_OK) {
    free(ctx);
    return NAN;
  }
  double total = 0.0;
  for (uint64_t a = 0; a < n; a += BLOCK) {
    uint32_t m = n - a < BLOCK ? (uint32_t)(n - a) : BLOCK;
    /* Teacher forcing: row j of prompt b predicts true byte j. */
    for (uint32_t b = 0; b < m; b++)
      for (uint32_t j = 0; j < L; j++)
        ctx[b * L + j] = text + test[a + b] - k + j;
    const float *l = pulse_sim_text_forward(t, s, theta, ctx, 0, m * L);
    for (uint32_t b = 0; b < m; b++) {
      double all_right = 1.0; /* P(the first j + 1 bytes all match) */
      for (uint32_t j = 0; j < L; j++) {
        const float *row = l + (size_t)(b * L + j) * V;
        float mx = row[0];
        for (uint32_t c = 1; c < V; c++)
          if (row[c] > mx)
            mx = row[c];
        double sum = 0.0;
        for (uint32_t c = 0; c < V; c++)
          sum += exp((double)(row[c] - mx));
        all_right *= exp((double)(row[text[test[a + b] + j]] - mx)) / sum;
        total += all_right;
      }
    }
  }
  pulse_sim_text_scratch_free(s);
  free(ctx);
  return total / (double)n;
}
